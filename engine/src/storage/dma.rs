//! Production storage: O_DIRECT files through glommio's io_uring reactor.
//!
//! Must be used from inside a glommio executor. Directory listing and creation use blocking
//! calls; they happen only when a log is opened or a partition is created, never per request.

use std::cell::RefCell;
use std::collections::HashSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::rc::Rc;

use glommio::io::{DmaBuffer, DmaFile, OpenOptions};

use super::{IoBuf, Storage, StorageFile, ALIGN};

/// Segment reads in flight on one shard (thread); each starts only when no fdatasync of the shard
/// is in flight (waiting up to `READ_YIELDS_TO_SYNC_MAX`). Cold reads queue here rather than in
/// the device: a deep queue of large reads makes the device hold every fdatasync behind them.
/// Measured with fio on this project's test machine (virtio disk): four outstanding 1 MiB reads
/// raised the p50 of a concurrent 16 KiB write + fdatasync from 0.2 ms to 25 ms; one at a time,
/// to 0.5 ms, while still reading 1.2 GB/s. Waiting for the shard's own syncs took the p99 of a
/// producer during a 1 GiB catch-up from about 7.3 to 5.4-6.2 ms (perf/README.md, (e)).
pub const READS_IN_FLIGHT_PER_SHARD: usize = 1;

thread_local! {
    static READS: std::sync::Arc<async_lock::Semaphore> =
        std::sync::Arc::new(async_lock::Semaphore::new(READS_IN_FLIGHT_PER_SHARD));
    /// fdatasyncs in flight on this shard, and an event when one ends: a cold read waits for
    /// them before it starts, so acknowledgements never queue behind a read in the device.
    static SYNCS: Rc<(std::cell::Cell<usize>, event_listener::Event)> =
        Rc::new((std::cell::Cell::new(0), event_listener::Event::new()));
}

/// Longest a cold read waits for fdatasyncs to finish: under a steady stream of syncs it then
/// goes anyway, so readers are slowed, never starved.
const READ_YIELDS_TO_SYNC_MAX: std::time::Duration = std::time::Duration::from_millis(5);

/// Waits until no fdatasync is in flight on this shard, or `READ_YIELDS_TO_SYNC_MAX`.
async fn syncs_done() {
    let syncs = SYNCS.with(Rc::clone);
    let deadline = std::time::Instant::now() + READ_YIELDS_TO_SYNC_MAX;
    while syncs.0.get() > 0 {
        let listener = syncs.1.listen();
        if syncs.0.get() == 0 {
            break;
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            break;
        }
        futures_lite::future::or(listener, async {
            glommio::timer::sleep(deadline - now).await;
        })
        .await;
    }
}

/// Counts an fdatasync in flight on this shard for as long as it lives (also when its future is
/// dropped midway).
struct SyncInFlight(Rc<(std::cell::Cell<usize>, event_listener::Event)>);

impl SyncInFlight {
    fn start() -> SyncInFlight {
        let syncs = SYNCS.with(Rc::clone);
        syncs.0.set(syncs.0.get() + 1);
        SyncInFlight(syncs)
    }
}

impl Drop for SyncInFlight {
    fn drop(&mut self) {
        let left = self.0 .0.get() - 1;
        self.0 .0.set(left);
        if left == 0 {
            self.0 .1.notify(usize::MAX);
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct DmaStorage;

impl DmaStorage {
    pub fn new() -> DmaStorage {
        DmaStorage
    }
}

pub struct DmaIoBuf(DmaBuffer);

impl IoBuf for DmaIoBuf {
    fn as_slice(&self) -> &[u8] {
        self.0.as_bytes()
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        self.0.as_bytes_mut()
    }
}

pub struct DmaStorageFile {
    file: DmaFile,
    path: std::path::PathBuf,
    /// Opened on first use by a zero-copy fetch (`buffered_fd`).
    buffered: std::cell::OnceCell<Option<std::sync::Arc<std::os::fd::OwnedFd>>>,
}

impl StorageFile for DmaStorageFile {
    type Buf = DmaIoBuf;

    fn alloc_buf(&self, len: usize) -> DmaIoBuf {
        assert_eq!(len as u64 % ALIGN, 0, "unaligned buffer length {len}");
        let buf = self.file.alloc_dma_buffer(len);
        // A misaligned O_DIRECT buffer makes ext4 fall back to buffered I/O without a word.
        assert_eq!(buf.as_ptr() as u64 % ALIGN, 0, "DMA buffer is not aligned");
        // Not zeroed: callers fill what they write and zero only the padding after it.
        DmaIoBuf(buf)
    }

    async fn write_at(&self, buf: DmaIoBuf, pos: u64) -> io::Result<()> {
        assert_eq!(pos % ALIGN, 0, "unaligned write position {pos}");
        let len = buf.0.len();
        let written = self.file.write_at(buf.0, pos).await?;
        if written != len {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short O_DIRECT write: {written} of {len} bytes at {pos}"),
            ));
        }
        Ok(())
    }

    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let _turn = disk_read_turn().await;
        let result = self.file.read_at(pos, len).await?;
        Ok(result.to_vec())
    }

    async fn fdatasync(&self) -> io::Result<()> {
        let _in_flight = SyncInFlight::start();
        let started = std::time::Instant::now();
        let synced = self.file.fdatasync().await;
        crate::waits::record(crate::waits::Wait::Fdatasync, started.elapsed(), || {
            format!(
                "fdatasync of {}",
                self.file
                    .path()
                    .map_or_else(|| "?".into(), |p| p.display().to_string())
            )
        });
        Ok(synced?)
    }

    async fn allocate(&self, len: u64) -> io::Result<()> {
        // keep_size = false: the file's size grows over the allocated blocks, so later O_DIRECT
        // writes land inside the file and never pay for extending it.
        Ok(self.file.pre_allocate(len, false).await?)
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        Ok(self.file.truncate(len).await?)
    }

    async fn size(&self) -> io::Result<u64> {
        Ok(self.file.file_size().await?)
    }

    fn buffered_fd(&self) -> Option<std::sync::Arc<std::os::fd::OwnedFd>> {
        self.buffered
            .get_or_init(|| {
                // Read-ahead off: a splice then reads exactly the bytes it sends, never the
                // pages after them, which the O_DIRECT writer may still rewrite.
                let opened = std::fs::File::open(&self.path).and_then(|f| {
                    use std::os::fd::AsRawFd;
                    // SAFETY: advice on the file just opened; no memory is passed.
                    let rc = unsafe {
                        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM)
                    };
                    if rc != 0 {
                        return Err(io::Error::from_raw_os_error(rc));
                    }
                    Ok(std::sync::Arc::new(std::os::fd::OwnedFd::from(f)))
                });
                match opened {
                    Ok(fd) => Some(fd),
                    Err(e) => {
                        tracing::warn!(path = %self.path.display(), error = %e, "no buffered descriptor; fetches of this segment copy");
                        None
                    }
                }
            })
            .clone()
    }
}

/// A turn to read from the disk on this shard: waits for the shard's fdatasyncs in flight (at
/// most `READ_YIELDS_TO_SYNC_MAX`) and holds one of `READS_IN_FLIGHT_PER_SHARD` until dropped.
/// Zero-copy fetches take one per chunk they splice from a segment file.
pub async fn disk_read_turn() -> async_lock::SemaphoreGuardArc {
    let reads = READS.with(std::sync::Arc::clone);
    let turn = reads.acquire_arc().await;
    syncs_done().await;
    turn
}

thread_local! {
    /// Devices whose io_uring poll support this thread has settled (see `calibrate`).
    static CALIBRATED_DEVICES: RefCell<HashSet<u64>> = RefCell::new(HashSet::new());
}

/// glommio decides, once per device and thread, whether reads may use the io_uring poll ring,
/// by reading the first block of the first file it opens there. When that file is empty the
/// probe succeeds vacuously, and on a device without polling (virtio, most cloud disks) every
/// later read then fails with EOPNOTSUPP. So before the first open on a device, open a file
/// that has a block of data: the probe then gives the true answer, which glommio caches.
///
/// A file already in `dir` whose first block holds data serves as well (the shard calibrating
/// owns the directory, so nothing removes the file meanwhile). Preallocated space does not serve:
/// its blocks are unwritten extents, read as zeros without reaching the device, which is the
/// vacuous probe again; so the block must have a byte that is not zero. Otherwise a probe file is
/// written; when the disk has no room even for that, a data file of a sibling directory (another
/// partition) serves, so a broker restarting on a disk with no free byte left still opens its
/// logs. Probe files are never borrowed: their shard removes them at once, and glommio panics
/// when a file vanishes while it opens it.
async fn calibrate(dir: &Path) -> io::Result<()> {
    const PROBE_PREFIX: &str = ".sluice-iopoll-probe-";
    let dev = std::fs::metadata(dir)?.dev();
    if CALIBRATED_DEVICES.with(|d| d.borrow().contains(&dev)) {
        return Ok(());
    }
    let has_data = |path: &Path| -> bool {
        use std::io::Read;
        let mut block = vec![0u8; ALIGN as usize];
        std::fs::File::open(path)
            .and_then(|mut f| f.read_exact(&mut block))
            .is_ok_and(|()| block.iter().any(|&b| b != 0))
    };
    let with_data = |d: &Path| {
        std::fs::read_dir(d).ok()?.flatten().find(|e| {
            !e.file_name().to_string_lossy().starts_with(PROBE_PREFIX)
                && e.metadata()
                    .is_ok_and(|m| m.is_file() && m.len() >= ALIGN && m.dev() == dev)
                && has_data(&e.path())
        })
    };
    let settle = |path: std::path::PathBuf| async move {
        OpenOptions::new()
            .read(true)
            .dma_open(path)
            .await?
            .close()
            .await?;
        CALIBRATED_DEVICES.with(|d| d.borrow_mut().insert(dev));
        Ok::<(), io::Error>(())
    };
    if let Some(entry) = with_data(dir) {
        return settle(entry.path()).await;
    }
    // One probe file per call: shards calibrate at the same time in the same directory, and a
    // probe truncated or removed by another thread under glommio's read would give it a wrong
    // answer.
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = dir.join(format!("{PROBE_PREFIX}{}-{n}", std::process::id()));
    if let Err(e) = std::fs::write(&probe, [0x5au8; ALIGN as usize]) {
        let _ = std::fs::remove_file(&probe);
        if !matches!(
            e.kind(),
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
        ) {
            return Err(e);
        }
        let sibling = dir.parent().and_then(|parent| {
            std::fs::read_dir(parent)
                .ok()?
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .find_map(|e| with_data(&e.path()))
        });
        return match sibling {
            Some(entry) => settle(entry.path()).await,
            None => Err(e),
        };
    }
    let opened = OpenOptions::new().read(true).dma_open(&probe).await;
    let _ = std::fs::remove_file(&probe);
    opened?.close().await?;
    CALIBRATED_DEVICES.with(|d| d.borrow_mut().insert(dev));
    Ok(())
}

impl Storage for DmaStorage {
    type File = DmaStorageFile;

    async fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    async fn open(&self, path: &Path, create: bool) -> io::Result<DmaStorageFile> {
        calibrate(path.parent().unwrap_or(Path::new("."))).await?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .dma_open(path)
            .await?;
        assert!(
            file.alignment() <= ALIGN,
            "device needs {}-byte alignment, more than Sluice's {ALIGN}",
            file.alignment()
        );
        Ok(DmaStorageFile {
            file,
            path: path.to_path_buf(),
            buffered: std::cell::OnceCell::new(),
        })
    }

    async fn remove(&self, path: &Path) -> io::Result<()> {
        Ok(glommio::io::remove(path).await?)
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        Ok(glommio::io::rename(from, to).await?)
    }

    async fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }

    async fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        // glommio opens a directory relative to no directory at all: give it an absolute path.
        let dir = std::path::absolute(dir)?;
        let d = glommio::io::Directory::open(&dir).await?;
        d.sync().await?;
        Ok(d.close().await?)
    }

    async fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    async fn modified_ms(&self, path: &Path) -> io::Result<Option<i64>> {
        // One stat of an inode already in the cache, at log open only.
        let modified = std::fs::metadata(path)?.modified()?;
        Ok(modified
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_millis() as i64))
    }
}
