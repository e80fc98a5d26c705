//! Operator subcommands that speak the Kafka protocol to a running broker, like Kafka's own
//! command-line tools and kcat: `topic`, `produce`, `consume`, `cluster`, `group`,
//! `transactions`, `reassign` and `elect-leaders`; and `storage`, which formats a data directory before a node first
//! starts.
//!
//! Everything here is blocking and single-threaded on the calling thread (`client.rs`); the
//! CLI never starts a shard. Results go to stdout, notes and errors to stderr, and any error
//! (including an error code from the broker, named as Kafka names it) exits non-zero.

use clap::Subcommand;

pub mod client;
pub use group::group_lags;
mod cluster;
mod consume;
mod dev_cluster;
mod group;
mod produce;
mod reassign;
mod storage;
mod topic;
mod transactions;

/// The subcommands that talk to a broker; `main.rs` flattens them into its own list.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create, list, describe and delete topics, and change their configs.
    Topic(topic::TopicArgs),
    /// Write the lines of stdin to a topic, one record per line.
    Produce(produce::ProduceArgs),
    /// Print the records of a topic.
    Consume(consume::ConsumeArgs),
    /// Show the brokers, the controller, topic counts and the API versions of the broker.
    Cluster(cluster::ClusterArgs),
    /// List, describe and delete consumer groups, show their lag and reset their offsets.
    Group(group::GroupArgs),
    /// List, describe and abort transactions, show partitions' producers and find hanging
    /// transactions, like kafka-transactions.
    Transactions(transactions::TransactionsArgs),
    /// Move partition replicas between brokers, drain a broker, list or cancel reassignments.
    Reassign(reassign::ReassignArgs),
    /// Elect preferred (or, with --unclean, any) leaders, like kafka-leader-election.
    ElectLeaders(reassign::ElectLeadersArgs),
    /// Format a data directory with its cluster id and node id (like kafka-storage).
    Storage(storage::StorageArgs),
    /// Run a cluster of combined nodes on loopback in the foreground (Ctrl-C stops it).
    DevCluster(dev_cluster::DevClusterArgs),
}

/// The `--bootstrap-server` option every subcommand takes.
#[derive(clap::Args, Debug, Clone)]
pub struct Connection {
    /// Broker to connect to first, `HOST:PORT`; a comma-separated list is tried in order.
    #[arg(
        long,
        global = true,
        value_name = "HOST:PORT",
        default_value = "127.0.0.1:9092"
    )]
    pub bootstrap_server: String,
}

/// Runs one subcommand and exits: 0 on success, 1 with `error: ...` on stderr otherwise. The
/// message is the whole cause chain and never a backtrace, whatever `RUST_BACKTRACE` says.
pub fn run(command: &Command) -> ! {
    let result = match command {
        Command::Topic(args) => topic::run(args),
        Command::Produce(args) => produce::run(args),
        Command::Consume(args) => consume::run(args),
        Command::Cluster(args) => cluster::run(args),
        Command::Group(args) => group::run(args),
        Command::Transactions(args) => transactions::run(args),
        Command::Reassign(args) => reassign::run(args),
        Command::ElectLeaders(args) => reassign::elect(args),
        Command::Storage(args) => storage::run(args),
        Command::DevCluster(args) => dev_cluster::run(args),
    };
    let code = match result {
        Ok(()) => 0,
        // A closed stdout (`sluice consume ... | head`) ends the command quietly, as for any
        // Unix filter.
        Err(e) if is_broken_pipe(&e) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    };
    std::process::exit(code)
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Splits `k=v` for `--config`, `--set` and `--header`.
pub fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// `1 record`, `2 records`.
pub fn plural(n: u64, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}
