//! Partition reassignment (KIP-455), as Kafka's controller runs it: a reassignment widens the
//! replica set to the target plus the replicas leaving it; the new replicas fetch from the
//! leader, and once every one of them is in the ISR the controller narrows the replica set to
//! the target (electing a new leader if the old one leaves). A cancellation goes back to the
//! replicas the partition had before.

use super::*;

impl Controller {
    pub(super) fn alter_reassignments(
        &mut self,
        r: &AlterPartitionReassignmentsRequest,
    ) -> (Vec<Record>, ControllerResponse) {
        let mut records = Vec::new();
        let mut results = Vec::new();
        for (topic, partitions) in &r.topics {
            for (partition_id, target) in partitions {
                let outcome = self.reassign(
                    topic,
                    *partition_id,
                    target.as_deref(),
                    r.allow_replication_factor_change,
                );
                let (error_code, error_message) = match outcome {
                    Ok(change) => {
                        if let Some(change) = change {
                            // One record each, applied at once, so that a partition named
                            // twice sees its first change.
                            self.emit(&mut records, vec![Record::PartitionChange(change)]);
                        }
                        (NONE, None)
                    }
                    Err((code, message)) => (code, Some(message)),
                };
                results.push(ReassignmentResult {
                    topic: topic.clone(),
                    partition_id: *partition_id,
                    error_code,
                    error_message,
                });
            }
        }
        (
            records,
            ControllerResponse::AlterPartitionReassignments(AlterPartitionReassignmentsResponse {
                error_code: NONE,
                results,
            }),
        )
    }

    /// The change one partition's reassignment (or cancellation) makes, `None` for none.
    fn reassign(
        &self,
        topic: &str,
        partition_id: i32,
        target: Option<&[BrokerId]>,
        allow_replication_factor_change: bool,
    ) -> Result<Option<PartitionChangeRecord>, (i16, String)> {
        let unknown = || {
            (
                UNKNOWN_TOPIC_OR_PARTITION,
                format!("Unable to find partition {topic}-{partition_id}."),
            )
        };
        let t = self.image().topic(topic).ok_or_else(unknown)?;
        let p = t.partitions.get(&partition_id).ok_or_else(unknown)?;
        // What the partition had before any reassignment in progress.
        let original: Vec<BrokerId> = p
            .replicas
            .iter()
            .copied()
            .filter(|b| !p.adding_replicas.contains(b))
            .collect();
        let target: Vec<BrokerId> = match target {
            None => {
                if p.adding_replicas.is_empty() && p.removing_replicas.is_empty() {
                    return Err((
                        NO_REASSIGNMENT_IN_PROGRESS,
                        format!("No reassignment is in progress for {topic}-{partition_id}."),
                    ));
                }
                original.clone()
            }
            Some(target) => {
                self.check_reassignment_target(target)?;
                if !allow_replication_factor_change && target.len() != original.len() {
                    return Err((
                        INVALID_REPLICATION_FACTOR,
                        format!(
                            "The replication factor is changed from {} to {} but \
                             allowReplicationFactorChange is false.",
                            original.len(),
                            target.len()
                        ),
                    ));
                }
                target.to_vec()
            }
        };
        Ok(self.move_replicas(t.id, partition_id, p, &original, &target))
    }

    fn check_reassignment_target(&self, target: &[BrokerId]) -> Result<(), (i16, String)> {
        if target.is_empty() {
            return Err((
                INVALID_REPLICA_ASSIGNMENT,
                "The target replica list is empty.".into(),
            ));
        }
        let mut distinct = target.to_vec();
        distinct.sort();
        distinct.dedup();
        if distinct.len() != target.len() {
            return Err((
                INVALID_REPLICA_ASSIGNMENT,
                format!("The target replicas {target:?} contain a duplicate broker."),
            ));
        }
        if let Some(b) = target.iter().find(|b| self.image().broker(**b).is_none()) {
            return Err((
                INVALID_REPLICA_ASSIGNMENT,
                format!(
                    "The target replicas include broker {b}, but no such broker is registered."
                ),
            ));
        }
        self.check_replication_factor(target.len())
            .map_err(|m| (INVALID_REPLICA_ASSIGNMENT, m))
    }

    /// The change that moves a partition from `original` towards `target`: done at once when
    /// every replica it adds is in the ISR already (a reorder, a shrink), else the widened
    /// replica set with its adding and removing replicas.
    fn move_replicas(
        &self,
        topic_id: TopicId,
        partition_id: i32,
        p: &PartitionRegistration,
        original: &[BrokerId],
        target: &[BrokerId],
    ) -> Option<PartitionChangeRecord> {
        let removing: Vec<BrokerId> = original
            .iter()
            .copied()
            .filter(|b| !target.contains(b))
            .collect();
        let adding: Vec<BrokerId> = target
            .iter()
            .copied()
            .filter(|b| !original.contains(b))
            .collect();
        let mut replicas = target.to_vec();
        replicas.extend(&removing);
        // Replicas a cancellation drops leave the ISR with the replica set.
        let isr: Vec<BrokerId> = p
            .isr
            .iter()
            .copied()
            .filter(|b| replicas.contains(b))
            .collect();
        let moving = PartitionRegistration {
            replicas,
            isr,
            removing_replicas: removing,
            adding_replicas: adding,
            ..p.clone()
        };
        let mut change = PartitionChangeRecord {
            partition_id,
            topic_id,
            ..Default::default()
        };
        let mut next = self
            .complete_reassignment(&moving, &moving.isr)
            .unwrap_or(moving);
        if next.leader != BrokerId::NONE && !next.isr.contains(&next.leader) {
            // A cancellation drops the adding replica that led.
            next.leader = next
                .replicas
                .iter()
                .copied()
                .find(|b| next.isr.contains(b) && self.can_lead(*b))
                .unwrap_or(BrokerId::NONE);
        }
        if next.replicas == p.replicas
            && next.isr == p.isr
            && next.adding_replicas == p.adding_replicas
            && next.removing_replicas == p.removing_replicas
            && next.leader == p.leader
        {
            return None;
        }
        fill_change(&mut change, p, &next);
        Some(change)
    }

    /// The partition once its reassignment completes with `isr`: every adding replica is in
    /// the ISR and some target replica there can lead. `None` when no reassignment is in
    /// progress or it cannot complete yet. The leader is kept if it stays, else the first
    /// target replica in the ISR that can lead; replicas leaving also fence the leader epoch
    /// (the leader's epoch moves on), as Kafka's controller does, so they stop fetching.
    pub(super) fn complete_reassignment(
        &self,
        p: &PartitionRegistration,
        isr: &[BrokerId],
    ) -> Option<PartitionRegistration> {
        if p.adding_replicas.is_empty() && p.removing_replicas.is_empty() {
            return None;
        }
        let keep = |b: &BrokerId| !p.removing_replicas.contains(b);
        let isr: Vec<BrokerId> = isr.iter().copied().filter(keep).collect();
        if isr.is_empty() || p.adding_replicas.iter().any(|b| !isr.contains(b)) {
            return None;
        }
        let replicas: Vec<BrokerId> = p.replicas.iter().copied().filter(keep).collect();
        let leader = if isr.contains(&p.leader) {
            p.leader
        } else {
            *replicas
                .iter()
                .find(|b| isr.contains(b) && self.can_lead(**b))?
        };
        Some(PartitionRegistration {
            eligible_leader_replicas: p
                .eligible_leader_replicas
                .iter()
                .copied()
                .filter(keep)
                .collect(),
            last_known_elr: p.last_known_elr.iter().copied().filter(keep).collect(),
            replicas,
            isr,
            leader,
            removing_replicas: vec![],
            adding_replicas: vec![],
            ..p.clone()
        })
    }

    pub(super) fn list_reassignments(
        &self,
        r: &ListPartitionReassignmentsRequest,
    ) -> ControllerResponse {
        let ongoing = |topic: &TopicImage, partition_id: i32| {
            let p = topic.partitions.get(&partition_id)?;
            (!p.adding_replicas.is_empty() || !p.removing_replicas.is_empty()).then(|| {
                OngoingReassignment {
                    topic: topic.name.clone(),
                    partition_id,
                    replicas: p.replicas.clone(),
                    adding_replicas: p.adding_replicas.clone(),
                    removing_replicas: p.removing_replicas.clone(),
                }
            })
        };
        let reassignments = match &r.topics {
            None => self
                .image()
                .topics()
                .flat_map(|t| t.partitions.keys().filter_map(|&i| ongoing(t, i)))
                .collect(),
            Some(list) => list
                .iter()
                .filter_map(|(name, ids)| Some((self.image().topic(name)?, ids)))
                .flat_map(|(t, ids)| ids.iter().filter_map(|&i| ongoing(t, i)))
                .collect(),
        };
        ControllerResponse::ListPartitionReassignments(ListPartitionReassignmentsResponse {
            error_code: NONE,
            reassignments,
        })
    }
}

/// Sets in `change` the fields in which `next` differs from `p`; a leader that moves or a
/// replica set that loses members moves the leader epoch on.
pub(super) fn fill_change(
    change: &mut PartitionChangeRecord,
    p: &PartitionRegistration,
    next: &PartitionRegistration,
) {
    if next.replicas != p.replicas {
        change.replicas = Some(next.replicas.clone());
    }
    if next.isr != p.isr {
        change.isr = Some(next.isr.clone());
    }
    if next.adding_replicas != p.adding_replicas {
        change.adding_replicas = Some(next.adding_replicas.clone());
    }
    if next.removing_replicas != p.removing_replicas {
        change.removing_replicas = Some(next.removing_replicas.clone());
    }
    if next.eligible_leader_replicas != p.eligible_leader_replicas {
        change.eligible_leader_replicas = Some(next.eligible_leader_replicas.clone());
    }
    if next.last_known_elr != p.last_known_elr {
        change.last_known_elr = Some(next.last_known_elr.clone());
    }
    let shrunk = p.replicas.iter().any(|b| !next.replicas.contains(b));
    if next.leader != p.leader || shrunk {
        change.leader = Some(next.leader);
    }
}
