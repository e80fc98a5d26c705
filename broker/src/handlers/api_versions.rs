//! ApiVersions: exactly the APIs and versions this broker implements, and the feature levels
//! (KIP-584) it runs at, which clients read to know what the cluster does.

use kafka_protocol::messages::api_versions_response::{
    ApiVersion, FinalizedFeatureKey, SupportedFeatureKey,
};
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::SUPPORTED;

/// A feature this broker has: the levels it supports and the one it runs at.
pub struct Feature {
    pub name: &'static str,
    pub min_version: i16,
    pub max_version: i16,
    pub finalized: i16,
}

/// The features this broker runs at, as a Kafka 4.0 cluster reports them. A feature left out
/// is at level 0 for clients: `eligible.leader.replicas.version` (no ELR), `share.version` and
/// `streams.version` (no share or streams groups), `kraft.version` (a static voter set).
/// `transaction.version` is the broker's setting (`BrokerConfig::transaction_version`).
pub fn features(transaction_version: i16) -> [Feature; 3] {
    [
        // 4.0-IV3, the level of Kafka 4.0, whose API versions this broker implements. Only
        // that level: there is no metadata log whose format could be run at an older one.
        Feature {
            name: "metadata.version",
            min_version: METADATA_VERSION_4_0,
            max_version: METADATA_VERSION_4_0,
            finalized: METADATA_VERSION_4_0,
        },
        // Level 1 is the KIP-848 consumer group protocol (ConsumerGroupHeartbeat), which this
        // broker serves beside the classic one (level 0).
        Feature {
            name: "group.version",
            min_version: 0,
            max_version: 1,
            finalized: 1,
        },
        // Level 2 is KIP-890 part 2: EndTxn v5 bumps the epoch, Produce v12 and TxnOffsetCommit
        // v5 add their partitions to the transaction at the leader. Clients read the finalized
        // level to pick the protocol (the Java client from 4.0).
        Feature {
            name: "transaction.version",
            min_version: 0,
            max_version: 2,
            finalized: transaction_version,
        },
    ]
}

/// `metadata.version` 4.0-IV3 (`kafka-features version-mapping --release-version 4.0`).
pub const METADATA_VERSION_4_0: i16 = 25;

/// The epoch of the finalized levels. They are fixed in a build, so the epoch is too; clients
/// keep the levels of the highest epoch they have seen, so it must grow whenever a build changes
/// a level in [`features`]. (A running client does not notice `transaction.version` changed
/// by restarting the cluster with another setting; a new client does.)
pub const FINALIZED_FEATURES_EPOCH: i64 = 2;

pub fn handle(
    _request: &ApiVersionsRequest,
    version: i16,
    error: Option<ResponseError>,
    transaction_version: i16,
) -> ApiVersionsResponse {
    let features = features(transaction_version);
    let mut response = ApiVersionsResponse::default();
    response.error_code = error.map(|e| e.code()).unwrap_or(0);
    response.api_keys = SUPPORTED
        .iter()
        .map(|&(key, min, max)| {
            ApiVersion::default()
                .with_api_key(key as i16)
                .with_min_version(min)
                .with_max_version(max)
        })
        .collect();
    // Before version 4 a supported range starting at 0 broke older clients (KAFKA-17011), so
    // Kafka leaves those features out of `supported_features` then; so does this broker.
    response.supported_features = features
        .iter()
        .filter(|f| version >= 4 || f.min_version > 0)
        .map(|f| {
            SupportedFeatureKey::default()
                .with_name(StrBytes::from_static_str(f.name))
                .with_min_version(f.min_version)
                .with_max_version(f.max_version)
        })
        .collect();
    // A feature finalized at level 0 is left out, as Kafka leaves it out.
    response.finalized_features = features
        .iter()
        .filter(|f| f.finalized > 0)
        .map(|f| {
            FinalizedFeatureKey::default()
                .with_name(StrBytes::from_static_str(f.name))
                .with_min_version_level(f.finalized)
                .with_max_version_level(f.finalized)
        })
        .collect();
    response.finalized_features_epoch = FINALIZED_FEATURES_EPOCH;
    response
}
