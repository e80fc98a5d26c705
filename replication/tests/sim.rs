//! Deterministic simulation of the controller quorum (DESIGN.md, testing layer 3).
//!
//! N controller nodes (voters) and two broker nodes (raft observers, added as learners when they register) run in one process on a
//! simulated clock and network: messages are delayed, reordered, dropped and cut by
//! partitions; nodes crash (losing whatever they had not persisted, including a Ready caught
//! half-way) and restart from their simulated disk. Each broker registers, heartbeats, asks for
//! producer ids and now and then shuts down in a controlled way; an admin client creates,
//! grows, reconfigures and deletes topics. Everything is drawn from one seeded `StdRng`, so a
//! seed replays exactly.
//!
//! Checked during and after every run: one leader per term; every node applies the same batch
//! at each offset, contiguously; every image keeps its invariants (a fenced broker leads
//! nothing); once healed, every node catches up and all images are equal; nothing acknowledged
//! is lost (acknowledged topics and registrations are in the committed log, producer-id blocks
//! are never handed out twice); broker epochs only grow.
//!
//! `SIM_SEED=n` replays one seed; `SIM_SEEDS=n` runs n seeds per cluster size (default below).

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_replication::controller::*;
use sluice_replication::error_code;
use sluice_replication::image::MetadataImage;
use sluice_replication::quorum::{
    CommittedBatch, Message, MetadataNode, PersistedState, QuorumConfig, Ready, RequestId,
    StateRole,
};
use sluice_replication::records::*;

#[path = "sim/data.rs"]
mod data;
use data::{DataMsg, DataPlane, ALTER_BASE, DATA_PARTITIONS, DATA_TOPIC, PRODUCER_BASE};

const STEP_MS: u64 = 5;
const FAULT_PHASE_MS: u64 = 60_000;
/// After the faults stop, how long the cluster has to converge before the run fails.
const HEAL_PHASE_MS_MAX: u64 = 30_000;
const SESSION_TIMEOUT_MS: u64 = 2_000;
const HEARTBEAT_INTERVAL_MS: u64 = 300;
const REQUEST_TIMEOUT_MS: u64 = 1_500;
const SNAPSHOT_INTERVAL_ENTRIES: u64 = 25;
const BROKERS: [u64; 3] = [101, 102, 103];
const CLUSTER_ID: &str = "sim-cluster";
/// Seeds per cluster size when `SIM_SEEDS` is not set.
const SEEDS_DEFAULT: u64 = 100;

enum Payload {
    Raft(Message),
    Request {
        client: u64,
        id: RequestId,
        request: ControllerRequest,
    },
    Response {
        id: RequestId,
        response: ControllerResponse,
    },
    /// Between brokers and the data plane's clients (data.rs).
    Data(DataMsg),
}

struct InFlight {
    deliver_at: u64,
    seq: u64,
    from: u64,
    to: u64,
    payload: Payload,
}

struct Node {
    config: QuorumConfig,
    node: Option<MetadataNode>,
    disk: PersistedState,
    /// The last offset this incarnation applied (contiguity check).
    applied: Offset,
    restart_at: u64,
    /// How far this node's clock runs ahead of true time; it only ever jumps forward.
    clock_skew_ms: u64,
}

/// A client's request waiting for its response.
struct Outstanding {
    sent_at: u64,
    request: ControllerRequest,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum BrokerState {
    Unregistered,
    Registered(BrokerEpoch),
    /// Asked for controlled shutdown; stops (and restarts later) once told to.
    ShuttingDown(BrokerEpoch),
}

struct Broker {
    id: u64,
    state: BrokerState,
    incarnation: uuid::Uuid,
    previous_epoch: i64,
    next_heartbeat_ms: u64,
    next_producer_ids_ms: u64,
    outstanding: BTreeMap<RequestId, Outstanding>,
}

struct Admin {
    outstanding: BTreeMap<RequestId, Outstanding>,
    next_request_ms: u64,
}

/// What the run's clients were told succeeded.
#[derive(Default)]
struct Acked {
    topics: BTreeSet<TopicId>,
    registrations: Vec<(BrokerId, BrokerEpoch)>,
    producer_id_blocks: Vec<i64>,
    /// Partitions whose reassignment (or cancellation) the controller accepted.
    reassignments: u64,
    requests: u64,
    sent: u64,
    not_controller: u64,
}

struct Sim {
    rng: StdRng,
    now: u64,
    nodes: BTreeMap<u64, Node>,
    voters: Vec<u64>,
    net: Vec<InFlight>,
    seq: u64,
    drop_per_mille: u32,
    /// Nodes cut off from the rest while a partition lasts.
    isolated: BTreeSet<u64>,
    partition_until: u64,
    brokers: Vec<Broker>,
    admin: Admin,
    next_request_id: RequestId,
    /// Where each client last found the active controller.
    controller_hint: BTreeMap<u64, u64>,
    // --- checks ---
    leaders: BTreeMap<u64, u64>,
    log: BTreeMap<i64, (u64, Vec<Record>)>,
    acked: Acked,
    faults: bool,
    crashes: u32,
    clock_jumps: u32,
    snapshots_installed: u32,
    data: DataPlane,
}

const ADMIN: u64 = 1_000;

impl Sim {
    fn new(seed: u64, voter_count: u64) -> Sim {
        let mut rng = StdRng::seed_from_u64(seed);
        let voters: Vec<u64> = (1..=voter_count).collect();
        let mut nodes = BTreeMap::new();
        for &id in voters.iter().chain(BROKERS.iter()) {
            // Brokers join as learners when they register (a configuration change), as real ones do.
            let mut config = QuorumConfig::new(id, voters.clone(), vec![], CLUSTER_ID);
            config.snapshot_interval_entries = SNAPSHOT_INTERVAL_ENTRIES;
            config.seed = rng.gen();
            config.controller.seed = rng.gen();
            config.controller.broker_session_timeout_ms = SESSION_TIMEOUT_MS;
            config.controller.default_replication_factor = 2;
            let node = MetadataNode::new(config.clone(), PersistedState::default()).unwrap();
            nodes.insert(
                id,
                Node {
                    config,
                    node: Some(node),
                    disk: PersistedState::default(),
                    applied: Offset(0),
                    restart_at: 0,
                    clock_skew_ms: 0,
                },
            );
        }
        let data = DataPlane::new(&mut rng);
        let brokers = BROKERS
            .iter()
            .map(|&id| Broker {
                id,
                state: BrokerState::Unregistered,
                incarnation: uuid::Uuid::from_u128(rng.gen()),
                previous_epoch: -1,
                next_heartbeat_ms: 0,
                next_producer_ids_ms: 2_000,
                outstanding: BTreeMap::new(),
            })
            .collect();
        Sim {
            rng,
            now: 0,
            nodes,
            voters,
            net: Vec::new(),
            seq: 0,
            drop_per_mille: 20,
            isolated: BTreeSet::new(),
            partition_until: 0,
            brokers,
            admin: Admin {
                outstanding: BTreeMap::new(),
                next_request_ms: 500,
            },
            next_request_id: 1,
            controller_hint: BTreeMap::new(),
            leaders: BTreeMap::new(),
            log: BTreeMap::new(),
            acked: Acked::default(),
            faults: true,
            crashes: 0,
            clock_jumps: 0,
            snapshots_installed: 0,
            data,
        }
    }

    fn send(&mut self, from: u64, to: u64, payload: Payload) {
        if self.faults && self.rng.gen_range(0..1000) < self.drop_per_mille {
            return;
        }
        let mut delay = self.rng.gen_range(1..=20);
        if self.faults && self.rng.gen_range(0..100) == 0 {
            delay += 300; // a straggler, overtaken by later messages
        }
        self.seq += 1;
        self.net.push(InFlight {
            deliver_at: self.now + delay,
            seq: self.seq,
            from,
            to,
            payload,
        });
    }

    fn cut(&self, a: u64, b: u64) -> bool {
        // The admin and the data plane's clients reach every node; a broker's AlterPartition
        // channel is cut with the broker.
        let host = |id: u64| {
            if id >= ALTER_BASE {
                id - ALTER_BASE
            } else {
                id
            }
        };
        let client = |id: u64| id == ADMIN || (PRODUCER_BASE..ALTER_BASE).contains(&id);
        let (a, b) = (host(a), host(b));
        !client(a) && !client(b) && self.isolated.contains(&a) != self.isolated.contains(&b)
    }

    fn run(&mut self) {
        while self.now < FAULT_PHASE_MS {
            self.step();
            self.inject_faults();
        }
        // Heal: no more faults, every node back, then wait for convergence.
        self.faults = false;
        self.share_set_target();
        self.isolated.clear();
        self.data.disarm();
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for id in ids {
            if self.nodes[&id].node.is_none() {
                self.restart(id);
            }
        }
        let deadline = self.now + HEAL_PHASE_MS_MAX;
        loop {
            self.step();
            if self.converged() {
                break;
            }
            assert!(
                self.now < deadline,
                "cluster did not converge {HEAL_PHASE_MS_MAX} ms after healing: {}; data plane: {}",
                self.describe(),
                self.describe_data()
            );
        }
        self.final_checks();
    }

    fn describe(&self) -> String {
        self.nodes
            .iter()
            .map(|(id, n)| match &n.node {
                Some(m) => format!(
                    "node {id}: {:?} term {} leader {:?} commit {} image {:?} active {}",
                    m.role(),
                    m.term(),
                    m.leader_id(),
                    m.commit_index(),
                    m.image().offset(),
                    m.is_active_controller()
                ),
                None => format!("node {id}: down"),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn step(&mut self) {
        self.now += STEP_MS;
        // Deliver what is due, in delivery order.
        let now = self.now;
        let mut due: Vec<InFlight> = Vec::new();
        let mut i = 0;
        while i < self.net.len() {
            if self.net[i].deliver_at <= now {
                due.push(self.net.swap_remove(i));
            } else {
                i += 1;
            }
        }
        due.sort_by_key(|m| (m.deliver_at, m.seq));
        for m in due {
            if self.cut(m.from, m.to) {
                continue;
            }
            self.deliver(m);
        }
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for &id in &ids {
            // Crashed nodes (and brokers that shut down) come back when their time is up.
            if self.nodes[&id].node.is_none() && now >= self.nodes[&id].restart_at {
                self.restart(id);
            }
            let n = self.nodes.get_mut(&id).unwrap();
            let local_now = now + n.clock_skew_ms;
            if let Some(node) = n.node.as_mut() {
                node.tick(local_now);
            }
        }
        self.run_brokers();
        self.run_data();
        self.run_admin();
        for &id in &ids {
            self.drain(id);
        }
        self.check_leaders();
    }

    fn deliver(&mut self, m: InFlight) {
        match m.payload {
            Payload::Raft(msg) => {
                if let Some(node) = self.nodes.get_mut(&m.to).and_then(|n| n.node.as_mut()) {
                    node.step(msg);
                }
            }
            Payload::Request {
                client,
                id,
                request,
            } => {
                if let Some(node) = self.nodes.get_mut(&m.to).and_then(|n| n.node.as_mut()) {
                    // The client id is folded into the request id so replies find their way.
                    node.submit(client << 32 | id, request);
                }
            }
            Payload::Response { id, response } => self.on_response(m.to, m.from, id, response),
            Payload::Data(msg) => self.on_data(m.from, m.to, msg),
        }
    }

    /// Processes a node's Readies until it has none, persisting each to its disk first.
    fn drain(&mut self, id: u64) {
        loop {
            let Some(node) = self.nodes.get_mut(&id).unwrap().node.as_mut() else {
                return;
            };
            let Some(ready) = node.ready() else { return };
            // Messages that need no persistence may leave before a crash.
            for m in ready.messages.iter().cloned() {
                self.send(id, m.to, Payload::Raft(m));
            }
            if self.faults && ready.must_persist() && self.rng.gen_range(0..300) == 0 {
                // Power lost before the write reached the disk: nothing of it survives, and
                // none of the acknowledgements it would have allowed go out.
                self.check_ready(id, &ready);
                self.crash(id);
                return;
            }
            self.check_ready(id, &ready);
            let n = self.nodes.get_mut(&id).unwrap();
            n.disk.persist(&ready);
            for m in ready.persisted_messages {
                self.send(id, m.to, Payload::Raft(m));
            }
            for (rid, response) in ready.replies {
                let client = rid >> 32;
                self.send(
                    id,
                    client,
                    Payload::Response {
                        id: rid & 0xffff_ffff,
                        response,
                    },
                );
            }
            self.nodes
                .get_mut(&id)
                .unwrap()
                .node
                .as_mut()
                .unwrap()
                .advance();
        }
    }

    /// Checks what a node applied in one Ready against the global committed log.
    fn check_ready(&mut self, id: u64, ready: &Ready) {
        let n = self.nodes.get_mut(&id).unwrap();
        if let Some(offset) = ready.installed_snapshot {
            assert!(
                offset >= n.applied,
                "node {id} installed a snapshot at {offset:?} behind its applied {:?}",
                n.applied
            );
            n.applied = offset;
            self.snapshots_installed += 1;
        }
        for CommittedBatch {
            offset,
            term,
            records,
        } in &ready.committed
        {
            let n = self.nodes.get_mut(&id).unwrap();
            assert_eq!(
                offset.0,
                n.applied.0 + 1,
                "node {id} applied {offset:?} after {:?}",
                n.applied
            );
            n.applied = *offset;
            match self.log.get(&offset.0) {
                Some((t, r)) => {
                    assert_eq!(
                        (t, r),
                        (term, records),
                        "node {id} committed a different batch at {offset:?}"
                    );
                }
                None => {
                    self.log.insert(offset.0, (*term, records.clone()));
                }
            }
        }
        let image = self.nodes[&id].node.as_ref().unwrap().image();
        if let Err(e) = image.check_invariants() {
            panic!("node {id} image at {:?}: {e}", image.offset());
        }
    }

    fn check_leaders(&mut self) {
        for (&id, n) in &self.nodes {
            if let Some(node) = &n.node {
                if node.role() == StateRole::Leader {
                    let leader = *self.leaders.entry(node.term()).or_insert(id);
                    assert_eq!(leader, id, "two leaders in term {}", node.term());
                    assert!(self.voters.contains(&id), "observer {id} became leader");
                }
            }
        }
    }

    fn crash(&mut self, id: u64) {
        let n = self.nodes.get_mut(&id).unwrap();
        n.node = None;
        n.restart_at = self.now + self.rng.gen_range(200..4_000);
        self.crashes += 1;
        if let Some(b) = self.brokers.iter_mut().find(|b| b.id == id) {
            // The broker process dies with its node; the next one is a new incarnation.
            b.state = BrokerState::Unregistered;
            b.outstanding.clear();
            // Its disk keeps what was synced, and now and then some torn sectors of the rest.
            let mode = if self.rng.gen_range(0..4) == 0 {
                sluice_engine::CrashMode::TornSectors {
                    seed: self.rng.gen(),
                }
            } else {
                sluice_engine::CrashMode::DropUnsynced
            };
            self.data.crash(id, mode);
        }
    }

    fn restart(&mut self, id: u64) {
        let n = self.nodes.get_mut(&id).unwrap();
        let mut node = MetadataNode::new(n.config.clone(), n.disk.clone()).unwrap();
        node.tick(self.now + n.clock_skew_ms);
        n.applied = node.image().offset();
        n.node = Some(node);
        let incarnation = uuid::Uuid::from_u128(self.rng.gen());
        if let Some(b) = self.brokers.iter_mut().find(|b| b.id == id) {
            b.incarnation = incarnation;
            b.state = BrokerState::Unregistered;
            b.next_heartbeat_ms = self.now;
        }
    }

    fn inject_faults(&mut self) {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        if self.rng.gen_range(0..20_000) == 0 {
            // Every node loses power at once.
            for &id in &ids {
                if self.nodes[&id].node.is_some() {
                    self.crash(id);
                }
            }
        }
        for &b in BROKERS.iter() {
            if self.nodes[&b].node.is_some() && self.rng.gen_range(0..6_000) == 0 {
                // A write or an fdatasync soon fails: the broker stops on it.
                let n = self.rng.gen_range(0..40);
                self.data.fail_storage_after(b, n);
            }
            if self.rng.gen_range(0..3_000) == 0 {
                // The disk turns slow for a while.
                let until = self.now + self.rng.gen_range(500..3_000);
                self.data.brokers.get_mut(&b).unwrap().slow_disk_until = until;
            }
        }
        for id in ids {
            if self.nodes[&id].node.is_some() && self.rng.gen_range(0..4_000) == 0 {
                self.crash(id);
            }
            if self.rng.gen_range(0..8_000) == 0 {
                // The clock jumps ahead (a VM pause, an NTP step).
                let jump = self.rng.gen_range(100..5_000);
                self.nodes.get_mut(&id).unwrap().clock_skew_ms += jump;
                self.clock_jumps += 1;
            }
        }
        if !self.isolated.is_empty() && self.now >= self.partition_until {
            self.isolated.clear();
        } else if self.isolated.is_empty() && self.rng.gen_range(0..1_500) == 0 {
            let all: Vec<u64> = self.nodes.keys().copied().collect();
            let count = self.rng.gen_range(1..=all.len() / 2);
            while self.isolated.len() < count {
                self.isolated.insert(all[self.rng.gen_range(0..all.len())]);
            }
            self.partition_until = self.now + self.rng.gen_range(500..4_000);
        }
    }

    fn controller_for(&mut self, client: u64) -> u64 {
        // A broker follows the log, so it knows the leader, as a Kafka broker does.
        let host = if client >= ALTER_BASE {
            client - ALTER_BASE
        } else {
            client
        };
        let known = self
            .nodes
            .get(&host)
            .and_then(|n| n.node.as_ref())
            .and_then(|n| n.leader_id());
        if let Some(leader) = known {
            return leader;
        }
        if let Some(&hint) = self.controller_hint.get(&client) {
            return hint;
        }
        let v = self.voters[self.rng.gen_range(0..self.voters.len())];
        self.controller_hint.insert(client, v);
        v
    }

    fn request(&mut self, client: u64, request: ControllerRequest) -> RequestId {
        let id = self.next_request_id;
        self.next_request_id += 1;
        self.acked.sent += 1;
        let to = self.controller_for(client);
        self.send(
            client,
            to,
            Payload::Request {
                client,
                id,
                request: request.clone(),
            },
        );
        let outstanding = Outstanding {
            sent_at: self.now,
            request,
        };
        if client == ADMIN {
            self.admin.outstanding.insert(id, outstanding);
        } else if client >= ALTER_BASE {
            // The data plane tracks its broker's AlterPartition itself.
        } else {
            let b = self.brokers.iter_mut().find(|b| b.id == client).unwrap();
            b.outstanding.insert(id, outstanding);
        }
        id
    }

    fn run_brokers(&mut self) {
        for i in 0..self.brokers.len() {
            let id = self.brokers[i].id;
            if self.nodes[&id].node.is_none() {
                continue;
            }
            let now = self.now;
            self.brokers[i]
                .outstanding
                .retain(|_, o| now < o.sent_at + REQUEST_TIMEOUT_MS);
            if !self.brokers[i].outstanding.is_empty() || now < self.brokers[i].next_heartbeat_ms {
                continue;
            }
            self.brokers[i].next_heartbeat_ms = now + HEARTBEAT_INTERVAL_MS;
            let offset = self.nodes[&id].node.as_ref().unwrap().image().offset();
            let b = &self.brokers[i];
            let request = match b.state {
                BrokerState::Unregistered => {
                    ControllerRequest::BrokerRegistration(BrokerRegistrationRequest {
                        broker_id: BrokerId(id as i32),
                        cluster_id: CLUSTER_ID.into(),
                        incarnation_id: b.incarnation,
                        listeners: vec![Endpoint {
                            name: "PLAINTEXT".into(),
                            host: "127.0.0.1".into(),
                            port: 9000 + id as u16,
                            security_protocol: 0,
                        }],
                        rack: Some(format!("rack-{}", id % 2)),
                        previous_broker_epoch: b.previous_epoch,
                    })
                }
                BrokerState::Registered(epoch) if now >= b.next_producer_ids_ms => {
                    self.brokers[i].next_producer_ids_ms = now + 2_000;
                    ControllerRequest::AllocateProducerIds(AllocateProducerIdsRequest {
                        broker_id: BrokerId(id as i32),
                        broker_epoch: epoch,
                    })
                }
                BrokerState::Registered(epoch) | BrokerState::ShuttingDown(epoch) => {
                    let shutting = matches!(b.state, BrokerState::ShuttingDown(_));
                    let wants_shut_down =
                        shutting || (self.faults && self.rng.gen_range(0..150) == 0);
                    if wants_shut_down {
                        self.brokers[i].state = BrokerState::ShuttingDown(epoch);
                    }
                    ControllerRequest::BrokerHeartbeat(BrokerHeartbeatRequest {
                        broker_id: BrokerId(id as i32),
                        broker_epoch: epoch,
                        current_metadata_offset: offset,
                        wants_fence: false,
                        wants_shut_down,
                    })
                }
            };
            self.request(id, request);
        }
    }

    fn run_admin(&mut self) {
        let now = self.now;
        self.admin
            .outstanding
            .retain(|_, o| now < o.sent_at + REQUEST_TIMEOUT_MS);
        if !self.faults || now < self.admin.next_request_ms || self.admin.outstanding.len() >= 4 {
            return;
        }
        self.admin.next_request_ms = now + self.rng.gen_range(10..100);
        let name = format!("topic-{}", self.rng.gen_range(0..8));
        if !self.data.topic_known() {
            // The data plane's topic first (data.rs); it is never deleted.
            let request = ControllerRequest::CreateTopics(CreateTopicsRequest {
                topics: vec![CreatableTopic {
                    name: DATA_TOPIC.into(),
                    num_partitions: DATA_PARTITIONS,
                    replication_factor: 3,
                    assignments: vec![],
                    configs: vec![("min.insync.replicas".into(), Some("2".into()))],
                }],
                validate_only: false,
            });
            self.request(ADMIN, request);
            return;
        }
        let request = match self.rng.gen_range(0..12) {
            0..=4 => ControllerRequest::CreateTopics(CreateTopicsRequest {
                topics: vec![CreatableTopic {
                    name,
                    num_partitions: self.rng.gen_range(1..=4),
                    replication_factor: self.rng.gen_range(1..=2),
                    assignments: vec![],
                    configs: vec![("retention.ms".into(), Some("60000".into()))],
                }],
                validate_only: self.rng.gen_range(0..10) == 0,
            }),
            5 | 6 => ControllerRequest::DeleteTopics(DeleteTopicsRequest {
                topics: vec![TopicRef::Name(name)],
            }),
            // Reassignments (and cancellations) while leaders change and nodes crash: half of
            // them move the data topic's partitions, whose brokers copy and then drop replicas
            // (keeping at least `min.insync.replicas` of them); the other topics' brokers never
            // fetch, so moves there that add a replica stay in progress and shrinks and
            // reorders complete at once.
            10 | 11 => {
                let data = self.rng.gen();
                let target = if self.rng.gen_range(0..4) == 0 {
                    None
                } else {
                    let mut brokers: Vec<BrokerId> =
                        BROKERS.iter().map(|&b| BrokerId(b as i32)).collect();
                    for i in (1..brokers.len()).rev() {
                        brokers.swap(i, self.rng.gen_range(0..=i));
                    }
                    let min = if data { 2 } else { 1 };
                    brokers.truncate(self.rng.gen_range(min..=BROKERS.len()));
                    Some(brokers)
                };
                let (name, partition) = if data {
                    (
                        DATA_TOPIC.to_string(),
                        self.rng.gen_range(0..DATA_PARTITIONS),
                    )
                } else {
                    (name, self.rng.gen_range(0..2))
                };
                ControllerRequest::AlterPartitionReassignments(AlterPartitionReassignmentsRequest {
                    topics: vec![(name, vec![(partition, target)])],
                    allow_replication_factor_change: true,
                })
            }
            7 => ControllerRequest::CreatePartitions(CreatePartitionsRequest {
                topics: vec![CreatePartitionsTopic {
                    name,
                    count: self.rng.gen_range(1..=6),
                    assignments: None,
                }],
                validate_only: false,
            }),
            _ => ControllerRequest::IncrementalAlterConfigs(IncrementalAlterConfigsRequest {
                resources: vec![AlterConfigsResource {
                    resource_type: if self.rng.gen() { 2 } else { 4 },
                    resource_name: if self.rng.gen() { name } else { String::new() },
                    configs: vec![AlterableConfig {
                        name: "retention.ms".into(),
                        op: if self.rng.gen() {
                            AlterConfigOp::Set
                        } else {
                            AlterConfigOp::Delete
                        },
                        value: Some(self.rng.gen_range(1..100_000).to_string()),
                    }],
                }],
                validate_only: false,
            }),
        };
        self.request(ADMIN, request);
    }

    fn on_response(&mut self, client: u64, from: u64, id: RequestId, response: ControllerResponse) {
        if client >= ALTER_BASE {
            self.controller_hint.insert(client, from);
            self.on_alter_response(client - ALTER_BASE, id, response);
            return;
        }
        let outstanding = if client == ADMIN {
            self.admin.outstanding.remove(&id)
        } else {
            match self.brokers.iter_mut().find(|b| b.id == client) {
                Some(b) => b.outstanding.remove(&id),
                None => None,
            }
        };
        // A response after the client gave up (or from before a broker restart) is ignored.
        let Some(outstanding) = outstanding else {
            return;
        };
        let not_controller = match &response {
            ControllerResponse::CreateTopics(v) => {
                v.iter().any(|t| t.error_code == error_code::NOT_CONTROLLER)
            }
            ControllerResponse::DeleteTopics(v) => {
                v.iter().any(|t| t.error_code == error_code::NOT_CONTROLLER)
            }
            ControllerResponse::CreatePartitions(v) => {
                v.iter().any(|t| t.error_code == error_code::NOT_CONTROLLER)
            }
            ControllerResponse::IncrementalAlterConfigs(v) => {
                v.iter().any(|t| t.error_code == error_code::NOT_CONTROLLER)
            }
            ControllerResponse::BrokerRegistration(r) => r.error_code == error_code::NOT_CONTROLLER,
            ControllerResponse::BrokerHeartbeat(r) => r.error_code == error_code::NOT_CONTROLLER,
            ControllerResponse::AllocateProducerIds(r) => {
                r.error_code == error_code::NOT_CONTROLLER
            }
            ControllerResponse::Migrate(r) => r.error_code == error_code::NOT_CONTROLLER,
            ControllerResponse::AlterPartition(r) => r.error_code == error_code::NOT_CONTROLLER,
            ControllerResponse::LostReplicas(r) => r.error_code == error_code::NOT_CONTROLLER,
            ControllerResponse::ElectLeaders(r) => r.error_code == error_code::NOT_CONTROLLER,
            ControllerResponse::AlterPartitionReassignments(r) => {
                r.error_code == error_code::NOT_CONTROLLER
            }
            ControllerResponse::ListPartitionReassignments(r) => {
                r.error_code == error_code::NOT_CONTROLLER
            }
            ControllerResponse::UpdateFeatures(e) => *e == error_code::NOT_CONTROLLER,
            ControllerResponse::AlterUserScramCredentials(r) => {
                r.iter().any(|u| u.error_code == error_code::NOT_CONTROLLER)
            }
            ControllerResponse::CreateAcls(r) => {
                r.iter().any(|c| c.error_code == error_code::NOT_CONTROLLER)
            }
            ControllerResponse::DeleteAcls(r) => {
                r.iter().any(|f| f.error_code == error_code::NOT_CONTROLLER)
            }
            ControllerResponse::AlterClientQuotas(r) => {
                r.iter().any(|e| e.error_code == error_code::NOT_CONTROLLER)
            }
        };
        if not_controller {
            self.acked.not_controller += 1;
            // Try another controller next time.
            let v = self.voters[self.rng.gen_range(0..self.voters.len())];
            self.controller_hint.insert(client, v);
            return;
        }
        self.controller_hint.insert(client, from);
        self.acked.requests += 1;
        match response {
            ControllerResponse::CreateTopics(v) => {
                let validate_only = matches!(
                    &outstanding.request,
                    ControllerRequest::CreateTopics(r) if r.validate_only
                );
                for t in v {
                    if t.error_code == error_code::NONE && !validate_only {
                        self.acked
                            .topics
                            .insert(t.topic_id.expect("created topic has an id"));
                    }
                }
            }
            ControllerResponse::BrokerRegistration(r) => {
                let b = self.brokers.iter_mut().find(|b| b.id == client).unwrap();
                if r.error_code == error_code::NONE {
                    let epoch = BrokerEpoch(r.broker_epoch);
                    b.state = BrokerState::Registered(epoch);
                    b.previous_epoch = -1;
                    self.acked
                        .registrations
                        .push((BrokerId(client as i32), epoch));
                }
            }
            ControllerResponse::BrokerHeartbeat(r) => {
                let b = self.brokers.iter_mut().find(|b| b.id == client).unwrap();
                if r.error_code == error_code::STALE_BROKER_EPOCH
                    || r.error_code == error_code::BROKER_ID_NOT_REGISTERED
                {
                    b.state = BrokerState::Unregistered;
                } else if r.should_shut_down {
                    if let BrokerState::ShuttingDown(epoch) = b.state {
                        // A clean stop: the next incarnation may register at once.
                        b.previous_epoch = epoch.0;
                    }
                    let prev = b.previous_epoch;
                    self.crash(client);
                    let b = self.brokers.iter_mut().find(|b| b.id == client).unwrap();
                    b.previous_epoch = prev;
                }
            }
            ControllerResponse::AllocateProducerIds(r) => {
                if r.error_code == error_code::NONE {
                    self.acked.producer_id_blocks.push(r.producer_id_start);
                } else if r.error_code == error_code::STALE_BROKER_EPOCH {
                    let b = self.brokers.iter_mut().find(|b| b.id == client).unwrap();
                    b.state = BrokerState::Unregistered;
                }
            }
            ControllerResponse::AlterPartitionReassignments(r) => {
                self.acked.reassignments += r
                    .results
                    .iter()
                    .filter(|p| p.error_code == error_code::NONE)
                    .count() as u64;
            }
            _ => {}
        }
    }

    fn converged(&self) -> bool {
        let Some(leader) = self
            .nodes
            .values()
            .filter_map(|n| n.node.as_ref())
            .find(|n| n.is_active_controller())
        else {
            return false;
        };
        let commit = Offset(leader.commit_index() as i64);
        self.nodes.values().all(|n| {
            n.node.as_ref().is_some_and(|m| {
                m.image().offset() == commit && m.commit_index() == commit.0 as u64
            })
        }) && self.data_converged(leader.image())
            && (leader.image().topic(DATA_TOPIC).is_none() || self.share_drained())
    }

    fn final_checks(&self) {
        let images: Vec<(u64, &MetadataImage)> = self
            .nodes
            .iter()
            .map(|(id, n)| (*id, n.node.as_ref().unwrap().image()))
            .collect();
        for (id, image) in &images[1..] {
            assert!(
                *image == images[0].1,
                "node {id}'s image differs from node {}'s",
                images[0].0
            );
        }
        let image = images[0].1;
        // The active controller has heard from every voter and learner (DescribeQuorum's last
        // fetch time), never in its future; a replica that has caught up with it since it
        // leads did so at or before its last fetch. One still a few records behind at this
        // instant may not have caught up yet (Kafka reports -1 for it).
        let leader = self
            .nodes
            .values()
            .filter_map(|n| n.node.as_ref())
            .find(|n| n.is_active_controller())
            .expect("an active controller");
        let status = leader.quorum_status();
        assert_eq!(
            status.voters.len() + status.observers.len(),
            self.nodes.len(),
            "{status:?}"
        );
        for r in status.voters.iter().chain(&status.observers) {
            let fetched = r.last_fetch_ms;
            assert!(
                fetched.is_some_and(|t| t <= status.now_ms),
                "replica {} as the controller saw it: {status:?}",
                r.replica_id
            );
            assert!(
                r.last_caught_up_ms.is_none_or(|t| Some(t) <= fetched),
                "replica {} as the controller saw it: {status:?}",
                r.replica_id
            );
        }
        // Every registered broker became a learner, on every node alike.
        for (id, n) in &self.nodes {
            let conf = n.node.as_ref().unwrap().conf_state();
            let mut voters = conf.voters.clone();
            voters.sort();
            assert_eq!(voters, self.voters, "node {id}'s voters");
            for b in image.brokers() {
                assert!(
                    conf.learners.contains(&(b.id.0 as u64)),
                    "node {id} lacks registered broker {} among its learners {:?}",
                    b.id,
                    conf.learners
                );
            }
        }
        // Nothing acknowledged is lost.
        let mut created = BTreeSet::new();
        let mut registered = BTreeMap::new();
        let mut last_epoch: BTreeMap<BrokerId, BrokerEpoch> = BTreeMap::new();
        for (&offset, (_, records)) in &self.log {
            for r in records {
                match r {
                    Record::Topic(t) => {
                        created.insert(t.topic_id);
                    }
                    Record::RegisterBroker(b) => {
                        assert_eq!(
                            b.broker_epoch.0, offset,
                            "a broker's epoch is its registration offset"
                        );
                        if let Some(prev) = last_epoch.insert(b.broker_id, b.broker_epoch) {
                            assert!(
                                prev < b.broker_epoch,
                                "broker {} epoch went back",
                                b.broker_id
                            );
                        }
                        registered.insert((b.broker_id, b.broker_epoch), ());
                    }
                    _ => {}
                }
            }
        }
        for t in &self.acked.topics {
            assert!(
                created.contains(t),
                "acknowledged topic {t} is not in the committed log"
            );
        }
        for r in &self.acked.registrations {
            assert!(
                registered.contains_key(r),
                "acknowledged registration {r:?} is not committed"
            );
        }
        let mut blocks = self.acked.producer_id_blocks.clone();
        blocks.sort();
        let before = blocks.len();
        blocks.dedup();
        assert_eq!(
            blocks.len(),
            before,
            "a producer id block was handed out twice"
        );
        if let Some(last) = blocks.last() {
            assert!(*last < image.next_producer_id());
        }
        assert!(self.acked.requests > 0, "the run acknowledged nothing");
        self.data_final_checks(image);
    }
}

struct SeedGuard {
    seed: u64,
    voters: u64,
}

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "simulation failed: seed {} with {} voters; replay with SIM_SEED={} SIM_VOTERS={} cargo test -p sluice-replication --test sim",
                self.seed, self.voters, self.seed, self.voters
            );
        }
    }
}

fn run_seed(seed: u64, voters: u64) -> Sim {
    let _guard = SeedGuard { seed, voters };
    let mut sim = Sim::new(seed, voters);
    sim.run();
    sim
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().expect("a number"))
}

fn run_many(voters: u64) {
    if let Some(seed) = env_u64("SIM_SEED") {
        if env_u64("SIM_VOTERS").unwrap_or(voters) == voters {
            run_seed(seed, voters);
        }
        return;
    }
    let seeds = env_u64("SIM_SEEDS").unwrap_or(SEEDS_DEFAULT);
    let (mut crashes, mut jumps, mut snapshots, mut acked, mut batches) = (0, 0, 0, 0, 0);
    let mut reassignments = 0;
    let (mut writes, mut reads, mut leaderships, mut truncations, mut storage_failures) =
        (0, 0, 0, 0, 0);
    let (mut share_acked, mut share_deliveries, mut share_fenced) = (0, 0, 0);
    for seed in 0..seeds {
        let sim = run_seed(seed, voters);
        crashes += sim.crashes;
        jumps += sim.clock_jumps;
        snapshots += sim.snapshots_installed;
        acked += sim.acked.requests;
        batches += sim.log.len();
        reassignments += sim.acked.reassignments;
        writes += sim.data.acked.len();
        reads += sim.data.consumed.len();
        leaderships += sim.data.leaderships;
        truncations += sim.data.truncations;
        storage_failures += sim.data.storage_failures;
        share_acked += sim.data.share.acked.len();
        share_deliveries += sim.data.share.deliveries;
        share_fenced += sim.data.share.fenced;
    }
    eprintln!(
        "{seeds} seeds, {voters} voters: {crashes} crashes, {jumps} clock jumps, {snapshots} snapshots installed, {acked} requests acknowledged ({reassignments} reassignments), {batches} batches committed; data plane: {writes} acks=all writes acknowledged, {reads} offsets read by consumers, {leaderships} leaderships, {truncations} follower truncations, {storage_failures} storage failures; share group: {share_deliveries} deliveries, {share_acked} acknowledgements answered, {share_fenced} fetches at fenced leaders"
    );
    assert!(
        seeds == 0 || (share_acked > 0 && share_deliveries > share_acked as u64),
        "the share consumers acknowledged nothing, or no record was ever delivered twice"
    );
    assert!(
        seeds == 0 || (writes > 0 && reads > 0),
        "the data plane acknowledged or read nothing"
    );
    assert!(
        seeds < 10 || truncations > 0,
        "no follower ever truncated: the faults do not reach the data plane"
    );
    assert!(
        seeds == 0 || reassignments > 0,
        "no run had a reassignment accepted"
    );
    assert!(
        seeds == 0 || snapshots > 0,
        "no run exercised snapshot installation"
    );
}

#[test]
fn three_controllers_three_brokers() {
    run_many(3);
}

#[test]
fn five_controllers_three_brokers() {
    run_many(5);
}

/// Seeds that found bugs, as (seed, voters), run whatever `SIM_SEEDS` says (see
/// replication/README.md, "Tests").
/// The first two were found before the leaders' fdatasyncs ran on after an append and before
/// two producers shared a partition, so they no longer replay the histories that found their
/// bugs (unit tests in `replica::tests` keep those); they stay as seeds.
const REGRESSION_SEEDS: [(u64, u64); 12] = [
    // Acknowledged writes lost after an unanswered AlterPartition.
    (3, 3),
    // An acknowledged write lost after a late AlterPartition refusal cleared a newer change.
    (2681, 5),
    // A lone leader below min.insync.replicas moved its high watermark; the controller then
    // elected an eligible leader replica without those records: committed reads lost.
    (2, 3),
    (6, 5),
    // A former leader, its last appends not yet durable, fetched from its durable end under
    // the epoch of that tail: the new leader's check passed, its overlapping batches were
    // skipped, and the replicas diverged.
    (352, 3),
    (145, 5),
    // The same bug, found again once the simulator's followers ran the broker's own follower
    // component (`sluice_replication::follower`): with the fetch from the durable end and the
    // skip of batches below the log end put back into it, these seeds end with replicas that
    // differ byte for byte (tests/README.md).
    (187, 3),
    (613, 5),
    // Those two no longer replay once acks=all waiters ran late (`waiter_delay`); with the
    // same bug put back, these seeds find it again.
    (928, 3),
    (1200, 5),
    // A produce's acks=all wait answered by a later leadership of the same replica (its
    // records truncated away while it followed, the offsets written again by another
    // leader): `produce::acks_all_answer` with its epoch check taken out loses an
    // acknowledged write at these seeds.
    (315, 3),
    (1446, 5),
];

#[test]
fn regression_seeds() {
    for (seed, voters) in REGRESSION_SEEDS {
        let sim = run_seed(seed, voters);
        assert!(
            !sim.data.acked.is_empty(),
            "seed {seed} acknowledged no write"
        );
    }
}

#[test]
fn a_seed_replays_exactly() {
    let a = run_seed(7, 3);
    let b = run_seed(7, 3);
    assert_eq!(a.log, b.log);
    assert_eq!(a.crashes, b.crashes);
    assert_eq!(a.data.acked, b.data.acked);
    assert_eq!(a.data.consumed, b.data.consumed);
}

#[test]
#[ignore]
fn describe_one_seed() {
    let seed = env_u64("SIM_SEED").unwrap_or(1);
    let sim = run_seed(seed, env_u64("SIM_VOTERS").unwrap_or(3));
    eprintln!(
        "sent {} not controller {}\nterms {:?}\nbatches {} crashes {} snapshots {} acked requests {} topics {} registrations {:?} pid blocks {}",
        sim.acked.sent,
        sim.acked.not_controller,
        sim.leaders,
        sim.log.len(),
        sim.crashes,
        sim.snapshots_installed,
        sim.acked.requests,
        sim.acked.topics.len(),
        sim.acked.registrations,
        sim.acked.producer_id_blocks.len()
    );
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, records) in sim.log.values() {
        for r in records {
            let k = match r {
                Record::RegisterBroker(_) => "register",
                Record::FenceBroker(_) => "fence",
                Record::UnfenceBroker(_) => "unfence",
                Record::Topic(_) => "topic",
                Record::RemoveTopic(_) => "remove",
                Record::Partition(_) => "partition",
                Record::PartitionChange(_) => "change",
                Record::Config(_) => "config",
                Record::ProducerIds(_) => "pids",
                Record::LeaderChange(_) => "leader",
                _ => "other",
            };
            *kinds.entry(k).or_default() += 1;
        }
    }
    eprintln!("{kinds:?}\n{}", sim.describe());
    eprintln!(
        "data plane: {} writes acknowledged, {} offsets read, {} leaderships, {} truncations, {} storage failures, produce errors {:?}",
        sim.data.acked.len(),
        sim.data.consumed.len(),
        sim.data.leaderships,
        sim.data.truncations,
        sim.data.storage_failures,
        sim.data.produce_errors
    );
}
