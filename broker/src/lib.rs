//! The Sluice broker as a library: shards, the Kafka protocol server, coordinators and the
//! `sluice` CLI. The `sluice` binary (`src/main.rs`) only calls [`main`]; the fuzz targets
//! (`fuzz/`) decode requests through [`wire`].

use std::path::PathBuf;

use clap::{Parser, Subcommand};

mod cli;
mod cluster;
mod codec;
mod config;
mod config_catalog;
mod errors;
mod features;
mod group;
mod handlers;
#[cfg(test)]
mod layers;
mod loggers;
mod metadata;
mod metrics;
mod net;
mod peer;
mod quota;
mod security;
mod server;
mod shard;
mod share;
mod topic_config;
mod txn;

use config::BrokerConfig;

/// Request decoding exactly as a connection does it (size prefix, header, body), for the fuzz
/// targets in `fuzz/` and for tests.
pub mod wire {
    pub use crate::codec::frame::{body_len, decode_frame, decode_header, Decoded, Header};
    pub use crate::codec::{decode_request, supported, SUPPORTED};
    /// TLS as the listeners and this node's links to the others set it up, for the fuzz
    /// targets.
    pub use crate::config::security::{ClientAuth, SslConfig};
    /// SASL as a connection runs it, for the fuzz targets.
    pub use crate::security::sasl::{Authenticator, Outcome, SaslServer};
    pub use crate::security::scram::Mechanism as ScramMechanism;
    pub use crate::security::tls::{
        client_config as tls_client_config, server_config as tls_server_config,
    };
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
    /// TOML file with broker settings under Kafka's names (`listeners`, `log.dirs`, ...);
    /// flags win over it. Every setting is in broker/SETTINGS.md.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Every broker setting as a flag (`config/settings.rs`).
    #[command(flatten)]
    settings: config::settings::SettingArgs,
    /// A setting by its Kafka name, applied after the flags, as `kafka-server-start --override`
    /// takes it; also the names with a listener prefix, such as
    /// `listener.name.client.plain.sasl.jaas.config`. Repeatable.
    #[arg(long = "override", value_name = "NAME=VALUE")]
    overrides: Vec<String>,
}

fn broker_config(args: &ServeArgs) -> anyhow::Result<BrokerConfig> {
    let mut config = BrokerConfig::default();
    if let Some(path) = &args.config {
        config.apply_file(path)?;
    }
    config.apply_flags(&args.settings)?;
    for entry in &args.overrides {
        let (name, value) = entry.split_once('=').ok_or_else(|| {
            anyhow::anyhow!(
                "--override {:?}: write NAME=VALUE",
                entry.split('=').next().unwrap_or("")
            )
        })?;
        config
            .set(name.trim(), value)
            .map_err(|e| anyhow::anyhow!("--override {}: {e}", name.trim()))?;
    }
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
