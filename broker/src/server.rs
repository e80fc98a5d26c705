//! Starting the broker: load the metadata image, start one shard per core, open every
//! partition on its owner shard, serve the Kafka protocol on every shard (SO_REUSEPORT), and on
//! SIGTERM/SIGINT stop accepting, close every log cleanly and exit.

use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use glommio::channels::channel_mesh::{Full, MeshBuilder};
use glommio::net::TcpListener;
use glommio::{LocalExecutorPoolBuilder, PoolPlacement};

use crate::config::security::SecurityProtocol;
use crate::config::BrokerConfig;
use crate::metadata::MetadataImage;
use crate::shard::{Job, Shard, Shared, MESH_QUEUE_DEPTH};

static STOP: AtomicBool = AtomicBool::new(false);

/// How long a shutdown waits for requests in flight (long-polling fetches included).
const SHUTDOWN_DRAIN_MAX: Duration = Duration::from_secs(3);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(signal, on_signal as *const () as libc::sighandler_t);
        }
    }
}

/// Fails if something already accepts connections on `addr`. Binding a probe socket would not
/// do: connections of a previous run that linger after a restart hold the port too, and the
/// shards' SO_REUSEPORT sockets can share it with them but not with a probe.
fn check_port_free(addr: std::net::SocketAddr) -> std::io::Result<()> {
    let mut probe = addr;
    if probe.ip().is_unspecified() {
        probe.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    // The listening socket of a process killed a moment ago can outlive it briefly (io_uring
    // releases its files after the process is gone), so only a listener that stays counts.
    let started = std::time::Instant::now();
    loop {
        match std::net::TcpStream::connect_timeout(&probe, std::time::Duration::from_millis(300)) {
            Err(_) => return Ok(()),
            Ok(_) if started.elapsed() > std::time::Duration::from_secs(3) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    "another process is listening there",
                ))
            }
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    }
}

/// One `MeshBuilder` per shard, each to be moved (never cloned) into its shard's thread.
///
/// glommio 0.9's `MeshBuilder` is `Send` but shares its peer list through an `Rc`: clones and
/// drops on the shard threads race on the reference count, and AddressSanitizer showed the
/// result at start-up (a heap use-after-free when two shards dropped their builders at once;
/// without ASan, rarely, "malloc(): unaligned tcache chunk detected"). So every clone is made
/// here, on this one thread, before any shard starts, and one clone is leaked: with no other
/// increments left, racing decrements can only leave the count too high, and the extra reference
/// keeps it above zero, so the peer list is never freed while a shard still uses it.
fn mesh_builders(shards: usize) -> Arc<std::sync::Mutex<Vec<MeshBuilder<Job, Full>>>> {
    let mesh = MeshBuilder::<Job, _>::full(shards, MESH_QUEUE_DEPTH);
    let builders = (0..shards).map(|_| mesh.clone()).collect();
    std::mem::forget(mesh);
    Arc::new(std::sync::Mutex::new(builders))
}

/// A panic on any thread ends the process: a shard that unwound would leave the others waiting
/// on it (cross-shard jobs, start-up) with the port still open, a broker that looks alive and
/// serves nothing. The default hook prints the message and backtrace first.
fn abort_on_panic() {
    let print = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        print(info);
        tracing::error!("a thread panicked; aborting the broker");
        std::process::abort();
    }));
}

/// The single-node default's start on shard 0, once its quorum of one runs: wait until this
/// broker is registered and unfenced (the metadata log replayed, every partition in it opened),
/// import the metadata file of a broker from before the metadata log and retire it, create the
/// offsets topic, and fail if any partition could not be opened.
async fn standalone_start(
    shard: &std::rc::Rc<crate::shard::Shard>,
    node: &crate::cluster::node::ClusterNode,
) -> anyhow::Result<()> {
    let data_dir = shard.config().data_dir.clone();
    let waited = std::time::Instant::now();
    let mut noted = false;
    while !node.is_unfenced() {
        if STOP.load(Ordering::SeqCst) {
            return Ok(());
        }
        if !noted && waited.elapsed() > Duration::from_secs(10) {
            tracing::warn!("still waiting for this broker to register with its own controller");
            noted = true;
        }
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    // Every shard leads its partitions only once its image holds this run's registration,
    // unfenced: before that a produce would be told NOT_LEADER_OR_FOLLOWER.
    let me = shard.config().node_id;
    let epoch = shard.shared.broker_epoch.load(Ordering::Acquire);
    let registered = node
        .wait_for_image(
            shard,
            Duration::from_secs(30),
            node.applied_offset(),
            |image| {
                image
                    .cluster
                    .as_ref()
                    .and_then(|c| c.broker(me))
                    .is_some_and(|b| !b.fenced && b.epoch == epoch)
            },
        )
        .await;
    if !registered {
        tracing::warn!("this broker's registration did not reach every shard in time");
    }
    node.check_applied()?;
    let file = MetadataImage::path(&data_dir);
    if file.exists() {
        let old = MetadataImage::load(&data_dir)?;
        let imported = node.migrate(shard, &old).await?;
        node.check_applied()?;
        let retired = file.with_extension("json.migrated");
        std::fs::rename(&file, &retired)
            .and_then(|_| std::fs::File::open(&data_dir)?.sync_all())
            .map_err(|e| anyhow::anyhow!("retiring {}: {e}", file.display()))?;
        tracing::info!(
            topics = old.topics.len(),
            imported,
            next_producer_id = old.next_producer_id,
            retired = %retired.display(),
            "imported the metadata file into the metadata log"
        );
    }
    let offsets = crate::group::offsets_topic::OFFSETS_TOPIC;
    if !shard.image().topics.contains_key(offsets) {
        match crate::cluster::create_internal_topic(shard, crate::cluster::InternalTopic::Offsets)
            .await
        {
            Ok(()) | Err(crate::cluster::CreateError::Exists) => {}
            Err(e) => anyhow::bail!("creating the offsets topic: {e}"),
        }
        node.check_applied()?;
    }
    Ok(())
}

pub fn run(mut config: BrokerConfig) -> anyhow::Result<()> {
    abort_on_panic();
    for dir in &config.log_dirs {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
    }
    let (identity, directory_ids) = crate::cluster::meta_properties::load_or_format(&config)?;
    config.cluster_id = identity.cluster_id;
    config.log_dir_ids = directory_ids;
    crate::shard::replica_move::recover(&config.log_dirs)?;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let shards = if config.cores == 0 {
        cores
    } else {
        config.cores
    };
    if config.is_cluster() && MetadataImage::path(&config.data_dir).exists() {
        anyhow::bail!(
            "{} holds a single-node broker's metadata ({}); a cluster node starts from an \
             empty data directory",
            config.data_dir.display(),
            crate::metadata::METADATA_FILE
        );
    }
    // Topics come from the metadata log once the quorum (on the single-node default, a quorum
    // of one) replays it; a single-node broker's older metadata file is imported into it.
    let mut image = MetadataImage::default();
    // Placement of new partitions spreads over the shards this process runs.
    image.shards = shards;
    let image = Arc::new(image);
    install_signal_handlers();
    // Shards bind their own SO_REUSEPORT sockets, which would quietly share the port with
    // another broker; so bind once here first, to fail fast with a clear error.
    if config.process_roles.broker {
        for l in &config.broker_listeners {
            check_port_free(l.addr)
                .map_err(|e| anyhow::anyhow!("cannot listen on {} ({}): {e}", l.addr, l.name))?;
        }
    }
    // An SSL listener's key material is loaded once here, so that a missing or bad file stops
    // the start with a clear error rather than every shard's handshakes.
    let protocol = config.client_security_protocol()?;
    let mut served = Vec::new();
    if config.process_roles.broker {
        served.extend(config.broker_listeners.iter().map(|l| l.name.clone()));
    }
    if config.is_cluster() && config.process_roles.controller {
        served.push(config.controller_listener_name().to_string());
    }
    crate::security::principal::PrincipalMapper::parse(&config.ssl.principal_mapping_rules)
        .map_err(|e| anyhow::anyhow!("ssl.principal.mapping.rules: {e}"))?;
    let mut tls_listeners = Vec::new();
    for name in served {
        let protocol = config
            .security_protocol_of(&name)
            .unwrap_or(SecurityProtocol::Plaintext);
        if protocol.sasl() {
            crate::security::sasl::SaslServer::new(&config, &name)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        if protocol.tls() {
            crate::security::tls::server_config(&config.ssl)
                .map_err(|e| anyhow::anyhow!("listener {name} ({protocol}): {e:#}"))?;
            tls_listeners.push(name);
        }
    }
    if config.is_cluster() {
        // This node's own TLS client, for the connections it opens to the other nodes.
        crate::peer::Dialers::new(&config).map_err(|e| anyhow::anyhow!("{e:#}"))?;
    }
    if !tls_listeners.is_empty() {
        if crate::security::tls::kernel_tls_available() {
            tracing::info!("fetches over SSL copy records through the broker: handing TLS to the kernel (kTLS) is not built yet");
        } else {
            tracing::info!("fetches over SSL copy records through the broker: this kernel has no kernel TLS (kTLS) to splice them through");
        }
    }
    if let Some(addr) = config.controller_listener.filter(|_| config.is_cluster()) {
        check_port_free(addr)
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (CONTROLLER): {e}"))?;
    }
    let shared = Arc::new(Shared {
        config: config.clone(),
        shards,
        appended: (0..shards).map(|_| event_listener::Event::new()).collect(),
        drained: std::sync::atomic::AtomicUsize::new(0),
        opened: std::sync::atomic::AtomicUsize::new(0),
        handed_over: std::sync::atomic::AtomicBool::new(false),
        metadata_ready: std::sync::atomic::AtomicBool::new(false),
        broker_epoch: std::sync::atomic::AtomicI64::new(-1),
        coordinators: (0..config.offsets_topic_partitions)
            .map(|_| std::sync::atomic::AtomicBool::new(false))
            .collect(),
        metrics: Arc::new(crate::metrics::Metrics::new(shards)),
        quotas: crate::quota::Sensors::new(crate::quota::Window {
            samples: config.quota_window_num,
            sample_ms: u64::from(config.quota_window_size_seconds) * 1000,
        }),
        log_dirs: crate::shard::log_dirs::LogDirs::new(&config.log_dirs, &config.log_dir_ids),
        move_throttle: Default::default(),
    });
    let _ = shared.metrics.log_dirs.set(
        shared
            .log_dirs
            .dirs()
            .iter()
            .map(|d| (d.path.to_string_lossy().into_owned(), d.id.clone()))
            .collect(),
    );
    if let Some(listener) = &config.metrics_listener {
        // The lag comes from this broker's own listener, asked as a plaintext client would
        // (`cli::group_lags`): not possible on a TLS or SASL listener yet.
        let plaintext = protocol == crate::config::security::SecurityProtocol::Plaintext;
        if config.process_roles.broker && !plaintext {
            tracing::info!(security_protocol = %protocol, "kafka_consumergroup_lag is not exported: it is read through the broker's own listener, which needs PLAINTEXT for that today");
        }
        let bootstrap = (config.process_roles.broker && plaintext)
            .then(|| format!("{}:{}", config.advertised_host, config.advertised_port));
        let node_id = config.node_id;
        let lags = bootstrap.map(|b| -> crate::metrics::LagSource {
            Box::new(move || crate::cli::group_lags(&b, Some(node_id)))
        });
        crate::metrics::serve(listener, shared.metrics.clone(), lags)?;
    }
    let meshes = mesh_builders(shards);
    tracing::info!(shards, node_id = config.node_id, roles = %config.process_roles, cluster_id = %config.cluster_id, listener = %config.listener, log_dirs = ?config.log_dirs, topics = image.topics.len(), "starting sluice");
    let handles = LocalExecutorPoolBuilder::new(PoolPlacement::MaxSpread(shards, None))
        .name("shard")
        .spin_before_park(Duration::from_micros(200))
        .on_all_shards(move || {
            let shared = shared.clone();
            let image = image.clone();
            let meshes = meshes.clone();
            async move {
                let mesh = meshes.lock().expect("mesh builders").pop().expect("one mesh builder per shard");
                let (senders, receivers) = mesh.join().await.map_err(|_| anyhow::anyhow!("joining the shard mesh"))?;
                let id = senders.peer_id();
                let shard = Shard::new(id, shared.clone(), image.clone(), senders);
                if shared.config.is_cluster() {
                    crate::peer::set_dialers(crate::peer::Dialers::new(&shared.config).map_err(|e| anyhow::anyhow!("{e:#}"))?);
                }
                let inter = shared.config.inter_broker_listener();
                if shared.config.security_protocol_of(inter).is_ok_and(|p| p != SecurityProtocol::Plaintext) {
                    // This node's calls to itself (peer.rs) are served in-process, not
                    // through its own TLS and SASL.
                    let (host, port) = shared.config.advertised_on(inter);
                    let own = format!("{host}:{port}");
                    let weak = Rc::downgrade(&shard);
                    crate::peer::set_loopback(own, Rc::new(move |frame| {
                        let shard = weak.upgrade();
                        Box::pin(async move {
                            match shard {
                                Some(shard) => crate::net::loopback(shard, frame).await,
                                None => Err(std::io::Error::other("shard stopped")),
                            }
                        })
                    }));
                }
                shard.serve_jobs(receivers);
                // Groups load once the image names this node the leader of their offsets
                // partitions (`Shard::on_offsets_leadership`).
                let opened = async {
                    for topic in image.topics.values() {
                        shard.open_owned(topic).await?;
                    }
                    anyhow::Ok(())
                }
                .await;
                if let Err(e) = opened {
                    // The other shards wait for this one (below): stop them, so the process
                    // exits with this error rather than hang.
                    STOP.store(true, Ordering::SeqCst);
                    shard.close_all().await;
                    return Err(e);
                }
                // Serve nothing until every shard has opened (recovered) its partitions, so that
                // every partition Metadata lists answers, as Kafka loads all logs before it listens.
                shared.opened.fetch_add(1, Ordering::SeqCst);
                while shared.opened.load(Ordering::SeqCst) < shared.shards {
                    if STOP.load(Ordering::SeqCst) {
                        // Another shard failed to start, or a signal came during start-up.
                        shard.close_all().await;
                        return Ok(());
                    }
                    glommio::timer::sleep(Duration::from_millis(5)).await;
                }
                shard.start_group_timers();
                shard.start_housekeeping();
                let cluster = shared.config.is_cluster();
                if id == 0 {
                    let ready = async {
                        let node = crate::cluster::node::ClusterNode::start(&shard).await?;
                        shard.set_controller(node.clone());
                        if cluster {
                            // Every shard waits for the cluster's image below.
                            Ok(())
                        } else {
                            standalone_start(&shard, &node).await
                        }
                    }
                    .await;
                    if let Err(e) = ready {
                        STOP.store(true, Ordering::SeqCst);
                        shared.metadata_ready.store(true, Ordering::SeqCst);
                        shard.close_all().await;
                        if let Some(node) = crate::cluster::node_of(&shard) {
                            node.close().await;
                        }
                        return Err(e);
                    }
                    shared.metadata_ready.store(true, Ordering::SeqCst);
                }
                while !shared.metadata_ready.load(Ordering::SeqCst) && !STOP.load(Ordering::SeqCst) {
                    glommio::timer::sleep(Duration::from_millis(5)).await;
                }
                // A cluster broker serves clients once its image holds the registration it made
                // in this run, so it has everything committed before it (Kafka's initial
                // catch-up): never from an empty image that would name only itself, nor from
                // the stale one its own copy of the metadata log replays to after a restart
                // (itself leading what moved while it was down). Each shard applies images in
                // its own time, so each waits for its own.
                let me = shared.config.node_id;
                let caught_up = |shard: &Shard| {
                    let epoch = shared.broker_epoch.load(Ordering::Acquire);
                    let image = shard.image();
                    match &image.cluster {
                        None => false,
                        Some(_) if !shared.config.process_roles.broker => true,
                        Some(view) => epoch >= 0 && view.broker(me).is_some_and(|b| b.epoch == epoch),
                    }
                };
                while cluster && !caught_up(&shard) && !STOP.load(Ordering::SeqCst) {
                    glommio::timer::sleep(Duration::from_millis(5)).await;
                }
                let mut servers = Vec::new();
                if shared.config.process_roles.broker && !STOP.load(Ordering::SeqCst) {
                    for l in &shared.config.broker_listeners {
                        let listener = TcpListener::bind(l.addr).map_err(|e| anyhow::anyhow!("shard {id}: binding {} ({}): {e}", l.addr, l.name))?;
                        if id == 0 {
                            let protocol = shared.config.security_protocol_of(&l.name).unwrap_or(SecurityProtocol::Plaintext);
                            tracing::info!(listener = %l.addr, name = %l.name, security_protocol = %protocol, "serving the Kafka protocol");
                        }
                        servers.push(glommio::spawn_local(crate::net::serve(shard.clone(), listener, Rc::from(l.name.as_str()))));
                    }
                }
                while !STOP.load(Ordering::SeqCst) {
                    glommio::timer::sleep(Duration::from_millis(100)).await;
                }
                // A cluster broker hands its leaderships over before it stops serving (Kafka's
                // controlled shutdown): shard 0 asks the controller, the others keep serving.
                // (A single node has nobody to hand them to.)
                if cluster && shared.config.process_roles.broker {
                    if let Some(node) = crate::cluster::node_of(&shard) {
                        node.controlled_shutdown().await;
                        shared.handed_over.store(true, Ordering::SeqCst);
                    }
                    // Bounded: shard 0's handover gives up after the session timeout.
                    let waited = std::time::Instant::now();
                    let most = Duration::from_millis(shared.config.broker_session_timeout_ms) + SHUTDOWN_DRAIN_MAX;
                    while !shared.handed_over.load(Ordering::SeqCst) && waited.elapsed() < most {
                        glommio::timer::sleep(Duration::from_millis(10)).await;
                    }
                }
                // Stop accepting, let requests in flight finish (they may need other shards, which
                // keep serving jobs), then close the logs once every shard has drained.
                for server in servers {
                    server.cancel().await;
                }
                let started = std::time::Instant::now();
                while shard.requests_in_flight() > 0 && started.elapsed() < SHUTDOWN_DRAIN_MAX {
                    glommio::timer::sleep(Duration::from_millis(10)).await;
                }
                if shard.requests_in_flight() > 0 {
                    tracing::warn!(shard = id, requests = shard.requests_in_flight(), "shutting down with requests still in flight");
                }
                shared.drained.fetch_add(1, Ordering::SeqCst);
                while shared.drained.load(Ordering::SeqCst) < shared.shards && started.elapsed() < 2 * SHUTDOWN_DRAIN_MAX {
                    glommio::timer::sleep(Duration::from_millis(10)).await;
                }
                shard.close_all().await;
                if let Some(node) = crate::cluster::node_of(&shard) {
                    node.close().await;
                }
                tracing::info!(shard = id, "shard stopped cleanly");
                Ok::<_, anyhow::Error>(())
            }
        })
        .map_err(|e| anyhow::anyhow!("starting shards: {e}"))?;
    for result in handles.join_all() {
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(e) => return Err(anyhow::anyhow!("a shard panicked: {e:?}")),
        }
    }
    Ok(())
}
