//! Deterministic batch content for crash tests.
//!
//! Every batch a crash-test writer appends is a pure function of its [`BatchId`]: the writer
//! process's run number, the appending task, and the task's sequence number. The id is spelled
//! out in every record key, so a checker that finds a batch in a recovered log can rebuild what
//! the writer built and compare the two byte for byte. Anything in the log that does not match
//! is garbage no writer could have appended.

use bytes::Bytes;
use sluice_engine::batch::{BatchBuilder, NewRecord, Records, BATCH_HEADER_SIZE};
use sluice_engine::{LeaderEpoch, Offset, Timestamp};

/// Records per batch are 1..=this, so batches cover a varying number of offsets.
pub const RECORDS_PER_BATCH_MAX: u64 = 4;
/// Value bytes per batch. With the header and record framing, batches are ~100..4000 bytes.
pub const VALUE_BYTES_MIN: u64 = 20;
pub const VALUE_BYTES_MAX: u64 = 3_700;
const _: () = assert!(VALUE_BYTES_MIN >= RECORDS_PER_BATCH_MAX);
const _: () = assert!(VALUE_BYTES_MIN <= VALUE_BYTES_MAX);

/// Record timestamps start here (2023-11-14), plus the sequence number: deterministic, and in
/// the range real producers send, so nothing time-based (retention, segment.ms) trips on them.
const TIMESTAMP_BASE_MS: i64 = 1_700_000_000_000;

/// Names one batch a writer appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchId {
    pub run: u32,
    pub task: u32,
    pub seq: u64,
}

impl BatchId {
    /// Fixed width, so that the key length never changes a batch's size.
    fn key(&self, index: u64) -> Vec<u8> {
        format!(
            "r{:010}-t{:03}-s{:020}-i{:02}",
            self.run, self.task, self.seq, index
        )
        .into_bytes()
    }

    /// The inverse of `key`: the batch id and record index a key names.
    fn parse_key(key: &[u8]) -> Option<(BatchId, u64)> {
        let text = std::str::from_utf8(key).ok()?;
        let mut parts = text.split('-');
        let mut field =
            |prefix: char| -> Option<u64> { parts.next()?.strip_prefix(prefix)?.parse().ok() };
        let run = u32::try_from(field('r')?).ok()?;
        let task = u32::try_from(field('t')?).ok()?;
        let seq = field('s')?;
        let index = field('i')?;
        if parts.next().is_some() {
            return None;
        }
        let id = BatchId { run, task, seq };
        (id.key(index) == key).then_some((id, index))
    }

    fn seed(&self) -> u64 {
        let mut state = (self.run as u64) << 32 | self.task as u64;
        let mixed = splitmix64(&mut state);
        let mut state = mixed ^ self.seq;
        splitmix64(&mut state)
    }

    /// Record count and value bytes of the batch.
    fn shape(&self) -> (u64, u64) {
        let mut rng = self.seed() ^ 0x5eed;
        let record_count = 1 + splitmix64(&mut rng) % RECORDS_PER_BATCH_MAX;
        let value_bytes =
            VALUE_BYTES_MIN + splitmix64(&mut rng) % (VALUE_BYTES_MAX - VALUE_BYTES_MIN + 1);
        (record_count, value_bytes)
    }
}

/// SplitMix64: a tiny, well-mixed generator, enough to make content that differs everywhere.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Builds the batch `id` names. Same id, same bytes, in every process.
pub fn build_batch(id: BatchId) -> Bytes {
    let (record_count, value_bytes) = id.shape();
    let mut rng = id.seed();
    let mut builder = BatchBuilder::new();
    for index in 0..record_count {
        let mut len = value_bytes / record_count;
        if index == 0 {
            len += value_bytes % record_count;
        }
        let mut value = Vec::with_capacity(len as usize + 8);
        while (value.len() as u64) < len {
            value.extend_from_slice(&splitmix64(&mut rng).to_le_bytes());
        }
        value.truncate(len as usize);
        builder.push(&NewRecord {
            key: Some(id.key(index)),
            value: Some(value),
            headers: Vec::new(),
            timestamp: Timestamp(TIMESTAMP_BASE_MS + id.seq as i64 + index as i64),
        });
    }
    builder.build()
}

/// The byte ranges of a batch its producer chose: everything but the base offset (bytes 0..8)
/// and the partition leader epoch (12..16), which the log stamps on append.
fn producer_ranges(batch: &[u8]) -> [&[u8]; 2] {
    [&batch[8..12], &batch[16..]]
}

/// FNV-1a (64-bit) over the bytes the producer chose; see [`producer_ranges`]. Independent of
/// the CRC-32C the engine checks, so a match here is a second opinion, not the same one.
pub fn content_hash(batch: &[u8]) -> u64 {
    assert!(
        batch.len() >= BATCH_HEADER_SIZE,
        "a batch of {} bytes has no header",
        batch.len()
    );
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for range in producer_ranges(batch) {
        for &byte in range {
            hash ^= byte as u64;
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

/// Checks that `stored`, read back from a log, is `original` as the log stamps it: same bytes
/// everywhere the producer chose, the offset it was given and the leader epoch of the append.
pub fn check_same_batch(
    stored: &[u8],
    original: &[u8],
    base_offset: Offset,
    leader_epoch: LeaderEpoch,
) -> Result<(), String> {
    if stored.len() != original.len() {
        return Err(format!(
            "batch at offset {base_offset} is {} bytes, expected {}",
            stored.len(),
            original.len()
        ));
    }
    if stored.len() < BATCH_HEADER_SIZE {
        return Err(format!(
            "batch at offset {base_offset} is {} bytes, shorter than a header",
            stored.len()
        ));
    }
    let stamped_base = i64::from_be_bytes(stored[0..8].try_into().expect("8 bytes"));
    if stamped_base != base_offset.0 {
        return Err(format!(
            "batch read at offset {base_offset} carries base offset {stamped_base}"
        ));
    }
    let stamped_epoch = i32::from_be_bytes(stored[12..16].try_into().expect("4 bytes"));
    if stamped_epoch != leader_epoch.0 {
        return Err(format!(
            "batch at offset {base_offset} carries leader epoch {stamped_epoch}, expected {leader_epoch}"
        ));
    }
    for (from, to) in [(8usize, 12usize), (16, stored.len())] {
        if let Some(at) = (from..to).find(|&i| stored[i] != original[i]) {
            return Err(format!(
                "batch at offset {base_offset} differs at byte {at}: {:#04x}, expected {:#04x}",
                stored[at], original[at]
            ));
        }
    }
    Ok(())
}

/// Checks a batch read from a crash test's log: it must be exactly a batch some writer built
/// (found from its first record key), stamped with `base_offset` and `leader_epoch`.
pub fn check_written_batch(
    stored: &[u8],
    base_offset: Offset,
    leader_epoch: LeaderEpoch,
) -> Result<BatchId, String> {
    let first = match Records::new(stored).next() {
        Some(Ok(record)) => record,
        Some(Err(e)) => return Err(format!("batch at offset {base_offset} is malformed: {e}")),
        None => return Err(format!("batch at offset {base_offset} has no records")),
    };
    let key = first
        .key
        .ok_or_else(|| format!("batch at offset {base_offset}: first record has no key"))?;
    let Some((id, 0)) = BatchId::parse_key(key) else {
        return Err(format!(
            "batch at offset {base_offset}: first key {:?} is not one a writer makes",
            String::from_utf8_lossy(key)
        ));
    };
    check_same_batch(stored, &build_batch(id), base_offset, leader_epoch)?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use sluice_engine::batch::{stamp, validate_for_append};

    #[test]
    fn batches_are_deterministic_valid_and_sized_as_promised() {
        let mut sizes = HashSet::new();
        let mut record_counts = HashSet::new();
        for seq in 0..500 {
            let id = BatchId {
                run: 7,
                task: (seq % 4) as u32,
                seq,
            };
            let batch = build_batch(id);
            assert_eq!(batch, build_batch(id));
            validate_for_append(&batch, 1 << 20, false).unwrap();
            assert!(
                (100..=4000).contains(&batch.len()),
                "batch of {} bytes",
                batch.len()
            );
            sizes.insert(batch.len());
            record_counts.insert(Records::new(&batch).count());
        }
        assert!(sizes.len() > 300, "only {} different sizes", sizes.len());
        assert_eq!(record_counts.len(), RECORDS_PER_BATCH_MAX as usize);
    }

    #[test]
    fn a_stamped_batch_checks_out_and_any_change_is_caught() {
        let id = BatchId {
            run: 3,
            task: 1,
            seq: 42,
        };
        let mut stored = build_batch(id).to_vec();
        let hash = content_hash(&stored);
        stamp(&mut stored, Offset(1000), LeaderEpoch(0));
        assert_eq!(
            content_hash(&stored),
            hash,
            "stamping keeps the content hash"
        );
        assert_eq!(
            check_written_batch(&stored, Offset(1000), LeaderEpoch(0)),
            Ok(id)
        );
        assert!(check_written_batch(&stored, Offset(1001), LeaderEpoch(0)).is_err());
        assert!(check_written_batch(&stored, Offset(1000), LeaderEpoch(1)).is_err());
        for at in [9, 20, 30, BATCH_HEADER_SIZE + 3, stored.len() - 1] {
            let mut bad = stored.clone();
            bad[at] ^= 0x10;
            assert!(
                check_written_batch(&bad, Offset(1000), LeaderEpoch(0)).is_err(),
                "flip at byte {at} not caught"
            );
            assert_ne!(content_hash(&bad), hash, "flip at byte {at} keeps the hash");
        }
    }

    #[test]
    fn keys_round_trip() {
        let id = BatchId {
            run: u32::MAX,
            task: 3,
            seq: u64::MAX,
        };
        assert_eq!(BatchId::parse_key(&id.key(2)), Some((id, 2)));
        assert_eq!(BatchId::parse_key(b"r1-t2-s3-i0"), None, "not fixed width");
        assert_eq!(
            BatchId::parse_key(b"r0000000001-t002-s00000000000000000003"),
            None
        );
        assert_eq!(BatchId::parse_key(b"garbage"), None);
    }
}
