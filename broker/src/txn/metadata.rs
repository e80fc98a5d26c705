//! The state of one transactional id and its transitions, as Kafka's `TransactionMetadata` and
//! `TransactionState` define them.
//!
//! Every transition has two steps. A `prepare_*` method checks that the move is legal, records
//! the target state as pending and returns the target ([`TxnData`]); nothing else changes. Once
//! the target's record is durable in `__transaction_state`, [`TxnMetadata::complete_transition`]
//! applies it. While a transition is pending no other may be prepared: the coordinator answers
//! such requests with CONCURRENT_TRANSACTIONS. A failure in `complete_transition`'s checks is a
//! bug in the coordinator, not bad input, and crashes.

use std::collections::BTreeSet;

use kafka_protocol::ResponseError;

use super::records::{TxnLogPartitions, TxnLogValue};

pub const NO_PRODUCER_ID: i64 = -1;
pub const NO_PRODUCER_EPOCH: i16 = -1;

/// Kafka's `TransactionState`, with its ids (the `TransactionStatus` of a record) and names (what
/// DescribeTransactions and ListTransactions show).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TxnState {
    /// No transaction: just initialised, or finished and reset by InitProducerId.
    Empty,
    /// Partitions have been added; the producer is writing.
    Ongoing,
    /// Commit decided and durable; markers are being written.
    PrepareCommit,
    /// Abort decided and durable; markers are being written.
    PrepareAbort,
    /// Every commit marker is written.
    CompleteCommit,
    /// Every abort marker is written.
    CompleteAbort,
    /// The transactional id expired and is being deleted; only ever a pending state.
    Dead,
    /// The epoch is being bumped to fence a producer before aborting its transaction; Kafka never
    /// completes a transition to it, and neither does Sluice.
    PrepareEpochFence,
}

impl TxnState {
    pub const ALL: [TxnState; 8] = [
        TxnState::Empty,
        TxnState::Ongoing,
        TxnState::PrepareCommit,
        TxnState::PrepareAbort,
        TxnState::CompleteCommit,
        TxnState::CompleteAbort,
        TxnState::Dead,
        TxnState::PrepareEpochFence,
    ];

    pub const fn id(self) -> i8 {
        match self {
            TxnState::Empty => 0,
            TxnState::Ongoing => 1,
            TxnState::PrepareCommit => 2,
            TxnState::PrepareAbort => 3,
            TxnState::CompleteCommit => 4,
            TxnState::CompleteAbort => 5,
            TxnState::Dead => 6,
            TxnState::PrepareEpochFence => 7,
        }
    }

    pub fn from_id(id: i8) -> Option<TxnState> {
        TxnState::ALL.into_iter().find(|s| s.id() == id)
    }

    pub const fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
            TxnState::Dead => "Dead",
            TxnState::PrepareEpochFence => "PrepareEpochFence",
        }
    }

    pub fn from_name(name: &str) -> Option<TxnState> {
        TxnState::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The states a transition into `self` may start from (Kafka's `validPreviousStates`). With
    /// transaction version 2 an abort may start from Empty or Complete*, because a client unsure
    /// of the server's state may always abort.
    pub const fn valid_previous_states(self) -> &'static [TxnState] {
        use TxnState::*;
        match self {
            Empty => &[Empty, CompleteCommit, CompleteAbort],
            Ongoing => &[Ongoing, Empty, CompleteCommit, CompleteAbort],
            PrepareCommit => &[Ongoing],
            PrepareAbort => &[
                Ongoing,
                PrepareEpochFence,
                Empty,
                CompleteCommit,
                CompleteAbort,
            ],
            CompleteCommit => &[PrepareCommit],
            CompleteAbort => &[PrepareAbort],
            Dead => &[Empty, CompleteAbort, CompleteCommit],
            PrepareEpochFence => &[Ongoing],
        }
    }

    /// Whether an idle transactional id in this state may expire
    /// (`transactional.id.expiration.ms`).
    pub const fn expiration_allowed(self) -> bool {
        matches!(
            self,
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
        )
    }

    pub const fn is_prepare(self) -> bool {
        matches!(self, TxnState::PrepareCommit | TxnState::PrepareAbort)
    }
}

/// Kafka's `transaction.version` feature level, as the cluster sets it and as a client's requests
/// imply it (EndTxn and AddPartitionsToTxn v5+ mean version 2, older ones 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TransactionVersion(pub i16);

impl TransactionVersion {
    pub const TV_0: TransactionVersion = TransactionVersion(0);
    pub const TV_1: TransactionVersion = TransactionVersion(1);
    /// KIP-890 part 2: the epoch is bumped by every EndTxn and partitions are added by the
    /// partition leaders.
    pub const TV_2: TransactionVersion = TransactionVersion(2);

    pub const fn supports_epoch_bump(self) -> bool {
        self.0 >= 2
    }

    /// The `TransactionLogValue` version a coordinator at this level writes.
    pub const fn log_value_version(self) -> i16 {
        if self.0 >= 2 {
            1
        } else {
            0
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: i32,
}

impl TopicPartition {
    pub fn new(topic: &str, partition: i32) -> TopicPartition {
        TopicPartition {
            topic: topic.to_string(),
            partition,
        }
    }
}

/// An epoch that may not be handed out any more: Kafka keeps `i16::MAX` back so that the
/// coordinator can always fence the last producer by one more bump.
pub const fn is_epoch_exhausted(producer_epoch: i16) -> bool {
    producer_epoch >= i16::MAX - 1
}

/// Everything a transition sets: the fields of a `__transaction_state` record plus
/// `last_producer_epoch`, which Kafka keeps in memory only (so a KIP-360 retry that spans a
/// coordinator move is fenced, as in Kafka).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnData {
    pub producer_id: i64,
    /// The producer id before the transition that produced this data (a rotation changes it).
    pub previous_producer_id: i64,
    /// Set while a TV2 transaction ends on an exhausted epoch: the id the producer moves to.
    pub next_producer_id: i64,
    pub producer_epoch: i16,
    /// The epoch before the last bump, so that a retried InitProducerId (KIP-360) or EndTxn
    /// (TV2) is recognised; -1 when unknown.
    pub last_producer_epoch: i16,
    pub txn_timeout_ms: i32,
    pub state: TxnState,
    pub partitions: BTreeSet<TopicPartition>,
    /// When the first partition was added; -1 when there is no transaction.
    pub txn_start_timestamp_ms: i64,
    pub txn_last_update_timestamp_ms: i64,
    pub client_transaction_version: TransactionVersion,
}

/// A record whose status is no state Kafka knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownStatus(pub i8);

impl TxnData {
    /// The record Kafka writes for this data: partitions grouped by topic, null when Empty.
    pub fn to_log_value(&self) -> TxnLogValue {
        assert!(
            self.state != TxnState::Empty || self.partitions.is_empty(),
            "Empty with {} partitions",
            self.partitions.len()
        );
        let transaction_partitions = (self.state != TxnState::Empty).then(|| {
            let mut entries: Vec<TxnLogPartitions> = Vec::new();
            for tp in &self.partitions {
                match entries.last_mut() {
                    Some(last) if last.topic == tp.topic => last.partition_ids.push(tp.partition),
                    _ => entries.push(TxnLogPartitions {
                        topic: tp.topic.clone(),
                        partition_ids: vec![tp.partition],
                    }),
                }
            }
            entries
        });
        TxnLogValue {
            producer_id: self.producer_id,
            previous_producer_id: self.previous_producer_id,
            next_producer_id: self.next_producer_id,
            producer_epoch: self.producer_epoch,
            next_producer_epoch: NO_PRODUCER_EPOCH,
            transaction_timeout_ms: self.txn_timeout_ms,
            transaction_status: self.state.id(),
            transaction_partitions,
            transaction_last_update_timestamp_ms: self.txn_last_update_timestamp_ms,
            transaction_start_timestamp_ms: self.txn_start_timestamp_ms,
            client_transaction_version: self.client_transaction_version.0,
        }
    }

    /// The data a loaded record stands for; `last_producer_epoch` is unknown after a load.
    pub fn from_log_value(v: &TxnLogValue) -> Result<TxnData, UnknownStatus> {
        let state =
            TxnState::from_id(v.transaction_status).ok_or(UnknownStatus(v.transaction_status))?;
        let mut partitions = BTreeSet::new();
        if state != TxnState::Empty {
            for entry in v.transaction_partitions.iter().flatten() {
                for &p in &entry.partition_ids {
                    partitions.insert(TopicPartition::new(&entry.topic, p));
                }
            }
        }
        Ok(TxnData {
            producer_id: v.producer_id,
            previous_producer_id: v.previous_producer_id,
            next_producer_id: v.next_producer_id,
            producer_epoch: v.producer_epoch,
            last_producer_epoch: NO_PRODUCER_EPOCH,
            txn_timeout_ms: v.transaction_timeout_ms,
            state,
            partitions,
            txn_start_timestamp_ms: v.transaction_start_timestamp_ms,
            txn_last_update_timestamp_ms: v.transaction_last_update_timestamp_ms,
            client_transaction_version: TransactionVersion(v.client_transaction_version),
        })
    }
}

/// One transactional id: its durable data, and the transition in flight if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnMetadata {
    pub transactional_id: String,
    pub data: TxnData,
    /// The state a prepared transition moves to; `None` when nothing is in flight.
    pending_state: Option<TxnState>,
    /// A fencing bump whose record failed to append: the in-memory epoch is already bumped (and
    /// was never returned to a client), so the next fence must not bump again.
    pub has_failed_epoch_fence: bool,
}

impl TxnMetadata {
    /// A transactional id seen for the first time: a fresh producer id and no epoch yet, which
    /// InitProducerId then bumps to 0.
    pub fn new(transactional_id: &str, producer_id: i64, txn_timeout_ms: i32, now_ms: i64) -> Self {
        TxnMetadata {
            transactional_id: transactional_id.to_string(),
            data: TxnData {
                producer_id,
                previous_producer_id: NO_PRODUCER_ID,
                next_producer_id: NO_PRODUCER_ID,
                producer_epoch: NO_PRODUCER_EPOCH,
                last_producer_epoch: NO_PRODUCER_EPOCH,
                txn_timeout_ms,
                state: TxnState::Empty,
                partitions: BTreeSet::new(),
                txn_start_timestamp_ms: -1,
                txn_last_update_timestamp_ms: now_ms,
                client_transaction_version: TransactionVersion::TV_0,
            },
            pending_state: None,
            has_failed_epoch_fence: false,
        }
    }

    /// Metadata as loaded from its latest record.
    pub fn loaded(transactional_id: &str, data: TxnData) -> Self {
        TxnMetadata {
            transactional_id: transactional_id.to_string(),
            data,
            pending_state: None,
            has_failed_epoch_fence: false,
        }
    }

    pub fn state(&self) -> TxnState {
        self.data.state
    }

    pub fn pending_state(&self) -> Option<TxnState> {
        self.pending_state
    }

    pub fn pending_transition_in_progress(&self) -> bool {
        self.pending_state.is_some()
    }

    pub fn is_producer_epoch_exhausted(&self) -> bool {
        is_epoch_exhausted(self.data.producer_epoch)
    }

    fn has_pending_transaction(&self) -> bool {
        matches!(
            self.data.state,
            TxnState::Ongoing | TxnState::PrepareCommit | TxnState::PrepareAbort
        )
    }

    /// Forgets a prepared transition whose record could not be appended.
    pub fn clear_pending(&mut self) {
        self.pending_state = None;
    }

    /// Marks a transition as in flight without a record of its own: Prepare* is durable and the
    /// markers are being written, so `to` (Complete*) is what comes next.
    pub fn set_pending(&mut self, to: TxnState) {
        assert!(
            self.pending_state.is_none(),
            "{}: pending {:?} while setting {to:?}",
            self.transactional_id,
            self.pending_state
        );
        self.pending_state = Some(to);
    }

    /// The epoch a fence moves to: one more, unless a failed fence already bumped it in memory or
    /// it is at `i16::MAX`. Kafka bumps the in-memory epoch at once (the fenced epoch is never
    /// returned to a client), so this does too.
    pub fn fence_producer_epoch(&mut self) -> i16 {
        assert!(
            self.data.state == TxnState::Ongoing,
            "{}: fencing in {:?}",
            self.transactional_id,
            self.data.state
        );
        assert!(self.pending_state.is_none());
        let epoch = self.data.producer_epoch;
        let fenced = if self.has_failed_epoch_fence || epoch == i16::MAX {
            epoch
        } else {
            epoch + 1
        };
        self.data.producer_epoch = fenced;
        self.data.last_producer_epoch = NO_PRODUCER_EPOCH;
        fenced
    }

    /// InitProducerId on an idle id: bump the epoch (KIP-360 rules for an expected epoch).
    pub fn prepare_increment_producer_epoch(
        &mut self,
        txn_timeout_ms: i32,
        expected_producer_epoch: Option<i16>,
        now_ms: i64,
    ) -> Result<TxnData, ResponseError> {
        if self.is_producer_epoch_exhausted() {
            // Kafka throws an IllegalStateException here, which reaches the client as
            // UNKNOWN_SERVER_ERROR; rotation is decided by the caller before this point.
            return Err(ResponseError::UnknownServerError);
        }
        let current = self.data.producer_epoch;
        let last = self.data.last_producer_epoch;
        let bumped = current + 1;
        let (producer_epoch, last_producer_epoch) = match expected_producer_epoch {
            // A new producer instance: bump and forget the last epoch.
            None => (bumped, NO_PRODUCER_EPOCH),
            // The producer continues after an error, or the id is new: bump, remember the last.
            Some(expected) if current == NO_PRODUCER_EPOCH || expected == current => {
                (bumped, current)
            }
            // A retry of a bump whose response was lost: hand out the current epoch again.
            Some(expected) if expected == last => (current, last),
            Some(_) => return Err(ResponseError::ProducerFenced),
        };
        let mut target = self.data.clone();
        target.state = TxnState::Empty;
        target.producer_epoch = producer_epoch;
        target.last_producer_epoch = last_producer_epoch;
        target.txn_timeout_ms = txn_timeout_ms;
        target.partitions.clear();
        target.txn_start_timestamp_ms = -1;
        target.txn_last_update_timestamp_ms = now_ms;
        Ok(self.prepare_transition_to(target))
    }

    /// InitProducerId on an exhausted epoch: a new producer id at epoch 0.
    pub fn prepare_producer_id_rotation(
        &mut self,
        new_producer_id: i64,
        txn_timeout_ms: i32,
        now_ms: i64,
        record_last_epoch: bool,
    ) -> TxnData {
        assert!(
            !self.has_pending_transaction(),
            "{}: rotating producer ids in {:?}",
            self.transactional_id,
            self.data.state
        );
        let mut target = self.data.clone();
        target.state = TxnState::Empty;
        target.producer_id = new_producer_id;
        target.producer_epoch = 0;
        target.last_producer_epoch = if record_last_epoch {
            self.data.producer_epoch
        } else {
            NO_PRODUCER_EPOCH
        };
        target.txn_timeout_ms = txn_timeout_ms;
        target.partitions.clear();
        target.txn_start_timestamp_ms = -1;
        target.txn_last_update_timestamp_ms = now_ms;
        self.prepare_transition_to(target)
    }

    /// AddPartitionsToTxn: Ongoing with the union of the partitions; a new transaction starts now.
    pub fn prepare_add_partitions(
        &mut self,
        added: &[TopicPartition],
        now_ms: i64,
        client_transaction_version: TransactionVersion,
    ) -> TxnData {
        let mut target = self.data.clone();
        if matches!(
            self.data.state,
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
        ) {
            target.txn_start_timestamp_ms = now_ms;
        }
        target.partitions.extend(added.iter().cloned());
        target.state = TxnState::Ongoing;
        target.txn_last_update_timestamp_ms = now_ms;
        target.client_transaction_version = client_transaction_version;
        self.prepare_transition_to(target)
    }

    /// EndTxn (or a fence's abort): PrepareCommit or PrepareAbort. With transaction version 2
    /// the epoch is bumped (never past `i16::MAX`); `next_producer_id` is the id to move to when
    /// the current epoch is exhausted.
    pub fn prepare_abort_or_commit(
        &mut self,
        new_state: TxnState,
        client_transaction_version: TransactionVersion,
        next_producer_id: i64,
        now_ms: i64,
        no_partition_added: bool,
    ) -> TxnData {
        assert!(new_state.is_prepare(), "{new_state:?}");
        let mut target = self.data.clone();
        target.state = new_state;
        if client_transaction_version.supports_epoch_bump() {
            // An abort at i16::MAX (a broken state) goes through without a bump so that the
            // transaction can still end; a commit never gets here at i16::MAX.
            if !(self.data.producer_epoch == i16::MAX && new_state == TxnState::PrepareAbort) {
                assert!(
                    self.data.producer_epoch < i16::MAX,
                    "{}: commit at epoch {}",
                    self.transactional_id,
                    self.data.producer_epoch
                );
                target.producer_epoch = self.data.producer_epoch + 1;
            }
            target.last_producer_epoch = self.data.producer_epoch;
        }
        // TV2 may abort without any partition: the start time is then the abort's time.
        if no_partition_added {
            target.txn_start_timestamp_ms = now_ms;
        }
        target.next_producer_id = next_producer_id;
        target.txn_last_update_timestamp_ms = now_ms;
        target.client_transaction_version = client_transaction_version;
        self.prepare_transition_to(target)
    }

    /// What Prepare* moves to once every marker is written. On an exhausted TV2 epoch the
    /// producer moves to `next_producer_id` at epoch 0; `last_producer_epoch` stays the last
    /// epoch the client saw.
    pub fn complete_target(&self, now_ms: i64) -> TxnData {
        assert!(
            self.data.state.is_prepare(),
            "{}: completing {:?}",
            self.transactional_id,
            self.data.state
        );
        let mut target = self.data.clone();
        target.state = if self.data.state == TxnState::PrepareCommit {
            TxnState::CompleteCommit
        } else {
            TxnState::CompleteAbort
        };
        if self.data.client_transaction_version.supports_epoch_bump()
            && self.data.next_producer_id != NO_PRODUCER_ID
        {
            target.producer_id = self.data.next_producer_id;
            target.producer_epoch = 0;
        }
        target.next_producer_id = NO_PRODUCER_ID;
        target.partitions.clear();
        target.txn_last_update_timestamp_ms = now_ms;
        target
    }

    /// Prepares the Complete* transition (after the markers are written).
    pub fn prepare_complete(&mut self, now_ms: i64) -> TxnData {
        // The log append of the Prepare* record worked, so a failed fence is behind us.
        self.has_failed_epoch_fence = false;
        let target = self.complete_target(now_ms);
        self.prepare_transition_to(target)
    }

    /// Expiration of an idle transactional id; its record is a tombstone.
    pub fn prepare_dead(&mut self) -> TxnData {
        let mut target = self.data.clone();
        target.state = TxnState::Dead;
        target.partitions.clear();
        self.prepare_transition_to(target)
    }

    /// Every transition's common checks: nothing else in flight, and a legal move.
    fn prepare_transition_to(&mut self, mut target: TxnData) -> TxnData {
        assert!(
            self.pending_state.is_none(),
            "{}: preparing {:?} while {:?} is pending",
            self.transactional_id,
            target.state,
            self.pending_state
        );
        assert!(
            target.producer_id >= 0,
            "{}: producer id {}",
            self.transactional_id,
            target.producer_id
        );
        assert!(
            target.state == TxnState::Dead || target.producer_epoch >= 0,
            "{}: producer epoch {}",
            self.transactional_id,
            target.producer_epoch
        );
        assert!(
            target
                .state
                .valid_previous_states()
                .contains(&self.data.state),
            "{}: {:?} -> {:?} is not a transition",
            self.transactional_id,
            self.data.state,
            target.state
        );
        // As Kafka's TxnTransitMetadata: the previous producer id is the one before the move.
        target.previous_producer_id = self.data.producer_id;
        self.pending_state = Some(target.state);
        target
    }

    /// Applies a prepared transition whose record is durable. The checks are Kafka's; failing
    /// one means the coordinator is wrong.
    pub fn complete_transition(&mut self, target: TxnData) {
        let to = self.pending_state.unwrap_or_else(|| {
            panic!(
                "{}: completing {:?} with nothing pending",
                self.transactional_id, target.state
            )
        });
        assert_eq!(to, target.state, "{}: pending state", self.transactional_id);
        let current = &self.data;
        let tv2 = target.client_transaction_version.supports_epoch_bump();
        let valid_epoch = || {
            if tv2
                && matches!(
                    target.state,
                    TxnState::CompleteCommit | TxnState::CompleteAbort
                )
                && target.producer_epoch == 0
                && target.producer_id != current.producer_id
            {
                target.last_producer_epoch == current.last_producer_epoch
                    && target.previous_producer_id == current.producer_id
            } else if tv2 && target.state.is_prepare() {
                target.last_producer_epoch == current.producer_epoch
                    && target.producer_id == current.producer_id
            } else {
                target.producer_epoch == current.producer_epoch
                    && target.producer_id == current.producer_id
            }
        };
        let ok = match to {
            TxnState::Empty => {
                let valid_bump = i32::from(target.producer_epoch)
                    == i32::from(current.producer_epoch) + 1
                    || (target.producer_epoch == 0 && target.producer_id != current.producer_id);
                (current.producer_epoch == target.producer_epoch || valid_bump)
                    && target.partitions.is_empty()
                    && target.txn_start_timestamp_ms == -1
            }
            TxnState::Ongoing => {
                valid_epoch()
                    && target.partitions.is_superset(&current.partitions)
                    && target.txn_timeout_ms == current.txn_timeout_ms
            }
            TxnState::PrepareCommit | TxnState::PrepareAbort => {
                let empty_abort = to == TxnState::PrepareAbort
                    && tv2
                    && matches!(
                        current.state,
                        TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
                    );
                valid_epoch()
                    && target.partitions == current.partitions
                    && target.txn_timeout_ms == current.txn_timeout_ms
                    && (target.txn_start_timestamp_ms == current.txn_start_timestamp_ms
                        || empty_abort)
            }
            TxnState::CompleteCommit | TxnState::CompleteAbort => {
                valid_epoch()
                    && target.txn_timeout_ms == current.txn_timeout_ms
                    && target.txn_start_timestamp_ms != -1
            }
            TxnState::PrepareEpochFence | TxnState::Dead => false,
        };
        assert!(
            ok,
            "{}: illegal transition from {:?} to {:?}",
            self.transactional_id, self.data, target
        );
        assert!(
            target.txn_last_update_timestamp_ms >= 0,
            "{}: timestamp {}",
            self.transactional_id,
            target.txn_last_update_timestamp_ms
        );
        self.data = target;
        self.pending_state = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(t: &str, p: i32) -> TopicPartition {
        TopicPartition::new(t, p)
    }

    fn initialised() -> TxnMetadata {
        let mut md = TxnMetadata::new("t", 10, 1000, 0);
        let target = md.prepare_increment_producer_epoch(1000, None, 1).unwrap();
        md.complete_transition(target);
        md
    }

    #[test]
    fn state_ids_and_names_are_kafkas() {
        let expected = [
            (0, "Empty"),
            (1, "Ongoing"),
            (2, "PrepareCommit"),
            (3, "PrepareAbort"),
            (4, "CompleteCommit"),
            (5, "CompleteAbort"),
            (6, "Dead"),
            (7, "PrepareEpochFence"),
        ];
        for (state, (id, name)) in TxnState::ALL.into_iter().zip(expected) {
            assert_eq!(state.id(), id);
            assert_eq!(state.name(), name);
            assert_eq!(TxnState::from_id(id), Some(state));
            assert_eq!(TxnState::from_name(name), Some(state));
        }
        assert_eq!(TxnState::from_id(8), None);
        assert_eq!(TxnState::from_name("ongoing"), None);
    }

    #[test]
    fn first_init_gives_epoch_zero() {
        let md = initialised();
        assert_eq!(md.data.producer_epoch, 0);
        assert_eq!(md.data.state, TxnState::Empty);
        assert!(!md.pending_transition_in_progress());
    }

    #[test]
    fn a_pending_transition_is_visible_until_completed() {
        let mut md = initialised();
        let target = md.prepare_add_partitions(&[tp("a", 0)], 5, TransactionVersion::TV_0);
        assert_eq!(md.pending_state(), Some(TxnState::Ongoing));
        assert_eq!(md.state(), TxnState::Empty);
        md.complete_transition(target);
        assert_eq!(md.state(), TxnState::Ongoing);
        assert_eq!(md.data.txn_start_timestamp_ms, 5);
    }

    #[test]
    #[should_panic(expected = "is pending")]
    fn preparing_twice_is_a_bug() {
        let mut md = initialised();
        md.prepare_add_partitions(&[tp("a", 0)], 5, TransactionVersion::TV_0);
        md.prepare_add_partitions(&[tp("a", 1)], 5, TransactionVersion::TV_0);
    }

    #[test]
    #[should_panic(expected = "is not a transition")]
    fn commit_from_empty_is_a_bug() {
        let mut md = initialised();
        md.prepare_abort_or_commit(
            TxnState::PrepareCommit,
            TransactionVersion::TV_0,
            -1,
            5,
            false,
        );
    }

    #[test]
    fn kip_360_expected_epoch_rules() {
        let mut md = initialised();
        // Continue after an error: bump, remember the last epoch.
        let t = md
            .prepare_increment_producer_epoch(1000, Some(0), 2)
            .unwrap();
        assert_eq!((t.producer_epoch, t.last_producer_epoch), (1, 0));
        md.complete_transition(t);
        // The same request retried: the same epoch again.
        let t = md
            .prepare_increment_producer_epoch(1000, Some(0), 3)
            .unwrap();
        assert_eq!((t.producer_epoch, t.last_producer_epoch), (1, 0));
        md.complete_transition(t);
        // A stale epoch is fenced.
        assert_eq!(
            md.prepare_increment_producer_epoch(1000, Some(7), 4),
            Err(ResponseError::ProducerFenced)
        );
        assert!(!md.pending_transition_in_progress());
    }

    #[test]
    fn tv2_end_bumps_the_epoch_and_exhaustion_moves_to_the_next_id() {
        let mut md = initialised();
        md.data.producer_epoch = i16::MAX - 1;
        let t = md.prepare_add_partitions(&[tp("a", 0)], 5, TransactionVersion::TV_2);
        md.complete_transition(t);
        let t = md.prepare_abort_or_commit(
            TxnState::PrepareCommit,
            TransactionVersion::TV_2,
            77,
            6,
            false,
        );
        assert_eq!(t.producer_epoch, i16::MAX);
        assert_eq!(t.last_producer_epoch, i16::MAX - 1);
        md.complete_transition(t);
        let t = md.prepare_complete(7);
        assert_eq!((t.producer_id, t.producer_epoch), (77, 0));
        assert_eq!(t.previous_producer_id, 10);
        assert_eq!(t.last_producer_epoch, i16::MAX - 1);
        md.complete_transition(t);
        assert_eq!(md.state(), TxnState::CompleteCommit);
        assert!(md.data.partitions.is_empty());
    }

    #[test]
    fn log_value_round_trip_groups_partitions_by_topic() {
        let mut md = initialised();
        let t = md.prepare_add_partitions(
            &[tp("b", 1), tp("a", 2), tp("a", 0)],
            5,
            TransactionVersion::TV_2,
        );
        md.complete_transition(t);
        let v = md.data.to_log_value();
        let entries = v.transaction_partitions.clone().unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].partition_ids, vec![0, 2]);
        let back = TxnData::from_log_value(&v).unwrap();
        let mut expected = md.data.clone();
        expected.last_producer_epoch = NO_PRODUCER_EPOCH;
        assert_eq!(back, expected);
    }

    #[test]
    fn unknown_status_is_an_error() {
        let mut v = initialised().data.to_log_value();
        v.transaction_status = 9;
        assert_eq!(TxnData::from_log_value(&v), Err(UnknownStatus(9)));
    }
}
