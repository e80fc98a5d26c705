//! Taking over the commits that earlier releases placed on another `__consumer_offsets` partition.
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
use std::rc::Rc;
use std::time::Duration;

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, ListOffsetsRequest, RequestKind, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use sluice_engine::batch::{BatchHeader, Records};
use sluice_engine::producer_state::{control_type, CONTROL_TYPE_COMMIT};

use super::offsets_topic::{self, OFFSETS_TOPIC};
use super::Committed;
use crate::shard::Shard;

/// The versions sent: the newest that name topics rather than ids.
const LIST_OFFSETS_VERSION: i16 = 7;
const FETCH_VERSION: i16 = 12;
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Between attempts while a partition to read has no leader or does not answer yet.
const RETRY: Duration = Duration::from_millis(100);

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

/// Reads every other offsets partition from its leader and returns the commits of the groups
/// that now belong to `index` and were placed there before; tried again while `still_leading`
/// holds and a partition has no leader or does not answer.
pub async fn read_strays(
    shard: &Rc<Shard>,
    index: i32,
    still_leading: &impl Fn() -> bool,
) -> Option<HashMap<String, Commits>> {
    let started = std::time::Instant::now();
    let mut warned = false;
    loop {
        if !still_leading() {
            return None;
        }
        match read_once(shard, index).await {
            Ok(groups) => return Some(groups),
            Err(why) => {
                // A new cluster's offsets partitions open together: a few tries are normal.
                if !warned && started.elapsed() > Duration::from_secs(10) {
                    tracing::warn!(partition = index, error = %why, "still waiting to read the other offsets partitions for groups placed there by an earlier release");
                    warned = true;
                } else {
                    tracing::debug!(partition = index, error = %why, "reading the other offsets partitions; trying again");
                }
                glommio::timer::sleep(RETRY).await;
            }
        }
    }
}

async fn read_once(shard: &Rc<Shard>, index: i32) -> Result<HashMap<String, Commits>, String> {
    let partitions = shard.config().offsets_topic_partitions;
    let mut by_leader: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    {
        let image = shard.image();
        for p in (0..partitions).filter(|&p| p != index) {
            let addr = image
                .leader_of(OFFSETS_TOPIC, p)
                .and_then(|(info, broker)| {
                    (info.leader >= 0)
                        .then_some(broker)
                        .flatten()
                        .filter(|b| !b.fenced)
                        .map(|b| format!("{}:{}", b.host, b.port))
                });
            let addr = addr.ok_or_else(|| format!("{OFFSETS_TOPIC}-{p} has no leader"))?;
            by_leader.entry(addr).or_default().push(p);
        }
    }
    let mut strays = Strays::new(index, partitions);
    for (addr, parts) in by_leader {
        read_from(&addr, &parts, &mut strays).await?;
    }
    Ok(strays.finish())
}

async fn call(
    addr: &str,
    key: ApiKey,
    version: i16,
    request: RequestKind,
) -> Result<ResponseKind, String> {
    let frame = crate::cluster::controller_api::encode_request(key, version, 1, &request)
        .map_err(|e| format!("encoding {key:?}: {e}"))?;
    let body = crate::cluster::transport::call(addr, frame, CALL_TIMEOUT)
        .await
        .map_err(|e| format!("{key:?} to {addr}: {e}"))?;
    crate::cluster::controller_api::decode_response(key, version, body)
        .map_err(|e| format!("decoding {key:?} from {addr}: {e}"))
}

fn topic_name() -> TopicName {
    TopicName(StrBytes::from_static_str(OFFSETS_TOPIC))
}

/// Reads `parts` from their log start to their high watermark at `addr`, into `strays`.
async fn read_from(addr: &str, parts: &[i32], strays: &mut Strays) -> Result<(), String> {
    let request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(0)
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(topic_name())
            .with_partitions(
                parts
                    .iter()
                    .map(|&p| {
                        ListOffsetsPartition::default()
                            .with_partition_index(p)
                            .with_current_leader_epoch(-1)
                            .with_timestamp(-2)
                    })
                    .collect(),
            )]);
    let ResponseKind::ListOffsets(answer) = call(
        addr,
        ApiKey::ListOffsets,
        LIST_OFFSETS_VERSION,
        RequestKind::ListOffsets(request),
    )
    .await?
    else {
        return Err("ListOffsets answered with another response".into());
    };
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    for t in answer.topics {
        for p in t.partitions {
            if p.error_code != 0 {
                return Err(format!(
                    "ListOffsets of {OFFSETS_TOPIC}-{}: error {}",
                    p.partition_index, p.error_code
                ));
            }
            next.insert(p.partition_index, p.offset);
        }
    }
    if let Some(p) = parts.iter().find(|p| !next.contains_key(p)) {
        return Err(format!("ListOffsets left out {OFFSETS_TOPIC}-{p}"));
    }
    while !next.is_empty() {
        let request = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_min_bytes(1)
            .with_max_bytes(8 << 20)
            .with_isolation_level(0)
            .with_session_id(0)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(topic_name())
                .with_partitions(
                    next.iter()
                        .map(|(&p, &offset)| {
                            FetchPartition::default()
                                .with_partition(p)
                                .with_current_leader_epoch(-1)
                                .with_fetch_offset(offset)
                                .with_last_fetched_epoch(-1)
                                .with_log_start_offset(-1)
                                .with_partition_max_bytes(1 << 20)
                        })
                        .collect(),
                )]);
        let ResponseKind::Fetch(answer) = call(
            addr,
            ApiKey::Fetch,
            FETCH_VERSION,
            RequestKind::Fetch(request),
        )
        .await?
        else {
            return Err("Fetch answered with another response".into());
        };
        if answer.error_code != 0 {
            return Err(format!("Fetch: error {}", answer.error_code));
        }
        let mut progressed = false;
        for t in answer.responses {
            for pd in t.partitions {
                let p = pd.partition_index;
                let Some(&at) = next.get(&p) else { continue };
                if pd.error_code != 0 {
                    return Err(format!(
                        "Fetch of {OFFSETS_TOPIC}-{p}: error {}",
                        pd.error_code
                    ));
                }
                let mut position = at;
                for batch in
                    crate::shard::replication::whole_batches(pd.records.unwrap_or_default())
                {
                    let Ok(header) = BatchHeader::parse(&batch) else {
                        break;
                    };
                    let last = header.last_offset().0;
                    // A fetch from inside a batch returns the whole batch.
                    if last >= position {
                        strays.apply(p, &batch);
                        position = last + 1;
                    }
                }
                if position >= pd.high_watermark {
                    next.remove(&p);
                    progressed = true;
                } else if position > at {
                    next.insert(p, position);
                    progressed = true;
                }
            }
        }
        if !progressed {
            return Err(format!(
                "reading {OFFSETS_TOPIC} at {addr} made no progress"
            ));
        }
    }
    Ok(())
}

/// A batch of commits (`None`: a tombstone) as a coordinator writes it, for tests.
#[cfg(test)]
fn batch(commits: &[(&str, &str, i32, Option<i64>)], producer: Option<i64>) -> bytes::Bytes {
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
