//! The one place where engine and domain errors become Kafka error codes.

use kafka_protocol::ResponseError;
use sluice_engine::producer_state::ProducerError;
use sluice_engine::{BatchError, LogError};

/// Kafka error code for an engine error, as Apache Kafka would answer a client.
pub fn log_error_code(error: &LogError) -> i16 {
    let e = match error {
        LogError::InvalidBatch(BatchError::TooLarge { .. }) => ResponseError::MessageTooLarge,
        LogError::InvalidBatch(BatchError::MissingKey { .. }) => ResponseError::InvalidRecord,
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
        // Only a follower's append meets it; its fetcher refetches from its own log end.
        LogError::UnexpectedAppendOffset { .. } => ResponseError::UnknownServerError,
        LogError::Producer(ProducerError::OutOfOrderSequence { .. }) => {
            ResponseError::OutOfOrderSequenceNumber
        }
        LogError::Producer(ProducerError::InvalidEpoch { .. }) => {
            ResponseError::InvalidProducerEpoch
        }
        LogError::Producer(ProducerError::CoordinatorFenced { .. }) => {
            ResponseError::TransactionCoordinatorFenced
        }
    };
    e.code()
}

/// Whether Kafka's Produce answer for `error` carries the partition's log start offset. Kafka
/// leaves it at -1 for a missing partition, a too large or corrupt batch and a storage error,
/// and reports it for every other refusal (records refused by validation, producer state
/// errors).
pub fn produce_error_reports_log_start_offset(error: &LogError) -> bool {
    let code = log_error_code(error);
    ![
        ResponseError::MessageTooLarge,
        ResponseError::CorruptMessage,
        ResponseError::KafkaStorageError,
        ResponseError::NotLeaderOrFollower,
        ResponseError::UnknownTopicOrPartition,
    ]
    .iter()
    .any(|e| e.code() == code)
}

/// Kafka's cap on the record errors its partition error message spells out.
const RECORD_ERRORS_IN_MESSAGE_MAX: usize = 3;

/// A batch refused because of some of its records (KIP-467): each one's `batch_index` and
/// message, and the partition's error message that sums them up, worded as Kafka's
/// `LogValidator` words them so that clients and people see what they would from Kafka.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordErrors {
    pub records: Vec<(i32, String)>,
    pub message: String,
}

/// The per-record errors of `error`, refused on `topic`-`partition`; `None` when the error is
/// about the batch as a whole.
pub fn record_errors(error: &LogError, topic: &str, partition: i32) -> Option<RecordErrors> {
    let LogError::InvalidBatch(BatchError::MissingKey { batch_indexes }) = error else {
        return None;
    };
    let records: Vec<(i32, String)> = batch_indexes
        .iter()
        .map(|&index| {
            (
                index,
                format!(
                    "Compacted topic cannot accept message without key in topic partition \
                     {topic}-{partition}"
                ),
            )
        })
        .collect();
    // Java's `List.toString` of Kafka's `RecordError`s.
    let shown: Vec<String> = records
        .iter()
        .take(RECORD_ERRORS_IN_MESSAGE_MAX)
        .map(|(index, message)| format!("RecordError(batchIndex={index}, message='{message}')"))
        .collect();
    let message = format!(
        "One or more records have been rejected due to {} record errors in total, and only \
         showing the first three errors at most: [{}]",
        records.len(),
        shown.join(", ")
    );
    Some(RecordErrors { records, message })
}

/// Features this broker does not have, and how Kafka answers requests for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disabled {
    /// No authorizer: ACL requests get SECURITY_DISABLED, as from Kafka without
    /// `authorizer.class.name` (with its messages: Describe says "on the broker", Create and
    /// Delete do not).
    Authorizer,
    AuthorizerDescribe,
    /// No quota store: quotas can be described (there are none) but not set. Kafka always
    /// stores quotas, so no Kafka code says this; INVALID_REQUEST is the one clients show with
    /// the message.
    ClientQuotas,
    /// No SASL, so no SCRAM credentials to keep: an upsertion is refused as a mechanism this
    /// broker does not support.
    Scram,
}

impl Disabled {
    pub fn code(self) -> i16 {
        match self {
            Disabled::Authorizer | Disabled::AuthorizerDescribe => {
                ResponseError::SecurityDisabled.code()
            }
            Disabled::ClientQuotas => ResponseError::InvalidRequest.code(),
            Disabled::Scram => ResponseError::UnsupportedSaslMechanism.code(),
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Disabled::Authorizer => "No Authorizer is configured.",
            Disabled::AuthorizerDescribe => "No Authorizer is configured on the broker",
            Disabled::ClientQuotas => {
                "Client quotas are not supported by this broker: it neither stores nor enforces them"
            }
            Disabled::Scram => {
                "SCRAM credentials are not supported by this broker: it does not authenticate with SASL"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyless_records_become_kafkas_record_errors() {
        let error = LogError::InvalidBatch(BatchError::MissingKey {
            batch_indexes: vec![0, 2, 3, 9],
        });
        assert_eq!(log_error_code(&error), ResponseError::InvalidRecord.code());
        let errors = record_errors(&error, "orders", 4).unwrap();
        assert_eq!(
            errors.records.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            vec![0, 2, 3, 9]
        );
        let one = "Compacted topic cannot accept message without key in topic partition orders-4";
        assert!(errors.records.iter().all(|(_, m)| m == one));
        assert_eq!(
            errors.message,
            format!(
                "One or more records have been rejected due to 4 record errors in total, and \
                 only showing the first three errors at most: [RecordError(batchIndex=0, \
                 message='{one}'), RecordError(batchIndex=2, message='{one}'), \
                 RecordError(batchIndex=3, message='{one}')]"
            )
        );
        let whole = LogError::InvalidBatch(BatchError::TooLarge { size: 9, max: 1 });
        assert_eq!(record_errors(&whole, "orders", 4), None);
    }
}
