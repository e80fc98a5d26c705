//! ShareGroupHeartbeat (KIP-932): join, heartbeat and leave a share group in one API, the
//! assignment computed on the coordinator (`group/share.rs`).

use std::rc::Rc;

use kafka_protocol::messages::share_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::{ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse};
use kafka_protocol::protocol::StrBytes;

use crate::group::configs::ShareGroupConfig;
use crate::group::share::ShareHeartbeat;
use crate::shard::groups::{coordinator_shard, no_coordinator};
use crate::shard::Shard;

pub async fn handle(
    shard: &Rc<Shard>,
    request: ShareGroupHeartbeatRequest,
    client_id: String,
    client_host: String,
) -> ShareGroupHeartbeatResponse {
    let group_id = request.group_id.0.to_string();
    let image = shard.image();
    let own = image
        .cluster
        .as_ref()
        .and_then(|c| c.group_configs.get(&group_id));
    let interval_ms = ShareGroupConfig::resolve(shard.config(), own).heartbeat_interval_ms;
    let mut response = ShareGroupHeartbeatResponse::default()
        .with_heartbeat_interval_ms(i32::try_from(interval_ms).unwrap_or(i32::MAX));
    let Some(owner) = coordinator_shard(shard, &group_id) else {
        return response.with_error_code(no_coordinator(shard, &group_id));
    };
    // The share coordinators' topic is made on first use, as Kafka makes it; the members'
    // fetches find their share partitions' state there.
    let state_topic = crate::share::coordinator::SHARE_STATE_TOPIC;
    if image.cluster.is_some() && !image.topics.contains_key(state_topic) {
        crate::cluster::ensure_internal_topic(
            shard,
            crate::cluster::InternalTopic::ShareGroupState,
        );
    }
    let req = ShareHeartbeat {
        member_id: request.member_id.to_string(),
        member_epoch: request.member_epoch,
        rack_id: request.rack_id.map(|s| s.to_string()),
        subscribed: request
            .subscribed_topic_names
            .map(|v| v.into_iter().map(|t| t.0.to_string()).collect()),
        client_id,
        client_host,
    };
    let result = shard
        .invoke_on(
            owner,
            move |s| async move { s.share_heartbeat(&group_id, req) },
        )
        .await;
    response.error_code = result.error;
    response.error_message = result.message.map(StrBytes::from_string);
    if result.error == 0 {
        response.member_id = Some(StrBytes::from_string(result.member_id));
        response.member_epoch = result.member_epoch;
        response.assignment = result.assignment.map(|set| {
            Assignment::default().with_topic_partitions(
                crate::group::consumer::by_topic(&set)
                    .into_iter()
                    .map(|(t, ps)| {
                        TopicPartitions::default()
                            .with_topic_id(t)
                            .with_partitions(ps)
                    })
                    .collect(),
            )
        });
    }
    response
}
