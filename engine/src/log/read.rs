//! The read path: whole batches from an offset, and ListOffsets lookups.
//!
//! Sources, in order: the shard's batch cache, the active segment's batches not yet on the
//! device, then the segment files (asynchronous io_uring reads; every batch CRC-checked).

use std::ops::Bound;
use std::rc::Rc;

use super::{Log, State};
use crate::batch::{self, BatchHeader, Records};
use crate::error::{LogError, Result};
use crate::segment::reader::{find_batch, read_batches, FileExtent, ReadBatch};
use crate::segment::Segment;
use crate::storage::Storage;
use crate::storage::{align_down, StorageFile};
use crate::types::{Offset, Timestamp};

enum Source<F> {
    Memory(ReadBatch),
    Disk {
        file: Rc<F>,
        segment_base: Offset,
        position: u64,
        limit: u64,
        segment_end: Offset,
    },
    End,
}

/// `OffsetOutOfRange` unless `offset` is between the log start and the log end.
fn in_range<F>(st: &State<F>, offset: Offset) -> Result<()> {
    if offset < st.log_start_offset || offset > st.log_end_offset {
        return Err(LogError::OffsetOutOfRange {
            offset,
            log_start_offset: st.log_start_offset,
            log_end_offset: st.log_end_offset,
        });
    }
    Ok(())
}

/// The segment holding `offset`, or the first one after it (offsets compaction removed).
fn segment_holding<F>(st: &State<F>, offset: Offset) -> Option<&Segment<F>> {
    let mut candidate = st.segments.range(..=offset).next_back();
    if candidate.is_none_or(|(_, s)| offset >= s.next_offset) {
        let after = candidate
            .map(|(&b, _)| Bound::Excluded(b))
            .unwrap_or(Bound::Unbounded);
        candidate = st.segments.range((after, Bound::Unbounded)).next();
    }
    candidate.map(|(_, seg)| seg)
}

enum ExtentEnd {
    At(u64),
    NeedFirstBatch,
    None,
}

impl<S: Storage> Log<S> {
    /// Reads whole batches starting with the one that holds `from`, stopping before `max_offset`
    /// (exclusive; the broker passes the high watermark) and before `max_bytes` would be passed.
    /// The first batch is always returned whole, even when larger than `max_bytes`.
    pub async fn read(
        &self,
        from: Offset,
        max_bytes: usize,
        max_offset: Offset,
    ) -> Result<Vec<ReadBatch>> {
        self.check_usable()?;
        let max_offset = {
            let st = self.state.borrow();
            in_range(&st, from)?;
            max_offset.min(st.log_end_offset)
        };
        let mut out: Vec<ReadBatch> = Vec::new();
        let mut total = 0usize;
        let mut cur = from;
        while cur < max_offset {
            if let Some((base, last, bytes)) = self.cache.get(self.cache_id, cur) {
                if base >= max_offset || (total > 0 && total + bytes.len() > max_bytes) {
                    break;
                }
                total += bytes.len();
                out.push(ReadBatch {
                    base_offset: base,
                    last_offset: last,
                    bytes,
                });
                cur = last.next();
                continue;
            }
            match self.locate(cur) {
                Source::End => break,
                Source::Memory(batch) => {
                    if batch.base_offset >= max_offset
                        || (total > 0 && total + batch.bytes.len() > max_bytes)
                    {
                        break;
                    }
                    total += batch.bytes.len();
                    cur = batch.last_offset.next();
                    out.push(batch);
                }
                Source::Disk {
                    file,
                    segment_base,
                    position,
                    limit,
                    segment_end,
                } => {
                    let batches = read_batches(
                        &*file,
                        segment_base,
                        position,
                        limit,
                        cur,
                        max_offset,
                        max_bytes,
                        total,
                    )
                    .await?;
                    if batches.is_empty() {
                        if total > 0 || segment_end <= cur {
                            break;
                        }
                        // Nothing left in this segment at or after `cur` (compaction removed it).
                        cur = segment_end;
                        continue;
                    }
                    for batch in batches {
                        total += batch.bytes.len();
                        cur = batch.last_offset.next();
                        // The entry shares the read buffer rather than copying every cold
                        // byte once more: the batches of one read are cached (and evicted)
                        // together, so little of a buffer outlives its batches.
                        self.cache.insert(
                            self.cache_id,
                            batch.base_offset,
                            batch.last_offset,
                            batch.bytes.clone(),
                        );
                        out.push(batch);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Whether the batch holding `from` is served from memory (the batch cache, or not yet on
    /// the device), so reading it costs no disk read. A fetch budgets the rest ("cold" bytes)
    /// apart, to keep reads from holding the disk behind producers' fdatasyncs.
    pub fn in_memory(&self, from: Offset) -> bool {
        let written_end = self.state.borrow().written_end;
        from >= written_end || self.cache.get(self.cache_id, from).is_some()
    }

    /// For a zero-copy fetch: where on disk the whole batches from `from` lie, stopping before
    /// `max_offset` (exclusive), within `max_bytes` unless `first` (then one larger batch still
    /// goes), all in one segment. `None` when the bytes are better read than spliced: in the
    /// batch cache or not yet on the device, in storage without descriptors, or when no batch
    /// boundary the index knows fits the budget.
    ///
    /// Boundaries come from the offset index (an entry every `index.interval.bytes`), so a
    /// fetch needs no read at all when it starts where the last one ended; otherwise it reads
    /// batch headers from the index entry before `from`. In the active segment an extent ends
    /// below the page the O_DIRECT writer rewrites (the last, partial one): pages read through
    /// the page cache are never written again. Batches are not CRC-checked here (Kafka does not
    /// either; consumers check them).
    pub async fn read_extent(
        &self,
        from: Offset,
        max_bytes: usize,
        max_offset: Offset,
        first: bool,
    ) -> Result<Option<FileExtent>> {
        self.check_usable()?;
        let (file, fd, base, entry, exact, limit) = {
            let st = self.state.borrow();
            in_range(&st, from)?;
            if from >= max_offset.min(st.written_end)
                || self.cache.get(self.cache_id, from).is_some()
            {
                return Ok(None);
            }
            let Some(seg) = segment_holding(&st, from) else {
                return Ok(None);
            };
            let Some(fd) = seg.file.buffered_fd() else {
                return Ok(None);
            };
            let (entry, exact) = if from > seg.base_offset {
                let (rel, pos) = seg.offset_index.lookup(seg.relative(from));
                (pos as u64, seg.base_offset.0 + rel as i64 == from.0)
            } else {
                // The segment's first batch holds `from` or is the first after it.
                (0, true)
            };
            let limit = seg.appender.as_ref().map_or(seg.size, |a| a.written);
            (seg.file.clone(), fd, seg.base_offset, entry, exact, limit)
        };
        let mut first_batch = None;
        let start = if exact {
            entry
        } else {
            match find_batch(&*file, base, entry, limit, from).await? {
                Some((pos, batch_base, last, size)) => {
                    if batch_base >= max_offset {
                        return Ok(None);
                    }
                    first_batch = Some((last, size));
                    pos
                }
                None => return Ok(None),
            }
        };
        loop {
            match self.extent_end(
                &file,
                base,
                start,
                max_bytes,
                max_offset,
                first,
                first_batch,
            ) {
                ExtentEnd::At(end) => {
                    return Ok(Some(FileExtent {
                        fd,
                        position: start,
                        len: end - start,
                    }))
                }
                ExtentEnd::None => return Ok(None),
                ExtentEnd::NeedFirstBatch => {
                    match find_batch(&*file, base, start, limit, from).await? {
                        Some((pos, _, last, size)) if pos == start => {
                            first_batch = Some((last, size))
                        }
                        _ => return Ok(None),
                    }
                }
            }
        }
    }

    /// Where an extent from `start` in `file`, the segment at `base`, may end (see
    /// `read_extent`).
    #[allow(clippy::too_many_arguments)]
    fn extent_end(
        &self,
        file: &Rc<S::File>,
        base: Offset,
        start: u64,
        max_bytes: usize,
        max_offset: Offset,
        first: bool,
        first_batch: Option<(Offset, u64)>,
    ) -> ExtentEnd {
        let st = self.state.borrow();
        // Gone, or replaced by compaction while batch headers were read: positions would differ.
        let Some(seg) = st
            .segments
            .get(&base)
            .filter(|seg| Rc::ptr_eq(&seg.file, file))
        else {
            return ExtentEnd::None;
        };
        if max_offset <= seg.base_offset {
            return ExtentEnd::None;
        }
        // Bytes on the device, and in the active segment only whole pages the writer is done with.
        let cap = match &seg.appender {
            Some(a) => align_down(a.written),
            None => seg.size,
        };
        let budget_end = start.saturating_add(max_bytes as u64);
        let segment_visible = seg.next_offset <= max_offset && seg.appender.is_none();
        if segment_visible && seg.size <= budget_end && seg.size > start {
            return ExtentEnd::At(seg.size);
        }
        let max_rel = (max_offset.0 - base.0).min(u32::MAX as i64) as u32;
        let max_pos = cap.min(budget_end).min(u32::MAX as u64) as u32;
        if let Some((_, pos)) = seg.offset_index.last_at_or_before(max_pos, max_rel) {
            if pos as u64 > start {
                return ExtentEnd::At(pos as u64);
            }
        }
        if !first {
            return ExtentEnd::None;
        }
        match first_batch {
            None => ExtentEnd::NeedFirstBatch,
            Some((last, size)) if last < max_offset && start + size <= cap => {
                ExtentEnd::At(start + size)
            }
            Some(_) => ExtentEnd::None,
        }
    }

    /// Where the batch holding `offset` (or the first one after it) is.
    fn locate(&self, offset: Offset) -> Source<S::File> {
        let st = self.state.borrow();
        if offset >= st.log_end_offset {
            return Source::End;
        }
        if offset >= st.written_end {
            let appender = st
                .active()
                .appender
                .as_ref()
                .expect("active segment has an appender");
            return match appender.find(offset) {
                Some(b) => Source::Memory(ReadBatch {
                    base_offset: b.base_offset,
                    last_offset: b.last_offset,
                    bytes: b.bytes.clone(),
                }),
                None => Source::End,
            };
        }
        let Some(seg) = segment_holding(&st, offset) else {
            return Source::End;
        };
        let position = if offset > seg.base_offset {
            seg.offset_index.lookup(seg.relative(offset)).1 as u64
        } else {
            0
        };
        let limit = match &seg.appender {
            Some(appender) => appender.written,
            None => seg.size,
        };
        Source::Disk {
            file: seg.file.clone(),
            segment_base: seg.base_offset,
            position,
            limit,
            segment_end: seg.next_offset,
        }
    }

    /// ListOffsets by timestamp: the first offset whose record timestamp is at or after
    /// `target`, with that timestamp; `None` when every record is older.
    pub async fn offset_for_timestamp(
        &self,
        target: Timestamp,
    ) -> Result<Option<(Offset, Timestamp)>> {
        self.check_usable()?;
        let (mut cur, log_start) = {
            let st = self.state.borrow();
            let found = st
                .segments
                .values()
                .find(|s| s.max_timestamp >= target)
                .map(|s| Offset(s.base_offset.0 + s.time_index.lookup(target.0) as i64));
            match found {
                Some(o) => (o.max(st.log_start_offset), st.log_start_offset),
                None => return Ok(None),
            }
        };
        loop {
            let end = self.log_end_offset();
            if cur >= end {
                return Ok(None);
            }
            let batches = self.read(cur, 1 << 20, end).await?;
            if batches.is_empty() {
                return Ok(None);
            }
            for batch in batches {
                let header = BatchHeader::parse(&batch.bytes)?;
                if header.max_timestamp() >= target {
                    if let Some(found) =
                        record_at_or_after(&header, &batch.bytes, target, log_start.max(cur))?
                    {
                        return Ok(Some(found));
                    }
                }
                cur = batch.last_offset.next();
            }
        }
    }

    /// ListOffsets MAX_TIMESTAMP (KIP-734): the offset and timestamp of the record with the
    /// largest timestamp, the earliest such record when several share it.
    pub async fn max_timestamp_offset(&self) -> Result<Option<(Offset, Timestamp)>> {
        self.check_usable()?;
        let best = {
            let st = self.state.borrow();
            let mut best: Option<(Timestamp, Offset)> = None;
            for seg in st.segments.values() {
                if seg.max_timestamp.0 >= 0 && best.is_none_or(|(t, _)| seg.max_timestamp > t) {
                    best = Some((seg.max_timestamp, seg.offset_of_max_timestamp));
                }
            }
            best
        };
        let Some((ts, _)) = best else {
            return Ok(None);
        };
        // The earliest record carrying the max timestamp.
        self.offset_for_timestamp(ts).await
    }
}

/// Within one batch whose max timestamp is ≥ `target`: the first record at or after `min_offset`
/// with a timestamp ≥ `target`, looking inside compressed batches too (Kafka answers the exact
/// record there as well). In a `LogAppendTime` batch every record carries the batch's time.
fn record_at_or_after(
    header: &BatchHeader<'_>,
    bytes: &[u8],
    target: Timestamp,
    min_offset: Offset,
) -> Result<Option<(Offset, Timestamp)>> {
    let base = header.base_offset();
    if header.is_log_append_time() {
        return Ok(Some((base.max(min_offset), header.max_timestamp())));
    }
    let records = batch::records_section(bytes)?;
    for record in Records::section(&records, header.record_count()) {
        let record = record?;
        let offset = Offset(base.0 + record.offset_delta as i64);
        let ts = Timestamp(header.base_timestamp().0 + record.timestamp_delta);
        if offset >= min_offset && ts >= target {
            return Ok(Some((offset, ts)));
        }
    }
    Ok(None)
}
