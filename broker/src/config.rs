//! Broker configuration: Kafka's names, from a TOML file and command-line flags (flags win).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// Settings the broker reads at start. Keys in the TOML file are Kafka's (`listeners`,
/// `advertised.listeners`, `log.dirs`, `num.partitions`, `auto.create.topics.enable`, ...).
#[derive(Clone, Debug)]
pub struct BrokerConfig {
    pub node_id: i32,
    pub cluster_id: String,
    /// `listeners`: where the Kafka protocol is served.
    pub listener: SocketAddr,
    /// `advertised.listeners`: host and port clients are told to connect to.
    pub advertised_host: String,
    pub advertised_port: u16,
    /// `log.dirs` (one directory).
    pub data_dir: PathBuf,
    /// Number of shards (cores); 0 = every core.
    pub cores: usize,
    /// `num.partitions`: partitions of auto-created topics and CreateTopics with -1.
    pub num_partitions: i32,
    /// `auto.create.topics.enable`
    pub auto_create_topics: bool,
    /// `socket.request.max.bytes`: larger frames close the connection.
    pub socket_request_max_bytes: u32,
    /// Per-shard batch cache budget.
    pub batch_cache_bytes: u64,
    /// `fetch.max.bytes` (broker): the most record bytes one fetch response carries, whatever
    /// the client asks (its first batch always goes, so a consumer makes progress).
    pub fetch_max_bytes: usize,
    /// `fetch.zero.copy` (Sluice's own): fetch responses splice records that are on disk from
    /// the segment files to the socket rather than copy them through the broker's memory.
    pub fetch_zero_copy: bool,
    /// `group.initial.rebalance.delay.ms`: how long a new group waits for more members.
    pub group_initial_rebalance_delay_ms: u64,
    /// `group.consumer.session.timeout.ms`: a KIP-848 (`group.protocol=consumer`) member that
    /// sends no heartbeat for this long leaves its group and its partitions move to the others.
    pub group_consumer_session_timeout_ms: u64,
    /// `group.consumer.heartbeat.interval.ms`: how often KIP-848 members are told to heartbeat;
    /// less than the session timeout.
    pub group_consumer_heartbeat_interval_ms: u64,
    /// `offsets.topic.num.partitions`
    pub offsets_topic_partitions: i32,
    /// `max.connections`: client connections the broker holds open at once, over all shards;
    /// more are accepted and closed at once, with a (rate-limited) log line.
    pub max_connections: usize,
    /// `max.connections.per.ip`: the same limit per client IP address.
    pub max_connections_per_ip: usize,
    /// `connections.max.idle.ms`: a connection that makes no progress for this long (no complete
    /// request read and no response written) is closed. Bytes of an unfinished request do not
    /// count as progress, so a client trickling a request byte by byte is closed too.
    pub connections_max_idle_ms: u64,
    /// `max.in.flight.requests.per.connection`: requests of one connection read and not yet
    /// answered before the broker stops reading from it (Kafka has no broker-side name for this;
    /// the client-side name says the same thing from the other end).
    pub max_in_flight_requests_per_connection: usize,
    /// `group.min.session.timeout.ms` and `group.max.session.timeout.ms`: the session timeouts
    /// a classic group member may ask for in JoinGroup (INVALID_SESSION_TIMEOUT otherwise).
    pub group_min_session_timeout_ms: i64,
    pub group_max_session_timeout_ms: i64,
    /// `log.retention.check.interval.ms`: how often each shard applies time and size retention
    /// to its partitions.
    pub log_retention_check_interval_ms: u64,
    /// `log.cleaner.backoff.ms`: how often each shard compacts its `cleanup.policy=compact`
    /// partitions. Kafka's cleaner sleeps this long when it finds nothing to clean.
    pub log_cleaner_backoff_ms: u64,
    /// `group.consumer.migration.policy`: whether a classic group converts to a consumer group
    /// when a `group.protocol=consumer` member joins it (upgrade), and back when the last such
    /// member leaves (downgrade).
    pub group_consumer_migration_policy: MigrationPolicy,
}

/// Kafka's `group.consumer.migration.policy`; its default is `bidirectional`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MigrationPolicy {
    Disabled,
    Upgrade,
    Downgrade,
    #[default]
    Bidirectional,
}

impl MigrationPolicy {
    pub fn upgrade(self) -> bool {
        matches!(
            self,
            MigrationPolicy::Upgrade | MigrationPolicy::Bidirectional
        )
    }

    pub fn downgrade(self) -> bool {
        matches!(
            self,
            MigrationPolicy::Downgrade | MigrationPolicy::Bidirectional
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            MigrationPolicy::Disabled => "disabled",
            MigrationPolicy::Upgrade => "upgrade",
            MigrationPolicy::Downgrade => "downgrade",
            MigrationPolicy::Bidirectional => "bidirectional",
        }
    }
}

impl std::str::FromStr for MigrationPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "disabled" => Ok(MigrationPolicy::Disabled),
            "upgrade" => Ok(MigrationPolicy::Upgrade),
            "downgrade" => Ok(MigrationPolicy::Downgrade),
            "bidirectional" => Ok(MigrationPolicy::Bidirectional),
            _ => Err(format!(
                "group.consumer.migration.policy must be disabled, upgrade, downgrade or \
                 bidirectional, not {s:?}"
            )),
        }
    }
}

/// Kafka's defaults for `group.min.session.timeout.ms` (6 s) and `group.max.session.timeout.ms`
/// (30 minutes).
pub const GROUP_MIN_SESSION_TIMEOUT_MS_DEFAULT: i64 = 6_000;
pub const GROUP_MAX_SESSION_TIMEOUT_MS_DEFAULT: i64 = 1_800_000;

/// Kafka's default `log.retention.check.interval.ms` (5 minutes).
pub const LOG_RETENTION_CHECK_INTERVAL_MS_DEFAULT: u64 = 300_000;

/// Sluice's default `log.cleaner.backoff.ms`, one minute (Kafka's is 15 s). Kafka's cleaner
/// tracks each log's dirty ratio and cleans only logs past `min.cleanable.dirty.ratio`; Sluice
/// has no such tracking yet, so each pass reads every closed segment of every compacted log,
/// and running that four times as often would cost reads for little gain.
pub const LOG_CLEANER_BACKOFF_MS_DEFAULT: u64 = 60_000;

/// Sluice's default broker `fetch.max.bytes`, 2 MiB (Kafka's is 55 MiB). A consumer catching up
/// then takes its backlog in 2 MiB responses rather than 16 MiB ones (16 partitions x 1 MiB),
/// which measured on this project's 2-core test machine (perf/README.md, workload (e)) kept the
/// p99 produce latency of a producer on the same shards near 6.5 ms instead of 17-22 ms, at the
/// same catch-up rate.
pub const FETCH_MAX_BYTES_DEFAULT: usize = 2 << 20;

/// Kafka's default `max.connections` and `max.connections.per.ip`: no limit but the process's
/// descriptors (`Int.MaxValue`).
pub const MAX_CONNECTIONS_DEFAULT: usize = i32::MAX as usize;
/// Kafka's default `connections.max.idle.ms` (10 minutes).
pub const CONNECTIONS_MAX_IDLE_MS_DEFAULT: u64 = 600_000;
/// Requests of one connection being processed before the reader stops reading more.
pub const IN_FLIGHT_PER_CONNECTION_MAX: usize = 64;
/// Kafka's default `group.consumer.session.timeout.ms` (45 s).
pub const GROUP_CONSUMER_SESSION_TIMEOUT_MS_DEFAULT: u64 = 45_000;
/// Kafka's default `group.consumer.heartbeat.interval.ms` (5 s).
pub const GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS_DEFAULT: u64 = 5_000;

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            node_id: 1,
            cluster_id: "sluice-single-node".into(),
            listener: "127.0.0.1:9092".parse().expect("valid address"),
            advertised_host: "127.0.0.1".into(),
            advertised_port: 9092,
            data_dir: PathBuf::from("./data"),
            cores: 0,
            num_partitions: 1,
            auto_create_topics: true,
            socket_request_max_bytes: 104_857_600,
            batch_cache_bytes: 256 << 20,
            fetch_max_bytes: FETCH_MAX_BYTES_DEFAULT,
            fetch_zero_copy: true,
            group_initial_rebalance_delay_ms: 3000,
            group_consumer_session_timeout_ms: GROUP_CONSUMER_SESSION_TIMEOUT_MS_DEFAULT,
            group_consumer_heartbeat_interval_ms: GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS_DEFAULT,
            offsets_topic_partitions: 50,
            max_connections: MAX_CONNECTIONS_DEFAULT,
            max_connections_per_ip: MAX_CONNECTIONS_DEFAULT,
            connections_max_idle_ms: CONNECTIONS_MAX_IDLE_MS_DEFAULT,
            max_in_flight_requests_per_connection: IN_FLIGHT_PER_CONNECTION_MAX,
            log_retention_check_interval_ms: LOG_RETENTION_CHECK_INTERVAL_MS_DEFAULT,
            group_min_session_timeout_ms: GROUP_MIN_SESSION_TIMEOUT_MS_DEFAULT,
            group_max_session_timeout_ms: GROUP_MAX_SESSION_TIMEOUT_MS_DEFAULT,
            log_cleaner_backoff_ms: LOG_CLEANER_BACKOFF_MS_DEFAULT,
            group_consumer_migration_policy: MigrationPolicy::default(),
        }
    }
}

/// The broker's TOML file, under Kafka's names. TOML reads an unquoted `batch.cache.bytes = 1`
/// as nested tables, so the file is flattened back to dotted names before these fields are
/// matched: quoted names, dotted keys and `[batch.cache]` sections all work. A name that is not
/// here is an error, never silently ignored.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(rename = "node.id")]
    node_id: Option<i32>,
    #[serde(rename = "cluster.id")]
    cluster_id: Option<String>,
    listeners: Option<String>,
    #[serde(rename = "advertised.listeners")]
    advertised_listeners: Option<String>,
    #[serde(rename = "log.dirs")]
    log_dirs: Option<String>,
    cores: Option<usize>,
    #[serde(rename = "num.partitions")]
    num_partitions: Option<i32>,
    #[serde(rename = "auto.create.topics.enable")]
    auto_create_topics: Option<bool>,
    #[serde(rename = "socket.request.max.bytes")]
    socket_request_max_bytes: Option<u32>,
    #[serde(rename = "batch.cache.bytes")]
    batch_cache_bytes: Option<u64>,
    #[serde(rename = "fetch.max.bytes")]
    fetch_max_bytes: Option<usize>,
    #[serde(rename = "fetch.zero.copy")]
    fetch_zero_copy: Option<bool>,
    #[serde(rename = "group.initial.rebalance.delay.ms")]
    group_initial_rebalance_delay_ms: Option<u64>,
    #[serde(rename = "group.consumer.session.timeout.ms")]
    group_consumer_session_timeout_ms: Option<u64>,
    #[serde(rename = "group.consumer.heartbeat.interval.ms")]
    group_consumer_heartbeat_interval_ms: Option<u64>,
    #[serde(rename = "offsets.topic.num.partitions")]
    offsets_topic_partitions: Option<i32>,
    #[serde(rename = "max.connections")]
    max_connections: Option<usize>,
    #[serde(rename = "max.connections.per.ip")]
    max_connections_per_ip: Option<usize>,
    #[serde(rename = "connections.max.idle.ms")]
    connections_max_idle_ms: Option<u64>,
    #[serde(rename = "max.in.flight.requests.per.connection")]
    max_in_flight_requests_per_connection: Option<usize>,
    #[serde(rename = "log.retention.check.interval.ms")]
    log_retention_check_interval_ms: Option<u64>,
    #[serde(rename = "group.min.session.timeout.ms")]
    group_min_session_timeout_ms: Option<i64>,
    #[serde(rename = "group.max.session.timeout.ms")]
    group_max_session_timeout_ms: Option<i64>,
    #[serde(rename = "log.cleaner.backoff.ms")]
    log_cleaner_backoff_ms: Option<u64>,
    #[serde(rename = "group.consumer.migration.policy")]
    group_consumer_migration_policy: Option<String>,
}

/// Command-line flags for the connection limits, under the TOML names with dashes; flags win
/// over the file.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LimitArgs {
    /// Client connections held open at once, over all shards (`max.connections`).
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Client connections held open at once from one IP address (`max.connections.per.ip`).
    #[arg(long)]
    pub max_connections_per_ip: Option<usize>,
    /// Close a connection that makes no progress for this long (`connections.max.idle.ms`).
    #[arg(long)]
    pub connections_max_idle_ms: Option<u64>,
    /// Requests of one connection in flight before the broker stops reading from it
    /// (`max.in.flight.requests.per.connection`).
    #[arg(long)]
    pub max_in_flight_requests_per_connection: Option<usize>,
}

impl LimitArgs {
    pub fn apply(&self, config: &mut BrokerConfig) {
        if let Some(v) = self.max_connections {
            config.max_connections = v;
        }
        if let Some(v) = self.max_connections_per_ip {
            config.max_connections_per_ip = v;
        }
        if let Some(v) = self.connections_max_idle_ms {
            config.connections_max_idle_ms = v;
        }
        if let Some(v) = self.max_in_flight_requests_per_connection {
            config.max_in_flight_requests_per_connection = v.max(1);
        }
    }
}

/// Moves `table`'s values into `flat` under dotted names: `{batch = {cache = {bytes = 1}}}`
/// becomes `{"batch.cache.bytes" = 1}`.
fn flatten_into(flat: &mut toml::Table, prefix: &str, table: toml::Table) {
    for (key, value) in table {
        let name = if prefix.is_empty() {
            key
        } else {
            format!("{prefix}.{key}")
        };
        match value {
            toml::Value::Table(inner) => flatten_into(flat, &name, inner),
            value => {
                flat.insert(name, value);
            }
        }
    }
}

/// Parses `PLAINTEXT://host:port` (or `host:port`) into host and port.
pub fn parse_listener(value: &str) -> anyhow::Result<(String, u16)> {
    let first = value.split(',').next().unwrap_or("").trim();
    let addr = first.split("://").last().unwrap_or(first);
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| anyhow::anyhow!("listener {value:?} has no port"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| anyhow::anyhow!("listener {value:?} has a bad port"))?;
    let host = if host.is_empty() {
        "0.0.0.0".to_string()
    } else {
        host.to_string()
    };
    Ok((host, port))
}

impl BrokerConfig {
    pub fn apply_file(&mut self, path: &std::path::Path) -> anyhow::Result<()> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        let table: toml::Table = toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("parsing {}: {e}", path.display()))?;
        let mut flat = toml::Table::new();
        flatten_into(&mut flat, "", table);
        let file: FileConfig = flat
            .try_into()
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        if let Some(v) = file.node_id {
            self.node_id = v;
        }
        if let Some(v) = file.cluster_id {
            self.cluster_id = v;
        }
        if let Some(v) = file.listeners {
            self.set_listeners(&v)?;
        }
        if let Some(v) = file.advertised_listeners {
            self.set_advertised(&v)?;
        }
        if let Some(v) = file.log_dirs {
            self.data_dir = PathBuf::from(v);
        }
        if let Some(v) = file.cores {
            self.cores = v;
        }
        if let Some(v) = file.num_partitions {
            self.num_partitions = v;
        }
        if let Some(v) = file.auto_create_topics {
            self.auto_create_topics = v;
        }
        if let Some(v) = file.socket_request_max_bytes {
            self.socket_request_max_bytes = v;
        }
        if let Some(v) = file.batch_cache_bytes {
            self.batch_cache_bytes = v;
        }
        if let Some(v) = file.fetch_max_bytes {
            self.fetch_max_bytes = v.max(1);
        }
        if let Some(v) = file.fetch_zero_copy {
            self.fetch_zero_copy = v;
        }
        if let Some(v) = file.group_initial_rebalance_delay_ms {
            self.group_initial_rebalance_delay_ms = v;
        }
        if let Some(v) = file.group_consumer_session_timeout_ms {
            self.group_consumer_session_timeout_ms = v;
        }
        if let Some(v) = file.group_consumer_heartbeat_interval_ms {
            self.group_consumer_heartbeat_interval_ms = v;
        }
        if let Some(v) = file.offsets_topic_partitions {
            self.offsets_topic_partitions = v.max(1);
        }
        if let Some(v) = file.log_retention_check_interval_ms {
            self.log_retention_check_interval_ms = v;
        }
        if let Some(v) = file.group_min_session_timeout_ms {
            self.group_min_session_timeout_ms = v;
        }
        if let Some(v) = file.group_max_session_timeout_ms {
            self.group_max_session_timeout_ms = v;
        }
        if let Some(v) = file.log_cleaner_backoff_ms {
            self.log_cleaner_backoff_ms = v;
        }
        if let Some(v) = &file.group_consumer_migration_policy {
            self.group_consumer_migration_policy = v.parse().map_err(anyhow::Error::msg)?;
        }
        LimitArgs {
            max_connections: file.max_connections,
            max_connections_per_ip: file.max_connections_per_ip,
            connections_max_idle_ms: file.connections_max_idle_ms,
            max_in_flight_requests_per_connection: file.max_in_flight_requests_per_connection,
        }
        .apply(self);
        Ok(())
    }

    /// Checks settings that depend on each other, once the file and flags are applied.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms {
            anyhow::bail!(
                "group.min.session.timeout.ms ({}) is above group.max.session.timeout.ms ({})",
                self.group_min_session_timeout_ms,
                self.group_max_session_timeout_ms
            );
        }
        if self.log_retention_check_interval_ms == 0 {
            anyhow::bail!(
                "log.retention.check.interval.ms must be at least 1 (Kafka's default is 300000)"
            );
        }
        if self.log_cleaner_backoff_ms == 0 {
            anyhow::bail!("log.cleaner.backoff.ms must be at least 1 (Sluice's default is 60000)");
        }
        let (session, heartbeat) = (
            self.group_consumer_session_timeout_ms,
            self.group_consumer_heartbeat_interval_ms,
        );
        if heartbeat == 0 || heartbeat > i32::MAX as u64 {
            anyhow::bail!(
                "group.consumer.heartbeat.interval.ms must be between 1 and {}, not {heartbeat}",
                i32::MAX
            );
        }
        if heartbeat >= session {
            anyhow::bail!(
                "group.consumer.heartbeat.interval.ms ({heartbeat}) must be less than \
                 group.consumer.session.timeout.ms ({session})"
            );
        }
        Ok(())
    }

    /// Sets `listeners`; the advertised address follows unless set on its own.
    pub fn set_listeners(&mut self, value: &str) -> anyhow::Result<()> {
        let (host, port) = parse_listener(value)?;
        self.listener = format!("{host}:{port}")
            .parse()
            .map_err(|_| anyhow::anyhow!("listener {value:?} is not an IP address and port"))?;
        if host != "0.0.0.0" {
            self.advertised_host = host;
        }
        self.advertised_port = port;
        Ok(())
    }

    pub fn set_advertised(&mut self, value: &str) -> anyhow::Result<()> {
        let (host, port) = parse_listener(value)?;
        self.advertised_host = host;
        self.advertised_port = port;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_parse_like_kafka() {
        assert_eq!(
            parse_listener("PLAINTEXT://127.0.0.1:9092").unwrap(),
            ("127.0.0.1".into(), 9092)
        );
        assert_eq!(
            parse_listener("localhost:19092").unwrap(),
            ("localhost".into(), 19092)
        );
        assert!(parse_listener("PLAINTEXT://nohost").is_err());
        let mut c = BrokerConfig::default();
        c.set_listeners("PLAINTEXT://127.0.0.1:29092").unwrap();
        assert_eq!(c.advertised_port, 29092);
        assert_eq!(c.listener.port(), 29092);
    }

    #[test]
    fn connection_limits_come_from_the_file_and_flags() {
        let dir = std::env::temp_dir().join(format!("sluice-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("broker.toml");
        std::fs::write(
            &path,
            "\"max.connections\" = 100\n\"max.connections.per.ip\" = 10\n\
             \"connections.max.idle.ms\" = 5000\n\"max.in.flight.requests.per.connection\" = 0\n",
        )
        .unwrap();
        let mut c = BrokerConfig::default();
        assert_eq!(c.connections_max_idle_ms, 600_000, "Kafka's default");
        assert_eq!(
            c.max_in_flight_requests_per_connection,
            IN_FLIGHT_PER_CONNECTION_MAX
        );
        c.apply_file(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(c.max_connections, 100);
        assert_eq!(c.max_connections_per_ip, 10);
        assert_eq!(c.connections_max_idle_ms, 5000);
        assert_eq!(c.max_in_flight_requests_per_connection, 1, "at least one");
        LimitArgs {
            max_connections: Some(7),
            ..LimitArgs::default()
        }
        .apply(&mut c);
        assert_eq!(c.max_connections, 7, "flags win");
        assert_eq!(c.max_connections_per_ip, 10);
    }

    #[test]
    fn kafka_names_are_read_quoted_dotted_or_as_sections_and_unknown_names_refused() {
        let dir = std::env::temp_dir().join(format!("sluice-config-names-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("broker.toml");
        let read = |text: &str| {
            std::fs::write(&path, text).unwrap();
            let mut c = BrokerConfig::default();
            c.apply_file(&path).map(|()| c)
        };
        let quoted = read("\"batch.cache.bytes\" = 65536\n\"num.partitions\" = 3\n").unwrap();
        let dotted = read("batch.cache.bytes = 65536\nnum.partitions = 3\n").unwrap();
        let section = read("num.partitions = 3\n[batch.cache]\nbytes = 65536\n").unwrap();
        for c in [&quoted, &dotted, &section] {
            assert_eq!(c.batch_cache_bytes, 65536);
            assert_eq!(c.num_partitions, 3);
        }
        let typo = read("batch.cache.byte = 65536\n").unwrap_err().to_string();
        let wrong_type = read("num.partitions = \"three\"\n")
            .unwrap_err()
            .to_string();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(typo.contains("batch.cache.byte"), "{typo}");
        assert!(wrong_type.contains("num.partitions"), "{wrong_type}");
    }

    #[test]
    fn consumer_group_timeouts_come_from_the_file_and_are_checked() {
        let c = BrokerConfig::default();
        assert_eq!(
            c.group_consumer_session_timeout_ms, 45_000,
            "Kafka's default"
        );
        assert_eq!(
            c.group_consumer_heartbeat_interval_ms, 5_000,
            "Kafka's default"
        );
        c.validate().unwrap();
        let dir = std::env::temp_dir().join(format!("sluice-config-cg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("broker.toml");
        std::fs::write(
            &path,
            "\"group.consumer.session.timeout.ms\" = 6000\n\
             \"group.consumer.heartbeat.interval.ms\" = 2000\n",
        )
        .unwrap();
        let mut c = BrokerConfig::default();
        c.apply_file(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(c.group_consumer_session_timeout_ms, 6000);
        assert_eq!(c.group_consumer_heartbeat_interval_ms, 2000);
        c.validate().unwrap();
        c.group_consumer_heartbeat_interval_ms = 6000;
        assert!(
            c.validate().is_err(),
            "the interval must be below the session timeout"
        );
        c.group_consumer_heartbeat_interval_ms = 0;
        assert!(c.validate().is_err());
    }

    #[test]
    fn the_cleaner_backoff_comes_from_the_file_and_is_checked() {
        let c = BrokerConfig::default();
        assert_eq!(c.log_cleaner_backoff_ms, LOG_CLEANER_BACKOFF_MS_DEFAULT);
        let dir =
            std::env::temp_dir().join(format!("sluice-config-cleaner-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("broker.toml");
        std::fs::write(&path, "log.cleaner.backoff.ms = 250\n").unwrap();
        let mut c = BrokerConfig::default();
        c.apply_file(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(c.log_cleaner_backoff_ms, 250);
        c.validate().unwrap();
        c.log_cleaner_backoff_ms = 0;
        assert!(c.validate().is_err());
    }
}
