//! Removing data: time and size retention, DeleteRecords, and truncation for replication.
//!
//! Retention deletes whole closed segments, oldest first, and is driven by the shard off the
//! produce path. Files are unlinked after the segment leaves the in-memory view; a reader that
//! already holds the file keeps a valid descriptor until it is done.

use super::Log;
use crate::error::{LogError, Result};
use crate::segment::reader::scan_segment;
use crate::segment::{self, Segment};
use crate::storage::{Storage, StorageFile};
use crate::types::Offset;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RetentionOutcome {
    pub segments_deleted: usize,
    pub bytes_deleted: u64,
    pub log_start_offset: Offset,
}

impl<S: Storage> Log<S> {
    /// Applies `retention.ms`, `retention.bytes` and the log start offset as Kafka's
    /// `UnifiedLog.deleteOldSegments` does: walking from the oldest segment, each one goes while
    /// it is expired (its [`Segment::largest_timestamp_ms`] more than `retention.ms` ago), over
    /// the size budget, or wholly below the log start offset, and wholly below the high
    /// watermark; the walk stops at the first segment that stays. The active segment goes only
    /// when every segment before it went and it is itself expired or over the budget: it is
    /// rolled first, so the log keeps an empty active segment at its end.
    pub async fn enforce_retention(&self) -> Result<RetentionOutcome> {
        self.check_usable()?;
        let _io = self.io.lock().await;
        self.check_usable()?;
        let config = self.config();
        let now = self.clock.now_ms();
        let high_watermark = self.high_watermark();
        let (victims, roll_active) = {
            let st = self.state.borrow();
            let mut total: u64 = st.segments.values().map(|s| s.size).sum();
            let mut victims = Vec::new();
            let mut roll_active = false;
            let active_base = st.active().base_offset;
            for seg in st.segments.values() {
                let is_active = seg.base_offset == active_base;
                let below_start = !is_active && seg.next_offset <= st.log_start_offset;
                let expired = config.cleanup_delete
                    && config.retention_ms >= 0
                    && seg
                        .largest_timestamp_ms()
                        .is_some_and(|t| now - t > config.retention_ms);
                let over_size = config.cleanup_delete
                    && config.retention_bytes >= 0
                    && total - seg.size >= config.retention_bytes as u64;
                // Never past the high watermark: a consumer may not have been able to read it.
                let below_high_watermark = seg.next_offset <= high_watermark;
                if !((below_start || expired || over_size) && below_high_watermark) {
                    break;
                }
                if is_active {
                    // An empty active segment has nothing to delete.
                    roll_active = !seg.is_empty();
                    break;
                }
                total -= seg.size;
                victims.push(seg.base_offset);
            }
            (victims, roll_active)
        };
        if roll_active {
            let active = self.state.borrow().active().base_offset;
            tracing::info!(dir = %self.dir.display(), base_offset = active.0, "rolling the active segment: it is past retention");
            self.roll_locked().await?;
            let mut victims = victims;
            victims.push(active);
            return self.delete_segments_locked(&victims).await;
        }
        self.delete_segments_locked(&victims).await
    }

    /// Removes the given oldest segments and moves the log start past them.
    async fn delete_segments_locked(&self, victims: &[Offset]) -> Result<RetentionOutcome> {
        let mut outcome = RetentionOutcome::default();
        let mut removed: Vec<Segment<S::File>> = Vec::new();
        let start_moved = {
            let mut st = self.state.borrow_mut();
            for base in victims {
                let seg = st.segments.remove(base).expect("victim exists");
                assert!(
                    seg.appender.is_none(),
                    "retention never deletes the active segment"
                );
                removed.push(seg);
            }
            let first = *st.segments.keys().next().expect("active segment remains");
            let old = st.log_start_offset;
            st.log_start_offset = st.log_start_offset.max(first);
            outcome.log_start_offset = st.log_start_offset;
            st.check_invariants();
            st.log_start_offset != old
        };
        if start_moved {
            self.cache
                .remove_before(self.cache_id, outcome.log_start_offset);
        }
        for seg in removed {
            outcome.segments_deleted += 1;
            outcome.bytes_deleted += seg.size;
            self.remove_segment_files(seg.base_offset).await?;
            tracing::info!(dir = %self.dir.display(), base_offset = seg.base_offset.0, bytes = seg.size, "deleted segment");
        }
        if outcome.segments_deleted > 0 {
            self.storage
                .sync_dir(&self.dir)
                .await
                .map_err(|e| LogError::io("syncing the log directory", e))?;
        }
        Ok(outcome)
    }

    pub(crate) async fn remove_segment_files(&self, base: Offset) -> Result<()> {
        for path in [
            segment::log_path(&self.dir, base),
            segment::index_path(&self.dir, base),
            segment::time_index_path(&self.dir, base),
        ] {
            if self.storage.exists(&path).await {
                self.storage
                    .remove(&path)
                    .await
                    .map_err(|e| LogError::io("deleting a segment file", e))?;
            }
        }
        Ok(())
    }

    /// DeleteRecords: moves the log start offset to `offset` (at most the log end) and deletes
    /// the segments wholly below it. Returns the new log start offset (Kafka's low watermark).
    pub async fn delete_records(&self, offset: Offset) -> Result<Offset> {
        self.check_usable()?;
        let _io = self.io.lock().await;
        self.check_usable()?;
        let (start, end) = {
            let st = self.state.borrow();
            (st.log_start_offset, st.log_end_offset)
        };
        if offset > end || offset.0 < 0 {
            return Err(LogError::OffsetOutOfRange {
                offset,
                log_start_offset: start,
                log_end_offset: end,
            });
        }
        if offset <= start {
            return Ok(start);
        }
        // Durable before it is visible: a crash must not bring deleted records back.
        self.write_log_start_checkpoint(offset).await?;
        {
            let mut st = self.state.borrow_mut();
            st.log_start_offset = offset;
            st.check_invariants();
        }
        self.cache.remove_before(self.cache_id, offset);
        let victims: Vec<Offset> = {
            let st = self.state.borrow();
            let closed = st.segments.len() - 1;
            st.segments
                .values()
                .take(closed)
                .take_while(|s| s.next_offset <= offset)
                .map(|s| s.base_offset)
                .collect()
        };
        self.delete_segments_locked(&victims).await?;
        Ok(offset)
    }

    /// Removes every batch and starts the log over, empty, at `offset` (Kafka's
    /// `truncateFullyAndStartAt`): for a replica whose leader's log starts past this one's end,
    /// or a metadata log replaced by a snapshot. Segments go newest first, so a crash midway
    /// leaves a prefix of the old log (and the old start offset) for the caller to judge.
    pub async fn truncate_fully_and_start_at(&self, offset: Offset) -> Result<()> {
        if offset.0 < 0 {
            return Err(LogError::OffsetOutOfRange {
                offset,
                log_start_offset: self.log_start_offset(),
                log_end_offset: self.log_end_offset(),
            });
        }
        self.check_usable()?;
        let _io = self.io.lock().await;
        // An fdatasync in flight (it runs under the sync lock alone) must not end while
        // segments are half removed: it would find a log whose end names segments gone.
        let _sync = self.sync.lock().await;
        self.check_usable()?;
        self.state.borrow_mut().appends_blocked = true;
        let result = self.truncate_fully_locked(offset).await;
        self.state.borrow_mut().appends_blocked = false;
        result
    }

    async fn truncate_fully_locked(&self, offset: Offset) -> Result<()> {
        self.flush_locked(false).await?;
        let bases: Vec<Offset> = self.state.borrow().segments.keys().rev().copied().collect();
        for base in bases {
            self.state.borrow_mut().segments.remove(&base);
            if let Err(e) = self.remove_segment_files(base).await {
                return Err(self.poison(format!("removing segment {base} to start over: {e}")));
            }
        }
        // The start offset is durable before the new segment exists: a crash in between
        // reopens an empty log at `offset`.
        self.write_log_start_checkpoint(offset).await?;
        let seg = match self.create_segment_locked(offset).await {
            Ok(seg) => seg,
            Err(e) => {
                return Err(self.poison(format!("no active segment after starting over: {e}")))
            }
        };
        {
            let mut st = self.state.borrow_mut();
            st.segments.insert(offset, seg);
            st.log_start_offset = offset;
            st.log_end_offset = offset;
            st.written_end = offset;
            st.synced_end = offset;
            st.epochs.clear();
            st.epochs_dirty = true;
        }
        self.cache.remove_from(self.cache_id, Offset(0));
        if let Err(e) = self.storage.sync_dir(&self.dir).await {
            return Err(self.poison(format!(
                "syncing the log directory after starting over: {e}"
            )));
        }
        self.write_epochs_checkpoint().await;
        self.state.borrow().check_invariants();
        self.rebuild_producer_state().await?;
        tracing::info!(dir = %self.dir.display(), start_offset = offset.0, "log emptied and started over");
        Ok(())
    }

    /// Removes every batch at or after `offset` (replication truncation, KIP-101). The log end
    /// becomes the start of the batch holding `offset` (equal to `offset` at a batch boundary).
    pub async fn truncate_to(&self, offset: Offset) -> Result<Offset> {
        self.check_usable()?;
        let _io = self.io.lock().await;
        // An fdatasync in flight (it runs under the sync lock alone) must not end while
        // segments are half removed: it would find a log whose end names segments gone.
        let _sync = self.sync.lock().await;
        self.check_usable()?;
        self.state.borrow_mut().appends_blocked = true;
        let result = self.truncate_locked(offset).await;
        self.state.borrow_mut().appends_blocked = false;
        result
    }

    async fn truncate_locked(&self, offset: Offset) -> Result<Offset> {
        self.flush_locked(false).await?;
        let (start, end) = {
            let st = self.state.borrow();
            (st.log_start_offset, st.log_end_offset)
        };
        if offset >= end {
            return Ok(end);
        }
        if offset < start {
            return Err(LogError::OffsetOutOfRange {
                offset,
                log_start_offset: start,
                log_end_offset: end,
            });
        }
        // Segments wholly at or after the offset go first (newest first, so a crash midway
        // leaves a log that is a prefix of the old one).
        let (victims, keep, keep_was_active) = {
            let st = self.state.borrow();
            let first = *st.segments.keys().next().expect("segments");
            // The segment that will hold the new end: the last one starting below the offset,
            // or the first one when the log is cut back to its very start.
            let keep = st
                .segments
                .range(..offset)
                .next_back()
                .map(|(&b, _)| b)
                .unwrap_or(first);
            let victims: Vec<Offset> = st
                .segments
                .keys()
                .rev()
                .copied()
                .filter(|&b| b > keep)
                .collect();
            (victims, keep, st.active().base_offset == keep)
        };
        for base in &victims {
            self.state.borrow_mut().segments.remove(base);
            self.remove_segment_files(*base).await?;
        }
        let (file, position, size) = {
            let st = self.state.borrow();
            let seg = &st.segments[&keep];
            let position = if offset > seg.base_offset {
                seg.offset_index.lookup(seg.relative(offset)).1 as u64
            } else {
                0
            };
            (seg.file.clone(), position, seg.size)
        };
        let cut = crate::segment::reader::position_of(&*file, keep, position, size, offset).await?;
        if let Err(e) = file.truncate(cut).await {
            return Err(self.poison(format!(
                "truncating segment {keep} for replication failed: {e}"
            )));
        }
        if let Err(e) = file.fdatasync().await {
            return Err(self.poison(format!("fdatasync after truncation failed: {e}")));
        }
        let interval = self.config.borrow().index_interval_bytes;
        let rescanned = scan_segment(file.clone(), keep, cut, interval, false)
            .await
            .map_err(|e| LogError::io("rescanning a truncated segment", e))?;
        let new_end = rescanned.segment.next_offset;
        if new_end < start {
            self.write_log_start_checkpoint(new_end).await?;
        }
        {
            let mut st = self.state.borrow_mut();
            let mut seg = rescanned.segment;
            seg.last_modified_ms = Some(self.clock.now_ms());
            st.segments.insert(keep, seg);
            st.log_end_offset = new_end;
            // The batch holding the target may start below a DeleteRecords start offset.
            st.log_start_offset = st.log_start_offset.min(new_end);
            st.written_end = new_end;
            st.synced_end = new_end;
            st.epochs.retain(|&(_, o)| o < new_end);
            st.epochs_dirty = true;
        }
        if keep_was_active || cut == 0 {
            self.activate_locked(keep).await?;
        } else {
            // A closed segment may have compaction gaps, which an active segment never has:
            // keep it sealed and start a fresh active segment at the new end.
            self.write_segment_indexes(keep).await;
            match self.create_segment_locked(new_end).await {
                Ok(seg) => {
                    self.state.borrow_mut().segments.insert(new_end, seg);
                }
                Err(e) => {
                    return Err(self.poison(format!("no active segment after truncation: {e}")))
                }
            }
        }
        self.cache.remove_from(self.cache_id, new_end);
        self.storage
            .sync_dir(&self.dir)
            .await
            .map_err(|e| LogError::io("syncing the log directory", e))?;
        self.write_epochs_checkpoint().await;
        self.state.borrow().check_invariants();
        self.rebuild_producer_state().await?;
        tracing::info!(dir = %self.dir.display(), requested = offset.0, log_end_offset = new_end.0, "log truncated");
        Ok(new_end)
    }
}
