//! One share partition (KIP-932, "queues for Kafka"): for a single share group and a single
//! topic partition, which records are out with which consumer, and which are done.
//!
//! # What it owns
//!
//! The window of *in-flight* offsets `[start_offset, end_offset)`. Every offset below the
//! share-partition start offset (SPSO, [`SharePartition::start_offset`]) is done
//! (acknowledged, archived, or skipped by a reset) and forgotten. Every offset at or above the
//! share-partition end offset (SPEO, [`SharePartition::end_offset`]) has never been handed to a
//! consumer and exists only in the log. Each in-flight offset that holds a record carries a
//! [`RecordState`] and a delivery count (how many times it was acquired):
//!
//! - `Available`: it may be acquired, because it was released or its lock timed out.
//! - `Acquired`: one member holds it until a deadline, the acquisition lock.
//! - `Acknowledged`: its holder accepted it. This is final.
//! - `Archived`: rejected, acknowledged as a gap, or delivered `delivery_count_limit` times.
//!   This is final too.
//!
//! # Transitions
//!
//! A fresh or `Available` record becomes `Acquired` when a member fetches it, and its delivery
//! count goes up by one. An `Acquired` record becomes `Acknowledged` on ACCEPT and `Archived` on
//! REJECT or GAP. It becomes `Available` again on RELEASE, when its lock expires, or when its
//! holder leaves, except that a record already delivered `delivery_count_limit` times is archived
//! instead, so that a poison record cannot circulate forever. RENEW only pushes the lock's
//! deadline out. Whenever the lowest in-flight records become final, the start offset moves past
//! them and they are dropped, so the window holds only what still matters.
//!
//! Offsets inside the window that have no entry are offsets where the log holds no record: the
//! space between two record batches the shard read (compaction can remove whole batches). Reads
//! never return them, so they never become in flight, and the start offset steps over them when
//! it advances: it always equals the lowest in-flight offset, or the end offset when nothing is
//! in flight. Should a read nevertheless return one, it is treated as a record never delivered.
//!
//! # Who drives it
//!
//! The shard that leads the topic partition owns one `SharePartition` per share group reading
//! it. On a ShareFetch it asks [`SharePartition::next_fetch_offset`] where to read, reads record
//! batches from its log there, and passes their bounds to [`SharePartition::acquire`], which
//! decides what the fetching member gets. Acknowledgements from ShareFetch and ShareAcknowledge
//! go to [`SharePartition::acknowledge`]; a member that leaves or whose share session closes goes
//! to [`SharePartition::release_member`]. The shard arms a timer at
//! [`SharePartition::next_deadline`] and calls [`SharePartition::expire`] when it fires. It
//! persists [`SharePartition::state_batches`] with the start offset through the share-group state
//! persister, and a shard that becomes leader rebuilds the partition with
//! [`SharePartition::restore`]; one that stops leading drops it.
//!
//! Nothing here does I/O or reads the clock: time is passed in as an [`Instant`], so every
//! transition is deterministic and testable.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Kafka's acknowledge types as the wire carries them (ShareFetch / ShareAcknowledge
/// `AcknowledgeTypes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckType {
    /// The offset holds no record (a hole inside a batch); the record is archived.
    Gap,
    /// Processed: the record is acknowledged.
    Accept,
    /// Not processed: the record may be delivered again (unless at the delivery limit).
    Release,
    /// Unprocessable: the record is archived.
    Reject,
    /// Still working on it: the acquisition lock is extended.
    Renew,
}

impl AckType {
    /// The type for its wire value, or `None` for a value Kafka does not define.
    pub fn from_wire(v: i8) -> Option<AckType> {
        match v {
            0 => Some(AckType::Gap),
            1 => Some(AckType::Accept),
            2 => Some(AckType::Release),
            3 => Some(AckType::Reject),
            4 => Some(AckType::Renew),
            _ => None,
        }
    }

    /// The wire value.
    pub fn wire(self) -> i8 {
        match self {
            AckType::Gap => 0,
            AckType::Accept => 1,
            AckType::Release => 2,
            AckType::Reject => 3,
            AckType::Renew => 4,
        }
    }
}

/// The delivery state of one in-flight record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordState {
    Available,
    Acquired,
    Acknowledged,
    Archived,
}

impl RecordState {
    /// Kafka's persisted delivery state value.
    pub fn wire(self) -> i8 {
        match self {
            RecordState::Available => 0,
            RecordState::Acquired => 1,
            RecordState::Acknowledged => 2,
            RecordState::Archived => 4,
        }
    }

    /// The state for a persisted delivery state value, or `None` for one Kafka does not define.
    pub fn from_wire(v: i8) -> Option<RecordState> {
        match v {
            0 => Some(RecordState::Available),
            1 => Some(RecordState::Acquired),
            2 => Some(RecordState::Acknowledged),
            4 => Some(RecordState::Archived),
            _ => None,
        }
    }

    /// Whether the record is done: it will never be delivered again.
    pub fn is_final(self) -> bool {
        matches!(self, RecordState::Acknowledged | RecordState::Archived)
    }

    /// The position of this state in per-state counters.
    fn slot(self) -> usize {
        match self {
            RecordState::Available => 0,
            RecordState::Acquired => 1,
            RecordState::Acknowledged => 2,
            RecordState::Archived => 3,
        }
    }
}

/// Limits and timings, from the group's configs.
#[derive(Clone, Copy, Debug)]
pub struct ShareConfig {
    /// `share.record.lock.duration.ms`: how long a member holds a record it acquired.
    pub record_lock_duration: Duration,
    /// `share.delivery.count.limit`: deliveries after which a record is archived rather than
    /// made available again.
    pub delivery_count_limit: u16,
    /// `group.share.partition.max.record.locks`: records Acquired at once, at most.
    pub partition_max_record_locks: u32,
}

impl Default for ShareConfig {
    /// Kafka's defaults.
    fn default() -> ShareConfig {
        ShareConfig {
            record_lock_duration: Duration::from_secs(30),
            delivery_count_limit: 5,
            partition_max_record_locks: 2000,
        }
    }
}

/// One run of consecutive offsets acquired in one go with the same delivery count (ShareFetch's
/// AcquiredRecords).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcquiredRange {
    pub first_offset: i64,
    pub last_offset: i64,
    pub delivery_count: u16,
}

/// Why an acknowledgement was refused (Kafka answers INVALID_RECORD_STATE for all but
/// InvalidRequest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AckError {
    /// An offset in the range is not acquired by this member (never was, someone else has it,
    /// already acknowledged, or its lock expired).
    InvalidRecordState { offset: i64 },
    /// Malformed: last < first, or `types` neither of length 1 nor one per offset, or an
    /// unknown type.
    InvalidRequest(String),
}

impl fmt::Display for AckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AckError::InvalidRecordState { offset } => {
                write!(f, "offset {offset} is not acquired by this member")
            }
            AckError::InvalidRequest(why) => write!(f, "invalid acknowledgement: {why}"),
        }
    }
}

impl std::error::Error for AckError {}

/// One contiguous run of in-flight offsets with the same state and delivery count, for
/// persisting the state (Kafka's PersisterStateBatch: first offset, last offset, delivery state,
/// delivery count). Acquired records are persisted as Available (a new leader must deliver them
/// again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateBatch {
    pub first_offset: i64,
    pub last_offset: i64,
    pub state: RecordState,
    pub delivery_count: u16,
}

/// Who holds an acquired record, and until when.
#[derive(Clone, Debug)]
struct Lock {
    member: Rc<str>,
    deadline: Instant,
}

/// The state of one in-flight offset. `lock` is `Some` exactly when `state` is `Acquired`.
#[derive(Clone, Debug)]
struct InFlight {
    state: RecordState,
    delivery_count: u16,
    lock: Option<Lock>,
}

impl InFlight {
    /// Ends the lock on an acquired record that was not processed (released, expired, or its
    /// holder left): it may be delivered again, unless it already was as often as allowed.
    fn unlock(&mut self, delivery_count_limit: u16) {
        self.lock = None;
        self.state = if self.delivery_count >= delivery_count_limit {
            RecordState::Archived
        } else {
            RecordState::Available
        };
    }

    /// Whether `member` holds this record with a lock still valid at `now`.
    fn held_by(&self, member: &str, now: Instant) -> bool {
        match &self.lock {
            Some(lock) => {
                self.state == RecordState::Acquired
                    && &*lock.member == member
                    && now < lock.deadline
            }
            None => false,
        }
    }
}

/// Secondary views of the in-flight records, kept in step with every change so that the
/// questions asked on every fetch (how many are acquired, which is the lowest available, which
/// lock expires first) never need a scan of the window, which can be large when a slow record
/// holds the start offset back.
#[derive(Debug, Default)]
struct Index {
    /// Records per state, by `RecordState::slot`.
    counts: [u64; 4],
    /// Offsets of the Available records.
    available: BTreeSet<i64>,
    /// (deadline, offset) of every Acquired record, earliest deadline first.
    locks: BTreeSet<(Instant, i64)>,
    /// The first deadline in `locks`, cached so that `expire` with nothing due is O(1).
    earliest: Option<Instant>,
}

impl Index {
    fn add(&mut self, offset: i64, rec: &InFlight) {
        debug_assert_eq!(
            rec.state == RecordState::Acquired,
            rec.lock.is_some(),
            "offset {offset}: a lock exactly when Acquired"
        );
        self.counts[rec.state.slot()] += 1;
        match (rec.state, &rec.lock) {
            (RecordState::Available, _) => {
                self.available.insert(offset);
            }
            (RecordState::Acquired, Some(lock)) => {
                self.locks.insert((lock.deadline, offset));
                if self.earliest.is_none_or(|e| lock.deadline < e) {
                    self.earliest = Some(lock.deadline);
                }
            }
            _ => {}
        }
    }

    fn remove(&mut self, offset: i64, rec: &InFlight) {
        let count = &mut self.counts[rec.state.slot()];
        debug_assert!(*count > 0, "offset {offset}: removing an uncounted record");
        *count = count.saturating_sub(1);
        match (rec.state, &rec.lock) {
            (RecordState::Available, _) => {
                self.available.remove(&offset);
            }
            (RecordState::Acquired, Some(lock)) => {
                self.locks.remove(&(lock.deadline, offset));
                if self.earliest == Some(lock.deadline) {
                    self.earliest = self.locks.first().map(|&(deadline, _)| deadline);
                }
            }
            _ => {}
        }
    }

    fn acquired(&self) -> u64 {
        self.counts[RecordState::Acquired.slot()]
    }
}

/// The in-flight state of one share group on one topic partition. See the module
/// documentation.
#[derive(Debug)]
pub struct SharePartition {
    config: ShareConfig,
    /// The share-partition start offset (SPSO).
    start: i64,
    /// The share-partition end offset (SPEO).
    end: i64,
    /// One entry per in-flight offset that holds a record; every key is in `[start, end)`, and
    /// the lowest key is `start` (the start offset never rests on a hole or a final record).
    records: BTreeMap<i64, InFlight>,
    index: Index,
}

impl SharePartition {
    /// A share partition starting at `start_offset` (nothing in flight; end_offset =
    /// start_offset).
    pub fn new(start_offset: i64, config: ShareConfig) -> SharePartition {
        SharePartition {
            config,
            start: start_offset,
            end: start_offset,
            records: BTreeMap::new(),
            index: Index::default(),
        }
    }

    /// Rebuilt from persisted state: start offset plus state batches (offsets ≥ start_offset,
    /// sorted, not overlapping). end_offset becomes one past the last batch (or start_offset).
    /// Any `Acquired` in the input is taken as Available, since no member holds a lock on a new
    /// leader.
    ///
    /// The input is read defensively, as it comes from storage: a batch with last < first is
    /// ignored, and offsets below the start offset or already covered by an earlier batch are
    /// skipped. As everywhere, the start offset then moves past leading final records and holes,
    /// so it may come out higher than `start_offset`.
    pub fn restore(
        start_offset: i64,
        batches: &[StateBatch],
        config: ShareConfig,
    ) -> SharePartition {
        let mut partition = SharePartition::new(start_offset, config);
        // One past the last offset taken from the input so far.
        let mut next = start_offset;
        for batch in batches {
            if batch.last_offset < batch.first_offset || batch.last_offset < next {
                continue;
            }
            let first = batch.first_offset.max(next);
            next = batch.last_offset.saturating_add(1);
            let state = match batch.state {
                RecordState::Acquired => RecordState::Available,
                state => state,
            };
            // Final records in front of everything else would only be dropped again when the
            // start offset advances; skipping them here avoids materialising what can be a long
            // acknowledged run.
            if partition.records.is_empty() && state.is_final() {
                continue;
            }
            for offset in first..=batch.last_offset {
                let rec = InFlight {
                    state,
                    delivery_count: batch.delivery_count,
                    lock: None,
                };
                partition.index.add(offset, &rec);
                partition.records.insert(offset, rec);
            }
        }
        partition.end = next;
        partition.advance_start();
        partition
    }

    /// Replaces the limits and timings. They apply from the next operation: existing locks keep
    /// their deadlines, and an Available record already at a lowered delivery limit is archived
    /// when it would next be acquired.
    pub fn set_config(&mut self, config: ShareConfig) {
        self.config = config;
    }

    pub fn config(&self) -> ShareConfig {
        self.config
    }

    pub fn start_offset(&self) -> i64 {
        self.start
    }

    pub fn end_offset(&self) -> i64 {
        self.end
    }

    /// How many records are Acquired now (without expiring locks).
    pub fn acquired_count(&self) -> u64 {
        self.index.acquired()
    }

    /// The state and delivery count of one in-flight offset, or `None` when it is not in flight.
    pub fn record(&self, offset: i64) -> Option<(RecordState, u16)> {
        self.records
            .get(&offset)
            .map(|rec| (rec.state, rec.delivery_count))
    }

    /// The member holding one offset, if it is Acquired (without expiring locks).
    pub fn holder(&self, offset: i64) -> Option<&Rc<str>> {
        self.records
            .get(&offset)
            .and_then(|rec| rec.lock.as_ref())
            .map(|lock| &lock.member)
    }

    /// Where the next read of the log should start: the lowest Available in-flight offset if
    /// any, else end_offset; None when `partition_max_record_locks` records are already Acquired
    /// (nothing more may be acquired until some are acknowledged or released). Expires locks
    /// first (see `expire`).
    pub fn next_fetch_offset(&mut self, now: Instant) -> Option<i64> {
        self.expire(now);
        if self.index.acquired() >= u64::from(self.config.partition_max_record_locks) {
            return None;
        }
        Some(self.index.available.first().copied().unwrap_or(self.end))
    }

    /// `batches`: the (first offset, last offset) of each record batch the shard read from the
    /// log, in order, starting at or before `next_fetch_offset` (a batch may start before it;
    /// offsets below start_offset are skipped). Acquires for `member` every offset in them that
    /// is Available in flight or ≥ end_offset (fresh: it becomes in flight and end_offset moves
    /// to one past it), sets its lock deadline to now + record_lock_duration and increments its
    /// delivery count. Offsets Acquired (by anyone), Acknowledged or Archived are skipped, and an
    /// Available offset already delivered `delivery_count_limit` times (possible after the limit
    /// was lowered) is archived instead of acquired.
    ///
    /// Stops after the batch in which the acquired count reaches `max_records`: whole batches
    /// are taken, so a batch of fresh records is never split across two members. It never lets
    /// more than `partition_max_record_locks` records be Acquired in total, and that limit may
    /// cut within a batch. A `max_records` of 0 acquires nothing.
    ///
    /// Returns the acquired offsets as ranges of consecutive offsets with equal delivery count,
    /// sorted. Expires locks first.
    pub fn acquire(
        &mut self,
        member: &Rc<str>,
        batches: &[(i64, i64)],
        max_records: u32,
        now: Instant,
    ) -> Vec<AcquiredRange> {
        self.expire(now);
        let mut acquired: Vec<AcquiredRange> = Vec::new();
        if max_records == 0 {
            return acquired;
        }
        let deadline = self.lock_deadline(now);
        let lock_limit = u64::from(self.config.partition_max_record_locks);
        let delivery_limit = self.config.delivery_count_limit;
        let mut taken: u64 = 0;
        'batches: for &(first, last) in batches {
            debug_assert!(first <= last, "batch {first}..={last} is inverted");
            if last < self.start {
                continue;
            }
            for offset in first.max(self.start)..=last {
                if self.index.acquired() >= lock_limit {
                    break 'batches;
                }
                let lock = || Lock {
                    member: Rc::clone(member),
                    deadline,
                };
                let delivery_count = match self.records.get_mut(&offset) {
                    Some(rec) => {
                        if rec.state != RecordState::Available {
                            continue;
                        }
                        self.index.remove(offset, rec);
                        if rec.delivery_count >= delivery_limit {
                            rec.state = RecordState::Archived;
                            self.index.add(offset, rec);
                            continue;
                        }
                        rec.state = RecordState::Acquired;
                        rec.delivery_count = rec.delivery_count.saturating_add(1);
                        rec.lock = Some(lock());
                        self.index.add(offset, rec);
                        rec.delivery_count
                    }
                    None => {
                        // Fresh from the log (or, below the end offset, an offset no earlier
                        // read returned, so never delivered either).
                        let rec = InFlight {
                            state: RecordState::Acquired,
                            delivery_count: 1,
                            lock: Some(lock()),
                        };
                        self.index.add(offset, &rec);
                        self.records.insert(offset, rec);
                        if offset >= self.end {
                            self.end = offset.saturating_add(1);
                        }
                        1
                    }
                };
                taken += 1;
                match acquired.last_mut() {
                    Some(range)
                        if range.last_offset.checked_add(1) == Some(offset)
                            && range.delivery_count == delivery_count =>
                    {
                        range.last_offset = offset;
                    }
                    _ => acquired.push(AcquiredRange {
                        first_offset: offset,
                        last_offset: offset,
                        delivery_count,
                    }),
                }
            }
            if taken >= u64::from(max_records) {
                break;
            }
        }
        // Archiving can free the start offset, and the first records acquired into an empty
        // window may lie past a hole that the start offset has to step over.
        self.advance_start();
        acquired
    }

    /// Archives the records of one batch the shard read but must never deliver (a control
    /// batch, or under read_committed the records of an aborted transaction), so that the end
    /// and start offsets move past them instead of stopping there. Available in-flight offsets
    /// in `first..=last` become Archived, and fresh ones become in-flight Archived records (with
    /// delivery count 0) as the end offset moves past them; offsets Acquired, Acknowledged or
    /// Archived are left alone, and offsets below the start offset are ignored.
    ///
    /// Fresh offsets are only archived when the range starts at or below the end offset: a
    /// range further up may have unacquired records between the end offset and itself, which
    /// the end offset must not step over (it is left for a later read, which reaches it once
    /// those are acquired). Returns how many offsets were archived.
    pub fn skip(&mut self, first_offset: i64, last_offset: i64) -> usize {
        let first = first_offset.max(self.start);
        if last_offset < first || first > self.end {
            return 0;
        }
        let mut archived = 0;
        for offset in first..=last_offset {
            match self.records.get_mut(&offset) {
                Some(rec) => {
                    if rec.state == RecordState::Available {
                        self.index.remove(offset, rec);
                        rec.state = RecordState::Archived;
                        self.index.add(offset, rec);
                        archived += 1;
                    }
                }
                None => {
                    let rec = InFlight {
                        state: RecordState::Archived,
                        delivery_count: 0,
                        lock: None,
                    };
                    self.index.add(offset, &rec);
                    self.records.insert(offset, rec);
                    if offset >= self.end {
                        self.end = offset.saturating_add(1);
                    }
                    archived += 1;
                }
            }
        }
        self.advance_start();
        archived
    }

    /// Applies one acknowledgement batch of `member`: offsets first..=last, `types` either one
    /// type for the whole range or one per offset. Every offset must be Acquired by `member` with
    /// its lock not expired at `now` (a lock whose deadline is `now` has expired); otherwise the
    /// first offending offset is reported and nothing changes, because everything is validated
    /// before anything is applied. Accept → Acknowledged; Release → Available, or Archived when
    /// its delivery_count ≥ delivery_count_limit; Reject and Gap → Archived; Renew → the lock
    /// deadline becomes now + record_lock_duration (state unchanged). Then the start offset
    /// moves past every leading Acknowledged/Archived offset, and those are forgotten.
    ///
    /// Expired locks are expired first, as in every operation. That is not a change made by the
    /// acknowledgement (the records would have become Available at their deadline anyway), and it
    /// makes an acknowledgement that arrives too late fail for its holder, who no longer holds
    /// the records.
    pub fn acknowledge(
        &mut self,
        member: &str,
        first_offset: i64,
        last_offset: i64,
        types: &[AckType],
        now: Instant,
    ) -> Result<(), AckError> {
        if last_offset < first_offset {
            return Err(AckError::InvalidRequest(format!(
                "last offset {last_offset} is below first offset {first_offset}"
            )));
        }
        // i128, because the span of two arbitrary i64 offsets may not fit an i64.
        let span = i128::from(last_offset) - i128::from(first_offset) + 1;
        if types.len() != 1 && i128::try_from(types.len()).ok() != Some(span) {
            return Err(AckError::InvalidRequest(format!(
                "{} acknowledge types for {span} offsets {first_offset}..={last_offset}",
                types.len()
            )));
        }
        self.expire(now);

        // Validate the whole range before changing anything. Walking the in-flight entries of
        // the range (rather than every offset in it) keeps a huge bogus range cheap to refuse.
        let mut expected = i128::from(first_offset);
        for (&offset, rec) in self.records.range(first_offset..=last_offset) {
            if i128::from(offset) != expected {
                return Err(AckError::InvalidRecordState {
                    offset: Self::offset_within(expected, last_offset),
                });
            }
            if !rec.held_by(member, now) {
                return Err(AckError::InvalidRecordState { offset });
            }
            expected += 1;
        }
        if expected <= i128::from(last_offset) {
            return Err(AckError::InvalidRecordState {
                offset: Self::offset_within(expected, last_offset),
            });
        }

        let deadline = self.lock_deadline(now);
        let delivery_limit = self.config.delivery_count_limit;
        // The length check above leaves either one type or exactly one per offset (at least
        // one, as last ≥ first).
        let per_offset = types.len() != 1;
        for (i, (&offset, rec)) in self
            .records
            .range_mut(first_offset..=last_offset)
            .enumerate()
        {
            // The range was validated to be contiguous, so the i-th entry is offset first + i.
            let ack = if per_offset { types[i] } else { types[0] };
            self.index.remove(offset, rec);
            match ack {
                AckType::Accept => {
                    rec.state = RecordState::Acknowledged;
                    rec.lock = None;
                }
                AckType::Release => rec.unlock(delivery_limit),
                AckType::Reject | AckType::Gap => {
                    rec.state = RecordState::Archived;
                    rec.lock = None;
                }
                AckType::Renew => {
                    if let Some(lock) = rec.lock.as_mut() {
                        lock.deadline = deadline;
                    }
                }
            }
            self.index.add(offset, rec);
        }
        self.advance_start();
        Ok(())
    }

    /// Everything `member` holds becomes Available again (Archived when at the delivery limit):
    /// a member that left, or whose share session closed. Returns how many records.
    pub fn release_member(&mut self, member: &str) -> usize {
        // The lock index holds only the Acquired records, at most partition_max_record_locks of
        // them, so this does not walk the whole window.
        let offsets: Vec<i64> = self
            .index
            .locks
            .iter()
            .filter(|&&(_, offset)| {
                self.records
                    .get(&offset)
                    .and_then(|rec| rec.lock.as_ref())
                    .is_some_and(|lock| &*lock.member == member)
            })
            .map(|&(_, offset)| offset)
            .collect();
        for &offset in &offsets {
            self.unlock(offset);
        }
        if !offsets.is_empty() {
            self.advance_start();
        }
        offsets.len()
    }

    /// Locks past their deadline at `now` (a deadline equal to `now` has passed): those records
    /// become Available (Archived at the delivery limit). Returns how many. O(1) when nothing
    /// expired, thanks to the cached earliest deadline.
    pub fn expire(&mut self, now: Instant) -> usize {
        match self.index.earliest {
            Some(earliest) if earliest <= now => {}
            _ => return 0,
        }
        let mut expired = 0;
        while let Some(&(deadline, offset)) = self.index.locks.first() {
            if deadline > now {
                break;
            }
            self.unlock(offset);
            expired += 1;
        }
        self.advance_start();
        expired
    }

    /// The earliest lock deadline, if any record is Acquired (for the shard's timer).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.index.earliest
    }

    /// Moves the start offset (share.auto.offset.reset, AlterShareGroupOffsets, or the log start
    /// moving past it after retention/DeleteRecords): in-flight state below the new start is
    /// dropped, locks included; if the new start is ≥ end_offset the partition restarts there
    /// empty.
    ///
    /// Moving it below the current start offset also restarts the partition empty at the new
    /// start: everything from there on is delivered again as fresh records, which is what
    /// rewinding a share group's offset asks for. A caller following the log start should
    /// therefore only call this when the log start is above `start_offset`.
    pub fn reset_start(&mut self, start_offset: i64) {
        if start_offset < self.start || start_offset >= self.end {
            self.records.clear();
            self.index = Index::default();
            self.start = start_offset;
            self.end = start_offset;
            return;
        }
        while let Some(entry) = self.records.first_entry() {
            if *entry.key() >= start_offset {
                break;
            }
            let (offset, rec) = entry.remove_entry();
            self.index.remove(offset, &rec);
        }
        self.start = start_offset;
        self.advance_start();
    }

    /// (available, acquired, acknowledged, archived) counts of in-flight records.
    pub fn in_flight_counts(&self) -> (u64, u64, u64, u64) {
        let [available, acquired, acknowledged, archived] = self.index.counts;
        (available, acquired, acknowledged, archived)
    }

    /// The in-flight state as StateBatches (runs merged), for persisting. Acquired records come
    /// out as Available with their current delivery count: the acquisition already counted as a
    /// delivery, and a new leader must deliver them again.
    pub fn state_batches(&self) -> Vec<StateBatch> {
        let mut batches: Vec<StateBatch> = Vec::new();
        for (&offset, rec) in &self.records {
            let state = match rec.state {
                RecordState::Acquired => RecordState::Available,
                state => state,
            };
            match batches.last_mut() {
                Some(batch)
                    if batch.last_offset.checked_add(1) == Some(offset)
                        && batch.state == state
                        && batch.delivery_count == rec.delivery_count =>
                {
                    batch.last_offset = offset;
                }
                _ => batches.push(StateBatch {
                    first_offset: offset,
                    last_offset: offset,
                    state,
                    delivery_count: rec.delivery_count,
                }),
            }
        }
        batches
    }

    /// Ends the lock on one Acquired record (see `InFlight::unlock`).
    fn unlock(&mut self, offset: i64) {
        let rec = self
            .records
            .get_mut(&offset)
            .expect("every entry of the lock index is an in-flight record");
        self.index.remove(offset, rec);
        rec.unlock(self.config.delivery_count_limit);
        self.index.add(offset, rec);
    }

    /// Drops the leading final records and moves the start offset to the lowest remaining
    /// in-flight offset, stepping over holes, or to the end offset when nothing is left.
    fn advance_start(&mut self) {
        while let Some(entry) = self.records.first_entry() {
            if !entry.get().state.is_final() {
                debug_assert!(*entry.key() >= self.start, "in-flight offset below start");
                self.start = *entry.key();
                self.debug_check_bounds();
                return;
            }
            let (offset, rec) = entry.remove_entry();
            self.index.remove(offset, &rec);
        }
        self.start = self.end;
    }

    /// now + record_lock_duration, or the latest deadline `Instant` can represent should an
    /// absurd duration overflow it.
    fn lock_deadline(&self, now: Instant) -> Instant {
        let mut duration = self.config.record_lock_duration;
        loop {
            if let Some(deadline) = now.checked_add(duration) {
                return deadline;
            }
            duration /= 2;
        }
    }

    /// `expected`, known to lie in `[first, last]` of an acknowledgement, as an offset.
    fn offset_within(expected: i128, last_offset: i64) -> i64 {
        i64::try_from(expected.min(i128::from(last_offset)))
            .expect("an offset between two i64 offsets fits an i64")
    }

    /// The cheap part of the invariant: every key in `[start, end)`.
    fn debug_check_bounds(&self) {
        debug_assert!(
            self.records
                .first_key_value()
                .is_none_or(|(&first, _)| first >= self.start),
            "an in-flight offset below the start offset {}",
            self.start
        );
        debug_assert!(
            self.records
                .last_key_value()
                .is_none_or(|(&last, _)| last < self.end),
            "an in-flight offset at or above the end offset {}",
            self.end
        );
        debug_assert!(self.start <= self.end, "start offset above end offset");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::HashMap;

    const MS: Duration = Duration::from_millis(1);

    fn config() -> ShareConfig {
        ShareConfig {
            record_lock_duration: Duration::from_millis(100),
            delivery_count_limit: 3,
            partition_max_record_locks: 100,
        }
    }

    fn member(name: &str) -> Rc<str> {
        Rc::from(name)
    }

    fn range(first_offset: i64, last_offset: i64, delivery_count: u16) -> AcquiredRange {
        AcquiredRange {
            first_offset,
            last_offset,
            delivery_count,
        }
    }

    fn batch(
        first_offset: i64,
        last_offset: i64,
        state: RecordState,
        delivery_count: u16,
    ) -> StateBatch {
        StateBatch {
            first_offset,
            last_offset,
            state,
            delivery_count,
        }
    }

    /// Every invariant, checked by scanning (the implementation itself only checks the cheap
    /// ones).
    fn check_invariants(sp: &SharePartition) {
        assert!(sp.start <= sp.end, "start {} > end {}", sp.start, sp.end);
        match sp.records.first_key_value() {
            Some((&first, _)) => assert_eq!(first, sp.start, "start is the lowest in-flight"),
            None => assert_eq!(sp.start, sp.end, "empty window has start == end"),
        }
        if let Some((&last, _)) = sp.records.last_key_value() {
            assert!(last < sp.end, "offset {last} at or above end {}", sp.end);
        }
        let mut counts = [0u64; 4];
        let mut available = BTreeSet::new();
        let mut locks = BTreeSet::new();
        for (&offset, rec) in &sp.records {
            counts[rec.state.slot()] += 1;
            assert_eq!(rec.state == RecordState::Acquired, rec.lock.is_some());
            match rec.state {
                RecordState::Available => {
                    available.insert(offset);
                }
                RecordState::Acquired => {
                    let lock = rec.lock.as_ref().expect("checked above");
                    locks.insert((lock.deadline, offset));
                }
                _ => {}
            }
        }
        assert_eq!(sp.index.counts, counts);
        assert_eq!(sp.index.available, available);
        assert_eq!(sp.index.locks, locks);
        assert_eq!(sp.index.earliest, locks.first().map(|&(d, _)| d));
        let (a, b, c, d) = sp.in_flight_counts();
        assert_eq!(a + b + c + d, sp.records.len() as u64);
    }

    #[test]
    fn wire_values_match_kafka() {
        for v in 0..=4 {
            let ack = AckType::from_wire(v).expect("defined");
            assert_eq!(ack.wire(), v);
        }
        assert_eq!(AckType::from_wire(1), Some(AckType::Accept));
        assert_eq!(AckType::from_wire(4), Some(AckType::Renew));
        assert_eq!(AckType::from_wire(5), None);
        assert_eq!(AckType::from_wire(-1), None);
        assert_eq!(RecordState::Available.wire(), 0);
        assert_eq!(RecordState::Acquired.wire(), 1);
        assert_eq!(RecordState::Acknowledged.wire(), 2);
        assert_eq!(RecordState::Archived.wire(), 4);
        assert_eq!(RecordState::from_wire(3), None);
        for state in [
            RecordState::Available,
            RecordState::Acquired,
            RecordState::Acknowledged,
            RecordState::Archived,
        ] {
            assert_eq!(RecordState::from_wire(state.wire()), Some(state));
        }
    }

    #[test]
    fn new_partition_is_empty_and_fetches_from_its_start() {
        let now = Instant::now();
        let mut sp = SharePartition::new(42, config());
        assert_eq!((sp.start_offset(), sp.end_offset()), (42, 42));
        assert_eq!(sp.next_fetch_offset(now), Some(42));
        assert_eq!(sp.in_flight_counts(), (0, 0, 0, 0));
        assert_eq!(sp.next_deadline(), None);
        assert!(sp.state_batches().is_empty());
        check_invariants(&sp);
    }

    #[test]
    fn fresh_records_are_acquired_in_whole_batches_and_move_the_end_offset() {
        let now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(0, config());
        let got = sp.acquire(&m, &[(0, 4), (5, 9)], 100, now);
        assert_eq!(got, vec![range(0, 9, 1)]);
        assert_eq!((sp.start_offset(), sp.end_offset()), (0, 10));
        assert_eq!(sp.in_flight_counts(), (0, 10, 0, 0));
        assert_eq!(sp.next_deadline(), Some(now + 100 * MS));
        assert_eq!(sp.holder(3).map(|h| &**h), Some("a"));
        assert_eq!(sp.next_fetch_offset(now), Some(10));
        check_invariants(&sp);
    }

    #[test]
    fn max_records_keeps_whole_batches() {
        let now = Instant::now();
        let m = member("a");
        let batches = [(0, 4), (5, 9), (10, 14)];

        // The first batch reaches 3, so the acquisition stops after it, with all five records.
        let mut sp = SharePartition::new(0, config());
        assert_eq!(sp.acquire(&m, &batches, 3, now), vec![range(0, 4, 1)]);
        assert_eq!(sp.end_offset(), 5);

        // Exactly reaching max_records at a batch boundary stops there too.
        let mut sp = SharePartition::new(0, config());
        assert_eq!(sp.acquire(&m, &batches, 5, now), vec![range(0, 4, 1)]);

        // One more takes the whole next batch.
        let mut sp = SharePartition::new(0, config());
        assert_eq!(sp.acquire(&m, &batches, 6, now), vec![range(0, 9, 1)]);
        assert_eq!(sp.end_offset(), 10);

        // Zero asks for nothing.
        let mut sp = SharePartition::new(0, config());
        assert!(sp.acquire(&m, &batches, 0, now).is_empty());
        assert_eq!(sp.end_offset(), 0);
        check_invariants(&sp);
    }

    #[test]
    fn a_fresh_batch_is_not_split_across_members() {
        let now = Instant::now();
        let (a, b) = (member("a"), member("b"));
        let mut sp = SharePartition::new(0, config());
        assert_eq!(
            sp.acquire(&a, &[(0, 4), (5, 9)], 1, now),
            vec![range(0, 4, 1)]
        );
        let from = sp.next_fetch_offset(now).expect("below the lock limit");
        assert_eq!(from, 5);
        assert_eq!(sp.acquire(&b, &[(5, 9)], 1, now), vec![range(5, 9, 1)]);
        assert_eq!(sp.holder(4).map(|h| &**h), Some("a"));
        assert_eq!(sp.holder(5).map(|h| &**h), Some("b"));
        check_invariants(&sp);
    }

    #[test]
    fn acquire_skips_offsets_below_the_start_offset() {
        let now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(7, config());
        // The batch holding the start offset begins before it; a batch wholly below is ignored.
        let got = sp.acquire(&m, &[(0, 3), (4, 9), (10, 11)], 100, now);
        assert_eq!(got, vec![range(7, 11, 1)]);
        assert_eq!((sp.start_offset(), sp.end_offset()), (7, 12));
        assert_eq!(sp.record(6), None);
        check_invariants(&sp);
    }

    #[test]
    fn offsets_between_batches_never_become_in_flight() {
        let now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(0, config());
        // 5..=9 were compacted away as whole batches: the read simply does not return them.
        let got = sp.acquire(&m, &[(0, 4), (10, 14)], 100, now);
        assert_eq!(got, vec![range(0, 4, 1), range(10, 14, 1)]);
        assert_eq!(sp.end_offset(), 15);
        assert_eq!(sp.record(7), None);
        assert_eq!(sp.in_flight_counts(), (0, 10, 0, 0));
        // Acknowledging offsets that hold no record is refused.
        assert_eq!(
            sp.acknowledge("a", 4, 10, &[AckType::Accept], now),
            Err(AckError::InvalidRecordState { offset: 5 })
        );
        // Once the records below the hole are done, the start offset steps over it.
        sp.acknowledge("a", 0, 4, &[AckType::Accept], now)
            .expect("held by a");
        assert_eq!(sp.start_offset(), 10);
        assert_eq!(
            sp.state_batches(),
            vec![batch(10, 14, RecordState::Available, 1)]
        );
        check_invariants(&sp);
    }

    #[test]
    fn a_hole_inside_a_batch_is_acquired_and_can_be_gap_acknowledged() {
        let now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(0, config());
        // The batch spans 0..=9 but compaction left records only at 0..=2 and 8..=9: the bounds
        // are all the state machine sees, so the whole span is acquired.
        assert_eq!(sp.acquire(&m, &[(0, 9)], 100, now), vec![range(0, 9, 1)]);
        sp.acknowledge("a", 0, 2, &[AckType::Accept], now)
            .expect("held");
        sp.acknowledge("a", 3, 7, &[AckType::Gap], now)
            .expect("held");
        assert_eq!(sp.start_offset(), 8);
        assert_eq!(sp.in_flight_counts(), (0, 2, 0, 0));
        sp.acknowledge("a", 8, 9, &[AckType::Accept], now)
            .expect("held");
        assert_eq!((sp.start_offset(), sp.end_offset()), (10, 10));
        assert_eq!(sp.in_flight_counts(), (0, 0, 0, 0));
        check_invariants(&sp);
    }

    #[test]
    fn released_record_is_acquired_again_with_a_higher_delivery_count() {
        let now = Instant::now();
        let (a, b) = (member("a"), member("b"));
        let mut sp = SharePartition::new(0, config());
        sp.acquire(&a, &[(0, 4)], 100, now);
        sp.acknowledge("a", 2, 3, &[AckType::Release], now)
            .expect("held");
        assert_eq!(sp.record(2), Some((RecordState::Available, 1)));
        assert_eq!(sp.next_fetch_offset(now), Some(2));
        // The read starts at the batch holding offset 2; only the released ones are taken.
        let got = sp.acquire(&b, &[(0, 4), (5, 6)], 100, now);
        assert_eq!(got, vec![range(2, 3, 2), range(5, 6, 1)]);
        assert_eq!(sp.holder(2).map(|h| &**h), Some("b"));
        assert_eq!(sp.holder(0).map(|h| &**h), Some("a"));
        check_invariants(&sp);
    }

    #[test]
    fn records_held_by_others_or_done_are_skipped() {
        let now = Instant::now();
        let (a, b) = (member("a"), member("b"));
        let mut sp = SharePartition::new(0, config());
        sp.acquire(&a, &[(0, 5)], 100, now);
        sp.acknowledge("a", 0, 5, &[AckType::Release], now)
            .expect("held");
        sp.acquire(&a, &[(0, 1)], 100, now);
        sp.acknowledge("a", 0, 0, &[AckType::Accept], now)
            .expect("held");
        sp.acquire(&a, &[(2, 2)], 100, now);
        sp.acknowledge("a", 2, 2, &[AckType::Reject], now)
            .expect("held");
        // 0 acknowledged (and forgotten), 1 held by a, 2 archived, 3..=5 available.
        assert_eq!(sp.start_offset(), 1);
        let got = sp.acquire(&b, &[(0, 5)], 100, now);
        assert_eq!(got, vec![range(3, 5, 2)]);
        assert_eq!(sp.holder(1).map(|h| &**h), Some("a"));
        check_invariants(&sp);
    }

    #[test]
    fn release_at_the_delivery_limit_archives() {
        let mut now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(0, config()); // delivery_count_limit 3
        for delivery in 1..=3 {
            assert_eq!(
                sp.acquire(&m, &[(0, 1)], 100, now),
                vec![range(0, 1, delivery)]
            );
            sp.acknowledge("a", 1, 1, &[AckType::Release], now)
                .expect("held");
            if delivery < 3 {
                sp.acknowledge("a", 0, 0, &[AckType::Release], now)
                    .expect("held");
            }
            now += MS;
        }
        // Offset 1 was released at its third delivery: archived, never delivered again.
        assert_eq!(sp.record(1), Some((RecordState::Archived, 3)));
        assert_eq!(sp.start_offset(), 0);
        // Offset 0, released by its holder leaving at the limit, is archived too, and the start
        // offset passes both.
        assert_eq!(sp.release_member("a"), 1);
        assert_eq!((sp.start_offset(), sp.end_offset()), (2, 2));
        assert!(sp.acquire(&m, &[(0, 1)], 100, now).is_empty());
        check_invariants(&sp);
    }

    #[test]
    fn expired_lock_makes_the_record_available_again() {
        let now = Instant::now();
        let (a, b) = (member("a"), member("b"));
        let mut sp = SharePartition::new(0, config());
        sp.acquire(&a, &[(0, 2)], 100, now);
        sp.acquire(&a, &[(3, 4)], 100, now + 50 * MS);
        assert_eq!(sp.next_deadline(), Some(now + 100 * MS));
        assert_eq!(sp.expire(now + 99 * MS), 0);
        // A deadline equal to now has passed.
        assert_eq!(sp.expire(now + 100 * MS), 3);
        assert_eq!(sp.next_deadline(), Some(now + 150 * MS));
        assert_eq!(sp.in_flight_counts(), (3, 2, 0, 0));
        assert_eq!(sp.next_fetch_offset(now + 100 * MS), Some(0));
        let got = sp.acquire(&b, &[(0, 4)], 100, now + 120 * MS);
        assert_eq!(got, vec![range(0, 2, 2)]);
        // Acquiring expires first: 3..=4 become available at 150 ms and b takes them.
        let got = sp.acquire(&b, &[(3, 4)], 100, now + 150 * MS);
        assert_eq!(got, vec![range(3, 4, 2)]);
        check_invariants(&sp);
    }

    #[test]
    fn expiry_at_the_delivery_limit_archives() {
        let mut now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(0, config());
        for _ in 0..3 {
            assert_eq!(sp.acquire(&m, &[(0, 0)], 100, now).len(), 1);
            now += 100 * MS;
            assert_eq!(sp.expire(now), 1);
        }
        assert_eq!((sp.start_offset(), sp.end_offset()), (1, 1));
        assert_eq!(sp.in_flight_counts(), (0, 0, 0, 0));
        check_invariants(&sp);
    }

    #[test]
    fn ack_after_lock_expiry_is_refused() {
        let now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(0, config());
        sp.acquire(&m, &[(0, 4)], 100, now);
        assert_eq!(
            sp.acknowledge("a", 0, 4, &[AckType::Accept], now + 100 * MS),
            Err(AckError::InvalidRecordState { offset: 0 })
        );
        assert_eq!(sp.in_flight_counts(), (5, 0, 0, 0));
        assert_eq!(sp.record(0), Some((RecordState::Available, 1)));
        check_invariants(&sp);
    }

    #[test]
    fn ack_just_before_the_deadline_is_accepted() {
        let now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(0, config());
        sp.acquire(&m, &[(0, 4)], 100, now);
        sp.acknowledge("a", 0, 4, &[AckType::Accept], now + 99 * MS)
            .expect("lock still valid");
        assert_eq!((sp.start_offset(), sp.end_offset()), (5, 5));
        check_invariants(&sp);
    }

    #[test]
    fn ack_for_a_range_partly_owned_by_another_member_fails_whole() {
        let now = Instant::now();
        let (a, b) = (member("a"), member("b"));
        let mut sp = SharePartition::new(0, config());
        sp.acquire(&a, &[(0, 4)], 1, now);
        sp.acquire(&b, &[(5, 9)], 1, now);
        let before = sp.state_batches();
        let counts = sp.in_flight_counts();
        assert_eq!(
            sp.acknowledge("a", 3, 6, &[AckType::Accept], now),
            Err(AckError::InvalidRecordState { offset: 5 })
        );
        // Nothing changed, not even the offsets a does hold.
        assert_eq!(sp.state_batches(), before);
        assert_eq!(sp.in_flight_counts(), counts);
        assert_eq!(sp.holder(3).map(|h| &**h), Some("a"));
        assert_eq!(sp.start_offset(), 0);
        check_invariants(&sp);
    }

    #[test]
    fn ack_of_records_not_held_is_refused() {
        let now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(0, config());
        // Nothing in flight at all.
        assert_eq!(
            sp.acknowledge("a", 0, 0, &[AckType::Accept], now),
            Err(AckError::InvalidRecordState { offset: 0 })
        );
        sp.acquire(&m, &[(0, 4)], 100, now);
        // Beyond the end offset.
        assert_eq!(
            sp.acknowledge("a", 3, 5, &[AckType::Accept], now),
            Err(AckError::InvalidRecordState { offset: 5 })
        );
        // Twice: the second time 2 is Acknowledged, no longer Acquired.
        sp.acknowledge("a", 2, 2, &[AckType::Accept], now)
            .expect("held");
        assert_eq!(
            sp.acknowledge("a", 2, 2, &[AckType::Accept], now),
            Err(AckError::InvalidRecordState { offset: 2 })
        );
        // Released records are no longer the member's.
        sp.acknowledge("a", 1, 1, &[AckType::Release], now)
            .expect("held");
        assert_eq!(
            sp.acknowledge("a", 1, 1, &[AckType::Accept], now),
            Err(AckError::InvalidRecordState { offset: 1 })
        );
        // A huge bogus range is refused (cheaply) at its first offset with no record.
        assert_eq!(
            sp.acknowledge("a", 3, i64::MAX, &[AckType::Accept], now),
            Err(AckError::InvalidRecordState { offset: 5 })
        );
        // Below the start offset.
        sp.acknowledge("a", 0, 0, &[AckType::Accept], now)
            .expect("held");
        assert_eq!(sp.start_offset(), 1);
        assert_eq!(
            sp.acknowledge("a", 0, 0, &[AckType::Accept], now),
            Err(AckError::InvalidRecordState { offset: 0 })
        );
        check_invariants(&sp);
    }

    #[test]
    fn malformed_acks_are_invalid_requests() {
        let now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(0, config());
        sp.acquire(&m, &[(0, 4)], 100, now);
        let before = sp.state_batches();
        assert!(matches!(
            sp.acknowledge("a", 3, 2, &[AckType::Accept], now),
            Err(AckError::InvalidRequest(_))
        ));
        assert!(matches!(
            sp.acknowledge("a", 0, 4, &[], now),
            Err(AckError::InvalidRequest(_))
        ));
        assert!(matches!(
            sp.acknowledge("a", 0, 4, &[AckType::Accept, AckType::Reject], now),
            Err(AckError::InvalidRequest(_))
        ));
        assert!(matches!(
            sp.acknowledge("a", i64::MIN, i64::MAX, &[AckType::Accept; 2], now),
            Err(AckError::InvalidRequest(_))
        ));
        assert_eq!(sp.state_batches(), before);
        assert_eq!(sp.in_flight_counts(), (0, 5, 0, 0));
    }

    #[test]
    fn per_offset_types_apply_to_their_own_offsets() {
        let now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(0, config());
        sp.acquire(&m, &[(0, 4)], 100, now);
        let types = [
            AckType::Accept,
            AckType::Release,
            AckType::Reject,
            AckType::Gap,
            AckType::Renew,
        ];
        sp.acknowledge("a", 0, 4, &types, now + 10 * MS)
            .expect("held");
        assert_eq!(sp.start_offset(), 1);
        assert_eq!(sp.record(1), Some((RecordState::Available, 1)));
        assert_eq!(sp.record(2), Some((RecordState::Archived, 1)));
        assert_eq!(sp.record(3), Some((RecordState::Archived, 1)));
        assert_eq!(sp.record(4), Some((RecordState::Acquired, 1)));
        assert_eq!(sp.next_deadline(), Some(now + 110 * MS));
        check_invariants(&sp);
    }

    #[test]
    fn renew_extends_the_lock() {
        let now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(0, config());
        sp.acquire(&m, &[(0, 4)], 100, now);
        sp.acknowledge("a", 0, 1, &[AckType::Renew], now + 80 * MS)
            .expect("held");
        assert_eq!(sp.next_deadline(), Some(now + 100 * MS));
        assert_eq!(sp.expire(now + 100 * MS), 3);
        assert_eq!(sp.next_deadline(), Some(now + 180 * MS));
        assert_eq!(sp.record(0), Some((RecordState::Acquired, 1)));
        sp.acknowledge("a", 0, 1, &[AckType::Accept], now + 170 * MS)
            .expect("renewed lock still valid");
        assert_eq!(sp.start_offset(), 2);
        assert_eq!(sp.next_deadline(), None);
        check_invariants(&sp);
    }

    #[test]
    fn start_offset_advances_past_leading_done_records_only() {
        let now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(0, config());
        sp.acquire(&m, &[(0, 9)], 100, now);
        sp.acknowledge("a", 0, 1, &[AckType::Accept], now)
            .expect("held");
        sp.acknowledge("a", 2, 2, &[AckType::Release], now)
            .expect("held");
        sp.acknowledge("a", 3, 5, &[AckType::Reject], now)
            .expect("held");
        // The Available hole at 2 stops the start offset.
        assert_eq!(sp.start_offset(), 2);
        assert_eq!(sp.in_flight_counts(), (1, 4, 0, 3));
        sp.acknowledge("a", 7, 9, &[AckType::Accept], now)
            .expect("held");
        assert_eq!(sp.start_offset(), 2);
        // Once 2 is done, the start moves up to the still Acquired 6.
        sp.acquire(&m, &[(0, 9)], 100, now);
        sp.acknowledge("a", 2, 2, &[AckType::Accept], now)
            .expect("held");
        assert_eq!(sp.start_offset(), 6);
        sp.acknowledge("a", 6, 6, &[AckType::Accept], now)
            .expect("held");
        assert_eq!((sp.start_offset(), sp.end_offset()), (10, 10));
        assert_eq!(sp.in_flight_counts(), (0, 0, 0, 0));
        check_invariants(&sp);
    }

    #[test]
    fn skipped_control_batch_is_archived_and_passed() {
        let now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(0, config());
        assert_eq!(sp.acquire(&m, &[(0, 4)], 100, now), vec![range(0, 4, 1)]);
        // The commit marker right after the data.
        assert_eq!(sp.skip(5, 5), 1);
        assert_eq!(sp.end_offset(), 6);
        assert_eq!(sp.record(5), Some((RecordState::Archived, 0)));
        assert_eq!(sp.next_fetch_offset(now), Some(6));
        sp.acknowledge("a", 0, 4, &[AckType::Accept], now)
            .expect("held");
        assert_eq!((sp.start_offset(), sp.end_offset()), (6, 6));
        // A marker alone in an empty window is passed without anything left in flight.
        assert_eq!(sp.skip(6, 6), 1);
        assert_eq!((sp.start_offset(), sp.end_offset()), (7, 7));
        assert_eq!(sp.in_flight_counts(), (0, 0, 0, 0));
        check_invariants(&sp);
    }

    #[test]
    fn skip_archives_available_records_but_not_acquired_ones() {
        let now = Instant::now();
        let (a, b) = (member("a"), member("b"));
        let mut sp = SharePartition::new(0, config());
        sp.acquire(&a, &[(0, 5)], 100, now);
        sp.acknowledge("a", 0, 2, &[AckType::Release], now)
            .expect("held");
        sp.acquire(&b, &[(1, 1)], 100, now);
        assert_eq!(sp.skip(0, 7), 4); // 0 and 2 in flight, 6 and 7 fresh
        assert_eq!(sp.record(1), Some((RecordState::Acquired, 2)));
        assert_eq!(sp.record(3), Some((RecordState::Acquired, 1)));
        assert_eq!((sp.start_offset(), sp.end_offset()), (1, 8));
        assert_eq!(sp.next_fetch_offset(now), Some(8));
        check_invariants(&sp);
    }

    #[test]
    fn skip_beyond_unacquired_records_leaves_them_to_a_later_read() {
        let now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(0, config());
        // The read held data 0..=4 and 5..=9 and a marker at 10, but max_records stopped the
        // acquisition after the first batch: 5..=9 must not be stepped over.
        assert_eq!(
            sp.acquire(&m, &[(0, 4), (5, 9)], 1, now),
            vec![range(0, 4, 1)]
        );
        assert_eq!(sp.skip(10, 10), 0);
        assert_eq!(sp.end_offset(), 5);
        assert_eq!(sp.next_fetch_offset(now), Some(5));
        assert_eq!(sp.acquire(&m, &[(5, 9)], 1, now), vec![range(5, 9, 1)]);
        assert_eq!(sp.skip(10, 10), 1);
        assert_eq!(sp.end_offset(), 11);
        check_invariants(&sp);
    }

    #[test]
    fn lock_limit_cuts_within_a_batch_and_stops_fetching() {
        let now = Instant::now();
        let (a, b) = (member("a"), member("b"));
        let mut sp = SharePartition::new(
            0,
            ShareConfig {
                partition_max_record_locks: 3,
                ..config()
            },
        );
        assert_eq!(sp.acquire(&a, &[(0, 4)], 100, now), vec![range(0, 2, 1)]);
        assert_eq!(sp.end_offset(), 3);
        assert_eq!(sp.next_fetch_offset(now), None);
        assert!(sp.acquire(&b, &[(3, 4)], 100, now).is_empty());
        sp.acknowledge("a", 0, 0, &[AckType::Accept], now)
            .expect("held");
        assert_eq!(sp.next_fetch_offset(now), Some(3));
        // The rest of the batch went to another member: the limit may split a batch.
        assert_eq!(sp.acquire(&b, &[(0, 4)], 100, now), vec![range(3, 3, 1)]);
        assert_eq!(sp.next_fetch_offset(now), None);
        // Expiry frees the locks.
        assert_eq!(sp.next_fetch_offset(now + 100 * MS), Some(1));
        check_invariants(&sp);
    }

    #[test]
    fn lowering_the_lock_limit_blocks_fetching_until_below_it() {
        let now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(0, config());
        sp.acquire(&m, &[(0, 9)], 100, now);
        sp.set_config(ShareConfig {
            partition_max_record_locks: 5,
            ..config()
        });
        assert_eq!(sp.next_fetch_offset(now), None);
        sp.acknowledge("a", 0, 5, &[AckType::Accept], now)
            .expect("held");
        assert_eq!(sp.next_fetch_offset(now), Some(10));
    }

    #[test]
    fn available_record_at_a_lowered_delivery_limit_is_archived_not_redelivered() {
        let now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(0, config());
        sp.acquire(&m, &[(0, 1)], 100, now);
        sp.acknowledge("a", 0, 1, &[AckType::Release], now)
            .expect("held");
        sp.acquire(&m, &[(0, 0)], 100, now);
        sp.acknowledge("a", 0, 0, &[AckType::Release], now)
            .expect("held");
        sp.set_config(ShareConfig {
            delivery_count_limit: 2,
            ..config()
        });
        // 0 was delivered twice (now the limit) and is archived; 1 was delivered once.
        assert_eq!(sp.acquire(&m, &[(0, 1)], 100, now), vec![range(1, 1, 2)]);
        assert_eq!(sp.start_offset(), 1);
        check_invariants(&sp);
    }

    #[test]
    fn release_member_frees_only_that_members_records() {
        let now = Instant::now();
        let (a, b) = (member("a"), member("b"));
        let mut sp = SharePartition::new(0, config());
        sp.acquire(&a, &[(0, 2)], 1, now);
        sp.acquire(&b, &[(3, 5)], 1, now);
        sp.acquire(&a, &[(6, 7)], 1, now);
        assert_eq!(sp.release_member("a"), 5);
        assert_eq!(sp.release_member("a"), 0);
        assert_eq!(sp.release_member("nobody"), 0);
        assert_eq!(sp.in_flight_counts(), (5, 3, 0, 0));
        assert_eq!(sp.holder(4).map(|h| &**h), Some("b"));
        assert_eq!(sp.next_fetch_offset(now), Some(0));
        check_invariants(&sp);
    }

    #[test]
    fn reset_start_inside_the_window_drops_what_is_below() {
        let now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(0, config());
        sp.acquire(&m, &[(0, 9)], 100, now);
        sp.acknowledge("a", 5, 6, &[AckType::Accept], now)
            .expect("held");
        sp.reset_start(3);
        assert_eq!((sp.start_offset(), sp.end_offset()), (3, 10));
        assert_eq!(sp.in_flight_counts(), (0, 5, 2, 0));
        // The member's locks on the dropped records are gone.
        assert_eq!(
            sp.acknowledge("a", 2, 2, &[AckType::Accept], now),
            Err(AckError::InvalidRecordState { offset: 2 })
        );
        // Landing on done records moves on past them.
        sp.reset_start(5);
        assert_eq!(sp.start_offset(), 7);
        assert_eq!(sp.in_flight_counts(), (0, 3, 0, 0));
        check_invariants(&sp);
    }

    #[test]
    fn reset_start_at_or_beyond_the_end_restarts_empty() {
        let now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(0, config());
        sp.acquire(&m, &[(0, 9)], 100, now);
        sp.reset_start(25);
        assert_eq!((sp.start_offset(), sp.end_offset()), (25, 25));
        assert_eq!(sp.in_flight_counts(), (0, 0, 0, 0));
        assert_eq!(sp.next_deadline(), None);
        assert_eq!(sp.next_fetch_offset(now), Some(25));
        assert_eq!(
            sp.acquire(&m, &[(20, 29)], 100, now),
            vec![range(25, 29, 1)]
        );
        check_invariants(&sp);
    }

    #[test]
    fn reset_start_below_the_start_redelivers_from_there() {
        let now = Instant::now();
        let m = member("a");
        let mut sp = SharePartition::new(0, config());
        sp.acquire(&m, &[(0, 9)], 100, now);
        sp.acknowledge("a", 0, 7, &[AckType::Accept], now)
            .expect("held");
        assert_eq!(sp.start_offset(), 8);
        sp.reset_start(2);
        assert_eq!((sp.start_offset(), sp.end_offset()), (2, 2));
        assert_eq!(sp.acquire(&m, &[(0, 9)], 100, now), vec![range(2, 9, 1)]);
        check_invariants(&sp);
    }

    #[test]
    fn restore_then_acquire_redelivers_with_incremented_delivery_counts() {
        let now = Instant::now();
        let m = member("a");
        let batches = [
            batch(10, 11, RecordState::Available, 1),
            batch(12, 12, RecordState::Acknowledged, 1),
            batch(13, 14, RecordState::Acquired, 2),
            batch(15, 15, RecordState::Archived, 3),
            batch(16, 17, RecordState::Available, 0),
        ];
        let mut sp = SharePartition::restore(10, &batches, config());
        assert_eq!((sp.start_offset(), sp.end_offset()), (10, 18));
        assert_eq!(sp.in_flight_counts(), (6, 0, 1, 1));
        assert_eq!(sp.next_deadline(), None);
        assert_eq!(sp.next_fetch_offset(now), Some(10));
        let got = sp.acquire(&m, &[(8, 14), (15, 19)], 100, now);
        assert_eq!(
            got,
            vec![
                range(10, 11, 2),
                range(13, 14, 3),
                // 16..=17 restored never delivered, 18..=19 fresh: one run, as both are on
                // their first delivery.
                range(16, 19, 1),
            ]
        );
        assert_eq!(sp.end_offset(), 20);
        check_invariants(&sp);
    }

    #[test]
    fn restore_skips_leading_done_batches_and_bad_input() {
        let batches = [
            batch(0, 4, RecordState::Available, 1), // below the start offset
            batch(5, 1_000_000, RecordState::Acknowledged, 1),
            batch(999_990, 1_000_002, RecordState::Available, 1), // overlaps the previous one
            batch(1_000_009, 1_000_008, RecordState::Available, 1), // inverted
            batch(1_000_010, 1_000_010, RecordState::Archived, 2),
        ];
        let sp = SharePartition::restore(5, &batches, config());
        assert_eq!((sp.start_offset(), sp.end_offset()), (1_000_001, 1_000_011));
        assert_eq!(sp.in_flight_counts(), (2, 0, 0, 1));
        assert_eq!(
            sp.state_batches(),
            vec![
                batch(1_000_001, 1_000_002, RecordState::Available, 1),
                batch(1_000_010, 1_000_010, RecordState::Archived, 2),
            ]
        );
        check_invariants(&sp);

        let empty = SharePartition::restore(7, &[], config());
        assert_eq!((empty.start_offset(), empty.end_offset()), (7, 7));
    }

    #[test]
    fn state_batches_merge_runs_and_persist_acquired_as_available() {
        let now = Instant::now();
        let (a, b) = (member("a"), member("b"));
        let mut sp = SharePartition::new(0, config());
        sp.acquire(&a, &[(0, 3)], 1, now);
        sp.acquire(&b, &[(4, 5)], 1, now);
        sp.acknowledge("a", 2, 2, &[AckType::Accept], now)
            .expect("held");
        sp.acknowledge("a", 3, 3, &[AckType::Release], now)
            .expect("held");
        // 0,1 Acquired(a) and 3 Available share a state once persisted, but 2 splits them; 4,5
        // held by b merge with 3.
        assert_eq!(
            sp.state_batches(),
            vec![
                batch(0, 1, RecordState::Available, 1),
                batch(2, 2, RecordState::Acknowledged, 1),
                batch(3, 5, RecordState::Available, 1),
            ]
        );
        let restored = SharePartition::restore(sp.start_offset(), &sp.state_batches(), config());
        assert_eq!(restored.state_batches(), sp.state_batches());
        assert_eq!(restored.in_flight_counts(), (5, 0, 1, 0));
        check_invariants(&restored);
    }

    // ---- Randomized test against a simple model ------------------------------------------

    /// xorshift64*: deterministic, good enough to pick operations.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        /// Uniform-ish in `0..n` (n > 0).
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        fn chance(&mut self, percent: u64) -> bool {
            self.below(100) < percent
        }
    }

    #[derive(Clone, Debug, PartialEq)]
    struct ModelRec {
        state: RecordState,
        delivery_count: u16,
        holder: Option<(String, Instant)>,
    }

    /// The same rules written as plainly as possible: no indexes, linear scans everywhere.
    struct Model {
        config: ShareConfig,
        start: i64,
        end: i64,
        recs: BTreeMap<i64, ModelRec>,
        /// Every offset the model ever made final.
        finalized: BTreeSet<i64>,
    }

    impl Model {
        fn finish(&mut self, offset: i64, rec: &mut ModelRec, state: RecordState) {
            rec.holder = None;
            rec.state = state;
            self.finalized.insert(offset);
        }

        fn unlock(&mut self, offset: i64, rec: &mut ModelRec) {
            if rec.delivery_count >= self.config.delivery_count_limit {
                self.finish(offset, rec, RecordState::Archived);
            } else {
                rec.holder = None;
                rec.state = RecordState::Available;
            }
        }

        fn advance(&mut self) {
            let drop: Vec<i64> = self
                .recs
                .iter()
                .take_while(|(_, r)| r.state.is_final())
                .map(|(&o, _)| o)
                .collect();
            for o in drop {
                self.recs.remove(&o);
            }
            self.start = self.recs.keys().next().copied().unwrap_or(self.end);
        }

        fn expire(&mut self, now: Instant) -> usize {
            let mut n = 0;
            let mut recs = std::mem::take(&mut self.recs);
            for (&offset, rec) in recs.iter_mut() {
                if let Some((_, deadline)) = &rec.holder {
                    if *deadline <= now {
                        self.unlock(offset, rec);
                        n += 1;
                    }
                }
            }
            self.recs = recs;
            self.advance();
            n
        }

        fn acquired(&self) -> u64 {
            self.recs
                .values()
                .filter(|r| r.state == RecordState::Acquired)
                .count() as u64
        }

        fn next_fetch_offset(&mut self, now: Instant) -> Option<i64> {
            self.expire(now);
            if self.acquired() >= u64::from(self.config.partition_max_record_locks) {
                return None;
            }
            let available = self
                .recs
                .iter()
                .find(|(_, r)| r.state == RecordState::Available)
                .map(|(&o, _)| o);
            Some(available.unwrap_or(self.end))
        }

        fn acquire(
            &mut self,
            member: &str,
            batches: &[(i64, i64)],
            max_records: u32,
            now: Instant,
        ) -> Vec<(i64, u16)> {
            self.expire(now);
            let mut got = Vec::new();
            if max_records == 0 {
                return got;
            }
            let deadline = now + self.config.record_lock_duration;
            'outer: for &(first, last) in batches {
                for offset in first..=last {
                    if offset < self.start {
                        continue;
                    }
                    if self.acquired() >= u64::from(self.config.partition_max_record_locks) {
                        break 'outer;
                    }
                    let limit = self.config.delivery_count_limit;
                    let rec = self.recs.entry(offset).or_insert(ModelRec {
                        state: RecordState::Available,
                        delivery_count: 0,
                        holder: None,
                    });
                    if rec.state != RecordState::Available {
                        continue;
                    }
                    if rec.delivery_count >= limit {
                        rec.state = RecordState::Archived;
                        self.finalized.insert(offset);
                        continue;
                    }
                    rec.state = RecordState::Acquired;
                    rec.delivery_count += 1;
                    rec.holder = Some((member.to_string(), deadline));
                    got.push((offset, rec.delivery_count));
                    self.end = self.end.max(offset + 1);
                }
                if got.len() as u64 >= u64::from(max_records) {
                    break;
                }
            }
            self.advance();
            got
        }

        fn acknowledge(
            &mut self,
            member: &str,
            first: i64,
            last: i64,
            types: &[AckType],
            now: Instant,
        ) -> Result<(), AckError> {
            if last < first || (types.len() != 1 && types.len() as i64 != last - first + 1) {
                return Err(AckError::InvalidRequest(String::new()));
            }
            self.expire(now);
            for offset in first..=last {
                let ok = self.recs.get(&offset).is_some_and(|r| {
                    r.state == RecordState::Acquired
                        && r.holder
                            .as_ref()
                            .is_some_and(|(m, d)| m == member && now < *d)
                });
                if !ok {
                    return Err(AckError::InvalidRecordState { offset });
                }
            }
            let deadline = now + self.config.record_lock_duration;
            for offset in first..=last {
                let ack = if types.len() == 1 {
                    types[0]
                } else {
                    types[(offset - first) as usize]
                };
                let mut rec = self.recs.remove(&offset).expect("validated");
                match ack {
                    AckType::Accept => self.finish(offset, &mut rec, RecordState::Acknowledged),
                    AckType::Release => self.unlock(offset, &mut rec),
                    AckType::Reject | AckType::Gap => {
                        self.finish(offset, &mut rec, RecordState::Archived)
                    }
                    AckType::Renew => {
                        if let Some((_, d)) = rec.holder.as_mut() {
                            *d = deadline;
                        }
                    }
                }
                self.recs.insert(offset, rec);
            }
            self.advance();
            Ok(())
        }

        fn release_member(&mut self, member: &str) -> usize {
            let mut n = 0;
            let mut recs = std::mem::take(&mut self.recs);
            for (&offset, rec) in recs.iter_mut() {
                if rec.holder.as_ref().is_some_and(|(m, _)| m == member) {
                    self.unlock(offset, rec);
                    n += 1;
                }
            }
            self.recs = recs;
            self.advance();
            n
        }

        fn skip(&mut self, first: i64, last: i64) -> usize {
            if first.max(self.start) > self.end {
                return 0;
            }
            let mut n = 0;
            for offset in first.max(self.start)..=last {
                let rec = self.recs.entry(offset).or_insert(ModelRec {
                    state: RecordState::Available,
                    delivery_count: 0,
                    holder: None,
                });
                if rec.state == RecordState::Available {
                    rec.state = RecordState::Archived;
                    self.finalized.insert(offset);
                    n += 1;
                }
                self.end = self.end.max(offset + 1);
            }
            self.advance();
            n
        }

        fn reset_start(&mut self, start: i64) {
            if start < self.start || start >= self.end {
                self.recs.clear();
                self.start = start;
                self.end = start;
            } else {
                self.recs.retain(|&o, _| o >= start);
                self.start = start;
                self.advance();
            }
        }

        fn restore(&mut self) {
            for rec in self.recs.values_mut() {
                if rec.state == RecordState::Acquired {
                    rec.state = RecordState::Available;
                    rec.holder = None;
                }
            }
        }
    }

    /// Compares the implementation with the model, record by record.
    fn assert_same(sp: &SharePartition, model: &Model) {
        assert_eq!(sp.start_offset(), model.start, "start offset");
        assert_eq!(sp.end_offset(), model.end, "end offset");
        let ours: BTreeMap<i64, ModelRec> = sp
            .records
            .iter()
            .map(|(&o, r)| {
                let holder = r.lock.as_ref().map(|l| (l.member.to_string(), l.deadline));
                (
                    o,
                    ModelRec {
                        state: r.state,
                        delivery_count: r.delivery_count,
                        holder,
                    },
                )
            })
            .collect();
        assert_eq!(ours, model.recs);
    }

    /// Expands acquired ranges into (offset, delivery count) pairs, checking their shape.
    fn expand(ranges: &[AcquiredRange]) -> Vec<(i64, u16)> {
        let mut out = Vec::new();
        for (i, r) in ranges.iter().enumerate() {
            assert!(r.first_offset <= r.last_offset);
            if i > 0 {
                let prev = ranges[i - 1];
                assert!(prev.last_offset < r.first_offset, "sorted, disjoint");
                assert!(
                    prev.last_offset + 1 < r.first_offset
                        || prev.delivery_count != r.delivery_count,
                    "mergeable ranges left apart: {prev:?} {r:?}"
                );
            }
            out.extend((r.first_offset..=r.last_offset).map(|o| (o, r.delivery_count)));
        }
        out
    }

    /// A log of record batches with holes between some of them (whole batches compacted away).
    fn make_log(rng: &mut Rng) -> Vec<(i64, i64)> {
        let mut log = Vec::new();
        let mut offset = 0;
        while offset < 1000 {
            if rng.chance(15) {
                offset += 1 + rng.below(4) as i64;
            }
            let len = 1 + rng.below(6) as i64;
            log.push((offset, offset + len - 1));
            offset += len;
        }
        log
    }

    /// What a read from `from` returns: the batch holding it (or the next one) and a few more.
    fn read(log: &[(i64, i64)], from: i64, batches: usize) -> Vec<(i64, i64)> {
        log.iter()
            .copied()
            .filter(|&(_, last)| last >= from)
            .take(batches)
            .collect()
    }

    fn run_random(seed: u64, steps: usize) {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let config = ShareConfig {
            record_lock_duration: Duration::from_millis(50 + rng.below(100)),
            delivery_count_limit: 1 + rng.below(4) as u16,
            partition_max_record_locks: 3 + rng.below(20) as u32,
        };
        let log = make_log(&mut rng);
        let log_offsets: BTreeSet<i64> = log.iter().flat_map(|&(f, l)| f..=l).collect();
        let members: Vec<Rc<str>> = (0..4).map(|i| member(&format!("m{i}"))).collect();
        let mut now = Instant::now();
        let mut sp = SharePartition::new(0, config);
        let mut model = Model {
            config,
            start: 0,
            end: 0,
            recs: BTreeMap::new(),
            finalized: BTreeSet::new(),
        };
        // Offsets skipped by moving the log start.
        let mut skipped: BTreeSet<i64> = BTreeSet::new();
        let mut max_delivery: HashMap<i64, u16> = HashMap::new();

        for step in 0..steps {
            let ctx = format!("seed {seed} step {step}");
            let locks_before: HashMap<i64, (Rc<str>, Instant)> = sp
                .records
                .iter()
                .filter_map(|(&o, r)| {
                    r.lock
                        .as_ref()
                        .map(|l| (o, (Rc::clone(&l.member), l.deadline)))
                })
                .collect();
            match rng.below(100) {
                0..=34 => {
                    let m = &members[rng.below(4) as usize];
                    let from = sp.next_fetch_offset(now);
                    assert_eq!(from, model.next_fetch_offset(now), "{ctx}");
                    let Some(from) = from else { continue };
                    let batches = read(&log, from, 1 + rng.below(4) as usize);
                    let max_records = rng.below(12) as u32;
                    let got = sp.acquire(m, &batches, max_records, now);
                    let pairs = expand(&got);
                    assert_eq!(pairs, model.acquire(m, &batches, max_records, now), "{ctx}");
                    for &(o, dc) in &pairs {
                        assert!(
                            !model.finalized.contains(&o) && !skipped.contains(&o),
                            "{ctx}: done offset {o} acquired again"
                        );
                        assert!(
                            dc <= config.delivery_count_limit,
                            "{ctx}: offset {o} delivered {dc} times"
                        );
                        if let Some((h, deadline)) = locks_before.get(&o) {
                            // Held before: only possible if its lock has expired.
                            assert!(
                                *deadline <= now,
                                "{ctx}: {o} is held by {h} and also went to {m}"
                            );
                        }
                        let max = max_delivery.entry(o).or_insert(0);
                        assert!(dc > *max, "{ctx}: delivery count of {o} did not increase");
                        *max = dc;
                        assert!(log_offsets.contains(&o), "{ctx}: {o} is not in the log");
                    }
                }
                35..=69 => {
                    // Mostly a member that holds something, to exercise successful acks.
                    let holders: Vec<&str> = model
                        .recs
                        .values()
                        .filter_map(|r| r.holder.as_ref().map(|(h, _)| h.as_str()))
                        .collect();
                    let m = if !holders.is_empty() && rng.chance(80) {
                        let name = holders[rng.below(holders.len() as u64) as usize];
                        members
                            .iter()
                            .find(|m| &***m == name)
                            .expect("a member of the test")
                    } else {
                        &members[rng.below(4) as usize]
                    };
                    let held: Vec<i64> = model
                        .recs
                        .iter()
                        .filter(|(_, r)| r.holder.as_ref().is_some_and(|(h, _)| **h == **m))
                        .map(|(&o, _)| o)
                        .collect();
                    let first = if !held.is_empty() && rng.chance(80) {
                        held[rng.below(held.len() as u64) as usize]
                    } else {
                        model.start - 2 + rng.below((model.end - model.start + 4) as u64) as i64
                    };
                    // Mostly stay within a run the member holds, sometimes run past it.
                    let mut run_end = first;
                    while held.binary_search(&(run_end + 1)).is_ok() {
                        run_end += 1;
                    }
                    let last = if rng.chance(85) && run_end >= first {
                        first + rng.below((run_end - first + 1) as u64) as i64
                    } else {
                        first + rng.below(4) as i64
                    };
                    let pick = |rng: &mut Rng| match rng.below(10) {
                        0..=3 => AckType::Accept,
                        4..=5 => AckType::Release,
                        6 => AckType::Reject,
                        7 => AckType::Gap,
                        _ => AckType::Renew,
                    };
                    let n = if rng.chance(5) {
                        (last - first + 3) as usize // malformed
                    } else if rng.chance(50) {
                        1
                    } else {
                        (last - first + 1) as usize
                    };
                    let types: Vec<AckType> = (0..n).map(|_| pick(&mut rng)).collect();
                    let ours = sp.acknowledge(m, first, last, &types, now);
                    let theirs = model.acknowledge(m, first, last, &types, now);
                    match (&ours, &theirs) {
                        (Err(AckError::InvalidRequest(_)), Err(AckError::InvalidRequest(_))) => {}
                        _ => assert_eq!(ours, theirs, "{ctx}: ack {first}..={last} {types:?}"),
                    }
                }
                70..=74 => {
                    let m = &members[rng.below(4) as usize];
                    assert_eq!(sp.release_member(m), model.release_member(m), "{ctx}");
                }
                75..=89 => {
                    now += Duration::from_millis(rng.below(60));
                    if rng.chance(50) {
                        assert_eq!(sp.expire(now), model.expire(now), "{ctx}");
                    }
                }
                90..=94 => {
                    let theirs = model
                        .recs
                        .values()
                        .filter_map(|r| r.holder.as_ref().map(|(_, d)| *d))
                        .min();
                    assert_eq!(sp.next_deadline(), theirs, "{ctx}");
                }
                95 => {
                    // A control batch (or an aborted transaction's) met by a read.
                    let from = sp.next_fetch_offset(now);
                    assert_eq!(from, model.next_fetch_offset(now), "{ctx}");
                    let Some(from) = from else { continue };
                    let batches = read(&log, from, 1 + rng.below(3) as usize);
                    if let Some(&(first, last)) = batches.last() {
                        assert_eq!(sp.skip(first, last), model.skip(first, last), "{ctx}");
                    }
                }
                96 => {
                    // The log start moves up (retention or DeleteRecords).
                    let to = sp.start_offset() + rng.below(6) as i64;
                    if to > sp.start_offset() {
                        skipped.extend(sp.start_offset()..to);
                        sp.reset_start(to);
                        model.reset_start(to);
                    }
                }
                _ => {
                    // A new leader: persisted state round trip, locks lost.
                    sp = SharePartition::restore(sp.start_offset(), &sp.state_batches(), config);
                    model.restore();
                }
            }

            check_invariants(&sp);
            assert_same(&sp, &model);
            assert!(
                sp.acquired_count() <= u64::from(config.partition_max_record_locks),
                "{ctx}: lock limit exceeded"
            );
            for (&o, rec) in &sp.records {
                assert!(
                    rec.delivery_count <= config.delivery_count_limit,
                    "{ctx}: {o} over the delivery limit"
                );
            }
            // Every record of the log below the start offset was made final (or skipped by
            // moving the log start).
            for &o in log_offsets.range(..sp.start_offset()) {
                assert!(
                    model.finalized.contains(&o) || skipped.contains(&o),
                    "{ctx}: {o} below the start offset was never done"
                );
            }
            // Round trip through the persisted form.
            let batches = sp.state_batches();
            let restored = SharePartition::restore(sp.start_offset(), &batches, config);
            check_invariants(&restored);
            assert_eq!(restored.start_offset(), sp.start_offset(), "{ctx}");
            assert_eq!(restored.end_offset(), sp.end_offset(), "{ctx}");
            assert_eq!(restored.state_batches(), batches, "{ctx}");
            let (av, aq, ak, ar) = sp.in_flight_counts();
            assert_eq!(restored.in_flight_counts(), (av + aq, 0, ak, ar), "{ctx}");
        }
    }

    #[test]
    fn randomized_against_a_simple_model() {
        for seed in 1..=30 {
            run_random(seed, 1200);
        }
    }
}
