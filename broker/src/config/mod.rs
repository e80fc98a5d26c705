//! Broker configuration: Kafka's names, from a TOML file and command-line flags (flags win).

use std::net::SocketAddr;
use std::path::PathBuf;

pub mod security;
pub mod settings;

/// The metadata log's directory under the data directory, named as Kafka's.
pub const METADATA_DIR: &str = "__cluster_metadata-0";

use security::{SaslConfig, SecurityProtocol, SslConfig};
use settings::{SettingArgs, BROKER_SETTINGS};

/// Settings the broker reads at start. Keys in the TOML file are Kafka's (`listeners`,
/// `advertised.listeners`, `log.dirs`, `num.partitions`, `auto.create.topics.enable`, ...).
#[derive(Clone, Debug)]
pub struct BrokerConfig {
    pub node_id: i32,
    /// The cluster id this node belongs to: the one its storage was formatted with
    /// (`meta.properties`), set at start. Before that, the `cluster.id` of the file, if any,
    /// which the stored one must then match.
    pub cluster_id: String,
    /// Whether the file named a `cluster.id` (which the formatted storage must then match).
    pub cluster_id_configured: bool,
    /// `process.roles`: broker, controller, or both (the default, as a single node).
    pub process_roles: ProcessRoles,
    /// `controller.quorum.voters`: the controllers, `id@host:port` each. Empty for the
    /// single-node default, whose quorum is this node alone.
    pub controller_quorum_voters: Vec<Voter>,
    /// `controller.listener.names`: which of `listeners` carry the controller quorum's
    /// traffic (the first is used).
    pub controller_listener_names: Vec<String>,
    /// The controller listener's address (the `listeners` entry named by
    /// `controller.listener.names`), on nodes with the controller role in a cluster.
    pub controller_listener: Option<SocketAddr>,
    /// `broker.rack`
    pub broker_rack: Option<String>,
    /// `metrics.listener`: where Prometheus metrics are served (`HOST:PORT`, GET /metrics);
    /// none by default.
    pub metrics_listener: Option<String>,
    /// `broker.session.timeout.ms`: a broker that sends no heartbeat for this long is fenced.
    pub broker_session_timeout_ms: u64,
    /// `broker.heartbeat.interval.ms`: how often a broker heartbeats to the active controller.
    pub broker_heartbeat_interval_ms: u64,
    /// `listeners`: where the Kafka protocol is served.
    pub listener: SocketAddr,
    /// `listeners` as given, sorted again if `controller.listener.names` comes after it.
    pub listeners_text: Option<String>,
    /// The name of the client listener (the first of `listeners` not named by
    /// `controller.listener.names`).
    pub listener_name: String,
    /// Every listener that serves the Kafka protocol (all of `listeners` but the controller
    /// ones), with its advertised address; the first is [`BrokerConfig::listener`].
    pub broker_listeners: Vec<BrokerListener>,
    /// `advertised.listeners` as given.
    pub advertised_text: Option<String>,
    /// `inter.broker.listener.name`: the listener other brokers are reached on (replica
    /// fetches, transaction markers); unset, the first of the broker listeners.
    pub inter_broker_listener_name: Option<String>,
    /// `sasl.mechanism.inter.broker.protocol`: the mechanism this broker logs in with on a
    /// SASL inter-broker listener.
    pub sasl_mechanism_inter_broker_protocol: String,
    /// `sasl.mechanism.controller.protocol`: the mechanism nodes log in with on a SASL
    /// controller listener.
    pub sasl_mechanism_controller_protocol: String,
    /// `listener.security.protocol.map`: each listener name's security protocol.
    pub security_protocol_map: Vec<(String, SecurityProtocol)>,
    /// `ssl.*`: the key material and TLS policy of SSL listeners.
    pub ssl: SslConfig,
    /// `sasl.*` and the listeners' JAAS configurations: how SASL listeners authenticate.
    pub sasl: SaslConfig,
    /// `authorizer.class.name` names Kafka's StandardAuthorizer: ACLs are enforced.
    pub authorizer: bool,
    /// `super.users` and `allow.everyone.if.no.acl.found`.
    pub authorizer_config: sluice_replication::acl::AuthorizerConfig,
    /// `advertised.listeners`: host and port clients are told to connect to.
    pub advertised_host: String,
    pub advertised_port: u16,
    /// `log.dirs`: the directories partition logs are kept in, each its own disk (Kafka's
    /// JBOD). The first also holds the metadata log (Kafka's `metadata.log.dir` default).
    pub log_dirs: Vec<PathBuf>,
    /// The first of `log.dirs`: the metadata log, meta.properties' source of truth.
    pub data_dir: PathBuf,
    /// Each log directory's `directory.id` from its meta.properties, in `log_dirs` order (set
    /// at start).
    pub log_dir_ids: Vec<String>,
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
    /// `fetch.cold.max.bytes` (Sluice's own): of those, the most read from disk rather than
    /// memory; the first batch of a response always goes.
    pub fetch_cold_max_bytes: usize,
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
    /// `group.streams.session.timeout.ms`: a streams group (KIP-1071) member silent this long
    /// leaves and its tasks move to the others.
    pub group_streams_session_timeout_ms: u64,
    /// `group.streams.heartbeat.interval.ms`
    pub group_streams_heartbeat_interval_ms: u64,
    /// `group.streams.num.standby.replicas`: standby tasks per active task.
    pub group_streams_num_standby_replicas: u64,
    /// `group.share.session.timeout.ms`: a share group member silent this long leaves.
    pub group_share_session_timeout_ms: u64,
    /// `group.share.heartbeat.interval.ms`
    pub group_share_heartbeat_interval_ms: u64,
    /// `group.share.record.lock.duration.ms`: the acquisition lock of a share consumer's records.
    pub group_share_record_lock_duration_ms: u64,
    /// `group.share.min.record.lock.duration.ms` and `group.share.max.record.lock.duration.ms`:
    /// the bounds of any acquisition lock.
    pub group_share_min_record_lock_duration_ms: u64,
    pub group_share_max_record_lock_duration_ms: u64,
    /// `group.share.delivery.count.limit`: deliveries before a record is archived.
    pub group_share_delivery_count_limit: u64,
    /// `group.share.partition.max.record.locks`: records of one share partition acquired at once.
    pub group_share_partition_max_record_locks: u64,
    /// `group.share.max.size`: members of one share group.
    pub group_share_max_size: u64,
    /// `offsets.topic.num.partitions`
    pub offsets_topic_partitions: i32,
    /// `offsets.topic.replication.factor` as set; [`BrokerConfig::offsets_topic_replication_factor`]
    /// gives the one in force.
    pub offsets_topic_replication_factor_set: Option<i16>,
    /// `transaction.state.log.num.partitions`
    pub transaction_state_log_partitions: i32,
    /// `transaction.state.log.replication.factor` as set;
    /// [`BrokerConfig::transaction_state_log_replication_factor`] gives the one in force.
    pub transaction_state_log_replication_factor_set: Option<i16>,
    /// `transaction.state.log.min.isr` as set; [`BrokerConfig::transaction_state_log_min_isr`]
    /// gives the one in force.
    pub transaction_state_log_min_isr_set: Option<i32>,
    /// `share.coordinator.state.topic.num.partitions`
    pub share_coordinator_state_topic_partitions: i32,
    /// `share.coordinator.state.topic.replication.factor` as set;
    /// [`BrokerConfig::share_coordinator_state_topic_replication_factor`] gives the one in force.
    pub share_coordinator_state_topic_replication_factor_set: Option<i16>,
    /// `share.coordinator.state.topic.min.isr` as set;
    /// [`BrokerConfig::share_coordinator_state_topic_min_isr`] gives the one in force.
    pub share_coordinator_state_topic_min_isr_set: Option<i32>,
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms`: how often transaction
    /// coordinators look for transactions past their timeout (and transactional ids past
    /// `transactional.id.expiration.ms`).
    pub transaction_abort_timed_out_transaction_cleanup_interval_ms: u64,
    /// `transaction.max.timeout.ms`: the longest `transaction.timeout.ms` a producer may ask for.
    pub transaction_max_timeout_ms: i32,
    /// `transactional.id.expiration.ms`: how long a transactional id without transactions is
    /// kept.
    pub transactional_id_expiration_ms: i64,
    /// The `transaction.version` feature level the cluster runs at (KIP-890): 2, the level of
    /// a new Kafka 4 cluster, has every transaction end bump the producer epoch and the
    /// partition leaders add partitions to transactions for the client; 0 and 1 keep clients
    /// on the KIP-98 protocol (the leaders still verify, KIP-890 part 1). Kafka keeps it in the
    /// metadata log; here every broker of a cluster must be given the same level.
    pub transaction_version: i16,
    /// `transaction.partition.verification.enable`: whether a partition leader verifies with
    /// the coordinator that a transaction's first batch belongs to an ongoing transaction
    /// (KIP-890 part 1). Adding partitions at transaction version 2 happens regardless.
    pub transaction_partition_verification_enable: bool,
    /// `default.replication.factor`: replicas of a topic created without a replication factor
    /// (auto-created topics, CreateTopics asking for -1).
    pub default_replication_factor: i16,
    /// `min.insync.replicas` for topics that set none: the in-sync replicas an acks=all produce
    /// needs.
    pub min_insync_replicas: i32,
    /// `auto.leader.rebalance.enable`: the controller gives partitions back to their preferred
    /// replica every `leader.imbalance.check.interval.seconds` once it is in sync.
    pub auto_leader_rebalance_enable: bool,
    pub leader_imbalance_check_interval_seconds: u64,
    /// `unclean.leader.election.enable` for topics that set none.
    pub unclean_leader_election_enable: bool,
    /// `max.connections`: client connections the broker holds open at once, over all shards;
    /// more are accepted and closed at once, with a (rate-limited) log line.
    pub max_connections: usize,
    /// `max.connections.per.ip`: the same limit per client IP address.
    pub max_connections_per_ip: usize,
    /// `connections.max.idle.ms`: a connection that makes no progress for this long (no complete
    /// request read and no response written) is closed. Bytes of an unfinished request do not
    /// count as progress, so a client trickling a request byte by byte is closed too.
    pub connections_max_idle_ms: u64,
    /// `quota.window.num`: samples of a client quota's rate (`crate::quota`).
    pub quota_window_num: u32,
    /// `quota.window.size.seconds`: the length of each sample.
    pub quota_window_size_seconds: u32,
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
    /// `replica.lag.time.max.ms`: an in-sync follower that has not caught up with its leader
    /// for this long leaves the ISR.
    pub replica_lag_time_max_ms: u64,
    /// `replica.fetch.wait.max.ms`: how long a follower's fetch waits at its leader for new
    /// records.
    pub replica_fetch_wait_max_ms: u64,
    /// `replica.selector.class` (KIP-392): Kafka's `RackAwareReplicaSelector` sends consumers
    /// with a `client.rack` to a replica in their rack; unset (or Kafka's `LeaderSelector`),
    /// consumers read from leaders unless they choose a follower themselves.
    pub replica_selector_class: Option<String>,
    /// `log.cleaner.backoff.ms`: how often each shard compacts its `cleanup.policy=compact`
    /// partitions. Kafka's cleaner sleeps this long when it finds nothing to clean.
    pub log_cleaner_backoff_ms: u64,
    /// `group.consumer.migration.policy`: whether a classic group converts to a consumer group
    /// when a `group.protocol=consumer` member joins it (upgrade), and back when the last such
    /// member leaves (downgrade).
    pub group_consumer_migration_policy: MigrationPolicy,
}

/// Kafka's `process.roles`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessRoles {
    pub broker: bool,
    pub controller: bool,
}

impl Default for ProcessRoles {
    fn default() -> Self {
        ProcessRoles {
            broker: true,
            controller: true,
        }
    }
}

impl std::str::FromStr for ProcessRoles {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut roles = ProcessRoles {
            broker: false,
            controller: false,
        };
        for role in s.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            match role {
                "broker" => roles.broker = true,
                "controller" => roles.controller = true,
                other => {
                    return Err(format!(
                        "process.roles: unknown role {other:?}; the roles are broker and controller"
                    ))
                }
            }
        }
        if !roles.broker && !roles.controller {
            return Err("process.roles names no role; give broker, controller, or both".into());
        }
        Ok(roles)
    }
}

impl std::fmt::Display for ProcessRoles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.broker, self.controller) {
            (true, true) => f.write_str("broker,controller"),
            (true, false) => f.write_str("broker"),
            _ => f.write_str("controller"),
        }
    }
}

/// One entry of `controller.quorum.voters`: `id@host:port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Voter {
    pub id: i32,
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for Voter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}:{}", self.id, self.host, self.port)
    }
}

/// Parses `controller.quorum.voters`: `1@host1:9093,2@host2:9093,...`.
pub fn parse_voters(value: &str) -> anyhow::Result<Vec<Voter>> {
    let mut voters: Vec<Voter> = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (id, addr) = entry.split_once('@').ok_or_else(|| {
            anyhow::anyhow!("controller.quorum.voters: {entry:?} is not id@host:port")
        })?;
        let id: i32 =
            id.parse().ok().filter(|id| *id >= 0).ok_or_else(|| {
                anyhow::anyhow!("controller.quorum.voters: {entry:?} has a bad id")
            })?;
        let (host, port) = addr
            .rsplit_once(':')
            .ok_or_else(|| anyhow::anyhow!("controller.quorum.voters: {entry:?} has no port"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| anyhow::anyhow!("controller.quorum.voters: {entry:?} has a bad port"))?;
        if host.is_empty() {
            anyhow::bail!("controller.quorum.voters: {entry:?} has no host");
        }
        if voters.iter().any(|v| v.id == id) {
            anyhow::bail!("controller.quorum.voters names node {id} twice");
        }
        voters.push(Voter {
            id,
            host: host.to_string(),
            port,
        });
    }
    Ok(voters)
}

/// A listener serving the Kafka protocol, and the address it is advertised at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerListener {
    pub name: String,
    pub addr: SocketAddr,
    pub advertised_host: String,
    pub advertised_port: u16,
}

/// One entry of `listeners` or `advertised.listeners`: `NAME://host:port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listener {
    pub name: String,
    pub host: String,
    pub port: u16,
}

/// Parses a comma-separated listener list. An entry without a name is `PLAINTEXT`.
pub fn parse_listeners(value: &str) -> anyhow::Result<Vec<Listener>> {
    let mut out: Vec<Listener> = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, _) = entry.split_once("://").unwrap_or(("PLAINTEXT", entry));
        let (host, port) = parse_listener(entry)?;
        if out.iter().any(|l| l.name == name) {
            anyhow::bail!("listeners name {name} twice");
        }
        out.push(Listener {
            name: name.to_string(),
            host,
            port,
        });
    }
    if out.is_empty() {
        anyhow::bail!("listeners is empty");
    }
    Ok(out)
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

/// Kafka's replica selectors (KIP-392), by class name; the last part alone is taken too.
pub const RACK_AWARE_REPLICA_SELECTOR: &str =
    "org.apache.kafka.common.replica.RackAwareReplicaSelector";
pub const LEADER_SELECTOR: &str = "org.apache.kafka.common.replica.LeaderSelector";

/// The cluster id every release before `meta.properties` reported for a single node: a data
/// directory holding data from one keeps it (`meta_properties::load_or_format`); a new one gets
/// a random id.
pub const SINGLE_NODE_CLUSTER_ID: &str = "sluice-single-node";

impl BrokerConfig {
    /// Every field before the settings' defaults are applied: placeholders, not defaults (those
    /// are in `config/settings.rs`), apart from the fields no setting sets.
    fn unset() -> Self {
        BrokerConfig {
            node_id: 0,
            cluster_id: SINGLE_NODE_CLUSTER_ID.into(),
            cluster_id_configured: false,
            process_roles: ProcessRoles::default(),
            controller_quorum_voters: Vec::new(),
            controller_listener_names: Vec::new(),
            controller_listener: None,
            broker_rack: None,
            metrics_listener: None,
            broker_session_timeout_ms: 0,
            broker_heartbeat_interval_ms: 0,
            listener: SocketAddr::from(([0, 0, 0, 0], 0)),
            listeners_text: None,
            listener_name: String::new(),
            broker_listeners: Vec::new(),
            advertised_text: None,
            inter_broker_listener_name: None,
            sasl_mechanism_inter_broker_protocol: String::new(),
            sasl_mechanism_controller_protocol: String::new(),
            security_protocol_map: Vec::new(),
            ssl: SslConfig::default(),
            sasl: SaslConfig::default(),
            authorizer: false,
            authorizer_config: Default::default(),
            advertised_host: String::new(),
            advertised_port: 0,
            log_dirs: Vec::new(),
            data_dir: PathBuf::new(),
            log_dir_ids: Vec::new(),
            cores: 0,
            num_partitions: 0,
            auto_create_topics: false,
            socket_request_max_bytes: 0,
            batch_cache_bytes: 0,
            fetch_max_bytes: 0,
            fetch_cold_max_bytes: 0,
            fetch_zero_copy: false,
            group_initial_rebalance_delay_ms: 0,
            group_consumer_session_timeout_ms: 0,
            group_consumer_heartbeat_interval_ms: 0,
            group_streams_session_timeout_ms: 0,
            group_streams_heartbeat_interval_ms: 0,
            group_streams_num_standby_replicas: 0,
            group_share_session_timeout_ms: 0,
            group_share_heartbeat_interval_ms: 0,
            group_share_record_lock_duration_ms: 0,
            group_share_min_record_lock_duration_ms: 0,
            group_share_max_record_lock_duration_ms: 0,
            group_share_delivery_count_limit: 0,
            group_share_partition_max_record_locks: 0,
            group_share_max_size: 0,
            offsets_topic_partitions: 0,
            offsets_topic_replication_factor_set: None,
            transaction_state_log_partitions: 0,
            transaction_state_log_replication_factor_set: None,
            transaction_state_log_min_isr_set: None,
            share_coordinator_state_topic_partitions: 0,
            share_coordinator_state_topic_replication_factor_set: None,
            share_coordinator_state_topic_min_isr_set: None,
            transaction_abort_timed_out_transaction_cleanup_interval_ms: 0,
            transaction_max_timeout_ms: 0,
            transactional_id_expiration_ms: 0,
            transaction_version: 0,
            transaction_partition_verification_enable: false,
            default_replication_factor: 0,
            min_insync_replicas: 0,
            auto_leader_rebalance_enable: false,
            leader_imbalance_check_interval_seconds: 0,
            unclean_leader_election_enable: false,
            max_connections: 0,
            max_connections_per_ip: 0,
            connections_max_idle_ms: 0,
            quota_window_num: 0,
            quota_window_size_seconds: 0,
            max_in_flight_requests_per_connection: 0,
            log_retention_check_interval_ms: 0,
            replica_lag_time_max_ms: 0,
            replica_fetch_wait_max_ms: 0,
            replica_selector_class: None,
            group_min_session_timeout_ms: 0,
            group_max_session_timeout_ms: 0,
            log_cleaner_backoff_ms: 0,
            group_consumer_migration_policy: MigrationPolicy::default(),
        }
    }
}

impl Default for BrokerConfig {
    /// Every setting at its default (`settings::BROKER_SETTINGS`).
    fn default() -> Self {
        let mut config = BrokerConfig::unset();
        for s in BROKER_SETTINGS {
            if let Some(d) = s.default {
                if let Err(e) = (s.set)(&mut config, d) {
                    unreachable!("the default of {} does not apply: {e}", s.name);
                }
            }
        }
        config
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
    /// Applies the TOML file at `path`: every key a setting's name (`config/settings.rs`).
    /// TOML reads an unquoted `batch.cache.bytes = 1` as nested tables, so the file is
    /// flattened back to dotted names first: quoted names, dotted keys and `[batch.cache]`
    /// sections all work. A name that is no setting is an error, never silently ignored.
    pub fn apply_file(&mut self, path: &std::path::Path) -> anyhow::Result<()> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        let table: toml::Table = toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("parsing {}: {e}", path.display()))?;
        let mut flat = toml::Table::new();
        flatten_into(&mut flat, "", table);
        for (name, value) in flat {
            let text = match value {
                toml::Value::String(s) => s,
                toml::Value::Integer(n) => n.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                toml::Value::Float(f) => f.to_string(),
                other => anyhow::bail!(
                    "{}: {name} must be a string, number or boolean, not {other}",
                    path.display()
                ),
            };
            self.set(&name, &text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        }
        Ok(())
    }

    /// Sets the setting `name` (Kafka's name, `config/settings.rs`) from its text.
    pub fn set(&mut self, name: &str, value: &str) -> anyhow::Result<()> {
        // Kafka's listener-prefixed names (`listener.name.<l>.<mechanism>.sasl.jaas.config`).
        if self
            .sasl
            .set_prefixed(name, value)
            .map_err(anyhow::Error::msg)?
        {
            return Ok(());
        }
        let setting = crate::config::settings::find(name).ok_or_else(|| {
            anyhow::anyhow!("{name:?} is not a Sluice broker setting (sluice --help lists them)")
        })?;
        (setting.set)(self, value).map_err(anyhow::Error::msg)
    }

    /// Applies the settings given as flags, after the file (flags win).
    pub fn apply_flags(&mut self, flags: &SettingArgs) -> anyhow::Result<()> {
        for (name, value) in &flags.given {
            self.set(name, value)
                .map_err(|e| anyhow::anyhow!("--{}: {e}", name.replace('.', "-")))?;
        }
        Ok(())
    }

    /// Checks settings that depend on each other, once the file and flags are applied.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.validate_cluster()?;
        self.validate_security()?;
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms {
            anyhow::bail!(
                "group.min.session.timeout.ms ({}) is above group.max.session.timeout.ms ({})",
                self.group_min_session_timeout_ms,
                self.group_max_session_timeout_ms
            );
        }
        for (protocol, session, heartbeat) in [
            (
                "consumer",
                self.group_consumer_session_timeout_ms,
                self.group_consumer_heartbeat_interval_ms,
            ),
            (
                "streams",
                self.group_streams_session_timeout_ms,
                self.group_streams_heartbeat_interval_ms,
            ),
        ] {
            if heartbeat >= session {
                anyhow::bail!(
                    "group.{protocol}.heartbeat.interval.ms ({heartbeat}) must be less than \
                     group.{protocol}.session.timeout.ms ({session})"
                );
            }
        }
        if self.group_share_heartbeat_interval_ms >= self.group_share_session_timeout_ms {
            anyhow::bail!(
                "group.share.heartbeat.interval.ms ({}) must be less than \
                 group.share.session.timeout.ms ({})",
                self.group_share_heartbeat_interval_ms,
                self.group_share_session_timeout_ms
            );
        }
        let (min, lock, max) = (
            self.group_share_min_record_lock_duration_ms,
            self.group_share_record_lock_duration_ms,
            self.group_share_max_record_lock_duration_ms,
        );
        if !(min <= lock && lock <= max) {
            anyhow::bail!(
                "group.share.record.lock.duration.ms ({lock}) must be between \
                 group.share.min.record.lock.duration.ms ({min}) and \
                 group.share.max.record.lock.duration.ms ({max})"
            );
        }
        Ok(())
    }

    /// Sets `listeners`: every listener not named by `controller.listener.names` serves the
    /// Kafka protocol (the first is [`BrokerConfig::listener`]), the controller one carries the
    /// quorum.
    pub fn set_listeners(&mut self, value: &str) -> anyhow::Result<()> {
        parse_listeners(value)?;
        self.listeners_text = Some(value.to_string());
        self.resolve_listeners()
    }

    /// Sets `controller.listener.names` (which sorts `listeners`).
    pub fn set_controller_listener_names(&mut self, value: &str) {
        self.controller_listener_names = value
            .split(',')
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        // Checked when the listeners were set.
        let _ = self.resolve_listeners();
    }

    /// Sets `advertised.listeners`: each broker listener is advertised under its own name's
    /// entry, or at its own address when it has none.
    pub fn set_advertised(&mut self, value: &str) -> anyhow::Result<()> {
        parse_listeners(value)?;
        self.advertised_text = Some(value.to_string());
        self.resolve_listeners()
    }

    /// Derives the listeners from `listeners`, `advertised.listeners` and
    /// `controller.listener.names`, whichever order they were set in.
    fn resolve_listeners(&mut self) -> anyhow::Result<()> {
        let Some(text) = &self.listeners_text else {
            return Ok(());
        };
        let listeners = parse_listeners(text)?;
        let advertised = match &self.advertised_text {
            Some(a) => parse_listeners(a)?,
            None => Vec::new(),
        };
        let socket = |l: &Listener| -> anyhow::Result<SocketAddr> {
            format!("{}:{}", l.host, l.port).parse().map_err(|_| {
                anyhow::anyhow!(
                    "listener {}://{}:{} is not an IP address and port",
                    l.name,
                    l.host,
                    l.port
                )
            })
        };
        self.controller_listener = None;
        self.broker_listeners.clear();
        for l in &listeners {
            if self.controller_listener_names.contains(&l.name) {
                if self.controller_listener.is_none() {
                    self.controller_listener = Some(socket(l)?);
                }
                continue;
            }
            // An advertised entry named after no listener (e.g. written without a name, so
            // PLAINTEXT) stands for the first one, as single-listener configurations wrote it.
            let own = advertised.iter().find(|a| a.name == l.name).or_else(|| {
                advertised
                    .iter()
                    .filter(|_| self.broker_listeners.is_empty())
                    .find(|a| !listeners.iter().any(|l| l.name == a.name))
            });
            let (advertised_host, advertised_port) = match own {
                Some(a) => (a.host.clone(), a.port),
                None if l.host == "0.0.0.0" => (self.advertised_host.clone(), l.port),
                None => (l.host.clone(), l.port),
            };
            self.broker_listeners.push(BrokerListener {
                name: l.name.clone(),
                addr: socket(l)?,
                advertised_host,
                advertised_port,
            });
        }
        if let Some(first) = self.broker_listeners.first() {
            self.listener = first.addr;
            self.listener_name = first.name.clone();
            self.advertised_host = first.advertised_host.clone();
            self.advertised_port = first.advertised_port;
        }
        Ok(())
    }

    /// The security protocol of the listener `name`, from `listener.security.protocol.map`.
    pub fn security_protocol_of(&self, name: &str) -> anyhow::Result<SecurityProtocol> {
        self.security_protocol_map
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, p)| p)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "listener {name} has no security protocol: name it in \
                     listener.security.protocol.map (e.g. {name}:SSL)"
                )
            })
    }

    /// Where this node's listener `name` is advertised; the first listener's address when it
    /// has none of that name.
    pub fn advertised_on(&self, name: &str) -> (&str, u16) {
        self.broker_listeners
            .iter()
            .find(|l| l.name == name)
            .map_or((self.advertised_host.as_str(), self.advertised_port), |l| {
                (l.advertised_host.as_str(), l.advertised_port)
            })
    }

    /// The listener other brokers are reached on: `inter.broker.listener.name`, else the first
    /// broker listener.
    pub fn inter_broker_listener(&self) -> &str {
        self.inter_broker_listener_name
            .as_deref()
            .unwrap_or(&self.listener_name)
    }

    /// The controller listener's name: the first of `controller.listener.names`.
    pub fn controller_listener_name(&self) -> &str {
        self.controller_listener_names
            .first()
            .map_or("CONTROLLER", String::as_str)
    }

    /// The client listener's security protocol: its name's entry in
    /// `listener.security.protocol.map`.
    pub fn client_security_protocol(&self) -> anyhow::Result<SecurityProtocol> {
        self.security_protocol_map
            .iter()
            .find(|(name, _)| *name == self.listener_name)
            .map(|&(_, p)| p)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "listener {} has no security protocol: name it in \
                     listener.security.protocol.map (e.g. {}:SSL)",
                    self.listener_name,
                    self.listener_name
                )
            })
    }

    fn validate_security(&self) -> anyhow::Result<()> {
        for l in &self.broker_listeners {
            self.validate_listener(&l.name, self.security_protocol_of(&l.name)?)?;
        }
        let inter = self.inter_broker_listener();
        // A controller-only node serves no broker listener and dials no broker.
        if self.process_roles.broker && !self.broker_listeners.iter().any(|l| l.name == inter) {
            anyhow::bail!(
                "inter.broker.listener.name {inter} is not one of listeners ({})",
                self.broker_listeners
                    .iter()
                    .map(|l| l.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        if self.is_cluster() && self.process_roles.broker {
            self.validate_login(
                inter,
                self.security_protocol_of(inter)?,
                "sasl.mechanism.inter.broker.protocol",
                &self.sasl_mechanism_inter_broker_protocol,
            )?;
        }
        if self.is_cluster() {
            let controller = self.controller_listener_name();
            let protocol = self.controller_security_protocol();
            if self.process_roles.controller {
                self.validate_listener(controller, protocol)?;
            }
            self.validate_login(
                controller,
                protocol,
                "sasl.mechanism.controller.protocol",
                &self.sasl_mechanism_controller_protocol,
            )?;
        }
        Ok(())
    }

    /// The controller listener's security protocol: its entry in
    /// `listener.security.protocol.map`, PLAINTEXT without one (as Kafka).
    pub fn controller_security_protocol(&self) -> SecurityProtocol {
        self.security_protocol_of(self.controller_listener_name())
            .unwrap_or(SecurityProtocol::Plaintext)
    }

    /// A listener this node serves: SASL has its mechanisms and users, TLS its key material.
    fn validate_listener(&self, name: &str, protocol: SecurityProtocol) -> anyhow::Result<()> {
        if protocol.sasl() {
            self.validate_sasl(name)?;
        }
        if protocol.tls()
            && self.ssl.keystore_location.is_none()
            && self.ssl.keystore_certificate_chain.is_none()
        {
            anyhow::bail!(
                "listener {name} is {protocol}: set ssl.keystore.location (or \
                 ssl.keystore.certificate.chain and ssl.keystore.key)"
            );
        }
        Ok(())
    }

    /// A listener this node connects to as a client of another node: TLS trusts an
    /// authority, SASL has this node's own login (`username` and `password` in the listener's
    /// JAAS entry for `mechanism`).
    fn validate_login(
        &self,
        listener: &str,
        protocol: SecurityProtocol,
        setting: &str,
        mechanism: &str,
    ) -> anyhow::Result<()> {
        if protocol.tls()
            && self.ssl.truststore_location.is_none()
            && self.ssl.truststore_certificates.is_none()
        {
            anyhow::bail!(
                "listener {listener} is {protocol} between nodes: set ssl.truststore.location \
                 (the authority that signed the other nodes' certificates)"
            );
        }
        if protocol.sasl() {
            self.login(listener, mechanism).map_err(|e| {
                anyhow::anyhow!(
                    "listener {listener} is {protocol} between nodes: {setting}={mechanism}: {e}"
                )
            })?;
        }
        Ok(())
    }

    /// This node's own SASL login on `listener` with `mechanism`: the `username` and
    /// `password` options of `listener.name.<listener>.<mechanism>.sasl.jaas.config`.
    pub fn login(&self, listener: &str, mechanism: &str) -> anyhow::Result<(String, String)> {
        if !matches!(mechanism, "PLAIN" | "SCRAM-SHA-256" | "SCRAM-SHA-512") {
            anyhow::bail!("nodes log in to each other with PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512");
        }
        let key = format!(
            "listener.name.{}.{}.sasl.jaas.config",
            listener.to_ascii_lowercase(),
            mechanism.to_ascii_lowercase()
        );
        let jaas = self
            .sasl
            .jaas_of(listener, mechanism)
            .ok_or_else(|| anyhow::anyhow!("set {key} with this node's username and password"))?;
        let option = |name: &str| {
            jaas.options
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        match (option("username"), option("password")) {
            (Some(user), Some(password)) => Ok((user, password)),
            _ => anyhow::bail!(
                "{key} has no username=\"...\" password=\"...\" for this node's own login"
            ),
        }
    }

    /// A SASL listener: every enabled mechanism is one Sluice runs and has its JAAS entry.
    fn validate_sasl(&self, listener: &str) -> anyhow::Result<()> {
        if self.sasl.enabled_mechanisms.is_empty() {
            anyhow::bail!(
                "listener {listener} is SASL: set sasl.enabled.mechanisms (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER)"
            );
        }
        for mechanism in &self.sasl.enabled_mechanisms {
            if !security::SASL_MECHANISMS.contains(&mechanism.as_str()) {
                anyhow::bail!(
                    "sasl.enabled.mechanisms: {mechanism} is not a mechanism Sluice runs ({})",
                    security::SASL_MECHANISMS.join(", ")
                );
            }
            if mechanism != "PLAIN" {
                // SCRAM's credentials live in the metadata log, OAUTHBEARER's tokens prove
                // themselves; a JAAS entry, if set, must name the mechanism's login module
                // (its options are the broker's own login, and OAUTHBEARER's unsecured checks).
                let module = if mechanism == "OAUTHBEARER" {
                    security::OAUTHBEARER_LOGIN_MODULE
                } else {
                    security::SCRAM_LOGIN_MODULE
                };
                if let Some(jaas) = self.sasl.jaas_of(listener, mechanism) {
                    if jaas.module != module {
                        anyhow::bail!(
                            "listener.name.{}.{}.sasl.jaas.config: {mechanism} takes {}, not {}",
                            listener.to_ascii_lowercase(),
                            mechanism.to_ascii_lowercase(),
                            module,
                            jaas.module
                        );
                    }
                }
                continue;
            }
            let key = format!(
                "listener.name.{}.plain.sasl.jaas.config",
                listener.to_ascii_lowercase(),
            );
            let jaas = self.sasl.jaas_of(listener, mechanism).ok_or_else(|| {
                anyhow::anyhow!("listener {listener} runs SASL {mechanism}: set {key}")
            })?;
            if jaas.module != security::PLAIN_LOGIN_MODULE {
                anyhow::bail!(
                    "{key}: PLAIN takes {}, not {}",
                    security::PLAIN_LOGIN_MODULE,
                    jaas.module
                );
            }
            if jaas.plain_users().is_empty() {
                anyhow::bail!("{key}: no user_<name>=\"<password>\" option, so nobody can log in");
            }
        }
        Ok(())
    }

    fn validate_cluster(&self) -> anyhow::Result<()> {
        let (session, heartbeat) = (
            self.broker_session_timeout_ms,
            self.broker_heartbeat_interval_ms,
        );
        if heartbeat >= session {
            anyhow::bail!(
                "broker.heartbeat.interval.ms ({heartbeat}) must be less than \
                 broker.session.timeout.ms ({session})"
            );
        }
        if !self.is_cluster() {
            if self.process_roles != ProcessRoles::default() {
                anyhow::bail!(
                    "process.roles={} needs controller.quorum.voters (the controllers, \
                     id@host:port each); only a combined node (broker,controller) runs alone",
                    self.process_roles
                );
            }
            return Ok(());
        }
        let names = self.controller_listener_names.join(",");
        match (self.process_roles.controller, self.own_voter()) {
            (true, None) => anyhow::bail!(
                "node {} has the controller role but is not in controller.quorum.voters ({})",
                self.node_id,
                self.voters_text()
            ),
            (false, Some(_)) => anyhow::bail!(
                "node {} is in controller.quorum.voters but process.roles={} lacks controller",
                self.node_id,
                self.process_roles
            ),
            (true, Some(voter)) => {
                let Some(addr) = self.controller_listener else {
                    anyhow::bail!(
                        "node {} is a controller but listeners has no listener named by \
                         controller.listener.names ({names}), e.g. CONTROLLER://{}:{}",
                        self.node_id,
                        voter.host,
                        voter.port
                    );
                };
                if addr.port() != voter.port {
                    anyhow::bail!(
                        "node {}'s controller listener is on port {} but controller.quorum.voters \
                         gives it {voter}",
                        self.node_id,
                        addr.port()
                    );
                }
            }
            (false, None) => {}
        }
        Ok(())
    }

    /// `controller.quorum.voters` as Kafka writes it.
    pub fn voters_text(&self) -> String {
        self.controller_quorum_voters
            .iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Whether leaders send consumers to a replica in their rack (`replica.selector.class`).
    pub fn replica_selector_rack_aware(&self) -> bool {
        self.replica_selector_class.as_deref().is_some_and(|c| {
            c == RACK_AWARE_REPLICA_SELECTOR
                || RACK_AWARE_REPLICA_SELECTOR.ends_with(&format!(".{c}"))
        })
    }

    /// Whether this node is part of a cluster that `controller.quorum.voters` describes; the
    /// single-node default has no voters list (its quorum is itself).
    pub fn is_cluster(&self) -> bool {
        !self.controller_quorum_voters.is_empty()
    }

    /// `offsets.topic.replication.factor` in force: as set, else Kafka's 3 in a cluster and 1
    /// on the single-node default (as Kafka's own single-node `server.properties` sets it).
    /// `__consumer_offsets` is not created until the cluster has that many brokers, as in Kafka.
    pub fn offsets_topic_replication_factor(&self) -> i16 {
        self.offsets_topic_replication_factor_set
            .unwrap_or(if self.is_cluster() { 3 } else { 1 })
    }

    /// `transaction.state.log.replication.factor` in force, with the same defaults as
    /// [`BrokerConfig::offsets_topic_replication_factor`]: as set, else Kafka's 3 in a cluster
    /// and 1 on the single-node default. `__transaction_state` is not created until the cluster
    /// has that many brokers, as in Kafka.
    pub fn transaction_state_log_replication_factor(&self) -> i16 {
        self.transaction_state_log_replication_factor_set
            .unwrap_or(if self.is_cluster() { 3 } else { 1 })
    }

    /// `transaction.state.log.min.isr` in force (the topic's `min.insync.replicas`): as set,
    /// else Kafka's 2 in a cluster and 1 on the single-node default; never above the
    /// replication factor, which could not satisfy it.
    pub fn transaction_state_log_min_isr(&self) -> i32 {
        let set = self
            .transaction_state_log_min_isr_set
            .unwrap_or(if self.is_cluster() { 2 } else { 1 });
        set.min(i32::from(self.transaction_state_log_replication_factor()))
    }

    /// `share.coordinator.state.topic.replication.factor` in force, with the defaults of
    /// [`BrokerConfig::transaction_state_log_replication_factor`].
    pub fn share_coordinator_state_topic_replication_factor(&self) -> i16 {
        self.share_coordinator_state_topic_replication_factor_set
            .unwrap_or(if self.is_cluster() { 3 } else { 1 })
    }

    /// `share.coordinator.state.topic.min.isr` in force, with the defaults of
    /// [`BrokerConfig::transaction_state_log_min_isr`].
    pub fn share_coordinator_state_topic_min_isr(&self) -> i32 {
        let set = self
            .share_coordinator_state_topic_min_isr_set
            .unwrap_or(if self.is_cluster() { 2 } else { 1 });
        set.min(i32::from(
            self.share_coordinator_state_topic_replication_factor(),
        ))
    }

    /// This node's entry in `controller.quorum.voters`, if it is a voter.
    pub fn own_voter(&self) -> Option<&Voter> {
        self.controller_quorum_voters
            .iter()
            .find(|v| v.id == self.node_id)
    }
}

/// Kafka's rule for ids it did not make: printable, no whitespace, at most 100 characters.
pub fn validate_cluster_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("the cluster id is empty".into());
    }
    if id.len() > 100 {
        return Err(format!(
            "the cluster id is {} characters; at most 100",
            id.len()
        ));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        return Err(format!(
            "the cluster id {id:?} contains {c:?}; use letters, digits, '-' and '_' \
             (`sluice storage random-uuid` makes one)"
        ));
    }
    Ok(())
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
        assert_eq!(c.max_in_flight_requests_per_connection, 64);
        let e = c.apply_file(&path).unwrap_err().to_string();
        assert!(e.contains("max.in.flight.requests.per.connection"), "{e}");
        std::fs::write(
            &path,
            "\"max.connections\" = 100\n\"max.connections.per.ip\" = 10\n\
             \"connections.max.idle.ms\" = 5000\n\"max.in.flight.requests.per.connection\" = 1\n",
        )
        .unwrap();
        let mut c = BrokerConfig::default();
        c.apply_file(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(c.max_connections, 100);
        assert_eq!(c.max_connections_per_ip, 10);
        assert_eq!(c.connections_max_idle_ms, 5000);
        assert_eq!(c.max_in_flight_requests_per_connection, 1);
        c.apply_flags(&SettingArgs {
            given: vec![("max.connections", "7".into())],
        })
        .unwrap();
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
        assert!(c.set("group.consumer.heartbeat.interval.ms", "0").is_err());
    }

    #[test]
    fn the_cleaner_backoff_comes_from_the_file_and_is_checked() {
        let c = BrokerConfig::default();
        assert_eq!(c.log_cleaner_backoff_ms, 60_000);
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
        assert!(c.set("log.cleaner.backoff.ms", "0").is_err());
    }

    #[test]
    fn cluster_settings_parse_like_kafka_and_are_checked() {
        let voters = parse_voters("1@127.0.0.1:9192, 2@localhost:9193,3@127.0.0.1:9194").unwrap();
        assert_eq!(voters.len(), 3);
        assert_eq!(
            voters[1],
            Voter {
                id: 2,
                host: "localhost".into(),
                port: 9193
            }
        );
        for bad in [
            "1@host",
            "x@host:1",
            "1:host:1",
            "1@:9",
            "1@a:1,1@b:2",
            "-1@a:1",
        ] {
            assert!(parse_voters(bad).is_err(), "{bad}");
        }
        assert_eq!(
            "broker,controller".parse::<ProcessRoles>().unwrap(),
            ProcessRoles::default()
        );
        assert_eq!(
            "broker".parse::<ProcessRoles>().unwrap(),
            ProcessRoles {
                broker: true,
                controller: false
            }
        );
        assert!("".parse::<ProcessRoles>().is_err());
        assert!("broker,zookeeper".parse::<ProcessRoles>().is_err());

        let mut c = BrokerConfig::default();
        c.set_listeners("PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9192")
            .unwrap();
        assert_eq!(c.listener.port(), 9092);
        assert_eq!(c.controller_listener.map(|a| a.port()), Some(9192));
        assert_eq!(c.advertised_port, 9092);
        c.validate().unwrap();
        assert!(!c.is_cluster());
        c.controller_quorum_voters = parse_voters("1@127.0.0.1:9192,2@127.0.0.1:9193").unwrap();
        c.validate().unwrap();
        // The controller listener must be the one the voters name for this node.
        c.node_id = 2;
        assert!(c.validate().unwrap_err().to_string().contains("port 9192"));
        // A controller that is not a voter, a voter without the role.
        c.node_id = 5;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("not in controller.quorum.voters"));
        c.node_id = 1;
        c.process_roles = "broker".parse().unwrap();
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("lacks controller"));
        // A lone broker-only node has no quorum to join.
        let alone = BrokerConfig {
            process_roles: "broker".parse().unwrap(),
            ..BrokerConfig::default()
        };
        assert!(alone.validate().is_err());
        // Names sort listeners whichever comes first.
        let mut named = BrokerConfig::default();
        named
            .set_listeners("CLIENTS://127.0.0.1:7000,QUORUM://127.0.0.1:7001")
            .unwrap();
        named.set_controller_listener_names("QUORUM");
        assert_eq!(named.listener.port(), 7000);
        assert_eq!(named.controller_listener.map(|a| a.port()), Some(7001));
        let heartbeat = BrokerConfig {
            broker_heartbeat_interval_ms: 9_000,
            ..BrokerConfig::default()
        };
        assert!(heartbeat.validate().is_err());
    }
}
