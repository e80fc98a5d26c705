//! Compaction for `cleanup.policy = compact`: keep the latest record per key.
//!
//! Runs over the cleanable segments: the closed segments (the active one is never cleaned) that
//! end at or below the last stable offset (LSO), itself never past the high watermark. Nothing at
//! or past the LSO is read to decide what to keep, nor rewritten: an open transaction's records
//! may still be aborted, and a decided one whose marker the high watermark has not passed may
//! still be taken back by a leader change.
//!
//! Pass one builds a map from key to the offset of its latest record, skipping records of
//! aborted transactions and control batches. Pass two rewrites each cleanable segment that would
//! change:
//! - a record of an aborted transaction (a transactional batch of producer P within one of P's
//!   aborted ranges `[first_offset, marker)`, from the producer state's aborted list) is removed,
//!   whatever its key;
//! - any other record is kept only if it is the latest for its key, and a tombstone (null value)
//!   only until its batch is older than `delete.retention.ms`; committed transactional records
//!   are compacted like any others;
//! - a transaction marker (commit or abort control batch) is kept while any batch of its
//!   transaction remains (an emptied one included, see below); once none does, it goes when
//!   its batch is older than
//!   `delete.retention.ms`, the rule tombstones follow. A read-committed consumer reads a
//!   transaction only once its marker is written, so one that has read records of it has
//!   `delete.retention.ms` from the marker's time to reach the marker. An abort marker's entry
//!   in the aborted list is dropped, and a producer state snapshot without it written, before
//!   the segment without the marker is installed.
//!
//! A rewritten batch keeps its base offset, last offset delta, timestamps, attributes and
//! producer fields, so offsets never move. A batch left with no record is dropped, except the
//! last batch of a producer the producer state remembers: its header is kept with no records
//! (`batch::emptied`), as Kafka's cleaner does, so that whoever rebuilds producer state from the
//! log (a follower fetching from the log start, or a replay without a usable snapshot) still
//! learns the producer's epoch and last sequence. Compressed batches are decompressed, filtered
//! the same way and their retained records compressed again with the batch's own codec, as
//! Kafka's cleaner does.
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
use crate::producer_state::{control_type, AbortedTxn, CONTROL_TYPE_ABORT, CONTROL_TYPE_COMMIT};
use crate::segment::reader::{read_batches, scan_segment, ReadBatch};
use crate::segment::{self};
use crate::storage::{align_up, IoBuf, Storage, StorageFile};
use crate::types::Offset;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CompactionOutcome {
    pub segments_rewritten: usize,
    /// Data records removed (markers are counted in `markers_removed`).
    pub records_removed: u64,
    /// Transaction markers removed.
    pub markers_removed: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// One past the last offset the cleaning could touch: the end of the last cleanable
    /// segment, at or below the last stable offset and the active segment's base.
    pub cleanable_end: Offset,
}

/// Bytes read per request while cleaning.
const CLEAN_READ_BYTES: usize = 4 << 20;

/// What the cleaner knows of producers and transactions below the cleanable end, from the
/// producer state.
struct Txns {
    /// Aborted ranges `[first_offset, marker_offset)` per producer id, by marker offset.
    aborted: HashMap<i64, Vec<(Offset, Offset)>>,
    /// The base offset of each producer's last batch with a sequence.
    last_batches: HashMap<i64, Offset>,
}

impl Txns {
    /// A transactional data batch of a transaction that was aborted.
    fn is_aborted(&self, header: &BatchHeader<'_>) -> bool {
        if !header.is_transactional() || header.is_control() {
            return false;
        }
        let Some(ranges) = self.aborted.get(&header.producer_id()) else {
            return false;
        };
        let base = header.base_offset();
        // A producer's transactions do not overlap: the first range ending past `base` is the
        // only one that can hold it.
        let i = ranges.partition_point(|&(_, marker)| marker <= base);
        ranges.get(i).is_some_and(|&(first, _)| first <= base)
    }

    fn is_producers_last_batch(&self, header: &BatchHeader<'_>) -> bool {
        header.producer_id() >= 0
            && header.base_sequence() >= 0
            && self.last_batches.get(&header.producer_id()) == Some(&header.base_offset())
    }
}

/// What [`filter_batch`] decided for one batch.
struct Filtered {
    /// The batch to write (unchanged, rebuilt, or emptied), or none.
    bytes: Option<Bytes>,
    /// Whether `bytes` differs from the batch read.
    changed: bool,
    /// Data records removed.
    records_removed: u64,
    /// The offset of a transaction marker removed, and whether it was an abort marker.
    marker_removed: Option<(Offset, bool)>,
}

impl<S: Storage> Log<S> {
    /// Compacts up to the last stable offset as this log alone knows it: its own high watermark
    /// (single-replica partitions, tests). A replicated partition's leader calls
    /// [`Log::compact_up_to`] with the partition's high watermark.
    pub async fn compact(&self) -> Result<CompactionOutcome> {
        let high_watermark = self.high_watermark();
        self.compact_up_to(high_watermark).await
    }

    /// Compacts the segments that end at or below the last stable offset given the partition's
    /// `high_watermark` (see the module doc).
    pub async fn compact_up_to(&self, high_watermark: Offset) -> Result<CompactionOutcome> {
        self.check_usable()?;
        let _io = self.io.lock().await;
        self.check_usable()?;
        let config = self.config();
        let mut outcome = CompactionOutcome::default();
        if !config.cleanup_compact {
            return Ok(outcome);
        }
        let (cleanable, txns) = {
            let mut st = self.state.borrow_mut();
            let high_watermark = high_watermark.min(st.log_end_offset);
            let last_stable_offset = st
                .producers
                .first_unstable_offset(high_watermark)
                .map_or(high_watermark, |first| first.min(high_watermark));
            let active = st.active().base_offset;
            let bound = last_stable_offset.min(active);
            let cleanable: Vec<(Offset, Offset)> = st
                .segments
                .values()
                .take_while(|s| s.base_offset < active && s.next_offset <= bound)
                .map(|s| (s.base_offset, s.next_offset))
                .collect();
            let mut aborted: HashMap<i64, Vec<(Offset, Offset)>> = HashMap::new();
            for a in st.producers.aborted_transactions(Offset(i64::MIN), bound) {
                aborted
                    .entry(a.producer_id)
                    .or_default()
                    .push((a.first_offset, a.last_offset));
            }
            let txns = Txns {
                aborted,
                last_batches: st.producers.last_batch_offsets(),
            };
            (cleanable, txns)
        };
        outcome.cleanable_end = cleanable
            .last()
            .map_or(self.log_start_offset(), |&(_, end)| end);
        // Pass one: the latest offset of every key, aborted records aside.
        let mut latest: HashMap<Vec<u8>, Offset> = HashMap::new();
        for &(base, _) in &cleanable {
            for batch in self.read_whole_segment(base).await? {
                let header = BatchHeader::parse(&batch.bytes)?;
                if header.is_control() || txns.is_aborted(&header) {
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
        // Pass two: rewrite the segments that change. `txn_kept` follows each producer's
        // transaction through the segments, in offset order: whether any of its batches stays.
        let horizon = self.clock.now_ms() - config.delete_retention_ms;
        let mut txn_kept: HashMap<i64, bool> = HashMap::new();
        for &(base, _) in &cleanable {
            let batches = self.read_whole_segment(base).await?;
            let before: u64 = batches.iter().map(|b| b.bytes.len() as u64).sum();
            let mut kept: Vec<Bytes> = Vec::with_capacity(batches.len());
            let mut changed = false;
            let mut removed = 0u64;
            let mut markers_removed = 0u64;
            let mut abort_markers_removed = Vec::new();
            for batch in &batches {
                let filtered = filter_batch(&batch.bytes, &latest, horizon, &txns, &mut txn_kept)?;
                changed |= filtered.changed;
                removed += filtered.records_removed;
                if let Some((offset, abort)) = filtered.marker_removed {
                    markers_removed += 1;
                    if abort {
                        abort_markers_removed.push(offset);
                    }
                }
                if let Some(bytes) = filtered.bytes {
                    kept.push(bytes);
                }
            }
            if !changed {
                continue;
            }
            if !abort_markers_removed.is_empty() {
                self.forget_aborted_locked(&abort_markers_removed).await?;
            }
            let after: u64 = kept.iter().map(|b| b.len() as u64).sum();
            self.replace_segment_locked(base, &kept, after).await?;
            outcome.segments_rewritten += 1;
            outcome.records_removed += removed;
            outcome.markers_removed += markers_removed;
            outcome.bytes_before += before;
            outcome.bytes_after += after;
        }
        if outcome.segments_rewritten > 0 {
            self.cache.clear_log(self.cache_id);
            tracing::info!(dir = %self.dir.display(), ?outcome, "compacted");
        }
        Ok(outcome)
    }

    /// Forgets the aborted transactions whose abort markers (at `markers`) compaction is about
    /// to remove, and makes that durable before they go: a snapshot still listing them, loaded
    /// after a crash, would tell read-committed consumers of aborts whose markers are gone. A
    /// marker without its entry is harmless (a consumer drops nothing for it). The snapshot is
    /// taken at the log end with appends held back and everything before it fdatasync'd, so a
    /// crash cannot leave it above the recovered log end (where it would be ignored for an
    /// older one). If it cannot be written, the entries are put back and the cleaning fails.
    async fn forget_aborted_locked(&self, markers: &[Offset]) -> Result<()> {
        let forgotten: Vec<AbortedTxn> = {
            let mut st = self.state.borrow_mut();
            markers
                .iter()
                .filter_map(|&m| st.producers.forget_aborted(m))
                .collect()
        };
        self.state.borrow_mut().appends_blocked = true;
        let flushed = self.flush_locked(true).await;
        let written = flushed.is_ok() && self.write_producer_snapshot_locked().await;
        self.state.borrow_mut().appends_blocked = false;
        if written {
            return Ok(());
        }
        {
            let mut st = self.state.borrow_mut();
            for txn in forgotten {
                st.producers.restore_aborted(txn);
            }
        }
        flushed?;
        Err(LogError::io(
            "writing the producer state snapshot before removing abort markers",
            std::io::Error::other("snapshot not written"),
        ))
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

/// Filters one batch (see the module doc). `txn_kept` holds, per producer, whether a batch of
/// its current transaction is kept so far in this pass; a marker ends the transaction.
fn filter_batch(
    bytes: &Bytes,
    latest: &HashMap<Vec<u8>, Offset>,
    tombstone_horizon_ms: i64,
    txns: &Txns,
    txn_kept: &mut HashMap<i64, bool>,
) -> Result<Filtered> {
    let header = BatchHeader::parse(bytes)?;
    let unchanged = Filtered {
        bytes: Some(bytes.clone()),
        changed: false,
        records_removed: 0,
        marker_removed: None,
    };
    let producer_id = header.producer_id();
    let expired = header.max_timestamp().0 < tombstone_horizon_ms;
    if header.is_control() {
        let data_kept = txn_kept.remove(&producer_id).unwrap_or(false);
        let kind = control_type(bytes);
        let is_marker = matches!(kind, Some(CONTROL_TYPE_ABORT | CONTROL_TYPE_COMMIT));
        if !is_marker || data_kept || !expired {
            return Ok(unchanged);
        }
        return Ok(Filtered {
            bytes: None,
            changed: true,
            records_removed: 0,
            marker_removed: Some((header.base_offset(), kind == Some(CONTROL_TYPE_ABORT))),
        });
    }
    let filtered = filter_data_batch(bytes, &header, latest, expired, txns, unchanged)?;
    if header.is_transactional() {
        // Any batch of the transaction left in the log, an emptied one included, keeps its
        // marker: a replay or a follower reading the batch must also read the marker, or it
        // would take the transaction for one still open.
        *txn_kept.entry(producer_id).or_default() |= filtered.bytes.is_some();
    }
    Ok(filtered)
}

fn filter_data_batch(
    bytes: &Bytes,
    header: &BatchHeader<'_>,
    latest: &HashMap<Vec<u8>, Offset>,
    expired: bool,
    txns: &Txns,
    unchanged: Filtered,
) -> Result<Filtered> {
    let base = header.base_offset();
    let aborted = txns.is_aborted(header);
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
        let expired_tombstone = record.value.is_none() && expired;
        if !aborted && is_latest && !expired_tombstone {
            kept.extend_from_slice(record.raw);
            kept_count += 1;
        } else {
            dropped += 1;
        }
    }
    if kept_count == 0 {
        if txns.is_producers_last_batch(header) {
            if header.record_count() == 0 {
                return Ok(unchanged);
            }
            return Ok(Filtered {
                bytes: Some(batch::emptied(bytes).freeze()),
                changed: true,
                records_removed: dropped,
                marker_removed: None,
            });
        }
        // Also an empty batch kept by an earlier cleaning whose producer has written since.
        return Ok(Filtered {
            bytes: None,
            changed: true,
            records_removed: dropped,
            marker_removed: None,
        });
    }
    if dropped == 0 {
        return Ok(unchanged);
    }
    let codec = Compression::from_attributes(header.attributes())?;
    let rebuilt = batch::rebuild(
        bytes,
        header.attributes(),
        kept_count,
        &compression::compress(codec, &kept),
    );
    Ok(Filtered {
        bytes: Some(rebuilt.freeze()),
        changed: true,
        records_removed: dropped,
        marker_removed: None,
    })
}
