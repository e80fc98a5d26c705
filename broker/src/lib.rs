//! The Sluice broker as a library: shards, the Kafka protocol server, coordinators and the
//! `sluice` CLI. The `sluice` binary (`src/main.rs`) only calls [`main`]; the fuzz targets
//! (`fuzz/`) decode requests through [`wire`].

use std::path::PathBuf;

use clap::{Parser, Subcommand};

mod cli;
mod cluster;
mod config;
mod config_catalog;
mod features;
mod group;
mod handlers;
mod loggers;
mod metadata;
mod metrics;
mod net;
mod server;
mod shard;
mod topic_config;
mod txn;

use config::BrokerConfig;

/// Request decoding exactly as a connection does it (size prefix, header, body), for the fuzz
/// targets in `fuzz/` and for tests.
pub mod wire {
    pub use crate::handlers::{decode_request, supported, SUPPORTED};
    pub use crate::net::frame::{body_len, decode_frame, decode_header, Decoded, Header};
}

#[derive(Parser, Debug)]
#[command(
    name = "sluice",
    version,
    about = "Sluice: a Kafka-compatible, thread-per-core commit log"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a broker (the default).
    Serve(Box<ServeArgs>),
    #[command(flatten)]
    Client(cli::Command),
}

#[derive(clap::Args, Debug, Clone, Default)]
struct ServeArgs {
    /// TOML file with broker settings under Kafka's names (`listeners`, `log.dirs`, ...).
    #[arg(long)]
    config: Option<PathBuf>,
    /// This node's id in the cluster (`node.id`). Default 1.
    #[arg(long)]
    node_id: Option<i32>,
    /// broker, controller, or broker,controller (`process.roles`). Default both.
    #[arg(long)]
    process_roles: Option<String>,
    /// The controllers, e.g. 1@127.0.0.1:9093,2@127.0.0.1:9095,3@127.0.0.1:9097
    /// (`controller.quorum.voters`). None for a single node.
    #[arg(long)]
    controller_quorum_voters: Option<String>,
    /// Which listeners carry the controller quorum (`controller.listener.names`). Default
    /// CONTROLLER.
    #[arg(long)]
    controller_listener_names: Option<String>,
    /// This broker's rack, for rack-aware replica placement (`broker.rack`).
    #[arg(long)]
    broker_rack: Option<String>,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (`metrics.listener`). Off when
    /// not given.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_listener: Option<String>,
    /// A broker without a heartbeat for this long is fenced (`broker.session.timeout.ms`).
    /// Default 9000.
    #[arg(long)]
    broker_session_timeout_ms: Option<u64>,
    /// How often brokers heartbeat to the controller (`broker.heartbeat.interval.ms`).
    /// Default 2000.
    #[arg(long)]
    broker_heartbeat_interval_ms: Option<u64>,
    /// Directory for partition logs and metadata (`log.dirs`). Default ./data.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Where to serve the Kafka protocol, e.g. PLAINTEXT://127.0.0.1:9092, and the controller
    /// quorum, e.g. PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093 (`listeners`).
    #[arg(long)]
    listeners: Option<String>,
    /// Address given to clients, e.g. PLAINTEXT://broker1:9092 (`advertised.listeners`).
    #[arg(long)]
    advertised_listeners: Option<String>,
    /// Shards to run, one per core; 0 = every core.
    #[arg(long)]
    cores: Option<usize>,
    /// Partitions of auto-created topics (`num.partitions`).
    #[arg(long)]
    num_partitions: Option<i32>,
    /// How long a new consumer group waits for more members (`group.initial.rebalance.delay.ms`).
    #[arg(long)]
    group_initial_rebalance_delay_ms: Option<u64>,
    /// How long a `group.protocol=consumer` member may go without a heartbeat before it leaves
    /// its group (`group.consumer.session.timeout.ms`). Default 45000.
    #[arg(long)]
    group_consumer_session_timeout_ms: Option<u64>,
    /// How often `group.protocol=consumer` members are told to heartbeat; less than the session
    /// timeout (`group.consumer.heartbeat.interval.ms`). Default 5000.
    #[arg(long)]
    group_consumer_heartbeat_interval_ms: Option<u64>,
    /// The most record bytes in one fetch response, whatever the client asks
    /// (`fetch.max.bytes`). Default 8 MiB.
    #[arg(long)]
    fetch_max_bytes: Option<usize>,
    /// Of those, the most read from disk rather than memory (`fetch.cold.max.bytes`), so that
    /// a consumer catching up does not hold the disk behind producers. Default 2 MiB.
    #[arg(long)]
    fetch_cold_max_bytes: Option<usize>,
    /// Splice records on disk from segment files to the socket (`fetch.zero.copy`, default
    /// true); false copies them through memory.
    #[arg(long)]
    fetch_zero_copy: Option<bool>,
    /// The shortest session timeout a classic group member may ask for
    /// (`group.min.session.timeout.ms`). Default 6000.
    #[arg(long)]
    group_min_session_timeout_ms: Option<i64>,
    /// The longest session timeout a classic group member may ask for
    /// (`group.max.session.timeout.ms`). Default 1800000.
    #[arg(long)]
    group_max_session_timeout_ms: Option<i64>,
    /// How often retention deletes expired segments (`log.retention.check.interval.ms`).
    /// Default 300000, as Kafka.
    #[arg(long)]
    log_retention_check_interval_ms: Option<u64>,
    /// How long an in-sync follower may go without catching up before it leaves the ISR
    /// (`replica.lag.time.max.ms`). Default 30000, as Kafka.
    #[arg(long)]
    replica_lag_time_max_ms: Option<u64>,
    /// The `transaction.version` feature level (KIP-890): 2 (default, as a new Kafka 4
    /// cluster) bumps the producer epoch at every transaction end and adds partitions to
    /// transactions at their leaders; 0 keeps clients on the KIP-98 protocol. Give every broker
    /// of a cluster the same level.
    #[arg(long)]
    transaction_version: Option<i16>,
    /// Whether partition leaders verify a transaction's first batch with its coordinator
    /// (`transaction.partition.verification.enable`, KIP-890). Default true, as Kafka.
    #[arg(long)]
    transaction_partition_verification_enable: Option<bool>,
    /// How long a follower's fetch waits at its leader for new records
    /// (`replica.fetch.wait.max.ms`). Default 500, as Kafka.
    #[arg(long)]
    replica_fetch_wait_max_ms: Option<u64>,
    /// Where leaders send consumers to read (`replica.selector.class`, KIP-392):
    /// `org.apache.kafka.common.replica.RackAwareReplicaSelector` (or `RackAwareReplicaSelector`)
    /// sends a consumer with a `client.rack` to an in-sync replica in its rack. Default: unset,
    /// the leader.
    #[arg(long)]
    replica_selector_class: Option<String>,
    /// Replicas of `__consumer_offsets` (`offsets.topic.replication.factor`). Default 3 in a
    /// cluster, as Kafka, and 1 on the single-node default.
    #[arg(long)]
    offsets_topic_replication_factor: Option<i16>,
    /// Replicas of `__transaction_state` (`transaction.state.log.replication.factor`). Default
    /// 3 in a cluster, as Kafka, and 1 on the single-node default.
    #[arg(long)]
    transaction_state_log_replication_factor: Option<i16>,
    /// How often transaction coordinators abort transactions past their timeout
    /// (`transaction.abort.timed.out.transaction.cleanup.interval.ms`). Default 10000, as Kafka.
    #[arg(long)]
    transaction_abort_timed_out_transaction_cleanup_interval_ms: Option<u64>,
    /// Replicas of topics created without a replication factor (`default.replication.factor`).
    /// Default 1, as Kafka.
    #[arg(long)]
    default_replication_factor: Option<i16>,
    /// In-sync replicas an acks=all produce needs, for topics that set none
    /// (`min.insync.replicas`). Default 1, as Kafka.
    #[arg(long)]
    min_insync_replicas: Option<i32>,
    /// Whether the controller gives partitions back to their preferred replica once it is in
    /// sync (`auto.leader.rebalance.enable`). Default true, as Kafka.
    #[arg(long)]
    auto_leader_rebalance_enable: Option<bool>,
    /// How often the controller looks for partitions not led by their preferred replica
    /// (`leader.imbalance.check.interval.seconds`). Default 300, as Kafka.
    #[arg(long)]
    leader_imbalance_check_interval_seconds: Option<u64>,
    /// Whether an out-of-sync replica may lead a partition no in-sync replica can lead, for
    /// topics that set none (`unclean.leader.election.enable`). Default false, as Kafka.
    #[arg(long)]
    unclean_leader_election_enable: Option<bool>,
    /// How often compacted topics are cleaned (`log.cleaner.backoff.ms`). Default 60000.
    #[arg(long)]
    log_cleaner_backoff_ms: Option<u64>,
    /// Whether classic groups convert to consumer groups when a `group.protocol=consumer`
    /// member joins, and back when the last one leaves: disabled, upgrade, downgrade or
    /// bidirectional (`group.consumer.migration.policy`). Default bidirectional, as Kafka.
    #[arg(long)]
    group_consumer_migration_policy: Option<config::MigrationPolicy>,
    /// Connection limits (`max.connections`, `connections.max.idle.ms`, ...).
    #[command(flatten)]
    limits: config::LimitArgs,
}

fn broker_config(args: &ServeArgs) -> anyhow::Result<BrokerConfig> {
    let mut config = BrokerConfig::default();
    if let Some(path) = &args.config {
        config.apply_file(path)?;
    }
    if let Some(dir) = &args.data_dir {
        config.data_dir = dir.clone();
    }
    if let Some(v) = args.node_id {
        config.node_id = v;
    }
    if let Some(v) = &args.process_roles {
        config.process_roles = v.parse().map_err(anyhow::Error::msg)?;
    }
    if let Some(v) = &args.controller_quorum_voters {
        config.controller_quorum_voters = config::parse_voters(v)?;
    }
    if let Some(v) = &args.controller_listener_names {
        config.set_controller_listener_names(v);
    }
    if let Some(v) = &args.broker_rack {
        config.broker_rack = Some(v.clone()).filter(|r| !r.is_empty());
    }
    if let Some(v) = &args.metrics_listener {
        config.metrics_listener = Some(v.clone()).filter(|l| !l.is_empty());
    }
    if let Some(v) = args.broker_session_timeout_ms {
        config.broker_session_timeout_ms = v;
    }
    if let Some(v) = args.broker_heartbeat_interval_ms {
        config.broker_heartbeat_interval_ms = v;
    }
    if let Some(l) = &args.listeners {
        config.set_listeners(l)?;
    }
    if let Some(a) = &args.advertised_listeners {
        config.set_advertised(a)?;
    }
    if let Some(c) = args.cores {
        config.cores = c;
    }
    if let Some(n) = args.num_partitions {
        config.num_partitions = n;
    }
    if let Some(d) = args.group_initial_rebalance_delay_ms {
        config.group_initial_rebalance_delay_ms = d;
    }
    if let Some(v) = args.group_consumer_session_timeout_ms {
        config.group_consumer_session_timeout_ms = v;
    }
    if let Some(v) = args.group_consumer_heartbeat_interval_ms {
        config.group_consumer_heartbeat_interval_ms = v;
    }
    if let Some(v) = args.fetch_max_bytes {
        config.fetch_max_bytes = v.max(1);
    }
    if let Some(v) = args.fetch_cold_max_bytes {
        config.fetch_cold_max_bytes = v.max(1);
    }
    if let Some(v) = args.fetch_zero_copy {
        config.fetch_zero_copy = v;
    }
    if let Some(v) = args.group_min_session_timeout_ms {
        config.group_min_session_timeout_ms = v;
    }
    if let Some(v) = args.group_max_session_timeout_ms {
        config.group_max_session_timeout_ms = v;
    }
    if let Some(v) = args.log_retention_check_interval_ms {
        config.log_retention_check_interval_ms = v;
    }
    if let Some(v) = args.replica_lag_time_max_ms {
        config.replica_lag_time_max_ms = v;
    }
    if let Some(v) = args.transaction_version {
        config.transaction_version = v;
    }
    if let Some(v) = args.transaction_partition_verification_enable {
        config.transaction_partition_verification_enable = v;
    }
    if let Some(v) = args.replica_fetch_wait_max_ms {
        config.replica_fetch_wait_max_ms = v;
    }
    if let Some(v) = &args.replica_selector_class {
        config.replica_selector_class = Some(v.clone()).filter(|v| !v.is_empty());
    }
    if let Some(v) = args.offsets_topic_replication_factor {
        config.offsets_topic_replication_factor_set = Some(v);
    }
    if let Some(v) = args.transaction_state_log_replication_factor {
        config.transaction_state_log_replication_factor_set = Some(v);
    }
    if let Some(v) = args.transaction_abort_timed_out_transaction_cleanup_interval_ms {
        config.transaction_abort_timed_out_transaction_cleanup_interval_ms = v;
    }
    if let Some(v) = args.default_replication_factor {
        config.default_replication_factor = v;
    }
    if let Some(v) = args.min_insync_replicas {
        config.min_insync_replicas = v;
    }
    if let Some(v) = args.auto_leader_rebalance_enable {
        config.auto_leader_rebalance_enable = v;
    }
    if let Some(v) = args.leader_imbalance_check_interval_seconds {
        config.leader_imbalance_check_interval_seconds = v;
    }
    if let Some(v) = args.unclean_leader_election_enable {
        config.unclean_leader_election_enable = v;
    }
    if let Some(v) = args.log_cleaner_backoff_ms {
        config.log_cleaner_backoff_ms = v;
    }
    if let Some(v) = args.group_consumer_migration_policy {
        config.group_consumer_migration_policy = v;
    }
    args.limits.apply(&mut config);
    config.validate()?;
    Ok(config)
}

/// The `sluice` command: parses the command line, then serves or runs a client subcommand.
pub fn main() -> anyhow::Result<()> {
    loggers::install();
    let cli = Cli::parse();
    let args = match &cli.command {
        Some(Command::Serve(args)) => (**args).clone(),
        None => cli.serve.clone(),
        Some(Command::Client(command)) => cli::run(command),
    };
    server::run(broker_config(&args)?)
}
