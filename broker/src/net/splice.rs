//! Zero-copy fetch: record bytes go from a segment file to a client's socket by splice(2), file
//! to pipe and pipe to socket, without entering user space.
//!
//! glommio has no splice, so each shard keeps an io_uring of its own (the `io-uring` crate) for
//! it. The kernel always runs a splice on an io_uring worker thread, never on the shard's: a
//! read of pages not in the page cache, or a socket whose send buffer is full (glommio sockets
//! are blocking-mode, see DESIGN.md), blocks that worker while the shard goes on. The shard
//! learns of completions by polling the ring between its other tasks (a few tens of
//! microseconds apart at first, backing off to a quarter of a millisecond).
//!
//! Each chunk read from a segment first takes the shard's disk read turn, as a cold O_DIRECT read
//! does (`sluice_engine::storage::disk_read_turn`): at most one in flight, none while a
//! producer's fdatasync is. The turn ends when the chunk is in the pipe, before the socket end,
//! so a client that reads slowly holds up only its own connection.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use io_uring::{opcode, squeue, types, IoUring};
use sluice_engine::FileExtent;

/// Bytes a pipe holds, and so the most one splice moves: Linux's default `pipe-max-size`.
const PIPE_BYTES: i32 = 1 << 20;
/// Empty pipes a shard keeps for later transfers (two descriptors each).
const PIPES_KEPT: usize = 64;
/// Submission queue entries of a shard's splice ring; more transfers than this queue in user
/// space (each has at most one operation in flight).
const RING_ENTRIES: u32 = 64;
/// How often a waiting transfer looks for its completion: at first, and at most.
const POLL_FIRST: Duration = Duration::from_micros(20);
const POLL_MAX: Duration = Duration::from_micros(250);

thread_local! {
    static SPLICER: RefCell<Option<Rc<Splicer>>> = const { RefCell::new(None) };
}

/// What an operation in flight uses, kept open until its completion is reaped: the kernel
/// resolves descriptor numbers only when a worker picks the operation up.
type Keep = (Rc<Pipe>, Option<Arc<OwnedFd>>, Rc<OwnedFd>);

pub struct Splicer {
    ring: RefCell<IoUring>,
    next_id: Cell<u64>,
    in_flight: RefCell<HashMap<u64, Keep>>,
    done: RefCell<HashMap<u64, i32>>,
    /// Operations of transfers dropped midway: their results are not wanted.
    abandoned: RefCell<HashSet<u64>>,
    pipes: RefCell<Vec<Rc<Pipe>>>,
}

struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    bytes: u32,
}

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded: both descriptors are open and owned by nothing else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // A smaller pipe (the system's limit may be lower) only means more, smaller splices.
        // SAFETY: fcntl on a descriptor this function owns; no memory is passed.
        let bytes = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES) };
        let bytes = if bytes > 0 {
            bytes
        } else {
            // SAFETY: as above.
            unsafe { libc::fcntl(write.as_raw_fd(), libc::F_GETPIPE_SZ) }
        };
        if bytes <= 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Pipe {
            read,
            write,
            bytes: bytes as u32,
        })
    }
}

/// The shard's splicer, made on first use.
pub fn splicer() -> io::Result<Rc<Splicer>> {
    SPLICER.with(|s| {
        let mut s = s.borrow_mut();
        if let Some(splicer) = s.as_ref() {
            return Ok(splicer.clone());
        }
        let splicer = Rc::new(Splicer {
            ring: RefCell::new(IoUring::new(RING_ENTRIES)?),
            next_id: Cell::new(1),
            in_flight: RefCell::new(HashMap::new()),
            done: RefCell::new(HashMap::new()),
            abandoned: RefCell::new(HashSet::new()),
            pipes: RefCell::new(Vec::new()),
        });
        *s = Some(splicer.clone());
        Ok(splicer)
    })
}

/// A socket descriptor of a connection's own, for splicing: a duplicate, so the number stays
/// valid for operations in flight even after the connection's stream is closed.
pub fn socket_for_splice(fd: RawFd) -> io::Result<Rc<OwnedFd>> {
    // SAFETY: fcntl with no memory argument; a bad `fd` is an error return, not undefined.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `dup` is a new open descriptor that nothing else owns.
    Ok(Rc::new(unsafe { OwnedFd::from_raw_fd(dup) }))
}

impl Splicer {
    /// Sends the extent's bytes to `socket`; returns when all are in the socket's send buffer.
    pub async fn send(&self, socket: &Rc<OwnedFd>, extent: &FileExtent) -> io::Result<()> {
        let pipe = match self.pipes.borrow_mut().pop() {
            Some(p) => p,
            None => Rc::new(Pipe::new()?),
        };
        let mut transfer = Transfer {
            splicer: self,
            socket: socket.clone(),
            pending: Vec::new(),
        };
        let mut sent = 0u64;
        while sent < extent.len {
            let chunk = (extent.len - sent).min(pipe.bytes as u64) as u32;
            let turn = sluice_engine::storage::disk_read_turn().await;
            // The chunk's pages are read ahead in one go (read-ahead is otherwise off for
            // segment files), then spliced into the pipe.
            let fd = types::Fd(extent.fd.as_raw_fd());
            let position = extent.position + sent;
            let advise = opcode::Fadvise::new(fd, chunk as libc::off_t, libc::POSIX_FADV_WILLNEED)
                .offset(position)
                .build();
            let read = opcode::Splice::new(
                fd,
                position as i64,
                types::Fd(pipe.write.as_raw_fd()),
                -1,
                chunk,
            )
            .build();
            let keep = || (pipe.clone(), Some(extent.fd.clone()), socket.clone());
            let moved = transfer.run(vec![(advise, keep()), (read, keep())]).await;
            drop(turn);
            let mut in_pipe = match moved {
                n if n > 0 => n as u64,
                e if e == -libc::EINTR || e == -libc::EAGAIN => continue,
                0 => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "segment file ends before the extent being fetched",
                    ))
                }
                e => return Err(io::Error::from_raw_os_error(-e)),
            };
            while in_pipe > 0 {
                let write = opcode::Splice::new(
                    types::Fd(pipe.read.as_raw_fd()),
                    -1,
                    types::Fd(socket.as_raw_fd()),
                    -1,
                    in_pipe as u32,
                )
                .build();
                let keep = (pipe.clone(), None, socket.clone());
                match transfer.run(vec![(write, keep)]).await {
                    n if n > 0 => {
                        in_pipe -= n as u64;
                        sent += n as u64;
                    }
                    e if e == -libc::EINTR || e == -libc::EAGAIN => {}
                    0 => return Err(io::ErrorKind::WriteZero.into()),
                    e => return Err(io::Error::from_raw_os_error(-e)),
                }
            }
        }
        // The pipe is empty: the next transfer may use it.
        let mut pipes = self.pipes.borrow_mut();
        if pipes.len() < PIPES_KEPT {
            pipes.push(pipe);
        }
        Ok(())
    }

    /// Submits `entries` as one chain (each runs when the one before it has ended, whatever its
    /// result) and returns their ids.
    fn submit(&self, entries: Vec<(squeue::Entry, Keep)>) -> io::Result<Vec<u64>> {
        let mut ring = self.ring.borrow_mut();
        let count = entries.len();
        let mut ids = Vec::with_capacity(count);
        let mut chain = Vec::with_capacity(count);
        for (i, (entry, keep)) in entries.into_iter().enumerate() {
            let id = self.next_id.get();
            self.next_id.set(id + 1);
            // Always on a worker thread, whatever the kernel would guess.
            let mut flags = squeue::Flags::ASYNC;
            if i + 1 < count {
                flags |= squeue::Flags::IO_HARDLINK;
            }
            chain.push(entry.user_data(id).flags(flags));
            self.in_flight.borrow_mut().insert(id, keep);
            ids.push(id);
        }
        let room = {
            let queue = ring.submission();
            queue.capacity() - queue.len()
        };
        if room < count {
            ring.submit()?;
        }
        // Safety: each `keep` holds every descriptor its entry names open until it completes;
        // the queue has room for the whole chain (checked above; the ring is larger than any).
        unsafe { ring.submission().push_multiple(&chain) }
            .map_err(|_| io::Error::other("splice ring full"))?;
        ring.submit()?;
        Ok(ids)
    }

    /// Moves completions out of the ring.
    fn reap(&self) {
        let mut ring = self.ring.borrow_mut();
        for cqe in ring.completion() {
            let id = cqe.user_data();
            self.in_flight.borrow_mut().remove(&id);
            if !self.abandoned.borrow_mut().remove(&id) {
                self.done.borrow_mut().insert(id, cqe.result());
            }
        }
    }

    async fn wait(&self, id: u64) -> i32 {
        let mut pause = POLL_FIRST;
        loop {
            self.reap();
            if let Some(result) = self.done.borrow_mut().remove(&id) {
                return result;
            }
            glommio::timer::sleep(pause).await;
            pause = (pause * 2).min(POLL_MAX);
        }
    }
}

/// One extent on its way; dropped midway (its connection closing), it shuts the socket down so
/// an operation blocked on it ends, and leaves its pipe to be closed when that operation does.
struct Transfer<'a> {
    splicer: &'a Splicer,
    socket: Rc<OwnedFd>,
    /// Operations submitted whose results are not in yet: only while `run` awaits them, so
    /// only when the transfer is dropped midway.
    pending: Vec<u64>,
}

impl Transfer<'_> {
    /// Runs a chain of operations; returns the last one's result (a byte count, or minus an
    /// errno).
    async fn run(&mut self, chain: Vec<(squeue::Entry, Keep)>) -> i32 {
        let ids = match self.splicer.submit(chain) {
            Ok(ids) => ids,
            Err(e) => return -e.raw_os_error().unwrap_or(libc::EIO),
        };
        self.pending = ids.clone();
        let mut result = 0;
        for id in ids {
            result = self.splicer.wait(id).await;
            self.pending.retain(|&p| p != id);
        }
        result
    }
}

impl Drop for Transfer<'_> {
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            // SAFETY: shutdown on the connection's own open descriptor; no memory is passed.
            unsafe { libc::shutdown(self.socket.as_raw_fd(), libc::SHUT_RDWR) };
        }
        for &id in &self.pending {
            // Its result may be in already.
            if self.splicer.done.borrow_mut().remove(&id).is_none() {
                self.splicer.abandoned.borrow_mut().insert(id);
            }
        }
    }
}
