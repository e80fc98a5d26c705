//! The share partitions this shard leads (KIP-932) and the share sessions of the connections
//! it serves.
//!
//! A share partition (`crate::share::partition`) lives on the shard that owns the topic
//! partition's replica, created the first time a share group reads the partition here, and
//! dropped when the replica stops leading. ShareFetch and ShareAcknowledge reach it through
//! [`Shard::share_local`]: acknowledgements first, then, for a fetch, the log is read from the
//! share partition's next fetch offset and the records acquired for the member come back with
//! the batches that hold them.
//!
//! Share sessions (which partitions a member fetches from this broker, and the epoch of its
//! next request) live on the shard of the connection, as Kafka keeps them per broker.
//!
//! Persistence: a share partition is made from the state its share coordinator keeps
//! (`shard/share_state.rs`), read when this shard first needs it in a leadership; a group's
//! first read of a partition places the start offset by `share.auto.offset.reset` and writes
//! it. Every change after that is written back as a snapshot by one writer task per share
//! partition, one write in flight at a time, each carrying every change made before it
//! started. Acknowledgements are answered only once a write that holds them is durable, so an
//! acknowledged record is never delivered again after a restart or a leader move; acquisitions
//! and releases are written without anyone waiting (their delivery counts survive as far as
//! the last write got).

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;

use super::read::{read_local, PartitionRead, Records};
use super::share_state::{persist, StateOp};
use super::Shard;
use crate::group::configs::{OffsetReset, ShareGroupConfig};
use crate::share::coordinator::{
    SharePartitionKey, ShareState, FENCED_LEADER_EPOCH, FENCED_STATE_EPOCH,
};
use crate::share::partition::{AckError, AckType, AcquiredRange, ShareConfig, SharePartition};
use sluice_engine::Offset;

/// Share sessions one shard keeps at most (Kafka's `group.share.max.share.sessions` is per
/// broker); the oldest goes when a new one would exceed it.
pub const SHARE_SESSIONS_MAX: usize = 2000;

/// A share fetch reads about this many bytes from the log per record it still wants (a 1 KiB
/// record and its share of a batch header), and at least `SHARE_READ_BYTES_MIN`.
const SHARE_READ_BYTES_PER_RECORD: usize = 1100;
const SHARE_READ_BYTES_MIN: usize = 64 * 1024;

/// One acknowledgement batch of a request, as the wire carries it.
#[derive(Clone, Debug)]
pub struct AckBatch {
    pub first_offset: i64,
    pub last_offset: i64,
    pub types: Vec<i8>,
}

/// One partition of a ShareFetch or ShareAcknowledge, for its owner shard.
#[derive(Clone, Debug)]
pub struct ShareRead {
    pub topic: Arc<str>,
    pub partition: i32,
    pub acks: Vec<AckBatch>,
    /// Whether records are wanted (a ShareAcknowledge, or a fetch's second pass, only acks).
    pub fetch: bool,
    /// ShareFetch 2's record-limit acquire mode: at most the records left, splitting a batch if
    /// need be (batch-optimized, the default, acquires whole batches).
    pub record_limit: bool,
}

/// What one partition's turn found.
#[derive(Debug, Default)]
pub struct ShareResult {
    pub error_code: i16,
    /// The acknowledgements' outcome (0 when there were none or all applied).
    pub ack_error_code: i16,
    pub ack_error_message: Option<String>,
    pub leader_epoch: i32,
    pub records: Option<Bytes>,
    pub acquired: Vec<AcquiredRange>,
}

/// A share partition with the group settings it was made with.
struct Entry {
    partition: SharePartition,
    read_committed: bool,
    /// The leader epoch it was made in: a replica that led, followed and leads again starts
    /// over, as a new leader does.
    leader_epoch: i32,
    /// Its key at the share coordinator.
    key: SharePartitionKey,
    /// The state epoch its state was read under: an offsets reset since fences its writes.
    state_epoch: i32,
    /// Unique per entry made, so that a writer never serves a successor.
    id: u64,
    /// Changes made (a counter), and how many of them a durable write holds.
    changes: u64,
    persisted: u64,
    /// Whether its writer task runs.
    writing: bool,
    /// Who waits for a write holding change N.
    waiters: Vec<(u64, futures_channel::oneshot::Sender<i16>)>,
}

impl Entry {
    fn new(
        partition: SharePartition,
        read_committed: bool,
        leader_epoch: i32,
        key: SharePartitionKey,
        state_epoch: i32,
    ) -> Entry {
        thread_local! {
            static NEXT_ID: std::cell::Cell<u64> = const { std::cell::Cell::new(1) };
        }
        Entry {
            partition,
            read_committed,
            leader_epoch,
            key,
            state_epoch,
            id: NEXT_ID.with(|n| n.replace(n.get() + 1)),
            changes: 0,
            persisted: 0,
            writing: false,
            waiters: Vec::new(),
        }
    }

    /// The state to write: the start offset and the in-flight batches.
    fn snapshot(&self) -> ShareState {
        ShareState {
            state_epoch: self.state_epoch,
            leader_epoch: self.leader_epoch,
            start_offset: self.partition.start_offset(),
            batches: self.partition.state_batches(),
        }
    }
}

/// A share partition's key: (group, topic, partition).
type ShareKey = (String, Arc<str>, i32);

/// One share partition's state as DescribeShareGroupOffsets and `sluice group` show it.
#[derive(Clone, Debug)]
pub struct ShareOffsets {
    pub topic: Arc<str>,
    pub partition: i32,
    pub start_offset: i64,
    /// In-flight records: (available, acquired, acknowledged, archived).
    pub in_flight: (u64, u64, u64, u64),
    pub high_watermark: i64,
    pub leader_epoch: i32,
}

impl ShareOffsets {
    /// Records at or past the start offset not yet done: what the group still has to
    /// deliver or have acknowledged (Kafka's share-partition lag).
    pub fn lag(&self) -> i64 {
        let done = (self.in_flight.2 + self.in_flight.3) as i64;
        (self.high_watermark - self.start_offset - done).max(0)
    }
}

/// The share partitions of this shard.
#[derive(Default)]
pub struct SharePartitions {
    map: std::cell::RefCell<HashMap<ShareKey, Entry>>,
}

/// A member's share session on this broker: the partitions it fetches and the epoch its next
/// request must carry.
#[derive(Debug)]
pub struct ShareSession {
    pub next_epoch: i32,
    pub partitions: indexmap::IndexSet<(uuid::Uuid, i32)>,
    pub last_used: Instant,
    /// The connection that opened it ([`ConnectionSessions::token`]): its end closes the
    /// session, unless another connection opened the member's session since.
    pub connection: usize,
}

/// The share sessions one connection opened, by (group, member).
#[derive(Default)]
pub struct ConnectionSessions {
    pub opened: std::cell::RefCell<Vec<(String, String)>>,
}

impl ConnectionSessions {
    /// This connection's token: its address, unique among live connections.
    pub fn token(&self) -> usize {
        self as *const ConnectionSessions as usize
    }
}

#[derive(Default)]
pub struct ShareSessions {
    pub map: std::cell::RefCell<HashMap<(String, String), ShareSession>>,
}

impl ShareSessions {
    /// Makes room for one more session: the least recently used goes.
    pub fn evict_if_full(&self) {
        let mut map = self.map.borrow_mut();
        if map.len() < SHARE_SESSIONS_MAX {
            return;
        }
        if let Some(oldest) = map
            .iter()
            .min_by_key(|(_, s)| s.last_used)
            .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
    }
}

/// The group's share settings, as the partition state machine takes them.
fn share_config(c: &ShareGroupConfig) -> ShareConfig {
    ShareConfig {
        record_lock_duration: Duration::from_millis(c.record_lock_duration_ms),
        delivery_count_limit: c.delivery_count_limit,
        partition_max_record_locks: c.partition_max_record_locks,
    }
}

/// Kafka's batch header: base offset at 0, length at 8, attributes at 21, last offset delta
/// at 23, producer id at 43; 61 bytes in all.
const BATCH_HEADER: usize = 61;
const ATTR_TRANSACTIONAL: i16 = 0x10;
const ATTR_CONTROL: i16 = 0x20;

/// One batch's offsets and what the share partition needs of its header.
#[derive(Clone, Copy, Debug)]
struct BatchInfo {
    first: i64,
    last: i64,
    control: bool,
    transactional: bool,
    producer_id: i64,
}

/// The batches of the chunks a read returned, whole ones only, each with its bytes (slices of
/// the chunks: nothing is copied).
fn batches_in(chunks: &[Bytes]) -> Vec<(BatchInfo, Bytes)> {
    chunks
        .iter()
        .flat_map(|chunk| {
            batches_of(chunk)
                .into_iter()
                .map(|(info, range)| (info, chunk.slice(range)))
        })
        .collect()
}

/// The batches of `buf`, whole ones only, with their byte ranges.
fn batches_of(buf: &Bytes) -> Vec<(BatchInfo, std::ops::Range<usize>)> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while buf.len() >= at + BATCH_HEADER {
        let b = &buf[at..];
        let first = i64::from_be_bytes(b[0..8].try_into().expect("8 bytes"));
        let length = i32::from_be_bytes(b[8..12].try_into().expect("4 bytes"));
        let Ok(length) = usize::try_from(length) else {
            break;
        };
        let size = 12 + length;
        if length < BATCH_HEADER - 12 || buf.len() < at + size {
            break;
        }
        let attributes = i16::from_be_bytes(b[21..23].try_into().expect("2 bytes"));
        let delta = i32::from_be_bytes(b[23..27].try_into().expect("4 bytes"));
        let producer_id = i64::from_be_bytes(b[43..51].try_into().expect("8 bytes"));
        out.push((
            BatchInfo {
                first,
                last: first + i64::from(delta.max(0)),
                control: attributes & ATTR_CONTROL != 0,
                transactional: attributes & ATTR_TRANSACTIONAL != 0,
                producer_id,
            },
            at..at + size,
        ));
        at += size;
    }
    out
}

fn ack_types(batch: &AckBatch) -> Result<Vec<AckType>, String> {
    batch
        .types
        .iter()
        .map(|&t| AckType::from_wire(t).ok_or_else(|| format!("unknown acknowledge type {t}")))
        .collect()
}

impl Shard {
    /// One member's turn at share partitions this shard owns: for each, its acknowledgements,
    /// then (when asked) records acquired from the log, at most `max_records` in all and
    /// `max_bytes` of batches.
    pub async fn share_local(
        self: &Rc<Self>,
        group_id: &str,
        member: Rc<str>,
        reads: Vec<ShareRead>,
        max_records: u32,
        max_bytes: usize,
    ) -> Vec<ShareResult> {
        let image = self.image();
        let own = image
            .cluster
            .as_ref()
            .and_then(|c| c.group_configs.get(group_id));
        let group_config = ShareGroupConfig::resolve(self.config(), own);
        let config = share_config(&group_config);
        let mut results: Vec<ShareResult> = Vec::with_capacity(reads.len());
        // Acknowledgements to see durable before answering: (share partition, change, result).
        let mut persist_waits: Vec<(ShareKey, u64, usize)> = Vec::new();
        // Share partitions changed by acquisitions, written without waiting.
        let mut changed: Vec<ShareKey> = Vec::new();
        let mut records_left = max_records.max(1);
        let mut bytes_left = max_bytes.max(1);
        for read in reads {
            let mut result = ShareResult::default();
            let Some(partition) = self.partition(&read.topic, read.partition) else {
                result.error_code = ResponseError::UnknownTopicOrPartition.code();
                results.push(result);
                continue;
            };
            let key = (group_id.to_string(), read.topic.clone(), read.partition);
            let epoch = match partition.check_leader(-1) {
                Ok(e) => e,
                Err(code) => {
                    self.share_partitions.map.borrow_mut().remove(&key);
                    result.error_code = code;
                    results.push(result);
                    continue;
                }
            };
            result.leader_epoch = epoch.0;
            let now = Instant::now();
            let log_start = partition.log.log_start_offset().0;
            let high_watermark = partition.high_watermark().0;
            // The first read of the partition in this leadership loads its state from the
            // share coordinator (or places its start offset, for a group's first read).
            let loaded = self
                .share_partitions
                .map
                .borrow()
                .get(&key)
                .is_some_and(|e| e.leader_epoch == epoch.0);
            if !loaded {
                let topic_id = image
                    .topics
                    .get(&*read.topic)
                    .map(|m| m.id)
                    .unwrap_or_default();
                let loading = self
                    .share_load(
                        &key,
                        topic_id,
                        epoch.0,
                        &group_config,
                        log_start,
                        high_watermark,
                    )
                    .await;
                if let Err(code) = loading {
                    // The share coordinator is not there yet (its topic is being made, or its
                    // partition loads): no records this time, the member asks again.
                    tracing::debug!(group = %group_id, topic = %read.topic, partition = read.partition, code, "share partition state not readable yet");
                    if !read.acks.is_empty() {
                        result.ack_error_code = code;
                    }
                    results.push(result);
                    continue;
                }
            }
            let fetch_from = {
                let mut map = self.share_partitions.map.borrow_mut();
                let Some(entry) = map.get_mut(&key).filter(|e| e.leader_epoch == epoch.0) else {
                    results.push(result);
                    continue;
                };
                entry.partition.set_config(config);
                entry.read_committed = group_config.read_committed;
                // Retention or DeleteRecords moved the log start past it.
                if entry.partition.start_offset() < log_start {
                    entry.partition.reset_start(log_start);
                }
                let mut applied = false;
                for batch in &read.acks {
                    let outcome =
                        ack_types(batch)
                            .map_err(AckError::InvalidRequest)
                            .and_then(|types| {
                                entry.partition.acknowledge(
                                    &member,
                                    batch.first_offset,
                                    batch.last_offset,
                                    &types,
                                    now,
                                )
                            });
                    match outcome {
                        // A RENEW only extends the lock, which is not persisted: nothing
                        // to wait for.
                        Ok(()) => {
                            applied |= ack_types(batch)
                                .is_ok_and(|t| t.iter().any(|&t| t != AckType::Renew))
                        }
                        Err(AckError::InvalidRecordState { offset }) => {
                            tracing::debug!(group = %group_id, member = %member, topic = %read.topic, partition = read.partition, offset, first = batch.first_offset, last = batch.last_offset, "acknowledgement refused: not acquired by this member");
                            result.ack_error_code = ResponseError::InvalidRecordState.code();
                            result.ack_error_message = Some(format!(
                                "The record at offset {offset} is not acquired by this member."
                            ));
                        }
                        Err(AckError::InvalidRequest(m)) => {
                            result.ack_error_code = ResponseError::InvalidRequest.code();
                            result.ack_error_message = Some(m);
                        }
                    }
                }
                if applied {
                    // Answered once a write holding them is durable.
                    entry.changes += 1;
                    persist_waits.push((key.clone(), entry.changes, results.len()));
                }
                if read.fetch && records_left > 0 && bytes_left > 0 {
                    entry
                        .partition
                        .next_fetch_offset(now)
                        .filter(|&o| o < high_watermark)
                        .map(|o| (o, entry.read_committed))
                } else {
                    None
                }
            };
            let Some((fetch_offset, read_committed)) = fetch_from else {
                results.push(result);
                continue;
            };
            // What the records still wanted take, about: whole batches are acquired, so a
            // larger read would mostly be read for nothing (the first batch comes whole
            // whatever its size).
            let read_bytes = (records_left as usize)
                .saturating_mul(SHARE_READ_BYTES_PER_RECORD)
                .clamp(SHARE_READ_BYTES_MIN, bytes_left.max(1));
            let partition_read = PartitionRead {
                topic: read.topic.clone(),
                partition: read.partition,
                fetch_offset: Offset(fetch_offset),
                max_bytes: read_bytes,
                current_leader_epoch: -1,
                last_fetched_epoch: -1,
                replica: None,
                read_committed,
                client_rack: None,
            };
            let (mut found, _) = read_local(
                self,
                std::slice::from_ref(&partition_read),
                read_bytes,
                false,
            )
            .await;
            let found = found.pop().expect("one partition read");
            if found.error_code != 0 {
                result.error_code = found.error_code;
                results.push(result);
                continue;
            }
            let chunks = match found.records {
                Records::Batches(b) => b,
                // Not spliced: a read for a copy comes back in memory.
                Records::File(_) => Vec::new(),
            };
            let batches = batches_in(&chunks);
            // Under read_committed, the records of aborted transactions and every control
            // batch are never delivered: archived as they are passed.
            let aborted = |b: &BatchInfo| {
                b.transactional
                    && found.aborted_transactions.iter().any(|a| {
                        a.producer_id == b.producer_id
                            && a.first_offset.0 <= b.last
                            && b.first <= a.last_offset.0
                    })
            };
            let mut acquired = Vec::new();
            let mut kept = Vec::new();
            {
                let mut map = self.share_partitions.map.borrow_mut();
                let Some(entry) = map.get_mut(&key).filter(|e| e.leader_epoch == epoch.0) else {
                    results.push(result);
                    continue;
                };
                let now = Instant::now();
                let mut skipped = false;
                let mut run: Vec<(i64, i64)> = Vec::new();
                let mut runs_ranges: Vec<Bytes> = Vec::new();
                let flush = |run: &mut Vec<(i64, i64)>,
                             ranges: &mut Vec<Bytes>,
                             entry: &mut Entry,
                             acquired: &mut Vec<AcquiredRange>,
                             kept: &mut Vec<Bytes>,
                             records_left: &mut u32| {
                    if run.is_empty() || *records_left == 0 {
                        run.clear();
                        ranges.clear();
                        return;
                    }
                    let got = entry.partition.acquire(&member, run, *records_left, now);
                    let count: i64 = got.iter().map(|r| r.last_offset - r.first_offset + 1).sum();
                    *records_left = records_left.saturating_sub(count as u32);
                    for (range, (first, last)) in ranges.iter().zip(run.iter()) {
                        if got
                            .iter()
                            .any(|r| r.first_offset <= *last && *first <= r.last_offset)
                        {
                            kept.push(range.clone());
                        }
                    }
                    acquired.extend(got);
                    run.clear();
                    ranges.clear();
                };
                // Record-limit mode: no offset past what `records_left` allows from the fetch
                // offset (records already done there count against it: at most, not exactly).
                let limit_end = if read.record_limit {
                    fetch_offset.saturating_add(i64::from(records_left)) - 1
                } else {
                    i64::MAX
                };
                for (info, range) in &batches {
                    if info.first > limit_end {
                        break;
                    }
                    let info = &BatchInfo {
                        last: info.last.min(limit_end),
                        ..*info
                    };
                    if info.control || (read_committed && aborted(info)) {
                        flush(
                            &mut run,
                            &mut runs_ranges,
                            entry,
                            &mut acquired,
                            &mut kept,
                            &mut records_left,
                        );
                        entry.partition.skip(info.first, info.last);
                        skipped = true;
                        continue;
                    }
                    run.push((info.first, info.last));
                    runs_ranges.push(range.clone());
                }
                flush(
                    &mut run,
                    &mut runs_ranges,
                    entry,
                    &mut acquired,
                    &mut kept,
                    &mut records_left,
                );
                if skipped || !acquired.is_empty() {
                    entry.changes += 1;
                    changed.push(key.clone());
                }
            }
            if !kept.is_empty() {
                // Only the batches that hold acquired records are copied into the response
                // (none when they are one slice).
                let out = Records::concatenated(kept);
                bytes_left = bytes_left.saturating_sub(out.len());
                result.records = Some(out);
            }
            result.acquired = acquired;
            results.push(result);
        }
        let mut waits = Vec::with_capacity(persist_waits.len());
        for (key, change, at) in persist_waits {
            waits.push((at, self.share_persisted(&key, change)));
        }
        for key in changed {
            self.share_spawn_writer(&key);
        }
        for (at, wait) in waits {
            let code = match wait {
                Ok(None) => 0,
                Ok(Some(rx)) => rx
                    .await
                    .unwrap_or(ResponseError::NotLeaderOrFollower.code()),
                Err(code) => code,
            };
            if code != 0 && results[at].ack_error_code == 0 {
                results[at].ack_error_code = code;
                results[at].ack_error_message = Some(format!(
                    "The acknowledgements could not be made durable ({}).",
                    ResponseError::try_from_code(code)
                        .map_or_else(|| code.to_string(), |e| format!("{e:?}"))
                ));
            }
        }
        results
    }

    /// Makes the share partition `key` from its persisted state (or, for a group's first
    /// read, at its `share.auto.offset.reset` position, which is then written).
    async fn share_load(
        self: &Rc<Self>,
        key: &ShareKey,
        topic_id: uuid::Uuid,
        leader_epoch: i32,
        group_config: &ShareGroupConfig,
        log_start: i64,
        high_watermark: i64,
    ) -> Result<(), i16> {
        let state_key = SharePartitionKey {
            group_id: key.0.clone(),
            topic_id,
            partition: key.2,
        };
        let found = persist(self, state_key.clone(), StateOp::Read { leader_epoch }).await?;
        let config = share_config(group_config);
        let mut map = self.share_partitions.map.borrow_mut();
        if map.get(key).is_some_and(|e| e.leader_epoch == leader_epoch) {
            return Ok(()); // another request loaded it meanwhile
        }
        let entry = match found {
            Some(state) => {
                tracing::info!(group = %key.0, topic = %key.1, partition = key.2, start_offset = state.start_offset, state_batches = state.batches.len(), state_epoch = state.state_epoch, leader_epoch, "share partition restored from its persisted state");
                Entry::new(
                    SharePartition::restore(state.start_offset, &state.batches, config),
                    group_config.read_committed,
                    leader_epoch,
                    state_key,
                    state.state_epoch,
                )
            }
            None => {
                let start = match group_config.auto_offset_reset {
                    OffsetReset::Earliest => log_start,
                    OffsetReset::Latest => high_watermark,
                    // Timestamps are looked up by the segment index; until then, the records
                    // still in the log.
                    OffsetReset::ByDuration(_) => log_start,
                };
                tracing::info!(group = %key.0, topic = %key.1, partition = key.2, start_offset = start, "share partition initialized");
                let mut entry = Entry::new(
                    SharePartition::new(start, config),
                    group_config.read_committed,
                    leader_epoch,
                    state_key,
                    0,
                );
                entry.changes = 1;
                entry
            }
        };
        map.insert(key.clone(), entry);
        drop(map);
        self.share_spawn_writer(key);
        Ok(())
    }

    /// Waits for a durable write holding change `change` of share partition `key`: `None`
    /// when one already is, else the answer to wait for (0, or the write's error code).
    fn share_persisted(
        self: &Rc<Self>,
        key: &ShareKey,
        change: u64,
    ) -> Result<Option<futures_channel::oneshot::Receiver<i16>>, i16> {
        let rx = {
            let mut map = self.share_partitions.map.borrow_mut();
            let Some(e) = map.get_mut(key) else {
                return Err(ResponseError::NotLeaderOrFollower.code());
            };
            if e.persisted >= change {
                return Ok(None);
            }
            let (tx, rx) = futures_channel::oneshot::channel();
            e.waiters.push((change, tx));
            rx
        };
        self.share_spawn_writer(key);
        Ok(Some(rx))
    }

    /// Starts the writer of share partition `key` unless it runs or there is nothing to write.
    fn share_spawn_writer(self: &Rc<Self>, key: &ShareKey) {
        let id = {
            let mut map = self.share_partitions.map.borrow_mut();
            let Some(e) = map.get_mut(key) else {
                return;
            };
            if e.writing || e.persisted >= e.changes {
                return;
            }
            e.writing = true;
            e.id
        };
        let shard = self.clone();
        let key = key.clone();
        glommio::spawn_local(async move { shard.share_write(key, id).await }).detach();
    }

    /// The writer of one share partition: writes snapshots until one holds every change, one
    /// at a time; retries a failed write with backoff; a fenced one (an offsets reset, a newer
    /// leader) drops the share partition, which the next fetch reads again.
    async fn share_write(self: Rc<Self>, key: ShareKey, id: u64) {
        const BACKOFF_MIN: Duration = Duration::from_millis(50);
        const BACKOFF_MAX: Duration = Duration::from_secs(2);
        let mut backoff = BACKOFF_MIN;
        loop {
            let (change, state_key, snapshot) = {
                let mut map = self.share_partitions.map.borrow_mut();
                let Some(e) = map.get_mut(&key).filter(|e| e.id == id) else {
                    return;
                };
                if e.persisted >= e.changes {
                    e.writing = false;
                    return;
                }
                (e.changes, e.key.clone(), e.snapshot())
            };
            let code = match persist(&self, state_key, StateOp::Write(snapshot)).await {
                Ok(_) => 0,
                Err(code) => code,
            };
            if !self.share_written(&key, id, change, code) {
                return;
            }
            if code == 0 {
                backoff = BACKOFF_MIN;
            } else {
                tracing::debug!(group = %key.0, topic = %key.1, partition = key.2, code, "writing a share partition's state failed; trying again");
                glommio::timer::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }

    /// Records the outcome `code` of the write of share partition `key` (entry `id`) that
    /// held its changes up to `change`, and answers who waited for them: whether its writer
    /// goes on (not when the entry is gone or its state was fenced, which drops it).
    fn share_written(&self, key: &ShareKey, id: u64, change: u64, code: i16) -> bool {
        let mut map = self.share_partitions.map.borrow_mut();
        let Some(e) = map.get_mut(key).filter(|e| e.id == id) else {
            return false;
        };
        if code == FENCED_LEADER_EPOCH || code == FENCED_STATE_EPOCH {
            tracing::info!(group = %key.0, topic = %key.1, partition = key.2, code, "share partition state fenced at its share coordinator; it is read again on the next fetch");
            if let Some(e) = map.remove(key) {
                for (_, tx) in e.waiters {
                    let _ = tx.send(code);
                }
            }
            return false;
        }
        if code == 0 {
            e.persisted = e.persisted.max(change);
        }
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut e.waiters)
            .into_iter()
            .partition(|(c, _)| *c <= change);
        e.waiters = waiting;
        for (_, tx) in done {
            let _ = tx.send(code);
        }
        true
    }

    /// A connection ended: the share sessions it opened close, and what their members hold
    /// goes back to the others at once rather than when its locks run out (Kafka's behaviour).
    pub fn close_share_sessions(self: &Rc<Self>, connection: &ConnectionSessions) {
        let token = connection.token();
        let opened = std::mem::take(&mut *connection.opened.borrow_mut());
        for key in opened {
            let mine = {
                let mut map = self.share_sessions.map.borrow_mut();
                match map.get(&key) {
                    Some(s) if s.connection == token => {
                        map.remove(&key);
                        true
                    }
                    _ => false,
                }
            };
            if mine {
                tracing::debug!(target: "sluice::share", group = %key.0, member = %key.1, "share session closed with its connection");
                self.release_share_member(&key.0, &key.1);
            }
        }
    }

    /// Everything `member` of `group_id` holds on this shard's share partitions goes back to
    /// the others (it left its group, or closed its share session).
    pub fn share_release(self: &Rc<Self>, group_id: &str, member: &str) -> usize {
        let mut released = 0;
        let mut changed = Vec::new();
        for (key, entry) in self.share_partitions.map.borrow_mut().iter_mut() {
            if key.0 == group_id {
                let n = entry.partition.release_member(member);
                if n > 0 {
                    entry.changes += 1;
                    changed.push(key.clone());
                }
                released += n;
            }
        }
        for key in changed {
            self.share_spawn_writer(&key);
        }
        released
    }

    /// The share partitions of `group_id` on this shard, as DescribeShareGroupOffsets shows
    /// them.
    pub fn share_state(&self, group_id: &str) -> Vec<ShareOffsets> {
        self.share_partitions
            .map
            .borrow()
            .iter()
            .filter(|((g, _, _), _)| g == group_id)
            .map(|((_, t, p), e)| ShareOffsets {
                topic: t.clone(),
                partition: *p,
                start_offset: e.partition.start_offset(),
                in_flight: e.partition.in_flight_counts(),
                high_watermark: self
                    .partition(t, *p)
                    .map_or(-1, |part| part.high_watermark().0),
                leader_epoch: e.leader_epoch,
            })
            .collect()
    }

    /// Forgets `group_id`'s share partitions of `topic` on this shard (DeleteShareGroupOffsets).
    pub fn share_delete_topic(&self, group_id: &str, topic: &str) -> usize {
        let mut map = self.share_partitions.map.borrow_mut();
        let before = map.len();
        map.retain(|(g, t, _), _| !(g == group_id && &**t == topic));
        before - map.len()
    }

    /// Forgets `group_id`'s share partitions on this shard (DeleteGroups of an empty group).
    pub fn share_delete_group(&self, group_id: &str) -> usize {
        let mut map = self.share_partitions.map.borrow_mut();
        let before = map.len();
        map.retain(|(g, _, _), _| g != group_id);
        before - map.len()
    }

    /// Forgets `group_id`'s share partition of `topic`-`partition` on this shard: its state
    /// was reset or deleted at the share coordinator, and the next fetch reads it again.
    /// Whether this shard held it.
    pub fn share_forget(&self, group_id: &str, topic: &str, partition: i32) -> bool {
        let mut map = self.share_partitions.map.borrow_mut();
        let before = map.len();
        map.retain(|(g, t, p), _| !(g == group_id && &**t == topic && *p == partition));
        before != map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(base: i64, records: i32, attributes: i16, producer_id: i64) -> Vec<u8> {
        let mut b = vec![0u8; BATCH_HEADER];
        b[0..8].copy_from_slice(&base.to_be_bytes());
        b[8..12].copy_from_slice(&((BATCH_HEADER - 12) as i32).to_be_bytes());
        b[21..23].copy_from_slice(&attributes.to_be_bytes());
        b[23..27].copy_from_slice(&(records - 1).to_be_bytes());
        b[43..51].copy_from_slice(&producer_id.to_be_bytes());
        b
    }

    #[test]
    fn batch_headers_give_offsets_and_kinds_and_a_torn_tail_is_left_out() {
        let mut buf = batch(10, 5, 0, -1);
        buf.extend(batch(15, 1, ATTR_CONTROL | ATTR_TRANSACTIONAL, 7));
        buf.extend(batch(16, 3, ATTR_TRANSACTIONAL, 7));
        buf.extend(&batch(19, 3, 0, -1)[..30]);
        let found = batches_of(&Bytes::from(buf));
        assert_eq!(found.len(), 3);
        assert_eq!((found[0].0.first, found[0].0.last), (10, 14));
        assert!(found[1].0.control && found[1].0.transactional);
        assert_eq!(found[2].0.producer_id, 7);
        assert_eq!(found[2].1, 2 * BATCH_HEADER..3 * BATCH_HEADER);
    }

    #[test]
    fn batches_across_chunks_are_slices_of_them() {
        let mut one = batch(0, 2, 0, -1);
        one.extend(batch(2, 3, 0, -1));
        let two = batch(5, 1, 0, -1);
        let found = batches_in(&[Bytes::from(one.clone()), Bytes::from(two.clone())]);
        let offsets: Vec<(i64, i64)> = found.iter().map(|(i, _)| (i.first, i.last)).collect();
        assert_eq!(offsets, vec![(0, 1), (2, 4), (5, 5)]);
        assert_eq!(&found[1].1[..], &one[BATCH_HEADER..]);
        assert_eq!(&found[2].1[..], &two[..]);
    }
}
