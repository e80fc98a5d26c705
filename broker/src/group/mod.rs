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
//! Committed offsets are appended to the group's `__consumer_offsets` partition (on every
//! in-sync replica before the commit is acknowledged). The leader of that partition is the
//! group's coordinator: a replica that becomes leader rebuilds its groups from the log, one that
//! stops being leader drops them (`Shard::on_offsets_leadership`), as Kafka's coordinators move.
//! Offsets sent with a transaction (TxnOffsetCommit) are the producer's transactional batch in
//! that log, pending until the transaction's marker there applies or drops them; a load replays
//! both.
//! Group membership is in memory: after a restart or a move members get UNKNOWN_MEMBER_ID and
//! simply rejoin.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_channel::oneshot;
use kafka_protocol::ResponseError;
use sluice_engine::batch::{BatchBuilder, BatchHeader, NewRecord, Records, ATTR_TRANSACTIONAL};
use sluice_engine::Timestamp;

use crate::shard::Shard;

pub mod consumer;
pub mod consumer_protocol;
pub mod offsets_topic;
pub mod placement;

use offsets_topic::{CommitKey, CommitValue, OFFSETS_TOPIC};

/// How long a commit waits for the in-sync replicas of its offsets partition (Kafka's
/// `offsets.commit.timeout.ms` default).
const OFFSETS_COMMIT_TIMEOUT: Duration = Duration::from_secs(5);

/// Members one group may have (Kafka's `group.max.size` defaults to unlimited; a bound is kept).
pub const GROUP_MEMBERS_MAX: usize = 10_000;
/// How often expired sessions are looked for.
const SESSION_SWEEP_MS: u64 = 200;

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
}

impl Group {
    fn new(id: &str) -> Group {
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

impl Shard {
    /// Starts the session-expiry sweep of this shard's groups.
    pub fn start_group_timers(self: &Rc<Self>) {
        let shard = self.clone();
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(Duration::from_millis(SESSION_SWEEP_MS)).await;
                shard.expire_sessions();
            }
        })
        .detach();
    }

    fn expire_sessions(self: &Rc<Self>) {
        let now = Instant::now();
        let mut touched = Vec::new();
        {
            let mut groups = self.groups.groups.borrow_mut();
            for group in groups.values_mut() {
                let expired: Vec<String> = group
                    .members
                    .values()
                    // A member waiting in JoinGroup is bounded by the rebalance timeout instead.
                    .filter(|m| {
                        m.join_waiter.is_none()
                            && now.duration_since(m.last_heartbeat) > m.session_timeout
                    })
                    .map(|m| m.id.clone())
                    .collect();
                for id in expired {
                    tracing::info!(group = %group.id, member = %id, "member session expired");
                    group.members.remove(&id);
                    touched.push(group.id.clone());
                }
            }
        }
        for id in touched {
            self.membership_changed(&id);
        }
        let image = self.image();
        let partitions_of = |t: &str| image.topics.get(t).map(|m| (m.id, m.shards.len() as i32));
        let session_timeout =
            Duration::from_millis(self.config().group_consumer_session_timeout_ms);
        let downgrade = self.config().group_consumer_migration_policy.downgrade();
        let mut downgraded = Vec::new();
        for group in self.groups.groups.borrow_mut().values_mut() {
            let Some(c) = group.consumer.as_mut() else {
                continue;
            };
            let had_consumer_protocol = c.members.values().any(|m| m.classic.is_none());
            let expired = c.expire(now, session_timeout, &partitions_of);
            for id in &expired {
                tracing::info!(group = %group.id, member = %id, "consumer group member session expired");
            }
            if downgrade
                && had_consumer_protocol
                && !c.members.is_empty()
                && c.members.values().all(|m| m.classic.is_some())
            {
                group.convert_to_classic(&|id| image.topic_by_id(id).map(|t| t.name.clone()));
                tracing::info!(group = %group.id, generation = group.generation, "consumer group converted back to a classic group");
                downgraded.push(group.id.clone());
            }
        }
        for id in downgraded {
            self.prepare_rebalance(&id, false);
        }
    }

    /// KIP-848 ConsumerGroupHeartbeat on the coordinator shard. A classic group with members
    /// converts to a consumer group first (`group.consumer.migration.policy` allowing), and a
    /// consumer group whose last consumer-protocol member leaves converts back.
    pub fn consumer_heartbeat(
        self: &Rc<Self>,
        group_id: &str,
        req: consumer::HeartbeatRequest,
    ) -> consumer::HeartbeatResult {
        let image = self.image();
        let partitions_of = |t: &str| image.topics.get(t).map(|m| (m.id, m.shards.len() as i32));
        let policy = self.config().group_consumer_migration_policy;
        let mut groups = self.groups.groups.borrow_mut();
        let group = groups
            .entry(group_id.to_string())
            .or_insert_with(|| Group::new(group_id));
        if !group.members.is_empty() {
            let refuse = |why: &str| {
                tracing::info!(group = %group_id, reason = why, "consumer-protocol member refused by a classic group");
                consumer::HeartbeatResult {
                    error: ResponseError::GroupIdNotFound.code(),
                    message: Some(format!("group {group_id} is a classic group: {why}")),
                    ..Default::default()
                }
            };
            if !policy.upgrade() {
                return refuse("group.consumer.migration.policy does not allow upgrades");
            }
            if group.protocol_type.as_deref() != Some(consumer_protocol::PROTOCOL_TYPE) {
                return refuse("its protocol type is not consumer");
            }
            if let Err(e) = group.convert_to_consumer(&|t: &str| image.topics.get(t).map(|m| m.id))
            {
                tracing::warn!(group = %group_id, error = %e, "cannot convert the classic group to a consumer group");
                return refuse("a member's embedded consumer protocol is malformed");
            }
            tracing::info!(group = %group_id, epoch = group.generation, "classic group converted to a consumer group");
        }
        let c = group.consumer.get_or_insert_with(Default::default);
        // The last consumer-protocol member leaving a group of classic members.
        let downgrade = req.member_epoch < 0
            && policy.downgrade()
            && c.members
                .get(&req.member_id)
                .is_some_and(|m| m.classic.is_none())
            && c.only_classic_besides(&req.member_id);
        let before = c.epoch;
        let result = c.heartbeat(req, &partitions_of);
        if c.epoch != before {
            tracing::info!(group = %group_id, epoch = c.epoch, members = c.members.len(), "consumer group epoch bumped");
        }
        if downgrade {
            group.convert_to_classic(&|id| image.topic_by_id(id).map(|t| t.name.clone()));
            tracing::info!(group = %group_id, generation = group.generation, members = group.members.len(), "consumer group converted back to a classic group");
            drop(groups);
            self.prepare_rebalance(group_id, false);
        }
        result
    }

    /// After members left or expired: rebalance the rest, or empty the group.
    fn membership_changed(self: &Rc<Self>, group_id: &str) {
        let mut groups = self.groups.groups.borrow_mut();
        let Some(group) = groups.get_mut(group_id) else {
            return;
        };
        match group.state {
            GroupState::Stable | GroupState::CompletingRebalance => {
                drop(groups);
                self.prepare_rebalance(group_id, false);
                // With nobody left to rejoin, the group is Empty at once.
                self.maybe_complete_join(group_id, false);
            }
            GroupState::PreparingRebalance => {
                drop(groups);
                self.maybe_complete_join(group_id, false);
            }
            GroupState::Empty => {}
        }
    }

    fn prepare_rebalance(self: &Rc<Self>, group_id: &str, new_group: bool) {
        let (round, delay) = {
            let mut groups = self.groups.groups.borrow_mut();
            let Some(group) = groups.get_mut(group_id) else {
                return;
            };
            if group.state == GroupState::CompletingRebalance {
                // Members waiting in SyncGroup must rejoin.
                for m in group.members.values_mut() {
                    if let Some(w) = m.sync_waiter.take() {
                        let _ = w.send(SyncResult {
                            error: err(ResponseError::RebalanceInProgress),
                            ..Default::default()
                        });
                    }
                }
            }
            group.state = GroupState::PreparingRebalance;
            group.rebalance_round += 1;
            let delay = if new_group {
                let d = Duration::from_millis(self.config().group_initial_rebalance_delay_ms);
                group.initial_delay_until = Some(Instant::now() + d);
                d.min(group.rebalance_timeout())
            } else {
                group.rebalance_timeout()
            };
            (group.rebalance_round, delay)
        };
        let shard = self.clone();
        let id = group_id.to_string();
        glommio::spawn_local(async move {
            glommio::timer::sleep(delay).await;
            let current = shard
                .groups
                .groups
                .borrow()
                .get(&id)
                .map(|g| (g.rebalance_round, g.state));
            if current == Some((round, GroupState::PreparingRebalance)) {
                if let Some(g) = shard.groups.groups.borrow_mut().get_mut(&id) {
                    g.initial_delay_until = None;
                }
                shard.maybe_complete_join(&id, true);
            }
        })
        .detach();
    }

    /// Completes the join phase when every member has rejoined (or, with `deadline`, with
    /// whoever has).
    fn maybe_complete_join(self: &Rc<Self>, group_id: &str, deadline: bool) {
        let mut groups = self.groups.groups.borrow_mut();
        let Some(group) = groups.get_mut(group_id) else {
            return;
        };
        if group.state != GroupState::PreparingRebalance {
            return;
        }
        let all_joined = group.members.values().all(|m| m.join_waiter.is_some());
        let waiting_initial = group
            .initial_delay_until
            .is_some_and(|t| Instant::now() < t);
        if !deadline && (!all_joined || waiting_initial) {
            return;
        }
        // Members that did not rejoin in time are out.
        let gone: Vec<String> = group
            .members
            .values()
            .filter(|m| m.join_waiter.is_none())
            .map(|m| m.id.clone())
            .collect();
        for id in gone {
            tracing::info!(group = %group.id, member = %id, "member did not rejoin in time");
            group.members.remove(&id);
        }
        group.generation += 1;
        if group.members.is_empty() {
            group.state = GroupState::Empty;
            group.leader = None;
            group.protocol = None;
            return;
        }
        group.protocol = group.select_protocol();
        if group
            .leader
            .as_ref()
            .is_none_or(|l| !group.members.contains_key(l))
        {
            group.leader = group.members.keys().next().cloned();
        }
        group.state = GroupState::CompletingRebalance;
        let leader = group.leader.clone().unwrap_or_default();
        let protocol = group.protocol.clone();
        let all = group.members_for_leader();
        tracing::info!(group = %group.id, generation = group.generation, members = group.members.len(), protocol = ?protocol, "rebalance: join complete");
        let (generation, protocol_type) = (group.generation, group.protocol_type.clone());
        for m in group.members.values_mut() {
            m.last_heartbeat = Instant::now();
            if let Some(w) = m.join_waiter.take() {
                let _ = w.send(JoinResult {
                    error: 0,
                    generation,
                    protocol_type: protocol_type.clone(),
                    protocol: protocol.clone(),
                    leader: leader.clone(),
                    member_id: m.id.clone(),
                    members: if m.id == leader {
                        all.clone()
                    } else {
                        Vec::new()
                    },
                    skip_assignment: false,
                });
            }
        }
    }

    pub async fn join_group(self: &Rc<Self>, req: JoinRequest) -> JoinResult {
        let fail = |e: ResponseError, member_id: &str| JoinResult {
            error: err(e),
            member_id: member_id.to_string(),
            generation: -1,
            ..Default::default()
        };
        let config = self.config();
        let allowed = config.group_min_session_timeout_ms..=config.group_max_session_timeout_ms;
        if !allowed.contains(&(req.session_timeout_ms as i64)) {
            tracing::info!(group = %req.group_id, session_timeout_ms = req.session_timeout_ms, min = config.group_min_session_timeout_ms, max = config.group_max_session_timeout_ms, "JoinGroup refused: session timeout outside group.min/max.session.timeout.ms");
            return fail(ResponseError::InvalidSessionTimeout, &req.member_id);
        }
        if req.protocols.is_empty() || req.protocol_type.is_empty() {
            return fail(ResponseError::InconsistentGroupProtocol, &req.member_id);
        }
        let rx = {
            let mut groups = self.groups.groups.borrow_mut();
            let new_group = !groups.contains_key(&req.group_id);
            let group = groups
                .entry(req.group_id.clone())
                .or_insert_with(|| Group::new(&req.group_id));
            if group.consumer_members().is_some() {
                return classic_join_to_consumer_group(group, &req, &self.image());
            }
            // An empty consumer group becomes a classic one (its offsets stay).
            group.consumer = None;
            if !group.members.is_empty() {
                let type_ok = group.protocol_type.as_deref() == Some(req.protocol_type.as_str());
                let any_common = req.protocols.iter().any(|(n, _)| {
                    group
                        .members
                        .values()
                        .all(|m| m.protocols.iter().any(|(mn, _)| mn == n))
                });
                if !type_ok || !any_common {
                    return fail(ResponseError::InconsistentGroupProtocol, &req.member_id);
                }
            }
            let mut member_id = req.member_id.clone();
            if member_id.is_empty() {
                if let Some(instance) = &req.instance_id {
                    member_id = new_member_id(&req.client_id);
                    // KIP-345: a static member coming back (a restart, a new member id) takes
                    // over its old identity's place and assignment; the old id is fenced.
                    let old = group
                        .members
                        .values()
                        .find(|m| m.instance_id.as_ref() == Some(instance))
                        .map(|m| m.id.clone());
                    if let Some(old) = old {
                        let mut m = group.members.remove(&old).expect("found");
                        let fenced = || JoinResult {
                            error: err(ResponseError::FencedInstanceId),
                            member_id: old.clone(),
                            generation: -1,
                            ..Default::default()
                        };
                        if let Some(w) = m.join_waiter.take() {
                            let _ = w.send(fenced());
                        }
                        if let Some(w) = m.sync_waiter.take() {
                            let _ = w.send(SyncResult {
                                error: err(ResponseError::FencedInstanceId),
                                ..Default::default()
                            });
                        }
                        m.id = member_id.clone();
                        m.client_id = req.client_id.clone();
                        m.client_host = req.client_host.clone();
                        m.protocols = req.protocols.clone();
                        m.session_timeout = Duration::from_millis(req.session_timeout_ms as u64);
                        m.rebalance_timeout = Duration::from_millis(
                            req.rebalance_timeout_ms.max(req.session_timeout_ms) as u64,
                        );
                        m.last_heartbeat = Instant::now();
                        group.members.insert(member_id.clone(), m);
                        if group.leader.as_ref() == Some(&old) {
                            group.leader = Some(member_id.clone());
                        }
                        tracing::info!(group = %group.id, instance = %instance, old = %old, new = %member_id, "static member rejoined under a new member id");
                        // A stable group whose protocol stays the same does not rebalance: the
                        // member gets the current generation and, by SyncGroup, its assignment.
                        if group.state == GroupState::Stable
                            && group.select_protocol() == group.protocol
                        {
                            let leader = group.leader.clone().unwrap_or_default();
                            let is_leader = leader == member_id;
                            let protocol = group.protocol.clone();
                            return JoinResult {
                                error: 0,
                                generation: group.generation,
                                protocol_type: group.protocol_type.clone(),
                                protocol: protocol.clone(),
                                leader,
                                member_id,
                                members: if is_leader {
                                    group.members_for_leader()
                                } else {
                                    Vec::new()
                                },
                                skip_assignment: is_leader,
                            };
                        }
                    }
                } else {
                    member_id = new_member_id(&req.client_id);
                    if req.require_known_member_id {
                        group.pending_members.push(member_id.clone());
                        return fail(ResponseError::MemberIdRequired, &member_id);
                    }
                }
            } else if !group.members.contains_key(&member_id) {
                match group.pending_members.iter().position(|p| *p == member_id) {
                    Some(i) => {
                        group.pending_members.remove(i);
                    }
                    None => return fail(ResponseError::UnknownMemberId, &member_id),
                }
            }
            if !group.members.contains_key(&member_id) && group.members.len() >= GROUP_MEMBERS_MAX {
                return fail(ResponseError::GroupMaxSizeReached, &member_id);
            }
            let (tx, rx) = oneshot::channel();
            let member = group
                .members
                .entry(member_id.clone())
                .or_insert_with(|| Member {
                    id: member_id.clone(),
                    instance_id: req.instance_id.clone(),
                    client_id: req.client_id.clone(),
                    client_host: req.client_host.clone(),
                    session_timeout: Duration::ZERO,
                    rebalance_timeout: Duration::ZERO,
                    protocols: Vec::new(),
                    assignment: Bytes::new(),
                    last_heartbeat: Instant::now(),
                    join_waiter: None,
                    sync_waiter: None,
                });
            member.session_timeout = Duration::from_millis(req.session_timeout_ms as u64);
            member.rebalance_timeout =
                Duration::from_millis(req.rebalance_timeout_ms.max(req.session_timeout_ms) as u64);
            member.protocols = req.protocols.clone();
            member.last_heartbeat = Instant::now();
            if let Some(old) = member.join_waiter.replace(tx) {
                let _ = old.send(JoinResult {
                    error: err(ResponseError::UnknownMemberId),
                    member_id: member_id.clone(),
                    generation: -1,
                    ..Default::default()
                });
            }
            group.protocol_type = Some(req.protocol_type.clone());
            let state = group.state;
            drop(groups);
            if state != GroupState::PreparingRebalance {
                self.prepare_rebalance(&req.group_id, new_group || state == GroupState::Empty);
            }
            self.maybe_complete_join(&req.group_id, false);
            rx
        };
        rx.await.unwrap_or_else(|_| JoinResult {
            error: err(ResponseError::RebalanceInProgress),
            generation: -1,
            ..Default::default()
        })
    }

    pub async fn sync_group(
        self: &Rc<Self>,
        group_id: &str,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
    ) -> SyncResult {
        let fail = |e: ResponseError| SyncResult {
            error: err(e),
            ..Default::default()
        };
        let rx = {
            let mut groups = self.groups.groups.borrow_mut();
            let Some(group) = groups.get_mut(group_id) else {
                return fail(ResponseError::UnknownMemberId);
            };
            if let Some(c) = group.consumer_members() {
                let assigned = match c.classic_sync(member_id, instance_id, generation) {
                    Ok(a) => a,
                    Err(e) => return fail(e),
                };
                let classic = c.members[member_id]
                    .classic
                    .clone()
                    .expect("a classic member");
                let image = self.image();
                let mut by_topic: BTreeMap<String, Vec<i32>> = BTreeMap::new();
                for (id, p) in assigned {
                    if let Some(t) = image.topic_by_id(id) {
                        by_topic.entry(t.name.clone()).or_default().push(p);
                    }
                }
                let version = classic
                    .protocols
                    .first()
                    .map_or(0, |(_, md)| consumer_protocol::version(md));
                return SyncResult {
                    error: 0,
                    protocol_type: Some(consumer_protocol::PROTOCOL_TYPE.to_string()),
                    protocol: Some(classic.protocol().to_string()),
                    assignment: consumer_protocol::encode_assignment(version, &by_topic),
                };
            }
            if group.fenced(member_id, instance_id) {
                return fail(ResponseError::FencedInstanceId);
            }
            if !group.members.contains_key(member_id) {
                return fail(ResponseError::UnknownMemberId);
            }
            if generation != group.generation {
                return fail(ResponseError::IllegalGeneration);
            }
            let (protocol_type, protocol) = (group.protocol_type.clone(), group.protocol.clone());
            match group.state {
                GroupState::PreparingRebalance | GroupState::Empty => {
                    return fail(ResponseError::RebalanceInProgress)
                }
                GroupState::Stable => {
                    let m = &group.members[member_id];
                    return SyncResult {
                        error: 0,
                        protocol_type,
                        protocol,
                        assignment: m.assignment.clone(),
                    };
                }
                GroupState::CompletingRebalance => {}
            }
            let (tx, rx) = oneshot::channel();
            let member = group.members.get_mut(member_id).expect("checked");
            member.last_heartbeat = Instant::now();
            member.sync_waiter = Some(tx);
            if group.leader.as_deref() == Some(member_id) {
                let given: HashMap<String, Bytes> = assignments.into_iter().collect();
                for m in group.members.values_mut() {
                    m.assignment = given.get(&m.id).cloned().unwrap_or_default();
                    if let Some(w) = m.sync_waiter.take() {
                        let _ = w.send(SyncResult {
                            error: 0,
                            protocol_type: protocol_type.clone(),
                            protocol: protocol.clone(),
                            assignment: m.assignment.clone(),
                        });
                    }
                }
                group.state = GroupState::Stable;
                tracing::info!(group = %group.id, generation = group.generation, "rebalance: assignments delivered; group stable");
            }
            rx
        };
        rx.await
            .unwrap_or_else(|_| fail(ResponseError::RebalanceInProgress))
    }

    pub fn heartbeat(
        &self,
        group_id: &str,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
    ) -> i16 {
        let mut groups = self.groups.groups.borrow_mut();
        let Some(group) = groups.get_mut(group_id) else {
            return err(ResponseError::UnknownMemberId);
        };
        if let Some(c) = group.consumer_members() {
            return match c.classic_heartbeat(member_id, instance_id, generation) {
                Ok(()) => 0,
                Err(e) => err(e),
            };
        }
        if group.fenced(member_id, instance_id) {
            return err(ResponseError::FencedInstanceId);
        }
        let state = group.state;
        let current = group.generation;
        let Some(member) = group.members.get_mut(member_id) else {
            return err(ResponseError::UnknownMemberId);
        };
        member.last_heartbeat = Instant::now();
        if state == GroupState::PreparingRebalance {
            return err(ResponseError::RebalanceInProgress);
        }
        if generation != current {
            return err(ResponseError::IllegalGeneration);
        }
        0
    }

    /// Removes members by id or group instance id; per member an error code.
    pub fn leave_group(
        self: &Rc<Self>,
        group_id: &str,
        leaving: Vec<(String, Option<String>)>,
    ) -> (i16, Vec<i16>) {
        let mut codes = Vec::new();
        let mut changed = false;
        {
            let mut groups = self.groups.groups.borrow_mut();
            let Some(group) = groups.get_mut(group_id) else {
                return (
                    err(ResponseError::UnknownMemberId),
                    leaving
                        .iter()
                        .map(|_| err(ResponseError::UnknownMemberId))
                        .collect(),
                );
            };
            if let Some(c) = group.consumer_members() {
                let image = self.image();
                let partitions_of =
                    |t: &str| image.topics.get(t).map(|m| (m.id, m.shards.len() as i32));
                let codes = leaving
                    .iter()
                    .map(|(member_id, instance_id)| {
                        let id = match instance_id {
                            Some(i) => match c.static_member(i) {
                                None => return err(ResponseError::UnknownMemberId),
                                Some(found) if !member_id.is_empty() && found != member_id => {
                                    return err(ResponseError::FencedInstanceId)
                                }
                                Some(found) => found.to_string(),
                            },
                            None => member_id.clone(),
                        };
                        if c.members.get(&id).is_none_or(|m| m.classic.is_none()) {
                            return err(ResponseError::UnknownMemberId);
                        }
                        c.remove_member(&id, &partitions_of);
                        tracing::info!(group = %group_id, member = %id, epoch = c.epoch, "classic member left the consumer group");
                        0
                    })
                    .collect();
                return (0, codes);
            }
            for (member_id, instance_id) in leaving {
                let id = if member_id.is_empty() {
                    instance_id.as_ref().and_then(|i| {
                        group
                            .members
                            .values()
                            .find(|m| m.instance_id.as_ref() == Some(i))
                            .map(|m| m.id.clone())
                    })
                } else {
                    Some(member_id)
                };
                match id.and_then(|id| group.members.remove(&id)) {
                    Some(mut m) => {
                        if let Some(w) = m.join_waiter.take() {
                            let _ = w.send(JoinResult {
                                error: err(ResponseError::UnknownMemberId),
                                generation: -1,
                                ..Default::default()
                            });
                        }
                        tracing::info!(group = %group.id, member = %m.id, "member left the group");
                        changed = true;
                        codes.push(0);
                    }
                    None => codes.push(err(ResponseError::UnknownMemberId)),
                }
            }
        }
        if changed {
            self.membership_changed(group_id);
        }
        (0, codes)
    }

    /// The group check of a TxnOffsetCommit (KIP-447): a request without group metadata (v0-2,
    /// or a producer outside group management) is not checked; one with it is checked as an
    /// OffsetCommit is, except that a rebalance in progress does not refuse it (Kafka checks the
    /// member and its generation only).
    pub fn check_txn_commit(
        &self,
        group_id: &str,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
    ) -> i16 {
        if generation < 0 && member_id.is_empty() && instance_id.is_none() {
            return 0;
        }
        match self.check_commit(group_id, member_id, instance_id, generation) {
            c if c == err(ResponseError::RebalanceInProgress) => 0,
            // A KIP-848 member's stale epoch is the transactional client's ILLEGAL_GENERATION.
            c if c == err(ResponseError::StaleMemberEpoch) => err(ResponseError::IllegalGeneration),
            c => c,
        }
    }

    /// Whether `member_id` is a member of `group_id` that speaks the consumer protocol
    /// (KIP-848), not the classic one.
    pub fn uses_consumer_protocol(&self, group_id: &str, member_id: &str) -> bool {
        let groups = self.groups.groups.borrow();
        groups
            .get(group_id)
            .and_then(|g| g.consumer.as_ref())
            .and_then(|c| c.members.get(member_id))
            .is_some_and(|m| m.classic.is_none())
    }

    /// Checks that an OffsetFetch (version 9, KIP-848) may read on behalf of `member_id` at
    /// `member_epoch`: of a consumer group, only a member at its current epoch (a classic
    /// member at its generation), unless neither is given (an admin client); classic groups do
    /// not check, as in Kafka.
    pub fn check_fetch(&self, group_id: &str, member_id: Option<&str>, member_epoch: i32) -> i16 {
        if member_epoch < 0 && member_id.is_none() {
            return 0;
        }
        let groups = self.groups.groups.borrow();
        let Some(c) = groups
            .get(group_id)
            .and_then(|g| g.consumer.as_ref())
            .filter(|c| !c.members.is_empty())
        else {
            return 0;
        };
        match c.members.get(member_id.unwrap_or_default()) {
            None => err(ResponseError::UnknownMemberId),
            Some(m) if member_epoch != m.epoch && m.classic.is_some() => {
                err(ResponseError::IllegalGeneration)
            }
            Some(m) if member_epoch != m.epoch => err(ResponseError::StaleMemberEpoch),
            Some(_) => 0,
        }
    }

    /// Checks that a commit may be made on behalf of `member_id` at `generation`
    /// (generation -1: a commit outside group management, allowed while the group has no
    /// members).
    pub fn check_commit(
        &self,
        group_id: &str,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
    ) -> i16 {
        let groups = self.groups.groups.borrow();
        let Some(group) = groups.get(group_id) else {
            return if generation < 0 {
                0
            } else {
                err(ResponseError::IllegalGeneration)
            };
        };
        if let Some(c) = group.consumer.as_ref().filter(|c| !c.members.is_empty()) {
            return match c.members.get(member_id) {
                None => err(ResponseError::UnknownMemberId),
                // A classic member commits with its generation, and hears the classic error.
                Some(m) if generation != m.epoch && m.classic.is_some() => {
                    err(ResponseError::IllegalGeneration)
                }
                Some(m) if generation != m.epoch => err(ResponseError::StaleMemberEpoch),
                Some(_) => 0,
            };
        }
        if group.fenced(member_id, instance_id) {
            return err(ResponseError::FencedInstanceId);
        }
        // A client outside group management (the admin client, or a consumer that only assigns
        // partitions; librdkafka's KIP-848 consumer sends its own member id then) may commit
        // while the group has no members, as in Kafka, whatever its member id. With members,
        // only a named member is checked further (and then its generation), as Kafka does.
        if generation < 0 && group.members.is_empty() {
            return 0;
        }
        if generation < 0 && member_id.is_empty() && instance_id.is_none() {
            return err(ResponseError::UnknownMemberId);
        }
        if !group.members.contains_key(member_id) {
            return err(ResponseError::UnknownMemberId);
        }
        if generation != group.generation {
            return err(ResponseError::IllegalGeneration);
        }
        // A member of the current generation may commit while the group prepares a rebalance
        // (an eager member commits in its revoke callback before it rejoins), as in Kafka; once
        // the join is complete and assignments are pending, it must sync first.
        if group.state == GroupState::CompletingRebalance {
            return err(ResponseError::RebalanceInProgress);
        }
        0
    }

    /// Appends commits (or deletions, `None`) to the group's offsets partition and, once durable,
    /// applies them to the in-memory view.
    pub async fn store_offsets(
        self: &Rc<Self>,
        group_id: &str,
        commits: Vec<((String, i32), Option<Committed>)>,
    ) -> Result<(), i16> {
        if commits.is_empty() {
            return Ok(());
        }
        self.append_offsets(group_id, &commits, None).await?;
        let mut groups = self.groups.groups.borrow_mut();
        let group = groups
            .entry(group_id.to_string())
            .or_insert_with(|| Group::new(group_id));
        for (key, committed) in commits {
            match committed {
                Some(c) => {
                    group.offsets.insert(key, c);
                }
                None => {
                    group.offsets.remove(&key);
                }
            }
        }
        Ok(())
    }

    /// TxnOffsetCommit: appends `commits` to the group's offsets partition as a transactional
    /// batch of `producer_id` (the transaction's markers reach that partition through
    /// AddOffsetsToTxn) and keeps them pending until the transaction's marker applies or drops
    /// them ([`Shard::complete_txn_offsets`]), as Kafka's group coordinator does.
    pub async fn store_txn_offsets(
        self: &Rc<Self>,
        group_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        commits: Vec<((String, i32), Committed)>,
    ) -> Result<(), i16> {
        if commits.is_empty() {
            return Ok(());
        }
        let as_records: Vec<_> = commits
            .iter()
            .map(|(k, c)| (k.clone(), Some(c.clone())))
            .collect();
        self.append_offsets(group_id, &as_records, Some((producer_id, producer_epoch)))
            .await?;
        let mut groups = self.groups.groups.borrow_mut();
        let group = groups
            .entry(group_id.to_string())
            .or_insert_with(|| Group::new(group_id));
        group
            .pending_txn
            .entry(producer_id)
            .or_default()
            .extend(commits);
        Ok(())
    }

    /// A marker for `producer_id`'s transaction was written to `__consumer_offsets` partition
    /// `index` (led here): the transaction's offsets for the groups of that partition are
    /// applied (commit) or dropped (abort).
    pub fn complete_txn_offsets(&self, index: i32, producer_id: i64, commit: bool) {
        if !self.shared.is_coordinator(index) {
            // Still loading: the load reads up to the high watermark, past this marker.
            return;
        }
        let partitions = self.config().offsets_topic_partitions;
        let mut groups = self.groups.groups.borrow_mut();
        for (id, group) in groups.iter_mut() {
            if offsets_topic::partition_for(id, partitions) != index {
                continue;
            }
            let n = group.complete_txn(producer_id, commit);
            if n > 0 {
                tracing::debug!(group = %id, producer_id, commit, offsets = n, "transactional offsets completed");
            }
        }
    }

    /// Appends offset records for `group_id` (a tombstone for `None`) to its offsets partition
    /// and waits until every in-sync replica has them. With `producer`, the batch is that
    /// producer's transactional batch.
    async fn append_offsets(
        self: &Rc<Self>,
        group_id: &str,
        commits: &[((String, i32), Option<Committed>)],
        producer: Option<(i64, i16)>,
    ) -> Result<(), i16> {
        let partitions = self.config().offsets_topic_partitions;
        let p = offsets_topic::partition_for(group_id, partitions);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let records = commits
            .iter()
            .map(|((topic, partition), committed)| {
                let key = offsets_topic::encode_key(&CommitKey {
                    group: group_id.to_string(),
                    topic: topic.clone(),
                    partition: *partition,
                });
                let value = committed.as_ref().map(|c| {
                    offsets_topic::encode_value(&CommitValue {
                        offset: c.offset,
                        leader_epoch: c.leader_epoch,
                        metadata: c.metadata.clone(),
                        commit_timestamp: now,
                    })
                });
                NewRecord {
                    key: Some(key.to_vec()),
                    value: value.map(|v| v.to_vec()),
                    headers: Vec::new(),
                    timestamp: Timestamp(now),
                }
            })
            .collect();
        self.append_to_offsets_partition(p, records, producer, group_id)
            .await
    }

    /// Appends `records` to `__consumer_offsets` partition `p` (led here) and waits until every
    /// in-sync replica has them; with `producer`, as that producer's transactional batch.
    /// `group_id` names the group for the log lines.
    async fn append_to_offsets_partition(
        self: &Rc<Self>,
        p: i32,
        records: Vec<NewRecord>,
        producer: Option<(i64, i16)>,
        group_id: &str,
    ) -> Result<(), i16> {
        let Some(log) = self.partition(OFFSETS_TOPIC, p) else {
            return Err(err(ResponseError::CoordinatorNotAvailable));
        };
        let mut builder = BatchBuilder::new();
        if let Some((producer_id, producer_epoch)) = producer {
            // No sequence: the coordinator writes it, not the producer (as Kafka's does).
            builder = builder
                .producer(producer_id, producer_epoch, -1)
                .attributes(ATTR_TRANSACTIONAL);
        }
        for record in &records {
            builder.push(record);
        }
        let batch = builder.build();
        // Stamped with the offsets partition's leader epoch, as every leader's append is, and
        // acknowledged once every in-sync replica has it (Kafka writes commits with acks=all).
        // Errors are Kafka's for a commit: the client finds the coordinator again or retries.
        let epoch = log
            .check_leader(-1)
            .map_err(|_| err(ResponseError::NotCoordinator))?;
        log.check_acks_all()
            .map_err(|_| err(ResponseError::CoordinatorNotAvailable))?;
        let info = match log.log.append(BytesMut::from(&batch[..]), epoch).await {
            Ok(info) => info,
            Err(e) => {
                tracing::error!(group = %group_id, error = %e, "could not store committed offsets");
                return Err(match crate::handlers::errors::log_error_code(&e) {
                    c if c == err(ResponseError::MessageTooLarge)
                        || c == err(ResponseError::RecordListTooLarge) =>
                    {
                        err(ResponseError::InvalidCommitOffsetSize)
                    }
                    c if c == err(ResponseError::KafkaStorageError) => {
                        err(ResponseError::NotCoordinator)
                    }
                    c => c,
                });
            }
        };
        self.notify_appended();
        let code = log
            .wait_acks_all(info.last_offset.next(), OFFSETS_COMMIT_TIMEOUT)
            .await;
        if code != 0 {
            tracing::debug!(group = %group_id, code, "committed offsets not acknowledged by the in-sync replicas");
            return Err(if code == err(ResponseError::NotLeaderOrFollower) {
                err(ResponseError::NotCoordinator)
            } else {
                err(ResponseError::CoordinatorNotAvailable)
            });
        }
        Ok(())
    }

    /// Rebuilds the groups of `__consumer_offsets` partition `index` from its log, as the
    /// coordinator of the leadership `still_leading` checks: it stops as soon as that
    /// leadership ends, so a load never applies what a newer one has read after it.
    pub async fn load_offsets_of(
        self: &Rc<Self>,
        index: i32,
        partition: &crate::shard::Partition,
        still_leading: impl Fn() -> bool,
    ) -> anyhow::Result<usize> {
        let mut loaded = 0usize;
        let mut placed = false;
        let partitions = self.config().offsets_topic_partitions;
        let log = &partition.log;
        let mut cur = log.log_start_offset();
        // Up to the high watermark as it is when the load ends, not as it was when it began:
        // transaction markers written meanwhile are replayed here (their live completion,
        // `complete_txn_offsets`, skips a partition still loading), and the check that ends
        // the loop and the caller's `set_coordinator` run with no await between, so every
        // marker is applied by exactly one of the two.
        loop {
            let end = log.high_watermark();
            if cur >= end {
                break;
            }
            let batches = log.read(cur, 4 << 20, end).await?;
            if batches.is_empty() || !still_leading() {
                break;
            }
            let mut groups = self.groups.groups.borrow_mut();
            for b in batches {
                cur = b.last_offset.next();
                let Ok(header) = BatchHeader::parse(&b.bytes) else {
                    continue;
                };
                if header.is_control() {
                    // A transaction's end: its offsets in this partition apply or go. Only
                    // this partition's groups: another partition's may hold the same
                    // producer's offsets from a later transaction, which this marker does not
                    // end.
                    let commit = sluice_engine::producer_state::control_type(&b.bytes)
                        == Some(sluice_engine::producer_state::CONTROL_TYPE_COMMIT);
                    for (id, g) in groups.iter_mut() {
                        if offsets_topic::partition_for(id, partitions) == index {
                            g.complete_txn(header.producer_id(), commit);
                        }
                    }
                    continue;
                }
                let txn_producer = header.is_transactional().then(|| header.producer_id());
                for record in Records::new(&b.bytes) {
                    let Ok(record) = record else { break };
                    if record.key.is_some_and(offsets_topic::is_placement_key) {
                        placed = true;
                        continue;
                    }
                    let Some(key) = record.key.and_then(offsets_topic::decode_key) else {
                        continue;
                    };
                    if offsets_topic::partition_for(&key.group, partitions) != index {
                        // Placed here by an earlier release; its coordinator has taken it over
                        // (`placement.rs`).
                        continue;
                    }
                    let group = groups
                        .entry(key.group.clone())
                        .or_insert_with(|| Group::new(&key.group));
                    match (
                        record.value.and_then(offsets_topic::decode_value),
                        txn_producer,
                    ) {
                        (Some(v), producer) => {
                            let committed = Committed {
                                offset: v.offset,
                                leader_epoch: v.leader_epoch,
                                metadata: v.metadata,
                            };
                            let key = (key.topic, key.partition);
                            match producer {
                                Some(pid) => {
                                    group
                                        .pending_txn
                                        .entry(pid)
                                        .or_default()
                                        .insert(key, committed);
                                }
                                None => {
                                    group.offsets.insert(key, committed);
                                }
                            }
                            loaded += 1;
                        }
                        (None, _) => {
                            group.offsets.remove(&(key.topic, key.partition));
                        }
                    }
                }
            }
        }
        // A group of this partition whose every commit was deleted (DeleteGroups, OffsetDelete)
        // is gone; other partitions' groups are not this load's.
        self.groups.groups.borrow_mut().retain(|id, g| {
            offsets_topic::partition_for(id, partitions) != index
                || !g.offsets.is_empty()
                || !g.pending_txn.is_empty()
                || !g.members.is_empty()
        });
        if !placed {
            loaded += self.take_over_strays(index, &still_leading).await?;
        }
        Ok(loaded)
    }

    /// Takes over the commits of the groups of partition `index` that earlier releases placed
    /// on other partitions, and records that it did (`placement.rs`). Their count.
    async fn take_over_strays(
        self: &Rc<Self>,
        index: i32,
        still_leading: &impl Fn() -> bool,
    ) -> anyhow::Result<usize> {
        let Some(strays) = placement::read_strays(self, index, still_leading).await else {
            return Ok(0); // no longer leading: the next leadership loads again
        };
        let partitions = self.config().offsets_topic_partitions;
        let mut taken = 0usize;
        for (group_id, commits) in strays {
            // A commit this partition already has for the same group and partition is newer.
            let fresh: Vec<((String, i32), Option<Committed>)> = {
                let groups = self.groups.groups.borrow();
                let have = groups.get(&group_id);
                commits
                    .into_iter()
                    .filter(|(at, _)| have.is_none_or(|g| !g.offsets.contains_key(at)))
                    .map(|(at, c)| (at, Some(c)))
                    .collect()
            };
            if fresh.is_empty() || !still_leading() {
                continue;
            }
            self.append_offsets(&group_id, &fresh, None)
                .await
                .map_err(|code| {
                    anyhow::anyhow!(
                        "storing the commits of group {group_id} taken over: error {code}"
                    )
                })?;
            let mut groups = self.groups.groups.borrow_mut();
            let group = groups
                .entry(group_id.clone())
                .or_insert_with(|| Group::new(&group_id));
            for (at, committed) in fresh {
                if let Some(c) = committed {
                    group.offsets.entry(at).or_insert(c);
                    taken += 1;
                }
            }
            tracing::info!(group = %group_id, from = offsets_topic::legacy_partition_for(&group_id, partitions), to = index, commits = group.offsets.len(), "took over the commits of a group an earlier release placed on another offsets partition");
        }
        if !still_leading() {
            return Ok(taken);
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let record = NewRecord {
            key: Some(offsets_topic::encode_placement_key().to_vec()),
            // Never null: a tombstone would be compacted away, and with it the record.
            value: Some(0i16.to_be_bytes().to_vec()),
            headers: Vec::new(),
            timestamp: Timestamp(now),
        };
        self.append_to_offsets_partition(index, vec![record], None, "")
            .await
            .map_err(|code| anyhow::anyhow!("storing the placement record: error {code}"))?;
        Ok(taken)
    }

    /// Drops the groups of `__consumer_offsets` partition `index` from memory (this broker no
    /// longer coordinates them): members waiting in JoinGroup or SyncGroup get
    /// NOT_COORDINATOR and find the new coordinator, as Kafka's members do.
    pub fn unload_groups(&self, index: i32) {
        let partitions = self.config().offsets_topic_partitions;
        let mut groups = self.groups.groups.borrow_mut();
        let gone: Vec<String> = groups
            .keys()
            .filter(|id| offsets_topic::partition_for(id, partitions) == index)
            .cloned()
            .collect();
        for id in &gone {
            let Some(mut group) = groups.remove(id) else {
                continue;
            };
            for m in group.members.values_mut() {
                if let Some(w) = m.join_waiter.take() {
                    let _ = w.send(JoinResult {
                        error: err(ResponseError::NotCoordinator),
                        member_id: m.id.clone(),
                        generation: -1,
                        ..Default::default()
                    });
                }
                if let Some(w) = m.sync_waiter.take() {
                    let _ = w.send(SyncResult {
                        error: err(ResponseError::NotCoordinator),
                        ..Default::default()
                    });
                }
            }
        }
        if !gone.is_empty() {
            tracing::info!(
                shard = self.id,
                partition = index,
                groups = gone.len(),
                "unloaded groups: no longer their coordinator"
            );
        }
    }
}

/// The error for a group request when this broker has no coordinator for the group: in a
/// cluster whose offsets partition for the group is led by another broker, NOT_COORDINATOR (the
/// client asks FindCoordinator again and moves, as with Kafka); led here but still loading,
/// COORDINATOR_LOAD_IN_PROGRESS; else COORDINATOR_NOT_AVAILABLE (the offsets topic is not there
/// yet, or its partition has no leader).
pub fn no_coordinator(shard: &Shard, group_id: &str) -> i16 {
    let p = offsets_topic::partition_for(group_id, shard.config().offsets_topic_partitions);
    let image = shard.image();
    match image.leader_of(OFFSETS_TOPIC, p) {
        Some((info, _)) if info.leader >= 0 && info.leader != shard.config().node_id => {
            ResponseError::NotCoordinator.code()
        }
        // Led here, its groups still loading from the log: the client retries.
        Some((info, _)) if info.leader == shard.config().node_id => {
            ResponseError::CoordinatorLoadInProgress.code()
        }
        _ => ResponseError::CoordinatorNotAvailable.code(),
    }
}

/// The shard that coordinates `group_id`: the owner of its `__consumer_offsets` partition,
/// while this node leads that partition and has loaded its groups.
pub fn coordinator_shard(shard: &Shard, group_id: &str) -> Option<usize> {
    let p = offsets_topic::partition_for(group_id, shard.config().offsets_topic_partitions);
    if !shard.shared.is_coordinator(p) {
        return None;
    }
    shard.image().owner(OFFSETS_TOPIC, p, shard.shared.shards)
}
