//! `sluice storage`: formats a data directory with its cluster id and node id, as Kafka's
//! `kafka-storage` does (`format`, `random-uuid`, `info`). It works on the directory, never
//! on a running broker.

use std::path::PathBuf;

use crate::cluster::meta_properties::{self, MetaProperties};

#[derive(clap::Args, Debug)]
pub struct StorageArgs {
    #[command(subcommand)]
    command: StorageCommand,
}

#[derive(clap::Subcommand, Debug)]
enum StorageCommand {
    /// Writes meta.properties (cluster id, node id) into a data directory, once, before the
    /// node's first start. Every node of a cluster is formatted with the same cluster id.
    Format {
        /// The cluster id (`-t` in kafka-storage); `sluice storage random-uuid` makes one.
        #[arg(long, short = 't')]
        cluster_id: String,
        /// The node's `node.id`; default: the config file's, else 1.
        #[arg(long)]
        node_id: Option<i32>,
        /// The node's `log.dirs`; default: the config file's, else ./data.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// The broker's TOML config file, for `node.id` and `log.dirs`.
        #[arg(long, short = 'c')]
        config: Option<PathBuf>,
        /// Succeed without changing a directory formatted the same way already.
        #[arg(long, short = 'g')]
        ignore_formatted: bool,
    },
    /// Prints a new cluster id.
    RandomUuid,
    /// Prints what a data directory was formatted with.
    Info {
        #[arg(long)]
        data_dir: PathBuf,
    },
}

pub fn run(args: &StorageArgs) -> anyhow::Result<()> {
    match &args.command {
        StorageCommand::RandomUuid => println!("{}", meta_properties::random_id()),
        StorageCommand::Format {
            cluster_id,
            node_id,
            data_dir,
            config,
            ignore_formatted,
        } => {
            let mut broker = crate::config::BrokerConfig::default();
            if let Some(path) = config {
                broker.apply_file(path)?;
            }
            let dir = data_dir.clone().unwrap_or(broker.data_dir);
            let node_id = node_id.unwrap_or(broker.node_id);
            let before = MetaProperties::read(&dir)?;
            let props = meta_properties::format(&dir, cluster_id, node_id, *ignore_formatted)?;
            if before.is_some() {
                println!("{} is already formatted; left as it is.", dir.display());
            } else {
                println!(
                    "Formatted {} for cluster {} as node {}.",
                    dir.display(),
                    props.cluster_id,
                    props.node_id
                );
            }
        }
        StorageCommand::Info { data_dir } => match MetaProperties::read(data_dir)? {
            Some(p) => {
                println!("Found log directory:\n  {}\n", data_dir.display());
                println!(
                    "Found metadata: {{cluster.id={}, directory.id={}, node.id={}, version=1}}",
                    p.cluster_id, p.directory_id, p.node_id
                );
            }
            None => anyhow::bail!(
                "{} is not formatted (no meta.properties)",
                data_dir.display()
            ),
        },
    }
    Ok(())
}
