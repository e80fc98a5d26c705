//! [`TxnCoordinator`]: the transactional ids of one `__transaction_state` partition and the
//! requests that move them (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
//! DescribeTransactions, ListTransactions), the timeout of transactions and the expiration of
//! idle ids. No IO: each call takes the time and returns what the caller must do. See `mod.rs`
//! for the protocol between the two.

use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;
use kafka_protocol::messages::ProducerId;
use kafka_protocol::ResponseError;

use super::metadata::{
    is_epoch_exhausted, TopicPartition, TransactionVersion, TxnData, TxnMetadata, TxnState,
    UnknownStatus, NO_PRODUCER_EPOCH, NO_PRODUCER_ID,
};
use super::records::{self, DecodeError};
use crate::group::offsets_topic::OFFSETS_TOPIC;

/// Kafka's `transaction.max.timeout.ms` default: 15 minutes.
pub const TRANSACTION_MAX_TIMEOUT_MS_DEFAULT: i32 = 15 * 60 * 1000;
/// Kafka's `transactional.id.expiration.ms` default: 7 days.
pub const TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT: i64 = 7 * 24 * 60 * 60 * 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnConfig {
    /// `transaction.max.timeout.ms`: the longest timeout InitProducerId may ask for.
    pub transaction_max_timeout_ms: i32,
    /// `transactional.id.expiration.ms`: how long an idle transactional id is kept.
    pub transactional_id_expiration_ms: i64,
    /// The cluster's `transaction.version` feature level: it picks the record version written
    /// and how the coordinator's own aborts (fencing, timeouts) bump the epoch.
    pub transaction_version_level: TransactionVersion,
}

impl Default for TxnConfig {
    fn default() -> Self {
        TxnConfig {
            transaction_max_timeout_ms: TRANSACTION_MAX_TIMEOUT_MS_DEFAULT,
            transactional_id_expiration_ms: TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT,
            transaction_version_level: TransactionVersion::TV_2,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnResult {
    Commit,
    Abort,
}

impl TxnResult {
    fn prepare_state(self) -> TxnState {
        match self {
            TxnResult::Commit => TxnState::PrepareCommit,
            TxnResult::Abort => TxnState::PrepareAbort,
        }
    }
}

/// Why a record is being appended: what its completion answers, and to whom.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendKind {
    /// A new epoch (or producer id) for InitProducerId.
    InitProducerId,
    /// InitProducerId found an ongoing transaction: it is fenced and aborted, and the client
    /// is told CONCURRENT_TRANSACTIONS so that it retries once the abort is done.
    FenceForInitProducerId,
    AddPartitions,
    AddOffsets,
    EndTxn {
        result: TxnResult,
        client_transaction_version: TransactionVersion,
    },
    /// The coordinator aborts a transaction past its timeout; nobody waits for it.
    TimeoutAbort,
    /// Complete* after every marker is written; nobody waits for it.
    Complete,
    /// The tombstone of an expired transactional id.
    Expire,
}

/// A record the caller must append to this coordinator's `__transaction_state` partition (with
/// acks=all, uncompressed), then hand back to [`TxnCoordinator::complete_append`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnAppend {
    pub transactional_id: String,
    pub coordinator_epoch: i32,
    pub kind: AppendKind,
    pub key: Bytes,
    /// `None`: a tombstone.
    pub value: Option<Bytes>,
}

/// A reply to a client. `error: None` is success.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnResponse {
    InitProducerId {
        error: Option<ResponseError>,
        producer_id: ProducerId,
        producer_epoch: i16,
    },
    /// The same error for every partition of the request.
    AddPartitions {
        error: Option<ResponseError>,
    },
    AddOffsets {
        error: Option<ResponseError>,
    },
    /// With transaction version 2 the producer id and epoch the producer continues with; -1
    /// otherwise.
    EndTxn {
        error: Option<ResponseError>,
        producer_id: ProducerId,
        producer_epoch: i16,
    },
}

/// What a request leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Reply now; nothing changed.
    Respond(TxnResponse),
    /// Append this record; the reply comes from `complete_append`.
    Append(TxnAppend),
}

/// Markers the caller must write (WriteTxnMarkers to each partition's leader) before calling
/// [`TxnCoordinator::complete_markers`]. An empty partition list (a TV2 abort with nothing
/// added) needs no marker: complete at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnMarkers {
    pub transactional_id: String,
    pub producer_id: ProducerId,
    pub producer_epoch: i16,
    pub result: TxnResult,
    pub coordinator_epoch: i32,
    pub partitions: Vec<TopicPartition>,
}

/// The outcome of an append.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Completion {
    /// The reply to the request that caused the append, if a client waits for one.
    pub response: Option<TxnResponse>,
    /// Markers to write, when a transaction's end became durable.
    pub markers: Option<TxnMarkers>,
    /// A Complete* record that failed to append and must be appended again (Kafka retries
    /// these until it stops being the coordinator).
    pub retry: Option<TxnAppend>,
}

/// An ongoing transaction past its timeout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimedOutTxn {
    pub transactional_id: String,
    pub producer_id: ProducerId,
    pub producer_epoch: i16,
}

/// DescribeTransactions for one id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnDescription {
    pub transactional_id: String,
    pub state: &'static str,
    pub producer_id: ProducerId,
    pub producer_epoch: i16,
    pub transaction_timeout_ms: i32,
    pub transaction_start_time_ms: i64,
    /// Topic and its partitions, by topic.
    pub topics: Vec<(String, Vec<i32>)>,
}

/// One entry of ListTransactions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnListing {
    pub transactional_id: String,
    pub producer_id: ProducerId,
    pub state: &'static str,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnList {
    pub transaction_states: Vec<TxnListing>,
    /// State filters that name no state.
    pub unknown_state_filters: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadError {
    Decode { index: usize, error: DecodeError },
    UnknownStatus { index: usize, status: i8 },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Decode { index, error } => write!(f, "record {index}: {error}"),
            LoadError::UnknownStatus { index, status } => {
                write!(f, "record {index}: unknown transaction status {status}")
            }
        }
    }
}

impl std::error::Error for LoadError {}

/// Allocates a producer id (from the broker's block, which the controller hands out). An error
/// goes to the client, as Kafka's `ProducerIdManager` errors do (e.g. COORDINATOR_LOAD_IN_PROGRESS
/// while no block is at hand, so that the client retries).
pub type ProducerIds<'a> = &'a mut dyn FnMut() -> Result<i64, ResponseError>;

/// KIP-360: the producer id and epoch an InitProducerId carries; both -1 means none, one of
/// them -1 is INVALID_REQUEST (as Kafka's request handler decides).
pub fn expected_producer(
    producer_id: ProducerId,
    producer_epoch: i16,
) -> Result<Option<(ProducerId, i16)>, ResponseError> {
    match (
        producer_id.0 == NO_PRODUCER_ID,
        producer_epoch == NO_PRODUCER_EPOCH,
    ) {
        (true, true) => Ok(None),
        (false, false) => Ok(Some((producer_id, producer_epoch))),
        _ => Err(ResponseError::InvalidRequest),
    }
}

/// Clients older than KIP-588 do not know PRODUCER_FENCED; Kafka answers them
/// INVALID_PRODUCER_EPOCH instead (InitProducerId below v4, AddPartitionsToTxn, AddOffsetsToTxn
/// and EndTxn below v2).
pub fn error_for_client(
    error: Option<ResponseError>,
    client_knows_producer_fenced: bool,
) -> Option<ResponseError> {
    match error {
        Some(ResponseError::ProducerFenced) if !client_knows_producer_fenced => {
            Some(ResponseError::InvalidProducerEpoch)
        }
        other => other,
    }
}

/// Kafka's translation of a failed `__transaction_state` append into the coordinator error the
/// client sees.
fn coordinator_error(append_error: ResponseError) -> ResponseError {
    use ResponseError::*;
    match append_error {
        UnknownTopicOrPartition
        | NotEnoughReplicas
        | NotEnoughReplicasAfterAppend
        | RequestTimedOut => CoordinatorNotAvailable,
        NotLeaderOrFollower | KafkaStorageError => NotCoordinator,
        MessageTooLarge | RecordListTooLarge => UnknownServerError,
        other => other,
    }
}

fn error_response(kind: AppendKind, error: ResponseError) -> Option<TxnResponse> {
    let error = Some(error);
    match kind {
        AppendKind::InitProducerId | AppendKind::FenceForInitProducerId => {
            Some(TxnResponse::InitProducerId {
                error,
                producer_id: ProducerId(NO_PRODUCER_ID),
                producer_epoch: NO_PRODUCER_EPOCH,
            })
        }
        AppendKind::AddPartitions => Some(TxnResponse::AddPartitions { error }),
        AppendKind::AddOffsets => Some(TxnResponse::AddOffsets { error }),
        AppendKind::EndTxn { .. } => Some(TxnResponse::EndTxn {
            error,
            producer_id: ProducerId(NO_PRODUCER_ID),
            producer_epoch: NO_PRODUCER_EPOCH,
        }),
        AppendKind::TimeoutAbort | AppendKind::Complete | AppendKind::Expire => None,
    }
}

fn init_error(error: ResponseError) -> Step {
    Step::Respond(error_response(AppendKind::InitProducerId, error).expect("a response"))
}

fn add_response(kind: AppendKind, error: Option<ResponseError>) -> Step {
    Step::Respond(match kind {
        AppendKind::AddOffsets => TxnResponse::AddOffsets { error },
        _ => TxnResponse::AddPartitions { error },
    })
}

fn end_response(error: Option<ResponseError>, producer_id: i64, producer_epoch: i16) -> Step {
    Step::Respond(TxnResponse::EndTxn {
        error,
        producer_id: ProducerId(producer_id),
        producer_epoch,
    })
}

fn end_error(error: ResponseError) -> Step {
    end_response(Some(error), NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
}

/// A record being appended: the transition it completes.
#[derive(Clone, Debug)]
struct InFlight {
    target: TxnData,
    kind: AppendKind,
}

/// The transactional ids of one `__transaction_state` partition, on the shard that leads it.
#[derive(Debug)]
pub struct TxnCoordinator {
    config: TxnConfig,
    /// The partition's leader epoch when this coordinator was loaded; markers carry it so that
    /// partitions ignore markers from an older coordinator.
    coordinator_epoch: i32,
    txns: BTreeMap<String, TxnMetadata>,
    /// The transition of every record being appended, by transactional id. A transactional id
    /// is here exactly when its pending state is that of an append (not of markers).
    in_flight: BTreeMap<String, InFlight>,
}

impl TxnCoordinator {
    /// The cluster's `transaction.version` from now on: the records this coordinator writes, and
    /// how its own aborts bump epochs, follow it.
    pub fn set_transaction_version(&mut self, level: TransactionVersion) {
        self.config.transaction_version_level = level;
    }

    /// A coordinator for a partition with no records yet.
    pub fn new(config: TxnConfig, coordinator_epoch: i32) -> Self {
        TxnCoordinator {
            config,
            coordinator_epoch,
            txns: BTreeMap::new(),
            in_flight: BTreeMap::new(),
        }
    }

    /// Rebuilds the coordinator from the partition's records, in log order (when this broker
    /// becomes the partition's leader). Keys of other versions are skipped, as Kafka does. The
    /// transactions caught in PrepareCommit/PrepareAbort are returned: their markers must be
    /// (re)written, then `complete_markers` called, as after an EndTxn.
    pub fn load<I, K, V>(
        config: TxnConfig,
        coordinator_epoch: i32,
        log: I,
    ) -> Result<(TxnCoordinator, Vec<TxnMarkers>), LoadError>
    where
        I: IntoIterator<Item = (K, Option<V>)>,
        K: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let mut coordinator = TxnCoordinator::new(config, coordinator_epoch);
        for (index, (key, value)) in log.into_iter().enumerate() {
            let record =
                match records::decode_record(key.as_ref(), value.as_ref().map(|v| v.as_ref())) {
                    Ok(record) => record,
                    Err(DecodeError::UnknownKeyVersion(version)) => {
                        tracing::warn!(
                            index,
                            version,
                            "skipping a __transaction_state record of unknown key version"
                        );
                        continue;
                    }
                    Err(error) => return Err(LoadError::Decode { index, error }),
                };
            match record.value {
                None => {
                    coordinator.txns.remove(&record.transactional_id);
                }
                Some(value) => {
                    let data =
                        TxnData::from_log_value(&value).map_err(|UnknownStatus(status)| {
                            LoadError::UnknownStatus { index, status }
                        })?;
                    let md = TxnMetadata::loaded(&record.transactional_id, data);
                    coordinator.txns.insert(record.transactional_id, md);
                }
            }
        }
        let mut markers = Vec::new();
        for md in coordinator.txns.values_mut() {
            if md.state().is_prepare() {
                markers.push(Self::markers_of(md, coordinator_epoch));
                md.set_pending(complete_state_of(md.state()));
            }
        }
        Ok((coordinator, markers))
    }

    pub fn config(&self) -> &TxnConfig {
        &self.config
    }

    pub fn coordinator_epoch(&self) -> i32 {
        self.coordinator_epoch
    }

    pub fn get(&self, transactional_id: &str) -> Option<&TxnMetadata> {
        self.txns.get(transactional_id)
    }

    pub fn iter(&self) -> impl Iterator<Item = &TxnMetadata> {
        self.txns.values()
    }

    pub fn len(&self) -> usize {
        self.txns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.txns.is_empty()
    }

    /// InitProducerId for a transactional id (the idempotent case, without one, is not the
    /// coordinator's). `expected` is the KIP-360 producer id and epoch of a producer that
    /// continues after an error ([`expected_producer`]). Kafka's coordinator takes no client
    /// transaction version here: its own abort of an ongoing transaction uses the cluster's.
    pub fn init_producer_id(
        &mut self,
        transactional_id: &str,
        transaction_timeout_ms: i32,
        expected: Option<(ProducerId, i16)>,
        producer_ids: ProducerIds<'_>,
        now_ms: i64,
    ) -> Step {
        if transactional_id.is_empty() {
            return init_error(ResponseError::InvalidRequest);
        }
        if transaction_timeout_ms <= 0
            || transaction_timeout_ms > self.config.transaction_max_timeout_ms
        {
            return init_error(ResponseError::InvalidTransactionTimeout);
        }
        if !self.txns.contains_key(transactional_id) {
            let producer_id = match producer_ids() {
                Ok(id) => id,
                Err(e) => return init_error(e),
            };
            let md = TxnMetadata::new(
                transactional_id,
                producer_id,
                transaction_timeout_ms,
                now_ms,
            );
            self.txns.insert(transactional_id.to_string(), md);
        }
        let md = self.txns.get_mut(transactional_id).expect("inserted above");
        if md.pending_transition_in_progress() {
            return init_error(ResponseError::ConcurrentTransactions);
        }
        if let Some((expected_id, expected_epoch)) = expected {
            // Fence the caller unless: the id was just created (a producer recovering from
            // UNKNOWN_PRODUCER_ID), it names the current producer id (the epoch is checked when
            // bumping), or it names the previous id at an exhausted epoch (a retry of a rotation
            // whose response was lost).
            let valid = md.data.producer_epoch == NO_PRODUCER_EPOCH
                || expected_id.0 == md.data.producer_id
                || (expected_id.0 == md.data.previous_producer_id
                    && is_epoch_exhausted(expected_epoch));
            if !valid {
                return init_error(ResponseError::ProducerFenced);
            }
        }
        match md.state() {
            TxnState::PrepareCommit | TxnState::PrepareAbort => {
                init_error(ResponseError::ConcurrentTransactions)
            }
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
                let rotate = md.is_producer_epoch_exhausted()
                    && expected.is_none_or(|(_, epoch)| epoch == md.data.producer_epoch);
                let target = if rotate {
                    match producer_ids() {
                        Ok(id) => md.prepare_producer_id_rotation(
                            id,
                            transaction_timeout_ms,
                            now_ms,
                            expected.is_some(),
                        ),
                        Err(e) => return init_error(e),
                    }
                } else {
                    match md.prepare_increment_producer_epoch(
                        transaction_timeout_ms,
                        expected.map(|(_, epoch)| epoch),
                        now_ms,
                    ) {
                        Ok(target) => target,
                        Err(e) => return init_error(e),
                    }
                };
                Step::Append(self.begin_append(
                    transactional_id,
                    target,
                    AppendKind::InitProducerId,
                ))
            }
            // The producer restarted mid-transaction: fence the old instance and abort. The
            // fenced epoch is never returned; the client retries and gets a fresh bump (or a
            // new producer id, if fencing exhausted the epochs).
            TxnState::Ongoing => Step::Append(self.fence_and_abort(
                transactional_id,
                AppendKind::FenceForInitProducerId,
                now_ms,
            )),
            TxnState::Dead | TxnState::PrepareEpochFence => {
                panic!("{transactional_id}: found in {:?}", md.state())
            }
        }
    }

    /// AddPartitionsToTxn from a client, or (KIP-890, transaction version 2) from a partition
    /// leader adding a partition on the producer's behalf.
    pub fn add_partitions(
        &mut self,
        transactional_id: &str,
        producer_id: ProducerId,
        producer_epoch: i16,
        partitions: &[TopicPartition],
        client_transaction_version: TransactionVersion,
        now_ms: i64,
    ) -> Step {
        self.add(
            AppendKind::AddPartitions,
            transactional_id,
            producer_id,
            producer_epoch,
            partitions,
            client_transaction_version,
            now_ms,
        )
    }

    /// AddOffsetsToTxn: adds the group's `__consumer_offsets` partition (its index is the
    /// caller's to compute, from the group id and the topic's partition count).
    pub fn add_offsets(
        &mut self,
        transactional_id: &str,
        producer_id: ProducerId,
        producer_epoch: i16,
        offsets_partition_index: i32,
        now_ms: i64,
    ) -> Step {
        // Kafka's request handler adds the partition as a transaction version 0 client would.
        let partition = TopicPartition::new(OFFSETS_TOPIC, offsets_partition_index);
        self.add(
            AppendKind::AddOffsets,
            transactional_id,
            producer_id,
            producer_epoch,
            &[partition],
            TransactionVersion::TV_0,
            now_ms,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        kind: AppendKind,
        transactional_id: &str,
        producer_id: ProducerId,
        producer_epoch: i16,
        partitions: &[TopicPartition],
        client_transaction_version: TransactionVersion,
        now_ms: i64,
    ) -> Step {
        if transactional_id.is_empty() {
            return add_response(kind, Some(ResponseError::InvalidRequest));
        }
        let Some(md) = self.txns.get_mut(transactional_id) else {
            return add_response(kind, Some(ResponseError::InvalidProducerIdMapping));
        };
        // Checked first (as Kafka 4 does) so that a TV2 producer moving to a new producer id
        // that is still pending gets a retriable error.
        if md.pending_transition_in_progress() {
            return add_response(kind, Some(ResponseError::ConcurrentTransactions));
        }
        if md.data.producer_id != producer_id.0 {
            return add_response(kind, Some(ResponseError::InvalidProducerIdMapping));
        }
        if md.data.producer_epoch != producer_epoch {
            return add_response(kind, Some(ResponseError::ProducerFenced));
        }
        match md.state() {
            TxnState::PrepareCommit | TxnState::PrepareAbort => {
                add_response(kind, Some(ResponseError::ConcurrentTransactions))
            }
            TxnState::Ongoing if partitions.iter().all(|p| md.data.partitions.contains(p)) => {
                add_response(kind, None)
            }
            TxnState::Dead | TxnState::PrepareEpochFence => {
                panic!("{transactional_id}: found in {:?}", md.state())
            }
            TxnState::Empty
            | TxnState::Ongoing
            | TxnState::CompleteCommit
            | TxnState::CompleteAbort => {
                let target =
                    md.prepare_add_partitions(partitions, now_ms, client_transaction_version);
                Step::Append(self.begin_append(transactional_id, target, kind))
            }
        }
    }

    /// AddPartitionsToTxn with `verify_only` (KIP-890 part 1): a partition leader asks whether
    /// partitions are already in the ongoing transaction before accepting a transactional
    /// produce. Nothing changes. Per partition: `None` when it is in the transaction,
    /// TRANSACTION_ABORTABLE when it is not, or the request's error.
    pub fn verify_partitions(
        &self,
        transactional_id: &str,
        producer_id: ProducerId,
        producer_epoch: i16,
        partitions: &[TopicPartition],
    ) -> Vec<(TopicPartition, Option<ResponseError>)> {
        let all = |e: ResponseError| partitions.iter().map(|p| (p.clone(), Some(e))).collect();
        if transactional_id.is_empty() {
            return all(ResponseError::InvalidRequest);
        }
        let Some(md) = self.txns.get(transactional_id) else {
            return all(ResponseError::InvalidProducerIdMapping);
        };
        if md.data.producer_id != producer_id.0 {
            return all(ResponseError::InvalidProducerIdMapping);
        }
        if md.data.producer_epoch != producer_epoch {
            return all(ResponseError::ProducerFenced);
        }
        // The pending state is not checked: partitions only count once their record is durable.
        if md.state().is_prepare() {
            return all(ResponseError::ConcurrentTransactions);
        }
        partitions
            .iter()
            .map(|p| {
                let error = (!md.data.partitions.contains(p))
                    .then_some(ResponseError::TransactionAbortable);
                (p.clone(), error)
            })
            .collect()
    }

    /// EndTxn. `client_transaction_version` is 2 for EndTxn v5+ (KIP-890 part 2: the epoch is
    /// bumped by every end, and the response carries the epoch to continue with), 0 below.
    /// `producer_ids` is called only when a TV2 end exhausts the epoch.
    #[allow(clippy::too_many_arguments)]
    pub fn end_txn(
        &mut self,
        transactional_id: &str,
        producer_id: ProducerId,
        producer_epoch: i16,
        result: TxnResult,
        client_transaction_version: TransactionVersion,
        producer_ids: ProducerIds<'_>,
        now_ms: i64,
    ) -> Step {
        if transactional_id.is_empty() {
            return end_error(ResponseError::InvalidRequest);
        }
        if !self.txns.contains_key(transactional_id) {
            return end_error(ResponseError::InvalidProducerIdMapping);
        }
        if client_transaction_version.supports_epoch_bump() {
            self.end_txn_v2(
                transactional_id,
                producer_id.0,
                producer_epoch,
                result,
                client_transaction_version,
                producer_ids,
                now_ms,
            )
        } else {
            self.end_txn_v1(
                transactional_id,
                producer_id.0,
                producer_epoch,
                result,
                now_ms,
            )
        }
    }

    fn end_txn_v1(
        &mut self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        result: TxnResult,
        now_ms: i64,
    ) -> Step {
        let md = self
            .txns
            .get_mut(transactional_id)
            .expect("checked by end_txn");
        if md.data.producer_id != producer_id {
            return end_error(ResponseError::InvalidProducerIdMapping);
        }
        // A client's end must carry exactly the current epoch.
        if md.data.producer_epoch != producer_epoch {
            return end_error(ResponseError::ProducerFenced);
        }
        if md.pending_transition_in_progress() {
            return end_error(ResponseError::ConcurrentTransactions);
        }
        let ok = end_response(None, NO_PRODUCER_ID, NO_PRODUCER_EPOCH);
        let commit = result == TxnResult::Commit;
        match md.state() {
            TxnState::Ongoing => {
                let target = md.prepare_abort_or_commit(
                    result.prepare_state(),
                    TransactionVersion::TV_0,
                    NO_PRODUCER_ID,
                    now_ms,
                    false,
                );
                let kind = AppendKind::EndTxn {
                    result,
                    client_transaction_version: TransactionVersion::TV_0,
                };
                Step::Append(self.begin_append(transactional_id, target, kind))
            }
            // A retry of an end that is done.
            TxnState::CompleteCommit if commit => ok,
            TxnState::CompleteAbort if !commit => ok,
            // A retry of an end whose markers are still being written.
            TxnState::PrepareCommit if commit => end_error(ResponseError::ConcurrentTransactions),
            TxnState::PrepareAbort if !commit => end_error(ResponseError::ConcurrentTransactions),
            TxnState::Empty
            | TxnState::CompleteCommit
            | TxnState::CompleteAbort
            | TxnState::PrepareCommit
            | TxnState::PrepareAbort => end_error(ResponseError::InvalidTxnState),
            TxnState::Dead | TxnState::PrepareEpochFence => {
                panic!("{transactional_id}: found in {:?}", md.state())
            }
        }
    }

    /// Transaction version 2. Kafka's table for the idle states ("retry" is the epoch before
    /// the current one, i.e. a retried end whose bump is durable; PF = PRODUCER_FENCED,
    /// ITS = INVALID_TXN_STATE, EB = success with an epoch bump):
    ///
    /// ```text
    ///                  Abort            Commit
    ///                  retry  current   retry  current
    /// Empty            PF     EB        PF     ITS
    /// CompleteAbort    NONE   EB        ITS    ITS
    /// CompleteCommit   ITS    EB        NONE   ITS
    /// ```
    #[allow(clippy::too_many_arguments)]
    fn end_txn_v2(
        &mut self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        result: TxnResult,
        client_transaction_version: TransactionVersion,
        producer_ids: ProducerIds<'_>,
        now_ms: i64,
    ) -> Step {
        let md = self
            .txns
            .get_mut(transactional_id)
            .expect("checked by end_txn");
        let current_epoch = md.data.producer_epoch;
        // The retried end moved the producer to a new id at epoch 0 (epoch overflow).
        let retry_on_overflow = md.data.previous_producer_id == producer_id
            && producer_epoch == i16::MAX - 1
            && current_epoch == 0;
        // The retried end's bump is durable.
        let retry_on_epoch_bump = i32::from(current_epoch) == i32::from(producer_epoch) + 1;
        let is_retry = retry_on_epoch_bump || retry_on_overflow;
        let valid_epoch = match md.state() {
            TxnState::PrepareCommit | TxnState::PrepareAbort => retry_on_epoch_bump,
            TxnState::CompleteCommit | TxnState::CompleteAbort => {
                is_retry || producer_epoch == current_epoch
            }
            _ => producer_epoch == current_epoch,
        };
        if md.data.producer_id != producer_id && !retry_on_overflow {
            return end_error(ResponseError::InvalidProducerIdMapping);
        }
        // The pending transition before the epoch (Kafka's KAFKA-18464): the next
        // transaction's end, sent at the epoch the previous end bumped while that end's markers
        // are still being written, is told to retry, not fenced. Only the current end can have
        // a transition pending here, so no older request gets through by it.
        if md.pending_transition_in_progress() {
            return end_error(ResponseError::ConcurrentTransactions);
        }
        if !valid_epoch {
            return end_error(ResponseError::ProducerFenced);
        }
        let commit = result == TxnResult::Commit;
        let ok = end_response(None, md.data.producer_id, current_epoch);
        // (next state, whether no partition was added), or the answer.
        let next = match md.state() {
            TxnState::Ongoing => Ok((result.prepare_state(), false)),
            TxnState::CompleteCommit if commit => {
                if is_retry {
                    Err(ok)
                } else {
                    Err(end_error(ResponseError::InvalidTxnState))
                }
            }
            TxnState::CompleteCommit => {
                if is_retry {
                    Err(end_error(ResponseError::InvalidTxnState))
                } else {
                    Ok((TxnState::PrepareAbort, true))
                }
            }
            TxnState::CompleteAbort if !commit => {
                if is_retry {
                    Err(ok)
                } else {
                    Ok((TxnState::PrepareAbort, true))
                }
            }
            TxnState::CompleteAbort => Err(end_error(ResponseError::InvalidTxnState)),
            TxnState::PrepareCommit if commit => {
                Err(end_error(ResponseError::ConcurrentTransactions))
            }
            TxnState::PrepareAbort if !commit => {
                Err(end_error(ResponseError::ConcurrentTransactions))
            }
            TxnState::PrepareCommit | TxnState::PrepareAbort => {
                Err(end_error(ResponseError::InvalidTxnState))
            }
            TxnState::Empty if !commit => Ok((TxnState::PrepareAbort, true)),
            TxnState::Empty => Err(end_error(ResponseError::InvalidTxnState)),
            TxnState::Dead | TxnState::PrepareEpochFence => {
                panic!("{transactional_id}: found in {:?}", md.state())
            }
        };
        let (next_state, no_partition_added) = match next {
            Ok(next) => next,
            Err(step) => return step,
        };
        // Bumping an exhausted epoch moves the producer to a new id once the end completes.
        let next_producer_id = if md.is_producer_epoch_exhausted() {
            match producer_ids() {
                Ok(id) => id,
                Err(e) => return end_error(e),
            }
        } else {
            NO_PRODUCER_ID
        };
        let target = md.prepare_abort_or_commit(
            next_state,
            client_transaction_version,
            next_producer_id,
            now_ms,
            no_partition_added,
        );
        let kind = AppendKind::EndTxn {
            result,
            client_transaction_version,
        };
        Step::Append(self.begin_append(transactional_id, target, kind))
    }

    /// Fences the producer of an ongoing transaction (an epoch bump, at once in memory) and
    /// prepares its abort, as the cluster's transaction version bumps (Kafka's
    /// PrepareEpochFence, which is prepared and left within this one call).
    fn fence_and_abort(
        &mut self,
        transactional_id: &str,
        kind: AppendKind,
        now_ms: i64,
    ) -> TxnAppend {
        let tv = if self.config.transaction_version_level.supports_epoch_bump() {
            self.config.transaction_version_level
        } else {
            TransactionVersion::TV_0
        };
        let md = self
            .txns
            .get_mut(transactional_id)
            .expect("fencing a known id");
        md.fence_producer_epoch();
        let target =
            md.prepare_abort_or_commit(TxnState::PrepareAbort, tv, NO_PRODUCER_ID, now_ms, false);
        self.begin_append(transactional_id, target, kind)
    }

    fn begin_append(
        &mut self,
        transactional_id: &str,
        target: TxnData,
        kind: AppendKind,
    ) -> TxnAppend {
        let value = (target.state != TxnState::Dead).then(|| {
            let version = self.config.transaction_version_level.log_value_version();
            target.to_log_value().encode(version)
        });
        let previous = self
            .in_flight
            .insert(transactional_id.to_string(), InFlight { target, kind });
        assert!(
            previous.is_none(),
            "{transactional_id}: two appends in flight ({:?} and {kind:?})",
            previous.map(|p| p.kind)
        );
        TxnAppend {
            transactional_id: transactional_id.to_string(),
            coordinator_epoch: self.coordinator_epoch,
            kind,
            key: records::encode_key(transactional_id),
            value,
        }
    }

    fn markers_of(md: &TxnMetadata, coordinator_epoch: i32) -> TxnMarkers {
        let result = match md.state() {
            TxnState::PrepareCommit => TxnResult::Commit,
            TxnState::PrepareAbort => TxnResult::Abort,
            other => panic!("{}: markers in {other:?}", md.transactional_id),
        };
        TxnMarkers {
            transactional_id: md.transactional_id.clone(),
            producer_id: ProducerId(md.data.producer_id),
            producer_epoch: md.data.producer_epoch,
            result,
            coordinator_epoch,
            partitions: md.data.partitions.iter().cloned().collect(),
        }
    }

    /// The append of `append` finished: `Ok` once the record is on every in-sync replica, or
    /// the append's error. Applies (or drops) the transition and says what comes next.
    pub fn complete_append(
        &mut self,
        append: &TxnAppend,
        result: Result<(), ResponseError>,
        now_ms: i64,
    ) -> Completion {
        let transactional_id = append.transactional_id.as_str();
        if append.coordinator_epoch != self.coordinator_epoch {
            // The partition moved away and back while the record was being appended.
            return Completion {
                response: error_response(append.kind, ResponseError::NotCoordinator),
                ..Completion::default()
            };
        }
        let in_flight = self.in_flight.remove(transactional_id).unwrap_or_else(|| {
            panic!(
                "{transactional_id}: {:?} completed with nothing in flight",
                append.kind
            )
        });
        assert_eq!(
            in_flight.kind, append.kind,
            "{transactional_id}: append kind"
        );
        let md = self
            .txns
            .get_mut(transactional_id)
            .expect("an id with an append in flight");
        assert_eq!(
            md.pending_state(),
            Some(in_flight.target.state),
            "{transactional_id}: pending state"
        );
        let kind = in_flight.kind;
        if let Err(append_error) = result {
            let error = coordinator_error(append_error);
            tracing::info!(
                transactional_id,
                ?kind,
                ?error,
                "__transaction_state append failed"
            );
            return match kind {
                AppendKind::Complete => {
                    // Still pending: markers are written, only the record is missing.
                    self.in_flight
                        .insert(transactional_id.to_string(), in_flight);
                    Completion {
                        retry: Some(append.clone()),
                        ..Completion::default()
                    }
                }
                AppendKind::FenceForInitProducerId | AppendKind::TimeoutAbort => {
                    md.clear_pending();
                    md.has_failed_epoch_fence = true;
                    Completion {
                        response: error_response(kind, error),
                        ..Completion::default()
                    }
                }
                _ => {
                    md.clear_pending();
                    Completion {
                        response: error_response(kind, error),
                        ..Completion::default()
                    }
                }
            };
        }
        match kind {
            AppendKind::Expire => {
                self.txns.remove(transactional_id);
                Completion::default()
            }
            AppendKind::InitProducerId => {
                md.complete_transition(in_flight.target);
                Completion {
                    response: Some(TxnResponse::InitProducerId {
                        error: None,
                        producer_id: ProducerId(md.data.producer_id),
                        producer_epoch: md.data.producer_epoch,
                    }),
                    ..Completion::default()
                }
            }
            AppendKind::AddPartitions | AppendKind::AddOffsets => {
                md.complete_transition(in_flight.target);
                let response = if kind == AppendKind::AddOffsets {
                    TxnResponse::AddOffsets { error: None }
                } else {
                    TxnResponse::AddPartitions { error: None }
                };
                Completion {
                    response: Some(response),
                    ..Completion::default()
                }
            }
            AppendKind::EndTxn { .. }
            | AppendKind::FenceForInitProducerId
            | AppendKind::TimeoutAbort => {
                md.complete_transition(in_flight.target);
                md.has_failed_epoch_fence = false;
                let markers = Self::markers_of(md, self.coordinator_epoch);
                let response = match kind {
                    AppendKind::EndTxn {
                        client_transaction_version,
                        ..
                    } if client_transaction_version.supports_epoch_bump() => {
                        // The identity the producer continues with: after an overflow, the next
                        // producer id at epoch 0.
                        let next = md.complete_target(now_ms);
                        Some(TxnResponse::EndTxn {
                            error: None,
                            producer_id: ProducerId(next.producer_id),
                            producer_epoch: next.producer_epoch,
                        })
                    }
                    AppendKind::EndTxn { .. } => Some(TxnResponse::EndTxn {
                        error: None,
                        producer_id: ProducerId(NO_PRODUCER_ID),
                        producer_epoch: NO_PRODUCER_EPOCH,
                    }),
                    AppendKind::FenceForInitProducerId => {
                        error_response(kind, ResponseError::ConcurrentTransactions)
                    }
                    _ => None,
                };
                md.set_pending(complete_state_of(md.state()));
                Completion {
                    response,
                    markers: Some(markers),
                    retry: None,
                }
            }
            AppendKind::Complete => {
                md.complete_transition(in_flight.target);
                Completion::default()
            }
        }
    }

    /// Every marker of the transaction is written: returns the Complete* record to append (then
    /// `complete_append`). `None` when the id is not waiting for its markers.
    pub fn complete_markers(&mut self, transactional_id: &str, now_ms: i64) -> Option<TxnAppend> {
        let md = self.txns.get_mut(transactional_id)?;
        if !md.state().is_prepare()
            || self.in_flight.contains_key(transactional_id)
            || md.pending_state() != Some(complete_state_of(md.state()))
        {
            return None;
        }
        md.clear_pending();
        let target = md.prepare_complete(now_ms);
        Some(self.begin_append(transactional_id, target, AppendKind::Complete))
    }

    /// Ongoing transactions past their timeout with nothing in flight (Kafka's
    /// `timedOutTransactions`).
    pub fn timed_out(&self, now_ms: i64) -> Vec<TimedOutTxn> {
        self.txns
            .values()
            .filter(|md| {
                !md.pending_transition_in_progress()
                    && md.state() == TxnState::Ongoing
                    && md.data.txn_start_timestamp_ms + i64::from(md.data.txn_timeout_ms) < now_ms
            })
            .map(|md| TimedOutTxn {
                transactional_id: md.transactional_id.clone(),
                producer_id: ProducerId(md.data.producer_id),
                producer_epoch: md.data.producer_epoch,
            })
            .collect()
    }

    /// Aborts every timed-out transaction: each producer is fenced by an epoch bump, as Kafka's
    /// `abortTimedOutTransactions` does. Append each record, then `complete_append`.
    pub fn abort_timed_out(&mut self, now_ms: i64) -> Vec<TxnAppend> {
        self.timed_out(now_ms)
            .into_iter()
            .map(|t| self.fence_and_abort(&t.transactional_id, AppendKind::TimeoutAbort, now_ms))
            .collect()
    }

    /// Tombstones for idle transactional ids (Empty or Complete*, nothing in flight) not
    /// updated for `transactional.id.expiration.ms`. Append each, then `complete_append`; the
    /// id is forgotten once its tombstone is durable.
    pub fn expire_transactional_ids(&mut self, now_ms: i64) -> Vec<TxnAppend> {
        let deadline = now_ms - self.config.transactional_id_expiration_ms;
        let expired: Vec<String> = self
            .txns
            .values()
            .filter(|md| {
                !md.pending_transition_in_progress()
                    && md.state().expiration_allowed()
                    && md.data.txn_last_update_timestamp_ms <= deadline
            })
            .map(|md| md.transactional_id.clone())
            .collect();
        expired
            .into_iter()
            .map(|id| {
                let target = self.txns.get_mut(&id).expect("listed above").prepare_dead();
                self.begin_append(&id, target, AppendKind::Expire)
            })
            .collect()
    }

    /// DescribeTransactions for one id.
    pub fn describe(&self, transactional_id: &str) -> Result<TxnDescription, ResponseError> {
        if transactional_id.is_empty() {
            return Err(ResponseError::InvalidRequest);
        }
        let md = self
            .txns
            .get(transactional_id)
            .filter(|md| md.state() != TxnState::Dead)
            .ok_or(ResponseError::TransactionalIdNotFound)?;
        let mut topics: Vec<(String, Vec<i32>)> = Vec::new();
        for tp in &md.data.partitions {
            match topics.last_mut() {
                Some((topic, partitions)) if *topic == tp.topic => partitions.push(tp.partition),
                _ => topics.push((tp.topic.clone(), vec![tp.partition])),
            }
        }
        Ok(TxnDescription {
            transactional_id: md.transactional_id.clone(),
            state: md.state().name(),
            producer_id: ProducerId(md.data.producer_id),
            producer_epoch: md.data.producer_epoch,
            transaction_timeout_ms: md.data.txn_timeout_ms,
            transaction_start_time_ms: md.data.txn_start_timestamp_ms,
            topics,
        })
    }

    /// ListTransactions: every id but the Dead, filtered by producer id and state name (when
    /// the filters are not empty) and, when `duration_filter_ms >= 0`, to transactions running
    /// for longer than that (KIP-994). The transactional id pattern (KIP-1152) is the caller's.
    pub fn list(
        &self,
        producer_id_filters: &[ProducerId],
        state_filters: &[String],
        duration_filter_ms: i64,
        now_ms: i64,
    ) -> TxnList {
        let mut list = TxnList::default();
        let mut states = Vec::new();
        for name in state_filters {
            match TxnState::from_name(name) {
                Some(state) => states.push(state),
                None => list.unknown_state_filters.push(name.clone()),
            }
        }
        for md in self.txns.values() {
            let state = md.state();
            if state == TxnState::Dead
                || (!producer_id_filters.is_empty()
                    && !producer_id_filters
                        .iter()
                        .any(|p| p.0 == md.data.producer_id))
                || (!state_filters.is_empty() && !states.contains(&state))
                || (duration_filter_ms >= 0
                    && now_ms - md.data.txn_start_timestamp_ms <= duration_filter_ms)
            {
                continue;
            }
            list.transaction_states.push(TxnListing {
                transactional_id: md.transactional_id.clone(),
                producer_id: ProducerId(md.data.producer_id),
                state: state.name(),
            });
        }
        list
    }

    /// Checks the coordinator's own invariants; for tests and debug builds (O(ids)).
    pub fn check_invariants(&self) {
        for (id, flight) in &self.in_flight {
            let md = self
                .txns
                .get(id)
                .unwrap_or_else(|| panic!("{id}: in flight, unknown"));
            assert_eq!(md.pending_state(), Some(flight.target.state), "{id}");
        }
        for (id, md) in &self.txns {
            assert_eq!(*id, md.transactional_id);
            assert!(
                !matches!(md.state(), TxnState::Dead | TxnState::PrepareEpochFence),
                "{id}: in {:?}",
                md.state()
            );
            if let Some(pending) = md.pending_state() {
                if !self.in_flight.contains_key(id) {
                    // Only markers are awaited without a record in flight.
                    assert!(
                        md.state().is_prepare(),
                        "{id}: {:?} pending {pending:?}",
                        md.state()
                    );
                    assert_eq!(pending, complete_state_of(md.state()), "{id}");
                }
            }
            assert!(
                md.state() != TxnState::Empty || md.data.partitions.is_empty(),
                "{id}: Empty with partitions"
            );
        }
    }
}

fn complete_state_of(prepare: TxnState) -> TxnState {
    match prepare {
        TxnState::PrepareCommit => TxnState::CompleteCommit,
        TxnState::PrepareAbort => TxnState::CompleteAbort,
        other => panic!("no completion of {other:?}"),
    }
}
