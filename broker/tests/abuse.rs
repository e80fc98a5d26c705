//! Protocol abuse against the real `sluice` binary: random frames, bad size prefixes, huge array
//! counts, thousands of abandoned connections, connection limits, slowloris, half-closes, deep
//! pipelines, a client that never reads, and running out of file descriptors. For each: the broker
//! stays up, its peak resident memory (VmHWM) stays bounded, a well-behaved client keeps producing
//! and fetching (every acknowledged batch read back byte for byte), and the broker's log says
//! what happened. Figures go to stderr (`--nocapture` shows them); tests/README.md records them.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpStream};
use std::os::fd::FromRawFd;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, CreateTopicsRequest, FetchResponse, MetadataRequest,
    ProduceRequest, ProduceResponse, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, StrBytes};
use sluice_engine::batch::simple_batch;
use sluice_engine::Timestamp;

mod common;

use common::{connect, fetch_request, frame, header_bytes, read_frame, with_size, Broker, Launch};

/// Peak resident memory any case may reach, in KiB. The broker idles at about 40 MiB; a broker
/// that allocated per claimed count or buffered an unread client's responses without bound would
/// pass this many times over.
const RSS_BOUND_KB: u64 = 256 * 1024;
/// Every wait on the broker has this deadline unless it says otherwise.
const DEADLINE: Duration = Duration::from_secs(20);

fn start(flags: &[&str], nofile: Option<u64>) -> Broker {
    Broker::launch(
        flags,
        Launch {
            env: vec![("RUST_LOG".into(), "info,sluice::net=debug".into())],
            nofile,
        },
    )
}

fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("broker status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("status field")
}

/// Peak resident memory of the broker (VmHWM), in KiB.
fn peak_rss_kb(broker: &Broker) -> u64 {
    status_kb(broker.pid(), "VmHWM:")
}

fn fd_count(broker: &Broker) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", broker.pid()))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn assert_rss_bounded(broker: &Broker, case: &str) -> u64 {
    let peak = peak_rss_kb(broker);
    eprintln!("{case}: peak RSS (VmHWM) {} MiB", peak / 1024);
    assert!(
        peak < RSS_BOUND_KB,
        "{case}: peak RSS {peak} KiB over {RSS_BOUND_KB} KiB"
    );
    peak
}

fn log_count(broker: &Broker, needle: &str) -> usize {
    broker.log_text().matches(needle).count()
}

/// Waits until the broker's log holds `needle` at least `n` times.
fn wait_for_log(broker: &Broker, needle: &str, n: usize, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let count = log_count(broker, needle);
        if count >= n {
            return count;
        }
        assert!(
            Instant::now() < deadline,
            "the log has {count} of {n} lines with {needle:?} after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A connection from `source` (any 127.x.y.z address) to the broker.
fn connect_from(source: Ipv4Addr, port: u16) -> std::io::Result<TcpStream> {
    // SAFETY: a fresh socket, bound and connected with valid sockaddr_in values; on success it
    // is owned by the returned TcpStream, on failure closed here.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let addr = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(ip).to_be(),
            },
            sin_zero: [0; 8],
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let local = addr(source, 0);
        let remote = addr(Ipv4Addr::LOCALHOST, port);
        if libc::bind(fd, &local as *const _ as *const libc::sockaddr, len) != 0
            || libc::connect(fd, &remote as *const _ as *const libc::sockaddr, len) != 0
        {
            let e = std::io::Error::last_os_error();
            libc::close(fd);
            return Err(e);
        }
        let s = TcpStream::from_raw_fd(fd);
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(s)
    }
}

fn response<R: Decodable>(s: &mut TcpStream, key: ApiKey, version: i16) -> (i32, R) {
    let mut body = read_frame(s).expect("a response");
    let header = ResponseHeader::decode(&mut body, key.response_header_version(version)).unwrap();
    (
        header.correlation_id,
        R::decode(&mut body, version).unwrap(),
    )
}

/// True once the broker closed the connection (EOF or reset), reading and dropping anything it
/// still sends; false when `within` passes first.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return false
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return true,
        }
    }
}

fn produce_request(topic: &str, records: Bytes) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(records))])])
}

fn create_topic(port: u16, name: &str) {
    let mut s = connect(port);
    let request = CreateTopicsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(StrBytes::from_string(name.to_string())))
            .with_num_partitions(1)
            .with_replication_factor(1)]);
    s.write_all(&frame(ApiKey::CreateTopics, 7, 1, &request))
        .unwrap();
    assert!(read_frame(&mut s).is_some());
}

/// Record batches one after another: (base offset, bytes from the magic byte on, which the broker
/// never changes).
fn split_batches(mut records: &[u8]) -> Vec<(i64, Vec<u8>)> {
    let mut out = Vec::new();
    while records.len() >= 12 {
        let base = i64::from_be_bytes(records[..8].try_into().unwrap());
        let len = i32::from_be_bytes(records[8..12].try_into().unwrap()) as usize;
        if records.len() < 12 + len {
            break;
        }
        out.push((base, records[16..12 + len].to_vec()));
        records = &records[12 + len..];
    }
    out
}

/// A well-behaved client on its own connection: produces one batch at a time with acks=all and
/// checks that everything acknowledged so far reads back byte for byte at its offset.
struct GoodClient {
    port: u16,
    s: TcpStream,
    topic: String,
    correlation: i32,
    acked: Vec<(i64, Vec<u8>)>,
    slowest: Duration,
}

impl GoodClient {
    fn new(port: u16, topic: &str) -> GoodClient {
        create_topic(port, topic);
        GoodClient {
            port,
            s: connect(port),
            topic: topic.to_string(),
            correlation: 0,
            acked: Vec::new(),
            slowest: Duration::ZERO,
        }
    }

    fn produce(&mut self) {
        self.correlation += 1;
        let value = format!("value-{}", self.correlation);
        let batch = simple_batch(&[(Some(b"k"), Some(value.as_bytes()))], Timestamp(1));
        self.s
            .write_all(&frame(
                ApiKey::Produce,
                9,
                self.correlation,
                &produce_request(&self.topic, batch.clone()),
            ))
            .unwrap();
        let (correlation, r): (i32, ProduceResponse) = response(&mut self.s, ApiKey::Produce, 9);
        assert_eq!(correlation, self.correlation);
        let p = &r.responses[0].partition_responses[0];
        assert_eq!(p.error_code, 0, "the good client's produce failed");
        if let Some(&(last, _)) = self.acked.last() {
            assert_eq!(p.base_offset, last + 1, "acknowledged offsets have a gap");
        }
        self.acked.push((p.base_offset, batch[16..].to_vec()));
    }

    /// Reads the partition from the start and checks every acknowledged batch.
    fn verify(&mut self) {
        let mut found = Vec::new();
        let mut offset = 0;
        while found.len() < self.acked.len() {
            self.correlation += 1;
            self.s
                .write_all(&frame(
                    ApiKey::Fetch,
                    12,
                    self.correlation,
                    &fetch_request(&self.topic, 0, offset, 8 << 20),
                ))
                .unwrap();
            let (correlation, r): (i32, FetchResponse) = response(&mut self.s, ApiKey::Fetch, 12);
            assert_eq!(correlation, self.correlation);
            let p = &r.responses[0].partitions[0];
            assert_eq!(p.error_code, 0, "the good client's fetch failed");
            let batches = split_batches(p.records.as_deref().unwrap_or(&[]));
            assert!(!batches.is_empty(), "a fetch returned nothing");
            offset = batches.last().unwrap().0 + 1;
            found.extend(batches);
        }
        assert_eq!(found, self.acked, "acknowledged data differs");
    }

    /// One produce and a full read-back; returns how long it took.
    fn round(&mut self) -> Duration {
        let started = Instant::now();
        self.produce();
        self.verify();
        let took = started.elapsed();
        self.slowest = self.slowest.max(took);
        took
    }

    /// A new connection, e.g. after the broker restarted.
    fn reconnect(&mut self) {
        self.s = connect(self.port);
    }
}

/// A small deterministic generator (xorshift64*), so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

#[test]
fn random_frames_never_hurt_the_broker() {
    let broker = start(&["--connections-max-idle-ms", "3000"], None);
    let mut good = GoodClient::new(broker.port, "victim");
    good.round();
    let seed = 0x5eed_0001;
    let mut rng = Rng(seed);
    // APIs whose random bodies cannot change the good client's topic (the ACL, quota, SCRAM
    // and log-directory changes among them store nothing).
    let apis: &[(ApiKey, i16, i16)] = &[
        (ApiKey::Produce, 3, 12),
        (ApiKey::Fetch, 4, 18),
        (ApiKey::ListOffsets, 1, 10),
        (ApiKey::Metadata, 0, 13),
        (ApiKey::ApiVersions, 0, 4),
        (ApiKey::DescribeConfigs, 1, 4),
        (ApiKey::InitProducerId, 0, 4),
        (ApiKey::FindCoordinator, 0, 4),
        (ApiKey::Heartbeat, 0, 4),
        (ApiKey::OffsetFetch, 1, 8),
        (ApiKey::ListGroups, 0, 4),
        (ApiKey::DescribeGroups, 0, 5),
        (ApiKey::DescribeCluster, 0, 1),
        (ApiKey::ConsumerGroupDescribe, 0, 1),
        (ApiKey::OffsetForLeaderEpoch, 2, 4),
        (ApiKey::DescribeTopicPartitions, 0, 0),
        (ApiKey::DescribeLogDirs, 1, 4),
        (ApiKey::AlterReplicaLogDirs, 1, 2),
        (ApiKey::ListConfigResources, 0, 1),
        (ApiKey::DescribeProducers, 0, 0),
        (ApiKey::DescribeAcls, 1, 3),
        (ApiKey::CreateAcls, 1, 3),
        (ApiKey::DeleteAcls, 1, 3),
        (ApiKey::DescribeClientQuotas, 0, 1),
        (ApiKey::AlterClientQuotas, 0, 1),
        (ApiKey::DescribeUserScramCredentials, 0, 0),
        (ApiKey::AlterUserScramCredentials, 0, 0),
    ];
    let started = Instant::now();
    let mut open = Vec::new();
    let mut sent = 0usize;
    for round in 0..3 {
        for i in 0..100 {
            // Sizes from a few bytes to 256 KiB.
            let len = match rng.below(10) {
                0 => rng.below(256 << 10) as usize,
                1..=3 => rng.below(4096) as usize,
                _ => rng.below(200) as usize,
            };
            let bytes = match round {
                // Anything at all, size prefix included.
                0 => rng.bytes(len.max(1)),
                // A true size prefix, then random bytes.
                1 => with_size(&rng.bytes(len)),
                // A valid header of a supported API and version, then a random body.
                _ => {
                    let (key, min, max) = apis[rng.below(apis.len() as u64) as usize];
                    let version = min + rng.below((max - min + 1) as u64) as i16;
                    let mut body = header_bytes(key, version, i);
                    body.extend_from_slice(&rng.bytes(len));
                    with_size(&body)
                }
            };
            let mut s = connect(broker.port);
            // The broker may close before it has read everything: then writing fails, as it may.
            let _ = s.write_all(&bytes);
            let _ = s.shutdown(Shutdown::Write);
            sent += 1;
            open.push(s);
        }
        good.round();
    }
    // Every connection ends: answered, refused, or closed as idle.
    let mut still_open = 0;
    for s in &mut open {
        if !closed_within(s, DEADLINE) {
            still_open += 1;
        }
    }
    good.round();
    eprintln!(
        "random frames: {sent} sent (seed {seed:#x}) in {:?}; {} bad-request, {} malformed, {} \
         size lines; slowest good round {:?}",
        started.elapsed(),
        log_count(&broker, "bad request; closing"),
        log_count(&broker, "malformed request; closing"),
        log_count(&broker, "frame size out of bounds; closing"),
        good.slowest
    );
    assert_eq!(still_open, 0, "connections the broker never closed");
    assert!(
        log_count(&broker, "bad request; closing")
            + log_count(&broker, "malformed request; closing")
            + log_count(&broker, "frame size out of bounds; closing")
            >= sent / 2,
        "most random frames are refused with a log line"
    );
    assert_rss_bounded(&broker, "random frames");
}

#[test]
fn bad_size_prefixes_close_only_their_connection() {
    let broker = start(&["--connections-max-idle-ms", "2000"], None);
    let mut good = GoodClient::new(broker.port, "victim");
    good.round();
    // Sizes bad_input.rs does not try: the most negative, -2, just above the 100 MiB
    // socket.request.max.bytes, 2 GiB exactly (as u32), and 0 (shorter than a header).
    for size in [i32::MIN, -2, 104_857_601, 0x7fff_ffff, 0] {
        let mut s = connect(broker.port);
        s.write_all(&size.to_be_bytes()).unwrap();
        assert!(
            closed_within(&mut s, DEADLINE),
            "size {size} did not close the connection"
        );
    }
    // A bad size after good requests on the same connection: the good ones are answered first.
    let mut s = connect(broker.port);
    let mut bytes = Vec::new();
    for correlation in 0..5 {
        bytes.extend(frame(
            ApiKey::ApiVersions,
            3,
            correlation,
            &ApiVersionsRequest::default()
                .with_client_software_name(StrBytes::from_static_str("abuse"))
                .with_client_software_version(StrBytes::from_static_str("1")),
        ));
    }
    bytes.extend_from_slice(&(-1i32).to_be_bytes());
    s.write_all(&bytes).unwrap();
    for correlation in 0..5 {
        let mut body = read_frame(&mut s).expect("the requests before the bad size are answered");
        assert_eq!(
            i32::from_be_bytes(body.split_to(4)[..].try_into().unwrap()),
            correlation
        );
    }
    assert!(closed_within(&mut s, DEADLINE));
    // 500 connections announcing 2 GiB: nothing allocated for any of them.
    let started = Instant::now();
    for i in 0..500 {
        let mut s = connect(broker.port);
        s.write_all(&0x7fff_fff0u32.to_be_bytes()).unwrap();
        assert!(closed_within(&mut s, DEADLINE));
        if i % 50 == 0 {
            good.round();
        }
    }
    let took = started.elapsed();
    good.round();
    // 200 connections announcing the largest allowed frame (100 MiB) and sending 1 KiB of it:
    // memory follows the bytes that arrived, not the size announced, and the idle timeout
    // closes them.
    let mut partial = Vec::new();
    for _ in 0..200 {
        let mut s = connect(broker.port);
        s.write_all(&104_857_600u32.to_be_bytes()).unwrap();
        s.write_all(&[7u8; 1024]).unwrap();
        partial.push(s);
    }
    good.round();
    let peak = assert_rss_bounded(&broker, "bad size prefixes");
    for s in &mut partial {
        assert!(
            closed_within(s, DEADLINE),
            "a partial 100 MiB frame was never closed"
        );
    }
    // The good client sat idle as long, so it was closed too, as Kafka would.
    good.reconnect();
    good.round();
    let lines = log_count(&broker, "frame size out of bounds; closing");
    let idle = log_count(&broker, "idle in the middle of a request");
    eprintln!(
        "bad size prefixes: 506 closed ({lines} log lines), 500 × 2 GiB in {took:?}; 200 partial \
         100 MiB frames closed as idle ({idle} lines); peak RSS {} MiB",
        peak / 1024
    );
    assert!(lines >= 505, "each bad size has its log line");
    assert!(idle >= 200, "each partial frame was closed as idle");
}

#[test]
fn huge_array_counts_allocate_nothing() {
    let broker = start(&[], None);
    let mut good = GoodClient::new(broker.port, "victim");
    good.round();
    let max = i32::MAX.to_be_bytes();
    let frames: Vec<(&str, Vec<u8>)> = vec![
        // Metadata v1: topics (array) = 2^31-1.
        ("Metadata v1 topics", {
            let mut b = header_bytes(ApiKey::Metadata, 1, 1);
            b.extend_from_slice(&max);
            b.extend_from_slice(&[0; 16]);
            with_size(&b)
        }),
        // Metadata v12 (flexible): topics (compact array) = 2^32-2.
        ("Metadata v12 topics", {
            let mut b = header_bytes(ApiKey::Metadata, 12, 2);
            b.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
            b.extend_from_slice(&[0; 16]);
            with_size(&b)
        }),
        // Produce v3: no transactional id, acks, timeout, topics = 2^31-1.
        ("Produce v3 topics", {
            let mut b = header_bytes(ApiKey::Produce, 3, 3);
            b.extend_from_slice(&(-1i16).to_be_bytes());
            b.extend_from_slice(&(-1i16).to_be_bytes());
            b.extend_from_slice(&5000i32.to_be_bytes());
            b.extend_from_slice(&max);
            b.extend_from_slice(&[0; 8]);
            with_size(&b)
        }),
        // Produce v3: one topic "victim" with 2^31-1 partitions.
        ("Produce v3 partitions", {
            let mut b = header_bytes(ApiKey::Produce, 3, 4);
            b.extend_from_slice(&(-1i16).to_be_bytes());
            b.extend_from_slice(&(-1i16).to_be_bytes());
            b.extend_from_slice(&5000i32.to_be_bytes());
            b.extend_from_slice(&1i32.to_be_bytes());
            b.extend_from_slice(&6i16.to_be_bytes());
            b.extend_from_slice(b"victim");
            b.extend_from_slice(&max);
            with_size(&b)
        }),
        // Fetch v4: replica, max wait, min bytes, max bytes, isolation, topics = 2^31-1.
        ("Fetch v4 topics", {
            let mut b = header_bytes(ApiKey::Fetch, 4, 5);
            for v in [-1i32, 100, 1, 1 << 20] {
                b.extend_from_slice(&v.to_be_bytes());
            }
            b.extend_from_slice(&[0]);
            b.extend_from_slice(&max);
            with_size(&b)
        }),
        // CreateTopics v2: topics = 2^31-1 (nothing may be created).
        ("CreateTopics v2 topics", {
            let mut b = header_bytes(ApiKey::CreateTopics, 2, 6);
            b.extend_from_slice(&max);
            b.extend_from_slice(&[0; 12]);
            with_size(&b)
        }),
        // Metadata v1 with 50 million topics: 3.6 GB at 72 bytes each.
        ("Metadata v1 50M topics", {
            let mut b = header_bytes(ApiKey::Metadata, 1, 7);
            b.extend_from_slice(&50_000_000i32.to_be_bytes());
            b.extend_from_slice(&[0; 16]);
            with_size(&b)
        }),
    ];
    const REPEATS: usize = 20;
    let started = Instant::now();
    for (name, bytes) in &frames {
        assert!(bytes.len() <= 64, "{name}: {} bytes", bytes.len());
        for _ in 0..REPEATS {
            let mut s = connect(broker.port);
            s.write_all(bytes).unwrap();
            assert!(
                closed_within(&mut s, DEADLINE),
                "{name}: the connection stayed open"
            );
        }
        good.round();
    }
    let lines = log_count(&broker, "malformed request; closing the connection");
    eprintln!(
        "huge array counts: {} frames of at most 64 bytes claiming up to 2^32-2 elements, in \
         {:?}; {lines} log lines",
        frames.len() * REPEATS,
        started.elapsed()
    );
    assert!(lines >= frames.len() * REPEATS);
    assert_rss_bounded(&broker, "huge array counts");
}

#[test]
fn ten_thousand_abandoned_connections_leak_nothing() {
    let broker = start(&[], None);
    let mut good = GoodClient::new(broker.port, "victim");
    good.round();
    std::thread::sleep(Duration::from_millis(200));
    let baseline = fd_count(&broker);
    const WAVES: usize = 10;
    const WAVE: usize = 1000;
    let started = Instant::now();
    let mut peak_fds = 0;
    for wave in 0..WAVES {
        let mut conns = Vec::with_capacity(WAVE);
        for i in 0..WAVE {
            let mut s = connect(broker.port);
            match i % 3 {
                0 => {}
                1 => s.write_all(&[0, 0, 1, 0, 0, 18]).unwrap(),
                _ => s
                    .write_all(&frame(
                        ApiKey::ApiVersions,
                        0,
                        i as i32,
                        &ApiVersionsRequest::default(),
                    ))
                    .unwrap(),
            }
            conns.push(s);
        }
        peak_fds = peak_fds.max(fd_count(&broker));
        let took = good.round();
        assert!(
            took < Duration::from_secs(5),
            "wave {wave}: the good client took {took:?}"
        );
        drop(conns);
    }
    let opened = started.elapsed();
    // Every descriptor comes back.
    let deadline = Instant::now() + DEADLINE;
    let mut fds = fd_count(&broker);
    while fds > baseline + 5 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        fds = fd_count(&broker);
    }
    good.round();
    let closed_lines = wait_for_log(&broker, "connection closed", WAVES * WAVE, DEADLINE);
    eprintln!(
        "abandoned connections: {} in {WAVES} waves in {opened:?}; broker fds: baseline \
         {baseline}, peak {peak_fds}, after {fds}; {closed_lines} close lines; slowest good \
         round {:?}",
        WAVES * WAVE,
        good.slowest
    );
    assert!(
        fds <= baseline + 5,
        "descriptors leaked: {baseline} before, {fds} after"
    );
    assert_rss_bounded(&broker, "abandoned connections");
}

#[test]
fn connection_limits_refuse_with_one_log_line_and_recover() {
    let broker = start(
        &["--max-connections", "60", "--max-connections-per-ip", "25"],
        None,
    );
    let ip = |last: u8| Ipv4Addr::new(127, 0, 0, last);
    // Served: a request gets its answer.
    let served = |s: &mut TcpStream| {
        s.write_all(&frame(
            ApiKey::ApiVersions,
            0,
            1,
            &ApiVersionsRequest::default(),
        ))
        .is_ok()
            && read_frame(s).is_some()
    };
    // 25 at once from one address are served. The start-up probe's connections from that
    // address may not have been closed on the broker's side yet (a loaded host): a connection
    // refused while they linger is tried again, until the deadline.
    let deadline = Instant::now() + DEADLINE;
    let mut from_1: Vec<TcpStream> = Vec::new();
    while from_1.len() < 25 {
        let mut s = connect_from(ip(1), broker.port).unwrap();
        if served(&mut s) {
            from_1.push(s);
        } else {
            assert!(
                Instant::now() < deadline,
                "a connection under the limits was refused ({} served)",
                from_1.len()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // 2,000 more from the same address: each closed at once, with few log lines.
    let started = Instant::now();
    for _ in 0..2000 {
        let mut s = connect_from(ip(1), broker.port).unwrap();
        assert!(
            closed_within(&mut s, DEADLINE),
            "a connection over max.connections.per.ip stayed open"
        );
    }
    let refused_in = started.elapsed();
    // Other addresses are still served, up to max.connections in all.
    let mut from_2: Vec<TcpStream> = (0..25)
        .map(|_| connect_from(ip(2), broker.port).unwrap())
        .collect();
    let mut from_3: Vec<TcpStream> = (0..10)
        .map(|_| connect_from(ip(3), broker.port).unwrap())
        .collect();
    for s in from_2.iter_mut().chain(from_3.iter_mut()) {
        assert!(served(s));
    }
    let mut over = connect_from(ip(4), broker.port).unwrap();
    assert!(
        closed_within(&mut over, DEADLINE),
        "the 61st connection was not refused"
    );
    // Closing some makes room again.
    from_1.truncate(20);
    from_3.clear();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let mut s = connect_from(ip(1), broker.port).unwrap();
        if served(&mut s) {
            break;
        }
        assert!(Instant::now() < deadline, "room was never made again");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut good = GoodClient::new(broker.port, "victim");
    good.round();
    let lines = log_count(&broker, "refused a connection");
    eprintln!(
        "connection limits: 2,001+ refusals in {refused_in:?}, {lines} log lines; served again \
         after closing"
    );
    assert!(log_count(&broker, "max.connections.per.ip (25) reached") >= 1);
    assert!(lines <= 5, "refusals flood the log: {lines} lines");
    assert_rss_bounded(&broker, "connection limits");
}

#[test]
fn slowloris_connections_are_closed_and_others_served() {
    // The active client's margin is this less its 200 ms between rounds: at 2000 a test
    // thread stalled 2 s on a loaded 2-core host once (the broker closed the good connection
    // as idle, correctly).
    const IDLE_MS: u64 = 4000;
    let broker = start(&["--connections-max-idle-ms", &IDLE_MS.to_string()], None);
    let mut good = GoodClient::new(broker.port, "victim");
    good.round();
    let request = frame(ApiKey::ApiVersions, 0, 1, &ApiVersionsRequest::default());
    const SLOW: usize = 300;
    let mut slow: Vec<(TcpStream, Option<Instant>)> = (0..SLOW)
        .map(|_| {
            let s = connect(broker.port);
            s.set_nonblocking(true).unwrap();
            (s, None)
        })
        .collect();
    let started = Instant::now();
    let mut sent = 0usize;
    let mut next_byte = Instant::now();
    // One byte per second on each, while the good client works.
    while slow.iter().any(|(_, c)| c.is_none()) {
        assert!(
            started.elapsed() < Duration::from_millis(IDLE_MS) + DEADLINE,
            "slow connections were never closed"
        );
        if Instant::now() >= next_byte {
            for (s, closed) in slow.iter_mut().filter(|(_, c)| c.is_none()) {
                if s.write_all(&request[sent..sent + 1]).is_err() {
                    *closed = Some(Instant::now());
                }
            }
            sent += 1;
            next_byte += Duration::from_secs(1);
        }
        for (s, closed) in slow.iter_mut().filter(|(_, c)| c.is_none()) {
            let mut b = [0u8; 64];
            match s.read(&mut b) {
                Ok(0) => *closed = Some(Instant::now()),
                Ok(_) => panic!("a request trickled byte by byte was answered"),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => *closed = Some(Instant::now()),
            }
        }
        let took = good.round();
        assert!(
            took < Duration::from_secs(2),
            "the good client took {took:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let last_closed = slow
        .iter()
        .filter_map(|(_, c)| *c)
        .max()
        .unwrap()
        .duration_since(started);
    let lines = log_count(&broker, "closing a connection idle");
    eprintln!(
        "slowloris: {SLOW} connections at 1 byte/s, {sent} bytes each at most, all closed \
         {last_closed:?} after the first byte (connections.max.idle.ms {IDLE_MS}); {lines} log \
         lines; slowest good round {:?}",
        good.slowest
    );
    assert!(sent < request.len(), "no trickled request completed");
    assert!(lines >= SLOW);
    // A connection that sends nothing is closed too, and an active one is not.
    let mut silent = connect(broker.port);
    for _ in 0..((IDLE_MS as usize * 2) / 200) {
        good.round();
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(closed_within(&mut silent, Duration::from_secs(5)));
    good.round();
    assert!(log_count(&broker, "idle waiting for a request") >= 1);
    assert_rss_bounded(&broker, "slowloris");
}

#[test]
fn a_half_closed_connection_gets_every_response() {
    let broker = start(&[], None);
    let mut good = GoodClient::new(broker.port, "victim");
    good.round();
    create_topic(broker.port, "half");
    let mut s = connect(broker.port);
    let mut bytes = Vec::new();
    for correlation in 0..20 {
        if correlation % 2 == 0 {
            let batch = simple_batch(&[(Some(b"h"), Some(b"half"))], Timestamp(2));
            bytes.extend(frame(
                ApiKey::Produce,
                9,
                correlation,
                &produce_request("half", batch),
            ));
        } else {
            bytes.extend(frame(
                ApiKey::Metadata,
                12,
                correlation,
                &MetadataRequest::default(),
            ));
        }
    }
    s.write_all(&bytes).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    for correlation in 0..20 {
        let mut body = read_frame(&mut s).expect("every request before the half-close answered");
        assert_eq!(
            i32::from_be_bytes(body.split_to(4)[..].try_into().unwrap()),
            correlation
        );
    }
    assert!(
        closed_within(&mut s, DEADLINE),
        "the broker did not close after answering"
    );
    wait_for_log(
        &broker,
        "connection closed: closed by the client",
        1,
        DEADLINE,
    );
    // Its own line: another connection (the start-up probe's, the good client's) may close
    // first, so wait for the one that counts 20 requests.
    wait_for_log(&broker, "requests=20", 1, DEADLINE);
    good.round();
    eprintln!("half-close: 20 requests, 20 responses in order, then closed by the broker");
    assert_rss_bounded(&broker, "half-close");
}

#[test]
fn a_thousand_pipelined_requests_answer_in_order() {
    let broker = start(&[], None);
    let mut good = GoodClient::new(broker.port, "victim");
    good.round();
    create_topic(broker.port, "pipelined");
    const N: i32 = 1000;
    let mut s = connect(broker.port);
    let mut writer = s.try_clone().unwrap();
    let started = Instant::now();
    let sender = std::thread::spawn(move || {
        for correlation in 0..N {
            let bytes = match correlation % 4 {
                0 | 1 => frame(
                    ApiKey::Produce,
                    9,
                    correlation,
                    &produce_request(
                        "pipelined",
                        simple_batch(
                            &[(None, Some(format!("{correlation}").as_bytes()))],
                            Timestamp(3),
                        ),
                    ),
                ),
                2 => frame(
                    ApiKey::Metadata,
                    12,
                    correlation,
                    &MetadataRequest::default(),
                ),
                _ => frame(
                    ApiKey::Fetch,
                    12,
                    correlation,
                    &fetch_request("pipelined", 0, 0, 1 << 20),
                ),
            };
            writer.write_all(&bytes).unwrap();
        }
    });
    let mut next_offset = 0;
    for correlation in 0..N {
        let key = match correlation % 4 {
            0 | 1 => ApiKey::Produce,
            2 => ApiKey::Metadata,
            _ => ApiKey::Fetch,
        };
        if key == ApiKey::Produce {
            let (c, r): (i32, ProduceResponse) = response(&mut s, key, 9);
            assert_eq!(c, correlation, "responses out of order");
            let p = &r.responses[0].partition_responses[0];
            assert_eq!(p.error_code, 0);
            assert_eq!(p.base_offset, next_offset, "produces applied out of order");
            next_offset += 1;
        } else {
            let mut body = read_frame(&mut s).expect("a response");
            assert_eq!(
                i32::from_be_bytes(body.split_to(4)[..].try_into().unwrap()),
                correlation,
                "responses out of order"
            );
        }
    }
    sender.join().unwrap();
    let took = started.elapsed();
    drop(s);
    wait_for_log(&broker, "requests=1000", 1, DEADLINE);
    good.round();
    eprintln!("pipelining: {N} requests on one connection answered in order in {took:?}");
    assert_rss_bounded(&broker, "pipelining");
}

#[test]
fn a_client_that_never_reads_holds_bounded_memory() {
    const IDLE_MS: u64 = 4000;
    let broker = start(&["--connections-max-idle-ms", &IDLE_MS.to_string()], None);
    let mut good = GoodClient::new(broker.port, "victim");
    good.round();
    // 256 KiB of data, so each fetch response is that big.
    create_topic(broker.port, "big");
    let mut p = connect(broker.port);
    for i in 0..32 {
        let value = vec![b'x'; 8 << 10];
        p.write_all(&frame(
            ApiKey::Produce,
            9,
            i,
            &produce_request("big", simple_batch(&[(None, Some(&value))], Timestamp(4))),
        ))
        .unwrap();
        let (_, r): (i32, ProduceResponse) = response(&mut p, ApiKey::Produce, 9);
        assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
    }
    let before = peak_rss_kb(&broker);
    // Fetch and Metadata requests, never reading a response, until the broker stops reading.
    let mut s = connect(broker.port);
    s.set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let fetch = frame(ApiKey::Fetch, 12, 0, &fetch_request("big", 0, 0, 1 << 20));
    let metadata = frame(ApiKey::Metadata, 12, 0, &MetadataRequest::default());
    let mut sent = 0usize;
    let started = Instant::now();
    while sent < 300_000 && started.elapsed() < Duration::from_secs(5) {
        let bytes = if sent.is_multiple_of(2) {
            &fetch
        } else {
            &metadata
        };
        if s.write_all(bytes).is_err() {
            break;
        }
        sent += 1;
    }
    let blocked_after = started.elapsed();
    // The broker holds at most max.in.flight.requests.per.connection responses for it, and
    // serves everyone else meanwhile.
    for _ in 0..10 {
        good.round();
    }
    let peak = assert_rss_bounded(&broker, "never-reading client");
    eprintln!(
        "never-reading client: writes blocked after {sent} requests ({blocked_after:?}); peak RSS \
         {} MiB before, {} MiB after; slowest good round {:?}",
        before / 1024,
        peak / 1024,
        good.slowest
    );
    assert!(
        sent < 300_000,
        "the broker kept reading from a client that never reads"
    );
    assert!(
        peak < before + 128 * 1024,
        "memory grew by {} MiB for one unread connection",
        (peak - before) / 1024
    );
    // With no progress for connections.max.idle.ms it is closed.
    wait_for_log(
        &broker,
        "idle with its responses unread",
        1,
        Duration::from_millis(IDLE_MS) + DEADLINE,
    );
    good.reconnect();
    good.round();
}

#[test]
fn running_out_of_file_descriptors_loses_nothing_and_recovers() {
    const NOFILE: u64 = 256;
    let mut broker = start(&[], Some(NOFILE));
    let mut good = GoodClient::new(broker.port, "victim");
    for _ in 0..10 {
        good.produce();
    }
    good.verify();
    let baseline = fd_count(&broker);
    // Hogs until the broker can accept no more.
    let mut hogs = Vec::new();
    let deadline = Instant::now() + DEADLINE;
    while log_count(&broker, "out of file descriptors") == 0 {
        assert!(
            Instant::now() < deadline,
            "no descriptor exhaustion after {} hogs",
            hogs.len()
        );
        for _ in 0..20 {
            hogs.push(connect(broker.port));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let exhausted_fds = fd_count(&broker);
    // Existing clients keep producing and fetching.
    for _ in 0..10 {
        good.produce();
    }
    good.verify();
    // A new client is closed at once instead of waiting without an answer.
    let mut newcomer = connect(broker.port);
    let _ = newcomer.write_all(&frame(
        ApiKey::ApiVersions,
        0,
        1,
        &ApiVersionsRequest::default(),
    ));
    let refused = closed_within(&mut newcomer, Duration::from_secs(5));
    // The hogs go; new connections are served again.
    let hog_count = hogs.len();
    drop(hogs);
    let deadline = Instant::now() + DEADLINE;
    let recovered_in = Instant::now();
    loop {
        let mut s = connect(broker.port);
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        if s.write_all(&frame(
            ApiKey::ApiVersions,
            0,
            1,
            &ApiVersionsRequest::default(),
        ))
        .is_ok()
            && read_frame(&mut s).is_some()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "connections were never accepted again"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let recovered_in = recovered_in.elapsed();
    wait_for_log(&broker, "accepting connections again", 1, DEADLINE);
    good.reconnect();
    good.round();
    // Everything acknowledged is there after a clean restart too.
    let status = broker.stop();
    assert!(
        status.is_some_and(|s| s.success()),
        "the broker did not stop cleanly: {status:?}"
    );
    broker.start_again();
    good.reconnect();
    good.verify();
    good.round();
    eprintln!(
        "ulimit -n {NOFILE}: broker fds {baseline} at rest, {exhausted_fds} when exhausted after \
         {hog_count} hogs; {} acknowledged batches intact (and after a restart); newcomer closed \
         at once: {refused}; served again {recovered_in:?} after the hogs closed; {} exhaustion \
         log lines",
        good.acked.len(),
        log_count(&broker, "out of file descriptors")
    );
    assert!(
        refused,
        "a new client got no answer while descriptors were exhausted"
    );
    assert_rss_bounded(&broker, "descriptor exhaustion");
}
