//! The simulation's share consumers (KIP-932): one share group reads each partition of the data
//! topic through the share partition state machine the broker runs (`sluice-share`'s
//! `SharePartition`), on whichever broker leads the partition, across the faults.
//!
//! A leader keeps the share partition in memory for its leadership. The first ShareFetch of a
//! leadership reads the persisted state (start offset and state batches), which fences leaders
//! of older epochs, and every change is written back before the fetch is answered: the
//! acknowledgements it carried, and the records it acquires (so their delivery counts survive a
//! failover). That is the broker's share coordinator (`__share_group_state`, replicated like any
//! topic) reduced to a store that never loses a write and refuses one from a fenced leader; a
//! fenced leader drops its share partition and answers an error, acknowledging nothing.
//!
//! Each consumer acknowledges (ACCEPT) what it was given in its next fetch, and now and then
//! forgets what it holds, as a consumer that crashed would: the records come back once their
//! lock runs out, or when a new leader restores the state.
//!
//! Checked at every answer: no record is acquired again after an acknowledgement answered as
//! done took effect (an answer delayed in the network may still carry an older acquisition); an
//! offset is always the same value; every acquisition of an offset has a higher delivery count
//! than the one before it (counts survive failovers). After healing: every
//! offset below the high watermark when the faults stopped is acknowledged in the persisted
//! state, none archived, and what consumers were told was acknowledged is.

use std::time::{Duration, Instant};

use sluice_share::partition::{AckType, RecordState, ShareConfig, SharePartition, StateBatch};

use super::*;

/// Client ids of the share consumers (inside the clients' range, never cut off).
pub const SHARE_BASE: u64 = 5_000;
const SHARE_CONSUMERS_PER_PARTITION: i32 = 2;
/// Records one ShareFetch acquires at most.
const SHARE_MAX_RECORDS: u32 = 8;
const SHARE_FETCH_TIMEOUT_MS: u64 = 1_000;

fn share_config() -> ShareConfig {
    ShareConfig {
        record_lock_duration: Duration::from_millis(800),
        // High enough that no record is archived by the faults alone: every offset must end
        // acknowledged.
        delivery_count_limit: 1_000,
        partition_max_record_locks: 200,
    }
}

/// The persisted state of one share partition and the newest leader epoch that read or wrote it.
#[derive(Default)]
struct Stored {
    fence: i32,
    start: i64,
    batches: Vec<StateBatch>,
}

struct Leading {
    leader_epoch: i32,
    partition: SharePartition,
}

struct ShareConsumer {
    partition: i32,
    /// The fetch in flight: its sequence, when it left, the offsets it acknowledges.
    in_flight: Option<(u64, u64, Vec<i64>)>,
    next_fetch: u64,
    /// Delivered and not yet acknowledged.
    holding: Vec<i64>,
}

pub struct ShareState {
    base: Instant,
    stored: BTreeMap<i32, Stored>,
    leading: BTreeMap<(u64, i32), Leading>,
    consumers: Vec<ShareConsumer>,
    /// (partition, offset) -> (value, when the acknowledgement took effect), for
    /// acknowledgements answered as done.
    pub acked: BTreeMap<(i32, i64), (u64, u64)>,
    /// (partition, offset) -> (value, delivery count, when acquired) of its latest acquisition
    /// seen.
    delivered: BTreeMap<(i32, i64), (u64, u16, u64)>,
    pub deliveries: u64,
    pub fenced: u64,
    /// Each partition's high watermark when the faults stopped: the drain's target.
    target: Option<BTreeMap<i32, i64>>,
}

impl ShareState {
    pub fn new() -> ShareState {
        ShareState {
            base: Instant::now(),
            stored: BTreeMap::new(),
            leading: BTreeMap::new(),
            consumers: (0..DATA_PARTITIONS * SHARE_CONSUMERS_PER_PARTITION)
                .map(|i| ShareConsumer {
                    partition: i % DATA_PARTITIONS,
                    in_flight: None,
                    next_fetch: 0,
                    holding: Vec::new(),
                })
                .collect(),
            acked: BTreeMap::new(),
            delivered: BTreeMap::new(),
            deliveries: 0,
            fenced: 0,
            target: None,
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.base + Duration::from_millis(ms)
    }

    /// A broker died: its share partitions were memory.
    pub fn crash(&mut self, broker: u64) {
        self.leading.retain(|&(b, _), _| b != broker);
    }

    /// Whether every offset below the target is acknowledged in the persisted state.
    fn drained(&self) -> bool {
        let Some(target) = &self.target else {
            return false;
        };
        target
            .iter()
            .all(|(p, &hw)| self.stored.get(p).is_some_and(|s| s.start >= hw))
    }
}

#[derive(Clone, Debug)]
pub struct ShareFetch {
    topic_id: TopicId,
    partition: i32,
    member: u64,
    acks: Vec<i64>,
    seq: u64,
}

#[derive(Clone, Debug)]
pub struct ShareFetchAnswer {
    seq: u64,
    /// When the leader handled the fetch (the simulation's time): when its acknowledgements
    /// took effect and its records were acquired.
    at: u64,
    error_code: i16,
    /// The acknowledgements were applied and persisted.
    acks_done: bool,
    /// (offset, value, delivery count)
    records: Vec<(i64, u64, u16)>,
}

impl DataPlane {
    /// A ShareFetch at broker `id`: restore the share partition if this leadership has not,
    /// apply the acknowledgements, acquire records up to the high watermark, persist, answer.
    pub(super) fn on_share_fetch(
        &mut self,
        id: u64,
        f: &ShareFetch,
        now_ms: u64,
        local_now: u64,
    ) -> Result<ShareFetchAnswer, LogError> {
        let mut answer = ShareFetchAnswer {
            seq: f.seq,
            at: now_ms,
            error_code: error_code::NOT_LEADER_OR_FOLLOWER,
            acks_done: false,
            records: Vec::new(),
        };
        let now = self.share.at(local_now);
        let b = self.brokers.get_mut(&id).unwrap();
        let Some(r) = b.replicas.get_mut(&(f.topic_id, f.partition)) else {
            return Ok(answer);
        };
        let ReplicaRole::Leader(l) = &r.role else {
            return Ok(answer);
        };
        let leader_epoch = l.leader_epoch.0;
        let high_watermark = r.role.high_watermark(r.log.high_watermark().0).0;
        let key = (id, f.partition);
        let share = &mut self.share;
        let stored = share.stored.entry(f.partition).or_default();
        if stored.fence > leader_epoch {
            share.leading.remove(&key);
            share.fenced += 1;
            answer.error_code = error_code::FENCED_LEADER_EPOCH;
            return Ok(answer);
        }
        if share
            .leading
            .get(&key)
            .is_none_or(|s| s.leader_epoch != leader_epoch)
        {
            // The read that starts a leadership's share partition fences older leaders.
            stored.fence = leader_epoch;
            let start = stored.start.max(r.log.log_start_offset().0);
            let partition = SharePartition::restore(start, &stored.batches, share_config());
            share.leading.insert(
                key,
                Leading {
                    leader_epoch,
                    partition,
                },
            );
        }
        let sp = &mut share.leading.get_mut(&key).unwrap().partition;
        let member: Rc<str> = Rc::from(format!("m{}", f.member).as_str());
        let mut acks_ok = true;
        for &offset in &f.acks {
            if sp
                .acknowledge(&member, offset, offset, &[AckType::Accept], now)
                .is_err()
            {
                acks_ok = false;
            }
        }
        let mut records = Vec::new();
        if let Some(from) = sp.next_fetch_offset(now) {
            if from < high_watermark {
                let read = match block_on(r.log.read(
                    LogOffset(from),
                    FETCH_MAX_BYTES,
                    LogOffset(high_watermark),
                )) {
                    Ok(read) => read,
                    Err(LogError::OffsetOutOfRange { .. }) => {
                        answer.error_code = OFFSET_OUT_OF_RANGE;
                        return Ok(answer);
                    }
                    Err(e) => return Err(e),
                };
                let mut bounds = Vec::new();
                let mut values = BTreeMap::new();
                for batch in &read {
                    let header = BatchHeader::parse(&batch.bytes).unwrap();
                    bounds.push((header.base_offset().0, batch.last_offset.0));
                    values.insert(header.base_offset().0, batch_value(&batch.bytes));
                }
                for range in sp.acquire(&member, &bounds, SHARE_MAX_RECORDS, now) {
                    for offset in range.first_offset..=range.last_offset {
                        let value = *values
                            .get(&offset)
                            .expect("one-record batches: an acquired offset starts a batch");
                        records.push((offset, value, range.delivery_count));
                    }
                }
            }
        }
        // Persisted before the answer (nothing can have fenced this leader since the check
        // above: the store is one step away).
        stored.start = sp.start_offset();
        stored.batches = sp.state_batches();
        answer.error_code = error_code::NONE;
        answer.acks_done = acks_ok;
        answer.records = records;
        Ok(answer)
    }

    /// After healing, the persisted state of every share partition: everything below the
    /// target acknowledged, nothing archived, and every acknowledgement answered as done there.
    pub(super) fn check_share_final(&self) {
        let target = self.share.target.as_ref().expect("the drain has a target");
        for (&partition, &hw) in target {
            let stored = &self.share.stored[&partition];
            assert!(
                stored.start >= hw,
                "share partition {partition}: start offset {} below the target {hw}",
                stored.start
            );
            for b in &stored.batches {
                assert_ne!(
                    b.state,
                    RecordState::Archived,
                    "share partition {partition}: offsets {}-{} archived",
                    b.first_offset,
                    b.last_offset
                );
            }
            for (&(_, offset), _) in self
                .share
                .acked
                .range((partition, i64::MIN)..(partition + 1, i64::MIN))
            {
                let done = offset < stored.start
                    || stored.batches.iter().any(|b| {
                        (b.first_offset..=b.last_offset).contains(&offset)
                            && b.state == RecordState::Acknowledged
                    });
                assert!(
                    done,
                    "share partition {partition}: offset {offset} was answered as acknowledged and is not"
                );
            }
        }
    }

    /// Every offset a share consumer was given is the value the final log holds there.
    pub(super) fn check_share_values(&self, partition: i32, by_offset: &BTreeMap<i64, u64>) {
        for (&(_, offset), &(value, _, _)) in self
            .share
            .delivered
            .range((partition, i64::MIN)..(partition + 1, i64::MIN))
        {
            assert_eq!(
                by_offset.get(&offset),
                Some(&value),
                "share partition {partition}: offset {offset} was delivered as {value:#x}, the log holds another"
            );
        }
    }
}

impl Sim {
    /// At the end of the fault phase: the share consumers must acknowledge everything up to
    /// each partition's high watermark now (the highest any replica has).
    pub fn share_set_target(&mut self) {
        let mut target: BTreeMap<i32, i64> = BTreeMap::new();
        for b in self.data.brokers.values() {
            for (&(_, partition), r) in &b.replicas {
                let hw = target.entry(partition).or_default();
                *hw = (*hw).max(r.log.high_watermark().0);
            }
        }
        self.data.share.target = Some(target);
    }

    pub fn share_drained(&self) -> bool {
        self.data.share.drained()
    }

    pub(super) fn run_share_consumers(&mut self) {
        let now = self.now;
        for i in 0..self.data.share.consumers.len() {
            let c = &mut self.data.share.consumers[i];
            if c.in_flight
                .as_ref()
                .is_some_and(|(_, sent, _)| now >= sent + SHARE_FETCH_TIMEOUT_MS)
            {
                // No answer: its acknowledgements may or may not have been applied.
                c.in_flight = None;
            }
            if c.in_flight.is_some() || now < c.next_fetch {
                continue;
            }
            if self.faults && self.rng.gen_range(0..100) == 0 {
                // A crashed consumer: what it holds comes back after the lock.
                self.data.share.consumers[i].holding.clear();
            }
            let partition = self.data.share.consumers[i].partition;
            let Some((leader, topic_id)) = self.client_leader(partition) else {
                self.data.share.consumers[i].next_fetch = now + 50;
                continue;
            };
            let seq = self.data.seq();
            let c = &mut self.data.share.consumers[i];
            let acks = std::mem::take(&mut c.holding);
            c.in_flight = Some((seq, now, acks.clone()));
            let msg = DataMsg::ShareFetch(ShareFetch {
                topic_id,
                partition,
                member: i as u64,
                acks,
                seq,
            });
            self.send(SHARE_BASE + i as u64, leader, Payload::Data(msg));
        }
    }

    pub(super) fn on_share_answer(&mut self, i: usize, a: ShareFetchAnswer) {
        let now = self.now;
        let share = &mut self.data.share;
        let c = &mut share.consumers[i];
        if c.in_flight.as_ref().map(|f| f.0) != Some(a.seq) {
            return;
        }
        let (_, _, acks) = c.in_flight.take().expect("in flight");
        c.next_fetch = now + self.rng.gen_range(5..40);
        let partition = c.partition;
        if a.error_code != error_code::NONE {
            return;
        }
        if a.acks_done {
            for offset in acks {
                let (value, _, _) = share.delivered[&(partition, offset)];
                share.acked.insert((partition, offset), (value, a.at));
            }
        }
        for (offset, value, count) in a.records {
            // An answer can arrive late: records acquired before an acknowledgement took effect
            // (by a leader about to be fenced) are no redelivery after it.
            if let Some(&(_, acked_at)) = share.acked.get(&(partition, offset)) {
                assert!(
                    a.at < acked_at,
                    "share partition {partition}: offset {offset} acquired again (count {count}) at {} after its acknowledgement took effect at {acked_at}",
                    a.at
                );
            }
            if let Some(&(before, last, when)) = share.delivered.get(&(partition, offset)) {
                assert_eq!(
                    before, value,
                    "share partition {partition}: offset {offset} delivered as {before:#x} and later as {value:#x}"
                );
                if when > a.at {
                    // A stale answer: a later acquisition was already seen.
                    share.deliveries += 1;
                    continue;
                }
                assert!(
                    count > last,
                    "share partition {partition}: offset {offset} acquired with count {count} at {} after count {last} at {when}",
                    a.at
                );
            }
            share
                .delivered
                .insert((partition, offset), (value, count, a.at));
            share.deliveries += 1;
            share.consumers[i].holding.push(offset);
        }
    }
}
