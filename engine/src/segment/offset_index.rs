//! Sparse offset index of one segment: base offset of a batch → its byte position.
//!
//! An entry is added after at least `index.interval.bytes` of batches since the previous one.
//! A lookup returns the last entry at or below the target, and the reader scans forward from
//! there. Entries are kept in memory for every segment; closed segments also have them in a
//! `.index` file written when the segment is sealed (format in `engine/FORMAT.md`).

use zerocopy::byteorder::big_endian::{I64, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

pub const OFFSET_INDEX_MAGIC: [u8; 4] = *b"SLOI";
pub const INDEX_VERSION: u16 = 1;
pub const OFFSET_INDEX_ENTRY_SIZE: usize = 8;

/// The last 32 bytes of a `.index` file.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Debug)]
#[repr(C)]
pub struct OffsetIndexTrailer {
    pub magic: [u8; 4],
    pub version: U16,
    pub reserved: U16,
    pub entry_count: U32,
    /// Bytes of batches in the `.log` file the index describes.
    pub segment_size: U64,
    /// One past the last offset in the segment.
    pub next_offset: I64,
    /// crc32 (IEEE) of every entry and of the trailer's bytes before this field.
    pub crc: U32,
}
const _: () = assert!(std::mem::size_of::<OffsetIndexTrailer>() == 32);

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OffsetIndex {
    /// (offset relative to the segment's base offset, byte position in the `.log` file)
    entries: Vec<(u32, u32)>,
}

impl OffsetIndex {
    pub fn push(&mut self, relative_offset: u32, position: u32) {
        if let Some(&(last_offset, last_position)) = self.entries.last() {
            assert!(
                relative_offset > last_offset,
                "offset index must grow: {relative_offset} after {last_offset}"
            );
            assert!(
                position > last_position,
                "offset index positions must grow: {position} after {last_position}"
            );
        }
        self.entries.push((relative_offset, position));
    }

    /// The last entry whose offset is at or below `relative_offset`, or the segment start.
    pub fn lookup(&self, relative_offset: u32) -> (u32, u32) {
        let i = self.entries.partition_point(|&(o, _)| o <= relative_offset);
        if i == 0 {
            (0, 0)
        } else {
            self.entries[i - 1]
        }
    }

    /// The last entry at or before both `position` and `relative_offset`: the furthest batch
    /// start that bounds a read ending by `position` with no offset past `relative_offset`.
    pub fn last_at_or_before(&self, position: u32, relative_offset: u32) -> Option<(u32, u32)> {
        let i = self
            .entries
            .partition_point(|&(o, p)| o <= relative_offset && p <= position);
        i.checked_sub(1).map(|i| self.entries[i])
    }

    /// Drops entries for batches at or after `position` (truncation).
    pub fn truncate_to_position(&mut self, position: u32) {
        let i = self.entries.partition_point(|&(_, p)| p < position);
        self.entries.truncate(i);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn encode(&self, segment_size: u64, next_offset: i64) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.len() * OFFSET_INDEX_ENTRY_SIZE + 32);
        for &(o, p) in &self.entries {
            out.extend_from_slice(&o.to_be_bytes());
            out.extend_from_slice(&p.to_be_bytes());
        }
        let mut trailer = OffsetIndexTrailer {
            magic: OFFSET_INDEX_MAGIC,
            version: INDEX_VERSION.into(),
            reserved: 0.into(),
            entry_count: (self.entries.len() as u32).into(),
            segment_size: segment_size.into(),
            next_offset: next_offset.into(),
            crc: 0.into(),
        };
        out.extend_from_slice(&trailer.as_bytes()[..28]);
        trailer.crc = crc32fast::hash(&out).into();
        out.extend_from_slice(&trailer.as_bytes()[28..]);
        out
    }

    /// Decodes a `.index` file; `None` if it is damaged or not an index.
    /// Returns the index, the segment size and the next offset it was written for.
    pub fn decode(bytes: &[u8]) -> Option<(OffsetIndex, u64, i64)> {
        if bytes.len() < 32 {
            return None;
        }
        let (body, trailer_bytes) = bytes.split_at(bytes.len() - 32);
        let trailer = OffsetIndexTrailer::read_from_bytes(trailer_bytes).ok()?;
        if trailer.magic != OFFSET_INDEX_MAGIC || trailer.version.get() != INDEX_VERSION {
            return None;
        }
        if body.len() != trailer.entry_count.get() as usize * OFFSET_INDEX_ENTRY_SIZE {
            return None;
        }
        if crc32fast::hash(&bytes[..bytes.len() - 4]) != trailer.crc.get() {
            return None;
        }
        let mut index = OffsetIndex::default();
        for chunk in body.chunks_exact(OFFSET_INDEX_ENTRY_SIZE) {
            let o = u32::from_be_bytes(chunk[0..4].try_into().unwrap());
            let p = u32::from_be_bytes(chunk[4..8].try_into().unwrap());
            if let Some(&(lo, lp)) = index.entries.last() {
                if o <= lo || p <= lp {
                    return None;
                }
            }
            index.entries.push((o, p));
        }
        Some((index, trailer.segment_size.get(), trailer.next_offset.get()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_finds_floor_entry() {
        let mut idx = OffsetIndex::default();
        idx.push(10, 4096);
        idx.push(20, 8192);
        assert_eq!(idx.lookup(5), (0, 0));
        assert_eq!(idx.lookup(10), (10, 4096));
        assert_eq!(idx.lookup(19), (10, 4096));
        assert_eq!(idx.lookup(25), (20, 8192));
    }

    #[test]
    fn encode_decode_round_trip_and_damage_is_detected() {
        let mut idx = OffsetIndex::default();
        idx.push(3, 100);
        idx.push(9, 5000);
        let bytes = idx.encode(6000, 12);
        let (back, size, next) = OffsetIndex::decode(&bytes).unwrap();
        assert_eq!((back, size, next), (idx, 6000, 12));
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(
                OffsetIndex::decode(&b).is_none(),
                "flip at {i} not detected"
            );
        }
        assert!(OffsetIndex::decode(&bytes[..bytes.len() - 1]).is_none());
    }
}
