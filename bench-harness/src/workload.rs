//! What a run does: a workload, read from a TOML file and/or flags (flags win).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use serde::{Deserialize, Serialize};

/// How producers choose message keys.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum KeyDistribution {
    /// No key: the client's partitioner spreads messages (librdkafka: sticky random).
    None,
    /// Keys 0, 1, 2, … `key_count - 1`, then again, per producer.
    RoundRobin,
    /// A uniformly random key out of `key_count`.
    Random,
    /// Hot keys: key k drawn with probability ∝ 1 / k^`zipf_exponent` out of `key_count`.
    Zipf,
}

/// One benchmark run. Field names are the TOML keys; every one has a flag of the same name with
/// dashes (`message_size` = `--message-size`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Workload {
    /// Names the run's results files and its topics.
    pub name: String,
    pub topics: u32,
    pub partitions: u32,
    /// Replicas of each created topic's partitions (1; 3 on a three-broker cluster).
    pub replication_factor: u32,
    /// Payload bytes per message; at least 16 (the send timestamp and a sequence number).
    pub message_size: usize,
    pub keys: KeyDistribution,
    pub key_count: u64,
    pub zipf_exponent: f64,
    /// Producer clients, each on its own thread with its own connection.
    pub producers: u32,
    /// Consumer groups, each reading every topic in full.
    pub consumer_groups: u32,
    pub consumers_per_group: u32,
    /// Messages per second over all producers; 0 = as fast as the broker takes them.
    pub rate: u64,
    /// `all`, `1` or `0`.
    pub acks: String,
    /// `none`, `gzip`, `snappy`, `lz4` or `zstd`.
    pub compression: String,
    /// Producer batch size in bytes.
    pub batch_size: u32,
    pub linger_ms: u32,
    /// Seconds at the start whose figures are thrown away.
    pub warmup_s: f64,
    /// Seconds measured.
    pub duration_s: f64,
    /// When non-zero, this many bytes are produced before consumers start; the run then
    /// measures producers alone, then producers while consumers catch up from the beginning.
    pub backlog_bytes: u64,
    /// Give up catching up after this many seconds.
    pub catch_up_timeout_s: f64,
    /// Once the producers stop, let the consumers read what is left for at most this long
    /// (what they still had not read is `unread_at_end`).
    pub drain_s_max: f64,
    /// After the (maximum-rate) run, search for the highest producer rate the consumers keep up
    /// with, by short probes at fixed rates (see `sustainable.rs`).
    pub find_sustainable_rate: bool,
    /// Probes after the maximum-rate run, at most; each is a run on fresh topics.
    pub probe_count_max: u32,
    pub probe_warmup_s: f64,
    pub probe_duration_s: f64,
    /// A probe passes with an end-to-end p99 at most this...
    pub sustainable_e2e_p99_ms_max: f64,
    /// ...and consumers reading at least this fraction of what was published.
    pub sustainable_consume_over_publish_min: f64,
    /// The search stops once the lowest failing rate is within this fraction above the highest
    /// passing one.
    pub probe_resolution: f64,
    /// Topic configs for the topics the run creates (e.g. `flush.messages = "1"`).
    pub topic_config: BTreeMap<String, String>,
    /// Transactional producers: each has its own `transactional.id` (unique per run) and
    /// sends inside transactions it commits after `records_per_transaction` records or
    /// `transaction_interval_ms`, whichever comes first; consumers read with
    /// `isolation.level=read_committed`, so end-to-end latency includes the commit.
    pub transactional: bool,
    /// Commit after this many records of one producer; 0 = no bound on the count.
    pub records_per_transaction: u64,
    /// Commit once a transaction is this old (checked at each send); 0 = no bound on time.
    pub transaction_interval_ms: u64,
    /// Extra librdkafka properties for producers and consumers.
    pub producer_config: BTreeMap<String, String>,
    pub consumer_config: BTreeMap<String, String>,
    /// librdkafka properties for every client, the admin client too (e.g. TLS's).
    pub client_config: BTreeMap<String, String>,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            name: "bench".into(),
            topics: 1,
            partitions: 16,
            replication_factor: 1,
            message_size: 1024,
            keys: KeyDistribution::None,
            key_count: 10_000,
            zipf_exponent: 1.0,
            producers: 1,
            consumer_groups: 1,
            consumers_per_group: 1,
            rate: 0,
            acks: "all".into(),
            compression: "none".into(),
            // The OpenMessaging Benchmark's Kafka driver settings.
            batch_size: 1 << 20,
            linger_ms: 1,
            warmup_s: 5.0,
            duration_s: 30.0,
            backlog_bytes: 0,
            catch_up_timeout_s: 600.0,
            drain_s_max: 30.0,
            find_sustainable_rate: false,
            // Six probes of 3 + 10 s, plus topic set-up and tear-down: about two minutes.
            probe_count_max: 6,
            probe_warmup_s: 3.0,
            probe_duration_s: 10.0,
            sustainable_e2e_p99_ms_max: 1000.0,
            sustainable_consume_over_publish_min: 0.97,
            probe_resolution: 0.1,
            transactional: false,
            records_per_transaction: 0,
            transaction_interval_ms: 0,
            topic_config: BTreeMap::new(),
            producer_config: BTreeMap::new(),
            consumer_config: BTreeMap::new(),
            client_config: BTreeMap::new(),
        }
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "sluice-bench",
    about = "An OpenMessaging-Benchmark-style load generator for any Kafka-compatible broker",
    long_about = "Creates the workload's topics, runs its producers and consumer groups \
                  (librdkafka), prints a progress line every second and writes \
                  <out>/<name>.json and <out>/<name>.svg. Flags override the workload file."
)]
pub struct Cli {
    /// Broker address(es), comma separated.
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub bootstrap: String,
    /// A TOML workload file; its keys are the flags' names with underscores.
    #[arg(long)]
    pub workload: Option<PathBuf>,
    /// Directory for the results JSON and plot.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// Keep the topics the run created (they are deleted by default).
    #[arg(long)]
    pub keep_topics: bool,
    /// Once the backlog is written, write dirty pages back and drop the host's page cache
    /// (root, Linux) before measuring, so the backlog is read from the disk by any broker.
    #[arg(long)]
    pub drop_caches_before_catch_up: bool,
    /// A label stored with the results (e.g. the broker and its settings).
    #[arg(long, default_value = "")]
    pub label: String,

    #[arg(long)]
    pub name: Option<String>,
    #[arg(long)]
    pub topics: Option<u32>,
    #[arg(long)]
    pub partitions: Option<u32>,
    /// Replicas per partition of the created topics (default 1).
    #[arg(long)]
    pub replication_factor: Option<u32>,
    #[arg(long)]
    pub message_size: Option<usize>,
    #[arg(long, value_enum)]
    pub keys: Option<KeyDistribution>,
    #[arg(long)]
    pub key_count: Option<u64>,
    #[arg(long)]
    pub zipf_exponent: Option<f64>,
    #[arg(long)]
    pub producers: Option<u32>,
    #[arg(long)]
    pub consumer_groups: Option<u32>,
    #[arg(long)]
    pub consumers_per_group: Option<u32>,
    /// Messages per second over all producers; 0 = maximum rate.
    #[arg(long)]
    pub rate: Option<u64>,
    #[arg(long)]
    pub acks: Option<String>,
    #[arg(long)]
    pub compression: Option<String>,
    #[arg(long)]
    pub batch_size: Option<u32>,
    #[arg(long)]
    pub linger_ms: Option<u32>,
    #[arg(long)]
    pub warmup_s: Option<f64>,
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// Bytes to produce before consumers start, e.g. 2147483648 for the 2 GiB catch-up workload.
    #[arg(long)]
    pub backlog_bytes: Option<u64>,
    #[arg(long)]
    pub catch_up_timeout_s: Option<f64>,
    #[arg(long)]
    pub drain_s_max: Option<f64>,
    /// After the maximum-rate run, probe fixed rates for the highest one the consumers sustain
    /// (end-to-end p99 and consume rate within the bounds below).
    #[arg(long)]
    pub find_sustainable_rate: bool,
    /// Probes at most (each a short run on fresh topics).
    #[arg(long)]
    pub probe_count_max: Option<u32>,
    #[arg(long)]
    pub probe_warmup_s: Option<f64>,
    #[arg(long)]
    pub probe_duration_s: Option<f64>,
    /// A probe passes with an end-to-end p99 of at most this many ms...
    #[arg(long)]
    pub sustainable_e2e_p99_ms_max: Option<f64>,
    /// ...and its consumers reading at least this fraction of the publish rate.
    #[arg(long)]
    pub sustainable_consume_over_publish_min: Option<f64>,
    /// Stop once the lowest failing rate is within this fraction above the highest passing one.
    #[arg(long)]
    pub probe_resolution: Option<f64>,
    /// Transactional producers (each its own `transactional.id`) and read_committed consumers.
    #[arg(long)]
    pub transactional: bool,
    /// With --transactional: commit after this many records per producer (0: no count bound).
    #[arg(long)]
    pub records_per_transaction: Option<u64>,
    /// With --transactional: commit every this many ms per producer (0: no time bound).
    #[arg(long)]
    pub transaction_interval_ms: Option<u64>,
    /// A topic config for created topics, `name=value`; repeatable.
    #[arg(long, value_parser = key_value)]
    pub topic_config: Vec<(String, String)>,
    /// An extra librdkafka producer property, `name=value`; repeatable.
    #[arg(long, value_parser = key_value)]
    pub producer_config: Vec<(String, String)>,
    /// An extra librdkafka consumer property, `name=value`; repeatable.
    #[arg(long, value_parser = key_value)]
    pub consumer_config: Vec<(String, String)>,
    /// A librdkafka property for every client (producers, consumers and the admin client),
    /// `name=value`, e.g. `security.protocol=SSL`; repeatable.
    #[arg(long, value_parser = key_value)]
    pub client_config: Vec<(String, String)>,
}

fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected name=value, got {s:?}")),
    }
}

impl Cli {
    /// The workload file (if any) with the flags applied over it, checked.
    pub fn workload(&self) -> anyhow::Result<Workload> {
        let mut w = match &self.workload {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?
            }
            None => Workload::default(),
        };
        macro_rules! set {
            ($($field:ident),*) => {$(
                if let Some(v) = &self.$field {
                    w.$field = v.clone();
                }
            )*};
        }
        set!(
            name,
            topics,
            partitions,
            replication_factor,
            message_size,
            keys,
            key_count,
            zipf_exponent,
            producers,
            consumer_groups,
            consumers_per_group,
            rate,
            acks,
            compression,
            batch_size,
            linger_ms,
            warmup_s,
            duration_s,
            backlog_bytes,
            catch_up_timeout_s,
            drain_s_max,
            probe_count_max,
            probe_warmup_s,
            probe_duration_s,
            sustainable_e2e_p99_ms_max,
            sustainable_consume_over_publish_min,
            probe_resolution,
            records_per_transaction,
            transaction_interval_ms
        );
        if self.find_sustainable_rate {
            w.find_sustainable_rate = true;
        }
        if self.transactional {
            w.transactional = true;
        }
        w.topic_config.extend(self.topic_config.iter().cloned());
        w.producer_config
            .extend(self.producer_config.iter().cloned());
        w.consumer_config
            .extend(self.consumer_config.iter().cloned());
        w.client_config.extend(self.client_config.iter().cloned());
        w.check()?;
        Ok(w)
    }
}

impl Workload {
    pub fn check(&self) -> anyhow::Result<()> {
        if self.message_size < crate::payload::HEADER_LEN {
            bail!(
                "message_size must be at least {} bytes (send time and sequence)",
                crate::payload::HEADER_LEN
            );
        }
        if self.topics == 0
            || self.partitions == 0
            || self.producers == 0
            || self.replication_factor == 0
        {
            bail!("topics, partitions, replication_factor and producers must be at least 1");
        }
        if self.consumer_groups > 0 && self.consumers_per_group == 0 {
            bail!("consumers_per_group must be at least 1 when there are consumer groups");
        }
        if self.backlog_bytes > 0 && self.consumer_groups == 0 {
            bail!("a backlog needs a consumer group to catch up on it");
        }
        if !["all", "-1", "1", "0"].contains(&self.acks.as_str()) {
            bail!("acks must be all, 1 or 0, not {:?}", self.acks);
        }
        if !["none", "gzip", "snappy", "lz4", "zstd"].contains(&self.compression.as_str()) {
            bail!("unknown compression {:?}", self.compression);
        }
        if self.keys != KeyDistribution::None && self.key_count == 0 {
            bail!("key_count must be at least 1");
        }
        if self.duration_s.is_nan() || self.duration_s <= 0.0 || self.warmup_s < 0.0 {
            bail!("duration_s must be positive and warmup_s not negative");
        }
        if self.drain_s_max.is_nan() || self.drain_s_max < 0.0 {
            bail!("drain_s_max must not be negative");
        }
        if self.find_sustainable_rate {
            self.check_search()?;
        }
        self.check_transactions()?;
        Ok(())
    }
}

impl Workload {
    fn check_transactions(&self) -> anyhow::Result<()> {
        if !self.transactional {
            if self.records_per_transaction > 0 || self.transaction_interval_ms > 0 {
                bail!("records_per_transaction and transaction_interval_ms need transactional");
            }
            return Ok(());
        }
        if self.records_per_transaction == 0 && self.transaction_interval_ms == 0 {
            bail!(
                "a transactional workload commits after records_per_transaction records or \
                 transaction_interval_ms: set at least one"
            );
        }
        // A transactional producer is idempotent, and idempotence needs every in-sync replica.
        if !["all", "-1"].contains(&self.acks.as_str()) {
            bail!("transactional producers need acks=all, not {:?}", self.acks);
        }
        Ok(())
    }
}

impl Workload {
    fn check_search(&self) -> anyhow::Result<()> {
        if self.rate != 0 {
            bail!(
                "find_sustainable_rate starts from a maximum-rate run: rate must be 0, not {}",
                self.rate
            );
        }
        if self.backlog_bytes > 0 || self.consumer_groups == 0 {
            bail!("find_sustainable_rate needs consumer groups and no backlog");
        }
        let limit = crate::sustainable::PROBE_COUNT_LIMIT;
        if self.probe_count_max == 0 || self.probe_count_max > limit {
            bail!(
                "probe_count_max must be 1 to {limit}, not {}",
                self.probe_count_max
            );
        }
        if self.probe_duration_s.is_nan()
            || self.probe_duration_s <= 0.0
            || self.probe_warmup_s.is_nan()
            || self.probe_warmup_s < 0.0
        {
            bail!("probe_duration_s must be positive and probe_warmup_s not negative");
        }
        let ratio = self.sustainable_consume_over_publish_min;
        if ratio.is_nan() || ratio <= 0.0 || ratio > 1.0 {
            bail!("sustainable_consume_over_publish_min must be in (0, 1]");
        }
        let positive = |v: f64| !v.is_nan() && v > 0.0;
        if !positive(self.sustainable_e2e_p99_ms_max) || !positive(self.probe_resolution) {
            bail!("sustainable_e2e_p99_ms_max and probe_resolution must be positive");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_workload_file_parses_and_flags_override_it() {
        let file = concat!(env!("CARGO_MANIFEST_DIR"), "/workloads/keyed-latency.toml");
        let cli = Cli::parse_from(["sluice-bench", "--workload", file, "--rate", "500"]);
        let w = cli.workload().unwrap();
        assert_eq!(w.name, "keyed-latency");
        assert_eq!(w.keys, KeyDistribution::Zipf);
        assert_eq!(w.compression, "lz4");
        assert_eq!(w.rate, 500, "the flag wins over the file's 20000");
        assert_eq!(w.producer_config["enable.idempotence"], "true");
        assert_eq!(w.batch_size, 1 << 20, "unset keys keep their defaults");
        assert_eq!(w.replication_factor, 1);
        let cli = Cli::parse_from(["sluice-bench", "--replication-factor", "3"]);
        assert_eq!(cli.workload().unwrap().replication_factor, 3);
    }

    #[test]
    fn bad_workloads_are_refused_with_a_reason() {
        let cli = Cli::parse_from(["sluice-bench", "--message-size", "8"]);
        let e = cli.workload().unwrap_err().to_string();
        assert!(e.contains("message_size"), "{e}");
        let cli = Cli::parse_from(["sluice-bench", "--replication-factor", "0"]);
        let e = cli.workload().unwrap_err().to_string();
        assert!(e.contains("replication_factor"), "{e}");
        let cli = Cli::parse_from(["sluice-bench", "--compression", "brotli"]);
        assert!(cli.workload().unwrap_err().to_string().contains("brotli"));
        let cli = Cli::parse_from(["sluice-bench", "--find-sustainable-rate", "--rate", "10"]);
        let e = cli.workload().unwrap_err().to_string();
        assert!(e.contains("maximum-rate run"), "{e}");
        let cli = Cli::parse_from([
            "sluice-bench",
            "--find-sustainable-rate",
            "--probe-count-max",
            "0",
        ]);
        assert!(cli
            .workload()
            .unwrap_err()
            .to_string()
            .contains("probe_count_max"));
    }

    #[test]
    fn the_transactional_workload_file_parses_and_flags_override_it() {
        let file = concat!(env!("CARGO_MANIFEST_DIR"), "/workloads/transactional.toml");
        let cli = Cli::parse_from(["sluice-bench", "--workload", file]);
        let w = cli.workload().unwrap();
        assert!(w.transactional);
        assert_eq!(w.transaction_interval_ms, 100);
        assert_eq!(w.records_per_transaction, 1000);
        let cli = Cli::parse_from([
            "sluice-bench",
            "--workload",
            file,
            "--records-per-transaction",
            "500",
            "--transaction-interval-ms",
            "0",
        ]);
        let w = cli.workload().unwrap();
        assert_eq!(
            (w.records_per_transaction, w.transaction_interval_ms),
            (500, 0)
        );
        let cli = Cli::parse_from([
            "sluice-bench",
            "--transactional",
            "--records-per-transaction",
            "5",
        ]);
        let w = cli.workload().unwrap();
        assert!(w.transactional);
        assert_eq!(w.records_per_transaction, 5);
        assert!(
            !Cli::parse_from(["sluice-bench"])
                .workload()
                .unwrap()
                .transactional
        );
    }

    #[test]
    fn bad_transactional_workloads_are_refused_with_a_reason() {
        let cli = Cli::parse_from(["sluice-bench", "--transactional"]);
        let e = cli.workload().unwrap_err().to_string();
        assert!(e.contains("records_per_transaction"), "{e}");
        let cli = Cli::parse_from(["sluice-bench", "--records-per-transaction", "10"]);
        let e = cli.workload().unwrap_err().to_string();
        assert!(e.contains("need transactional"), "{e}");
        let cli = Cli::parse_from([
            "sluice-bench",
            "--transactional",
            "--transaction-interval-ms",
            "100",
            "--acks",
            "1",
        ]);
        let e = cli.workload().unwrap_err().to_string();
        assert!(e.contains("acks=all"), "{e}");
    }

    #[test]
    fn the_search_flags_set_the_workload() {
        let cli = Cli::parse_from([
            "sluice-bench",
            "--find-sustainable-rate",
            "--probe-count-max",
            "3",
            "--probe-duration-s",
            "4",
        ]);
        let w = cli.workload().unwrap();
        assert!(w.find_sustainable_rate);
        assert_eq!((w.probe_count_max, w.probe_duration_s), (3, 4.0));
        assert_eq!(w.sustainable_e2e_p99_ms_max, 1000.0, "the default");
        assert!(
            !Cli::parse_from(["sluice-bench"])
                .workload()
                .unwrap()
                .find_sustainable_rate
        );
    }
}
