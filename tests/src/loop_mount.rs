//! A small, scratch ext4 filesystem on a loop device, for tests that must fill a disk for real.
//!
//! [`LoopMount::create`] makes an image file in a temporary directory, formats it and mounts it
//! with `mount -o loop` (which detaches the loop device again on unmount). Dropping the value
//! unmounts it, also while a failing test unwinds. It needs root and loop devices; where either
//! is missing, `create` says so with [`MountError::Unavailable`] so the test can skip.

use std::ffi::CString;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub struct LoopMount {
    mount_point: PathBuf,
    /// Holds the image and the mount point; removed after the unmount in `drop`.
    _dir: tempfile::TempDir,
}

#[derive(Debug)]
pub enum MountError {
    /// The machine cannot do it (not root, no loop devices, no mkfs.ext4): skip the test.
    Unavailable(String),
    /// It should have worked and did not.
    Failed(String),
}

impl fmt::Display for MountError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MountError::Unavailable(why) => write!(f, "unavailable: {why}"),
            MountError::Failed(why) => write!(f, "failed: {why}"),
        }
    }
}

fn run(command: &mut Command) -> Result<Output, String> {
    let output = command
        .output()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{command:?} exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(output)
}

impl LoopMount {
    /// Creates and mounts an ext4 filesystem of `size_bytes` (no blocks reserved for root, so
    /// root fills it like anyone else would).
    pub fn create(size_bytes: u64) -> Result<LoopMount, MountError> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(MountError::Unavailable("not running as root".into()));
        }
        if !Path::new("/dev/loop-control").exists() && !Path::new("/dev/loop0").exists() {
            return Err(MountError::Unavailable("no loop devices in /dev".into()));
        }
        let dir = tempfile::tempdir()
            .map_err(|e| MountError::Failed(format!("creating a temp dir: {e}")))?;
        let image = dir.path().join("fs.img");
        let mount_point = dir.path().join("mnt");
        std::fs::create_dir(&mount_point)
            .and_then(|()| std::fs::File::create(&image)?.set_len(size_bytes))
            .map_err(|e| MountError::Failed(format!("creating the image: {e}")))?;
        match Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0", "-b", "4096"])
            .arg(&image)
            .output()
        {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(MountError::Unavailable("mkfs.ext4 is not installed".into()));
            }
            Err(e) => return Err(MountError::Failed(format!("running mkfs.ext4: {e}"))),
            Ok(out) if !out.status.success() => {
                return Err(MountError::Failed(format!(
                    "mkfs.ext4 exited with {}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            Ok(_) => {}
        }
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mount_point))
        .map_err(MountError::Failed)?;
        Ok(LoopMount {
            mount_point,
            _dir: dir,
        })
    }

    pub fn path(&self) -> &Path {
        &self.mount_point
    }

    /// Bytes free on the filesystem.
    pub fn free_bytes(&self) -> u64 {
        free_bytes(&self.mount_point)
    }
}

/// Bytes free for an unprivileged writer on the filesystem holding `path`, as `df` says.
pub fn free_bytes(path: &Path) -> u64 {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("no NUL in path");
    // SAFETY: statvfs is plain old data, for which all zero bytes is a valid value.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is NUL-terminated and `stat` is writable for the whole call.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    assert_eq!(
        rc,
        0,
        "statvfs {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    stat.f_bavail as u64 * stat.f_frsize as u64
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        if let Err(e) = run(Command::new("umount").arg(&self.mount_point)) {
            // Something still holds a file open (a test that panicked mid-I/O): detach lazily,
            // so the filesystem and its loop device go away once it lets go.
            eprintln!("{e}; retrying with umount -l");
            if let Err(e) = run(Command::new("umount").arg("-l").arg(&self.mount_point)) {
                eprintln!("{e}; the scratch filesystem stays mounted");
            }
        }
    }
}
