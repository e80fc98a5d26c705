//! The narrow seam between the log and the filesystem.
//!
//! Every byte the engine reads or writes goes through [`Storage`] and [`StorageFile`]. Production
//! uses [`DmaStorage`] (O_DIRECT files driven by io_uring through glommio). Tests use
//! [`MemStorage`], which keeps a "durable" and a "current" image of every file so a simulated
//! power loss can drop exactly the writes that were never fdatasync'd, and which can fail an
//! operation or run out of space on a countdown.
//!
//! Both are single-threaded: a storage value lives on the shard that owns the logs using it.

use std::io;
use std::path::Path;

mod dma;
mod mem;

pub use dma::{disk_read_turn, DmaStorage};
pub use mem::{CrashMode, MemStorage};

/// Writes and their buffers are aligned to this many bytes. It is the largest logical block
/// size of the devices Sluice supports, so one constant serves every filesystem.
pub const ALIGN: u64 = 4096;

pub fn align_down(v: u64) -> u64 {
    v & !(ALIGN - 1)
}

pub fn align_up(v: u64) -> u64 {
    (v + ALIGN - 1) & !(ALIGN - 1)
}

/// A buffer that [`StorageFile::write_at`] accepts: aligned to [`ALIGN`] in memory and in length.
pub trait IoBuf {
    fn as_slice(&self) -> &[u8];
    fn as_mut_slice(&mut self) -> &mut [u8];
}

impl IoBuf for Vec<u8> {
    fn as_slice(&self) -> &[u8] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        self
    }
}

#[allow(async_fn_in_trait)]
pub trait StorageFile: 'static {
    type Buf: IoBuf;

    /// A buffer of `len` bytes (a multiple of [`ALIGN`]) suitable for `write_at`. Its contents
    /// are unspecified: the caller writes every byte, zeroing any padding.
    fn alloc_buf(&self, len: usize) -> Self::Buf;
    /// Writes the whole buffer at `pos` (a multiple of [`ALIGN`]).
    async fn write_at(&self, buf: Self::Buf, pos: u64) -> io::Result<()>;
    /// Reads up to `len` bytes at `pos`; fewer only at the end of the file.
    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>>;
    async fn fdatasync(&self) -> io::Result<()>;
    /// Makes the file at least `len` bytes long with allocated, zero-reading blocks.
    async fn allocate(&self, len: u64) -> io::Result<()>;
    async fn truncate(&self, len: u64) -> io::Result<()>;
    async fn size(&self) -> io::Result<u64>;
    /// A buffered, read-only descriptor of the same file, for zero-copy transfer (splice) of
    /// bytes that are never written again; `None` when the storage has no descriptors.
    fn buffered_fd(&self) -> Option<std::sync::Arc<std::os::fd::OwnedFd>> {
        None
    }
}

#[allow(async_fn_in_trait)]
pub trait Storage: Clone + 'static {
    type File: StorageFile;

    async fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Opens a file for reading and writing, creating it (empty) when `create` is set.
    async fn open(&self, path: &Path, create: bool) -> io::Result<Self::File>;
    async fn remove(&self, path: &Path) -> io::Result<()>;
    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// File names (not paths) in `dir`.
    async fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Makes creations, renames and removals in `dir` durable.
    async fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    async fn exists(&self, path: &Path) -> bool;
    /// The file's last modification time in milliseconds since the epoch, where the storage
    /// keeps one (retention falls back to it for a segment without record timestamps).
    async fn modified_ms(&self, path: &Path) -> io::Result<Option<i64>>;
}

/// Replaces `path` with `data` so that a crash leaves either the old or the new contents:
/// write a temporary file, fdatasync it, rename it over, sync the directory.
pub async fn write_file_atomic<S: Storage>(
    storage: &S,
    path: &Path,
    data: &[u8],
) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let file = storage.open(&tmp, true).await?;
    file.truncate(0).await?;
    if !data.is_empty() {
        let mut buf = file.alloc_buf(align_up(data.len() as u64) as usize);
        buf.as_mut_slice()[..data.len()].copy_from_slice(data);
        buf.as_mut_slice()[data.len()..].fill(0);
        file.write_at(buf, 0).await?;
        file.truncate(data.len() as u64).await?;
    }
    file.fdatasync().await?;
    drop(file);
    storage.rename(&tmp, path).await?;
    let dir = path.parent().unwrap_or(Path::new("."));
    storage.sync_dir(dir).await
}

/// Reads a whole (small) file.
pub async fn read_file<S: Storage>(storage: &S, path: &Path) -> io::Result<Vec<u8>> {
    let file = storage.open(path, false).await?;
    let size = file.size().await?;
    file.read_at(0, size as usize).await
}
