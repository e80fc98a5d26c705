//! Per-shard background work on the shard's partitions, off the produce path: `flush.mode =
//! interval` fdatasyncs, retention (`retention.ms`, `retention.bytes`, the log start offset;
//! every `log.retention.check.interval.ms`, as Kafka) and compaction of `cleanup.policy =
//! compact` topics (every `log.cleaner.backoff.ms`).

use std::rc::Rc;
use std::time::{Duration, Instant};

use sluice_engine::LogError;

use super::Shard;

/// A log closed by shutdown is not a housekeeping failure.
fn ignore_closed(e: LogError) -> Result<(), LogError> {
    match e {
        LogError::Closed => Ok(()),
        other => Err(other),
    }
}

/// How often interval-flushed logs are checked (`flush.ms` decides whether one is due).
pub const FLUSH_CHECK_MS: u64 = 50;

impl Shard {
    pub fn start_housekeeping(self: &Rc<Self>) {
        glommio::spawn_local(super::replication::expire_lagging_followers(self.clone())).detach();
        let shard = self.clone();
        glommio::spawn_local(async move {
            let mut last_retention = Instant::now();
            let mut last_compaction = Instant::now();
            let retention_check =
                Duration::from_millis(shard.config().log_retention_check_interval_ms);
            let compaction_check = Duration::from_millis(shard.config().log_cleaner_backoff_ms);
            loop {
                glommio::timer::sleep(Duration::from_millis(FLUSH_CHECK_MS)).await;
                let partitions: Vec<_> = shard.partitions.borrow().iter().map(|(k, p)| (k.clone(), p.clone())).collect();
                for ((topic, index), p) in &partitions {
                    if let Err(e) = p.log.flush_if_due().await.or_else(ignore_closed) {
                        tracing::error!(topic = %topic, partition = index, error = %e, "interval flush failed");
                    }
                }
                if last_retention.elapsed() >= retention_check {
                    last_retention = Instant::now();
                    for ((topic, index), p) in &partitions {
                        match p.log.enforce_retention().await {
                            Ok(outcome) if outcome.segments_deleted > 0 => tracing::info!(
                                topic = %topic, partition = index, segments = outcome.segments_deleted,
                                bytes = outcome.bytes_deleted, log_start_offset = outcome.log_start_offset.0, "retention deleted segments"
                            ),
                            Ok(_) => {}
                            Err(LogError::Closed) => {}
                            Err(e) => tracing::warn!(topic = %topic, partition = index, error = %e, "retention failed"),
                        }
                    }
                }
                if last_compaction.elapsed() >= compaction_check {
                    last_compaction = Instant::now();
                    for ((topic, index), p) in &partitions {
                        if let Err(e) = p.log.compact().await.map(drop).or_else(ignore_closed) {
                            tracing::warn!(topic = %topic, partition = index, error = %e, "compaction failed");
                        }
                    }
                }
            }
        })
        .detach();
    }
}
