//! One segment of a partition log: a `.log` file of record batches and its two sparse indexes.
//!
//! A segment is either closed (sealed: its file is truncated to its logical size, fdatasync'd,
//! and its indexes are on disk) or the single active segment at the end of the log, which owns
//! an [`appender::Appender`] holding the bytes not yet written to the device.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::batch::BatchHeader;
use crate::types::{Offset, Timestamp};

pub mod appender;
pub mod offset_index;
pub mod reader;
pub mod time_index;

use appender::Appender;
use offset_index::OffsetIndex;
use time_index::TimeIndex;

pub fn log_path(dir: &Path, base: Offset) -> PathBuf {
    dir.join(format!("{:020}.log", base.0))
}
pub fn index_path(dir: &Path, base: Offset) -> PathBuf {
    dir.join(format!("{:020}.index", base.0))
}
pub fn time_index_path(dir: &Path, base: Offset) -> PathBuf {
    dir.join(format!("{:020}.timeindex", base.0))
}
pub fn cleaned_path(dir: &Path, base: Offset) -> PathBuf {
    dir.join(format!("{:020}.log.cleaned", base.0))
}

/// Parses `00000000000000000042.log` into offset 42.
pub fn parse_log_name(name: &str) -> Option<Offset> {
    let stem = name.strip_suffix(".log")?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok().map(Offset)
}

pub struct Segment<F> {
    pub base_offset: Offset,
    pub file: Rc<F>,
    /// Bytes of batches in the segment (the logical end; the file may be longer while active).
    pub size: u64,
    /// One past the last offset in the segment; `base_offset` when empty.
    pub next_offset: Offset,
    pub max_timestamp: Timestamp,
    pub offset_of_max_timestamp: Offset,
    /// Wall-clock time of the first append, for `segment.ms`.
    pub first_append_ms: Option<i64>,
    /// Wall-clock time of the last append (for a segment loaded from disk, its file's
    /// modification time): the age retention gives a segment without valid record timestamps.
    pub last_modified_ms: Option<i64>,
    pub offset_index: OffsetIndex,
    pub time_index: TimeIndex,
    bytes_since_index_entry: u64,
    pub appender: Option<Appender>,
}

impl<F> Segment<F> {
    pub fn new(base_offset: Offset, file: Rc<F>) -> Segment<F> {
        Segment {
            base_offset,
            file,
            size: 0,
            next_offset: base_offset,
            max_timestamp: Timestamp::NONE,
            offset_of_max_timestamp: Offset(-1),
            first_append_ms: None,
            last_modified_ms: None,
            offset_index: OffsetIndex::default(),
            time_index: TimeIndex::default(),
            bytes_since_index_entry: 0,
            appender: None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// Kafka's `LogSegment.largestTimestamp`: the largest record timestamp, or where the segment
    /// holds no valid one (producers that send -1), when it was last modified. Time retention
    /// measures a segment's age from this. `None` only for a segment never written nor loaded.
    pub fn largest_timestamp_ms(&self) -> Option<i64> {
        if self.max_timestamp.0 >= 0 {
            Some(self.max_timestamp.0)
        } else {
            self.last_modified_ms
        }
    }

    pub fn relative(&self, offset: Offset) -> u32 {
        let rel = offset.0 - self.base_offset.0;
        assert!(
            rel >= 0 && rel <= u32::MAX as i64,
            "offset {offset} not relative to segment {}",
            self.base_offset
        );
        rel as u32
    }

    /// Records a batch that now sits at `position` in this segment: indexes, size, timestamps.
    pub fn track_batch(
        &mut self,
        header: &BatchHeader<'_>,
        position: u64,
        index_interval_bytes: u32,
    ) {
        let size = header.total_size().expect("tracked batch was validated") as u64;
        assert_eq!(position, self.size, "batches are tracked in order");
        assert!(
            header.base_offset() >= self.next_offset,
            "batch {} behind segment end {}",
            header.base_offset(),
            self.next_offset
        );
        if self.bytes_since_index_entry >= index_interval_bytes as u64 {
            let rel = self.relative(header.base_offset());
            self.offset_index.push(rel, position as u32);
            self.time_index.maybe_push(self.max_timestamp.0, rel);
            self.bytes_since_index_entry = 0;
        }
        self.bytes_since_index_entry += size;
        let max_timestamp = header.max_timestamp();
        if max_timestamp > self.max_timestamp {
            self.max_timestamp = max_timestamp;
            self.offset_of_max_timestamp = header.last_offset();
        }
        self.size += size;
        self.next_offset = header.last_offset().next();
    }

    /// Forgets everything the in-memory state says about the segment's contents, before a scan
    /// rebuilds it.
    pub fn reset_contents(&mut self) {
        self.size = 0;
        self.next_offset = self.base_offset;
        self.max_timestamp = Timestamp::NONE;
        self.offset_of_max_timestamp = Offset(-1);
        self.offset_index = OffsetIndex::default();
        self.time_index = TimeIndex::default();
        self.bytes_since_index_entry = 0;
    }

    /// Restores state from index files of a sealed segment.
    pub fn restore_from_indexes(
        &mut self,
        offset_index: OffsetIndex,
        time_index: TimeIndex,
        size: u64,
        next_offset: Offset,
        max_timestamp: Timestamp,
        offset_of_max_timestamp: Offset,
    ) {
        self.offset_index = offset_index;
        self.time_index = time_index;
        self.size = size;
        self.next_offset = next_offset;
        self.max_timestamp = max_timestamp;
        self.offset_of_max_timestamp = offset_of_max_timestamp;
        // Appends after a reopen start a fresh interval; an extra index entry is harmless.
        self.bytes_since_index_entry = 0;
    }
}
