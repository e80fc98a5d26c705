//! Zero-copy fetch (`fetch.zero.copy`): records on disk go from the segment file to the socket
//! by splice. Shown on a real broker, restarted so its batch cache is empty and every record is
//! read from disk:
//! - every byte fetched equals the byte produced, batch by batch, CRC-checked, from the start,
//!   from the middle of a batch, and with a budget smaller than one batch;
//! - the bytes went through the page cache (spliced), which the O_DIRECT copying path never
//!   fills: with `--fetch-zero-copy false` the same fetches leave the page cache empty;
//! - a client that stops reading in the middle of a spliced response holds up no one else, gets
//!   every byte once it reads again, and does not keep the broker from stopping.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{connect, fetch_request, frame, read_frame, request, Broker};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, FetchResponse, ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::{Decodable, StrBytes};
use sluice_engine::batch::simple_batch;
use sluice_engine::Timestamp;

/// Fetch v12: topic names.
const FETCH_VERSION: i16 = 12;

/// A deterministic stream of numbers (xorshift), so a failure reproduces.
struct Numbers(u64);

impl Numbers {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Produces about `bytes` to each partition of `topic` in batches of 1-8 records of 100 B to
/// 12 KiB; returns, per partition, each batch's base offset and bytes from the magic byte on
/// (which the broker stores as sent).
fn produce(
    port: u16,
    topic: &str,
    partitions: i32,
    bytes: usize,
) -> BTreeMap<i32, Vec<(i64, Vec<u8>)>> {
    let mut s = connect(port);
    let mut numbers = Numbers(0x5eed ^ bytes as u64);
    let mut out = BTreeMap::new();
    for p in 0..partitions {
        let mut batches = Vec::new();
        let mut total = 0;
        while total < bytes {
            let n = 1 + numbers.next() % 8;
            let values: Vec<Vec<u8>> = (0..n)
                .map(|i| {
                    let len = 100 + (numbers.next() % 12_000) as usize;
                    (0..len)
                        .map(|j| (j as u64 * 31 + i + p as u64) as u8)
                        .collect()
                })
                .collect();
            let records: Vec<sluice_engine::batch::KeyValue<'_>> = values
                .iter()
                .map(|v| (Some(&b"key"[..]), Some(&v[..])))
                .collect();
            let batch = simple_batch(&records, Timestamp(common::now_ms()));
            total += batch.len();
            let produce = ProduceRequest::default()
                .with_acks(-1)
                .with_timeout_ms(5000)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                    .with_partition_data(vec![PartitionProduceData::default()
                        .with_index(p)
                        .with_records(Some(batch.clone()))])]);
            let response: ProduceResponse = request(&mut s, ApiKey::Produce, 9, &produce);
            let r = &response.responses[0].partition_responses[0];
            assert_eq!(r.error_code, 0, "produce to {topic}-{p}");
            batches.push((r.base_offset, batch[16..].to_vec()));
        }
        out.insert(p, batches);
    }
    out
}

/// The records of the only partition in a fetch response, checked: no error, whole batches,
/// every CRC right. Returns (base offset, bytes from the magic byte on) per batch.
fn batches_of(response: &FetchResponse) -> Vec<(i64, Vec<u8>)> {
    assert_eq!(response.error_code, 0);
    let p = &response.responses[0].partitions[0];
    assert_eq!(p.error_code, 0, "partition error");
    let mut records: &[u8] = p.records.as_deref().unwrap_or_default();
    let mut out = Vec::new();
    while !records.is_empty() {
        let size = sluice_engine::batch::BatchHeader::parse(records)
            .expect("a batch header")
            .total_size()
            .expect("a batch length");
        assert!(
            size <= records.len(),
            "a partial batch of {} bytes",
            records.len()
        );
        let header = sluice_engine::batch::verify(&records[..size]).expect("a good CRC");
        out.push((header.base_offset().0, records[16..size].to_vec()));
        records = &records[size..];
    }
    out
}

/// Fetches a partition from its start to its end in responses of at most `max_bytes`, checking
/// every batch against what was produced. Returns the record bytes fetched.
fn fetch_all(
    s: &mut TcpStream,
    topic: &str,
    partition: i32,
    produced: &[(i64, Vec<u8>)],
    max_bytes: i32,
) -> usize {
    let mut next = 0usize;
    let mut bytes = 0usize;
    while next < produced.len() {
        let offset = produced[next].0;
        let response: FetchResponse = request(
            s,
            ApiKey::Fetch,
            FETCH_VERSION,
            &fetch_request(topic, partition, offset, max_bytes),
        );
        let got = batches_of(&response);
        assert!(
            !got.is_empty(),
            "{topic}-{partition}: nothing at offset {offset}"
        );
        for (base, data) in got {
            assert_eq!(base, produced[next].0, "{topic}-{partition}: batch order");
            assert!(
                data == produced[next].1,
                "{topic}-{partition}: bytes of the batch at {base}"
            );
            bytes += data.len() + 16;
            next += 1;
        }
    }
    bytes
}

/// The partition's segment files.
fn segment_files(broker: &Broker, topic: &str, partition: i32) -> Vec<PathBuf> {
    let dir = broker.data_dir().join(format!("{topic}-{partition}"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no segment in {}", dir.display());
    files
}

/// Drops the files' pages from the page cache.
fn evict(files: &[PathBuf]) {
    for path in files {
        let f = std::fs::File::open(path).unwrap();
        // SAFETY: advice on an open file of this function's; no memory is passed.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
    }
}

/// Bytes of the files in the page cache (mincore).
fn resident_bytes(files: &[PathBuf]) -> usize {
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let mut resident = 0;
    for path in files {
        let f = std::fs::File::open(path).unwrap();
        let len = f.metadata().unwrap().len() as usize;
        if len == 0 {
            continue;
        }
        // SAFETY: a read-only private mapping of an open file, of its length; mincore writes one
        // byte per page into a vector of that many; the mapping is unmapped before the file
        // closes and no reference into it outlives this block.
        unsafe {
            let map = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            );
            assert_ne!(map, libc::MAP_FAILED);
            let mut pages = vec![0u8; len.div_ceil(page)];
            assert_eq!(libc::mincore(map, len, pages.as_mut_ptr()), 0);
            libc::munmap(map, len);
            resident += pages.iter().filter(|&&b| b & 1 == 1).count() * page;
        }
    }
    resident
}

/// Produces, restarts (so the batch cache is empty), evicts the segments from the page cache,
/// fetches everything and the edge cases; returns (bytes fetched, bytes of the segments in the
/// page cache afterwards).
fn cold_fetches(extra: &[&str]) -> (usize, usize) {
    const TOPIC: &str = "cold";
    let mut broker = Broker::start_with(extra);
    broker.create_topic(TOPIC, 2);
    let produced = produce(broker.port, TOPIC, 2, 6 << 20);
    broker.restart();
    let files: Vec<PathBuf> = (0..2)
        .flat_map(|p| segment_files(&broker, TOPIC, p))
        .collect();
    evict(&files);
    let mut s = connect(broker.port);
    let mut fetched = 0;
    for (&p, batches) in &produced {
        // Responses of 1 MiB, then of 64 KiB (many responses end at an index entry short of
        // the budget).
        fetched += fetch_all(&mut s, TOPIC, p, batches, 1 << 20);
        fetched += fetch_all(&mut s, TOPIC, p, &batches[..batches.len() / 3], 64 << 10);
        // From the middle of batches, with a budget of one byte: each time exactly the batch
        // that holds the offset, whole.
        for (base, data) in batches.iter().skip(5).step_by(37) {
            let records = u32::from_be_bytes(data[41..45].try_into().unwrap()) as i64;
            let offset = base + records / 2;
            let response: FetchResponse = request(
                &mut s,
                ApiKey::Fetch,
                FETCH_VERSION,
                &fetch_request(TOPIC, p, offset, 1),
            );
            let got = batches_of(&response);
            assert_eq!(got.len(), 1, "{TOPIC}-{p} at {offset}: one batch");
            assert_eq!(got[0].0, *base);
            assert!(
                got[0].1 == *data,
                "{TOPIC}-{p}: bytes of the batch at {base}"
            );
            fetched += data.len() + 16;
        }
    }
    let resident = resident_bytes(&files);
    let status = broker.stop().expect("the broker stops on SIGTERM");
    assert!(status.success(), "broker exit: {status:?}");
    let log = broker.log_text();
    assert!(!log.contains("panicked"), "{log}");
    assert!(!log.contains("fetch failed"), "{log}");
    (fetched, resident)
}

#[test]
fn cold_fetches_are_spliced_byte_for_byte() {
    let (fetched, resident) = cold_fetches(&[]);
    let (copied, resident_copying) = cold_fetches(&["--fetch-zero-copy", "false"]);
    eprintln!(
        "zero-copy: {fetched} bytes fetched, {resident} of the segments in the page cache; \
         copying: {copied} fetched, {resident_copying} in the page cache"
    );
    assert_eq!(fetched, copied, "both paths fetched the same records");
    // Every distinct byte fetched passed through the page cache (about 12 MiB of segments)...
    assert!(
        resident > 10 << 20,
        "only {resident} bytes of the segments in the page cache: records were not spliced"
    );
    // ...which O_DIRECT reads never fill (a block or so is read buffered at start-up).
    assert!(
        resident_copying < 1 << 20,
        "{resident_copying} bytes in the page cache with zero-copy off"
    );
}

/// Reads one fetch response frame and decodes it.
fn read_fetch(s: &mut TcpStream) -> FetchResponse {
    let mut body = read_frame(s).expect("a response");
    kafka_protocol::messages::ResponseHeader::decode(&mut body, 1).unwrap();
    FetchResponse::decode(&mut body, FETCH_VERSION).unwrap()
}

/// A connection with a small receive buffer that sends `n` fetches of 2 MiB each and reads
/// nothing: the broker's splice to it blocks once the socket buffers are full.
fn stalled_client(port: u16, topic: &str, n: i32) -> TcpStream {
    // SAFETY: a new socket whose descriptor only the returned stream owns; setsockopt and
    // connect get pointers to locals of the right sizes.
    let mut s = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        // Set before connecting, so the window offered to the broker stays small.
        let small: libc::c_int = 64 << 10;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &small as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as u32,
        );
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_be_bytes([127, 0, 0, 1]).to_be(),
            },
            sin_zero: [0; 8],
        };
        let rc = libc::connect(
            fd,
            &addr as *const _ as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        );
        assert_eq!(rc, 0, "connect: {}", std::io::Error::last_os_error());
        <TcpStream as std::os::fd::FromRawFd>::from_raw_fd(fd)
    };
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    for i in 0..n {
        s.write_all(&frame(
            ApiKey::Fetch,
            FETCH_VERSION,
            i,
            &fetch_request(topic, 0, 0, 2 << 20),
        ))
        .unwrap();
    }
    s
}

#[test]
fn a_stalled_reader_of_spliced_records_holds_back_no_one() {
    const TOPIC: &str = "stall";
    let mut broker = Broker::start();
    broker.create_topic(TOPIC, 2);
    let produced = produce(broker.port, TOPIC, 2, 16 << 20);
    broker.restart();
    // Five 2 MiB responses of partition 0 for a client that reads nothing.
    let mut stalled = stalled_client(broker.port, TOPIC, 5);
    std::thread::sleep(Duration::from_secs(1));
    // Everyone else is served meanwhile: every record of both partitions, byte for byte.
    let started = Instant::now();
    let mut good = connect(broker.port);
    for (&p, batches) in &produced {
        fetch_all(&mut good, TOPIC, p, batches, 1 << 20);
    }
    eprintln!(
        "a good consumer read 32 MiB in {:?} beside a stalled one",
        started.elapsed()
    );
    // The stalled client reads again and gets all five responses whole.
    for _ in 0..5 {
        let got = batches_of(&read_fetch(&mut stalled));
        let want = &produced[&0][..got.len()];
        assert!(got.len() > 1);
        for ((base, data), (want_base, want_data)) in got.iter().zip(want) {
            assert_eq!(base, want_base);
            assert!(data == want_data, "bytes of the batch at {base}");
        }
    }
    // A client stalled in the middle of a response does not keep the broker from stopping.
    let _stalled_again = stalled_client(broker.port, TOPIC, 5);
    std::thread::sleep(Duration::from_secs(1));
    let stopping = Instant::now();
    let status = broker.stop().expect("the broker stops on SIGTERM");
    assert!(status.success(), "broker exit: {status:?}");
    eprintln!(
        "stopped in {:?} with a client stalled mid-response",
        stopping.elapsed()
    );
    let log = broker.log_text();
    assert!(!log.contains("panicked"), "{log}");
    // Everything is still there after a restart.
    broker.start_again();
    let mut s = connect(broker.port);
    fetch_all(&mut s, TOPIC, 1, &produced[&1], 1 << 20);
}
