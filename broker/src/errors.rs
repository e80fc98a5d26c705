//! The one place where engine and domain errors become Kafka error codes.

use kafka_protocol::ResponseError;

/// Kafka error code for an engine error, as Apache Kafka would answer a client (the mapping
/// lives with the partition replica's code, which the simulator runs too).
pub use sluice_replication::error_code::of_log_error as log_error_code;

/// Features this broker does not have, and how Kafka answers requests for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disabled {
    /// No authorizer: ACL requests get SECURITY_DISABLED, as from Kafka without
    /// `authorizer.class.name` (with its messages: Describe says "on the broker", Create and
    /// Delete do not).
    Authorizer,
    AuthorizerDescribe,
}

impl Disabled {
    pub fn code(self) -> i16 {
        match self {
            Disabled::Authorizer | Disabled::AuthorizerDescribe => {
                ResponseError::SecurityDisabled.code()
            }
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Disabled::Authorizer => "No Authorizer is configured.",
            Disabled::AuthorizerDescribe => "No Authorizer is configured on the broker",
        }
    }
}

#[cfg(test)]
mod tests {
    use kafka_protocol::ResponseError;
    use sluice_replication::error_code as code;

    /// The replication crate keeps Kafka's codes as plain numbers; they are Kafka's.
    #[test]
    fn the_replication_crates_codes_are_kafkas() {
        for (ours, kafka) in [
            (code::OFFSET_OUT_OF_RANGE, ResponseError::OffsetOutOfRange),
            (code::CORRUPT_MESSAGE, ResponseError::CorruptMessage),
            (code::MESSAGE_TOO_LARGE, ResponseError::MessageTooLarge),
            (
                code::NOT_LEADER_OR_FOLLOWER,
                ResponseError::NotLeaderOrFollower,
            ),
            (code::REQUEST_TIMED_OUT, ResponseError::RequestTimedOut),
            (code::NOT_ENOUGH_REPLICAS, ResponseError::NotEnoughReplicas),
            (
                code::NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                ResponseError::NotEnoughReplicasAfterAppend,
            ),
            (
                code::UNSUPPORTED_FOR_MESSAGE_FORMAT,
                ResponseError::UnsupportedForMessageFormat,
            ),
            (
                code::OUT_OF_ORDER_SEQUENCE_NUMBER,
                ResponseError::OutOfOrderSequenceNumber,
            ),
            (
                code::INVALID_PRODUCER_EPOCH,
                ResponseError::InvalidProducerEpoch,
            ),
            (
                code::TRANSACTION_COORDINATOR_FENCED,
                ResponseError::TransactionCoordinatorFenced,
            ),
            (code::KAFKA_STORAGE_ERROR, ResponseError::KafkaStorageError),
            (
                code::UNKNOWN_LEADER_EPOCH,
                ResponseError::UnknownLeaderEpoch,
            ),
            (code::INVALID_RECORD, ResponseError::InvalidRecord),
        ] {
            assert_eq!(ours, kafka.code(), "{kafka:?}");
        }
    }
}
