//! Idempotent producer state of one partition (KIP-98): for every producer id, its epoch and
//! the sequence ranges and offsets of its last five batches.
//!
//! A batch from a known producer and epoch must continue its sequence exactly; a batch equal to
//! one of the last five is a retry and is answered with the original offsets instead of being
//! appended again; an older epoch is fenced. The state is snapshotted when a segment is sealed and
//! at clean shutdown (`<offset:020>.snapshot`, format in `FORMAT.md`) and rebuilt on open from the
//! latest snapshot plus the batches after it.

use std::collections::{HashMap, VecDeque};

use crate::batch::BatchHeader;
use crate::types::{Offset, Timestamp};

/// Batches remembered per producer for duplicate detection, as Kafka does.
pub const PRODUCER_BATCHES_MAX: usize = 5;
/// Producers one partition remembers; beyond it the least recently active are forgotten (they
/// then start over as unknown producers, which Kafka also accepts).
pub const PRODUCERS_PER_PARTITION_MAX: usize = 100_000;

const SNAPSHOT_MAGIC: &[u8; 4] = b"SLPS";
/// Version 2 added each producer's last timestamp; version 1 snapshots still load, with the
/// timestamps unknown (`Timestamp::NONE`) until the producer appends again.
const SNAPSHOT_VERSION: u32 = 2;
const SNAPSHOT_VERSION_NO_TIMESTAMP: u32 = 1;

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
            })
            .collect();
        out.sort_by_key(|p| p.producer_id);
        out
    }

    /// Checks a batch from a producer before it is assigned offsets.
    pub fn check(&self, header: &BatchHeader<'_>) -> Result<SequenceCheck, ProducerError> {
        let producer_id = header.producer_id();
        if producer_id < 0 || header.base_sequence() < 0 {
            return Ok(SequenceCheck::Append);
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
        match entry.batches.back() {
            Some(last) if first_seq != next_seq(last.last_seq) => {
                Err(ProducerError::OutOfOrderSequence {
                    producer_id,
                    first_seq,
                    expected: next_seq(last.last_seq),
                })
            }
            _ => Ok(SequenceCheck::Append),
        }
    }

    /// Records a batch appended at `base..=last` (after `check` said Append, or when replaying the
    /// log on open).
    pub fn record(&mut self, header: &BatchHeader<'_>, base_offset: Offset, last_offset: Offset) {
        let producer_id = header.producer_id();
        if producer_id < 0 {
            return;
        }
        let epoch = header.producer_epoch();
        let entry = self.producers.entry(producer_id).or_default();
        if epoch != entry.epoch {
            entry.epoch = epoch;
            entry.batches.clear();
        }
        entry.last_offset = last_offset;
        entry.last_timestamp = header.max_timestamp();
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
            let oldest = self
                .producers
                .iter()
                .min_by_key(|(_, e)| e.last_offset)
                .map(|(&p, _)| p);
            if let Some(p) = oldest {
                self.producers.remove(&p);
            }
        }
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
            out.push(e.batches.len() as u8);
            for b in &e.batches {
                out.extend_from_slice(&b.first_seq.to_be_bytes());
                out.extend_from_slice(&b.last_seq.to_be_bytes());
                out.extend_from_slice(&b.base_offset.0.to_be_bytes());
                out.extend_from_slice(&b.last_offset.0.to_be_bytes());
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
        if version != SNAPSHOT_VERSION && version != SNAPSHOT_VERSION_NO_TIMESTAMP {
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
            state.producers.insert(
                id,
                ProducerEntry {
                    epoch,
                    batches,
                    last_offset,
                    last_timestamp,
                },
            );
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
    fn only_the_last_five_batches_are_remembered_and_snapshots_round_trip() {
        let mut s = ProducerStateManager::default();
        for i in 0..8 {
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
            "a batch older than the last five is not a duplicate"
        );
        let bytes = s.encode(Offset(8));
        let (back, offset) = ProducerStateManager::decode(&bytes).unwrap();
        assert_eq!((back, offset), (s.clone(), Offset(8)));
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
            },
            ActiveProducer {
                producer_id: 9,
                producer_epoch: 3,
                last_sequence: 1,
                last_timestamp: Timestamp(1_700_000_000_005),
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
