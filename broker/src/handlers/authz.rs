//! The authorizer, as the handlers ask it: once per resource of a request, never per record.
//! Without `authorizer.class.name` everything is allowed, as in Kafka. The rules are Kafka's
//! StandardAuthorizer's (`sluice_replication::acl`), over the ACLs of this shard's image.

use kafka_protocol::messages::{ApiKey, TopicName};
use sluice_replication::acl::{self, Action, Requester};

use super::Client;
use crate::shard::Shard;

/// The principal of a node's requests to itself (`net::loopback`), allowed everything. No
/// login makes it: SASL and TLS principals are `User:` ones.
pub const NODE_PRINCIPAL: &str = "Node:self";

pub use acl::operation;
pub use acl::resource_type;

/// Whether `client` may do `operation` on the resource; a denial is logged.
pub fn allowed(
    shard: &Shard,
    client: &Client,
    operation: i8,
    resource_type: i8,
    name: &str,
) -> bool {
    let ok = allowed_quietly(shard, client, operation, resource_type, name);
    if !ok {
        // Kafka's authorizer log line: who, from where, what, on what.
        tracing::info!(target: "sluice::authorizer", principal = %client.principal, host = %client.host.trim_start_matches('/'), operation = operation_name(operation), resource_type = resource_type_name(resource_type), resource = name, "denied");
    }
    ok
}

fn allowed_quietly(
    shard: &Shard,
    client: &Client,
    operation: i8,
    resource_type: i8,
    name: &str,
) -> bool {
    let config = shard.config();
    if !config.authorizer || &*client.principal == NODE_PRINCIPAL {
        return true;
    }
    let image = shard.image();
    let acls = image.cluster.as_ref().map_or(&[][..], |c| &c.acls[..]);
    acl::authorize(
        acls,
        &config.authorizer_config,
        Requester {
            principal: &client.principal,
            host: client.host.trim_start_matches('/'),
        },
        Action {
            operation,
            resource_type,
            resource_name: name,
        },
    )
}

/// The APIs whose handlers ask the authorizer for each resource as Kafka's do. With an
/// authorizer, the others are for super users only until they do.
pub fn checked(key: ApiKey) -> bool {
    use ApiKey::*;
    matches!(
        key,
        ApiVersions
            | SaslHandshake
            | SaslAuthenticate
            | Metadata
            | Produce
            | Fetch
            | ListOffsets
            | OffsetForLeaderEpoch
            | InitProducerId
            | FindCoordinator
            | JoinGroup
            | SyncGroup
            | Heartbeat
            | LeaveGroup
            | ConsumerGroupHeartbeat
            | OffsetCommit
            | OffsetFetch
            | CreateTopics
            | DeleteTopics
            | CreateAcls
            | DescribeAcls
            | DeleteAcls
    )
}

/// Whether the client is allowed everything: a super user, this node itself, or anyone when
/// there is no authorizer.
pub fn is_super(shard: &Shard, client: &Client) -> bool {
    let config = shard.config();
    !config.authorizer
        || &*client.principal == NODE_PRINCIPAL
        || config
            .authorizer_config
            .super_users
            .iter()
            .any(|s| **s == *client.principal)
}

/// InitProducerId: WRITE on the transactional id; without one (an idempotent producer),
/// IDEMPOTENT_WRITE on the cluster or WRITE on any topic, as Kafka since 3.0.
pub fn init_producer_id(
    shard: &Shard,
    client: &Client,
    request: &kafka_protocol::messages::InitProducerIdRequest,
) -> bool {
    match request.transactional_id.as_ref().filter(|t| !t.is_empty()) {
        Some(id) => transactional_id(shard, client, operation::WRITE, id.as_str()),
        None => {
            cluster(shard, client, operation::IDEMPOTENT_WRITE)
                || shard.image().topics.keys().any(|t| {
                    allowed_quietly(shard, client, operation::WRITE, resource_type::TOPIC, t)
                })
        }
    }
}

/// Whether `client` may do `operation` on the cluster.
pub fn cluster(shard: &Shard, client: &Client, operation: i8) -> bool {
    allowed(
        shard,
        client,
        operation,
        resource_type::CLUSTER,
        acl::CLUSTER_NAME,
    )
}

pub fn topic(shard: &Shard, client: &Client, operation: i8, topic: &TopicName) -> bool {
    allowed(
        shard,
        client,
        operation,
        resource_type::TOPIC,
        topic.as_str(),
    )
}

pub fn group(shard: &Shard, client: &Client, operation: i8, group: &str) -> bool {
    allowed(shard, client, operation, resource_type::GROUP, group)
}

pub fn transactional_id(shard: &Shard, client: &Client, operation: i8, id: &str) -> bool {
    allowed(
        shard,
        client,
        operation,
        resource_type::TRANSACTIONAL_ID,
        id,
    )
}

fn operation_name(op: i8) -> &'static str {
    use operation::*;
    match op {
        ALL => "ALL",
        READ => "READ",
        WRITE => "WRITE",
        CREATE => "CREATE",
        DELETE => "DELETE",
        ALTER => "ALTER",
        DESCRIBE => "DESCRIBE",
        CLUSTER_ACTION => "CLUSTER_ACTION",
        DESCRIBE_CONFIGS => "DESCRIBE_CONFIGS",
        ALTER_CONFIGS => "ALTER_CONFIGS",
        IDEMPOTENT_WRITE => "IDEMPOTENT_WRITE",
        CREATE_TOKENS => "CREATE_TOKENS",
        DESCRIBE_TOKENS => "DESCRIBE_TOKENS",
        TWO_PHASE_COMMIT => "TWO_PHASE_COMMIT",
        _ => "UNKNOWN",
    }
}

fn resource_type_name(t: i8) -> &'static str {
    use resource_type::*;
    match t {
        TOPIC => "TOPIC",
        GROUP => "GROUP",
        CLUSTER => "CLUSTER",
        TRANSACTIONAL_ID => "TRANSACTIONAL_ID",
        DELEGATION_TOKEN => "DELEGATION_TOKEN",
        USER => "USER",
        _ => "UNKNOWN",
    }
}
