//! Per-shard background work on the shard's partitions, off the produce path: `flush.mode =
//! interval` fdatasyncs, retention (`retention.ms`, `retention.bytes`, the log start offset;
//! every `log.retention.check.interval.ms`, as Kafka) and compaction of `cleanup.policy =
//! compact` topics (every `log.cleaner.backoff.ms`); and the reactor probe, which times the
//! shard's own responsiveness.

use std::rc::Rc;
use std::time::{Duration, Instant};

use sluice_engine::waits::{self, Wait};
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

/// How often the reactor probe's timer is due.
const PROBE_PERIOD: Duration = Duration::from_millis(50);

/// A thread's own CPU time and scheduling counts (`getrusage(RUSAGE_THREAD)`).
#[derive(Clone, Copy, Debug, Default)]
struct ThreadUsage {
    cpu: Duration,
    voluntary_switches: i64,
    involuntary_switches: i64,
    major_faults: i64,
}

impl ThreadUsage {
    fn now() -> ThreadUsage {
        // SAFETY: rusage is plain integers, for which all zeroes is a valid value.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: getrusage writes the struct it is given and nothing else.
        if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) } != 0 {
            return ThreadUsage::default();
        }
        let tv = |t: libc::timeval| {
            Duration::new(t.tv_sec.max(0) as u64, (t.tv_usec.max(0) as u32) * 1_000)
        };
        ThreadUsage {
            cpu: tv(u.ru_utime) + tv(u.ru_stime),
            voluntary_switches: u.ru_nvcsw,
            involuntary_switches: u.ru_nivcsw,
            major_faults: u.ru_majflt,
        }
    }

    /// What the thread did between `before` and now, in words, for a reactor that was late
    /// over a span of `wall`.
    fn explain(before: ThreadUsage, wall: Duration) -> String {
        let now = ThreadUsage::now();
        let cpu = now.cpu.saturating_sub(before.cpu);
        let preempted = now.involuntary_switches - before.involuntary_switches;
        let slept = now.voluntary_switches - before.voluntary_switches;
        let faults = now.major_faults - before.major_faults;
        let what = if cpu * 2 >= wall {
            "a task ran without yielding"
        } else if preempted > slept {
            "the thread was runnable but got too little CPU"
        } else {
            "the thread was off CPU without being preempted: asleep in the kernel (a blocking \
             call, a page fault), stopped, or woken but not scheduled"
        };
        format!(
            "the reactor was late: {what} (over {} ms: {} ms on CPU, {preempted} preemptions, \
             {slept} voluntary switches, {faults} major page faults)",
            wall.as_millis(),
            cpu.as_millis()
        )
    }
}

/// Times this shard's reactor: a timer due every [`PROBE_PERIOD`] that fires late means nothing
/// on the shard was served for that long. A late one of [`waits::SLOW`] or more is logged with
/// what the thread did meanwhile, from its own rusage: CPU time (a task that did not yield),
/// preemptions (no CPU to be had), or neither (asleep in the kernel, or woken from its park
/// but left waiting for a core).
async fn probe_reactor() {
    loop {
        let before = (Instant::now(), ThreadUsage::now());
        glommio::timer::sleep(PROBE_PERIOD).await;
        let wall = before.0.elapsed();
        waits::record(Wait::Reactor, wall.saturating_sub(PROBE_PERIOD), || {
            ThreadUsage::explain(before.1, wall)
        });
    }
}

/// Tells the controller which replicas the failed log directory `dir` held, on every shard, as
/// Kafka's brokers report an offline directory: it takes this broker out of their ISRs and
/// leaderships so that other replicas lead (in a cluster), or leaves them without a leader (the
/// last in-sync replica). Tried every second until a controller accepts it (after a new
/// registration, with the new broker epoch).
async fn report_lost_replicas(shard: Rc<Shard>, dir: usize) {
    for attempt in 0u32.. {
        let lost: Vec<(String, i32)> = shard
            .invoke_on_all(move |s| async move {
                s.partitions
                    .borrow()
                    .iter()
                    .filter(|(_, p)| s.shared.log_dirs.of(p.log.dir()) == Some(dir))
                    .map(|(key, _)| key.clone())
                    .collect::<Vec<_>>()
            })
            .await
            .concat();
        let image = shard.image();
        let partitions: Vec<_> = lost
            .iter()
            .filter_map(|(topic, p)| {
                image
                    .topics
                    .get(topic)
                    .map(|t| (sluice_replication::records::TopicId(t.id), *p))
            })
            .collect();
        let count = partitions.len();
        let answer = shard
            .invoke_on(0, move |s0| async move {
                match s0.controller() {
                    Some(c) => c.lost_replicas(partitions).await,
                    None => None,
                }
            })
            .await;
        match answer {
            Some(r) if r.error_code == 0 => {
                tracing::info!(replicas = count, attempt, "the controller took this broker's replicas in the offline log directory out of their ISRs and leaderships");
                return;
            }
            other => {
                if attempt % 10 == 0 {
                    tracing::warn!(answer = ?other.map(|r| r.error_code), "could not report the offline log directory's replicas to the controller yet; trying again every second");
                }
                glommio::timer::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

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

    /// A replica whose log failed (a write, fdatasync or truncation error poisoned it) takes its
    /// log directory offline, as Kafka does on any storage error in a directory: every replica
    /// there, on every shard (each at its next check), then answers KAFKA_STORAGE_ERROR, and no
    /// new replica goes there; the replicas on the other directories keep serving.
    fn check_log_dirs(
        self: &Rc<Self>,
        partitions: &[((String, i32), Rc<super::partition::Partition>)],
    ) {
        let dirs = &self.shared.log_dirs;
        // Cheap while all is well (every 50 ms over every partition): a directory is looked up
        // only for a poisoned log, or once some directory is offline.
        let any_offline = dirs.dirs().iter().any(|d| d.is_offline());
        for ((topic, index), p) in partitions {
            if !any_offline && p.log.poisoned().is_none() {
                continue;
            }
            let Some(d) = dirs.of(p.log.dir()) else {
                continue;
            };
            let dir = &dirs.dirs()[d];
            if dir.is_offline() {
                if p.log.poisoned().is_none() {
                    p.log
                        .take_offline(format!("log directory {} is offline", dir.path.display()));
                }
                continue;
            }
            if let Some(reason) = p.log.poisoned() {
                if dirs.set_offline(d) {
                    self.shared
                        .metrics
                        .offline_log_dirs
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::error!(log_dir = %dir.path.display(), directory_id = %dir.id, topic = %topic, partition = index, %reason, "a storage error took the log directory offline: its replicas answer KAFKA_STORAGE_ERROR until the broker restarts");
                    glommio::spawn_local(report_lost_replicas(self.clone(), d)).detach();
                }
            }
        }
    }

    pub fn start_housekeeping(self: &Rc<Self>) {
        glommio::spawn_local(probe_reactor()).detach();
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
                shard.check_log_dirs(&partitions);
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
