//! `log-writer <dir> [run]`: the process the kill -9 test starts and kills.
//!
//! Opens the log in `<dir>` (recovering it after the last kill) with `flush.mode = batch` and
//! small segments, so rolls happen often, and prints `OPEN <log_start_offset> <log_end_offset>`.
//! Then it appends forever from [`TASKS`] concurrent tasks: task `t`'s batch number `seq` is
//! `content::build_batch(BatchId { run, task: t, seq })`: 1–4 records, ~100–4000 bytes. Each
//! time an append returns Ok it prints `ACK <base_offset> <last_offset> <content_hash>` and
//! flushes stdout, so every line the test reads is a promise the log must keep after any crash.
//! `run` (default: the pid) keeps the batches of different runs distinct.
//!
//! Engine log lines go to stderr (`RUST_LOG`, default `info`). Any error is fatal: the writer
//! prints it and exits non-zero, which the test reports, since nothing here should fail.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use anyhow::{anyhow, Context};
use bytes::BytesMut;
use glommio::LocalExecutorBuilder;
use sluice_engine::{
    BatchCache, Clock, DmaStorage, FlushMode, LeaderEpoch, Log, LogConfig, Offset,
};
use sluice_tests::content::{build_batch, content_hash, BatchId};
use sluice_tests::protocol::WriterLine;
use tracing_subscriber::EnvFilter;

/// Concurrent appenders: enough that group commit covers several batches per fdatasync and
/// that batches are often waiting in memory when a roll or a kill comes.
const TASKS: u32 = 4;
/// Small segments, so that a run of a few hundred milliseconds rolls several of them.
const SEGMENT_BYTES: u64 = 256 << 10;
const CACHE_BYTES: u64 = 8 << 20;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let mut args = std::env::args().skip(1);
    let usage = "usage: log-writer <dir> [run]";
    let dir = PathBuf::from(args.next().context(usage)?);
    let run: u32 = match args.next() {
        Some(run) => run.parse().context(usage)?,
        None => std::process::id(),
    };
    LocalExecutorBuilder::default()
        .name("log-writer")
        .spawn(move || async move { write_forever(&dir, run).await })
        .map_err(|e| anyhow!("starting the executor: {e}"))?
        .join()
        .map_err(|e| anyhow!("executor failed: {e}"))?
}

/// Prints one protocol line with a single write, then flushes. If the test has gone away
/// (closed pipe), there is nobody to promise anything to: exit rather than write on forever.
fn emit(line: WriterLine) {
    let text = format!("{line}\n");
    let mut out = std::io::stdout().lock();
    if out
        .write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        std::process::exit(3);
    }
}

async fn write_forever(dir: &Path, run: u32) -> anyhow::Result<()> {
    let config = LogConfig {
        segment_bytes: SEGMENT_BYTES,
        flush_mode: FlushMode::Batch,
        ..LogConfig::default()
    };
    let log = Log::open(
        DmaStorage::new(),
        dir,
        config,
        BatchCache::new(CACHE_BYTES),
        Clock::System,
    )
    .await
    .with_context(|| format!("opening the log in {}", dir.display()))?;
    let log = Rc::new(log);
    emit(WriterLine::Open {
        log_start_offset: log.log_start_offset().0,
        log_end_offset: log.log_end_offset().0,
    });
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let log = log.clone();
            glommio::spawn_local(async move { append_forever(&log, run, task).await })
        })
        .collect();
    for task in tasks {
        task.await?;
    }
    Ok(())
}

async fn append_forever(log: &Log<DmaStorage>, run: u32, task: u32) -> anyhow::Result<()> {
    for seq in 0.. {
        let batch = build_batch(BatchId { run, task, seq });
        let hash = content_hash(&batch);
        let info = log
            .append(BytesMut::from(&batch[..]), LeaderEpoch(0))
            .await
            .with_context(|| format!("task {task}: append of batch {seq}"))?;
        assert!(info.last_offset >= info.base_offset);
        assert!(info.base_offset >= Offset(0));
        emit(WriterLine::Ack {
            base_offset: info.base_offset.0,
            last_offset: info.last_offset.0,
            content_hash: hash,
        });
    }
    Ok(())
}
