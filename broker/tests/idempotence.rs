//! Idempotent produce over the wire, deterministically: a retried batch (same producer id,
//! epoch and sequence) is answered with its original offsets and not appended again; a gap in
//! the sequence is OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch is INVALID_PRODUCER_EPOCH; and
//! the dedupe state survives a restart.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, InitProducerIdRequest, InitProducerIdResponse, ProduceRequest,
    ProduceResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use sluice_engine::batch::{BatchBuilder, NewRecord};
use sluice_engine::Timestamp;

/// The broker process this test started; SIGKILLed if the test fails before stopping it.
struct Running(Option<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn start(dir: &std::path::Path, port: u16) -> Running {
    let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["--data-dir", dir.to_str().unwrap()])
        .args([
            "--listeners",
            &format!("PLAINTEXT://127.0.0.1:{port}"),
            "--cores",
            "2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start sluice");
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "broker did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Running(Some(child))
}

fn stop(mut running: Running) {
    let mut child = running.0.take().expect("running");
    // SAFETY: signalling the child this test started.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    assert!(child.wait().unwrap().success());
}

fn call<Req: Encodable, Resp: Decodable>(
    s: &mut TcpStream,
    key: ApiKey,
    version: i16,
    request: &Req,
) -> Resp {
    let header = RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(7);
    let mut buf = BytesMut::new();
    header
        .encode(&mut buf, key.request_header_version(version))
        .unwrap();
    request.encode(&mut buf, version).unwrap();
    s.write_all(&(buf.len() as u32).to_be_bytes()).unwrap();
    s.write_all(&buf).unwrap();
    let mut size = [0u8; 4];
    s.read_exact(&mut size).unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(size) as usize];
    s.read_exact(&mut body).unwrap();
    let mut body = Bytes::from(body);
    ResponseHeader::decode(&mut body, key.response_header_version(version)).unwrap();
    Resp::decode(&mut body, version).unwrap()
}

fn batch(pid: i64, epoch: i16, seq: i32, n: usize) -> Bytes {
    let mut b = BatchBuilder::new().producer(pid, epoch, seq);
    for i in 0..n {
        b.push(&NewRecord {
            value: Some(format!("{seq}-{i}").into_bytes()),
            timestamp: Timestamp(1),
            ..Default::default()
        });
    }
    b.build()
}

/// (error code, base offset)
fn produce(s: &mut TcpStream, records: Bytes) -> (i16, i64) {
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str("idem")))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(records))])]);
    let r: ProduceResponse = call(s, ApiKey::Produce, 9, &request);
    let p = &r.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

#[test]
fn retried_batches_are_answered_with_their_first_offsets_across_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let broker = start(&dir, port);
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let create = CreateTopicsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(StrBytes::from_static_str("idem")))
            .with_num_partitions(1)
            .with_replication_factor(1)]);
    let _: kafka_protocol::messages::CreateTopicsResponse =
        call(&mut s, ApiKey::CreateTopics, 7, &create);
    let init: InitProducerIdResponse = call(
        &mut s,
        ApiKey::InitProducerId,
        4,
        &InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60_000),
    );
    assert_eq!(init.error_code, 0);
    let (pid, epoch) = (init.producer_id.0, init.producer_epoch);
    assert!(pid >= 0);

    assert_eq!(produce(&mut s, batch(pid, epoch, 0, 5)), (0, 0));
    assert_eq!(produce(&mut s, batch(pid, epoch, 5, 5)), (0, 5));
    // The retry of the second batch: same offsets, nothing appended.
    assert_eq!(produce(&mut s, batch(pid, epoch, 5, 5)), (0, 5));
    assert_eq!(
        produce(&mut s, batch(pid, epoch, 10, 1)),
        (0, 10),
        "a retry must not take offsets"
    );
    // A gap in the sequence, and an older epoch.
    assert_eq!(
        produce(&mut s, batch(pid, epoch, 20, 1)).0,
        45,
        "OUT_OF_ORDER_SEQUENCE_NUMBER"
    );
    if epoch > 0 {
        assert_eq!(
            produce(&mut s, batch(pid, epoch - 1, 11, 1)).0,
            47,
            "INVALID_PRODUCER_EPOCH"
        );
    }
    drop(s);

    // After a clean restart and after a kill -9, the retry is still recognised.
    stop(broker);
    let mut broker = start(&dir, port);
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(produce(&mut s, batch(pid, epoch, 10, 1)), (0, 10));
    assert_eq!(produce(&mut s, batch(pid, epoch, 11, 2)), (0, 11));
    drop(s);
    let mut child = broker.0.take().expect("running");
    child.kill().unwrap();
    child.wait().unwrap();
    // The killed process's listening socket can linger a moment after it is reaped.
    let gone = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_ok()
        && gone.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let broker = start(&dir, port);
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(
        produce(&mut s, batch(pid, epoch, 11, 2)),
        (0, 11),
        "retry after kill -9 must not be appended again"
    );
    assert_eq!(produce(&mut s, batch(pid, epoch, 13, 1)), (0, 13));
    // A bumped epoch starts over at sequence 0.
    assert_eq!(produce(&mut s, batch(pid, epoch + 1, 0, 1)), (0, 14));
    drop(s);
    stop(broker);
}
