//! Counters and latency histograms shared by the client threads and the reporter.
//!
//! Latencies are recorded in microseconds. Each `Meter` keeps a histogram for the current
//! measurement window and one for the current second; the reporter takes the second's every
//! second (the progress line and the plot) and the window's when a phase ends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latencies up to an hour, to three significant figures.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

#[derive(Default)]
struct Counts {
    messages: u64,
    bytes: u64,
}

struct Inner {
    window: Histogram<u64>,
    second: Histogram<u64>,
    window_counts: Counts,
    second_counts: Counts,
    total_messages: u64,
    errors: u64,
    first_error: Option<String>,
}

/// Messages, bytes and latencies of one kind of event (publish acknowledgements, or consumed
/// messages and their end-to-end latency).
pub struct Meter {
    inner: Mutex<Inner>,
}

/// What a meter saw in one second.
pub struct Second {
    pub messages: u64,
    pub bytes: u64,
    pub latency: Histogram<u64>,
}

impl Default for Meter {
    fn default() -> Self {
        Meter {
            inner: Mutex::new(Inner {
                window: histogram(),
                second: histogram(),
                window_counts: Counts::default(),
                second_counts: Counts::default(),
                total_messages: 0,
                errors: 0,
                first_error: None,
            }),
        }
    }
}

impl Meter {
    pub fn record(&self, bytes: usize, latency_us: u64) {
        let mut m = self.inner.lock().unwrap();
        let latency_us = latency_us.clamp(1, 3_600_000_000);
        // Never fails within the bounds above.
        let _ = m.window.record(latency_us);
        let _ = m.second.record(latency_us);
        m.window_counts.messages += 1;
        m.window_counts.bytes += bytes as u64;
        m.second_counts.messages += 1;
        m.second_counts.bytes += bytes as u64;
        m.total_messages += 1;
    }

    pub fn error(&self, what: impl FnOnce() -> String) {
        let mut m = self.inner.lock().unwrap();
        m.errors += 1;
        if m.first_error.is_none() {
            m.first_error = Some(what());
        }
    }

    /// Messages recorded since the start, in every phase.
    pub fn total(&self) -> u64 {
        self.inner.lock().unwrap().total_messages
    }

    pub fn errors(&self) -> (u64, Option<String>) {
        let m = self.inner.lock().unwrap();
        (m.errors, m.first_error.clone())
    }

    pub fn take_second(&self) -> Second {
        let mut m = self.inner.lock().unwrap();
        let latency = std::mem::replace(&mut m.second, histogram());
        let counts = std::mem::take(&mut m.second_counts);
        Second {
            messages: counts.messages,
            bytes: counts.bytes,
            latency,
        }
    }

    /// Ends the current window: returns its figures over `seconds` and starts a new one.
    pub fn take_window(&self, seconds: f64) -> Summary {
        let mut m = self.inner.lock().unwrap();
        let latency = std::mem::replace(&mut m.window, histogram());
        let counts = std::mem::take(&mut m.window_counts);
        Summary::new(counts.messages, counts.bytes, seconds, &latency)
    }
}

/// Rates and latency percentiles over a window.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub messages: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub msg_per_s: f64,
    pub mb_per_s: f64,
    pub latency_us: Percentiles,
}

impl Summary {
    pub fn new(messages: u64, bytes: u64, seconds: f64, latency: &Histogram<u64>) -> Summary {
        let seconds = seconds.max(1e-9);
        Summary {
            messages,
            bytes,
            seconds,
            msg_per_s: messages as f64 / seconds,
            mb_per_s: bytes as f64 / seconds / 1e6,
            latency_us: Percentiles::of(latency),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub mean: f64,
    pub p50: u64,
    pub p75: u64,
    pub p95: u64,
    pub p99: u64,
    pub p999: u64,
    pub p9999: u64,
    pub max: u64,
}

impl Percentiles {
    pub fn of(h: &Histogram<u64>) -> Percentiles {
        let q = |q: f64| {
            if h.is_empty() {
                0
            } else {
                h.value_at_quantile(q)
            }
        };
        Percentiles {
            count: h.len(),
            mean: if h.is_empty() { 0.0 } else { h.mean() },
            p50: q(0.50),
            p75: q(0.75),
            p95: q(0.95),
            p99: q(0.99),
            p999: q(0.999),
            p9999: q(0.9999),
            max: if h.is_empty() { 0 } else { h.max() },
        }
    }
}

/// The transactional producers' transactions: every commit with its latency (from the
/// `commit_transaction` call to its return, which includes flushing the transaction's records)
/// and its record count, every failed commit and every aborted transaction. Failures and aborts
/// count over the whole run: none is ever left out of the results.
#[derive(Default)]
pub struct Transactions {
    /// `messages` are committed transactions, `bytes` the records they held, the latency each
    /// commit's; `errors` are failed commit attempts (or a producer's failed set-up).
    commits: Meter,
    aborted: AtomicU64,
    aborted_records: AtomicU64,
}

impl Transactions {
    pub fn committed(&self, records: u64, latency_us: u64) {
        self.commits.record(records as usize, latency_us);
    }

    pub fn failed(&self, what: impl FnOnce() -> String) {
        self.commits.error(what);
    }

    /// A transaction ended by `abort_transaction`: its records are never read by a
    /// read_committed consumer.
    pub fn aborted(&self, records: u64) {
        self.aborted.fetch_add(1, Ordering::Relaxed);
        self.aborted_records.fetch_add(records, Ordering::Relaxed);
    }

    /// Failed commits (and producer set-ups) plus aborted transactions, over the run.
    pub fn failures(&self) -> u64 {
        self.commits.errors().0 + self.aborted.load(Ordering::Relaxed)
    }

    pub fn take_second(&self) -> Second {
        self.commits.take_second()
    }

    /// Ends the current window: its commits over `seconds`, with the run's failures so far.
    pub fn take_window(&self, seconds: f64) -> TransactionSummary {
        let w = self.commits.take_window(seconds);
        let (failed_commits, first_failure) = self.commits.errors();
        TransactionSummary {
            committed: w.messages,
            committed_per_s: w.msg_per_s,
            committed_records: w.bytes,
            records_per_transaction_mean: w.bytes as f64 / w.messages.max(1) as f64,
            commit_latency_us: w.latency_us,
            failed_commits,
            first_failure,
            aborted: self.aborted.load(Ordering::Relaxed),
            aborted_records: self.aborted_records.load(Ordering::Relaxed),
        }
    }
}

impl Transactions {
    /// Sets `s`'s failures and aborts to the run's totals so far (a window's summary is taken
    /// before the producers commit their last transactions).
    pub fn failures_so_far(&self, s: &mut TransactionSummary) {
        let (failed_commits, first_failure) = self.commits.errors();
        s.failed_commits = failed_commits;
        s.first_failure = first_failure;
        s.aborted = self.aborted.load(Ordering::Relaxed);
        s.aborted_records = self.aborted_records.load(Ordering::Relaxed);
    }
}

/// Transactions over a measured window; the failures and aborts over the whole run up to its end.
#[derive(Clone, Debug, Serialize)]
pub struct TransactionSummary {
    pub committed: u64,
    pub committed_per_s: f64,
    pub committed_records: u64,
    pub records_per_transaction_mean: f64,
    /// From `commit_transaction`'s call to its return.
    pub commit_latency_us: Percentiles,
    /// Commit attempts that returned an error (each retry counts), and producers whose
    /// `init_transactions` or `begin_transaction` failed.
    pub failed_commits: u64,
    pub first_failure: Option<String>,
    pub aborted: u64,
    pub aborted_records: u64,
}

/// The slowest consumer group's backlog over a window: messages acknowledged to the producers
/// and not yet read by that group, sampled once a second.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Backlog {
    /// When the window began.
    pub start: u64,
    /// At the window's last second: the lag at the end.
    pub end: u64,
    /// The largest sample, `start` included.
    pub max: u64,
}

impl Backlog {
    pub fn starting_at(messages: u64) -> Backlog {
        Backlog {
            start: messages,
            end: messages,
            max: messages,
        }
    }

    pub fn observe(&mut self, messages: u64) {
        self.end = messages;
        self.max = self.max.max(messages);
    }

    /// Messages per second by which the backlog grew over a window of `seconds` (negative: the
    /// consumers caught up on some of it).
    pub fn growth_per_s(&self, seconds: f64) -> f64 {
        (self.end as f64 - self.start as f64) / seconds.max(1e-9)
    }
}

/// Consumers read less than this fraction of what was published: they fell behind.
pub const KEEPING_UP_CONSUME_OVER_PUBLISH_MIN: f64 = 0.95;
/// A backlog at the window's end of more than this many seconds of publishing: behind.
pub const KEEPING_UP_BACKLOG_S_MAX: f64 = 1.0;

/// `1234567` as `1,234,567`.
pub fn group_digits(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `None` when the consumers kept pace with the producers over the window; otherwise why not,
/// in words, for the summary and the results (end-to-end latency then measures the backlog).
/// `consume_msg_per_s` is one group's (each group reads everything); `backlog` the slowest's.
pub fn falling_behind(
    publish_msg_per_s: f64,
    consume_msg_per_s: f64,
    backlog: &Backlog,
) -> Option<String> {
    let mut why = Vec::new();
    let ratio = consume_msg_per_s / publish_msg_per_s.max(1e-9);
    if publish_msg_per_s > 0.0 && ratio < KEEPING_UP_CONSUME_OVER_PUBLISH_MIN {
        why.push(format!("consumed {ratio:.2}x the publish rate"));
    }
    let seconds_of_publish = backlog.end as f64 / publish_msg_per_s.max(1e-9);
    if backlog.end > 0 && seconds_of_publish > KEEPING_UP_BACKLOG_S_MAX {
        why.push(format!(
            "{} messages unread at the end of the window ({seconds_of_publish:.1} s of publishing)",
            group_digits(backlog.end)
        ));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// One second of a run, for the results file and the plot.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    /// Seconds since the run started.
    pub t: f64,
    pub phase: &'static str,
    pub publish_msg_per_s: f64,
    pub publish_mb_per_s: f64,
    pub consume_msg_per_s: f64,
    pub consume_mb_per_s: f64,
    pub publish_p50_us: u64,
    pub publish_p99_us: u64,
    pub e2e_p50_us: u64,
    pub e2e_p99_us: u64,
    /// Messages produced but not yet consumed by the slowest group.
    pub backlog: u64,
    /// Transactions committed in the second, and their commit latency (transactional runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transactions_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit_p99_us: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_seconds_count_separately() {
        let m = Meter::default();
        for i in 1..=100 {
            m.record(1000, i);
        }
        let s = m.take_second();
        assert_eq!((s.messages, s.bytes, s.latency.len()), (100, 100_000, 100));
        m.record(10, 5000);
        let w = m.take_window(2.0);
        assert_eq!(w.messages, 101);
        assert_eq!(w.bytes, 100_010);
        assert_eq!(w.msg_per_s, 50.5);
        assert_eq!(w.latency_us.p50, 51);
        // Three significant figures: 5000 µs reads back as the top of its bucket.
        assert!(
            (5000..=5005).contains(&w.latency_us.max),
            "{}",
            w.latency_us.max
        );
        assert_eq!(m.total(), 101);
        assert_eq!(m.take_window(1.0).messages, 0);
        assert_eq!(m.take_second().messages, 1);
    }

    #[test]
    fn consume_summaries_report_both_rates() {
        let m = Meter::default();
        for _ in 0..3000 {
            m.record(1024, 2_000);
        }
        let c = m.take_window(3.0);
        assert_eq!(c.msg_per_s, 1000.0);
        assert!((c.mb_per_s - 1.024).abs() < 1e-9, "{}", c.mb_per_s);
        assert_eq!(c.latency_us.count, 3000);
    }

    #[test]
    fn the_backlog_keeps_its_start_end_and_peak() {
        let mut b = Backlog::starting_at(100);
        for v in [500, 2_000, 700] {
            b.observe(v);
        }
        assert_eq!(
            b,
            Backlog {
                start: 100,
                end: 700,
                max: 2_000
            }
        );
        assert_eq!(b.growth_per_s(10.0), 60.0);
        let mut b = Backlog::starting_at(5_000);
        b.observe(1_000);
        assert_eq!((b.end, b.max), (1_000, 5_000));
        assert_eq!(b.growth_per_s(2.0), -2_000.0);
    }

    #[test]
    fn consumers_that_keep_pace_are_not_behind() {
        let mut b = Backlog::starting_at(0);
        b.observe(300);
        assert_eq!(falling_behind(1_000.0, 970.0, &b), None);
        // Nothing published, nothing to keep up with.
        assert_eq!(falling_behind(0.0, 0.0, &Backlog::default()), None);
    }

    #[test]
    fn consumers_falling_behind_are_reported_with_the_reason() {
        let mut b = Backlog::starting_at(0);
        b.observe(50_000);
        let why = falling_behind(10_000.0, 5_000.0, &b).unwrap();
        assert_eq!(
            why,
            "consumed 0.50x the publish rate; 50,000 messages unread at the end of the window \
             (5.0 s of publishing)"
        );
        // Reading as fast as the producers, but still seconds behind from before the window.
        let mut b = Backlog::starting_at(90_000);
        b.observe(80_000);
        let why = falling_behind(30_000.0, 31_000.0, &b).unwrap();
        assert!(why.starts_with("80,000 messages unread"), "{why}");
    }

    #[test]
    fn transactions_count_commits_in_the_window_and_failures_over_the_run() {
        let t = Transactions::default();
        t.committed(100, 2_000);
        t.failed(|| "commit failed: the first".into());
        t.aborted(7);
        let w = t.take_window(1.0);
        assert_eq!((w.committed, w.committed_records), (1, 100));
        assert_eq!(w.records_per_transaction_mean, 100.0);
        assert_eq!(w.commit_latency_us.p50, 2_000);
        t.committed(300, 4_000);
        t.committed(100, 4_000);
        t.failed(|| "commit failed: the second".into());
        let w = t.take_window(2.0);
        assert_eq!((w.committed, w.committed_per_s), (2, 1.0));
        assert_eq!(w.records_per_transaction_mean, 200.0);
        // Failures are never windowed away.
        assert_eq!((w.failed_commits, w.aborted, w.aborted_records), (2, 1, 7));
        assert_eq!(w.first_failure.as_deref(), Some("commit failed: the first"));
        assert_eq!(t.failures(), 3);
    }

    #[test]
    fn digits_are_grouped_in_threes() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1_000), "1,000");
        assert_eq!(group_digits(1_234_567), "1,234,567");
    }
}
