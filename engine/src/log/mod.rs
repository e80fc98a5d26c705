//! The partition log: an ordered set of segments in one directory, with the offsets Kafka
//! speaks of and the write path that makes appends durable.
//!
//! A `Log` lives on the shard that owns its partition and is used from that shard's tasks only.
//! Appends buffer a batch into the active segment without awaiting, then wait until it is on the
//! device (and, under `flush.mode = batch`, fdatasync'd). All device mutations (writes, syncs,
//! rolls, preallocation, truncation, retention, compaction) run under one async mutex, `io`, so
//! there is one flusher at a time; appends that arrive while it works are covered by its next
//! write and fdatasync: group commit falls out of the lock.
//!
//! Invariant, asserted where it can break:
//! `log_start_offset ≤ log_end_offset` and `synced_end ≤ written_end ≤ log_end_offset`.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use bytes::BytesMut;
use hdrhistogram::Histogram;

use crate::batch::{self, BatchHeader};
use crate::batch_cache::BatchCache;
use crate::config::{Clock, FlushMode, LogConfig, TimestampType};
use crate::error::{is_disk_full, BatchError, LogError, Result};
use crate::producer_state::{ProducerStateManager, SequenceCheck};
use crate::segment::appender::{Appender, PendingBatch};
use crate::segment::{self, Segment};
use crate::storage::{align_down, align_up, write_file_atomic, Storage, StorageFile};
use crate::types::{LeaderEpoch, Offset, Timestamp};

mod checkpoint;
mod compaction;
mod read;
mod recovery;
mod retention;

pub use compaction::CompactionOutcome;
pub use retention::RetentionOutcome;

/// Bytes preallocated ahead of the write head at a time. Large enough that a segment grows by
/// few fallocate calls, small enough that many partitions do not reserve the disk.
pub const PREALLOCATE_BYTES: u64 = 16 << 20;
/// Appended bytes allowed to wait in memory for the device before appends wait for the flusher.
pub const PENDING_BYTES_MAX: u64 = 64 << 20;
const _: () = assert!(PREALLOCATE_BYTES.is_multiple_of(crate::storage::ALIGN));
const _: () = assert!(
    PENDING_BYTES_MAX >= 2 * 1_048_588,
    "two max-size batches must fit while one is written"
);

/// Marker file whose presence means the log was closed cleanly and needs no recovery scan.
pub const CLEAN_SHUTDOWN_FILE: &str = ".sluice-clean-shutdown";

/// What an append assigned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendInfo {
    pub base_offset: Offset,
    pub last_offset: Offset,
    /// The broker's time stamped into the batch for `LogAppendTime` topics, else `NONE`.
    pub log_append_time: Timestamp,
    pub log_start_offset: Offset,
}

pub(crate) struct State<F> {
    pub segments: BTreeMap<Offset, Segment<F>>,
    pub log_start_offset: Offset,
    pub log_end_offset: Offset,
    /// Offsets below are on the device.
    pub written_end: Offset,
    /// Offsets below are on the device and fdatasync'd.
    pub synced_end: Offset,
    pub poisoned: Option<String>,
    pub closed: bool,
    /// Leader epoch cache: (epoch, first offset of that epoch), ascending.
    pub epochs: Vec<(LeaderEpoch, Offset)>,
    pub epochs_dirty: bool,
    pub last_flush_ms: i64,
    /// Idempotent producers' sequence state.
    pub producers: ProducerStateManager,
    /// Appends take tickets and buffer in ticket order.
    pub next_ticket: u64,
    pub serving_ticket: u64,
    pub abandoned_tickets: std::collections::BTreeSet<u64>,
    /// A roll or truncation is in progress: appends wait for it instead of buffering into a
    /// segment that is about to change.
    pub appends_blocked: bool,
}

impl<F> State<F> {
    pub fn active(&self) -> &Segment<F> {
        self.segments
            .values()
            .next_back()
            .expect("a log always has an active segment")
    }
    pub fn active_mut(&mut self) -> &mut Segment<F> {
        self.segments
            .values_mut()
            .next_back()
            .expect("a log always has an active segment")
    }
    pub fn check_invariants(&self) {
        assert!(
            self.log_start_offset <= self.log_end_offset,
            "log_start_offset {} > log_end_offset {}",
            self.log_start_offset,
            self.log_end_offset
        );
        assert!(
            self.written_end <= self.log_end_offset,
            "written_end {} > log_end_offset {}",
            self.written_end,
            self.log_end_offset
        );
        assert!(
            self.synced_end <= self.written_end,
            "synced_end {} > written_end {}",
            self.synced_end,
            self.written_end
        );
        assert_eq!(self.active().next_offset, self.log_end_offset);
    }
}

/// Counters and the fdatasync latency histogram of one log.
pub struct LogStats {
    pub appends: u64,
    pub appended_bytes: u64,
    pub device_writes: u64,
    pub device_written_bytes: u64,
    /// fdatasync latency per group commit, microseconds.
    pub fdatasync_us: Histogram<u64>,
}

impl Default for LogStats {
    fn default() -> Self {
        LogStats {
            appends: 0,
            appended_bytes: 0,
            device_writes: 0,
            device_written_bytes: 0,
            fdatasync_us: Histogram::new_with_bounds(1, 60_000_000, 3)
                .expect("valid histogram bounds"),
        }
    }
}

/// An append's place in line; see `Log::ticket`.
struct Turn<'a, S: Storage> {
    log: &'a Log<S>,
    ticket: u64,
}

/// Runs a closure when dropped.
struct CallOnDrop<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Drop for CallOnDrop<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

impl<S: Storage> Drop for Turn<'_, S> {
    fn drop(&mut self) {
        let mut st = self.log.state.borrow_mut();
        if st.serving_ticket == self.ticket {
            st.serving_ticket += 1;
            loop {
                let serving = st.serving_ticket;
                if !st.abandoned_tickets.remove(&serving) {
                    break;
                }
                st.serving_ticket += 1;
            }
            drop(st);
            self.log.turn_event.notify(usize::MAX);
        } else {
            // Dropped while still waiting in line: skip this ticket when its turn comes.
            st.abandoned_tickets.insert(self.ticket);
        }
    }
}

pub struct Log<S: Storage> {
    pub(crate) dir: PathBuf,
    pub(crate) storage: S,
    pub(crate) config: RefCell<LogConfig>,
    pub(crate) clock: Clock,
    pub(crate) cache: Rc<BatchCache>,
    pub(crate) cache_id: u64,
    pub(crate) io: async_lock::Mutex<()>,
    /// Held by the fdatasync stage of group commit, which runs outside the io lock.
    pub(crate) sync: async_lock::Mutex<()>,
    pub(crate) state: RefCell<State<S::File>>,
    pub(crate) stats: RefCell<LogStats>,
    pub(crate) turn_event: event_listener::Event,
}

impl<S: Storage> Log<S> {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> LogConfig {
        self.config.borrow().clone()
    }

    /// Applies new topic configs; they take effect from the next append, roll or cleaning.
    pub fn set_config(&self, config: LogConfig) {
        *self.config.borrow_mut() = config;
    }

    pub fn log_start_offset(&self) -> Offset {
        self.state.borrow().log_start_offset
    }

    pub fn log_end_offset(&self) -> Offset {
        self.state.borrow().log_end_offset
    }

    /// One past the last offset that is fdatasync'd.
    pub fn durable_end_offset(&self) -> Offset {
        self.state.borrow().synced_end
    }

    /// One past the last offset a consumer may see on a single replica: what is as durable as
    /// `flush.mode` promises (fdatasync'd under `batch`, on the device otherwise). Data a crash
    /// could take back is never served.
    pub fn high_watermark(&self) -> Offset {
        let st = self.state.borrow();
        match self.config.borrow().flush_mode {
            FlushMode::Batch => st.synced_end,
            FlushMode::Interval | FlushMode::None => st.written_end,
        }
    }

    pub fn poisoned(&self) -> Option<String> {
        self.state.borrow().poisoned.clone()
    }

    pub fn segment_count(&self) -> usize {
        self.state.borrow().segments.len()
    }

    /// Base offsets of the segments, oldest first.
    pub fn segment_base_offsets(&self) -> Vec<Offset> {
        self.state.borrow().segments.keys().copied().collect()
    }

    pub fn size_bytes(&self) -> u64 {
        self.state.borrow().segments.values().map(|s| s.size).sum()
    }

    /// The first offset not yet stable given the partition's high watermark: of the oldest open
    /// transaction, or of one whose marker is not below `high_watermark` yet. The last stable
    /// offset is the smaller of it and the high watermark.
    pub fn first_unstable_offset(&self, high_watermark: Offset) -> Option<Offset> {
        self.state
            .borrow_mut()
            .producers
            .first_unstable_offset(high_watermark)
    }

    /// The transactions aborted within `[from, to)` (Fetch's `aborted_transactions`).
    pub fn aborted_transactions(
        &self,
        from: Offset,
        to: Offset,
    ) -> Vec<crate::producer_state::AbortedTxn> {
        self.state.borrow().producers.aborted_transactions(from, to)
    }

    /// Whether `producer_id` has a transaction open in this partition at `producer_epoch`: its
    /// later batches of that transaction need no check with the transaction coordinator
    /// (KIP-890's partition verification is for a transaction's first batch).
    pub fn producer_in_transaction(&self, producer_id: i64, producer_epoch: i16) -> bool {
        self.state
            .borrow()
            .producers
            .get(producer_id)
            .is_some_and(|e| e.epoch == producer_epoch && e.current_txn_first_offset.is_some())
    }

    /// The idempotent producers this partition remembers, by producer id (DescribeProducers).
    pub fn active_producers(&self) -> Vec<crate::producer_state::ActiveProducer> {
        self.state.borrow().producers.active()
    }

    pub fn leader_epochs(&self) -> Vec<(LeaderEpoch, Offset)> {
        self.state.borrow().epochs.clone()
    }

    /// OffsetForLeaderEpoch: the end offset of `epoch` (the start of the next larger epoch, or
    /// the log end for the latest one) and the largest epoch at or below the one asked for.
    pub fn end_offset_for_epoch(&self, epoch: LeaderEpoch) -> Option<(LeaderEpoch, Offset)> {
        let st = self.state.borrow();
        let i = st.epochs.partition_point(|&(e, _)| e <= epoch);
        if i == 0 {
            return None;
        }
        let found = st.epochs[i - 1].0;
        let end = st
            .epochs
            .get(i)
            .map(|&(_, o)| o)
            .unwrap_or(st.log_end_offset);
        Some((found, end))
    }

    pub fn with_stats<R>(&self, f: impl FnOnce(&LogStats) -> R) -> R {
        f(&self.stats.borrow())
    }

    pub(crate) fn check_usable(&self) -> Result<()> {
        let st = self.state.borrow();
        if let Some(reason) = &st.poisoned {
            return Err(LogError::Poisoned {
                reason: reason.clone(),
            });
        }
        if st.closed {
            return Err(LogError::Closed);
        }
        Ok(())
    }

    /// Marks the log unusable after a failed write or sync. Never retried: after a failed
    /// fsync the kernel may have dropped the dirty data, so only recovery from what is on the
    /// device can say what the log holds.
    pub(crate) fn poison(&self, reason: String) -> LogError {
        let mut st = self.state.borrow_mut();
        if st.poisoned.is_none() {
            tracing::error!(dir = %self.dir.display(), %reason, "log poisoned: refusing further requests");
            st.poisoned = Some(reason.clone());
        }
        LogError::Poisoned { reason }
    }

    /// Takes the log out of service because its directory failed (Kafka's offline log
    /// directory): every later request gets the storage error, as after a failed write here.
    pub fn take_offline(&self, reason: String) {
        let _ = self.poison(reason);
    }

    /// Appends one record batch (stamped with its offsets and `leader_epoch`) and returns when it
    /// is as durable as `flush.mode` asks.
    pub async fn append(&self, batch: BytesMut, leader_epoch: LeaderEpoch) -> Result<AppendInfo> {
        self.append_signalling(batch, leader_epoch, || {}, || {})
            .await
    }

    /// [`Log::append`], calling `in_order` as soon as the batch's place in this log's append
    /// order is fixed (every append started later goes after it), or once it is refused: before
    /// it waits for room, its turn or durability. A connection lets its next produce start then,
    /// so pipelined produces keep their order and still share fdatasyncs. `buffered` is called
    /// once the batch has its offsets and can be read (by replica fetchers, which copy it while
    /// this log makes it durable), before the wait for durability; never for a refused batch
    /// or a duplicate.
    pub async fn append_signalling(
        &self,
        batch: BytesMut,
        leader_epoch: LeaderEpoch,
        in_order: impl FnOnce(),
        buffered: impl FnOnce(),
    ) -> Result<AppendInfo> {
        // Called on every way out, the early refusals included.
        let in_order = CallOnDrop(Some(in_order));
        self.check_usable()?;
        let config = self.config();
        let (mut batch, records_max_timestamp) = self.prepare(batch, &config)?;
        let len = batch.len() as u64;
        // Appends to one log take effect in arrival order, even when one has to wait for room:
        // an idempotent producer's pipelined batches must not overtake each other.
        let ticket = self.ticket();
        drop(in_order);
        let turn = self.wait_turn(ticket).await;
        // Make room first: nothing is assigned an offset until there is space to write it.
        self.wait_for_room(len, &config).await?;
        // No await from here until the batch is buffered: offsets are assigned in order.
        let now = self.clock.now_ms();
        let duplicate = {
            let st = self.state.borrow();
            let header = BatchHeader::parse(&batch)?;
            match st.producers.check(&header)? {
                SequenceCheck::Append => None,
                SequenceCheck::Duplicate {
                    base_offset,
                    last_offset,
                } => {
                    tracing::debug!(dir = %self.dir.display(), producer_id = header.producer_id(), base_offset = base_offset.0, "duplicate batch from an idempotent producer; answering with its original offsets");
                    Some(AppendInfo {
                        base_offset,
                        last_offset,
                        log_append_time: Timestamp::NONE,
                        log_start_offset: st.log_start_offset,
                    })
                }
            }
        };
        if let Some(info) = duplicate {
            drop(turn);
            self.wait_durable(info.last_offset.next(), config.flush_mode)
                .await?;
            return Ok(info);
        }
        let info = {
            let mut st = self.state.borrow_mut();
            let base = st.log_end_offset;
            batch::stamp(&mut batch, base, leader_epoch);
            let mut log_append_time = Timestamp::NONE;
            if config.message_timestamp_type == TimestampType::LogAppendTime {
                log_append_time = Timestamp(now);
                batch::stamp_log_append_time(&mut batch, log_append_time);
            } else {
                let header = BatchHeader::parse(&batch).expect("validated");
                if header.max_timestamp() != records_max_timestamp && !header.is_control() {
                    batch::stamp_max_timestamp(&mut batch, records_max_timestamp);
                }
            }
            let bytes = batch.freeze();
            let header = BatchHeader::parse(&bytes).expect("validated");
            let last = header.last_offset();
            st.producers.record(&header, base, last);
            let seg = st.active_mut();
            let position = seg.size;
            seg.track_batch(&header, position, config.index_interval_bytes);
            seg.first_append_ms.get_or_insert(now);
            seg.last_modified_ms = Some(now);
            seg.appender
                .as_mut()
                .expect("active segment has an appender")
                .push(PendingBatch {
                    base_offset: base,
                    last_offset: last,
                    bytes: bytes.clone(),
                });
            st.log_end_offset = last.next();
            if leader_epoch.0 >= 0 && st.epochs.last().is_none_or(|&(e, _)| leader_epoch > e) {
                st.epochs.push((leader_epoch, base));
                st.epochs_dirty = true;
            }
            st.check_invariants();
            self.cache.insert(self.cache_id, base, last, bytes);
            AppendInfo {
                base_offset: base,
                last_offset: last,
                log_append_time,
                log_start_offset: st.log_start_offset,
            }
        };
        drop(turn);
        {
            let mut stats = self.stats.borrow_mut();
            stats.appends += 1;
            stats.appended_bytes += len;
        }
        buffered();
        self.wait_durable(info.last_offset.next(), config.flush_mode)
            .await?;
        Ok(info)
    }

    /// Appends a batch as a follower replica: as the leader stored it, with its offsets, leader
    /// epoch and timestamps, neither recompressed nor checked against producer sequences (the
    /// leader did that); the producer state is updated from it, so a follower that becomes leader
    /// knows every idempotent producer (Kafka's `appendAsFollower`). The batch must start at or
    /// past the log end (past it where the leader's compaction removed whole batches). Returns
    /// once the batch is buffered, without waiting for durability: the replica fetcher asks for
    /// that with [`Log::flush_for_replica`] after a whole fetch's batches are in.
    pub async fn append_as_follower(&self, batch: BytesMut) -> Result<AppendInfo> {
        self.check_usable()?;
        let config = self.config();
        let len = batch.len() as u64;
        let (base, last, epoch) = {
            let header = batch::verify(&batch)?;
            (
                header.base_offset(),
                header.last_offset(),
                header.partition_leader_epoch(),
            )
        };
        if last < base {
            return Err(BatchError::BadRecordCount {
                record_count: 0,
                last_offset_delta: (last.0 - base.0) as i32,
            }
            .into());
        }
        let ticket = self.ticket();
        let turn = self.wait_turn(ticket).await;
        self.wait_for_room(len, &config).await?;
        let now = self.clock.now_ms();
        let info = {
            let mut st = self.state.borrow_mut();
            if base < st.log_end_offset {
                return Err(LogError::UnexpectedAppendOffset {
                    base_offset: base,
                    log_end_offset: st.log_end_offset,
                });
            }
            let bytes = batch.freeze();
            let header = BatchHeader::parse(&bytes).expect("verified");
            st.producers.record(&header, base, last);
            let seg = st.active_mut();
            let position = seg.size;
            seg.track_batch(&header, position, config.index_interval_bytes);
            seg.first_append_ms.get_or_insert(now);
            seg.last_modified_ms = Some(now);
            seg.appender
                .as_mut()
                .expect("active segment has an appender")
                .push(PendingBatch {
                    base_offset: base,
                    last_offset: last,
                    bytes: bytes.clone(),
                });
            st.log_end_offset = last.next();
            if epoch.0 >= 0 && st.epochs.last().is_none_or(|&(e, _)| epoch > e) {
                st.epochs.push((epoch, base));
                st.epochs_dirty = true;
            }
            st.check_invariants();
            self.cache.insert(self.cache_id, base, last, bytes);
            AppendInfo {
                base_offset: base,
                last_offset: last,
                log_append_time: Timestamp::NONE,
                log_start_offset: st.log_start_offset,
            }
        };
        drop(turn);
        {
            let mut stats = self.stats.borrow_mut();
            stats.appends += 1;
            stats.appended_bytes += len;
        }
        Ok(info)
    }

    /// Rolls or retains until a batch of `len` bytes fits in the active segment. Nothing is
    /// assigned an offset before there is space to write it.
    async fn wait_for_room(&self, len: u64, config: &LogConfig) -> Result<()> {
        loop {
            let now = self.clock.now_ms();
            if self.has_room(len, now, config) {
                return Ok(());
            }
            let _io = self.io.lock().await;
            self.check_usable()?;
            if self.has_room(len, now, config) {
                return Ok(());
            }
            self.make_room_locked(len, now, config).await?;
        }
    }

    /// Makes everything a follower appended as durable as `flush.mode` asks, and returns the
    /// offset it may report to its leader as fetched: fdatasync'd under `batch` (so the
    /// leader's high watermark counts only records on every in-sync replica's disk), written
    /// otherwise.
    pub async fn flush_for_replica(&self) -> Result<Offset> {
        self.check_usable()?;
        let mode = self.config().flush_mode;
        let end = self.log_end_offset();
        self.wait_durable(end, mode).await?;
        Ok(self.high_watermark())
    }

    /// Validates a batch for appending and brings it into the form the log stores: recompressed
    /// with the topic's `compression.type` when that names another codec than the producer's,
    /// as Kafka's `LogValidator` does (control batches keep theirs, as in Kafka). Returns the
    /// batch and its records' max timestamp.
    ///
    /// The work is CPU on the shard, before the append takes its place in line: decompression
    /// of every compressed batch (Kafka does the same to validate the records) and, only when
    /// a topic asks for it, recompression.
    fn prepare(&self, batch: BytesMut, config: &LogConfig) -> Result<(BytesMut, Timestamp)> {
        let valid =
            batch::validate_for_append(&batch, config.max_message_bytes, config.cleanup_compact)?;
        let max_timestamp = valid.max_timestamp;
        let is_control = BatchHeader::parse(&batch)?.is_control();
        let target = config.compression_type.target(valid.compression);
        if target == valid.compression || is_control {
            drop(valid);
            return Ok((batch, max_timestamp));
        }
        let rebuilt = batch::recompress(&batch, &valid.records, target);
        // Recompression can make a batch larger (to `uncompressed`, or to a weaker codec);
        // Kafka checks `max.message.bytes` again then.
        if rebuilt.len() > config.max_message_bytes as usize {
            return Err(BatchError::TooLarge {
                size: rebuilt.len(),
                max: config.max_message_bytes,
            }
            .into());
        }
        Ok((rebuilt, max_timestamp))
    }

    /// Takes this append's place in line. The returned guard gives it up when dropped, also
    /// when the append fails or its future is dropped midway.
    fn ticket(&self) -> Turn<'_, S> {
        let ticket = {
            let mut st = self.state.borrow_mut();
            st.next_ticket += 1;
            st.next_ticket - 1
        };
        Turn { log: self, ticket }
    }

    /// Waits for this append's turn.
    async fn wait_turn<'a>(&'a self, turn: Turn<'a, S>) -> Turn<'a, S> {
        let ticket = turn.ticket;
        loop {
            if self.state.borrow().serving_ticket == ticket {
                return turn;
            }
            let listener = self.turn_event.listen();
            if self.state.borrow().serving_ticket == ticket {
                return turn;
            }
            listener.await;
        }
    }

    fn should_roll(&self, seg: &Segment<S::File>, len: u64, now: i64, config: &LogConfig) -> bool {
        if seg.is_empty() {
            return false;
        }
        let too_big = seg.size + len > config.segment_bytes;
        let too_old = seg
            .first_append_ms
            .is_some_and(|t| now - t >= config.segment_ms);
        // Relative offsets in the indexes are u32; leave a batch's worth of headroom.
        let offsets_full = seg.next_offset.0 - seg.base_offset.0 > (u32::MAX / 2) as i64;
        too_big || too_old || offsets_full
    }

    fn has_room(&self, len: u64, now: i64, config: &LogConfig) -> bool {
        let st = self.state.borrow();
        if st.poisoned.is_some() || st.appends_blocked {
            return false;
        }
        let seg = st.active();
        let appender = seg
            .appender
            .as_ref()
            .expect("active segment has an appender");
        appender.room(seg.size) >= len
            && !self.should_roll(seg, len, now, config)
            && (appender.unwritten.is_empty()
                || appender.unwritten_bytes + len <= PENDING_BYTES_MAX)
    }

    async fn make_room_locked(&self, len: u64, now: i64, config: &LogConfig) -> Result<()> {
        // Holding the io lock, no roll is running; a cancelled one must not block appends.
        self.state.borrow_mut().appends_blocked = false;
        let (pending_full, roll, room) = {
            let st = self.state.borrow();
            let seg = st.active();
            let appender = seg
                .appender
                .as_ref()
                .expect("active segment has an appender");
            (
                !appender.unwritten.is_empty()
                    && appender.unwritten_bytes + len > PENDING_BYTES_MAX,
                self.should_roll(seg, len, now, config),
                appender.room(seg.size),
            )
        };
        if pending_full {
            self.flush_locked(false).await?;
        }
        if roll {
            self.roll_locked().await?;
        } else if room < len {
            self.allocate_locked(len, config).await?;
        }
        Ok(())
    }

    /// Waits until every offset below `target` is written (and synced under `flush.mode=batch`).
    async fn wait_durable(&self, target: Offset, mode: FlushMode) -> Result<()> {
        let reached = |st: &State<S::File>| -> Result<bool> {
            if let Some(reason) = &st.poisoned {
                return Err(LogError::Poisoned {
                    reason: reason.clone(),
                });
            }
            if st.log_end_offset < target {
                return Err(LogError::Truncated { offset: target });
            }
            Ok(match mode {
                FlushMode::Batch => st.synced_end >= target,
                FlushMode::Interval | FlushMode::None => st.written_end >= target,
            })
        };
        loop {
            if reached(&self.state.borrow())? {
                return Ok(());
            }
            {
                let _io = self.io.lock().await;
                if reached(&self.state.borrow())? {
                    return Ok(());
                }
                self.flush_locked(false).await?;
            }
            if mode == FlushMode::Batch {
                // The io lock is free again while this fdatasync runs, so the next group of
                // appends is written meanwhile and covered by the following fdatasync.
                let _sync = self.sync.lock().await;
                if reached(&self.state.borrow())? {
                    return Ok(());
                }
                self.sync_written().await?;
            }
        }
    }

    /// fdatasyncs the active segment, making everything written so far durable. Runs under the
    /// `sync` lock (or the io lock); segments before the active one were synced when sealed.
    async fn sync_written(&self) -> Result<()> {
        let (file, target, segment_base) = {
            let st = self.state.borrow();
            (
                st.active().file.clone(),
                st.written_end,
                st.active().base_offset,
            )
        };
        if self.state.borrow().synced_end >= target {
            return Ok(());
        }
        let started = Instant::now();
        if let Err(e) = file.fdatasync().await {
            return Err(self.poison(format!("fdatasync of segment {segment_base} failed: {e}")));
        }
        let micros = started.elapsed().as_micros() as u64;
        let _ = self.stats.borrow_mut().fdatasync_us.record(micros.max(1));
        let mut st = self.state.borrow_mut();
        // A truncation may have run meanwhile: never claim more than is written.
        let target = target.min(st.written_end);
        st.synced_end = st.synced_end.max(target);
        st.last_flush_ms = self.clock.now_ms();
        st.check_invariants();
        Ok(())
    }

    /// Writes everything buffered to the device and, with `sync`, fdatasyncs it.
    pub(crate) async fn flush_locked(&self, sync: bool) -> Result<()> {
        let (file, plan, segment_base) = {
            let st = self.state.borrow();
            let seg = st.active();
            let appender = seg
                .appender
                .as_ref()
                .expect("active segment has an appender");
            (
                seg.file.clone(),
                appender.plan_write(&*seg.file),
                seg.base_offset,
            )
        };
        if let Some(plan) = plan {
            let len = plan.end - plan.position;
            let mut writes = plan.writes.into_iter();
            let (first_at, first) = writes.next().expect("a write plan has a write");
            let result = match writes.next() {
                None => file.write_at(first, first_at).await,
                Some((second_at, second)) => {
                    let (a, b) = futures_lite::future::zip(
                        file.write_at(first, first_at),
                        file.write_at(second, second_at),
                    )
                    .await;
                    a.and(b)
                }
            };
            if let Err(e) = result {
                return Err(self.poison(format!(
                    "write of {len} bytes at {} in segment {segment_base} failed: {e}",
                    plan.position
                )));
            }
            let mut st = self.state.borrow_mut();
            let seg = st.active_mut();
            assert_eq!(
                seg.base_offset, segment_base,
                "active segment changed under the io lock"
            );
            let next = seg
                .appender
                .as_mut()
                .expect("active segment has an appender")
                .complete_write(plan.end, plan.batch_count, plan.new_tail);
            st.written_end = next;
            st.check_invariants();
            let mut stats = self.stats.borrow_mut();
            stats.device_writes += 1;
            stats.device_written_bytes += align_up(len);
        }
        if sync {
            self.sync_written().await?;
        }
        if self.state.borrow().epochs_dirty {
            self.write_epochs_checkpoint().await;
        }
        Ok(())
    }

    /// Forces everything appended so far onto the device and fdatasyncs it.
    pub async fn flush(&self) -> Result<()> {
        self.check_usable()?;
        let _io = self.io.lock().await;
        self.check_usable()?;
        self.flush_locked(true).await
    }

    /// For `flush.mode = interval`: fdatasyncs if `flush.ms` has passed since the last one.
    /// The shard calls it from a timer.
    pub async fn flush_if_due(&self) -> Result<()> {
        let config = self.config();
        if config.flush_mode != FlushMode::Interval {
            return Ok(());
        }
        let due = {
            let st = self.state.borrow();
            st.synced_end < st.log_end_offset
                && self.clock.now_ms() - st.last_flush_ms >= config.flush_ms
        };
        if due {
            self.flush().await?;
        }
        Ok(())
    }

    /// Grows the active segment's preallocation to fit `len` more bytes. On a full disk, fails
    /// with `DiskFull` and changes nothing; the next append tries again.
    pub(crate) async fn allocate_locked(&self, len: u64, config: &LogConfig) -> Result<()> {
        let (file, size, allocated) = {
            let st = self.state.borrow();
            let seg = st.active();
            (
                seg.file.clone(),
                seg.size,
                seg.appender.as_ref().expect("active").allocated,
            )
        };
        let needed = align_up(size + len);
        if needed <= allocated {
            return Ok(());
        }
        let wanted = align_up(size + len.max(PREALLOCATE_BYTES))
            .min(align_up(config.segment_bytes.max(size + len)));
        let wanted = wanted.max(needed);
        let result = match file.allocate(wanted).await {
            Err(e) if is_disk_full(&e) && wanted > needed => {
                file.allocate(needed).await.map(|_| needed)
            }
            other => other.map(|_| wanted),
        };
        match result {
            Ok(now_allocated) => {
                let mut st = self.state.borrow_mut();
                let appender = st.active_mut().appender.as_mut().expect("active");
                appender.allocated = appender.allocated.max(now_allocated);
                Ok(())
            }
            Err(e) if is_disk_full(&e) => {
                tracing::warn!(dir = %self.dir.display(), needed = len, "disk full: append refused until space is freed");
                Err(LogError::DiskFull(e))
            }
            Err(e) => Err(LogError::io("preallocating segment space", e)),
        }
    }

    /// Creates and preallocates an empty active segment at `base`. On failure (a full disk)
    /// nothing is left behind.
    pub(crate) async fn create_segment_locked(&self, base: Offset) -> Result<Segment<S::File>> {
        let segment_bytes = self.config.borrow().segment_bytes;
        let path = segment::log_path(&self.dir, base);
        let file = self.storage.open(&path, true).await.map_err(|e| {
            if is_disk_full(&e) {
                LogError::DiskFull(e)
            } else {
                LogError::io("creating a segment", e)
            }
        })?;
        let allocate = align_up(PREALLOCATE_BYTES.min(segment_bytes.max(1)));
        if let Err(e) = file.allocate(allocate).await {
            drop(file);
            let _ = self.storage.remove(&path).await;
            return Err(if is_disk_full(&e) {
                tracing::warn!(dir = %self.dir.display(), "disk full: cannot create a new segment");
                LogError::DiskFull(e)
            } else {
                LogError::io("preallocating a new segment", e)
            });
        }
        let mut seg = Segment::new(base, Rc::new(file));
        seg.last_modified_ms = Some(self.clock.now_ms());
        seg.appender = Some(Appender::new(0, Vec::new(), allocate));
        Ok(seg)
    }

    /// Starts a new segment at the log end. Order matters for recovery: the old segment is made
    /// durable first, so a new segment file on disk always follows a complete one; the new one is
    /// created and preallocated before the old is sealed, so a full disk changes nothing.
    pub(crate) async fn roll_locked(&self) -> Result<()> {
        self.state.borrow_mut().appends_blocked = true;
        let result = self.roll_inner_locked().await;
        self.state.borrow_mut().appends_blocked = false;
        result
    }

    async fn roll_inner_locked(&self) -> Result<()> {
        self.flush_locked(true).await?;
        let next = self.state.borrow().log_end_offset;
        let seg = self.create_segment_locked(next).await?;
        self.seal_active_locked().await?;
        self.write_producer_snapshot_locked().await;
        if let Err(e) = self.storage.sync_dir(&self.dir).await {
            return Err(self.poison(format!(
                "syncing the log directory after a roll failed: {e}"
            )));
        }
        let mut st = self.state.borrow_mut();
        st.segments.insert(next, seg);
        st.check_invariants();
        tracing::debug!(dir = %self.dir.display(), base_offset = next.0, "rolled a new segment");
        Ok(())
    }

    /// Rolls the active segment now if it holds anything (tests and operators; appends roll
    /// by `segment.bytes` and `segment.ms` on their own).
    pub async fn roll(&self) -> Result<()> {
        self.check_usable()?;
        let _io = self.io.lock().await;
        self.check_usable()?;
        if self.state.borrow().active().is_empty() {
            return Ok(());
        }
        self.roll_locked().await
    }

    /// (base offset, bytes, next offset) of every segment, oldest first.
    pub fn segments_info(&self) -> Vec<(Offset, u64, Offset)> {
        let st = self.state.borrow();
        st.segments
            .values()
            .map(|s| (s.base_offset, s.size, s.next_offset))
            .collect()
    }

    /// Writes a sealed segment's `.index` and `.timeindex`. Best effort: without them the
    /// segment is scanned and they are rebuilt on the next open.
    pub(crate) async fn write_segment_indexes(&self, base: Offset) {
        let (index, time_index) = {
            let st = self.state.borrow();
            let seg = &st.segments[&base];
            (
                seg.offset_index.encode(seg.size, seg.next_offset.0),
                seg.time_index
                    .encode(seg.max_timestamp.0, seg.offset_of_max_timestamp.0),
            )
        };
        for (path, bytes) in [
            (segment::index_path(&self.dir, base), index),
            (segment::time_index_path(&self.dir, base), time_index),
        ] {
            if let Err(e) = write_file_atomic(&self.storage, &path, &bytes).await {
                tracing::warn!(path = %path.display(), error = %e, "could not write segment index; it will be rebuilt on open");
            }
        }
    }

    /// Truncates the active segment's file to its logical size, syncs it, and writes its
    /// indexes. The caller has flushed it. Index write failures only cost a rebuild on open.
    pub(crate) async fn seal_active_locked(&self) -> Result<()> {
        let (file, base, size) = {
            let st = self.state.borrow();
            let seg = st.active();
            let appender = seg.appender.as_ref().expect("active");
            assert!(
                appender.unwritten.is_empty(),
                "sealing a segment with unwritten batches"
            );
            assert_eq!(appender.written, seg.size);
            (seg.file.clone(), seg.base_offset, seg.size)
        };
        if let Err(e) = file.truncate(size).await {
            return Err(self.poison(format!("truncating sealed segment {base} failed: {e}")));
        }
        if let Err(e) = file.fdatasync().await {
            return Err(self.poison(format!("fdatasync of sealed segment {base} failed: {e}")));
        }
        self.write_segment_indexes(base).await;
        let mut st = self.state.borrow_mut();
        if let Some(seg) = st.segments.get_mut(&base) {
            seg.appender = None;
        }
        Ok(())
    }

    /// Makes `base`'s segment the active one: forgets its index files (they go stale with the
    /// first append), reads its partial last block into memory and preallocates ahead.
    pub(crate) async fn activate_locked(&self, base: Offset) -> Result<()> {
        let (file, size) = {
            let st = self.state.borrow();
            let seg = &st.segments[&base];
            (seg.file.clone(), seg.size)
        };
        for path in [
            segment::index_path(&self.dir, base),
            segment::time_index_path(&self.dir, base),
        ] {
            if self.storage.exists(&path).await {
                self.storage
                    .remove(&path)
                    .await
                    .map_err(|e| LogError::io("removing a stale index", e))?;
            }
        }
        let tail_start = align_down(size);
        let tail = file
            .read_at(tail_start, (size - tail_start) as usize)
            .await
            .map_err(|e| LogError::io("reading the tail block", e))?;
        if tail.len() as u64 != size - tail_start {
            return Err(LogError::Corrupt {
                segment: base,
                position: tail_start,
                reason: "segment shorter than recovered size".into(),
            });
        }
        let file_size = file
            .size()
            .await
            .map_err(|e| LogError::io("sizing a segment", e))?;
        let segment_bytes = self.config.borrow().segment_bytes;
        let wanted = align_up(size + PREALLOCATE_BYTES).min(align_up(segment_bytes.max(size + 1)));
        let allocated = match file.allocate(wanted).await {
            Ok(()) => wanted.max(align_down(file_size)),
            Err(e) if is_disk_full(&e) => {
                tracing::warn!(dir = %self.dir.display(), "disk full while reopening the active segment; appends wait for space");
                align_down(file_size)
            }
            Err(e) => return Err(LogError::io("preallocating the active segment", e)),
        };
        let mut st = self.state.borrow_mut();
        let seg = st.segments.get_mut(&base).expect("segment exists");
        seg.appender = Some(Appender::new(size, tail, allocated));
        Ok(())
    }

    /// Clean shutdown: everything to the device, the active segment sealed in place, indexes and
    /// checkpoints written, then the marker that lets the next open skip recovery.
    pub async fn close(&self) -> Result<()> {
        self.check_usable()?;
        let _io = self.io.lock().await;
        self.check_usable()?;
        self.state.borrow_mut().appends_blocked = true;
        self.flush_locked(true).await?;
        self.seal_active_locked().await?;
        self.write_producer_snapshot_locked().await;
        self.state.borrow_mut().closed = true;
        self.write_epochs_checkpoint().await;
        let marker = self.dir.join(CLEAN_SHUTDOWN_FILE);
        write_file_atomic(&self.storage, &marker, b"1")
            .await
            .map_err(|e| LogError::io("writing the clean-shutdown marker", e))?;
        self.cache.unregister_log(self.cache_id);
        Ok(())
    }
}
