//! Moving a replica to another log directory online (AlterReplicaLogDirs), as Kafka's future
//! replica does: a copy in the destination (`<topic>-<partition>.<id>-future`) catches up while
//! the replica keeps serving, then the two swap in a short pause.
//!
//! Catching up copies the files that no longer change (sealed segments with their indexes, and
//! producer snapshots), again and again, each pass only what is new or changed since the last,
//! until a pass finds little left; the active segment is rolled before the last pass so the
//! pause has little to copy. The pause: the replica steps down to no role (its requests get
//! retriable errors, as during a leader move), its log is closed cleanly, every file that
//! differs from its copy is copied again, the copy is made durable, the old directory is
//! renamed away (`-delete`) and the copy takes the replica's name, and the log is opened there
//! and takes the role the metadata gives it.
//!
//! A file counts as unchanged while its inode, length and modification time are those it had
//! when it was copied (compaction replaces a segment with a new file, truncation changes its
//! length and time). A crash between the two renames leaves the copy, complete and durable, as
//! the only `-future` of a replica with no directory: the start finishes the swap
//! ([`recover`]). A crash before leaves the old replica whole and the copy is deleted.
//! Copies run on the blocking thread pool, never on the shard's reactor.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use sluice_engine::{Clock, DmaStorage, Log};

use super::partition::Partition;
use super::Shard;

/// A pass that copied less than this ends the catch-up.
const CAUGHT_UP_BYTES: u64 = 4 << 20;
/// At most this many catch-up passes before the pause, however busy the replica.
const MAX_PASSES: usize = 20;

/// A move in progress on the replica's owner shard.
pub struct Move {
    /// The destination's index in `log.dirs`.
    pub dest: usize,
    pub future_dir: PathBuf,
    /// Bytes copied so far (DescribeLogDirs reports them as the future replica's size).
    pub copied_bytes: Cell<u64>,
    /// The end offset of what the copy holds, as far as whole segments go.
    pub copied_end: Cell<i64>,
    /// Another destination was asked for: this move gives up and deletes its copy.
    pub cancelled: Cell<bool>,
    /// The replica is in the swap's pause: produces wait for `swapped` rather than be refused.
    pub pausing: Cell<bool>,
    pub swapped: event_listener::Event,
}

/// The most a produce waits for a swap's pause to end before it goes on (and is refused).
const PAUSE_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// Ends the pause however the swap ends: the waiting produces go on.
struct PauseGuard<'a>(&'a Move);

impl Drop for PauseGuard<'_> {
    fn drop(&mut self) {
        self.0.pausing.set(false);
        self.0.swapped.notify(usize::MAX);
    }
}

/// Waits while replica `(topic, partition)` of this shard is in a move's pause, so that a
/// produce arriving then is appended to the log in its new place instead of being refused
/// (which costs a client a metadata refresh and a retry backoff).
pub async fn wait_out_pause(shard: &Shard, topic: &str, partition: i32) {
    // On every produce: nothing to allocate or look up while no replica of the shard moves.
    if shard.moves.borrow().is_empty() {
        return;
    }
    let key = (topic.to_string(), partition);
    let Some(mv) = shard.moves.borrow().get(&key).cloned() else {
        return;
    };
    let deadline = std::time::Instant::now() + PAUSE_WAIT_MAX;
    loop {
        let listener = mv.swapped.listen();
        let now = std::time::Instant::now();
        if !mv.pausing.get() || now >= deadline {
            return;
        }
        futures_lite::future::or(listener, glommio::timer::sleep(deadline - now)).await;
    }
}

/// The moves of a shard's replicas, by (topic, partition).
pub type Moves = RefCell<HashMap<(String, i32), Rc<Move>>>;

/// What a copied file was when copied.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct FileId {
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

fn file_id(meta: &std::fs::Metadata) -> FileId {
    use std::os::unix::fs::MetadataExt;
    FileId {
        ino: meta.ino(),
        len: meta.len(),
        mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
    }
}

/// The base offset a log file's name starts with (`<offset:020>.<ext>`), if it has one.
fn base_of(name: &str) -> Option<i64> {
    let (stem, ext) = name.split_once('.')?;
    matches!(ext, "log" | "index" | "timeindex" | "snapshot")
        .then(|| stem.parse().ok())
        .flatten()
}

/// Kafka's `replica.alter.log.dirs.io.max.bytes.per.second`: the bytes per second all of a
/// broker's replica moves may copy while catching up (the pause's last pass is not held back).
/// One bucket for the process, holding at most a second of the rate.
pub struct MoveThrottle {
    bucket: std::sync::Mutex<(f64, std::time::Instant)>,
}

impl Default for MoveThrottle {
    fn default() -> Self {
        MoveThrottle {
            bucket: std::sync::Mutex::new((0.0, std::time::Instant::now())),
        }
    }
}

impl MoveThrottle {
    /// Takes `bytes` at `rate` bytes per second; how long the copier waits before going on.
    fn take(&self, bytes: u64, rate: f64) -> std::time::Duration {
        let mut b = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        b.0 = (b.0 + rate * now.duration_since(b.1).as_secs_f64()).min(rate);
        b.1 = now;
        b.0 -= bytes as f64;
        if b.0 >= 0.0 {
            std::time::Duration::ZERO
        } else {
            std::time::Duration::from_secs_f64(-b.0 / rate)
        }
    }
}

/// Copies `from` to `to` in chunks of 1 MiB, holding to `rate` (bytes per second) through
/// `throttle` when one is given; returns the bytes copied.
fn copy_file(
    from: &Path,
    to: &Path,
    throttle: Option<(&MoveThrottle, f64)>,
) -> std::io::Result<u64> {
    use std::io::{Read, Write};
    let Some((throttle, rate)) = throttle else {
        return std::fs::copy(from, to);
    };
    let mut src = std::fs::File::open(from)?;
    let mut dst = std::fs::File::create(to)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0;
    loop {
        let n = src.read(&mut buf)?;
        if n == 0 {
            return Ok(total);
        }
        dst.write_all(&buf[..n])?;
        total += n as u64;
        std::thread::sleep(throttle.take(n as u64, rate));
    }
}

/// One pass of copying `source` into `future`, returning the bytes copied. While the log is
/// open (`below` = the active segment's base offset), only files of sealed segments and
/// snapshots below it, at most at the throttle's rate; with the log closed (`None`), every
/// file, and files the source no longer has are deleted from the copy. Every file copied is
/// synced as it is copied, and the copy's directory at the end of the closing pass.
fn copy_pass(
    source: &Path,
    future: &Path,
    copied: &mut HashMap<String, FileId>,
    below: Option<i64>,
    throttle: Option<(&MoveThrottle, f64)>,
) -> std::io::Result<u64> {
    let mut bytes = 0;
    let mut present = std::collections::HashSet::new();
    for entry in std::fs::read_dir(source)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") || name.ends_with(".cleaned") {
            continue;
        }
        match below {
            Some(active) if base_of(&name).is_none_or(|base| base >= active) => continue,
            _ => {}
        }
        let meta = match entry.metadata() {
            Ok(m) if m.is_file() => m,
            Ok(_) => continue,
            // Retention or compaction took it since the listing.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        present.insert(name.clone());
        let id = file_id(&meta);
        if copied.get(&name) == Some(&id) {
            continue;
        }
        match copy_file(&entry.path(), &future.join(&name), throttle) {
            Ok(n) => bytes += n,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && below.is_some() => continue,
            Err(e) => return Err(e),
        }
        // Made durable now, while the replica still serves, so that the pause syncs only what
        // it copies itself.
        std::fs::File::open(future.join(&name))?.sync_all()?;
        copied.insert(name, id);
    }
    if below.is_none() {
        for entry in std::fs::read_dir(future)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !present.contains(&name) {
                std::fs::remove_file(entry.path())?;
            }
        }
        std::fs::File::open(future)?.sync_all()?;
    }
    Ok(bytes)
}

/// Runs `f` on the blocking thread pool.
async fn blocking<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    glommio::executor().spawn_blocking(f).await
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// At start, before any replica opens: finishes swaps a crash interrupted and deletes copies
/// of moves that never reached theirs, and the old directories swaps left behind.
pub fn recover(log_dirs: &[PathBuf]) -> anyhow::Result<()> {
    let mut futures: Vec<(String, PathBuf)> = Vec::new();
    let mut trash: Vec<PathBuf> = Vec::new();
    for dir in log_dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(rest) = name.strip_suffix("-future") {
                if let Some((replica, _)) = rest.rsplit_once('.') {
                    futures.push((replica.to_string(), entry.path()));
                }
            } else if name.ends_with("-delete") && entry.path().is_dir() {
                trash.push(entry.path());
            }
        }
    }
    for (replica, future) in futures {
        let exists = log_dirs.iter().any(|d| d.join(&replica).is_dir());
        if exists {
            std::fs::remove_dir_all(&future)?;
            tracing::info!(future = %future.display(), "deleted the copy of a replica move that did not finish");
        } else {
            let target = future.with_file_name(&replica);
            std::fs::rename(&future, &target)?;
            sync_dir(target.parent().unwrap_or(Path::new(".")))?;
            tracing::info!(replica = %target.display(), "finished a replica move a stop interrupted");
        }
    }
    for dir in trash {
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "could not delete an old replica directory");
        }
    }
    Ok(())
}

/// `replica.alter.log.dirs.io.max.bytes.per.second` (a dynamic config of this broker or the
/// cluster default, as `kafka-reassign-partitions --replica-alter-log-dirs-throttle` sets it),
/// if one is set.
fn throttle_rate(shard: &Shard) -> Option<f64> {
    let image = shard.image();
    let (value, _) = image.dynamic_broker_config(
        shard.config().node_id,
        "replica.alter.log.dirs.io.max.bytes.per.second",
    )?;
    value.parse::<f64>().ok().filter(|r| *r > 0.0)
}

/// A pass while the log is open: the files below its active segment. Returns the bytes copied.
async fn catch_up_pass(
    shard: &Shard,
    part: &Partition,
    source: &Path,
    future: &Path,
    copied: &mut HashMap<String, FileId>,
    mv: &Move,
) -> anyhow::Result<u64> {
    let active = part.log.segments_info().last().map_or(0, |s| s.0 .0);
    let mut taken = std::mem::take(copied);
    let (source2, future2) = (source.to_path_buf(), future.to_path_buf());
    let rate = throttle_rate(shard);
    let shared = shard.shared.clone();
    let (bytes, back) = blocking(move || {
        let throttle = rate.map(|r| (&shared.move_throttle, r));
        let bytes = copy_pass(&source2, &future2, &mut taken, Some(active), throttle);
        (bytes, taken)
    })
    .await;
    *copied = back;
    let bytes = bytes?;
    mv.copied_bytes.set(mv.copied_bytes.get() + bytes);
    let whole = part
        .log
        .segments_info()
        .iter()
        .filter(|s| copied.contains_key(&format!("{:020}.log", s.0 .0)))
        .map(|s| s.2 .0)
        .max();
    if let Some(end) = whole {
        mv.copied_end.set(end);
    }
    Ok(bytes)
}

impl Shard {
    /// Starts moving replica `(topic, partition)` of this shard to log directory `dest`, or
    /// notes that it is there already. The error code otherwise: REPLICA_NOT_AVAILABLE when
    /// this shard has no such replica (not opened yet), KAFKA_STORAGE_ERROR when it is offline.
    pub fn start_replica_move(
        self: &Rc<Self>,
        topic: &str,
        partition: i32,
        dest: usize,
    ) -> Result<(), i16> {
        use kafka_protocol::ResponseError;
        let Some(part) = self.partition(topic, partition) else {
            return Err(ResponseError::ReplicaNotAvailable.code());
        };
        if part.log.poisoned().is_some() {
            return Err(ResponseError::KafkaStorageError.code());
        }
        let key = (topic.to_string(), partition);
        if let Some(running) = self.moves.borrow().get(&key) {
            if running.dest == dest {
                return Ok(());
            }
            running.cancelled.set(true);
        }
        if self.shared.log_dirs.of(part.log.dir()) == Some(dest) {
            self.moves.borrow_mut().remove(&key);
            return Ok(());
        }
        let name = format!("{topic}-{partition}");
        let future_dir = self.shared.log_dirs.dirs()[dest]
            .path
            .join(format!("{name}.{}-future", uuid::Uuid::new_v4().simple()));
        let mv = Rc::new(Move {
            dest,
            future_dir,
            copied_bytes: Cell::new(0),
            copied_end: Cell::new(part.log.log_start_offset().0),
            cancelled: Cell::new(false),
            pausing: Cell::new(false),
            swapped: event_listener::Event::new(),
        });
        self.moves.borrow_mut().insert(key.clone(), mv.clone());
        tracing::info!(topic, partition, to = %self.shared.log_dirs.dirs()[dest].path.display(), "moving a replica to another log directory");
        let shard = self.clone();
        glommio::spawn_local(async move {
            let started = std::time::Instant::now();
            let outcome = shard.run_move(&key, &part, &mv).await;
            let future = mv.future_dir.clone();
            if !matches!(outcome, Ok(true)) {
                let _ = blocking(move || std::fs::remove_dir_all(future)).await;
            }
            match outcome {
                Ok(true) => tracing::info!(topic = %key.0, partition = key.1, bytes = mv.copied_bytes.get(), elapsed_ms = started.elapsed().as_millis() as u64, "moved a replica to another log directory"),
                Ok(false) => tracing::info!(topic = %key.0, partition = key.1, "a replica move was given up (another destination, or the replica left)"),
                Err(e) => tracing::warn!(topic = %key.0, partition = key.1, error = %e, "a replica move failed; the replica stays where it was"),
            }
            let mut moves = shard.moves.borrow_mut();
            if moves.get(&key).is_some_and(|m| Rc::ptr_eq(m, &mv)) {
                moves.remove(&key);
            }
        })
        .detach();
        Ok(())
    }

    /// Whether `part` is still this shard's replica of `key`.
    fn still_hosts(&self, key: &(String, i32), part: &Rc<Partition>) -> bool {
        self.partitions
            .borrow()
            .get(key)
            .is_some_and(|p| Rc::ptr_eq(p, part))
    }

    /// Catches the copy up, then swaps; Ok(false) when given up.
    async fn run_move(
        self: &Rc<Self>,
        key: &(String, i32),
        part: &Rc<Partition>,
        mv: &Rc<Move>,
    ) -> anyhow::Result<bool> {
        let source = part.log.dir().to_path_buf();
        let future = mv.future_dir.clone();
        blocking({
            let future = future.clone();
            move || std::fs::create_dir_all(future)
        })
        .await?;
        let mut copied: HashMap<String, FileId> = HashMap::new();
        for pass in 1.. {
            if mv.cancelled.get() || !self.still_hosts(key, part) {
                return Ok(false);
            }
            let bytes = catch_up_pass(self, part, &source, &future, &mut copied, mv).await?;
            if bytes < CAUGHT_UP_BYTES || pass >= MAX_PASSES {
                break;
            }
        }
        // Seal what the active segment holds, so that it is copied now rather than in the
        // pause.
        part.log.roll().await?;
        catch_up_pass(self, part, &source, &future, &mut copied, mv).await?;
        if mv.cancelled.get() || !self.still_hosts(key, part) {
            return Ok(false);
        }
        // The pause.
        let paused = std::time::Instant::now();
        mv.pausing.set(true);
        let _pause = PauseGuard(mv);
        part.stop_replica();
        self.leave_coordination(key, part);
        let closed = part.log.close().await;
        let swapped = match closed {
            Ok(()) => {
                let name = format!("{}-{}", key.0, key.1);
                let target = self.shared.log_dirs.dirs()[mv.dest].path.join(&name);
                let trash = source
                    .with_file_name(format!("{name}.{}-delete", uuid::Uuid::new_v4().simple()));
                let (source2, future2, target2, trash2) = (
                    source.clone(),
                    future.clone(),
                    target.clone(),
                    trash.clone(),
                );
                let result = blocking(move || -> std::io::Result<u64> {
                    let bytes = copy_pass(&source2, &future2, &mut copied, None, None)?;
                    std::fs::rename(&source2, &trash2)?;
                    sync_dir(source2.parent().unwrap_or(Path::new(".")))?;
                    std::fs::rename(&future2, &target2)?;
                    sync_dir(target2.parent().unwrap_or(Path::new(".")))?;
                    let _ = std::fs::remove_dir_all(&trash2);
                    Ok(bytes)
                })
                .await;
                match result {
                    Ok(bytes) => {
                        mv.copied_bytes.set(mv.copied_bytes.get() + bytes);
                        Ok(target)
                    }
                    Err(e) => {
                        // Put the old directory back if it was renamed away.
                        if !source.exists() && trash.exists() {
                            let _ = std::fs::rename(&trash, &source);
                        }
                        Err(anyhow::anyhow!("copying and swapping: {e}"))
                    }
                }
            }
            Err(e) => Err(anyhow::anyhow!("closing the log before the swap: {e}")),
        };
        // Open the replica wherever it is now, whatever happened.
        let dir = match &swapped {
            Ok(target) => target.clone(),
            Err(_) => source.clone(),
        };
        self.reopen(key, part, dir).await?;
        let pause_ms = paused.elapsed().as_millis() as u64;
        tracing::info!(topic = %key.0, partition = key.1, pause_ms, "replica paused for the swap");
        swapped.map(|_| true)
    }

    /// An internal topic's coordinator (groups, transactions, share state) of a replica that
    /// stepped down unloads, so that the reopened replica loads it again from its log.
    fn leave_coordination(self: &Rc<Self>, key: &(String, i32), part: &Rc<Partition>) {
        let index = key.1;
        match key.0.as_str() {
            crate::group::offsets_topic::OFFSETS_TOPIC => self.on_offsets_leadership(index, part),
            crate::txn::TRANSACTION_STATE_TOPIC => super::txn::on_leadership(self, index, part),
            crate::share::coordinator::SHARE_STATE_TOPIC => {
                super::share_state::on_leadership(self, index, part)
            }
            _ => {}
        }
    }

    /// Opens the replica's log from `dir` in place of `old` (closed), if `old` is still this
    /// shard's replica, and gives it its role.
    async fn reopen(
        self: &Rc<Self>,
        key: &(String, i32),
        old: &Rc<Partition>,
        dir: PathBuf,
    ) -> anyhow::Result<()> {
        let image = self.image();
        let Some(topic) = image.topics.get(&key.0) else {
            return Ok(());
        };
        let config = crate::metadata::log_config(
            &image.effective_topic_configs(self.config().node_id, topic),
        )
        .map_err(anyhow::Error::msg)?;
        let log = Log::open(
            DmaStorage::new(),
            dir,
            config,
            self.cache.clone(),
            Clock::System,
        )
        .await?;
        if !self.still_hosts(key, old) {
            // Deleted meanwhile: the deletion found the old directory gone; this one goes too.
            let dir = log.dir().to_path_buf();
            let _ = log.close().await;
            drop(log);
            let _ = blocking(move || std::fs::remove_dir_all(dir)).await;
            return Ok(());
        }
        let partition = Rc::new(Partition::new(log, self.shared.metrics.clone()));
        self.partitions.borrow_mut().insert(key.clone(), partition);
        self.update_roles(&image);
        self.notify_appended();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bucket holds at most a second of the rate; taking beyond it waits for the rest.
    #[test]
    fn the_throttle_waits_for_what_was_taken_beyond_the_rate() {
        let t = MoveThrottle::default();
        let wait = t.take(3_000, 1_000.0);
        assert!(wait > std::time::Duration::from_millis(2_900), "{wait:?}");
        assert!(wait <= std::time::Duration::from_secs(3), "{wait:?}");
    }

    #[test]
    fn base_offsets_of_log_files() {
        assert_eq!(base_of("00000000000000000042.log"), Some(42));
        assert_eq!(base_of("00000000000000000042.timeindex"), Some(42));
        assert_eq!(base_of("00000000000000000007.snapshot"), Some(7));
        assert_eq!(base_of("leader-epoch-checkpoint"), None);
        assert_eq!(base_of("00000000000000000042.log.cleaned"), None);
    }

    /// Passes copy what is new or changed; the closing pass copies the rest, drops what the
    /// source lost, and leaves an exact copy.
    #[test]
    fn passes_converge_on_an_exact_copy() {
        let root = std::env::temp_dir().join(format!("sluice-move-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (src, dst) = (root.join("t-0"), root.join("t-0.x-future"));
        std::fs::create_dir_all(&src).unwrap();
        std::fs::create_dir_all(&dst).unwrap();
        let write = |name: &str, data: &[u8]| std::fs::write(src.join(name), data).unwrap();
        write("00000000000000000000.log", &[1; 5000]);
        write("00000000000000000000.index", &[2; 16]);
        write("00000000000000000010.log", &[3; 100]);
        write("leader-epoch-checkpoint", b"0\n1\n0 0\n");
        let mut copied = HashMap::new();
        assert_eq!(
            copy_pass(&src, &dst, &mut copied, Some(10), None).unwrap(),
            5016
        );
        assert_eq!(
            copy_pass(&src, &dst, &mut copied, Some(10), None).unwrap(),
            0
        );
        // Truncated and grown; a segment deleted by retention.
        std::thread::sleep(std::time::Duration::from_millis(5));
        write("00000000000000000000.index", &[9; 8]);
        write("00000000000000000010.log", &[4; 300]);
        std::fs::remove_file(src.join("00000000000000000000.log")).unwrap();
        let n = copy_pass(&src, &dst, &mut copied, None, None).unwrap();
        assert_eq!(n, 8 + 300 + 8);
        let list = |d: &Path| {
            let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(d)
                .unwrap()
                .flatten()
                .map(|e| {
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        std::fs::read(e.path()).unwrap(),
                    )
                })
                .collect();
            v.sort();
            v
        };
        assert_eq!(list(&src), list(&dst));
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// A copy left as the only trace of its replica takes its name; one beside its replica is
    /// deleted; old directories are deleted.
    #[test]
    fn recovery_finishes_or_drops_swaps() {
        let root = std::env::temp_dir().join(format!("sluice-move-rec-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (a, b) = (root.join("a"), root.join("b"));
        for d in [
            "a/t-0.old-delete",
            "b/t-0.f1-future",
            "a/u-1",
            "b/u-1.f2-future",
        ] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("b/t-0.f1-future/00000000000000000000.log"), b"x").unwrap();
        recover(&[a.clone(), b.clone()]).unwrap();
        assert!(b.join("t-0/00000000000000000000.log").is_file());
        assert!(!a.join("t-0.old-delete").exists());
        assert!(a.join("u-1").is_dir());
        assert!(!b.join("u-1.f2-future").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
