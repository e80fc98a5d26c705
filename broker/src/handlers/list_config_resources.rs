//! ListConfigResources (KIP-1142; version 0 was ListClientMetricsResources): the resources
//! DescribeConfigs can describe here, which are every topic and this broker.
//!
//! Kafka 4 also lists its broker loggers, the groups with config overrides and client metrics
//! subscriptions; this broker has none of them to describe, so asking for those types lists
//! nothing. A type Kafka does not know is answered UNSUPPORTED_VERSION, as Kafka does.

use std::rc::Rc;

use kafka_protocol::messages::list_config_resources_response::ConfigResource;
use kafka_protocol::messages::{ListConfigResourcesRequest, ListConfigResourcesResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::configs::{RESOURCE_BROKER, RESOURCE_TOPIC};
use crate::shard::Shard;

const RESOURCE_BROKER_LOGGER: i8 = 8;
const RESOURCE_CLIENT_METRICS: i8 = 16;
const RESOURCE_GROUP: i8 = 32;
/// The resource types Kafka lists; any other is refused.
const LISTABLE: &[i8] = &[
    RESOURCE_TOPIC,
    RESOURCE_BROKER,
    RESOURCE_BROKER_LOGGER,
    RESOURCE_CLIENT_METRICS,
    RESOURCE_GROUP,
];

pub fn handle(
    shard: &Rc<Shard>,
    request: ListConfigResourcesRequest,
    version: i16,
) -> ListConfigResourcesResponse {
    let mut response = ListConfigResourcesResponse::default();
    let types: Vec<i8> = if version == 0 {
        // Version 0 asks for client metrics resources only.
        vec![RESOURCE_CLIENT_METRICS]
    } else if request.resource_types.is_empty() {
        LISTABLE.to_vec()
    } else {
        request.resource_types
    };
    if types.iter().any(|t| !LISTABLE.contains(t)) {
        response.error_code = ResponseError::UnsupportedVersion.code();
        return response;
    }
    if types.contains(&RESOURCE_BROKER) {
        response.config_resources.push(
            ConfigResource::default()
                .with_resource_type(RESOURCE_BROKER)
                .with_resource_name(StrBytes::from_string(shard.config().node_id.to_string())),
        );
    }
    if types.contains(&RESOURCE_TOPIC) {
        response
            .config_resources
            .extend(shard.image().topics.keys().map(|name| {
                ConfigResource::default()
                    .with_resource_type(RESOURCE_TOPIC)
                    .with_resource_name(StrBytes::from_string(name.clone()))
            }));
    }
    // Groups with configs of their own (Kafka lists those; the groups themselves come from
    // ListGroups).
    if types.contains(&RESOURCE_GROUP) {
        let image = shard.image();
        if let Some(cluster) = image.cluster.as_ref() {
            response
                .config_resources
                .extend(cluster.group_configs.keys().map(|name| {
                    ConfigResource::default()
                        .with_resource_type(RESOURCE_GROUP)
                        .with_resource_name(StrBytes::from_string(name.clone()))
                }));
        }
    }
    response
}
