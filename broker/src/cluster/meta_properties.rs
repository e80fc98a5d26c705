//! `meta.properties`: the identity a data directory is formatted with, in Kafka's format
//! (`version=1`, `cluster.id`, `node.id`, `directory.id`), so that Kafka's `kafka-storage info`
//! reads it too. A node refuses to start on a directory formatted for another node or another
//! cluster; `sluice storage format` writes it, and the single-node default writes it itself.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

pub const META_PROPERTIES: &str = "meta.properties";
/// Records for the cluster's first controller to write (`storage format --add-scram`), as
/// Kafka's `bootstrap.checkpoint`: one checksummed batch of metadata records.
pub const BOOTSTRAP: &str = "bootstrap.checkpoint";

/// Writes the bootstrap records durably beside `meta.properties`.
pub fn write_bootstrap(
    data_dir: &Path,
    records: &[sluice_replication::records::Record],
) -> anyhow::Result<()> {
    let path = data_dir.join(BOOTSTRAP);
    let tmp = data_dir.join(format!("{BOOTSTRAP}.tmp"));
    let bytes = sluice_replication::records::encode_batch(records);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(data_dir)?.sync_all()
    };
    write().map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))
}

/// The bootstrap records `storage format` left, if any.
pub fn read_bootstrap(data_dir: &Path) -> anyhow::Result<Vec<sluice_replication::records::Record>> {
    let path = data_dir.join(BOOTSTRAP);
    match std::fs::read(&path) {
        Ok(bytes) => sluice_replication::records::decode_batch(&bytes)
            .map_err(|e| anyhow::anyhow!("{} is damaged: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(anyhow::anyhow!("reading {}: {e}", path.display())),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaProperties {
    pub cluster_id: String,
    pub node_id: i32,
    /// Kafka's `directory.id` (KIP-858), base64url like a cluster id.
    pub directory_id: String,
}

/// A new id in Kafka's form (`kafka-storage random-uuid`): a random UUID in URL-safe base64
/// without padding, 22 characters, never starting with '-' (Kafka avoids those too, as they
/// read as command-line options).
pub fn random_id() -> String {
    loop {
        let id = base64url(uuid::Uuid::new_v4().as_bytes());
        if !id.starts_with('-') {
            return id;
        }
    }
}

/// Kafka's text form of a 16-byte id (`Uuid.toString`): URL-safe base64 without padding.
fn base64url(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// An id in Kafka's text form (`Uuid.fromString`): 22 characters of URL-safe base64 that
/// decode to 16 bytes.
pub fn parse_kafka_uuid(text: &str) -> Option<uuid::Uuid> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text)
        .ok()?;
    uuid::Uuid::from_slice(&bytes).ok()
}

impl MetaProperties {
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join(META_PROPERTIES)
    }

    /// Reads the directory's `meta.properties`; `None` when it has none.
    pub fn read(data_dir: &Path) -> anyhow::Result<Option<MetaProperties>> {
        let path = Self::path(data_dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => anyhow::bail!("reading {}: {e}", path.display()),
        };
        let props: BTreeMap<&str, &str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('!'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim(), v.trim()))
            .collect();
        let get = |key: &str| {
            props
                .get(key)
                .copied()
                .ok_or_else(|| anyhow::anyhow!("{} has no {key}", path.display()))
        };
        if get("version")? != "1" {
            anyhow::bail!(
                "{} has version {}; this release reads version 1",
                path.display(),
                get("version")?
            );
        }
        Ok(Some(MetaProperties {
            cluster_id: get("cluster.id")?.to_string(),
            node_id: get("node.id")?
                .parse()
                .map_err(|_| anyhow::anyhow!("{} has a bad node.id", path.display()))?,
            directory_id: props.get("directory.id").unwrap_or(&"").to_string(),
        }))
    }

    /// Writes it durably: a temporary file, fsync, rename, directory fsync.
    pub fn write(&self, data_dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(data_dir)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", data_dir.display()))?;
        let path = Self::path(data_dir);
        let tmp = path.with_extension("properties.tmp");
        let text = format!(
            "#\n#Written by sluice storage format\ncluster.id={}\ndirectory.id={}\nnode.id={}\nversion=1\n",
            self.cluster_id, self.directory_id, self.node_id
        );
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(data_dir)?.sync_all()
        };
        write().map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))
    }
}

/// What `sluice storage format` does: writes `meta.properties` into an unformatted directory.
/// A directory already formatted is an error unless `ignore_formatted` (Kafka's
/// `--ignore-formatted`), and then only if it was formatted the same way.
pub fn format(
    data_dir: &Path,
    cluster_id: &str,
    node_id: i32,
    ignore_formatted: bool,
) -> anyhow::Result<MetaProperties> {
    crate::config::validate_cluster_id(cluster_id).map_err(anyhow::Error::msg)?;
    if node_id < 0 {
        anyhow::bail!("node.id must be 0 or more, not {node_id}");
    }
    if let Some(existing) = MetaProperties::read(data_dir)? {
        if !ignore_formatted {
            anyhow::bail!(
                "{} is already formatted (cluster {}, node {}); --ignore-formatted leaves it \
                 as it is",
                data_dir.display(),
                existing.cluster_id,
                existing.node_id
            );
        }
        check(&existing, data_dir, node_id, Some(cluster_id))?;
        return Ok(existing);
    }
    let props = MetaProperties {
        cluster_id: cluster_id.to_string(),
        node_id,
        directory_id: random_id(),
    };
    props.write(data_dir)?;
    Ok(props)
}

fn check(
    props: &MetaProperties,
    data_dir: &Path,
    node_id: i32,
    cluster_id: Option<&str>,
) -> anyhow::Result<()> {
    if props.node_id != node_id {
        anyhow::bail!(
            "{} belongs to node {}, and this is node {node_id} (node.id); give each node its \
             own data directory",
            data_dir.display(),
            props.node_id
        );
    }
    if let Some(id) = cluster_id.filter(|id| *id != props.cluster_id) {
        anyhow::bail!(
            "{} belongs to cluster {}, not to cluster {id}: a node never joins a cluster other \
             than the one its storage was formatted for",
            data_dir.display(),
            props.cluster_id
        );
    }
    Ok(())
}

/// At start: the directory's identity, checked against the configuration. An unformatted
/// directory of the single-node default formats itself with the configured `cluster.id`, else
/// a new random id as `kafka-storage random-uuid` makes (a directory holding data from a
/// release before `meta.properties` keeps the id that release reported); a cluster node's must
/// have been formatted first.
fn load_or_format_first(config: &crate::config::BrokerConfig) -> anyhow::Result<MetaProperties> {
    let dir = &config.data_dir;
    let configured = config
        .cluster_id_configured
        .then_some(config.cluster_id.as_str());
    match MetaProperties::read(dir)? {
        Some(props) => {
            check(&props, dir, config.node_id, configured)?;
            Ok(props)
        }
        None if !config.is_cluster() => {
            let id = if config.cluster_id_configured {
                config.cluster_id.clone()
            } else if holds_data(dir) {
                crate::config::SINGLE_NODE_CLUSTER_ID.to_string()
            } else {
                random_id()
            };
            format(dir, &id, config.node_id, false)
        }
        None => anyhow::bail!(
            "{} is not formatted: run `sluice storage format --cluster-id ID --node-id {} \
             --data-dir {}` on every node with the same ID (`sluice storage random-uuid` \
             makes one) before starting it",
            dir.display(),
            config.node_id,
            dir.display()
        ),
    }
}

/// Every log directory's identity at start: the first (which holds the metadata log) as
/// [`load_or_format_first`] does; any other is checked against it, or, when it has no
/// meta.properties yet (a disk just added), formatted with the same cluster and node and a new
/// directory id, as Kafka does with a new empty log directory. Two directories with one id
/// (one copied from the other) are refused.
pub fn load_or_format(
    config: &crate::config::BrokerConfig,
) -> anyhow::Result<(MetaProperties, Vec<String>)> {
    let first = load_or_format_first(config)?;
    let mut ids = vec![first.directory_id.clone()];
    for dir in config.log_dirs.iter().skip(1) {
        let props = match MetaProperties::read(dir)? {
            Some(props) => {
                check(&props, dir, first.node_id, Some(&first.cluster_id))?;
                props
            }
            None => {
                let props = MetaProperties {
                    cluster_id: first.cluster_id.clone(),
                    node_id: first.node_id,
                    directory_id: random_id(),
                };
                props.write(dir)?;
                tracing::info!(dir = %dir.display(), directory_id = %props.directory_id, "formatted a new log directory");
                props
            }
        };
        if !props.directory_id.is_empty() && ids.contains(&props.directory_id) {
            anyhow::bail!(
                "{} has the directory.id {} of another log directory (a copy?); give it its own \
                 by removing its meta.properties if it holds no data",
                dir.display(),
                props.directory_id
            );
        }
        ids.push(props.directory_id);
    }
    Ok((first, ids))
}

/// Whether `dir` holds anything but what a start leaves behind before formatting (a lock file,
/// an empty directory): data written by an earlier release.
fn holds_data(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            !name.starts_with(".lock") && name != "lost+found"
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_look_like_kafkas() {
        for _ in 0..100 {
            let id = random_id();
            assert_eq!(id.len(), 22, "{id}");
            assert!(!id.starts_with('-'));
            crate::config::validate_cluster_id(&id).unwrap();
        }
        // The known encoding of 16 zero bytes and of 0xff..: "AAAA...A" and "____...w".
        assert_eq!(base64url(&[0; 16]), "AAAAAAAAAAAAAAAAAAAAAA");
        assert_eq!(base64url(&[0xff; 16]), "_____________________w");
        assert_eq!(base64url(b"Man"), "TWFu");
        let id = uuid::Uuid::new_v4();
        assert_eq!(parse_kafka_uuid(&base64url(id.as_bytes())), Some(id));
        assert_eq!(
            parse_kafka_uuid("AAAAAAAAAAAAAAAAAAAAAA"),
            Some(uuid::Uuid::nil())
        );
        assert!(parse_kafka_uuid("not-an-id").is_none());
        assert!(parse_kafka_uuid("AAAA").is_none());
    }

    #[test]
    fn a_directory_keeps_its_identity() {
        let dir = tempfile::tempdir().unwrap();
        let props = format(dir.path(), "abc-DEF_1", 3, false).unwrap();
        assert_eq!(
            MetaProperties::read(dir.path()).unwrap(),
            Some(props.clone())
        );
        let again = format(dir.path(), "abc-DEF_1", 3, false).unwrap_err();
        assert!(again.to_string().contains("already formatted"), "{again}");
        assert_eq!(format(dir.path(), "abc-DEF_1", 3, true).unwrap(), props);
        let other_cluster = format(dir.path(), "other", 3, true).unwrap_err();
        assert!(
            other_cluster
                .to_string()
                .contains("belongs to cluster abc-DEF_1"),
            "{other_cluster}"
        );
        let other_node = format(dir.path(), "abc-DEF_1", 4, true).unwrap_err();
        assert!(
            other_node.to_string().contains("belongs to node 3"),
            "{other_node}"
        );
        assert!(format(dir.path(), "has space", 3, true).is_err());
    }

    #[test]
    fn kafkas_own_meta_properties_read() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(META_PROPERTIES),
            "#\n#Tue Dec 01 10:00:00 UTC 2026\nnode.id=2\ndirectory.id=J8aAPcfLQt2bqs1JT_rMgQ\n\
             version=1\ncluster.id=MkU3OEVBNTcwNTJENDM2Qk\n",
        )
        .unwrap();
        let props = MetaProperties::read(dir.path()).unwrap().unwrap();
        assert_eq!(props.cluster_id, "MkU3OEVBNTcwNTJENDM2Qk");
        assert_eq!(props.node_id, 2);
        std::fs::write(dir.path().join(META_PROPERTIES), "version=0\nnode.id=2\n").unwrap();
        assert!(MetaProperties::read(dir.path()).is_err());
    }
}
