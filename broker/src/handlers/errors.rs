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
