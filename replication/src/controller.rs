//! The controller state machine: turns controller requests and time into metadata records and
//! responses, as Kafka's QuorumController does. Sans-IO: it never commits anything itself.
//!
//! Lifecycle: every node has one, inactive. When this node's raft becomes leader and its
//! leader-change batch has committed (so it has applied everything committed before), the node
//! calls `activate` with the committed image. While active, `handle` and `tick` return records
//! to propose together with the response to send once they commit. The controller applies its
//! own records at once to a speculative image, so the next request sees them (KRaft does the
//! same); if leadership is lost the node calls `deactivate`, which throws the speculative image
//! away, and the next activation starts from the committed one again. An inactive controller
//! answers every request with NOT_CONTROLLER.
//!
//! Broker sessions (heartbeat deadlines) and controlled-shutdown state are in memory on the
//! active controller only, as in Kafka: a new controller gives every registered broker a fresh
//! session.

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error_code::*;
use crate::image::{MetadataImage, PartitionRegistration, TopicImage};
use crate::placement::{place, PlacementBroker, PlacementError};
use crate::records::*;

mod client_quotas;
mod reassignment;

pub use client_quotas::*;

/// The config KIP-966 counts eligible leader replicas against.
pub const MIN_INSYNC_REPLICAS: &str = "min.insync.replicas";

/// Kafka's `broker.session.timeout.ms` default.
pub const BROKER_SESSION_TIMEOUT_MS_DEFAULT: u64 = 9_000;
/// Kafka's producer id block size (AllocateProducerIds hands out this many at a time).
pub const PRODUCER_ID_BLOCK_SIZE: i64 = 1_000;
/// Most partitions one topic may have: a CreateTopics batch holds one record per partition,
/// and each batch must stay well under the raft message size.
pub const PARTITIONS_PER_TOPIC_MAX: i32 = 10_000;
/// Kafka's internal topics, which DeleteTopics refuses.
pub const INTERNAL_TOPICS: &[&str] = &["__consumer_offsets", "__transaction_state"];
/// Kafka's topic name length limit.
pub const TOPIC_NAME_BYTES_MAX: usize = 249;
/// Most brokers one partition may be placed on.
pub const REPLICATION_FACTOR_MAX: i16 = 64;
/// Kafka's `leader.imbalance.check.interval.seconds` default, in milliseconds.
pub const LEADER_IMBALANCE_CHECK_INTERVAL_MS_DEFAULT: u64 = 300_000;
/// Most leaderships one automatic rebalance moves (Kafka's controller moves at most 1000 per
/// pass too), so one pass stays one modest metadata batch.
pub const REBALANCE_ELECTIONS_MAX: usize = 1_000;
/// ElectLeaders election types, as Kafka numbers them.
pub const ELECTION_PREFERRED: i8 = 0;
pub const ELECTION_UNCLEAN: i8 = 1;

/// Validates a resource's configs as they would be after a change; `Err` is the message for
/// INVALID_CONFIG. The broker passes its own checks (it knows which values its logs accept).
pub type ConfigValidator =
    fn(ConfigResourceType, &BTreeMap<String, String>) -> Result<(), (i16, String)>;
/// A config's value when a resource has none of its own (the broker's static or default
/// value), which APPEND and SUBTRACT start from, as Kafka's do.
pub type ConfigDefault = fn(ConfigResourceType, &str) -> Option<String>;

#[derive(Clone, Debug)]
pub struct ControllerConfig {
    pub node_id: BrokerId,
    pub cluster_id: String,
    /// `broker.session.timeout.ms`.
    pub broker_session_timeout_ms: u64,
    /// `num.partitions`.
    pub num_partitions: i32,
    /// `default.replication.factor`.
    pub default_replication_factor: i16,
    /// `min.insync.replicas` for topics without their own: a fenced replica whose removal
    /// takes the ISR below it joins the eligible leader replicas (KIP-966).
    pub min_insync_replicas: usize,
    pub config_validator: Option<ConfigValidator>,
    pub config_default: Option<ConfigDefault>,
    /// The largest replication factor CreateTopics takes: the broker holds it at 1 until its
    /// followers replicate (issue 14), so that no topic claims replicas it does not have.
    pub replication_factor_max: i16,
    /// `auto.leader.rebalance.enable`: every `leader_imbalance_check_interval_ms`, partitions
    /// whose preferred replica (the first) is an unfenced in-sync replica but not the leader
    /// get it back as leader.
    pub auto_leader_rebalance: bool,
    pub leader_imbalance_check_interval_ms: u64,
    /// `unclean.leader.election.enable` for topics that do not set it.
    pub unclean_leader_election: bool,
    /// Seeds topic ids and placement; the simulator fixes it, the broker draws it at random.
    pub seed: u64,
}

impl ControllerConfig {
    pub fn new(node_id: BrokerId, cluster_id: impl Into<String>) -> Self {
        ControllerConfig {
            node_id,
            cluster_id: cluster_id.into(),
            broker_session_timeout_ms: BROKER_SESSION_TIMEOUT_MS_DEFAULT,
            num_partitions: 1,
            default_replication_factor: 1,
            min_insync_replicas: 1,
            config_validator: None,
            config_default: None,
            replication_factor_max: REPLICATION_FACTOR_MAX,
            auto_leader_rebalance: true,
            leader_imbalance_check_interval_ms: LEADER_IMBALANCE_CHECK_INTERVAL_MS_DEFAULT,
            unclean_leader_election: false,
            seed: 0,
        }
    }
}

// ----- requests and responses, already decoded from Kafka's wire types -----

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatableTopic {
    pub name: String,
    /// -1 for `num.partitions`.
    pub num_partitions: i32,
    /// -1 for `default.replication.factor`.
    pub replication_factor: i16,
    /// Manual assignment: (partition index, replicas, preferred leader first).
    pub assignments: Vec<(i32, Vec<BrokerId>)>,
    pub configs: Vec<(String, Option<String>)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateTopicsRequest {
    pub topics: Vec<CreatableTopic>,
    pub validate_only: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatableTopicResult {
    pub name: String,
    pub topic_id: Option<TopicId>,
    pub error_code: i16,
    pub error_message: Option<String>,
    pub num_partitions: i32,
    pub replication_factor: i16,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopicRef {
    Name(String),
    Id(TopicId),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeleteTopicsRequest {
    pub topics: Vec<TopicRef>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeletableTopicResult {
    pub name: Option<String>,
    pub topic_id: Option<TopicId>,
    pub error_code: i16,
    pub error_message: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatePartitionsTopic {
    pub name: String,
    /// The new total partition count.
    pub count: i32,
    /// Replicas of each new partition, or `None` to place them.
    pub assignments: Option<Vec<Vec<BrokerId>>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatePartitionsRequest {
    pub topics: Vec<CreatePartitionsTopic>,
    pub validate_only: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatePartitionsTopicResult {
    pub name: String,
    pub error_code: i16,
    pub error_message: Option<String>,
}

/// IncrementalAlterConfigs' operations, with Kafka's ids 0..=3.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlterConfigOp {
    Set,
    Delete,
    Append,
    Subtract,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlterableConfig {
    pub name: String,
    pub op: AlterConfigOp,
    pub value: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlterConfigsResource {
    /// Kafka's ConfigResource type id (2 = topic, 4 = broker); others are refused.
    pub resource_type: i8,
    pub resource_name: String,
    pub configs: Vec<AlterableConfig>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IncrementalAlterConfigsRequest {
    pub resources: Vec<AlterConfigsResource>,
    pub validate_only: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlterConfigsResourceResult {
    pub resource_type: i8,
    pub resource_name: String,
    pub error_code: i16,
    pub error_message: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerRegistrationRequest {
    pub broker_id: BrokerId,
    pub cluster_id: String,
    pub incarnation_id: uuid::Uuid,
    pub listeners: Vec<Endpoint>,
    pub rack: Option<String>,
    /// The epoch of this broker's previous registration if it shut down cleanly, else -1:
    /// lets a restarted broker register before its old session expires.
    pub previous_broker_epoch: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerRegistrationResponse {
    pub error_code: i16,
    pub broker_epoch: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerHeartbeatRequest {
    pub broker_id: BrokerId,
    pub broker_epoch: BrokerEpoch,
    /// The last metadata offset the broker has applied.
    pub current_metadata_offset: Offset,
    pub wants_fence: bool,
    pub wants_shut_down: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerHeartbeatResponse {
    pub error_code: i16,
    pub is_caught_up: bool,
    pub is_fenced: bool,
    pub should_shut_down: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocateProducerIdsRequest {
    pub broker_id: BrokerId,
    pub broker_epoch: BrokerEpoch,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocateProducerIdsResponse {
    pub error_code: i16,
    pub producer_id_start: i64,
    pub producer_id_len: i32,
}

/// A topic of a single-node broker's metadata file, as the migration hands it over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigratedTopic {
    pub name: String,
    pub id: TopicId,
    pub partitions: i32,
    pub configs: BTreeMap<String, String>,
}

/// The metadata of a single-node broker from before the metadata log (its JSON file), to be
/// imported as it is: topics with their ids, their configs, dynamic broker configs, and the
/// producer-id counter. The importing broker is the only replica of every partition; it must
/// be registered and unfenced. Importing again is harmless: topics already there with the same
/// id are left alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigrateRequest {
    pub broker_id: BrokerId,
    pub topics: Vec<MigratedTopic>,
    /// By resource name: "" for the cluster-wide default, a node id for one broker.
    pub broker_configs: BTreeMap<String, BTreeMap<String, String>>,
    pub next_producer_id: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigrateResponse {
    pub error_code: i16,
    pub error_message: Option<String>,
    /// Topics this request added (the others were there already).
    pub imported: usize,
}

/// Kafka's AlterPartition (KIP-497, KIP-903): a partition leader asks to change its ISR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlterPartitionRequest {
    pub broker_id: BrokerId,
    pub broker_epoch: BrokerEpoch,
    pub partitions: Vec<AlterPartitionItem>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlterPartitionItem {
    pub topic_id: TopicId,
    pub partition_id: i32,
    /// The leader epoch and partition epoch the leader's change is based on.
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
    /// The ISR it wants, each member with the broker epoch the leader saw it fetch with
    /// (-1: not known), so a replica that restarted since cannot be added on an old fetch.
    pub new_isr: Vec<(BrokerId, BrokerEpoch)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlterPartitionResponse {
    pub error_code: i16,
    pub partitions: Vec<AlterPartitionResult>,
}

/// A partition's state after an AlterPartition (its error code aside): what the leader goes on
/// with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlterPartitionResult {
    pub topic_id: TopicId,
    pub partition_id: i32,
    pub error_code: i16,
    pub leader: BrokerId,
    pub leader_epoch: LeaderEpoch,
    pub isr: Vec<BrokerId>,
    pub partition_epoch: PartitionEpoch,
}

/// A broker's replicas whose log directory failed (Kafka's offline log directory, KIP-858):
/// Kafka's AssignReplicasToDirs naming the LOST directory. The controller takes the broker out
/// of their ISRs and eligible leaders and elects other leaders where it led, as fencing does
/// for all of a broker's partitions; the broker keeps the others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostReplicasRequest {
    pub broker_id: BrokerId,
    pub broker_epoch: BrokerEpoch,
    pub partitions: Vec<(TopicId, i32)>,
}

/// Per partition asked for: NONE, or UNKNOWN_TOPIC_ID / UNKNOWN_TOPIC_OR_PARTITION (also when
/// the broker holds no replica of it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostReplicasResponse {
    pub error_code: i16,
    pub partitions: Vec<(TopicId, i32, i16)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControllerRequest {
    CreateTopics(CreateTopicsRequest),
    DeleteTopics(DeleteTopicsRequest),
    CreatePartitions(CreatePartitionsRequest),
    IncrementalAlterConfigs(IncrementalAlterConfigsRequest),
    BrokerRegistration(BrokerRegistrationRequest),
    BrokerHeartbeat(BrokerHeartbeatRequest),
    AllocateProducerIds(AllocateProducerIdsRequest),
    Migrate(MigrateRequest),
    AlterPartition(AlterPartitionRequest),
    LostReplicas(LostReplicasRequest),
    ElectLeaders(ElectLeadersRequest),
    AlterPartitionReassignments(AlterPartitionReassignmentsRequest),
    ListPartitionReassignments(ListPartitionReassignmentsRequest),
    UpdateFeatures(UpdateFeaturesRequest),
    AlterUserScramCredentials(AlterUserScramCredentialsRequest),
    CreateAcls(CreateAclsRequest),
    DeleteAcls(DeleteAclsRequest),
    AlterClientQuotas(AlterClientQuotasRequest),
}

/// Kafka's UpdateFeatures: new finalized levels of cluster-wide features. The levels were
/// checked against what the brokers support before they got here; level 0 removes a feature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpdateFeaturesRequest {
    /// Feature names and their new levels.
    pub updates: Vec<(String, i16)>,
    pub validate_only: bool,
}

/// Kafka's AlterUserScramCredentials, with each upsertion's keys already derived from the
/// salted password the client sent (the broker does that; the controller never sees it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlterUserScramCredentialsRequest {
    /// User names and mechanism ids.
    pub deletions: Vec<(String, i8)>,
    pub upsertions: Vec<UserScramCredentialRecord>,
}

/// One user's answer to AlterUserScramCredentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScramAlterationResult {
    pub user: String,
    pub error_code: i16,
    pub error_message: Option<String>,
}

/// Kafka's CreateAcls: each ACL is created unless invalid; one that exists already is left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateAclsRequest {
    pub creations: Vec<crate::acl::AclBinding>,
}

/// One creation's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AclCreationResult {
    pub error_code: i16,
    pub error_message: Option<String>,
}

/// Kafka's DeleteAcls: every ACL any filter matches goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeleteAclsRequest {
    pub filters: Vec<crate::acl::AclFilter>,
}

/// One filter's answer: the ACLs it matched (and deleted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeleteAclsFilterResult {
    pub error_code: i16,
    pub error_message: Option<String>,
    pub matching: Vec<crate::acl::AclBinding>,
}

/// Kafka's SCRAM mechanism ids: SCRAM-SHA-256 and SCRAM-SHA-512.
pub const SCRAM_MECHANISMS: [i8; 2] = [1, 2];
/// Kafka's bounds on a SCRAM credential's iterations.
pub const SCRAM_ITERATIONS_MIN: i32 = 4096;
pub const SCRAM_ITERATIONS_MAX: i32 = 16384;

/// One partition of an AlterPartitionReassignments: its index and target replicas, or `None`
/// to cancel its reassignment.
pub type ReassignablePartition = (i32, Option<Vec<BrokerId>>);

/// Kafka's AlterPartitionReassignments (KIP-455).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlterPartitionReassignmentsRequest {
    /// Per topic, its partitions' targets.
    pub topics: Vec<(String, Vec<ReassignablePartition>)>,
    /// Version 1 (KIP-1101): `false` refuses a target of another size than the replica set.
    pub allow_replication_factor_change: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlterPartitionReassignmentsResponse {
    pub error_code: i16,
    pub results: Vec<ReassignmentResult>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReassignmentResult {
    pub topic: String,
    pub partition_id: i32,
    pub error_code: i16,
    pub error_message: Option<String>,
}

/// Kafka's ListPartitionReassignments; `None` lists every ongoing reassignment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListPartitionReassignmentsRequest {
    pub topics: Option<Vec<(String, Vec<i32>)>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListPartitionReassignmentsResponse {
    pub error_code: i16,
    pub reassignments: Vec<OngoingReassignment>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OngoingReassignment {
    pub topic: String,
    pub partition_id: i32,
    /// The whole replica set while it moves: the target, then the replicas leaving.
    pub replicas: Vec<BrokerId>,
    pub adding_replicas: Vec<BrokerId>,
    pub removing_replicas: Vec<BrokerId>,
}

/// Kafka's ElectLeaders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElectLeadersRequest {
    /// [`ELECTION_PREFERRED`] or [`ELECTION_UNCLEAN`].
    pub election_type: i8,
    /// `None`: every partition (and then partitions that need no election are left out of
    /// the answer, as Kafka leaves them out).
    pub partitions: Option<Vec<(String, Vec<i32>)>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElectLeadersResponse {
    pub error_code: i16,
    pub results: Vec<ElectionResult>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElectionResult {
    pub topic: String,
    pub partition_id: i32,
    pub error_code: i16,
    pub error_message: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControllerResponse {
    CreateTopics(Vec<CreatableTopicResult>),
    DeleteTopics(Vec<DeletableTopicResult>),
    CreatePartitions(Vec<CreatePartitionsTopicResult>),
    IncrementalAlterConfigs(Vec<AlterConfigsResourceResult>),
    BrokerRegistration(BrokerRegistrationResponse),
    BrokerHeartbeat(BrokerHeartbeatResponse),
    AllocateProducerIds(AllocateProducerIdsResponse),
    Migrate(MigrateResponse),
    AlterPartition(AlterPartitionResponse),
    LostReplicas(LostReplicasResponse),
    ElectLeaders(ElectLeadersResponse),
    AlterPartitionReassignments(AlterPartitionReassignmentsResponse),
    ListPartitionReassignments(ListPartitionReassignmentsResponse),
    /// The error of the whole request (the features are finalized together or not at all).
    UpdateFeatures(i16),
    /// One result per user, in user name order.
    AlterUserScramCredentials(Vec<ScramAlterationResult>),
    /// One result per creation, in order.
    CreateAcls(Vec<AclCreationResult>),
    /// One result per filter, in order.
    DeleteAcls(Vec<DeleteAclsFilterResult>),
    /// One result per entry, in order.
    AlterClientQuotas(Vec<QuotaAlterationResult>),
}

impl ControllerRequest {
    /// The response that fails every part of this request with one error code.
    pub fn error_response(&self, error_code: i16) -> ControllerResponse {
        match self {
            ControllerRequest::CreateTopics(r) => ControllerResponse::CreateTopics(
                r.topics
                    .iter()
                    .map(|t| CreatableTopicResult {
                        name: t.name.clone(),
                        topic_id: None,
                        error_code,
                        error_message: None,
                        num_partitions: -1,
                        replication_factor: -1,
                    })
                    .collect(),
            ),
            ControllerRequest::DeleteTopics(r) => ControllerResponse::DeleteTopics(
                r.topics
                    .iter()
                    .map(|t| DeletableTopicResult {
                        name: match t {
                            TopicRef::Name(n) => Some(n.clone()),
                            TopicRef::Id(_) => None,
                        },
                        topic_id: match t {
                            TopicRef::Id(id) => Some(*id),
                            TopicRef::Name(_) => None,
                        },
                        error_code,
                        error_message: None,
                    })
                    .collect(),
            ),
            ControllerRequest::CreatePartitions(r) => ControllerResponse::CreatePartitions(
                r.topics
                    .iter()
                    .map(|t| CreatePartitionsTopicResult {
                        name: t.name.clone(),
                        error_code,
                        error_message: None,
                    })
                    .collect(),
            ),
            ControllerRequest::IncrementalAlterConfigs(r) => {
                ControllerResponse::IncrementalAlterConfigs(
                    r.resources
                        .iter()
                        .map(|c| AlterConfigsResourceResult {
                            resource_type: c.resource_type,
                            resource_name: c.resource_name.clone(),
                            error_code,
                            error_message: None,
                        })
                        .collect(),
                )
            }
            ControllerRequest::BrokerRegistration(_) => {
                ControllerResponse::BrokerRegistration(BrokerRegistrationResponse {
                    error_code,
                    broker_epoch: -1,
                })
            }
            ControllerRequest::BrokerHeartbeat(_) => {
                ControllerResponse::BrokerHeartbeat(BrokerHeartbeatResponse {
                    error_code,
                    is_caught_up: false,
                    is_fenced: true,
                    should_shut_down: false,
                })
            }
            ControllerRequest::AllocateProducerIds(_) => {
                ControllerResponse::AllocateProducerIds(AllocateProducerIdsResponse {
                    error_code,
                    producer_id_start: -1,
                    producer_id_len: 0,
                })
            }
            ControllerRequest::Migrate(_) => ControllerResponse::Migrate(MigrateResponse {
                error_code,
                error_message: None,
                imported: 0,
            }),
            ControllerRequest::AlterPartition(_) => {
                ControllerResponse::AlterPartition(AlterPartitionResponse {
                    error_code,
                    partitions: vec![],
                })
            }
            ControllerRequest::LostReplicas(_) => {
                ControllerResponse::LostReplicas(LostReplicasResponse {
                    error_code,
                    partitions: vec![],
                })
            }
            ControllerRequest::ElectLeaders(r) => {
                ControllerResponse::ElectLeaders(ElectLeadersResponse {
                    error_code,
                    results: r
                        .partitions
                        .iter()
                        .flatten()
                        .flat_map(|(topic, ids)| {
                            ids.iter().map(move |&partition_id| ElectionResult {
                                topic: topic.clone(),
                                partition_id,
                                error_code,
                                error_message: None,
                            })
                        })
                        .collect(),
                })
            }
            ControllerRequest::AlterPartitionReassignments(_) => {
                ControllerResponse::AlterPartitionReassignments(
                    AlterPartitionReassignmentsResponse {
                        error_code,
                        results: vec![],
                    },
                )
            }
            ControllerRequest::ListPartitionReassignments(_) => {
                ControllerResponse::ListPartitionReassignments(ListPartitionReassignmentsResponse {
                    error_code,
                    reassignments: vec![],
                })
            }
            ControllerRequest::UpdateFeatures(_) => ControllerResponse::UpdateFeatures(error_code),
            ControllerRequest::CreateAcls(r) => ControllerResponse::CreateAcls(
                r.creations
                    .iter()
                    .map(|_| AclCreationResult {
                        error_code,
                        error_message: None,
                    })
                    .collect(),
            ),
            ControllerRequest::AlterClientQuotas(r) => ControllerResponse::AlterClientQuotas(
                r.entries
                    .iter()
                    .map(|_| QuotaAlterationResult {
                        error_code,
                        error_message: None,
                    })
                    .collect(),
            ),
            ControllerRequest::DeleteAcls(r) => ControllerResponse::DeleteAcls(
                r.filters
                    .iter()
                    .map(|_| DeleteAclsFilterResult {
                        error_code,
                        error_message: None,
                        matching: vec![],
                    })
                    .collect(),
            ),
            ControllerRequest::AlterUserScramCredentials(r) => {
                let users: BTreeSet<&String> = r
                    .deletions
                    .iter()
                    .map(|(name, _)| name)
                    .chain(r.upsertions.iter().map(|u| &u.name))
                    .collect();
                ControllerResponse::AlterUserScramCredentials(
                    users
                        .into_iter()
                        .map(|user| ScramAlterationResult {
                            user: user.clone(),
                            error_code,
                            error_message: None,
                        })
                        .collect(),
                )
            }
        }
    }
}

/// What handling a request produced: records to commit (possibly none), and the response to
/// send once they have committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerResult {
    pub records: Vec<Record>,
    pub response: ControllerResponse,
}

pub struct Controller {
    config: ControllerConfig,
    /// The committed image plus every record this controller has produced since, while active.
    speculative: Option<MetadataImage>,
    /// Heartbeat deadline of each registered broker (ms), active controller only.
    sessions: BTreeMap<BrokerId, u64>,
    /// Brokers that asked for controlled shutdown since they registered.
    shutting_down: BTreeSet<BrokerId>,
    /// When the next automatic leader rebalance is due (ms), active controller only.
    next_rebalance_ms: u64,
    /// The offset the records being produced will commit at (set by `handle` and `tick`).
    next_offset: Offset,
    rng: StdRng,
}

impl Controller {
    pub fn new(config: ControllerConfig) -> Self {
        let rng = StdRng::seed_from_u64(config.seed);
        Controller {
            config,
            speculative: None,
            sessions: BTreeMap::new(),
            shutting_down: BTreeSet::new(),
            next_rebalance_ms: 0,
            next_offset: Offset(0),
            rng,
        }
    }

    pub fn config(&self) -> &ControllerConfig {
        &self.config
    }

    pub fn is_active(&self) -> bool {
        self.speculative.is_some()
    }

    /// Becomes the active controller on top of `committed`, which must hold everything
    /// committed so far. Every registered broker gets a fresh session from `now_ms`.
    pub fn activate(&mut self, committed: &MetadataImage, now_ms: u64) {
        self.speculative = Some(committed.clone());
        self.sessions = committed
            .brokers()
            .map(|b| (b.id, now_ms + self.config.broker_session_timeout_ms))
            .collect();
        self.shutting_down.clear();
        self.next_rebalance_ms = now_ms + self.config.leader_imbalance_check_interval_ms;
    }

    /// Stops being the active controller; uncommitted work is forgotten.
    pub fn deactivate(&mut self) {
        self.speculative = None;
        self.sessions.clear();
        self.shutting_down.clear();
    }

    /// The image this controller decides against (committed plus its own pending records).
    pub fn speculative_image(&self) -> Option<&MetadataImage> {
        self.speculative.as_ref()
    }

    /// Handles one request. `next_offset` is the offset its records will be committed at (the
    /// raft index the next proposal gets): a broker's epoch is the offset of its registration.
    pub fn handle(
        &mut self,
        now_ms: u64,
        next_offset: Offset,
        request: &ControllerRequest,
    ) -> ControllerResult {
        if self.speculative.is_none() {
            return ControllerResult {
                records: vec![],
                response: request.error_response(NOT_CONTROLLER),
            };
        }
        self.next_offset = next_offset;
        let (records, response) = match request {
            ControllerRequest::CreateTopics(r) => self.create_topics(r),
            ControllerRequest::DeleteTopics(r) => self.delete_topics(r),
            ControllerRequest::CreatePartitions(r) => self.create_partitions(r),
            ControllerRequest::IncrementalAlterConfigs(r) => self.alter_configs(r),
            ControllerRequest::BrokerRegistration(r) => {
                self.register_broker(now_ms, next_offset, r)
            }
            ControllerRequest::BrokerHeartbeat(r) => self.heartbeat(now_ms, r),
            ControllerRequest::AllocateProducerIds(r) => self.allocate_producer_ids(r),
            ControllerRequest::Migrate(r) => self.migrate(r),
            ControllerRequest::AlterPartition(r) => self.alter_partition(r),
            ControllerRequest::LostReplicas(r) => self.lost_replicas(r),
            ControllerRequest::ElectLeaders(r) => self.elect_leaders(r),
            ControllerRequest::AlterPartitionReassignments(r) => self.alter_reassignments(r),
            ControllerRequest::ListPartitionReassignments(r) => {
                (vec![], self.list_reassignments(r))
            }
            ControllerRequest::UpdateFeatures(r) => self.update_features(r),
            ControllerRequest::AlterUserScramCredentials(r) => self.alter_scram(r),
            ControllerRequest::CreateAcls(r) => self.create_acls(r),
            ControllerRequest::DeleteAcls(r) => self.delete_acls(r),
            ControllerRequest::AlterClientQuotas(r) => self.alter_client_quotas(r),
        };
        ControllerResult { records, response }
    }

    /// Fences brokers whose sessions have expired; returns the records to commit (one batch),
    /// empty when there is nothing to do or this controller is not active.
    pub fn tick(&mut self, now_ms: u64, next_offset: Offset) -> Vec<Record> {
        self.next_offset = next_offset;
        let Some(image) = &self.speculative else {
            return vec![];
        };
        let expired: Vec<BrokerId> = self
            .sessions
            .iter()
            .filter(|(id, &deadline)| deadline < now_ms && image.is_unfenced(**id))
            .map(|(id, _)| *id)
            .collect();
        let mut records = Vec::new();
        let safety = self.elr_safety_records();
        if !safety.is_empty() {
            self.emit(&mut records, safety);
        }
        for id in expired {
            let image = self.speculative.as_ref().expect("active");
            let epoch = image
                .broker(id)
                .expect("session of a registered broker")
                .epoch;
            let mut batch = self.leave_partitions(id);
            batch.push(Record::FenceBroker(BrokerFencingRecord { id, epoch }));
            self.emit(&mut records, batch);
        }
        if self.config.auto_leader_rebalance && now_ms >= self.next_rebalance_ms {
            self.next_rebalance_ms = now_ms + self.config.leader_imbalance_check_interval_ms;
            let batch = self.rebalance_leaders();
            if !batch.is_empty() {
                self.emit(&mut records, batch);
            }
        }
        records
    }

    /// Preferred-leader elections for every partition whose preferred replica could lead but
    /// does not (at most [`REBALANCE_ELECTIONS_MAX`]).
    fn rebalance_leaders(&self) -> Vec<Record> {
        let mut batch = Vec::new();
        for topic in self.image().topics() {
            for (&partition_id, p) in &topic.partitions {
                if batch.len() >= REBALANCE_ELECTIONS_MAX {
                    return batch;
                }
                if let Ok(change) = self.preferred_election(topic.id, partition_id, p) {
                    batch.push(Record::PartitionChange(change));
                }
            }
        }
        batch
    }

    /// Whether a replica may be elected leader now: unfenced and not shutting down.
    fn can_lead(&self, b: BrokerId) -> bool {
        self.image().is_unfenced(b) && !self.shutting_down.contains(&b)
    }

    /// The change that makes the preferred (first) replica the leader, or why there is none.
    fn preferred_election(
        &self,
        topic_id: TopicId,
        partition_id: i32,
        p: &PartitionRegistration,
    ) -> Result<PartitionChangeRecord, (i16, String)> {
        let Some(&preferred) = p.replicas.first() else {
            return Err((
                PREFERRED_LEADER_NOT_AVAILABLE,
                "the partition has no replicas".into(),
            ));
        };
        if p.leader == preferred {
            return Err((
                ELECTION_NOT_NEEDED,
                "Leader election not needed for topic partition.".into(),
            ));
        }
        if !p.isr.contains(&preferred) || !self.can_lead(preferred) {
            return Err((
                PREFERRED_LEADER_NOT_AVAILABLE,
                format!(
                    "the preferred replica {} is not an unfenced in-sync replica",
                    preferred.0
                ),
            ));
        }
        Ok(PartitionChangeRecord {
            partition_id,
            topic_id,
            leader: Some(preferred),
            ..Default::default()
        })
    }

    /// The change that gives a leaderless partition a leader: an unfenced in-sync replica, else
    /// an eligible leader replica (KIP-966), else any unfenced replica, which loses whatever it
    /// lacks of the old ISR's records (hence unclean). Its ISR is then the new leader alone.
    fn unclean_election(
        &self,
        topic_id: TopicId,
        partition_id: i32,
        p: &PartitionRegistration,
    ) -> Result<PartitionChangeRecord, (i16, String)> {
        if p.leader != BrokerId::NONE {
            return Err((
                ELECTION_NOT_NEEDED,
                "Leader election not needed for topic partition.".into(),
            ));
        }
        let mut change = PartitionChangeRecord {
            partition_id,
            topic_id,
            ..Default::default()
        };
        let clean = self.elect(p, &p.isr, BrokerId::NONE);
        if clean != BrokerId::NONE {
            change.leader = Some(clean);
            return Ok(change);
        }
        let Some(&chosen) = p
            .eligible_leader_replicas
            .iter()
            .chain(p.replicas.iter())
            .find(|&&b| p.replicas.contains(&b) && self.can_lead(b))
        else {
            return Err((
                ELIGIBLE_LEADERS_NOT_AVAILABLE,
                "no replica of the partition is on an unfenced broker".into(),
            ));
        };
        change.leader = Some(chosen);
        change.isr = Some(vec![chosen]);
        change.eligible_leader_replicas = Some(vec![]);
        Ok(change)
    }

    fn unclean_allowed(&self, topic: &str) -> bool {
        self.image()
            .topic_configs(topic)
            .and_then(|c| c.get("unclean.leader.election.enable"))
            .map_or(self.config.unclean_leader_election, |v| v == "true")
    }

    fn elect_leaders(&mut self, r: &ElectLeadersRequest) -> (Vec<Record>, ControllerResponse) {
        if r.election_type != ELECTION_PREFERRED && r.election_type != ELECTION_UNCLEAN {
            let mut response =
                ControllerRequest::ElectLeaders(r.clone()).error_response(INVALID_REQUEST);
            if let ControllerResponse::ElectLeaders(e) = &mut response {
                e.error_code = INVALID_REQUEST;
            }
            return (vec![], response);
        }
        let every = r.partitions.is_none();
        let wanted: Vec<(String, i32)> = match &r.partitions {
            Some(list) => list
                .iter()
                .flat_map(|(t, ids)| ids.iter().map(move |&i| (t.clone(), i)))
                .collect(),
            None => self
                .image()
                .topics()
                .flat_map(|t| t.partitions.keys().map(move |&i| (t.name.clone(), i)))
                .collect(),
        };
        let mut batch = Vec::new();
        let mut results = Vec::new();
        let mut seen = BTreeSet::new();
        for (topic, partition_id) in wanted {
            if !seen.insert((topic.clone(), partition_id)) {
                continue;
            }
            let outcome = match self
                .image()
                .topic(&topic)
                .and_then(|t| Some((t.id, t.partitions.get(&partition_id)?)))
            {
                None => Err((
                    UNKNOWN_TOPIC_OR_PARTITION,
                    "This server does not host this topic-partition.".to_string(),
                )),
                Some((id, p)) if r.election_type == ELECTION_PREFERRED => {
                    self.preferred_election(id, partition_id, p)
                }
                Some((id, p)) => self.unclean_election(id, partition_id, p),
            };
            let (error_code, error_message) = match outcome {
                Ok(change) => {
                    batch.push(Record::PartitionChange(change));
                    (NONE, None)
                }
                Err((ELECTION_NOT_NEEDED, _)) if every => continue,
                Err((code, message)) => (code, Some(message)),
            };
            results.push(ElectionResult {
                topic,
                partition_id,
                error_code,
                error_message,
            });
        }
        let mut records = Vec::new();
        if !batch.is_empty() {
            self.emit(&mut records, batch);
        }
        (
            records,
            ControllerResponse::ElectLeaders(ElectLeadersResponse {
                error_code: NONE,
                results,
            }),
        )
    }

    fn image(&self) -> &MetadataImage {
        self.speculative.as_ref().expect("active controller")
    }

    /// Applies `batch` to the speculative image, so what follows sees it, and adds it to `out`.
    fn emit(&mut self, out: &mut Vec<Record>, batch: Vec<Record>) {
        let offset = self.next_offset;
        let image = self.speculative.as_mut().expect("active controller");
        for record in &batch {
            if let Err(e) = image.apply(offset, record) {
                panic!("controller produced a record its own image refuses: {e}: {record:?}");
            }
        }
        out.extend(batch);
    }

    /// A topic's `min.insync.replicas`: its own, else the cluster-wide dynamic default, else the
    /// static one.
    fn min_insync_replicas(&self, topic: &str) -> usize {
        let image = self.image();
        image
            .topic_configs(topic)
            .and_then(|c| c.get(MIN_INSYNC_REPLICAS))
            .or_else(|| {
                image
                    .configs(ConfigResourceType::Broker, "")
                    .and_then(|c| c.get(MIN_INSYNC_REPLICAS))
            })
            .and_then(|v| v.parse().ok())
            .unwrap_or(self.config.min_insync_replicas)
    }

    /// KIP-966, as Kafka's controller does once eligible leader replicas are on: the cluster
    /// keeps a cluster-wide `min.insync.replicas` in the metadata log (the static value, the
    /// first time), so that every broker and the controller count the same minimum.
    fn elr_safety_records(&self) -> Vec<Record> {
        let has = self
            .image()
            .configs(ConfigResourceType::Broker, "")
            .is_some_and(|c| c.contains_key(MIN_INSYNC_REPLICAS));
        if has {
            return vec![];
        }
        vec![Record::Config(ConfigRecord {
            resource_type: ConfigResourceType::Broker,
            resource_name: String::new(),
            name: MIN_INSYNC_REPLICAS.into(),
            value: Some(self.config.min_insync_replicas.to_string()),
        })]
    }

    fn usable_brokers(&self) -> Vec<PlacementBroker> {
        self.image()
            .unfenced_brokers()
            .filter(|b| !self.shutting_down.contains(&b.id))
            .map(|b| PlacementBroker {
                id: b.id,
                rack: b.rack.clone(),
            })
            .collect()
    }

    fn new_topic_id(&mut self) -> TopicId {
        loop {
            let id = uuid::Builder::from_random_bytes(self.rng.gen()).into_uuid();
            if !id.is_nil() && self.image().topic_by_id(TopicId(id)).is_none() {
                return TopicId(id);
            }
        }
    }

    /// A leader for a partition, preferring replica order: the first ISR member that is
    /// unfenced and not shutting down, other than `excluded`.
    fn elect(&self, p: &PartitionRegistration, isr: &[BrokerId], excluded: BrokerId) -> BrokerId {
        p.replicas
            .iter()
            .copied()
            .find(|b| {
                *b != excluded
                    && isr.contains(b)
                    && self.image().is_unfenced(*b)
                    && !self.shutting_down.contains(b)
            })
            .unwrap_or(BrokerId::NONE)
    }

    /// Partition changes that take `broker` out of every ISR and leadership, for fencing and
    /// controlled shutdown. The last ISR member stays in the ISR (with no leader), as in Kafka,
    /// so it can lead again when it comes back; a removal that takes the ISR below
    /// `min.insync.replicas` puts the broker in the eligible leader replicas (KIP-966).
    fn leave_partitions(&self, broker: BrokerId) -> Vec<Record> {
        let mut records = Vec::new();
        for topic in self.image().topics() {
            let min_isr = self.min_insync_replicas(&topic.name);
            for (&partition_id, p) in &topic.partitions {
                if !p.isr.contains(&broker) && p.leader != broker {
                    continue;
                }
                let mut change = PartitionChangeRecord {
                    partition_id,
                    topic_id: topic.id,
                    ..Default::default()
                };
                let mut isr = p.isr.clone();
                if isr.len() > 1 {
                    isr.retain(|b| *b != broker);
                    change.isr = Some(isr.clone());
                    if isr.len() < min_isr && !p.eligible_leader_replicas.contains(&broker) {
                        let mut elr = p.eligible_leader_replicas.clone();
                        elr.push(broker);
                        change.eligible_leader_replicas = Some(elr);
                    }
                }
                if p.leader == broker {
                    let leader = self.elect(p, &isr, broker);
                    change.leader = Some(leader);
                    if leader == BrokerId::NONE && self.unclean_allowed(&topic.name) {
                        // No in-sync replica is left: with unclean election allowed, any
                        // unfenced replica leads, alone in the ISR.
                        if let Some(&other) = p
                            .replicas
                            .iter()
                            .find(|&&b| b != broker && self.can_lead(b))
                        {
                            change.leader = Some(other);
                            change.isr = Some(vec![other]);
                            change.eligible_leader_replicas = Some(vec![]);
                        }
                    }
                }
                if change.isr.is_some() || change.leader.is_some() {
                    records.push(Record::PartitionChange(change));
                }
            }
        }
        records
    }

    /// Partition changes that give leaderless partitions to `broker` once it is unfenced:
    /// it leads where it is in the ISR, or failing that in the eligible leader replicas.
    fn lead_leaderless(&self, broker: BrokerId) -> Vec<Record> {
        let mut records = Vec::new();
        for topic in self.image().topics() {
            for (&partition_id, p) in &topic.partitions {
                if p.leader != BrokerId::NONE {
                    continue;
                }
                let mut change = PartitionChangeRecord {
                    partition_id,
                    topic_id: topic.id,
                    ..Default::default()
                };
                if p.isr.contains(&broker) {
                    change.leader = Some(broker);
                } else if p.eligible_leader_replicas.contains(&broker) {
                    change.leader = Some(broker);
                    change.isr = Some(vec![broker]);
                    change.eligible_leader_replicas = Some(
                        p.eligible_leader_replicas
                            .iter()
                            .copied()
                            .filter(|b| *b != broker)
                            .collect(),
                    );
                } else if p.replicas.contains(&broker) && self.unclean_allowed(&topic.name) {
                    change.leader = Some(broker);
                    change.isr = Some(vec![broker]);
                    change.eligible_leader_replicas = Some(vec![]);
                } else {
                    continue;
                }
                records.push(Record::PartitionChange(change));
            }
        }
        records
    }

    fn create_topics(&mut self, r: &CreateTopicsRequest) -> (Vec<Record>, ControllerResponse) {
        let mut records = Vec::new();
        let mut results = Vec::new();
        let mut seen = BTreeMap::new();
        for t in &r.topics {
            *seen.entry(t.name.as_str()).or_insert(0) += 1;
        }
        for t in &r.topics {
            let result = if seen[t.name.as_str()] > 1 {
                Err((
                    INVALID_REQUEST,
                    format!("Duplicate topic name {:?}.", t.name),
                ))
            } else {
                self.create_topic(t)
            };
            match result {
                Ok((topic_records, result)) => {
                    if !r.validate_only {
                        // Later topics of the same request see this one.
                        self.emit(&mut records, topic_records);
                    }
                    results.push(result);
                }
                Err((error_code, message)) => results.push(CreatableTopicResult {
                    name: t.name.clone(),
                    topic_id: None,
                    error_code,
                    error_message: Some(message),
                    num_partitions: -1,
                    replication_factor: -1,
                }),
            }
        }
        (records, ControllerResponse::CreateTopics(results))
    }

    fn create_topic(
        &mut self,
        t: &CreatableTopic,
    ) -> Result<(Vec<Record>, CreatableTopicResult), (i16, String)> {
        validate_topic_name(&t.name).map_err(|m| (INVALID_TOPIC_EXCEPTION, m))?;
        if self.image().topic(&t.name).is_some() {
            return Err((
                TOPIC_ALREADY_EXISTS,
                format!("Topic '{}' already exists.", t.name),
            ));
        }
        let mut configs = BTreeMap::new();
        for (name, value) in &t.configs {
            let Some(value) = value else {
                return Err((
                    INVALID_CONFIG,
                    format!("Null value not supported for topic configs: {name}"),
                ));
            };
            configs.insert(name.clone(), value.clone());
        }
        if let Some(validate) = self.config.config_validator {
            validate(ConfigResourceType::Topic, &configs)?;
        }
        let assignments = if t.assignments.is_empty() {
            let num_partitions = if t.num_partitions == -1 {
                self.config.num_partitions
            } else {
                t.num_partitions
            };
            let replication_factor = if t.replication_factor == -1 {
                self.config.default_replication_factor
            } else {
                t.replication_factor
            };
            if num_partitions <= 0 || num_partitions > PARTITIONS_PER_TOPIC_MAX {
                return Err((
                    INVALID_PARTITIONS,
                    format!(
                        "Number of partitions was set to {num_partitions}; it must be between 1 and {PARTITIONS_PER_TOPIC_MAX}."
                    ),
                ));
            }
            if replication_factor <= 0 || replication_factor > REPLICATION_FACTOR_MAX {
                return Err((
                    INVALID_REPLICATION_FACTOR,
                    "Replication factor must be larger than 0.".into(),
                ));
            }
            // After placement, so that a factor no broker count could meet gets Kafka's answer.
            let placed = self.place(0, num_partitions, replication_factor)?;
            self.check_replication_factor(replication_factor as usize)
                .map_err(|m| (INVALID_REPLICATION_FACTOR, m))?;
            placed
        } else {
            if t.num_partitions != -1 || t.replication_factor != -1 {
                return Err((
                    INVALID_REQUEST,
                    "Both numPartitions or replicationFactor and replicasAssignments were set. Both cannot be used at the same time.".into(),
                ));
            }
            let mut sorted = t.assignments.clone();
            sorted.sort_by_key(|(p, _)| *p);
            for (i, (p, _)) in sorted.iter().enumerate() {
                if *p != i as i32 {
                    return Err((
                        INVALID_REPLICA_ASSIGNMENT,
                        "Partitions in the manual assignment must be numbered 0, 1, 2, ... with none missing.".into(),
                    ));
                }
            }
            if sorted.len() > PARTITIONS_PER_TOPIC_MAX as usize {
                return Err((INVALID_PARTITIONS, "Too many partitions.".into()));
            }
            let assignments: Vec<Vec<BrokerId>> = sorted.into_iter().map(|(_, r)| r).collect();
            self.check_manual_assignments(&assignments)?;
            assignments
        };
        let topic_id = self.new_topic_id();
        let mut records = vec![Record::Topic(TopicRecord {
            name: t.name.clone(),
            topic_id,
        })];
        for (name, value) in configs {
            records.push(Record::Config(ConfigRecord {
                resource_type: ConfigResourceType::Topic,
                resource_name: t.name.clone(),
                name,
                value: Some(value),
            }));
        }
        for (i, replicas) in assignments.iter().enumerate() {
            records.push(self.new_partition(topic_id, i as i32, replicas));
        }
        Ok((
            records,
            CreatableTopicResult {
                name: t.name.clone(),
                topic_id: Some(topic_id),
                error_code: NONE,
                error_message: None,
                num_partitions: assignments.len() as i32,
                replication_factor: assignments[0].len() as i16,
            },
        ))
    }

    fn place(
        &mut self,
        first: i32,
        count: i32,
        replication_factor: i16,
    ) -> Result<Vec<Vec<BrokerId>>, (i16, String)> {
        let brokers = self.usable_brokers();
        place(&brokers, first, count, replication_factor, &mut self.rng).map_err(|e| match e {
            PlacementError::NotEnoughBrokers {
                replication_factor,
                brokers,
            } => (
                INVALID_REPLICATION_FACTOR,
                format!(
                    "Unable to replicate the partition {replication_factor} time(s): The target replication factor of {replication_factor} cannot be reached because only {brokers} broker(s) are registered and unfenced."
                ),
            ),
        })
    }

    fn check_replication_factor(&self, replicas: usize) -> Result<(), String> {
        let max = self.config.replication_factor_max.max(1) as usize;
        if replicas > max {
            return Err(format!(
                "A replication factor of {replicas} is more than this cluster allows ({max})."
            ));
        }
        Ok(())
    }

    fn check_manual_assignments(&self, assignments: &[Vec<BrokerId>]) -> Result<(), (i16, String)> {
        let rf = assignments.first().map_or(0, Vec::len);
        for (p, replicas) in assignments.iter().enumerate() {
            if replicas.is_empty() || replicas.len() > REPLICATION_FACTOR_MAX as usize {
                return Err((
                    INVALID_REPLICA_ASSIGNMENT,
                    format!(
                        "The manual partition assignment for partition {p} has {} replicas.",
                        replicas.len()
                    ),
                ));
            }
            if replicas.len() != rf {
                return Err((
                    INVALID_REPLICA_ASSIGNMENT,
                    "All partitions in the manual partition assignment must have the same number of replicas.".into(),
                ));
            }
            let mut distinct = replicas.clone();
            distinct.sort();
            distinct.dedup();
            if distinct.len() != replicas.len() {
                return Err((
                    INVALID_REPLICA_ASSIGNMENT,
                    format!("The manual partition assignment for partition {p} contains a duplicate broker."),
                ));
            }
            if let Some(b) = replicas.iter().find(|b| self.image().broker(**b).is_none()) {
                return Err((
                    INVALID_REPLICA_ASSIGNMENT,
                    format!("The manual partition assignment includes broker {b}, but no such broker is registered."),
                ));
            }
            if !replicas.iter().any(|b| self.image().is_unfenced(*b)) {
                return Err((
                    INVALID_REPLICA_ASSIGNMENT,
                    format!("All brokers specified in the manual partition assignment for partition {p} are fenced."),
                ));
            }
        }
        self.check_replication_factor(rf)
            .map_err(|m| (INVALID_REPLICA_ASSIGNMENT, m))
    }

    /// A new partition: the ISR is its unfenced replicas, the leader the first of them.
    fn new_partition(&self, topic_id: TopicId, partition_id: i32, replicas: &[BrokerId]) -> Record {
        let isr: Vec<BrokerId> = replicas
            .iter()
            .copied()
            .filter(|b| self.image().is_unfenced(*b))
            .collect();
        assert!(
            !isr.is_empty(),
            "placement chose only fenced brokers: {replicas:?}"
        );
        Record::Partition(PartitionRecord {
            partition_id,
            topic_id,
            replicas: replicas.to_vec(),
            leader: isr[0],
            isr,
            removing_replicas: vec![],
            adding_replicas: vec![],
            leader_epoch: LeaderEpoch(0),
            partition_epoch: PartitionEpoch(0),
            eligible_leader_replicas: vec![],
            last_known_elr: vec![],
        })
    }

    fn delete_topics(&mut self, r: &DeleteTopicsRequest) -> (Vec<Record>, ControllerResponse) {
        let mut records = Vec::new();
        let mut deleted = BTreeSet::new();
        let mut results = Vec::new();
        for t in &r.topics {
            let found = match t {
                TopicRef::Name(name) => self.image().topic(name).ok_or(UNKNOWN_TOPIC_OR_PARTITION),
                TopicRef::Id(id) => self.image().topic_by_id(*id).ok_or(UNKNOWN_TOPIC_ID),
            };
            let (name, id) = match t {
                TopicRef::Name(n) => (Some(n.clone()), None),
                TopicRef::Id(id) => (None, Some(*id)),
            };
            match found {
                Ok(topic) if INTERNAL_TOPICS.contains(&topic.name.as_str()) => {
                    // Groups (and transactions) would lose their state.
                    results.push(DeletableTopicResult {
                        name: Some(topic.name.clone()),
                        topic_id: Some(topic.id),
                        error_code: INVALID_TOPIC_EXCEPTION,
                        error_message: Some(format!(
                            "Topic '{}' is an internal topic and cannot be deleted.",
                            topic.name
                        )),
                    })
                }
                Ok(topic) => {
                    if deleted.insert(topic.id) {
                        records.push(Record::RemoveTopic(RemoveTopicRecord {
                            topic_id: topic.id,
                        }));
                    }
                    results.push(DeletableTopicResult {
                        name: Some(topic.name.clone()),
                        topic_id: Some(topic.id),
                        error_code: NONE,
                        error_message: None,
                    });
                }
                // Kafka's messages for these errors (from version 5).
                Err(error_code) => results.push(DeletableTopicResult {
                    name,
                    topic_id: id,
                    error_code,
                    error_message: Some(
                        if error_code == UNKNOWN_TOPIC_ID {
                            "This server does not host this topic ID."
                        } else {
                            "This server does not host this topic-partition."
                        }
                        .to_string(),
                    ),
                }),
            }
        }
        let mut out = Vec::new();
        self.emit(&mut out, records);
        (out, ControllerResponse::DeleteTopics(results))
    }

    fn create_partitions(
        &mut self,
        r: &CreatePartitionsRequest,
    ) -> (Vec<Record>, ControllerResponse) {
        let mut records = Vec::new();
        let mut results = Vec::new();
        let mut seen = BTreeMap::new();
        for t in &r.topics {
            *seen.entry(t.name.as_str()).or_insert(0) += 1;
        }
        for t in &r.topics {
            let outcome = if seen[t.name.as_str()] > 1 {
                Err((
                    INVALID_REQUEST,
                    format!("Duplicate topic name {:?}.", t.name),
                ))
            } else {
                self.create_partitions_of(t)
            };
            match outcome {
                Ok(new) => {
                    if !r.validate_only {
                        self.emit(&mut records, new);
                    }
                    results.push(CreatePartitionsTopicResult {
                        name: t.name.clone(),
                        error_code: NONE,
                        error_message: None,
                    });
                }
                // An empty message is none (Kafka gives none for a topic it does not know).
                Err((error_code, message)) => results.push(CreatePartitionsTopicResult {
                    name: t.name.clone(),
                    error_code,
                    error_message: (!message.is_empty()).then_some(message),
                }),
            }
        }
        (records, ControllerResponse::CreatePartitions(results))
    }

    fn create_partitions_of(
        &mut self,
        t: &CreatePartitionsTopic,
    ) -> Result<Vec<Record>, (i16, String)> {
        let topic = self
            .image()
            .topic(&t.name)
            .ok_or((UNKNOWN_TOPIC_OR_PARTITION, String::new()))?;
        let topic_id = topic.id;
        let current = topic.partitions.len() as i32;
        let replication_factor = topic.partitions.get(&0).map_or(1, |p| p.replicas.len()) as i16;
        if t.count < current {
            return Err((
                INVALID_PARTITIONS,
                format!("The topic {} currently has {current} partition(s); {} would not be an increase.", t.name, t.count),
            ));
        }
        if t.count == current {
            return Err((
                INVALID_PARTITIONS,
                format!("Topic already has {current} partition(s)."),
            ));
        }
        if t.count > PARTITIONS_PER_TOPIC_MAX {
            return Err((
                INVALID_PARTITIONS,
                format!("At most {PARTITIONS_PER_TOPIC_MAX} partitions."),
            ));
        }
        let added = t.count - current;
        let assignments = match &t.assignments {
            Some(a) => {
                if a.len() != added as usize {
                    return Err((
                        INVALID_REPLICA_ASSIGNMENT,
                        format!("Attempted to add {added} additional partition(s), but only {} assignment(s) were specified.", a.len()),
                    ));
                }
                self.check_manual_assignments(a)?;
                a.clone()
            }
            None => self.place(current, added, replication_factor)?,
        };
        Ok(assignments
            .iter()
            .enumerate()
            .map(|(i, replicas)| self.new_partition(topic_id, current + i as i32, replicas))
            .collect())
    }

    /// Finalizes the requested levels: one FeatureLevel record each, in one batch, for those
    /// that change.
    fn update_features(&mut self, r: &UpdateFeaturesRequest) -> (Vec<Record>, ControllerResponse) {
        let image = self.image();
        let batch: Vec<Record> = r
            .updates
            .iter()
            .filter(|(name, level)| image.feature_level(name).unwrap_or(0) != *level)
            .map(|(name, level)| {
                Record::FeatureLevel(FeatureLevelRecord {
                    name: name.clone(),
                    feature_level: *level,
                })
            })
            .collect();
        let mut records = Vec::new();
        if !r.validate_only && !batch.is_empty() {
            self.emit(&mut records, batch);
        }
        (records, ControllerResponse::UpdateFeatures(NONE))
    }

    /// Creates each valid ACL not already there, under a new id.
    fn create_acls(&mut self, r: &CreateAclsRequest) -> (Vec<Record>, ControllerResponse) {
        let mut existing: BTreeSet<crate::acl::AclBinding> =
            self.image().acls().values().cloned().collect();
        let mut batch = Vec::new();
        let mut results = Vec::with_capacity(r.creations.len());
        for acl in &r.creations {
            if let Some(why) = acl.invalid() {
                results.push(AclCreationResult {
                    error_code: INVALID_REQUEST,
                    error_message: Some(why),
                });
                continue;
            }
            if existing.insert(acl.clone()) {
                let id = uuid::Builder::from_random_bytes(self.rng.gen()).into_uuid();
                batch.push(Record::AccessControlEntry(AccessControlEntryRecord {
                    id,
                    acl: acl.clone(),
                }));
            }
            results.push(AclCreationResult {
                error_code: NONE,
                error_message: None,
            });
        }
        let mut records = Vec::new();
        if !batch.is_empty() {
            self.emit(&mut records, batch);
        }
        (records, ControllerResponse::CreateAcls(results))
    }

    /// Deletes every ACL a valid filter matches; each filter lists what it matched.
    fn delete_acls(&mut self, r: &DeleteAclsRequest) -> (Vec<Record>, ControllerResponse) {
        let image = self.image();
        let mut removed: BTreeSet<uuid::Uuid> = BTreeSet::new();
        let mut results = Vec::with_capacity(r.filters.len());
        for filter in &r.filters {
            if let Some(why) = filter.invalid() {
                results.push(DeleteAclsFilterResult {
                    error_code: INVALID_REQUEST,
                    error_message: Some(why.to_string()),
                    matching: vec![],
                });
                continue;
            }
            let mut matching = Vec::new();
            for (id, acl) in image.acls() {
                if filter.matches(acl) {
                    removed.insert(*id);
                    matching.push(acl.clone());
                }
            }
            results.push(DeleteAclsFilterResult {
                error_code: NONE,
                error_message: None,
                matching,
            });
        }
        let batch: Vec<Record> = removed
            .into_iter()
            .map(|id| Record::RemoveAccessControlEntry(RemoveAccessControlEntryRecord { id }))
            .collect();
        let mut records = Vec::new();
        if !batch.is_empty() {
            self.emit(&mut records, batch);
        }
        (records, ControllerResponse::DeleteAcls(results))
    }

    /// Checks each user's alterations as Kafka's controller does; a user whose alterations are
    /// all acceptable gets them, in one batch with every other such user's. A user named twice
    /// is refused whole (DUPLICATE_RESOURCE), as is an empty name.
    fn alter_scram(
        &mut self,
        r: &AlterUserScramCredentialsRequest,
    ) -> (Vec<Record>, ControllerResponse) {
        let image = self.image();
        let mut refused: BTreeMap<&str, (i16, &str)> = BTreeMap::new();
        let mut named: BTreeMap<&str, usize> = BTreeMap::new();
        for name in r
            .deletions
            .iter()
            .map(|(name, _)| name.as_str())
            .chain(r.upsertions.iter().map(|u| u.name.as_str()))
        {
            *named.entry(name).or_default() += 1;
        }
        for (&user, &n) in &named {
            if n > 1 {
                refused.insert(
                    user,
                    (
                        DUPLICATE_RESOURCE,
                        "A user credential cannot be altered twice in the same request",
                    ),
                );
            } else if user.is_empty() {
                refused.insert(
                    user,
                    (UNACCEPTABLE_CREDENTIAL, "Username must not be empty"),
                );
            }
        }
        for (user, mechanism) in &r.deletions {
            let why = if !SCRAM_MECHANISMS.contains(mechanism) {
                (UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")
            } else if image.scram_credential(user, *mechanism).is_none() {
                (
                    RESOURCE_NOT_FOUND,
                    "Attempt to delete a user credential that does not exist",
                )
            } else {
                continue;
            };
            refused.entry(user).or_insert(why);
        }
        for u in &r.upsertions {
            let why = if !SCRAM_MECHANISMS.contains(&u.mechanism) {
                (UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")
            } else if u.iterations < SCRAM_ITERATIONS_MIN {
                (UNACCEPTABLE_CREDENTIAL, "Too few iterations")
            } else if u.iterations > SCRAM_ITERATIONS_MAX {
                (UNACCEPTABLE_CREDENTIAL, "Too many iterations")
            } else if u.salt.is_empty() || u.stored_key.is_empty() || u.server_key.is_empty() {
                (
                    UNACCEPTABLE_CREDENTIAL,
                    "The salt and the salted password must not be empty",
                )
            } else {
                continue;
            };
            refused.entry(&u.name).or_insert(why);
        }
        let mut batch = Vec::new();
        for (user, mechanism) in &r.deletions {
            if !refused.contains_key(user.as_str()) {
                batch.push(Record::RemoveUserScramCredential(
                    RemoveUserScramCredentialRecord {
                        name: user.clone(),
                        mechanism: *mechanism,
                    },
                ));
            }
        }
        for u in &r.upsertions {
            if !refused.contains_key(u.name.as_str()) {
                batch.push(Record::UserScramCredential(u.clone()));
            }
        }
        let results = named
            .keys()
            .map(|&user| {
                let (error_code, message) = refused.get(user).copied().unwrap_or((NONE, ""));
                ScramAlterationResult {
                    user: user.to_string(),
                    error_code,
                    error_message: (error_code != NONE).then(|| message.to_string()),
                }
            })
            .collect();
        let mut records = Vec::new();
        if !batch.is_empty() {
            self.emit(&mut records, batch);
        }
        (
            records,
            ControllerResponse::AlterUserScramCredentials(results),
        )
    }

    fn alter_configs(
        &mut self,
        r: &IncrementalAlterConfigsRequest,
    ) -> (Vec<Record>, ControllerResponse) {
        let mut records = Vec::new();
        let mut results = Vec::new();
        for res in &r.resources {
            match self.alter_resource(res) {
                Ok(new) => {
                    if !r.validate_only {
                        self.emit(&mut records, new);
                    }
                    results.push(AlterConfigsResourceResult {
                        resource_type: res.resource_type,
                        resource_name: res.resource_name.clone(),
                        error_code: NONE,
                        error_message: None,
                    });
                }
                Err((error_code, message)) => results.push(AlterConfigsResourceResult {
                    resource_type: res.resource_type,
                    resource_name: res.resource_name.clone(),
                    error_code,
                    error_message: Some(message),
                }),
            }
        }
        (
            records,
            ControllerResponse::IncrementalAlterConfigs(results),
        )
    }

    fn alter_resource(&self, res: &AlterConfigsResource) -> Result<Vec<Record>, (i16, String)> {
        let resource_type = ConfigResourceType::from_id(res.resource_type).ok_or((
            INVALID_REQUEST,
            format!("Unsupported resource type {}.", res.resource_type),
        ))?;
        match resource_type {
            ConfigResourceType::Topic => {
                if self.image().topic(&res.resource_name).is_none() {
                    return Err((
                        UNKNOWN_TOPIC_OR_PARTITION,
                        format!("The topic '{}' does not exist.", res.resource_name),
                    ));
                }
            }
            ConfigResourceType::Group => {
                if res.resource_name.is_empty() {
                    return Err((INVALID_REQUEST, "Group name must not be empty.".to_string()));
                }
            }
            ConfigResourceType::Broker => {
                if !res.resource_name.is_empty() && res.resource_name.parse::<i32>().is_err() {
                    return Err((
                        INVALID_REQUEST,
                        format!("Invalid broker name {:?}.", res.resource_name),
                    ));
                }
            }
        }
        let mut configs = self
            .image()
            .configs(resource_type, &res.resource_name)
            .cloned()
            .unwrap_or_default();
        let mut changed = BTreeSet::new();
        for c in &res.configs {
            if !changed.insert(c.name.clone()) {
                return Err((
                    INVALID_REQUEST,
                    format!("Duplicate config name {:?}.", c.name),
                ));
            }
            let list = |s: Option<&String>| -> Vec<String> {
                s.map(|s| {
                    s.split(',')
                        .map(str::trim)
                        .filter(|x| !x.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
            };
            match c.op {
                AlterConfigOp::Set => {
                    let value = c.value.clone().ok_or((
                        INVALID_REQUEST,
                        format!("Null value for config {:?}.", c.name),
                    ))?;
                    configs.insert(c.name.clone(), value);
                }
                AlterConfigOp::Delete => {
                    configs.remove(&c.name);
                }
                AlterConfigOp::Append | AlterConfigOp::Subtract => {
                    let default = self
                        .config
                        .config_default
                        .and_then(|d| d(resource_type, &c.name));
                    let mut items = list(configs.get(&c.name).or(default.as_ref()));
                    let operand = list(c.value.as_ref());
                    if c.op == AlterConfigOp::Append {
                        items.extend(
                            operand
                                .into_iter()
                                .filter(|x| !items.contains(x))
                                .collect::<Vec<_>>(),
                        );
                    } else {
                        items.retain(|x| !operand.contains(x));
                    }
                    if items.is_empty() {
                        configs.remove(&c.name);
                    } else {
                        configs.insert(c.name.clone(), items.join(","));
                    }
                }
            }
        }
        if let Some(validate) = self.config.config_validator {
            validate(resource_type, &configs)?;
        }
        let before = self
            .image()
            .configs(resource_type, &res.resource_name)
            .cloned()
            .unwrap_or_default();
        // With eligible leader replicas on (always, here), Kafka keeps `min.insync.replicas`
        // cluster-wide only: the controller and every broker count the same minimum.
        if resource_type == ConfigResourceType::Broker && changed.contains(MIN_INSYNC_REPLICAS) {
            if res.resource_name.is_empty() && !configs.contains_key(MIN_INSYNC_REPLICAS) {
                return Err((
                    INVALID_CONFIG,
                    "Cluster-level min.insync.replicas cannot be removed while ELR is enabled."
                        .into(),
                ));
            }
            if !res.resource_name.is_empty() && configs.contains_key(MIN_INSYNC_REPLICAS) {
                return Err((
                    INVALID_CONFIG,
                    "Broker-level min.insync.replicas cannot be altered while ELR is enabled."
                        .into(),
                ));
            }
        }
        let mut records = Vec::new();
        for name in changed {
            let value = configs.get(&name).cloned();
            if before.get(&name) != value.as_ref() {
                records.push(Record::Config(ConfigRecord {
                    resource_type,
                    resource_name: res.resource_name.clone(),
                    name,
                    value,
                }));
            }
        }
        Ok(records)
    }

    fn register_broker(
        &mut self,
        now_ms: u64,
        next_offset: Offset,
        r: &BrokerRegistrationRequest,
    ) -> (Vec<Record>, ControllerResponse) {
        let fail = |error_code| {
            (
                vec![],
                ControllerResponse::BrokerRegistration(BrokerRegistrationResponse {
                    error_code,
                    broker_epoch: -1,
                }),
            )
        };
        if r.cluster_id != self.config.cluster_id {
            return fail(INCONSISTENT_CLUSTER_ID);
        }
        if r.broker_id.0 < 0 {
            return fail(INVALID_REQUEST);
        }
        let mut records = Vec::new();
        if let Some(existing) = self.image().broker(r.broker_id) {
            let session_alive = self
                .sessions
                .get(&r.broker_id)
                .is_some_and(|&deadline| deadline >= now_ms);
            // The broker of this controller's own node (a combined node) has no other live
            // incarnation: a new one is this process, so the old one is gone.
            let own_node = r.broker_id == self.config.node_id;
            if existing.incarnation_id != r.incarnation_id
                && session_alive
                && r.previous_broker_epoch != existing.epoch.0
                && !own_node
            {
                return fail(DUPLICATE_BROKER_REGISTRATION);
            }
            // The new registration starts fenced: the old incarnation's leaderships move now.
            if !existing.fenced {
                records.extend(self.leave_partitions(r.broker_id));
            }
        }
        records.push(Record::RegisterBroker(RegisterBrokerRecord {
            broker_id: r.broker_id,
            incarnation_id: r.incarnation_id,
            broker_epoch: BrokerEpoch(next_offset.0),
            endpoints: r.listeners.clone(),
            rack: r.rack.clone(),
            fenced: true,
        }));
        self.sessions
            .insert(r.broker_id, now_ms + self.config.broker_session_timeout_ms);
        self.shutting_down.remove(&r.broker_id);
        let mut out = Vec::new();
        self.emit(&mut out, records);
        (
            out,
            ControllerResponse::BrokerRegistration(BrokerRegistrationResponse {
                error_code: NONE,
                broker_epoch: next_offset.0,
            }),
        )
    }

    fn heartbeat(
        &mut self,
        now_ms: u64,
        r: &BrokerHeartbeatRequest,
    ) -> (Vec<Record>, ControllerResponse) {
        let reply = |error_code, is_caught_up, is_fenced, should_shut_down| {
            ControllerResponse::BrokerHeartbeat(BrokerHeartbeatResponse {
                error_code,
                is_caught_up,
                is_fenced,
                should_shut_down,
            })
        };
        let Some(broker) = self.image().broker(r.broker_id) else {
            return (vec![], reply(BROKER_ID_NOT_REGISTERED, false, true, false));
        };
        if broker.epoch != r.broker_epoch {
            return (vec![], reply(STALE_BROKER_EPOCH, false, true, false));
        }
        let epoch = broker.epoch;
        let fenced = broker.fenced;
        self.sessions
            .insert(r.broker_id, now_ms + self.config.broker_session_timeout_ms);
        let is_caught_up = r.current_metadata_offset.0 >= epoch.0;
        let mut records = Vec::new();
        if r.wants_shut_down || self.shutting_down.contains(&r.broker_id) {
            // Controlled shutdown: hand every leadership over, leave the ISRs, and fence, all
            // in one batch; the broker may stop once that has committed.
            self.shutting_down.insert(r.broker_id);
            if !fenced {
                let mut batch = self.leave_partitions(r.broker_id);
                batch.push(Record::FenceBroker(BrokerFencingRecord {
                    id: r.broker_id,
                    epoch,
                }));
                self.emit(&mut records, batch);
            }
            return (records, reply(NONE, is_caught_up, true, true));
        }
        if r.wants_fence {
            if !fenced {
                let mut batch = self.leave_partitions(r.broker_id);
                batch.push(Record::FenceBroker(BrokerFencingRecord {
                    id: r.broker_id,
                    epoch,
                }));
                self.emit(&mut records, batch);
            }
            return (records, reply(NONE, is_caught_up, true, false));
        }
        if fenced && is_caught_up {
            let unfence = Record::UnfenceBroker(BrokerFencingRecord {
                id: r.broker_id,
                epoch,
            });
            self.emit(&mut records, vec![unfence]);
            // Elect it where partitions have no leader, against the image with it unfenced.
            let leads = self.lead_leaderless(r.broker_id);
            self.emit(&mut records, leads);
            return (records, reply(NONE, true, false, false));
        }
        (records, reply(NONE, is_caught_up, fenced, false))
    }

    fn allocate_producer_ids(
        &mut self,
        r: &AllocateProducerIdsRequest,
    ) -> (Vec<Record>, ControllerResponse) {
        let reply = |error_code, producer_id_start, producer_id_len| {
            ControllerResponse::AllocateProducerIds(AllocateProducerIdsResponse {
                error_code,
                producer_id_start,
                producer_id_len,
            })
        };
        let Some(broker) = self.image().broker(r.broker_id) else {
            return (vec![], reply(BROKER_ID_NOT_REGISTERED, -1, 0));
        };
        if broker.epoch != r.broker_epoch {
            return (vec![], reply(STALE_BROKER_EPOCH, -1, 0));
        }
        let start = self.image().next_producer_id();
        let Some(next) = start.checked_add(PRODUCER_ID_BLOCK_SIZE) else {
            return (vec![], reply(UNKNOWN_SERVER_ERROR, -1, 0));
        };
        let mut records = Vec::new();
        let block = Record::ProducerIds(ProducerIdsRecord {
            broker_id: r.broker_id,
            broker_epoch: r.broker_epoch,
            next_producer_id: next,
        });
        self.emit(&mut records, vec![block]);
        (records, reply(NONE, start, PRODUCER_ID_BLOCK_SIZE as i32))
    }
}

impl Controller {
    /// AlterPartition: the leader of each partition changes its ISR, checked as Kafka's
    /// controller checks it; one PartitionChange per changed partition, all in one batch.
    /// Takes `r.broker_id` out of the partitions whose replica it lost: out of the ISR (the last
    /// member stays, with no leader, as in fencing) and the eligible leader replicas (its data
    /// is gone, so it is not safe to elect), and out of the leadership, which goes to another
    /// in-sync replica.
    fn lost_replicas(&mut self, r: &LostReplicasRequest) -> (Vec<Record>, ControllerResponse) {
        let stale = self
            .image()
            .broker(r.broker_id)
            .is_none_or(|b| b.epoch != r.broker_epoch);
        if stale {
            let response = LostReplicasResponse {
                error_code: STALE_BROKER_EPOCH,
                partitions: vec![],
            };
            return (vec![], ControllerResponse::LostReplicas(response));
        }
        let broker = r.broker_id;
        let mut batch = Vec::new();
        let mut results = Vec::new();
        for &(topic_id, partition_id) in &r.partitions {
            let Some(topic) = self.image().topic_by_id(topic_id) else {
                results.push((topic_id, partition_id, UNKNOWN_TOPIC_ID));
                continue;
            };
            let Some(p) = topic
                .partitions
                .get(&partition_id)
                .filter(|p| p.replicas.contains(&broker))
            else {
                results.push((topic_id, partition_id, UNKNOWN_TOPIC_OR_PARTITION));
                continue;
            };
            results.push((topic_id, partition_id, NONE));
            let mut change = PartitionChangeRecord {
                partition_id,
                topic_id,
                ..Default::default()
            };
            let mut isr = p.isr.clone();
            if isr.len() > 1 && isr.contains(&broker) {
                isr.retain(|b| *b != broker);
                change.isr = Some(isr.clone());
            }
            if p.eligible_leader_replicas.contains(&broker) {
                let mut elr = p.eligible_leader_replicas.clone();
                elr.retain(|b| *b != broker);
                change.eligible_leader_replicas = Some(elr);
            }
            if p.leader == broker {
                change.leader = Some(self.elect(p, &isr, broker));
            }
            if change.isr.is_some()
                || change.leader.is_some()
                || change.eligible_leader_replicas.is_some()
            {
                batch.push(Record::PartitionChange(change));
            }
        }
        let mut records = Vec::new();
        if !batch.is_empty() {
            self.emit(&mut records, batch);
        }
        let response = LostReplicasResponse {
            error_code: NONE,
            partitions: results,
        };
        (records, ControllerResponse::LostReplicas(response))
    }

    fn alter_partition(&mut self, r: &AlterPartitionRequest) -> (Vec<Record>, ControllerResponse) {
        let stale = self
            .image()
            .broker(r.broker_id)
            .is_none_or(|b| b.epoch != r.broker_epoch);
        if stale {
            return (
                vec![],
                ControllerResponse::AlterPartition(AlterPartitionResponse {
                    error_code: STALE_BROKER_EPOCH,
                    partitions: vec![],
                }),
            );
        }
        let mut records = Vec::new();
        let mut results = Vec::new();
        for item in &r.partitions {
            let outcome = self.alter_one(r.broker_id, item);
            let (error_code, change) = match outcome {
                Ok(change) => (NONE, change),
                Err(code) => (code, None),
            };
            if let Some(change) = change {
                self.emit(&mut records, vec![Record::PartitionChange(change)]);
            }
            let current = self
                .image()
                .topic_by_id(item.topic_id)
                .and_then(|t| t.partitions.get(&item.partition_id));
            results.push(AlterPartitionResult {
                topic_id: item.topic_id,
                partition_id: item.partition_id,
                error_code,
                leader: current.map_or(BrokerId::NONE, |p| p.leader),
                leader_epoch: current.map_or(LeaderEpoch(-1), |p| p.leader_epoch),
                isr: current.map_or_else(Vec::new, |p| p.isr.clone()),
                partition_epoch: current.map_or(PartitionEpoch(-1), |p| p.partition_epoch),
            });
        }
        (
            records,
            ControllerResponse::AlterPartition(AlterPartitionResponse {
                error_code: NONE,
                partitions: results,
            }),
        )
    }

    /// One partition of an AlterPartition: the change to commit (`None` when the ISR is what
    /// it asks already), or the error code.
    fn alter_one(
        &self,
        leader: BrokerId,
        item: &AlterPartitionItem,
    ) -> Result<Option<PartitionChangeRecord>, i16> {
        let topic = self
            .image()
            .topic_by_id(item.topic_id)
            .ok_or(UNKNOWN_TOPIC_ID)?;
        let p = topic
            .partitions
            .get(&item.partition_id)
            .ok_or(UNKNOWN_TOPIC_OR_PARTITION)?;
        if p.leader != leader {
            return Err(NOT_LEADER_OR_FOLLOWER);
        }
        if item.leader_epoch != p.leader_epoch {
            return Err(FENCED_LEADER_EPOCH);
        }
        if item.partition_epoch != p.partition_epoch {
            return Err(INVALID_UPDATE_VERSION);
        }
        let isr: Vec<BrokerId> = item.new_isr.iter().map(|(b, _)| *b).collect();
        let mut unique = isr.clone();
        unique.sort();
        unique.dedup();
        if unique.len() != isr.len()
            || !isr.contains(&leader)
            || isr.iter().any(|b| !p.replicas.contains(b))
        {
            return Err(INVALID_REQUEST);
        }
        // Who joins must be alive, registered as the incarnation the leader saw fetch, and not
        // on its way out.
        for &(b, epoch) in &item.new_isr {
            if p.isr.contains(&b) {
                continue;
            }
            let eligible = self
                .image()
                .broker(b)
                .is_some_and(|reg| !reg.fenced && (epoch.0 < 0 || reg.epoch == epoch))
                && !self.shutting_down.contains(&b);
            if !eligible {
                return Err(INELIGIBLE_REPLICA);
            }
        }
        if isr == p.isr {
            return Ok(None);
        }
        let mut change = PartitionChangeRecord {
            partition_id: item.partition_id,
            topic_id: item.topic_id,
            isr: Some(isr.clone()),
            ..Default::default()
        };
        // KIP-966: below min.insync.replicas, a replica leaving the ISR stays eligible to lead
        // (it has everything up to the high watermark); one that rejoins is no longer listed.
        let min_isr = self.min_insync_replicas(&topic.name);
        let mut elr: Vec<BrokerId> = p
            .eligible_leader_replicas
            .iter()
            .copied()
            .filter(|b| !isr.contains(b))
            .collect();
        if isr.len() < min_isr {
            for b in &p.isr {
                if !isr.contains(b) && !elr.contains(b) {
                    elr.push(*b);
                }
            }
        } else {
            elr.clear();
        }
        // The ISR that takes in the last replica a reassignment adds completes it.
        let after = PartitionRegistration {
            isr: isr.clone(),
            eligible_leader_replicas: elr.clone(),
            ..p.clone()
        };
        if let Some(done) = self.complete_reassignment(&after, &isr) {
            let mut change = PartitionChangeRecord {
                partition_id: item.partition_id,
                topic_id: item.topic_id,
                ..Default::default()
            };
            reassignment::fill_change(&mut change, p, &done);
            return Ok(Some(change));
        }
        if elr != p.eligible_leader_replicas {
            change.eligible_leader_replicas = Some(elr);
        }
        Ok(Some(change))
    }

    fn migrate(&mut self, r: &MigrateRequest) -> (Vec<Record>, ControllerResponse) {
        let fail = |error_code, message: String| {
            (
                vec![],
                ControllerResponse::Migrate(MigrateResponse {
                    error_code,
                    error_message: Some(message),
                    imported: 0,
                }),
            )
        };
        let Some(broker) = self.image().broker(r.broker_id) else {
            return fail(
                BROKER_ID_NOT_REGISTERED,
                format!("broker {} is not registered", r.broker_id.0),
            );
        };
        if broker.fenced {
            return fail(
                BROKER_ID_NOT_REGISTERED,
                format!("broker {} is fenced", r.broker_id.0),
            );
        }
        let epoch = broker.epoch;
        let mut batch = Vec::new();
        let mut imported = 0;
        for t in &r.topics {
            match (self.image().topic(&t.name), self.image().topic_by_id(t.id)) {
                (Some(a), Some(b)) if a.id == b.id => continue,
                (None, None) => {}
                _ => {
                    return fail(
                        INVALID_REQUEST,
                        format!(
                        "topic {:?} ({}) is in the metadata log already under another name or id",
                        t.name, t.id.0
                    ),
                    )
                }
            }
            if validate_topic_name(&t.name).is_err()
                || t.partitions <= 0
                || t.partitions > PARTITIONS_PER_TOPIC_MAX
            {
                return fail(
                    INVALID_REQUEST,
                    format!(
                        "topic {:?} with {} partitions cannot be imported",
                        t.name, t.partitions
                    ),
                );
            }
            batch.push(Record::Topic(TopicRecord {
                name: t.name.clone(),
                topic_id: t.id,
            }));
            for (name, value) in &t.configs {
                batch.push(Record::Config(ConfigRecord {
                    resource_type: ConfigResourceType::Topic,
                    resource_name: t.name.clone(),
                    name: name.clone(),
                    value: Some(value.clone()),
                }));
            }
            imported += 1;
        }
        for (resource_name, configs) in &r.broker_configs {
            let before = self
                .image()
                .configs(ConfigResourceType::Broker, resource_name)
                .cloned()
                .unwrap_or_default();
            for (name, value) in configs {
                if before.get(name) != Some(value) {
                    batch.push(Record::Config(ConfigRecord {
                        resource_type: ConfigResourceType::Broker,
                        resource_name: resource_name.clone(),
                        name: name.clone(),
                        value: Some(value.clone()),
                    }));
                }
            }
        }
        if r.next_producer_id > self.image().next_producer_id() {
            batch.push(Record::ProducerIds(ProducerIdsRecord {
                broker_id: r.broker_id,
                broker_epoch: epoch,
                next_producer_id: r.next_producer_id,
            }));
        }
        // Topics first, so the partitions below are built against an image that has them.
        let mut records = Vec::new();
        self.emit(&mut records, batch);
        let mut partitions = Vec::new();
        for t in &r.topics {
            let fresh = self
                .image()
                .topic_by_id(t.id)
                .is_some_and(|topic| topic.partitions.is_empty());
            if fresh {
                for p in 0..t.partitions {
                    partitions.push(self.new_partition(t.id, p, &[r.broker_id]));
                }
            }
        }
        self.emit(&mut records, partitions);
        (
            records,
            ControllerResponse::Migrate(MigrateResponse {
                error_code: NONE,
                error_message: None,
                imported,
            }),
        )
    }
}

/// Kafka's topic name rules.
pub fn validate_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("Topic name is illegal, it can't be empty.".into());
    }
    if name == "." || name == ".." {
        return Err("Topic name cannot be \".\" or \"..\".".into());
    }
    if name.len() > TOPIC_NAME_BYTES_MAX {
        return Err(format!(
            "Topic name is illegal, it can't be longer than {TOPIC_NAME_BYTES_MAX} characters, topic name: {name}"
        ));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-')
    {
        return Err(format!(
            "Topic name {name:?} is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives a controller as the node would, committing every batch at once.
    struct Harness {
        controller: Controller,
        image: MetadataImage,
        now_ms: u64,
    }

    impl Harness {
        fn new() -> Harness {
            let mut config = ControllerConfig::new(BrokerId(0), "cluster");
            config.seed = 7;
            let mut controller = Controller::new(config);
            let image = MetadataImage::default();
            controller.activate(&image, 0);
            Harness {
                controller,
                image,
                now_ms: 0,
            }
        }

        fn next_offset(&self) -> Offset {
            Offset(self.image.offset().0 + 1)
        }

        fn commit(&mut self, records: &[Record]) {
            if records.is_empty() {
                return;
            }
            let offset = self.next_offset();
            for r in records {
                self.image.apply(offset, r).unwrap();
            }
            self.image.check_invariants().unwrap();
            assert_eq!(self.controller.speculative_image(), Some(&self.image));
        }

        fn run(&mut self, request: ControllerRequest) -> ControllerResponse {
            let result = self
                .controller
                .handle(self.now_ms, self.next_offset(), &request);
            self.commit(&result.records);
            result.response
        }

        fn tick(&mut self, now_ms: u64) {
            self.now_ms = now_ms;
            let records = self.controller.tick(now_ms, self.next_offset());
            self.commit(&records);
        }

        fn register(&mut self, id: i32, rack: Option<&str>) -> BrokerEpoch {
            let response = self.run(ControllerRequest::BrokerRegistration(registration(
                id, rack,
            )));
            let ControllerResponse::BrokerRegistration(r) = response else {
                panic!("{response:?}")
            };
            assert_eq!(r.error_code, NONE);
            let epoch = BrokerEpoch(r.broker_epoch);
            let hb = self.heartbeat(id, epoch, false);
            assert!(!hb.is_fenced);
            epoch
        }

        fn heartbeat(
            &mut self,
            id: i32,
            epoch: BrokerEpoch,
            wants_shut_down: bool,
        ) -> BrokerHeartbeatResponse {
            let offset = self.image.offset();
            match self.run(ControllerRequest::BrokerHeartbeat(BrokerHeartbeatRequest {
                broker_id: BrokerId(id),
                broker_epoch: epoch,
                current_metadata_offset: offset,
                wants_fence: false,
                wants_shut_down,
            })) {
                ControllerResponse::BrokerHeartbeat(r) => r,
                other => panic!("{other:?}"),
            }
        }

        fn create(&mut self, topic: CreatableTopic, validate_only: bool) -> CreatableTopicResult {
            match self.run(ControllerRequest::CreateTopics(CreateTopicsRequest {
                topics: vec![topic],
                validate_only,
            })) {
                ControllerResponse::CreateTopics(mut v) => v.remove(0),
                other => panic!("{other:?}"),
            }
        }

        fn partitions(&self, name: &str) -> Vec<PartitionRegistration> {
            self.image
                .topic(name)
                .unwrap()
                .partitions
                .values()
                .cloned()
                .collect()
        }
    }

    fn registration(id: i32, rack: Option<&str>) -> BrokerRegistrationRequest {
        BrokerRegistrationRequest {
            broker_id: BrokerId(id),
            cluster_id: "cluster".into(),
            incarnation_id: uuid::Uuid::from_u128(id as u128),
            listeners: vec![Endpoint {
                name: "PLAINTEXT".into(),
                host: "127.0.0.1".into(),
                port: 9092,
                security_protocol: 0,
            }],
            rack: rack.map(str::to_owned),
            previous_broker_epoch: -1,
        }
    }

    fn topic(name: &str, num_partitions: i32, replication_factor: i16) -> CreatableTopic {
        CreatableTopic {
            name: name.into(),
            num_partitions,
            replication_factor,
            assignments: vec![],
            configs: vec![],
        }
    }

    #[test]
    fn an_inactive_controller_answers_not_controller() {
        let mut c = Controller::new(ControllerConfig::new(BrokerId(0), "cluster"));
        let result = c.handle(
            0,
            Offset(1),
            &ControllerRequest::CreateTopics(CreateTopicsRequest {
                topics: vec![topic("a", 1, 1)],
                validate_only: false,
            }),
        );
        assert!(result.records.is_empty());
        let ControllerResponse::CreateTopics(v) = result.response else {
            panic!()
        };
        assert_eq!(v[0].error_code, NOT_CONTROLLER);
    }

    #[test]
    fn a_broker_epoch_is_its_registration_offset_and_it_unfences_once_caught_up() {
        let mut h = Harness::new();
        let response = h.run(ControllerRequest::BrokerRegistration(registration(1, None)));
        let ControllerResponse::BrokerRegistration(r) = response else {
            panic!()
        };
        assert_eq!(r.broker_epoch, h.image.offset().0);
        let epoch = BrokerEpoch(r.broker_epoch);
        assert!(h.image.broker(BrokerId(1)).unwrap().fenced);
        // Behind the registration: stays fenced.
        let hb = match h.run(ControllerRequest::BrokerHeartbeat(BrokerHeartbeatRequest {
            broker_id: BrokerId(1),
            broker_epoch: epoch,
            current_metadata_offset: Offset(epoch.0 - 1),
            wants_fence: false,
            wants_shut_down: false,
        })) {
            ControllerResponse::BrokerHeartbeat(r) => r,
            _ => panic!(),
        };
        assert!(hb.is_fenced && !hb.is_caught_up);
        let hb = h.heartbeat(1, epoch, false);
        assert!(!hb.is_fenced && hb.is_caught_up);
        assert!(!h.image.broker(BrokerId(1)).unwrap().fenced);
        // A stale epoch is refused.
        let hb = h.heartbeat(1, BrokerEpoch(epoch.0 - 1), false);
        assert_eq!(hb.error_code, STALE_BROKER_EPOCH);
        let hb = h.heartbeat(9, epoch, false);
        assert_eq!(hb.error_code, BROKER_ID_NOT_REGISTERED);
    }

    #[test]
    fn a_new_incarnation_of_the_controllers_own_node_replaces_the_old_at_once() {
        // Harness's controller is node 0: broker 0 is the broker of the same process.
        let mut h = Harness::new();
        let old = h.register(0, None);
        h.create(topic("t", 2, 1), false);
        let mut again = registration(0, None);
        again.incarnation_id = uuid::Uuid::from_u128(99);
        let ControllerResponse::BrokerRegistration(r) =
            h.run(ControllerRequest::BrokerRegistration(again))
        else {
            panic!()
        };
        assert_eq!(r.error_code, NONE, "the old session had not expired, yet");
        assert!(r.broker_epoch > old.0);
        // Fenced until caught up, its partitions without a leader; then it leads them again.
        let t = h.image.topic("t").unwrap();
        assert!(t
            .partitions
            .values()
            .all(|p| p.leader == BrokerId::NONE && p.isr == vec![BrokerId(0)]));
        let hb = h.heartbeat(0, BrokerEpoch(r.broker_epoch), false);
        assert!(!hb.is_fenced);
        let t = h.image.topic("t").unwrap();
        assert!(t.partitions.values().all(|p| p.leader == BrokerId(0)));
        // Another node's broker still has to wait its old session out.
        h.register(1, None);
        let mut other = registration(1, None);
        other.incarnation_id = uuid::Uuid::from_u128(98);
        let ControllerResponse::BrokerRegistration(r) =
            h.run(ControllerRequest::BrokerRegistration(other))
        else {
            panic!()
        };
        assert_eq!(r.error_code, DUPLICATE_BROKER_REGISTRATION);
    }

    /// A broker's lost replicas (a failed log directory) leave their ISRs and eligible leaders,
    /// and their leaderships go to other in-sync replicas; its other replicas are untouched. The
    /// last ISR member stays, with no leader. Stale epochs, unknown topics and partitions the
    /// broker has no replica of are refused.
    #[test]
    fn lost_replicas_leave_isr_and_leadership() {
        let mut h = Harness::new();
        let epochs: Vec<BrokerEpoch> = (1..=3).map(|b| h.register(b, None)).collect();
        let id = h.create(topic("r3", 2, 3), false).topic_id.unwrap();
        let solo = h.create(topic("r1", 3, 1), false).topic_id.unwrap();
        let p = |h: &Harness, t: TopicId, i: i32| {
            h.image.topic_by_id(t).unwrap().partitions[&i].clone()
        };
        let before = p(&h, id, 0);
        let lost = before.leader;
        let epoch = epochs[lost.0 as usize - 1];
        let other = p(&h, id, 1);
        let (on_lost, elsewhere): (Vec<i32>, Vec<i32>) =
            (0..3).partition(|&i| p(&h, solo, i).replicas == vec![lost]);
        assert!(!on_lost.is_empty() && !elsewhere.is_empty());
        let ask = |h: &mut Harness, epoch: BrokerEpoch, partitions: Vec<(TopicId, i32)>| match h
            .run(ControllerRequest::LostReplicas(LostReplicasRequest {
                broker_id: lost,
                broker_epoch: epoch,
                partitions,
            })) {
            ControllerResponse::LostReplicas(r) => r,
            other => panic!("{other:?}"),
        };
        let stale = ask(&mut h, BrokerEpoch(epoch.0 - 1), vec![(id, 0)]);
        assert_eq!(stale.error_code, STALE_BROKER_EPOCH);
        assert_eq!(p(&h, id, 0), before);

        let unknown = TopicId(uuid::Uuid::from_u128(77));
        let r = ask(
            &mut h,
            epoch,
            vec![
                (id, 0),
                (unknown, 0),
                (solo, on_lost[0]),
                (solo, elsewhere[0]),
                (id, 9),
            ],
        );
        assert_eq!(r.error_code, NONE);
        assert_eq!(
            r.partitions,
            vec![
                (id, 0, NONE),
                (unknown, 0, UNKNOWN_TOPIC_ID),
                (solo, on_lost[0], NONE),
                (solo, elsewhere[0], UNKNOWN_TOPIC_OR_PARTITION),
                (id, 9, UNKNOWN_TOPIC_OR_PARTITION),
            ]
        );
        let after = p(&h, id, 0);
        assert!(
            !after.isr.contains(&lost) && after.isr.len() == 2,
            "{after:?}"
        );
        assert!(
            after.leader != lost && after.isr.contains(&after.leader),
            "{after:?}"
        );
        assert_eq!(after.leader_epoch.0, before.leader_epoch.0 + 1);
        assert_eq!(
            p(&h, id, 1),
            other,
            "a replica on another directory is untouched"
        );
        let solo_after = p(&h, solo, on_lost[0]);
        assert_eq!(
            (solo_after.leader, solo_after.isr.clone()),
            (BrokerId::NONE, vec![lost])
        );
        // Asked again, nothing is left to change.
        let again = ask(&mut h, epoch, vec![(id, 0)]);
        assert_eq!(again.partitions, vec![(id, 0, NONE)]);
        assert_eq!(p(&h, id, 0), after);
    }

    #[test]
    fn alter_partition_changes_the_isr_only_for_the_current_leader_and_epochs() {
        let mut h = Harness::new();
        let epochs: Vec<BrokerEpoch> = (1..=3).map(|b| h.register(b, None)).collect();
        let epoch_of = |b: BrokerId| epochs[b.0 as usize - 1];
        let mut t = topic("r3", 1, 3);
        t.configs = vec![("min.insync.replicas".into(), Some("2".into()))];
        let id = h.create(t, false).topic_id.unwrap();
        let p = |h: &Harness| h.image.topic_by_id(id).unwrap().partitions[&0].clone();
        let start = p(&h);
        let leader = start.leader;
        let others: Vec<BrokerId> = start
            .replicas
            .iter()
            .copied()
            .filter(|b| *b != leader)
            .collect();
        let ask =
            |h: &mut Harness, from: BrokerId, epoch: BrokerEpoch, item: AlterPartitionItem| match h
                .run(ControllerRequest::AlterPartition(AlterPartitionRequest {
                    broker_id: from,
                    broker_epoch: epoch,
                    partitions: vec![item],
                })) {
                ControllerResponse::AlterPartition(r) => r,
                other => panic!("{other:?}"),
            };
        let item = |p: &PartitionRegistration, isr: &[BrokerId]| AlterPartitionItem {
            topic_id: id,
            partition_id: 0,
            leader_epoch: p.leader_epoch,
            partition_epoch: p.partition_epoch,
            new_isr: isr.iter().map(|b| (*b, BrokerEpoch(-1))).collect(),
        };

        // A shrink by the leader: committed, the partition epoch moves, the leader stays.
        let shrunk = [leader, others[0]];
        let r = ask(&mut h, leader, epoch_of(leader), item(&start, &shrunk));
        assert_eq!(r.error_code, NONE);
        assert_eq!(r.partitions[0].error_code, NONE);
        assert_eq!(r.partitions[0].isr, shrunk.to_vec());
        let now = p(&h);
        assert_eq!(now.isr, shrunk.to_vec());
        assert_eq!(now.partition_epoch.0, start.partition_epoch.0 + 1);
        assert_eq!((now.leader, now.leader_epoch), (leader, start.leader_epoch));
        assert_eq!(r.partitions[0].partition_epoch, now.partition_epoch);

        // What a leader based on old state, or a non-leader, or an old incarnation asks fails.
        let r = ask(&mut h, leader, epoch_of(leader), item(&start, &[leader]));
        assert_eq!(r.partitions[0].error_code, INVALID_UPDATE_VERSION);
        let mut fenced_epoch = item(&now, &[leader]);
        fenced_epoch.leader_epoch = LeaderEpoch(now.leader_epoch.0 - 1);
        assert_eq!(
            ask(&mut h, leader, epoch_of(leader), fenced_epoch).partitions[0].error_code,
            FENCED_LEADER_EPOCH
        );
        assert_eq!(
            ask(
                &mut h,
                others[0],
                epoch_of(others[0]),
                item(&now, &[others[0]])
            )
            .partitions[0]
                .error_code,
            NOT_LEADER_OR_FOLLOWER
        );
        assert_eq!(
            ask(&mut h, leader, BrokerEpoch(0), item(&now, &[leader])).error_code,
            STALE_BROKER_EPOCH
        );
        assert_eq!(
            ask(&mut h, leader, epoch_of(leader), item(&now, &[others[0]])).partitions[0]
                .error_code,
            INVALID_REQUEST
        );
        assert_eq!(
            ask(
                &mut h,
                leader,
                epoch_of(leader),
                item(&now, &[leader, BrokerId(9)])
            )
            .partitions[0]
                .error_code,
            INVALID_REQUEST
        );
        // Joining on a fetch from another incarnation, or while fenced: ineligible.
        let mut wrong_incarnation = item(&now, &[leader, others[0], others[1]]);
        wrong_incarnation.new_isr[2].1 = BrokerEpoch(epoch_of(others[1]).0 + 1000);
        assert_eq!(
            ask(&mut h, leader, epoch_of(leader), wrong_incarnation).partitions[0].error_code,
            INELIGIBLE_REPLICA
        );
        assert_eq!(p(&h), now, "refused changes change nothing");

        // Below min.insync.replicas (2) the replica that leaves stays eligible to lead (KIP-966);
        // back at 2 or more, the list empties.
        let r = ask(&mut h, leader, epoch_of(leader), item(&now, &[leader]));
        assert_eq!(r.partitions[0].error_code, NONE);
        let alone = p(&h);
        assert_eq!(alone.isr, vec![leader]);
        assert_eq!(alone.eligible_leader_replicas, vec![others[0]]);
        let mut back = item(&alone, &[leader, others[1]]);
        back.new_isr[1].1 = epoch_of(others[1]);
        assert_eq!(
            ask(&mut h, leader, epoch_of(leader), back).partitions[0].error_code,
            NONE
        );
        let two = p(&h);
        assert_eq!(two.isr, vec![leader, others[1]]);
        assert!(two.eligible_leader_replicas.is_empty());
        // Asking for the ISR it has: answered, nothing committed.
        let offset = h.image.offset();
        let r = ask(
            &mut h,
            leader,
            epoch_of(leader),
            item(&two, &[leader, others[1]]),
        );
        assert_eq!(
            (r.partitions[0].error_code, h.image.offset()),
            (NONE, offset)
        );
        // A fenced broker cannot join.
        let fence = ControllerRequest::BrokerHeartbeat(BrokerHeartbeatRequest {
            broker_id: others[0],
            broker_epoch: epoch_of(others[0]),
            current_metadata_offset: h.image.offset(),
            wants_fence: true,
            wants_shut_down: false,
        });
        h.run(fence);
        let after = p(&h);
        let r = ask(
            &mut h,
            leader,
            epoch_of(leader),
            item(&after, &[leader, others[1], others[0]]),
        );
        assert_eq!(r.partitions[0].error_code, INELIGIBLE_REPLICA);
    }

    #[test]
    fn a_replication_factor_above_the_configured_maximum_is_refused() {
        let mut h = Harness::new();
        h.controller.config.replication_factor_max = 1;
        for b in 1..=3 {
            h.register(b, None);
        }
        let r = h.create(topic("r3", 2, 3), false);
        assert_eq!(r.error_code, INVALID_REPLICATION_FACTOR);
        assert!(r
            .error_message
            .unwrap()
            .contains("more than this cluster allows"));
        // More than there are brokers: Kafka's own answer still.
        let r = h.create(topic("r9", 2, 9), false);
        assert!(r.error_message.unwrap().contains("cannot be reached"));
        let mut manual = topic("m2", -1, -1);
        manual.assignments = vec![(0, vec![BrokerId(1), BrokerId(2)])];
        assert_eq!(
            h.create(manual, false).error_code,
            INVALID_REPLICA_ASSIGNMENT
        );
        assert_eq!(h.create(topic("r1", 2, 1), false).error_code, NONE);
        assert!(h.image.topic("r3").is_none() && h.image.topic("m2").is_none());
    }

    #[test]
    fn a_migration_imports_topics_with_their_ids_once() {
        let mut h = Harness::new();
        let id = TopicId(uuid::Uuid::from_u128(0xfeed));
        let request = MigrateRequest {
            broker_id: BrokerId(1),
            topics: vec![MigratedTopic {
                name: "old".into(),
                id,
                partitions: 3,
                configs: BTreeMap::from([("cleanup.policy".to_string(), "compact".to_string())]),
            }],
            broker_configs: BTreeMap::from([(
                "1".to_string(),
                BTreeMap::from([("log.retention.ms".to_string(), "5".to_string())]),
            )]),
            next_producer_id: 1234,
        };
        // Only a registered, unfenced broker can hold the partitions.
        let ControllerResponse::Migrate(r) = h.run(ControllerRequest::Migrate(request.clone()))
        else {
            panic!()
        };
        assert_eq!(r.error_code, BROKER_ID_NOT_REGISTERED);
        h.register(1, None);
        let ControllerResponse::Migrate(r) = h.run(ControllerRequest::Migrate(request.clone()))
        else {
            panic!()
        };
        assert_eq!((r.error_code, r.imported), (NONE, 1));
        let t = h.image.topic("old").unwrap();
        assert_eq!(t.id, id);
        assert_eq!(t.partitions.len(), 3);
        assert!(t
            .partitions
            .values()
            .all(|p| p.leader == BrokerId(1) && p.replicas == vec![BrokerId(1)]));
        assert_eq!(
            h.image
                .topic_configs("old")
                .unwrap()
                .get("cleanup.policy")
                .map(String::as_str),
            Some("compact")
        );
        assert_eq!(
            h.image
                .configs(ConfigResourceType::Broker, "1")
                .unwrap()
                .get("log.retention.ms")
                .map(String::as_str),
            Some("5")
        );
        assert_eq!(h.image.next_producer_id(), 1234);
        // Again (a crash before the file was retired): nothing changes.
        let before = h.image.clone();
        let ControllerResponse::Migrate(r) = h.run(ControllerRequest::Migrate(request.clone()))
        else {
            panic!()
        };
        assert_eq!((r.error_code, r.imported), (NONE, 0));
        assert_eq!(h.image, before);
        // A name taken by another topic id is refused, whole.
        let mut clash = request;
        clash.topics[0].id = TopicId(uuid::Uuid::from_u128(0xbeef));
        let ControllerResponse::Migrate(r) = h.run(ControllerRequest::Migrate(clash)) else {
            panic!()
        };
        assert_eq!(r.error_code, INVALID_REQUEST);
        assert_eq!(h.image, before);
    }

    #[test]
    fn internal_topics_cannot_be_deleted() {
        let mut h = Harness::new();
        h.register(1, None);
        h.create(topic("__consumer_offsets", 1, 1), false);
        let ControllerResponse::DeleteTopics(v) =
            h.run(ControllerRequest::DeleteTopics(DeleteTopicsRequest {
                topics: vec![TopicRef::Name("__consumer_offsets".into())],
            }))
        else {
            panic!()
        };
        assert_eq!(v[0].error_code, INVALID_TOPIC_EXCEPTION);
        assert!(h.image.topic("__consumer_offsets").is_some());
    }

    #[test]
    fn registration_checks_cluster_id_and_duplicate_incarnations() {
        let mut h = Harness::new();
        let epoch = h.register(1, None);
        let mut other = registration(1, None);
        other.incarnation_id = uuid::Uuid::from_u128(99);
        let ControllerResponse::BrokerRegistration(r) =
            h.run(ControllerRequest::BrokerRegistration(other.clone()))
        else {
            panic!()
        };
        assert_eq!(r.error_code, DUPLICATE_BROKER_REGISTRATION);
        other.previous_broker_epoch = epoch.0;
        let ControllerResponse::BrokerRegistration(r) =
            h.run(ControllerRequest::BrokerRegistration(other.clone()))
        else {
            panic!()
        };
        assert_eq!(r.error_code, NONE);
        assert!(r.broker_epoch > epoch.0);
        other.cluster_id = "elsewhere".into();
        let ControllerResponse::BrokerRegistration(r) =
            h.run(ControllerRequest::BrokerRegistration(other))
        else {
            panic!()
        };
        assert_eq!(r.error_code, INCONSISTENT_CLUSTER_ID);
    }

    #[test]
    fn create_topics_refuses_what_kafka_refuses() {
        let mut h = Harness::new();
        h.register(1, None);
        h.register(2, None);
        assert_eq!(h.create(topic("a", 3, 2), false).error_code, NONE);
        assert_eq!(
            h.create(topic("a", 3, 2), false).error_code,
            TOPIC_ALREADY_EXISTS
        );
        assert_eq!(
            h.create(topic("b", 1, 3), false).error_code,
            INVALID_REPLICATION_FACTOR
        );
        assert_eq!(
            h.create(topic("b", 0, 1), false).error_code,
            INVALID_PARTITIONS
        );
        assert_eq!(
            h.create(topic("b", 1, 0), false).error_code,
            INVALID_REPLICATION_FACTOR
        );
        assert_eq!(
            h.create(topic("no/slash", 1, 1), false).error_code,
            INVALID_TOPIC_EXCEPTION
        );
        assert_eq!(
            h.create(topic(&"x".repeat(250), 1, 1), false).error_code,
            INVALID_TOPIC_EXCEPTION
        );
        let mut manual = topic("m", -1, -1);
        manual.assignments = vec![(0, vec![BrokerId(1), BrokerId(7)])];
        assert_eq!(
            h.create(manual.clone(), false).error_code,
            INVALID_REPLICA_ASSIGNMENT
        );
        manual.assignments = vec![(0, vec![BrokerId(1), BrokerId(1)])];
        assert_eq!(
            h.create(manual.clone(), false).error_code,
            INVALID_REPLICA_ASSIGNMENT
        );
        manual.assignments = vec![(1, vec![BrokerId(1)])];
        assert_eq!(
            h.create(manual.clone(), false).error_code,
            INVALID_REPLICA_ASSIGNMENT
        );
        manual.num_partitions = 1;
        manual.assignments = vec![(0, vec![BrokerId(2), BrokerId(1)])];
        assert_eq!(h.create(manual.clone(), false).error_code, INVALID_REQUEST);
        manual.num_partitions = -1;
        let created = h.create(manual, false);
        assert_eq!(created.error_code, NONE);
        assert_eq!(h.partitions("m")[0].leader, BrokerId(2));
        let mut configured = topic("c", 1, 1);
        configured.configs = vec![("retention.ms".into(), None)];
        assert_eq!(h.create(configured, false).error_code, INVALID_CONFIG);
        // Two topics of one name in one request both fail.
        let ControllerResponse::CreateTopics(v) =
            h.run(ControllerRequest::CreateTopics(CreateTopicsRequest {
                topics: vec![topic("d", 1, 1), topic("d", 1, 1)],
                validate_only: false,
            }))
        else {
            panic!()
        };
        assert!(v.iter().all(|t| t.error_code == INVALID_REQUEST));
    }

    #[test]
    fn validate_only_writes_nothing() {
        let mut h = Harness::new();
        h.register(1, None);
        let offset = h.image.offset();
        let result = h.create(topic("a", 2, 1), true);
        assert_eq!(result.error_code, NONE);
        assert_eq!(result.num_partitions, 2);
        assert_eq!(h.image.offset(), offset);
        assert!(h.image.topic("a").is_none());
    }

    #[test]
    fn twelve_partitions_spread_leaders_over_three_brokers() {
        let mut h = Harness::new();
        for id in 1..=3 {
            h.register(id, None);
        }
        let created = h.create(topic("spread", 12, 3), false);
        assert_eq!(created.error_code, NONE);
        let mut leaders = BTreeMap::new();
        for p in h.partitions("spread") {
            *leaders.entry(p.leader).or_insert(0) += 1;
            assert_eq!(p.isr, p.replicas);
        }
        assert_eq!(leaders.values().copied().collect::<Vec<_>>(), [4, 4, 4]);
    }

    #[test]
    fn an_expired_session_fences_the_broker_and_moves_its_leaderships() {
        let mut h = Harness::new();
        let epochs: Vec<BrokerEpoch> = (1..=3).map(|id| h.register(id, None)).collect();
        h.create(topic("t", 6, 3), false);
        let timeout = BROKER_SESSION_TIMEOUT_MS_DEFAULT;
        h.now_ms = timeout / 2;
        h.heartbeat(2, epochs[1], false);
        h.heartbeat(3, epochs[2], false);
        h.tick(timeout + 1);
        assert!(h.image.broker(BrokerId(1)).unwrap().fenced);
        for p in h.partitions("t") {
            assert_ne!(p.leader, BrokerId(1));
            assert_ne!(p.leader, BrokerId::NONE);
            assert!(!p.isr.contains(&BrokerId(1)));
        }
        // Back and caught up: unfenced, but not in any ISR until it catches up on data.
        h.heartbeat(1, epochs[0], false);
        assert!(!h.image.broker(BrokerId(1)).unwrap().fenced);
    }

    /// Fences broker `victim` by letting its session expire while the others heartbeat.
    fn expire(h: &mut Harness, epochs: &[BrokerEpoch], victim: i32) {
        let timeout = BROKER_SESSION_TIMEOUT_MS_DEFAULT;
        let start = h.now_ms;
        h.now_ms = start + timeout / 2;
        for (i, e) in epochs.iter().enumerate() {
            let id = i as i32 + 1;
            if id != victim {
                h.heartbeat(id, *e, false);
            }
        }
        h.tick(start + timeout + 1);
        assert!(h.image.broker(BrokerId(victim)).unwrap().fenced);
    }

    fn elect(
        h: &mut Harness,
        election_type: i8,
        partitions: Option<Vec<(String, Vec<i32>)>>,
    ) -> Vec<(String, i32, i16)> {
        match h.run(ControllerRequest::ElectLeaders(ElectLeadersRequest {
            election_type,
            partitions,
        })) {
            ControllerResponse::ElectLeaders(r) => {
                assert_eq!(r.error_code, NONE);
                r.results
                    .into_iter()
                    .map(|e| (e.topic, e.partition_id, e.error_code))
                    .collect()
            }
            other => panic!("{other:?}"),
        }
    }

    /// Sets partition 0's ISR of topic `id` to `isr` by AlterPartition, as its leader would.
    fn set_isr(h: &mut Harness, epochs: &[BrokerEpoch], id: TopicId, isr: Vec<BrokerId>) {
        let p = h.image.topic_by_id(id).unwrap().partitions[&0].clone();
        let r = h.run(ControllerRequest::AlterPartition(AlterPartitionRequest {
            broker_id: p.leader,
            broker_epoch: epochs[p.leader.0 as usize - 1],
            partitions: vec![AlterPartitionItem {
                topic_id: id,
                partition_id: 0,
                leader_epoch: p.leader_epoch,
                partition_epoch: p.partition_epoch,
                new_isr: isr.iter().map(|b| (*b, BrokerEpoch(-1))).collect(),
            }],
        }));
        let ControllerResponse::AlterPartition(r) = r else {
            panic!("{r:?}")
        };
        assert_eq!(r.partitions[0].error_code, NONE);
    }

    /// Puts `back` into partition 0's ISR of topic `id`.
    fn rejoin(h: &mut Harness, epochs: &[BrokerEpoch], id: TopicId, back: BrokerId) {
        let mut isr = h.image.topic_by_id(id).unwrap().partitions[&0].isr.clone();
        isr.push(back);
        set_isr(h, epochs, id, isr);
    }

    fn reassign(
        h: &mut Harness,
        topic: &str,
        partition: i32,
        target: Option<Vec<i32>>,
    ) -> (i16, Option<String>) {
        let r = h.run(ControllerRequest::AlterPartitionReassignments(
            AlterPartitionReassignmentsRequest {
                topics: vec![(
                    topic.into(),
                    vec![(
                        partition,
                        target.map(|t| t.into_iter().map(BrokerId).collect()),
                    )],
                )],
                allow_replication_factor_change: true,
            },
        ));
        let ControllerResponse::AlterPartitionReassignments(mut r) = r else {
            panic!("{r:?}")
        };
        assert_eq!(r.error_code, NONE);
        let result = r.results.remove(0);
        (result.error_code, result.error_message)
    }

    fn ongoing(h: &mut Harness) -> Vec<OngoingReassignment> {
        let r = h.run(ControllerRequest::ListPartitionReassignments(
            ListPartitionReassignmentsRequest { topics: None },
        ));
        let ControllerResponse::ListPartitionReassignments(r) = r else {
            panic!("{r:?}")
        };
        r.reassignments
    }

    fn ids(v: &[i32]) -> Vec<BrokerId> {
        v.iter().copied().map(BrokerId).collect()
    }

    /// Brokers 1..=`brokers` (the automatic rebalance off) and topic "t" with one partition on
    /// `replicas`.
    fn one_assigned_partition(
        brokers: i32,
        replicas: &[i32],
    ) -> (Harness, Vec<BrokerEpoch>, TopicId) {
        let mut h = Harness::new();
        h.controller.config.auto_leader_rebalance = false;
        let epochs: Vec<BrokerEpoch> = (1..=brokers).map(|id| h.register(id, None)).collect();
        let created = h.create(
            CreatableTopic {
                assignments: vec![(0, ids(replicas))],
                ..topic("t", -1, -1)
            },
            false,
        );
        (h, epochs, created.topic_id.unwrap())
    }

    #[test]
    fn a_reassignment_adds_replicas_then_drops_the_old_once_the_new_are_in_sync() {
        let (mut h, epochs, id) = one_assigned_partition(4, &[1, 2, 3]);
        let p = |h: &Harness| h.image.topic_by_id(id).unwrap().partitions[&0].clone();
        let before = p(&h);
        assert_eq!(before.leader, BrokerId(1));

        // Move 1,2,3 to 4,2,3: 4 is added and must catch up; 1 (the leader) leaves last.
        assert_eq!(reassign(&mut h, "t", 0, Some(vec![4, 2, 3])), (NONE, None));
        let moving = p(&h);
        assert_eq!(moving.replicas, ids(&[4, 2, 3, 1]));
        assert_eq!(moving.adding_replicas, ids(&[4]));
        assert_eq!(moving.removing_replicas, ids(&[1]));
        assert_eq!(moving.isr, before.isr);
        assert_eq!(moving.leader, BrokerId(1));
        assert_eq!(
            moving.leader_epoch, before.leader_epoch,
            "adding fences no one"
        );
        assert_eq!(
            ongoing(&mut h),
            vec![OngoingReassignment {
                topic: "t".into(),
                partition_id: 0,
                replicas: ids(&[4, 2, 3, 1]),
                adding_replicas: ids(&[4]),
                removing_replicas: ids(&[1]),
            }]
        );

        // The new replica catches up: the leader's ISR expansion completes the move, and the
        // leaving leader hands over to the first target replica in the ISR.
        rejoin(&mut h, &epochs, id, BrokerId(4));
        let done = p(&h);
        assert_eq!(done.replicas, ids(&[4, 2, 3]));
        assert_eq!(done.isr, ids(&[2, 3, 4]));
        assert!(done.adding_replicas.is_empty() && done.removing_replicas.is_empty());
        assert_eq!(done.leader, BrokerId(4));
        assert_eq!(done.leader_epoch.0, before.leader_epoch.0 + 1);
        assert_eq!(ongoing(&mut h), vec![]);
        assert_eq!(
            reassign(&mut h, "t", 0, None).0,
            NO_REASSIGNMENT_IN_PROGRESS
        );

        // A shrink and a reorder need no catching up: done at once, the epoch moves on when
        // a replica leaves.
        assert_eq!(reassign(&mut h, "t", 0, Some(vec![2, 4])).0, NONE);
        let shrunk = p(&h);
        assert_eq!(shrunk.replicas, ids(&[2, 4]));
        assert_eq!(shrunk.isr, ids(&[2, 4]));
        assert_eq!(shrunk.leader, BrokerId(4));
        assert_eq!(shrunk.leader_epoch.0, done.leader_epoch.0 + 1);
        assert_eq!(reassign(&mut h, "t", 0, Some(vec![4, 2])).0, NONE);
        assert_eq!(p(&h).replicas, ids(&[4, 2]));
        assert_eq!(
            p(&h).leader_epoch,
            shrunk.leader_epoch,
            "a reorder fences no one"
        );
        // The same target again changes nothing.
        let offset = h.image.offset();
        assert_eq!(reassign(&mut h, "t", 0, Some(vec![4, 2])).0, NONE);
        assert_eq!(h.image.offset(), offset);
    }

    #[test]
    fn a_cancelled_reassignment_goes_back_to_the_original_replicas() {
        let (mut h, epochs, id) = one_assigned_partition(4, &[1, 2]);
        let p = |h: &Harness| h.image.topic_by_id(id).unwrap().partitions[&0].clone();
        let before = p(&h);
        assert_eq!(reassign(&mut h, "t", 0, Some(vec![3, 4])).0, NONE);
        assert_eq!(p(&h).replicas, ids(&[3, 4, 1, 2]));
        // One of the two new replicas catches up: not done until both have.
        rejoin(&mut h, &epochs, id, BrokerId(3));
        assert_eq!(p(&h).isr, ids(&[1, 2, 3]));
        assert_eq!(p(&h).adding_replicas, ids(&[3, 4]));
        // A new target replaces the one in progress, from the original replicas.
        assert_eq!(reassign(&mut h, "t", 0, Some(vec![3, 2])).0, NONE);
        let retargeted = p(&h);
        assert_eq!(
            retargeted.replicas,
            ids(&[3, 2]),
            "3 is in sync: done at once"
        );
        assert_eq!(retargeted.isr, ids(&[2, 3]));
        assert_eq!(retargeted.leader, BrokerId(3));

        assert_eq!(reassign(&mut h, "t", 0, Some(vec![1, 4])).0, NONE);
        assert_eq!(p(&h).adding_replicas, ids(&[1, 4]));
        assert_eq!(reassign(&mut h, "t", 0, None), (NONE, None));
        let cancelled = p(&h);
        assert_eq!(cancelled.replicas, ids(&[3, 2]));
        assert!(cancelled.adding_replicas.is_empty() && cancelled.removing_replicas.is_empty());
        assert_eq!(cancelled.leader, BrokerId(3));
        assert!(cancelled.leader_epoch.0 > before.leader_epoch.0);
        assert_eq!(ongoing(&mut h), vec![]);
    }

    #[test]
    fn a_cancellation_drops_an_added_replica_that_led() {
        let (mut h, epochs, id) = one_assigned_partition(3, &[1, 2]);
        let p = |h: &Harness| h.image.topic_by_id(id).unwrap().partitions[&0].clone();
        // Targets Kafka refuses.
        assert_eq!(
            reassign(&mut h, "t", 0, Some(vec![3, 1, 4])).0,
            INVALID_REPLICA_ASSIGNMENT
        );
        assert_eq!(
            reassign(&mut h, "t", 0, Some(vec![3, 3])).0,
            INVALID_REPLICA_ASSIGNMENT
        );
        assert_eq!(
            reassign(&mut h, "t", 0, Some(vec![])).0,
            INVALID_REPLICA_ASSIGNMENT
        );
        assert_eq!(
            reassign(&mut h, "t", 9, Some(vec![1])).0,
            UNKNOWN_TOPIC_OR_PARTITION
        );
        assert_eq!(
            reassign(&mut h, "u", 0, Some(vec![1])).0,
            UNKNOWN_TOPIC_OR_PARTITION
        );
        assert_eq!(reassign(&mut h, "t", 0, Some(vec![3, 1, 2])).0, NONE);
        rejoin(&mut h, &epochs, id, BrokerId(3));
        assert_eq!(p(&h).replicas, ids(&[3, 1, 2]), "nothing leaves: done");
        // Grow once more, and this time the leader of the moving partition is an added one.
        assert_eq!(reassign(&mut h, "t", 0, Some(vec![3])).0, NONE);
        assert_eq!(p(&h).replicas, ids(&[3]));
        assert_eq!(p(&h).leader, BrokerId(3));
        assert_eq!(reassign(&mut h, "t", 0, Some(vec![1, 2])).0, NONE);
        assert_eq!(p(&h).replicas, ids(&[1, 2, 3]));
        assert_eq!(p(&h).leader, BrokerId(3));
        // Cancelled before 1 and 2 caught up: back to 3 alone, which still leads.
        assert_eq!(reassign(&mut h, "t", 0, None).0, NONE);
        assert_eq!(p(&h).replicas, ids(&[3]));
        assert_eq!(p(&h).isr, ids(&[3]));
        assert_eq!(p(&h).leader, BrokerId(3));
    }

    #[test]
    fn preferred_election_gives_the_first_replica_its_leadership_back_once_in_sync() {
        let mut h = Harness::new();
        h.controller.config.auto_leader_rebalance = false;
        let epochs: Vec<BrokerEpoch> = (1..=3).map(|id| h.register(id, None)).collect();
        let id = h.create(topic("t", 1, 3), false).topic_id.unwrap();
        let p = |h: &Harness| h.image.topic_by_id(id).unwrap().partitions[&0].clone();
        let preferred = p(&h).replicas[0];
        assert_eq!(p(&h).leader, preferred);
        let all = |h: &mut Harness| elect(h, ELECTION_PREFERRED, Some(vec![("t".into(), vec![0])]));
        assert_eq!(all(&mut h), vec![("t".into(), 0, ELECTION_NOT_NEEDED)]);
        // Every partition, none needing an election: nothing to report, as Kafka answers.
        assert_eq!(elect(&mut h, ELECTION_PREFERRED, None), vec![]);

        expire(&mut h, &epochs, preferred.0);
        let moved = p(&h);
        assert_ne!(moved.leader, preferred);
        assert_eq!(
            all(&mut h),
            vec![("t".into(), 0, PREFERRED_LEADER_NOT_AVAILABLE)]
        );
        // Back but not yet in sync: still not available.
        h.heartbeat(preferred.0, epochs[preferred.0 as usize - 1], false);
        assert_eq!(
            all(&mut h),
            vec![("t".into(), 0, PREFERRED_LEADER_NOT_AVAILABLE)]
        );
        rejoin(&mut h, &epochs, id, preferred);
        assert_eq!(all(&mut h), vec![("t".into(), 0, NONE)]);
        let now = p(&h);
        assert_eq!(now.leader, preferred);
        assert_eq!(now.leader_epoch.0, moved.leader_epoch.0 + 1);
        assert_eq!(now.isr.len(), 3);
        assert_eq!(
            elect(
                &mut h,
                ELECTION_PREFERRED,
                Some(vec![("nope".into(), vec![0]), ("t".into(), vec![7])])
            ),
            vec![
                ("nope".into(), 0, UNKNOWN_TOPIC_OR_PARTITION),
                ("t".into(), 7, UNKNOWN_TOPIC_OR_PARTITION)
            ]
        );
    }

    #[test]
    fn the_automatic_rebalance_moves_leaderships_back_to_preferred_replicas() {
        let mut h = Harness::new();
        h.controller.config.leader_imbalance_check_interval_ms = 60_000;
        h.controller.activate(&h.image.clone(), 0);
        let epochs: Vec<BrokerEpoch> = (1..=3).map(|id| h.register(id, None)).collect();
        let id = h.create(topic("t", 1, 3), false).topic_id.unwrap();
        let p = |h: &Harness| h.image.topic_by_id(id).unwrap().partitions[&0].clone();
        let preferred = p(&h).replicas[0];
        expire(&mut h, &epochs, preferred.0);
        h.heartbeat(preferred.0, epochs[preferred.0 as usize - 1], false);
        rejoin(&mut h, &epochs, id, preferred);
        assert_ne!(p(&h).leader, preferred);
        // Before the interval is up nothing moves; at the next check the leadership does.
        let at = h.now_ms;
        for (i, e) in epochs.iter().enumerate() {
            h.heartbeat(i as i32 + 1, *e, false);
        }
        h.tick(at.max(1));
        if at < 60_000 {
            assert_ne!(p(&h).leader, preferred);
        }
        for (i, e) in epochs.iter().enumerate() {
            h.now_ms = 60_000;
            h.heartbeat(i as i32 + 1, *e, false);
        }
        h.tick(60_000);
        assert_eq!(p(&h).leader, preferred);
    }

    #[test]
    fn unclean_election_only_where_allowed_and_only_when_no_in_sync_replica_can_lead() {
        let mut h = Harness::new();
        h.controller.config.auto_leader_rebalance = false;
        let epochs: Vec<BrokerEpoch> = (1..=2).map(|id| h.register(id, None)).collect();
        let id = h.create(topic("u", 1, 2), false).topic_id.unwrap();
        let p = |h: &Harness| h.image.topic_by_id(id).unwrap().partitions[&0].clone();
        let start = p(&h);
        let (leader, follower) = (
            start.leader,
            start
                .replicas
                .iter()
                .copied()
                .find(|b| *b != start.leader)
                .unwrap(),
        );
        // The follower falls out of the ISR, then the leader dies: the partition is leaderless.
        set_isr(&mut h, &epochs, id, vec![leader]);
        expire(&mut h, &epochs, leader.0);
        assert_eq!(p(&h).leader, BrokerId::NONE);
        let unclean =
            |h: &mut Harness| elect(h, ELECTION_UNCLEAN, Some(vec![("u".into(), vec![0])]));
        // ElectLeaders UNCLEAN is the operator's choice, whatever the topic says.
        assert_eq!(unclean(&mut h), vec![("u".into(), 0, NONE)]);
        let now = p(&h);
        assert_eq!((now.leader, now.isr.clone()), (follower, vec![follower]));
        assert_eq!(unclean(&mut h), vec![("u".into(), 0, ELECTION_NOT_NEEDED)]);
        // An unknown election type fails the whole request.
        let r = h.run(ControllerRequest::ElectLeaders(ElectLeadersRequest {
            election_type: 5,
            partitions: Some(vec![("u".into(), vec![0])]),
        }));
        let ControllerResponse::ElectLeaders(r) = r else {
            panic!("{r:?}")
        };
        assert_eq!(r.error_code, INVALID_REQUEST);
        assert_eq!(r.results[0].error_code, INVALID_REQUEST);
    }

    #[test]
    fn a_topic_allowing_unclean_election_gets_a_leader_when_its_last_in_sync_replica_dies() {
        let mut h = Harness::new();
        h.controller.config.auto_leader_rebalance = false;
        let epochs: Vec<BrokerEpoch> = (1..=2).map(|id| h.register(id, None)).collect();
        let mut t = topic("dirty", 1, 2);
        t.configs = vec![("unclean.leader.election.enable".into(), Some("true".into()))];
        let id = h.create(t, false).topic_id.unwrap();
        let p = |h: &Harness| h.image.topic_by_id(id).unwrap().partitions[&0].clone();
        let start = p(&h);
        let leader = start.leader;
        let follower = start
            .replicas
            .iter()
            .copied()
            .find(|b| *b != leader)
            .unwrap();
        set_isr(&mut h, &epochs, id, vec![leader]);
        expire(&mut h, &epochs, leader.0);
        let now = p(&h);
        assert_eq!((now.leader, now.isr.clone()), (follower, vec![follower]));
    }

    #[test]
    fn the_last_isr_member_keeps_its_place_and_leads_again_when_back() {
        let mut h = Harness::new();
        let epoch = h.register(1, None);
        h.create(topic("solo", 1, 1), false);
        h.tick(BROKER_SESSION_TIMEOUT_MS_DEFAULT + 1);
        let p = &h.partitions("solo")[0];
        assert_eq!(p.leader, BrokerId::NONE);
        assert_eq!(p.isr, vec![BrokerId(1)]);
        assert_eq!(p.leader_epoch, LeaderEpoch(1));
        h.heartbeat(1, epoch, false);
        let p = &h.partitions("solo")[0];
        assert_eq!(p.leader, BrokerId(1));
        assert_eq!(p.leader_epoch, LeaderEpoch(2));
    }

    #[test]
    fn a_fenced_replica_below_min_isr_becomes_an_eligible_leader_replica() {
        let mut h = Harness::new();
        let e1 = h.register(1, None);
        h.register(2, None);
        let mut t = topic("elr", 1, 2);
        t.configs = vec![("min.insync.replicas".into(), Some("2".into()))];
        h.create(t, false);
        let leader = h.partitions("elr")[0].leader;
        let follower = if leader == BrokerId(1) {
            BrokerId(2)
        } else {
            BrokerId(1)
        };
        let epoch_of = |id: BrokerId| h.image.broker(id).unwrap().epoch;
        let fence_epoch = epoch_of(follower);
        let _ = e1;
        h.run(ControllerRequest::BrokerHeartbeat(BrokerHeartbeatRequest {
            broker_id: follower,
            broker_epoch: fence_epoch,
            current_metadata_offset: h.image.offset(),
            wants_fence: true,
            wants_shut_down: false,
        }));
        let p = &h.partitions("elr")[0];
        assert_eq!(p.isr, vec![leader]);
        assert_eq!(p.eligible_leader_replicas, vec![follower]);
    }

    #[test]
    fn the_cluster_keeps_a_dynamic_min_isr_that_eligible_leader_replicas_count_against() {
        let mut h = Harness::new();
        h.tick(1);
        let cluster = || ConfigResourceType::Broker;
        assert_eq!(
            h.image
                .configs(cluster(), "")
                .and_then(|c| c.get(MIN_INSYNC_REPLICAS))
                .map(String::as_str),
            Some("1"),
            "the static value, written once"
        );
        let before = h.image.offset();
        h.tick(2);
        assert_eq!(h.image.offset(), before, "written only once");
        // Raised cluster-wide to 2, a topic with no override counts against 2: losing one of
        // two in-sync replicas makes it an eligible leader replica.
        let ControllerResponse::IncrementalAlterConfigs(v) = h.run(
            ControllerRequest::IncrementalAlterConfigs(IncrementalAlterConfigsRequest {
                resources: vec![AlterConfigsResource {
                    resource_type: 4,
                    resource_name: String::new(),
                    configs: vec![AlterableConfig {
                        name: MIN_INSYNC_REPLICAS.into(),
                        op: AlterConfigOp::Set,
                        value: Some("2".into()),
                    }],
                }],
                validate_only: false,
            }),
        ) else {
            panic!()
        };
        assert_eq!(v[0].error_code, NONE, "{v:?}");
        // Kafka's rules with eligible leader replicas on: the cluster-wide value stays, and no
        // broker has its own.
        for (resource_name, op, value) in [
            ("", AlterConfigOp::Delete, None),
            ("1", AlterConfigOp::Set, Some("3")),
        ] {
            let ControllerResponse::IncrementalAlterConfigs(v) = h.run(
                ControllerRequest::IncrementalAlterConfigs(IncrementalAlterConfigsRequest {
                    resources: vec![AlterConfigsResource {
                        resource_type: 4,
                        resource_name: resource_name.into(),
                        configs: vec![AlterableConfig {
                            name: MIN_INSYNC_REPLICAS.into(),
                            op,
                            value: value.map(str::to_owned),
                        }],
                    }],
                    validate_only: false,
                }),
            ) else {
                panic!()
            };
            assert_eq!(v[0].error_code, INVALID_CONFIG, "{v:?}");
        }
        h.register(1, None);
        h.register(2, None);
        h.create(topic("elr-default", 1, 2), false);
        let p = &h.partitions("elr-default")[0];
        let follower = if p.leader == BrokerId(1) {
            BrokerId(2)
        } else {
            BrokerId(1)
        };
        let epoch = h.image.broker(follower).unwrap().epoch;
        h.run(ControllerRequest::BrokerHeartbeat(BrokerHeartbeatRequest {
            broker_id: follower,
            broker_epoch: epoch,
            current_metadata_offset: h.image.offset(),
            wants_fence: true,
            wants_shut_down: false,
        }));
        assert_eq!(
            h.partitions("elr-default")[0].eligible_leader_replicas,
            vec![follower]
        );
    }

    #[test]
    fn update_features_finalizes_levels_and_level_0_removes_one() {
        let mut h = Harness::new();
        let update = |updates: &[(&str, i16)], validate_only| {
            ControllerRequest::UpdateFeatures(UpdateFeaturesRequest {
                updates: updates.iter().map(|(n, l)| (n.to_string(), *l)).collect(),
                validate_only,
            })
        };
        let request = update(
            &[("metadata.version", 25), ("transaction.version", 2)],
            true,
        );
        assert_eq!(h.run(request), ControllerResponse::UpdateFeatures(NONE));
        assert_eq!(h.image.feature_level("transaction.version"), None);
        let request = update(
            &[("metadata.version", 25), ("transaction.version", 2)],
            false,
        );
        assert_eq!(h.run(request), ControllerResponse::UpdateFeatures(NONE));
        assert_eq!(h.image.feature_level("metadata.version"), Some(25));
        assert_eq!(h.image.feature_level("transaction.version"), Some(2));
        let offset = h.image.offset();
        // The same levels again: nothing to write.
        let request = update(&[("transaction.version", 2)], false);
        assert_eq!(h.run(request), ControllerResponse::UpdateFeatures(NONE));
        assert_eq!(h.image.offset(), offset);
        let request = update(&[("transaction.version", 0)], false);
        assert_eq!(h.run(request), ControllerResponse::UpdateFeatures(NONE));
        assert_eq!(h.image.feature_level("transaction.version"), None);
        assert_eq!(h.image.feature_level("metadata.version"), Some(25));
    }

    fn credential(name: &str, mechanism: i8, iterations: i32) -> UserScramCredentialRecord {
        UserScramCredentialRecord {
            name: name.into(),
            mechanism,
            salt: b"salt".to_vec(),
            stored_key: vec![1; 32],
            server_key: vec![2; 32],
            iterations,
        }
    }

    fn scram_results(response: ControllerResponse) -> Vec<(String, i16)> {
        match response {
            ControllerResponse::AlterUserScramCredentials(results) => results
                .into_iter()
                .map(|r| {
                    assert_eq!(r.error_message.is_some(), r.error_code != NONE, "{r:?}");
                    (r.user, r.error_code)
                })
                .collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn client_quotas_are_set_removed_and_kept_in_snapshots() {
        let mut h = Harness::new();
        let entry = |parts: &[(&str, Option<&str>)], ops: &[(&str, Option<f64>)]| QuotaAlteration {
            entity: parts
                .iter()
                .map(|(t, n)| (t.to_string(), n.map(str::to_string)))
                .collect(),
            ops: ops
                .iter()
                .map(|(k, v)| (k.to_string(), v.map(QuotaValue)))
                .collect(),
        };
        let alter = |entries: Vec<QuotaAlteration>, validate_only: bool| {
            ControllerRequest::AlterClientQuotas(AlterClientQuotasRequest {
                entries,
                validate_only,
            })
        };
        let codes = |response: ControllerResponse| match response {
            ControllerResponse::AlterClientQuotas(r) => {
                r.iter().map(|e| e.error_code).collect::<Vec<_>>()
            }
            other => panic!("{other:?}"),
        };
        let alice = vec![("user".to_string(), Some("alice".to_string()))];
        let request = alter(
            vec![
                entry(
                    &[("user", Some("alice"))],
                    &[
                        ("producer_byte_rate", Some(1024.0)),
                        ("consumer_byte_rate", Some(2048.0)),
                    ],
                ),
                entry(
                    &[("user", Some("bob"))],
                    &[("producer_byte_rate", Some(0.5))],
                ),
            ],
            true,
        );
        assert_eq!(codes(h.run(request.clone())), vec![NONE, INVALID_REQUEST]);
        assert!(
            h.image.client_quotas().is_empty(),
            "validate_only writes nothing"
        );
        assert_eq!(
            codes(h.run(alter(
                match request {
                    ControllerRequest::AlterClientQuotas(r) => r.entries,
                    _ => unreachable!(),
                },
                false,
            ))),
            vec![NONE, INVALID_REQUEST]
        );
        let keys = &h.image.client_quotas()[&alice];
        assert_eq!(keys["producer_byte_rate"], QuotaValue(1024.0));
        assert_eq!(keys["consumer_byte_rate"], QuotaValue(2048.0));
        assert_eq!(
            h.image.client_quotas().len(),
            1,
            "bob's refused entry wrote nothing"
        );
        // A default entity, and a removal.
        assert_eq!(
            codes(h.run(alter(
                vec![
                    entry(
                        &[("client-id", None)],
                        &[("consumer_byte_rate", Some(10.0))]
                    ),
                    entry(&[("user", Some("alice"))], &[("producer_byte_rate", None)]),
                ],
                false
            ))),
            vec![NONE, NONE]
        );
        assert_eq!(
            h.image.client_quotas()[&alice].keys().collect::<Vec<_>>(),
            vec!["consumer_byte_rate"]
        );
        let snapshot =
            MetadataImage::from_snapshot(h.image.offset(), &h.image.snapshot_records()).unwrap();
        assert_eq!(snapshot, h.image);
        assert_eq!(snapshot.client_quotas().len(), 2);
        // Removing the last key removes the entity.
        h.run(alter(
            vec![entry(
                &[("user", Some("alice"))],
                &[("consumer_byte_rate", None)],
            )],
            false,
        ));
        assert!(!h.image.client_quotas().contains_key(&alice));
    }

    #[test]
    fn scram_credentials_are_checked_per_user_and_stored_in_the_image() {
        let mut h = Harness::new();
        let alter = |deletions: &[(&str, i8)], upsertions: Vec<UserScramCredentialRecord>| {
            ControllerRequest::AlterUserScramCredentials(AlterUserScramCredentialsRequest {
                deletions: deletions.iter().map(|(n, m)| (n.to_string(), *m)).collect(),
                upsertions,
            })
        };
        let request = alter(
            &[("carol", 1)],
            vec![
                credential("alice", 1, 4096),
                credential("bob", 2, 8192),
                credential("dave", 3, 4096),
                credential("erin", 1, 4095),
                credential("frank", 1, 16385),
                credential("", 1, 4096),
                credential("gina", 1, 4096),
                credential("gina", 2, 4096),
            ],
        );
        assert_eq!(
            scram_results(h.run(request)),
            vec![
                ("".to_string(), UNACCEPTABLE_CREDENTIAL),
                ("alice".to_string(), NONE),
                ("bob".to_string(), NONE),
                ("carol".to_string(), RESOURCE_NOT_FOUND),
                ("dave".to_string(), UNSUPPORTED_SASL_MECHANISM),
                ("erin".to_string(), UNACCEPTABLE_CREDENTIAL),
                ("frank".to_string(), UNACCEPTABLE_CREDENTIAL),
                ("gina".to_string(), DUPLICATE_RESOURCE),
            ]
        );
        let stored: Vec<(&str, i8, i32)> = h
            .image
            .scram_credentials()
            .map(|c| (c.name.as_str(), c.mechanism, c.iterations))
            .collect();
        assert_eq!(stored, vec![("alice", 1, 4096), ("bob", 2, 8192)]);
        assert_eq!(
            h.image.scram_credential("bob", 2).unwrap().stored_key,
            vec![1; 32]
        );
        // A snapshot keeps them.
        let rebuilt =
            MetadataImage::from_snapshot(h.image.offset(), &h.image.snapshot_records()).unwrap();
        assert_eq!(rebuilt, h.image);
        // Replaced, deleted; deleting a mechanism the user lacks is refused.
        let request = alter(&[("bob", 2)], vec![credential("alice", 1, 10000)]);
        assert_eq!(
            scram_results(h.run(request)),
            vec![("alice".to_string(), NONE), ("bob".to_string(), NONE)]
        );
        assert_eq!(
            h.image.scram_credential("alice", 1).unwrap().iterations,
            10000
        );
        assert!(h.image.scram_credential("bob", 2).is_none());
        let request = alter(&[("alice", 2)], vec![]);
        assert_eq!(
            scram_results(h.run(request)),
            vec![("alice".to_string(), RESOURCE_NOT_FOUND)]
        );
        assert!(h.image.scram_credential("alice", 1).is_some());
        // Nothing acceptable: nothing written.
        let offset = h.image.offset();
        let request = alter(&[], vec![credential("zed", 1, 1)]);
        assert_eq!(
            scram_results(h.run(request)),
            vec![("zed".to_string(), UNACCEPTABLE_CREDENTIAL)]
        );
        assert_eq!(h.image.offset(), offset);
    }

    #[test]
    fn acls_are_created_once_listed_by_filters_and_deleted() {
        use crate::acl::{
            operation, pattern_type, permission, resource_type, AclBinding, AclFilter,
        };
        let mut h = Harness::new();
        let acl = |name: &str, pattern: i8, principal: &str| AclBinding {
            resource_type: resource_type::TOPIC,
            resource_name: name.into(),
            pattern_type: pattern,
            principal: principal.into(),
            host: "*".into(),
            operation: operation::READ,
            permission: permission::ALLOW,
        };
        let create = |creations: Vec<AclBinding>| {
            ControllerRequest::CreateAcls(CreateAclsRequest { creations })
        };
        let codes = |response: ControllerResponse| match response {
            ControllerResponse::CreateAcls(r) => r.iter().map(|c| c.error_code).collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        let orders = acl("orders", pattern_type::LITERAL, "User:alice");
        let prefixed = acl("ord", pattern_type::PREFIXED, "User:bob");
        let bad = acl("x", pattern_type::MATCH, "User:carol");
        let response = h.run(create(vec![
            orders.clone(),
            prefixed.clone(),
            bad,
            orders.clone(),
        ]));
        assert_eq!(codes(response), [NONE, NONE, INVALID_REQUEST, NONE]);
        assert_eq!(h.image.acls().len(), 2, "the same ACL twice is kept once");
        let offset = h.image.offset();
        assert_eq!(codes(h.run(create(vec![orders.clone()]))), [NONE]);
        assert_eq!(h.image.offset(), offset, "an existing ACL writes nothing");
        let rebuilt =
            MetadataImage::from_snapshot(h.image.offset(), &h.image.snapshot_records()).unwrap();
        assert_eq!(rebuilt, h.image);
        // Delete by MATCH on a name: both apply to "orders".
        let filter = AclFilter {
            resource_type: resource_type::TOPIC,
            resource_name: Some("orders".into()),
            pattern_type: pattern_type::MATCH,
            principal: Some("User:bob".into()),
            host: None,
            operation: operation::ANY,
            permission: permission::ANY,
        };
        let mut invalid = filter.clone();
        invalid.operation = operation::UNKNOWN;
        let request = ControllerRequest::DeleteAcls(DeleteAclsRequest {
            filters: vec![filter, invalid],
        });
        match h.run(request) {
            ControllerResponse::DeleteAcls(r) => {
                assert_eq!(r[0].error_code, NONE);
                assert_eq!(r[0].matching, vec![prefixed]);
                assert_eq!(r[1].error_code, INVALID_REQUEST);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            h.image.acls().values().cloned().collect::<Vec<_>>(),
            vec![orders]
        );
    }

    #[test]
    fn controlled_shutdown_hands_leaderships_over_then_fences() {
        let mut h = Harness::new();
        let epochs: Vec<BrokerEpoch> = (1..=2).map(|id| h.register(id, None)).collect();
        h.create(topic("t", 4, 2), false);
        assert!(h.partitions("t").iter().any(|p| p.leader == BrokerId(1)));
        let hb = h.heartbeat(1, epochs[0], true);
        assert!(hb.should_shut_down && hb.is_fenced);
        assert!(h.image.broker(BrokerId(1)).unwrap().fenced);
        for p in h.partitions("t") {
            assert_eq!(p.leader, BrokerId(2));
            assert_eq!(p.isr, vec![BrokerId(2)]);
        }
        // It is not unfenced by later heartbeats, and gets nothing new.
        let hb = h.heartbeat(1, epochs[0], false);
        assert!(hb.should_shut_down);
        assert_eq!(
            h.create(topic("u", 1, 2), false).error_code,
            INVALID_REPLICATION_FACTOR
        );
    }

    #[test]
    fn delete_topics_by_name_and_id() {
        let mut h = Harness::new();
        h.register(1, None);
        let id = h.create(topic("a", 1, 1), false).topic_id.unwrap();
        let ControllerResponse::DeleteTopics(v) =
            h.run(ControllerRequest::DeleteTopics(DeleteTopicsRequest {
                topics: vec![
                    TopicRef::Name("missing".into()),
                    TopicRef::Id(TopicId(uuid::Uuid::from_u128(5))),
                    TopicRef::Id(id),
                ],
            }))
        else {
            panic!()
        };
        assert_eq!(v[0].error_code, UNKNOWN_TOPIC_OR_PARTITION);
        assert_eq!(v[1].error_code, UNKNOWN_TOPIC_ID);
        assert_eq!(v[2].error_code, NONE);
        assert_eq!(v[2].name.as_deref(), Some("a"));
        assert!(h.image.topic("a").is_none());
    }

    #[test]
    fn create_partitions_only_grows() {
        let mut h = Harness::new();
        h.register(1, None);
        h.register(2, None);
        h.create(topic("a", 2, 2), false);
        let mut grow = |count, assignments| {
            let ControllerResponse::CreatePartitions(v) = h.run(
                ControllerRequest::CreatePartitions(CreatePartitionsRequest {
                    topics: vec![CreatePartitionsTopic {
                        name: "a".into(),
                        count,
                        assignments,
                    }],
                    validate_only: false,
                }),
            ) else {
                panic!()
            };
            v[0].error_code
        };
        assert_eq!(grow(1, None), INVALID_PARTITIONS);
        assert_eq!(grow(2, None), INVALID_PARTITIONS);
        assert_eq!(
            grow(4, Some(vec![vec![BrokerId(1), BrokerId(2)]])),
            INVALID_REPLICA_ASSIGNMENT
        );
        assert_eq!(grow(4, None), NONE);
        let partitions = h.partitions("a");
        assert_eq!(partitions.len(), 4);
        assert!(partitions.iter().all(|p| p.replicas.len() == 2));
    }

    #[test]
    fn incremental_alter_configs_sets_deletes_appends_and_subtracts() {
        let mut h = Harness::new();
        h.register(1, None);
        h.create(topic("a", 1, 1), false);
        fn alter(
            h: &mut Harness,
            resource_type: i8,
            name: &str,
            op: AlterConfigOp,
            value: Option<&str>,
        ) -> i16 {
            let ControllerResponse::IncrementalAlterConfigs(v) = h.run(
                ControllerRequest::IncrementalAlterConfigs(IncrementalAlterConfigsRequest {
                    resources: vec![AlterConfigsResource {
                        resource_type,
                        resource_name: name.into(),
                        configs: vec![AlterableConfig {
                            name: "cleanup.policy".into(),
                            op,
                            value: value.map(str::to_owned),
                        }],
                    }],
                    validate_only: false,
                }),
            ) else {
                panic!()
            };
            v[0].error_code
        }
        assert_eq!(
            alter(&mut h, 2, "a", AlterConfigOp::Set, Some("delete")),
            NONE
        );
        assert_eq!(
            alter(&mut h, 2, "a", AlterConfigOp::Append, Some("compact")),
            NONE
        );
        assert_eq!(
            h.image.topic_configs("a").unwrap()["cleanup.policy"],
            "delete,compact"
        );
        assert_eq!(
            alter(&mut h, 2, "a", AlterConfigOp::Subtract, Some("delete")),
            NONE
        );
        assert_eq!(
            h.image.topic_configs("a").unwrap()["cleanup.policy"],
            "compact"
        );
        assert_eq!(alter(&mut h, 2, "a", AlterConfigOp::Delete, None), NONE);
        assert!(h.image.topic_configs("a").is_none());
        assert_eq!(
            alter(&mut h, 2, "missing", AlterConfigOp::Set, Some("x")),
            UNKNOWN_TOPIC_OR_PARTITION
        );
        assert_eq!(
            alter(&mut h, 4, "", AlterConfigOp::Set, Some("delete")),
            NONE
        );
        assert_eq!(
            alter(&mut h, 4, "not-a-number", AlterConfigOp::Set, Some("x")),
            INVALID_REQUEST
        );
        assert_eq!(
            alter(&mut h, 3, "x", AlterConfigOp::Set, Some("x")),
            INVALID_REQUEST
        );
    }

    #[test]
    fn producer_id_blocks_never_overlap() {
        let mut h = Harness::new();
        let epoch = h.register(1, None);
        let mut starts = Vec::new();
        for _ in 0..3 {
            let ControllerResponse::AllocateProducerIds(r) = h.run(
                ControllerRequest::AllocateProducerIds(AllocateProducerIdsRequest {
                    broker_id: BrokerId(1),
                    broker_epoch: epoch,
                }),
            ) else {
                panic!()
            };
            assert_eq!(r.error_code, NONE);
            assert_eq!(r.producer_id_len as i64, PRODUCER_ID_BLOCK_SIZE);
            starts.push(r.producer_id_start);
        }
        assert_eq!(starts, [0, 1000, 2000]);
        assert_eq!(h.image.next_producer_id(), 3000);
        let ControllerResponse::AllocateProducerIds(r) = h.run(
            ControllerRequest::AllocateProducerIds(AllocateProducerIdsRequest {
                broker_id: BrokerId(1),
                broker_epoch: BrokerEpoch(epoch.0 + 100),
            }),
        ) else {
            panic!()
        };
        assert_eq!(r.error_code, STALE_BROKER_EPOCH);
    }

    #[test]
    fn rack_aware_placement_puts_replicas_on_distinct_racks() {
        let mut h = Harness::new();
        for (id, rack) in [(1, "a"), (2, "a"), (3, "b"), (4, "b"), (5, "c"), (6, "c")] {
            h.register(id, Some(rack));
        }
        h.create(topic("racked", 12, 3), false);
        for p in h.partitions("racked") {
            let mut racks: Vec<String> = p
                .replicas
                .iter()
                .map(|b| h.image.broker(*b).unwrap().rack.clone().unwrap())
                .collect();
            racks.sort();
            racks.dedup();
            assert_eq!(racks.len(), 3, "{:?}", p.replicas);
        }
    }
}
