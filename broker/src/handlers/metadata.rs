//! Metadata: this broker, and the topics asked for (all of them when the list is null),
//! creating unknown ones when `auto.create.topics.enable` and the client allow it.

use std::rc::Rc;

use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::cluster::{create_topic, CreateError};
use crate::metadata::validate_topic_name;
use crate::shard::Shard;

pub async fn handle(
    shard: &Rc<Shard>,
    client: &super::Client,
    request: MetadataRequest,
    version: i16,
) -> MetadataResponse {
    use super::authz::{self, operation, resource_type};
    let config = shard.config().clone();
    let mut response = MetadataResponse::default();
    let cluster = shard.image().cluster.clone();
    match &cluster {
        Some(cluster) => {
            response.brokers = cluster
                .live_brokers()
                .map(|b| {
                    let (host, port) = b.on(&client.listener);
                    MetadataResponseBroker::default()
                        .with_node_id(BrokerId(b.id))
                        .with_host(StrBytes::from_string(host.to_string()))
                        .with_port(port as i32)
                        .with_rack(b.rack.clone().map(StrBytes::from_string))
                })
                .collect();
            response.controller_id = BrokerId(if version >= 1 {
                cluster.controller_id
            } else {
                -1
            });
        }
        None => {
            let (host, port) = config.advertised_on(&client.listener);
            response.brokers = vec![MetadataResponseBroker::default()
                .with_node_id(BrokerId(config.node_id))
                .with_host(StrBytes::from_string(host.to_string()))
                .with_port(port as i32)];
            response.controller_id = BrokerId(if version >= 1 { config.node_id } else { -1 });
        }
    }
    if version >= 2 {
        response.cluster_id = Some(StrBytes::from_string(config.cluster_id.clone()));
    }

    let wanted: Option<Vec<(Option<String>, uuid::Uuid)>> = request.topics.map(|topics| {
        topics
            .into_iter()
            .map(|t| (t.name.map(|n| n.0.to_string()), t.topic_id))
            .collect()
    });
    let auto_create =
        config.auto_create_topics && (version < 4 || request.allow_auto_topic_creation);
    // The authorizer: every topic lists only those the client may describe; a named one it
    // may not is TOPIC_AUTHORIZATION_FAILED, whether it exists or not.
    let describable = |name: &str| {
        authz::allowed(
            shard,
            client,
            operation::DESCRIBE,
            resource_type::TOPIC,
            name,
        )
    };
    let names: Vec<(Option<String>, uuid::Uuid)> = match wanted {
        // Left out quietly: a denial line per hidden topic per poll would drown the log.
        None => shard
            .image()
            .topics
            .keys()
            .filter(|n| {
                authz::permitted(shard, client, operation::DESCRIBE, resource_type::TOPIC, n)
            })
            .map(|n| (Some(n.clone()), uuid::Uuid::nil()))
            .collect(),
        Some(list) => list,
    };
    for (name, id) in names {
        let image = shard.image();
        let name = match name {
            Some(n) => n,
            None => match image.topic_by_id(id) {
                Some(t) => t.name.clone(),
                None => {
                    response.topics.push(
                        MetadataResponseTopic::default()
                            .with_error_code(ResponseError::UnknownTopicId.code())
                            .with_topic_id(id),
                    );
                    continue;
                }
            },
        };
        let mut topic = MetadataResponseTopic::default()
            .with_name(Some(TopicName(StrBytes::from_string(name.clone()))));
        if let Err(reason) = validate_topic_name(&name) {
            tracing::debug!(topic = %name, %reason, "metadata for an invalid topic name");
            response
                .topics
                .push(topic.with_error_code(ResponseError::InvalidTopicException.code()));
            continue;
        }
        if !describable(&name) {
            response
                .topics
                .push(topic.with_error_code(ResponseError::TopicAuthorizationFailed.code()));
            continue;
        }
        let mut meta = image.topics.get(&name).cloned();
        // Creating it needs CREATE on the cluster or on the topic.
        if meta.is_none()
            && auto_create
            && !authz::cluster(shard, client, operation::CREATE)
            && !authz::allowed(
                shard,
                client,
                operation::CREATE,
                resource_type::TOPIC,
                &name,
            )
        {
            response
                .topics
                .push(topic.with_error_code(ResponseError::TopicAuthorizationFailed.code()));
            continue;
        }
        if meta.is_none() && auto_create {
            match create_topic(
                shard,
                &name,
                config.num_partitions,
                -1,
                Default::default(),
                false,
            )
            .await
            {
                Ok(()) | Err(CreateError::Exists) => {
                    meta = shard.image().topics.get(&name).cloned()
                }
                Err(e) => tracing::warn!(topic = %name, error = %e, "auto-creating a topic failed"),
            }
        }
        let Some(meta) = meta else {
            response
                .topics
                .push(topic.with_error_code(ResponseError::UnknownTopicOrPartition.code()));
            continue;
        };
        if version >= 10 {
            topic.topic_id = meta.id;
        }
        topic.is_internal = version >= 1 && meta.name == crate::group::offsets_topic::OFFSETS_TOPIC;
        if let Some(partitions) = cluster.as_ref().and_then(|c| c.partitions.get(&meta.name)) {
            let live = |id: &i32| {
                cluster
                    .as_ref()
                    .and_then(|c| c.broker(*id))
                    .is_some_and(|b| !b.fenced)
            };
            topic.partitions = partitions
                .iter()
                .enumerate()
                .map(|(index, p)| {
                    let mut partition = MetadataResponsePartition::default()
                        .with_partition_index(index as i32)
                        .with_leader_id(BrokerId(p.leader))
                        .with_replica_nodes(p.replicas.iter().map(|&r| BrokerId(r)).collect())
                        .with_isr_nodes(p.isr.iter().map(|&r| BrokerId(r)).collect());
                    if p.leader < 0 {
                        partition.error_code = ResponseError::LeaderNotAvailable.code();
                    }
                    if version >= 5 {
                        partition.offline_replicas = p
                            .replicas
                            .iter()
                            .filter(|r| !live(r))
                            .map(|&r| BrokerId(r))
                            .collect();
                    }
                    if version >= 7 {
                        partition.leader_epoch = p.leader_epoch;
                    }
                    partition
                })
                .collect();
            response.topics.push(topic);
            continue;
        }
        topic.partitions = (0..meta.shards.len() as i32)
            .map(|p| {
                let mut partition = MetadataResponsePartition::default()
                    .with_partition_index(p)
                    .with_leader_id(BrokerId(config.node_id))
                    .with_replica_nodes(vec![BrokerId(config.node_id)])
                    .with_isr_nodes(vec![BrokerId(config.node_id)]);
                if version >= 7 {
                    partition.leader_epoch = 0;
                }
                partition
            })
            .collect();
        response.topics.push(topic);
    }
    response
}
