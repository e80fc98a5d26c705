//! The metadata node of this process, on shard 0: raft-rs and the controller core driven by
//! real time, disk (`metadata_log`) and sockets (`transport`), and the broker's side of the
//! cluster: registration and heartbeats, publishing each committed image to every shard, and
//! sending admin requests to the active controller.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, EnvelopeRequest, RequestKind, ResponseKind};
use sluice_replication::controller::{self as core, ControllerConfig};
use sluice_replication::error_code;
use sluice_replication::image::MetadataImage as ClusterImage;
use sluice_replication::quorum::{MetadataNode, QuorumConfig, QuorumStatus, RequestId};
use sluice_replication::records::{BrokerEpoch, BrokerId, ConfigResourceType, Endpoint, Offset};

use super::controller_api;
use super::metadata_log::MetadataStore;
use super::transport::{Inbound, Transport};
use crate::codec::{decode_response, encode_request};
use crate::config::BrokerConfig;
use futures_lite::future::BoxedLocal;

use crate::shard::{ControllerChannel, Shard};

/// How long one inter-node request may take (Kafka's `controller.quorum.request.timeout.ms`).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a connection to the CONTROLLER listener may take over its TLS handshake and SASL
/// login (bounded by `connections.max.idle.ms` too).
const CONTROLLER_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the shards may take to open the partitions of an imported metadata file.
const APPLIED_WAIT_MIGRATION: Duration = Duration::from_secs(600);
/// How long an admin request keeps looking for an active controller before it fails.
const ADMIN_RETRY_FOR: Duration = Duration::from_secs(5);
const RETRY_BACKOFF: Duration = Duration::from_millis(100);
/// The driver's longest sleep between two looks at raft (it ticks every 100 ms).
const DRIVER_PERIOD: Duration = Duration::from_millis(10);
/// Written in the data directory by a clean shutdown: the broker epoch it stopped with, so the
/// next start registers at once as the same broker (`PreviousBrokerEpoch`) instead of waiting
/// for the old session to expire (DUPLICATE_BROKER_REGISTRATION). Kafka keeps the same fact in
/// `.kafka_cleanshutdown`, in the same form.
pub const CLEAN_SHUTDOWN_FILE: &str = ".clean_shutdown";

#[derive(serde::Serialize, serde::Deserialize)]
struct CleanShutdown {
    version: u32,
    #[serde(rename = "brokerEpoch")]
    broker_epoch: i64,
}

/// The broker epoch of the last clean shutdown, taken (the file is removed: a crash after this
/// start must not claim it).
fn take_clean_shutdown_epoch(data_dir: &std::path::Path) -> i64 {
    let path = data_dir.join(CLEAN_SHUTDOWN_FILE);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return -1;
    };
    let _ = std::fs::remove_file(&path);
    match serde_json::from_str::<CleanShutdown>(&text) {
        Ok(c) if c.version == 0 => c.broker_epoch,
        _ => {
            tracing::warn!(path = %path.display(), "unreadable clean-shutdown file; registering as a new incarnation");
            -1
        }
    }
}

pub struct ClusterNode {
    pub node_id: i32,
    config: BrokerConfig,
    shards: usize,
    node: RefCell<MetadataNode>,
    store: RefCell<Option<MetadataStore>>,
    transport: Rc<Transport>,
    started: Instant,
    wake: event_listener::Event,
    replies:
        RefCell<HashMap<RequestId, futures_channel::oneshot::Sender<core::ControllerResponse>>>,
    next_request: Cell<RequestId>,
    /// The newest committed image not yet handed to the shards.
    unpublished: RefCell<Option<ClusterImage>>,
    publish: event_listener::Event,
    /// The metadata offset every shard has applied, and its event.
    published: Cell<i64>,
    published_event: event_listener::Event,
    last_leader: Cell<Option<u64>>,
    broker_epoch: Cell<i64>,
    /// What every shard shares (the broker epoch is published there for the replica fetchers).
    shared: std::sync::Arc<crate::shard::Shared>,
    /// Whether this broker is unfenced (its last heartbeat said so).
    unfenced: Cell<bool>,
    /// Set by a clean shutdown: the driver stops before its next Ready.
    closed: Cell<bool>,
    /// The producer-id block this broker hands out from (next, end), from AllocateProducerIds.
    producer_ids: Cell<(i64, i64)>,
    producer_ids_lock: async_lock::Mutex<()>,
    /// The voter to ask next while no leader is known.
    next_voter: Cell<usize>,
    /// Set by a controlled shutdown: the regular heartbeats stop.
    shutting_down: Cell<bool>,
    /// What shards could not apply (a partition that would not open), for the start-up check.
    apply_errors: RefCell<Vec<String>>,
}

/// The controller's check of a resource's configs: a topic's as its logs would take them,
/// a broker's each as a dynamic broker config.
fn validate_config(
    resource: ConfigResourceType,
    configs: &std::collections::BTreeMap<String, String>,
) -> Result<(), (i16, String)> {
    match resource {
        ConfigResourceType::Topic => crate::metadata::log_config(configs)
            .map(|_| ())
            .map_err(|m| (error_code::INVALID_CONFIG, m)),
        ConfigResourceType::Broker => configs
            .iter()
            .try_for_each(|(k, v)| super::broker_configs::check_broker_config(k, v)),
        ConfigResourceType::Group => {
            crate::group::configs::validate(configs).map_err(|m| (error_code::INVALID_CONFIG, m))
        }
    }
}

/// What APPEND and SUBTRACT start from for a config the resource does not set itself.
fn config_default(resource: ConfigResourceType, name: &str) -> Option<String> {
    match resource {
        ConfigResourceType::Topic => {
            crate::topic_config::setting(name).map(|s| s.default_value().to_string())
        }
        ConfigResourceType::Broker => super::broker_configs::broker_config_default(name),
        ConfigResourceType::Group => None,
    }
}

impl ClusterNode {
    /// Opens the metadata log and starts the node: the raft driver, the CONTROLLER listener
    /// (on controllers), connections to the other voters, the image publisher and (on brokers)
    /// registration and heartbeats.
    pub async fn start(shard0: &Rc<Shard>) -> anyhow::Result<Rc<ClusterNode>> {
        let config = shard0.config().clone();
        let (store, persisted) =
            MetadataStore::open(&config.data_dir, shard0.cache.clone()).await?;
        // The single-node default is a quorum of one: itself, with no CONTROLLER listener
        // (it has nobody to talk to).
        let voters: Vec<u64> = if config.is_cluster() {
            config
                .controller_quorum_voters
                .iter()
                .map(|v| v.id as u64)
                .collect()
        } else {
            vec![config.node_id as u64]
        };
        let mut quorum =
            QuorumConfig::new(config.node_id as u64, voters, vec![], &config.cluster_id);
        quorum.seed = uuid::Uuid::new_v4().as_u64_pair().0;
        quorum.bootstrap = super::meta_properties::read_bootstrap(&config.data_dir)?;
        let mut controller =
            ControllerConfig::new(BrokerId(config.node_id), config.cluster_id.clone());
        controller.broker_session_timeout_ms = config.broker_session_timeout_ms;
        controller.num_partitions = config.num_partitions;
        controller.default_replication_factor = config.default_replication_factor;
        controller.min_insync_replicas = config.min_insync_replicas as usize;
        controller.auto_leader_rebalance = config.auto_leader_rebalance_enable;
        controller.leader_imbalance_check_interval_ms = config
            .leader_imbalance_check_interval_seconds
            .saturating_mul(1000);
        controller.unclean_leader_election = config.unclean_leader_election_enable;
        controller.config_validator = Some(validate_config);
        controller.config_default = Some(config_default);
        controller.seed = uuid::Uuid::new_v4().as_u64_pair().1;
        quorum.controller = controller;
        let node = MetadataNode::new(quorum, persisted)
            .map_err(|e| anyhow::anyhow!("starting the metadata node: {e}"))?;
        let transport = Transport::new(
            config.node_id as u64,
            config.cluster_id.clone(),
            config
                .controller_quorum_voters
                .iter()
                .map(|v| (v.id as u64, format!("{}:{}", v.host, v.port)))
                .collect(),
        );
        let me = Rc::new(ClusterNode {
            node_id: config.node_id,
            shards: shard0.shared.shards,
            config: config.clone(),
            node: RefCell::new(node),
            store: RefCell::new(Some(store)),
            transport,
            started: Instant::now(),
            wake: event_listener::Event::new(),
            replies: RefCell::new(HashMap::new()),
            next_request: Cell::new(1),
            unpublished: RefCell::new(None),
            publish: event_listener::Event::new(),
            published: Cell::new(-1),
            published_event: event_listener::Event::new(),
            last_leader: Cell::new(None),
            broker_epoch: Cell::new(-1),
            shared: shard0.shared.clone(),
            unfenced: Cell::new(false),
            closed: Cell::new(false),
            producer_ids: Cell::new((0, 0)),
            producer_ids_lock: async_lock::Mutex::new(()),
            next_voter: Cell::new(0),
            shutting_down: Cell::new(false),
            apply_errors: RefCell::new(Vec::new()),
        });
        if let Some(addr) = config.controller_listener {
            let listener = glommio::net::TcpListener::bind(addr)
                .map_err(|e| anyhow::anyhow!("binding the CONTROLLER listener {addr}: {e}"))?;
            let name = config.controller_listener_name();
            let protocol = config.controller_security_protocol();
            let security = super::transport::ListenerSecurity {
                tls: if protocol.tls() {
                    Some(
                        crate::security::tls::Tls::new(&config.ssl)
                            .map_err(|e| anyhow::anyhow!("listener {name} ({protocol}): {e:#}"))?,
                    )
                } else {
                    None
                },
                sasl: if protocol.sasl() {
                    Some(Rc::new(
                        // Its sessions last as long as their connections: the raft links
                        // do not log in again (connections.max.reauth.ms is for the brokers'
                        // listeners).
                        crate::security::sasl::SaslServer::new(&config, name)
                            .map_err(|e| anyhow::anyhow!("{e}"))?
                            .with_max_reauth_ms(0),
                    ))
                } else {
                    None
                },
                failed_authentication_delay: Duration::from_millis(
                    config.sasl.failed_authentication_delay_ms,
                ),
                handshake_timeout: Duration::from_millis(config.connections_max_idle_ms)
                    .min(CONTROLLER_HANDSHAKE_TIMEOUT),
                max_receive_size: config.sasl.max_receive_size,
                principal_mapper: crate::security::principal::PrincipalMapper::parse(
                    &config.ssl.principal_mapping_rules,
                )
                .map_err(|e| anyhow::anyhow!("ssl.principal.mapping.rules: {e}"))?,
            };
            glommio::spawn_local(me.transport.clone().serve(
                listener,
                me.clone(),
                Rc::new(security),
            ))
            .detach();
            tracing::info!(listener = %addr, name, security_protocol = %protocol, "serving the controller quorum");
        }
        me.transport.connect_to_voters(me.clone());
        glommio::spawn_local(me.clone().drive()).detach();
        glommio::spawn_local(me.clone().publish_images(shard0.clone())).detach();
        if config.process_roles.broker {
            glommio::spawn_local(me.clone().heartbeats()).detach();
        }
        Ok(me)
    }

    /// Closes the metadata log (clean shutdown), waiting for a persist in progress, and notes
    /// the broker epoch for the next start.
    pub async fn close(&self) {
        self.closed.set(true);
        let epoch = self.broker_epoch.get();
        if self.config.process_roles.broker && epoch >= 0 {
            let path = self.config.data_dir.join(CLEAN_SHUTDOWN_FILE);
            let text = serde_json::to_string(&CleanShutdown {
                version: 0,
                broker_epoch: epoch,
            })
            .expect("plain struct");
            if let Err(e) = crate::metadata::write_durably(&path, text.as_bytes()) {
                tracing::warn!(path = %path.display(), error = %e, "cannot note the clean shutdown; the next start waits out the old session");
            }
        }
        for _ in 0..300 {
            let store = self.store.borrow_mut().take();
            if let Some(store) = store {
                store.close().await;
                return;
            }
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
        tracing::warn!("the metadata log was busy at shutdown; it will be recovered on start");
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub fn cluster_id(&self) -> &str {
        &self.config.cluster_id
    }

    pub fn quorum_status(&self) -> QuorumStatus {
        self.node.borrow().quorum_status()
    }

    pub fn voter_endpoints(&self) -> Vec<(u64, String, u16)> {
        self.config
            .controller_quorum_voters
            .iter()
            .map(|v| (v.id as u64, v.host.clone(), v.port))
            .collect()
    }

    pub fn is_quorum_leader(&self) -> bool {
        self.node.borrow().role() == sluice_replication::quorum::StateRole::Leader
    }

    /// Sends a request frame body (no size prefix) to the quorum leader's CONTROLLER listener
    /// as it is and returns the leader's response frame, size prefix included.
    pub async fn ask_leader(&self, body: &[u8]) -> Option<Bytes> {
        let leader = self.leader_id().filter(|&l| l != self.node_id as u64)?;
        let addr = self.transport.voter_address(leader)?.to_string();
        let mut frame = Vec::with_capacity(body.len() + 4);
        frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
        frame.extend_from_slice(body);
        let response = crate::peer::call(
            crate::peer::Route::Controller,
            &addr,
            Bytes::from(frame),
            REQUEST_TIMEOUT,
        )
        .await
        .ok()?;
        let mut out = Vec::with_capacity(response.len() + 4);
        out.extend_from_slice(&(response.len() as u32).to_be_bytes());
        out.extend_from_slice(&response);
        Some(Bytes::from(out))
    }

    pub fn is_active_controller(&self) -> bool {
        self.node.borrow().is_active_controller()
    }

    pub fn leader_id(&self) -> Option<u64> {
        self.node.borrow().leader_id()
    }

    /// Submits a request to this node's controller; NOT_CONTROLLER when it is not active.
    pub async fn submit(&self, request: core::ControllerRequest) -> core::ControllerResponse {
        let id = self.next_request.get();
        self.next_request.set(id + 1);
        let (tx, rx) = futures_channel::oneshot::channel();
        self.replies.borrow_mut().insert(id, tx);
        let fallback = request.error_response(error_code::NOT_CONTROLLER);
        self.node.borrow_mut().submit(id, request);
        self.wake.notify(1);
        rx.await.unwrap_or(fallback)
    }

    /// The raft driver: ticks, steps, persists, sends, answers and publishes.
    async fn drive(self: Rc<Self>) {
        while !self.closed.get() {
            let woken = self.wake.listen();
            self.node.borrow_mut().tick(self.now_ms());
            self.process_ready().await;
            let leader = self.node.borrow().leader_id();
            if leader != self.last_leader.get() {
                self.last_leader.set(leader);
                tracing::info!(leader = ?leader, term = self.node.borrow().term(), "metadata quorum leader");
                // Metadata names the controller: publish again even without a commit.
                self.queue_publish();
            }
            futures_lite::future::or(woken, glommio::timer::sleep(DRIVER_PERIOD)).await;
        }
    }

    async fn process_ready(&self) {
        while !self.closed.get() {
            let ready = self.node.borrow_mut().ready();
            let Some(mut ready) = ready else { return };
            self.transport.send(std::mem::take(&mut ready.messages));
            if ready.must_persist() {
                let mut store = self
                    .store
                    .borrow_mut()
                    .take()
                    .expect("one persist at a time");
                let result = store.persist(&ready).await;
                *self.store.borrow_mut() = Some(store);
                if let Err(e) = result {
                    // The metadata log cannot be trusted past a failed write or fsync; Kafka
                    // exits too. Restarting recovers from what is on disk.
                    tracing::error!(error = %e, "the metadata log failed; stopping the node");
                    std::process::abort();
                }
            }
            self.transport
                .send(std::mem::take(&mut ready.persisted_messages));
            for (id, response) in ready.replies.drain(..) {
                if let Some(tx) = self.replies.borrow_mut().remove(&id) {
                    let _ = tx.send(response);
                }
            }
            let moved = !ready.committed.is_empty() || ready.installed_snapshot.is_some();
            self.node.borrow_mut().advance();
            if moved {
                self.queue_publish();
            }
        }
    }

    fn queue_publish(&self) {
        *self.unpublished.borrow_mut() = Some(self.node.borrow().image().clone());
        self.publish.notify(1);
    }

    /// The controller Metadata and DescribeCluster name: this broker itself while it is
    /// registered and unfenced, else the lowest live broker. Kafka's brokers name a random live
    /// broker, as clients cannot reach controllers; any broker forwards admin requests to the
    /// active controller. Naming the one the client is talking to means a client never sends
    /// them to a controller that has just died and waits out its request timeout there.
    fn controller_for_clients(&self, image: &ClusterImage) -> i32 {
        if image
            .broker(BrokerId(self.node_id))
            .is_some_and(|b| !b.fenced)
        {
            return self.node_id;
        }
        image.unfenced_brokers().map(|b| b.id.0).min().unwrap_or(-1)
    }

    /// Hands each new image to every shard, newest first: images that arrive while one is being
    /// applied are coalesced into the latest.
    async fn publish_images(self: Rc<Self>, shard0: Rc<Shard>) {
        loop {
            let listener = self.publish.listen();
            let next = self.unpublished.borrow_mut().take();
            let Some(cluster) = next else {
                listener.await;
                continue;
            };
            let controller = self.controller_for_clients(&cluster);
            let image = Arc::new(crate::metadata::view::broker_image(
                &cluster,
                self.node_id,
                self.shards,
                controller,
            ));
            let offset = cluster.offset().0;
            for r in shard0.apply_image_everywhere(image).await {
                if let Err(e) = r {
                    tracing::error!(offset, error = %e, "applying a metadata image failed on a shard");
                    self.apply_errors.borrow_mut().push(e);
                }
            }
            self.published.set(offset);
            self.published_event.notify(usize::MAX);
        }
    }

    /// The metadata offset this node's own image has applied (its shards may not have it yet).
    pub fn applied_offset(&self) -> i64 {
        self.node.borrow().image().offset().0
    }

    /// Waits until every shard has an image of at least metadata offset `offset` that
    /// satisfies `done`, or `timeout` passes.
    pub async fn wait_for_image(
        &self,
        shard0: &Rc<Shard>,
        timeout: Duration,
        offset: i64,
        done: impl Fn(&crate::metadata::MetadataImage) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let listener = self.published_event.listen();
            if self.published.get() >= offset && done(&shard0.image()) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            futures_lite::future::or(listener, glommio::timer::sleep(deadline - now)).await;
        }
    }

    /// The CONTROLLER address of the node to ask for the active controller: the quorum leader
    /// when this node knows one other than itself, else the other voters in turn. A broker-only
    /// node learns the leader only once it replicates the log, which starts after it has
    /// registered; a voter asks around during an election. A voter that is not the active
    /// controller answers NOT_CONTROLLER, and the caller retries.
    fn controller_address(&self) -> Option<String> {
        if let Some(leader) = self.leader_id() {
            if leader == self.node_id as u64 {
                return None;
            }
            return self.transport.voter_address(leader).map(str::to_string);
        }
        let others: Vec<_> = self
            .config
            .controller_quorum_voters
            .iter()
            .filter(|v| v.id != self.node_id)
            .collect();
        if others.is_empty() {
            return None;
        }
        let i = self.next_voter.get();
        self.next_voter.set(i.wrapping_add(1));
        let v = others[i % others.len()];
        Some(format!("{}:{}", v.host, v.port))
    }

    /// Sends an inter-node request to the active controller: this node's own when it is the
    /// one, else over the network to the quorum leader. `None` when there is none to ask.
    async fn controller_call(
        &self,
        request: core::ControllerRequest,
    ) -> Option<core::ControllerResponse> {
        if self.is_active_controller() {
            return Some(self.submit(request).await);
        }
        let addr = self.controller_address()?;
        let (key, version, kafka) = controller_api::kafka_request(&request)?;
        let frame = encode_request(key, version, 1, &kafka).ok()?;
        let body = match crate::peer::call(
            crate::peer::Route::Controller,
            &addr,
            frame,
            REQUEST_TIMEOUT,
        )
        .await
        {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(%addr, error = %e, ?key, "controller call failed");
                return None;
            }
        };
        let response = decode_response(key, version, body).ok()?;
        controller_api::core_response(&response)
    }

    /// Registers this broker, then heartbeats every `broker.heartbeat.interval.ms`; registers
    /// again whenever the controller has forgotten it.
    async fn heartbeats(self: Rc<Self>) {
        let incarnation = uuid::Uuid::new_v4();
        let interval = Duration::from_millis(self.config.broker_heartbeat_interval_ms);
        let mut previous_epoch = take_clean_shutdown_epoch(&self.config.data_dir);
        loop {
            let request =
                core::ControllerRequest::BrokerRegistration(core::BrokerRegistrationRequest {
                    broker_id: BrokerId(self.node_id),
                    cluster_id: self.config.cluster_id.clone(),
                    incarnation_id: incarnation,
                    listeners: self
                        .config
                        .broker_listeners
                        .iter()
                        .map(|l| Endpoint {
                            name: l.name.clone(),
                            host: l.advertised_host.clone(),
                            port: l.advertised_port,
                            security_protocol: self
                                .config
                                .security_protocol_of(&l.name)
                                .map_or(0, |p| p.id()),
                        })
                        .collect(),
                    rack: self.config.broker_rack.clone(),
                    previous_broker_epoch: previous_epoch,
                });
            match self.controller_call(request).await {
                Some(core::ControllerResponse::BrokerRegistration(r)) if r.error_code == 0 => {
                    self.broker_epoch.set(r.broker_epoch);
                    self.shared
                        .broker_epoch
                        .store(r.broker_epoch, std::sync::atomic::Ordering::Release);
                    tracing::info!(
                        broker_epoch = r.broker_epoch,
                        previous_broker_epoch = previous_epoch,
                        "registered with the controller"
                    );
                    previous_epoch = r.broker_epoch;
                }
                Some(core::ControllerResponse::BrokerRegistration(r)) => {
                    if r.error_code != error_code::NOT_CONTROLLER {
                        tracing::info!(
                            error_code = r.error_code,
                            "the controller refused the registration; retrying"
                        );
                    }
                    if r.error_code == error_code::INCONSISTENT_CLUSTER_ID {
                        tracing::error!(
                            cluster_id = %self.config.cluster_id,
                            "the controller belongs to another cluster than the one this node \
                             was formatted for; this broker cannot register"
                        );
                    }
                    glommio::timer::sleep(RETRY_BACKOFF * 5).await;
                    continue;
                }
                _ => {
                    glommio::timer::sleep(RETRY_BACKOFF).await;
                    continue;
                }
            }
            // Heartbeat until the controller says the registration is gone.
            loop {
                if self.shutting_down.get() {
                    return;
                }
                let request =
                    core::ControllerRequest::BrokerHeartbeat(core::BrokerHeartbeatRequest {
                        broker_id: BrokerId(self.node_id),
                        broker_epoch: BrokerEpoch(self.broker_epoch.get()),
                        current_metadata_offset: Offset(self.published.get().max(0)),
                        wants_fence: false,
                        wants_shut_down: false,
                    });
                let started = Instant::now();
                match self.controller_call(request).await {
                    Some(core::ControllerResponse::BrokerHeartbeat(r)) if r.error_code == 0 => {
                        if self.unfenced.get() == r.is_fenced {
                            tracing::info!(fenced = r.is_fenced, "broker state changed");
                        }
                        self.unfenced.set(!r.is_fenced);
                    }
                    Some(core::ControllerResponse::BrokerHeartbeat(r))
                        if r.error_code == error_code::STALE_BROKER_EPOCH
                            || r.error_code == error_code::BROKER_ID_NOT_REGISTERED =>
                    {
                        tracing::warn!(
                            error_code = r.error_code,
                            "the controller no longer knows this broker; registering again"
                        );
                        self.unfenced.set(false);
                        break;
                    }
                    _ => {
                        // No controller, or it is busy: try again soon, within the session.
                        glommio::timer::sleep(RETRY_BACKOFF).await;
                        continue;
                    }
                }
                // A fenced broker asks again soon: it is unfenced as soon as it has caught up
                // with the metadata log, and serves nothing until then.
                let wait = if self.unfenced.get() {
                    interval
                } else {
                    RETRY_BACKOFF
                };
                let elapsed = started.elapsed();
                if elapsed < wait {
                    glommio::timer::sleep(wait - elapsed).await;
                }
            }
        }
    }

    /// Fails with what the shards could not apply so far (a partition that would not open): a
    /// broker that starts must serve every partition it hosts, as Kafka loads every log first.
    pub fn check_applied(&self) -> anyhow::Result<()> {
        let errors = self.apply_errors.borrow();
        if errors.is_empty() {
            return Ok(());
        }
        anyhow::bail!("{}", errors.join("; "))
    }

    /// Whether this broker is registered and unfenced (its last heartbeat said so).
    pub fn is_unfenced(&self) -> bool {
        self.unfenced.get()
    }

    /// Imports a single-node broker's metadata file (from before the metadata log) through the
    /// controller, once this broker is registered and unfenced, and waits until every shard has
    /// the topics. Importing the same file again (a crash before it was retired) changes nothing.
    pub async fn migrate(
        &self,
        shard0: &Rc<Shard>,
        old: &crate::metadata::MetadataImage,
    ) -> anyhow::Result<usize> {
        let request = core::ControllerRequest::Migrate(core::MigrateRequest {
            broker_id: BrokerId(self.node_id),
            topics: old
                .topics
                .values()
                .map(|t| core::MigratedTopic {
                    name: t.name.clone(),
                    id: sluice_replication::records::TopicId(t.id),
                    partitions: t.shards.len() as i32,
                    configs: t.configs.clone(),
                })
                .collect(),
            broker_configs: old.broker_configs.clone(),
            next_producer_id: old.next_producer_id,
        });
        let imported = match self.controller_call(request).await {
            Some(core::ControllerResponse::Migrate(r)) if r.error_code == 0 => r.imported,
            Some(core::ControllerResponse::Migrate(r)) => anyhow::bail!(
                "the controller refused to import the metadata file (error {}): {}",
                r.error_code,
                r.error_message.unwrap_or_default()
            ),
            other => anyhow::bail!("importing the metadata file: no answer ({other:?})"),
        };
        let names: Vec<String> = old.topics.keys().cloned().collect();
        if !self
            .wait_for_image(shard0, APPLIED_WAIT_MIGRATION, -1, |image| {
                names.iter().all(|n| image.topics.contains_key(n))
            })
            .await
        {
            anyhow::bail!("the imported topics did not reach the shards");
        }
        Ok(imported)
    }

    /// Kafka's controlled shutdown, on SIGTERM: heartbeats ask to shut down until the active
    /// controller answers that this broker may, which it does once the batch that moves its
    /// leaderships away, takes it out of the ISRs and fences it has committed; clients then
    /// find the partitions' new leaders in Metadata. Gives up after the broker session timeout
    /// (by then the controller fences it anyway), e.g. when the quorum has no majority.
    pub async fn controlled_shutdown(&self) {
        let epoch = self.broker_epoch.get();
        if epoch < 0 {
            return;
        }
        self.shutting_down.set(true);
        let started = Instant::now();
        let most = Duration::from_millis(self.config.broker_session_timeout_ms);
        loop {
            let request = core::ControllerRequest::BrokerHeartbeat(core::BrokerHeartbeatRequest {
                broker_id: BrokerId(self.node_id),
                broker_epoch: BrokerEpoch(epoch),
                current_metadata_offset: Offset(self.published.get().max(0)),
                wants_fence: false,
                wants_shut_down: true,
            });
            let answer = futures_lite::future::or(self.controller_call(request), async {
                glommio::timer::sleep(most.saturating_sub(started.elapsed())).await;
                None
            })
            .await;
            if let Some(core::ControllerResponse::BrokerHeartbeat(r)) = answer {
                if r.error_code == 0 && r.should_shut_down {
                    tracing::info!(
                        took_ms = started.elapsed().as_millis() as u64,
                        "controlled shutdown: leaderships handed over"
                    );
                    return;
                }
            }
            if started.elapsed() >= most {
                tracing::warn!(
                    waited_ms = most.as_millis() as u64,
                    "controlled shutdown: no controller confirmed it; stopping anyway"
                );
                return;
            }
            glommio::timer::sleep(RETRY_BACKOFF).await;
        }
    }

    /// The next idempotent producer id: from this broker's block, which the controller hands
    /// out (AllocateProducerIds) so that no two brokers ever give out the same id. `None`
    /// when no block can be had now (no controller, or this broker is not registered).
    pub async fn next_producer_id(&self) -> Option<i64> {
        let _one = self.producer_ids_lock.lock().await;
        let (next, end) = self.producer_ids.get();
        if next < end {
            self.producer_ids.set((next + 1, end));
            return Some(next);
        }
        let epoch = self.broker_epoch.get();
        if epoch < 0 {
            return None;
        }
        let request =
            core::ControllerRequest::AllocateProducerIds(core::AllocateProducerIdsRequest {
                broker_id: BrokerId(self.node_id),
                broker_epoch: BrokerEpoch(epoch),
            });
        match self.controller_call(request).await {
            Some(core::ControllerResponse::AllocateProducerIds(r))
                if r.error_code == 0 && r.producer_id_len > 0 =>
            {
                let start = r.producer_id_start;
                self.producer_ids
                    .set((start + 1, start + r.producer_id_len as i64));
                tracing::info!(
                    start,
                    len = r.producer_id_len,
                    "got a block of producer ids"
                );
                Some(start)
            }
            other => {
                tracing::warn!(answer = ?other, "no block of producer ids from the controller");
                None
            }
        }
    }

    /// Sends a partition leader's ISR changes to the active controller (AlterPartition, as
    /// Kafka's leaders do). `None` when no controller answered.
    pub async fn alter_partition(
        &self,
        partitions: Vec<core::AlterPartitionItem>,
    ) -> Option<core::AlterPartitionResponse> {
        let request = core::ControllerRequest::AlterPartition(core::AlterPartitionRequest {
            broker_id: BrokerId(self.node_id),
            broker_epoch: sluice_replication::records::BrokerEpoch(self.broker_epoch.get()),
            partitions,
        });
        match self.controller_call(request).await? {
            core::ControllerResponse::AlterPartition(r) => Some(r),
            other => {
                tracing::warn!(answer = ?other, "unexpected answer to AlterPartition");
                None
            }
        }
    }

    /// Tells the controller that this broker lost its replicas of `partitions` (their log
    /// directory failed); `None` when no controller answered.
    pub async fn lost_replicas(
        &self,
        partitions: Vec<(sluice_replication::records::TopicId, i32)>,
    ) -> Option<core::LostReplicasResponse> {
        let request = core::ControllerRequest::LostReplicas(core::LostReplicasRequest {
            broker_id: BrokerId(self.node_id),
            broker_epoch: sluice_replication::records::BrokerEpoch(self.broker_epoch.get()),
            partitions,
        });
        match self.controller_call(request).await? {
            core::ControllerResponse::LostReplicas(r) => Some(r),
            other => {
                tracing::warn!(answer = ?other, "unexpected answer to AssignReplicasToDirs");
                None
            }
        }
    }

    /// An admin request (CreateTopics, DeleteTopics, CreatePartitions,
    /// IncrementalAlterConfigs) at the active controller: run here when this node is it, else
    /// forwarded inside an Envelope to the quorum leader, retrying while no controller answers
    /// (an election) for a few seconds, then failed with REQUEST_TIMED_OUT.
    pub async fn admin(
        self: &Rc<Self>,
        key: ApiKey,
        version: i16,
        request: RequestKind,
    ) -> ResponseKind {
        let deadline = Instant::now() + ADMIN_RETRY_FOR;
        loop {
            let response = if self.is_active_controller() {
                Some(controller_api::admin(self, request.clone(), version).await)
            } else {
                self.forward(key, version, &request).await
            };
            let retry = match &response {
                None => true,
                Some(r) => all_not_controller(r),
            };
            if !retry {
                return response.expect("an answer");
            }
            if Instant::now() >= deadline {
                tracing::warn!(?key, "no active controller answered; failing the request");
                let core = controller_api::controller_request(&request).expect("an admin request");
                return controller_api::admin_response(
                    core.error_response(error_code::REQUEST_TIMED_OUT),
                    version,
                );
            }
            glommio::timer::sleep(RETRY_BACKOFF).await;
        }
    }

    async fn forward(
        &self,
        key: ApiKey,
        version: i16,
        request: &RequestKind,
    ) -> Option<ResponseKind> {
        let addr = self.controller_address()?;
        let inner = encode_request(key, version, 0, request).ok()?;
        let envelope = RequestKind::Envelope(
            EnvelopeRequest::default()
                .with_request_data(inner.slice(4..))
                .with_client_host_address(Bytes::from_static(&[127, 0, 0, 1])),
        );
        let frame = encode_request(ApiKey::Envelope, 0, 1, &envelope).ok()?;
        let body = crate::peer::call(
            crate::peer::Route::Controller,
            &addr,
            frame,
            REQUEST_TIMEOUT,
        )
        .await
        .ok()?;
        let ResponseKind::Envelope(outer) = decode_response(ApiKey::Envelope, 0, body).ok()? else {
            return None;
        };
        if outer.error_code != 0 {
            tracing::debug!(
                error_code = outer.error_code,
                "the controller refused a forwarded request"
            );
            return None;
        }
        // The inner response whole: header and body, without a size prefix.
        let data = outer.response_data?;
        decode_response(key, version, data.to_vec()).ok()
    }
}

/// Whether every part of an admin response says NOT_CONTROLLER (so it is worth retrying).
fn all_not_controller(response: &ResponseKind) -> bool {
    let nc = error_code::NOT_CONTROLLER;
    match response {
        ResponseKind::CreateTopics(r) => {
            !r.topics.is_empty() && r.topics.iter().all(|t| t.error_code == nc)
        }
        ResponseKind::DeleteTopics(r) => {
            !r.responses.is_empty() && r.responses.iter().all(|t| t.error_code == nc)
        }
        ResponseKind::CreatePartitions(r) => {
            !r.results.is_empty() && r.results.iter().all(|t| t.error_code == nc)
        }
        ResponseKind::IncrementalAlterConfigs(r) => {
            !r.responses.is_empty() && r.responses.iter().all(|t| t.error_code == nc)
        }
        ResponseKind::ElectLeaders(r) => r.error_code == nc,
        ResponseKind::AlterPartitionReassignments(r) => r.error_code == nc,
        ResponseKind::ListPartitionReassignments(r) => r.error_code == nc,
        ResponseKind::UpdateFeatures(r) => r.error_code == nc,
        ResponseKind::AlterUserScramCredentials(r) => {
            !r.results.is_empty() && r.results.iter().all(|u| u.error_code == nc)
        }
        ResponseKind::CreateAcls(r) => {
            !r.results.is_empty() && r.results.iter().all(|c| c.error_code == nc)
        }
        ResponseKind::DeleteAcls(r) => {
            !r.filter_results.is_empty() && r.filter_results.iter().all(|f| f.error_code == nc)
        }
        _ => false,
    }
}

impl Inbound for ClusterNode {
    fn raft_message(&self, message: sluice_replication::quorum::Message) {
        self.node.borrow_mut().step(message);
        self.wake.notify(1);
    }

    fn request(self: Rc<Self>, frame: Bytes) -> futures_lite::future::BoxedLocal<Option<Bytes>> {
        Box::pin(async move { controller_api::answer(&self, frame).await })
    }

    fn scram_credential(
        &self,
        user: &str,
        mechanism: i8,
    ) -> Option<sluice_replication::records::UserScramCredentialRecord> {
        self.node
            .borrow()
            .image()
            .scram_credential(user, mechanism)
            .cloned()
    }

    fn may_join(&self, principal: &str, host: &str) -> bool {
        if !self.config.authorizer {
            return true;
        }
        let node = self.node.borrow();
        sluice_replication::acl::authorize(
            node.image().acls().values(),
            &self.config.authorizer_config,
            sluice_replication::acl::Requester { principal, host },
            sluice_replication::acl::Action {
                operation: sluice_replication::acl::operation::CLUSTER_ACTION,
                resource_type: sluice_replication::acl::resource_type::CLUSTER,
                resource_name: sluice_replication::acl::CLUSTER_NAME,
            },
        )
    }

    fn authentication_failed(&self) {
        crate::metrics::Metrics::count(&self.shared.metrics.failed_authentication, 1);
    }
}

impl ControllerChannel for ClusterNode {
    fn alter_partition(
        self: Rc<Self>,
        partitions: Vec<core::AlterPartitionItem>,
    ) -> BoxedLocal<Option<core::AlterPartitionResponse>> {
        Box::pin(async move { ClusterNode::alter_partition(&self, partitions).await })
    }

    fn lost_replicas(
        self: Rc<Self>,
        partitions: Vec<(sluice_replication::records::TopicId, i32)>,
    ) -> BoxedLocal<Option<core::LostReplicasResponse>> {
        Box::pin(async move { ClusterNode::lost_replicas(&self, partitions).await })
    }

    fn next_producer_id(self: Rc<Self>) -> BoxedLocal<Option<i64>> {
        Box::pin(async move { ClusterNode::next_producer_id(&self).await })
    }

    fn is_active_controller(&self) -> bool {
        ClusterNode::is_active_controller(self)
    }

    fn into_any(self: Rc<Self>) -> Rc<dyn std::any::Any> {
        self
    }
}
