//! JoinGroup, run on the group's coordinator shard.

use std::rc::Rc;

use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::{JoinGroupRequest, JoinGroupResponse};
use kafka_protocol::protocol::StrBytes;

use crate::group::{JoinRequest, JoinResult};
use crate::shard::groups::{coordinator_shard, no_coordinator};
use crate::shard::Shard;

pub async fn handle(
    shard: &Rc<Shard>,
    request: JoinGroupRequest,
    version: i16,
    client_id: String,
    client_host: String,
) -> JoinGroupResponse {
    let group_id = request.group_id.0.to_string();
    let result = match coordinator_shard(shard, &group_id) {
        None => JoinResult {
            error: no_coordinator(shard, &group_id),
            generation: -1,
            ..Default::default()
        },
        Some(owner) => {
            let req = JoinRequest {
                group_id,
                member_id: request.member_id.to_string(),
                instance_id: request.group_instance_id.map(|s| s.to_string()),
                client_id,
                client_host,
                session_timeout_ms: request.session_timeout_ms,
                rebalance_timeout_ms: if version >= 1 {
                    request.rebalance_timeout_ms
                } else {
                    request.session_timeout_ms
                },
                protocol_type: request.protocol_type.to_string(),
                protocols: request
                    .protocols
                    .into_iter()
                    .map(|p| (p.name.to_string(), p.metadata))
                    .collect(),
                require_known_member_id: version >= 4,
            };
            shard
                .invoke_on(owner, move |s| async move { s.join_group(req).await })
                .await
        }
    };
    let mut response = JoinGroupResponse::default()
        .with_error_code(result.error)
        .with_generation_id(result.generation)
        .with_leader(StrBytes::from_string(result.leader))
        .with_member_id(StrBytes::from_string(result.member_id));
    if version >= 7 {
        response.protocol_type = result.protocol_type.map(StrBytes::from_string);
    }
    // No protocol chosen (an error, MEMBER_ID_REQUIRED among them): null from version 7, where
    // the field may be, as in Kafka.
    response.protocol_name = match result.protocol {
        Some(p) => Some(StrBytes::from_string(p)),
        None if version >= 7 => None,
        None => Some(StrBytes::default()),
    };
    if version >= 9 {
        response.skip_assignment = result.skip_assignment;
    }
    response.members = result
        .members
        .into_iter()
        .map(|(id, instance, metadata)| {
            let mut m = JoinGroupResponseMember::default()
                .with_member_id(StrBytes::from_string(id))
                .with_metadata(metadata);
            if version >= 5 {
                m.group_instance_id = instance.map(StrBytes::from_string);
            }
            m
        })
        .collect();
    response
}
