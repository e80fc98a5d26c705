//! The KIP-848 consumer group protocol: members heartbeat with ConsumerGroupHeartbeat, the
//! coordinator computes the target assignment with a server-side assignor (`uniform` or
//! `range`), and moves each member towards its target without ever giving a partition to a new
//! owner before the previous owner has reported it released.
//!
//! Epochs: the group epoch rises with every change of membership or subscriptions; the target
//! assignment is recomputed for it; a member's epoch reaches the group epoch once it owns exactly
//! its target. A member revokes first (its assignment shrinks to what it keeps), acknowledges by
//! reporting what it owns, and only then receives partitions freed by others.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;

/// `group.consumer.heartbeat.interval.ms` (Kafka's default is 5000; a shorter interval moves
/// partitions between members sooner, for a few more small requests).
pub const HEARTBEAT_INTERVAL_MS: i32 = 2_000;
/// `group.consumer.session.timeout.ms`
pub const SESSION_TIMEOUT_MS: u64 = 45_000;
pub const ASSIGNORS: &[&str] = &["uniform", "range"];

/// A partition by topic id.
pub type Tp = (uuid::Uuid, i32);

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
    pub last_heartbeat: Instant,
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
        } else if self
            .members
            .values()
            .any(|m| m.epoch != self.assignment_epoch)
        {
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
                    last_heartbeat: Instant::now(),
                });
            // A member (re)joining owns nothing yet.
            m.epoch = 0;
            m.assigned.clear();
            m.owned.clear();
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

    /// Moves one member towards its target: shrink first, grow only into free partitions.
    fn reconcile(&mut self, member_id: &str) {
        let target = self.target.get(member_id).cloned().unwrap_or_default();
        let taken: BTreeSet<Tp> = self
            .members
            .values()
            .filter(|m| m.id != member_id)
            .flat_map(|m| m.assigned.iter().chain(m.owned.iter()).copied())
            .collect();
        let assignment_epoch = self.assignment_epoch;
        let m = self.members.get_mut(member_id).expect("member exists");
        let keep: BTreeSet<Tp> = m.assigned.intersection(&target).copied().collect();
        if keep.len() < m.assigned.len() {
            // Revocation first; the member keeps its epoch until it has let go.
            m.assigned = keep;
            return;
        }
        let free: Vec<Tp> = target
            .iter()
            .filter(|tp| !m.assigned.contains(tp) && !taken.contains(tp))
            .copied()
            .collect();
        m.assigned.extend(free);
        if m.assigned == target {
            m.epoch = assignment_epoch;
        }
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

    /// Removes members whose session expired; true if any was.
    pub fn expire(
        &mut self,
        now: Instant,
        partitions_of: &dyn Fn(&str) -> Option<(uuid::Uuid, i32)>,
    ) -> Vec<String> {
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| {
                now.duration_since(m.last_heartbeat) > Duration::from_millis(SESSION_TIMEOUT_MS)
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
