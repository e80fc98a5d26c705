//! ApiVersions: exactly the APIs and versions this broker implements, and the feature levels
//! (KIP-584) it runs at, which clients read to know what the cluster does.
//!
//! Version 5 (KIP-1242) lets a client name the cluster and node it means to reach: naming one
//! without the other is INVALID_REQUEST, another cluster or node REBOOTSTRAP_REQUIRED, each with
//! no APIs listed, as Kafka answers. The codec stops at version 4, whose response is 5's; the
//! request is read here (`decode_v5`).

use kafka_protocol::messages::api_versions_response::{
    ApiVersion, FinalizedFeatureKey, SupportedFeatureKey,
};
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::codec::versions::{CLUSTER_ID_TAG, NODE_ID_TAG};
use crate::codec::SUPPORTED;
use crate::config::BrokerConfig;
use crate::metadata::MetadataImage;

/// Version 5's check of the cluster and node the client names (KIP-1242), as Kafka makes it.
fn misrouted(request: &ApiVersionsRequest, config: &BrokerConfig) -> Option<ResponseError> {
    let cluster_id = request.unknown_tagged_fields.get(&CLUSTER_ID_TAG);
    let node_id = request
        .unknown_tagged_fields
        .get(&NODE_ID_TAG)
        .and_then(|b| <[u8; 4]>::try_from(&b[..]).ok())
        .map_or(-1, i32::from_be_bytes);
    match (cluster_id, node_id) {
        (None, -1) => None,
        (None, _) | (Some(_), -1) => Some(ResponseError::InvalidRequest),
        (Some(cluster), node) => (&cluster[..] != config.cluster_id.as_bytes()
            || node != config.node_id)
            .then_some(ResponseError::RebootstrapRequired),
    }
}

pub fn handle(
    request: &ApiVersionsRequest,
    version: i16,
    error: Option<ResponseError>,
    image: &MetadataImage,
    config: &BrokerConfig,
) -> ApiVersionsResponse {
    if version >= 5 {
        if let Some(e) = misrouted(request, config) {
            tracing::info!(error = ?e, "ApiVersions 5 names another cluster or node, or only one of them");
            return ApiVersionsResponse::default().with_error_code(e.code());
        }
    }
    let features = crate::features::finalized(image, config);
    // The share group APIs only while `share.version` is finalized at 1 or more, as Kafka
    // lists them.
    let share_groups = crate::features::share_groups_enabled(image, config);
    let mut response = ApiVersionsResponse::default();
    response.error_code = error.map(|e| e.code()).unwrap_or(0);
    response.api_keys = SUPPORTED
        .iter()
        .filter(|&&(key, _, _)| share_groups || !crate::features::is_share_api(key))
        .map(|&(key, min, max)| {
            ApiVersion::default()
                .with_api_key(key as i16)
                .with_min_version(min)
                .with_max_version(max)
        })
        .collect();
    // The streams group APIs, whose messages this broker reads itself (codec/streams_group.rs),
    // while `streams.version` is 1 or more, as Kafka lists them.
    if crate::features::streams_groups_enabled(image, config) {
        use crate::codec::streams_group::{
            STREAMS_GROUP_DESCRIBE, STREAMS_GROUP_HEARTBEAT, VERSION,
        };
        for key in [STREAMS_GROUP_HEARTBEAT, STREAMS_GROUP_DESCRIBE] {
            response.api_keys.push(
                ApiVersion::default()
                    .with_api_key(key)
                    .with_min_version(VERSION)
                    .with_max_version(VERSION),
            );
        }
        response.api_keys.sort_by_key(|k| k.api_key);
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::versions::decode_v5;
    use bytes::Bytes;

    fn body(cluster: Option<&str>, node: i32) -> Bytes {
        let mut b = vec![3, b'c', b'l', 2, b'1'];
        match cluster {
            Some(c) => {
                b.push(c.len() as u8 + 1);
                b.extend_from_slice(c.as_bytes());
            }
            None => b.push(0),
        }
        b.extend_from_slice(&node.to_be_bytes());
        b.push(0);
        Bytes::from(b)
    }

    #[test]
    fn version_5_names_the_cluster_and_node_or_neither() {
        let config = BrokerConfig {
            cluster_id: "abc".into(),
            node_id: 3,
            ..BrokerConfig::default()
        };
        let check = |cluster, node| {
            let request = decode_v5(&mut body(cluster, node)).unwrap();
            assert_eq!(request.client_software_name.as_str(), "cl");
            misrouted(&request, &config)
        };
        assert_eq!(check(None, -1), None);
        assert_eq!(check(Some("abc"), 3), None);
        assert_eq!(check(None, 3), Some(ResponseError::InvalidRequest));
        assert_eq!(check(Some("abc"), -1), Some(ResponseError::InvalidRequest));
        assert_eq!(
            check(Some("xyz"), 3),
            Some(ResponseError::RebootstrapRequired)
        );
        assert_eq!(
            check(Some("abc"), 4),
            Some(ResponseError::RebootstrapRequired)
        );
        // Truncated bodies are errors, never panics.
        let whole = body(Some("abc"), 3);
        for cut in 0..whole.len() - 1 {
            assert!(decode_v5(&mut whole.slice(..cut)).is_err(), "{cut}");
        }
    }
}
