//! kill -9 crash test of the storage engine on real files.
//!
//! Each cycle starts `log-writer` on the same log directory, lets it recover the log and append
//! from several tasks, and kills it with SIGKILL a random 20–150 ms after it started (one cycle
//! in four: these mostly land in recovery) or after it reported the log open (the others: these
//! land among appends, group commits and segment rolls). The test collects the `ACK` lines the
//! writer printed. Every acknowledgement is a promise (`flush.mode = batch`: the batch
//! was fdatasync'd before the append returned), so after every kill:
//!
//! - the next writer's `OPEN` line shows a log starting at 0 and ending at or after one past the
//!   highest acknowledged offset;
//! - every `VERIFY_EVERY` cycles and at the end, the test opens the log itself and reads it all:
//!   offsets run from 0 to the log end with no gap and no overlap, every batch is byte for byte
//!   one a writer built (no garbage, no batch twice), and every acknowledged batch is there at
//!   its acknowledged offsets with its acknowledged content.
//!
//! Knobs: `SLUICE_KILL9_CYCLES` (default 200), `SLUICE_KILL9_SEED` (default random; printed),
//! `SLUICE_TEST_DIR` (where the log lives; default Cargo's target tmp dir, a real filesystem,
//! since O_DIRECT does not work on tmpfs).

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader};
use std::ops::RangeInclusive;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use glommio::LocalExecutorBuilder;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_engine::batch::BatchHeader;
use sluice_engine::{BatchCache, Clock, DmaStorage, LeaderEpoch, Log, LogConfig, Offset};
use sluice_tests::content::{check_written_batch, content_hash};
use sluice_tests::protocol::WriterLine;

const CYCLES_DEFAULT: u64 = 200;
/// The test opens and reads the whole log itself this often (and after the last cycle).
const VERIFY_EVERY: u64 = 20;
const KILL_AFTER_MS: RangeInclusive<u64> = 20..=150;
/// One cycle in this many counts its delay from the writer's start; the others from its OPEN
/// line. Starting the executor and recovering the log take 50–100 ms in a debug build, so
/// counting from the start alone would mostly kill writers before they append anything.
const KILL_AFTER_START_ONE_IN: u32 = 4;
/// A writer that has not recovered the log by then is stuck.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Must match the writer's, so the verifying open sees the log as the writer does.
const SEGMENT_BYTES: u64 = 256 << 10;
const READ_BYTES_MAX: usize = 1 << 20;

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
    )
}

/// Kills and reaps the writer if the test fails while it runs, so no writer outlives the test.
struct Writer(Option<Child>);

impl Drop for Writer {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// When a cycle's kill comes.
#[derive(Clone, Copy, Debug)]
enum KillAt {
    /// This long after the writer starts: often while it is still recovering the log.
    AfterStart(Duration),
    /// This long after it reports the log open: while it appends and rolls segments.
    AfterOpen(Duration),
}

/// What one writer printed before it was killed.
struct CycleOutput {
    lines: Vec<WriterLine>,
}

/// Starts a writer, kills it as `kill_at` says, and returns the complete lines it printed. A
/// line cut short by the kill was never fully received and is not a promise.
fn run_writer(
    log_dir: &Path,
    run: u64,
    kill_at: KillAt,
    stderr_path: &Path,
) -> Result<CycleOutput, String> {
    let stderr = std::fs::File::create(stderr_path).map_err(|e| format!("stderr file: {e}"))?;
    let child = Command::new(env!("CARGO_BIN_EXE_log-writer"))
        .arg(log_dir)
        .arg(run.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("starting log-writer: {e}"))?;
    let mut writer = Writer(Some(child));
    let child = writer.0.as_mut().expect("just started");
    let stdout = child.stdout.take().expect("stdout is piped");
    // Drain stdout while the writer runs: a full pipe would block its appends.
    let (sender, received) = mpsc::channel();
    let reader = std::thread::spawn(move || -> Result<(), String> {
        let mut reader = BufReader::new(stdout);
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(_) if line.ends_with('\n') => {
                    line.pop();
                    // The receiver outlives the writer process, so sending cannot fail.
                    let _ = sender.send(line);
                }
                Ok(_) => return Ok(()),
                Err(e) => return Err(format!("reading the writer's stdout: {e}")),
            }
        }
    });
    let mut lines = Vec::new();
    let delay = match kill_at {
        KillAt::AfterStart(delay) => delay,
        KillAt::AfterOpen(delay) => {
            match received.recv_timeout(OPEN_TIMEOUT) {
                Ok(line) => lines.push(line),
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "log-writer did not open the log within {OPEN_TIMEOUT:?}"
                    ));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = child.wait().map_err(|e| e.to_string())?;
                    return Err(format!("log-writer exited by itself with {status}"));
                }
            }
            delay
        }
    };
    std::thread::sleep(delay);
    if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
        return Err(format!("log-writer exited by itself with {status}"));
    }
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
    // SAFETY: kill has no memory-safety preconditions; `pid` is our own child, not yet reaped
    // (try_wait saw it running and nothing else waits for it), so the pid cannot be reused.
    let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
    if rc != 0 {
        return Err(format!(
            "kill -9 {pid}: {}",
            std::io::Error::last_os_error()
        ));
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    writer.0 = None;
    if status.signal() != Some(libc::SIGKILL) {
        return Err(format!("log-writer ended with {status}, not by SIGKILL"));
    }
    reader.join().expect("stdout reader thread")?;
    lines.extend(received.try_iter());
    let lines = lines
        .iter()
        .map(|l| WriterLine::parse(l))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(CycleOutput { lines })
}

/// Everything the writers promised, across all cycles.
#[derive(Default)]
struct Promises {
    /// base offset → (last offset, content hash) of every acknowledged batch.
    acked: BTreeMap<i64, (i64, u64)>,
    /// One past the highest acknowledged offset.
    acked_end: i64,
    /// Writers killed before they had recovered the log.
    killed_before_open: u64,
}

impl Promises {
    /// Checks a writer's output against what earlier writers were promised, then adds its own
    /// promises. Returns how many batches it acknowledged.
    fn absorb(&mut self, output: &CycleOutput) -> Result<u64, String> {
        let mut lines = output.lines.iter();
        let open_end = match lines.next() {
            None => {
                self.killed_before_open += 1;
                return Ok(0);
            }
            Some(&WriterLine::Open {
                log_start_offset,
                log_end_offset,
            }) => {
                if log_start_offset != 0 {
                    return Err(format!(
                        "recovered log starts at {log_start_offset}; nothing deletes, so it must be 0"
                    ));
                }
                if log_end_offset < self.acked_end {
                    return Err(format!(
                        "recovered log ends at {log_end_offset}, but offsets up to {} were acknowledged",
                        self.acked_end - 1
                    ));
                }
                log_end_offset
            }
            Some(line) => return Err(format!("first line is {line}, not OPEN")),
        };
        let mut count = 0;
        for line in lines {
            let &WriterLine::Ack {
                base_offset,
                last_offset,
                content_hash,
            } = line
            else {
                return Err(format!("unexpected line after OPEN: {line}"));
            };
            if base_offset < open_end || last_offset < base_offset {
                return Err(format!(
                    "{line}: offsets must be new ones at or after the recovered end {open_end}"
                ));
            }
            if let Some((&prev_base, &(prev_last, _))) =
                self.acked.range(..=last_offset).next_back()
            {
                if prev_last >= base_offset {
                    return Err(format!(
                        "{line} overlaps the acknowledged batch {prev_base}..={prev_last}"
                    ));
                }
            }
            self.acked.insert(base_offset, (last_offset, content_hash));
            self.acked_end = self.acked_end.max(last_offset + 1);
            count += 1;
        }
        Ok(count)
    }
}

/// What reading the whole log found.
struct Verified {
    log_end_offset: i64,
    batches: u64,
    bytes: u64,
    segments: usize,
}

/// Opens the log in this process (recovering it as a writer would) and checks it against every
/// promise. Drops it without closing, so the next writer still recovers from a crash.
fn verify_log(log_dir: &Path, promises: &Promises) -> Result<Verified, String> {
    let log_dir = log_dir.to_path_buf();
    let acked = promises.acked.clone();
    let acked_end = promises.acked_end;
    LocalExecutorBuilder::default()
        .name("kill9-verify")
        .spawn(move || async move { verify_log_inner(log_dir, acked, acked_end).await })
        .expect("verification executor")
        .join()
        .expect("verification executor thread")
}

async fn verify_log_inner(
    log_dir: PathBuf,
    acked: BTreeMap<i64, (i64, u64)>,
    acked_end: i64,
) -> Result<Verified, String> {
    let config = LogConfig {
        segment_bytes: SEGMENT_BYTES,
        ..LogConfig::default()
    };
    let log = Log::open(
        DmaStorage::new(),
        &log_dir,
        config,
        BatchCache::new(1 << 20),
        Clock::System,
    )
    .await
    .map_err(|e| format!("opening the log to verify it: {e}"))?;
    let log_end_offset = log.log_end_offset().0;
    if log.log_start_offset() != Offset(0) {
        return Err(format!("log starts at {}, not 0", log.log_start_offset()));
    }
    if log_end_offset < acked_end {
        return Err(format!(
            "log ends at {log_end_offset}, but offsets up to {} were acknowledged",
            acked_end - 1
        ));
    }
    let mut ids = HashSet::new();
    let mut bases = HashSet::new();
    let mut verified = Verified {
        log_end_offset,
        batches: 0,
        bytes: 0,
        segments: log.segment_count(),
    };
    let mut next = 0i64;
    while next < log_end_offset {
        let batches = log
            .read(Offset(next), READ_BYTES_MAX, Offset(i64::MAX))
            .await
            .map_err(|e| format!("reading at offset {next}: {e}"))?;
        if batches.is_empty() {
            return Err(format!(
                "read at offset {next} returned nothing, before the log end {log_end_offset}"
            ));
        }
        for batch in batches {
            if batch.base_offset.0 != next {
                return Err(format!(
                    "expected a batch at offset {next}, the log has one at {}..={} (segments at {:?})",
                    batch.base_offset,
                    batch.last_offset,
                    log.segment_base_offsets()
                ));
            }
            let id = check_written_batch(&batch.bytes, batch.base_offset, LeaderEpoch(0))?;
            let header = BatchHeader::parse(&batch.bytes).map_err(|e| e.to_string())?;
            if header.last_offset() != batch.last_offset {
                return Err(format!(
                    "batch at {next}: read reports last offset {}, its header {}",
                    batch.last_offset,
                    header.last_offset()
                ));
            }
            if !ids.insert(id) {
                return Err(format!("batch {id:?} is in the log twice, again at {next}"));
            }
            if let Some(&(last, hash)) = acked.get(&next) {
                if last != batch.last_offset.0 || hash != content_hash(&batch.bytes) {
                    return Err(format!(
                        "acknowledged batch {next}..={last} (hash {hash:016x}) reads back as \
                         {next}..={} (hash {:016x})",
                        batch.last_offset,
                        content_hash(&batch.bytes)
                    ));
                }
            }
            bases.insert(next);
            verified.batches += 1;
            verified.bytes += batch.bytes.len() as u64;
            next = batch.last_offset.0 + 1;
        }
    }
    if next != log_end_offset {
        return Err(format!(
            "the last batch ends at {}, past the log end {log_end_offset}",
            next - 1
        ));
    }
    if let Some((base, (last, _))) = acked.iter().find(|(base, _)| !bases.contains(*base)) {
        return Err(format!(
            "acknowledged batch {base}..={last} does not start a batch in the log"
        ));
    }
    drop(log);
    Ok(verified)
}

fn scratch_dir() -> tempfile::TempDir {
    let parent = std::env::var_os("SLUICE_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    // Absolute, so the writer does not depend on its working directory.
    let parent = std::fs::canonicalize(&parent)
        .unwrap_or_else(|e| panic!("test dir {}: {e}", parent.display()));
    tempfile::Builder::new()
        .prefix("sluice-kill9-")
        .tempdir_in(&parent)
        .unwrap_or_else(|e| panic!("temp dir in {}: {e}", parent.display()))
}

#[test]
fn acknowledged_appends_survive_kill_9() {
    let cycles = env_u64("SLUICE_KILL9_CYCLES").unwrap_or(CYCLES_DEFAULT);
    let seed = env_u64("SLUICE_KILL9_SEED").unwrap_or_else(rand::random);
    println!("kill9: {cycles} cycles, seed {seed} (rerun with SLUICE_KILL9_SEED={seed})");
    let scratch = scratch_dir();
    let log_dir = scratch.path().join("topic-0");
    let stderr_path = scratch.path().join("log-writer.stderr");
    let fail = |cycle: u64, error: String| -> ! {
        let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        panic!(
            "kill9 cycle {cycle} (seed {seed}): {error}\n--- last writer's stderr ---\n{stderr}"
        );
    };

    assert!(cycles > 0, "SLUICE_KILL9_CYCLES must be at least 1");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut promises = Promises::default();
    let started = Instant::now();
    let mut last_verified = None;
    let mut cycles_with_acks = 0u64;
    for cycle in 0..cycles {
        let delay = Duration::from_millis(rng.gen_range(KILL_AFTER_MS));
        let kill_at = if rng.gen_ratio(1, KILL_AFTER_START_ONE_IN) {
            KillAt::AfterStart(delay)
        } else {
            KillAt::AfterOpen(delay)
        };
        let output =
            run_writer(&log_dir, cycle, kill_at, &stderr_path).unwrap_or_else(|e| fail(cycle, e));
        let acked_now = promises.absorb(&output).unwrap_or_else(|e| fail(cycle, e));
        if acked_now > 0 {
            cycles_with_acks += 1;
        }
        let done = cycle + 1;
        if done % VERIFY_EVERY == 0 || done == cycles {
            let verify_started = Instant::now();
            let verified = verify_log(&log_dir, &promises).unwrap_or_else(|e| fail(cycle, e));
            println!(
                "kill9: {done}/{cycles} cycles, {:.1}s: {} batches acked; log verified in {} ms: \
                 {} batches, {} bytes, {} segments, end offset {}",
                started.elapsed().as_secs_f64(),
                promises.acked.len(),
                verify_started.elapsed().as_millis(),
                verified.batches,
                verified.bytes,
                verified.segments,
                verified.log_end_offset
            );
            last_verified = Some(verified);
        }
    }
    let verified = last_verified.expect("the last cycle verifies");
    println!(
        "kill9 summary: {cycles} cycles in {:.1}s (seed {seed}); {} batches acknowledged \
         ({} offsets, up to {}) by {cycles_with_acks} writers, {} writers killed before recovery \
         finished; recovered log: \
         {} batches, {} bytes, {} segments, end offset {}",
        started.elapsed().as_secs_f64(),
        promises.acked.len(),
        promises
            .acked
            .iter()
            .map(|(base, (last, _))| last - base + 1)
            .sum::<i64>(),
        promises.acked_end - 1,
        promises.killed_before_open,
        verified.batches,
        verified.bytes,
        verified.segments,
        verified.log_end_offset
    );
    assert!(
        !promises.acked.is_empty() || cycles == 0,
        "no writer ever acknowledged anything: the test checked nothing"
    );
}
