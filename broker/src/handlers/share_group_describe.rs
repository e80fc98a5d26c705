//! ShareGroupDescribe (KIP-932): a share group's epochs, assignor and members with their
//! assignments.

use std::collections::BTreeMap;
use std::rc::Rc;

use kafka_protocol::messages::share_group_describe_response::{
    Assignment, DescribedGroup, Member, TopicPartitions,
};
use kafka_protocol::messages::{ShareGroupDescribeRequest, ShareGroupDescribeResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::group::consumer::Tp;
use crate::shard::groups::{coordinator_shard, no_coordinator};
use crate::shard::Shard;

fn assignment(
    set: &std::collections::BTreeSet<Tp>,
    names: &BTreeMap<uuid::Uuid, String>,
) -> Assignment {
    Assignment::default().with_topic_partitions(
        crate::group::consumer::by_topic(set)
            .into_iter()
            .map(|(t, ps)| {
                TopicPartitions::default()
                    .with_topic_id(t)
                    .with_topic_name(TopicName(StrBytes::from_string(
                        names.get(&t).cloned().unwrap_or_default(),
                    )))
                    .with_partitions(ps)
            })
            .collect(),
    )
}

pub async fn handle(
    shard: &Rc<Shard>,
    request: ShareGroupDescribeRequest,
) -> ShareGroupDescribeResponse {
    let names: BTreeMap<uuid::Uuid, String> = shard
        .image()
        .topics
        .values()
        .map(|t| (t.id, t.name.clone()))
        .collect();
    let mut response = ShareGroupDescribeResponse::default();
    for group_id in request.group_ids {
        let id = group_id.0.to_string();
        let mut described = DescribedGroup::default().with_group_id(group_id.clone());
        let Some(owner) = coordinator_shard(shard, &id) else {
            response
                .groups
                .push(described.with_error_code(no_coordinator(shard, &id)));
            continue;
        };
        let names = names.clone();
        let found = shard
            .invoke_on(owner, move |s| async move {
                let groups = s.groups.share_groups.borrow();
                let g = groups.get(&id)?;
                let members: Vec<Member> = g
                    .members
                    .values()
                    .map(|m| {
                        Member::default()
                            .with_member_id(StrBytes::from_string(m.id.clone()))
                            .with_rack_id(m.rack_id.clone().map(StrBytes::from_string))
                            .with_member_epoch(m.epoch)
                            .with_client_id(StrBytes::from_string(m.client_id.clone()))
                            .with_client_host(StrBytes::from_string(m.client_host.clone()))
                            .with_subscribed_topic_names(
                                m.subscribed
                                    .iter()
                                    .map(|t| TopicName(StrBytes::from_string(t.clone())))
                                    .collect(),
                            )
                            .with_assignment(assignment(&m.assigned, &names))
                    })
                    .collect();
                Some((g.state().to_string(), g.epoch, g.assignment_epoch, members))
            })
            .await;
        match found {
            Some((state, epoch, assignment_epoch, members)) => {
                described.group_state = StrBytes::from_string(state);
                described.group_epoch = epoch;
                described.assignment_epoch = assignment_epoch;
                described.assignor_name = StrBytes::from_static_str(crate::group::share::ASSIGNOR);
                described.members = members;
                described.authorized_operations = i32::MIN;
            }
            None => {
                described.error_code = ResponseError::GroupIdNotFound.code();
                described.error_message = Some(StrBytes::from_string(format!(
                    "Group {} not found.",
                    group_id.0.as_str()
                )));
            }
        }
        response.groups.push(described);
    }
    response
}
