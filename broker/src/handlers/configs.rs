//! DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics (Kafka's names and
//! defaults) and, read-only, for the broker.

use std::collections::BTreeMap;
use std::rc::Rc;

use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::metadata::{log_config, TOPIC_CONFIG_DEFAULTS};
use crate::shard::Shard;

pub const RESOURCE_TOPIC: i8 = 2;
pub const RESOURCE_BROKER: i8 = 4;
const SOURCE_TOPIC_CONFIG: i8 = 1;
const SOURCE_STATIC_BROKER_CONFIG: i8 = 4;
const SOURCE_DEFAULT_CONFIG: i8 = 5;

const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

fn entry(name: &str, value: &str, source: i8, read_only: bool) -> DescribeConfigsResourceResult {
    DescribeConfigsResourceResult::default()
        .with_name(StrBytes::from_string(name.to_string()))
        .with_value(Some(StrBytes::from_string(value.to_string())))
        .with_read_only(read_only)
        .with_config_source(source)
}

pub async fn describe(
    shard: &Rc<Shard>,
    request: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    let mut response = DescribeConfigsResponse::default();
    let config = shard.config().clone();
    for resource in request.resources {
        let name = resource.resource_name.to_string();
        let wanted = |key: &str| {
            resource
                .configuration_keys
                .as_ref()
                .is_none_or(|keys| keys.iter().any(|k| k.as_str() == key))
        };
        let mut result = DescribeConfigsResult::default()
            .with_resource_type(resource.resource_type)
            .with_resource_name(resource.resource_name.clone());
        match resource.resource_type {
            RESOURCE_TOPIC => match shard.image().topics.get(&name) {
                Some(topic) => {
                    for (key, default) in TOPIC_CONFIG_DEFAULTS {
                        if !wanted(key) {
                            continue;
                        }
                        result.configs.push(match topic.configs.get(*key) {
                            Some(v) => entry(key, v, SOURCE_TOPIC_CONFIG, false),
                            None => entry(key, default, SOURCE_DEFAULT_CONFIG, false),
                        });
                    }
                }
                None => {
                    result.error_code = ResponseError::UnknownTopicOrPartition.code();
                    result.error_message = Some(StrBytes::from_string(format!(
                        "topic {name} does not exist"
                    )));
                }
            },
            RESOURCE_BROKER => {
                let values = [
                    ("node.id", config.node_id.to_string()),
                    ("listeners", format!("PLAINTEXT://{}", config.listener)),
                    (
                        "advertised.listeners",
                        format!(
                            "PLAINTEXT://{}:{}",
                            config.advertised_host, config.advertised_port
                        ),
                    ),
                    ("log.dirs", config.data_dir.display().to_string()),
                    ("num.partitions", config.num_partitions.to_string()),
                    (
                        "auto.create.topics.enable",
                        config.auto_create_topics.to_string(),
                    ),
                    (
                        "socket.request.max.bytes",
                        config.socket_request_max_bytes.to_string(),
                    ),
                    ("default.replication.factor", "1".to_string()),
                    ("min.insync.replicas", "1".to_string()),
                    ("batch.cache.bytes", config.batch_cache_bytes.to_string()),
                    ("fetch.max.bytes", config.fetch_max_bytes.to_string()),
                    ("fetch.zero.copy", config.fetch_zero_copy.to_string()),
                    (
                        "group.initial.rebalance.delay.ms",
                        config.group_initial_rebalance_delay_ms.to_string(),
                    ),
                    (
                        "group.consumer.session.timeout.ms",
                        config.group_consumer_session_timeout_ms.to_string(),
                    ),
                    (
                        "group.consumer.heartbeat.interval.ms",
                        config.group_consumer_heartbeat_interval_ms.to_string(),
                    ),
                    (
                        "offsets.topic.num.partitions",
                        config.offsets_topic_partitions.to_string(),
                    ),
                    ("max.connections", config.max_connections.to_string()),
                    (
                        "max.connections.per.ip",
                        config.max_connections_per_ip.to_string(),
                    ),
                    (
                        "connections.max.idle.ms",
                        config.connections_max_idle_ms.to_string(),
                    ),
                    (
                        "max.in.flight.requests.per.connection",
                        config.max_in_flight_requests_per_connection.to_string(),
                    ),
                    (
                        "log.retention.check.interval.ms",
                        config.log_retention_check_interval_ms.to_string(),
                    ),
                    (
                        "log.cleaner.backoff.ms",
                        config.log_cleaner_backoff_ms.to_string(),
                    ),
                ];
                for (key, value) in values {
                    if wanted(key) {
                        result
                            .configs
                            .push(entry(key, &value, SOURCE_STATIC_BROKER_CONFIG, true));
                    }
                }
            }
            other => {
                result.error_code = ResponseError::InvalidRequest.code();
                result.error_message = Some(StrBytes::from_string(format!(
                    "resource type {other} is not supported"
                )));
            }
        }
        response.results.push(result);
    }
    response
}

/// Validates `new` overrides and stores them for `topic` (unless `validate_only`).
async fn set_topic_configs(
    shard: &Rc<Shard>,
    topic: String,
    new: BTreeMap<String, String>,
    validate_only: bool,
) -> (i16, Option<String>) {
    if let Err(e) = log_config(&new) {
        return (ResponseError::InvalidConfig.code(), Some(e));
    }
    if !shard.image().topics.contains_key(&topic) {
        return (
            ResponseError::UnknownTopicOrPartition.code(),
            Some(format!("topic {topic} does not exist")),
        );
    }
    if validate_only {
        return (0, None);
    }
    let name = topic.clone();
    match shard
        .update_metadata(move |image| {
            let t = image
                .topics
                .get_mut(&name)
                .ok_or_else(|| "topic is gone".to_string())?;
            t.configs = new;
            Ok(())
        })
        .await
    {
        Ok(()) => {
            tracing::info!(topic = %topic, "topic configs altered");
            (0, None)
        }
        Err(e) => (ResponseError::KafkaStorageError.code(), Some(e)),
    }
}

/// Legacy AlterConfigs: the given set replaces every override.
pub async fn alter(shard: &Rc<Shard>, request: AlterConfigsRequest) -> AlterConfigsResponse {
    use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
    let mut response = AlterConfigsResponse::default();
    for resource in request.resources {
        let (code, message) = if resource.resource_type != RESOURCE_TOPIC {
            (
                ResponseError::InvalidRequest.code(),
                Some("only topic configs can be altered".to_string()),
            )
        } else {
            let new = resource
                .configs
                .iter()
                .filter_map(|c| {
                    c.value
                        .as_ref()
                        .map(|v| (c.name.to_string(), v.to_string()))
                })
                .collect();
            set_topic_configs(
                shard,
                resource.resource_name.to_string(),
                new,
                request.validate_only,
            )
            .await
        };
        response.responses.push(
            AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_error_message(message.map(StrBytes::from_string))
                .with_resource_type(resource.resource_type)
                .with_resource_name(resource.resource_name),
        );
    }
    response
}

pub async fn incremental_alter(
    shard: &Rc<Shard>,
    request: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
    let mut response = IncrementalAlterConfigsResponse::default();
    for resource in request.resources {
        let name = resource.resource_name.to_string();
        let (code, message) = if resource.resource_type != RESOURCE_TOPIC {
            (
                ResponseError::InvalidRequest.code(),
                Some("only topic configs can be altered".to_string()),
            )
        } else if let Some(topic) = shard.image().topics.get(&name) {
            let mut new = topic.configs.clone();
            let mut error = None;
            for c in &resource.configs {
                let key = c.name.to_string();
                let value = c.value.as_ref().map(|v| v.to_string());
                let list_default = || {
                    TOPIC_CONFIG_DEFAULTS
                        .iter()
                        .find(|(k, _)| *k == key)
                        .map(|(_, v)| v.to_string())
                        .unwrap_or_default()
                };
                match (c.config_operation, value) {
                    (OP_SET, Some(v)) => {
                        new.insert(key, v);
                    }
                    (OP_DELETE, _) => {
                        new.remove(&key);
                    }
                    (OP_APPEND, Some(v)) => {
                        let current = new.get(&key).cloned().unwrap_or_else(list_default);
                        let mut items: Vec<String> = current
                            .split(',')
                            .filter(|s| !s.is_empty())
                            .map(str::to_string)
                            .collect();
                        for item in v.split(',') {
                            if !items.iter().any(|i| i == item) {
                                items.push(item.to_string());
                            }
                        }
                        new.insert(key, items.join(","));
                    }
                    (OP_SUBTRACT, Some(v)) => {
                        let current = new.get(&key).cloned().unwrap_or_else(list_default);
                        let remove: Vec<&str> = v.split(',').collect();
                        let items: Vec<&str> =
                            current.split(',').filter(|i| !remove.contains(i)).collect();
                        new.insert(key, items.join(","));
                    }
                    (op, _) => {
                        error = Some(format!(
                            "operation {op} on {key} needs a value or is unknown"
                        ));
                        break;
                    }
                }
            }
            match error {
                Some(e) => (ResponseError::InvalidConfig.code(), Some(e)),
                None => set_topic_configs(shard, name, new, request.validate_only).await,
            }
        } else {
            (
                ResponseError::UnknownTopicOrPartition.code(),
                Some(format!("topic {name} does not exist")),
            )
        };
        response.responses.push(
            AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_error_message(message.map(StrBytes::from_string))
                .with_resource_type(resource.resource_type)
                .with_resource_name(resource.resource_name),
        );
    }
    response
}
