//! The one place where engine and domain errors become Kafka error codes.

use kafka_protocol::ResponseError;
use sluice_engine::producer_state::ProducerError;
use sluice_engine::{BatchError, LogError};

/// Kafka error code for an engine error, as Apache Kafka would answer a client.
pub fn log_error_code(error: &LogError) -> i16 {
    let e = match error {
        LogError::InvalidBatch(BatchError::TooLarge { .. }) => ResponseError::MessageTooLarge,
        LogError::InvalidBatch(BatchError::MissingKey) => ResponseError::InvalidRecord,
        LogError::InvalidBatch(BatchError::BadMagic { .. }) => {
            ResponseError::UnsupportedForMessageFormat
        }
        LogError::InvalidBatch(_) => ResponseError::CorruptMessage,
        LogError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
        // A full disk: the produce is refused and may be retried once space returns.
        LogError::DiskFull(_) => ResponseError::KafkaStorageError,
        // Shutting down: the client looks for the partition again, as after a leader change.
        LogError::Closed => ResponseError::NotLeaderOrFollower,
        LogError::Poisoned { .. } | LogError::Corrupt { .. } | LogError::Io { .. } => {
            ResponseError::KafkaStorageError
        }
        LogError::Truncated { .. } => ResponseError::NotLeaderOrFollower,
        LogError::Producer(ProducerError::OutOfOrderSequence { .. }) => {
            ResponseError::OutOfOrderSequenceNumber
        }
        LogError::Producer(ProducerError::InvalidEpoch { .. }) => {
            ResponseError::InvalidProducerEpoch
        }
    };
    e.code()
}
