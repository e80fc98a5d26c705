//! ShareAcknowledge (KIP-932): a share consumer's acknowledgements (ACCEPT, RELEASE, REJECT,
//! GAP) of records it acquired, without fetching. Epoch -1 also closes its share session and
//! releases what it still holds.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use kafka_protocol::messages::share_acknowledge_response::{
    LeaderIdAndEpoch, PartitionData, ShareAcknowledgeTopicResponse,
};
use kafka_protocol::messages::{ShareAcknowledgeRequest, ShareAcknowledgeResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::authz;
use super::share_fetch::{ack_batches, run_on_owners, session_step, SessionStep, Wanted};
use crate::shard::Shard;

pub async fn handle(
    shard: &Rc<Shard>,
    client: &super::Client,
    request: ShareAcknowledgeRequest,
    version: i16,
) -> ShareAcknowledgeResponse {
    let mut response = ShareAcknowledgeResponse::default();
    let (Some(group_id), Some(member_id)) = (request.group_id.as_ref(), request.member_id.as_ref())
    else {
        response.error_code = ResponseError::InvalidRequest.code();
        response.error_message = Some(StrBytes::from_static_str(
            "ShareAcknowledge needs a group id and a member id.",
        ));
        return response;
    };
    let group_id = group_id.0.to_string();
    let member_id = member_id.to_string();
    if !authz::group(shard, client, authz::operation::READ, &group_id) {
        response.error_code = ResponseError::GroupAuthorizationFailed.code();
        return response;
    }
    tracing::debug!(target: "sluice::share", group = %group_id, member = %member_id, epoch = request.share_session_epoch, acks = request.topics.iter().flat_map(|t| &t.partitions).map(|p| p.acknowledgement_batches.len()).sum::<usize>(), "ShareAcknowledge");
    let key = (group_id.clone(), member_id.clone());
    // Acknowledging needs a session: epoch 0 (opening one) is refused, as Kafka does.
    let closing = match session_step(
        shard,
        client,
        &key,
        request.share_session_epoch,
        &[],
        &[],
        false,
    ) {
        Ok(SessionStep::Closed) => true,
        Ok(SessionStep::Fetch(_)) => false,
        Err(code) => {
            response.error_code = code;
            return response;
        }
    };
    let image = shard.image();
    let mut wanted = Vec::new();
    let mut denied = Vec::new();
    for t in &request.topics {
        let topic = image
            .topic_by_id(t.topic_id)
            .map(|m| Arc::<str>::from(m.name.as_str()));
        for p in &t.partitions {
            if let Some(name) = &topic {
                if !authz::allowed(
                    shard,
                    client,
                    authz::operation::READ,
                    authz::resource_type::TOPIC,
                    name,
                ) {
                    denied.push((t.topic_id, p.partition_index));
                    continue;
                }
            }
            wanted.push(Wanted {
                topic_id: t.topic_id,
                partition: p.partition_index,
                topic: topic.clone(),
                acks: ack_batches(
                    p.acknowledgement_batches
                        .iter()
                        .map(|b| (b.first_offset, b.last_offset, &b.acknowledge_types)),
                ),
                fetch: false,
                record_limit: false,
            });
        }
    }
    let results = run_on_owners(shard, &group_id, &member_id, &wanted, 1, 1).await;
    if closing {
        shard.release_share_member(&group_id, &member_id);
    }
    let node_id = shard.config().node_id;
    let mut by_topic: BTreeMap<uuid::Uuid, Vec<PartitionData>> = BTreeMap::new();
    for (w, r) in wanted.iter().zip(results) {
        let (code, message) = if r.error_code != 0 {
            (r.error_code, None)
        } else {
            (r.ack_error_code, r.ack_error_message)
        };
        by_topic.entry(w.topic_id).or_default().push(
            PartitionData::default()
                .with_partition_index(w.partition)
                .with_error_code(code)
                .with_error_message(message.map(StrBytes::from_string))
                .with_current_leader(
                    LeaderIdAndEpoch::default()
                        .with_leader_id(if r.error_code == 0 { node_id } else { -1 })
                        .with_leader_epoch(r.leader_epoch),
                ),
        );
    }
    for (topic_id, partition) in denied {
        by_topic.entry(topic_id).or_default().push(
            PartitionData::default()
                .with_partition_index(partition)
                .with_error_code(ResponseError::TopicAuthorizationFailed.code())
                .with_current_leader(
                    LeaderIdAndEpoch::default()
                        .with_leader_id(-1)
                        .with_leader_epoch(-1),
                ),
        );
    }
    if version >= 2 {
        // Version 2's acquisition_lock_timeout_ms, for the encoder (`codec::versions`).
        let own = image
            .cluster
            .as_ref()
            .and_then(|c| c.group_configs.get(&group_id));
        let lock_ms = crate::group::configs::ShareGroupConfig::resolve(shard.config(), own)
            .record_lock_duration_ms;
        let lock_ms = i32::try_from(lock_ms).unwrap_or(i32::MAX);
        response.unknown_tagged_fields.insert(
            crate::codec::versions::NEWER_FIELDS_TAG,
            bytes::Bytes::copy_from_slice(&lock_ms.to_be_bytes()),
        );
    }
    response.responses = by_topic
        .into_iter()
        .map(|(topic_id, partitions)| {
            ShareAcknowledgeTopicResponse::default()
                .with_topic_id(topic_id)
                .with_partitions(partitions)
        })
        .collect();
    response
}
