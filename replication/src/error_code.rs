//! Kafka error codes the controller and the partition replicas answer with, by Kafka's names,
//! and the one mapping of the engine's errors to them ([`of_log_error`]).
//!
//! The values are Kafka's protocol error codes. They live here, as plain `i16`s, so that this
//! crate needs no protocol codec; the broker puts them into kafka-protocol responses unchanged.

use sluice_engine::producer_state::ProducerError;
use sluice_engine::{BatchError, LogError};

pub const NONE: i16 = 0;
pub const UNKNOWN_SERVER_ERROR: i16 = -1;
pub const OFFSET_OUT_OF_RANGE: i16 = 1;
pub const CORRUPT_MESSAGE: i16 = 2;
pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;
pub const REQUEST_TIMED_OUT: i16 = 7;
pub const MESSAGE_TOO_LARGE: i16 = 10;
pub const INVALID_TOPIC_EXCEPTION: i16 = 17;
/// acks=all refused before the append: fewer in-sync replicas than `min.insync.replicas`.
pub const NOT_ENOUGH_REPLICAS: i16 = 19;
/// acks=all appended, but the ISR fell below `min.insync.replicas` before it was acknowledged.
pub const NOT_ENOUGH_REPLICAS_AFTER_APPEND: i16 = 20;
pub const TOPIC_ALREADY_EXISTS: i16 = 36;
pub const INVALID_PARTITIONS: i16 = 37;
pub const INVALID_REPLICATION_FACTOR: i16 = 38;
pub const INVALID_REPLICA_ASSIGNMENT: i16 = 39;
pub const INVALID_CONFIG: i16 = 40;
/// Retriable: the client finds the active controller and tries again.
pub const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
pub const NOT_CONTROLLER: i16 = 41;
pub const INVALID_REQUEST: i16 = 42;
pub const UNSUPPORTED_FOR_MESSAGE_FORMAT: i16 = 43;
pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
pub const INVALID_PRODUCER_EPOCH: i16 = 47;
pub const TRANSACTION_COORDINATOR_FENCED: i16 = 52;
pub const KAFKA_STORAGE_ERROR: i16 = 56;
pub const UNKNOWN_LEADER_EPOCH: i16 = 75;
pub const FENCED_LEADER_EPOCH: i16 = 74;
pub const STALE_BROKER_EPOCH: i16 = 77;
/// ElectLeaders: the preferred replica is not an unfenced in-sync replica.
pub const PREFERRED_LEADER_NOT_AVAILABLE: i16 = 80;
/// ElectLeaders: no replica may lead (unclean election found none unfenced).
pub const ELIGIBLE_LEADERS_NOT_AVAILABLE: i16 = 83;
/// ElectLeaders: the partition already has the leader the election would give it.
pub const ELECTION_NOT_NEEDED: i16 = 84;
/// AlterPartitionReassignments: a cancellation for a partition with no reassignment.
pub const NO_REASSIGNMENT_IN_PROGRESS: i16 = 85;
/// AlterPartition from a leader that read an older partition epoch than the controller's.
pub const INVALID_RECORD: i16 = 87;
pub const RESOURCE_NOT_FOUND: i16 = 91;
pub const DUPLICATE_RESOURCE: i16 = 92;
pub const UNACCEPTABLE_CREDENTIAL: i16 = 93;
pub const INVALID_UPDATE_VERSION: i16 = 95;
pub const UNKNOWN_TOPIC_ID: i16 = 100;
pub const DUPLICATE_BROKER_REGISTRATION: i16 = 101;
pub const BROKER_ID_NOT_REGISTERED: i16 = 102;
pub const INCONSISTENT_CLUSTER_ID: i16 = 104;
/// An AlterPartition's new ISR names a fenced, shutting-down or re-registered broker.
pub const INELIGIBLE_REPLICA: i16 = 107;

/// Kafka's error code for an engine error, as Apache Kafka would answer a client.
pub fn of_log_error(error: &LogError) -> i16 {
    match error {
        LogError::InvalidBatch(BatchError::TooLarge { .. }) => MESSAGE_TOO_LARGE,
        LogError::InvalidBatch(BatchError::MissingKey { .. }) => INVALID_RECORD,
        LogError::InvalidBatch(BatchError::BadMagic { .. }) => UNSUPPORTED_FOR_MESSAGE_FORMAT,
        LogError::InvalidBatch(_) => CORRUPT_MESSAGE,
        LogError::OffsetOutOfRange { .. } => OFFSET_OUT_OF_RANGE,
        // A full disk: the produce is refused and may be retried once space returns.
        LogError::DiskFull(_) => KAFKA_STORAGE_ERROR,
        // Shutting down: the client looks for the partition again, as after a leader change.
        LogError::Closed => NOT_LEADER_OR_FOLLOWER,
        LogError::Poisoned { .. } | LogError::Corrupt { .. } | LogError::Io { .. } => {
            KAFKA_STORAGE_ERROR
        }
        LogError::Truncated { .. } => NOT_LEADER_OR_FOLLOWER,
        // Only a follower's append meets it; its fetcher refetches from its own log end.
        LogError::UnexpectedAppendOffset { .. } => UNKNOWN_SERVER_ERROR,
        LogError::Producer(ProducerError::OutOfOrderSequence { .. }) => {
            OUT_OF_ORDER_SEQUENCE_NUMBER
        }
        LogError::Producer(ProducerError::InvalidEpoch { .. }) => INVALID_PRODUCER_EPOCH,
        LogError::Producer(ProducerError::CoordinatorFenced { .. }) => {
            TRANSACTION_COORDINATOR_FENCED
        }
    }
}
