//! The write head of the active segment.
//!
//! Appends are buffered here as whole batches (`unwritten`) and written to the device by the
//! log's flusher in one aligned O_DIRECT write. The partially filled last block (`tail`) stays in
//! memory and is rewritten, completed, by the next write, so no byte is ever read back from the
//! device to extend it. The file is preallocated ahead of the write head (`allocated`), so writes
//! land in allocated blocks inside the file and never pay for growing it.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::storage::{align_down, align_up, IoBuf, StorageFile, ALIGN};
use crate::types::Offset;

/// A batch that is in the log (readable, cached) but not yet on the device.
pub struct PendingBatch {
    pub base_offset: Offset,
    pub last_offset: Offset,
    pub bytes: Bytes,
}

pub struct Appender {
    /// Bytes of the file that are allocated (a multiple of the alignment).
    pub allocated: u64,
    /// Bytes `[0, written)` of the segment are on the device.
    pub written: u64,
    /// Bytes `[align_down(written), written)`: the partial block last written.
    pub tail: Vec<u8>,
    pub unwritten: VecDeque<PendingBatch>,
    pub unwritten_bytes: u64,
}

/// One aligned write the flusher performs, prepared while holding no borrow across an await.
pub struct WritePlan<B> {
    pub position: u64,
    /// (position, buffer) of each aligned write; they do not overlap and may run together.
    pub writes: Vec<(u64, B)>,
    /// The segment size the write brings to the device.
    pub end: u64,
    /// How many unwritten batches it covers.
    pub batch_count: usize,
    pub new_tail: Vec<u8>,
}

impl Appender {
    pub fn new(written: u64, tail: Vec<u8>, allocated: u64) -> Appender {
        assert_eq!(
            tail.len() as u64,
            written - align_down(written),
            "tail must be the partial block"
        );
        Appender {
            allocated,
            written,
            tail,
            unwritten: VecDeque::new(),
            unwritten_bytes: 0,
        }
    }

    /// Room left in the preallocated file.
    pub fn room(&self, segment_size: u64) -> u64 {
        self.allocated.saturating_sub(segment_size)
    }

    pub fn push(&mut self, batch: PendingBatch) {
        self.unwritten_bytes += batch.bytes.len() as u64;
        self.unwritten.push_back(batch);
    }

    /// Copies the tail block and every unwritten batch into one aligned buffer.
    pub fn plan_write<F: StorageFile>(&self, file: &F) -> Option<WritePlan<F::Buf>> {
        if self.unwritten.is_empty() {
            return None;
        }
        let position = align_down(self.written);
        let end = self.written + self.unwritten_bytes;
        assert!(
            align_up(end) <= self.allocated,
            "write past preallocated space: end {end}, allocated {}",
            self.allocated
        );
        let total = (align_up(end) - position) as usize;
        // The partly written tail block goes out as its own write, side by side with the rest:
        // one write covering both an already written block and never written (preallocated)
        // blocks cannot be issued without blocking on ext4, and io_uring hands it to a worker
        // thread; two writes that each cover one kind can be.
        let split = if !self.tail.is_empty() && total > ALIGN as usize {
            ALIGN as usize
        } else {
            0
        };
        let mut head = (split > 0).then(|| file.alloc_buf(split));
        let mut rest = file.alloc_buf(total - split);
        let mut at = 0usize;
        {
            let head_slice: &mut [u8] = match head.as_mut() {
                Some(h) => h.as_mut_slice(),
                None => &mut [],
            };
            let rest_slice = rest.as_mut_slice();
            let mut put = |at: &mut usize, bytes: &[u8]| {
                let mut bytes = bytes;
                if *at < split {
                    let n = bytes.len().min(split - *at);
                    head_slice[*at..*at + n].copy_from_slice(&bytes[..n]);
                    bytes = &bytes[n..];
                    *at += n;
                }
                if !bytes.is_empty() {
                    let r = *at - split;
                    rest_slice[r..r + bytes.len()].copy_from_slice(bytes);
                    *at += bytes.len();
                }
            };
            put(&mut at, &self.tail);
            for batch in &self.unwritten {
                put(&mut at, &batch.bytes);
            }
            assert_eq!(position + at as u64, end);
            // Zero the padding after the last batch: recovery reads zeros as the end of the log.
            if at < split {
                head_slice[at..].fill(0);
                rest_slice.fill(0);
            } else {
                rest_slice[at - split..].fill(0);
            }
        }
        // The new tail: the bytes of the last, partly filled block.
        let tail_start = (align_down(end) - position) as usize;
        let mut new_tail = Vec::with_capacity(at - tail_start);
        for i in tail_start..at {
            new_tail.push(if i < split {
                head.as_ref().expect("head exists below split").as_slice()[i]
            } else {
                rest.as_slice()[i - split]
            });
        }
        let mut writes = Vec::with_capacity(2);
        if let Some(h) = head {
            writes.push((position, h));
        }
        writes.push((position + split as u64, rest));
        Some(WritePlan {
            position,
            writes,
            end,
            batch_count: self.unwritten.len(),
            new_tail,
        })
    }

    /// Applies a completed write. Returns the offset one past the last batch written.
    pub fn complete_write(&mut self, end: u64, batch_count: usize, new_tail: Vec<u8>) -> Offset {
        let mut next = Offset(-1);
        for _ in 0..batch_count {
            let batch = self
                .unwritten
                .pop_front()
                .expect("written batches are still queued");
            self.unwritten_bytes -= batch.bytes.len() as u64;
            next = batch.last_offset.next();
        }
        assert_eq!(end, self.written + (end - self.written));
        self.written = end;
        self.tail = new_tail;
        assert_eq!(
            self.tail.len() as u64,
            self.written - align_down(self.written)
        );
        next
    }

    /// The queued batch holding `offset`, or the first one after it.
    pub fn find(&self, offset: Offset) -> Option<&PendingBatch> {
        let i = self.unwritten.partition_point(|b| b.last_offset < offset);
        self.unwritten.get(i)
    }

    /// Offset of the first batch not yet on the device, if any.
    pub fn first_unwritten_offset(&self) -> Option<Offset> {
        self.unwritten.front().map(|b| b.base_offset)
    }
}
