//! ConsumerGroupHeartbeat (KIP-848): join, heartbeat, reconcile and leave in one API, with the
//! assignment computed on the coordinator.

use std::rc::Rc;

use kafka_protocol::messages::consumer_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::{ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::group::consumer::HeartbeatRequest;
use crate::shard::groups::{coordinator_shard, no_coordinator};
use crate::shard::Shard;

pub async fn handle(
    shard: &Rc<Shard>,
    request: ConsumerGroupHeartbeatRequest,
    client_id: String,
    client_host: String,
) -> ConsumerGroupHeartbeatResponse {
    let group_id = request.group_id.0.to_string();
    let interval_ms = shard.config().group_consumer_heartbeat_interval_ms;
    let mut response = ConsumerGroupHeartbeatResponse::default()
        .with_heartbeat_interval_ms(i32::try_from(interval_ms).unwrap_or(i32::MAX));
    let Some(owner) = coordinator_shard(shard, &group_id) else {
        return response.with_error_code(no_coordinator(shard, &group_id));
    };
    if request
        .subscribed_topic_regex
        .as_ref()
        .is_some_and(|r| !r.is_empty())
    {
        return response
            .with_error_code(ResponseError::InvalidRequest.code())
            .with_error_message(Some(StrBytes::from_static_str(
                "regular expression subscriptions are not supported yet",
            )));
    }
    let req = HeartbeatRequest {
        member_id: request.member_id.to_string(),
        member_epoch: request.member_epoch,
        instance_id: request.instance_id.map(|s| s.to_string()),
        rack_id: request.rack_id.map(|s| s.to_string()),
        rebalance_timeout_ms: request.rebalance_timeout_ms,
        subscribed: request
            .subscribed_topic_names
            .map(|v| v.into_iter().map(|t| t.0.to_string()).collect()),
        assignor: request.server_assignor.map(|s| s.to_string()),
        owned: request.topic_partitions.map(|tps| {
            tps.into_iter()
                .flat_map(|t| t.partitions.into_iter().map(move |p| (t.topic_id, p)))
                .collect()
        }),
        client_id,
        client_host,
    };
    let result = shard
        .invoke_on(owner, move |s| async move {
            s.consumer_heartbeat(&group_id, req)
        })
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
