//! Idempotent producer state of one partition (KIP-98): for every producer id, its epoch and
//! the sequence ranges and offsets of its last [`PRODUCER_BATCHES_MAX`] batches.
//!
//! A batch from a known producer and epoch must continue its sequence exactly; a batch equal to
//! one of the remembered ones is a retry and is answered with the original offsets instead of
//! being appended again; an older epoch is fenced. The state is snapshotted when a segment is sealed and
//! at clean shutdown (`<offset:020>.snapshot`, format in `FORMAT.md`) and rebuilt on open from the
//! latest snapshot plus the batches after it.
//!
//! Transactions (KIP-98) are tracked here too, from the batches alone: a producer's first
//! transactional batch opens its transaction at that batch's offset, and a control batch (the
//! commit or abort marker the transaction coordinator has the leader write) closes it. The
//! first offset of the oldest open transaction bounds the last stable offset (LSO) that
//! `read_committed` consumers read up to; an aborted transaction's range is remembered so that
//! fetches can tell those consumers which records to drop. A transaction stays unstable after
//! its marker until the high watermark passes the marker, as in Kafka, so a consumer never reads
//! a decision that a leader change could take back.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::batch::BatchHeader;
use crate::types::{Offset, Timestamp};

/// Batches remembered per producer for duplicate detection. Kafka keeps 5, the most a client
/// has in flight on one connection, and answers a retry of anything older
/// OUT_OF_ORDER_SEQUENCE_NUMBER, which the Java client retries (the batch is not the next one it
/// waits for) until `delivery.timeout.ms`. More than 5 batches can land behind a batch the
/// client still has to resend: a connection's pipelined produces append behind an earlier one
/// that is still waiting for acks=all here (Kafka reads a connection's next request only once
/// the earlier one is answered) and still append after the client gave up on that connection,
/// and after a leader change the client sends new batches to the new leader while the old one
/// holds an earlier batch's request. Remembering more turns such a retry into the duplicate it
/// is, answered with its original offsets. 24 bytes a batch; a snapshot stores the count in one
/// byte, and every version reads any count.
pub const PRODUCER_BATCHES_MAX: usize = 32;
/// Producers one partition remembers; beyond it the least recently active are forgotten (they
/// then start over as unknown producers, which Kafka also accepts).
pub const PRODUCERS_PER_PARTITION_MAX: usize = 100_000;

const SNAPSHOT_MAGIC: &[u8; 4] = b"SLPS";
/// Version 4 added each producer's last coordinator epoch; version 3 each producer's open
/// transaction and the partition's aborted transactions; version 2 each producer's last
/// timestamp. The older versions still load: version 3's coordinator epochs are unknown until the
/// producer's next marker, versions 1 and 2 have no open transaction (a release without
/// transactions wrote them), and version 1's timestamps are unknown (`Timestamp::NONE`) until the
/// producer appends again.
const SNAPSHOT_VERSION: u32 = 4;
const SNAPSHOT_VERSION_NO_COORDINATOR_EPOCH: u32 = 3;
const SNAPSHOT_VERSION_NO_TXN: u32 = 2;
const SNAPSHOT_VERSION_NO_TIMESTAMP: u32 = 1;

/// A control record's type (the second field of its key, after the version).
pub const CONTROL_TYPE_ABORT: i16 = 0;
pub const CONTROL_TYPE_COMMIT: i16 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchMeta {
    pub first_seq: i32,
    pub last_seq: i32,
    pub base_offset: Offset,
    pub last_offset: Offset,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProducerEntry {
    pub epoch: i16,
    pub batches: VecDeque<BatchMeta>,
    /// Offset of the producer's last batch, to forget the least recently active first.
    pub last_offset: Offset,
    /// The max timestamp of the producer's last batch, as the log holds it (the broker's time
    /// on `LogAppendTime` topics). DescribeProducers reports it.
    pub last_timestamp: Timestamp,
    /// The offset of the producer's first batch in its open transaction, if one is open here.
    pub current_txn_first_offset: Option<Offset>,
    /// The coordinator epoch of the producer's last marker (Kafka's `coordinatorEpoch`), which
    /// DescribeProducers reports, `kafka-transactions abort` sends back, and which fences the
    /// markers of an older coordinator. Snapshots carry it from format 4 on; loaded from an
    /// older one it is unknown until the producer's next marker.
    pub coordinator_epoch: Option<i32>,
}

/// A transaction aborted in this partition: its records from `first_offset` up to the abort
/// marker at `last_offset` are to be dropped by `read_committed` consumers. Kafka's
/// `AbortedTxn`, and what a Fetch response's `aborted_transactions` lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: Offset,
    /// The offset of the abort marker.
    pub last_offset: Offset,
    /// The first offset still undecided once this transaction ended (the LSO it left behind,
    /// high watermark aside). Every transaction aborted later began at or after it, so a
    /// search for the aborted transactions of a range stops at the first entry whose
    /// `last_stable_offset` is past the range.
    pub last_stable_offset: Offset,
}

/// A transaction one control batch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompletedTxn {
    pub producer_id: i64,
    pub first_offset: Offset,
    pub marker_offset: Offset,
    pub committed: bool,
}

/// One idempotent producer as DescribeProducers shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActiveProducer {
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// The last sequence of its last batch; -1 when no batch with a sequence is remembered
    /// (after an epoch bump that only wrote a control batch).
    pub last_sequence: i32,
    pub last_timestamp: Timestamp,
    /// The first offset of its open transaction here, -1 when none is open.
    pub current_txn_start_offset: i64,
    /// The coordinator epoch of its last marker here, -1 when unknown.
    pub coordinator_epoch: i32,
}

/// What to do with a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SequenceCheck {
    Append,
    /// A retry of a batch already in the log at these offsets.
    Duplicate {
        base_offset: Offset,
        last_offset: Offset,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProducerError {
    #[error("producer {producer_id} epoch {epoch} is older than the current epoch {current}")]
    InvalidEpoch {
        producer_id: i64,
        epoch: i16,
        current: i16,
    },
    #[error("producer {producer_id}: sequence {first_seq} out of order, expected {expected}")]
    OutOfOrderSequence {
        producer_id: i64,
        first_seq: i32,
        expected: i32,
    },
    #[error("producer {producer_id}: a marker from coordinator epoch {coordinator_epoch}, older than the last marker's {current}")]
    CoordinatorFenced {
        producer_id: i64,
        coordinator_epoch: i32,
        current: i32,
    },
}

fn next_seq(seq: i32) -> i32 {
    if seq == i32::MAX {
        0
    } else {
        seq + 1
    }
}

fn last_seq_of(header: &BatchHeader<'_>) -> i32 {
    let first = header.base_sequence() as i64;
    ((first + header.last_offset_delta() as i64) % (i32::MAX as i64 + 1)) as i32
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProducerStateManager {
    producers: HashMap<i64, ProducerEntry>,
    /// Open transactions by first offset (their producer ids): the first is the oldest.
    ongoing: BTreeMap<Offset, i64>,
    /// Transactions ended by a marker the high watermark has not passed yet, by marker offset
    /// (their first offsets). Not snapshotted: after a restart the replayed tail's markers are
    /// unreplicated again until the high watermark passes them.
    unreplicated: BTreeMap<Offset, Offset>,
    /// Aborted transactions by marker offset.
    aborted: BTreeMap<Offset, AbortedTxn>,
}

/// The control record type of a control batch (`CONTROL_TYPE_ABORT` or `CONTROL_TYPE_COMMIT`),
/// from its first record's key; `None` when the key is not a control key.
pub fn control_type(batch: &[u8]) -> Option<i16> {
    let record = crate::batch::Records::new(batch).next()?.ok()?;
    let key = record.key?;
    if key.len() < 4 {
        return None;
    }
    Some(i16::from_be_bytes([key[2], key[3]]))
}

/// The coordinator epoch a transaction marker carries, from its first record's value
/// (`(version 0, coordinator_epoch)`); `None` when the value is not a marker's.
pub fn control_coordinator_epoch(batch: &[u8]) -> Option<i32> {
    let record = crate::batch::Records::new(batch).next()?.ok()?;
    let value = record.value?;
    if value.len() < 6 {
        return None;
    }
    Some(i32::from_be_bytes([value[2], value[3], value[4], value[5]]))
}

impl ProducerStateManager {
    pub fn len(&self) -> usize {
        self.producers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    pub fn get(&self, producer_id: i64) -> Option<&ProducerEntry> {
        self.producers.get(&producer_id)
    }

    /// Every producer remembered, by producer id.
    pub fn active(&self) -> Vec<ActiveProducer> {
        let mut out: Vec<ActiveProducer> = self
            .producers
            .iter()
            .map(|(&producer_id, e)| ActiveProducer {
                producer_id,
                producer_epoch: e.epoch,
                last_sequence: e.batches.back().map(|b| b.last_seq).unwrap_or(-1),
                last_timestamp: e.last_timestamp,
                current_txn_start_offset: e.current_txn_first_offset.map_or(-1, |o| o.0),
                coordinator_epoch: e.coordinator_epoch.unwrap_or(-1),
            })
            .collect();
        out.sort_by_key(|p| p.producer_id);
        out
    }

    /// Checks a batch from a producer before it is assigned offsets.
    pub fn check(&self, header: &BatchHeader<'_>) -> Result<SequenceCheck, ProducerError> {
        let producer_id = header.producer_id();
        if header.is_control() {
            // A marker carries no sequence; one from an older producer epoch than the
            // producer's, or from an older coordinator epoch than its last marker's, is a
            // zombie coordinator's and is refused, as Kafka does.
            let coordinator_epoch = control_coordinator_epoch(header.bytes());
            return match self.producers.get(&producer_id) {
                Some(e) if header.producer_epoch() < e.epoch => Err(ProducerError::InvalidEpoch {
                    producer_id,
                    epoch: header.producer_epoch(),
                    current: e.epoch,
                }),
                Some(ProducerEntry {
                    coordinator_epoch: Some(current),
                    ..
                }) if coordinator_epoch.is_some_and(|c| c < *current) => {
                    Err(ProducerError::CoordinatorFenced {
                        producer_id,
                        coordinator_epoch: coordinator_epoch.unwrap_or(-1),
                        current: *current,
                    })
                }
                _ => Ok(SequenceCheck::Append),
            };
        }
        if producer_id < 0 {
            return Ok(SequenceCheck::Append);
        }
        if header.base_sequence() < 0 {
            // A coordinator's batch for a producer (transactional offsets) has no sequence, but
            // an older epoch than the partition knows is a fenced producer's, as in Kafka.
            return match self.producers.get(&producer_id) {
                Some(e) if header.producer_epoch() < e.epoch => Err(ProducerError::InvalidEpoch {
                    producer_id,
                    epoch: header.producer_epoch(),
                    current: e.epoch,
                }),
                _ => Ok(SequenceCheck::Append),
            };
        }
        let Some(entry) = self.producers.get(&producer_id) else {
            // Unknown producer (new, or its state expired): accept whatever it sends.
            return Ok(SequenceCheck::Append);
        };
        let epoch = header.producer_epoch();
        if epoch < entry.epoch {
            return Err(ProducerError::InvalidEpoch {
                producer_id,
                epoch,
                current: entry.epoch,
            });
        }
        let first_seq = header.base_sequence();
        if epoch > entry.epoch {
            // A bumped epoch starts its sequence over.
            if first_seq != 0 {
                return Err(ProducerError::OutOfOrderSequence {
                    producer_id,
                    first_seq,
                    expected: 0,
                });
            }
            return Ok(SequenceCheck::Append);
        }
        let last_seq = last_seq_of(header);
        if let Some(dup) = entry
            .batches
            .iter()
            .find(|b| b.first_seq == first_seq && b.last_seq == last_seq)
        {
            return Ok(SequenceCheck::Duplicate {
                base_offset: dup.base_offset,
                last_offset: dup.last_offset,
            });
        }
        // A known producer with no batch remembered at its epoch (one bumped by a marker, as
        // transaction version 2 does at every end) starts at sequence 0, as in Kafka: a batch
        // that overtook the producer's first one must not land ahead of it.
        let expected = entry
            .batches
            .back()
            .map_or(0, |last| next_seq(last.last_seq));
        if first_seq != expected {
            return Err(ProducerError::OutOfOrderSequence {
                producer_id,
                first_seq,
                expected,
            });
        }
        Ok(SequenceCheck::Append)
    }

    /// Records a batch appended at `base..=last` (after `check` said Append, or when replaying the
    /// log on open). `header` must span the whole batch (a control batch's record is read).
    /// Returns the transaction a control batch ended.
    pub fn record(
        &mut self,
        header: &BatchHeader<'_>,
        base_offset: Offset,
        last_offset: Offset,
    ) -> Option<CompletedTxn> {
        let producer_id = header.producer_id();
        if producer_id < 0 {
            return None;
        }
        let epoch = header.producer_epoch();
        let entry = self.producers.entry(producer_id).or_default();
        if epoch != entry.epoch {
            entry.epoch = epoch;
            entry.batches.clear();
        }
        entry.last_offset = last_offset;
        entry.last_timestamp = header.max_timestamp();
        let mut completed = None;
        if header.is_control() {
            // A marker ends the open transaction; one with none open (a retried marker) ends an
            // empty one at its own offset, as in Kafka.
            let first_offset = entry.current_txn_first_offset.take();
            if let Some(first) = first_offset {
                self.ongoing.remove(&first);
            }
            let kind = control_type(header.bytes());
            if matches!(kind, Some(CONTROL_TYPE_ABORT | CONTROL_TYPE_COMMIT)) {
                if let Some(coordinator_epoch) = control_coordinator_epoch(header.bytes()) {
                    entry.coordinator_epoch = Some(coordinator_epoch);
                }
                completed = Some(CompletedTxn {
                    producer_id,
                    first_offset: first_offset.unwrap_or(base_offset),
                    marker_offset: base_offset,
                    committed: kind == Some(CONTROL_TYPE_COMMIT),
                });
            }
        } else if header.is_transactional() && entry.current_txn_first_offset.is_none() {
            entry.current_txn_first_offset = Some(base_offset);
            self.ongoing.insert(base_offset, producer_id);
        }
        let entry = self
            .producers
            .get_mut(&producer_id)
            .expect("inserted above");
        if header.base_sequence() >= 0 && !header.is_control() {
            entry.batches.push_back(BatchMeta {
                first_seq: header.base_sequence(),
                last_seq: last_seq_of(header),
                base_offset,
                last_offset,
            });
            while entry.batches.len() > PRODUCER_BATCHES_MAX {
                entry.batches.pop_front();
            }
        }
        if self.producers.len() > PRODUCERS_PER_PARTITION_MAX {
            // A producer with an open transaction is never forgotten: its marker must find it.
            let oldest = self
                .producers
                .iter()
                .filter(|(_, e)| e.current_txn_first_offset.is_none())
                .min_by_key(|(_, e)| e.last_offset)
                .map(|(&p, _)| p);
            if let Some(p) = oldest {
                self.producers.remove(&p);
            }
        }
        if let Some(done) = completed {
            if !done.committed {
                let last_stable_offset = self
                    .first_undecided_offset()
                    .unwrap_or(done.marker_offset.next());
                self.aborted.insert(
                    done.marker_offset,
                    AbortedTxn {
                        producer_id,
                        first_offset: done.first_offset,
                        last_offset: done.marker_offset,
                        last_stable_offset,
                    },
                );
            }
            self.unreplicated
                .insert(done.marker_offset, done.first_offset);
        }
        completed
    }

    /// The first offset of an open transaction or of one whose marker the high watermark has not
    /// passed (as of the last [`ProducerStateManager::advance_high_watermark`]).
    fn first_undecided_offset(&self) -> Option<Offset> {
        let open = self.ongoing.keys().next().copied();
        let unreplicated = self.unreplicated.values().min().copied();
        match (open, unreplicated) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Forgets the unreplicated state of transactions whose markers are below `high_watermark`,
    /// then returns the first offset that is not yet stable, if any: the LSO is the smaller of
    /// it and the high watermark.
    pub fn first_unstable_offset(&mut self, high_watermark: Offset) -> Option<Offset> {
        while let Some((&marker, _)) = self.unreplicated.first_key_value() {
            if marker >= high_watermark {
                break;
            }
            self.unreplicated.pop_first();
        }
        self.first_undecided_offset()
    }

    /// The transactions aborted within `[from, to)`: those whose marker is at or past `from`
    /// and whose first offset is below `to`.
    pub fn aborted_transactions(&self, from: Offset, to: Offset) -> Vec<AbortedTxn> {
        let mut out = Vec::new();
        for a in self.aborted.range(from..).map(|(_, a)| a) {
            if a.first_offset < to {
                out.push(*a);
            }
            if a.last_stable_offset >= to {
                break;
            }
        }
        out
    }

    /// Forgets the aborted transaction whose abort marker is at `marker_offset`: compaction
    /// removed that marker, its records having gone before it. A read-committed consumer must
    /// never be told of an aborted transaction whose marker is gone (it would drop the
    /// producer's later transactional batches until an abort marker that never comes), so the
    /// entry goes no later than the marker does.
    pub fn forget_aborted(&mut self, marker_offset: Offset) -> Option<AbortedTxn> {
        self.aborted.remove(&marker_offset)
    }

    /// Puts back an entry [`ProducerStateManager::forget_aborted`] returned.
    pub fn restore_aborted(&mut self, txn: AbortedTxn) {
        self.aborted.insert(txn.last_offset, txn);
    }

    /// The base offset of every producer's last batch with a sequence (the batch its next
    /// sequence continues from). Compaction keeps such a batch's header even when it removes
    /// all of its records, as Kafka's cleaner does.
    pub fn last_batch_offsets(&self) -> HashMap<i64, Offset> {
        self.producers
            .iter()
            .filter_map(|(&id, e)| Some((id, e.batches.back()?.base_offset)))
            .collect()
    }

    /// Forgets aborted transactions whose markers are below the log start offset.
    pub fn trim_aborted(&mut self, log_start_offset: Offset) {
        self.aborted = self.aborted.split_off(&log_start_offset);
    }

    /// Snapshot bytes for the state as of `offset` (every batch below it recorded).
    pub fn encode(&self, offset: Offset) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&SNAPSHOT_VERSION.to_be_bytes());
        out.extend_from_slice(&offset.0.to_be_bytes());
        let mut ids: Vec<&i64> = self.producers.keys().collect();
        ids.sort();
        out.extend_from_slice(&(ids.len() as u32).to_be_bytes());
        for id in ids {
            let e = &self.producers[id];
            out.extend_from_slice(&id.to_be_bytes());
            out.extend_from_slice(&e.epoch.to_be_bytes());
            out.extend_from_slice(&e.last_offset.0.to_be_bytes());
            out.extend_from_slice(&e.last_timestamp.0.to_be_bytes());
            out.extend_from_slice(&e.current_txn_first_offset.map_or(-1, |o| o.0).to_be_bytes());
            out.extend_from_slice(&e.coordinator_epoch.unwrap_or(-1).to_be_bytes());
            out.push(e.batches.len() as u8);
            for b in &e.batches {
                out.extend_from_slice(&b.first_seq.to_be_bytes());
                out.extend_from_slice(&b.last_seq.to_be_bytes());
                out.extend_from_slice(&b.base_offset.0.to_be_bytes());
                out.extend_from_slice(&b.last_offset.0.to_be_bytes());
            }
        }
        out.extend_from_slice(&(self.aborted.len() as u32).to_be_bytes());
        for a in self.aborted.values() {
            for v in [
                a.producer_id,
                a.first_offset.0,
                a.last_offset.0,
                a.last_stable_offset.0,
            ] {
                out.extend_from_slice(&v.to_be_bytes());
            }
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        out
    }

    /// Decodes a snapshot: the state and the offset it covers. `None` if damaged.
    pub fn decode(bytes: &[u8]) -> Option<(ProducerStateManager, Offset)> {
        if bytes.len() < 24 || &bytes[..4] != SNAPSHOT_MAGIC {
            return None;
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32fast::hash(body).to_be_bytes() != crc {
            return None;
        }
        let mut at = 4;
        let mut take = |n: usize| -> Option<&[u8]> {
            let s = body.get(at..at + n)?;
            at += n;
            Some(s)
        };
        let version = u32::from_be_bytes(take(4)?.try_into().ok()?);
        if ![
            SNAPSHOT_VERSION,
            SNAPSHOT_VERSION_NO_COORDINATOR_EPOCH,
            SNAPSHOT_VERSION_NO_TXN,
            SNAPSHOT_VERSION_NO_TIMESTAMP,
        ]
        .contains(&version)
        {
            return None;
        }
        let offset = Offset(i64::from_be_bytes(take(8)?.try_into().ok()?));
        let count = u32::from_be_bytes(take(4)?.try_into().ok()?) as usize;
        let mut state = ProducerStateManager::default();
        for _ in 0..count {
            let id = i64::from_be_bytes(take(8)?.try_into().ok()?);
            let epoch = i16::from_be_bytes(take(2)?.try_into().ok()?);
            let last_offset = Offset(i64::from_be_bytes(take(8)?.try_into().ok()?));
            let last_timestamp = if version == SNAPSHOT_VERSION_NO_TIMESTAMP {
                Timestamp::NONE
            } else {
                Timestamp(i64::from_be_bytes(take(8)?.try_into().ok()?))
            };
            let current_txn_first_offset = if version >= SNAPSHOT_VERSION_NO_COORDINATOR_EPOCH {
                Some(i64::from_be_bytes(take(8)?.try_into().ok()?))
                    .filter(|&o| o >= 0)
                    .map(Offset)
            } else {
                None
            };
            let coordinator_epoch = if version >= SNAPSHOT_VERSION {
                Some(i32::from_be_bytes(take(4)?.try_into().ok()?)).filter(|&e| e >= 0)
            } else {
                None
            };
            let n = take(1)?[0] as usize;
            let mut batches = VecDeque::with_capacity(n);
            for _ in 0..n {
                batches.push_back(BatchMeta {
                    first_seq: i32::from_be_bytes(take(4)?.try_into().ok()?),
                    last_seq: i32::from_be_bytes(take(4)?.try_into().ok()?),
                    base_offset: Offset(i64::from_be_bytes(take(8)?.try_into().ok()?)),
                    last_offset: Offset(i64::from_be_bytes(take(8)?.try_into().ok()?)),
                });
            }
            if let Some(first) = current_txn_first_offset {
                state.ongoing.insert(first, id);
            }
            state.producers.insert(
                id,
                ProducerEntry {
                    epoch,
                    batches,
                    last_offset,
                    last_timestamp,
                    current_txn_first_offset,
                    coordinator_epoch,
                },
            );
        }
        if version >= SNAPSHOT_VERSION_NO_COORDINATOR_EPOCH {
            let aborted = u32::from_be_bytes(take(4)?.try_into().ok()?) as usize;
            for _ in 0..aborted {
                let mut v = [0i64; 4];
                for x in &mut v {
                    *x = i64::from_be_bytes(take(8)?.try_into().ok()?);
                }
                let a = AbortedTxn {
                    producer_id: v[0],
                    first_offset: Offset(v[1]),
                    last_offset: Offset(v[2]),
                    last_stable_offset: Offset(v[3]),
                };
                state.aborted.insert(a.last_offset, a);
            }
        }
        if take(1).is_some() {
            return None;
        }
        Some((state, offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{BatchBuilder, NewRecord};
    use crate::types::Timestamp;

    fn batch(pid: i64, epoch: i16, seq: i32, records: usize) -> bytes::Bytes {
        let mut b = BatchBuilder::new().producer(pid, epoch, seq);
        for _ in 0..records {
            b.push(&NewRecord {
                value: Some(b"v".to_vec()),
                timestamp: Timestamp(1),
                ..Default::default()
            });
        }
        b.build()
    }

    fn txn_batch(pid: i64, epoch: i16, seq: i32, records: usize) -> bytes::Bytes {
        let mut b = BatchBuilder::new()
            .producer(pid, epoch, seq)
            .attributes(crate::batch::ATTR_TRANSACTIONAL);
        for _ in 0..records {
            b.push(&NewRecord {
                value: Some(b"t".to_vec()),
                timestamp: Timestamp(1),
                ..Default::default()
            });
        }
        b.build()
    }

    fn marker(pid: i64, epoch: i16, commit: bool) -> bytes::Bytes {
        crate::batch::control_batch(pid, epoch, commit, 3, Timestamp(2))
    }

    fn record(s: &mut ProducerStateManager, b: &[u8], base: i64) -> Option<CompletedTxn> {
        let h = BatchHeader::parse(b).unwrap();
        let last = base + h.last_offset_delta() as i64;
        s.record(&h, Offset(base), Offset(last))
    }

    #[test]
    fn after_a_marker_bumps_the_epoch_the_next_batch_must_start_at_sequence_zero() {
        // Transaction version 2: the commit marker carries the bumped epoch, so the producer's
        // entry is at the new epoch with no batch. A later batch of the next transaction that
        // overtook its first one (which was still being verified) is out of order, and the
        // first one then lands.
        let mut s = ProducerStateManager::default();
        record(&mut s, &txn_batch(2, 28, 0, 432), 0);
        record(&mut s, &txn_batch(2, 28, 432, 68), 432);
        record(&mut s, &marker(2, 29, true), 500);
        let second = txn_batch(2, 29, 432, 68);
        assert_eq!(
            s.check(&BatchHeader::parse(&second).unwrap()),
            Err(ProducerError::OutOfOrderSequence {
                producer_id: 2,
                first_seq: 432,
                expected: 0,
            })
        );
        let first = txn_batch(2, 29, 0, 432);
        assert_eq!(
            s.check(&BatchHeader::parse(&first).unwrap()),
            Ok(SequenceCheck::Append)
        );
        record(&mut s, &first, 501);
        assert_eq!(
            s.check(&BatchHeader::parse(&second).unwrap()),
            Ok(SequenceCheck::Append)
        );
        // A producer the partition does not know may start anywhere (its state expired).
        let unknown = batch(9, 0, 77, 1);
        assert_eq!(
            s.check(&BatchHeader::parse(&unknown).unwrap()),
            Ok(SequenceCheck::Append)
        );
    }

    #[test]
    fn a_coordinator_batch_without_sequence_is_checked_for_its_epoch_only() {
        let mut s = ProducerStateManager::default();
        record(&mut s, &txn_batch(5, 2, 0, 1), 0);
        // Transactional offsets a group coordinator writes for producer 5: no sequence.
        let current = txn_batch(5, 2, -1, 1);
        let check = s.check(&BatchHeader::parse(&current).unwrap()).unwrap();
        assert!(matches!(check, SequenceCheck::Append));
        let fenced = txn_batch(5, 1, -1, 1);
        let check = s.check(&BatchHeader::parse(&fenced).unwrap());
        assert!(
            matches!(
                check,
                Err(ProducerError::InvalidEpoch {
                    producer_id: 5,
                    epoch: 1,
                    current: 2
                })
            ),
            "{check:?}"
        );
        // An unknown producer's is taken.
        let unknown = txn_batch(7, 0, -1, 1);
        assert!(matches!(
            s.check(&BatchHeader::parse(&unknown).unwrap()),
            Ok(SequenceCheck::Append)
        ));
    }

    #[test]
    fn transactions_bound_the_stable_offset_until_their_markers_are_replicated() {
        let mut s = ProducerStateManager::default();
        assert_eq!(control_type(&marker(5, 0, false)), Some(CONTROL_TYPE_ABORT));
        assert_eq!(control_type(&marker(5, 0, true)), Some(CONTROL_TYPE_COMMIT));
        // Non-transactional data never holds the stable offset back.
        assert_eq!(record(&mut s, &batch(9, 0, 0, 2), 0), None);
        assert_eq!(s.first_unstable_offset(Offset(2)), None);
        record(&mut s, &txn_batch(5, 0, 0, 3), 10); // 10..=12
        record(&mut s, &txn_batch(6, 0, 0, 1), 13);
        record(&mut s, &txn_batch(5, 0, 3, 1), 14); // same transaction, still from 10
        assert_eq!(s.first_unstable_offset(Offset(15)), Some(Offset(10)));
        assert_eq!(
            s.active()
                .iter()
                .find(|p| p.producer_id == 5)
                .unwrap()
                .current_txn_start_offset,
            10
        );
        let done = record(&mut s, &marker(5, 0, false), 15);
        assert_eq!(
            done,
            Some(CompletedTxn {
                producer_id: 5,
                first_offset: Offset(10),
                marker_offset: Offset(15),
                committed: false
            })
        );
        // The abort is decided but its marker is not below the high watermark yet.
        assert_eq!(s.first_unstable_offset(Offset(15)), Some(Offset(10)));
        assert_eq!(s.first_unstable_offset(Offset(16)), Some(Offset(13)));
        let aborted = AbortedTxn {
            producer_id: 5,
            first_offset: Offset(10),
            last_offset: Offset(15),
            last_stable_offset: Offset(13),
        };
        assert_eq!(
            s.aborted_transactions(Offset(0), Offset(100)),
            vec![aborted]
        );
        assert_eq!(
            s.aborted_transactions(Offset(11), Offset(12)),
            vec![aborted]
        );
        assert_eq!(s.aborted_transactions(Offset(16), Offset(100)), vec![]);
        assert_eq!(s.aborted_transactions(Offset(0), Offset(10)), vec![]);
        // A snapshot keeps the open transaction and the aborted one.
        let (back, _) = ProducerStateManager::decode(&s.encode(Offset(16))).unwrap();
        let mut back = back;
        assert_eq!(back.first_unstable_offset(Offset(16)), Some(Offset(13)));
        assert_eq!(
            back.aborted_transactions(Offset(0), Offset(100)),
            vec![aborted]
        );
        // A marker from an older epoch is refused; the commit ends producer 6's transaction.
        record(&mut s, &txn_batch(6, 0, 1, 1), 16);
        let stale = marker(5, -1, true);
        assert!(s.check(&BatchHeader::parse(&stale).unwrap()).is_err());
        let commit = marker(6, 0, true);
        assert_eq!(
            s.check(&BatchHeader::parse(&commit).unwrap()),
            Ok(SequenceCheck::Append)
        );
        assert!(record(&mut s, &commit, 17).unwrap().committed);
        assert_eq!(s.first_unstable_offset(Offset(17)), Some(Offset(13)));
        assert_eq!(s.first_unstable_offset(Offset(18)), None);
        // Only aborts are listed; trimming drops those below the log start.
        assert_eq!(
            s.aborted_transactions(Offset(0), Offset(100)),
            vec![aborted]
        );
        s.trim_aborted(Offset(16));
        assert_eq!(s.aborted_transactions(Offset(0), Offset(100)), vec![]);
        // A new transaction of the same producer starts at its own first batch.
        record(&mut s, &txn_batch(5, 0, 4, 1), 18);
        assert_eq!(s.first_unstable_offset(Offset(19)), Some(Offset(18)));
    }

    #[test]
    fn the_last_markers_coordinator_epoch_is_reported_fences_older_markers_and_is_snapshotted() {
        let mut s = ProducerStateManager::default();
        let epoch_of = |s: &ProducerStateManager| {
            s.active()
                .iter()
                .find(|p| p.producer_id == 5)
                .unwrap()
                .coordinator_epoch
        };
        record(&mut s, &txn_batch(5, 0, 0, 1), 0);
        assert_eq!(epoch_of(&s), -1, "no marker yet");
        let m = crate::batch::control_batch(5, 0, false, 7, Timestamp(2));
        assert_eq!(control_coordinator_epoch(&m), Some(7));
        assert_eq!(control_coordinator_epoch(&txn_batch(5, 0, 1, 1)), None);
        record(&mut s, &m, 1);
        assert_eq!(epoch_of(&s), 7);
        // A marker from an older coordinator epoch is a zombie coordinator's.
        let zombie = crate::batch::control_batch(5, 0, true, 6, Timestamp(2));
        assert!(matches!(
            s.check(&BatchHeader::parse(&zombie).unwrap()),
            Err(ProducerError::CoordinatorFenced {
                producer_id: 5,
                coordinator_epoch: 6,
                current: 7
            })
        ));
        let same = crate::batch::control_batch(5, 0, true, 7, Timestamp(2));
        assert_eq!(
            s.check(&BatchHeader::parse(&same).unwrap()),
            Ok(SequenceCheck::Append)
        );
        // A new transaction keeps the epoch of the last marker until its own marker.
        record(&mut s, &txn_batch(5, 0, 1, 1), 2);
        assert_eq!(epoch_of(&s), 7);
        record(
            &mut s,
            &crate::batch::control_batch(5, 0, true, 9, Timestamp(3)),
            3,
        );
        assert_eq!(epoch_of(&s), 9);
        // A snapshot keeps it, so the fencing holds across a restart.
        let v4 = s.encode(Offset(4));
        let (back, _) = ProducerStateManager::decode(&v4).unwrap();
        assert_eq!(epoch_of(&back), 9);
        let zombie = crate::batch::control_batch(5, 0, true, 8, Timestamp(4));
        assert!(matches!(
            back.check(&BatchHeader::parse(&zombie).unwrap()),
            Err(ProducerError::CoordinatorFenced { current: 9, .. })
        ));
        // Format 3 had no room for it: unknown until the next marker. The same state as format
        // 3 wrote it: version 3, and no coordinator epoch after the open transaction's offset
        // (header 20 bytes, then producer 5's id, epoch, last offset, timestamp, first offset).
        let at = 20 + 8 + 2 + 8 + 8 + 8;
        assert_eq!(&v4[at..at + 4], &9i32.to_be_bytes());
        let mut v3 = v4[..v4.len() - 4].to_vec();
        v3.drain(at..at + 4);
        v3[4..8].copy_from_slice(&3u32.to_be_bytes());
        let crc = crc32fast::hash(&v3);
        v3.extend_from_slice(&crc.to_be_bytes());
        let (old, _) = ProducerStateManager::decode(&v3).unwrap();
        assert_eq!(epoch_of(&old), -1);
        assert_eq!(
            old.active()[0].producer_epoch,
            back.active()[0].producer_epoch
        );
    }

    #[test]
    fn the_aborted_search_stops_at_the_first_entry_past_the_range() {
        let mut s = ProducerStateManager::default();
        // Three transactions aborted one after the other, none overlapping.
        let mut at = 0;
        for pid in 1..=3 {
            record(&mut s, &txn_batch(pid, 0, 0, 2), at);
            record(&mut s, &marker(pid, 0, false), at + 2);
            // The high watermark passes each marker before the next transaction ends.
            assert_eq!(s.first_unstable_offset(Offset(at + 3)), None);
            at += 3;
        }
        let all = s.aborted_transactions(Offset(0), Offset(100));
        assert_eq!(
            all.iter().map(|a| a.first_offset.0).collect::<Vec<_>>(),
            vec![0, 3, 6]
        );
        assert_eq!(
            all.iter()
                .map(|a| a.last_stable_offset.0)
                .collect::<Vec<_>>(),
            vec![3, 6, 9]
        );
        let some = s.aborted_transactions(Offset(0), Offset(4));
        assert_eq!(
            some.iter().map(|a| a.producer_id).collect::<Vec<_>>(),
            vec![1, 2]
        );
    }

    #[test]
    fn sequences_must_continue_and_retries_are_duplicates() {
        let mut s = ProducerStateManager::default();
        let b0 = batch(7, 0, 0, 3);
        let h0 = BatchHeader::parse(&b0).unwrap();
        assert_eq!(s.check(&h0), Ok(SequenceCheck::Append));
        s.record(&h0, Offset(10), Offset(12));
        assert_eq!(
            s.check(&h0),
            Ok(SequenceCheck::Duplicate {
                base_offset: Offset(10),
                last_offset: Offset(12)
            })
        );
        let gap = batch(7, 0, 5, 1);
        assert!(matches!(
            s.check(&BatchHeader::parse(&gap).unwrap()),
            Err(ProducerError::OutOfOrderSequence { expected: 3, .. })
        ));
        let next = batch(7, 0, 3, 2);
        assert_eq!(
            s.check(&BatchHeader::parse(&next).unwrap()),
            Ok(SequenceCheck::Append)
        );
        let old_epoch = batch(7, -1, 0, 1);
        assert!(s.check(&BatchHeader::parse(&old_epoch).unwrap()).is_err());
        let bumped_bad = batch(7, 1, 4, 1);
        assert!(s.check(&BatchHeader::parse(&bumped_bad).unwrap()).is_err());
        let bumped = batch(7, 1, 0, 1);
        assert_eq!(
            s.check(&BatchHeader::parse(&bumped).unwrap()),
            Ok(SequenceCheck::Append)
        );
    }

    #[test]
    fn only_the_last_batches_are_remembered_and_snapshots_round_trip() {
        let mut s = ProducerStateManager::default();
        let n = PRODUCER_BATCHES_MAX as i32 + 3;
        for i in 0..n {
            let b = batch(1, 2, i, 1);
            s.record(
                &BatchHeader::parse(&b).unwrap(),
                Offset(i as i64),
                Offset(i as i64),
            );
        }
        assert_eq!(s.get(1).unwrap().batches.len(), PRODUCER_BATCHES_MAX);
        let old = batch(1, 2, 1, 1);
        assert!(
            s.check(&BatchHeader::parse(&old).unwrap()).is_err(),
            "a batch older than the remembered ones is not a duplicate"
        );
        // A retry from more than Kafka's five batches back (pipelined produces appended behind
        // it, or a new leader took later batches) is still answered as the duplicate it is.
        let seq = n - 20;
        let retry = batch(1, 2, seq, 1);
        assert_eq!(
            s.check(&BatchHeader::parse(&retry).unwrap()),
            Ok(SequenceCheck::Duplicate {
                base_offset: Offset(seq as i64),
                last_offset: Offset(seq as i64)
            })
        );
        let bytes = s.encode(Offset(n as i64));
        let (back, offset) = ProducerStateManager::decode(&bytes).unwrap();
        assert_eq!((back, offset), (s.clone(), Offset(n as i64)));
        let mut bad = bytes.clone();
        bad[20] ^= 1;
        assert!(ProducerStateManager::decode(&bad).is_none());
    }

    #[test]
    fn active_producers_report_last_sequence_and_timestamp_across_snapshots() {
        let mut s = ProducerStateManager::default();
        let mut b = BatchBuilder::new().producer(9, 3, 0);
        for t in [1_700_000_000_005, 1_700_000_000_002] {
            b.push(&NewRecord {
                value: Some(b"v".to_vec()),
                timestamp: Timestamp(t),
                ..Default::default()
            });
        }
        let b = b.build();
        s.record(&BatchHeader::parse(&b).unwrap(), Offset(0), Offset(1));
        let b2 = batch(4, 0, 7, 1);
        s.record(&BatchHeader::parse(&b2).unwrap(), Offset(2), Offset(2));
        let want = vec![
            ActiveProducer {
                producer_id: 4,
                producer_epoch: 0,
                last_sequence: 7,
                last_timestamp: Timestamp(1),
                current_txn_start_offset: -1,
                coordinator_epoch: -1,
            },
            ActiveProducer {
                producer_id: 9,
                producer_epoch: 3,
                last_sequence: 1,
                last_timestamp: Timestamp(1_700_000_000_005),
                current_txn_start_offset: -1,
                coordinator_epoch: -1,
            },
        ];
        assert_eq!(s.active(), want);
        let (back, _) = ProducerStateManager::decode(&s.encode(Offset(3))).unwrap();
        assert_eq!(back.active(), want);

        // A version 1 snapshot (no timestamps) still loads; its timestamps are unknown.
        let mut v1 = Vec::new();
        v1.extend_from_slice(SNAPSHOT_MAGIC);
        v1.extend_from_slice(&SNAPSHOT_VERSION_NO_TIMESTAMP.to_be_bytes());
        v1.extend_from_slice(&3i64.to_be_bytes());
        v1.extend_from_slice(&1u32.to_be_bytes());
        v1.extend_from_slice(&4i64.to_be_bytes());
        v1.extend_from_slice(&0i16.to_be_bytes());
        v1.extend_from_slice(&2i64.to_be_bytes());
        v1.push(1);
        for v in [7i32, 7] {
            v1.extend_from_slice(&v.to_be_bytes());
        }
        for v in [2i64, 2] {
            v1.extend_from_slice(&v.to_be_bytes());
        }
        let crc = crc32fast::hash(&v1);
        v1.extend_from_slice(&crc.to_be_bytes());
        let (old, offset) = ProducerStateManager::decode(&v1).unwrap();
        assert_eq!(offset, Offset(3));
        assert_eq!(
            old.active(),
            vec![ActiveProducer {
                last_timestamp: Timestamp::NONE,
                ..want[0]
            }]
        );
    }
}
