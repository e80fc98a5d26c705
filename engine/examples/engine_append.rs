//! Engine append benchmark: how fast one shard appends record batches to one partition log on
//! real O_DIRECT files, and how well group commit amortises fdatasync.
//!
//! Runs on one glommio executor pinned to one core, with `DmaStorage` under `--dir`. Each case
//! appends copies of one prebuilt batch (records with 1 KiB values packed into batches of at
//! most 16 KiB or 1 MiB) from several local tasks at once, as a producer with several requests
//! in flight would, so appends that arrive while the flusher is busy share its next write and
//! fdatasync. Every case uses a fresh log directory, deleted when the case ends.
//!
//! A progress line goes to stderr every second; one JSON object per case goes to stdout, or, with
//! `--json FILE`, one per line to FILE. Throughput is in MiB/s (2^20 bytes per second) of acked
//! batch bytes. This is a measurement, not a timed test: nothing here passes or fails on speed.
//!
//! ```text
//! cargo run --release -p sluice-engine --example engine_append -- --seconds 5
//! ```

use std::cell::{Cell, RefCell};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use glommio::{LocalExecutorBuilder, Placement};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use serde_json::{json, Value};
use sluice_engine::batch::{BatchBuilder, NewRecord};
use sluice_engine::{
    BatchCache, Clock, DmaStorage, FlushMode, LeaderEpoch, Log, LogConfig, Timestamp,
};

const MIB: f64 = (1u64 << 20) as f64;
/// Batch cache budget for the shard. The benchmark never reads, so the cache only costs the
/// inserts and evictions every append pays for in the broker too.
const CACHE_BYTES: u64 = 256 << 20;
/// Segment size: large, so that rolls (which fdatasync and write indexes) are rare, as with
/// Kafka's default `segment.bytes`.
const SEGMENT_BYTES: u64 = 1 << 30;

const USAGE: &str = "\
engine_append: append throughput of one sluice-engine log on one core

Options:
  --dir DIR              parent directory for the data (default: target/bench-data)
  --seconds S            measured seconds per case (default: 5)
  --warmup-seconds S     unmeasured seconds before each case (default: 1)
  --cases LIST           comma-separated among 16k-batch,16k-none,1m-batch,1m-none (default: all)
  --in-flight-16k N      concurrent appends for 16 KiB batches (default: 8)
  --in-flight-1m N       concurrent appends for 1 MiB batches (default: 4)
  --record-bytes N       value bytes per record (default: 1024)
  --cpu N                CPU to pin the executor to (default: 0)
  --spin-ms N            executor spin_before_park in milliseconds (default: 5)
  --io-memory-mib N      glommio registered I/O memory (default: 64)
  --json FILE            write one JSON object per case, one per line, to FILE (default: stdout)
";

struct Args {
    dir: PathBuf,
    seconds: f64,
    warmup_seconds: f64,
    cases: Vec<String>,
    in_flight_16k: usize,
    in_flight_1m: usize,
    record_bytes: usize,
    cpu: usize,
    spin_ms: u64,
    io_memory_mib: usize,
    json: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        dir: PathBuf::from("target/bench-data"),
        seconds: 5.0,
        warmup_seconds: 1.0,
        cases: ["16k-batch", "16k-none", "1m-batch", "1m-none"]
            .map(String::from)
            .to_vec(),
        in_flight_16k: 8,
        in_flight_1m: 4,
        record_bytes: 1024,
        cpu: 0,
        spin_ms: 5,
        io_memory_mib: 64,
        json: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            print!("{USAGE}");
            std::process::exit(0);
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("bad value {value:?} for {flag}: {e}");
        match flag.as_str() {
            "--dir" => args.dir = PathBuf::from(&value),
            "--seconds" => args.seconds = value.parse().map_err(|e| bad(&e))?,
            "--warmup-seconds" => args.warmup_seconds = value.parse().map_err(|e| bad(&e))?,
            "--cases" => args.cases = value.split(',').map(String::from).collect(),
            "--in-flight-16k" => args.in_flight_16k = value.parse().map_err(|e| bad(&e))?,
            "--in-flight-1m" => args.in_flight_1m = value.parse().map_err(|e| bad(&e))?,
            "--record-bytes" => args.record_bytes = value.parse().map_err(|e| bad(&e))?,
            "--cpu" => args.cpu = value.parse().map_err(|e| bad(&e))?,
            "--spin-ms" => args.spin_ms = value.parse().map_err(|e| bad(&e))?,
            "--io-memory-mib" => args.io_memory_mib = value.parse().map_err(|e| bad(&e))?,
            "--json" => args.json = Some(PathBuf::from(&value)),
            _ => return Err(format!("unknown flag {flag}\n\n{USAGE}")),
        }
    }
    let positive = |v: f64| v.is_finite() && v > 0.0;
    if !positive(args.seconds) || !(args.warmup_seconds == 0.0 || positive(args.warmup_seconds)) {
        return Err("--seconds must be positive and --warmup-seconds not negative".into());
    }
    if args.in_flight_16k == 0 || args.in_flight_1m == 0 {
        return Err("in-flight counts must be at least 1".into());
    }
    Ok(args)
}

/// One benchmark case: a batch size, a flush mode and how many appends are in flight.
struct Case {
    name: String,
    batch_bytes_max: usize,
    flush_mode: FlushMode,
    in_flight: usize,
}

fn case_from_name(name: &str, args: &Args) -> Result<Case, String> {
    let (size, mode) = name
        .split_once('-')
        .ok_or_else(|| format!("bad case {name:?}: expected SIZE-MODE, e.g. 16k-batch"))?;
    let (batch_bytes_max, in_flight) = match size {
        "16k" => (16 << 10, args.in_flight_16k),
        "1m" => (1 << 20, args.in_flight_1m),
        _ => return Err(format!("bad case {name:?}: size must be 16k or 1m")),
    };
    let flush_mode = match mode {
        "batch" => FlushMode::Batch,
        "none" => FlushMode::None,
        _ => return Err(format!("bad case {name:?}: mode must be batch or none")),
    };
    Ok(Case {
        name: name.to_string(),
        batch_bytes_max,
        flush_mode,
        in_flight,
    })
}

/// Builds one uncompressed batch holding as many records with `record_bytes` random values as
/// fit in `batch_bytes_max`, and returns it with its record count. Random values keep any
/// compressing layer below from flattering the figures.
fn build_batch(batch_bytes_max: usize, record_bytes: usize) -> (Bytes, i32) {
    let now = Timestamp(Clock::System.now_ms());
    let build = |count: usize| {
        let mut rng = StdRng::seed_from_u64(batch_bytes_max as u64);
        let mut builder = BatchBuilder::new();
        for _ in 0..count {
            let mut value = vec![0u8; record_bytes];
            rng.fill_bytes(&mut value);
            builder.push(&NewRecord {
                key: None,
                value: Some(value),
                headers: Vec::new(),
                timestamp: now,
            });
        }
        builder.build()
    };
    // Binary search for the largest count that fits: `fits` fits, `too_many` does not.
    let mut fits = 1;
    assert!(
        build(fits).len() <= batch_bytes_max,
        "a {record_bytes}-byte record does not fit a {batch_bytes_max}-byte batch"
    );
    let mut too_many = batch_bytes_max / record_bytes.max(1) + 2;
    while too_many - fits > 1 {
        let mid = (fits + too_many) / 2;
        if build(mid).len() <= batch_bytes_max {
            fits = mid;
        } else {
            too_many = mid;
        }
    }
    (build(fits), fits as i32)
}

/// What the producer tasks have seen acknowledged, shared with the reporting task.
struct Progress {
    appends: Cell<u64>,
    bytes: Cell<u64>,
    /// Append latency as the producer sees it (buffering, write, fdatasync), microseconds.
    append_us: RefCell<Histogram<u64>>,
    stop: Cell<bool>,
    error: RefCell<Option<String>>,
}

async fn producer(log: Rc<Log<DmaStorage>>, batch: Bytes, progress: Rc<Progress>) {
    while !progress.stop.get() {
        let started = Instant::now();
        // A fresh buffer per append, as a request read off a socket would be.
        let result = log.append(BytesMut::from(&batch[..]), LeaderEpoch(0)).await;
        match result {
            Ok(_) => {
                progress.appends.set(progress.appends.get() + 1);
                progress
                    .bytes
                    .set(progress.bytes.get() + batch.len() as u64);
                let micros = started.elapsed().as_micros() as u64;
                let _ = progress.append_us.borrow_mut().record(micros.max(1));
            }
            Err(e) => {
                progress.error.borrow_mut().get_or_insert(e.to_string());
                progress.stop.set(true);
            }
        }
    }
}

/// Counters at one instant, for differences over the measured window.
struct Snapshot {
    at: Instant,
    appends: u64,
    bytes: u64,
    log_appends: u64,
    device_writes: u64,
    device_written_bytes: u64,
    fdatasync_us: Histogram<u64>,
    cpu: Duration,
}

fn snapshot(log: &Log<DmaStorage>, progress: &Progress) -> Snapshot {
    let (log_appends, device_writes, device_written_bytes, fdatasync_us) = log.with_stats(|s| {
        (
            s.appends,
            s.device_writes,
            s.device_written_bytes,
            s.fdatasync_us.clone(),
        )
    });
    Snapshot {
        at: Instant::now(),
        appends: progress.appends.get(),
        bytes: progress.bytes.get(),
        log_appends,
        device_writes,
        device_written_bytes,
        fdatasync_us,
        cpu: thread_cpu_time(),
    }
}

/// CPU time (user + system) this thread has used: the executor's, since it runs everything.
fn thread_cpu_time() -> Duration {
    // SAFETY: getrusage only writes into the zeroed struct we pass it.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_THREAD, &mut usage) != 0 {
            return Duration::ZERO;
        }
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// The fdatasync latencies recorded between two snapshots.
fn fdatasync_between(from: &Snapshot, to: &Snapshot) -> Histogram<u64> {
    let mut h = to.fdatasync_us.clone();
    h.subtract(&from.fdatasync_us)
        .expect("the histogram only grows");
    h
}

fn quantiles(h: &Histogram<u64>) -> Value {
    if h.is_empty() {
        return Value::Null;
    }
    json!({
        "count": h.len(),
        "p50": h.value_at_quantile(0.50),
        "p90": h.value_at_quantile(0.90),
        "p99": h.value_at_quantile(0.99),
        "max": h.max(),
        "mean": (h.mean() * 10.0).round() / 10.0,
    })
}

fn mode_name(mode: FlushMode) -> &'static str {
    match mode {
        FlushMode::Batch => "batch",
        FlushMode::Interval => "interval",
        FlushMode::None => "none",
    }
}

fn progress_line(case: &Case, elapsed: f64, phase: &str, from: &Snapshot, to: &Snapshot) -> String {
    let secs = to.at.duration_since(from.at).as_secs_f64().max(1e-9);
    let appends = to.appends - from.appends;
    let writes = to.device_writes - from.device_writes;
    let syncs = fdatasync_between(from, to);
    let sync = if syncs.is_empty() {
        "no fdatasync".to_string()
    } else {
        format!(
            "{} fdatasync/s p50 {} µs p99 {} µs",
            (syncs.len() as f64 / secs).round(),
            syncs.value_at_quantile(0.5),
            syncs.value_at_quantile(0.99)
        )
    };
    format!(
        "[{}] {elapsed:5.1}s {phase:9} {:8.1} MiB/s {:8.0} appends/s {:7.0} writes/s ({:.1} appends/write), {sync}",
        case.name,
        (to.bytes - from.bytes) as f64 / MIB / secs,
        appends as f64 / secs,
        writes as f64 / secs,
        (to.log_appends - from.log_appends) as f64 / (writes.max(1)) as f64,
    )
}

async fn run_case(case: &Case, args: &Args, data_dir: &Path) -> Result<Value, String> {
    let (batch, records_per_batch) = build_batch(case.batch_bytes_max, args.record_bytes);
    let dir = data_dir.join(&case.name).join("bench-0");
    let config = LogConfig {
        flush_mode: case.flush_mode,
        segment_bytes: SEGMENT_BYTES,
        ..Default::default()
    };
    let cache = BatchCache::new(CACHE_BYTES);
    let log = Log::open(DmaStorage::new(), &dir, config, cache, Clock::System)
        .await
        .map_err(|e| format!("opening the log in {}: {e}", dir.display()))?;
    let log = Rc::new(log);
    let progress = Rc::new(Progress {
        appends: Cell::new(0),
        bytes: Cell::new(0),
        append_us: RefCell::new(
            Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds"),
        ),
        stop: Cell::new(false),
        error: RefCell::new(None),
    });
    eprintln!(
        "[{}] {} records of {} B per batch ({} B), flush.mode={}, {} appends in flight, {} in {}",
        case.name,
        records_per_batch,
        args.record_bytes,
        batch.len(),
        mode_name(case.flush_mode),
        case.in_flight,
        format_args!("{}s + {}s warm-up", args.seconds, args.warmup_seconds),
        dir.display(),
    );
    let tasks: Vec<_> = (0..case.in_flight)
        .map(|_| glommio::spawn_local(producer(log.clone(), batch.clone(), progress.clone())))
        .collect();

    let start = snapshot(&log, &progress);
    let warmup = Duration::from_secs_f64(args.warmup_seconds);
    let measured = Duration::from_secs_f64(args.seconds);
    let mut last = snapshot(&log, &progress);
    let mut base: Option<Snapshot> = if warmup.is_zero() {
        progress.append_us.borrow_mut().reset();
        Some(snapshot(&log, &progress))
    } else {
        None
    };
    let mut end: Option<Snapshot> = None;
    let mut tick = 1u32;
    while end.is_none() && !progress.stop.get() {
        let measure_from = start.at + warmup;
        let measure_to = measure_from + measured;
        let next_tick = start.at + Duration::from_secs(tick as u64);
        let next = if base.is_none() {
            next_tick.min(measure_from)
        } else {
            next_tick.min(measure_to)
        };
        glommio::timer::sleep(next.saturating_duration_since(Instant::now())).await;
        let now = snapshot(&log, &progress);
        let elapsed = now.at.duration_since(start.at).as_secs_f64();
        if now.at >= next_tick {
            let phase = if base.is_some() {
                "measuring"
            } else {
                "warm-up"
            };
            eprintln!("{}", progress_line(case, elapsed, phase, &last, &now));
            last = snapshot(&log, &progress);
            tick += 1;
        }
        if base.is_none() && now.at >= measure_from {
            progress.append_us.borrow_mut().reset();
            base = Some(snapshot(&log, &progress));
        } else if base.is_some() && now.at >= measure_to {
            end = Some(now);
        }
    }
    progress.stop.set(true);
    for task in tasks {
        task.await;
    }
    if let Some(error) = progress.error.borrow().clone() {
        return Err(format!("append failed: {error}"));
    }
    let base = base.expect("measured");
    let end = end.expect("measured");

    // Cross-check the counters against the log itself before trusting them.
    let total_appends = progress.appends.get();
    let log_end_offset = log.log_end_offset().0;
    assert_eq!(
        log_end_offset,
        total_appends as i64 * records_per_batch as i64,
        "log end offset disagrees with acknowledged appends"
    );
    if case.flush_mode == FlushMode::Batch {
        assert_eq!(log.durable_end_offset().0, log_end_offset);
    }
    let size_bytes = log.size_bytes();
    assert_eq!(size_bytes, total_appends * batch.len() as u64);
    let segments = log.segment_count();
    log.close()
        .await
        .map_err(|e| format!("closing the log: {e}"))?;
    drop(log);
    fs::remove_dir_all(data_dir.join(&case.name))
        .map_err(|e| format!("removing {}: {e}", dir.display()))?;

    let secs = end.at.duration_since(base.at).as_secs_f64();
    let appends = end.appends - base.appends;
    let bytes = end.bytes - base.bytes;
    let log_appends = end.log_appends - base.log_appends;
    let device_writes = end.device_writes - base.device_writes;
    let device_written_bytes = end.device_written_bytes - base.device_written_bytes;
    let syncs = fdatasync_between(&base, &end);
    let append_us = progress.append_us.borrow();
    let cpu = (end.cpu - base.cpu).as_secs_f64() / secs;
    let round = |v: f64, digits: i32| (v * 10f64.powi(digits)).round() / 10f64.powi(digits);
    let result = json!({
        "case": case.name,
        "flush_mode": mode_name(case.flush_mode),
        "batch_bytes_max": case.batch_bytes_max,
        "batch_bytes": batch.len(),
        "records_per_batch": records_per_batch,
        "record_value_bytes": args.record_bytes,
        "in_flight": case.in_flight,
        "warmup_seconds": args.warmup_seconds,
        "seconds": round(secs, 3),
        "appends": appends,
        "bytes": bytes,
        "bytes_per_sec": round(bytes as f64 / secs, 0),
        "mib_per_sec": round(bytes as f64 / MIB / secs, 1),
        "appends_per_sec": round(appends as f64 / secs, 1),
        "records_per_sec": round((appends * records_per_batch as u64) as f64 / secs, 0),
        "append_latency_us": quantiles(&append_us),
        "log_appends": log_appends,
        "device_writes": device_writes,
        "device_written_bytes": device_written_bytes,
        "appends_per_device_write": round(log_appends as f64 / device_writes.max(1) as f64, 2),
        "write_amplification": round(device_written_bytes as f64 / bytes.max(1) as f64, 3),
        "fdatasyncs": syncs.len(),
        "appends_per_fdatasync": if syncs.is_empty() {
            Value::Null
        } else {
            json!(round(log_appends as f64 / syncs.len() as f64, 2))
        },
        "fdatasync_us": quantiles(&syncs),
        "executor_cpu_utilization": round(cpu, 3),
        "segments": segments,
        "cpu": args.cpu,
        "spin_before_park_ms": args.spin_ms,
    });
    eprintln!(
        "[{}] result: {:.1} MiB/s, {:.0} appends/s, {:.2} appends per device write, fdatasync p50/p99 {}, executor CPU {:.0}%",
        case.name,
        bytes as f64 / MIB / secs,
        appends as f64 / secs,
        log_appends as f64 / device_writes.max(1) as f64,
        if syncs.is_empty() {
            "-".to_string()
        } else {
            format!(
                "{}/{} µs",
                syncs.value_at_quantile(0.5),
                syncs.value_at_quantile(0.99)
            )
        },
        cpu * 100.0,
    );
    Ok(result)
}

async fn run_all(args: Args, cases: Vec<Case>) -> Result<(), String> {
    let data_dir = args
        .dir
        .join(format!("engine-append-{}", std::process::id()));
    fs::create_dir_all(&data_dir).map_err(|e| format!("creating {}: {e}", data_dir.display()))?;
    // An absolute path, so that progress lines say exactly where the data goes.
    let data_dir = fs::canonicalize(&data_dir)
        .map_err(|e| format!("resolving {}: {e}", data_dir.display()))?;
    let mut out: Box<dyn Write> = match &args.json {
        Some(path) => Box::new(
            fs::File::create(path).map_err(|e| format!("creating {}: {e}", path.display()))?,
        ),
        None => Box::new(std::io::stdout()),
    };
    let mut outcome = Ok(());
    for case in &cases {
        match run_case(case, &args, &data_dir).await {
            Ok(result) => {
                writeln!(out, "{result}").map_err(|e| format!("writing results: {e}"))?;
                out.flush().map_err(|e| format!("writing results: {e}"))?;
            }
            Err(e) => {
                outcome = Err(format!("case {}: {e}", case.name));
                break;
            }
        }
    }
    let _ = fs::remove_dir_all(&data_dir);
    outcome
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("engine_append: {e}");
            std::process::exit(2);
        }
    };
    let cases: Result<Vec<Case>, String> = args
        .cases
        .iter()
        .map(|name| case_from_name(name, &args))
        .collect();
    let cases = match cases {
        Ok(cases) => cases,
        Err(e) => {
            eprintln!("engine_append: {e}");
            std::process::exit(2);
        }
    };
    let builder = LocalExecutorBuilder::new(Placement::Fixed(args.cpu))
        .name("engine-append")
        .spin_before_park(Duration::from_millis(args.spin_ms))
        .io_memory(args.io_memory_mib << 20);
    let result = builder
        .spawn(move || run_all(args, cases))
        .expect("starting the executor")
        .join()
        .expect("executor thread");
    if let Err(e) = result {
        eprintln!("engine_append: {e}");
        std::process::exit(1);
    }
}
