//! Response frames, and how a fetch response carries records spliced from segment files.
//!
//! The protocol crate encodes a response from values in memory. A zero-copy fetch response
//! gives it, for each partition's records, a placeholder `Bytes` of the right length: a slice
//! of an address range mapped read-only and never touched, so it costs no memory. Encoding
//! into [`SplicedBuf`] cuts the frame where a placeholder's bytes would be copied: the frame
//! becomes encoded bytes and file extents, in order, and the connection's writer sends the
//! bytes and splices the extents (`net/splice.rs`).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::OnceLock;

use bytes::buf::UninitSlice;
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::buf::ByteBufMut;
use sluice_engine::FileExtent;

/// A response on its way to the client.
pub enum Frame {
    Bytes(Bytes),
    /// Encoded bytes and extents of segment files, in the order they go out.
    Spliced(Vec<FramePart>),
}

pub enum FramePart {
    Bytes(Bytes),
    File(FileExtent),
}

/// Address space for placeholders: more than the records of any one response (at most
/// `fetch.max.bytes` plus one batch).
const PLACEHOLDER_BYTES: usize = 4 << 30;

/// The placeholder range, mapped on first use; `None` if the mapping failed, and then fetches
/// copy.
pub fn placeholder_range() -> Option<usize> {
    static RANGE: OnceLock<Option<usize>> = OnceLock::new();
    *RANGE.get_or_init(|| {
        // SAFETY: a new anonymous private read-only mapping at an address the kernel picks; it
        // aliases no Rust object and is never unmapped.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PLACEHOLDER_BYTES,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            tracing::warn!(error = %std::io::Error::last_os_error(), "no address space for zero-copy fetch; fetches copy");
            None
        } else {
            Some(p as usize)
        }
    })
}

/// The extents of one response, by the address of their placeholders.
#[derive(Default)]
pub struct Splices {
    by_address: HashMap<usize, FileExtent>,
    used: usize,
    /// The connection cannot take splices (TLS): records are read into memory instead.
    copying: bool,
}

impl Splices {
    /// For a connection whose responses must go out through user space (TLS).
    pub fn copying() -> Splices {
        Splices {
            copying: true,
            ..Splices::default()
        }
    }

    /// Whether reads for this response may leave records on disk to be spliced.
    pub fn possible(&self) -> bool {
        !self.copying && placeholder_range().is_some()
    }

    /// A placeholder for the extent's bytes, or `None` when the response has no room left.
    pub fn placeholder(&mut self, extent: FileExtent) -> Option<Bytes> {
        if self.copying {
            return None;
        }
        let base = placeholder_range()?;
        let len = extent.len as usize;
        if len == 0 || self.used + len > PLACEHOLDER_BYTES {
            return None;
        }
        let address = base + self.used;
        self.used += len;
        self.by_address.insert(address, extent);
        // Safety: the range is mapped read-only for the life of the process.
        Some(Bytes::from_static(unsafe {
            std::slice::from_raw_parts(address as *const u8, len)
        }))
    }

    pub fn is_empty(&self) -> bool {
        self.by_address.is_empty()
    }
}

/// An encoding buffer that turns placeholders into frame parts.
pub struct SplicedBuf<'a> {
    splices: &'a Splices,
    parts: Vec<SplicedPart>,
    current: BytesMut,
    /// Bytes before `current`.
    before: usize,
}

enum SplicedPart {
    Bytes(BytesMut),
    File(FileExtent),
}

impl<'a> SplicedBuf<'a> {
    pub fn new(splices: &'a Splices, capacity: usize) -> SplicedBuf<'a> {
        SplicedBuf {
            splices,
            parts: Vec::new(),
            current: BytesMut::with_capacity(capacity),
            before: 0,
        }
    }

    /// The frame, its first four bytes set to the size of the rest.
    pub fn finish(mut self) -> Frame {
        let size = (self.offset() - 4) as u32;
        self.parts.push(SplicedPart::Bytes(self.current));
        match self.parts.first_mut() {
            Some(SplicedPart::Bytes(b)) if b.len() >= 4 => {
                b[0..4].copy_from_slice(&size.to_be_bytes())
            }
            _ => unreachable!("a frame starts with its size prefix"),
        }
        Frame::Spliced(
            self.parts
                .into_iter()
                .filter_map(|p| match p {
                    SplicedPart::Bytes(b) if b.is_empty() => None,
                    SplicedPart::Bytes(b) => Some(FramePart::Bytes(b.freeze())),
                    SplicedPart::File(e) => Some(FramePart::File(e)),
                })
                .collect(),
        )
    }
}

// SAFETY: `remaining_mut`, `chunk_mut` and `advance_mut` are `current`'s (a `BytesMut`), so
// they keep its contract; the other methods write only through `BytesMut`'s safe API.
unsafe impl BufMut for SplicedBuf<'_> {
    fn remaining_mut(&self) -> usize {
        self.current.remaining_mut()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: the caller's promise (`cnt` bytes of `chunk_mut` initialized) is about
        // `self.current`'s chunk, which `chunk_mut` returned.
        unsafe { self.current.advance_mut(cnt) }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        self.current.chunk_mut()
    }

    fn put_slice(&mut self, src: &[u8]) {
        let address = src.as_ptr() as usize;
        let placeholder = placeholder_range()
            .filter(|&base| address >= base && address < base + PLACEHOLDER_BYTES)
            .and_then(|_| self.splices.by_address.get(&address))
            .filter(|e| e.len as usize == src.len());
        match placeholder {
            Some(extent) => {
                let bytes = std::mem::take(&mut self.current);
                self.before += bytes.len() + src.len();
                self.parts.push(SplicedPart::Bytes(bytes));
                self.parts.push(SplicedPart::File(extent.clone()));
            }
            None => self.current.extend_from_slice(src),
        }
    }
}

impl ByteBufMut for SplicedBuf<'_> {
    fn offset(&self) -> usize {
        self.before + self.current.len()
    }

    fn seek(&mut self, offset: usize) {
        assert!(offset >= self.before, "seek back past a spliced extent");
        self.current.resize(offset - self.before, 0);
    }

    fn range(&mut self, r: Range<usize>) -> &mut [u8] {
        assert!(r.start >= self.before, "range before a spliced extent");
        &mut self.current[r.start - self.before..r.end - self.before]
    }
}
