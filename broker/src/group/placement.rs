//! Taking over the commits that earlier releases placed on another `__consumer_offsets` partition:
//! what is kept of the batches read ([`Strays`], I/O-free); the reads are the shard's
//! (`shard/placement.rs`).
//!
//! Releases before this one placed a group on partition `(hash & 0x7fffffff) % n`; Kafka, and
//! this release, on `abs(hash) % n` (`offsets_topic::partition_for`). The two agree for a hash
//! that is not negative and differ for most negative ones, so after an upgrade some groups'
//! commits sit on a partition that no longer coordinates them.
//!
//! A coordinator that loads partition `P` and finds no placement record in its log has not taken
//! them over yet. Before it serves any group of `P`, it reads every other offsets partition from
//! its leader with Kafka's ListOffsets and Fetch (the same requests a consumer of
//! `__consumer_offsets` sends), keeps the commits of the groups that now belong to `P` and were
//! placed on the partition read, appends them to `P` (where `P` has no commit of its own for the
//! same group and partition), then appends the placement record. Until then the groups of `P`
//! answer COORDINATOR_LOAD_IN_PROGRESS, so no member can start from a missing commit. With the
//! record in the log, later loads of `P` never look elsewhere again: a group deleted after the
//! upgrade does not come back from its old partition, where its stale commits stay until the
//! partition is compacted (the loader of that partition skips them).
//!
//! A new cluster pays one ListOffsets and one Fetch per other partition's leader per partition,
//! once. What is left out: offsets of a transaction still open at the upgrade (its marker ends up
//! on the old partition after the read) are not taken over; the transaction's records are.

use std::collections::{BTreeMap, HashMap};

use sluice_engine::batch::{BatchHeader, Records};
use sluice_engine::producer_state::{control_type, CONTROL_TYPE_COMMIT};

use super::offsets_topic;
use super::Committed;

/// A group's commits, by topic and partition.
pub type Commits = BTreeMap<(String, i32), Committed>;

/// A transactional commit waiting for its marker: the group, its topic and partition, the commit.
type PendingCommit = (String, (String, i32), Committed);

/// The commits of the groups that now belong to partition `index` and that earlier releases
/// placed elsewhere, gathered from those partitions' batches. I/O-free: fed batches in log order
/// per partition read.
pub struct Strays {
    index: i32,
    partitions: i32,
    groups: HashMap<String, Commits>,
    /// Transactional commits until their marker, by the partition read and producer id.
    pending: HashMap<(i32, i64), Vec<PendingCommit>>,
}

impl Strays {
    pub fn new(index: i32, partitions: i32) -> Strays {
        Strays {
            index,
            partitions,
            groups: HashMap::new(),
            pending: HashMap::new(),
        }
    }

    /// Whether an earlier release placed `group` on `from` and it now belongs to this partition.
    fn wanted(&self, group: &str, from: i32) -> bool {
        from != self.index
            && offsets_topic::legacy_partition_for(group, self.partitions) == from
            && offsets_topic::partition_for(group, self.partitions) == self.index
    }

    /// One whole batch of offsets partition `from`.
    pub fn apply(&mut self, from: i32, batch: &[u8]) {
        let Ok(header) = BatchHeader::parse(batch) else {
            return;
        };
        if header.is_control() {
            if let Some(commits) = self.pending.remove(&(from, header.producer_id())) {
                if control_type(batch) == Some(CONTROL_TYPE_COMMIT) {
                    for (group, key, committed) in commits {
                        self.groups.entry(group).or_default().insert(key, committed);
                    }
                }
            }
            return;
        }
        let txn_producer = header.is_transactional().then(|| header.producer_id());
        for record in Records::new(batch) {
            let Ok(record) = record else { break };
            let Some(key) = record.key.and_then(offsets_topic::decode_key) else {
                continue;
            };
            if !self.wanted(&key.group, from) {
                continue;
            }
            let value = record.value.and_then(offsets_topic::decode_value);
            let at = (key.topic, key.partition);
            match (value, txn_producer) {
                (Some(v), producer) => {
                    let committed = Committed {
                        offset: v.offset,
                        leader_epoch: v.leader_epoch,
                        metadata: v.metadata,
                    };
                    match producer {
                        Some(pid) => self
                            .pending
                            .entry((from, pid))
                            .or_default()
                            .push((key.group, at, committed)),
                        None => {
                            self.groups
                                .entry(key.group)
                                .or_default()
                                .insert(at, committed);
                        }
                    }
                }
                (None, _) => {
                    if let Some(commits) = self.groups.get_mut(&key.group) {
                        commits.remove(&at);
                    }
                }
            }
        }
    }

    /// The groups with commits left, by group id.
    pub fn finish(mut self) -> HashMap<String, Commits> {
        self.groups.retain(|_, commits| !commits.is_empty());
        self.groups
    }
}

/// A batch of commits (`None`: a tombstone) as a coordinator writes it, for tests.
#[cfg(test)]
pub(crate) fn batch(
    commits: &[(&str, &str, i32, Option<i64>)],
    producer: Option<i64>,
) -> bytes::Bytes {
    use sluice_engine::batch::{BatchBuilder, NewRecord, ATTR_TRANSACTIONAL};
    let mut b = BatchBuilder::new();
    if let Some(pid) = producer {
        b = b.producer(pid, 0, -1).attributes(ATTR_TRANSACTIONAL);
    }
    for &(group, topic, partition, offset) in commits {
        let key = offsets_topic::encode_key(&offsets_topic::CommitKey {
            group: group.into(),
            topic: topic.into(),
            partition,
        });
        let value = offset.map(|offset| {
            offsets_topic::encode_value(&offsets_topic::CommitValue {
                offset,
                leader_epoch: -1,
                metadata: String::new(),
                commit_timestamp: 0,
            })
        });
        b.push(&NewRecord {
            key: Some(key.to_vec()),
            value: value.map(|v| v.to_vec()),
            headers: Vec::new(),
            timestamp: sluice_engine::Timestamp(0),
        });
    }
    b.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: i32 = 5;

    /// The first `base-i` whose old and new partitions differ.
    fn moving(base: &str) -> (String, i32, i32) {
        (0..1000)
            .map(|i| format!("{base}-{i}"))
            .map(|g| {
                let old = offsets_topic::legacy_partition_for(&g, N);
                let new = offsets_topic::partition_for(&g, N);
                (g, old, new)
            })
            .find(|(_, old, new)| old != new)
            .expect("a moving group")
    }

    fn offsets(groups: &HashMap<String, Commits>, group: &str) -> Vec<(String, i32, i64)> {
        groups
            .get(group)
            .map(|c| {
                c.iter()
                    .map(|((t, p), c)| (t.clone(), *p, c.offset))
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn the_last_commit_of_a_moved_group_is_taken_and_others_are_left() {
        let (g, old, new) = moving("moved");
        let mut strays = Strays::new(new, N);
        strays.apply(
            old,
            &batch(&[(&g, "t", 0, Some(5)), (&g, "t", 1, Some(6))], None),
        );
        strays.apply(
            old,
            &batch(
                &[(&g, "t", 0, Some(9)), ("stays-put", "t", 0, Some(1))],
                None,
            ),
        );
        // The same group's records on another partition than its old one are not its commits.
        let elsewhere = (0..N)
            .find(|p| *p != old && *p != new)
            .expect("a third partition");
        strays.apply(elsewhere, &batch(&[(&g, "t", 2, Some(77))], None));
        let groups = strays.finish();
        assert_eq!(
            offsets(&groups, &g),
            vec![("t".into(), 0, 9), ("t".into(), 1, 6)]
        );
        assert_eq!(groups.len(), 1, "only the moved group: {:?}", groups.keys());
    }

    #[test]
    fn deleted_commits_stay_deleted_and_only_committed_transactions_count() {
        let (gone, old, new) = moving("gone");
        let (txn, txn_old, txn_new) = moving("txn");
        assert_eq!(new, offsets_topic::partition_for(&gone, N));
        let mut strays = Strays::new(new, N);
        strays.apply(old, &batch(&[(&gone, "t", 0, Some(3))], None));
        strays.apply(old, &batch(&[(&gone, "t", 0, None)], None));
        let groups = strays.finish();
        assert!(offsets(&groups, &gone).is_empty(), "{groups:?}");

        let mut strays = Strays::new(txn_new, N);
        strays.apply(txn_old, &batch(&[(&txn, "t", 0, Some(1))], None));
        strays.apply(txn_old, &batch(&[(&txn, "t", 0, Some(50))], Some(7)));
        strays.apply(txn_old, &control(7, false));
        strays.apply(txn_old, &batch(&[(&txn, "t", 1, Some(60))], Some(8)));
        strays.apply(txn_old, &control(8, true));
        // Still open: not taken.
        strays.apply(txn_old, &batch(&[(&txn, "t", 2, Some(70))], Some(9)));
        let groups = strays.finish();
        assert_eq!(
            offsets(&groups, &txn),
            vec![("t".into(), 0, 1), ("t".into(), 1, 60)]
        );
    }

    fn control(producer_id: i64, commit: bool) -> bytes::Bytes {
        sluice_engine::batch::control_batch(producer_id, 0, commit, 0, sluice_engine::Timestamp(0))
    }
}
