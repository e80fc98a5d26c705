//! OffsetCommit: checked against the group's generation, stored durably in
//! `__consumer_offsets` before it is acknowledged.

use std::rc::Rc;

use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::{OffsetCommitRequest, OffsetCommitResponse};
use kafka_protocol::ResponseError;

use crate::group::Committed;
use crate::shard::groups::{coordinator_shard, no_coordinator};
use crate::shard::Shard;

pub async fn handle(
    shard: &Rc<Shard>,
    client: &super::Client,
    mut request: OffsetCommitRequest,
    version: i16,
) -> OffsetCommitResponse {
    use super::authz::{self, operation};
    let group_id = request.group_id.0.to_string();
    let image = shard.image();
    // The authorizer: READ on the group (else every partition is GROUP_AUTHORIZATION_FAILED)
    // and on each topic (else its partitions are TOPIC_AUTHORIZATION_FAILED).
    let group_allowed = authz::group(shard, client, operation::READ, &group_id);
    // Named by id (OffsetCommit 10, TxnOffsetCommit 6): the ids this image knows become names.
    let by_id = version >= 10;
    if by_id {
        for t in &mut request.topics {
            crate::codec::topic_ids::resolve(&image, &mut t.name);
        }
    }
    // A commit for a topic or a partition that does not exist is refused per partition, as
    // Kafka does; the other partitions of the request are committed.
    let known = |topic: &str, partition: i32| image.has_partition(topic, partition);
    let topics_allowed = authz::topics_allowed(
        shard,
        client,
        operation::READ,
        request.topics.iter().map(|t| &t.name),
    );
    let allowed = |topic: &str| topics_allowed.contains(topic);
    let mut commits = Vec::new();
    for t in &request.topics {
        for p in &t.partitions {
            if !known(t.name.0.as_str(), p.partition_index) || !allowed(t.name.0.as_str()) {
                continue;
            }
            commits.push((
                (t.name.0.to_string(), p.partition_index),
                Some(Committed {
                    offset: p.committed_offset,
                    leader_epoch: p.committed_leader_epoch,
                    metadata: p
                        .committed_metadata
                        .as_ref()
                        .map(|m| m.to_string())
                        .unwrap_or_default(),
                }),
            ));
        }
    }
    let code = match coordinator_shard(shard, &group_id) {
        _ if !group_allowed => ResponseError::GroupAuthorizationFailed.code(),
        None => no_coordinator(shard, &group_id),
        Some(owner) => {
            let member_id = request.member_id.to_string();
            let instance_id = request.group_instance_id.as_ref().map(|i| i.to_string());
            let generation = request.generation_id_or_member_epoch;
            shard
                .invoke_on(owner, move |s| async move {
                    let check =
                        s.groups.check_commit(&group_id, &member_id, instance_id.as_deref(), generation);
                    if check != 0 {
                        return check;
                    }
                    // A member of the consumer protocol commits with version 9 or above, as
                    // Kafka requires (its epoch is checked the same either way).
                    if version < 9 && s.groups.uses_consumer_protocol(&group_id, &member_id) {
                        tracing::info!(group = %group_id, version, "OffsetCommit below version 9 from a consumer-protocol member refused");
                        return ResponseError::UnsupportedVersion.code();
                    }
                    match s.store_offsets(&group_id, commits).await {
                        Ok(()) => 0,
                        Err(code) => code,
                    }
                })
                .await
        }
    };
    let mut response = OffsetCommitResponse::default();
    for t in request.topics {
        let partitions = t
            .partitions
            .iter()
            .map(|p| {
                let code = if !group_allowed {
                    code
                } else if !allowed(t.name.0.as_str()) {
                    ResponseError::TopicAuthorizationFailed.code()
                } else if known(t.name.0.as_str(), p.partition_index) {
                    code
                } else if by_id && crate::codec::topic_ids::is_unknown_id(&t.name.0) {
                    ResponseError::UnknownTopicId.code()
                } else {
                    ResponseError::UnknownTopicOrPartition.code()
                };
                OffsetCommitResponsePartition::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(code)
            })
            .collect();
        response.topics.push(
            OffsetCommitResponseTopic::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    if by_id {
        for t in &mut response.topics {
            crate::codec::topic_ids::to_placeholder(&image, &mut t.name);
        }
    }
    response
}
