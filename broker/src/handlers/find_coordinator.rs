//! FindCoordinator: the leader of the `__consumer_offsets` partition a group hashes to
//! coordinates the group, and the leader of the `__transaction_state` partition a
//! transactional id hashes to coordinates the id. The first request for a kind of key creates
//! its topic, as in Kafka; until its partition has a leader the answer is
//! COORDINATOR_NOT_AVAILABLE and the client asks again. A share-partition key (version 6,
//! KIP-932: `group:topicId:partition`) is coordinated by the leader of the
//! `__share_group_state` partition it hashes to; a malformed one gets INVALID_REQUEST, as
//! Kafka answers it.

use std::rc::Rc;

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::cluster::InternalTopic;
use crate::shard::Shard;

const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;
const KEY_TYPE_SHARE: i8 = 2;
/// Kafka's message for INVALID_REQUEST, which it gives for an unknown key type.
const INVALID_REQUEST_MESSAGE: &str = "This most likely occurs because of a request being \
     malformed by the client library or the message was sent to an incompatible broker. See the \
     broker logs for more details.";

/// Whether `key` is a share-partition key as Kafka parses one: `group:topicId:partition`.
fn is_share_partition_key(key: &str) -> bool {
    let parts: Vec<&str> = key.split(':').collect();
    parts.len() == 3
        && !parts[0].is_empty()
        && crate::cluster::meta_properties::parse_kafka_uuid(parts[1]).is_some()
        && parts[2].parse::<i32>().is_ok()
}

fn key_text(c: &Coordinator) -> String {
    c.key.to_string()
}

pub fn handle(
    shard: &Rc<Shard>,
    client: &super::Client,
    request: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    use super::authz::{self, operation};
    let config = shard.config();
    let image = shard.image();
    let answer = |key: StrBytes| {
        let mut c = Coordinator::default().with_key(key);
        // The authorizer: DESCRIBE on the group or the transactional id.
        let denied = match request.key_type {
            KEY_TYPE_GROUP => (!authz::group(shard, client, operation::DESCRIBE, &key_text(&c)))
                .then_some(ResponseError::GroupAuthorizationFailed),
            KEY_TYPE_TRANSACTION => {
                (!authz::transactional_id(shard, client, operation::DESCRIBE, &key_text(&c)))
                    .then_some(ResponseError::TransactionalIdAuthorizationFailed)
            }
            // Share coordinators are for brokers: CLUSTER_ACTION on the cluster, as Kafka asks.
            KEY_TYPE_SHARE => (!authz::cluster(shard, client, operation::CLUSTER_ACTION))
                .then_some(ResponseError::ClusterAuthorizationFailed),
            _ => None,
        };
        if let Some(error) = denied {
            c.node_id = BrokerId(-1);
            c.port = -1;
            c.error_code = error.code();
            return c;
        }
        // The internal topic and partition whose leader coordinates the key, in a cluster.
        let placed = match request.key_type {
            _ if image.cluster.is_none() => None,
            KEY_TYPE_GROUP => Some((
                InternalTopic::Offsets,
                crate::group::offsets_topic::partition_for(
                    &key_text(&c),
                    config.offsets_topic_partitions,
                ),
                "the group's __consumer_offsets partition has no leader yet",
            )),
            KEY_TYPE_TRANSACTION => Some((
                InternalTopic::TransactionState,
                crate::txn::partition_for(&key_text(&c), config.transaction_state_log_partitions),
                "the transactional id's __transaction_state partition has no leader yet",
            )),
            KEY_TYPE_SHARE if is_share_partition_key(&key_text(&c)) => Some((
                InternalTopic::ShareGroupState,
                crate::share::coordinator::partition_for_key(
                    &key_text(&c),
                    config.share_coordinator_state_topic_partitions,
                ),
                // Kafka answers a share key's COORDINATOR_NOT_AVAILABLE with no message.
                "",
            )),
            _ => None,
        };
        if let Some((topic, p, no_leader)) = placed {
            match image.leader_of(topic.name(), p) {
                Some((_, Some(leader))) if !leader.fenced => {
                    c.node_id = BrokerId(leader.id);
                    let (host, port) = leader.on(&client.listener);
                    c.host = StrBytes::from_string(host.to_string());
                    c.port = port as i32;
                }
                found => {
                    if found.is_none() {
                        crate::cluster::ensure_internal_topic(shard, topic);
                    }
                    c.node_id = BrokerId(-1);
                    c.port = -1;
                    c.error_code = ResponseError::CoordinatorNotAvailable.code();
                    c.error_message = Some(StrBytes::from_static_str(no_leader));
                }
            }
        } else if request.key_type == KEY_TYPE_GROUP {
            c.node_id = BrokerId(config.node_id);
            let (host, port) = config.advertised_on(&client.listener);
            c.host = StrBytes::from_string(host.to_string());
            c.port = port as i32;
        } else {
            c.node_id = BrokerId(-1);
            c.port = -1;
            let (error, message) = match request.key_type {
                KEY_TYPE_SHARE if is_share_partition_key(&key_text(&c)) => {
                    (ResponseError::CoordinatorNotAvailable, "")
                }
                KEY_TYPE_SHARE => (ResponseError::InvalidRequest, ""),
                _ => {
                    tracing::info!(
                        key_type = request.key_type,
                        "FindCoordinator with an unknown key type"
                    );
                    (ResponseError::InvalidRequest, INVALID_REQUEST_MESSAGE)
                }
            };
            c.error_code = error.code();
            c.error_message = Some(StrBytes::from_static_str(message));
        }
        c
    };
    let mut response = FindCoordinatorResponse::default();
    if version >= 4 {
        response.coordinators = request
            .coordinator_keys
            .iter()
            .cloned()
            .map(answer)
            .collect();
    } else {
        let c = answer(request.key.clone());
        response.error_code = c.error_code;
        response.node_id = c.node_id;
        response.host = c.host;
        response.port = c.port;
        if version >= 1 {
            // Before the batched version Kafka names the absence of an error too.
            response.error_message = if c.error_code == 0 {
                Some(StrBytes::from_static_str("NONE"))
            } else {
                c.error_message
            };
        }
    }
    response
}
