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
/// How often a shard stores its partition gauges for the metrics exporter.
const GAUGES_INTERVAL: Duration = Duration::from_secs(1);

impl Shard {
    /// This shard's partition gauges into its slot of the node's metrics; on shard 0 also the
    /// controller's (whether it is the active one, and then the partitions without a leader).
    fn store_gauges(
        self: &Rc<Self>,
        partitions: &[((String, i32), Rc<super::partition::Partition>)],
    ) {
        use std::sync::atomic::Ordering::Relaxed;
        let metrics = &self.shared.metrics;
        let (mut leaders, mut under_replicated, mut under_min_isr) = (0, 0, 0);
        for (_, p) in partitions {
            if let Some((isr, replicas, min_isr)) = p.replica_health() {
                leaders += 1;
                under_replicated += i64::from(isr < replicas);
                under_min_isr += i64::from(isr < min_isr);
            }
        }
        let gauges = &metrics.shards[self.id];
        gauges.partitions.store(partitions.len() as i64, Relaxed);
        gauges.leaders.store(leaders, Relaxed);
        gauges.under_replicated.store(under_replicated, Relaxed);
        gauges.under_min_isr.store(under_min_isr, Relaxed);
        if self.id == 0 {
            let active = self.controller().is_some_and(|c| c.is_active_controller());
            let offline = match (active, &self.image().cluster) {
                (true, Some(view)) => view
                    .partitions
                    .values()
                    .flatten()
                    .filter(|p| p.leader < 0)
                    .count() as i64,
                _ => 0,
            };
            metrics.active_controller.store(i64::from(active), Relaxed);
            metrics.offline_partitions.store(offline, Relaxed);
        }
    }

    pub fn start_housekeeping(self: &Rc<Self>) {
        glommio::spawn_local(super::replication::expire_lagging_followers(self.clone())).detach();
        let shard = self.clone();
        glommio::spawn_local(async move {
            let mut last_retention = Instant::now();
            let mut last_compaction = Instant::now();
            let retention_check =
                Duration::from_millis(shard.config().log_retention_check_interval_ms);
            let compaction_check = Duration::from_millis(shard.config().log_cleaner_backoff_ms);
            let mut last_gauges = Instant::now();
            loop {
                glommio::timer::sleep(Duration::from_millis(FLUSH_CHECK_MS)).await;
                let partitions: Vec<_> = shard.partitions.borrow().iter().map(|(k, p)| (k.clone(), p.clone())).collect();
                if last_gauges.elapsed() >= GAUGES_INTERVAL {
                    last_gauges = Instant::now();
                    shard.store_gauges(&partitions);
                }
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
                        // Never past the last stable offset as the partition's high
                        // watermark makes it, not this replica's own log end.
                        let hw = p.high_watermark();
                        if let Err(e) = p.log.compact_up_to(hw).await.map(drop).or_else(ignore_closed) {
                            tracing::warn!(topic = %topic, partition = index, error = %e, "compaction failed");
                        }
                    }
                }
            }
        })
        .detach();
    }
}
