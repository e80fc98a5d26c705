//! `sluice-bench`: an OpenMessaging-Benchmark-style load generator for any Kafka-compatible
//! broker. It is a librdkafka client (the `rdkafka` crate) and depends on none of Sluice's own
//! crates, so that runs against Sluice and against Apache Kafka are measured the same way.
//!
//! A run: create the workload's topics; when the workload has a backlog, fill it at full speed,
//! then measure the producers alone ("baseline") and the producers while the consumer groups
//! read the backlog from the beginning ("catch-up"); otherwise warm up, then measure producers
//! and consumers together ("measure"): publish and consume rates, end-to-end latency and the
//! slowest group's backlog. With `find_sustainable_rate`, short probes at fixed rates follow,
//! each on fresh topics, to find the highest rate the consumers keep up with
//! (`sustainable.rs`). Every second a progress line; at the end a summary, the results JSON and
//! an SVG plot in `--out`.

mod clients;
mod payload;
mod plot;
mod stats;
mod sustainable;
mod workload;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde::Serialize;

use clients::{consumer_config, producer_config, spawn_consumer, spawn_producer, ProducerPlan};
use stats::{
    falling_behind, group_digits, Backlog, Meter, Point, Summary, TransactionSummary, Transactions,
};
use sustainable::{Criteria, Outcome, Probe, Search, Step};
use workload::{Cli, Workload};

/// How long the producers wait for the consumer groups to be assigned their partitions.
const ASSIGNMENT_WAIT_S_MAX: f64 = 30.0;

fn main() {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("sluice-bench: {e:#}");
            std::process::exit(2);
        }
    }
}

#[derive(Serialize)]
struct CatchUp {
    backlog_bytes: u64,
    backlog_messages: u64,
    /// From the consumers' start until the slowest group's lag was within a second of produce.
    seconds: Option<f64>,
    /// Publish figures of the producers alone, then while the consumers caught up.
    publish_before: Summary,
    publish_during: Summary,
    /// publish p99 during catch-up over publish p99 before.
    publish_p99_ratio: f64,
    consume_during: Summary,
}

#[derive(Serialize)]
struct Errors {
    publish: u64,
    first_publish_error: Option<String>,
    consume: u64,
    first_consume_error: Option<String>,
}

/// The maximum-sustainable-rate search: its bounds, every probe, and its answer.
#[derive(Serialize)]
struct Discovery {
    criteria: Criteria,
    search: Search,
    probe_warmup_s: f64,
    probe_duration_s: f64,
    /// The maximum-rate run judged as a probe whose target was what it published.
    max_run: Probe,
    probes: Vec<Probe>,
    /// The highest rate that passed, as its run measured it; `None` when none did.
    sustainable: Option<Outcome>,
    /// "max-rate run" or "probe <n>" (from 1).
    sustainable_from: Option<String>,
    /// The lowest probed target above it that failed: the answer lies below this.
    failed_above_msg_per_s: Option<f64>,
    /// When no rate passed: the lowest one probed and why it failed.
    none_because: Option<String>,
    /// Wall time of the probes.
    seconds: f64,
}

#[derive(Serialize)]
struct Results<'a> {
    tool: &'static str,
    label: &'a str,
    bootstrap: &'a str,
    started_unix_s: u64,
    workload: &'a Workload,
    topics: &'a [String],
    /// The measured window: "measure" without a backlog, "baseline" with one.
    publish: Summary,
    /// Consumption in the measured window over all groups: rates, and end-to-end latency (from
    /// the send time in the payload to the consumer's poll), whether or not the consumers kept
    /// up. `None` with a backlog (see `catch_up`).
    consume: Option<Summary>,
    /// A transactional workload's transactions: commits in the measured window with their
    /// latency; failed commits and aborted transactions over the whole run (probes included).
    transactions: Option<TransactionSummary>,
    /// One group's consume rate over the publish rate in the window (1: kept pace).
    consume_over_publish: Option<f64>,
    /// The slowest group's backlog over the window, in messages (times `message_size` for bytes).
    backlog: Option<Backlog>,
    backlog_growth_msg_per_s: Option<f64>,
    /// Why the consumers count as behind the producers over the window, when they do: their
    /// end-to-end latency then measures their backlog more than the broker's latency.
    consumer_behind: Option<String>,
    catch_up: Option<CatchUp>,
    errors: Errors,
    /// Produced messages the slowest group had not read `drain_s_max` after the producers
    /// stopped.
    unread_at_end: u64,
    sustainable: Option<Discovery>,
    series: Vec<Point>,
}

/// The per-second clock of a run: prints the progress line and keeps the series.
struct Reporter {
    start: Instant,
    next: Duration,
    publish: Arc<Meter>,
    consume: Arc<Meter>,
    /// A transactional workload's commits.
    transactions: Option<Arc<Transactions>>,
    series: Vec<Point>,
}

impl Reporter {
    /// Starts the next second now, throwing away what the meters saw since the last tick (time
    /// spent setting up, which no point should average over).
    fn resync(&mut self) {
        self.next = self.start.elapsed();
        self.publish.take_second();
        self.consume.take_second();
        if let Some(t) = &self.transactions {
            t.take_second();
        }
    }

    /// Sleeps to the next whole second of the run and records it; returns the backlog sampled.
    fn tick(&mut self, phase: &'static str, backlog: &dyn Fn() -> u64) -> u64 {
        let previous = self.next;
        self.next += Duration::from_secs(1);
        match self.next.checked_sub(self.start.elapsed()) {
            Some(wait) => std::thread::sleep(wait),
            // Late (the reporter was held up): this point covers everything since the last.
            None => self.next = self.start.elapsed(),
        }
        let seconds = (self.next - previous).as_secs_f64();
        let backlog = backlog();
        let p = self.publish.take_second();
        let c = self.consume.take_second();
        let t = self.transactions.as_ref().map(|t| t.take_second());
        let q = |h: &hdrhistogram::Histogram<u64>, q: f64| {
            if h.is_empty() {
                0
            } else {
                h.value_at_quantile(q)
            }
        };
        let point = Point {
            t: self.next.as_secs_f64(),
            phase,
            publish_msg_per_s: p.messages as f64 / seconds,
            publish_mb_per_s: p.bytes as f64 / 1e6 / seconds,
            consume_msg_per_s: c.messages as f64 / seconds,
            consume_mb_per_s: c.bytes as f64 / 1e6 / seconds,
            publish_p50_us: q(&p.latency, 0.5),
            publish_p99_us: q(&p.latency, 0.99),
            e2e_p50_us: q(&c.latency, 0.5),
            e2e_p99_us: q(&c.latency, 0.99),
            backlog,
            transactions_per_s: t.as_ref().map(|t| t.messages as f64 / seconds),
            commit_p99_us: t.as_ref().map(|t| q(&t.latency, 0.99)),
        };
        let transactions = match (point.transactions_per_s, point.commit_p99_us) {
            (Some(per_s), Some(p99)) => format!(" | txn {per_s:>5.0}/s commit p99 {}", ms(p99)),
            _ => String::new(),
        };
        eprintln!(
            "[{:>4.0}s {:<8}] publish {:>9} msg/s {:>7.1} MB/s p50 {} p99 {} | consume {:>9} msg/s {:>7.1} MB/s e2e p50 {} p99 {} | backlog {}{}",
            point.t,
            phase,
            group_digits(point.publish_msg_per_s as u64),
            point.publish_mb_per_s,
            ms(point.publish_p50_us),
            ms(point.publish_p99_us),
            group_digits(point.consume_msg_per_s as u64),
            point.consume_mb_per_s,
            ms(point.e2e_p50_us),
            ms(point.e2e_p99_us),
            group_digits(backlog),
            transactions,
        );
        self.series.push(point);
        backlog
    }
}

/// One set of topics with its producers and consumer groups: the main run, or one probe.
struct Session<'a> {
    bootstrap: &'a str,
    w: &'a Workload,
    /// Topic and group names start with it.
    prefix: String,
    topics: Arc<Vec<String>>,
    publish: Arc<Meter>,
    consume: Arc<Meter>,
    transactions: Arc<Transactions>,
    /// Messages read by each group.
    groups: Vec<Arc<AtomicU64>>,
    /// Partitions assigned to each consumer, by group.
    assigned: Vec<Vec<Arc<AtomicU64>>>,
    /// Messages written before the measured producers started (the backlog workload's).
    backlog_messages: u64,
    /// The publish meter's total when this session began (earlier sessions' messages).
    published_before: u64,
    stop_producers: Arc<AtomicBool>,
    stop_consumers: Arc<AtomicBool>,
    producers: Vec<JoinHandle<()>>,
    consumers: Vec<JoinHandle<()>>,
}

impl<'a> Session<'a> {
    /// Creates the session's topics and waits until every partition has a leader.
    fn create(
        bootstrap: &'a str,
        w: &'a Workload,
        prefix: String,
        publish: &Arc<Meter>,
        consume: &Arc<Meter>,
        transactions: &Arc<Transactions>,
    ) -> anyhow::Result<Session<'a>> {
        let topics: Vec<String> = (0..w.topics).map(|i| format!("{prefix}-{i}")).collect();
        create_topics(bootstrap, &topics, w)?;
        Ok(Session {
            bootstrap,
            w,
            prefix,
            topics: Arc::new(topics),
            publish: publish.clone(),
            consume: consume.clone(),
            transactions: transactions.clone(),
            groups: (0..w.consumer_groups)
                .map(|_| Arc::new(AtomicU64::new(0)))
                .collect(),
            assigned: Vec::new(),
            backlog_messages: 0,
            published_before: publish.total(),
            stop_producers: Arc::new(AtomicBool::new(false)),
            stop_consumers: Arc::new(AtomicBool::new(false)),
            producers: Vec::new(),
            consumers: Vec::new(),
        })
    }

    fn start_consumers(&mut self) -> anyhow::Result<()> {
        for (g, consumed) in self.groups.iter().enumerate() {
            let group = format!("{}-group-{g}", self.prefix);
            let mut assigned = Vec::new();
            for c in 0..self.w.consumers_per_group {
                let count = Arc::new(AtomicU64::new(0));
                self.consumers.push(spawn_consumer(
                    format!("consumer-{g}-{c}"),
                    consumer_config(self.bootstrap, &group, self.w),
                    self.topics.clone(),
                    self.consume.clone(),
                    consumed.clone(),
                    count.clone(),
                    self.stop_consumers.clone(),
                )?);
                assigned.push(count);
            }
            self.assigned.push(assigned);
        }
        Ok(())
    }

    /// Waits (at most `ASSIGNMENT_WAIT_S_MAX`) until every group has every partition assigned to
    /// one of its consumers, so that a short run does not spend its window on the group's join.
    fn wait_for_assignment(&self) {
        let partitions = self.w.topics as u64 * self.w.partitions as u64;
        let start = Instant::now();
        let complete = || {
            self.assigned.iter().all(|group| {
                group.iter().map(|c| c.load(Ordering::Relaxed)).sum::<u64>() == partitions
            })
        };
        while !complete() {
            if start.elapsed().as_secs_f64() > ASSIGNMENT_WAIT_S_MAX {
                eprintln!(
                    "sluice-bench: the consumer groups do not have all {partitions} partitions \
                     assigned after {ASSIGNMENT_WAIT_S_MAX} s; starting the producers anyway"
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The measured producers, at `rate` messages per second over all of them (0: maximum).
    fn start_producers(&mut self, rate: u64) -> anyhow::Result<()> {
        for index in 0..self.w.producers {
            let plan = ProducerPlan {
                index,
                topics: self.topics.clone(),
                rate: rate as f64 / self.w.producers as f64,
                limit_bytes: None,
                // Unique per run (the prefix holds the run's id) and per probe.
                transactional_id: self
                    .w
                    .transactional
                    .then(|| format!("{}-txn-{index}", self.prefix)),
            };
            self.producers.push(spawn_producer(
                plan,
                producer_config(self.bootstrap, self.w),
                self.w,
                self.publish.clone(),
                self.transactions.clone(),
                self.stop_producers.clone(),
            )?);
        }
        Ok(())
    }

    /// Messages acknowledged to the producers and not yet read by the slowest group.
    fn backlog(&self) -> u64 {
        let produced = self.backlog_messages + self.publish.total() - self.published_before;
        let slowest = self
            .groups
            .iter()
            .map(|g| g.load(Ordering::Relaxed))
            .min()
            .unwrap_or(produced);
        produced.saturating_sub(slowest)
    }

    /// Stops the producers; each flushes what it has queued.
    fn stop_producers(&mut self) {
        self.stop_producers.store(true, Ordering::Relaxed);
        join_all(std::mem::take(&mut self.producers));
    }

    /// Lets the consumers read the rest for at most `drain`, stops them and deletes the topics
    /// (unless kept). Returns the slowest group's backlog at the end (0 without consumers).
    fn finish(mut self, drain: Duration, keep_topics: bool) -> u64 {
        self.stop_producers();
        let deadline = Instant::now() + drain;
        while !self.consumers.is_empty() && self.backlog() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let unread = if self.consumers.is_empty() {
            0
        } else {
            self.backlog()
        };
        self.stop_consumers.store(true, Ordering::Relaxed);
        join_all(std::mem::take(&mut self.consumers));
        if !keep_topics {
            if let Err(e) = delete_topics(self.bootstrap, &self.topics, self.w) {
                eprintln!("sluice-bench: {e:#}");
            }
        }
        unread
    }
}

/// What a measured window saw.
struct Measured {
    seconds: f64,
    publish: Summary,
    /// Over all groups; `None` when the window had no consumers.
    consume: Option<Summary>,
    /// A transactional workload's commits in the window.
    transactions: Option<TransactionSummary>,
    backlog: Backlog,
}

impl Measured {
    /// One group's consume rate (each group reads everything).
    fn consume_per_group(&self, groups: u32) -> Option<(f64, f64)> {
        let c = self.consume.as_ref()?;
        let groups = groups.max(1) as f64;
        Some((c.msg_per_s / groups, c.mb_per_s / groups))
    }

    fn outcome(&self, w: &Workload, target_msg_per_s: f64, errors: u64) -> Outcome {
        let (consume_msg_per_s, consume_mb_per_s) = self
            .consume_per_group(w.consumer_groups)
            .unwrap_or_default();
        Outcome {
            target_msg_per_s,
            publish_msg_per_s: self.publish.msg_per_s,
            publish_mb_per_s: self.publish.mb_per_s,
            consume_msg_per_s,
            consume_mb_per_s,
            e2e_p99_us: self.consume.as_ref().map_or(0, |c| c.latency_us.p99),
            backlog_end: self.backlog.end,
            errors,
        }
    }
}

/// Whole seconds of a phase: none for 0, otherwise at least one.
fn ticks(seconds: f64) -> u64 {
    if seconds > 0.0 {
        seconds.round().max(1.0) as u64
    } else {
        0
    }
}

/// Warms up for `warmup_s` (figures thrown away), then measures `duration_s`.
fn measure(
    reporter: &mut Reporter,
    session: &Session,
    phases: (&'static str, &'static str),
    warmup_s: f64,
    duration_s: f64,
    with_consumers: bool,
) -> Measured {
    let backlog = || session.backlog();
    for _ in 0..ticks(warmup_s) {
        reporter.tick(phases.0, &backlog);
    }
    session.publish.take_window(1.0);
    session.consume.take_window(1.0);
    session.transactions.take_window(1.0);
    let mut track = Backlog::starting_at(backlog());
    let start = Instant::now();
    for _ in 0..ticks(duration_s).max(1) {
        track.observe(reporter.tick(phases.1, &backlog));
    }
    let seconds = start.elapsed().as_secs_f64();
    Measured {
        seconds,
        publish: session.publish.take_window(seconds),
        consume: with_consumers.then(|| session.consume.take_window(seconds)),
        transactions: session
            .w
            .transactional
            .then(|| session.transactions.take_window(seconds)),
        backlog: track,
    }
}

/// Failed deliveries and consumes, failed commits and aborted transactions, so far.
fn error_count(publish: &Meter, consume: &Meter, transactions: &Transactions) -> u64 {
    publish.errors().0 + consume.errors().0 + transactions.failures()
}

/// The search for the maximum sustainable rate, after the maximum-rate run `main`.
#[allow(clippy::too_many_arguments)]
fn discover(
    cli: &Cli,
    w: &Workload,
    prefix: &str,
    main: &Measured,
    main_errors: u64,
    publish: &Arc<Meter>,
    consume: &Arc<Meter>,
    transactions: &Arc<Transactions>,
    reporter: &mut Reporter,
) -> anyhow::Result<Discovery> {
    let criteria = Criteria {
        e2e_p99_us_max: (w.sustainable_e2e_p99_ms_max * 1000.0) as u64,
        consume_over_publish_min: w.sustainable_consume_over_publish_min,
        publish_over_target_min: sustainable::PUBLISH_OVER_TARGET_MIN,
    };
    let search = Search {
        probe_count_max: w.probe_count_max,
        resolution: w.probe_resolution,
    };
    let started = Instant::now();
    let max_run = criteria.judge(main.outcome(w, main.publish.msg_per_s, main_errors));
    eprintln!(
        "sluice-bench: sustainable-rate search: the max-rate run {}",
        verdict(&max_run)
    );
    let mut probes: Vec<Probe> = Vec::new();
    while let Step::Probe(rate) = sustainable::next_step(&max_run, &probes, &search) {
        let n = probes.len() + 1;
        eprintln!(
            "sluice-bench: probe {n} (of at most {}) at {} msg/s ({:.1} MB/s)",
            search.probe_count_max,
            group_digits(rate as u64),
            rate * w.message_size as f64 / 1e6
        );
        let errors_before = error_count(publish, consume, transactions);
        let mut session = Session::create(
            &cli.bootstrap,
            w,
            format!("{prefix}-p{n}"),
            publish,
            consume,
            transactions,
        )?;
        session.start_consumers()?;
        session.wait_for_assignment();
        session.start_producers(rate as u64)?;
        reporter.resync();
        let m = measure(
            reporter,
            &session,
            ("probe-warmup", "probe"),
            w.probe_warmup_s,
            w.probe_duration_s,
            true,
        );
        // A probe's verdict is in; what its consumers still owe is not worth waiting for.
        session.finish(Duration::ZERO, cli.keep_topics);
        let errors = error_count(publish, consume, transactions) - errors_before;
        let probe = criteria.judge(m.outcome(w, rate, errors));
        eprintln!("sluice-bench: probe {n} {}", verdict(&probe));
        probes.push(probe);
    }
    let (best, above) = sustainable::conclude(&max_run, &probes);
    let sustainable_from = best.map(|b| match probes.iter().position(|p| std::ptr::eq(p, b)) {
        Some(i) => format!("probe {}", i + 1),
        None => "max-rate run".to_string(),
    });
    let none_because = match best {
        Some(_) => None,
        None => {
            let lowest = probes
                .iter()
                .min_by(|a, b| {
                    a.outcome
                        .target_msg_per_s
                        .total_cmp(&b.outcome.target_msg_per_s)
                })
                .unwrap_or(&max_run);
            Some(format!(
                "no rate passed; the lowest, {} msg/s: {}",
                group_digits(lowest.outcome.target_msg_per_s as u64),
                lowest.failed_because.join(", ")
            ))
        }
    };
    let sustainable = best.map(|b| b.outcome.clone());
    let failed_above_msg_per_s = above.map(|a| a.outcome.target_msg_per_s);
    Ok(Discovery {
        sustainable,
        sustainable_from,
        failed_above_msg_per_s,
        none_because,
        criteria,
        search,
        probe_warmup_s: w.probe_warmup_s,
        probe_duration_s: w.probe_duration_s,
        seconds: started.elapsed().as_secs_f64(),
        max_run,
        probes,
    })
}

fn verdict(p: &Probe) -> String {
    let o = &p.outcome;
    let figures = format!(
        "published {} msg/s ({:.1} MB/s), consumed {} msg/s ({:.1} MB/s), e2e p99 {}",
        group_digits(o.publish_msg_per_s as u64),
        o.publish_mb_per_s,
        group_digits(o.consume_msg_per_s as u64),
        o.consume_mb_per_s,
        ms(o.e2e_p99_us)
    );
    if p.passed {
        format!("passed: {figures}")
    } else {
        format!("failed ({}): {figures}", p.failed_because.join(", "))
    }
}

fn ms(us: u64) -> String {
    format!("{:.2} ms", us as f64 / 1000.0)
}

fn admin(bootstrap: &str, w: &Workload) -> anyhow::Result<AdminClient<DefaultClientContext>> {
    clients::client(bootstrap, w)
        .create()
        .context("creating an admin client")
}

fn create_topics(bootstrap: &str, topics: &[String], w: &Workload) -> anyhow::Result<()> {
    let admin = admin(bootstrap, w)?;
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|t| {
            let mut topic = NewTopic::new(
                t,
                w.partitions as i32,
                TopicReplication::Fixed(w.replication_factor as i32),
            );
            for (k, v) in &w.topic_config {
                topic = topic.set(k, v);
            }
            topic
        })
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(60)));
    let results = futures_lite::future::block_on(admin.create_topics(&new, &options))
        .context("CreateTopics")?;
    for result in results {
        if let Err((topic, code)) = result {
            bail!("creating topic {topic}: {code}");
        }
    }
    // Wait until metadata shows every partition with a leader.
    let probe: BaseConsumer = clients::client(bootstrap, w).create()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    for topic in topics {
        loop {
            let ready = probe
                .fetch_metadata(Some(topic), Duration::from_secs(5))
                .ok()
                .and_then(|m| {
                    let t = m.topics().first()?;
                    Some(
                        t.error().is_none()
                            && t.partitions().len() == w.partitions as usize
                            && t.partitions().iter().all(|p| p.leader() >= 0),
                    )
                })
                .unwrap_or(false);
            if ready {
                break;
            }
            if Instant::now() > deadline {
                bail!("topic {topic} has no leader for every partition after 60 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

fn delete_topics(bootstrap: &str, topics: &[String], w: &Workload) -> anyhow::Result<()> {
    let admin = admin(bootstrap, w)?;
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(60)));
    for result in futures_lite::future::block_on(admin.delete_topics(&names, &options))? {
        if let Err((topic, code)) = result {
            bail!("deleting topic {topic}: {code}");
        }
    }
    Ok(())
}

/// `sync`, then drop clean pages, dentries and inodes: a cold backlog for a page-cache broker too.
fn drop_caches() {
    let synced = std::process::Command::new("sync").status();
    match (synced, std::fs::write("/proc/sys/vm/drop_caches", "3")) {
        (Ok(status), Ok(())) if status.success() => eprintln!("sluice-bench: page cache dropped"),
        (_, result) => eprintln!("sluice-bench: could not drop the page cache: {result:?}"),
    }
}

fn join_all(handles: Vec<JoinHandle<()>>) {
    for h in handles {
        if h.join().is_err() {
            eprintln!("sluice-bench: a client thread panicked");
        }
    }
}

fn run(cli: &Cli) -> anyhow::Result<bool> {
    let w = cli.workload()?;
    let bootstrap = cli.bootstrap.as_str();
    let started_unix_s = payload::now_ns() / 1_000_000_000;
    let run_id = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
    let prefix = format!("{}-{run_id}", w.name);
    eprintln!(
        "sluice-bench: {} against {bootstrap}: {} topic(s) x {} partitions (replication factor {}), {} B messages, {} producer(s) at {}, {} group(s) x {} consumer(s), acks={} compression={}{}{}{}",
        w.name,
        w.topics,
        w.partitions,
        w.replication_factor,
        w.message_size,
        w.producers,
        if w.rate == 0 { "max rate".to_string() } else { format!("{} msg/s", w.rate) },
        w.consumer_groups,
        w.consumers_per_group,
        w.acks,
        w.compression,
        if w.backlog_bytes > 0 { format!(", backlog {} MiB", w.backlog_bytes >> 20) } else { String::new() },
        if w.transactional {
            format!(
                ", transactional (commit after {} records or {} ms; 0 = no bound), read_committed",
                w.records_per_transaction, w.transaction_interval_ms
            )
        } else {
            String::new()
        },
        if w.find_sustainable_rate {
            format!(
                ", then at most {} probes of {} + {} s for the sustainable rate",
                w.probe_count_max, w.probe_warmup_s, w.probe_duration_s
            )
        } else {
            String::new()
        },
    );

    let publish = Arc::new(Meter::default());
    let consume = Arc::new(Meter::default());
    let transactions = Arc::new(Transactions::default());
    let mut session = Session::create(
        bootstrap,
        &w,
        prefix.clone(),
        &publish,
        &consume,
        &transactions,
    )?;
    let topics: Vec<String> = session.topics.to_vec();
    let mut reporter = Reporter {
        start: Instant::now(),
        next: Duration::ZERO,
        publish: publish.clone(),
        consume: consume.clone(),
        transactions: w.transactional.then(|| transactions.clone()),
        series: Vec::new(),
    };

    // The backlog, at full speed, by its own producers.
    if w.backlog_bytes > 0 {
        session.backlog_messages = fill_backlog(bootstrap, &w, &session.topics)?;
        // Before anything is measured: writing back a host's dirty pages can stall every disk
        // user for seconds.
        if cli.drop_caches_before_catch_up {
            drop_caches();
        }
        reporter.start = Instant::now();
    } else {
        session.start_consumers()?;
        session.wait_for_assignment();
    }
    session.start_producers(w.rate)?;

    let measured_phase = if w.backlog_bytes == 0 {
        "measure"
    } else {
        "baseline"
    };
    let with_consumers = w.backlog_bytes == 0 && w.consumer_groups > 0;
    let measured = measure(
        &mut reporter,
        &session,
        ("warmup", measured_phase),
        w.warmup_s,
        w.duration_s,
        with_consumers,
    );

    let catch_up = if w.backlog_bytes > 0 {
        consume.take_window(1.0);
        session.start_consumers()?;
        let start = Instant::now();
        // Caught up: the slowest group is within a second of production (or 1,000 messages).
        let tolerance = (w.rate).max(1000);
        let mut caught_up = None;
        while caught_up.is_none() && start.elapsed().as_secs_f64() < w.catch_up_timeout_s {
            if reporter.tick("catch-up", &|| session.backlog()) <= tolerance {
                caught_up = Some(start.elapsed().as_secs_f64());
            }
        }
        let elapsed = start.elapsed().as_secs_f64();
        let during = publish.take_window(elapsed);
        let ratio = during.latency_us.p99 as f64 / measured.publish.latency_us.p99.max(1) as f64;
        Some(CatchUp {
            backlog_bytes: w.backlog_bytes,
            backlog_messages: session.backlog_messages,
            seconds: caught_up,
            publish_before: measured.publish.clone(),
            publish_during: during,
            publish_p99_ratio: ratio,
            consume_during: consume.take_window(elapsed),
        })
    } else {
        None
    };

    let unread = session.finish(Duration::from_secs_f64(w.drain_s_max), cli.keep_topics);
    let main_errors = error_count(&publish, &consume, &transactions);
    let discovery = if w.find_sustainable_rate {
        Some(discover(
            cli,
            &w,
            &prefix,
            &measured,
            main_errors,
            &publish,
            &consume,
            &transactions,
            &mut reporter,
        )?)
    } else {
        None
    };

    let per_group = measured.consume_per_group(w.consumer_groups);
    let consume_over_publish = per_group.map(|(msg, _)| msg / measured.publish.msg_per_s.max(1e-9));
    let consumer_behind = per_group
        .and_then(|(msg, _)| falling_behind(measured.publish.msg_per_s, msg, &measured.backlog));
    let (publish_errors, first_publish_error) = publish.errors();
    let (consume_errors, first_consume_error) = consume.errors();
    // The window's commits, with every failure of the run: the last commits came after it.
    let transaction_summary = measured.transactions.clone().map(|mut s| {
        transactions.failures_so_far(&mut s);
        s
    });
    let transaction_failures = transactions.failures();
    let results = Results {
        tool: "sluice-bench",
        label: &cli.label,
        bootstrap,
        started_unix_s,
        workload: &w,
        topics: &topics,
        publish: measured.publish.clone(),
        consume: measured.consume.clone(),
        transactions: transaction_summary,
        consume_over_publish,
        backlog: with_consumers.then_some(measured.backlog),
        backlog_growth_msg_per_s: with_consumers
            .then(|| measured.backlog.growth_per_s(measured.seconds)),
        consumer_behind,
        catch_up,
        errors: Errors {
            publish: publish_errors,
            first_publish_error,
            consume: consume_errors,
            first_consume_error,
        },
        unread_at_end: unread,
        sustainable: discovery,
        series: reporter.series,
    };
    print_summary(&results);

    std::fs::create_dir_all(&cli.out).with_context(|| format!("creating {}", cli.out.display()))?;
    let json = cli.out.join(format!("{}.json", w.name));
    std::fs::write(&json, serde_json::to_string_pretty(&results)?)
        .with_context(|| format!("writing {}", json.display()))?;
    let title = if cli.label.is_empty() {
        w.name.clone()
    } else {
        format!("{}: {}", w.name, cli.label)
    };
    let svg = cli.out.join(format!("{}.svg", w.name));
    std::fs::write(&svg, plot::svg(&title, &results.series))
        .with_context(|| format!("writing {}", svg.display()))?;
    eprintln!(
        "sluice-bench: wrote {} and {}",
        json.display(),
        svg.display()
    );

    if unread > 0 {
        eprintln!(
            "sluice-bench: the consumers were {unread} messages behind {} s after the producers \
             stopped: their end-to-end latency measures that backlog",
            w.drain_s_max
        );
    }
    if transaction_failures > 0 {
        eprintln!(
            "sluice-bench: {transaction_failures} failed commits or aborted transactions (see \
             `transactions` in the results)"
        );
    }
    Ok(publish_errors == 0
        && consume_errors == 0
        && transaction_failures == 0
        && results.publish.messages > 0)
}

/// Writes `backlog_bytes` at full speed with producers of its own; returns the messages written.
fn fill_backlog(bootstrap: &str, w: &Workload, topics: &Arc<Vec<String>>) -> anyhow::Result<u64> {
    let fill = Arc::new(Meter::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for index in 0..w.producers {
        let plan = ProducerPlan {
            index: 1000 + index,
            topics: topics.clone(),
            rate: 0.0,
            limit_bytes: Some(w.backlog_bytes.div_ceil(w.producers as u64)),
            // The backlog is written outside transactions: it is set-up, not measured, and a
            // read_committed consumer reads it all the same.
            transactional_id: None,
        };
        handles.push(spawn_producer(
            plan,
            producer_config(bootstrap, w),
            w,
            fill.clone(),
            Arc::new(Transactions::default()),
            stop.clone(),
        )?);
    }
    let fill_start = Instant::now();
    while handles.iter().any(|h| !h.is_finished()) {
        std::thread::sleep(Duration::from_secs(1));
        let done = fill.total() * w.message_size as u64;
        eprintln!(
            "[{:>4.0}s backlog ] {} / {} MiB acknowledged",
            fill_start.elapsed().as_secs_f64(),
            done >> 20,
            w.backlog_bytes >> 20
        );
    }
    join_all(handles);
    let (errors, first) = fill.errors();
    if errors > 0 {
        bail!(
            "{errors} backlog messages failed: {}",
            first.unwrap_or_default()
        );
    }
    Ok(fill.total())
}

fn print_summary(r: &Results) {
    let line = |what: &str, s: &Summary| {
        let l = &s.latency_us;
        println!(
            "{what:<22} {:>10.0} msg/s {:>8.2} MB/s  latency ms: p50 {:.2} p75 {:.2} p95 {:.2} p99 {:.2} p99.9 {:.2} p99.99 {:.2} max {:.2}",
            s.msg_per_s,
            s.mb_per_s,
            l.p50 as f64 / 1e3,
            l.p75 as f64 / 1e3,
            l.p95 as f64 / 1e3,
            l.p99 as f64 / 1e3,
            l.p999 as f64 / 1e3,
            l.p9999 as f64 / 1e3,
            l.max as f64 / 1e3,
        );
    };
    println!("== {} {}", r.workload.name, r.label);
    if let Some(c) = &r.catch_up {
        line("publish (baseline)", &c.publish_before);
        line("publish (catch-up)", &c.publish_during);
        line("consume (catch-up)", &c.consume_during);
        match c.seconds {
            Some(s) => println!(
                "caught up on {} MiB in {s:.1} s; publish p99 during catch-up / before = {:.2}",
                c.backlog_bytes >> 20,
                c.publish_p99_ratio
            ),
            None => println!(
                "did not catch up on {} MiB within {:.0} s",
                c.backlog_bytes >> 20,
                r.workload.catch_up_timeout_s
            ),
        }
    } else {
        line("publish", &r.publish);
    }
    if let Some(c) = &r.consume {
        line("consume (end-to-end)", c);
    }
    if let Some(t) = &r.transactions {
        let l = &t.commit_latency_us;
        println!(
            "transactions           {:>10.1} txn/s, {} committed, {:.0} records each on average  commit latency ms: p50 {:.2} p99 {:.2} max {:.2}",
            t.committed_per_s,
            group_digits(t.committed),
            t.records_per_transaction_mean,
            l.p50 as f64 / 1e3,
            l.p99 as f64 / 1e3,
            l.max as f64 / 1e3,
        );
        // Always printed on a transactional run, zero or not.
        println!(
            "transactions failed    {} failed commits ({}), {} aborted ({} records), over the whole run",
            t.failed_commits,
            t.first_failure.as_deref().unwrap_or("-"),
            t.aborted,
            group_digits(t.aborted_records),
        );
    }
    if let (Some(ratio), Some(b)) = (r.consume_over_publish, &r.backlog) {
        println!(
            "consume / publish {ratio:.3}; backlog of the slowest group (messages): {} at the start, {} at most, {} at the end ({:.1} MB)",
            group_digits(b.start),
            group_digits(b.max),
            group_digits(b.end),
            b.end as f64 * r.workload.message_size as f64 / 1e6,
        );
    }
    if let Some(why) = &r.consumer_behind {
        println!("consumers behind: {why}; end-to-end latency above measures that backlog");
    }
    if let Some(d) = &r.sustainable {
        for (i, p) in d.probes.iter().enumerate() {
            println!(
                "probe {} at {:>10} msg/s: {}",
                i + 1,
                group_digits(p.outcome.target_msg_per_s as u64),
                verdict(p)
            );
        }
        match (&d.sustainable, &d.none_because) {
            (Some(s), _) => println!(
                "sustainable rate       {:>10.0} msg/s {:>8.2} MB/s  consume {:.0} msg/s {:.2} MB/s, e2e p99 {} ({}; {} probes in {:.0} s{})",
                s.publish_msg_per_s,
                s.publish_mb_per_s,
                s.consume_msg_per_s,
                s.consume_mb_per_s,
                ms(s.e2e_p99_us),
                d.sustainable_from.as_deref().unwrap_or("-"),
                d.probes.len(),
                d.seconds,
                match d.failed_above_msg_per_s {
                    Some(f) => format!("; {} msg/s failed", group_digits(f as u64)),
                    None => String::new(),
                },
            ),
            (None, why) => println!(
                "sustainable rate       none found: {}",
                why.as_deref().unwrap_or("-")
            ),
        }
    }
    if r.errors.publish + r.errors.consume > 0 {
        println!(
            "errors: {} publish ({}), {} consume ({})",
            r.errors.publish,
            r.errors.first_publish_error.as_deref().unwrap_or("-"),
            r.errors.consume,
            r.errors.first_consume_error.as_deref().unwrap_or("-")
        );
    }
    if r.unread_at_end > 0 {
        println!("unread: {}", r.unread_at_end);
    }
}
