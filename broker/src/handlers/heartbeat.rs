//! Heartbeat: keeps a member's session alive and tells it when to rejoin.

use std::rc::Rc;

use kafka_protocol::messages::{HeartbeatRequest, HeartbeatResponse};

use crate::shard::groups::{coordinator_shard, no_coordinator};
use crate::shard::Shard;

pub async fn handle(shard: &Rc<Shard>, request: HeartbeatRequest) -> HeartbeatResponse {
    let group_id = request.group_id.0.to_string();
    let code = match coordinator_shard(shard, &group_id) {
        None => no_coordinator(shard, &group_id),
        Some(owner) => {
            let member_id = request.member_id.to_string();
            let instance_id = request.group_instance_id.map(|i| i.to_string());
            let generation = request.generation_id;
            shard
                .invoke_on(owner, move |s| async move {
                    s.heartbeat(&group_id, &member_id, instance_id.as_deref(), generation)
                })
                .await
        }
    };
    HeartbeatResponse::default().with_error_code(code)
}
