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
        /// The node's `log.dirs` (comma-separated, each formatted); default: the config
        /// file's, else ./data.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// The broker's TOML config file, for `node.id` and `log.dirs`.
        #[arg(long, short = 'c')]
        config: Option<PathBuf>,
        /// Succeed without changing a directory formatted the same way already.
        #[arg(long, short = 'g')]
        ignore_formatted: bool,
        /// A SCRAM user the new cluster starts with, as kafka-storage takes it:
        /// 'SCRAM-SHA-256=[name=alice,password=alice-secret]' (also iterations=, salt= in
        /// base64). Repeat for more users; the cluster's first controller stores them.
        #[arg(long, short = 'S', value_name = "MECHANISM=[name=..,password=..]")]
        add_scram: Vec<String>,
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
            add_scram,
        } => {
            let scram = add_scram
                .iter()
                .map(|arg| parse_scram(arg))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let mut broker = crate::config::BrokerConfig::default();
            if let Some(path) = config {
                broker.apply_file(path)?;
            }
            if let Some(dirs) = data_dir {
                broker.set("log.dirs", &dirs.to_string_lossy())?;
            }
            let node_id = node_id.unwrap_or(broker.node_id);
            // Every log directory gets its own meta.properties (and directory id); the first,
            // which holds the metadata log, also the bootstrap records.
            for (i, dir) in broker.log_dirs.iter().enumerate() {
                let before = MetaProperties::read(dir)?;
                let props = meta_properties::format(dir, cluster_id, node_id, *ignore_formatted)?;
                if before.is_some() {
                    println!("{} is already formatted; left as it is.", dir.display());
                    continue;
                }
                if i == 0 && !scram.is_empty() {
                    let records: Vec<_> = scram
                        .iter()
                        .cloned()
                        .map(sluice_replication::records::Record::UserScramCredential)
                        .collect();
                    meta_properties::write_bootstrap(dir, &records)?;
                }
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

/// One `--add-scram` argument as a credential: the salted password is derived here (PBKDF2),
/// and only the salt and keys are kept. The error names no password.
fn parse_scram(
    arg: &str,
) -> anyhow::Result<sluice_replication::records::UserScramCredentialRecord> {
    use base64::Engine as _;
    use sluice_replication::controller::{SCRAM_ITERATIONS_MAX, SCRAM_ITERATIONS_MIN};
    let usage = "--add-scram takes MECHANISM=[name=<user>,password=<password>], e.g. \
                 'SCRAM-SHA-256=[name=alice,password=alice-secret]'";
    let (mechanism, rest) = arg.split_once('=').ok_or_else(|| anyhow::anyhow!(usage))?;
    let m = crate::security::scram::Mechanism::from_name(mechanism.trim()).ok_or_else(|| {
        anyhow::anyhow!("--add-scram: {mechanism:?} is not SCRAM-SHA-256 or SCRAM-SHA-512")
    })?;
    let body = rest
        .trim()
        .strip_prefix('[')
        .and_then(|b| b.strip_suffix(']'))
        .ok_or_else(|| anyhow::anyhow!(usage))?;
    let (mut name, mut password, mut salt, mut iterations) = (None, None, None, 4096);
    for (key, value) in split_options(body).ok_or_else(|| anyhow::anyhow!(usage))? {
        match key.as_str() {
            "name" => name = Some(value),
            "password" => password = Some(value),
            "salt" => {
                salt = Some(
                    base64::engine::general_purpose::STANDARD
                        .decode(&value)
                        .map_err(|_| anyhow::anyhow!("--add-scram: the salt is not base64"))?,
                )
            }
            "iterations" => {
                iterations = value
                    .parse()
                    .map_err(|_| anyhow::anyhow!("--add-scram: iterations is not a number"))?
            }
            other => anyhow::bail!("--add-scram: unknown option {other:?} ({usage})"),
        }
    }
    let (Some(name), Some(password)) = (name, password) else {
        anyhow::bail!("--add-scram: name and password are required ({usage})");
    };
    if name.is_empty() {
        anyhow::bail!("--add-scram: the user name is empty");
    }
    if !(SCRAM_ITERATIONS_MIN..=SCRAM_ITERATIONS_MAX).contains(&iterations) {
        anyhow::bail!(
            "--add-scram: iterations must be {SCRAM_ITERATIONS_MIN} to {SCRAM_ITERATIONS_MAX}, not {iterations}"
        );
    }
    let salt = salt.unwrap_or_else(|| crate::security::scram::random_bytes(32));
    let salted = m.salted_password(password.as_bytes(), &salt, iterations as u32);
    Ok(m.credential(&name, &salt, &salted, iterations))
}

/// `k=v,k="v, with commas"`: the options of one `--add-scram`, values optionally quoted.
fn split_options(body: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let (value, after) = if let Some(quoted) = after.strip_prefix('"') {
            let end = quoted.find('"')?;
            (&quoted[..end], &quoted[end + 1..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        out.push((key.trim().to_ascii_lowercase(), value.to_string()));
        rest = match after.trim_start().strip_prefix(',') {
            Some(r) => r.trim_start(),
            None if after.trim().is_empty() => "",
            None => return None,
        };
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_scram_arguments_as_kafka_storage_takes_them() {
        let c = parse_scram("SCRAM-SHA-256=[name=alice,password=alice-secret]").unwrap();
        assert_eq!(
            (c.name.as_str(), c.mechanism, c.iterations),
            ("alice", 1, 4096)
        );
        assert_eq!(
            (c.salt.len(), c.stored_key.len(), c.server_key.len()),
            (32, 32, 32)
        );
        let c = parse_scram(
            r#"SCRAM-SHA-512=[name="bob",password="a, b=c]",iterations=8192,salt=c2FsdA==]"#,
        )
        .unwrap();
        assert_eq!(
            (c.name.as_str(), c.mechanism, c.iterations),
            ("bob", 2, 8192)
        );
        assert_eq!(c.salt, b"salt");
        let m = crate::security::scram::Mechanism::Sha512;
        assert_eq!(
            c,
            m.credential(
                "bob",
                b"salt",
                &m.salted_password(b"a, b=c]", b"salt", 8192),
                8192
            )
        );
        for (bad, says) in [
            ("SCRAM-SHA-1=[name=a,password=b]", "is not SCRAM-SHA-256"),
            ("SCRAM-SHA-256=name=a,password=b", "takes MECHANISM"),
            ("SCRAM-SHA-256=[name=a]", "required"),
            (
                "SCRAM-SHA-256=[name=a,password=secret-pw,iterations=10]",
                "iterations must be",
            ),
            (
                "SCRAM-SHA-256=[name=a,password=secret-pw,colour=red]",
                "unknown option",
            ),
            (
                "SCRAM-SHA-256=[name=a,password=\"secret-pw]",
                "takes MECHANISM",
            ),
        ] {
            let e = parse_scram(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
            assert!(!e.contains("secret-pw"), "{e}");
        }
    }
}
