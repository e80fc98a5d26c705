//! The simulation's data plane: partition replicas on the simulated brokers, each a real
//! `sluice_engine::Log` over the engine's test storage (`MemStorage`: a power loss drops what
//! was not fdatasync'd, or keeps a random part of it as torn sectors; a write or an fdatasync
//! can be made to fail), led and followed by the same sans-IO code the broker runs:
//! `ReplicaRole::update` for what the image makes a replica, `LeaderState` for followers'
//! progress, the ISR, the high watermark and acks=all, `diverging_epoch` for KIP-320 at the
//! leader, the broker's own follower component (`follower::apply`: truncation, starting
//! over, appending what comes back as the leader stored it) and its produce component
//! (`produce`: the leader and acks=all checks, the error a refused append answers, when an
//! acks=all produce is answered). Around them the broker's glue, as
//! short as the broker's own: a follower fetches from its log end, has `follower::apply` take
//! the answer, makes what it appended durable (`Log::flush_for_replica`, after a simulated
//! fdatasync latency; a slow disk's is long) and only then fetches again; a leader answers
//! fetches (a follower up to its log end, a consumer up to the high watermark), takes acks=all
//! produces and sends AlterPartition to the controller. A failed write or fdatasync stops the
//! broker, which comes back later on what its disk kept.
//!
//! Clients: one idempotent producer per partition of the `events` topic (replication factor
//! 3, `min.insync.replicas` 2) sends one-record batches with acks=all, each value unique, and
//! retries the same batch (same sequence) after every retriable error and timeout; one
//! consumer per partition reads from the leader up to its high watermark, now and then from the
//! start again. Both find the leader in a broker's image, as a Kafka client finds it in
//! Metadata, so they may ask a stale one.
//!
//! Checked: no two brokers lead a partition at one leader epoch; on every replica at every
//! step `log_start <= high watermark <= log end`; a leader's high watermark never goes back
//! within its leadership; a consumer never reads two values at one offset. After healing: every acknowledged write is on every replica
//! (all in the ISR by then) once, at its acknowledged offset; the replicas hold the same
//! batches byte for byte; everything a consumer read is in the final log at the offset it was
//! read at; no value is stored twice.

use std::path::PathBuf;
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use futures_lite::future::block_on;
use sluice_engine::batch::{BatchBuilder, BatchHeader, NewRecord, Records};
use sluice_engine::{
    BatchCache, Clock, CrashMode, LeaderEpoch as LogEpoch, Log, LogConfig, LogError, MemStorage,
    Offset as LogOffset, Storage, Timestamp,
};
use sluice_replication::follower::{self, Applied, FetchedPartition};
use sluice_replication::image::{MetadataImage, PartitionRegistration};
use sluice_replication::produce::{self, Refusal};
use sluice_replication::replica::{
    diverging_epoch, fetch_position, FetchPosition, IsrAnswer, IsrChange, ReplicaConfig,
    ReplicaRole, RoleChange, RoleUpdate,
};

use super::*;

#[path = "share.rs"]
mod share;
pub use share::SHARE_BASE;
use share::{ShareFetch, ShareFetchAnswer, ShareState};

pub const DATA_TOPIC: &str = "events";
pub const DATA_PARTITIONS: i32 = 2;
/// Idempotent producers per partition: two, so that a new leader takes one's records while
/// the old one still holds the other's, not yet durable.
const PRODUCERS_PER_PARTITION: i32 = 2;
/// `replica.lag.time.max.ms` of the simulated brokers.
const REPLICA_LAG_TIME_MAX_MS: u64 = 1_500;
/// Client ids of the producers and consumers: like the admin, never cut off by a partition.
pub const PRODUCER_BASE: u64 = 2_000;
pub const CONSUMER_BASE: u64 = 3_000;
/// A broker's AlterPartition channel to the controller (id + this), apart from its heartbeats.
pub const ALTER_BASE: u64 = 10_000;
const PRODUCER_ID_BASE: i64 = 9_000;
const PRODUCE_TIMEOUT_MS: u64 = 1_500;
const FETCH_TIMEOUT_MS: u64 = 1_000;
const FETCH_MAX_BYTES: usize = 2_048;
/// The broker's pause before sending an unanswered ISR change again.
const ISR_RETRY_BACKOFF_MS: u64 = 200;
use sluice_replication::error_code::{OFFSET_OUT_OF_RANGE, UNKNOWN_LEADER_EPOCH};

/// A fetch, of a follower or a consumer, as far as replication needs it.
#[derive(Clone, Debug)]
pub struct Fetch {
    topic_id: TopicId,
    partition: i32,
    fetch_offset: i64,
    last_fetched_epoch: i32,
    current_leader_epoch: i32,
    /// A follower's id and broker epoch (KIP-903); `None` for a consumer.
    replica: Option<(BrokerId, BrokerEpoch)>,
    seq: u64,
}

#[derive(Clone, Debug)]
pub struct FetchAnswer {
    topic_id: TopicId,
    partition: i32,
    seq: u64,
    error_code: i16,
    high_watermark: i64,
    log_start_offset: i64,
    diverging: Option<(LeaderEpoch, i64)>,
    batches: Vec<Bytes>,
}

#[derive(Clone, Debug)]
pub enum DataMsg {
    Fetch(Fetch),
    FetchAnswer(FetchAnswer),
    Produce {
        topic_id: TopicId,
        partition: i32,
        batch: Bytes,
        seq: u64,
    },
    ProduceResponse {
        seq: u64,
        error_code: i16,
        base_offset: i64,
    },
    ShareFetch(ShareFetch),
    ShareFetchAnswer(ShareFetchAnswer),
}

/// An acks=all produce waiting for the high watermark.
struct PendingAck {
    client: u64,
    seq: u64,
    /// The leader epoch it was appended at.
    epoch: LogEpoch,
    /// The waiting task looks at its partition again no earlier than this: in the broker it is
    /// woken by a change and runs when its shard gets to it, so a replica may lose and regain
    /// its leadership before the produce is answered.
    look_at: u64,
    base_offset: i64,
    end_offset: i64,
    deadline: u64,
}

struct SimReplica {
    log: Log<MemStorage>,
    role: ReplicaRole,
    /// The fetch in flight (responses to others are ignored) and when it left.
    fetch: Option<(u64, u64)>,
    /// What was appended as follower becomes durable at this time.
    flush_at: Option<u64>,
    /// The fdatasync of what this replica appended as leader ends at this time. Until then
    /// those records are in the log (followers copy them) but not durable, and may still be
    /// when the replica becomes a follower, as in the broker.
    leader_sync_at: Option<u64>,
    /// No fetch before this (after an error or an empty answer).
    fetch_after: u64,
    pending_acks: Vec<PendingAck>,
    /// The high watermark this leadership last showed.
    last_high_watermark: i64,
}

/// An AlterPartition in flight: its request id, when it left, the changes it carries.
type AlterInFlight = (RequestId, u64, Vec<(TopicId, i32, IsrChange)>);

pub struct BrokerData {
    storage: MemStorage,
    clock: Clock,
    cache: Rc<BatchCache>,
    replicas: BTreeMap<(TopicId, i32), SimReplica>,
    /// The AlterPartition in flight: request id, when it left, the partitions it carries.
    alter_in_flight: Option<AlterInFlight>,
    /// ISR changes waiting for the channel, and when it may send again after no answer.
    alter_queue: Vec<(TopicId, i32, IsrChange)>,
    alter_retry_at: u64,
    /// This disk's fdatasync latency range, ms.
    disk_delay_ms: (u64, u64),
    pub slow_disk_until: u64,
}

struct Producer {
    partition: i32,
    /// The batch being sent until acknowledged: its sequence and value.
    sequence: i32,
    value: u64,
    /// Sent at least once and not acknowledged yet.
    pending: bool,
    in_flight: Option<(u64, u64)>,
    next_send: u64,
}

struct Consumer {
    partition: i32,
    position: i64,
    in_flight: Option<(u64, u64)>,
    next_fetch: u64,
}

/// Messages to send once the borrows end: (from, to, message).
type Outbox = Vec<(u64, u64, DataMsg)>;

pub struct DataPlane {
    pub brokers: BTreeMap<u64, BrokerData>,
    producers: Vec<Producer>,
    consumers: Vec<Consumer>,
    /// (partition, value) -> offset, for every acknowledged produce.
    pub acked: BTreeMap<(i32, u64), i64>,
    /// (partition, offset) -> value, for everything a consumer read.
    pub consumed: BTreeMap<(i32, i64), u64>,
    /// (partition, leader epoch) -> the broker that led it.
    epochs: BTreeMap<(i32, i32), u64>,
    pub produce_errors: BTreeMap<i16, u64>,
    pub truncations: u64,
    pub storage_failures: u64,
    pub leaderships: u64,
    next_seq: u64,
    topic_id: Option<TopicId>,
    /// The share group's consumers and the share partitions' state (share.rs).
    pub share: ShareState,
}

/// `SIM_TRACE=1` prints the data plane's events.
fn trace() -> bool {
    thread_local! {
        static ON: bool = std::env::var_os("SIM_TRACE").is_some();
    }
    ON.with(|on| *on)
}

fn log_config() -> LogConfig {
    LogConfig {
        segment_bytes: 8 << 10,
        retention_ms: -1,
        retention_bytes: -1,
        index_interval_bytes: 256,
        ..LogConfig::default()
    }
}

fn log_dir(broker: u64, topic_id: TopicId, partition: i32) -> PathBuf {
    PathBuf::from(format!("/b{broker}/{topic_id}-{partition}"))
}

/// The value of the one record of a batch the producers wrote.
fn batch_value(batch: &[u8]) -> u64 {
    let mut records = Records::new(batch);
    let record = records.next().expect("one record").expect("a valid record");
    u64::from_be_bytes(record.value.expect("a value").try_into().expect("8 bytes"))
}

/// What [`append_until_buffered`] got to.
enum Appended {
    /// Done, durable (a duplicate, answered with its first offsets; or the append made it
    /// durable on its way).
    Durable(sluice_engine::AppendInfo),
    /// In the log at these offsets, its fdatasync not run yet.
    Buffered { base_offset: i64, end_offset: i64 },
}

/// A leader's append up to the point where its records are in the log and readable, the
/// fdatasync not done: the broker's produce at that moment (its sync runs on, and the
/// replica's role can change meanwhile). The simulation finishes the sync later
/// (`leader_sync_at`).
fn append_until_buffered(
    log: &Log<MemStorage>,
    batch: &Bytes,
    epoch: LogEpoch,
) -> Result<Appended, LogError> {
    let buffered = std::cell::Cell::new(false);
    let start = log.log_end_offset().0;
    let append = log.append_signalling(
        BytesMut::from(&batch[..]),
        epoch,
        || {},
        || buffered.set(true),
    );
    let mut append = std::pin::pin!(append);
    loop {
        if let Some(done) = block_on(futures_lite::future::poll_once(&mut append)) {
            return done.map(Appended::Durable);
        }
        if buffered.get() {
            return Ok(Appended::Buffered {
                base_offset: start,
                end_offset: log.log_end_offset().0,
            });
        }
    }
}

fn produce_batch(producer: usize, sequence: i32, value: u64) -> Bytes {
    let mut b = BatchBuilder::new().producer(PRODUCER_ID_BASE + producer as i64, 0, sequence);
    b.push(&NewRecord {
        key: None,
        value: Some(value.to_be_bytes().to_vec()),
        headers: vec![],
        timestamp: Timestamp(1_700_000_000_000),
    });
    b.build()
}

fn data_partition(
    image: &MetadataImage,
    partition: i32,
) -> Option<(TopicId, &PartitionRegistration)> {
    let topic = image.topic(DATA_TOPIC)?;
    Some((topic.id, topic.partitions.get(&partition)?))
}

/// An injected storage failure (EIO, ENOSPC, or a log poisoned by one): the broker stops.
/// Anything else a log operation returns here is a bug.
fn check_storage_error(broker: u64, e: &LogError) {
    assert!(
        matches!(
            e,
            LogError::Io { .. } | LogError::Poisoned { .. } | LogError::DiskFull(_)
        ),
        "broker {broker}: a log operation failed: {e}"
    );
}

impl DataPlane {
    pub fn new(rng: &mut StdRng) -> DataPlane {
        let brokers = BROKERS
            .iter()
            .map(|&b| {
                let data = BrokerData {
                    storage: MemStorage::new(),
                    clock: Clock::manual(0),
                    cache: BatchCache::new(64 << 10),
                    replicas: BTreeMap::new(),
                    alter_in_flight: None,
                    alter_queue: Vec::new(),
                    alter_retry_at: 0,
                    disk_delay_ms: (1, rng.gen_range(5..30)),
                    slow_disk_until: 0,
                };
                (b, data)
            })
            .collect();
        DataPlane {
            brokers,
            producers: (0..DATA_PARTITIONS * PRODUCERS_PER_PARTITION)
                .map(|i| Producer {
                    partition: i % DATA_PARTITIONS,
                    sequence: 0,
                    value: ((i as u64) << 32) | 1,
                    pending: false,
                    in_flight: None,
                    next_send: 0,
                })
                .collect(),
            consumers: (0..DATA_PARTITIONS)
                .map(|partition| Consumer {
                    partition,
                    position: 0,
                    in_flight: None,
                    next_fetch: 0,
                })
                .collect(),
            acked: BTreeMap::new(),
            consumed: BTreeMap::new(),
            epochs: BTreeMap::new(),
            produce_errors: BTreeMap::new(),
            truncations: 0,
            storage_failures: 0,
            leaderships: 0,
            next_seq: 0,
            topic_id: None,
            share: ShareState::new(),
        }
    }

    pub fn topic_known(&self) -> bool {
        self.topic_id.is_some()
    }

    /// A broker's process died (power loss or a storage failure): its logs go with it, its
    /// disk keeps what `mode` says.
    pub fn crash(&mut self, broker: u64, mode: CrashMode) {
        if let Some(b) = self.brokers.get_mut(&broker) {
            b.storage = b.storage.crash(mode);
            b.replicas.clear();
            b.alter_in_flight = None;
            b.alter_queue.clear();
        }
        self.share.crash(broker);
    }

    /// Makes the broker's disk fail its `n`-th next data operation.
    pub fn fail_storage_after(&mut self, broker: u64, n: u64) {
        self.brokers[&broker].storage.fail_after(n);
    }

    /// No more injected storage failures (the heal phase).
    pub fn disarm(&mut self) {
        for b in self.brokers.values_mut() {
            b.storage.fail_after(u64::MAX);
            b.slow_disk_until = 0;
        }
    }

    fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    /// Leads or follows each of this broker's replicas as `image` says; opens new ones,
    /// deletes those moved away. `registered`: its epoch of this run when the image holds it.
    fn apply_image(
        &mut self,
        id: u64,
        image: &MetadataImage,
        registered: bool,
        now: u64,
        out: &mut Outbox,
    ) -> Result<(), LogError> {
        let me = BrokerId(id as i32);
        let topic = image.topic(DATA_TOPIC);
        if let Some(t) = topic {
            self.topic_id.get_or_insert(t.id);
        }
        let min_insync_replicas = image
            .topic_configs(DATA_TOPIC)
            .and_then(|c| c.get("min.insync.replicas"))
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let config = ReplicaConfig {
            replica_lag_time_max_ms: REPLICA_LAG_TIME_MAX_MS,
            min_insync_replicas,
        };
        let b = self.brokers.get_mut(&id).unwrap();
        b.clock.advance(now as i64 - b.clock.now_ms());
        let wanted: BTreeSet<(TopicId, i32)> = topic
            .map(|t| {
                t.partitions
                    .iter()
                    .filter(|(_, p)| p.replicas.contains(&me))
                    .map(|(&i, _)| (t.id, i))
                    .collect()
            })
            .unwrap_or_default();
        let gone: Vec<(TopicId, i32)> = b
            .replicas
            .keys()
            .filter(|k| !wanted.contains(k))
            .copied()
            .collect();
        for key in gone {
            let r = b.replicas.remove(&key).unwrap();
            fail_acks(id, r.pending_acks, out);
            block_on(r.log.close())?;
            let dir = log_dir(id, key.0, key.1);
            for name in block_on(b.storage.list_dir(&dir)).unwrap_or_default() {
                block_on(b.storage.remove(&dir.join(name))).map_err(|source| LogError::Io {
                    context: "removing a moved replica",
                    source,
                })?;
            }
        }
        let Some(t) = topic else { return Ok(()) };
        for key in wanted {
            let p = &t.partitions[&key.1];
            if !b.replicas.contains_key(&key) {
                let log = block_on(Log::open(
                    b.storage.clone(),
                    log_dir(id, key.0, key.1),
                    log_config(),
                    b.cache.clone(),
                    b.clock.clone(),
                ))?;
                let r = SimReplica {
                    log,
                    role: ReplicaRole::Unknown,
                    fetch: None,
                    flush_at: None,
                    leader_sync_at: None,
                    fetch_after: 0,
                    pending_acks: Vec::new(),
                    last_high_watermark: -1,
                };
                b.replicas.insert(key, r);
            }
            let r = b.replicas.get_mut(&key).unwrap();
            let change = r.role.update(
                RoleUpdate {
                    me,
                    leader: if registered { p.leader } else { BrokerId(-1) },
                    leader_epoch: p.leader_epoch,
                    partition_epoch: p.partition_epoch,
                    replicas: &p.replicas,
                    isr: &p.isr,
                    config,
                },
                r.log.high_watermark().0,
                r.log.log_start_offset().0,
                now,
            );
            match change {
                RoleChange::Leading => {
                    self.leaderships += 1;
                    if trace() {
                        eprintln!(
                            "{now} broker {id} leads partition {} at epoch {} isr {:?}, log end {}",
                            key.1,
                            p.leader_epoch.0,
                            p.isr,
                            r.log.log_end_offset().0
                        );
                    }
                    let led = *self.epochs.entry((key.1, p.leader_epoch.0)).or_insert(id);
                    assert_eq!(
                        led, id,
                        "partition {} has two leaders at leader epoch {}",
                        key.1, p.leader_epoch.0
                    );
                    r.last_high_watermark = -1;
                    r.fetch = None;
                }
                RoleChange::Following => {
                    r.fetch = None;
                    r.fetch_after = 0;
                    r.last_high_watermark = -1;
                }
                RoleChange::SameLeadership { .. } | RoleChange::Unchanged => {}
            }
        }
        Ok(())
    }

    /// A step of this broker's leaders (ISR shrinks, acks=all answers) and followers (flushes,
    /// fetches).
    fn run_replicas(
        &mut self,
        id: u64,
        epoch: Option<BrokerEpoch>,
        now: u64,
        local_now: u64,
        out: &mut Outbox,
    ) -> Result<(), LogError> {
        let keys: Vec<(TopicId, i32)> = self.brokers[&id].replicas.keys().copied().collect();
        for key in keys {
            let seq = self.seq();
            let b = self.brokers.get_mut(&id).unwrap();
            let r = b.replicas.get_mut(&key).unwrap();
            // A flush the replica fetcher started completes whatever the role is now.
            if r.flush_at.is_some_and(|at| now >= at) {
                block_on(r.log.flush_for_replica())?;
                r.flush_at = None;
            }
            // So does a produce's.
            if r.leader_sync_at.is_some_and(|at| now >= at) {
                block_on(r.log.flush())?;
                r.leader_sync_at = None;
            }
            let (hw, _) = r.role.high_watermark(r.log.high_watermark().0);
            let (start, end) = (r.log.log_start_offset().0, r.log.log_end_offset().0);
            if hw >= 0 {
                assert!(
                    start <= hw && hw <= end,
                    "broker {id} partition {}: log start {start}, high watermark {hw}, log end {end}",
                    key.1
                );
            }
            // Leader epochs only grow along the log.
            let epochs = r.log.leader_epochs();
            assert!(
                epochs
                    .windows(2)
                    .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
                "broker {id} partition {}: leader epochs out of order: {epochs:?}",
                key.1
            );
            // Waiting acks=all produces are answered as the broker's `wait_acks_all` answers
            // them, whatever this replica is now.
            let mut i = 0;
            while i < r.pending_acks.len() {
                let a = &mut r.pending_acks[i];
                if now < a.look_at {
                    i += 1;
                    continue;
                }
                a.look_at = now + waiter_delay(a.seq ^ now);
                let timed_out = now >= a.deadline;
                let Some(code) =
                    produce::acks_all_answer(&r.role, a.epoch, a.end_offset, timed_out)
                else {
                    i += 1;
                    continue;
                };
                let a = r.pending_acks.remove(i);
                let base_offset = if code == 0 { a.base_offset } else { -1 };
                out.push((
                    id,
                    a.client,
                    DataMsg::ProduceResponse {
                        seq: a.seq,
                        error_code: code,
                        base_offset,
                    },
                ));
            }
            match &mut r.role {
                ReplicaRole::Leader(l) => {
                    assert!(
                        hw >= r.last_high_watermark,
                        "broker {id} partition {}: the high watermark went back from {} to {hw}",
                        key.1,
                        r.last_high_watermark
                    );
                    r.last_high_watermark = hw;
                    if let Some(change) = l.tick(local_now) {
                        b.alter_queue.push((key.0, key.1, change));
                    }
                }
                ReplicaRole::Follower(f) => {
                    if r.fetch
                        .is_some_and(|(_, sent)| now >= sent + FETCH_TIMEOUT_MS)
                    {
                        r.fetch = None;
                    }
                    let Some(epoch) = epoch else { continue };
                    if r.fetch.is_some()
                        || r.flush_at.is_some()
                        || now < r.fetch_after
                        || f.leader.0 < 0
                        || r.log.poisoned().is_some()
                    {
                        continue;
                    }
                    let last_epoch = r.log.leader_epochs().last().map(|(e, _)| LeaderEpoch(e.0));
                    let FetchPosition::At {
                        fetch_offset,
                        last_fetched_epoch,
                    } = fetch_position(end, r.log.high_watermark().0, last_epoch)
                    else {
                        block_on(r.log.flush_for_replica())?;
                        continue;
                    };
                    r.fetch = Some((seq, now));
                    out.push((
                        id,
                        f.leader.0 as u64,
                        DataMsg::Fetch(Fetch {
                            topic_id: key.0,
                            partition: key.1,
                            fetch_offset,
                            last_fetched_epoch: last_fetched_epoch.0,
                            current_leader_epoch: f.leader_epoch.0,
                            replica: Some((BrokerId(id as i32), epoch)),
                            seq,
                        }),
                    ));
                }
                ReplicaRole::Unknown => {}
            }
        }
        Ok(())
    }

    /// A leader's answer to a fetch (a follower's or a consumer's).
    fn on_fetch(&mut self, id: u64, f: &Fetch, local_now: u64) -> Result<FetchAnswer, LogError> {
        let (topic_id, partition, fetch_offset) = (f.topic_id, f.partition, f.fetch_offset);
        let mut answer = FetchAnswer {
            topic_id,
            partition,
            seq: f.seq,
            error_code: error_code::NOT_LEADER_OR_FOLLOWER,
            high_watermark: -1,
            log_start_offset: -1,
            diverging: None,
            batches: vec![],
        };
        let b = self.brokers.get_mut(&id).unwrap();
        let Some(r) = b.replicas.get_mut(&(topic_id, partition)) else {
            return Ok(answer);
        };
        let ReplicaRole::Leader(l) = &mut r.role else {
            return Ok(answer);
        };
        // The broker's `Partition::check_leader`.
        let current = f.current_leader_epoch;
        if current >= 0 && current < l.leader_epoch.0 {
            answer.error_code = error_code::FENCED_LEADER_EPOCH;
            return Ok(answer);
        }
        if current > l.leader_epoch.0 {
            answer.error_code = UNKNOWN_LEADER_EPOCH;
            return Ok(answer);
        }
        answer.error_code = error_code::NONE;
        answer.log_start_offset = r.log.log_start_offset().0;
        let visible_end = match f.replica {
            Some((follower, broker_epoch)) => {
                if f.last_fetched_epoch >= 0 {
                    let end = r
                        .log
                        .end_offset_for_epoch(LogEpoch(f.last_fetched_epoch))
                        .map(|(e, o)| (LeaderEpoch(e.0), o.0));
                    answer.diverging = diverging_epoch(
                        end,
                        LeaderEpoch(f.last_fetched_epoch),
                        fetch_offset,
                        answer.log_start_offset,
                    );
                }
                if answer.diverging.is_none() {
                    l.on_log_end(r.log.high_watermark().0);
                    let (_, change) = l.on_fetch(follower, broker_epoch, fetch_offset, local_now);
                    if let Some(change) = change {
                        b.alter_queue.push((topic_id, partition, change));
                    }
                }
                r.log.log_end_offset().0
            }
            None => r.role.high_watermark(r.log.high_watermark().0).0,
        };
        answer.high_watermark = r.role.high_watermark(r.log.high_watermark().0).0;
        if answer.diverging.is_some() {
            return Ok(answer);
        }
        match block_on(r.log.read(
            LogOffset(fetch_offset),
            FETCH_MAX_BYTES,
            LogOffset(visible_end),
        )) {
            Ok(read) => answer.batches = read.into_iter().map(|b| b.bytes).collect(),
            Err(LogError::OffsetOutOfRange { .. }) => answer.error_code = OFFSET_OUT_OF_RANGE,
            Err(e) => return Err(e),
        }
        Ok(answer)
    }

    /// A follower applies its leader's answer, as the broker's replica fetcher does.
    fn on_fetch_answer(
        &mut self,
        id: u64,
        a: FetchAnswer,
        now: u64,
        rng: &mut StdRng,
    ) -> Result<(), LogError> {
        let FetchAnswer {
            topic_id,
            partition,
            seq,
            error_code,
            high_watermark,
            log_start_offset,
            diverging,
            batches,
        } = a;
        let b = self.brokers.get_mut(&id).unwrap();
        let slow = now < b.slow_disk_until;
        let (lo, hi) = b.disk_delay_ms;
        let Some(r) = b.replicas.get_mut(&(topic_id, partition)) else {
            return Ok(());
        };
        if r.fetch.map(|(s, _)| s) != Some(seq) {
            return Ok(());
        }
        r.fetch = None;
        let ReplicaRole::Follower(f) = &mut r.role else {
            return Ok(());
        };
        // The broker's own follower component (`sluice_replication::follower`).
        let answer = FetchedPartition {
            error_code,
            high_watermark,
            log_start_offset,
            diverging,
            batches,
        };
        let applied = block_on(follower::apply(&r.log, answer))?;
        if applied.takes_high_watermark() {
            f.high_watermark = high_watermark;
        }
        match applied {
            Applied::Truncated { .. }
            | Applied::StartedOver { .. }
            | Applied::TruncatedToHighWatermark { .. } => self.truncations += 1,
            Applied::Retry | Applied::Refused(_) => r.fetch_after = now + 100,
            Applied::Appended | Applied::Nothing | Applied::StoppedBelowLogEnd { .. } => {
                if applied.appended() {
                    let delay = if slow {
                        rng.gen_range(200..1_500)
                    } else {
                        rng.gen_range(lo..=hi)
                    };
                    r.flush_at = Some(now + delay);
                } else {
                    // Nothing new: the next fetch a moment later (a real one waits at the
                    // leader).
                    r.fetch_after = now + 20;
                }
            }
        }
        Ok(())
    }

    /// A leader takes an acks=all produce; it is answered once the high watermark passes it.
    #[allow(clippy::too_many_arguments)]
    fn on_produce(
        &mut self,
        id: u64,
        client: u64,
        (topic_id, partition): (TopicId, i32),
        batch: Bytes,
        seq: u64,
        now: u64,
        rng: &mut StdRng,
        out: &mut Outbox,
    ) -> Result<(), LogError> {
        let reply = |error_code| {
            (
                id,
                client,
                DataMsg::ProduceResponse {
                    seq,
                    error_code,
                    base_offset: -1,
                },
            )
        };
        let b = self.brokers.get_mut(&id).unwrap();
        let slow = now < b.slow_disk_until;
        let (lo, hi) = b.disk_delay_ms;
        let Some(r) = b.replicas.get_mut(&(topic_id, partition)) else {
            out.push(reply(error_code::NOT_LEADER_OR_FOLLOWER));
            return Ok(());
        };
        // The broker's own checks, in its order.
        let header = BatchHeader::parse(&batch).ok();
        let admitted = produce::check_batch(header.as_ref())
            .and_then(|()| produce::admit(&r.role, produce::ACKS_ALL));
        let epoch = match admitted {
            Ok(epoch) => epoch,
            Err(refused) => {
                out.push(reply(refused.error_code));
                return Ok(());
            }
        };
        match append_until_buffered(&r.log, &batch, epoch) {
            Ok(Appended::Durable(info)) => {
                if let ReplicaRole::Leader(l) = &mut r.role {
                    l.on_log_end(r.log.high_watermark().0);
                }
                r.pending_acks.push(PendingAck {
                    client,
                    seq,
                    epoch,
                    look_at: now + waiter_delay(seq),
                    base_offset: info.base_offset.0,
                    end_offset: info.last_offset.0 + 1,
                    deadline: now + PRODUCE_TIMEOUT_MS,
                });
            }
            Ok(Appended::Buffered {
                base_offset,
                end_offset,
            }) => {
                // The fdatasync runs on: one per group of appends, as the broker's group commit.
                if r.leader_sync_at.is_none() {
                    let delay = if slow {
                        rng.gen_range(200..1_500)
                    } else {
                        rng.gen_range(lo..=hi)
                    };
                    r.leader_sync_at = Some(now + delay);
                }
                r.pending_acks.push(PendingAck {
                    client,
                    seq,
                    epoch,
                    look_at: now + waiter_delay(seq),
                    base_offset,
                    end_offset,
                    deadline: now + PRODUCE_TIMEOUT_MS,
                });
            }
            // A producer's error is the client's; any other stops the broker (storage).
            Err(e @ LogError::Producer(_)) => {
                let refused = Refusal::of(&e, DATA_TOPIC, partition, r.log.log_start_offset().0);
                out.push(reply(refused.error_code))
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// The controller answered a broker's AlterPartition, or it never will (`None`: the
    /// request or its answer was lost, or timed out), as the broker's replication does: a
    /// definite answer per partition goes to its leader (`LeaderState::on_isr_answer`); for the
    /// others the pending change is sent again a moment later.
    fn on_alter_answer(&mut self, id: u64, response: Option<AlterPartitionResponse>, now: u64) {
        let b = self.brokers.get_mut(&id).unwrap();
        let Some((_, _, changes)) = b.alter_in_flight.take() else {
            return;
        };
        let results = response
            .filter(|r| r.error_code == error_code::NONE)
            .map(|r| r.partitions)
            .unwrap_or_default();
        for (topic_id, partition, answered) in changes {
            let key = (topic_id, partition);
            let Some(ReplicaRole::Leader(l)) = b.replicas.get_mut(&key).map(|r| &mut r.role) else {
                continue;
            };
            let result = results
                .iter()
                .find(|p| p.topic_id == key.0 && p.partition_id == key.1);
            match result {
                Some(p) if p.error_code == error_code::NONE => {
                    l.on_isr_answer(
                        &answered,
                        IsrAnswer::Committed {
                            isr: p.isr.clone(),
                            partition_epoch: p.partition_epoch,
                        },
                    );
                }
                Some(p) => {
                    l.on_isr_answer(
                        &answered,
                        IsrAnswer::Refused {
                            leader_epoch: p.leader_epoch,
                            isr: p.isr.clone(),
                            partition_epoch: p.partition_epoch,
                        },
                    );
                }
                None => {
                    // Sent again only while it is still the pending change.
                    if let Some(change) = l.pending_change().filter(|c| **c == answered) {
                        b.alter_queue.push((key.0, key.1, change.clone()));
                        b.alter_retry_at = now + ISR_RETRY_BACKOFF_MS;
                    }
                }
            }
        }
    }

    fn check_final(&self, image: &MetadataImage) {
        let Some(topic) = image.topic(DATA_TOPIC) else {
            assert!(
                self.acked.is_empty(),
                "writes were acknowledged to a topic that is gone"
            );
            return;
        };
        for (&partition, p) in &topic.partitions {
            // Every replica's batches, read from its log.
            let mut logs: Vec<(u64, Vec<Bytes>)> = Vec::new();
            for r in &p.replicas {
                let id = r.0 as u64;
                let replica = &self.brokers[&id].replicas[&(topic.id, partition)];
                let log = &replica.log;
                let mut batches = Vec::new();
                let mut from = log.log_start_offset();
                while from < log.log_end_offset() {
                    let read = block_on(log.read(from, 1 << 20, log.log_end_offset()))
                        .expect("reading a healed replica");
                    let last = read.last().expect("batches up to the log end").last_offset;
                    batches.extend(read.into_iter().map(|b| b.bytes));
                    from = last.next();
                }
                logs.push((id, batches));
            }
            let (first, reference) = &logs[0];
            for (id, batches) in &logs[1..] {
                assert!(
                    batches == reference,
                    "partition {partition}: broker {id}'s log differs from broker {first}'s"
                );
            }
            let mut at: BTreeMap<u64, i64> = BTreeMap::new();
            let mut epoch = -1;
            for batch in reference {
                let header = BatchHeader::parse(batch).unwrap();
                assert!(
                    header.partition_leader_epoch().0 >= epoch,
                    "partition {partition}: leader epoch {} after {epoch} at offset {}",
                    header.partition_leader_epoch().0,
                    header.base_offset().0
                );
                epoch = header.partition_leader_epoch().0;
                let value = batch_value(batch);
                if let Some(other) = at.insert(value, header.base_offset().0) {
                    panic!(
                        "partition {partition}: value {value:#x} stored twice, at {other} and {}",
                        header.base_offset().0
                    );
                }
            }
            for (&(_, value), &offset) in self.acked.range((partition, 0)..(partition + 1, 0)) {
                assert_eq!(
                    at.get(&value),
                    Some(&offset),
                    "partition {partition}: acknowledged value {value:#x} at offset {offset} is not there"
                );
            }
            let by_offset: BTreeMap<i64, u64> = at.iter().map(|(&v, &o)| (o, v)).collect();
            self.check_share_values(partition, &by_offset);
            for (&(_, offset), &value) in self
                .consumed
                .range((partition, i64::MIN)..(partition + 1, i64::MIN))
            {
                assert_eq!(
                    by_offset.get(&offset),
                    Some(&value),
                    "partition {partition}: a consumer read {value:#x} at offset {offset}, the log holds another"
                );
            }
        }
    }
}

/// How long a waiting produce's task takes to run again, 0-255 ms, drawn from its sequence
/// number and the time rather than the simulation's generator.
fn waiter_delay(x: u64) -> u64 {
    x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56
}

fn fail_acks(id: u64, acks: Vec<PendingAck>, out: &mut Outbox) {
    for a in acks {
        out.push((
            id,
            a.client,
            DataMsg::ProduceResponse {
                seq: a.seq,
                error_code: error_code::NOT_LEADER_OR_FOLLOWER,
                base_offset: -1,
            },
        ));
    }
}

impl Sim {
    fn registered_epoch(&self, broker: u64) -> Option<BrokerEpoch> {
        let b = self.brokers.iter().find(|b| b.id == broker)?;
        match b.state {
            BrokerState::Registered(e) | BrokerState::ShuttingDown(e) => Some(e),
            BrokerState::Unregistered => None,
        }
    }

    fn send_data(&mut self, out: Outbox) {
        for (from, to, msg) in out {
            self.send(from, to, Payload::Data(msg));
        }
    }

    /// A broker's storage failed: it stops, and comes back later on what its disk kept.
    fn storage_failure(&mut self, broker: u64, e: &LogError) {
        check_storage_error(broker, e);
        self.data.storage_failures += 1;
        self.crash(broker);
    }

    /// Every step: each live broker brings its replicas in line with its image, does its
    /// leaders' and followers' work and sends its ISR changes; then the clients act.
    pub fn run_data(&mut self) {
        let now = self.now;
        let mut out = Outbox::new();
        for &id in BROKERS.iter() {
            let Some(node) = self.nodes[&id].node.as_ref() else {
                continue;
            };
            let local_now = now + self.nodes[&id].clock_skew_ms;
            let epoch = self.registered_epoch(id);
            let image = node.image();
            let me = BrokerId(id as i32);
            let registered = epoch.is_some_and(|e| image.broker(me).is_some_and(|b| b.epoch == e));
            let result = self
                .data
                .apply_image(id, image, registered, local_now, &mut out)
                .and_then(|()| self.data.run_replicas(id, epoch, now, local_now, &mut out));
            if let Err(e) = result {
                self.storage_failure(id, &e);
                continue;
            }
            self.send_isr_changes(id, epoch);
        }
        self.send_data(out);
        self.run_producers();
        self.run_consumers();
        self.run_share_consumers();
        if trace() && now.is_multiple_of(250) {
            let mut line = format!("{now}:");
            for (&id, b) in &self.data.brokers {
                let state = self.brokers.iter().find(|x| x.id == id).map(|x| x.state);
                line += &format!(" | {id} {state:?}");
                for (k, r) in &b.replicas {
                    let role = match &r.role {
                        ReplicaRole::Leader(l) => format!(
                            "L{} isr {:?} hw {}",
                            l.leader_epoch.0,
                            l.isr.iter().map(|b| b.0).collect::<Vec<_>>(),
                            l.high_watermark()
                        ),
                        ReplicaRole::Follower(f) => format!(
                            "F{}<-{} fetch {:?}",
                            f.leader_epoch.0,
                            f.leader.0,
                            r.fetch.map(|(_, t)| now - t)
                        ),
                        ReplicaRole::Unknown => "U".into(),
                    };
                    line += &format!(
                        " p{} {} end {}/{}",
                        k.1,
                        role,
                        r.log.high_watermark().0,
                        r.log.log_end_offset().0
                    );
                }
            }
            eprintln!("{line}");
        }
    }

    fn send_isr_changes(&mut self, id: u64, epoch: Option<BrokerEpoch>) {
        let now = self.now;
        let b = &self.data.brokers[&id];
        if b.alter_in_flight
            .as_ref()
            .is_some_and(|(_, sent, _)| now >= sent + REQUEST_TIMEOUT_MS)
        {
            self.data.on_alter_answer(id, None, now);
        }
        let b = self.data.brokers.get_mut(&id).unwrap();
        let Some(epoch) = epoch else { return };
        if b.alter_in_flight.is_some() || b.alter_queue.is_empty() || now < b.alter_retry_at {
            return;
        }
        let mut queue = std::mem::take(&mut b.alter_queue);
        // One change per partition: the latest.
        let mut seen = BTreeSet::new();
        queue.reverse();
        queue.retain(|(t, p, _)| seen.insert((*t, *p)));
        let changes = queue.clone();
        let request = ControllerRequest::AlterPartition(AlterPartitionRequest {
            broker_id: BrokerId(id as i32),
            broker_epoch: epoch,
            partitions: queue
                .into_iter()
                .map(|(topic_id, partition_id, c)| AlterPartitionItem {
                    topic_id,
                    partition_id,
                    leader_epoch: c.leader_epoch,
                    partition_epoch: c.partition_epoch,
                    new_isr: c.new_isr,
                })
                .collect(),
        });
        if trace() {
            eprintln!("{now} broker {id} AlterPartition {request:?}");
        }
        let rid = self.request(ALTER_BASE + id, request);
        self.data.brokers.get_mut(&id).unwrap().alter_in_flight = Some((rid, now, changes));
    }

    pub fn on_alter_response(&mut self, id: u64, rid: RequestId, response: ControllerResponse) {
        let matches = self.data.brokers[&id]
            .alter_in_flight
            .as_ref()
            .is_some_and(|(r, _, _)| *r == rid);
        if !matches || self.nodes[&id].node.is_none() {
            return;
        }
        let ControllerResponse::AlterPartition(r) = response else {
            return;
        };
        if r.error_code == error_code::NOT_CONTROLLER {
            let v = self.voters[self.rng.gen_range(0..self.voters.len())];
            self.controller_hint.insert(ALTER_BASE + id, v);
        }
        if trace() {
            eprintln!("{} broker {id} AlterPartition answer {r:?}", self.now);
        }
        self.data.on_alter_answer(id, Some(r), self.now);
    }

    pub fn on_data(&mut self, from: u64, to: u64, msg: DataMsg) {
        let now = self.now;
        if BROKERS.contains(&to) {
            if self.nodes[&to].node.is_none() {
                return;
            }
            let local_now = now + self.nodes[&to].clock_skew_ms;
            let mut out = Outbox::new();
            let result = match msg {
                DataMsg::Fetch(f) => self
                    .data
                    .on_fetch(to, &f, local_now)
                    .map(|answer| out.push((to, from, DataMsg::FetchAnswer(answer)))),
                DataMsg::FetchAnswer(a) => self.data.on_fetch_answer(to, a, now, &mut self.rng),
                DataMsg::Produce {
                    topic_id,
                    partition,
                    batch,
                    seq,
                } => self.data.on_produce(
                    to,
                    from,
                    (topic_id, partition),
                    batch,
                    seq,
                    now,
                    &mut self.rng,
                    &mut out,
                ),
                DataMsg::ShareFetch(f) => self
                    .data
                    .on_share_fetch(to, &f, now, local_now)
                    .map(|answer| out.push((to, from, DataMsg::ShareFetchAnswer(answer)))),
                DataMsg::ProduceResponse { .. } | DataMsg::ShareFetchAnswer(_) => Ok(()),
            };
            match result {
                Ok(()) => self.send_data(out),
                Err(e) => self.storage_failure(to, &e),
            }
        } else if (PRODUCER_BASE..CONSUMER_BASE).contains(&to) {
            if let DataMsg::ProduceResponse {
                seq,
                error_code,
                base_offset,
            } = msg
            {
                self.on_produce_response(
                    (to - PRODUCER_BASE) as usize,
                    seq,
                    error_code,
                    base_offset,
                );
            }
        } else if (SHARE_BASE..ALTER_BASE).contains(&to) {
            if let DataMsg::ShareFetchAnswer(a) = msg {
                self.on_share_answer((to - SHARE_BASE) as usize, a);
            }
        } else if (CONSUMER_BASE..SHARE_BASE).contains(&to) {
            if let DataMsg::FetchAnswer(FetchAnswer {
                seq,
                error_code,
                high_watermark,
                batches,
                ..
            }) = msg
            {
                self.on_consumer_response(
                    (to - CONSUMER_BASE) as usize,
                    seq,
                    error_code,
                    high_watermark,
                    batches,
                );
            }
        }
    }

    /// Where a client finds a partition's leader: in a random live broker's image.
    fn client_leader(&mut self, partition: i32) -> Option<(u64, TopicId)> {
        let live: Vec<u64> = BROKERS
            .iter()
            .copied()
            .filter(|b| self.nodes[b].node.is_some())
            .collect();
        if live.is_empty() {
            return None;
        }
        let b = live[self.rng.gen_range(0..live.len())];
        let image = self.nodes[&b].node.as_ref().unwrap().image();
        let (topic_id, p) = data_partition(image, partition)?;
        (p.leader.0 >= 0).then_some((p.leader.0 as u64, topic_id))
    }

    fn run_producers(&mut self) {
        let now = self.now;
        for i in 0..self.data.producers.len() {
            let p = &mut self.data.producers[i];
            if p.in_flight
                .is_some_and(|(_, sent)| now >= sent + PRODUCE_TIMEOUT_MS)
            {
                p.in_flight = None;
            }
            // New values only while faults happen; a batch sent before is retried until
            // acknowledged, also after.
            if p.in_flight.is_some() || now < p.next_send || !(self.faults || p.pending) {
                continue;
            }
            let partition = p.partition;
            let Some((leader, topic_id)) = self.client_leader(partition) else {
                self.data.producers[i].next_send = now + 50;
                continue;
            };
            let seq = self.data.seq();
            let p = &mut self.data.producers[i];
            p.in_flight = Some((seq, now));
            p.pending = true;
            let batch = produce_batch(i, p.sequence, p.value);
            let msg = DataMsg::Produce {
                topic_id,
                partition,
                batch,
                seq,
            };
            self.send(PRODUCER_BASE + i as u64, leader, Payload::Data(msg));
        }
    }

    fn on_produce_response(&mut self, i: usize, seq: u64, code: i16, base_offset: i64) {
        let now = self.now;
        let p = &mut self.data.producers[i];
        if p.in_flight.map(|(s, _)| s) != Some(seq) {
            return;
        }
        p.in_flight = None;
        if trace() {
            eprintln!(
                "{now} producer {i}: value {:#x} answered {code} offset {base_offset}",
                p.value
            );
        }
        if code == error_code::NONE {
            let key = (p.partition, p.value);
            if let Some(before) = self.data.acked.insert(key, base_offset) {
                assert_eq!(
                    before, base_offset,
                    "value {:#x} acknowledged at two offsets",
                    p.value
                );
            }
            p.sequence += 1;
            p.value += 1;
            p.pending = false;
            p.next_send = now + self.rng.gen_range(2..30);
            return;
        }
        // OUT_OF_ORDER_SEQUENCE_NUMBER too is no loss by itself: a stale leader that has not
        // heard of its successor answers it for a sequence the new leader took. Loss shows in
        // the final checks, which look for every acknowledged write.
        *self.data.produce_errors.entry(code).or_default() += 1;
        p.next_send = now + self.rng.gen_range(20..200);
    }

    fn run_consumers(&mut self) {
        let now = self.now;
        for i in 0..self.data.consumers.len() {
            let c = &mut self.data.consumers[i];
            if c.in_flight
                .is_some_and(|(_, sent)| now >= sent + FETCH_TIMEOUT_MS)
            {
                c.in_flight = None;
            }
            if c.in_flight.is_some() || now < c.next_fetch {
                continue;
            }
            let partition = c.partition;
            let Some((leader, topic_id)) = self.client_leader(partition) else {
                self.data.consumers[i].next_fetch = now + 50;
                continue;
            };
            if self.rng.gen_range(0..200) == 0 {
                // Read everything again now and then: what was read must not have changed.
                self.data.consumers[i].position = 0;
            }
            let seq = self.data.seq();
            let c = &mut self.data.consumers[i];
            c.in_flight = Some((seq, now));
            let msg = DataMsg::Fetch(Fetch {
                topic_id,
                partition,
                fetch_offset: c.position,
                last_fetched_epoch: -1,
                current_leader_epoch: -1,
                replica: None,
                seq,
            });
            self.send(CONSUMER_BASE + i as u64, leader, Payload::Data(msg));
        }
    }

    fn on_consumer_response(
        &mut self,
        i: usize,
        seq: u64,
        code: i16,
        hw: i64,
        batches: Vec<Bytes>,
    ) {
        let now = self.now;
        let c = &mut self.data.consumers[i];
        if c.in_flight.map(|(s, _)| s) != Some(seq) {
            return;
        }
        c.in_flight = None;
        c.next_fetch = now + self.rng.gen_range(5..50);
        if code != error_code::NONE {
            return;
        }
        for batch in batches {
            let header = BatchHeader::parse(&batch).unwrap();
            let offset = header.base_offset().0;
            assert!(
                offset < hw,
                "a consumer was given offset {offset} at high watermark {hw}"
            );
            if offset < c.position {
                continue;
            }
            let value = batch_value(&batch);
            if let Some(before) = self.data.consumed.insert((c.partition, offset), value) {
                assert_eq!(
                    before, value,
                    "partition {}: offset {offset} read as {before:#x} and later as {value:#x}",
                    c.partition
                );
            }
            c.position = offset + 1;
        }
    }

    /// After healing: every partition of the data topic has its whole replica set in the ISR,
    /// led at the image's epoch, every replica durable up to the leader's high watermark at
    /// the log end, and no produce waiting.
    pub fn data_converged(&self, image: &MetadataImage) -> bool {
        if self.data.producers.iter().any(|p| p.pending) {
            return false;
        }
        let Some(topic) = image.topic(DATA_TOPIC) else {
            return !self.data.topic_known();
        };
        topic.partitions.iter().all(|(&partition, p)| {
            let mut isr = p.isr.clone();
            let mut replicas = p.replicas.clone();
            isr.sort();
            replicas.sort();
            if p.leader.0 < 0 || isr != replicas || !p.adding_replicas.is_empty() {
                return false;
            }
            let leader = &self.data.brokers[&(p.leader.0 as u64)];
            let Some(lr) = leader.replicas.get(&(topic.id, partition)) else {
                return false;
            };
            let ReplicaRole::Leader(l) = &lr.role else {
                return false;
            };
            let end = lr.log.log_end_offset().0;
            l.leader_epoch == p.leader_epoch
                && l.high_watermark() == end
                && p.replicas.iter().all(|r| {
                    self.data.brokers[&(r.0 as u64)]
                        .replicas
                        .get(&(topic.id, partition))
                        .is_some_and(|x| {
                            x.log.high_watermark().0 == end && x.log.log_end_offset().0 == end
                        })
                })
        })
    }

    /// For a run that did not converge: each partition's leader (as the active controller's
    /// image says), its log end and high watermark, and the acknowledged writes its log lacks.
    pub fn describe_data(&self) -> String {
        let Some(image) = self
            .nodes
            .values()
            .filter_map(|n| n.node.as_ref())
            .find(|n| n.is_active_controller())
            .map(|n| n.image())
        else {
            return "no active controller".into();
        };
        let Some(topic) = image.topic(DATA_TOPIC) else {
            return "no data topic".into();
        };
        let mut out = Vec::new();
        for (&partition, p) in &topic.partitions {
            let leader = self
                .data
                .brokers
                .get(&(p.leader.0 as u64))
                .and_then(|b| b.replicas.get(&(topic.id, partition)));
            let Some(r) = leader else {
                out.push(format!(
                    "partition {partition}: leader {} has no replica",
                    p.leader.0
                ));
                continue;
            };
            let mut values = BTreeMap::new();
            let end = r.log.log_end_offset();
            let mut from = r.log.log_start_offset();
            while from < end {
                let Ok(read) = block_on(r.log.read(from, 1 << 20, end)) else {
                    break;
                };
                let Some(last) = read.last().map(|b| b.last_offset) else {
                    break;
                };
                for b in read {
                    values.insert(batch_value(&b.bytes), b.base_offset.0);
                }
                from = last.next();
            }
            let lost: Vec<String> = self
                .data
                .acked
                .range((partition, 0)..(partition + 1, 0))
                .filter(|(&(_, v), &o)| values.get(&v) != Some(&o))
                .map(|(&(_, v), &o)| format!("{v:#x}@{o}"))
                .collect();
            out.push(format!(
                "partition {partition}: leader {} epoch {} isr {:?}, log end {}, high watermark {}, {} acknowledged writes missing {lost:?}",
                p.leader.0,
                p.leader_epoch.0,
                p.isr,
                end.0,
                r.role.known_high_watermark(),
                lost.len()
            ));
        }
        out.join("; ")
    }

    pub fn data_final_checks(&self, image: &MetadataImage) {
        self.data.check_final(image);
        if image.topic(DATA_TOPIC).is_some() {
            self.data.check_share_final();
        }
    }
}
