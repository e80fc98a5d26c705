//! Sparse time index of one segment, for ListOffsets by timestamp.
//!
//! An entry `(timestamp, relative_offset)` means: every batch in this segment before
//! `base_offset + relative_offset` has a max timestamp at or below `timestamp`. Entries are added
//! at the same moments as offset index entries (so the offset has an exact position), and only
//! when the timestamp grew. To find the first offset with a timestamp ≥ T, start scanning at the
//! last entry whose timestamp is below T. Closed segments store it in a `.timeindex` file, whose
//! trailer also records the segment's max timestamp and the offset that carries it.

use zerocopy::byteorder::big_endian::{I64, U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::offset_index::INDEX_VERSION;

pub const TIME_INDEX_MAGIC: [u8; 4] = *b"SLTI";
pub const TIME_INDEX_ENTRY_SIZE: usize = 12;

/// The last 32 bytes of a `.timeindex` file.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Debug)]
#[repr(C)]
pub struct TimeIndexTrailer {
    pub magic: [u8; 4],
    pub version: U16,
    pub reserved: U16,
    pub entry_count: U32,
    pub max_timestamp: I64,
    pub offset_of_max_timestamp: I64,
    /// crc32 (IEEE) of every entry and of the trailer's bytes before this field.
    pub crc: U32,
}
const _: () = assert!(std::mem::size_of::<TimeIndexTrailer>() == 32);

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TimeIndex {
    entries: Vec<(i64, u32)>,
}

impl TimeIndex {
    /// Adds an entry if `timestamp` is above the last one's.
    pub fn maybe_push(&mut self, timestamp: i64, relative_offset: u32) {
        match self.entries.last() {
            Some(&(t, o)) if timestamp <= t || relative_offset <= o => {}
            _ => self.entries.push((timestamp, relative_offset)),
        }
    }

    /// Relative offset to start scanning from for the first record with timestamp ≥ `target`.
    pub fn lookup(&self, target: i64) -> u32 {
        let i = self.entries.partition_point(|&(t, _)| t < target);
        if i == 0 {
            0
        } else {
            self.entries[i - 1].1
        }
    }

    pub fn truncate_to_offset(&mut self, relative_offset: u32) {
        let i = self.entries.partition_point(|&(_, o)| o <= relative_offset);
        self.entries.truncate(i);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn encode(&self, max_timestamp: i64, offset_of_max_timestamp: i64) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.len() * TIME_INDEX_ENTRY_SIZE + 32);
        for &(t, o) in &self.entries {
            out.extend_from_slice(&t.to_be_bytes());
            out.extend_from_slice(&o.to_be_bytes());
        }
        let mut trailer = TimeIndexTrailer {
            magic: TIME_INDEX_MAGIC,
            version: INDEX_VERSION.into(),
            reserved: 0.into(),
            entry_count: (self.entries.len() as u32).into(),
            max_timestamp: max_timestamp.into(),
            offset_of_max_timestamp: offset_of_max_timestamp.into(),
            crc: 0.into(),
        };
        out.extend_from_slice(&trailer.as_bytes()[..28]);
        trailer.crc = crc32fast::hash(&out).into();
        out.extend_from_slice(&trailer.as_bytes()[28..]);
        out
    }

    /// Decodes a `.timeindex` file: the index, the max timestamp and its offset.
    pub fn decode(bytes: &[u8]) -> Option<(TimeIndex, i64, i64)> {
        if bytes.len() < 32 {
            return None;
        }
        let (body, trailer_bytes) = bytes.split_at(bytes.len() - 32);
        let trailer = TimeIndexTrailer::read_from_bytes(trailer_bytes).ok()?;
        if trailer.magic != TIME_INDEX_MAGIC || trailer.version.get() != INDEX_VERSION {
            return None;
        }
        if body.len() != trailer.entry_count.get() as usize * TIME_INDEX_ENTRY_SIZE {
            return None;
        }
        if crc32fast::hash(&bytes[..bytes.len() - 4]) != trailer.crc.get() {
            return None;
        }
        let mut index = TimeIndex::default();
        for chunk in body.chunks_exact(TIME_INDEX_ENTRY_SIZE) {
            let t = i64::from_be_bytes(chunk[0..8].try_into().unwrap());
            let o = u32::from_be_bytes(chunk[8..12].try_into().unwrap());
            let before = index.entries.len();
            index.maybe_push(t, o);
            if index.entries.len() == before {
                return None;
            }
        }
        Some((
            index,
            trailer.max_timestamp.get(),
            trailer.offset_of_max_timestamp.get(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_starts_before_the_first_possible_match() {
        let mut idx = TimeIndex::default();
        idx.maybe_push(100, 5);
        idx.maybe_push(100, 6); // not growing: ignored
        idx.maybe_push(200, 9);
        assert_eq!(idx.len(), 2);
        assert_eq!(idx.lookup(50), 0);
        assert_eq!(idx.lookup(100), 0);
        assert_eq!(idx.lookup(101), 5);
        assert_eq!(idx.lookup(201), 9);
    }

    #[test]
    fn round_trip() {
        let mut idx = TimeIndex::default();
        idx.maybe_push(7, 1);
        idx.maybe_push(9, 4);
        let bytes = idx.encode(12, 6);
        assert_eq!(TimeIndex::decode(&bytes), Some((idx, 12, 6)));
        let mut bad = bytes.clone();
        bad[3] ^= 1;
        assert!(TimeIndex::decode(&bad).is_none());
    }
}
