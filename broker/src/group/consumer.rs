//! The KIP-848 consumer group protocol: members heartbeat with ConsumerGroupHeartbeat, the
//! coordinator computes the target assignment with a server-side assignor (`uniform` or
//! `range`), and moves each member towards its target without ever giving a partition to a new
//! owner before the previous owner has reported it released.
//!
//! Epochs: the group epoch rises with every change of membership or subscriptions; the target
//! assignment is recomputed for it. A member that must give up partitions revokes first: its
//! assignment shrinks to what it keeps and it stays at its epoch until it acknowledges, by
//! reporting what it owns, that it let them go. A member with nothing (left) to revoke moves to
//! the target assignment's epoch at once, in the same response, as in Kafka's
//! `CurrentAssignmentBuilder`: it gets the partitions of its target that are free, and those still
//! owned by others (pending their revocation) follow in later responses at that same epoch. So a
//! response that carries partitions always carries an epoch of at least 1, the epoch the member
//! commits with; and a partition is never given to a member while another one may still hold it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;

pub const ASSIGNORS: &[&str] = &["uniform", "range"];

/// A partition by topic id.
pub type Tp = (uuid::Uuid, i32);

/// Partitions grouped by topic id, each topic's in order: how assignments go on the wire.
pub fn by_topic<'a>(set: impl IntoIterator<Item = &'a Tp>) -> BTreeMap<uuid::Uuid, Vec<i32>> {
    let mut by_topic: BTreeMap<uuid::Uuid, Vec<i32>> = BTreeMap::new();
    for &(t, p) in set {
        by_topic.entry(t).or_default().push(p);
    }
    by_topic
}

#[derive(Clone, Debug)]
pub struct ConsumerMember {
    pub id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub epoch: i32,
    pub subscribed: Vec<String>,
    pub assignor: Option<String>,
    pub rebalance_timeout_ms: i32,
    /// What the coordinator last told the member to own.
    pub assigned: BTreeSet<Tp>,
    /// What the member last reported owning.
    pub owned: BTreeSet<Tp>,
    /// Partitions the member was told to let go of and has not yet reported released (Kafka's
    /// partitions pending revocation): nobody else gets them, and the member keeps its epoch.
    pub revoking: BTreeSet<Tp>,
    pub last_heartbeat: Instant,
    /// Set for a member that speaks the classic protocol (JoinGroup, SyncGroup, Heartbeat) in
    /// this group, as a classic consumer does in a group converted to the consumer protocol.
    pub classic: Option<ClassicMember>,
}

/// What a classic-protocol member of a consumer group keeps of its JoinGroup (Kafka's
/// ClassicMemberMetadata): its protocols, in its order of preference, and session timeout.
#[derive(Clone, Debug)]
pub struct ClassicMember {
    pub protocols: Vec<(String, Bytes)>,
    pub session_timeout: Duration,
}

impl ClassicMember {
    /// The protocol the member is told to use: its first (Kafka's choice too).
    pub fn protocol(&self) -> &str {
        self.protocols.first().map_or("", |(n, _)| n.as_str())
    }
}

/// A classic member's JoinGroup, as the consumer group sees it: the subscription and owned
/// partitions come from the ConsumerProtocolSubscription in its metadata.
pub struct ClassicJoin {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub subscribed: Vec<String>,
    pub owned: Vec<Tp>,
    pub classic: ClassicMember,
}

#[derive(Debug, Default)]
pub struct ConsumerGroup {
    pub epoch: i32,
    pub assignment_epoch: i32,
    pub assignor: String,
    pub members: BTreeMap<String, ConsumerMember>,
    pub target: BTreeMap<String, BTreeSet<Tp>>,
}

pub struct HeartbeatRequest {
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub subscribed: Option<Vec<String>>,
    pub assignor: Option<String>,
    pub owned: Option<Vec<Tp>>,
    pub client_id: String,
    pub client_host: String,
}

#[derive(Debug, Default)]
pub struct HeartbeatResult {
    pub error: i16,
    pub message: Option<String>,
    pub member_id: String,
    pub member_epoch: i32,
    pub assignment: Option<BTreeSet<Tp>>,
}

impl ConsumerGroup {
    pub fn state(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self.assignment_epoch < self.epoch {
            "Assigning"
        } else if self.members.values().any(|m| {
            m.epoch != self.assignment_epoch
                || !m.revoking.is_empty()
                || self
                    .target
                    .get(&m.id)
                    .map_or(!m.assigned.is_empty(), |t| *t != m.assigned)
        }) {
            "Reconciling"
        } else {
            "Stable"
        }
    }

    /// Handles one heartbeat. `partitions_of` gives the partition count of a subscribed topic
    /// (and its id), `None` if the topic does not exist.
    pub fn heartbeat(
        &mut self,
        req: HeartbeatRequest,
        partitions_of: &dyn Fn(&str) -> Option<(uuid::Uuid, i32)>,
    ) -> HeartbeatResult {
        let fail = |e: ResponseError, message: &str| HeartbeatResult {
            error: e.code(),
            message: Some(message.to_string()),
            ..Default::default()
        };
        if let Some(a) = &req.assignor {
            if !ASSIGNORS.contains(&a.as_str()) {
                return fail(
                    ResponseError::UnsupportedAssignor,
                    "supported assignors: uniform, range",
                );
            }
        }
        // Leaving: epoch -1 (or -2 for a static member's temporary leave).
        if req.member_epoch < 0 {
            if self.members.remove(&req.member_id).is_some() {
                self.target.remove(&req.member_id);
                self.epoch += 1;
                self.recompute(partitions_of);
            }
            return HeartbeatResult {
                member_id: req.member_id,
                member_epoch: req.member_epoch,
                ..Default::default()
            };
        }
        let mut changed = false;
        let member_id = if req.member_epoch == 0 {
            // Joining (or rejoining after being fenced). v0 clients send an empty id.
            let id = if req.member_id.is_empty() {
                uuid::Uuid::new_v4().simple().to_string()
            } else {
                req.member_id.clone()
            };
            if let Some(instance) = &req.instance_id {
                let old = self
                    .members
                    .values()
                    .find(|m| m.instance_id.as_ref() == Some(instance) && m.id != id)
                    .map(|m| m.id.clone());
                if let Some(old) = old {
                    self.members.remove(&old);
                    self.target.remove(&old);
                }
            }
            if !self.members.contains_key(&id) {
                changed = true;
            }
            let m = self
                .members
                .entry(id.clone())
                .or_insert_with(|| ConsumerMember {
                    id: id.clone(),
                    instance_id: req.instance_id.clone(),
                    rack_id: req.rack_id.clone(),
                    client_id: req.client_id.clone(),
                    client_host: req.client_host.clone(),
                    epoch: 0,
                    subscribed: Vec::new(),
                    assignor: None,
                    rebalance_timeout_ms: req.rebalance_timeout_ms,
                    assigned: BTreeSet::new(),
                    owned: BTreeSet::new(),
                    revoking: BTreeSet::new(),
                    last_heartbeat: Instant::now(),
                    classic: None,
                });
            // A member (re)joining owns nothing yet.
            m.epoch = 0;
            m.assigned.clear();
            m.owned.clear();
            m.revoking.clear();
            id
        } else {
            let Some(m) = self.members.get(&req.member_id) else {
                return fail(
                    ResponseError::UnknownMemberId,
                    "unknown member; rejoin with epoch 0",
                );
            };
            // The member may lag one step behind the epoch the last response carried.
            if req.member_epoch > m.epoch {
                return fail(
                    ResponseError::FencedMemberEpoch,
                    "member epoch is fenced; rejoin with epoch 0",
                );
            }
            req.member_id.clone()
        };
        let m = self.members.get_mut(&member_id).expect("member exists");
        m.last_heartbeat = Instant::now();
        m.rebalance_timeout_ms = req.rebalance_timeout_ms.max(0);
        if let Some(subscribed) = req.subscribed {
            let mut s = subscribed;
            s.sort();
            s.dedup();
            if s != m.subscribed {
                m.subscribed = s;
                changed = true;
            }
        }
        if let Some(a) = req.assignor {
            if m.assignor.as_ref() != Some(&a) {
                m.assignor = Some(a);
                changed = true;
            }
        }
        if let Some(owned) = req.owned {
            // What the member holds right now; partitions it still holds are not free for
            // others, even if it was already told to let them go.
            m.owned = owned.into_iter().collect();
        }
        if changed {
            self.epoch += 1;
            self.recompute(partitions_of);
        }
        self.reconcile(&member_id);
        let m = &self.members[&member_id];
        HeartbeatResult {
            error: 0,
            message: None,
            member_id,
            member_epoch: m.epoch,
            assignment: Some(m.assigned.clone()),
        }
    }

    /// Moves one member towards its target, as Kafka's `CurrentAssignmentBuilder` does: revoke
    /// first and keep the epoch until the member has let go; with nothing to revoke, move to the
    /// target epoch at once with the free part of the target (partitions still assigned to,
    /// owned by or being revoked from others are withheld and follow once released).
    fn reconcile(&mut self, member_id: &str) {
        let target = self.target.get(member_id).cloned().unwrap_or_default();
        let taken = self.held_by_others(member_id);
        let assignment_epoch = self.assignment_epoch;
        let m = self.members.get_mut(member_id).expect("member exists");
        // What the member reports owning tells which revocations it has acknowledged; this is
        // the report of a request sent after an earlier response told it what to let go.
        let owned = &m.owned;
        m.revoking.retain(|tp| owned.contains(tp));
        let dropped: BTreeSet<Tp> = m.assigned.difference(&target).copied().collect();
        if !dropped.is_empty() {
            m.assigned.retain(|tp| target.contains(tp));
            m.revoking.extend(dropped);
        }
        if !m.revoking.is_empty() {
            // Revocation first; the member keeps its epoch until it has let go.
            return;
        }
        let free: Vec<Tp> = target
            .iter()
            .filter(|tp| !m.assigned.contains(tp) && !taken.contains(tp))
            .copied()
            .collect();
        m.assigned.extend(free);
        m.epoch = assignment_epoch;
    }

    /// Recomputes the target assignment for the current members and subscriptions.
    pub fn recompute(&mut self, partitions_of: &dyn Fn(&str) -> Option<(uuid::Uuid, i32)>) {
        self.assignor = self
            .members
            .values()
            .filter_map(|m| m.assignor.clone())
            .next()
            .unwrap_or_else(|| "uniform".to_string());
        let mut target: BTreeMap<String, BTreeSet<Tp>> = self
            .members
            .keys()
            .map(|id| (id.clone(), BTreeSet::new()))
            .collect();
        let topics: BTreeSet<String> = self
            .members
            .values()
            .flat_map(|m| m.subscribed.iter().cloned())
            .collect();
        if self.assignor == "range" {
            for topic in &topics {
                let Some((id, count)) = partitions_of(topic) else {
                    continue;
                };
                let subscribers: Vec<&String> = self
                    .members
                    .values()
                    .filter(|m| m.subscribed.contains(topic))
                    .map(|m| &m.id)
                    .collect();
                if subscribers.is_empty() {
                    continue;
                }
                let n = subscribers.len() as i32;
                let (per, extra) = (count / n, count % n);
                let mut next = 0;
                for (i, member) in subscribers.iter().enumerate() {
                    let take = per + if (i as i32) < extra { 1 } else { 0 };
                    for p in next..next + take {
                        target.get_mut(*member).expect("member").insert((id, p));
                    }
                    next += take;
                }
            }
        } else {
            // Uniform and sticky: keep what each member had, within its fair share, then hand
            // out the rest to the least loaded subscribers.
            let mut all: Vec<(String, Tp)> = Vec::new();
            for topic in &topics {
                if let Some((id, count)) = partitions_of(topic) {
                    all.extend((0..count).map(|p| (topic.clone(), (id, p))));
                }
            }
            let members = self.members.len().max(1);
            let quota_low = all.len() / members;
            let mut extra_slots = all.len() % members;
            let mut unassigned: Vec<(String, Tp)> = Vec::new();
            let mut placed: BTreeSet<Tp> = BTreeSet::new();
            for (id, m) in &self.members {
                let previous = self.target.get(id).cloned().unwrap_or_default();
                let mut kept: Vec<Tp> = previous
                    .into_iter()
                    .filter(|tp| all.iter().any(|(t, x)| x == tp && m.subscribed.contains(t)))
                    .collect();
                let quota = if extra_slots > 0 && kept.len() > quota_low {
                    extra_slots -= 1;
                    quota_low + 1
                } else {
                    quota_low
                };
                kept.truncate(quota);
                for tp in kept {
                    placed.insert(tp);
                    target.get_mut(id).expect("member").insert(tp);
                }
            }
            for item in &all {
                if !placed.contains(&item.1) {
                    unassigned.push(item.clone());
                }
            }
            for (topic, tp) in unassigned {
                let choice = self
                    .members
                    .values()
                    .filter(|m| m.subscribed.contains(&topic))
                    .min_by_key(|m| (target[&m.id].len(), m.id.clone()))
                    .map(|m| m.id.clone());
                if let Some(id) = choice {
                    target.get_mut(&id).expect("member").insert(tp);
                }
            }
        }
        self.target = target;
        self.assignment_epoch = self.epoch;
    }

    /// A classic member's JoinGroup to this group (Kafka's `classicGroupJoinToConsumerGroup`):
    /// the member is created or updated, the target recomputed if its subscription changed, and
    /// it is reconciled with what it reports owning. Answered at once: the member's epoch is the
    /// generation it syncs and heartbeats with, and SyncGroup hands it its assignment.
    pub fn classic_join(
        &mut self,
        join: ClassicJoin,
        partitions_of: &dyn Fn(&str) -> Option<(uuid::Uuid, i32)>,
    ) -> i32 {
        let id = join.member_id.clone();
        if let Some(instance) = &join.instance_id {
            // KIP-345: a static member back under a new id takes its old identity's place.
            let old = self
                .members
                .values()
                .find(|m| m.instance_id.as_ref() == Some(instance) && m.id != id)
                .map(|m| m.id.clone());
            if let Some(old) = old {
                self.members.remove(&old);
                self.target.remove(&old);
            }
        }
        let mut changed = !self.members.contains_key(&id);
        let m = self
            .members
            .entry(id.clone())
            .or_insert_with(|| ConsumerMember {
                id: id.clone(),
                instance_id: join.instance_id.clone(),
                rack_id: None,
                client_id: String::new(),
                client_host: String::new(),
                epoch: 0,
                subscribed: Vec::new(),
                assignor: None,
                rebalance_timeout_ms: 0,
                assigned: BTreeSet::new(),
                owned: BTreeSet::new(),
                revoking: BTreeSet::new(),
                last_heartbeat: Instant::now(),
                classic: None,
            });
        m.rack_id = join.rack_id;
        m.client_id = join.client_id;
        m.client_host = join.client_host;
        m.rebalance_timeout_ms = join.rebalance_timeout_ms.max(0);
        m.classic = Some(join.classic);
        m.last_heartbeat = Instant::now();
        let mut subscribed = join.subscribed;
        subscribed.sort();
        subscribed.dedup();
        if subscribed != m.subscribed {
            m.subscribed = subscribed;
            changed = true;
        }
        // A classic member rejoining holds exactly what it reports: an eager one has let go of
        // everything, a cooperative one lists what it kept.
        m.owned = join.owned.into_iter().collect();
        let owned = &m.owned;
        m.assigned.retain(|tp| owned.contains(tp));
        if changed {
            self.epoch += 1;
            self.recompute(partitions_of);
        }
        self.reconcile(&id);
        self.members[&id].epoch
    }

    /// Finds a classic member for SyncGroup, Heartbeat or LeaveGroup: by instance id when one
    /// is given (FENCED_INSTANCE_ID if it maps to another member id), else by member id.
    fn classic_member(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<&ConsumerMember, ResponseError> {
        let m = match instance_id {
            Some(instance) => {
                let m = self
                    .members
                    .values()
                    .find(|m| m.instance_id.as_deref() == Some(instance))
                    .ok_or(ResponseError::UnknownMemberId)?;
                if m.id != member_id {
                    return Err(ResponseError::FencedInstanceId);
                }
                m
            }
            None => self
                .members
                .get(member_id)
                .ok_or(ResponseError::UnknownMemberId)?,
        };
        if m.classic.is_none() {
            return Err(ResponseError::UnknownMemberId);
        }
        Ok(m)
    }

    /// A classic member's SyncGroup: its assignment, once it is at its generation and no newer
    /// rebalance waits for it (a member still revoking syncs to learn what it keeps).
    pub fn classic_sync(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
    ) -> Result<BTreeSet<Tp>, ResponseError> {
        let m = self.classic_member(member_id, instance_id)?;
        if m.epoch != generation {
            return Err(ResponseError::IllegalGeneration);
        }
        if self.epoch > m.epoch && m.revoking.is_empty() {
            return Err(ResponseError::RebalanceInProgress);
        }
        let id = m.id.clone();
        let m = self.members.get_mut(&id).expect("found");
        m.last_heartbeat = Instant::now();
        Ok(m.assigned.clone())
    }

    /// A classic member's Heartbeat: REBALANCE_IN_PROGRESS when it must rejoin, that is when
    /// the group epoch moved past it, it must revoke partitions, or partitions of its target
    /// that others held have been released.
    pub fn classic_heartbeat(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
    ) -> Result<(), ResponseError> {
        let m = self.classic_member(member_id, instance_id)?;
        if m.epoch != generation {
            return Err(ResponseError::IllegalGeneration);
        }
        let id = m.id.clone();
        self.members.get_mut(&id).expect("found").last_heartbeat = Instant::now();
        if self.must_rejoin(&id) {
            return Err(ResponseError::RebalanceInProgress);
        }
        Ok(())
    }

    fn must_rejoin(&self, member_id: &str) -> bool {
        let m = &self.members[member_id];
        if m.epoch < self.epoch || !m.revoking.is_empty() {
            return true;
        }
        // Partitions of its target withheld because others held them, now free.
        let Some(target) = self.target.get(member_id) else {
            return false;
        };
        let taken = self.held_by_others(member_id);
        target
            .iter()
            .any(|tp| !m.assigned.contains(tp) && !taken.contains(tp))
    }

    /// Partitions other members than `member_id` are assigned, hold, or are revoking: not free
    /// to give to it.
    fn held_by_others(&self, member_id: &str) -> BTreeSet<Tp> {
        self.members
            .values()
            .filter(|m| m.id != member_id)
            .flat_map(|m| {
                m.assigned
                    .iter()
                    .chain(m.owned.iter())
                    .chain(m.revoking.iter())
                    .copied()
            })
            .collect()
    }

    /// Removes a member (a LeaveGroup, or a consumer-protocol leave); the others are
    /// rebalanced. False if there was no such member.
    pub fn remove_member(
        &mut self,
        member_id: &str,
        partitions_of: &dyn Fn(&str) -> Option<(uuid::Uuid, i32)>,
    ) -> bool {
        if self.members.remove(member_id).is_none() {
            return false;
        }
        self.target.remove(member_id);
        self.epoch += 1;
        self.recompute(partitions_of);
        true
    }

    /// The member id of the static member `instance`, if any.
    pub fn static_member(&self, instance: &str) -> Option<&str> {
        self.members
            .values()
            .find(|m| m.instance_id.as_deref() == Some(instance))
            .map(|m| m.id.as_str())
    }

    /// Whether every member but `except` speaks the classic protocol (and there is another
    /// member): the condition for converting the group back to a classic group when `except`
    /// leaves.
    pub fn only_classic_besides(&self, except: &str) -> bool {
        self.members.keys().any(|id| id != except)
            && self
                .members
                .values()
                .all(|m| m.id == except || m.classic.is_some())
    }

    /// Removes members whose session expired and returns their ids. `session_timeout` is the
    /// broker's `group.consumer.session.timeout.ms`; classic members have their own.
    pub fn expire(
        &mut self,
        now: Instant,
        session_timeout: Duration,
        partitions_of: &dyn Fn(&str) -> Option<(uuid::Uuid, i32)>,
    ) -> Vec<String> {
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| {
                let timeout = m
                    .classic
                    .as_ref()
                    .map_or(session_timeout, |c| c.session_timeout);
                now.duration_since(m.last_heartbeat) > timeout
            })
            .map(|m| m.id.clone())
            .collect();
        for id in &gone {
            self.members.remove(id);
            self.target.remove(id);
        }
        if !gone.is_empty() {
            self.epoch += 1;
            self.recompute(partitions_of);
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics(name: &str) -> Option<(uuid::Uuid, i32)> {
        match name {
            "t" => Some((uuid::Uuid::from_u128(1), 6)),
            _ => None,
        }
    }

    fn join(g: &mut ConsumerGroup, id: &str) -> HeartbeatResult {
        g.heartbeat(
            HeartbeatRequest {
                member_id: id.into(),
                member_epoch: 0,
                instance_id: None,
                rack_id: None,
                rebalance_timeout_ms: 30_000,
                subscribed: Some(vec!["t".into()]),
                assignor: None,
                owned: Some(vec![]),
                client_id: "c".into(),
                client_host: "h".into(),
            },
            &topics,
        )
    }

    fn beat(g: &mut ConsumerGroup, id: &str, epoch: i32, owned: &BTreeSet<Tp>) -> HeartbeatResult {
        g.heartbeat(
            HeartbeatRequest {
                member_id: id.into(),
                member_epoch: epoch,
                instance_id: None,
                rack_id: None,
                rebalance_timeout_ms: 30_000,
                subscribed: None,
                assignor: None,
                owned: Some(owned.iter().copied().collect()),
                client_id: "c".into(),
                client_host: "h".into(),
            },
            &topics,
        )
    }

    fn classic_join(g: &mut ConsumerGroup, id: &str, owned: &BTreeSet<Tp>) -> i32 {
        g.classic_join(
            ClassicJoin {
                member_id: id.into(),
                instance_id: None,
                rack_id: None,
                client_id: "c".into(),
                client_host: "h".into(),
                rebalance_timeout_ms: 30_000,
                subscribed: vec!["t".into()],
                owned: owned.iter().copied().collect(),
                classic: ClassicMember {
                    protocols: vec![("range".into(), Bytes::new())],
                    session_timeout: Duration::from_secs(10),
                },
            },
            &topics,
        )
    }

    fn assert_disjoint(g: &ConsumerGroup) {
        let mut seen = BTreeSet::new();
        for m in g.members.values() {
            for tp in m.assigned.iter().chain(m.owned.iter()) {
                let others = g
                    .members
                    .values()
                    .filter(|o| o.id != m.id && (o.assigned.contains(tp) || o.owned.contains(tp)))
                    .count();
                assert_eq!(others, 0, "{tp:?} held by {} and another", m.id);
                seen.insert(*tp);
            }
        }
    }

    /// A classic member and a consumer-protocol member share a group: the classic one is told to
    /// rejoin by its heartbeat, a cooperative rejoin revokes before anything moves, and no
    /// partition is ever held by both.
    #[test]
    fn classic_members_rejoin_and_revoke_before_partitions_move() {
        let mut g = ConsumerGroup::default();
        let none = BTreeSet::new();
        let gen = classic_join(&mut g, "a", &none);
        let all = g.classic_sync("a", None, gen).expect("synced");
        assert_eq!(all.len(), 6);
        assert_eq!(g.classic_heartbeat("a", None, gen), Ok(()));
        // A consumer-protocol member joins: nothing is free for it yet.
        let b = join(&mut g, "b");
        assert_eq!(b.assignment, Some(BTreeSet::new()));
        assert_disjoint(&g);
        assert_eq!(
            g.classic_heartbeat("a", None, gen),
            Err(ResponseError::RebalanceInProgress)
        );
        assert_eq!(
            g.classic_sync("a", None, gen),
            Err(ResponseError::RebalanceInProgress)
        );
        assert_eq!(
            g.classic_heartbeat("a", None, gen + 5),
            Err(ResponseError::IllegalGeneration)
        );
        // Cooperative: a rejoins still owning everything; three must go first.
        let gen2 = classic_join(&mut g, "a", &all);
        assert_eq!(gen2, gen, "the member keeps its epoch until it has revoked");
        let keep = g
            .classic_sync("a", None, gen2)
            .expect("a member revoking syncs");
        assert_eq!(keep.len(), 3);
        assert_eq!(
            g.classic_heartbeat("a", None, gen2),
            Err(ResponseError::RebalanceInProgress)
        );
        let b = beat(&mut g, "b", b.member_epoch, &BTreeSet::new());
        assert_eq!(b.assignment, Some(BTreeSet::new()), "a still holds them");
        assert_disjoint(&g);
        // a rejoins with what it kept: it is at the group's epoch and b gets the rest.
        let gen3 = classic_join(&mut g, "a", &keep);
        assert_eq!(gen3, g.epoch);
        assert_eq!(g.classic_sync("a", None, gen3).expect("synced"), keep);
        assert_eq!(g.classic_heartbeat("a", None, gen3), Ok(()));
        let b = beat(&mut g, "b", b.member_epoch, &BTreeSet::new());
        let b_parts = b.assignment.expect("assignment");
        assert_eq!(b_parts.len(), 3);
        assert!(b_parts.is_disjoint(&keep));
        assert_disjoint(&g);
        // Unknown, fenced and non-classic members.
        assert_eq!(
            g.classic_heartbeat("zz", None, 1),
            Err(ResponseError::UnknownMemberId)
        );
        assert_eq!(
            g.classic_heartbeat("b", None, b.member_epoch),
            Err(ResponseError::UnknownMemberId)
        );
        assert!(g.only_classic_besides("b"));
        assert!(!g.only_classic_besides("a"));
        assert!(g.remove_member("b", &topics));
        assert_eq!(
            g.classic_heartbeat("a", None, gen3),
            Err(ResponseError::RebalanceInProgress)
        );
    }

    /// No partition is ever held by two members, and the group converges.
    #[test]
    fn partitions_move_only_after_release_and_the_group_converges() {
        let mut g = ConsumerGroup::default();
        let a = join(&mut g, "a");
        assert_eq!(a.assignment.as_ref().unwrap().len(), 6);
        let mut owned: BTreeMap<String, (i32, BTreeSet<Tp>)> = BTreeMap::new();
        owned.insert("a".into(), (a.member_epoch, a.assignment.unwrap()));
        let b = join(&mut g, "b");
        owned.insert("b".into(), (b.member_epoch, b.assignment.unwrap()));
        for round in 0..6 {
            for id in ["a", "b"] {
                let (epoch, have) = owned[id].clone();
                let r = beat(&mut g, id, epoch, &have);
                assert_eq!(r.error, 0, "round {round} member {id}");
                owned.insert(id.into(), (r.member_epoch, r.assignment.unwrap()));
                let a = &owned["a"].1;
                let b = &owned["b"].1;
                assert!(a.is_disjoint(b), "round {round}: {a:?} and {b:?} overlap");
            }
        }
        assert_eq!(owned["a"].1.len(), 3);
        assert_eq!(owned["b"].1.len(), 3);
        assert_eq!(g.state(), "Stable");
        // The first member kept three of its partitions: only three moved.
        assert!(owned["a"].1.iter().all(|tp| tp.1 < 6));
    }

    /// A newcomer is never told "epoch 0" together with partitions: with nothing to revoke it
    /// moves to the target epoch at once, partitions still owned by others follow at that epoch
    /// once released, and its epoch is the one commits are checked against.
    #[test]
    fn a_joining_member_gets_partitions_only_with_the_target_epoch() {
        let mut g = ConsumerGroup::default();
        let a = join(&mut g, "a");
        let all = a.assignment.clone().unwrap();
        assert_eq!(all.len(), 6);
        assert!(a.member_epoch >= 1);
        let a_epoch = a.member_epoch;

        let b = join(&mut g, "b");
        assert_eq!(b.error, 0);
        assert!(
            b.member_epoch > a_epoch,
            "B moves to the new target epoch at once, not 0: {b:?}"
        );
        assert!(
            b.assignment.as_ref().unwrap().is_empty(),
            "A still owns everything"
        );
        let b_epoch = b.member_epoch;
        // Until A reports it let go, B gets nothing, and keeps its epoch.
        let r = beat(&mut g, "b", b_epoch, &BTreeSet::new());
        assert!(r.assignment.unwrap().is_empty());
        assert_eq!(r.member_epoch, b_epoch);

        // A is told to revoke; it keeps its epoch until it acknowledges.
        let r = beat(&mut g, "a", a_epoch, &all);
        assert_eq!(r.member_epoch, a_epoch);
        let a_keeps = r.assignment.unwrap();
        assert_eq!(a_keeps.len(), 3);
        // B still gets nothing: A has not reported the release yet.
        let r = beat(&mut g, "b", b_epoch, &BTreeSet::new());
        assert!(r.assignment.unwrap().is_empty());
        // A acknowledges and reaches the new epoch.
        let r = beat(&mut g, "a", a_epoch, &a_keeps);
        assert_eq!(r.member_epoch, b_epoch);
        assert_eq!(r.assignment.unwrap(), a_keeps);
        // Now B gets the rest, at the epoch it already had.
        let r = beat(&mut g, "b", b_epoch, &BTreeSet::new());
        assert_eq!(r.member_epoch, b_epoch);
        let b_gets = r.assignment.unwrap();
        assert_eq!(b_gets.len(), 3);
        assert!(b_gets.is_disjoint(&a_keeps));
        assert_eq!(
            g.members["b"].epoch, b_epoch,
            "commits are checked against this"
        );
        let r = beat(&mut g, "b", b_epoch, &b_gets);
        assert_eq!(r.assignment.unwrap(), b_gets);
        assert_eq!(g.state(), "Stable");
    }

    /// Members join, heartbeat and acknowledge in a scrambled order, some acknowledging late:
    /// no response pairs partitions with epoch 0 (or an epoch the group has not reached), no
    /// partition is owned by two members at once, and the group converges.
    #[test]
    fn scrambled_heartbeats_never_pair_partitions_with_epoch_zero() {
        for seed in 1..=200u64 {
            let mut rng = seed;
            let mut next = move |n: u64| {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (rng >> 33) % n
            };
            let mut g = ConsumerGroup::default();
            // Per member: (epoch, owned, the latest response not applied yet).
            type Client = (i32, BTreeSet<Tp>, Option<(i32, BTreeSet<Tp>)>);
            let mut clients: BTreeMap<String, Client> = BTreeMap::new();
            let names = ["a", "b", "c"];
            for step in 0..120 {
                let name = names[next(3) as usize];
                let r = match clients.get_mut(name) {
                    None => join(&mut g, name),
                    Some((epoch, owned, pending)) => {
                        if next(3) != 0 {
                            if let Some((e, assignment)) = pending.take() {
                                *epoch = e;
                                *owned = assignment;
                            }
                        }
                        let (epoch, owned) = (*epoch, owned.clone());
                        beat(&mut g, name, epoch, &owned)
                    }
                };
                assert_eq!(r.error, 0, "seed {seed} step {step}: {r:?}");
                let assignment = r.assignment.clone().unwrap();
                assert!(
                    assignment.is_empty() || r.member_epoch >= 1,
                    "seed {seed} step {step}: {name} got {assignment:?} at epoch {}",
                    r.member_epoch
                );
                assert!(r.member_epoch <= g.epoch);
                let c = clients
                    .entry(name.to_string())
                    .or_insert((0, BTreeSet::new(), None));
                c.2 = Some((r.member_epoch, assignment));
                let mut seen = BTreeSet::new();
                for (_, owned, _) in clients.values() {
                    for tp in owned {
                        assert!(
                            seen.insert(*tp),
                            "seed {seed} step {step}: {tp:?} owned twice"
                        );
                    }
                }
            }
            // Everyone applies and heartbeats until the group is stable.
            for _ in 0..6 {
                for name in names {
                    let Some((epoch, owned, pending)) = clients.get_mut(name) else {
                        continue;
                    };
                    if let Some((e, assignment)) = pending.take() {
                        *epoch = e;
                        *owned = assignment;
                    }
                    let r = beat(&mut g, name, *epoch, &owned.clone());
                    *pending = Some((r.member_epoch, r.assignment.unwrap()));
                }
            }
            assert_eq!(g.state(), "Stable", "seed {seed}");
            let total: usize = g.members.values().map(|m| m.assigned.len()).sum();
            assert_eq!(total, 6, "seed {seed}");
        }
    }

    #[test]
    fn unknown_and_fenced_members_are_refused() {
        let mut g = ConsumerGroup::default();
        let r = beat(&mut g, "ghost", 3, &BTreeSet::new());
        assert_eq!(r.error, ResponseError::UnknownMemberId.code());
        let a = join(&mut g, "a");
        let r = beat(&mut g, "a", a.member_epoch + 5, &BTreeSet::new());
        assert_eq!(r.error, ResponseError::FencedMemberEpoch.code());
    }

    #[test]
    fn range_assignor_gives_contiguous_ranges() {
        let mut g = ConsumerGroup::default();
        for id in ["a", "b", "c", "d"] {
            let mut req = HeartbeatRequest {
                member_id: id.into(),
                member_epoch: 0,
                instance_id: None,
                rack_id: None,
                rebalance_timeout_ms: 30_000,
                subscribed: Some(vec!["t".into()]),
                assignor: Some("range".into()),
                owned: Some(vec![]),
                client_id: "c".into(),
                client_host: "h".into(),
            };
            req.member_id = id.into();
            g.heartbeat(req, &topics);
        }
        let sizes: Vec<usize> = g.target.values().map(|s| s.len()).collect();
        assert_eq!(sizes, vec![2, 2, 1, 1]);
        let a: Vec<i32> = g.target["a"].iter().map(|tp| tp.1).collect();
        assert_eq!(a, vec![0, 1]);
    }
}
