//! ListGroups, DescribeGroups, DeleteGroups and OffsetDelete: the group administration APIs
//! that `kafka-consumer-groups` and `sluice group` use.

use std::rc::Rc;

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::{
    DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse,
    GroupId, ListGroupsRequest, ListGroupsResponse, OffsetDeleteRequest, OffsetDeleteResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::group::GroupState;
use crate::shard::groups::{coordinator_shard, no_coordinator};
use crate::shard::Shard;

/// Every group operation (READ, DELETE, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS as bits 3, 6,
/// 8, 10, 11): without an authorizer everyone may do everything, and Kafka reports exactly this
/// bitfield then.
pub const GROUP_OPERATIONS_ALL: i32 = (1 << 3) | (1 << 6) | (1 << 8) | (1 << 10) | (1 << 11);
const _: () = assert!(GROUP_OPERATIONS_ALL == 3400);

pub async fn list(shard: &Rc<Shard>, request: ListGroupsRequest) -> ListGroupsResponse {
    let per_shard = shard
        .invoke_on_all(|s| async move {
            s.groups
                .groups
                .borrow()
                .values()
                .map(|g| match (&g.streams, &g.consumer) {
                    (Some(st), _) if g.members.is_empty() => (
                        g.id.clone(),
                        "streams".to_string(),
                        st.state().to_string(),
                        "streams",
                    ),
                    (_, Some(c)) if g.members.is_empty() => (
                        g.id.clone(),
                        "consumer".to_string(),
                        c.state().to_string(),
                        "consumer",
                    ),
                    _ => (
                        g.id.clone(),
                        g.protocol_type.clone().unwrap_or_default(),
                        g.state.name().to_string(),
                        "classic",
                    ),
                })
                .chain(s.groups.share_groups.borrow().iter().map(|(id, g)| {
                    (
                        id.clone(),
                        "share".to_string(),
                        g.state().to_string(),
                        "share",
                    )
                }))
                .collect::<Vec<_>>()
        })
        .await;
    let mut response = ListGroupsResponse::default();
    for (id, protocol_type, state, group_type) in per_shard.into_iter().flatten() {
        if !request.states_filter.is_empty()
            && !request
                .states_filter
                .iter()
                .any(|s| s.as_str().eq_ignore_ascii_case(&state))
        {
            continue;
        }
        // ListGroups v5 (KIP-848): only groups of the types asked for.
        if !request.types_filter.is_empty()
            && !request
                .types_filter
                .iter()
                .any(|t| t.as_str().eq_ignore_ascii_case(group_type))
        {
            continue;
        }
        response.groups.push(
            ListedGroup::default()
                .with_group_id(GroupId(StrBytes::from_string(id)))
                .with_protocol_type(StrBytes::from_string(protocol_type))
                .with_group_state(StrBytes::from_string(state))
                .with_group_type(StrBytes::from_static_str(group_type)),
        );
    }
    response
}

pub async fn describe(
    shard: &Rc<Shard>,
    request: DescribeGroupsRequest,
    version: i16,
) -> DescribeGroupsResponse {
    let mut response = DescribeGroupsResponse::default();
    for group_id in request.groups {
        let id = group_id.0.to_string();
        let mut described = DescribedGroup::default().with_group_id(group_id.clone());
        match coordinator_shard(shard, &id) {
            None => described.error_code = no_coordinator(shard, &id),
            Some(owner) => {
                if version >= 3 && request.include_authorized_operations {
                    described.authorized_operations = GROUP_OPERATIONS_ALL;
                }
                let found = shard
                    .invoke_on(owner, move |s| async move {
                        let groups = s.groups.groups.borrow();
                        // DescribeGroups describes classic groups; a consumer group is described
                        // as an unknown one, as in Kafka (ConsumerGroupDescribe describes it).
                        let classic = |g: &&crate::group::Group| {
                            (g.consumer.is_none() && g.streams.is_none()) || !g.members.is_empty()
                        };
                        let Some(g) = groups.get(&id) else {
                            return Err(format!("Group {id} not found."));
                        };
                        if !classic(&g) {
                            return Err(format!("Group {id} is not a classic group."));
                        }
                        Ok({
                            let protocol = g.protocol.clone();
                            let members: Vec<_> = g
                                .members
                                .values()
                                .map(|m| {
                                    let metadata = m.metadata_for(protocol.as_deref());
                                    (
                                        m.id.clone(),
                                        m.instance_id.clone(),
                                        m.client_id.clone(),
                                        m.client_host.clone(),
                                        metadata,
                                        m.assignment.clone(),
                                    )
                                })
                                .collect();
                            (
                                g.state.name().to_string(),
                                g.protocol_type.clone().unwrap_or_default(),
                                protocol.unwrap_or_default(),
                                members,
                            )
                        })
                    })
                    .await;
                match found {
                    Ok((state, protocol_type, protocol, members)) => {
                        described.group_state = StrBytes::from_string(state);
                        described.protocol_type = StrBytes::from_string(protocol_type);
                        described.protocol_data = StrBytes::from_string(protocol);
                        described.members = members
                            .into_iter()
                            .map(|(id, instance, client, host, metadata, assignment)| {
                                let mut m = DescribedGroupMember::default()
                                    .with_member_id(StrBytes::from_string(id))
                                    .with_client_id(StrBytes::from_string(client))
                                    .with_client_host(StrBytes::from_string(host))
                                    .with_member_metadata(metadata)
                                    .with_member_assignment(assignment);
                                if version >= 4 {
                                    m.group_instance_id = instance.map(StrBytes::from_string);
                                }
                                m
                            })
                            .collect();
                    }
                    Err(why) => {
                        // Kafka describes an unknown group (and a consumer group, which
                        // ConsumerGroupDescribe describes) as Dead; from version 6 with
                        // GROUP_ID_NOT_FOUND and a message too (KIP-1043).
                        described.group_state = StrBytes::from_static_str("Dead");
                        if version >= 6 {
                            described.authorized_operations = i32::MIN;
                            described.error_code = ResponseError::GroupIdNotFound.code();
                            described.error_message = Some(StrBytes::from_string(why));
                        }
                    }
                }
            }
        }
        response.groups.push(described);
    }
    response
}

pub async fn delete(shard: &Rc<Shard>, request: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let mut response = DeleteGroupsResponse::default();
    for group_id in request.groups_names {
        let id = group_id.0.to_string();
        let code = match coordinator_shard(shard, &id) {
            None => no_coordinator(shard, &id),
            Some(owner) => {
                shard
                    .invoke_on(owner, move |s| async move {
                        // A share group: only once it has no members; its share partitions
                        // on every shard go with it.
                        let share = s
                            .groups
                            .share_groups
                            .borrow()
                            .get(&id)
                            .map(|g| g.members.is_empty());
                        match share {
                            Some(false) => return ResponseError::NonEmptyGroup.code(),
                            Some(true) => {
                                // The persisted state of every share partition it may have
                                // read goes first: a failure leaves the group to try again.
                                let topics: Vec<String> = s
                                    .groups
                                    .share_groups
                                    .borrow()
                                    .get(&id)
                                    .map(|g| g.topics.iter().cloned().collect())
                                    .unwrap_or_default();
                                for topic in topics {
                                    if let Err(code) =
                                        crate::shard::share_state::delete_topic_state(&s, &id, &topic)
                                            .await
                                    {
                                        tracing::warn!(group = %id, topic = %topic, code, "could not delete a share group's persisted state");
                                        return code;
                                    }
                                }
                                s.groups.share_groups.borrow_mut().remove(&id);
                                let gone = id.clone();
                                s.invoke_on_all(move |s| {
                                    let g = gone.clone();
                                    async move { s.share_delete_group(&g) }
                                })
                                .await;
                                tracing::info!(group = %id, "deleted share group");
                                return 0;
                            }
                            None => {}
                        }
                        let keys = {
                            let groups = s.groups.groups.borrow();
                            match groups.get(&id) {
                                None => return ResponseError::GroupIdNotFound.code(),
                                Some(g)
                                    if g.state != GroupState::Empty
                                        || g.streams.as_ref().is_some_and(|st| !st.members.is_empty()) =>
                                {
                                    return ResponseError::NonEmptyGroup.code()
                                }
                                Some(g) => g.offsets.keys().cloned().collect::<Vec<_>>(),
                            }
                        };
                        let tombstones = keys.into_iter().map(|k| (k, None)).collect();
                        if let Err(code) = s.store_offsets(&id, tombstones).await {
                            return code;
                        }
                        s.groups.groups.borrow_mut().remove(&id);
                        tracing::info!(group = %id, "deleted group");
                        0
                    })
                    .await
            }
        };
        response.results.push(
            DeletableGroupResult::default()
                .with_group_id(group_id)
                .with_error_code(code),
        );
    }
    response
}

pub async fn offset_delete(
    shard: &Rc<Shard>,
    request: OffsetDeleteRequest,
) -> OffsetDeleteResponse {
    let id = request.group_id.0.to_string();
    let image = shard.image();
    // A topic or partition that does not exist is answered UNKNOWN_TOPIC_OR_PARTITION whatever
    // the group's state, as in Kafka; the others are deleted.
    let known = |topic: &str, partition: i32| image.has_partition(topic, partition);
    let keys: Vec<(String, i32)> = request
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(move |p| (t.name.0.to_string(), p.partition_index))
        })
        .filter(|(t, p)| known(t, *p))
        .collect();
    let code = match coordinator_shard(shard, &id) {
        None => no_coordinator(shard, &id),
        Some(owner) => {
            let keys = keys.clone();
            shard
                .invoke_on(owner, move |s| async move {
                    match s.groups.groups.borrow().get(&id) {
                        None => return ResponseError::GroupIdNotFound.code(),
                        Some(g) if g.state != GroupState::Empty => {
                            return ResponseError::GroupSubscribedToTopic.code()
                        }
                        Some(_) => {}
                    }
                    let tombstones = keys.into_iter().map(|k| (k, None)).collect();
                    match s.store_offsets(&id, tombstones).await {
                        Ok(()) => 0,
                        Err(code) => code,
                    }
                })
                .await
        }
    };
    let mut response = OffsetDeleteResponse::default();
    let group_level = matches!(code, c if c == ResponseError::GroupIdNotFound.code() || c == ResponseError::CoordinatorNotAvailable.code());
    if group_level {
        response.error_code = code;
    }
    for t in request.topics {
        let name = t.name.0.to_string();
        response.topics.push(
            OffsetDeleteResponseTopic::default()
                .with_name(t.name)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            OffsetDeleteResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(if group_level {
                                    0
                                } else if !known(&name, p.partition_index) {
                                    ResponseError::UnknownTopicOrPartition.code()
                                } else {
                                    code
                                })
                        })
                        .collect(),
                ),
        );
    }
    response
}
