//! `sluice-bench`: an OpenMessaging-Benchmark-style load generator for any Kafka-compatible
//! broker. It is a librdkafka client (the `rdkafka` crate) and depends on none of Sluice's own
//! crates, so that runs against Sluice and against Apache Kafka are measured the same way.
//!
//! A run: create the workload's topics; when the workload has a backlog, fill it at full speed,
//! then measure the producers alone ("baseline") and the producers while the consumer groups
//! read the backlog from the beginning ("catch-up"); otherwise warm up, then measure producers
//! and consumers together ("measure"). Every second a progress line; at the end a summary, the
//! results JSON and an SVG plot in `--out`.

mod clients;
mod payload;
mod plot;
mod stats;
mod workload;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde::Serialize;

use clients::{consumer_config, producer_config, spawn_consumer, spawn_producer, ProducerPlan};
use stats::{Meter, Point, Summary};
use workload::{Cli, Workload};

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
    /// Consumption in the measured window; its latency is end-to-end (send to receive).
    end_to_end: Option<Summary>,
    catch_up: Option<CatchUp>,
    errors: Errors,
    /// Produced messages the slowest group had not read 30 s after the producers stopped: at
    /// the maximum rate, consumers on the same cores may fall behind (their end-to-end
    /// latency then measures that backlog).
    unread_at_end: u64,
    series: Vec<Point>,
}

/// The per-second clock of a run: prints the progress line and keeps the series.
struct Reporter {
    start: Instant,
    next: Duration,
    publish: Arc<Meter>,
    consume: Arc<Meter>,
    series: Vec<Point>,
}

impl Reporter {
    /// Sleeps to the next whole second of the run and records it.
    fn tick(&mut self, phase: &'static str, backlog: &dyn Fn() -> u64) {
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
        };
        eprintln!(
            "[{:>4.0}s {:<8}] publish {:>9} msg/s {:>7.1} MB/s p50 {} p99 {} | consume {:>9} msg/s {:>7.1} MB/s e2e p50 {} p99 {} | backlog {}",
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
        );
        self.series.push(point);
    }
}

fn ms(us: u64) -> String {
    format!("{:.2} ms", us as f64 / 1000.0)
}

fn group_digits(n: u64) -> String {
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

fn admin(bootstrap: &str) -> anyhow::Result<AdminClient<DefaultClientContext>> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .context("creating an admin client")
}

fn create_topics(bootstrap: &str, topics: &[String], w: &Workload) -> anyhow::Result<()> {
    let admin = admin(bootstrap)?;
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|t| {
            let mut topic = NewTopic::new(t, w.partitions as i32, TopicReplication::Fixed(1));
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
    let probe: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
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

fn delete_topics(bootstrap: &str, topics: &[String]) -> anyhow::Result<()> {
    let admin = admin(bootstrap)?;
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
    let topics: Arc<Vec<String>> = Arc::new(
        (0..w.topics)
            .map(|i| format!("{}-{run_id}-{i}", w.name))
            .collect(),
    );
    eprintln!(
        "sluice-bench: {} against {bootstrap}: {} topic(s) x {} partitions, {} B messages, {} producer(s) at {}, {} group(s) x {} consumer(s), acks={} compression={}{}",
        w.name,
        w.topics,
        w.partitions,
        w.message_size,
        w.producers,
        if w.rate == 0 { "max rate".to_string() } else { format!("{} msg/s", w.rate) },
        w.consumer_groups,
        w.consumers_per_group,
        w.acks,
        w.compression,
        if w.backlog_bytes > 0 { format!(", backlog {} MiB", w.backlog_bytes >> 20) } else { String::new() },
    );
    create_topics(bootstrap, &topics, &w)?;

    let publish = Arc::new(Meter::default());
    let consume = Arc::new(Meter::default());
    let mut reporter = Reporter {
        start: Instant::now(),
        next: Duration::ZERO,
        publish: publish.clone(),
        consume: consume.clone(),
        series: Vec::new(),
    };

    // The backlog, at full speed, by its own producers.
    let mut backlog_messages = 0;
    if w.backlog_bytes > 0 {
        let fill = Arc::new(Meter::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for index in 0..w.producers {
            let plan = ProducerPlan {
                index: 1000 + index,
                topics: topics.clone(),
                rate: 0.0,
                limit_bytes: Some(w.backlog_bytes.div_ceil(w.producers as u64)),
            };
            handles.push(spawn_producer(
                plan,
                producer_config(bootstrap, &w),
                &w,
                fill.clone(),
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
        backlog_messages = fill.total();
        // Before anything is measured: writing back a host's dirty pages can stall every disk
        // user for seconds.
        if cli.drop_caches_before_catch_up {
            drop_caches();
        }
        reporter.start = Instant::now();
    }

    let groups: Vec<Arc<AtomicU64>> = (0..w.consumer_groups)
        .map(|_| Arc::new(AtomicU64::new(0)))
        .collect();
    let stop_consumers = Arc::new(AtomicBool::new(false));
    let start_consumers = || -> anyhow::Result<Vec<JoinHandle<()>>> {
        let mut handles = Vec::new();
        for (g, consumed) in groups.iter().enumerate() {
            let group = format!("{}-{run_id}-group-{g}", w.name);
            for c in 0..w.consumers_per_group {
                handles.push(spawn_consumer(
                    format!("consumer-{g}-{c}"),
                    consumer_config(bootstrap, &group, &w),
                    topics.clone(),
                    consume.clone(),
                    consumed.clone(),
                    stop_consumers.clone(),
                )?);
            }
        }
        Ok(handles)
    };
    let backlog = || {
        let produced = backlog_messages + publish.total();
        let slowest = groups
            .iter()
            .map(|g| g.load(Ordering::Relaxed))
            .min()
            .unwrap_or(produced);
        produced.saturating_sub(slowest)
    };

    let mut consumers = if w.backlog_bytes == 0 {
        start_consumers()?
    } else {
        Vec::new()
    };
    let stop_producers = Arc::new(AtomicBool::new(false));
    let mut producers = Vec::new();
    for index in 0..w.producers {
        let plan = ProducerPlan {
            index,
            topics: topics.clone(),
            rate: w.rate as f64 / w.producers as f64,
            limit_bytes: None,
        };
        producers.push(spawn_producer(
            plan,
            producer_config(bootstrap, &w),
            &w,
            publish.clone(),
            stop_producers.clone(),
        )?);
    }

    let seconds = |s: f64| s.round().max(1.0) as u64;
    let warmup_ticks = if w.warmup_s > 0.0 {
        seconds(w.warmup_s)
    } else {
        0
    };
    for _ in 0..warmup_ticks {
        reporter.tick("warmup", &backlog);
    }
    publish.take_window(1.0);
    consume.take_window(1.0);

    let measured_phase = if w.backlog_bytes == 0 {
        "measure"
    } else {
        "baseline"
    };
    let window_start = Instant::now();
    for _ in 0..seconds(w.duration_s) {
        reporter.tick(measured_phase, &backlog);
    }
    let elapsed = window_start.elapsed().as_secs_f64();
    let measured = publish.take_window(elapsed);
    let end_to_end =
        (w.backlog_bytes == 0 && w.consumer_groups > 0).then(|| consume.take_window(elapsed));

    let catch_up = if w.backlog_bytes > 0 {
        consume.take_window(1.0);
        consumers = start_consumers()?;
        let start = Instant::now();
        // Caught up: the slowest group is within a second of production (or 1,000 messages).
        let tolerance = (w.rate).max(1000);
        let mut caught_up = None;
        while caught_up.is_none() && start.elapsed().as_secs_f64() < w.catch_up_timeout_s {
            reporter.tick("catch-up", &backlog);
            if backlog() <= tolerance {
                caught_up = Some(start.elapsed().as_secs_f64());
            }
        }
        let elapsed = start.elapsed().as_secs_f64();
        let during = publish.take_window(elapsed);
        let ratio = during.latency_us.p99 as f64 / measured.latency_us.p99.max(1) as f64;
        Some(CatchUp {
            backlog_bytes: w.backlog_bytes,
            backlog_messages,
            seconds: caught_up,
            publish_before: measured.clone(),
            publish_during: during,
            publish_p99_ratio: ratio,
            consume_during: consume.take_window(elapsed),
        })
    } else {
        None
    };

    stop_producers.store(true, Ordering::Relaxed);
    join_all(producers);
    // Let the consumers read what was produced last (at most 30 s).
    let drain_deadline = Instant::now() + Duration::from_secs(30);
    while !consumers.is_empty() && backlog() > 0 && Instant::now() < drain_deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let unread = if consumers.is_empty() { 0 } else { backlog() };
    stop_consumers.store(true, Ordering::Relaxed);
    join_all(consumers);
    if !cli.keep_topics {
        if let Err(e) = delete_topics(bootstrap, &topics) {
            eprintln!("sluice-bench: {e:#}");
        }
    }

    let (publish_errors, first_publish_error) = publish.errors();
    let (consume_errors, first_consume_error) = consume.errors();
    let results = Results {
        tool: "sluice-bench",
        label: &cli.label,
        bootstrap,
        started_unix_s,
        workload: &w,
        topics: &topics,
        publish: measured,
        end_to_end,
        catch_up,
        errors: Errors {
            publish: publish_errors,
            first_publish_error,
            consume: consume_errors,
            first_consume_error,
        },
        unread_at_end: unread,
        series: reporter.series,
    };
    print_summary(&results, unread);

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
            "sluice-bench: the consumers were {unread} messages behind 30 s after the producers \
             stopped: their end-to-end latency measures that backlog"
        );
    }
    Ok(publish_errors == 0 && consume_errors == 0 && results.publish.messages > 0)
}

fn print_summary(r: &Results, unread: u64) {
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
    if let Some(e) = &r.end_to_end {
        line("consume (end-to-end)", e);
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
    if unread > 0 {
        println!("unread: {unread}");
    }
}
