//! The broker's log directories (`log.dirs`, Kafka's JBOD): which one holds a replica, and
//! which one a new replica goes to. Shared by every shard; each shard opens its own partitions'
//! logs in whichever directory holds them, so writes to different disks never wait on each
//! other.
//!
//! A replica lives in `<log dir>/<topic>-<partition>/`. A new one goes to an online directory
//! whose file system has the most usable bytes, give or take a tenth (directories on one file
//! system have the same), and among those to the one with the fewest replicas, then the first
//! in `log.dirs`. (Kafka places by fewest replicas alone; the space rule keeps a small disk from
//! filling first when the disks differ.) A storage error in a directory takes it offline
//! (`Shard::check_log_dirs`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

pub struct LogDir {
    /// As configured, made absolute (Kafka reports the absolute path).
    pub path: PathBuf,
    /// Its meta.properties' `directory.id`.
    pub id: String,
    /// Replicas in it: counted at start, counted up as replicas are placed, down as deleted.
    replicas: AtomicUsize,
    /// A storage error took it offline (Kafka's offline log directory): its replicas answer
    /// KAFKA_STORAGE_ERROR and no new replica goes there, until the broker restarts.
    offline: AtomicBool,
}

impl LogDir {
    pub fn is_offline(&self) -> bool {
        self.offline.load(Ordering::Acquire)
    }
}

pub struct LogDirs {
    dirs: Vec<LogDir>,
}

/// Whether a directory entry's name is a replica's (`<topic>-<partition>`); the metadata log's
/// own directory is not one.
fn is_replica_name(name: &str) -> bool {
    name != crate::config::METADATA_DIR
        && name.rsplit_once('-').is_some_and(|(topic, p)| {
            !topic.is_empty() && !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())
        })
}

fn count_replicas(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .filter(|e| is_replica_name(&e.file_name().to_string_lossy()) && e.path().is_dir())
            .count()
    })
}

/// The file system's identity and usable bytes (what an unprivileged writer may still use).
fn volume(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let device = std::fs::metadata(path).ok()?.dev();
    let (_, usable) = crate::metrics::volume_bytes(&path.to_string_lossy());
    (usable >= 0).then_some((device, usable as u64))
}

impl LogDirs {
    /// `paths` and their `ids` in `log.dirs` order.
    pub fn new(paths: &[PathBuf], ids: &[String]) -> LogDirs {
        let dirs = paths
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let path = std::path::absolute(p).unwrap_or_else(|_| p.clone());
                LogDir {
                    replicas: AtomicUsize::new(count_replicas(&path)),
                    offline: AtomicBool::new(false),
                    id: ids.get(i).cloned().unwrap_or_default(),
                    path,
                }
            })
            .collect();
        LogDirs { dirs }
    }

    pub fn dirs(&self) -> &[LogDir] {
        &self.dirs
    }

    /// The directory of replica `name` (`<topic>-<partition>`): where it is, else where a new
    /// one goes (counted as placed there). A replica found in two log directories is an error,
    /// as in Kafka: which copy is the log cannot be told. One in an offline directory is lost.
    pub fn locate(&self, name: &str) -> anyhow::Result<PathBuf> {
        if let Some(d) = self
            .dirs
            .iter()
            .find(|d| d.is_offline() && d.path.join(name).is_dir())
        {
            anyhow::bail!(
                "replica {name} is in the offline log directory {}",
                d.path.display()
            );
        }
        let found: Vec<PathBuf> = self
            .dirs
            .iter()
            .map(|d| d.path.join(name))
            .filter(|p| p.is_dir())
            .collect();
        match found.as_slice() {
            [one] => return Ok(one.clone()),
            [] => {}
            [first, second, ..] => anyhow::bail!(
                "replica {name} is in two log directories ({} and {}); remove the stale copy",
                first.display(),
                second.display()
            ),
        }
        let Some(chosen) = self.place() else {
            anyhow::bail!("no log directory is online to hold replica {name}");
        };
        self.dirs[chosen].replicas.fetch_add(1, Ordering::Relaxed);
        Ok(self.dirs[chosen].path.join(name))
    }

    /// The index of the directory a new replica goes to; `None` when every one is offline.
    /// Directories within a tenth of the most usable bytes count as equally roomy (a burst of
    /// new replicas is placed before their files take any space, so a strict "most bytes"
    /// would send the whole burst to one disk); among those, fewest replicas, then the first.
    fn place(&self) -> Option<usize> {
        let online: Vec<usize> = (0..self.dirs.len())
            .filter(|&i| !self.dirs[i].is_offline())
            .collect();
        if online.len() <= 1 {
            return online.first().copied();
        }
        // One statvfs per file system, so directories sharing one compare equal on space.
        let mut volumes: Vec<(u64, u64)> = Vec::new();
        let usable: Vec<u64> = self
            .dirs
            .iter()
            .map(|d| match volume(&d.path) {
                Some((device, usable)) => match volumes.iter().find(|(dev, _)| *dev == device) {
                    Some(&(_, first)) => first,
                    None => {
                        volumes.push((device, usable));
                        usable
                    }
                },
                None => 0,
            })
            .collect();
        let most = online.iter().map(|&i| usable[i]).max().unwrap_or(0);
        let roomy = |i: usize| usable[i] >= most - most / 10;
        online
            .into_iter()
            .filter(|&i| roomy(i))
            .min_by_key(|&i| (self.dirs[i].replicas.load(Ordering::Relaxed), i))
    }

    /// Takes log directory `i` offline; true if it was online.
    pub fn set_offline(&self, i: usize) -> bool {
        !self.dirs[i].offline.swap(true, Ordering::AcqRel)
    }

    /// The log directory holding the replica directory `replica_dir`.
    pub fn of(&self, replica_dir: &Path) -> Option<usize> {
        let parent = replica_dir.parent()?;
        self.dirs.iter().position(|d| d.path == parent)
    }

    /// A replica directory was deleted.
    pub fn removed(&self, replica_dir: &Path) {
        if let Some(i) = self.of(replica_dir) {
            let _ = self.dirs[i]
                .replicas
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_names() {
        assert!(is_replica_name("orders-0"));
        assert!(is_replica_name("a-b-12"));
        assert!(!is_replica_name("orders.0a1b-delete"));
        assert!(!is_replica_name("metadata"));
        assert!(!is_replica_name(crate::config::METADATA_DIR));
        assert!(!is_replica_name("orders-"));
        assert!(!is_replica_name("-3"));
    }

    /// Directories on one file system fill by fewest replicas, in order on a tie; a replica
    /// already on disk is found where it is; one in two directories is refused.
    #[test]
    fn one_file_system_by_replica_count() {
        let root = std::env::temp_dir().join(format!("sluice-logdirs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let paths: Vec<PathBuf> = ["a", "b", "c"].iter().map(|d| root.join(d)).collect();
        for p in &paths {
            std::fs::create_dir_all(p).unwrap();
        }
        std::fs::create_dir_all(paths[0].join("old-0")).unwrap();
        std::fs::create_dir_all(paths[0].join("old-1")).unwrap();
        std::fs::create_dir_all(paths[2].join("other-0")).unwrap();
        let dirs = LogDirs::new(&paths, &["x".into(), "y".into(), "z".into()]);
        assert_eq!(
            dirs.locate("old-1").unwrap(),
            dirs.dirs()[0].path.join("old-1")
        );
        // Counts 2, 0, 1: b; then b and c tie at 1, b first in order; then c; then all tie.
        let placed: Vec<usize> = (0..4)
            .map(|i| {
                let p = dirs.locate(&format!("t-{i}")).unwrap();
                std::fs::create_dir_all(&p).unwrap();
                dirs.of(&p).unwrap()
            })
            .collect();
        assert_eq!(placed, vec![1, 1, 2, 0]);
        std::fs::create_dir_all(paths[1].join("old-0")).unwrap();
        let err = dirs.locate("old-0").unwrap_err().to_string();
        assert!(err.contains("two log directories"), "{err}");
        dirs.removed(&dirs.dirs()[1].path.join("t-0"));
        assert_eq!(dirs.dirs()[1].replicas.load(Ordering::Relaxed), 1);
        // An offline directory takes no new replica, however few it holds.
        assert!(dirs.set_offline(1));
        assert!(!dirs.set_offline(1));
        let p = dirs.locate("t-9").unwrap();
        assert_ne!(dirs.of(&p), Some(1));
        dirs.set_offline(0);
        dirs.set_offline(2);
        let none = dirs.locate("t-10").unwrap_err().to_string();
        assert!(none.contains("no log directory is online"), "{none}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
