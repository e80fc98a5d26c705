//! The metadata image: topics, their ids, partition counts, configs and the shard that owns
//! each partition. Shard 0 owns the authoritative copy and persists it; every shard holds an
//! immutable `Arc<MetadataImage>` replaced by message when it changes.
//!
//! Built from the metadata log's committed image (`metadata/view.rs`). A single-node broker from
//! before the metadata log kept it as JSON in `<data>/.sluice-metadata.json`; that file is read
//! once, imported into the log, and retired (`server.rs`).

pub mod view;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sluice_engine::{Compression, CompressionType, FlushMode, LogConfig, TimestampType};

pub const METADATA_FILE: &str = ".sluice-metadata.json";

/// The owner "shard" of a partition that has no replica on this node (cluster mode).
pub const NOT_HOSTED: u16 = u16::MAX;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TopicMeta {
    pub name: String,
    pub id: uuid::Uuid,
    /// Owner shard of each partition, by partition index. Stored so placement survives
    /// restarts; with fewer shards than recorded, the owner is `shard % shards`.
    pub shards: Vec<u16>,
    /// Topic-level config overrides, Kafka names.
    pub configs: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct MetadataImage {
    pub version: u64,
    pub topics: BTreeMap<String, TopicMeta>,
    /// Shards of the running broker; set at start, not persisted meaningfully.
    #[serde(default)]
    pub shards: usize,
    /// Next idempotent producer id to hand out (InitProducerId).
    #[serde(default)]
    pub next_producer_id: i64,
    /// Dynamic broker configs (AlterConfigs / IncrementalAlterConfigs on a broker resource), by
    /// resource name: "" for the cluster-wide default, the node id for one broker. Kafka names.
    #[serde(default)]
    pub broker_configs: BTreeMap<String, BTreeMap<String, String>>,
    /// Topic names by id, built on the first lookup by id (Fetch v13+ names topics by id).
    #[serde(skip)]
    ids: TopicIds,
    /// In a cluster: brokers, partition leaders and the controller, from the cluster's
    /// metadata image. `None` on the single-node default, which leads everything itself.
    #[serde(skip)]
    pub cluster: Option<Arc<crate::metadata::view::ClusterView>>,
}

/// An index from topic id to name, for an image that is no longer changed once published. It is
/// a cache, never the truth: a clone starts empty (a clone is what gets changed), and a lookup
/// checks the id of the topic it finds and falls back to a scan on a miss, so an index built
/// before a change can only cost time, never give a wrong answer.
#[derive(Default)]
struct TopicIds(std::sync::OnceLock<std::collections::HashMap<uuid::Uuid, String>>);

impl Clone for TopicIds {
    fn clone(&self) -> TopicIds {
        TopicIds::default()
    }
}

impl PartialEq for TopicIds {
    fn eq(&self, _: &TopicIds) -> bool {
        true
    }
}

impl std::fmt::Debug for TopicIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TopicIds")
    }
}

impl MetadataImage {
    /// Whether `topic` exists and has a partition `partition`.
    pub fn has_partition(&self, topic: &str, partition: i32) -> bool {
        self.topics
            .get(topic)
            .is_some_and(|t| (0..t.shards.len() as i32).contains(&partition))
    }

    /// A dynamic broker config as this broker sees it: its own value, else the cluster-wide
    /// default, with the source that set it (2 = per broker, 3 = cluster default, as Kafka's
    /// DescribeConfigs `config_source`).
    pub fn dynamic_broker_config(&self, node_id: i32, name: &str) -> Option<(&str, i8)> {
        let ours = self
            .broker_configs
            .get(&node_id.to_string())
            .and_then(|m| m.get(name));
        if let Some(v) = ours {
            return Some((v.as_str(), 2));
        }
        self.broker_configs
            .get("")
            .and_then(|m| m.get(name))
            .map(|v| (v.as_str(), 3))
    }

    /// A topic's configs with the dynamic broker defaults filled in under topic names, then its
    /// own overrides on top: what its logs run with.
    pub fn effective_topic_configs(
        &self,
        node_id: i32,
        topic: &TopicMeta,
    ) -> BTreeMap<String, String> {
        let mut configs = BTreeMap::new();
        for (topic_key, broker_key) in crate::topic_config::broker_synonyms() {
            if let Some((v, _)) = self.dynamic_broker_config(node_id, broker_key) {
                configs.insert(topic_key.to_string(), v.to_string());
            }
        }
        configs.extend(topic.configs.iter().map(|(k, v)| (k.clone(), v.clone())));
        configs
    }
}

impl MetadataImage {
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join(METADATA_FILE)
    }

    pub fn load(data_dir: &Path) -> anyhow::Result<MetadataImage> {
        let path = Self::path(data_dir);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| anyhow::anyhow!("metadata {} is damaged: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(MetadataImage::default()),
            Err(e) => Err(anyhow::anyhow!("reading {}: {e}", path.display())),
        }
    }

    pub fn topic_by_id(&self, id: uuid::Uuid) -> Option<&TopicMeta> {
        let ids = self.ids.0.get_or_init(|| {
            self.topics
                .values()
                .map(|t| (t.id, t.name.clone()))
                .collect()
        });
        match ids.get(&id).and_then(|name| self.topics.get(name)) {
            Some(t) if t.id == id => Some(t),
            _ => self.topics.values().find(|t| t.id == id),
        }
    }

    /// The shard that owns a partition's replica on this node; `None` for an unknown
    /// partition and, in a cluster, for one with no replica here ([`Self::led_elsewhere`]).
    pub fn owner(&self, topic: &str, partition: i32, shards: usize) -> Option<usize> {
        let t = self.topics.get(topic)?;
        let s = *t.shards.get(usize::try_from(partition).ok()?)?;
        (s != NOT_HOSTED).then_some(s as usize % shards)
    }

    /// Whether a partition exists but this node does not lead it (it may still hold a
    /// replica): requests for it get NOT_LEADER_OR_FOLLOWER, never UNKNOWN_TOPIC_OR_PARTITION.
    pub fn led_elsewhere(&self, node_id: i32, topic: &str, partition: i32) -> bool {
        self.cluster
            .as_ref()
            .and_then(|c| c.partition(topic, partition))
            .is_some_and(|p| p.leader != node_id)
    }

    /// The error for a partition this shard's image has no owner for: NOT_LEADER_OR_FOLLOWER
    /// when another broker leads it, else UNKNOWN_TOPIC_OR_PARTITION.
    pub fn missing_partition_error(&self, node_id: i32, topic: &str, partition: i32) -> i16 {
        if self.led_elsewhere(node_id, topic, partition) {
            kafka_protocol::ResponseError::NotLeaderOrFollower.code()
        } else {
            kafka_protocol::ResponseError::UnknownTopicOrPartition.code()
        }
    }

    /// The leader of a partition and its epoch, with the leader's endpoint: for KIP-951's
    /// `current_leader` and `node_endpoints` in NOT_LEADER_OR_FOLLOWER answers.
    /// A broker's rack (`broker.rack`), if it has one and the image knows it.
    pub fn broker_rack(&self, id: i32) -> Option<&str> {
        self.cluster.as_ref()?.broker(id)?.rack.as_deref()
    }

    pub fn leader_of(
        &self,
        topic: &str,
        partition: i32,
    ) -> Option<(
        &crate::metadata::view::PartitionInfo,
        Option<&crate::metadata::view::BrokerInfo>,
    )> {
        let cluster = self.cluster.as_ref()?;
        let p = cluster.partition(topic, partition)?;
        Some((p, cluster.broker(p.leader)))
    }
}

/// Replaces `path` with `bytes` durably: a temporary file beside it, fsync, rename, fsync of
/// the directory.
pub fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(dir)?.sync_all()
}

/// Kafka's topic name rules, with Kafka's messages: the controller's, so a name is judged the
/// same wherever it arrives.
pub use sluice_replication::controller::validate_topic_name;

/// Builds the engine's config from topic overrides, checking every value.
pub fn log_config(configs: &BTreeMap<String, String>) -> Result<LogConfig, String> {
    let mut c = LogConfig::default();
    for (key, value) in configs {
        // Every known name is checked against Kafka's type and range; the ones Sluice does not
        // act on stop there.
        let Some(setting) = crate::topic_config::setting(key) else {
            return Err(format!("unknown topic config {key:?}"));
        };
        crate::topic_config::check_value(setting, value)?;
        if setting.support != crate::topic_config::Support::Honoured {
            continue;
        }
        let int = || {
            value
                .parse::<i64>()
                .map_err(|_| format!("{key}={value:?} is not a number"))
        };
        match key.as_str() {
            "cleanup.policy" => {
                let parts: Vec<&str> = value.split(',').map(str::trim).collect();
                if parts.iter().any(|p| *p != "delete" && *p != "compact") || parts.is_empty() {
                    return Err(format!(
                        "cleanup.policy={value:?}: expected delete, compact or both"
                    ));
                }
                c.cleanup_delete = parts.contains(&"delete");
                c.cleanup_compact = parts.contains(&"compact");
            }
            "compression.type" => {
                c.compression_type = match value.as_str() {
                    "producer" => CompressionType::Producer,
                    "uncompressed" => CompressionType::Codec(Compression::None),
                    "gzip" => CompressionType::Codec(Compression::Gzip),
                    "snappy" => CompressionType::Codec(Compression::Snappy),
                    "lz4" => CompressionType::Codec(Compression::Lz4),
                    "zstd" => CompressionType::Codec(Compression::Zstd),
                    _ => {
                        return Err(format!(
                            "compression.type={value:?}: expected producer, uncompressed, gzip, \
                             snappy, lz4 or zstd"
                        ))
                    }
                }
            }
            "delete.retention.ms" => c.delete_retention_ms = int()?.max(0),
            "flush.mode" => {
                c.flush_mode = match value.as_str() {
                    "batch" => FlushMode::Batch,
                    "interval" => FlushMode::Interval,
                    "none" => FlushMode::None,
                    _ => {
                        return Err(format!(
                            "flush.mode={value:?}: expected batch, interval or none"
                        ))
                    }
                }
            }
            "flush.ms" => c.flush_ms = int()?.max(0),
            "index.interval.bytes" => {
                c.index_interval_bytes = int()?.clamp(0, i32::MAX as i64) as u32
            }
            "max.message.bytes" => {
                let v = int()?;
                if v < 0 {
                    return Err(format!("max.message.bytes={value} must be at least 0"));
                }
                c.max_message_bytes = v.min(u32::MAX as i64) as u32;
            }
            "message.timestamp.type" => {
                c.message_timestamp_type = match value.as_str() {
                    "CreateTime" => TimestampType::CreateTime,
                    "LogAppendTime" => TimestampType::LogAppendTime,
                    _ => {
                        return Err(format!(
                        "message.timestamp.type={value:?}: expected CreateTime or LogAppendTime"
                    ))
                    }
                }
            }
            "retention.bytes" => c.retention_bytes = int()?,
            "retention.ms" => c.retention_ms = int()?,
            "segment.bytes" => {
                let v = int()?;
                if v < 14 {
                    return Err(format!("segment.bytes={value} must be at least 14"));
                }
                c.segment_bytes = v as u64;
            }
            "segment.ms" => c.segment_ms = int()?.max(1),
            // Replication's, not the log's: the partition's leader reads it.
            "min.insync.replicas" => {
                if int()? < 1 {
                    return Err(format!("min.insync.replicas={value} must be at least 1"));
                }
            }
            // The controller's: whether an out-of-sync replica may lead when no in-sync one can.
            "unclean.leader.election.enable" => {
                if value != "true" && value != "false" {
                    return Err(format!(
                        "unclean.leader.election.enable={value:?}: expected true or false"
                    ));
                }
            }
            // The replication throttle's replicas (`kafka-reassign-partitions --throttle`):
            // `*` or `partition:broker` pairs. The follower's is applied by its fetchers.
            "leader.replication.throttled.replicas" | "follower.replication.throttled.replicas" => {
                let pairs_ok = value.split(',').map(str::trim).all(|pair| {
                    pair.split_once(':').is_some_and(|(p, b)| {
                        p.trim().parse::<i32>().is_ok() && b.trim().parse::<i32>().is_ok()
                    })
                });
                if !(value.trim() == "*" || value.trim().is_empty() || pairs_ok) {
                    return Err(format!(
                        "{key}={value:?}: expected * or a list of partition:broker pairs"
                    ));
                }
            }
            other => return Err(format!("unknown topic config {other:?}")),
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_kafka_rules() {
        assert!(validate_topic_name("orders.v1_2-x").is_ok());
        assert!(validate_topic_name("").is_err());
        assert!(validate_topic_name("..").is_err());
        assert!(validate_topic_name("a/b").is_err());
        assert!(validate_topic_name(&"x".repeat(250)).is_err());
    }

    #[test]
    fn configs_map_to_the_engine() {
        let mut m = BTreeMap::new();
        m.insert("cleanup.policy".to_string(), "compact,delete".to_string());
        m.insert("flush.mode".to_string(), "none".to_string());
        m.insert("segment.bytes".to_string(), "1048576".to_string());
        let c = log_config(&m).unwrap();
        assert!(c.cleanup_compact && c.cleanup_delete);
        assert_eq!(c.flush_mode, FlushMode::None);
        assert_eq!(c.segment_bytes, 1 << 20);
        m.insert("retention.ms".to_string(), "soon".to_string());
        assert!(log_config(&m).is_err());
        let mut bad = BTreeMap::new();
        bad.insert("no.such.config".to_string(), "1".to_string());
        assert!(log_config(&bad).is_err());
    }

    #[test]
    fn compression_type_takes_kafkas_values() {
        let with = |value: &str| {
            let mut m = BTreeMap::new();
            m.insert("compression.type".to_string(), value.to_string());
            log_config(&m).map(|c| c.compression_type)
        };
        assert_eq!(
            LogConfig::default().compression_type,
            CompressionType::Producer
        );
        assert_eq!(with("producer"), Ok(CompressionType::Producer));
        for (value, codec) in [
            ("uncompressed", Compression::None),
            ("gzip", Compression::Gzip),
            ("snappy", Compression::Snappy),
            ("lz4", Compression::Lz4),
            ("zstd", Compression::Zstd),
        ] {
            assert_eq!(with(value), Ok(CompressionType::Codec(codec)));
        }
        // Kafka's names only, case and all.
        for value in ["none", "GZIP", "brotli", ""] {
            assert!(with(value).is_err(), "{value:?}");
        }
    }
}
