//! Compaction for `cleanup.policy = compact`: keep the latest record per key.
//!
//! Runs over the closed segments (the active one is never cleaned). Pass one builds a map from
//! key to the offset of its latest record; pass two rewrites each closed segment that would
//! change, keeping a record only if it is the latest for its key, and dropping tombstones (null
//! values) once their batch is older than `delete.retention.ms`. A rewritten batch keeps its base
//! offset, last offset delta, timestamps and producer fields, so offsets never move; a batch left
//! with no record is dropped. Compressed batches are decompressed, filtered the same way and
//! their retained records compressed again with the batch's own codec, as Kafka's cleaner does;
//! control batches are kept.
//!
//! Crash safety: the new segment is written to `<base>.log.cleaned`, fdatasync'd, then renamed
//! over `<base>.log`; a leftover `.cleaned` file is deleted on open, and stale index files are
//! detected by the segment size in their trailer and rebuilt.

use std::collections::HashMap;

use bytes::Bytes;

use super::Log;
use crate::batch::{self, BatchHeader, Records};
use crate::compression::{self, Compression};
use crate::error::{LogError, Result};
use crate::segment::reader::{read_batches, scan_segment, ReadBatch};
use crate::segment::{self};
use crate::storage::{align_up, IoBuf, Storage, StorageFile};
use crate::types::Offset;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CompactionOutcome {
    pub segments_rewritten: usize,
    pub records_removed: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// Bytes read per request while cleaning.
const CLEAN_READ_BYTES: usize = 4 << 20;

impl<S: Storage> Log<S> {
    pub async fn compact(&self) -> Result<CompactionOutcome> {
        self.check_usable()?;
        let _io = self.io.lock().await;
        self.check_usable()?;
        let config = self.config();
        let mut outcome = CompactionOutcome::default();
        if !config.cleanup_compact {
            return Ok(outcome);
        }
        let closed: Vec<Offset> = {
            let st = self.state.borrow();
            let n = st.segments.len() - 1;
            st.segments.keys().take(n).copied().collect()
        };
        // Pass one: the latest offset of every key.
        let mut latest: HashMap<Vec<u8>, Offset> = HashMap::new();
        for &base in &closed {
            for batch in self.read_whole_segment(base).await? {
                let header = BatchHeader::parse(&batch.bytes)?;
                if header.is_control() {
                    continue;
                }
                let records = batch::records_section(&batch.bytes)?;
                for record in Records::section(&records, header.record_count()) {
                    let record = record?;
                    if let Some(key) = record.key {
                        latest.insert(
                            key.to_vec(),
                            Offset(header.base_offset().0 + record.offset_delta as i64),
                        );
                    }
                }
            }
        }
        // Pass two: rewrite the segments that change.
        let horizon = self.clock.now_ms() - config.delete_retention_ms;
        for &base in &closed {
            let batches = self.read_whole_segment(base).await?;
            let before: u64 = batches.iter().map(|b| b.bytes.len() as u64).sum();
            let mut kept: Vec<Bytes> = Vec::with_capacity(batches.len());
            let mut removed = 0u64;
            for batch in &batches {
                let (bytes, dropped) = filter_batch(&batch.bytes, &latest, horizon)?;
                removed += dropped;
                if let Some(bytes) = bytes {
                    kept.push(bytes);
                }
            }
            if removed == 0 {
                continue;
            }
            let after: u64 = kept.iter().map(|b| b.len() as u64).sum();
            self.replace_segment_locked(base, &kept, after).await?;
            outcome.segments_rewritten += 1;
            outcome.records_removed += removed;
            outcome.bytes_before += before;
            outcome.bytes_after += after;
        }
        if outcome.segments_rewritten > 0 {
            self.cache.clear_log(self.cache_id);
            tracing::info!(dir = %self.dir.display(), ?outcome, "compacted");
        }
        Ok(outcome)
    }

    async fn read_whole_segment(&self, base: Offset) -> Result<Vec<ReadBatch>> {
        let (file, size) = {
            let st = self.state.borrow();
            let seg = &st.segments[&base];
            (seg.file.clone(), seg.size)
        };
        let mut out = Vec::new();
        let mut position = 0u64;
        while position < size {
            let batches = read_batches(
                &*file,
                base,
                position,
                size,
                Offset(0),
                Offset(i64::MAX),
                CLEAN_READ_BYTES,
                0,
            )
            .await?;
            if batches.is_empty() {
                break;
            }
            for b in batches {
                position += b.bytes.len() as u64;
                out.push(b);
            }
        }
        Ok(out)
    }

    /// Writes `batches` as the new contents of segment `base`, atomically.
    async fn replace_segment_locked(
        &self,
        base: Offset,
        batches: &[Bytes],
        size: u64,
    ) -> Result<()> {
        let path = segment::log_path(&self.dir, base);
        let cleaned = segment::cleaned_path(&self.dir, base);
        let io = |context| move |e| LogError::io(context, e);
        let file = self
            .storage
            .open(&cleaned, true)
            .await
            .map_err(io("creating a cleaned segment"))?;
        file.truncate(0)
            .await
            .map_err(io("truncating a cleaned segment"))?;
        if size > 0 {
            let mut buf = file.alloc_buf(align_up(size) as usize);
            let slice = buf.as_mut_slice();
            let mut at = 0;
            for b in batches {
                slice[at..at + b.len()].copy_from_slice(b);
                at += b.len();
            }
            slice[at..].fill(0);
            file.write_at(buf, 0)
                .await
                .map_err(io("writing a cleaned segment"))?;
            file.truncate(size)
                .await
                .map_err(io("truncating a cleaned segment"))?;
        }
        file.fdatasync()
            .await
            .map_err(io("syncing a cleaned segment"))?;
        drop(file);
        // Until the new segment is installed below, zero-copy fetches still compute extents from
        // the old one; its buffered descriptor is opened lazily by path, so open it now, on the
        // old file: opened after the rename it would be the new, shorter file, and a splice of
        // the old positions would run past its end.
        let old_file = self.state.borrow().segments[&base].file.clone();
        let _ = old_file.buffered_fd();
        self.storage
            .rename(&cleaned, &path)
            .await
            .map_err(io("installing a cleaned segment"))?;
        self.storage
            .sync_dir(&self.dir)
            .await
            .map_err(io("syncing the log directory"))?;
        let file = std::rc::Rc::new(
            self.storage
                .open(&path, false)
                .await
                .map_err(io("reopening a cleaned segment"))?,
        );
        let interval = self.config.borrow().index_interval_bytes;
        let scanned = scan_segment(file, base, size, interval, false)
            .await
            .map_err(io("scanning a cleaned segment"))?;
        let mut seg = scanned.segment;
        assert_eq!(seg.size, size, "cleaned segment must scan whole");
        {
            let st = self.state.borrow();
            // Keep the segment's offset range even if its last batches were removed, and its
            // age: cleaning is not a write of new data (Kafka keeps `lastModified` too).
            let old = &st.segments[&base];
            seg.next_offset = seg.next_offset.max(old.next_offset);
            seg.last_modified_ms = old.last_modified_ms;
        }
        self.state.borrow_mut().segments.insert(base, seg);
        self.write_segment_indexes(base).await;
        Ok(())
    }
}

/// Filters one batch. Returns the batch to keep (unchanged, rebuilt, or none) and how many
/// records were dropped.
fn filter_batch(
    bytes: &Bytes,
    latest: &HashMap<Vec<u8>, Offset>,
    tombstone_horizon_ms: i64,
) -> Result<(Option<Bytes>, u64)> {
    let header = BatchHeader::parse(bytes)?;
    if header.is_control() {
        return Ok((Some(bytes.clone()), 0));
    }
    let base = header.base_offset();
    let tombstones_expire = header.max_timestamp().0 < tombstone_horizon_ms;
    let records = batch::records_section(bytes)?;
    let mut kept = Vec::with_capacity(records.len());
    let mut kept_count = 0;
    let mut dropped = 0u64;
    for record in Records::section(&records, header.record_count()) {
        let record = record?;
        let offset = Offset(base.0 + record.offset_delta as i64);
        let is_latest = match record.key {
            Some(key) => latest.get(key) == Some(&offset),
            None => true,
        };
        let expired_tombstone = record.value.is_none() && tombstones_expire;
        if is_latest && !expired_tombstone {
            kept.extend_from_slice(record.raw);
            kept_count += 1;
        } else {
            dropped += 1;
        }
    }
    if dropped == 0 {
        return Ok((Some(bytes.clone()), 0));
    }
    if kept_count == 0 {
        return Ok((None, dropped));
    }
    let codec = Compression::from_attributes(header.attributes())?;
    let rebuilt = batch::rebuild(
        bytes,
        header.attributes(),
        kept_count,
        &compression::compress(codec, &kept),
    );
    Ok((Some(rebuilt.freeze()), dropped))
}
