//! Helpers shared by the CLI test binaries: the real broker started as a process on a free
//! port with a temporary data directory, and `sluice` subcommands run against it. Each test
//! binary uses a subset of them.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

pub const BIN: &str = env!("CARGO_BIN_EXE_sluice");
/// How long the broker may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// What the broker logs once every shard serves the Kafka protocol.
const READY_LINE: &str = "serving the Kafka protocol";
/// How long one CLI command may run.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the broker may take to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// The broker process; SIGTERM on drop, so it stops even when an assertion fails.
pub struct Broker {
    child: Child,
    pub port: u16,
    log: PathBuf,
    pub dir: tempfile::TempDir,
    /// Arguments after the usual ones, kept for restarts.
    extra: Vec<String>,
    /// Environment and limits of the process, kept for restarts.
    launch: Launch,
}

/// How the broker process is started besides its arguments.
#[derive(Clone, Debug, Default)]
pub struct Launch {
    /// Environment variables set for the broker (e.g. `RUST_LOG`).
    pub env: Vec<(String, String)>,
    /// `RLIMIT_NOFILE` (soft and hard) of the broker process, as `ulimit -n` would set it.
    pub nofile: Option<u64>,
}

impl Broker {
    pub fn start() -> Broker {
        Broker::start_with(&[])
    }

    /// Starts the broker with `extra` arguments after the usual ones.
    pub fn start_with(extra: &[&str]) -> Broker {
        Broker::launch(extra, Launch::default())
    }

    /// Starts the broker with `extra` arguments, an environment and limits.
    pub fn launch(extra: &[&str], launch: Launch) -> Broker {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
            l.local_addr().unwrap().port()
        };
        let log = dir.path().join("broker.log");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let child = spawn(dir.path(), port, &log, &extra, &launch);
        let mut broker = Broker {
            child,
            port,
            log,
            dir,
            extra,
            launch,
        };
        broker.wait_until_ready(0);
        broker
    }

    /// Stops the broker (SIGTERM) and starts it again on the same port and data directory.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// Starts the broker again on the same port and data directory, after `stop` or `kill`.
    pub fn start_again(&mut self) {
        let log_from = self.log_text().len();
        self.child = spawn(
            self.dir.path(),
            self.port,
            &self.log,
            &self.extra,
            &self.launch,
        );
        self.wait_until_ready(log_from);
    }

    /// SIGKILL, then waits until the port refuses connections: a killed broker's listening
    /// socket can outlive the process for a moment.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let deadline = Instant::now() + STOP_TIMEOUT;
        while TcpStream::connect(("127.0.0.1", self.port)).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The broker's data directory (`--data-dir`).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Waits until the broker listens and has logged `READY_LINE` after byte `log_from` of
    /// its log.
    fn wait_until_ready(&mut self, log_from: usize) {
        let port = self.port;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "the broker exited with {status} before listening:\n{}",
                    self.log_text()
                );
            }
            // The first shard to listen may accept connections while shard 0 still creates
            // `__consumer_offsets`; shard 0 logs this line once every shard serves.
            if TcpStream::connect(("127.0.0.1", port)).is_ok()
                && self
                    .log_text()
                    .get(log_from..)
                    .is_some_and(|l| l.contains(READY_LINE))
            {
                self.wait_for_coordinators(log_from);
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the broker did not listen on port {port} within {START_TIMEOUT:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every `__consumer_offsets` partition's groups are loaded (each coordinator
    /// logs `LOADED_LINE` then). A first load reads the other offsets partitions before it
    /// serves (group/placement.rs), and tests send group requests right after the start: a
    /// client retries COORDINATOR_LOAD_IN_PROGRESS, these raw requests do not.
    fn wait_for_coordinators(&self, log_from: usize) {
        const LOADED_LINE: &str = "coordinating the groups of __consumer_offsets partition";
        let metadata =
            kafka_protocol::messages::MetadataRequest::default().with_topics(Some(vec![
                kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                    .with_name(Some(kafka_protocol::messages::TopicName(
                        StrBytes::from_static_str("__consumer_offsets"),
                    ))),
            ]));
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return;
        };
        let answer: kafka_protocol::messages::MetadataResponse =
            request(&mut stream, ApiKey::Metadata, 12, &metadata);
        let partitions = answer
            .topics
            .first()
            .filter(|t| t.error_code == 0)
            .map_or(0, |t| t.partitions.len());
        let deadline = Instant::now() + START_TIMEOUT;
        while self
            .log_text()
            .get(log_from..)
            .map_or(0, |l| l.matches(LOADED_LINE).count())
            < partitions
        {
            assert!(
                Instant::now() < deadline,
                "the broker's {partitions} group coordinators did not load within {START_TIMEOUT:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then SIGKILL if the broker has not stopped within `STOP_TIMEOUT`. Returns how it
    /// exited after SIGTERM; `None` if it had already exited or had to be killed.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let pid = self.child.id() as libc::pid_t;
        if self.child.try_wait().ok().flatten().is_some() {
            return None;
        }
        // SAFETY: kill(2) on the pid of a child this test started and has not reaped yet.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("the broker did not stop within {STOP_TIMEOUT:?} of SIGTERM; killing it");
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }

    /// The broker's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Runs `sluice ARGS --bootstrap-server ...` with `stdin`.
    pub fn run(&self, args: &[&str], stdin: &str) -> Output {
        run_sluice(
            self.dir.path(),
            args,
            &["--bootstrap-server", &self.address()],
            stdin,
        )
    }

    /// Like `run`, and asserts that the command succeeded.
    pub fn ok(&self, args: &[&str], stdin: &str) -> String {
        let out = self.run(args, stdin);
        assert!(
            out.success,
            "sluice {args:?} failed:\nstdout:\n{}\nstderr:\n{}",
            out.stdout, out.stderr
        );
        out.stdout
    }

    /// Creates `topic` with `partitions` partitions through `sluice topic create`.
    pub fn create_topic(&self, topic: &str, partitions: i32) {
        self.ok(
            &[
                "topic",
                "create",
                topic,
                "--partitions",
                &partitions.to_string(),
            ],
            "",
        );
    }

    /// Like `run`, and asserts that the command failed with `message` on stderr; returns the
    /// whole stderr.
    pub fn fails(&self, args: &[&str], stdin: &str, message: &str) -> String {
        let out = self.run(args, stdin);
        assert!(
            !out.success,
            "sluice {args:?} should fail but printed:\n{}",
            out.stdout
        );
        assert!(
            out.stderr.contains(message),
            "sluice {args:?}: stderr lacks {message:?}:\n{}",
            out.stderr
        );
        assert!(
            !out.stderr.contains("Stack backtrace"),
            "errors are messages, not backtraces:\n{}",
            out.stderr
        );
        out.stderr
    }

    /// The APIs the broker advertises, asked with ApiVersions v0 by the test itself.
    pub fn advertised_apis(&self) -> BTreeSet<i16> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let header = RequestHeader::default()
            .with_request_api_key(ApiKey::ApiVersions as i16)
            .with_request_api_version(0)
            .with_correlation_id(7);
        let mut frame = BytesMut::new();
        frame.extend_from_slice(&[0; 4]);
        header
            .encode(&mut frame, ApiKey::ApiVersions.request_header_version(0))
            .unwrap();
        ApiVersionsRequest::default().encode(&mut frame, 0).unwrap();
        let size = (frame.len() - 4) as u32;
        frame[..4].copy_from_slice(&size.to_be_bytes());
        stream.write_all(&frame).unwrap();
        let mut size = [0u8; 4];
        stream.read_exact(&mut size).unwrap();
        let mut body = vec![0u8; u32::from_be_bytes(size) as usize];
        stream.read_exact(&mut body).unwrap();
        let mut body = Bytes::from(body);
        let correlation_id = i32::from_be_bytes(body[..4].try_into().unwrap());
        assert_eq!(correlation_id, 7);
        let _ = body.split_to(4);
        let response = ApiVersionsResponse::decode(&mut body, 0).unwrap();
        assert_eq!(response.error_code, 0);
        response.api_keys.iter().map(|k| k.api_key).collect()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- broker log ---\n{}--- end ---", self.log_text());
        }
        self.stop();
    }
}

/// Sends one request on `stream` and decodes its response (the correlation id is not checked).
pub fn request<Req: Encodable, Resp: Decodable>(
    stream: &mut TcpStream,
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
    stream.write_all(&(buf.len() as u32).to_be_bytes()).unwrap();
    stream.write_all(&buf).unwrap();
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(size) as usize];
    stream.read_exact(&mut body).unwrap();
    let mut body = Bytes::from(body);
    kafka_protocol::messages::ResponseHeader::decode(
        &mut body,
        key.response_header_version(version),
    )
    .unwrap();
    Resp::decode(&mut body, version).unwrap()
}

/// Starts `sluice` serving on `port` with its data under `dir`; output appended to `log`.
fn spawn(dir: &Path, port: u16, log: &Path, extra: &[String], launch: &Launch) -> Child {
    let open_log = || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap()
    };
    let mut command = Command::new(BIN);
    command
        .arg("--listeners")
        .arg(format!("PLAINTEXT://127.0.0.1:{port}"))
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--cores")
        .arg("2")
        .args(extra)
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(open_log())
        .stderr(open_log());
    if let Some(nofile) = launch.nofile {
        use std::os::unix::process::CommandExt;
        // SAFETY: setrlimit is async-signal-safe and touches only the child being started.
        unsafe {
            command.pre_exec(move || {
                let limit = libc::rlimit {
                    rlim_cur: nofile,
                    rlim_max: nofile,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    command.spawn().expect("start sluice")
}

pub struct Output {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the binary with output in files (no pipe to fill up) and a deadline.
pub fn run_sluice(dir: &Path, args: &[&str], extra: &[&str], stdin: &str) -> Output {
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out_path = dir.join(format!("cmd-{n}.out"));
    let err_path = dir.join(format!("cmd-{n}.err"));
    let mut child = Command::new(BIN)
        .args(args)
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap())
        .spawn()
        .expect("start sluice");
    {
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.as_bytes()).unwrap();
    }
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "sluice {args:?} did not finish within {COMMAND_TIMEOUT:?}; stdout so far:\n{}",
                std::fs::read_to_string(&out_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        success: status.success(),
        stdout: std::fs::read_to_string(&out_path).unwrap(),
        stderr: std::fs::read_to_string(&err_path).unwrap(),
    }
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Per-partition record counts and offset ranges from the `sluice produce` summary.
pub fn parse_produce_summary(output: &str) -> BTreeMap<i32, (u64, i64, i64)> {
    let mut partitions = BTreeMap::new();
    for line in output.lines().filter(|l| l.starts_with("  partition ")) {
        // "  partition 2: 34 records, offsets 0 to 33"
        let words: Vec<&str> = line.split_whitespace().collect();
        let partition: i32 = words[1].trim_end_matches(':').parse().unwrap();
        let count: u64 = words[2].parse().unwrap();
        let first: i64 = words[5].parse().unwrap();
        let last: i64 = words[7].parse().unwrap();
        partitions.insert(partition, (count, first, last));
    }
    partitions
}

/// A connection to the broker on `port` whose reads give up after 10 s.
pub fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// A request header for `key` at `version`, encoded, with the client id `test`.
pub fn header_bytes(key: ApiKey, version: i16, correlation_id: i32) -> BytesMut {
    let header = RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("test")));
    let mut buf = BytesMut::new();
    header
        .encode(&mut buf, key.request_header_version(version))
        .unwrap();
    buf
}

/// `body` behind its 4-byte size prefix.
pub fn with_size(body: &[u8]) -> Vec<u8> {
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

/// A whole request frame: size prefix, header, body.
pub fn frame(key: ApiKey, version: i16, correlation_id: i32, request: &impl Encodable) -> Vec<u8> {
    let mut buf = header_bytes(key, version, correlation_id);
    request.encode(&mut buf, version).unwrap();
    with_size(&buf)
}

/// A fetch of one partition from `offset`, at most `max_bytes` (for the response and the
/// partition), waiting up to 100 ms for one byte.
pub fn fetch_request(
    topic: &str,
    partition: i32,
    offset: i64,
    max_bytes: i32,
) -> kafka_protocol::messages::FetchRequest {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    kafka_protocol::messages::FetchRequest::default()
        .with_replica_id(kafka_protocol::messages::BrokerId(-1))
        .with_max_wait_ms(100)
        .with_min_bytes(1)
        .with_max_bytes(max_bytes)
        .with_topics(vec![FetchTopic::default()
            .with_topic(kafka_protocol::messages::TopicName(StrBytes::from_string(
                topic.to_string(),
            )))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(max_bytes)])])
}

/// Reads one response frame, or `None` when the broker closed the connection.
pub fn read_frame(s: &mut TcpStream) -> Option<Bytes> {
    let mut size = [0u8; 4];
    s.read_exact(&mut size).ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(size) as usize];
    s.read_exact(&mut body).ok()?;
    Some(Bytes::from(body))
}
