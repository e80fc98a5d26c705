//! StreamsGroupHeartbeat and StreamsGroupDescribe (KIP-1071): Kafka Streams' own group
//! protocol (`group.protocol=streams`). The coordinator (`group/streams.rs`) keeps the topology
//! and assigns tasks; this handler checks the ACLs, reaches the coordinator shard and creates the
//! internal topics (repartition and changelog topics) the topology needs, as Kafka's coordinator
//! does, then answers the member again so it gets its tasks at once.

use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::ResponseError;

use super::authz::{self, operation};
use super::groups_admin::GROUP_OPERATIONS_ALL;
use super::Client;
use crate::codec::streams_group::{
    encode_describe_response, status, DescribeRequest, DescribedGroup, HeartbeatRequest,
    HeartbeatResponse, Status, STREAMS_GROUP_DESCRIBE, STREAMS_GROUP_HEARTBEAT,
};
use crate::shard::groups::{coordinator_shard, no_coordinator};
use crate::shard::Shard;

/// Serves one streams group request; its response body.
pub async fn dispatch(
    shard: &Rc<Shard>,
    key: i16,
    body: Bytes,
    client: Client,
) -> anyhow::Result<BytesMut> {
    if !crate::features::streams_groups_enabled(&shard.image(), shard.config()) {
        tracing::info!(api_key = key, principal = %client.principal, host = %client.host, "streams group request while streams.version is 0; closing the connection");
        anyhow::bail!(
            "streams group API {key} while streams groups are disabled (streams.version 0)"
        );
    }
    let mut out = BytesMut::new();
    match key {
        STREAMS_GROUP_HEARTBEAT => {
            let request = HeartbeatRequest::decode(body)?;
            heartbeat(shard, request, &client).await.encode(&mut out);
        }
        STREAMS_GROUP_DESCRIBE => {
            let request = DescribeRequest::decode(body)?;
            let groups = describe(shard, request, &client).await;
            encode_describe_response(&groups, &mut out);
        }
        _ => anyhow::bail!("API key {key} is not a streams group API"),
    }
    Ok(out)
}

async fn heartbeat(
    shard: &Rc<Shard>,
    request: HeartbeatRequest,
    client: &Client,
) -> HeartbeatResponse {
    let interval_ms = {
        let image = shard.image();
        let own = image
            .cluster
            .as_ref()
            .and_then(|c| c.group_configs.get(&request.group_id));
        let config = crate::group::configs::StreamsGroupConfig::resolve(shard.config(), own);
        i32::try_from(config.heartbeat_interval_ms).unwrap_or(i32::MAX)
    };
    let (member_id, member_epoch) = (request.member_id.clone(), request.member_epoch);
    let fail = |e: ResponseError, message: Option<String>| HeartbeatResponse {
        error_code: e.code(),
        error_message: message,
        member_id: member_id.clone(),
        member_epoch,
        heartbeat_interval_ms: interval_ms,
        ..Default::default()
    };
    let group_id = request.group_id.clone();
    if group_id.is_empty() {
        return fail(
            ResponseError::InvalidRequest,
            Some("GroupId can't be empty.".into()),
        );
    }
    if !authz::group(shard, client, operation::READ, &group_id) {
        return fail(ResponseError::GroupAuthorizationFailed, None);
    }
    if let Some(topology) = &request.topology {
        let denied: Vec<&String> = topology
            .subtopologies
            .iter()
            .flat_map(|s| &s.source_topics)
            .filter(|t| {
                !authz::allowed(
                    shard,
                    client,
                    operation::DESCRIBE,
                    authz::resource_type::TOPIC,
                    t,
                )
            })
            .collect();
        if !denied.is_empty() {
            return fail(
                ResponseError::TopicAuthorizationFailed,
                Some(format!(
                    "Unauthorized to describe source topics {denied:?}."
                )),
            );
        }
    }
    let Some(owner) = coordinator_shard(shard, &group_id) else {
        let code = no_coordinator(shard, &group_id);
        let mut r = fail(ResponseError::NotCoordinator, None);
        r.error_code = code;
        return r;
    };
    let (client_id, host) = (client.client_id.clone(), client.host.clone());
    let outcome = {
        let (group_id, member_id) = (group_id.clone(), member_id.clone());
        shard
            .invoke_on(owner, move |s| async move {
                s.streams_heartbeat(&group_id, Some(request), &member_id, client_id, host)
            })
            .await
    };
    let Some(outcome) = outcome else {
        return fail(ResponseError::UnknownServerError, None);
    };
    if outcome.create.is_empty() || outcome.response.error_code != 0 {
        return outcome.response;
    }
    // The internal topics the topology needs: created through the controller (CREATE on the
    // cluster or on each topic), then the member is answered again with its tasks.
    let mut refused: Vec<String> = Vec::new();
    let creations = outcome.create.iter().map(|t| {
        let may = authz::cluster(shard, client, operation::CREATE)
            || authz::allowed(
                shard,
                client,
                operation::CREATE,
                authz::resource_type::TOPIC,
                &t.name,
            );
        let configs = t
            .configs
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect();
        let replication_factor = if t.replication_factor > 0 {
            t.replication_factor
        } else {
            -1
        };
        let (name, partitions) = (t.name.clone(), t.partitions);
        let group_id = &group_id;
        async move {
            if !may {
                return Err(format!("Unauthorized to CREATE on topic {name}."));
            }
            match crate::cluster::create_topic(
                shard,
                &name,
                partitions,
                replication_factor,
                configs,
                false,
            )
            .await
            {
                Ok(()) => {
                    tracing::info!(group = %group_id, topic = %name, partitions, "created a streams group's internal topic");
                    Ok(())
                }
                Err(crate::cluster::CreateError::Exists) => Ok(()),
                Err(e) => Err(format!("{name}: {e}")),
            }
        }
    });
    for creation in creations {
        if let Err(e) = creation.await {
            tracing::warn!(group = %group_id, error = %e, "could not create a streams group's internal topic");
            refused.push(e);
        }
    }
    let (client_id, host) = (client.client_id.clone(), client.host.clone());
    let again = {
        let (group_id, member_id) = (group_id.clone(), member_id.clone());
        shard
            .invoke_on(owner, move |s| async move {
                s.streams_heartbeat(&group_id, None, &member_id, client_id, host)
            })
            .await
    };
    let mut response = again.map_or(outcome.response, |o| o.response);
    if !refused.is_empty() {
        let statuses = response.status.get_or_insert_with(Vec::new);
        statuses.retain(|s| s.code != status::MISSING_INTERNAL_TOPICS);
        statuses.push(Status {
            code: status::MISSING_INTERNAL_TOPICS,
            detail: format!(
                "Internal topics could not be created: {}",
                refused.join("; ")
            ),
        });
    }
    response
}

async fn describe(
    shard: &Rc<Shard>,
    request: DescribeRequest,
    client: &Client,
) -> Vec<DescribedGroup> {
    let mut out = Vec::new();
    for id in request.group_ids {
        let failed = |e: ResponseError, message: Option<String>| DescribedGroup {
            error_code: e.code(),
            error_message: message,
            group_id: id.clone(),
            authorized_operations: i32::MIN,
            ..Default::default()
        };
        if !authz::group(shard, client, operation::DESCRIBE, &id) {
            out.push(failed(ResponseError::GroupAuthorizationFailed, None));
            continue;
        }
        let Some(owner) = coordinator_shard(shard, &id) else {
            let mut g = failed(ResponseError::NotCoordinator, None);
            g.error_code = no_coordinator(shard, &id);
            out.push(g);
            continue;
        };
        let found = {
            let id = id.clone();
            shard
                .invoke_on(owner, move |s| async move {
                    let groups = s.groups.groups.borrow();
                    groups
                        .get(&id)
                        .filter(|g| g.members.is_empty())
                        .and_then(|g| g.streams.as_ref())
                        .map(|st| st.describe(&id))
                })
                .await
        };
        match found {
            Some(mut g) => {
                if request.include_authorized_operations {
                    g.authorized_operations = GROUP_OPERATIONS_ALL;
                }
                out.push(g);
            }
            None => out.push(failed(
                ResponseError::GroupIdNotFound,
                Some(format!("Group {id} not found.")),
            )),
        }
    }
    out
}
