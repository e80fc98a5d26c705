//! The group coordinator as an I/O-free state machine: JoinGroup, SyncGroup, Heartbeat and
//! LeaveGroup of classic members, the KIP-848 heartbeat with the conversions between the two
//! protocols, session expiry, the checks of commits and fetches, and the committed offsets as
//! the log of `__consumer_offsets` replays them.
//!
//! It holds no timer, reads no clock and writes no log. Every call that depends on time takes
//! `now`; a call that must be called back later returns a [`GroupEffect`] (Kafka's delayed join
//! in its purgatory), which the shard arms (`shard/groups.rs`). Commits are applied here only
//! after the shard has made them durable in the group's offsets partition. Members waiting in
//! JoinGroup or SyncGroup hold a oneshot sender, completed when the rebalance moves on; the
//! caller awaits the receiver of a [`Reply::Later`].

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_channel::oneshot;
use kafka_protocol::ResponseError;
use sluice_engine::batch::{BatchHeader, Records};

use super::offsets_topic;
use super::{
    classic_join_to_consumer_group, consumer, consumer_protocol, err, new_member_id, Committed,
    Group, GroupCoordinator, GroupState, JoinRequest, JoinResult, Member, SyncRequest, SyncResult,
    GROUP_MEMBERS_MAX,
};
use crate::config::BrokerConfig;
use crate::metadata::MetadataImage;

/// What the shard does for the coordinator after a call.
#[derive(Debug, PartialEq, Eq)]
pub enum GroupEffect {
    /// After `after`, call [`GroupCoordinator::rebalance_deadline`] with `group_id` and `round`:
    /// the join phase of that rebalance ends with whoever has joined.
    RebalanceDeadline {
        group_id: String,
        round: u64,
        after: Duration,
    },
}

/// An answer now, or one that a later call completes (a member waiting in JoinGroup or
/// SyncGroup for the others).
pub enum Reply<T> {
    Now(T),
    Later(oneshot::Receiver<T>),
}

impl<T: std::fmt::Debug> std::fmt::Debug for Reply<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reply::Now(t) => f.debug_tuple("Now").field(t).finish(),
            Reply::Later(_) => f.write_str("Later"),
        }
    }
}

/// A batch of `__consumer_offsets` replayed by [`GroupCoordinator::replay`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Commits read (applied or pending on their transaction).
    pub commits: usize,
    /// Whether the batch holds the placement record (`placement.rs`).
    pub placed: bool,
}

fn partitions_of(image: &MetadataImage) -> impl Fn(&str) -> Option<(uuid::Uuid, i32)> + '_ {
    |t: &str| image.topics.get(t).map(|m| (m.id, m.shards.len() as i32))
}

impl GroupCoordinator {
    /// Members whose session ran out are removed (their groups rebalance), as are consumer
    /// group members past `group.consumer.session.timeout.ms`; a consumer group left with
    /// classic members only converts back when the migration policy allows.
    pub fn expire_sessions(
        &self,
        now: Instant,
        config: &BrokerConfig,
        image: &MetadataImage,
    ) -> Vec<GroupEffect> {
        let mut effects = Vec::new();
        let mut groups = self.groups.borrow_mut();
        for group in groups.values_mut() {
            let expired: Vec<String> = group
                .members
                .values()
                // A member waiting in JoinGroup is bounded by the rebalance timeout instead.
                .filter(|m| {
                    m.join_waiter.is_none()
                        && now.saturating_duration_since(m.last_heartbeat) > m.session_timeout
                })
                .map(|m| m.id.clone())
                .collect();
            if expired.is_empty() {
                continue;
            }
            for id in expired {
                tracing::info!(group = %group.id, member = %id, "member session expired");
                group.members.remove(&id);
            }
            effects.extend(membership_changed(group, now, config));
        }
        for group in groups.values_mut() {
            if let Some(s) = group.streams.as_mut().filter(|s| !s.members.is_empty()) {
                let own = image
                    .cluster
                    .as_ref()
                    .and_then(|c| c.group_configs.get(&group.id));
                let c = super::configs::StreamsGroupConfig::resolve(config, own);
                let timeout = Duration::from_millis(c.session_timeout_ms);
                for id in s.expire(now, timeout, c.num_standby_replicas) {
                    tracing::info!(group = %group.id, member = %id, epoch = s.epoch, "streams group member session expired");
                }
            }
        }
        let session_timeout = Duration::from_millis(config.group_consumer_session_timeout_ms);
        let downgrade = config.group_consumer_migration_policy.downgrade();
        for group in groups.values_mut() {
            let Some(c) = group.consumer.as_mut() else {
                continue;
            };
            let had_consumer_protocol = c.members.values().any(|m| m.classic.is_none());
            let expired = c.expire(now, session_timeout, &partitions_of(image));
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
                effects.push(prepare_rebalance(group, false, now, config));
            }
        }
        effects
    }

    /// The deadline of rebalance `round` of `group_id` (armed by a [`GroupEffect`]): the join
    /// phase completes with the members that have joined; a stale round does nothing.
    pub fn rebalance_deadline(&self, group_id: &str, round: u64, now: Instant) {
        let mut groups = self.groups.borrow_mut();
        let Some(group) = groups.get_mut(group_id) else {
            return;
        };
        if group.rebalance_round != round || group.state != GroupState::PreparingRebalance {
            return;
        }
        group.initial_delay_until = None;
        maybe_complete_join(group, true, now);
    }

    /// KIP-848 ConsumerGroupHeartbeat. A classic group with members converts to a consumer
    /// group first (`group.consumer.migration.policy` allowing), and a consumer group whose last
    /// consumer-protocol member leaves converts back.
    pub fn consumer_heartbeat(
        &self,
        group_id: &str,
        req: consumer::HeartbeatRequest,
        now: Instant,
        config: &BrokerConfig,
        image: &MetadataImage,
    ) -> (consumer::HeartbeatResult, Vec<GroupEffect>) {
        let policy = config.group_consumer_migration_policy;
        let mut groups = self.groups.borrow_mut();
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
                return (
                    refuse("group.consumer.migration.policy does not allow upgrades"),
                    Vec::new(),
                );
            }
            if group.protocol_type.as_deref() != Some(consumer_protocol::PROTOCOL_TYPE) {
                return (refuse("its protocol type is not consumer"), Vec::new());
            }
            if let Err(e) = group.convert_to_consumer(&|t: &str| image.topics.get(t).map(|m| m.id))
            {
                tracing::warn!(group = %group_id, error = %e, "cannot convert the classic group to a consumer group");
                return (
                    refuse("a member's embedded consumer protocol is malformed"),
                    Vec::new(),
                );
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
        let result = c.heartbeat(req, &partitions_of(image));
        if c.epoch != before {
            tracing::info!(group = %group_id, epoch = c.epoch, members = c.members.len(), "consumer group epoch bumped");
        }
        let mut effects = Vec::new();
        if downgrade {
            group.convert_to_classic(&|id| image.topic_by_id(id).map(|t| t.name.clone()));
            tracing::info!(group = %group_id, generation = group.generation, members = group.members.len(), "consumer group converted back to a classic group");
            effects.push(prepare_rebalance(group, false, now, config));
        }
        (result, effects)
    }

    /// JoinGroup. A member that must wait for the others gets [`Reply::Later`].
    pub fn join(
        &self,
        req: JoinRequest,
        now: Instant,
        config: &BrokerConfig,
        image: &MetadataImage,
    ) -> (Reply<JoinResult>, Vec<GroupEffect>) {
        let fail = |e: ResponseError, member_id: &str| {
            let result = JoinResult {
                error: err(e),
                member_id: member_id.to_string(),
                generation: -1,
                ..Default::default()
            };
            (Reply::Now(result), Vec::new())
        };
        let allowed = config.group_min_session_timeout_ms..=config.group_max_session_timeout_ms;
        if !allowed.contains(&(req.session_timeout_ms as i64)) {
            tracing::info!(group = %req.group_id, session_timeout_ms = req.session_timeout_ms, min = config.group_min_session_timeout_ms, max = config.group_max_session_timeout_ms, "JoinGroup refused: session timeout outside group.min/max.session.timeout.ms");
            return fail(ResponseError::InvalidSessionTimeout, &req.member_id);
        }
        if req.protocols.is_empty() || req.protocol_type.is_empty() {
            return fail(ResponseError::InconsistentGroupProtocol, &req.member_id);
        }
        let mut groups = self.groups.borrow_mut();
        let new_group = !groups.contains_key(&req.group_id);
        let group = groups
            .entry(req.group_id.clone())
            .or_insert_with(|| Group::new(&req.group_id));
        if group.consumer_members().is_some() {
            let result = classic_join_to_consumer_group(group, &req, image);
            return (Reply::Now(result), Vec::new());
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
            member_id = new_member_id(&req.client_id);
            match &req.instance_id {
                Some(instance) => {
                    if let Some(result) = rejoin_static(group, instance, &member_id, &req, now) {
                        return (Reply::Now(result), Vec::new());
                    }
                }
                None if req.require_known_member_id => {
                    group.pending_members.push(member_id.clone());
                    return fail(ResponseError::MemberIdRequired, &member_id);
                }
                None => {}
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
                last_heartbeat: now,
                join_waiter: None,
                sync_waiter: None,
            });
        member.session_timeout = Duration::from_millis(req.session_timeout_ms as u64);
        member.rebalance_timeout =
            Duration::from_millis(req.rebalance_timeout_ms.max(req.session_timeout_ms) as u64);
        member.protocols = req.protocols.clone();
        member.last_heartbeat = now;
        if let Some(old) = member.join_waiter.replace(tx) {
            let _ = old.send(JoinResult {
                error: err(ResponseError::UnknownMemberId),
                member_id: member_id.clone(),
                generation: -1,
                ..Default::default()
            });
        }
        group.protocol_type = Some(req.protocol_type.clone());
        let mut effects = Vec::new();
        if group.state != GroupState::PreparingRebalance {
            let first = new_group || group.state == GroupState::Empty;
            effects.push(prepare_rebalance(group, first, now, config));
        }
        maybe_complete_join(group, false, now);
        (Reply::Later(rx), effects)
    }

    /// SyncGroup. Members other than the leader wait for the leader's assignments.
    pub fn sync(
        &self,
        req: SyncRequest<'_>,
        now: Instant,
        image: &MetadataImage,
    ) -> Reply<SyncResult> {
        let SyncRequest {
            group_id,
            member_id,
            instance_id,
            generation,
            assignments,
        } = req;
        let fail = |e: ResponseError| {
            Reply::Now(SyncResult {
                error: err(e),
                ..Default::default()
            })
        };
        let mut groups = self.groups.borrow_mut();
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
            return Reply::Now(SyncResult {
                error: 0,
                protocol_type: Some(consumer_protocol::PROTOCOL_TYPE.to_string()),
                protocol: Some(classic.protocol().to_string()),
                assignment: consumer_protocol::encode_assignment(version, &by_topic),
            });
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
                return Reply::Now(SyncResult {
                    error: 0,
                    protocol_type,
                    protocol,
                    assignment: m.assignment.clone(),
                });
            }
            GroupState::CompletingRebalance => {}
        }
        let (tx, rx) = oneshot::channel();
        let member = group.members.get_mut(member_id).expect("checked");
        member.last_heartbeat = now;
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
        Reply::Later(rx)
    }

    /// Heartbeat: keeps the member's session and tells it whether to rejoin.
    pub fn heartbeat(
        &self,
        group_id: &str,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        now: Instant,
    ) -> i16 {
        let mut groups = self.groups.borrow_mut();
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
        member.last_heartbeat = now;
        if state == GroupState::PreparingRebalance {
            return err(ResponseError::RebalanceInProgress);
        }
        if generation != current {
            return err(ResponseError::IllegalGeneration);
        }
        0
    }

    /// LeaveGroup: removes members by id or group instance id; per member an error code.
    pub fn leave(
        &self,
        group_id: &str,
        leaving: Vec<(String, Option<String>)>,
        now: Instant,
        config: &BrokerConfig,
        image: &MetadataImage,
    ) -> ((i16, Vec<i16>), Vec<GroupEffect>) {
        let mut groups = self.groups.borrow_mut();
        let Some(group) = groups.get_mut(group_id) else {
            let codes = leaving
                .iter()
                .map(|_| err(ResponseError::UnknownMemberId))
                .collect();
            return ((err(ResponseError::UnknownMemberId), codes), Vec::new());
        };
        if let Some(c) = group.consumer_members() {
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
                    c.remove_member(&id, &partitions_of(image));
                    tracing::info!(group = %group_id, member = %id, epoch = c.epoch, "classic member left the consumer group");
                    0
                })
                .collect();
            return ((0, codes), Vec::new());
        }
        let mut codes = Vec::new();
        let mut changed = false;
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
        let effects = if changed {
            membership_changed(group, now, config)
        } else {
            Vec::new()
        };
        ((0, codes), effects)
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
        let groups = self.groups.borrow();
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
        let groups = self.groups.borrow();
        if let Some(s) = groups
            .get(group_id)
            .and_then(|g| g.streams.as_ref())
            .filter(|s| !s.members.is_empty())
        {
            return s.check_member(member_id.unwrap_or_default(), member_epoch);
        }
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
        let groups = self.groups.borrow();
        let Some(group) = groups.get(group_id) else {
            return if generation < 0 {
                0
            } else {
                err(ResponseError::IllegalGeneration)
            };
        };
        if let Some(s) = group.streams.as_ref().filter(|s| !s.members.is_empty()) {
            return s.check_member(member_id, generation);
        }
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

    /// Commits (or deletions, `None`) now durable in the group's offsets partition.
    pub fn apply_commits(&self, group_id: &str, commits: Vec<((String, i32), Option<Committed>)>) {
        let mut groups = self.groups.borrow_mut();
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
    }

    /// Transactional commits of `producer_id` now durable in the group's offsets partition:
    /// pending until the transaction's marker there ([`GroupCoordinator::complete_txn`]).
    pub fn add_txn_commits(
        &self,
        group_id: &str,
        producer_id: i64,
        commits: Vec<((String, i32), Committed)>,
    ) {
        let mut groups = self.groups.borrow_mut();
        let group = groups
            .entry(group_id.to_string())
            .or_insert_with(|| Group::new(group_id));
        group
            .pending_txn
            .entry(producer_id)
            .or_default()
            .extend(commits);
    }

    /// A marker of `producer_id`'s transaction in offsets partition `index` (of `partitions`):
    /// the transaction's offsets of that partition's groups apply (commit) or go (abort).
    pub fn complete_txn(&self, index: i32, partitions: i32, producer_id: i64, commit: bool) {
        let mut groups = self.groups.borrow_mut();
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

    /// One batch of offsets partition `index` (of `partitions`), read in log order while its
    /// groups load: commits apply, tombstones delete, transactional commits wait for their
    /// marker, and commits an earlier release placed here for a group of another partition are
    /// skipped (that partition's coordinator took them over, `placement.rs`).
    pub fn replay(&self, index: i32, partitions: i32, batch: &[u8]) -> Replayed {
        let mut out = Replayed::default();
        let Ok(header) = BatchHeader::parse(batch) else {
            return out;
        };
        let mut groups = self.groups.borrow_mut();
        if header.is_control() {
            // A transaction's end: its offsets in this partition apply or go. Only this
            // partition's groups: another partition's may hold the same producer's offsets from
            // a later transaction, which this marker does not end.
            let commit = sluice_engine::producer_state::control_type(batch)
                == Some(sluice_engine::producer_state::CONTROL_TYPE_COMMIT);
            for (id, g) in groups.iter_mut() {
                if offsets_topic::partition_for(id, partitions) == index {
                    g.complete_txn(header.producer_id(), commit);
                }
            }
            return out;
        }
        let txn_producer = header.is_transactional().then(|| header.producer_id());
        for record in Records::new(batch) {
            let Ok(record) = record else { break };
            if record.key.is_some_and(offsets_topic::is_placement_key) {
                out.placed = true;
                continue;
            }
            let Some(key) = record.key.and_then(offsets_topic::decode_key) else {
                continue;
            };
            if offsets_topic::partition_for(&key.group, partitions) != index {
                continue;
            }
            let group = groups
                .entry(key.group.clone())
                .or_insert_with(|| Group::new(&key.group));
            let at = (key.topic, key.partition);
            match record.value.and_then(offsets_topic::decode_value) {
                Some(v) => {
                    let committed = Committed {
                        offset: v.offset,
                        leader_epoch: v.leader_epoch,
                        metadata: v.metadata,
                    };
                    match txn_producer {
                        Some(pid) => {
                            group
                                .pending_txn
                                .entry(pid)
                                .or_default()
                                .insert(at, committed);
                        }
                        None => {
                            group.offsets.insert(at, committed);
                        }
                    }
                    out.commits += 1;
                }
                None => {
                    group.offsets.remove(&at);
                }
            }
        }
        out
    }

    /// The end of a load of partition `index`: a group of that partition whose every commit was
    /// deleted (DeleteGroups, OffsetDelete) and that has no member is gone.
    pub fn finish_load(&self, index: i32, partitions: i32) {
        self.groups.borrow_mut().retain(|id, g| {
            offsets_topic::partition_for(id, partitions) != index
                || !g.offsets.is_empty()
                || !g.pending_txn.is_empty()
                || !g.members.is_empty()
        });
    }

    /// Of the commits of `group_id` taken over from another partition, those this coordinator
    /// has none for: a commit of its own for the same topic and partition is newer.
    pub fn missing_commits(
        &self,
        group_id: &str,
        commits: super::placement::Commits,
    ) -> Vec<((String, i32), Committed)> {
        let groups = self.groups.borrow();
        let have = groups.get(group_id);
        commits
            .into_iter()
            .filter(|(at, _)| have.is_none_or(|g| !g.offsets.contains_key(at)))
            .collect()
    }

    /// Commits taken over from another partition, now durable in this one; one of this
    /// coordinator's own for the same topic and partition stays. The group's commits count.
    pub fn adopt_commits(&self, group_id: &str, commits: Vec<((String, i32), Committed)>) -> usize {
        let mut groups = self.groups.borrow_mut();
        let group = groups
            .entry(group_id.to_string())
            .or_insert_with(|| Group::new(group_id));
        for (at, c) in commits {
            group.offsets.entry(at).or_insert(c);
        }
        group.offsets.len()
    }

    /// Drops the groups of offsets partition `index` (this broker no longer coordinates them):
    /// members waiting in JoinGroup or SyncGroup get NOT_COORDINATOR and find the new
    /// coordinator, as Kafka's members do. The number of groups dropped.
    pub fn unload(&self, index: i32, partitions: i32) -> usize {
        // Share group membership is in memory: members get UNKNOWN_MEMBER_ID from the new
        // coordinator and join again.
        self.share_groups
            .borrow_mut()
            .retain(|id, _| offsets_topic::partition_for(id, partitions) != index);
        let mut groups = self.groups.borrow_mut();
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
        gone.len()
    }
}

/// KIP-345: a static member coming back under a new member id (a restart) takes over its old
/// identity's place and assignment, and the old id is fenced. In a stable group whose protocol
/// stays the same there is no rebalance: the member gets the current generation at once and, by
/// SyncGroup, its assignment. `None` when it must join as any member does.
fn rejoin_static(
    group: &mut Group,
    instance: &str,
    member_id: &str,
    req: &JoinRequest,
    now: Instant,
) -> Option<JoinResult> {
    let old = group
        .members
        .values()
        .find(|m| m.instance_id.as_deref() == Some(instance))
        .map(|m| m.id.clone())?;
    let mut m = group.members.remove(&old).expect("found");
    if let Some(w) = m.join_waiter.take() {
        let _ = w.send(JoinResult {
            error: err(ResponseError::FencedInstanceId),
            member_id: old.clone(),
            generation: -1,
            ..Default::default()
        });
    }
    if let Some(w) = m.sync_waiter.take() {
        let _ = w.send(SyncResult {
            error: err(ResponseError::FencedInstanceId),
            ..Default::default()
        });
    }
    m.id = member_id.to_string();
    m.client_id = req.client_id.clone();
    m.client_host = req.client_host.clone();
    m.protocols = req.protocols.clone();
    m.session_timeout = Duration::from_millis(req.session_timeout_ms as u64);
    m.rebalance_timeout =
        Duration::from_millis(req.rebalance_timeout_ms.max(req.session_timeout_ms) as u64);
    m.last_heartbeat = now;
    group.members.insert(member_id.to_string(), m);
    if group.leader.as_deref() == Some(old.as_str()) {
        group.leader = Some(member_id.to_string());
    }
    tracing::info!(group = %group.id, instance = %instance, old = %old, new = %member_id, "static member rejoined under a new member id");
    if group.state != GroupState::Stable || group.select_protocol() != group.protocol {
        return None;
    }
    let leader = group.leader.clone().unwrap_or_default();
    let is_leader = leader == member_id;
    Some(JoinResult {
        error: 0,
        generation: group.generation,
        protocol_type: group.protocol_type.clone(),
        protocol: group.protocol.clone(),
        leader,
        member_id: member_id.to_string(),
        members: if is_leader {
            group.members_for_leader()
        } else {
            Vec::new()
        },
        skip_assignment: is_leader,
    })
}

/// After members left or expired: rebalance the rest, or empty the group.
fn membership_changed(group: &mut Group, now: Instant, config: &BrokerConfig) -> Vec<GroupEffect> {
    match group.state {
        GroupState::Stable | GroupState::CompletingRebalance => {
            let effect = prepare_rebalance(group, false, now, config);
            // With nobody left to rejoin, the group is Empty at once.
            maybe_complete_join(group, false, now);
            vec![effect]
        }
        GroupState::PreparingRebalance => {
            maybe_complete_join(group, false, now);
            Vec::new()
        }
        GroupState::Empty => Vec::new(),
    }
}

/// Starts a rebalance round: members waiting in SyncGroup must rejoin, and the join phase ends
/// at the returned deadline (a new group first waits `group.initial.rebalance.delay.ms` for more
/// members, bounded by the rebalance timeout).
fn prepare_rebalance(
    group: &mut Group,
    new_group: bool,
    now: Instant,
    config: &BrokerConfig,
) -> GroupEffect {
    if group.state == GroupState::CompletingRebalance {
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
    let after = if new_group {
        let d = Duration::from_millis(config.group_initial_rebalance_delay_ms);
        group.initial_delay_until = Some(now + d);
        d.min(group.rebalance_timeout())
    } else {
        group.rebalance_timeout()
    };
    GroupEffect::RebalanceDeadline {
        group_id: group.id.clone(),
        round: group.rebalance_round,
        after,
    }
}

/// Completes the join phase when every member has rejoined (or, with `deadline`, with whoever
/// has): a new generation, its protocol and leader; every waiting member is answered, the
/// leader with everyone's metadata.
fn maybe_complete_join(group: &mut Group, deadline: bool, now: Instant) {
    if group.state != GroupState::PreparingRebalance {
        return;
    }
    let all_joined = group.members.values().all(|m| m.join_waiter.is_some());
    let waiting_initial = group.initial_delay_until.is_some_and(|t| now < t);
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
        m.last_heartbeat = now;
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

#[cfg(test)]
mod tests {
    use super::*;

    const SESSION_MS: i32 = 10_000;

    fn config() -> BrokerConfig {
        BrokerConfig {
            group_min_session_timeout_ms: 6_000,
            group_max_session_timeout_ms: 1_800_000,
            group_initial_rebalance_delay_ms: 3_000,
            ..BrokerConfig::default()
        }
    }

    fn request(group: &str, member_id: &str, instance: Option<&str>) -> JoinRequest {
        JoinRequest {
            group_id: group.into(),
            member_id: member_id.into(),
            instance_id: instance.map(String::from),
            client_id: "client".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: SESSION_MS,
            rebalance_timeout_ms: 30_000,
            protocol_type: "consumer".into(),
            protocols: vec![
                ("cooperative-sticky".into(), Bytes::from_static(b"c")),
                ("range".into(), Bytes::from_static(b"r")),
            ],
            require_known_member_id: false,
        }
    }

    /// The answer a `Reply::Later` has received by now, if any.
    fn answered<T>(reply: &mut Reply<T>) -> Option<T> {
        match reply {
            Reply::Now(_) => panic!("answered at once"),
            Reply::Later(rx) => rx.try_recv().expect("not cancelled"),
        }
    }

    fn now_of<T>(reply: Reply<T>) -> T {
        match reply {
            Reply::Now(t) => t,
            Reply::Later(_) => panic!("must wait"),
        }
    }

    fn deadline(effects: &[GroupEffect]) -> (String, u64, Duration) {
        match effects {
            [GroupEffect::RebalanceDeadline {
                group_id,
                round,
                after,
            }] => (group_id.clone(), *round, *after),
            other => panic!("expected one deadline, got {other:?}"),
        }
    }

    fn state(c: &GroupCoordinator, group: &str) -> (GroupState, i32) {
        let groups = c.groups.borrow();
        let g = &groups[group];
        (g.state, g.generation)
    }

    /// Two members form a generation: the first waits out the initial delay, the second joins
    /// in it, the deadline completes the join; the leader alone gets everyone's metadata and
    /// its assignments reach the follower through SyncGroup.
    fn two_members(c: &GroupCoordinator, t0: Instant) -> (String, String) {
        let (cfg, image) = (config(), MetadataImage::default());
        let (mut a, effects) = c.join(request("g", "", None), t0, &cfg, &image);
        let (group, round, after) = deadline(&effects);
        assert_eq!((group.as_str(), after), ("g", Duration::from_millis(3_000)));
        assert!(answered(&mut a).is_none(), "waits for the initial delay");
        let (mut b, effects) = c.join(request("g", "", None), t0, &cfg, &image);
        assert!(
            effects.is_empty(),
            "one rebalance round at a time: {effects:?}"
        );
        assert!(answered(&mut b).is_none());
        c.rebalance_deadline("g", round + 1, t0 + after);
        assert!(answered(&mut a).is_none(), "a stale round does nothing");
        c.rebalance_deadline("g", round, t0 + after);
        let (a, b) = (answered(&mut a).unwrap(), answered(&mut b).unwrap());
        assert_eq!((a.error, b.error), (0, 0));
        assert_eq!((a.generation, b.generation), (1, 1));
        assert_eq!(a.protocol.as_deref(), Some("cooperative-sticky"));
        assert_eq!(a.leader, b.leader);
        let (leader, follower) = if a.leader == a.member_id {
            (a, b)
        } else {
            (b, a)
        };
        assert_eq!(leader.members.len(), 2);
        assert!(follower.members.is_empty());
        assert_eq!(state(c, "g"), (GroupState::CompletingRebalance, 1));

        let mut waiting = c.sync(
            sync_req("g", &follower.member_id, None, 1, vec![]),
            t0,
            &image,
        );
        assert!(
            answered(&mut waiting).is_none(),
            "the follower waits for the leader"
        );
        let assignments = vec![
            (leader.member_id.clone(), Bytes::from_static(b"to-leader")),
            (
                follower.member_id.clone(),
                Bytes::from_static(b"to-follower"),
            ),
        ];
        let mine = now_of_or_later(c.sync(
            sync_req("g", &leader.member_id, None, 1, assignments),
            t0,
            &image,
        ));
        assert_eq!(&mine.assignment[..], b"to-leader");
        let theirs = answered(&mut waiting).unwrap();
        assert_eq!(
            (theirs.error, &theirs.assignment[..]),
            (0, &b"to-follower"[..])
        );
        assert_eq!(state(c, "g"), (GroupState::Stable, 1));
        (leader.member_id, follower.member_id)
    }

    /// The leader's own SyncGroup is answered by its own assignment at once (through its
    /// waiter).
    fn now_of_or_later(mut reply: Reply<SyncResult>) -> SyncResult {
        match &mut reply {
            Reply::Now(_) => now_of(reply),
            Reply::Later(_) => answered(&mut reply).expect("the leader's sync completes it"),
        }
    }

    fn sync_req<'a>(
        group_id: &'a str,
        member_id: &'a str,
        instance_id: Option<&'a str>,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
    ) -> SyncRequest<'a> {
        SyncRequest {
            group_id,
            member_id,
            instance_id,
            generation,
            assignments,
        }
    }

    #[test]
    fn members_join_sync_and_heartbeat_through_a_generation() {
        let c = GroupCoordinator::default();
        let t0 = Instant::now();
        let (leader, follower) = two_members(&c, t0);
        assert_eq!(c.heartbeat("g", &leader, None, 1, t0), 0);
        assert_eq!(
            c.heartbeat("g", &follower, None, 0, t0),
            err(ResponseError::IllegalGeneration)
        );
        assert_eq!(
            c.heartbeat("g", "stranger", None, 1, t0),
            err(ResponseError::UnknownMemberId)
        );
        // A stable member syncing again gets its assignment back.
        let again = now_of(c.sync(
            sync_req("g", &follower, None, 1, vec![]),
            t0,
            &MetadataImage::default(),
        ));
        assert_eq!(&again.assignment[..], b"to-follower");
    }

    #[test]
    fn a_member_that_leaves_rebalances_the_rest_and_the_last_empties_the_group() {
        let (c, cfg, image) = (
            GroupCoordinator::default(),
            config(),
            MetadataImage::default(),
        );
        let t0 = Instant::now();
        let (leader, follower) = two_members(&c, t0);
        let ((code, codes), effects) = c.leave(
            "g",
            vec![(leader.clone(), None), ("nobody".into(), None)],
            t0,
            &cfg,
            &image,
        );
        assert_eq!(
            (code, codes),
            (0, vec![0, err(ResponseError::UnknownMemberId)])
        );
        let (_, _, after) = deadline(&effects);
        assert_eq!(
            after,
            Duration::from_millis(30_000),
            "the rebalance timeout"
        );
        assert_eq!(state(&c, "g"), (GroupState::PreparingRebalance, 1));
        assert_eq!(
            c.heartbeat("g", &follower, None, 1, t0),
            err(ResponseError::RebalanceInProgress)
        );
        // The follower rejoins: it is the only member, so the join completes at once.
        let (mut rejoined, _) = c.join(request("g", &follower, None), t0, &cfg, &image);
        let r = answered(&mut rejoined).unwrap();
        assert_eq!((r.generation, r.leader.as_str()), (2, follower.as_str()));
        let ((code, codes), _) = c.leave("g", vec![(follower, None)], t0, &cfg, &image);
        assert_eq!((code, codes), (0, vec![0]));
        assert_eq!(state(&c, "g"), (GroupState::Empty, 3));
    }

    #[test]
    fn an_expired_session_removes_the_member_and_rebalances() {
        let (c, cfg, image) = (
            GroupCoordinator::default(),
            config(),
            MetadataImage::default(),
        );
        let t0 = Instant::now();
        let (leader, follower) = two_members(&c, t0);
        let later = t0 + Duration::from_millis(SESSION_MS as u64 - 1);
        assert_eq!(c.heartbeat("g", &leader, None, 1, later), 0);
        assert!(
            c.expire_sessions(later, &cfg, &image).is_empty(),
            "both still in session"
        );
        let expired = t0 + Duration::from_millis(SESSION_MS as u64 + 1);
        let effects = c.expire_sessions(expired, &cfg, &image);
        let (_, round, _) = deadline(&effects);
        assert!(!c.groups.borrow()["g"].members.contains_key(&follower));
        assert_eq!(
            c.heartbeat("g", &leader, None, 1, expired),
            err(ResponseError::RebalanceInProgress)
        );
        // The leader does not rejoin before the deadline: the group ends up empty.
        c.rebalance_deadline("g", round, expired + Duration::from_secs(30));
        assert_eq!(state(&c, "g"), (GroupState::Empty, 2));
    }

    #[test]
    fn a_new_member_first_gets_its_id_and_only_that_id_joins() {
        let (c, cfg, image) = (
            GroupCoordinator::default(),
            config(),
            MetadataImage::default(),
        );
        let t0 = Instant::now();
        let mut req = request("g", "", None);
        req.require_known_member_id = true;
        let (reply, effects) = c.join(req, t0, &cfg, &image);
        let first = now_of(reply);
        assert_eq!(first.error, err(ResponseError::MemberIdRequired));
        assert!(
            first.member_id.starts_with("client-"),
            "{}",
            first.member_id
        );
        assert!(effects.is_empty());
        let (reply, _) = c.join(request("g", "client-made-up", None), t0, &cfg, &image);
        assert_eq!(now_of(reply).error, err(ResponseError::UnknownMemberId));
        let (mut reply, effects) = c.join(request("g", &first.member_id, None), t0, &cfg, &image);
        let (_, round, _) = deadline(&effects);
        c.rebalance_deadline("g", round, t0 + Duration::from_secs(3));
        let joined = answered(&mut reply).unwrap();
        assert_eq!((joined.error, joined.member_id), (0, first.member_id));
    }

    #[test]
    fn a_static_member_back_under_a_new_id_keeps_the_generation_and_fences_the_old_id() {
        let (c, cfg, image) = (
            GroupCoordinator::default(),
            config(),
            MetadataImage::default(),
        );
        let t0 = Instant::now();
        let (mut a, effects) = c.join(request("g", "", Some("instance-1")), t0, &cfg, &image);
        let (_, round, _) = deadline(&effects);
        c.rebalance_deadline("g", round, t0 + Duration::from_secs(3));
        let old = answered(&mut a).unwrap();
        now_of_or_later(c.sync(
            sync_req(
                "g",
                &old.member_id,
                Some("instance-1"),
                1,
                vec![(old.member_id.clone(), Bytes::from_static(b"mine"))],
            ),
            t0,
            &image,
        ));
        let (reply, effects) = c.join(request("g", "", Some("instance-1")), t0, &cfg, &image);
        let back = now_of(reply);
        assert!(effects.is_empty(), "no rebalance: {effects:?}");
        assert_ne!(back.member_id, old.member_id);
        assert_eq!((back.error, back.generation), (0, 1));
        assert!(
            back.skip_assignment,
            "the static leader keeps the assignments"
        );
        let synced = now_of(c.sync(
            sync_req("g", &back.member_id, Some("instance-1"), 1, vec![]),
            t0,
            &image,
        ));
        assert_eq!(&synced.assignment[..], b"mine");
        assert_eq!(
            c.heartbeat("g", &old.member_id, Some("instance-1"), 1, t0),
            err(ResponseError::FencedInstanceId)
        );
        assert_eq!(state(&c, "g"), (GroupState::Stable, 1));
    }

    #[test]
    fn join_refuses_bad_sessions_and_protocols() {
        let (c, cfg, image) = (
            GroupCoordinator::default(),
            config(),
            MetadataImage::default(),
        );
        let t0 = Instant::now();
        let mut short = request("g", "", None);
        short.session_timeout_ms = 5_999;
        assert_eq!(
            now_of(c.join(short, t0, &cfg, &image).0).error,
            err(ResponseError::InvalidSessionTimeout)
        );
        two_members(&c, t0);
        let mut other = request("g", "", None);
        other.protocols = vec![("roundrobin".into(), Bytes::new())];
        assert_eq!(
            now_of(c.join(other, t0, &cfg, &image).0).error,
            err(ResponseError::InconsistentGroupProtocol)
        );
    }

    #[test]
    fn commits_are_checked_against_the_membership() {
        let c = GroupCoordinator::default();
        let t0 = Instant::now();
        // No group: a commit outside group management goes, one with a generation does not.
        assert_eq!(c.check_commit("g", "", None, -1), 0);
        assert_eq!(
            c.check_commit("g", "m", None, 3),
            err(ResponseError::IllegalGeneration)
        );
        let (leader, _) = two_members(&c, t0);
        assert_eq!(c.check_commit("g", &leader, None, 1), 0);
        assert_eq!(
            c.check_commit("g", &leader, None, 0),
            err(ResponseError::IllegalGeneration)
        );
        assert_eq!(
            c.check_commit("g", "", None, -1),
            err(ResponseError::UnknownMemberId)
        );
        assert_eq!(
            c.check_commit("g", "x", None, 1),
            err(ResponseError::UnknownMemberId)
        );
        // A transactional commit without group metadata is not checked.
        assert_eq!(c.check_txn_commit("g", "", None, -1), 0);
        assert_eq!(c.check_fetch("g", None, -1), 0);
        assert!(!c.uses_consumer_protocol("g", &leader));
    }

    #[test]
    fn a_load_replays_commits_deletions_and_transactions_of_its_own_groups_only() {
        use super::super::placement::batch;
        const N: i32 = 50;
        let c = GroupCoordinator::default();
        // Groups of partition `index`, and one of another partition.
        let mine: Vec<String> = (0..)
            .map(|i| format!("g{i}"))
            .filter(|g| offsets_topic::partition_for(g, N) == offsets_topic::partition_for("g0", N))
            .take(2)
            .collect();
        let index = offsets_topic::partition_for(&mine[0], N);
        let other = (0..)
            .map(|i| format!("o{i}"))
            .find(|g| offsets_topic::partition_for(g, N) != index)
            .unwrap();
        let (a, b) = (mine[0].as_str(), mine[1].as_str());
        let replayed = c.replay(
            index,
            N,
            &batch(
                &[
                    (a, "t", 0, Some(5)),
                    (a, "t", 1, Some(6)),
                    (&other, "t", 0, Some(9)),
                ],
                None,
            ),
        );
        assert_eq!(
            replayed,
            Replayed {
                commits: 2,
                placed: false
            }
        );
        c.replay(index, N, &batch(&[(a, "t", 1, None)], None));
        c.replay(index, N, &batch(&[(b, "t", 0, Some(40))], Some(7)));
        assert!(c.groups.borrow()[b].has_pending_txn_offset("t", 0));
        c.replay(index, N, &batch(&[(b, "t", 1, Some(41))], Some(8)));
        c.replay(
            index,
            N,
            &sluice_engine::batch::control_batch(7, 0, true, 0, sluice_engine::Timestamp(0)),
        );
        c.replay(
            index,
            N,
            &sluice_engine::batch::control_batch(8, 0, false, 0, sluice_engine::Timestamp(0)),
        );
        c.finish_load(index, N);
        let groups = c.groups.borrow();
        let offsets = |g: &str| -> Vec<(i32, i64)> {
            groups[g]
                .offsets
                .iter()
                .map(|((_, p), c)| (*p, c.offset))
                .collect()
        };
        assert_eq!(offsets(a), vec![(0, 5)]);
        assert_eq!(offsets(b), vec![(0, 40)], "committed applies, aborted goes");
        assert!(groups[b].pending_txn.is_empty());
        assert!(
            !groups.contains_key(&other),
            "another partition's group is skipped"
        );
        drop(groups);
        assert_eq!(c.unload(index, N), 2);
        assert!(c.groups.borrow().is_empty());
    }

    #[test]
    fn unloading_answers_waiting_members_not_coordinator() {
        let (c, cfg, image) = (
            GroupCoordinator::default(),
            config(),
            MetadataImage::default(),
        );
        let t0 = Instant::now();
        let (mut waiting, _) = c.join(request("g", "", None), t0, &cfg, &image);
        let partitions = 50;
        c.unload(offsets_topic::partition_for("g", partitions), partitions);
        let answer = answered(&mut waiting).unwrap();
        assert_eq!(answer.error, err(ResponseError::NotCoordinator));
    }
}
