//! The raft-rs driver and the metadata node: one per process, on shard 0.
//!
//! `MetadataNode` wraps raft-rs's `RawNode` over `MetadataLog`, an in-memory copy of the
//! metadata log that the caller persists, and ties it to the metadata image and the controller.
//! It is sans-IO: the caller feeds it raft messages (`step`), time (`tick`) and controller
//! requests (`submit`), then repeatedly takes a `Ready` and, in this order,
//!
//! 1. persists `snapshot` (replacing the stored log), `entries` (appending, dropping any stored
//!    entries at or after the first one's index) and `hard_state`, durably (fdatasync), and
//!    `compacted` (a snapshot this node took; entries up to its index may then be dropped);
//! 2. sends `persisted_messages` (votes and acknowledgements must never precede the data they
//!    vouch for; `messages` may go out at once, before or during persistence);
//! 3. calls `advance`.
//!
//! Until `advance`, calls to `step`, `tick` and `submit` are queued and run after it, as
//! raft-rs requires. `Ready::committed` lists the batches applied to the image, and
//! `Ready::replies` the controller responses whose records have committed.
//!
//! Voters are the controllers (`controller.quorum.voters`); brokers that are not controllers
//! are raft-rs learners (Kafka's observers): they replicate and apply the log but never vote.
//! A broker becomes a learner when it registers: the active controller proposes a raft
//! configuration change adding it (one at a time, as raft-rs allows) for every registered
//! broker the configuration lacks, and every node takes a snapshot right after applying one,
//! so that the snapshot a leader sends a new learner names it (raft-rs refuses a snapshot whose
//! configuration lacks the node). A learner is never removed: a broker keeps its id.
//! Only the raft leader's controller is active, and only once its first batch (a LeaderChange
//! record) has committed, so it has applied everything committed before it; every other node
//! answers NOT_CONTROLLER.
//!
//! Offsets: a batch's metadata offset is its raft index. raft-rs's own empty entries (a new
//! leader's first entry) are applied as no-ops so the image's offset is always the raft
//! applied index, and a snapshot at that index rebuilds an equal image.

use std::collections::{BTreeMap, VecDeque};

use raft::eraftpb::{
    ConfChange, ConfChangeType, ConfState, EntryType, MessageType, SnapshotMetadata,
};
use raft::{GetEntriesContext, RaftState, RawNode, SnapshotStatus, Storage, StorageError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub use raft::eraftpb::{Entry, HardState, Message, Snapshot};
pub use raft::StateRole;

use crate::controller::{Controller, ControllerConfig, ControllerRequest, ControllerResponse};
use crate::error_code::NOT_CONTROLLER;
use crate::image::MetadataImage;
use crate::records::{decode_batch, encode_batch, BrokerId, LeaderChangeRecord, Offset, Record};

/// Kafka's `controller.quorum.election.timeout.ms` is 1000; with 100 ms ticks that is 10.
pub const TICK_MS_DEFAULT: u64 = 100;
pub const ELECTION_TICK_DEFAULT: usize = 10;
/// Leaders heartbeat every 200 ms (Kafka's fetch from followers is continuous; raft-rs's
/// heartbeats carry the commit index to idle followers).
pub const HEARTBEAT_TICK_DEFAULT: usize = 2;
/// Take a snapshot and compact the log once this many entries are past the last snapshot.
pub const SNAPSHOT_INTERVAL_ENTRIES_DEFAULT: u64 = 10_000;
/// Most entries raft-rs sends in one append message, and most unacknowledged appends per peer.
const MAX_INFLIGHT_MSGS: usize = 256;
const MAX_SIZE_PER_MSG: u64 = 1 << 20;
/// Most requests queued while a Ready is outstanding; beyond it `submit` answers at once with
/// NOT_CONTROLLER so the client retries instead of the queue growing without bound.
pub const INBOX_REQUESTS_MAX: usize = 4_096;
/// A clock jump longer than this many ticks is not replayed tick by tick.
const TICKS_PER_CALL_MAX: u64 = 100;

/// Caller's identifier for a submitted request, echoed with its response.
pub type RequestId = u64;

/// The raft id of node 0. raft-rs reserves id 0 for "no node", and Kafka's node ids start at 0
/// (`node.id` is 0..=2^31-1), so node 0 takes the one raft id above every node id. Every other
/// node's raft id is its node id, which keeps logs, snapshots and hard states written before
/// node 0 was possible valid as they are.
const NODE_ZERO_RAFT_ID: u64 = 1 << 31;

/// A node's raft id: the one place node ids become raft ids. Raft messages, the raft log's
/// configuration entries and hard state carry raft ids; everything else speaks node ids.
pub fn raft_id(node_id: u64) -> u64 {
    assert!(
        node_id < NODE_ZERO_RAFT_ID,
        "node id {node_id} out of range"
    );
    if node_id == 0 {
        NODE_ZERO_RAFT_ID
    } else {
        node_id
    }
}

/// The node id of a raft id; the inverse of [`raft_id`].
pub fn node_id_of(raft_id: u64) -> u64 {
    assert_ne!(raft_id, raft::INVALID_ID, "raft id 0 names no node");
    if raft_id == NODE_ZERO_RAFT_ID {
        0
    } else {
        raft_id
    }
}

#[derive(Clone, Debug)]
pub struct QuorumConfig {
    /// This node's `node.id`.
    pub node_id: u64,
    /// `controller.quorum.voters`.
    pub voters: Vec<u64>,
    /// Brokers that replicate the log without voting.
    pub observers: Vec<u64>,
    pub tick_ms: u64,
    pub election_tick: usize,
    pub heartbeat_tick: usize,
    pub snapshot_interval_entries: u64,
    /// Seeds the tick jitter that staggers elections (raft-rs's own randomization is turned
    /// off so that a seeded run is deterministic).
    pub seed: u64,
    pub controller: ControllerConfig,
    /// Records the first controller of a new cluster writes with its LeaderChange, before
    /// anything else (Kafka's bootstrap metadata: `storage format --add-scram`).
    pub bootstrap: Vec<Record>,
}

impl QuorumConfig {
    pub fn new(node_id: u64, voters: Vec<u64>, observers: Vec<u64>, cluster_id: &str) -> Self {
        QuorumConfig {
            node_id,
            voters,
            observers,
            tick_ms: TICK_MS_DEFAULT,
            election_tick: ELECTION_TICK_DEFAULT,
            heartbeat_tick: HEARTBEAT_TICK_DEFAULT,
            snapshot_interval_entries: SNAPSHOT_INTERVAL_ENTRIES_DEFAULT,
            seed: node_id,
            controller: ControllerConfig::new(BrokerId(node_id as i32), cluster_id),
            bootstrap: Vec::new(),
        }
    }
}

/// What the caller keeps durably and hands back on restart.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PersistedState {
    pub hard_state: HardState,
    pub snapshot: Option<Snapshot>,
    /// Entries after the snapshot, contiguous.
    pub entries: Vec<Entry>,
}

impl PersistedState {
    /// Applies one Ready's persistence part, as a disk would: snapshot, then entries, then the
    /// hard state, then the compaction snapshot. The simulator uses this; the broker does the
    /// same against its metadata log files.
    pub fn persist(&mut self, ready: &Ready) {
        if let Some(s) = &ready.snapshot {
            self.snapshot = Some(s.clone());
            self.entries.clear();
        }
        if let Some(first) = ready.entries.first() {
            self.entries.retain(|e| e.index < first.index);
            if let Some(last) = self.entries.last() {
                assert_eq!(
                    last.index + 1,
                    first.index,
                    "persisted log would have a gap"
                );
            }
            self.entries.extend(ready.entries.iter().cloned());
        }
        if let Some(hs) = &ready.hard_state {
            self.hard_state = hs.clone();
        }
        if let Some(s) = &ready.compacted {
            let index = s.get_metadata().index;
            let newer = self
                .snapshot
                .as_ref()
                .is_none_or(|old| old.get_metadata().index < index);
            if newer {
                self.snapshot = Some(s.clone());
                self.entries.retain(|e| e.index > index);
            }
        }
    }
}

/// The in-memory metadata log raft-rs reads: the last snapshot's metadata, the entries after
/// it, and the hard and configuration state.
pub struct MetadataLog {
    hard_state: HardState,
    conf_state: ConfState,
    snapshot: Snapshot,
    /// entries[i].index == snapshot index + 1 + i.
    entries: Vec<Entry>,
}

impl MetadataLog {
    fn snapshot_index(&self) -> u64 {
        self.snapshot.get_metadata().index
    }

    fn first_index_(&self) -> u64 {
        self.snapshot_index() + 1
    }

    fn last_index_(&self) -> u64 {
        self.entries
            .last()
            .map_or(self.snapshot_index(), |e| e.index)
    }

    fn append(&mut self, entries: &[Entry]) {
        let Some(first) = entries.first() else { return };
        assert!(
            first.index >= self.first_index_(),
            "append at {} overwrites compacted entries before {}",
            first.index,
            self.first_index_()
        );
        assert!(
            first.index <= self.last_index_() + 1,
            "append at {} leaves a gap after {}",
            first.index,
            self.last_index_()
        );
        let keep = (first.index - self.first_index_()) as usize;
        self.entries.truncate(keep);
        self.entries.extend_from_slice(entries);
    }

    fn install(&mut self, snapshot: Snapshot) {
        let meta = snapshot.get_metadata();
        self.hard_state.term = self.hard_state.term.max(meta.term);
        self.hard_state.commit = meta.index;
        self.conf_state = meta.get_conf_state().clone();
        self.entries.clear();
        self.snapshot = snapshot;
    }

    /// Replaces the snapshot with one taken at `index` (applied, so stable) and drops the
    /// entries it covers.
    fn compact(&mut self, snapshot: Snapshot) {
        let index = snapshot.get_metadata().index;
        assert!(index > self.snapshot_index() && index <= self.last_index_());
        let drop = (index - self.snapshot_index()) as usize;
        self.entries.drain(..drop);
        self.snapshot = snapshot;
    }
}

impl Storage for MetadataLog {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.hard_state.clone(),
            self.conf_state.clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.first_index_() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        assert!(
            high <= self.last_index_() + 1,
            "entries up to {high} past the log end"
        );
        let from = (low - self.first_index_()) as usize;
        let to = (high - self.first_index_()) as usize;
        let max_size = max_size.into().unwrap_or(u64::MAX);
        let mut out = Vec::new();
        let mut size = 0u64;
        for e in &self.entries[from..to] {
            size += (e.data.len() + e.context.len() + 24) as u64;
            if !out.is_empty() && size > max_size {
                break;
            }
            out.push(e.clone());
        }
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.snapshot_index() {
            return Ok(self.snapshot.get_metadata().term);
        }
        if idx < self.first_index_() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > self.last_index_() {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(self.entries[(idx - self.first_index_()) as usize].term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first_index_())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last_index_())
    }

    fn snapshot(&self, _request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        // Only the latest snapshot exists; a follower asking for a newer one catches up from
        // the entries after it.
        Ok(self.snapshot.clone())
    }
}

/// A batch applied to this node's image.
#[derive(Clone, Debug, PartialEq)]
pub struct CommittedBatch {
    pub offset: Offset,
    /// The raft term the batch was proposed in.
    pub term: u64,
    /// Empty for raft's own no-op entries.
    pub records: Vec<Record>,
}

/// One round of work for the caller; see the module docs for the order.
#[derive(Debug, Default)]
pub struct Ready {
    /// A snapshot received from the leader: replace the stored log with it.
    pub snapshot: Option<Snapshot>,
    pub entries: Vec<Entry>,
    pub hard_state: Option<HardState>,
    /// A snapshot this node took of its own image: store it; stored entries up to its index
    /// may then be dropped.
    pub compacted: Option<Snapshot>,
    /// Send at once.
    pub messages: Vec<Message>,
    /// Send only once everything above is durable.
    pub persisted_messages: Vec<Message>,
    /// Batches applied to the image in this round, in log order.
    pub committed: Vec<CommittedBatch>,
    /// Set when the image was replaced from a snapshot in this round (before `committed`).
    pub installed_snapshot: Option<Offset>,
    /// Controller responses whose records are committed (or that failed).
    pub replies: Vec<(RequestId, ControllerResponse)>,
}

impl Ready {
    /// Whether anything must be made durable before `persisted_messages` go out.
    pub fn must_persist(&self) -> bool {
        self.snapshot.is_some()
            || !self.entries.is_empty()
            || self.hard_state.is_some()
            || self.compacted.is_some()
    }
}

/// One voter or observer as the leader sees it (DescribeQuorum).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaState {
    pub replica_id: u64,
    /// The offset after the last entry known to be on that replica; -1 when unknown.
    pub log_end_offset: i64,
    /// When the leader last heard from that replica (an append or heartbeat response), on the
    /// node's clock (`QuorumStatus::now_ms`); the leader itself is heard now. `None` when unknown.
    pub last_fetch_ms: Option<u64>,
    /// When that replica last had every entry the leader had (Kafka's last caught-up time).
    pub last_caught_up_ms: Option<u64>,
}

/// What DescribeQuorum reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuorumStatus {
    /// -1 when no leader is known.
    pub leader_id: i64,
    /// The raft term (Kafka's leader epoch of the quorum).
    pub leader_epoch: u64,
    /// The offset after the last committed entry.
    pub high_watermark: i64,
    pub voters: Vec<ReplicaState>,
    pub observers: Vec<ReplicaState>,
    /// The node's clock when this was taken, to turn the replicas' times into wall time.
    pub now_ms: u64,
}

/// What the leader last heard from one replica, on the node's clock.
#[derive(Clone, Copy, Debug, Default)]
struct Heard {
    fetch_ms: u64,
    caught_up_ms: Option<u64>,
}

/// Requests waiting for their records to commit.
struct Pending {
    index: u64,
    term: u64,
    request_id: Option<RequestId>,
    response: Option<ControllerResponse>,
}

enum Input {
    Step(Message),
    Submit(RequestId, ControllerRequest),
}

pub struct MetadataNode {
    config: QuorumConfig,
    raw: RawNode<MetadataLog>,
    image: MetadataImage,
    controller: Controller,
    now_ms: u64,
    next_tick_ms: u64,
    rng: StdRng,
    /// The term this node proposed its LeaderChange in, and that entry's index, until the
    /// controller is active for that term.
    leader_term: Option<u64>,
    activation_index: Option<u64>,
    pending: VecDeque<Pending>,
    /// Responses with no records, released once everything proposed before them commits.
    waiting: Vec<(u64, RequestId, ControllerResponse)>,
    in_flight: Option<raft::Ready>,
    inbox: VecDeque<Input>,
    out: Ready,
    snapshots_sent: Vec<u64>,
    /// A configuration change was applied since the last snapshot: take one at once.
    conf_changed: bool,
    /// While leading: what each other replica last answered, by raft id (DescribeQuorum).
    heard: BTreeMap<u64, Heard>,
}

#[derive(Debug, thiserror::Error)]
pub enum QuorumError {
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    #[error("stored snapshot does not decode: {0}")]
    Snapshot(String),
}

impl MetadataNode {
    /// Starts a node from what it persisted (`PersistedState::default()` the first time).
    pub fn new(config: QuorumConfig, persisted: PersistedState) -> Result<Self, QuorumError> {
        let mut conf_state = ConfState {
            voters: config.voters.iter().map(|&id| raft_id(id)).collect(),
            learners: config.observers.iter().map(|&id| raft_id(id)).collect(),
            ..Default::default()
        };
        let mut log = MetadataLog {
            hard_state: persisted.hard_state.clone(),
            conf_state: conf_state.clone(),
            snapshot: Snapshot::default(),
            entries: vec![],
        };
        let mut image = MetadataImage::default();
        if let Some(snapshot) = persisted.snapshot {
            image = image_from_snapshot(&snapshot)?;
            conf_state = snapshot.get_metadata().get_conf_state().clone();
            log.conf_state = conf_state;
            log.snapshot = snapshot;
        }
        let entries: Vec<Entry> = persisted
            .entries
            .into_iter()
            .filter(|e| e.index > log.snapshot_index())
            .collect();
        if let Some(first) = entries.first() {
            assert_eq!(
                first.index,
                log.snapshot_index() + 1,
                "persisted log has a gap"
            );
        }
        log.entries = entries;
        let snapshot_index = log.snapshot_index();
        log.hard_state.commit = log
            .hard_state
            .commit
            .max(snapshot_index)
            .min(log.last_index_());
        let raft_config = raft::Config {
            id: raft_id(config.node_id),
            election_tick: config.election_tick,
            heartbeat_tick: config.heartbeat_tick,
            // One fixed timeout: the driver's seeded tick jitter staggers elections instead
            // of raft-rs's thread-local random generator, so runs replay exactly.
            min_election_tick: config.election_tick,
            max_election_tick: config.election_tick + 1,
            applied: snapshot_index,
            max_size_per_msg: MAX_SIZE_PER_MSG,
            max_inflight_msgs: MAX_INFLIGHT_MSGS,
            check_quorum: true,
            pre_vote: true,
            ..Default::default()
        };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let mut raw = RawNode::new(&raft_config, log, &logger)?;
        // A quorum of one (the single-node default) has nobody to wait for: it elects itself
        // now rather than after an election timeout.
        if config.voters == [config.node_id]
            && raw
                .raft
                .prs()
                .conf()
                .voters()
                .contains(raft_id(config.node_id))
        {
            raw.campaign()?;
        }
        let rng = StdRng::seed_from_u64(config.seed);
        let controller = Controller::new(config.controller.clone());
        Ok(MetadataNode {
            config,
            raw,
            image,
            controller,
            now_ms: 0,
            next_tick_ms: 0,
            rng,
            leader_term: None,
            activation_index: None,
            pending: VecDeque::new(),
            waiting: Vec::new(),
            in_flight: None,
            inbox: VecDeque::new(),
            out: Ready::default(),
            snapshots_sent: Vec::new(),
            conf_changed: false,
            heard: BTreeMap::new(),
        })
    }

    pub fn node_id(&self) -> u64 {
        self.config.node_id
    }

    /// The committed image (as of `image().offset()`).
    pub fn image(&self) -> &MetadataImage {
        &self.image
    }

    pub fn is_active_controller(&self) -> bool {
        self.controller.is_active()
    }

    pub fn role(&self) -> StateRole {
        self.raw.raft.state
    }

    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    /// The node id of the raft leader this node knows of, if any.
    pub fn leader_id(&self) -> Option<u64> {
        let id = self.raw.raft.leader_id;
        (id != raft::INVALID_ID).then(|| node_id_of(id))
    }

    pub fn commit_index(&self) -> u64 {
        self.raw.raft.raft_log.committed
    }

    /// Advances time. Raft ticks every `tick_ms`, each interval jittered by ±50% from the
    /// seeded generator; the active controller fences brokers whose sessions expired.
    pub fn tick(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
        if self.in_flight.is_some() {
            return;
        }
        if self.next_tick_ms + TICKS_PER_CALL_MAX * self.config.tick_ms < self.now_ms {
            self.next_tick_ms = self.now_ms;
        }
        while self.next_tick_ms <= self.now_ms {
            self.raw.tick();
            let half = self.config.tick_ms / 2;
            self.next_tick_ms += self.config.tick_ms - half + self.rng.gen_range(0..=2 * half);
        }
        self.check_leadership();
        if self.controller.is_active() {
            let next = self.next_offset();
            let records = self.controller.tick(self.now_ms, next);
            if !records.is_empty() {
                self.propose(records, None, None);
            }
            self.add_learners();
        }
    }

    /// Proposes adding the first registered broker that is neither a voter nor a learner as a
    /// learner, unless a configuration change is still pending.
    fn add_learners(&mut self) {
        if self.raw.raft.has_pending_conf() {
            return;
        }
        let conf = self.raw.raft.prs().conf().to_conf_state();
        let missing = self
            .image
            .brokers()
            .map(|b| raft_id(b.id.0 as u64))
            .find(|id| !conf.voters.contains(id) && !conf.learners.contains(id));
        let Some(id) = missing else { return };
        let change = ConfChange {
            change_type: ConfChangeType::AddLearnerNode as i32,
            node_id: id,
            ..Default::default()
        };
        // Dropped only when leadership is moving; the next leader proposes it again.
        let _ = self.raw.propose_conf_change(vec![], change);
    }

    /// The voters and learners of the applied configuration, as raft ids.
    pub fn conf_state(&self) -> ConfState {
        self.raw.raft.prs().conf().to_conf_state()
    }

    /// Hands a raft message from a peer to this node.
    pub fn step(&mut self, message: Message) {
        if self.in_flight.is_some() {
            self.inbox.push_back(Input::Step(message));
            return;
        }
        let answer = matches!(
            message.get_msg_type(),
            MessageType::MsgAppendResponse | MessageType::MsgHeartbeatResponse
        ) && !message.reject;
        let from = message.from;
        // Messages from unknown peers or stale terms are raft's to ignore; an error here only
        // means the message was dropped.
        let _ = self.raw.step(message);
        self.check_leadership();
        if answer && self.raw.raft.state == StateRole::Leader {
            self.heard_from(from);
        }
    }

    /// Submits a controller request; its response comes in a later `Ready::replies`.
    pub fn submit(&mut self, request_id: RequestId, request: ControllerRequest) {
        if self.in_flight.is_some() {
            if self.inbox.len() >= INBOX_REQUESTS_MAX {
                self.out
                    .replies
                    .push((request_id, request.error_response(NOT_CONTROLLER)));
            } else {
                self.inbox.push_back(Input::Submit(request_id, request));
            }
            return;
        }
        self.check_leadership();
        if !self.controller.is_active() {
            self.out
                .replies
                .push((request_id, request.error_response(NOT_CONTROLLER)));
            return;
        }
        let next = self.next_offset();
        let result = self.controller.handle(self.now_ms, next, &request);
        if result.records.is_empty() {
            match self.pending.back() {
                None => self.out.replies.push((request_id, result.response)),
                Some(last) => self.waiting.push((last.index, request_id, result.response)),
            }
        } else {
            self.propose(result.records, Some(request_id), Some(result.response));
        }
    }

    /// The next round of work, if any. `advance` must follow before the next call.
    pub fn ready(&mut self) -> Option<Ready> {
        assert!(
            self.in_flight.is_none(),
            "ready() called twice without advance()"
        );
        if !self.raw.has_ready() {
            if self.out.replies.is_empty()
                && self.out.messages.is_empty()
                && self.out.committed.is_empty()
                && self.out.compacted.is_none()
            {
                return None;
            }
            return Some(std::mem::take(&mut self.out));
        }
        let mut rd = self.raw.ready();
        if !rd.snapshot().is_empty() {
            let snapshot = rd.snapshot().clone();
            match image_from_snapshot(&snapshot) {
                Ok(image) => self.image = image,
                // A leader's snapshot that does not decode is corruption on its side.
                Err(e) => panic!("snapshot from the leader does not decode: {e}"),
            }
            self.raw.mut_store().install(snapshot.clone());
            self.fail_pending();
            self.out.installed_snapshot = Some(Offset(snapshot.get_metadata().index as i64));
            self.out.snapshot = Some(snapshot);
        }
        let committed = rd.take_committed_entries();
        self.apply_committed(committed);
        if !rd.entries().is_empty() {
            self.raw.mut_store().append(rd.entries());
            self.out.entries = rd.take_entries();
        }
        if let Some(hs) = rd.hs() {
            self.raw.mut_store().hard_state = hs.clone();
            self.out.hard_state = Some(hs.clone());
        }
        let mut messages = rd.take_messages();
        let persisted = rd.take_persisted_messages();
        for m in messages.iter().chain(&persisted) {
            if m.get_msg_type() == MessageType::MsgSnapshot {
                self.snapshots_sent.push(m.to);
            }
        }
        self.out.messages.append(&mut messages);
        self.out.persisted_messages = persisted;
        self.in_flight = Some(rd);
        Some(std::mem::take(&mut self.out))
    }

    /// Tells the node the last `Ready` was persisted and its messages sent.
    pub fn advance(&mut self) {
        let Some(rd) = self.in_flight.take() else {
            return;
        };
        let mut light = self.raw.advance(rd);
        if let Some(commit) = light.commit_index() {
            self.raw.mut_store().hard_state.commit = commit;
        }
        self.out.messages.extend(light.take_messages());
        let committed = light.take_committed_entries();
        self.apply_committed(committed);
        self.raw.advance_apply();
        // A snapshot is reported delivered as soon as it is sent: if it was lost, the
        // follower's next rejection makes the leader send another.
        for to in std::mem::take(&mut self.snapshots_sent) {
            self.raw.report_snapshot(to, SnapshotStatus::Finish);
        }
        self.maybe_compact();
        self.check_leadership();
        while self.in_flight.is_none() {
            match self.inbox.pop_front() {
                Some(Input::Step(m)) => self.step(m),
                Some(Input::Submit(id, r)) => self.submit(id, r),
                None => break,
            }
        }
        let now = self.now_ms;
        self.tick(now);
    }

    /// The leader heard an answer from `raft_id`: its fetch time is now, and so is its
    /// caught-up time when it has every entry the leader has.
    fn heard_from(&mut self, raft_id: u64) {
        let raft = &self.raw.raft;
        let Some(progress) = raft.prs().get(raft_id) else {
            return;
        };
        let caught_up = progress.matched >= raft.raft_log.last_index();
        let now = self.now_ms;
        let heard = self.heard.entry(raft_id).or_default();
        heard.fetch_ms = now;
        if caught_up {
            heard.caught_up_ms = Some(now);
        }
    }

    /// DescribeQuorum. Log end offsets of other replicas are known on the leader only.
    pub fn quorum_status(&self) -> QuorumStatus {
        let raft = &self.raw.raft;
        let is_leader = raft.state == StateRole::Leader;
        let own_leo = raft.raft_log.last_index() as i64 + 1;
        let replica = |raft_id: u64| {
            let id = node_id_of(raft_id);
            let (log_end_offset, last_fetch_ms, last_caught_up_ms) = if id == self.config.node_id {
                let now = is_leader.then_some(self.now_ms);
                (own_leo, now, now)
            } else if is_leader {
                let heard = self.heard.get(&raft_id);
                (
                    raft.prs().get(raft_id).map_or(-1, |p| p.matched as i64 + 1),
                    heard.map(|h| h.fetch_ms),
                    heard.and_then(|h| h.caught_up_ms),
                )
            } else {
                (-1, None, None)
            };
            ReplicaState {
                replica_id: id,
                log_end_offset,
                last_fetch_ms,
                last_caught_up_ms,
            }
        };
        let conf = raft.prs().conf().to_conf_state();
        QuorumStatus {
            leader_id: self.leader_id().map_or(-1, |id| id as i64),
            leader_epoch: raft.term,
            high_watermark: raft.raft_log.committed as i64 + 1,
            voters: conf.voters.iter().map(|&id| replica(id)).collect(),
            observers: conf.learners.iter().map(|&id| replica(id)).collect(),
            now_ms: self.now_ms,
        }
    }

    fn next_offset(&self) -> Offset {
        Offset(self.raw.raft.raft_log.last_index() as i64 + 1)
    }

    fn propose(
        &mut self,
        records: Vec<Record>,
        request_id: Option<RequestId>,
        response: Option<ControllerResponse>,
    ) {
        let expected = self.raw.raft.raft_log.last_index() + 1;
        let term = self.raw.raft.term;
        match self.raw.propose(vec![], encode_batch(&records)) {
            Ok(()) => {
                let index = self.raw.raft.raft_log.last_index();
                assert_eq!(index, expected, "proposal landed at an unexpected index");
                self.pending.push_back(Pending {
                    index,
                    term,
                    request_id,
                    response,
                });
            }
            Err(_) => {
                // Dropped (leadership is moving): the controller's speculative state included
                // these records, so it must start over.
                if let Some(id) = request_id {
                    let response = response.expect("a request's proposal has a response");
                    self.out.replies.push((id, error_like(&response)));
                }
                self.step_down();
            }
        }
    }

    /// Notices leadership changes: a new leader proposes its LeaderChange; a node that is no
    /// longer leader of the term it activated in deactivates its controller.
    fn check_leadership(&mut self) {
        let raft = &self.raw.raft;
        let leading = raft.state == StateRole::Leader;
        let term = raft.term;
        if self.leader_term.is_some() && (!leading || self.leader_term != Some(term)) {
            self.step_down();
        }
        if leading && self.leader_term.is_none() {
            let mut records = vec![Record::LeaderChange(LeaderChangeRecord {
                leader_id: BrokerId(self.config.node_id as i32),
                leader_epoch: term as i32,
            })];
            if self.log_is_new() {
                records.extend(self.config.bootstrap.iter().cloned());
            }
            if self.raw.propose(vec![], encode_batch(&records)).is_ok() {
                self.leader_term = Some(term);
                self.activation_index = Some(self.raw.raft.raft_log.last_index());
            }
        }
    }

    /// Whether this (leading) node's log holds no metadata yet: nothing compacted, and no entry
    /// with records. A leader's log holds everything committed, so only the first controller of
    /// a new cluster sees it new.
    fn log_is_new(&self) -> bool {
        let log = &self.raw.raft.raft_log;
        if log.first_index() != 1 || log.last_index() > 64 {
            return false;
        }
        match log.entries(1, None, GetEntriesContext::empty(false)) {
            Ok(entries) => entries
                .iter()
                .all(|e| e.get_entry_type() != EntryType::EntryNormal || e.data.is_empty()),
            Err(_) => false,
        }
    }

    fn step_down(&mut self) {
        self.heard.clear();
        self.leader_term = None;
        self.activation_index = None;
        self.controller.deactivate();
        self.fail_pending();
    }

    fn fail_pending(&mut self) {
        for p in self.pending.drain(..) {
            if let (Some(id), Some(response)) = (p.request_id, p.response) {
                self.out.replies.push((id, error_like(&response)));
            }
        }
        for (_, id, response) in self.waiting.drain(..) {
            self.out.replies.push((id, error_like(&response)));
        }
    }

    fn apply_committed(&mut self, entries: Vec<Entry>) {
        for entry in entries {
            let offset = Offset(entry.index as i64);
            let records = match entry.get_entry_type() {
                EntryType::EntryNormal if entry.data.is_empty() => vec![],
                EntryType::EntryNormal => match decode_batch(&entry.data) {
                    Ok(records) => records,
                    Err(e) => panic!("committed batch at {offset:?} does not decode: {e}"),
                },
                EntryType::EntryConfChange => {
                    self.apply_conf_change(offset, &entry.data);
                    vec![]
                }
                // Only single changes (version 1) are ever proposed.
                EntryType::EntryConfChangeV2 => {
                    panic!("unexpected joint configuration change at {offset:?}")
                }
            };
            if records.is_empty() {
                self.image
                    .apply(offset, &Record::NoOp)
                    .expect("a no-op always applies");
            }
            for record in &records {
                if let Err(e) = self.image.apply(offset, record) {
                    panic!("committed record at {offset:?} does not apply: {e}: {record:?}");
                }
            }
            self.out.committed.push(CommittedBatch {
                offset,
                term: entry.term,
                records,
            });
            while self.pending.front().is_some_and(|p| p.index <= entry.index) {
                let p = self.pending.pop_front().expect("checked");
                let ours = p.index == entry.index && p.term == entry.term;
                if let (Some(id), Some(response)) = (p.request_id, p.response) {
                    let response = if ours {
                        response
                    } else {
                        error_like(&response)
                    };
                    self.out.replies.push((id, response));
                }
                if !ours {
                    self.step_down();
                }
            }
            let mut i = 0;
            while i < self.waiting.len() {
                if self.waiting[i].0 <= entry.index {
                    let (_, id, response) = self.waiting.swap_remove(i);
                    self.out.replies.push((id, response));
                } else {
                    i += 1;
                }
            }
            if self.activation_index == Some(entry.index) {
                if Some(entry.term) == self.leader_term {
                    self.controller.activate(&self.image, self.now_ms);
                } else {
                    self.step_down();
                }
            }
        }
    }

    /// Applies a committed configuration change (adding a learner). One that raft-rs refuses
    /// is refused on every node alike, so it is skipped, with a line.
    fn apply_conf_change(&mut self, offset: Offset, data: &[u8]) {
        use prost::Message as _;
        let change = match ConfChange::decode(data) {
            Ok(c) => c,
            Err(e) => panic!("committed configuration change at {offset:?} does not decode: {e}"),
        };
        match self.raw.apply_conf_change(&change) {
            Ok(conf_state) => {
                self.raw.mut_store().conf_state = conf_state;
                self.conf_changed = true;
            }
            Err(e) => {
                tracing::warn!(?offset, node = change.node_id, error = %e, "configuration change refused")
            }
        }
    }

    fn maybe_compact(&mut self) {
        let applied = self.raw.raft.raft_log.applied;
        let store = self.raw.store();
        let due = applied >= store.snapshot_index() + self.config.snapshot_interval_entries;
        let forced = self.conf_changed && applied > store.snapshot_index();
        if !due && !forced {
            return;
        }
        self.conf_changed = false;
        assert_eq!(
            self.image.offset(),
            Offset(applied as i64),
            "image offset must be the applied index"
        );
        let term = store.term(applied).expect("applied entry is in the log");
        let snapshot = Snapshot {
            data: encode_batch(&self.image.snapshot_records()),
            metadata: Some(SnapshotMetadata {
                conf_state: Some(store.conf_state.clone()),
                index: applied,
                term,
            }),
        };
        self.raw.mut_store().compact(snapshot.clone());
        self.out.compacted = Some(snapshot);
    }
}

fn image_from_snapshot(snapshot: &Snapshot) -> Result<MetadataImage, QuorumError> {
    let offset = Offset(snapshot.get_metadata().index as i64);
    if snapshot.data.is_empty() {
        return Ok(MetadataImage::default());
    }
    let records = decode_batch(&snapshot.data).map_err(|e| QuorumError::Snapshot(e.to_string()))?;
    MetadataImage::from_snapshot(offset, &records).map_err(|e| QuorumError::Snapshot(e.to_string()))
}

/// The NOT_CONTROLLER form of a response, for requests whose records did not commit.
fn error_like(response: &ControllerResponse) -> ControllerResponse {
    use ControllerResponse as R;
    let mut r = response.clone();
    match &mut r {
        R::CreateTopics(v) => v.iter_mut().for_each(|t| {
            t.error_code = NOT_CONTROLLER;
            t.topic_id = None;
        }),
        R::DeleteTopics(v) => v.iter_mut().for_each(|t| t.error_code = NOT_CONTROLLER),
        R::CreatePartitions(v) => v.iter_mut().for_each(|t| t.error_code = NOT_CONTROLLER),
        R::IncrementalAlterConfigs(v) => v.iter_mut().for_each(|t| t.error_code = NOT_CONTROLLER),
        R::BrokerRegistration(b) => {
            b.error_code = NOT_CONTROLLER;
            b.broker_epoch = -1;
        }
        R::BrokerHeartbeat(b) => b.error_code = NOT_CONTROLLER,
        R::AllocateProducerIds(a) => {
            a.error_code = NOT_CONTROLLER;
            a.producer_id_start = -1;
        }
        R::Migrate(m) => {
            m.error_code = NOT_CONTROLLER;
            m.imported = 0;
        }
        R::AlterPartition(a) => {
            a.error_code = NOT_CONTROLLER;
            a.partitions.clear();
        }
        R::LostReplicas(a) => {
            a.error_code = NOT_CONTROLLER;
            a.partitions.clear();
        }
        R::ElectLeaders(e) => {
            e.error_code = NOT_CONTROLLER;
            e.results.iter_mut().for_each(|p| {
                p.error_code = NOT_CONTROLLER;
                p.error_message = None;
            });
        }
        R::AlterPartitionReassignments(a) => {
            a.error_code = NOT_CONTROLLER;
            a.results.iter_mut().for_each(|p| {
                p.error_code = NOT_CONTROLLER;
                p.error_message = None;
            });
        }
        R::ListPartitionReassignments(l) => {
            l.error_code = NOT_CONTROLLER;
            l.reassignments.clear();
        }
        R::UpdateFeatures(e) => *e = NOT_CONTROLLER,
        R::AlterUserScramCredentials(results) => results.iter_mut().for_each(|u| {
            u.error_code = NOT_CONTROLLER;
            u.error_message = None;
        }),
        R::CreateAcls(results) => results.iter_mut().for_each(|c| {
            c.error_code = NOT_CONTROLLER;
            c.error_message = None;
        }),
        R::DeleteAcls(results) => results.iter_mut().for_each(|f| {
            f.error_code = NOT_CONTROLLER;
            f.error_message = None;
            f.matching.clear();
        }),
        R::AlterClientQuotas(results) => results.iter_mut().for_each(|e| {
            e.error_code = NOT_CONTROLLER;
            e.error_message = None;
        }),
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::{BrokerRegistrationRequest, CreatableTopic, CreateTopicsRequest};
    use crate::error_code::NONE;
    use crate::records::Endpoint;

    /// One voter, driven to completion after every input, persisting to `disk`.
    struct Single {
        node: MetadataNode,
        disk: PersistedState,
        now_ms: u64,
        replies: Vec<(RequestId, ControllerResponse)>,
    }

    impl Single {
        fn new(config: QuorumConfig, disk: PersistedState) -> Single {
            let node = MetadataNode::new(config, disk.clone()).unwrap();
            Single {
                node,
                disk,
                now_ms: 0,
                replies: vec![],
            }
        }

        fn drain(&mut self) {
            while let Some(ready) = self.node.ready() {
                assert!(ready.messages.is_empty() && ready.persisted_messages.is_empty());
                self.disk.persist(&ready);
                self.replies.extend(ready.replies);
                self.node.advance();
            }
        }

        fn run_for(&mut self, ms: u64) {
            let end = self.now_ms + ms;
            while self.now_ms < end {
                self.now_ms += 10;
                self.node.tick(self.now_ms);
                self.drain();
            }
        }

        fn request(&mut self, id: RequestId, request: ControllerRequest) -> ControllerResponse {
            self.node.submit(id, request);
            self.drain();
            self.run_for(50);
            let at = self
                .replies
                .iter()
                .position(|(r, _)| *r == id)
                .expect("a reply");
            self.replies.remove(at).1
        }
    }

    fn config(snapshot_interval_entries: u64) -> QuorumConfig {
        let mut c = QuorumConfig::new(1, vec![1], vec![], "cluster");
        c.snapshot_interval_entries = snapshot_interval_entries;
        c
    }

    fn register() -> ControllerRequest {
        ControllerRequest::BrokerRegistration(BrokerRegistrationRequest {
            broker_id: BrokerId(1),
            cluster_id: "cluster".into(),
            incarnation_id: uuid::Uuid::from_u128(1),
            listeners: vec![Endpoint {
                name: "PLAINTEXT".into(),
                host: "localhost".into(),
                port: 9092,
                security_protocol: 0,
            }],
            rack: None,
            previous_broker_epoch: -1,
        })
    }

    fn create(name: &str) -> ControllerRequest {
        ControllerRequest::CreateTopics(CreateTopicsRequest {
            topics: vec![CreatableTopic {
                name: name.into(),
                num_partitions: 2,
                replication_factor: 1,
                assignments: vec![],
                configs: vec![],
            }],
            validate_only: false,
        })
    }

    #[test]
    fn a_single_voter_elects_itself_activates_and_answers() {
        let mut s = Single::new(config(1_000), PersistedState::default());
        assert_eq!(
            s.request(1, register()),
            register().error_response(NOT_CONTROLLER)
        );
        s.run_for(3_000);
        assert!(s.node.is_active_controller());
        let ControllerResponse::BrokerRegistration(r) = s.request(2, register()) else {
            panic!()
        };
        assert_eq!(r.error_code, NONE);
        // The epoch is the offset of the batch that registered it.
        assert!(s.node.image().broker(BrokerId(1)).is_some());
        assert_eq!(
            r.broker_epoch,
            s.node.image().broker(BrokerId(1)).unwrap().epoch.0
        );
        let status = s.node.quorum_status();
        assert_eq!(status.leader_id, 1);
        assert_eq!(status.voters.len(), 1);
        assert_eq!(status.voters[0].log_end_offset, status.high_watermark);
        // The leader hears itself now.
        assert_eq!(status.voters[0].last_fetch_ms, Some(status.now_ms));
        assert_eq!(status.voters[0].last_caught_up_ms, Some(status.now_ms));
    }

    #[test]
    fn node_zero_is_a_voter_under_its_own_raft_id() {
        assert_eq!(raft_id(0), NODE_ZERO_RAFT_ID);
        assert_eq!(node_id_of(raft_id(0)), 0);
        for id in [1, 2, 3, 1000, i32::MAX as u64] {
            assert_eq!(raft_id(id), id, "other ids keep their raft id");
            assert_eq!(node_id_of(raft_id(id)), id);
        }
        let mut s = Single::new(
            QuorumConfig::new(0, vec![0], vec![], "cluster"),
            PersistedState::default(),
        );
        s.run_for(3_000);
        assert!(s.node.is_active_controller());
        assert_eq!(s.node.leader_id(), Some(0));
        let mut registration = register();
        let ControllerRequest::BrokerRegistration(r) = &mut registration else {
            unreachable!()
        };
        r.broker_id = BrokerId(0);
        let ControllerResponse::BrokerRegistration(r) = s.request(1, registration) else {
            panic!()
        };
        assert_eq!(r.error_code, NONE);
        assert!(s.node.image().broker(BrokerId(0)).is_some());
        let status = s.node.quorum_status();
        assert_eq!(status.leader_id, 0);
        assert_eq!(status.voters.len(), 1);
        assert_eq!(status.voters[0].replica_id, 0);
        assert_eq!(status.voters[0].log_end_offset, status.high_watermark);
    }

    #[test]
    fn a_restart_rebuilds_the_same_image_from_snapshot_and_log() {
        let mut s = Single::new(config(3), PersistedState::default());
        s.run_for(3_000);
        let ControllerResponse::BrokerRegistration(r) = s.request(1, register()) else {
            panic!()
        };
        assert_eq!(r.error_code, NONE);
        // Unfence by heartbeat so topics can be placed.
        let hb = ControllerRequest::BrokerHeartbeat(crate::controller::BrokerHeartbeatRequest {
            broker_id: BrokerId(1),
            broker_epoch: crate::records::BrokerEpoch(r.broker_epoch),
            current_metadata_offset: s.node.image().offset(),
            wants_fence: false,
            wants_shut_down: false,
        });
        s.request(2, hb);
        for (i, name) in ["a", "b", "c", "d", "e"].iter().enumerate() {
            let ControllerResponse::CreateTopics(v) = s.request(10 + i as u64, create(name)) else {
                panic!()
            };
            assert_eq!(v[0].error_code, NONE, "{v:?}");
        }
        assert!(
            s.disk.snapshot.is_some(),
            "the log was compacted into a snapshot"
        );
        let image = s.node.image().clone();
        assert_eq!(image.topics().count(), 5);
        let mut restarted = Single::new(config(3), s.disk.clone());
        restarted.now_ms = s.now_ms;
        restarted.run_for(3_000);
        assert_eq!(restarted.node.image().topics().count(), 5);
        // The new term's LeaderChange batch advanced the offset; everything else is equal.
        let rebuilt = MetadataImage::from_snapshot(
            image.offset(),
            &restarted.node.image().snapshot_records(),
        )
        .unwrap();
        assert_eq!(rebuilt, image);
    }

    #[test]
    fn bootstrap_records_are_written_once_by_the_first_controller() {
        let credential = |iterations| {
            Record::UserScramCredential(crate::records::UserScramCredentialRecord {
                name: "alice".into(),
                mechanism: 1,
                salt: b"salt".to_vec(),
                stored_key: vec![1; 32],
                server_key: vec![2; 32],
                iterations,
            })
        };
        let mut c = config(1_000);
        c.bootstrap = vec![credential(4096)];
        let mut s = Single::new(c, PersistedState::default());
        s.run_for(3_000);
        assert!(s.node.is_active_controller());
        let stored = |s: &Single| {
            s.node
                .image()
                .scram_credential("alice", 1)
                .map(|c| c.iterations)
        };
        assert_eq!(stored(&s), Some(4096));
        // A restart (a new term, a new LeaderChange) does not write them again, even when the
        // bootstrap it is given differs.
        let mut c = config(1_000);
        c.bootstrap = vec![credential(8192)];
        let mut restarted = Single::new(c, s.disk.clone());
        restarted.now_ms = s.now_ms;
        restarted.run_for(3_000);
        assert!(restarted.node.is_active_controller());
        assert!(restarted.node.image().offset() > s.node.image().offset());
        assert_eq!(stored(&restarted), Some(4096));
    }

    #[test]
    fn persisted_state_follows_truncation_and_compaction() {
        let entry = |index, term| Entry {
            index,
            term,
            ..Default::default()
        };
        let mut disk = PersistedState::default();
        disk.persist(&Ready {
            entries: vec![entry(1, 1), entry(2, 1), entry(3, 1)],
            ..Default::default()
        });
        // A new leader overwrites from index 2.
        disk.persist(&Ready {
            entries: vec![entry(2, 2)],
            ..Default::default()
        });
        assert_eq!(
            disk.entries
                .iter()
                .map(|e| (e.index, e.term))
                .collect::<Vec<_>>(),
            [(1, 1), (2, 2)]
        );
        let snapshot = Snapshot {
            data: vec![],
            metadata: Some(SnapshotMetadata {
                conf_state: None,
                index: 1,
                term: 1,
            }),
        };
        disk.persist(&Ready {
            compacted: Some(snapshot),
            ..Default::default()
        });
        assert_eq!(disk.entries.len(), 1);
        assert_eq!(disk.snapshot.as_ref().unwrap().get_metadata().index, 1);
    }
}

/// raft-rs's protobuf encodings, for the caller's disk (entries, snapshots) and network
/// (messages), so that the broker needs neither raft-rs nor prost itself.
pub mod codec {
    use prost::Message as _;

    use super::{Entry, Message, Snapshot};

    pub fn encode_entry(entry: &Entry) -> Vec<u8> {
        entry.encode_to_vec()
    }

    pub fn decode_entry(bytes: &[u8]) -> Result<Entry, String> {
        Entry::decode(bytes).map_err(|e| e.to_string())
    }

    pub fn encode_snapshot(snapshot: &Snapshot) -> Vec<u8> {
        snapshot.encode_to_vec()
    }

    pub fn decode_snapshot(bytes: &[u8]) -> Result<Snapshot, String> {
        Snapshot::decode(bytes).map_err(|e| e.to_string())
    }

    pub fn encode_message(message: &Message) -> Vec<u8> {
        message.encode_to_vec()
    }

    pub fn decode_message(bytes: &[u8]) -> Result<Message, String> {
        Message::decode(bytes).map_err(|e| e.to_string())
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn entries_snapshots_and_messages_round_trip() {
            let entry = Entry {
                index: 7,
                term: 3,
                data: b"records".to_vec(),
                ..Default::default()
            };
            assert_eq!(decode_entry(&encode_entry(&entry)).unwrap(), entry);
            let mut snapshot = Snapshot::default();
            snapshot.mut_metadata().index = 40;
            snapshot.mut_metadata().term = 2;
            snapshot.mut_metadata().mut_conf_state().voters = vec![1, 2, 3];
            snapshot.data = b"image".to_vec();
            assert_eq!(
                decode_snapshot(&encode_snapshot(&snapshot)).unwrap(),
                snapshot
            );
            let message = Message {
                from: 1,
                to: 2,
                term: 3,
                entries: vec![entry],
                ..Default::default()
            };
            assert_eq!(decode_message(&encode_message(&message)).unwrap(), message);
            assert!(decode_message(&[0xff, 0xff, 0xff]).is_err());
        }
    }
}
