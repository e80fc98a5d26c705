//! What a shard waits on, and for how long. Each wait that can hold a shard's work (a segment's
//! fdatasync, a job queued for another shard, a round trip to the controller, the reactor itself
//! running late) is timed with [`record`]; one of [`SLOW`] or more is counted and logged with its
//! cause, so that a pause names itself in the log and in the broker's `/metrics`.
//!
//! The tallies are process-wide relaxed atomics: a handful of adds per wait, no lock. Log lines
//! are limited to one per cause per second; the next one says how many slow waits it stands for.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A wait this long or longer is slow: logged and counted as such.
pub const SLOW: Duration = Duration::from_millis(100);

/// What a shard waited on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// A segment file's (or a checkpoint's) fdatasync.
    Fdatasync,
    /// A job sent to another shard, from its send until it starts there.
    CrossShardQueue,
    /// A round trip to the controller (AlterPartition, a block of producer ids).
    Controller,
    /// The shard's reactor running late: a timer that should have fired was not served, because
    /// a task ran without yielding, the thread got no CPU, or it slept in the kernel.
    Reactor,
}

impl Wait {
    pub const ALL: [Wait; 4] = [
        Wait::Fdatasync,
        Wait::CrossShardQueue,
        Wait::Controller,
        Wait::Reactor,
    ];

    /// The cause as metrics label it and the log names it.
    pub fn name(self) -> &'static str {
        match self {
            Wait::Fdatasync => "fdatasync",
            Wait::CrossShardQueue => "cross_shard_queue",
            Wait::Controller => "controller",
            Wait::Reactor => "reactor",
        }
    }
}

struct Tally {
    count: AtomicU64,
    slow: AtomicU64,
    total_us: AtomicU64,
    max_us: AtomicU64,
    /// Milliseconds since [`epoch`] of the last log line, and the slow waits since it.
    logged_ms: AtomicU64,
    unlogged: AtomicU64,
}

impl Tally {
    const fn new() -> Tally {
        Tally {
            count: AtomicU64::new(0),
            slow: AtomicU64::new(0),
            total_us: AtomicU64::new(0),
            max_us: AtomicU64::new(0),
            logged_ms: AtomicU64::new(0),
            unlogged: AtomicU64::new(0),
        }
    }
}

static TALLIES: [Tally; Wait::ALL.len()] = [const { Tally::new() }; Wait::ALL.len()];

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Records a wait of `took`. A slow one is counted and logged (at most once a second per cause)
/// with what `detail` says of it, and the name of the thread that waited. Returns whether it
/// was slow.
pub fn record(wait: Wait, took: Duration, detail: impl FnOnce() -> String) -> bool {
    let t = &TALLIES[wait as usize];
    let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
    t.count.fetch_add(1, Ordering::Relaxed);
    t.total_us.fetch_add(us, Ordering::Relaxed);
    t.max_us.fetch_max(us, Ordering::Relaxed);
    if took < SLOW {
        return false;
    }
    t.slow.fetch_add(1, Ordering::Relaxed);
    // 1 + so that the first slow wait of a cause is always logged.
    let now = 1 + u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX - 1);
    let last = t.logged_ms.load(Ordering::Relaxed);
    let due = last == 0 || now.saturating_sub(last) >= 1_000;
    if due
        && t.logged_ms
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        let also = t.unlogged.swap(0, Ordering::Relaxed);
        let detail = detail();
        let thread = std::thread::current();
        tracing::warn!(
            cause = wait.name(),
            ms = took.as_millis() as u64,
            thread = thread.name().unwrap_or("?"),
            unlogged_since_last = also,
            "slow wait: {detail}"
        );
    } else {
        t.unlogged.fetch_add(1, Ordering::Relaxed);
    }
    true
}

/// A cause's tallies since the process started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tallies {
    /// Waits timed.
    pub count: u64,
    /// Of those, the slow ones.
    pub slow: u64,
    pub total: Duration,
    pub max: Duration,
}

pub fn tallies(wait: Wait) -> Tallies {
    let t = &TALLIES[wait as usize];
    Tallies {
        count: t.count.load(Ordering::Relaxed),
        slow: t.slow.load(Ordering::Relaxed),
        total: Duration::from_micros(t.total_us.load(Ordering::Relaxed)),
        max: Duration::from_micros(t.max_us.load(Ordering::Relaxed)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_waits_are_counted_apart_and_the_maximum_kept() {
        // The tallies are process-wide: compare before and after.
        let before = tallies(Wait::Controller);
        assert!(!record(
            Wait::Controller,
            Duration::from_millis(3),
            || unreachable!()
        ));
        let mut described = 0;
        assert!(record(Wait::Controller, Duration::from_millis(250), || {
            described += 1;
            "a test's wait".to_string()
        }));
        // Within the second: counted, not logged again.
        assert!(record(Wait::Controller, Duration::from_millis(120), || {
            described += 1;
            String::new()
        }));
        let after = tallies(Wait::Controller);
        assert_eq!(after.count - before.count, 3);
        assert_eq!(after.slow - before.slow, 2);
        assert!(after.total - before.total >= Duration::from_millis(373));
        assert!(after.max >= Duration::from_millis(250));
        assert_eq!(
            described, 1,
            "the first slow wait is logged, the next within a second is not"
        );
    }
}
