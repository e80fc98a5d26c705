//! A broker whose logs cannot all be opened exits with an error naming the partition, whichever
//! shard owns it, instead of leaving the other shards waiting for it forever.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Broker, BIN};

const TOPIC: &str = "unopenable";
const PARTITIONS: usize = 4;
/// Start-up of an empty broker takes well under a second; a hang is anything past this.
const EXIT_WITHIN: Duration = Duration::from_secs(30);

#[test]
fn a_partition_that_cannot_be_opened_stops_the_broker_with_its_name() {
    let mut broker = Broker::start();
    broker.create_topic(TOPIC, PARTITIONS as i32);
    for p in 0..PARTITIONS {
        broker.ok(
            &["produce", TOPIC, "--partition", &p.to_string()],
            "one\ntwo\n",
        );
    }
    let data = broker.data_dir();
    let port = broker.port;
    broker.stop();

    // Each partition in turn, so that both shards (and every position in their opening order)
    // are the one that fails.
    for p in 0..PARTITIONS {
        let dir = data.join(format!("{TOPIC}-{p}"));
        let segment = dir.join(format!("{:020}.log", 0));
        let aside = dir.join("moved-aside");
        std::fs::rename(&segment, &aside).unwrap();
        // A directory where the segment file was: opening it fails.
        std::fs::create_dir(&segment).unwrap();

        let started = Instant::now();
        let mut child = Command::new(BIN)
            .args(["--listeners", &format!("PLAINTEXT://127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(&data)
            .args(["--cores", "2"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if started.elapsed() > EXIT_WITHIN {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
        let status = status.unwrap_or_else(|| {
            panic!("partition {p}: still running {EXIT_WITHIN:?} after start:\n{stderr}")
        });
        assert!(!status.success(), "partition {p}: exited 0:\n{stderr}");
        let last = stderr
            .lines()
            .rfind(|l| l.starts_with("Error:"))
            .unwrap_or("");
        assert!(
            last.contains(&format!("{TOPIC}-{p}")),
            "partition {p}: the error does not name it: {last:?}\n{stderr}"
        );

        std::fs::remove_dir(&segment).unwrap();
        std::fs::rename(&aside, &segment).unwrap();
    }

    // Repaired, it starts and serves everything again.
    broker.start_again();
    for p in 0..PARTITIONS {
        let out = broker.ok(
            &[
                "consume",
                TOPIC,
                "--partition",
                &p.to_string(),
                "--from-beginning",
                "--exit-at-end",
            ],
            "",
        );
        assert!(
            out.contains("one") && out.contains("two"),
            "partition {p}: {out}"
        );
    }
}
