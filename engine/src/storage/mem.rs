//! In-memory storage for tests: models what a power loss keeps and injects failures.
//!
//! Each file has a `current` image (what reads see) and a `durable` image (what survives a
//! crash). `fdatasync` copies current to durable. [`MemStorage::crash`] throws away everything
//! that was not synced, optionally keeping a random subset of unsynced 512-byte sectors to model a
//! torn write. Namespace operations (create, rename, remove) are treated as durable at once; the
//! engine still calls `sync_dir` where a real filesystem needs it.
//!
//! Failures: `fail_after(n)` makes the n-th next data operation (write, sync, allocate, truncate)
//! return EIO; `set_capacity(bytes)` makes allocations beyond that total fail with ENOSPC.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use super::{Storage, StorageFile, ALIGN};

#[derive(Default)]
struct Node {
    current: Vec<u8>,
    durable: Vec<u8>,
}

#[derive(Default)]
struct Fs {
    files: BTreeMap<PathBuf, Rc<RefCell<Node>>>,
    dirs: std::collections::BTreeSet<PathBuf>,
}

/// A handle to the simulated disk. Each handle belongs to one "process": after
/// [`MemStorage::crash`], the old handle and every file opened through it fail all operations
/// with EIO, as a dead process can no longer write, and the returned handle sees the disk as
/// it survived.
#[derive(Clone, Default)]
pub struct MemStorage {
    generation: u64,
    current_generation: Rc<Cell<u64>>,
    fs: Rc<RefCell<Fs>>,
    fail_countdown: Rc<Cell<Option<u64>>>,
    fail_suffix: Rc<Cell<&'static str>>,
    capacity: Rc<Cell<Option<u64>>>,
    data_ops: Rc<Cell<u64>>,
}

/// What a simulated power loss keeps of the writes that were not synced.
#[derive(Clone, Copy, Debug)]
pub enum CrashMode {
    /// Nothing: every unsynced write is lost.
    DropUnsynced,
    /// A pseudo-random subset of the unsynced 512-byte sectors, chosen by the seed.
    TornSectors { seed: u64 },
}

impl MemStorage {
    pub fn new() -> MemStorage {
        MemStorage::default()
    }

    /// The next `n`-th data operation fails with EIO (n = 0: the very next one), once.
    pub fn fail_after(&self, n: u64) {
        self.fail_after_on(n, "");
    }

    /// As [`fail_after`](Self::fail_after), counting only operations on files whose name ends
    /// with `suffix` (e.g. `".log"` for segment files).
    pub fn fail_after_on(&self, n: u64, suffix: &'static str) {
        self.fail_suffix.set(suffix);
        self.fail_countdown.set(Some(n));
    }

    /// Total bytes of file contents the "disk" holds; growth beyond fails with ENOSPC.
    pub fn set_capacity(&self, bytes: Option<u64>) {
        self.capacity.set(bytes);
    }

    /// Number of data operations so far; lets a test pick a countdown inside a run.
    pub fn data_ops(&self) -> u64 {
        self.data_ops.get()
    }

    pub fn used_bytes(&self) -> u64 {
        let fs = self.fs.borrow();
        fs.files
            .values()
            .map(|n| n.borrow().current.len() as u64)
            .sum()
    }

    /// Simulates a power loss and returns the handle of the restarted process.
    pub fn crash(&self, mode: CrashMode) -> MemStorage {
        self.current_generation
            .set(self.current_generation.get() + 1);
        let restarted = MemStorage {
            generation: self.current_generation.get(),
            ..self.clone()
        };
        let fs = self.fs.borrow();
        let mut rng = match mode {
            CrashMode::DropUnsynced => 0,
            CrashMode::TornSectors { seed } => seed | 1,
        };
        for node in fs.files.values() {
            let mut node = node.borrow_mut();
            let Node { current, durable } = &mut *node;
            let mut survived = durable.clone();
            if let CrashMode::TornSectors { .. } = mode {
                // Keep the durable length, unless the current one is longer and a kept sector
                // extends it.
                let len = current.len();
                let mut sector = 0;
                while sector < len {
                    let end = (sector + 512).min(len);
                    let differs =
                        survived.len() < end || survived[sector..end] != current[sector..end];
                    if differs {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        if rng % 2 == 0 {
                            if survived.len() < end {
                                survived.resize(end, 0);
                            }
                            survived[sector..end].copy_from_slice(&current[sector..end]);
                        }
                    }
                    sector = end;
                }
            }
            *current = survived.clone();
            *durable = survived;
        }
        drop(fs);
        restarted
    }

    fn alive(&self) -> io::Result<()> {
        if self.generation == self.current_generation.get() {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(libc::EIO))
        }
    }

    /// Direct access to a file's current bytes, for tests that corrupt data on purpose.
    pub fn with_file_bytes<R>(&self, path: &Path, f: impl FnOnce(&mut Vec<u8>) -> R) -> Option<R> {
        let fs = self.fs.borrow();
        let node = fs.files.get(path)?;
        let mut node = node.borrow_mut();
        let r = f(&mut node.current);
        node.durable = node.current.clone();
        Some(r)
    }

    fn data_op(&self, path: &Path) -> io::Result<()> {
        self.alive()?;
        self.data_ops.set(self.data_ops.get() + 1);
        if !path.to_string_lossy().ends_with(self.fail_suffix.get()) {
            return Ok(());
        }
        match self.fail_countdown.get() {
            Some(0) => {
                self.fail_countdown.set(None);
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
            Some(n) => {
                self.fail_countdown.set(Some(n - 1));
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn check_growth(&self, node: &Node, new_len: u64) -> io::Result<()> {
        if let Some(capacity) = self.capacity.get() {
            let grow = new_len.saturating_sub(node.current.len() as u64);
            if grow > 0 && self.used_bytes() + grow > capacity {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
        }
        Ok(())
    }
}

pub struct MemFile {
    storage: MemStorage,
    path: PathBuf,
    node: Rc<RefCell<Node>>,
}

impl StorageFile for MemFile {
    type Buf = Vec<u8>;

    fn alloc_buf(&self, len: usize) -> Vec<u8> {
        assert_eq!(len as u64 % ALIGN, 0, "unaligned buffer length {len}");
        vec![0; len]
    }

    async fn write_at(&self, buf: Vec<u8>, pos: u64) -> io::Result<()> {
        // Device I/O completes later: let other tasks run meanwhile, as they would.
        futures_lite::future::yield_now().await;
        assert_eq!(pos % ALIGN, 0, "unaligned write position {pos}");
        assert_eq!(buf.len() as u64 % ALIGN, 0, "unaligned write length");
        self.storage.data_op(&self.path)?;
        let end = pos as usize + buf.len();
        {
            let node = self.node.borrow();
            self.storage.check_growth(&node, end as u64)?;
        }
        let mut node = self.node.borrow_mut();
        if node.current.len() < end {
            node.current.resize(end, 0);
        }
        node.current[pos as usize..end].copy_from_slice(&buf);
        Ok(())
    }

    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        self.storage.alive()?;
        let node = self.node.borrow();
        let start = (pos as usize).min(node.current.len());
        let end = (pos as usize).saturating_add(len).min(node.current.len());
        Ok(node.current[start..end].to_vec())
    }

    async fn fdatasync(&self) -> io::Result<()> {
        futures_lite::future::yield_now().await;
        self.storage.data_op(&self.path)?;
        let mut node = self.node.borrow_mut();
        node.durable = node.current.clone();
        Ok(())
    }

    async fn allocate(&self, len: u64) -> io::Result<()> {
        self.storage.data_op(&self.path)?;
        {
            let node = self.node.borrow();
            self.storage.check_growth(&node, len)?;
        }
        let mut node = self.node.borrow_mut();
        if (node.current.len() as u64) < len {
            node.current.resize(len as usize, 0);
        }
        Ok(())
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        self.storage.data_op(&self.path)?;
        {
            let node = self.node.borrow();
            self.storage.check_growth(&node, len)?;
        }
        let mut node = self.node.borrow_mut();
        node.current.resize(len as usize, 0);
        Ok(())
    }

    async fn size(&self) -> io::Result<u64> {
        Ok(self.node.borrow().current.len() as u64)
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} not found", path.display()),
    )
}

impl Storage for MemStorage {
    type File = MemFile;

    async fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.alive()?;
        self.fs.borrow_mut().dirs.insert(dir.to_path_buf());
        Ok(())
    }

    async fn open(&self, path: &Path, create: bool) -> io::Result<MemFile> {
        self.alive()?;
        let mut fs = self.fs.borrow_mut();
        let node = match fs.files.get(path) {
            Some(node) => node.clone(),
            None if create => {
                let node = Rc::new(RefCell::new(Node::default()));
                fs.files.insert(path.to_path_buf(), node.clone());
                node
            }
            None => return Err(not_found(path)),
        };
        Ok(MemFile {
            storage: self.clone(),
            path: path.to_path_buf(),
            node,
        })
    }

    async fn remove(&self, path: &Path) -> io::Result<()> {
        self.alive()?;
        match self.fs.borrow_mut().files.remove(path) {
            Some(_) => Ok(()),
            None => Err(not_found(path)),
        }
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.alive()?;
        let mut fs = self.fs.borrow_mut();
        let node = fs.files.remove(from).ok_or_else(|| not_found(from))?;
        fs.files.insert(to.to_path_buf(), node);
        Ok(())
    }

    async fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.alive()?;
        let fs = self.fs.borrow();
        Ok(fs
            .files
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect())
    }

    async fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        self.alive()?;
        Ok(())
    }

    async fn exists(&self, path: &Path) -> bool {
        self.fs.borrow().files.contains_key(path)
    }

    /// The simulated disk keeps no times: a log opened on it takes its clock's "now" instead.
    async fn modified_ms(&self, _path: &Path) -> io::Result<Option<i64>> {
        Ok(None)
    }
}
