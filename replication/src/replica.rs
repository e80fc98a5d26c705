//! One partition's replication logic, sans IO: what its leader tracks of each follower, the
//! high watermark, when the ISR shrinks or grows (the AlterPartition to send), whether an
//! acks=all produce may be taken; and where a follower truncates to when it starts following a
//! new leader (KIP-101, KIP-279). The broker drives it from its fetch and produce paths and the
//! simulator drives the same code.
//!
//! Offsets are log end offsets as this crate sees them: for Sluice's durability under
//! `flush.mode=batch`, the leader's own is what it has fdatasync'd, and a follower's is the fetch
//! offset it sends, which it only moves past what it has fdatasync'd.

use std::collections::BTreeMap;

use crate::error_code::*;
use crate::records::{BrokerEpoch, BrokerId, LeaderEpoch, PartitionEpoch};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaConfig {
    /// `replica.lag.time.max.ms`: an ISR member that has not caught up for this long leaves.
    pub replica_lag_time_max_ms: u64,
    /// The topic's `min.insync.replicas`.
    pub min_insync_replicas: usize,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        ReplicaConfig {
            replica_lag_time_max_ms: 30_000,
            min_insync_replicas: 1,
        }
    }
}

/// What the leader knows of one follower.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FollowerProgress {
    /// Its log end offset, as its last fetch said (-1: no fetch yet in this leadership).
    pub log_end_offset: i64,
    /// The broker epoch it fetched with (KIP-903), for AlterPartition.
    pub broker_epoch: BrokerEpoch,
    /// When it was last caught up with the leader (Kafka's `lastCaughtUpTimeMs`).
    pub last_caught_up_ms: u64,
    last_fetch_ms: u64,
    /// The leader's log end at its last fetch.
    last_fetch_leader_end: i64,
}

/// An ISR change proposed to the controller and not answered yet. Until a definite answer
/// (or an image with a newer partition state) the controller may have committed it, so the
/// high watermark counts on its members too, and the change is sent again as it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingIsr {
    pub isr: Vec<BrokerId>,
    pub change: IsrChange,
}

/// The controller's definite answer to a pending AlterPartition. A lost request or answer, a
/// timeout, or a top-level error (NOT_CONTROLLER, ...) is no answer: the change stays pending
/// and is sent again ([`LeaderState::pending_change`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IsrAnswer {
    /// Committed: the partition's ISR and partition epoch now.
    Committed {
        isr: Vec<BrokerId>,
        partition_epoch: PartitionEpoch,
    },
    /// Refused for this partition, with the controller's state of it.
    Refused {
        leader_epoch: LeaderEpoch,
        isr: Vec<BrokerId>,
        partition_epoch: PartitionEpoch,
    },
}

/// The AlterPartition item the broker should send for this partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsrChange {
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
    pub new_isr: Vec<(BrokerId, BrokerEpoch)>,
}

/// A partition this broker leads.
#[derive(Clone, Debug)]
pub struct LeaderState {
    pub me: BrokerId,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
    pub replicas: Vec<BrokerId>,
    /// The committed ISR (the metadata image's).
    pub isr: Vec<BrokerId>,
    pub pending: Option<PendingIsr>,
    followers: BTreeMap<BrokerId, FollowerProgress>,
    log_end_offset: i64,
    high_watermark: i64,
    /// The leader's log end when this leadership began: a follower is caught up with this
    /// epoch only once it has reached it.
    epoch_start_offset: i64,
    /// Changes with the topic's configs (`min.insync.replicas`) and the broker's.
    pub config: ReplicaConfig,
}

/// The state a partition's leadership starts from (from the metadata image and the log).
#[derive(Clone, Debug)]
pub struct Leadership {
    pub me: BrokerId,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
    pub replicas: Vec<BrokerId>,
    pub isr: Vec<BrokerId>,
    pub log_end_offset: i64,
    pub high_watermark: i64,
}

impl LeaderState {
    /// Becomes leader at `now_ms`. The ISR's followers count as caught up now, as in Kafka,
    /// so that a new leader does not shrink the ISR before they had a chance to fetch.
    pub fn new(l: Leadership, config: ReplicaConfig, now_ms: u64) -> LeaderState {
        let followers = l
            .replicas
            .iter()
            .filter(|r| **r != l.me)
            .map(|&r| {
                (
                    r,
                    FollowerProgress {
                        log_end_offset: -1,
                        broker_epoch: BrokerEpoch(-1),
                        last_caught_up_ms: if l.isr.contains(&r) { now_ms } else { 0 },
                        last_fetch_ms: 0,
                        last_fetch_leader_end: -1,
                    },
                )
            })
            .collect();
        LeaderState {
            me: l.me,
            leader_epoch: l.leader_epoch,
            partition_epoch: l.partition_epoch,
            replicas: l.replicas,
            isr: l.isr,
            pending: None,
            followers,
            log_end_offset: l.log_end_offset,
            high_watermark: l.high_watermark.min(l.log_end_offset),
            epoch_start_offset: l.log_end_offset,
            config,
        }
    }

    pub fn high_watermark(&self) -> i64 {
        self.high_watermark
    }

    /// The replica set changed within this leadership (a reassignment adds replicas): a new
    /// replica is tracked from no fetch yet, a removed one is forgotten.
    pub fn set_replicas(&mut self, replicas: Vec<BrokerId>) {
        self.followers.retain(|b, _| replicas.contains(b));
        for &r in replicas.iter().filter(|r| **r != self.me) {
            self.followers.entry(r).or_insert(FollowerProgress {
                log_end_offset: -1,
                broker_epoch: BrokerEpoch(-1),
                last_caught_up_ms: 0,
                last_fetch_ms: 0,
                last_fetch_leader_end: -1,
            });
        }
        self.replicas = replicas;
    }

    pub fn log_end_offset(&self) -> i64 {
        self.log_end_offset
    }

    pub fn follower(&self, id: BrokerId) -> Option<&FollowerProgress> {
        self.followers.get(&id)
    }

    /// The ISR the high watermark waits for: while an expansion is pending, the new member too
    /// (Kafka's maximal ISR), so that the high watermark never counts on fewer replicas than
    /// the ISR that may commit any moment.
    pub fn maximal_isr(&self) -> Vec<BrokerId> {
        let mut isr = self.isr.clone();
        if let Some(p) = &self.pending {
            for b in &p.isr {
                if !isr.contains(b) {
                    isr.push(*b);
                }
            }
        }
        isr
    }

    /// The leader's own log end moved (appended and, under `flush.mode=batch`, synced). Returns
    /// the new high watermark if it moved.
    pub fn on_log_end(&mut self, log_end_offset: i64) -> Option<i64> {
        self.log_end_offset = self.log_end_offset.max(log_end_offset);
        self.advance_high_watermark()
    }

    /// KIP-392 with Kafka's `RackAwareReplicaSelector`: the replica a consumer in `client_rack`
    /// reading from `fetch_offset` should fetch from instead of this leader, or `None` to stay
    /// here. Candidates are the leader and the followers that are in the ISR, caught up within
    /// `replica.lag.time.max.ms` and hold `fetch_offset`; of those in the client's rack the
    /// leader wins, else the one with the most records (then the most recently caught up). A
    /// follower that falls behind or leaves the ISR stops being chosen, so the consumer's next
    /// fetch from the leader keeps it here. `rack_of` names a broker's rack.
    pub fn preferred_read_replica<'r>(
        &self,
        client_rack: &str,
        fetch_offset: i64,
        now_ms: u64,
        rack_of: impl Fn(BrokerId) -> Option<&'r str>,
    ) -> Option<BrokerId> {
        if client_rack.is_empty() || rack_of(self.me) == Some(client_rack) {
            return None;
        }
        self.followers
            .iter()
            .filter(|(id, f)| {
                self.isr.contains(id)
                    && f.log_end_offset >= fetch_offset
                    && now_ms.saturating_sub(f.last_caught_up_ms)
                        <= self.config.replica_lag_time_max_ms
                    && rack_of(**id) == Some(client_rack)
            })
            .max_by_key(|(id, f)| {
                (
                    f.log_end_offset,
                    f.last_caught_up_ms,
                    std::cmp::Reverse(**id),
                )
            })
            .map(|(id, _)| *id)
    }

    /// A follower fetched from `fetch_offset` (its log end) at `now_ms`. Returns the new high
    /// watermark if it moved, and the ISR change to ask for if it is now caught up and not in
    /// the ISR. `None`/`None` for a broker that is not a replica.
    pub fn on_fetch(
        &mut self,
        follower: BrokerId,
        broker_epoch: BrokerEpoch,
        fetch_offset: i64,
        now_ms: u64,
    ) -> (Option<i64>, Option<IsrChange>) {
        let leader_end = self.log_end_offset;
        let Some(f) = self.followers.get_mut(&follower) else {
            return (None, None);
        };
        // Kafka's rule: caught up now if it has everything; caught up as of its previous
        // fetch if it has what the leader had then.
        if fetch_offset >= leader_end {
            f.last_caught_up_ms = now_ms;
        } else if f.last_fetch_leader_end >= 0 && fetch_offset >= f.last_fetch_leader_end {
            f.last_caught_up_ms = f.last_caught_up_ms.max(f.last_fetch_ms);
        }
        f.last_fetch_ms = now_ms;
        f.last_fetch_leader_end = leader_end;
        f.log_end_offset = fetch_offset;
        f.broker_epoch = broker_epoch;
        let moved = self.advance_high_watermark();
        (moved, self.expansion())
    }

    /// The ISR change for followers that caught up (reached the high watermark and this
    /// leadership's start), if no change is pending.
    fn expansion(&mut self) -> Option<IsrChange> {
        if self.pending.is_some() {
            return None;
        }
        let joining: Vec<BrokerId> = self
            .followers
            .iter()
            .filter(|(id, f)| {
                !self.isr.contains(id)
                    && f.log_end_offset >= self.high_watermark
                    && f.log_end_offset >= self.epoch_start_offset
            })
            .map(|(id, _)| *id)
            .collect();
        if joining.is_empty() {
            return None;
        }
        let mut isr = self.isr.clone();
        isr.extend(joining);
        Some(self.propose(isr))
    }

    /// Time passed: the ISR change that drops followers who have not caught up within
    /// `replica.lag.time.max.ms`, if no change is pending.
    pub fn tick(&mut self, now_ms: u64) -> Option<IsrChange> {
        if self.pending.is_some() {
            return None;
        }
        let lagging: Vec<BrokerId> = self
            .isr
            .iter()
            .copied()
            .filter(|id| *id != self.me)
            .filter(|id| {
                self.followers.get(id).is_some_and(|f| {
                    now_ms.saturating_sub(f.last_caught_up_ms) > self.config.replica_lag_time_max_ms
                })
            })
            .collect();
        if lagging.is_empty() {
            return None;
        }
        let isr = self
            .isr
            .iter()
            .copied()
            .filter(|b| !lagging.contains(b))
            .collect();
        Some(self.propose(isr))
    }

    fn propose(&mut self, isr: Vec<BrokerId>) -> IsrChange {
        let change = IsrChange {
            leader_epoch: self.leader_epoch,
            partition_epoch: self.partition_epoch,
            new_isr: isr
                .iter()
                .map(|b| {
                    let epoch = self
                        .followers
                        .get(b)
                        .map_or(BrokerEpoch(-1), |f| f.broker_epoch);
                    (*b, epoch)
                })
                .collect(),
        };
        self.pending = Some(PendingIsr {
            isr,
            change: change.clone(),
        });
        change
    }

    /// The change waiting for the controller's answer, to send again after no answer.
    pub fn pending_change(&self) -> Option<&IsrChange> {
        self.pending.as_ref().map(|p| &p.change)
    }

    /// The controller answered the pending AlterPartition, or the metadata image brought the
    /// partition's committed state (the answer may be lost; the image is the truth). Returns
    /// the new high watermark if it moved. A state from another leader epoch means this
    /// leadership is over: the caller drops this state.
    pub fn on_committed(
        &mut self,
        isr: Vec<BrokerId>,
        partition_epoch: PartitionEpoch,
    ) -> Option<i64> {
        if partition_epoch.0 < self.partition_epoch.0 {
            return None;
        }
        self.isr = isr;
        self.partition_epoch = partition_epoch;
        self.pending = None;
        self.advance_high_watermark()
    }

    /// The controller answered `answered`, a change this leader proposed. A refusal
    /// (INVALID_UPDATE_VERSION, INELIGIBLE_REPLICA, ...) comes with the controller's state of the
    /// partition: when that is this leader's committed state, nothing changed and the next fetch
    /// or tick proposes again; when it is newer at this leader epoch (an earlier send of the
    /// change was committed, or the controller changed the ISR itself), it is the committed
    /// state from now on; from another leader epoch, this leadership is over and the image will
    /// say so. An answer to a change that is no longer the pending one (a late answer) clears
    /// nothing: only a state newer than this leader's counts, as it would from the image.
    /// Returns the new high watermark if it moved.
    pub fn on_isr_answer(&mut self, answered: &IsrChange, answer: IsrAnswer) -> Option<i64> {
        let answers_pending = self.pending.as_ref().is_some_and(|p| p.change == *answered);
        let (isr, partition_epoch) = match answer {
            IsrAnswer::Committed {
                isr,
                partition_epoch,
            } => {
                if answers_pending {
                    return self.on_committed(isr, partition_epoch);
                }
                (isr, partition_epoch)
            }
            IsrAnswer::Refused {
                leader_epoch,
                isr,
                partition_epoch,
            } => {
                if leader_epoch != self.leader_epoch {
                    return None;
                }
                if partition_epoch == self.partition_epoch && answers_pending {
                    self.pending = None;
                    return None;
                }
                (isr, partition_epoch)
            }
        };
        if partition_epoch.0 > self.partition_epoch.0 {
            self.on_committed(isr, partition_epoch)
        } else {
            None
        }
    }

    /// Forgets a pending change that was never sent (another was still in flight).
    pub fn drop_unsent(&mut self) {
        self.pending = None;
    }

    fn advance_high_watermark(&mut self) -> Option<i64> {
        // KIP-966: below `min.insync.replicas` the high watermark stays. The controller keeps
        // the replicas it removed from an ISR that small as eligible leaders, which is safe
        // only if nothing was committed without them.
        if self.isr.len() < self.config.min_insync_replicas {
            return None;
        }
        let mut lowest = self.log_end_offset;
        for b in self.maximal_isr() {
            if b == self.me {
                continue;
            }
            let end = self.followers.get(&b).map_or(-1, |f| f.log_end_offset);
            lowest = lowest.min(end);
        }
        if lowest > self.high_watermark {
            self.high_watermark = lowest;
            Some(lowest)
        } else {
            None
        }
    }

    /// Whether an acks=all produce may be appended: NOT_ENOUGH_REPLICAS below
    /// `min.insync.replicas` (the committed ISR), as Kafka checks before the append.
    pub fn check_acks_all(&self) -> Result<(), i16> {
        if self.isr.len() < self.config.min_insync_replicas {
            Err(NOT_ENOUGH_REPLICAS)
        } else {
            Ok(())
        }
    }

    /// An acks=all produce whose records end at `end_offset` (exclusive): `None` while waiting,
    /// else its error code: 0 once the high watermark passed it with enough replicas in the
    /// ISR, NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR shrank below the minimum meanwhile.
    pub fn acks_all_done(&self, end_offset: i64) -> Option<i16> {
        if self.high_watermark < end_offset {
            return None;
        }
        if self.isr.len() < self.config.min_insync_replicas {
            Some(NOT_ENOUGH_REPLICAS_AFTER_APPEND)
        } else {
            Some(NONE)
        }
    }
}

/// What a partition replica on this broker is, as the latest metadata image says. The broker's
/// `Partition` keeps one per replica and the simulator one per simulated replica; both change
/// it only through [`ReplicaRole::update`].
#[derive(Clone, Debug)]
pub enum ReplicaRole {
    /// Opened, no image applied yet: refuses produce and fetch as not the leader.
    Unknown,
    Leader(Box<LeaderState>),
    Follower(Follower),
}

/// A follower's knowledge of its leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Follower {
    pub leader: BrokerId,
    pub leader_epoch: LeaderEpoch,
    /// The leader's high watermark as its last fetch response said (-1: not yet).
    pub high_watermark: i64,
}

/// The partition's state in a metadata image, for [`ReplicaRole::update`]. `leader` is
/// `BrokerId::NONE` for a partition without one, and also while this broker's registration of
/// this run is not in the image yet (it leads nothing before).
#[derive(Clone, Copy, Debug)]
pub struct RoleUpdate<'a> {
    pub me: BrokerId,
    pub leader: BrokerId,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
    pub replicas: &'a [BrokerId],
    pub isr: &'a [BrokerId],
    pub config: ReplicaConfig,
}

/// What [`ReplicaRole::update`] changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoleChange {
    /// Still leading at the same leader epoch. `old_isr`: the committed ISR changed from this;
    /// `replicas_changed`: a reassignment added or removed replicas within the leadership.
    SameLeadership {
        old_isr: Option<Vec<BrokerId>>,
        replicas_changed: bool,
    },
    /// Leads from now on, at a new leader epoch.
    Leading,
    /// Follows a new leader or leader epoch: the replica fetcher must know.
    Following,
    /// Still follows the same leader at the same epoch.
    Unchanged,
}

impl ReplicaRole {
    /// The high watermark this replica knows: its own as leader, its leader's as follower.
    pub fn known_high_watermark(&self) -> i64 {
        match self {
            ReplicaRole::Leader(l) => l.high_watermark(),
            ReplicaRole::Follower(f) => f.high_watermark,
            ReplicaRole::Unknown => -1,
        }
    }

    /// Brings the role in line with the image. `log_end` is the log's durable end (what a new
    /// leadership starts from), `log_start` its start offset.
    pub fn update(
        &mut self,
        u: RoleUpdate<'_>,
        log_end: i64,
        log_start: i64,
        now_ms: u64,
    ) -> RoleChange {
        if u.leader == u.me {
            if let ReplicaRole::Leader(l) = self {
                if l.leader_epoch == u.leader_epoch {
                    // The same leadership: the image brings the committed ISR (the answer to
                    // an AlterPartition, or a change the controller made itself) when the
                    // partition's state changed; any other image leaves a pending change be.
                    let mut old_isr = None;
                    if l.partition_epoch != u.partition_epoch || l.isr != u.isr {
                        old_isr = Some(l.isr.clone());
                        l.on_committed(u.isr.to_vec(), u.partition_epoch);
                    }
                    let replicas_changed = l.replicas != u.replicas;
                    if replicas_changed {
                        l.set_replicas(u.replicas.to_vec());
                    }
                    l.config = u.config;
                    return RoleChange::SameLeadership {
                        old_isr,
                        replicas_changed,
                    };
                }
            }
            let mut state = LeaderState::new(
                Leadership {
                    me: u.me,
                    leader_epoch: u.leader_epoch,
                    partition_epoch: u.partition_epoch,
                    replicas: u.replicas.to_vec(),
                    isr: u.isr.to_vec(),
                    log_end_offset: log_end,
                    // Where it left off as a follower; with no followers in the ISR (and a
                    // `min.insync.replicas` of 1) it moves to the log end at once.
                    high_watermark: self.known_high_watermark().max(log_start),
                },
                u.config,
                now_ms,
            );
            state.on_log_end(log_end);
            *self = ReplicaRole::Leader(Box::new(state));
            return RoleChange::Leading;
        }
        let changed = match self {
            ReplicaRole::Follower(f) => f.leader != u.leader || f.leader_epoch != u.leader_epoch,
            _ => true,
        };
        if !changed {
            return RoleChange::Unchanged;
        }
        *self = ReplicaRole::Follower(Follower {
            leader: u.leader,
            leader_epoch: u.leader_epoch,
            high_watermark: self.known_high_watermark(),
        });
        RoleChange::Following
    }

    /// The high watermark readers of this replica see, given its log's durable end: the
    /// leader's after telling it that end; a follower's leader's, never past its own log.
    /// Returns it and whether a leader's moved.
    pub fn high_watermark(&mut self, log_end: i64) -> (i64, bool) {
        match self {
            ReplicaRole::Leader(l) => {
                let moved = l.on_log_end(log_end).is_some();
                (l.high_watermark(), moved)
            }
            ReplicaRole::Follower(f) => (f.high_watermark.min(log_end).max(-1), false),
            ReplicaRole::Unknown => (log_end, false),
        }
    }
}

/// KIP-320, at the leader: where a follower whose last fetched batch is of
/// `last_fetched_epoch` and that fetches at `fetch_offset` diverged from this leader's log, as
/// (epoch, end offset) to truncate by. `end_for_epoch` is the leader log's answer for that
/// epoch (its end of it, or of the largest epoch below), `log_start` the leader's log start.
/// The leader's end is returned when it is another epoch or ends before the fetch offset;
/// `None` when the logs agree.
pub fn diverging_epoch(
    end_for_epoch: Option<(LeaderEpoch, i64)>,
    last_fetched_epoch: LeaderEpoch,
    fetch_offset: i64,
    log_start: i64,
) -> Option<(LeaderEpoch, i64)> {
    match end_for_epoch {
        Some((epoch, end)) if epoch == last_fetched_epoch && end >= fetch_offset => None,
        Some(found) => Some(found),
        // This leader has no epoch at or below the follower's: nothing in common is known, and
        // the follower starts again from this log's start. (-1, -1) would read as "no
        // divergence" on the wire.
        None => Some((LeaderEpoch(-1), log_start)),
    }
}

/// What a follower does when its leader answers OFFSET_OUT_OF_RANGE for its fetch offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartOver {
    /// Its log ends before the leader's start: start over there, empty (Kafka's
    /// `truncateFullyAndStartAt`).
    At(i64),
    /// Its log runs past the leader's high watermark: truncate back to it.
    TruncateTo(i64),
    /// Neither: fetch again later.
    Retry,
}

/// A follower whose log ends at `local_end` was answered OFFSET_OUT_OF_RANGE with the leader's
/// log start and high watermark.
pub fn start_over(local_end: i64, leader_start: i64, leader_high_watermark: i64) -> StartOver {
    if leader_start >= 0 && local_end < leader_start {
        StartOver::At(leader_start)
    } else if leader_high_watermark >= 0 && local_end > leader_high_watermark {
        StartOver::TruncateTo(leader_high_watermark)
    } else {
        StartOver::Retry
    }
}

/// Where a follower's next fetch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FetchPosition {
    /// At its log end, with the epoch of its last batch (KIP-320's `last_fetched_epoch`).
    At {
        fetch_offset: i64,
        last_fetched_epoch: LeaderEpoch,
    },
    /// Its log runs past what is durable (records it wrote as leader whose fdatasync is still
    /// running, or appended and not yet flushed): make them durable, then ask again.
    FlushFirst,
}

/// Where a follower whose log ends at `log_end`, durable up to `durable_end`, with
/// `last_epoch` the epoch of its last batch, fetches from. Two things hold the fetch offset in
/// place. The leader counts a follower as having everything below it, for the high
/// watermark, so it must be durable. And the leader checks the follower's log against its own
/// only at the fetch offset, by the epoch of the batch just below it: fetching from the
/// durable end while naming the epoch of a later, undurable tail would let that tail, when it
/// diverges, escape the check and stay in the log under the leader's records.
pub fn fetch_position(
    log_end: i64,
    durable_end: i64,
    last_epoch: Option<LeaderEpoch>,
) -> FetchPosition {
    if durable_end < log_end {
        return FetchPosition::FlushFirst;
    }
    FetchPosition::At {
        fetch_offset: log_end,
        last_fetched_epoch: last_epoch.unwrap_or(LeaderEpoch(-1)),
    }
}

/// Where a follower truncates its log when it starts following a new leader (KIP-101,
/// KIP-279): it asked the leader for the end of its own latest epoch and got `(leader_epoch,
/// end_offset)` back. `local_epochs` are its own (epoch, start offset) pairs, ascending, and
/// `local_end` its log end. Truncating to the high watermark alone would lose records the new
/// leader has; this keeps exactly the prefix both logs share.
pub fn truncation_offset(
    local_epochs: &[(LeaderEpoch, i64)],
    local_end: i64,
    leader_epoch: LeaderEpoch,
    leader_end_offset: i64,
) -> i64 {
    if leader_epoch.0 < 0 || leader_end_offset < 0 {
        // The leader knows none of this follower's epochs: nothing in common is known.
        return local_epochs
            .first()
            .map_or(0, |(_, start)| *start)
            .min(local_end);
    }
    // The follower's own end of the epoch the leader answered for: the start of its next
    // epoch above it, or its log end.
    let own_end = local_epochs
        .iter()
        .find(|(e, _)| e.0 > leader_epoch.0)
        .map_or(local_end, |(_, start)| *start);
    leader_end_offset.min(own_end).min(local_end)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAG: u64 = 10_000;

    fn leader(isr: &[i32], log_end: i64, hw: i64, min_isr: usize) -> LeaderState {
        LeaderState::new(
            Leadership {
                me: BrokerId(1),
                leader_epoch: LeaderEpoch(3),
                partition_epoch: PartitionEpoch(7),
                replicas: vec![BrokerId(1), BrokerId(2), BrokerId(3)],
                isr: isr.iter().map(|b| BrokerId(*b)).collect(),
                log_end_offset: log_end,
                high_watermark: hw,
            },
            ReplicaConfig {
                replica_lag_time_max_ms: LAG,
                min_insync_replicas: min_isr,
            },
            0,
        )
    }

    fn ids(v: &[i32]) -> Vec<BrokerId> {
        v.iter().map(|b| BrokerId(*b)).collect()
    }

    #[test]
    fn a_consumer_reads_from_an_in_sync_caught_up_replica_in_its_rack() {
        let racks = |b: BrokerId| match b.0 {
            1 => Some("r1"),
            2 => Some("r2"),
            3 => Some("r3"),
            _ => None,
        };
        let mut l = leader(&[1, 2, 3], 100, 100, 1);
        l.on_fetch(BrokerId(2), BrokerEpoch(5), 100, 1_000);
        l.on_fetch(BrokerId(3), BrokerEpoch(6), 100, 1_000);
        assert_eq!(
            l.preferred_read_replica("r2", 50, 1_000, racks),
            Some(BrokerId(2))
        );
        assert_eq!(
            l.preferred_read_replica("r3", 100, 1_000, racks),
            Some(BrokerId(3))
        );
        // The leader's own rack, no rack, or a rack without a replica: the leader.
        assert_eq!(l.preferred_read_replica("r1", 50, 1_000, racks), None);
        assert_eq!(l.preferred_read_replica("", 50, 1_000, racks), None);
        assert_eq!(l.preferred_read_replica("r9", 50, 1_000, racks), None);
        // A replica without the offset yet is not chosen.
        l.on_log_end(120);
        l.on_fetch(BrokerId(3), BrokerEpoch(6), 120, 1_100);
        assert_eq!(l.preferred_read_replica("r2", 110, 1_100, racks), None);
        assert_eq!(
            l.preferred_read_replica("r3", 110, 1_100, racks),
            Some(BrokerId(3))
        );
        // One that has not caught up within replica.lag.time.max.ms is not either.
        assert_eq!(
            l.preferred_read_replica("r2", 50, 1_000 + LAG + 1, racks),
            None
        );
        // Nor one out of the ISR, however caught up.
        let mut out = leader(&[1, 3], 100, 100, 1);
        out.on_fetch(BrokerId(2), BrokerEpoch(5), 100, 1_000);
        assert_eq!(out.preferred_read_replica("r2", 50, 1_000, racks), None);
    }

    #[test]
    fn the_high_watermark_is_the_smallest_log_end_in_the_isr_and_never_goes_back() {
        let mut l = leader(&[1, 2, 3], 100, 90, 2);
        assert_eq!(l.high_watermark(), 90);
        assert_eq!(
            l.on_fetch(BrokerId(2), BrokerEpoch(5), 95, 1).0,
            None,
            "3 has not fetched"
        );
        assert_eq!(l.on_fetch(BrokerId(3), BrokerEpoch(6), 97, 2).0, Some(95));
        assert_eq!(l.on_log_end(120), None);
        assert_eq!(l.on_fetch(BrokerId(2), BrokerEpoch(5), 120, 3).0, Some(97));
        assert_eq!(
            l.on_fetch(BrokerId(3), BrokerEpoch(6), 130, 4).0,
            Some(120),
            "capped by the leader"
        );
        // A follower reporting less (it truncated) never takes the high watermark back.
        assert_eq!(l.on_fetch(BrokerId(2), BrokerEpoch(5), 100, 5).0, None);
        assert_eq!(l.high_watermark(), 120);
        // A produce ending at 120 is done; one ending at 121 waits.
        assert_eq!(l.acks_all_done(120), Some(NONE));
        assert_eq!(l.acks_all_done(121), None);
    }

    #[test]
    fn a_replica_added_within_the_leadership_joins_the_isr_once_caught_up() {
        let mut l = leader(&[1, 2, 3], 100, 100, 2);
        l.on_fetch(BrokerId(2), BrokerEpoch(5), 100, 1);
        l.on_fetch(BrokerId(3), BrokerEpoch(6), 100, 1);
        // A reassignment adds 4: not in the ISR, so it holds back no high watermark.
        l.set_replicas(ids(&[4, 2, 3, 1]));
        assert_eq!(l.follower(BrokerId(4)).unwrap().log_end_offset, -1);
        assert_eq!(l.on_fetch(BrokerId(4), BrokerEpoch(9), 0, 2), (None, None));
        assert_eq!(l.on_log_end(150), None, "2 and 3 have not fetched past 100");
        let (_, join) = l.on_fetch(BrokerId(4), BrokerEpoch(9), 150, 3);
        let join = join.expect("4 caught up");
        assert_eq!(
            join.new_isr,
            vec![
                (BrokerId(1), BrokerEpoch(-1)),
                (BrokerId(2), BrokerEpoch(5)),
                (BrokerId(3), BrokerEpoch(6)),
                (BrokerId(4), BrokerEpoch(9)),
            ]
        );
        // Removed again: forgotten, and a fetch from it changes nothing.
        l.drop_unsent();
        l.set_replicas(ids(&[2, 3, 1]));
        assert!(l.follower(BrokerId(4)).is_none());
        assert_eq!(
            l.on_fetch(BrokerId(4), BrokerEpoch(9), 150, 4),
            (None, None)
        );
    }

    #[test]
    fn a_follower_that_stops_catching_up_leaves_the_isr_and_rejoins_once_caught_up() {
        let mut l = leader(&[1, 2, 3], 100, 100, 2);
        l.on_fetch(BrokerId(2), BrokerEpoch(5), 100, 1_000);
        l.on_fetch(BrokerId(3), BrokerEpoch(6), 100, 1_000);
        l.on_log_end(200);
        // 2 keeps up; 3 fetches but stays behind what the leader had at its previous fetch.
        for t in (2_000..=12_000).step_by(1_000) {
            l.on_fetch(BrokerId(2), BrokerEpoch(5), 200, t);
            l.on_fetch(BrokerId(3), BrokerEpoch(6), 150, t);
        }
        assert_eq!(
            l.tick(11_000),
            None,
            "3 caught up last at 1000 (with what the leader had), lag not yet over"
        );
        let shrink = l.tick(11_001).expect("3 lags past replica.lag.time.max.ms");
        assert_eq!(
            shrink.new_isr,
            vec![
                (BrokerId(1), BrokerEpoch(-1)),
                (BrokerId(2), BrokerEpoch(5))
            ]
        );
        assert_eq!(
            (shrink.leader_epoch, shrink.partition_epoch),
            (LeaderEpoch(3), PartitionEpoch(7))
        );
        // One change in flight at a time.
        assert_eq!(l.tick(20_000), None);
        // Until it commits, the high watermark still waits for 3 (the ISR may not shrink).
        assert_eq!(l.high_watermark(), 150);
        assert_eq!(l.on_committed(ids(&[1, 2]), PartitionEpoch(8)), Some(200));
        assert_eq!(l.check_acks_all(), Ok(()));
        // 3 catches up: it reached the high watermark and this epoch's start: it may rejoin.
        let (_, grow) = l.on_fetch(BrokerId(3), BrokerEpoch(6), 200, 21_000);
        let grow = grow.expect("caught up");
        assert_eq!(grow.new_isr.last(), Some(&(BrokerId(3), BrokerEpoch(6))));
        assert_eq!(grow.partition_epoch, PartitionEpoch(8));
        // While the expansion is pending, the high watermark counts on 3 too.
        assert_eq!(l.maximal_isr(), ids(&[1, 2, 3]));
        l.on_log_end(210);
        l.on_fetch(BrokerId(2), BrokerEpoch(5), 210, 21_100);
        assert_eq!(l.high_watermark(), 200, "3 is at 200");
        assert_eq!(l.on_committed(ids(&[1, 2, 3]), PartitionEpoch(9)), None);
    }

    #[test]
    fn a_follower_behind_this_leaderships_start_does_not_rejoin() {
        // The new leader's log ends at 100; its high watermark is 80 (3, in the ISR, has not
        // fetched yet).
        let mut l = leader(&[1, 3], 100, 80, 1);
        let (_, grow) = l.on_fetch(BrokerId(2), BrokerEpoch(5), 90, 1);
        assert_eq!(l.high_watermark(), 80);
        assert_eq!(
            grow, None,
            "past the high watermark but not at the epoch start"
        );
        let (_, grow) = l.on_fetch(BrokerId(2), BrokerEpoch(5), 100, 2);
        assert!(grow.is_some());
        // A refusal at the committed state drops the pending change; the next fetch asks
        // again.
        let refused = IsrAnswer::Refused {
            leader_epoch: l.leader_epoch,
            isr: l.isr.clone(),
            partition_epoch: l.partition_epoch,
        };
        l.on_isr_answer(&grow.unwrap(), refused);
        let (_, again) = l.on_fetch(BrokerId(2), BrokerEpoch(5), 100, 3);
        assert!(again.is_some());
    }

    /// Found by the simulator (seed 3, three controllers): a leader whose AlterPartition
    /// adding a follower timed out took the change as refused, left the follower out of the
    /// high watermark and acknowledged acks=all writes without it, while the controller had
    /// committed the expansion; fenced with the other member, the controller then elected
    /// the follower, which lacked those writes. A change without a definite answer stays
    /// pending (its member counted), and is sent again.
    #[test]
    fn an_unanswered_expansion_keeps_its_member_in_the_high_watermark() {
        let mut l = leader(&[1, 2], 100, 100, 2);
        l.on_fetch(BrokerId(2), BrokerEpoch(5), 100, 1);
        let (_, grow) = l.on_fetch(BrokerId(3), BrokerEpoch(6), 100, 1);
        let grow = grow.expect("3 caught up");
        l.on_log_end(110);
        // 2 has everything, 3 nothing new: the high watermark waits for 3, however long the
        // answer takes.
        assert_eq!(l.on_fetch(BrokerId(2), BrokerEpoch(5), 110, 2).0, None);
        assert_eq!(l.high_watermark(), 100);
        assert_eq!(
            l.tick(1_000_000),
            None,
            "no shrink while a change is pending"
        );
        assert_eq!(l.pending_change(), Some(&grow), "sent again as it was");
        // The retry is refused as stale: the first send was committed. That state counts.
        let hw = l.on_isr_answer(
            &grow,
            IsrAnswer::Refused {
                leader_epoch: l.leader_epoch,
                isr: ids(&[1, 2, 3]),
                partition_epoch: PartitionEpoch(l.partition_epoch.0 + 1),
            },
        );
        assert_eq!(hw, None);
        assert_eq!(l.isr, ids(&[1, 2, 3]));
        assert_eq!(l.pending_change(), None);
        assert_eq!(l.on_fetch(BrokerId(3), BrokerEpoch(6), 110, 3).0, Some(110));
    }

    /// Found by the simulator (seed 2681, five controllers): a late refusal of an earlier
    /// change, at the state the leader already had, cleared the change proposed since (adding
    /// a follower), which the controller then committed while the high watermark had moved
    /// past that follower's log end. A late answer clears nothing.
    #[test]
    fn a_late_answer_leaves_the_pending_change_be() {
        let mut l = leader(&[1, 2], 100, 100, 2);
        l.on_fetch(BrokerId(2), BrokerEpoch(5), 100, 1);
        let (_, first) = l.on_fetch(BrokerId(3), BrokerEpoch(6), 100, 1);
        let first = first.expect("3 caught up");
        // The image brings a newer state; the first change can no longer commit, a second one
        // is proposed on the new state.
        l.on_committed(ids(&[1, 2]), PartitionEpoch(l.partition_epoch.0 + 1));
        let (_, second) = l.on_fetch(BrokerId(3), BrokerEpoch(6), 100, 2);
        let second = second.expect("proposed again");
        l.on_log_end(110);
        l.on_fetch(BrokerId(2), BrokerEpoch(5), 110, 3);
        // The first change's refusal, at the state the leader has: the second stays pending.
        let state = IsrAnswer::Refused {
            leader_epoch: l.leader_epoch,
            isr: l.isr.clone(),
            partition_epoch: l.partition_epoch,
        };
        assert_eq!(l.on_isr_answer(&first, state), None);
        assert_eq!(l.pending_change(), Some(&second));
        assert_eq!(l.high_watermark(), 100, "3 still counts");
        let committed = IsrAnswer::Committed {
            isr: ids(&[1, 2, 3]),
            partition_epoch: PartitionEpoch(l.partition_epoch.0 + 1),
        };
        assert_eq!(l.on_isr_answer(&second, committed), None);
        assert_eq!(l.isr, ids(&[1, 2, 3]));
    }

    #[test]
    fn the_high_watermark_stays_while_the_isr_is_below_min_insync_replicas() {
        // Sole member of the ISR, min.insync.replicas 2: what it appends stays above the high
        // watermark (KIP-966), so a replica the controller keeps as an eligible leader lacks
        // nothing committed.
        let mut l = leader(&[1], 100, 90, 2);
        assert_eq!(l.high_watermark(), 90);
        assert_eq!(l.on_log_end(120), None);
        assert_eq!(l.high_watermark(), 90);
        // 2 catches up and joins: the high watermark moves once the ISR is back to two.
        l.on_fetch(BrokerId(2), BrokerEpoch(5), 120, 1);
        assert_eq!(l.high_watermark(), 90);
        assert_eq!(l.on_committed(ids(&[1, 2]), PartitionEpoch(8)), Some(120));
        // With min.insync.replicas 1 a lone leader commits at once, as in Kafka.
        let mut alone = leader(&[1], 100, 90, 1);
        assert_eq!(alone.on_log_end(120), Some(120));
    }

    #[test]
    fn acks_all_needs_min_insync_replicas() {
        let mut l = leader(&[1], 100, 100, 2);
        assert_eq!(l.check_acks_all(), Err(NOT_ENOUGH_REPLICAS));
        l.on_fetch(BrokerId(2), BrokerEpoch(5), 100, 1);
        l.on_committed(ids(&[1, 2]), PartitionEpoch(8));
        assert_eq!(l.check_acks_all(), Ok(()));
        l.on_log_end(110);
        l.on_fetch(BrokerId(2), BrokerEpoch(5), 110, 2);
        // The ISR shrank below the minimum after the append: acknowledged as Kafka does.
        l.on_committed(ids(&[1]), PartitionEpoch(9));
        assert_eq!(l.acks_all_done(110), Some(NOT_ENOUGH_REPLICAS_AFTER_APPEND));
        // An older partition epoch (a late answer) changes nothing.
        assert_eq!(l.on_committed(ids(&[1, 2, 3]), PartitionEpoch(8)), None);
        assert_eq!(l.isr, ids(&[1]));
    }

    #[test]
    fn a_follower_truncates_to_the_prefix_it_shares_with_the_new_leader() {
        let epochs = [
            (LeaderEpoch(1), 0),
            (LeaderEpoch(2), 50),
            (LeaderEpoch(4), 80),
        ];
        // The leader has epoch 4 up to 90; we have up to 100: cut the 10 it never had.
        assert_eq!(truncation_offset(&epochs, 100, LeaderEpoch(4), 90), 90);
        // The leader has more of epoch 4 than we do: keep all of ours.
        assert_eq!(truncation_offset(&epochs, 100, LeaderEpoch(4), 120), 100);
        // The leader never had epoch 4: it answers its largest epoch below (2), ending at 70;
        // ours ends at 80 (where 4 starts): keep 70.
        assert_eq!(truncation_offset(&epochs, 100, LeaderEpoch(2), 70), 70);
        // ... and when ours ends first, ours counts (KIP-279).
        assert_eq!(truncation_offset(&epochs, 100, LeaderEpoch(2), 85), 80);
        // The leader knows none of our epochs.
        assert_eq!(truncation_offset(&epochs, 100, LeaderEpoch(-1), -1), 0);
        // An empty log stays empty.
        assert_eq!(truncation_offset(&[], 0, LeaderEpoch(4), 90), 0);
    }

    #[test]
    fn a_follower_fetches_from_its_durable_log_end_only() {
        assert_eq!(
            fetch_position(10, 10, Some(LeaderEpoch(4))),
            FetchPosition::At {
                fetch_offset: 10,
                last_fetched_epoch: LeaderEpoch(4)
            }
        );
        assert_eq!(
            fetch_position(0, 0, None),
            FetchPosition::At {
                fetch_offset: 0,
                last_fetched_epoch: LeaderEpoch(-1)
            }
        );
        // A tail written as leader, not yet durable: neither its end (not durable) nor the
        // durable end (the tail's epoch would hide it from the leader's check) will do.
        assert_eq!(
            fetch_position(12, 10, Some(LeaderEpoch(4))),
            FetchPosition::FlushFirst
        );
    }
}
