//! LeaveGroup, single (v0-2) or batched by member identity (v3+, KIP-345).

use std::rc::Rc;

use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{LeaveGroupRequest, LeaveGroupResponse};

use crate::shard::groups::{coordinator_shard, no_coordinator};
use crate::shard::Shard;

pub async fn handle(
    shard: &Rc<Shard>,
    request: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    let group_id = request.group_id.0.to_string();
    let leaving: Vec<(String, Option<String>)> = if version >= 3 {
        request
            .members
            .iter()
            .map(|m| {
                (
                    m.member_id.to_string(),
                    m.group_instance_id.as_ref().map(|s| s.to_string()),
                )
            })
            .collect()
    } else {
        vec![(request.member_id.to_string(), None)]
    };
    let (error, codes) = match coordinator_shard(shard, &group_id) {
        None => (no_coordinator(shard, &group_id), vec![]),
        Some(owner) => {
            let l = leaving.clone();
            shard
                .invoke_on(owner, move |s| async move { s.leave_group(&group_id, l) })
                .await
        }
    };
    let mut response = LeaveGroupResponse::default();
    if version >= 3 {
        response.error_code = error;
        response.members = request
            .members
            .into_iter()
            .zip(codes)
            .map(|(m, code)| {
                MemberResponse::default()
                    .with_member_id(m.member_id)
                    .with_group_instance_id(m.group_instance_id)
                    .with_error_code(code)
            })
            .collect();
    } else {
        response.error_code = if error != 0 {
            error
        } else {
            codes.first().copied().unwrap_or(0)
        };
    }
    response
}
