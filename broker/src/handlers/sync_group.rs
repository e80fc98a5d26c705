//! SyncGroup: the leader hands in assignments; every member gets its own.

use std::rc::Rc;

use kafka_protocol::messages::{SyncGroupRequest, SyncGroupResponse};
use kafka_protocol::protocol::StrBytes;

use crate::group::SyncResult;
use crate::shard::groups::{coordinator_shard, no_coordinator};
use crate::shard::Shard;

pub async fn handle(
    shard: &Rc<Shard>,
    request: SyncGroupRequest,
    version: i16,
) -> SyncGroupResponse {
    let group_id = request.group_id.0.to_string();
    let result = match coordinator_shard(shard, &group_id) {
        None => SyncResult {
            error: no_coordinator(shard, &group_id),
            ..Default::default()
        },
        Some(owner) => {
            let member_id = request.member_id.to_string();
            let instance_id = request.group_instance_id.map(|i| i.to_string());
            let generation = request.generation_id;
            let assignments: Vec<(String, bytes::Bytes)> = request
                .assignments
                .into_iter()
                .map(|a| (a.member_id.to_string(), a.assignment))
                .collect();
            shard
                .invoke_on(owner, move |s| async move {
                    s.sync_group(
                        &group_id,
                        &member_id,
                        instance_id.as_deref(),
                        generation,
                        assignments,
                    )
                    .await
                })
                .await
        }
    };
    let mut response = SyncGroupResponse::default()
        .with_error_code(result.error)
        .with_assignment(result.assignment);
    if version >= 5 {
        response.protocol_type = result.protocol_type.map(StrBytes::from_string);
        response.protocol_name = result.protocol.map(StrBytes::from_string);
    }
    response
}
