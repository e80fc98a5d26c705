//! Reading many partitions at once, for a fetch: one job per owner shard carrying all of that
//! shard's partitions, every shard at once, then one pass in request order that applies the
//! response's byte limit. Nothing here knows the Fetch response encoding, so a follower's fetch
//! (replication) can read through the same path at the same cost as a consumer's.
//!
//! Limits, as Kafka defines them for a fetch: each partition carries at most its
//! `partition_max_bytes`, the whole response at most `response_max_bytes`, partitions are
//! filled in request order, and the first batch of the response always goes whole, even when
//! larger than either limit, so a consumer always progresses. Partitions that get no records
//! (nothing new, or no room left) still report their high watermark and log start offset.
//!
//! How the budget is split between shards reading in parallel: each shard reads its partitions
//! in request order as if its partitions were the whole request (its running total against
//! `response_max_bytes`), then [`fill_in_order`] walks the results in request order and keeps, of
//! each partition, the whole batches that fit in what the earlier partitions left. A shard cannot
//! know what the others take, so in the worst case each reads a full response and all but one
//! response's worth is dropped. That costs little: batches from the batch cache are reference
//! counted and only the ones kept are ever copied (concatenated into the response), and a file
//! extent (`fetch.zero.copy`) is only a position and a length, nothing is read before the splice.
//! Only a cold read (O_DIRECT) costs I/O for what is dropped, and those batches stay in the batch
//! cache, where the next fetch finds them (a fetch session moves served partitions to its back, so
//! the partitions left out come first next time). The alternatives cost more: splitting the budget
//! between shards up front breaks the request order (a shard's later partitions would get room
//! that earlier partitions elsewhere should have had), and reading shard after shard makes the
//! fetch wait for each shard in turn.
//!
//! A consequence of reading ahead on each shard: a shard that spent its budget on a partition
//! that the final pass then trims may have left later partitions of its own unread, which the
//! final pass would have had room for. They get no records in this response (never more than
//! the limits allow, and the first partition with records is never affected); the next fetch
//! serves them.

use sluice_engine::producer_state::AbortedTxn;
use std::rc::Rc;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::ResponseError;
use sluice_engine::{FileExtent, LogError, Offset};

use super::Shard;
use crate::errors::log_error_code;
use sluice_replication::records::BrokerId;

/// A shard yields to its other tasks (produces, other connections) after reading this many
/// partitions for one fetch. Reads from the batch cache complete without waiting, so without
/// this a fetch of thousands of partitions would hold the shard for the whole loop; glommio's
/// own `yield_if_needed` only yields once the task queue's 100 ms slice is spent. 64 partitions
/// from the cache take some tens of microseconds, and a yield costs well under one.
pub const READ_YIELD_PARTITIONS: usize = 64;

/// One partition to read: where from and how much at most.
#[derive(Clone, Debug)]
pub struct PartitionRead {
    /// Shared, not copied, when the read moves to the owner shard.
    pub topic: Arc<str>,
    pub partition: i32,
    pub fetch_offset: Offset,
    pub max_bytes: usize,
    /// The leader epoch the fetcher expects (-1: none): fenced when it differs.
    pub current_leader_epoch: i32,
    /// A follower's: the epoch of its last batch (-1: none), checked against the leader's
    /// log for divergence (KIP-320).
    pub last_fetched_epoch: i32,
    /// A follower's fetch: its broker id and broker epoch.
    pub replica: Option<(i32, i64)>,
    /// A consumer's `isolation_level=read_committed`: reads stop at the last stable offset and
    /// the aborted transactions of the range come along.
    pub read_committed: bool,
    /// A consumer's Fetch v11+ (KIP-392): its `client.rack` (empty without one). Such a fetch
    /// may read from a follower, up to the high watermark the follower knows, and a leader may
    /// send it to a replica in its rack (`replica.selector.class`). `None` for followers and
    /// older consumers, which read from the leader only.
    pub client_rack: Option<Arc<str>>,
}

/// What one partition's read found. Offsets are -1 when the partition failed.
#[derive(Debug)]
pub struct ReadResult {
    pub error_code: i16,
    pub high_watermark: i64,
    /// The last stable offset (KIP-98): below it every transaction is decided. -1 when failed.
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    /// A read-committed read's: the transactions aborted in the range it covers.
    pub aborted_transactions: Vec<AbortedTxn>,
    pub records: Records,
    /// Whether the records were read from disk rather than memory (`fetch.cold.max.bytes`).
    pub cold: bool,
    /// To a follower whose log diverged from the leader's: the epoch and end offset to
    /// truncate by (KIP-320). No records come with it.
    pub diverging_epoch: Option<(i32, i64)>,
    /// To a consumer: the replica to fetch from instead (KIP-392), or -1. No records come with
    /// it.
    pub preferred_read_replica: i32,
}

/// A partition's records: whole batches in memory (not yet concatenated, so that batches the
/// final pass drops are never copied), or where they lie in a segment file.
#[derive(Debug)]
pub enum Records {
    Batches(Vec<Bytes>),
    File(FileExtent),
}

impl Default for Records {
    fn default() -> Records {
        Records::Batches(Vec::new())
    }
}

impl Records {
    pub fn len(&self) -> usize {
        match self {
            Records::Batches(b) => b.iter().map(|b| b.len()).sum(),
            Records::File(e) => e.len as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        match self {
            Records::Batches(b) => b.is_empty(),
            Records::File(e) => e.len == 0,
        }
    }

    /// The batches as one buffer: a copy only when there is more than one.
    pub fn concatenated(batches: Vec<Bytes>) -> Bytes {
        match batches.len() {
            0 => Bytes::new(),
            1 => batches.into_iter().next().expect("one batch"),
            _ => {
                let total = batches.iter().map(|b| b.len()).sum();
                let mut buf = BytesMut::with_capacity(total);
                for b in &batches {
                    buf.extend_from_slice(b);
                }
                buf.freeze()
            }
        }
    }
}

impl ReadResult {
    /// A partition that failed: Kafka answers its offsets as unknown (-1) then.
    pub fn failed(error_code: i16) -> ReadResult {
        ReadResult {
            error_code,
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
            aborted_transactions: Vec::new(),
            records: Records::default(),
            cold: false,
            diverging_epoch: None,
            preferred_read_replica: -1,
        }
    }

    fn unknown() -> ReadResult {
        ReadResult::failed(ResponseError::UnknownTopicOrPartition.code())
    }
}

/// Steps a fetch took: one per partition visited in each pass over the partitions (session
/// lookups, reads on the owner shards, the final fill, response assembly). Tests assert it stays
/// linear in the partitions asked for; a search or a scan per partition would show up here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work(pub u64);

impl Work {
    pub fn add(&mut self, steps: usize) {
        self.0 += steps as u64;
    }
}

/// Reads `reads`, partitions this shard owns, in order: `max_bytes` of each at most, and at
/// most `response_max_bytes` over all of them, except that the first batch found goes whole
/// whatever its size. Every partition is visited, so those left without records still get
/// their offsets. Runs on the owner shard, with no hop per partition.
pub async fn read_local(
    shard: &Rc<Shard>,
    reads: &[PartitionRead],
    response_max_bytes: usize,
    splices_possible: bool,
) -> (Vec<ReadResult>, Work) {
    let zero_copy = shard.config().fetch_zero_copy && splices_possible;
    let cold_max = shard.config().fetch_cold_max_bytes;
    let mut results = Vec::with_capacity(reads.len());
    let mut total = 0usize;
    // Bytes read from disk so far: a partition whose next batch is not in memory reads only
    // while they are under `fetch.cold.max.bytes`.
    let mut cold_total = 0usize;
    // One key for the partition map, its topic replaced only when the topic changes.
    let mut key: (String, i32) = (String::new(), 0);
    for (i, read) in reads.iter().enumerate() {
        if i > 0 && i % READ_YIELD_PARTITIONS == 0 {
            glommio::executor().yield_now().await;
        }
        if key.0 != *read.topic {
            key.0.clear();
            key.0.push_str(&read.topic);
        }
        key.1 = read.partition;
        let Some(p) = shard.partitions.borrow().get(&key).cloned() else {
            results.push(ReadResult::unknown());
            continue;
        };
        let log = &p.log;
        // A consumer's Fetch v11+ may read from a follower (KIP-392); every other from the
        // leader only.
        let checked = if read.client_rack.is_some() {
            p.check_readable(read.current_leader_epoch)
        } else {
            p.check_leader(read.current_leader_epoch)
        };
        if let Err(code) = checked {
            results.push(ReadResult::failed(code));
            continue;
        }
        // A follower reads up to the leader's log end, durable or not: it makes what it copies
        // durable itself while the leader does the same, and the high watermark (what every
        // ISR member, the leader included, has as durable as its flush.mode says) is what
        // acks=all and consumers wait for. A consumer reads up to the high watermark.
        let (hw, visible_end) = match read.replica {
            Some((follower, broker_epoch)) => {
                if read.last_fetched_epoch >= 0 {
                    if let Some(diverging) =
                        diverging_epoch(log, read.last_fetched_epoch, read.fetch_offset)
                    {
                        let mut result = ReadResult::failed(0);
                        result.high_watermark = p.high_watermark().0;
                        result.last_stable_offset = result.high_watermark;
                        result.log_start_offset = log.log_start_offset().0;
                        result.diverging_epoch = Some(diverging);
                        results.push(result);
                        continue;
                    }
                }
                if let Some(change) =
                    p.on_follower_fetch(follower, broker_epoch, read.fetch_offset.0)
                {
                    super::replication::send_isr_change(
                        shard,
                        &read.topic,
                        read.partition,
                        &p,
                        change,
                    );
                }
                (p.high_watermark(), log.log_end_offset())
            }
            None => {
                let hw = p.high_watermark();
                (hw, hw)
            }
        };
        // Below the last stable offset every transaction is decided: a read-committed
        // consumer reads no further.
        let lso = log
            .first_unstable_offset(hw)
            .map_or(hw, |first| first.min(hw));
        let visible_end = if read.read_committed && read.replica.is_none() {
            lso
        } else {
            visible_end
        };
        let mut result = ReadResult {
            error_code: 0,
            high_watermark: hw.0,
            last_stable_offset: lso.0,
            aborted_transactions: Vec::new(),
            log_start_offset: log.log_start_offset().0,
            records: Records::default(),
            cold: false,
            diverging_epoch: None,
            preferred_read_replica: -1,
        };
        // The leader sends a consumer in another rack to a replica in its own, with no records
        // (Kafka's RackAwareReplicaSelector); the consumer fetches there next.
        if let Some(rack) = read.client_rack.as_deref() {
            if shard.config().replica_selector_rack_aware() {
                let image = shard.image();
                let rack_of = |b: BrokerId| image.broker_rack(b.0);
                if let Some(preferred) =
                    p.preferred_read_replica(rack, read.fetch_offset.0, rack_of)
                {
                    result.preferred_read_replica = preferred.0;
                    results.push(result);
                    continue;
                }
            }
        }
        // A replica in a log directory a storage error took offline serves nothing (Kafka's
        // KAFKA_STORAGE_ERROR), even at its end where no read would touch the disk.
        if log.poisoned().is_some() {
            results.push(ReadResult::failed(
                kafka_protocol::ResponseError::KafkaStorageError.code(),
            ));
            continue;
        }
        let mut budget = read.max_bytes.min(response_max_bytes.saturating_sub(total));
        let first = total == 0;
        result.cold = !log.in_memory(read.fetch_offset);
        if result.cold {
            budget = budget.min(cold_max.saturating_sub(cold_total));
        }
        let offset = read.fetch_offset;
        // Full, or between the visible end and the log end (nothing visible yet): offsets only.
        if (budget == 0 && !first) || (offset > visible_end && offset <= log.log_end_offset()) {
            results.push(result);
            continue;
        }
        // A zero budget with nothing taken yet still reads the first batch, as Kafka does.
        let budget = budget.max(1);
        match read_partition(log, offset, budget, visible_end, first, zero_copy).await {
            Ok(records) => {
                if read.read_committed && !records.is_empty() {
                    result.aborted_transactions = log.aborted_transactions(offset, visible_end);
                }
                result.records = records;
            }
            Err(e) => {
                if !matches!(e, LogError::OffsetOutOfRange { .. } | LogError::Closed) {
                    tracing::warn!(topic = %read.topic, partition = read.partition, offset = offset.0, error = %e, "fetch failed");
                }
                let out_of_range = matches!(e, LogError::OffsetOutOfRange { .. });
                result = ReadResult::failed(log_error_code(&e));
                if out_of_range && read.replica.is_some() {
                    // A follower behind the leader's log start starts over from there.
                    result.log_start_offset = log.log_start_offset().0;
                    result.high_watermark = hw.0;
                    result.last_stable_offset = lso.0;
                }
            }
        }
        total += result.records.len();
        if result.cold {
            cold_total += result.records.len();
        }
        results.push(result);
    }
    (results, Work(reads.len() as u64))
}

/// KIP-320: where a follower diverged from this leader's log
/// (`sluice_replication::replica::diverging_epoch`, which the simulator drives too).
fn diverging_epoch(
    log: &sluice_engine::Log<sluice_engine::DmaStorage>,
    last_fetched_epoch: i32,
    fetch_offset: Offset,
) -> Option<(i32, i64)> {
    use sluice_replication::records::LeaderEpoch;
    let end = log
        .end_offset_for_epoch(sluice_engine::LeaderEpoch(last_fetched_epoch))
        .map(|(e, o)| (LeaderEpoch(e.0), o.0));
    sluice_replication::replica::diverging_epoch(
        end,
        LeaderEpoch(last_fetched_epoch),
        fetch_offset.0,
        log.log_start_offset().0,
    )
    .map(|(e, o)| (e.0, o))
}

/// One partition's records from `offset`: a file extent when zero-copy applies, else whole
/// batches from the batch cache or the segment, at most `budget` bytes, the first batch whole
/// only if `first`.
async fn read_partition(
    log: &sluice_engine::Log<sluice_engine::DmaStorage>,
    offset: Offset,
    budget: usize,
    hw: Offset,
    first: bool,
    zero_copy: bool,
) -> Result<Records, LogError> {
    if zero_copy {
        if let Some(extent) = log.read_extent(offset, budget, hw, first).await? {
            return Ok(Records::File(extent));
        }
    }
    let batches = log.read(offset, budget, hw).await?;
    let mut room = budget;
    let mut kept = Vec::with_capacity(batches.len());
    for (i, b) in batches.into_iter().enumerate() {
        // The log returns a first batch whatever its size; unless `first`, it must fit too.
        if b.bytes.len() > room && !(first && i == 0) {
            break;
        }
        room = room.saturating_sub(b.bytes.len());
        kept.push(b.bytes);
    }
    Ok(Records::Batches(kept))
}

/// Reads `reads` wherever their owners are: one job per owner shard, all at once, results in
/// request order and within the response limit ([`fill_in_order`]). Partitions of unknown topics
/// (no owner) come back UNKNOWN_TOPIC_OR_PARTITION.
pub async fn read_partitions(
    shard: &Rc<Shard>,
    reads: &[PartitionRead],
    response_max_bytes: usize,
    splices_possible: bool,
    work: &mut Work,
) -> Vec<ReadResult> {
    let image = shard.image();
    let shards = shard.shared.shards;
    // Which of `reads` each shard owns, by index into `reads`, in request order.
    let mut by_owner: Vec<Vec<usize>> = vec![Vec::new(); shards];
    let mut results: Vec<Option<ReadResult>> = Vec::with_capacity(reads.len());
    let mut topic: Option<(&str, Option<&crate::metadata::TopicMeta>)> = None;
    for (i, read) in reads.iter().enumerate() {
        // Consecutive partitions are mostly of one topic: look it up once for them.
        let meta = match topic {
            Some((name, meta)) if name == &*read.topic => meta,
            _ => {
                let meta = image.topics.get(&*read.topic);
                topic = Some((&read.topic, meta));
                meta
            }
        };
        let owner = meta.and_then(|t| t.shards.get(usize::try_from(read.partition).ok()?));
        match owner {
            // A partition led by another broker of the cluster.
            Some(&crate::metadata::NOT_HOSTED) => results.push(Some(ReadResult::failed(
                ResponseError::NotLeaderOrFollower.code(),
            ))),
            Some(&owner) => {
                by_owner[owner as usize % shards].push(i);
                results.push(None);
            }
            None => results.push(Some(ReadResult::unknown())),
        }
    }
    work.add(reads.len());
    let jobs: Vec<_> = by_owner
        .into_iter()
        .enumerate()
        .filter(|(_, indexes)| !indexes.is_empty())
        .map(|(owner, indexes)| {
            let job: Vec<PartitionRead> = indexes.iter().map(|&i| reads[i].clone()).collect();
            let shard = shard.clone();
            let task = glommio::spawn_local(async move {
                shard
                    .invoke_on(owner, move |s| async move {
                        read_local(&s, &job, response_max_bytes, splices_possible).await
                    })
                    .await
            });
            (indexes, task)
        })
        .collect();
    for (indexes, task) in jobs {
        let (found, steps) = task.await;
        assert_eq!(
            found.len(),
            indexes.len(),
            "a shard answered a different number of partitions"
        );
        work.0 += steps.0;
        for (i, result) in indexes.into_iter().zip(found) {
            results[i] = Some(result);
        }
    }
    let mut results: Vec<ReadResult> = results
        .into_iter()
        .map(|r| r.expect("every partition is answered"))
        .collect();
    fill_in_order(
        &mut results,
        reads,
        response_max_bytes,
        shard.config().fetch_cold_max_bytes,
        work,
    );
    results
}

/// Applies the response limit in request order to what the shards read: each partition keeps
/// the whole batches that fit in `min(max_bytes, what the partitions before it left)`, except
/// that the first partition with records keeps its first batch whatever its size. A file extent
/// is kept whole or not at all (its batch boundaries are not known here; the partition then
/// reports its offsets only, and the next fetch serves it).
pub fn fill_in_order(
    results: &mut [ReadResult],
    reads: &[PartitionRead],
    response_max_bytes: usize,
    cold_max_bytes: usize,
    work: &mut Work,
) {
    assert_eq!(results.len(), reads.len());
    let mut total = 0usize;
    let mut cold_total = 0usize;
    for (result, read) in results.iter_mut().zip(reads) {
        let mut room = read.max_bytes.min(response_max_bytes.saturating_sub(total));
        if result.cold {
            room = room.min(cold_max_bytes.saturating_sub(cold_total));
        }
        let first = total == 0;
        let before = total;
        match &mut result.records {
            Records::Batches(batches) => {
                let mut used = 0usize;
                let mut keep = 0usize;
                for b in batches.iter() {
                    if used + b.len() > room && !(first && keep == 0) {
                        break;
                    }
                    used += b.len();
                    keep += 1;
                }
                batches.truncate(keep);
                total += used;
            }
            Records::File(extent) => {
                if first || extent.len as usize <= room {
                    total += extent.len as usize;
                } else {
                    result.records = Records::default();
                }
            }
        }
        if result.cold {
            cold_total += total - before;
        }
    }
    work.add(reads.len());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(partition: i32, max_bytes: usize) -> PartitionRead {
        PartitionRead {
            topic: "t".into(),
            partition,
            fetch_offset: Offset(0),
            max_bytes,
            current_leader_epoch: -1,
            last_fetched_epoch: -1,
            replica: None,
            read_committed: false,
            client_rack: None,
        }
    }

    fn batches(sizes: &[usize]) -> ReadResult {
        ReadResult {
            error_code: 0,
            high_watermark: 10,
            last_stable_offset: 10,
            aborted_transactions: Vec::new(),
            log_start_offset: 0,
            records: Records::Batches(sizes.iter().map(|&n| Bytes::from(vec![0u8; n])).collect()),
            cold: false,
            diverging_epoch: None,
            preferred_read_replica: -1,
        }
    }

    fn cold(sizes: &[usize]) -> ReadResult {
        ReadResult {
            cold: true,
            ..batches(sizes)
        }
    }

    fn sizes(results: &[ReadResult]) -> Vec<Vec<usize>> {
        results
            .iter()
            .map(|r| match &r.records {
                Records::Batches(b) => b.iter().map(|b| b.len()).collect(),
                Records::File(e) => vec![e.len as usize],
            })
            .collect()
    }

    #[test]
    fn the_fill_keeps_whole_batches_in_request_order_within_the_response_limit() {
        let reads: Vec<_> = (0..4).map(|p| read(p, 1000)).collect();
        // As two shards reading ahead would return them: each up to the limit on its own.
        let mut results = vec![
            batches(&[40, 40]),
            batches(&[50, 30]),
            batches(&[10]),
            batches(&[15, 5]),
        ];
        let mut work = Work::default();
        fill_in_order(&mut results, &reads, 140, usize::MAX, &mut work);
        // 80 + 50 = 130; partition 1's 30 no longer fits, partition 2's 10 does, then full.
        assert_eq!(
            sizes(&results),
            vec![vec![40, 40], vec![50], vec![10], vec![]]
        );
        assert_eq!(work, Work(4));
        // Offsets stay for the partitions left out.
        assert_eq!(results[3].high_watermark, 10);
    }

    #[test]
    fn records_from_disk_stay_within_the_cold_limit_and_memory_fills_the_rest() {
        let reads: Vec<_> = (0..5).map(|p| read(p, 1000)).collect();
        let mut results = vec![
            cold(&[60, 60]),
            batches(&[100]),
            cold(&[30, 20]),
            batches(&[200, 100]),
            cold(&[10]),
        ];
        fill_in_order(&mut results, &reads, 500, 100, &mut Work::default());
        // Cold: 60 + 30 of the 100 allowed (the second 60 and the 20 would pass it, the 10
        // still fits); memory takes the rest of the 500.
        assert_eq!(
            sizes(&results),
            vec![vec![60], vec![100], vec![30], vec![200, 100], vec![10]]
        );
        // The first batch of a response goes even when cold and over the limit.
        let mut results = vec![cold(&[150, 10]), cold(&[10])];
        fill_in_order(&mut results, &reads[..2], 500, 100, &mut Work::default());
        assert_eq!(sizes(&results), vec![vec![150], vec![]]);
    }

    #[test]
    fn the_first_batch_of_the_response_goes_whole_and_later_ones_must_fit() {
        let reads: Vec<_> = (0..3).map(|p| read(p, 100)).collect();
        let mut results = vec![batches(&[]), batches(&[500, 10]), batches(&[300])];
        fill_in_order(&mut results, &reads, 200, usize::MAX, &mut Work::default());
        assert_eq!(sizes(&results), vec![vec![], vec![500], vec![]]);
    }

    #[test]
    fn the_partition_limit_applies_to_each_partition() {
        let reads = vec![read(0, 50), read(1, 50)];
        let mut results = vec![batches(&[30, 30]), batches(&[20, 20, 20])];
        fill_in_order(
            &mut results,
            &reads,
            1 << 20,
            usize::MAX,
            &mut Work::default(),
        );
        assert_eq!(sizes(&results), vec![vec![30], vec![20, 20]]);
    }
}
