//! `sluice group`: list, describe and delete consumer groups and reset their committed offsets,
//! like Kafka's `kafka-consumer-groups.sh`.
//!
//! ListGroups goes to every broker of the cluster; DescribeGroups, OffsetFetch, OffsetCommit and
//! DeleteGroups go to the group's coordinator, found with FindCoordinator (and found again when
//! it moves or is still loading). Log end offsets come from ListOffsets at each partition's
//! leader. Member assignments of `consumer` groups are decoded (ConsumerProtocolAssignment
//! v0-3) to show which member owns which partition.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{anyhow, bail};
use clap::Subcommand;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, ConsumerGroupDescribeRequest, DeleteGroupsRequest, DescribeGroupsRequest,
    FindCoordinatorRequest, GroupId, ListGroupsRequest, ListOffsetsRequest, OffsetCommitRequest,
    OffsetFetchRequest,
};
use kafka_protocol::ResponseError;

use super::client::{describe_error, error_name, str_bytes, topic_name, Client, Cluster};
use super::{plural, Connection};

/// FindCoordinator `key_type` of a consumer group.
const KEY_TYPE_GROUP: i8 = 0;
/// Attempts while the coordinator moves or loads the group, and the pause between them.
const COORDINATOR_ATTEMPTS_MAX: u32 = 20;
const RETRY_MS: u64 = 250;
/// ListOffsets timestamps with special meanings.
const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
/// The protocol type of groups whose assignments are ConsumerProtocolAssignment.
const CONSUMER_PROTOCOL_TYPE: &str = "consumer";

#[derive(clap::Args, Debug)]
pub struct GroupArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: GroupCommand,
}

#[derive(Subcommand, Debug)]
enum GroupCommand {
    /// List the groups of every broker with their state and protocol type (ListGroups).
    List {
        /// Only groups in this state, e.g. `Stable` or `Empty` (repeatable, any case).
        #[arg(long = "state", value_name = "STATE")]
        states: Vec<String>,
    },
    /// Show a group's state, members and assignments, and per partition the committed offset,
    /// log end offset, lag and owning member (DescribeGroups, OffsetFetch, ListOffsets).
    Describe {
        /// The group id.
        group: String,
    },
    /// Delete a group that has no active members, with its committed offsets (DeleteGroups).
    Delete {
        /// The group id.
        group: String,
    },
    /// Show, or with --execute commit, new offsets for a group that has no active members.
    ResetOffsets(ResetArgs),
}

#[derive(clap::Args, Debug)]
struct ResetArgs {
    /// The group id; a group that does not exist yet is created with the new offsets.
    group: String,
    /// A topic to reset, all its partitions or only the ones listed: `events` or
    /// `events:0,2` (repeatable).
    #[arg(long = "topic", value_name = "TOPIC[:P,P]", value_parser = parse_topic_spec, required_unless_present = "all_topics")]
    topics: Vec<TopicSpec>,
    /// Reset every partition the group has a committed offset for.
    #[arg(long, conflicts_with = "topics")]
    all_topics: bool,
    #[command(flatten)]
    target: TargetArgs,
    /// Commit the new offsets. Without it the plan is only printed.
    #[arg(long)]
    execute: bool,
    /// Only print the plan (the default; for symmetry with kafka-consumer-groups).
    #[arg(long, conflicts_with = "execute")]
    dry_run: bool,
}

/// Where to move each partition's committed offset; exactly one is required.
#[derive(clap::Args, Debug)]
#[group(required = true, multiple = false)]
struct TargetArgs {
    /// To the log start offset.
    #[arg(long)]
    to_earliest: bool,
    /// To the log end offset (high watermark): nothing left to consume.
    #[arg(long)]
    to_latest: bool,
    /// To this offset, kept within the partition's log start and end offsets.
    #[arg(long, value_name = "N")]
    to_offset: Option<i64>,
    /// To the first record whose timestamp is at or after MS (milliseconds since the Unix
    /// epoch), or to the log end offset when there is none.
    #[arg(long, value_name = "MS")]
    to_datetime: Option<i64>,
    /// By N (negative: back) from the committed offset, kept within the log.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    shift_by: Option<i64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Earliest,
    Latest,
    Offset(i64),
    Datetime(i64),
    ShiftBy(i64),
}

impl TargetArgs {
    fn target(&self) -> Target {
        if self.to_earliest {
            Target::Earliest
        } else if self.to_latest {
            Target::Latest
        } else if let Some(n) = self.to_offset {
            Target::Offset(n)
        } else if let Some(ms) = self.to_datetime {
            Target::Datetime(ms)
        } else if let Some(n) = self.shift_by {
            Target::ShiftBy(n)
        } else {
            unreachable!("clap requires one of the targets")
        }
    }
}

/// `--topic events` or `--topic events:0,2`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TopicSpec {
    topic: String,
    /// `None`: every partition of the topic.
    partitions: Option<Vec<i32>>,
}

fn parse_topic_spec(s: &str) -> Result<TopicSpec, String> {
    let (topic, partitions) = match s.split_once(':') {
        None => (s, None),
        Some((topic, list)) => {
            let mut partitions = Vec::new();
            for p in list.split(',') {
                let p = p.trim();
                match p.parse::<i32>() {
                    Ok(n) if n >= 0 => partitions.push(n),
                    _ => {
                        return Err(format!(
                            "{p:?} is not a partition number (expected TOPIC or TOPIC:P,P,...)"
                        ))
                    }
                }
            }
            partitions.sort_unstable();
            partitions.dedup();
            (topic, Some(partitions))
        }
    };
    if topic.is_empty() {
        return Err("the topic name is empty (expected TOPIC or TOPIC:P,P,...)".into());
    }
    Ok(TopicSpec {
        topic: topic.to_string(),
        partitions,
    })
}

pub fn run(args: &GroupArgs) -> anyhow::Result<()> {
    let client = Client::bootstrap(&args.connection.bootstrap_server)?;
    let mut admin = Admin {
        cluster: Cluster::new(client),
        coordinators: BTreeMap::new(),
        brokers_known: false,
    };
    match &args.command {
        GroupCommand::List { states } => list(&mut admin, states),
        GroupCommand::Describe { group } => describe(&mut admin, group),
        GroupCommand::Delete { group } => delete(&mut admin, group),
        GroupCommand::ResetOffsets(reset) => reset_offsets(&mut admin, reset),
    }
}

/// A topic partition.
type Tp = (String, i32);
/// Topic → its partitions' leader broker ids, or the topic's error code from Metadata.
type Leaders = BTreeMap<String, Result<BTreeMap<i32, i32>, i16>>;

/// An error code a broker answered with, and its message if it sent one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BrokerError {
    code: i16,
    message: Option<String>,
}

impl BrokerError {
    fn code(code: i16) -> BrokerError {
        BrokerError {
            code,
            message: None,
        }
    }

    fn describe(&self, what: impl std::fmt::Display) -> String {
        describe_error(
            self.code,
            self.message.as_deref().map(str_bytes).as_ref(),
            what,
        )
    }
}

fn is_coordinator_error(code: i16) -> bool {
    [
        ResponseError::NotCoordinator,
        ResponseError::CoordinatorNotAvailable,
        ResponseError::CoordinatorLoadInProgress,
    ]
    .iter()
    .any(|e| e.code() == code)
}

/// What DescribeGroups says about a group.
#[derive(Debug)]
struct GroupDescription {
    state: String,
    protocol_type: String,
    protocol: String,
    members: Vec<MemberDescription>,
}

impl GroupDescription {
    /// A group the coordinator does not know: Kafka answers state `Dead` without an error.
    fn is_dead(&self) -> bool {
        self.state == "Dead"
    }
}

#[derive(Debug)]
struct MemberDescription {
    id: String,
    instance_id: Option<String>,
    client_id: String,
    host: String,
    assignment: Assignment,
}

/// A consumer-protocol group by ConsumerGroupDescribe, or `None` if the coordinator knows no
/// such group.
fn describe_consumer_group(
    client: &mut Client,
    group: &str,
) -> anyhow::Result<Option<GroupDescription>> {
    let version = client.version(ApiKey::ConsumerGroupDescribe)?;
    let request = ConsumerGroupDescribeRequest::default()
        .with_group_ids(vec![GroupId(str_bytes(group))])
        .with_include_authorized_operations(false);
    let response = client.send_at(&request, version)?;
    let Some(g) = response
        .groups
        .into_iter()
        .find(|g| g.group_id.0.as_str() == group && g.error_code == 0)
    else {
        return Ok(None);
    };
    let members = g
        .members
        .into_iter()
        .map(|m| MemberDescription {
            id: m.member_id.to_string(),
            instance_id: m.instance_id.map(|i| i.to_string()),
            client_id: m.client_id.to_string(),
            host: m.client_host.to_string(),
            assignment: Assignment::Partitions(
                m.assignment
                    .topic_partitions
                    .into_iter()
                    .map(|t| (t.topic_name.0.to_string(), t.partitions))
                    .collect(),
            ),
        })
        .collect();
    Ok(Some(GroupDescription {
        state: g.group_state.to_string(),
        protocol_type: CONSUMER_PROTOCOL_TYPE.to_string(),
        protocol: g.assignor_name.to_string(),
        members,
    }))
}

/// A member's assignment as far as this tool understands it.
#[derive(Debug, PartialEq, Eq)]
enum Assignment {
    /// A consumer's topics and partitions, in the order the assignor gave them.
    Partitions(Vec<(String, Vec<i32>)>),
    /// The group is not a consumer group; its assignments are opaque bytes.
    Opaque(usize),
    /// A consumer assignment that does not decode.
    Invalid(String),
}

/// Reads a ConsumerProtocolAssignment: a version (i16), then the topics (array of a string and
/// an array of i32 partitions) and the user data (nullable bytes). Versions 0 to 3 have exactly
/// these fields; a later version may only add fields after them, so it is read the same way, as
/// Kafka's `ConsumerProtocol` does. Empty bytes are a member without an assignment (not synced
/// yet).
fn decode_assignment(bytes: &[u8]) -> Result<Vec<(String, Vec<i32>)>, String> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let mut r = Reader { bytes, at: 0 };
    let version = r.i16()?;
    if version < 0 {
        return Err(format!("version {version}"));
    }
    let topic_count = r.array_len(4)?;
    let mut topics = Vec::with_capacity(topic_count);
    for _ in 0..topic_count {
        let topic = r.string()?;
        let partition_count = r.array_len(4)?;
        let mut partitions = Vec::with_capacity(partition_count);
        for _ in 0..partition_count {
            partitions.push(r.i32()?);
        }
        topics.push((topic, partitions));
    }
    // User data: nullable bytes, not shown.
    let user_data = r.i32()?;
    if user_data > 0 {
        r.take(user_data as usize)?;
    }
    Ok(topics)
}

/// A bounds-checked big-endian reader for the consumer protocol's non-flexible encoding.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                format!(
                    "truncated: {n} bytes wanted at byte {} of {}",
                    self.at,
                    self.bytes.len()
                )
            })?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn i16(&mut self) -> Result<i16, String> {
        Ok(i16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    /// An array length, checked against the bytes left (each element is at least
    /// `element_bytes_min` long) so that a bad length cannot ask for a huge allocation.
    fn array_len(&mut self, element_bytes_min: usize) -> Result<usize, String> {
        let n = self.i32()?;
        if n < 0 {
            return Err(format!("array length {n} at byte {}", self.at - 4));
        }
        let n = n as usize;
        if n.saturating_mul(element_bytes_min) > self.bytes.len() - self.at {
            return Err(format!(
                "array of {n} elements at byte {} does not fit in {} bytes",
                self.at - 4,
                self.bytes.len()
            ));
        }
        Ok(n)
    }

    fn string(&mut self) -> Result<String, String> {
        let len = self.i16()?;
        if len < 0 {
            return Err(format!("null string at byte {}", self.at - 2));
        }
        let bytes = self.take(len as usize)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| "a topic name is not UTF-8".to_string())
    }
}

/// `events:0,1,2;logs:0`, or `-` for nothing assigned.
fn format_assignment(assignment: &Assignment) -> String {
    match assignment {
        Assignment::Partitions(topics) if topics.iter().all(|(_, ps)| ps.is_empty()) => "-".into(),
        Assignment::Partitions(topics) => topics
            .iter()
            .filter(|(_, ps)| !ps.is_empty())
            .map(|(t, ps)| {
                let ps: Vec<String> = ps.iter().map(|p| p.to_string()).collect();
                format!("{t}:{}", ps.join(","))
            })
            .collect::<Vec<_>>()
            .join(";"),
        Assignment::Opaque(n) => format!("({n}-byte)"),
        Assignment::Invalid(_) => "(invalid)".into(),
    }
}

/// Connections to the cluster and what is known of its group coordinators.
struct Admin {
    cluster: Cluster,
    /// Group id → the broker id of its coordinator.
    coordinators: BTreeMap<String, i32>,
    /// Whether Metadata has told `cluster` the brokers' addresses.
    brokers_known: bool,
}

impl Admin {
    fn learn_brokers(&mut self) -> anyhow::Result<()> {
        if !self.brokers_known {
            self.cluster.metadata(Some(&[]), false)?;
            self.brokers_known = true;
        }
        Ok(())
    }

    /// The broker id of `group`'s coordinator, or the error FindCoordinator answered.
    fn find_coordinator(&mut self, group: &str) -> anyhow::Result<Result<i32, BrokerError>> {
        if let Some(&id) = self.coordinators.get(group) {
            return Ok(Ok(id));
        }
        let client = self.cluster.any();
        let version = client.version(ApiKey::FindCoordinator)?;
        let mut request = FindCoordinatorRequest::default();
        if version >= 4 {
            request.coordinator_keys = vec![str_bytes(group)];
        } else {
            request.key = str_bytes(group);
        }
        if version >= 1 {
            request.key_type = KEY_TYPE_GROUP;
        }
        let response = client.send_at(&request, version)?;
        let (code, message, node) = if version >= 4 {
            let c = response
                .coordinators
                .iter()
                .find(|c| c.key.as_str() == group)
                .ok_or_else(|| {
                    anyhow!("the FindCoordinator response does not mention group {group:?}")
                })?;
            (c.error_code, c.error_message.clone(), c.node_id.0)
        } else {
            (
                response.error_code,
                response.error_message.clone(),
                response.node_id.0,
            )
        };
        if code != 0 {
            return Ok(Err(BrokerError {
                code,
                message: message.map(|m| m.to_string()),
            }));
        }
        self.coordinators.insert(group.to_string(), node);
        Ok(Ok(node))
    }

    /// Runs `request` on the coordinator of `group`. `request` answers `Err` with a group-level
    /// error code; a coordinator that moved or is loading is looked up again and asked again,
    /// any other error is returned.
    fn on_coordinator<T>(
        &mut self,
        group: &str,
        mut request: impl FnMut(&mut Client) -> anyhow::Result<Result<T, BrokerError>>,
    ) -> anyhow::Result<Result<T, BrokerError>> {
        let mut attempt = 1;
        loop {
            let outcome = match self.find_coordinator(group)? {
                Err(e) => Err(e),
                Ok(node) => {
                    self.learn_brokers()?;
                    let client = self.cluster.broker(node)?;
                    request(client)?
                }
            };
            match outcome {
                Err(e) if is_coordinator_error(e.code) && attempt < COORDINATOR_ATTEMPTS_MAX => {
                    self.coordinators.remove(group);
                    // The cluster may have changed: learn the brokers again.
                    self.brokers_known = false;
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(RETRY_MS));
                }
                other => return Ok(other),
            }
        }
    }

    fn describe_group(&mut self, group: &str) -> anyhow::Result<GroupDescription> {
        let outcome = self.on_coordinator(group, |client| {
            let version = client.version(ApiKey::DescribeGroups)?;
            let request = DescribeGroupsRequest::default()
                .with_groups(vec![GroupId(str_bytes(group))])
                .with_include_authorized_operations(false);
            let response = client.send_at(&request, version)?;
            let Some(g) = response
                .groups
                .into_iter()
                .find(|g| g.group_id.0.as_str() == group)
            else {
                bail!("the DescribeGroups response does not mention group {group:?}");
            };
            if g.error_code != 0 {
                return Ok(Err(BrokerError {
                    code: g.error_code,
                    message: g.error_message.map(|m| m.to_string()),
                }));
            }
            if g.group_state.as_str() == "Dead"
                && client.version_of(ApiKey::ConsumerGroupDescribe).is_some()
            {
                // DescribeGroups describes classic groups only; a KIP-848 group is described
                // by ConsumerGroupDescribe, as kafka-consumer-groups does.
                if let Some(described) = describe_consumer_group(client, group)? {
                    return Ok(Ok(described));
                }
            }
            let consumer = g.protocol_type.as_str() == CONSUMER_PROTOCOL_TYPE;
            let members = g
                .members
                .into_iter()
                .map(|m| MemberDescription {
                    id: m.member_id.to_string(),
                    instance_id: m.group_instance_id.map(|i| i.to_string()),
                    client_id: m.client_id.to_string(),
                    host: m.client_host.to_string(),
                    assignment: if !consumer {
                        Assignment::Opaque(m.member_assignment.len())
                    } else {
                        match decode_assignment(&m.member_assignment) {
                            Ok(topics) => Assignment::Partitions(topics),
                            Err(e) => Assignment::Invalid(e),
                        }
                    },
                })
                .collect();
            Ok(Ok(GroupDescription {
                state: g.group_state.to_string(),
                protocol_type: g.protocol_type.to_string(),
                protocol: g.protocol_data.to_string(),
                members,
            }))
        })?;
        outcome.map_err(|e| anyhow!(e.describe(format!("describing group {group:?}"))))
    }

    /// The group's committed offsets: of `wanted` partitions, or of every partition it has one
    /// for. Partitions without a committed offset are left out.
    fn committed(
        &mut self,
        group: &str,
        wanted: Option<&BTreeMap<String, Vec<i32>>>,
    ) -> anyhow::Result<BTreeMap<Tp, i64>> {
        let outcome = self.on_coordinator(group, |client| {
            let version = client.version(ApiKey::OffsetFetch)?;
            let mut request = OffsetFetchRequest::default();
            // (topic, partition, offset, error) as answered, whatever the version.
            let mut answered: Vec<(String, i32, i64, i16)> = Vec::new();
            if version >= 8 {
                request.groups = vec![OffsetFetchRequestGroup::default()
                    .with_group_id(GroupId(str_bytes(group)))
                    .with_topics(wanted.map(|w| {
                        w.iter()
                            .map(|(t, ps)| {
                                OffsetFetchRequestTopics::default()
                                    .with_name(topic_name(t))
                                    .with_partition_indexes(ps.clone())
                            })
                            .collect()
                    }))];
                let response = client.send_at(&request, version)?;
                let Some(g) = response
                    .groups
                    .into_iter()
                    .find(|g| g.group_id.0.as_str() == group)
                else {
                    bail!("the OffsetFetch response does not mention group {group:?}");
                };
                if g.error_code != 0 {
                    return Ok(Err(BrokerError::code(g.error_code)));
                }
                for t in g.topics {
                    for p in t.partitions {
                        answered.push((
                            t.name.0.to_string(),
                            p.partition_index,
                            p.committed_offset,
                            p.error_code,
                        ));
                    }
                }
            } else {
                request.group_id = GroupId(str_bytes(group));
                request.topics = wanted.map(|w| {
                    w.iter()
                        .map(|(t, ps)| {
                            OffsetFetchRequestTopic::default()
                                .with_name(topic_name(t))
                                .with_partition_indexes(ps.clone())
                        })
                        .collect()
                });
                let response = client.send_at(&request, version)?;
                if response.error_code != 0 {
                    return Ok(Err(BrokerError::code(response.error_code)));
                }
                for t in response.topics {
                    for p in t.partitions {
                        answered.push((
                            t.name.0.to_string(),
                            p.partition_index,
                            p.committed_offset,
                            p.error_code,
                        ));
                    }
                }
            }
            let mut offsets = BTreeMap::new();
            for (topic, partition, offset, code) in answered {
                if code != 0 {
                    if is_coordinator_error(code) {
                        return Ok(Err(BrokerError::code(code)));
                    }
                    bail!(describe_error(
                        code,
                        None,
                        format!("fetching the committed offset of group {group:?} for {topic}-{partition}")
                    ));
                }
                if offset >= 0 {
                    offsets.insert((topic, partition), offset);
                }
            }
            Ok(Ok(offsets))
        })?;
        outcome.map_err(|e| {
            anyhow!(e.describe(format!("fetching the committed offsets of group {group:?}")))
        })
    }

    /// Partition → leader broker id of `topics`, or the topic's error.
    fn leaders(&mut self, topics: &[&str]) -> anyhow::Result<Leaders> {
        if topics.is_empty() {
            return Ok(BTreeMap::new());
        }
        let response = self.cluster.metadata(Some(topics), false)?;
        self.brokers_known = true;
        let mut leaders = BTreeMap::new();
        for &name in topics {
            let found = response
                .topics
                .iter()
                .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == name));
            let entry = match found {
                None => Err(ResponseError::UnknownTopicOrPartition.code()),
                Some(t) if t.error_code != 0 => Err(t.error_code),
                Some(t) => Ok(t
                    .partitions
                    .iter()
                    .map(|p| (p.partition_index, p.leader_id.0))
                    .collect()),
            };
            leaders.insert(name.to_string(), entry);
        }
        Ok(leaders)
    }

    /// ListOffsets at `timestamp` (or `LATEST`, `EARLIEST`) for `partitions`, from each leader;
    /// per partition the offset (-1: no record at or after the timestamp) or the error code.
    fn list_offsets(
        &mut self,
        leaders: &Leaders,
        partitions: &BTreeSet<Tp>,
        timestamp: i64,
    ) -> anyhow::Result<BTreeMap<Tp, Result<i64, i16>>> {
        let mut results = BTreeMap::new();
        let mut by_leader: BTreeMap<i32, BTreeMap<&str, Vec<i32>>> = BTreeMap::new();
        for (topic, p) in partitions {
            let leader = match leaders.get(topic) {
                None => Err(ResponseError::UnknownTopicOrPartition.code()),
                Some(Err(code)) => Err(*code),
                Some(Ok(ps)) => match ps.get(p) {
                    None => Err(ResponseError::UnknownTopicOrPartition.code()),
                    Some(&l) if l < 0 => Err(ResponseError::LeaderNotAvailable.code()),
                    Some(&l) => Ok(l),
                },
            };
            match leader {
                Ok(l) => by_leader
                    .entry(l)
                    .or_default()
                    .entry(topic.as_str())
                    .or_default()
                    .push(*p),
                Err(code) => {
                    results.insert((topic.clone(), *p), Err(code));
                }
            }
        }
        for (leader, topics) in by_leader {
            let request = ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_topics(
                    topics
                        .iter()
                        .map(|(t, ps)| {
                            ListOffsetsTopic::default()
                                .with_name(topic_name(t))
                                .with_partitions(
                                    ps.iter()
                                        .map(|&p| {
                                            ListOffsetsPartition::default()
                                                .with_partition_index(p)
                                                .with_current_leader_epoch(-1)
                                                .with_timestamp(timestamp)
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                );
            let (response, _) = self.cluster.broker(leader)?.send(&request)?;
            for (t, ps) in &topics {
                for &p in ps {
                    let answer = response
                        .topics
                        .iter()
                        .filter(|rt| rt.name.0.as_str() == *t)
                        .flat_map(|rt| rt.partitions.iter())
                        .find(|r| r.partition_index == p)
                        .ok_or_else(|| {
                            anyhow!("the ListOffsets response does not mention {t}-{p}")
                        })?;
                    let result = if answer.error_code != 0 {
                        Err(answer.error_code)
                    } else {
                        Ok(answer.offset)
                    };
                    results.insert((t.to_string(), p), result);
                }
            }
        }
        Ok(results)
    }
}

/// Prints rows under a header, each column as wide as its widest cell plus two spaces.
pub(super) fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    for line in table(headers, rows) {
        println!("{line}");
    }
}

fn table(headers: &[&str], rows: &[Vec<String>]) -> Vec<String> {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            text.push_str(cell);
            if i + 1 < cells.len() {
                let pad = widths[i] + 2 - cell.chars().count();
                text.extend(std::iter::repeat_n(' ', pad));
            }
        }
        text
    };
    let mut lines = vec![line(headers.to_vec())];
    lines.extend(
        rows.iter()
            .map(|r| line(r.iter().map(String::as_str).collect())),
    );
    lines
}

fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

/// Group id → (state, protocol type) of the groups every broker (or only broker `only`)
/// coordinates: each broker lists its own.
fn list_groups(
    admin: &mut Admin,
    only: Option<i32>,
) -> anyhow::Result<BTreeMap<String, (Option<String>, String)>> {
    let response = admin.cluster.metadata(Some(&[]), false)?;
    admin.brokers_known = true;
    let mut broker_ids: Vec<i32> = response
        .brokers
        .iter()
        .map(|b| b.node_id.0)
        .filter(|id| only.is_none_or(|o| o == *id))
        .collect();
    broker_ids.sort_unstable();
    let mut groups: BTreeMap<String, (Option<String>, String)> = BTreeMap::new();
    for id in broker_ids {
        let client = admin.cluster.broker(id)?;
        let version = client.version(ApiKey::ListGroups)?;
        let response = client.send_at(&ListGroupsRequest::default(), version)?;
        if response.error_code != 0 {
            bail!(describe_error(
                response.error_code,
                None,
                format!("listing the groups of broker {id}")
            ));
        }
        for g in response.groups {
            let state = (version >= 4).then(|| g.group_state.to_string());
            groups.insert(
                g.group_id.0.to_string(),
                (state, g.protocol_type.to_string()),
            );
        }
    }
    Ok(groups)
}

/// The lag of every committed partition of the groups every broker (or only broker `only`)
/// coordinates: (group, topic, partition, log end offset minus committed offset). Partitions
/// whose log end cannot be read now (no leader) are left out.
pub fn group_lags(
    bootstrap: &str,
    only: Option<i32>,
) -> anyhow::Result<Vec<(String, String, i32, i64)>> {
    let client = Client::bootstrap(bootstrap)?;
    let mut admin = Admin {
        cluster: Cluster::new(client),
        coordinators: BTreeMap::new(),
        brokers_known: false,
    };
    let groups = list_groups(&mut admin, only)?;
    let mut committed: BTreeMap<String, BTreeMap<Tp, i64>> = BTreeMap::new();
    for group in groups.keys() {
        committed.insert(group.clone(), admin.committed(group, None)?);
    }
    let partitions: BTreeSet<Tp> = committed.values().flat_map(|c| c.keys().cloned()).collect();
    let topics: BTreeSet<&str> = partitions.iter().map(|(t, _)| t.as_str()).collect();
    let topics: Vec<&str> = topics.into_iter().collect();
    let leaders = admin.leaders(&topics)?;
    let ends = admin.list_offsets(&leaders, &partitions, LATEST)?;
    let mut lags = Vec::new();
    for (group, offsets) in committed {
        for ((topic, partition), offset) in offsets {
            if let Some(Ok(end)) = ends.get(&(topic.clone(), partition)) {
                lags.push((group.clone(), topic, partition, (end - offset).max(0)));
            }
        }
    }
    Ok(lags)
}

fn list(admin: &mut Admin, states: &[String]) -> anyhow::Result<()> {
    let mut groups = list_groups(admin, None)?;
    if !states.is_empty() {
        if groups.values().any(|(s, _)| s.is_none()) {
            bail!("--state needs ListGroups v4 or later, which reports group states; the broker does not support it");
        }
        groups.retain(|_, (s, _)| {
            let s = s.as_deref().unwrap_or_default();
            states.iter().any(|w| w.eq_ignore_ascii_case(s))
        });
    }
    if groups.is_empty() {
        eprintln!("No groups.");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = groups
        .into_iter()
        .map(|(id, (state, protocol_type))| {
            vec![
                id,
                state.unwrap_or_else(|| "-".into()),
                or_dash(&protocol_type),
            ]
        })
        .collect();
    print_table(&["GROUP", "STATE", "PROTOCOL-TYPE"], &rows);
    Ok(())
}

/// A share group member: id, client id, host, assignment by topic.
type ShareMember = (String, String, String, Vec<(String, Vec<i32>)>);

/// A share group (KIP-932) as ShareGroupDescribe and DescribeShareGroupOffsets tell it.
struct ShareDescription {
    state: String,
    epoch: i32,
    members: Vec<ShareMember>,
    /// Each partition's share-partition start offset (-1: not read yet), or its error.
    start_offsets: BTreeMap<Tp, Result<i64, BrokerError>>,
}

impl Admin {
    /// The share group `group`, or `None` when it is not one (or the cluster has none).
    fn describe_share_group(&mut self, group: &str) -> anyhow::Result<Option<ShareDescription>> {
        use kafka_protocol::messages::{
            DescribeShareGroupOffsetsRequest, ShareGroupDescribeRequest,
        };
        let outcome = self.on_coordinator(group, |client| {
            let Some(version) = client.version_of(ApiKey::ShareGroupDescribe) else {
                return Ok(Ok(None));
            };
            let request =
                ShareGroupDescribeRequest::default().with_group_ids(vec![GroupId(str_bytes(group))]);
            let response = client.send_at(&request, version)?;
            let Some(g) = response.groups.into_iter().next() else {
                bail!("the ShareGroupDescribe response does not mention group {group:?}");
            };
            if g.error_code == ResponseError::GroupIdNotFound.code() {
                return Ok(Ok(None));
            }
            if g.error_code != 0 {
                return Ok(Err(BrokerError {
                    code: g.error_code,
                    message: g.error_message.map(|m| m.to_string()),
                }));
            }
            let members = g
                .members
                .into_iter()
                .map(|m| {
                    let assignment = m
                        .assignment
                        .topic_partitions
                        .into_iter()
                        .map(|t| (t.topic_name.0.to_string(), t.partitions))
                        .collect();
                    (
                        m.member_id.to_string(),
                        m.client_id.to_string(),
                        m.client_host.to_string(),
                        assignment,
                    )
                })
                .collect();
            let mut start_offsets = BTreeMap::new();
            if let Some(version) = client.version_of(ApiKey::DescribeShareGroupOffsets) {
                let request = DescribeShareGroupOffsetsRequest::default().with_groups(vec![
                    kafka_protocol::messages::describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup::default()
                        .with_group_id(GroupId(str_bytes(group)))
                        .with_topics(None),
                ]);
                let response = client.send_at(&request, version)?;
                for g in response.groups {
                    for t in g.topics {
                        for p in t.partitions {
                            let tp = (t.topic_name.0.to_string(), p.partition_index);
                            let value = if p.error_code == 0 {
                                Ok(p.start_offset)
                            } else {
                                Err(BrokerError {
                                    code: p.error_code,
                                    message: p.error_message.map(|m| m.to_string()),
                                })
                            };
                            start_offsets.insert(tp, value);
                        }
                    }
                }
            }
            Ok(Ok(Some(ShareDescription {
                state: g.group_state.to_string(),
                epoch: g.group_epoch,
                members,
                start_offsets,
            })))
        })?;
        outcome.map_err(|e| anyhow!(e.describe(format!("describing share group {group:?}"))))
    }
}

/// `describe` for a share group: its members and their assignments, and per partition the
/// share-partition start offset, the log end offset and the backlog between them: records not
/// delivered yet, in flight, or acknowledged beyond one still in flight (so at least what Kafka
/// calls the share lag).
fn describe_share(admin: &mut Admin, group: &str, share: ShareDescription) -> anyhow::Result<()> {
    println!("Group: {group}");
    println!("Type: share");
    println!("State: {}", share.state);
    println!("Group epoch: {}", share.epoch);
    println!("Members: {}", share.members.len());
    if !share.members.is_empty() {
        println!();
        let rows: Vec<Vec<String>> = share
            .members
            .iter()
            .map(|(id, client, host, assignment)| {
                let assigned: Vec<String> = assignment
                    .iter()
                    .map(|(t, ps)| {
                        let ps: Vec<String> = ps.iter().map(|p| p.to_string()).collect();
                        format!("{t}:{}", ps.join(","))
                    })
                    .collect();
                vec![
                    id.clone(),
                    or_dash(client),
                    or_dash(host),
                    or_dash(&assigned.join(" ")),
                ]
            })
            .collect();
        print_table(&["MEMBER-ID", "CLIENT-ID", "HOST", "ASSIGNMENT"], &rows);
    }
    let partitions: BTreeSet<Tp> = share.start_offsets.keys().cloned().collect();
    if partitions.is_empty() {
        eprintln!("note: share group {group} has read no partition yet");
        return Ok(());
    }
    let topics: BTreeSet<&str> = partitions.iter().map(|(t, _)| t.as_str()).collect();
    let topics: Vec<&str> = topics.into_iter().collect();
    let leaders = admin.leaders(&topics)?;
    let ends = admin.list_offsets(&leaders, &partitions, LATEST)?;
    println!();
    let rows: Vec<Vec<String>> = partitions
        .iter()
        .map(|tp| {
            let end = match ends.get(tp) {
                Some(Ok(o)) => Some(*o),
                _ => None,
            };
            let (start, backlog) = match &share.start_offsets[tp] {
                Ok(start) if *start >= 0 => (
                    start.to_string(),
                    end.map_or("-".into(), |e| (e - start).max(0).to_string()),
                ),
                Ok(_) => ("-".into(), "-".into()),
                Err(e) => (error_name(e.code).to_string(), "-".into()),
            };
            vec![
                tp.0.clone(),
                tp.1.to_string(),
                start,
                end.map_or("-".into(), |e| e.to_string()),
                backlog,
            ]
        })
        .collect();
    print_table(
        &[
            "TOPIC",
            "PARTITION",
            "START-OFFSET",
            "LOG-END-OFFSET",
            "BACKLOG",
        ],
        &rows,
    );
    Ok(())
}

fn describe(admin: &mut Admin, group: &str) -> anyhow::Result<()> {
    if let Some(share) = admin.describe_share_group(group)? {
        return describe_share(admin, group, share);
    }
    let description = admin.describe_group(group)?;
    if description.is_dead() {
        bail!(
            "{}: the coordinator knows no such group (state Dead)",
            describe_error(
                ResponseError::GroupIdNotFound.code(),
                None,
                format!("group {group:?}")
            )
        );
    }
    let committed = admin.committed(group, None)?;

    // Who owns which partition, from the members' assignments.
    let mut members = description.members;
    members.sort_by(|a, b| a.id.cmp(&b.id));
    let mut owners: BTreeMap<Tp, usize> = BTreeMap::new();
    for (i, m) in members.iter().enumerate() {
        match &m.assignment {
            Assignment::Partitions(topics) => {
                for (t, ps) in topics {
                    for &p in ps {
                        owners.insert((t.clone(), p), i);
                    }
                }
            }
            Assignment::Opaque(_) => {}
            Assignment::Invalid(e) => eprintln!(
                "note: the assignment of member {} does not decode as a consumer assignment: {e}",
                m.id
            ),
        }
    }
    let partitions: BTreeSet<Tp> = committed.keys().chain(owners.keys()).cloned().collect();
    let topics: BTreeSet<&str> = partitions.iter().map(|(t, _)| t.as_str()).collect();
    let topics: Vec<&str> = topics.into_iter().collect();
    let leaders = admin.leaders(&topics)?;
    let ends = admin.list_offsets(&leaders, &partitions, LATEST)?;

    println!("Group: {group}");
    println!("State: {}", description.state);
    println!("Protocol type: {}", or_dash(&description.protocol_type));
    println!("Protocol: {}", or_dash(&description.protocol));
    println!("Members: {}", members.len());
    if !members.is_empty() {
        println!();
        let rows: Vec<Vec<String>> = members
            .iter()
            .map(|m| {
                vec![
                    m.id.clone(),
                    m.instance_id.clone().unwrap_or_else(|| "-".into()),
                    or_dash(&m.client_id),
                    or_dash(&m.host),
                    format_assignment(&m.assignment),
                ]
            })
            .collect();
        print_table(
            &[
                "MEMBER-ID",
                "INSTANCE-ID",
                "CLIENT-ID",
                "HOST",
                "ASSIGNMENT",
            ],
            &rows,
        );
    }
    if partitions.is_empty() {
        eprintln!("note: group {group} has no committed offsets and no assigned partitions");
        return Ok(());
    }
    println!();
    let mut rows = Vec::new();
    for tp in &partitions {
        let current = committed.get(tp).copied();
        let end = match ends.get(tp) {
            Some(Ok(o)) => Some(*o),
            Some(Err(code)) => {
                eprintln!(
                    "note: no log end offset for {}-{}: {}",
                    tp.0,
                    tp.1,
                    error_name(*code)
                );
                None
            }
            None => None,
        };
        let lag = match (current, end) {
            (Some(c), Some(e)) => (e - c).to_string(),
            _ => "-".into(),
        };
        let owner = owners.get(tp).map(|&i| &members[i]);
        rows.push(vec![
            tp.0.clone(),
            tp.1.to_string(),
            current.map_or("-".into(), |c| c.to_string()),
            end.map_or("-".into(), |e| e.to_string()),
            lag,
            owner.map_or("-".into(), |m| m.id.clone()),
            owner.map_or("-".into(), |m| or_dash(&m.host)),
            owner.map_or("-".into(), |m| or_dash(&m.client_id)),
        ]);
    }
    print_table(
        &[
            "TOPIC",
            "PARTITION",
            "CURRENT-OFFSET",
            "LOG-END-OFFSET",
            "LAG",
            "MEMBER-ID",
            "HOST",
            "CLIENT-ID",
        ],
        &rows,
    );
    Ok(())
}

fn delete(admin: &mut Admin, group: &str) -> anyhow::Result<()> {
    let outcome = admin.on_coordinator(group, |client| {
        let version = client.version(ApiKey::DeleteGroups)?;
        let request =
            DeleteGroupsRequest::default().with_groups_names(vec![GroupId(str_bytes(group))]);
        let response = client.send_at(&request, version)?;
        let result = response
            .results
            .iter()
            .find(|r| r.group_id.0.as_str() == group)
            .ok_or_else(|| anyhow!("the DeleteGroups response does not mention group {group:?}"))?;
        Ok(match result.error_code {
            0 => Ok(()),
            code => Err(BrokerError::code(code)),
        })
    })?;
    if let Err(e) = outcome {
        let mut text = e.describe(format!("deleting group {group:?}"));
        if e.code == ResponseError::NonEmptyGroup.code() {
            // Say why, as far as DescribeGroups tells.
            match admin.describe_group(group) {
                Ok(d) if !d.members.is_empty() => text.push_str(&format!(
                    ": the group has {} (state {}); stop its consumers (or wait for their \
                     sessions to expire) and try again",
                    plural(d.members.len() as u64, "active member"),
                    d.state
                )),
                Ok(d) => text.push_str(&format!(
                    ": the group has no members but is in state {}, not Empty; try again \
                     once it is Empty",
                    d.state
                )),
                Err(_) => text.push_str(
                    ": the group has active members; stop its consumers (or wait for their \
                     sessions to expire) and try again",
                ),
            }
        }
        bail!(text);
    }
    println!("Deleted group {group}.");
    Ok(())
}

/// What is known of one partition when choosing its new offset.
#[derive(Clone, Copy, Debug)]
struct PartitionOffsets {
    current: Option<i64>,
    earliest: i64,
    latest: i64,
    /// For `--to-datetime`: the first offset at or after the timestamp, -1 for none.
    at_time: Option<i64>,
}

/// The new offset of one partition; `Err` when it cannot be chosen. A wanted offset outside
/// the log is moved to its nearest end, and the second value says so.
fn new_offset(target: Target, o: &PartitionOffsets) -> Result<(i64, Option<String>), String> {
    let clamp = |wanted: i64| {
        if wanted < o.earliest {
            (
                o.earliest,
                Some(format!(
                    "{wanted} is before the log start offset {}",
                    o.earliest
                )),
            )
        } else if wanted > o.latest {
            (
                o.latest,
                Some(format!("{wanted} is after the log end offset {}", o.latest)),
            )
        } else {
            (wanted, None)
        }
    };
    Ok(match target {
        Target::Earliest => (o.earliest, None),
        Target::Latest => (o.latest, None),
        Target::Offset(n) => clamp(n),
        Target::Datetime(_) => match o.at_time {
            Some(offset) if offset >= 0 => clamp(offset),
            _ => (o.latest, None),
        },
        Target::ShiftBy(n) => match o.current {
            None => return Err("there is no committed offset to shift".into()),
            Some(c) => clamp(c.saturating_add(n)),
        },
    })
}

fn reset_offsets(admin: &mut Admin, args: &ResetArgs) -> anyhow::Result<()> {
    let group = args.group.as_str();
    let target = args.target.target();
    if let Target::Datetime(ms) = target {
        if ms < 0 {
            bail!("--to-datetime {ms}: timestamps are milliseconds since the epoch, at least 0");
        }
    }
    let description = admin.describe_group(group)?;
    let active = description.members.len();

    // The partitions to reset.
    let mut partitions: BTreeSet<Tp> = BTreeSet::new();
    let committed_all;
    let leaders;
    if args.all_topics {
        committed_all = admin.committed(group, None)?;
        if committed_all.is_empty() {
            bail!("group {group} has no committed offsets; name the topics to reset with --topic");
        }
        partitions.extend(committed_all.keys().cloned());
        let topics: BTreeSet<&str> = partitions.iter().map(|(t, _)| t.as_str()).collect();
        leaders = admin.leaders(&topics.into_iter().collect::<Vec<_>>())?;
    } else {
        let topics: BTreeSet<&str> = args.topics.iter().map(|s| s.topic.as_str()).collect();
        leaders = admin.leaders(&topics.into_iter().collect::<Vec<_>>())?;
        for spec in &args.topics {
            let known = match &leaders[&spec.topic] {
                Ok(ps) => ps,
                Err(code) => bail!(describe_error(
                    *code,
                    None,
                    format!("topic {:?}", spec.topic)
                )),
            };
            match &spec.partitions {
                None => partitions.extend(known.keys().map(|&p| (spec.topic.clone(), p))),
                Some(ps) => {
                    for &p in ps {
                        if !known.contains_key(&p) {
                            bail!(
                                "topic {} has {}; there is no partition {p}",
                                spec.topic,
                                plural(known.len() as u64, "partition")
                            );
                        }
                        partitions.insert((spec.topic.clone(), p));
                    }
                }
            }
        }
        let mut wanted: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for (t, p) in &partitions {
            wanted.entry(t.clone()).or_default().push(*p);
        }
        committed_all = admin.committed(group, Some(&wanted))?;
    }

    let earliest = admin.list_offsets(&leaders, &partitions, EARLIEST)?;
    let latest = admin.list_offsets(&leaders, &partitions, LATEST)?;
    let at_time = match target {
        Target::Datetime(ms) => Some(admin.list_offsets(&leaders, &partitions, ms)?),
        _ => None,
    };
    let offset_of = |map: &BTreeMap<Tp, Result<i64, i16>>, tp: &Tp, what: &str| match map.get(tp) {
        Some(Ok(o)) => Ok(*o),
        Some(Err(code)) => Err(anyhow!(describe_error(
            *code,
            None,
            format!("listing the {what} offset of {}-{}", tp.0, tp.1)
        ))),
        None => Err(anyhow!("no {what} offset for {}-{}", tp.0, tp.1)),
    };
    let mut plan: Vec<(Tp, Option<i64>, i64)> = Vec::new();
    for tp in &partitions {
        let offsets = PartitionOffsets {
            current: committed_all.get(tp).copied(),
            earliest: offset_of(&earliest, tp, "earliest")?,
            latest: offset_of(&latest, tp, "latest")?,
            at_time: match &at_time {
                Some(found) => Some(offset_of(found, tp, "timestamp's")?),
                None => None,
            },
        };
        let (new, note) = new_offset(target, &offsets)
            .map_err(|e| anyhow!("{}-{} in group {group}: {e}", tp.0, tp.1))?;
        if let Some(note) = note {
            eprintln!("note: {}-{}: {note}; using {new}", tp.0, tp.1);
        }
        plan.push((tp.clone(), offsets.current, new));
    }

    if args.execute {
        commit(admin, group, &plan, active, &description.state)?;
    }
    let rows: Vec<Vec<String>> = plan
        .iter()
        .map(|((t, p), current, new)| {
            vec![
                t.clone(),
                p.to_string(),
                current.map_or("-".into(), |c| c.to_string()),
                new.to_string(),
            ]
        })
        .collect();
    print_table(
        &["TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"],
        &rows,
    );
    if args.execute {
        println!(
            "Committed new offsets of {} for group {group}.",
            plural(plan.len() as u64, "partition")
        );
    } else {
        eprintln!("Dry run: nothing was committed. Add --execute to commit these offsets.");
        if active > 0 {
            eprintln!(
                "note: group {group} has {} (state {}); offsets can only be reset while it has none",
                plural(active as u64, "active member"),
                description.state
            );
        }
    }
    Ok(())
}

/// Commits the plan with OffsetCommit outside group membership (generation -1, no member
/// id), which the coordinator accepts only while the group has no members.
fn commit(
    admin: &mut Admin,
    group: &str,
    plan: &[(Tp, Option<i64>, i64)],
    active: usize,
    state: &str,
) -> anyhow::Result<()> {
    let mut by_topic: BTreeMap<&str, Vec<(i32, i64)>> = BTreeMap::new();
    for ((t, p), _, new) in plan {
        by_topic.entry(t.as_str()).or_default().push((*p, *new));
    }
    let outcome = admin.on_coordinator(group, |client| {
        let version = client.version(ApiKey::OffsetCommit)?;
        let mut request = OffsetCommitRequest::default()
            .with_group_id(GroupId(str_bytes(group)))
            .with_generation_id_or_member_epoch(-1)
            .with_member_id(str_bytes(""))
            .with_topics(
                by_topic
                    .iter()
                    .map(|(t, ps)| {
                        OffsetCommitRequestTopic::default()
                            .with_name(topic_name(t))
                            .with_partitions(
                                ps.iter()
                                    .map(|&(p, offset)| {
                                        OffsetCommitRequestPartition::default()
                                            .with_partition_index(p)
                                            .with_committed_offset(offset)
                                            .with_committed_leader_epoch(-1)
                                            .with_committed_metadata(Some(str_bytes("")))
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            );
        if (2..=4).contains(&version) {
            request.retention_time_ms = -1;
        }
        let response = client.send_at(&request, version)?;
        let mut errors: BTreeMap<i16, Vec<String>> = BTreeMap::new();
        let mut answered = 0;
        for t in &response.topics {
            for p in &t.partitions {
                answered += 1;
                if p.error_code != 0 {
                    errors.entry(p.error_code).or_default().push(format!(
                        "{}-{}",
                        t.name.0.as_str(),
                        p.partition_index
                    ));
                }
            }
        }
        if answered != plan.len() {
            bail!(
                "the OffsetCommit response answers for {answered} partitions; {} were committed",
                plan.len()
            );
        }
        if let Some(&code) = errors.keys().find(|&&c| is_coordinator_error(c)) {
            return Ok(Err(BrokerError::code(code)));
        }
        Ok(Ok(errors))
    })?;
    let errors = match outcome {
        Ok(errors) => errors,
        Err(e) => BTreeMap::from([(
            e.code,
            plan.iter()
                .map(|((t, p), _, _)| format!("{t}-{p}"))
                .collect(),
        )]),
    };
    if errors.is_empty() {
        return Ok(());
    }
    let mut text = format!("committing offsets for group {group:?}:");
    for (code, partitions) in &errors {
        let which = if partitions.len() == plan.len() {
            format!("all {}", plural(plan.len() as u64, "partition"))
        } else {
            partitions.join(", ")
        };
        text.push_str(&format!(" {} ({code}) for {which};", error_name(*code)));
    }
    text.pop();
    if active > 0 {
        text.push_str(&format!(
            ": the group has {} (state {state}); offsets can only be reset while it has none, \
             so stop its consumers first",
            plural(active as u64, "active member")
        ));
    }
    bail!(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ConsumerProtocolAssignment as a Java consumer writes it.
    fn assignment(version: i16, topics: &[(&str, &[i32])], user_data: Option<&[u8]>) -> Vec<u8> {
        let mut b = version.to_be_bytes().to_vec();
        b.extend_from_slice(&(topics.len() as i32).to_be_bytes());
        for (t, ps) in topics {
            b.extend_from_slice(&(t.len() as i16).to_be_bytes());
            b.extend_from_slice(t.as_bytes());
            b.extend_from_slice(&(ps.len() as i32).to_be_bytes());
            for p in *ps {
                b.extend_from_slice(&p.to_be_bytes());
            }
        }
        match user_data {
            None => b.extend_from_slice(&(-1i32).to_be_bytes()),
            Some(d) => {
                b.extend_from_slice(&(d.len() as i32).to_be_bytes());
                b.extend_from_slice(d);
            }
        }
        b
    }

    #[test]
    fn consumer_assignments_decode_in_every_version() {
        for version in 0..=4 {
            let bytes = assignment(version, &[("events", &[2, 0]), ("logs", &[])], Some(b"u"));
            assert_eq!(
                decode_assignment(&bytes).unwrap(),
                vec![
                    ("events".to_string(), vec![2, 0]),
                    ("logs".to_string(), vec![])
                ],
                "version {version}"
            );
        }
        let bytes = assignment(1, &[("a", &[1])], None);
        assert_eq!(
            decode_assignment(&bytes).unwrap(),
            vec![("a".to_string(), vec![1])]
        );
        assert_eq!(decode_assignment(&[]).unwrap(), vec![]);
    }

    #[test]
    fn bad_assignments_are_errors_not_allocations() {
        let bytes = assignment(0, &[("events", &[0, 1])], None);
        for cut in 1..bytes.len() {
            assert!(decode_assignment(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        // A topic count far beyond the bytes present.
        let mut huge = 0i16.to_be_bytes().to_vec();
        huge.extend_from_slice(&i32::MAX.to_be_bytes());
        assert!(decode_assignment(&huge)
            .unwrap_err()
            .contains("does not fit"));
        let mut negative = 0i16.to_be_bytes().to_vec();
        negative.extend_from_slice(&(-5i32).to_be_bytes());
        assert!(decode_assignment(&negative).is_err());
    }

    #[test]
    fn assignments_print_compactly() {
        let a = Assignment::Partitions(vec![
            ("events".into(), vec![0, 1, 2]),
            ("empty".into(), vec![]),
            ("logs".into(), vec![4]),
        ]);
        assert_eq!(format_assignment(&a), "events:0,1,2;logs:4");
        assert_eq!(format_assignment(&Assignment::Partitions(vec![])), "-");
        assert_eq!(format_assignment(&Assignment::Opaque(12)), "(12-byte)");
    }

    #[test]
    fn topic_specs() {
        assert_eq!(
            parse_topic_spec("events").unwrap(),
            TopicSpec {
                topic: "events".into(),
                partitions: None
            }
        );
        assert_eq!(
            parse_topic_spec("events:2,0,2").unwrap(),
            TopicSpec {
                topic: "events".into(),
                partitions: Some(vec![0, 2])
            }
        );
        assert!(parse_topic_spec("events:").is_err());
        assert!(parse_topic_spec("events:a").is_err());
        assert!(parse_topic_spec("events:-1").is_err());
        assert!(parse_topic_spec(":1").is_err());
    }

    #[test]
    fn new_offsets_stay_within_the_log() {
        let o = PartitionOffsets {
            current: Some(50),
            earliest: 10,
            latest: 100,
            at_time: Some(70),
        };
        assert_eq!(new_offset(Target::Earliest, &o).unwrap(), (10, None));
        assert_eq!(new_offset(Target::Latest, &o).unwrap(), (100, None));
        assert_eq!(new_offset(Target::Offset(42), &o).unwrap(), (42, None));
        assert_eq!(new_offset(Target::Offset(5), &o).unwrap().0, 10);
        assert!(new_offset(Target::Offset(5), &o).unwrap().1.is_some());
        assert_eq!(new_offset(Target::Offset(500), &o).unwrap().0, 100);
        assert_eq!(new_offset(Target::Datetime(1), &o).unwrap(), (70, None));
        let none_after = PartitionOffsets {
            at_time: Some(-1),
            ..o
        };
        assert_eq!(
            new_offset(Target::Datetime(1), &none_after).unwrap(),
            (100, None)
        );
        assert_eq!(new_offset(Target::ShiftBy(-20), &o).unwrap(), (30, None));
        assert_eq!(new_offset(Target::ShiftBy(-45), &o).unwrap().0, 10);
        assert_eq!(new_offset(Target::ShiftBy(70), &o).unwrap().0, 100);
        let uncommitted = PartitionOffsets { current: None, ..o };
        assert!(new_offset(Target::ShiftBy(1), &uncommitted).is_err());
        assert_eq!(new_offset(Target::Earliest, &uncommitted).unwrap().0, 10);
    }

    #[test]
    fn tables_align_columns() {
        let lines = table(
            &["A", "LONG-HEADER", "C"],
            &[
                vec!["wide-cell".into(), "1".into(), "x".into()],
                vec!["b".into(), "22".into(), "yy".into()],
            ],
        );
        assert_eq!(
            lines,
            vec![
                "A          LONG-HEADER  C",
                "wide-cell  1            x",
                "b          22           yy",
            ]
        );
    }
}
