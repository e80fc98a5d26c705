//! Reading batches back from a segment file: the recovery scan, and the read path's disk reads.
//!
//! Every batch read from the device is verified (length, magic, CRC-32C) before it is used, the
//! other half of the check made before it was written. A bad batch in a scan ends the scan (a
//! torn tail); a bad batch on the read path is reported as corruption and never served.

use std::rc::Rc;

use bytes::Bytes;

use super::Segment;
use crate::batch::{self, BatchHeader, BATCH_HEADER_SIZE};
use crate::error::{LogError, Result};
use crate::storage::StorageFile;
use crate::types::{LeaderEpoch, Offset};

/// Bytes read per device request during scans.
const SCAN_CHUNK_BYTES: usize = 1 << 20;
/// Smallest read the read path issues, so that scanning forward from a sparse index entry
/// usually needs one request.
const READ_CHUNK_MIN_BYTES: usize = 64 << 10;

/// How a scan ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanEnd {
    /// Reached the end of the file, or preallocated zeros after the last batch.
    Clean,
    /// Stopped at a batch that is torn, corrupt or out of order; the reason says which.
    Invalid { position: u64, reason: String },
}

pub struct ScanResult<F> {
    pub segment: Segment<F>,
    pub end: ScanEnd,
    /// (epoch, first offset) each time the partition leader epoch changed.
    pub epochs: Vec<(LeaderEpoch, Offset)>,
}

struct Window {
    start: u64,
    data: Vec<u8>,
}

impl Window {
    async fn ensure<F: StorageFile>(
        &mut self,
        file: &F,
        pos: u64,
        len: usize,
    ) -> std::io::Result<bool> {
        let have = pos >= self.start && pos + len as u64 <= self.start + self.data.len() as u64;
        if !have {
            self.data = file.read_at(pos, len.max(SCAN_CHUNK_BYTES)).await?;
            self.start = pos;
        }
        Ok(self.data.len() >= len)
    }

    fn slice(&self, pos: u64, len: usize) -> &[u8] {
        let at = (pos - self.start) as usize;
        &self.data[at..at + len]
    }
}

/// Scans a segment from its start, verifying every batch, and rebuilds its in-memory state.
///
/// `contiguous`: every batch must start exactly where the previous one ended (the first at the
/// segment's base offset). True for a segment that was never compacted, which is every active
/// segment; it also catches a flipped bit in the base offset, which the CRC does not cover.
pub async fn scan_segment<F: StorageFile>(
    file: Rc<F>,
    base_offset: Offset,
    file_size: u64,
    index_interval_bytes: u32,
    contiguous: bool,
) -> std::io::Result<ScanResult<F>> {
    let mut segment = Segment::new(base_offset, file.clone());
    let mut epochs: Vec<(LeaderEpoch, Offset)> = Vec::new();
    let mut window = Window {
        start: 0,
        data: Vec::new(),
    };
    let mut pos = 0u64;
    let invalid = |position: u64, reason: String| ScanEnd::Invalid { position, reason };
    let end = loop {
        if pos == file_size {
            break ScanEnd::Clean;
        }
        if pos + BATCH_HEADER_SIZE as u64 > file_size {
            if window
                .ensure(&*file, pos, (file_size - pos) as usize)
                .await?
                && window
                    .slice(pos, (file_size - pos) as usize)
                    .iter()
                    .all(|&b| b == 0)
            {
                break ScanEnd::Clean;
            }
            break invalid(pos, "partial batch header at the end of the file".into());
        }
        if !window.ensure(&*file, pos, BATCH_HEADER_SIZE).await? {
            break invalid(pos, "file shorter than its size".into());
        }
        let header_bytes = window.slice(pos, BATCH_HEADER_SIZE);
        if header_bytes.iter().all(|&b| b == 0) {
            // Preallocated space after the last batch. Anything non-zero beyond it would be a
            // torn write that never completed, and is discarded with it.
            break ScanEnd::Clean;
        }
        let header = BatchHeader::parse(header_bytes).expect("header length checked");
        let Some(size) = header.total_size() else {
            break invalid(pos, format!("bad batch length {}", header.batch_length()));
        };
        if pos + size as u64 > file_size {
            break invalid(
                pos,
                format!("batch of {size} bytes runs past the end of the file"),
            );
        }
        if !window.ensure(&*file, pos, size).await? {
            break invalid(pos, "file shorter than its size".into());
        }
        let bytes = window.slice(pos, size);
        let header = match batch::verify(bytes) {
            Ok(h) => h,
            Err(e) => break invalid(pos, e.to_string()),
        };
        if header.base_offset() < segment.next_offset
            || (contiguous && header.base_offset() != segment.next_offset)
        {
            break invalid(
                pos,
                format!(
                    "batch offset {} behind expected {}",
                    header.base_offset(),
                    segment.next_offset
                ),
            );
        }
        if header.last_offset_delta() < 0
            || header.last_offset().0 - base_offset.0 > u32::MAX as i64
        {
            break invalid(pos, "batch offsets outside the segment".into());
        }
        let epoch = header.partition_leader_epoch();
        if epoch.0 >= 0 && epochs.last().is_none_or(|&(e, _)| epoch > e) {
            epochs.push((epoch, header.base_offset()));
        }
        segment.track_batch(&header, pos, index_interval_bytes);
        pos += size as u64;
    };
    Ok(ScanResult {
        segment,
        end,
        epochs,
    })
}

/// A batch returned by a read, with the offsets a caller needs without reparsing.
#[derive(Clone, Debug)]
pub struct ReadBatch {
    pub base_offset: Offset,
    pub last_offset: Offset,
    pub bytes: Bytes,
}

/// Reads whole batches from `position` (an index entry at or before `from`) up to `limit` (the
/// readable end of the segment): skips batches ending before `from`, stops at `max_offset`
/// (exclusive) or when adding a batch would pass `max_bytes` (`have_bytes` already collected; the
/// first batch is returned whole even when larger, as Kafka's fetch does).
#[allow(clippy::too_many_arguments)]
pub async fn read_batches<F: StorageFile>(
    file: &F,
    segment_base: Offset,
    mut position: u64,
    limit: u64,
    from: Offset,
    max_offset: Offset,
    max_bytes: usize,
    have_bytes: usize,
) -> Result<Vec<ReadBatch>> {
    let corrupt = |position: u64, reason: String| {
        tracing::error!(segment = segment_base.0, position, %reason, "corrupt batch on read; not served");
        LogError::Corrupt {
            segment: segment_base,
            position,
            reason,
        }
    };
    let mut out = Vec::new();
    let mut total = have_bytes;
    while position < limit {
        let want = max_bytes.saturating_sub(total).max(READ_CHUNK_MIN_BYTES);
        let len = (limit - position).min(want as u64) as usize;
        let data = Bytes::from(
            file.read_at(position, len)
                .await
                .map_err(|e| LogError::io("reading a segment", e))?,
        );
        if data.len() < len {
            return Err(corrupt(
                position,
                format!("short read: {} of {len} bytes", data.len()),
            ));
        }
        let mut at = 0usize;
        let mut done = false;
        while at + BATCH_HEADER_SIZE <= data.len() {
            let header = BatchHeader::parse(&data[at..]).expect("length checked");
            let Some(size) = header.total_size() else {
                return Err(corrupt(
                    position + at as u64,
                    format!("bad batch length {}", header.batch_length()),
                ));
            };
            if position + (at + size) as u64 > limit {
                return Err(corrupt(
                    position + at as u64,
                    "batch runs past the segment end".into(),
                ));
            }
            if header.last_offset() < from {
                at += size;
                continue;
            }
            if header.base_offset() >= max_offset || (total > 0 && total + size > max_bytes) {
                done = true;
                break;
            }
            let bytes = if at + size <= data.len() {
                data.slice(at..at + size)
            } else if out.is_empty() {
                // The first batch is larger than the chunk: read exactly it.
                let exact = file
                    .read_at(position + at as u64, size)
                    .await
                    .map_err(|e| LogError::io("reading a segment", e))?;
                Bytes::from(exact)
            } else {
                break;
            };
            let header =
                batch::verify(&bytes).map_err(|e| corrupt(position + at as u64, e.to_string()))?;
            out.push(ReadBatch {
                base_offset: header.base_offset(),
                last_offset: header.last_offset(),
                bytes: bytes.clone(),
            });
            total += size;
            at += size;
        }
        if done || !out.is_empty() {
            break;
        }
        if at == 0 {
            return Err(corrupt(
                position,
                "no batch header where one was expected".into(),
            ));
        }
        position += at as u64;
    }
    Ok(out)
}

/// Where a zero-copy fetch finds its bytes: `len` bytes of whole batches at `position` in a
/// segment file, through a buffered descriptor that stays open as long as the extent lives.
#[derive(Clone, Debug)]
pub struct FileExtent {
    pub fd: std::sync::Arc<std::os::fd::OwnedFd>,
    pub position: u64,
    pub len: u64,
}

/// The batch that holds `offset`, or the first one after it: walks batch headers from
/// `position` (a batch boundary, an index entry at or before `offset`) to `limit`, reading one
/// header at a time. Returns its position, base and last offsets and size, or `None` when no
/// batch at or after `offset` starts before `limit`.
pub async fn find_batch<F: StorageFile>(
    file: &F,
    segment_base: Offset,
    mut position: u64,
    limit: u64,
    offset: Offset,
) -> Result<Option<(u64, Offset, Offset, u64)>> {
    while position + BATCH_HEADER_SIZE as u64 <= limit {
        let bytes = file
            .read_at(position, BATCH_HEADER_SIZE)
            .await
            .map_err(|e| LogError::io("reading batch headers", e))?;
        let corrupt = |reason: String| LogError::Corrupt {
            segment: segment_base,
            position,
            reason,
        };
        let header = BatchHeader::parse(&bytes)
            .map_err(|_| corrupt(format!("short read: {} bytes", bytes.len())))?;
        let Some(size) = header.total_size() else {
            return Err(corrupt(format!(
                "bad batch length {}",
                header.batch_length()
            )));
        };
        if position + size as u64 > limit {
            return Err(corrupt("batch runs past the segment end".into()));
        }
        if header.last_offset() >= offset {
            return Ok(Some((
                position,
                header.base_offset(),
                header.last_offset(),
                size as u64,
            )));
        }
        position += size as u64;
    }
    Ok(None)
}

/// Walks batch headers from `position` (a batch boundary) to `limit` and returns the position of
/// the first batch that ends at or after `offset`, or `limit` if there is none.
pub async fn position_of<F: StorageFile>(
    file: &F,
    segment_base: Offset,
    mut position: u64,
    limit: u64,
    offset: Offset,
) -> Result<u64> {
    let mut window = Window {
        start: 0,
        data: Vec::new(),
    };
    while position + BATCH_HEADER_SIZE as u64 <= limit {
        window
            .ensure(file, position, BATCH_HEADER_SIZE)
            .await
            .map_err(|e| LogError::io("reading batch headers", e))?;
        let header =
            BatchHeader::parse(window.slice(position, BATCH_HEADER_SIZE)).expect("length checked");
        if header.last_offset() >= offset {
            return Ok(position);
        }
        let Some(size) = header.total_size() else {
            return Err(LogError::Corrupt {
                segment: segment_base,
                position,
                reason: format!("bad batch length {}", header.batch_length()),
            });
        };
        position += size as u64;
    }
    Ok(limit)
}
