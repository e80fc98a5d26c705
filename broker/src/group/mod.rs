//! The classic consumer group coordinator (JoinGroup / SyncGroup / Heartbeat / LeaveGroup and
//! committed offsets), one per shard for the groups whose `__consumer_offsets` partition that
//! shard owns, as in Kafka.
//!
//! A group moves Empty → PreparingRebalance (members (re)join) → CompletingRebalance (the
//! leader computes assignments) → Stable (SyncGroup delivered them). The broker relays the
//! members' protocol metadata and the leader's assignments unchanged, so eager and cooperative
//! (incremental) assignors both work: nothing here revokes partitions on its own.
//!
//! A group is classic or, once a KIP-848 member joins, a consumer group (`consumer.rs`), whose
//! members may still speak the classic protocol: a classic group with members converts when a
//! `group.protocol=consumer` member joins it, and converts back when the last such member
//! leaves, as Kafka 4's `group.consumer.migration.policy` (default `bidirectional`) allows.
//!
//! The state and its transitions are I/O-free (`classic.rs`, `consumer.rs`): they take the time
//! and return the timers they need. The shard drives them (`shard/groups.rs`): it arms the
//! timers, appends commits to the group's `__consumer_offsets` partition (on every in-sync
//! replica before the commit is acknowledged) and loads the groups from that log. The leader of
//! that partition is the group's coordinator: a replica that becomes leader rebuilds its groups
//! from the log, one that stops being leader drops them (`Shard::on_offsets_leadership`), as
//! Kafka's coordinators move.
//! Offsets sent with a transaction (TxnOffsetCommit) are the producer's transactional batch in
//! that log, pending until the transaction's marker there applies or drops them; a load replays
//! both.
//! Group membership is in memory: after a restart or a move members get UNKNOWN_MEMBER_ID and
//! simply rejoin.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_channel::oneshot;
use kafka_protocol::ResponseError;

pub mod classic;
pub mod configs;
pub mod consumer;
pub mod consumer_protocol;
pub mod offsets_topic;
pub mod placement;
pub mod share;
pub mod streams;

pub use classic::{GroupEffect, Reply};

/// Members one group may have (Kafka's `group.max.size` defaults to unlimited; a bound is kept).
pub const GROUP_MEMBERS_MAX: usize = 10_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl GroupState {
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct JoinResult {
    pub error: i16,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// (member id, group instance id, metadata), for the leader only.
    pub members: Vec<(String, Option<String>, Bytes)>,
    /// KIP-814: a static leader that rejoined without a rebalance must not compute new
    /// assignments (JoinGroup v9+).
    pub skip_assignment: bool,
}

#[derive(Clone, Debug, Default)]
pub struct SyncResult {
    pub error: i16,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub assignment: Bytes,
}

pub struct Member {
    pub id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    pub protocols: Vec<(String, Bytes)>,
    pub assignment: Bytes,
    pub last_heartbeat: Instant,
    join_waiter: Option<oneshot::Sender<JoinResult>>,
    sync_waiter: Option<oneshot::Sender<SyncResult>>,
}

impl Member {
    /// This member's metadata for the group's chosen protocol (empty if it has none).
    pub fn metadata_for(&self, protocol: Option<&str>) -> Bytes {
        self.protocols
            .iter()
            .find(|(n, _)| Some(n.as_str()) == protocol)
            .map(|(_, md)| md.clone())
            .unwrap_or_default()
    }
}

#[derive(Clone, Debug)]
pub struct Committed {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
}

pub struct Group {
    pub id: String,
    pub state: GroupState,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub members: BTreeMap<String, Member>,
    /// Member ids handed out with MEMBER_ID_REQUIRED and not yet used (KIP-394).
    pending_members: Vec<String>,
    pub offsets: BTreeMap<(String, i32), Committed>,
    /// Offsets sent with a transaction (TxnOffsetCommit), by producer id: in the log, applied
    /// to `offsets` by the transaction's commit marker, dropped by its abort marker.
    pub pending_txn: BTreeMap<i64, BTreeMap<(String, i32), Committed>>,
    /// Bumped on every rebalance so a stale rebalance timer does nothing.
    rebalance_round: u64,
    /// While set, a new group waits for more members before completing its first join.
    initial_delay_until: Option<Instant>,
    /// Set when the group uses the KIP-848 consumer protocol.
    pub consumer: Option<consumer::ConsumerGroup>,
    /// Set when the group is a streams group (KIP-1071); it keeps its offsets here.
    pub streams: Option<streams::StreamsGroup>,
}

impl Group {
    pub fn new(id: &str) -> Group {
        Group {
            id: id.to_string(),
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            pending_members: Vec::new(),
            offsets: BTreeMap::new(),
            pending_txn: BTreeMap::new(),
            rebalance_round: 0,
            initial_delay_until: None,
            consumer: None,
            streams: None,
        }
    }

    /// Whether a transaction still open has offsets for `topic`-`partition` (OffsetFetch with
    /// `require_stable` then answers UNSTABLE_OFFSET_COMMIT, KIP-447).
    pub fn has_pending_txn_offset(&self, topic: &str, partition: i32) -> bool {
        let key = (topic.to_string(), partition);
        self.pending_txn.values().any(|o| o.contains_key(&key))
    }

    /// Ends producer `producer_id`'s transaction for this group: a commit applies its offsets,
    /// an abort drops them.
    fn complete_txn(&mut self, producer_id: i64, commit: bool) -> usize {
        let Some(pending) = self.pending_txn.remove(&producer_id) else {
            return 0;
        };
        let n = pending.len();
        if commit {
            self.offsets.extend(pending);
        }
        n
    }

    /// KIP-345: a request naming a static member's instance id under another member id comes
    /// from an instance that was replaced (a zombie) and is fenced.
    fn fenced(&self, member_id: &str, instance_id: Option<&str>) -> bool {
        let Some(instance) = instance_id else {
            return false;
        };
        self.members
            .values()
            .any(|m| m.instance_id.as_deref() == Some(instance) && m.id != member_id)
    }

    fn rebalance_timeout(&self) -> Duration {
        self.members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or(Duration::from_secs(1))
    }

    /// What the leader's JoinGroup response lists: every member with its metadata for the
    /// group's protocol.
    fn members_for_leader(&self) -> Vec<(String, Option<String>, Bytes)> {
        let protocol = self.protocol.as_deref();
        self.members
            .values()
            .map(|m| {
                (
                    m.id.clone(),
                    m.instance_id.clone(),
                    m.metadata_for(protocol),
                )
            })
            .collect()
    }

    /// Protocols every member supports, in the order of the first member's preference.
    fn select_protocol(&self) -> Option<String> {
        let first = self.members.values().next()?;
        first
            .protocols
            .iter()
            .map(|(name, _)| name)
            .find(|name| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(n, _)| n == *name))
            })
            .cloned()
    }
}

impl Group {
    /// The consumer-protocol group this group is, if it is one with members (Kafka's group type
    /// `consumer`); a classic group otherwise.
    pub fn consumer_members(&mut self) -> Option<&mut consumer::ConsumerGroup> {
        self.consumer.as_mut().filter(|c| !c.members.is_empty())
    }

    /// KIP-848's online upgrade: this classic group becomes a consumer group. Its members stay
    /// classic-protocol members with their subscriptions and the assignments of the current
    /// generation, which becomes the group epoch; members waiting in JoinGroup or SyncGroup are
    /// told REBALANCE_IN_PROGRESS and rejoin into the consumer group. Fails, changing nothing,
    /// if a member's embedded consumer protocol does not parse.
    fn convert_to_consumer(
        &mut self,
        topic_id: &dyn Fn(&str) -> Option<uuid::Uuid>,
    ) -> Result<(), String> {
        let protocol = self.protocol.clone();
        let mut converted = consumer::ConsumerGroup {
            epoch: self.generation,
            assignment_epoch: self.generation,
            assignor: "uniform".into(),
            ..Default::default()
        };
        for m in self.members.values() {
            let metadata = match protocol.as_deref() {
                Some(p) => m.metadata_for(Some(p)),
                None => m
                    .protocols
                    .first()
                    .map(|(_, md)| md.clone())
                    .unwrap_or_default(),
            };
            let subscription = consumer_protocol::decode_subscription(&metadata)
                .map_err(|e| format!("member {}: {e}", m.id))?;
            let assignment = consumer_protocol::decode_assignment(&m.assignment)
                .map_err(|e| format!("member {}: {e}", m.id))?;
            let assigned: std::collections::BTreeSet<consumer::Tp> = assignment
                .assigned_partitions
                .iter()
                .filter_map(|t| topic_id(t.topic.0.as_str()).map(|id| (id, t)))
                .flat_map(|(id, t)| t.partitions.iter().map(move |&p| (id, p)))
                .collect();
            converted.target.insert(m.id.clone(), assigned.clone());
            converted.members.insert(
                m.id.clone(),
                consumer::ConsumerMember {
                    id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    rack_id: subscription.rack_id.map(|r| r.to_string()),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    epoch: self.generation,
                    subscribed: {
                        let mut t: Vec<String> =
                            subscription.topics.iter().map(|t| t.to_string()).collect();
                        t.sort();
                        t.dedup();
                        t
                    },
                    assignor: None,
                    rebalance_timeout_ms: m.rebalance_timeout.as_millis() as i32,
                    owned: assigned.clone(),
                    assigned,
                    revoking: Default::default(),
                    last_heartbeat: m.last_heartbeat,
                    classic: Some(consumer::ClassicMember {
                        protocols: m.protocols.clone(),
                        session_timeout: m.session_timeout,
                    }),
                },
            );
        }
        for m in self.members.values_mut() {
            if let Some(w) = m.join_waiter.take() {
                let _ = w.send(JoinResult {
                    error: err(ResponseError::RebalanceInProgress),
                    member_id: m.id.clone(),
                    generation: -1,
                    ..Default::default()
                });
            }
            if let Some(w) = m.sync_waiter.take() {
                let _ = w.send(SyncResult {
                    error: err(ResponseError::RebalanceInProgress),
                    ..Default::default()
                });
            }
        }
        self.members.clear();
        self.pending_members.clear();
        self.state = GroupState::Empty;
        self.leader = None;
        self.protocol = None;
        // A rebalance timer of the classic group finds another round and does nothing.
        self.rebalance_round += 1;
        self.consumer = Some(converted);
        Ok(())
    }

    /// KIP-848's online downgrade: a consumer group whose members all speak the classic
    /// protocol becomes a classic group again, at its group epoch as the generation, each member
    /// keeping its assignment; the caller then starts a rebalance so that they rejoin.
    fn convert_to_classic(&mut self, topic_name: &dyn Fn(uuid::Uuid) -> Option<String>) {
        let Some(c) = self.consumer.take() else {
            return;
        };
        self.generation = c.epoch;
        self.protocol_type = Some(consumer_protocol::PROTOCOL_TYPE.to_string());
        self.members.clear();
        for m in c.members.into_values() {
            let Some(classic) = m.classic else {
                continue;
            };
            let mut by_topic: BTreeMap<String, Vec<i32>> = BTreeMap::new();
            for (id, p) in &m.assigned {
                if let Some(name) = topic_name(*id) {
                    by_topic.entry(name).or_default().push(*p);
                }
            }
            let version = classic
                .protocols
                .first()
                .map_or(0, |(_, md)| consumer_protocol::version(md));
            self.members.insert(
                m.id.clone(),
                Member {
                    id: m.id,
                    instance_id: m.instance_id,
                    client_id: m.client_id,
                    client_host: m.client_host,
                    session_timeout: classic.session_timeout,
                    rebalance_timeout: Duration::from_millis(m.rebalance_timeout_ms.max(0) as u64)
                        .max(classic.session_timeout),
                    protocols: classic.protocols,
                    assignment: consumer_protocol::encode_assignment(version, &by_topic),
                    last_heartbeat: Instant::now(),
                    join_waiter: None,
                    sync_waiter: None,
                },
            );
        }
        self.protocol = self.select_protocol();
        self.leader = self.members.keys().next().cloned();
        self.state = GroupState::Stable;
    }
}

#[derive(Default)]
pub struct GroupCoordinator {
    pub groups: RefCell<HashMap<String, Group>>,
    /// Share groups (KIP-932), in the same name space: an id is a classic or consumer group,
    /// or a share group, never both.
    pub share_groups: RefCell<HashMap<String, share::ShareGroup>>,
}

pub struct JoinRequest {
    pub group_id: String,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+: a new member first gets its id back with MEMBER_ID_REQUIRED.
    pub require_known_member_id: bool,
}

/// A SyncGroup, as the coordinator reads it.
pub struct SyncRequest<'a> {
    pub group_id: &'a str,
    pub member_id: &'a str,
    pub instance_id: Option<&'a str>,
    pub generation: i32,
    /// The leader's assignments, by member id (empty from the other members).
    pub assignments: Vec<(String, Bytes)>,
}

fn new_member_id(client_id: &str) -> String {
    format!(
        "{}-{}",
        if client_id.is_empty() {
            "member"
        } else {
            client_id
        },
        uuid::Uuid::new_v4()
    )
}

fn err(e: ResponseError) -> i16 {
    e.code()
}

/// A classic member's JoinGroup to a consumer group (Kafka's `classicGroupJoinToConsumerGroup`):
/// answered at once with the member's epoch as its generation and no leader, so the member
/// syncs as a follower and gets the assignment the coordinator computed.
fn classic_join_to_consumer_group(
    group: &mut Group,
    req: &JoinRequest,
    image: &crate::metadata::MetadataImage,
) -> JoinResult {
    let fail = |e: ResponseError, member_id: &str| JoinResult {
        error: err(e),
        member_id: member_id.to_string(),
        generation: -1,
        ..Default::default()
    };
    if req.protocol_type != consumer_protocol::PROTOCOL_TYPE {
        return fail(ResponseError::InconsistentGroupProtocol, &req.member_id);
    }
    let subscription = match consumer_protocol::decode_subscription(&req.protocols[0].1) {
        Ok(s) => s,
        Err(e) => {
            tracing::info!(group = %req.group_id, error = %e, "JoinGroup refused: malformed consumer protocol subscription");
            return fail(ResponseError::InconsistentGroupProtocol, &req.member_id);
        }
    };
    let c = group.consumer.as_mut().expect("a consumer group");
    let mut member_id = req.member_id.clone();
    if member_id.is_empty() {
        // A static member coming back under a new id takes its old identity's place.
        member_id = new_member_id(&req.client_id);
        if req.instance_id.is_none() && req.require_known_member_id {
            return fail(ResponseError::MemberIdRequired, &member_id);
        }
    } else if let Some(existing) = req.instance_id.as_deref().and_then(|i| c.static_member(i)) {
        if existing != member_id {
            return fail(ResponseError::FencedInstanceId, &req.member_id);
        }
    }
    if !c.members.contains_key(&member_id) && c.members.len() >= GROUP_MEMBERS_MAX {
        return fail(ResponseError::GroupMaxSizeReached, &member_id);
    }
    let owned = subscription
        .owned_partitions
        .iter()
        .filter_map(|t| image.topics.get(t.topic.0.as_str()).map(|m| (m.id, t)))
        .flat_map(|(id, t)| t.partitions.iter().map(move |&p| (id, p)))
        .collect();
    let protocol = req.protocols[0].0.clone();
    let before = c.epoch;
    let epoch = c.classic_join(
        consumer::ClassicJoin {
            member_id: member_id.clone(),
            instance_id: req.instance_id.clone(),
            rack_id: subscription.rack_id.map(|r| r.to_string()),
            client_id: req.client_id.clone(),
            client_host: req.client_host.clone(),
            rebalance_timeout_ms: req.rebalance_timeout_ms,
            subscribed: subscription.topics.iter().map(|t| t.to_string()).collect(),
            owned,
            classic: consumer::ClassicMember {
                protocols: req.protocols.clone(),
                session_timeout: Duration::from_millis(req.session_timeout_ms.max(0) as u64),
            },
        },
        &|t: &str| image.topics.get(t).map(|m| (m.id, m.shards.len() as i32)),
    );
    if c.epoch != before {
        tracing::info!(group = %group.id, epoch = c.epoch, members = c.members.len(), "consumer group epoch bumped by a classic member");
    }
    JoinResult {
        error: 0,
        generation: epoch,
        protocol_type: Some(consumer_protocol::PROTOCOL_TYPE.to_string()),
        protocol: Some(protocol),
        leader: String::new(),
        member_id,
        members: Vec::new(),
        skip_assignment: false,
    }
}
