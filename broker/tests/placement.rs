//! Partitions are spread over the shards (cores) and keep their owner across restarts.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, RequestHeader, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};

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
    let status = child.wait().unwrap();
    assert!(status.success(), "broker exited with {status}");
}

fn owners(dir: &std::path::Path, topic: &str) -> Vec<u64> {
    let text = std::fs::read_to_string(dir.join(".sluice-metadata.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["topics"][topic]["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[test]
fn partitions_are_spread_over_shards_and_keep_their_owner() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let broker = start(&dir, port);
    let request = CreateTopicsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(StrBytes::from_static_str("spread")))
            .with_num_partitions(4)
            .with_replication_factor(1)]);
    let header = RequestHeader::default()
        .with_request_api_key(ApiKey::CreateTopics as i16)
        .with_request_api_version(7)
        .with_correlation_id(1);
    let mut buf = BytesMut::new();
    header
        .encode(&mut buf, ApiKey::CreateTopics.request_header_version(7))
        .unwrap();
    request.encode(&mut buf, 7).unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&(buf.len() as u32).to_be_bytes()).unwrap();
    s.write_all(&buf).unwrap();
    let mut size = [0u8; 4];
    s.read_exact(&mut size).unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(size) as usize];
    s.read_exact(&mut body).unwrap();
    let before = owners(&dir, "spread");
    assert_eq!(before.len(), 4);
    assert!(
        before.contains(&0) && before.contains(&1),
        "4 partitions on 2 shards must use both: {before:?}"
    );
    stop(broker);
    let broker = start(&dir, port);
    stop(broker);
    assert_eq!(
        owners(&dir, "spread"),
        before,
        "placement changed across a restart"
    );
}
