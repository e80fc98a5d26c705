//! A few seconds of `sluice-bench` against a real `sluice`, so that the harness keeps working:
//! a fixed-rate run with consumers, and a catch-up run on a small backlog. Not a performance
//! test: it checks that the figures are there and add up, never how good they are.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BENCH: &str = env!("CARGO_BIN_EXE_sluice-bench");

/// The `sluice` binary next to this test's own directory (`cargo test --workspace` builds it).
fn sluice_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("SLUICE_BIN") {
        return bin.into();
    }
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("sluice");
    assert!(
        bin.exists(),
        "{} is missing: build the broker first (`cargo build -p sluice-broker`, or run \
         `cargo test --workspace`)",
        bin.display()
    );
    bin
}

struct Broker {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Broker {
    fn start() -> Broker {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // Not tmpfs: the broker writes with O_DIRECT.
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tmp");
        std::fs::create_dir_all(&base).unwrap();
        let dir = tempfile::Builder::new()
            .prefix("bench-smoke-")
            .tempdir_in(base)
            .unwrap();
        let log = std::fs::File::create(dir.path().join("broker.log")).unwrap();
        let child = Command::new(sluice_bin())
            .args(["--cores", "2", "--group-initial-rebalance-delay-ms", "0"])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--listeners")
            .arg(format!("PLAINTEXT://127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the broker did not listen in 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Broker { child, port, dir }
    }

    fn bench(&self, name: &str, args: &[&str]) -> Value {
        let out = self.dir.path().join("results");
        let status = Command::new(BENCH)
            .args(["--bootstrap", &format!("127.0.0.1:{}", self.port)])
            .args(["--name", name])
            .arg("--out")
            .arg(&out)
            .args(args)
            .status()
            .unwrap();
        assert!(status.success(), "sluice-bench {name} failed: {status}");
        let svg = std::fs::read_to_string(out.join(format!("{name}.svg"))).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("<polyline"),
            "{svg}"
        );
        let json = std::fs::read_to_string(out.join(format!("{name}.json"))).unwrap();
        serde_json::from_str(&json).unwrap()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        // SAFETY: a signal to the child this value started; no memory is passed.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn fixed_rate_run_with_a_consumer_group() {
    let broker = Broker::start();
    let r = broker.bench(
        "fixed",
        &[
            "--rate",
            "500",
            "--warmup-s",
            "1",
            "--duration-s",
            "3",
            "--partitions",
            "4",
            "--keys",
            "round-robin",
            "--compression",
            "lz4",
        ],
    );
    let published = u(&r["publish"]["messages"]);
    // 500 msg/s for 3 s: never more than the rate allows (plus a second's worth). How much
    // less depends on how busy the machine is (the other smoke tests run beside this one),
    // which is no test's business.
    assert!((1..=2000).contains(&published), "{published}");
    let rate = r["publish"]["msg_per_s"].as_f64().unwrap();
    assert!(rate > 0.0 && rate <= 650.0, "{rate}");
    let consumed = u(&r["consume"]["messages"]);
    assert!(consumed + 500 >= published, "{consumed} of {published}");
    let consume_rate = r["consume"]["msg_per_s"].as_f64().unwrap();
    assert!(consume_rate > 0.0 && r["consume"]["mb_per_s"].as_f64().unwrap() > 0.0);
    let ratio = r["consume_over_publish"].as_f64().unwrap();
    assert!((ratio - consume_rate / rate).abs() < 1e-6, "{ratio}");
    let backlog = &r["backlog"];
    assert!(
        u(&backlog["max"]) >= u(&backlog["start"]).max(u(&backlog["end"])),
        "{backlog}"
    );
    // 500 msg/s is nothing: the group keeps pace, so nothing marks it as behind.
    assert!(r["consumer_behind"].is_null(), "{}", r["consumer_behind"]);
    assert!(r["sustainable"].is_null(), "no search unless asked");
    for summary in [&r["publish"], &r["consume"]] {
        let l = &summary["latency_us"];
        assert!(u(&l["p50"]) > 0 && u(&l["p50"]) <= u(&l["p99"]), "{l}");
        assert!(u(&l["p99"]) <= u(&l["p9999"]) && u(&l["p9999"]) <= u(&l["max"]));
    }
    assert_eq!(u(&r["errors"]["publish"]), 0);
    assert_eq!(u(&r["errors"]["consume"]), 0);
    assert_eq!(u(&r["unread_at_end"]), 0, "the group read everything");
    let series = r["series"].as_array().unwrap();
    assert_eq!(
        series.len(),
        4,
        "one point per second: warm-up 1 + measured 3"
    );
    assert_eq!(series[0]["phase"], "warmup");
    assert_eq!(series[3]["phase"], "measure");
    assert_eq!(r["workload"]["compression"], "lz4");
}

#[test]
fn transactional_producers_commit_and_read_committed_consumers_read_it_all() {
    let broker = Broker::start();
    let r = broker.bench(
        "txn",
        &[
            "--rate",
            "1000",
            "--warmup-s",
            "1",
            "--duration-s",
            "3",
            "--partitions",
            "4",
            "--producers",
            "2",
            "--transactional",
            "--records-per-transaction",
            "100",
            "--transaction-interval-ms",
            "200",
        ],
    );
    let t = &r["transactions"];
    // 1,000 msg/s over two producers, a commit every 100 records or 200 ms: about 10/s.
    assert!(u(&t["committed"]) > 0, "{t}");
    assert_eq!(u(&t["failed_commits"]), 0, "{t}");
    assert_eq!(u(&t["aborted"]), 0, "{t}");
    assert!(t["first_failure"].is_null(), "{t}");
    let mean = t["records_per_transaction_mean"].as_f64().unwrap();
    assert!(mean > 0.0 && mean <= 100.0, "{mean}");
    let l = &t["commit_latency_us"];
    assert!(u(&l["p50"]) > 0 && u(&l["p50"]) <= u(&l["max"]), "{l}");
    // Every acknowledged record was in a committed transaction, so read_committed reads it all.
    assert_eq!(u(&r["unread_at_end"]), 0, "the group read everything");
    assert_eq!(u(&r["errors"]["publish"]), 0);
    assert_eq!(r["workload"]["transactional"], true);
    let series = r["series"].as_array().unwrap();
    assert!(series.iter().all(|p| p["transactions_per_s"].is_number()));
}

#[test]
fn a_sustainable_rate_search_is_bounded_and_reports_every_probe() {
    let broker = Broker::start();
    let r = broker.bench(
        "sustainable",
        &[
            "--warmup-s",
            "0",
            "--duration-s",
            "2",
            "--partitions",
            "2",
            "--find-sustainable-rate",
            "--probe-count-max",
            "2",
            "--probe-warmup-s",
            "1",
            "--probe-duration-s",
            "2",
        ],
    );
    let d = &r["sustainable"];
    let probes = d["probes"].as_array().unwrap();
    assert!(probes.len() <= 2, "{d}");
    let max_run = &d["max_run"];
    assert_eq!(
        max_run["target_msg_per_s"], r["publish"]["msg_per_s"],
        "the max-rate run is judged at what it published"
    );
    for p in probes.iter().chain([max_run]) {
        let passed = p["passed"].as_bool().unwrap();
        let reasons = p["failed_because"].as_array().unwrap();
        assert_eq!(passed, reasons.is_empty(), "{p}");
        assert!(p["consume_mb_per_s"].as_f64().is_some(), "{p}");
    }
    // Either an answer from a passing run, or why there is none; never both.
    match d["sustainable"].as_object() {
        Some(s) => {
            assert!(s["publish_msg_per_s"].as_f64().unwrap() > 0.0, "{d}");
            assert!(d["none_because"].is_null());
            let from = d["sustainable_from"].as_str().unwrap();
            assert!(
                from == "max-rate run" || from.starts_with("probe "),
                "{from}"
            );
        }
        None => assert!(d["none_because"].as_str().is_some(), "{d}"),
    }
    let phases: Vec<&str> = r["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    let probe_points = phases.iter().filter(|&&p| p == "probe").count();
    assert_eq!(probe_points, 2 * probes.len(), "{phases:?}");
}

#[test]
fn catch_up_on_a_backlog() {
    let broker = Broker::start();
    let r = broker.bench(
        "catchup",
        &[
            "--rate",
            "200",
            "--warmup-s",
            "0",
            "--duration-s",
            "1",
            "--partitions",
            "3",
            "--message-size",
            "1000",
            "--backlog-bytes",
            "5000000",
            "--catch-up-timeout-s",
            "60",
        ],
    );
    let c = &r["catch_up"];
    assert_eq!(
        u(&c["backlog_messages"]),
        5000,
        "5 MB of 1,000-byte messages"
    );
    assert!(c["seconds"].as_f64().is_some(), "never caught up: {c}");
    // Everything in the backlog was read during catch-up, plus what the producer added.
    assert!(u(&c["consume_during"]["messages"]) >= 5000, "{c}");
    assert!(u(&c["publish_before"]["messages"]) > 0);
    assert!(c["publish_p99_ratio"].as_f64().unwrap() > 0.0);
    let phases: Vec<&str> = r["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    assert_eq!(phases[0], "baseline");
    assert_eq!(*phases.last().unwrap(), "catch-up");
}
