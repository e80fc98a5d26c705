//! ApiVersions: exactly the APIs and versions this broker implements, and the feature levels
//! (KIP-584) it runs at, which clients read to know what the cluster does.

use kafka_protocol::messages::api_versions_response::{
    ApiVersion, FinalizedFeatureKey, SupportedFeatureKey,
};
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::SUPPORTED;
use crate::config::BrokerConfig;
use crate::metadata::MetadataImage;

pub fn handle(
    _request: &ApiVersionsRequest,
    version: i16,
    error: Option<ResponseError>,
    image: &MetadataImage,
    config: &BrokerConfig,
) -> ApiVersionsResponse {
    let features = crate::features::finalized(image, config);
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
        .filter(|(f, _)| version >= 4 || f.min_version > 0)
        .map(|(f, _)| {
            SupportedFeatureKey::default()
                .with_name(StrBytes::from_static_str(f.name))
                .with_min_version(f.min_version)
                .with_max_version(f.max_version)
        })
        .collect();
    // A feature finalized at level 0 is left out, as Kafka leaves it out.
    response.finalized_features = features
        .iter()
        .filter(|(_, level)| *level > 0)
        .map(|(f, level)| {
            FinalizedFeatureKey::default()
                .with_name(StrBytes::from_static_str(f.name))
                .with_min_version_level(*level)
                .with_max_version_level(*level)
        })
        .collect();
    response.finalized_features_epoch = crate::features::epoch(image);
    response
}
