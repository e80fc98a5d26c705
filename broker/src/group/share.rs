//! Share group membership (KIP-932): members heartbeat with ShareGroupHeartbeat and the
//! coordinator assigns them partitions with its server-side `simple` assignor. Unlike a consumer
//! group, a partition may be assigned to many members at once — the share partitions on the
//! leaders hand each record to one member under an acquisition lock — so an assignment never
//! waits for a revocation: a member moves to the group's epoch and its target assignment in the
//! same response.
//!
//! Epochs: the group epoch rises with every change of membership or subscriptions, and the
//! target assignment is recomputed for it. A member's epoch is the group epoch of the last
//! assignment it was sent; a member heartbeating with an older epoch gets the new one with its
//! assignment, one at the current epoch gets neither (nothing changed).
//!
//! I/O-free: time comes in, and what the shard must do (release the records of members that
//! left) goes out as member ids.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;

use super::consumer::Tp;

/// The assignor share groups use (Kafka's `group.share.assignors` default).
pub const ASSIGNOR: &str = "simple";

#[derive(Clone, Debug)]
pub struct ShareMember {
    pub id: String,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    /// The group epoch of the assignment the member was last sent.
    pub epoch: i32,
    pub subscribed: Vec<String>,
    pub assigned: BTreeSet<Tp>,
    pub last_heartbeat: Instant,
}

#[derive(Clone, Debug, Default)]
pub struct ShareGroup {
    pub epoch: i32,
    /// The group epoch the target assignment was computed for.
    pub assignment_epoch: i32,
    pub members: BTreeMap<String, ShareMember>,
    /// Every topic a member subscribed to since the group was made: the topics whose share
    /// partitions may have persisted state (Kafka's initialized topics), which offsets
    /// describes and the group's deletion go through.
    pub topics: std::collections::BTreeSet<String>,
}

/// A ShareGroupHeartbeat, as the coordinator reads it.
pub struct ShareHeartbeat {
    pub member_id: String,
    /// 0 to join, -1 to leave, else the epoch the member has.
    pub member_epoch: i32,
    pub rack_id: Option<String>,
    /// `None`: unchanged since the last heartbeat.
    pub subscribed: Option<Vec<String>>,
    pub client_id: String,
    pub client_host: String,
}

#[derive(Debug, Default)]
pub struct ShareHeartbeatResult {
    pub error: i16,
    pub message: Option<String>,
    pub member_id: String,
    pub member_epoch: i32,
    /// Sent when the member's epoch moved (`None`: keep what you have).
    pub assignment: Option<BTreeSet<Tp>>,
    /// Set when the member left or was fenced: the share partitions release what it holds.
    pub left: Option<String>,
}

impl ShareGroup {
    /// `Empty` or `Stable`: a share group has no rebalance phases.
    pub fn state(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else {
            "Stable"
        }
    }

    /// One heartbeat. `partitions_of` gives a topic's id and partition count (`None`: no such
    /// topic); `max_size` bounds the members (`group.share.max.size`).
    pub fn heartbeat(
        &mut self,
        req: ShareHeartbeat,
        now: Instant,
        max_size: usize,
        partitions_of: &dyn Fn(&str) -> Option<(uuid::Uuid, i32)>,
    ) -> ShareHeartbeatResult {
        let fail = |e: ResponseError, message: String| ShareHeartbeatResult {
            error: e.code(),
            message: Some(message),
            ..Default::default()
        };
        if req.member_id.is_empty() {
            // Clients of Kafka 4 make up their member id (a UUID) before they join.
            return fail(
                ResponseError::InvalidRequest,
                "MemberId can't be empty.".into(),
            );
        }
        if req.member_epoch < 0 {
            // Leaving: whatever it held goes back to the others.
            if self.members.remove(&req.member_id).is_some() {
                self.epoch += 1;
                self.recompute(partitions_of);
            }
            return ShareHeartbeatResult {
                member_id: req.member_id.clone(),
                member_epoch: req.member_epoch,
                left: Some(req.member_id),
                ..Default::default()
            };
        }
        let joining = req.member_epoch == 0;
        match self.members.get(&req.member_id) {
            None if !joining => {
                return fail(
                    ResponseError::UnknownMemberId,
                    format!("Member {} is not a member of the group.", req.member_id),
                )
            }
            Some(m) if !joining && req.member_epoch > m.epoch => {
                return ShareHeartbeatResult {
                    left: Some(req.member_id.clone()),
                    ..fail(
                        ResponseError::FencedMemberEpoch,
                        format!(
                            "The share group member has a greater member epoch ({}) than the one known by the group coordinator ({}).",
                            req.member_epoch, m.epoch
                        ),
                    )
                };
            }
            None if self.members.len() >= max_size => {
                return fail(
                    ResponseError::GroupMaxSizeReached,
                    format!(
                        "The share group has reached its maximum capacity of {max_size} members."
                    ),
                )
            }
            None if req.subscribed.as_ref().is_none_or(|s| s.is_empty()) => {
                return fail(
                    ResponseError::InvalidRequest,
                    "SubscribedTopicNames must be set in first request.".into(),
                )
            }
            _ => {}
        }
        let mut changed = false;
        let member = self
            .members
            .entry(req.member_id.clone())
            .or_insert_with(|| {
                changed = true;
                ShareMember {
                    id: req.member_id.clone(),
                    rack_id: None,
                    client_id: String::new(),
                    client_host: String::new(),
                    epoch: 0,
                    subscribed: Vec::new(),
                    assigned: BTreeSet::new(),
                    last_heartbeat: now,
                }
            });
        member.last_heartbeat = now;
        member.client_id = req.client_id;
        member.client_host = req.client_host;
        if req.rack_id.is_some() {
            member.rack_id = req.rack_id;
        }
        if let Some(mut topics) = req.subscribed {
            topics.sort();
            topics.dedup();
            if topics != member.subscribed {
                self.topics.extend(topics.iter().cloned());
                member.subscribed = topics;
                changed = true;
            }
        }
        if changed {
            self.epoch += 1;
            self.recompute(partitions_of);
        } else if self.assignment_epoch < self.epoch {
            self.recompute(partitions_of);
        }
        let epoch = self.epoch;
        let member = self
            .members
            .get_mut(&req.member_id)
            .expect("the member was just inserted");
        // A joining member always gets its assignment; another one when its epoch is behind.
        let send = joining || req.member_epoch < epoch || member.epoch < epoch;
        member.epoch = epoch;
        ShareHeartbeatResult {
            member_id: req.member_id,
            member_epoch: epoch,
            assignment: send.then(|| member.assigned.clone()),
            ..Default::default()
        }
    }

    /// The `simple` assignor: per topic, with M subscribed members (sorted by id) and P
    /// partitions, partition p goes to member p mod M when there are fewer members than
    /// partitions, and member m gets partition m mod P otherwise — every member gets work even
    /// on a one-partition topic, and every partition has a member.
    pub fn recompute(&mut self, partitions_of: &dyn Fn(&str) -> Option<(uuid::Uuid, i32)>) {
        let topics: BTreeSet<&String> = self
            .members
            .values()
            .flat_map(|m| m.subscribed.iter())
            .collect();
        let mut target: BTreeMap<String, BTreeSet<Tp>> = self
            .members
            .keys()
            .map(|id| (id.clone(), BTreeSet::new()))
            .collect();
        for topic in topics {
            let Some((id, partitions)) = partitions_of(topic) else {
                continue;
            };
            if partitions <= 0 {
                continue;
            }
            let subscribers: Vec<&String> = self
                .members
                .values()
                .filter(|m| m.subscribed.contains(topic))
                .map(|m| &m.id)
                .collect();
            let m = subscribers.len();
            if m == 0 {
                continue;
            }
            if m < partitions as usize {
                for p in 0..partitions {
                    let member = subscribers[p as usize % m];
                    target.get_mut(member).expect("a member").insert((id, p));
                }
            } else {
                for (i, member) in subscribers.iter().enumerate() {
                    let p = (i % partitions as usize) as i32;
                    target.get_mut(*member).expect("a member").insert((id, p));
                }
            }
        }
        for (id, assigned) in target {
            if let Some(m) = self.members.get_mut(&id) {
                m.assigned = assigned;
            }
        }
        self.assignment_epoch = self.epoch;
    }

    /// Members silent for longer than `session_timeout` leave; their ids (the shard releases
    /// what they hold).
    pub fn expire(
        &mut self,
        now: Instant,
        session_timeout: Duration,
        partitions_of: &dyn Fn(&str) -> Option<(uuid::Uuid, i32)>,
    ) -> Vec<String> {
        let expired: Vec<String> = self
            .members
            .values()
            .filter(|m| now.saturating_duration_since(m.last_heartbeat) > session_timeout)
            .map(|m| m.id.clone())
            .collect();
        if !expired.is_empty() {
            for id in &expired {
                self.members.remove(id);
            }
            self.epoch += 1;
            self.recompute(partitions_of);
        }
        expired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics(name: &str) -> Option<(uuid::Uuid, i32)> {
        match name {
            "one" => Some((uuid::Uuid::from_u128(1), 1)),
            "six" => Some((uuid::Uuid::from_u128(6), 6)),
            _ => None,
        }
    }

    fn join(g: &mut ShareGroup, id: &str, topics_: &[&str], now: Instant) -> ShareHeartbeatResult {
        g.heartbeat(
            ShareHeartbeat {
                member_id: id.into(),
                member_epoch: 0,
                rack_id: None,
                subscribed: Some(topics_.iter().map(|t| t.to_string()).collect()),
                client_id: "c".into(),
                client_host: "/127.0.0.1".into(),
            },
            now,
            200,
            &topics,
        )
    }

    fn beat(g: &mut ShareGroup, id: &str, epoch: i32, now: Instant) -> ShareHeartbeatResult {
        g.heartbeat(
            ShareHeartbeat {
                member_id: id.into(),
                member_epoch: epoch,
                rack_id: None,
                subscribed: None,
                client_id: "c".into(),
                client_host: "/127.0.0.1".into(),
            },
            now,
            200,
            &topics,
        )
    }

    #[test]
    fn every_member_of_a_one_partition_topic_gets_the_partition() {
        let mut g = ShareGroup::default();
        let now = Instant::now();
        for id in ["a", "b", "c", "d"] {
            let r = join(&mut g, id, &["one"], now);
            assert_eq!(r.error, 0);
        }
        for m in g.members.values() {
            assert_eq!(
                m.assigned,
                BTreeSet::from([(uuid::Uuid::from_u128(1), 0)]),
                "{}",
                m.id
            );
        }
        // An earlier member learns of the new epoch, keeping its partition.
        let r = beat(&mut g, "a", 1, now);
        assert_eq!(r.member_epoch, 4);
        assert_eq!(r.assignment.map(|a| a.len()), Some(1));
        let r = beat(&mut g, "a", 4, now);
        assert_eq!(r.assignment, None, "nothing changed: no assignment sent");
    }

    #[test]
    fn partitions_spread_over_fewer_members_with_none_left_out() {
        let mut g = ShareGroup::default();
        let now = Instant::now();
        join(&mut g, "a", &["six"], now);
        join(&mut g, "b", &["six"], now);
        join(&mut g, "c", &["six", "one"], now);
        let mut all: Vec<Tp> = g
            .members
            .values()
            .flat_map(|m| m.assigned.iter().copied())
            .collect();
        all.sort();
        let six: Vec<Tp> = (0..6).map(|p| (uuid::Uuid::from_u128(6), p)).collect();
        assert_eq!(all.len(), 7);
        assert!(six.iter().all(|tp| all.contains(tp)));
        assert!(g.members.values().all(|m| m.assigned.len() >= 2));
        assert!(g.members["c"]
            .assigned
            .contains(&(uuid::Uuid::from_u128(1), 0)));
    }

    #[test]
    fn leaving_and_expiring_members_bump_the_epoch_and_are_reported() {
        let mut g = ShareGroup::default();
        let t0 = Instant::now();
        join(&mut g, "a", &["six"], t0);
        join(&mut g, "b", &["six"], t0);
        let r = beat(&mut g, "a", -1, t0);
        assert_eq!(r.left.as_deref(), Some("a"));
        assert_eq!(g.epoch, 3);
        assert_eq!(g.members["b"].assigned.len(), 6);
        let later = t0 + Duration::from_secs(10);
        let expired = g.expire(later, Duration::from_secs(5), &topics);
        assert_eq!(expired, vec!["b".to_string()]);
        assert_eq!(g.state(), "Empty");
        assert_eq!(
            beat(&mut g, "b", 3, later).error,
            ResponseError::UnknownMemberId.code()
        );
    }

    #[test]
    fn a_first_heartbeat_needs_a_member_id_and_a_subscription() {
        let mut g = ShareGroup::default();
        let now = Instant::now();
        assert_eq!(
            join(&mut g, "", &["one"], now).error,
            ResponseError::InvalidRequest.code()
        );
        assert_eq!(
            join(&mut g, "a", &[], now).error,
            ResponseError::InvalidRequest.code()
        );
        join(&mut g, "a", &["one"], now);
        assert_eq!(
            beat(&mut g, "a", 7, now).error,
            ResponseError::FencedMemberEpoch.code()
        );
    }
}
