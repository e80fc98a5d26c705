//! `sluice`: the Sluice broker binary.
//!
//! Today it opens (and, after a crash, recovers) every partition log under the data directory,
//! reports what it found, and on SIGTERM or SIGINT closes them cleanly so the next start skips
//! recovery. The Kafka protocol listener, shards and CLI subcommands come with the single-node
//! broker work; see README.md.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use glommio::LocalExecutorBuilder;
use sluice_engine::{BatchCache, Clock, DmaStorage, Log, LogConfig};

/// Batch cache budget of the shard, bytes.
const BATCH_CACHE_BYTES: u64 = 256 << 20;

#[derive(Parser, Debug)]
#[command(
    name = "sluice",
    version,
    about = "Sluice: a Kafka-compatible, thread-per-core commit log"
)]
struct Cli {
    /// Directory holding one sub-directory per partition (`<topic>-<partition>`).
    #[arg(long, default_value = "./data")]
    data_dir: PathBuf,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(signal, on_signal as *const () as libc::sighandler_t);
        }
    }
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let cli = Cli::parse();
    std::fs::create_dir_all(&cli.data_dir)
        .with_context(|| format!("creating {}", cli.data_dir.display()))?;
    install_signal_handlers();
    let data_dir = cli.data_dir.clone();
    let handle = LocalExecutorBuilder::default()
        .name("shard-0")
        .spawn(move || async move { run(data_dir).await })
        .map_err(|e| anyhow::anyhow!("starting shard 0: {e}"))?;
    handle
        .join()
        .map_err(|e| anyhow::anyhow!("shard 0 panicked: {e:?}"))?
}

async fn run(data_dir: PathBuf) -> anyhow::Result<()> {
    let cache = BatchCache::new(BATCH_CACHE_BYTES);
    let mut logs = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&data_dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|e| e.path())
        .collect();
    dirs.sort();
    for dir in dirs {
        let log = Log::open(
            DmaStorage::new(),
            &dir,
            LogConfig::default(),
            cache.clone(),
            Clock::System,
        )
        .await
        .with_context(|| format!("opening {}", dir.display()))?;
        logs.push(log);
    }
    tracing::info!(
        data_dir = %data_dir.display(),
        partitions = logs.len(),
        "sluice is up; the Kafka listener is not built yet. SIGTERM or Ctrl-C to stop"
    );
    while !STOP.load(Ordering::SeqCst) {
        glommio::timer::sleep(Duration::from_millis(100)).await;
    }
    tracing::info!("shutting down: closing logs cleanly");
    for log in &logs {
        if let Err(e) = log.close().await {
            tracing::error!(dir = %log.dir().display(), error = %e, "log did not close cleanly; it will be recovered on start");
        }
    }
    Ok(())
}
