//! Shards: one glommio executor per core, each owning a disjoint set of partitions.
//!
//! A shard owns its partitions' logs, its batch cache and its connections. Work for a
//! partition owned elsewhere is sent to the owner as a job over a bounded `channel_mesh` queue
//! (a full queue makes the sender wait: backpressure, never a drop); the job runs on the owner and
//! its result comes back over a oneshot channel. Jobs carry `Bytes` (reference counted), never
//! copies. Shard 0 also owns the authoritative metadata image and applies topic changes.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use futures_lite::future::BoxedLocal;
use glommio::channels::channel_mesh::{Receivers, Senders};
use sluice_engine::waits::{self, Wait};
use sluice_engine::{BatchCache, Clock, DmaStorage, Log};
use sluice_replication::controller::{AlterPartitionItem, AlterPartitionResponse};

use crate::config::BrokerConfig;
use crate::metadata::{log_config, MetadataImage, TopicMeta};

pub mod apply;
pub mod fetch_sessions;
pub mod groups;
pub mod housekeeping;
pub mod log_dirs;
pub mod markers;
pub mod partition;
mod placement;
pub mod read;
pub mod replica_move;
pub mod replication;
pub mod share;
pub mod share_state;
pub mod txn;
pub mod txn_verify;
pub mod wake;

pub use partition::Partition;

/// Wall-clock milliseconds: the timestamps of records the shard writes itself
/// (transaction state, markers, commits) are stored and compared after restarts, so the shard's monotonic clock will not do.
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Jobs queued between two shards before senders wait.
pub const MESH_QUEUE_DEPTH: usize = 1024;

pub type Job = Box<dyn FnOnce(Rc<Shard>) -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// What every shard shares read-only with the others.
pub struct Shared {
    pub config: BrokerConfig,
    pub shards: usize,
    /// Notified after every append on the shard with that index; fetches waiting for data on
    /// partitions of that shard listen here (cross-thread wake-ups are glommio's own).
    pub appended: Vec<event_listener::Event>,
    /// Shards that have opened their partitions (start-up barrier).
    pub opened: std::sync::atomic::AtomicUsize,
    /// Shards that have stopped accepting and drained their requests (graceful shutdown).
    pub drained: std::sync::atomic::AtomicUsize,
    /// Set once a cluster broker's controlled shutdown has handed its leaderships over (or
    /// given up); shards keep serving until then.
    pub handed_over: std::sync::atomic::AtomicBool,
    /// Set by shard 0 once this node has the metadata it serves from (start-up barrier).
    pub metadata_ready: std::sync::atomic::AtomicBool,
    /// This broker's epoch from its latest registration (-1 before one), which its followers
    /// fetch with (KIP-903) so a leader never adds a replica to the ISR on a fetch from an
    /// earlier incarnation.
    pub broker_epoch: std::sync::atomic::AtomicI64,
    /// Per `__consumer_offsets` partition: whether this node coordinates its groups (leads it
    /// and has loaded them). Set by the owner shard, read by any shard a group request reaches.
    pub coordinators: Vec<std::sync::atomic::AtomicBool>,
    /// Counters and gauges for the Prometheus exporter (`metrics.rs`).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Client quota measurements of this broker (`crate::quota`).
    pub quotas: crate::quota::Sensors,
    /// The log directories and where replicas go (`log_dirs.rs`).
    pub log_dirs: log_dirs::LogDirs,
    /// The replica moves' copying throttle (`replica_move.rs`).
    pub move_throttle: replica_move::MoveThrottle,
}

impl Shared {
    pub fn is_coordinator(&self, offsets_partition: i32) -> bool {
        usize::try_from(offsets_partition)
            .ok()
            .and_then(|i| self.coordinators.get(i))
            .is_some_and(|c| c.load(std::sync::atomic::Ordering::Acquire))
    }

    pub fn set_coordinator(&self, offsets_partition: i32, on: bool) {
        if let Some(c) = usize::try_from(offsets_partition)
            .ok()
            .and_then(|i| self.coordinators.get(i))
        {
            c.store(on, std::sync::atomic::Ordering::Release);
        }
    }
}

/// What the partitions and the coordinators ask of the controller, through shard 0's metadata
/// node (`cluster/node.rs`), as Kafka's brokers ask through their channel to the controller.
pub trait ControllerChannel {
    /// A leader's ISR change (AlterPartition); `None` when no controller answered.
    fn alter_partition(
        self: Rc<Self>,
        partitions: Vec<AlterPartitionItem>,
    ) -> BoxedLocal<Option<AlterPartitionResponse>>;
    /// This broker's replicas of `partitions` are lost (their log directory failed): the
    /// controller takes them out of ISRs and leaderships. `None` when no controller answered.
    fn lost_replicas(
        self: Rc<Self>,
        partitions: Vec<(sluice_replication::records::TopicId, i32)>,
    ) -> BoxedLocal<Option<sluice_replication::controller::LostReplicasResponse>>;
    /// The next idempotent producer id from this broker's block; `None` when none can be had.
    fn next_producer_id(self: Rc<Self>) -> BoxedLocal<Option<i64>>;
    fn is_active_controller(&self) -> bool;
    /// The channel as what implements it (the metadata node, for the layers above).
    fn into_any(self: Rc<Self>) -> Rc<dyn std::any::Any>;
}

pub struct RequestGuard {
    shard: Rc<Shard>,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.shard.in_flight.set(self.shard.in_flight.get() - 1);
    }
}

pub struct Shard {
    pub id: usize,
    pub shared: Arc<Shared>,
    pub image: RefCell<Arc<MetadataImage>>,
    pub partitions: RefCell<HashMap<(String, i32), Rc<Partition>>>,
    pub cache: Rc<BatchCache>,
    pub groups: crate::group::GroupCoordinator,
    pub fetch_sessions: RefCell<fetch_sessions::FetchSessions>,
    /// The share partitions this shard leads and the share sessions of its connections.
    pub share_partitions: share::SharePartitions,
    pub share_sessions: share::ShareSessions,
    /// The leaders this shard's replica fetchers copy from (one fetcher each).
    pub fetchers: RefCell<std::collections::HashSet<i32>>,
    /// Whether shard 0 looked for replicas removed while this node was down (once per run).
    pub strays_checked: std::cell::Cell<bool>,
    /// The follower replication throttle's bucket, shared by this shard's fetchers.
    pub replica_throttle: RefCell<replication::ReplicaThrottle>,
    /// The `__consumer_offsets` partitions this shard coordinates groups for, with the leader
    /// epoch whose load started (their groups may still be loading).
    pub coordinating: RefCell<HashMap<i32, i32>>,
    /// The transaction coordinators of the `__transaction_state` partitions this shard leads.
    pub txns: crate::shard::txn::TxnCoordinators,
    /// The share coordinators of the `__share_group_state` partitions this shard leads.
    pub share_coordinators: share_state::ShareCoordinators,
    /// Replicas of this shard moving to another log directory (`replica_move.rs`).
    pub moves: replica_move::Moves,
    in_flight: std::cell::Cell<usize>,
    /// The controller channel (the metadata node); on shard 0 only.
    controller: RefCell<Option<Rc<dyn ControllerChannel>>>,
    senders: Senders<Job>,
}

impl Shard {
    pub fn new(
        id: usize,
        shared: Arc<Shared>,
        image: Arc<MetadataImage>,
        senders: Senders<Job>,
    ) -> Rc<Shard> {
        let cache = BatchCache::new(shared.config.batch_cache_bytes);
        Rc::new(Shard {
            id,
            shared,
            image: RefCell::new(image),
            partitions: RefCell::new(HashMap::new()),
            cache,
            groups: Default::default(),
            fetch_sessions: Default::default(),
            share_partitions: Default::default(),
            share_sessions: Default::default(),
            fetchers: Default::default(),
            replica_throttle: Default::default(),
            strays_checked: Default::default(),
            coordinating: Default::default(),
            txns: Default::default(),
            share_coordinators: Default::default(),
            controller: RefCell::new(None),
            moves: Default::default(),
            in_flight: std::cell::Cell::new(0),
            senders,
        })
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.shared.config
    }

    pub fn image(&self) -> Arc<MetadataImage> {
        self.image.borrow().clone()
    }

    /// The cluster's finalized `transaction.version` (`crate::features`).
    pub fn transaction_version(&self) -> i16 {
        crate::features::transaction_version(&self.image.borrow(), self.config())
    }

    /// The controller channel (shard 0 only, once its metadata node has started).
    pub fn controller(&self) -> Option<Rc<dyn ControllerChannel>> {
        self.controller.borrow().clone()
    }

    /// Shard 0's metadata node starts: requests for the controller go through it.
    pub fn set_controller(&self, controller: Rc<dyn ControllerChannel>) {
        *self.controller.borrow_mut() = Some(controller);
    }

    /// The next idempotent producer id, from shard 0's block; `None` when there is none to be
    /// had (shard 0's metadata node still starting after five seconds, or no controller).
    pub async fn next_producer_id(self: &Rc<Self>) -> Option<i64> {
        let asked = std::time::Instant::now();
        let id = self
            .invoke_on(0, |s0| async move {
                for _ in 0..500 {
                    if let Some(controller) = s0.controller() {
                        return controller.next_producer_id().await;
                    }
                    glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
                }
                None
            })
            .await;
        waits::record(Wait::Controller, asked.elapsed(), || {
            "a producer id from the controller".to_string()
        });
        id
    }

    /// Runs every job other shards send here.
    pub fn serve_jobs(self: &Rc<Self>, mut receivers: Receivers<Job>) {
        for (_, stream) in receivers.streams() {
            let shard = self.clone();
            glommio::spawn_local(async move {
                while let Some(job) = stream.recv().await {
                    glommio::spawn_local(job(shard.clone())).detach();
                }
            })
            .detach();
        }
    }

    /// Runs `f` on shard `target` and returns its result.
    pub async fn invoke_on<T, F, Fut>(self: &Rc<Self>, target: usize, f: F) -> T
    where
        T: Send + 'static,
        F: FnOnce(Rc<Shard>) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
    {
        if target == self.id {
            return f(self.clone()).await;
        }
        let (tx, rx) = futures_channel::oneshot::channel();
        let (from, sent) = (self.id, std::time::Instant::now());
        let job: Job = Box::new(move |shard| {
            Box::pin(async move {
                waits::record(Wait::CrossShardQueue, sent.elapsed(), || {
                    format!(
                        "a job from shard {from} waited to start on shard {}",
                        shard.id
                    )
                });
                let _ = tx.send(f(shard).await);
            })
        });
        if self.senders.send_to(target, job).await.is_err() {
            // Only while the process shuts down: the caller's request is abandoned.
            tracing::debug!(target, "shard is gone; abandoning a job");
            return std::future::pending().await;
        }
        // The other shard completes `rx` and drops its waker on its own thread: never let that
        // be a glommio task waker (see `wake`).
        match wake::owner_woken(rx).await {
            Ok(value) => value,
            Err(_) => {
                tracing::debug!(target, "shard dropped a job while stopping");
                std::future::pending().await
            }
        }
    }

    /// Counts a request as in flight until the guard drops (graceful shutdown waits for zero).
    pub fn request_guard(self: &Rc<Self>) -> RequestGuard {
        self.in_flight.set(self.in_flight.get() + 1);
        RequestGuard {
            shard: self.clone(),
        }
    }

    pub fn requests_in_flight(&self) -> usize {
        self.in_flight.get()
    }

    /// Runs `f` on every shard, this one included, and collects the results in shard order.
    pub async fn invoke_on_all<T, F, Fut>(self: &Rc<Self>, f: F) -> Vec<T>
    where
        T: Send + 'static,
        F: Fn(Rc<Shard>) -> Fut + Send + Clone + 'static,
        Fut: Future<Output = T> + 'static,
    {
        let mut tasks = Vec::new();
        for target in 0..self.shared.shards {
            let shard = self.clone();
            let f = f.clone();
            tasks.push(glommio::spawn_local(async move {
                shard.invoke_on(target, f).await
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await);
        }
        out
    }

    pub fn partition(&self, topic: &str, partition: i32) -> Option<Rc<Partition>> {
        self.partitions
            .borrow()
            .get(&(topic.to_string(), partition))
            .cloned()
    }

    /// Opens (creating or recovering) the partitions of `topic` that this shard owns; returns
    /// the ones it opened now.
    pub async fn open_owned(
        self: &Rc<Self>,
        topic: &TopicMeta,
    ) -> anyhow::Result<Vec<Rc<Partition>>> {
        let mut opened = Vec::new();
        let mut indexes = Vec::new();
        let config = log_config(
            &self
                .image()
                .effective_topic_configs(self.config().node_id, topic),
        )
        .map_err(|e| anyhow::anyhow!("topic {}: {e}", topic.name))?;
        let wanted: Vec<usize> = topic
            .shards
            .iter()
            .enumerate()
            .filter(|&(index, &owner)| {
                owner != crate::metadata::NOT_HOSTED
                    && owner as usize % self.shared.shards == self.id
                    && !self
                        .partitions
                        .borrow()
                        .contains_key(&(topic.name.clone(), index as i32))
            })
            .map(|(index, _)| index)
            .collect();
        // Logs opened at once: each open waits on its own file creation and preallocation, so
        // a topic of a thousand partitions opened one after another takes seconds.
        const OPENING_AT_ONCE: usize = 64;
        for chunk in wanted.chunks(OPENING_AT_ONCE) {
            let opening: Vec<_> = chunk
                .iter()
                .map(|&index| {
                    let dir = self
                        .shared
                        .log_dirs
                        .locate(&format!("{}-{}", topic.name, index));
                    let (config, cache) = (config.clone(), self.cache.clone());
                    glommio::spawn_local(async move {
                        Log::open(DmaStorage::new(), dir?, config, cache, Clock::System)
                            .await
                            .map_err(anyhow::Error::from)
                    })
                })
                .collect();
            // Every open is awaited, even after one fails, so none is left running.
            let mut first_error = None;
            for (task, &index) in opening.into_iter().zip(chunk) {
                match task.await {
                    Ok(log) => {
                        let partition = Rc::new(Partition::new(log, self.shared.metrics.clone()));
                        self.partitions
                            .borrow_mut()
                            .insert((topic.name.clone(), index as i32), partition.clone());
                        opened.push(partition);
                        indexes.push(index);
                    }
                    Err(e) => {
                        first_error.get_or_insert_with(|| {
                            anyhow::anyhow!("opening {}-{}: {e}", topic.name, index)
                        });
                    }
                }
            }
            if let Some(e) = first_error {
                return Err(e);
            }
        }
        if !indexes.is_empty() {
            tracing::info!(topic = %topic.name, shard = self.id, partitions = ?indexes, "opened partitions");
        }
        Ok(opened)
    }

    /// Notifies fetches waiting on this shard's partitions.
    pub fn notify_appended(&self) {
        self.shared.appended[self.id].notify(usize::MAX);
    }

    /// Closes every partition log cleanly (graceful shutdown).
    pub async fn close_all(&self) {
        /// Logs closed at once: each close waits on its own writes and fdatasync, so closing
        /// them one after another makes a shard of thousands of partitions slow to stop.
        const CLOSING_AT_ONCE: usize = 64;
        let partitions: Vec<Rc<Partition>> = self.partitions.borrow().values().cloned().collect();
        for chunk in partitions.chunks(CLOSING_AT_ONCE) {
            let closing: Vec<_> = chunk
                .iter()
                .cloned()
                .map(|p| {
                    glommio::spawn_local(async move {
                        if let Err(e) = p.log.close().await {
                            tracing::error!(dir = %p.log.dir().display(), error = %e, "log did not close cleanly; it will be recovered on start");
                        }
                    })
                })
                .collect();
            for task in closing {
                task.await;
            }
        }
    }
}
