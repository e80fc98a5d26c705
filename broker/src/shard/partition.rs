//! A partition replica on its owner shard: the log plus its part in replication. As leader it
//! keeps `sluice_replication::replica::LeaderState` (followers' progress, ISR, high watermark;
//! the same sans-IO code the simulator drives); as follower what the leader last said. The
//! metadata image decides which, in `Shard::apply_image`.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;
use sluice_engine::{DmaStorage, LeaderEpoch, Log, Offset};
use sluice_replication::produce::{self, acks_all_answer};
use sluice_replication::records::{BrokerEpoch, BrokerId};
use sluice_replication::replica::{IsrAnswer, IsrChange, RoleChange};

/// The leader epoch of a partition before any image named one (a single node's partitions
/// from before the cluster era were written at it).
pub const LEADER_EPOCH: LeaderEpoch = LeaderEpoch(0);

/// What this replica is, as the latest metadata image says: the sans-IO role the simulator
/// drives too.
pub use sluice_replication::replica::{Follower, ReplicaRole as Replica};

/// The partition's state from the image, for [`Partition::update_role`].
pub use sluice_replication::replica::RoleUpdate;

pub struct Partition {
    pub log: Log<DmaStorage>,
    pub replica: RefCell<Replica>,
    /// Notified when the high watermark moves, the ISR changes or the leadership ends, on the
    /// owner shard only (acks=all produces wait here).
    pub changed: event_listener::Event,
    /// An AlterPartition is on its way to the controller.
    pub isr_change_in_flight: std::cell::Cell<bool>,
    /// The node's metrics, for the ISR shrinks and expansions this replica leads.
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// KIP-890's verification guards, by producer id: a transaction's first batch here is
    /// appended only if no marker for its producer was written while the coordinator was
    /// asked whether the partition is in the transaction (else the batch, verified against a
    /// transaction that has just ended, would open one nobody ends).
    txn_verifications: RefCell<std::collections::HashMap<i64, Verification>>,
    next_verification: std::cell::Cell<u64>,
}

/// A producer's latest KIP-890 verification in this partition (`Partition::txn_verifications`).
struct Verification {
    guard: u64,
    producer_epoch: i16,
    /// It succeeded and its batch went to the log: later batches of the transaction at this
    /// epoch need none until the producer's next marker. (The producer state only knows the
    /// transaction once that batch is recorded, after batches pipelined behind it are checked.)
    verified: bool,
}

/// Counts a committed ISR change of a partition this broker leads, as Kafka's
/// `IsrShrinksPerSec` and `IsrExpandsPerSec` do.
fn count_isr_change(metrics: &crate::metrics::Metrics, old: &[BrokerId], new: &[BrokerId]) {
    use crate::metrics::Metrics;
    if old.iter().any(|b| !new.contains(b)) {
        Metrics::count(&metrics.isr_shrinks, 1);
    }
    if new.iter().any(|b| !old.contains(b)) {
        Metrics::count(&metrics.isr_expands, 1);
    }
}

/// A request naming the leader epoch it expects (`current`, -1 for none) against the replica's
/// `epoch`: FENCED_LEADER_EPOCH when older, UNKNOWN_LEADER_EPOCH when newer.
fn check_epoch(epoch: i32, current: i32) -> Result<LeaderEpoch, i16> {
    if current >= 0 && current < epoch {
        return Err(ResponseError::FencedLeaderEpoch.code());
    }
    if current > epoch {
        return Err(ResponseError::UnknownLeaderEpoch.code());
    }
    Ok(LeaderEpoch(epoch))
}

/// Milliseconds on a clock local to this process, for replica lag.
pub fn now_ms() -> u64 {
    thread_local! {
        static START: Instant = Instant::now();
    }
    START.with(|s| s.elapsed().as_millis() as u64)
}

impl Partition {
    pub fn new(
        log: Log<DmaStorage>,
        metrics: std::sync::Arc<crate::metrics::Metrics>,
    ) -> Partition {
        Partition {
            log,
            replica: RefCell::new(Replica::Unknown),
            changed: event_listener::Event::new(),
            isr_change_in_flight: std::cell::Cell::new(false),
            metrics,
            txn_verifications: RefCell::default(),
            next_verification: std::cell::Cell::new(0),
        }
    }

    /// Starts verifying a transactional batch of `producer_id` with its coordinator; returns
    /// the guard to hand to [`Partition::finish_txn_verification`].
    pub fn start_txn_verification(&self, producer_id: i64, producer_epoch: i16) -> u64 {
        let guard = self.next_verification.get() + 1;
        self.next_verification.set(guard);
        self.txn_verifications.borrow_mut().insert(
            producer_id,
            Verification {
                guard,
                producer_epoch,
                verified: false,
            },
        );
        guard
    }

    /// Whether the verification `guard` still stands; if so the producer's transaction counts
    /// as verified here from now on. Called right before the append, with no await between. A
    /// marker for the producer since the verification started makes it INVALID_TXN_STATE (the
    /// transaction it was verified against has ended); a later verification of the same
    /// producer (a retry on another connection) makes it NOT_ENOUGH_REPLICAS, which the
    /// producer retries, as Kafka answers the older of two.
    pub fn finish_txn_verification(
        &self,
        producer_id: i64,
        guard: u64,
    ) -> Result<(), kafka_protocol::ResponseError> {
        match self.txn_verifications.borrow_mut().get_mut(&producer_id) {
            Some(v) if v.guard == guard => {
                v.verified = true;
                Ok(())
            }
            Some(_) => Err(kafka_protocol::ResponseError::NotEnoughReplicas),
            None => Err(kafka_protocol::ResponseError::InvalidTxnState),
        }
    }

    /// Whether a batch of `producer_id`'s transaction at `producer_epoch` was verified here and
    /// no marker for the producer has been written since.
    pub fn txn_verified(&self, producer_id: i64, producer_epoch: i16) -> bool {
        self.txn_verifications
            .borrow()
            .get(&producer_id)
            .is_some_and(|v| v.verified && v.producer_epoch == producer_epoch)
    }

    /// A marker for `producer_id` is being written: verifications in flight no longer stand.
    pub fn clear_txn_verification(&self, producer_id: i64) {
        self.txn_verifications.borrow_mut().remove(&producer_id);
    }

    /// For a leader: (in-sync replicas, replicas, `min.insync.replicas`), for the gauges.
    pub fn replica_health(&self) -> Option<(usize, usize, usize)> {
        match &*self.replica.borrow() {
            Replica::Leader(l) => {
                Some((l.isr.len(), l.replicas.len(), l.config.min_insync_replicas))
            }
            _ => None,
        }
    }

    /// Brings the replica's role in line with the image. Returns true when it became a
    /// follower of another leader or leader epoch (the replica fetcher must know).
    pub fn update_role(&self, u: RoleUpdate<'_>) -> bool {
        let log_end = self.log.high_watermark().0;
        let log_start = self.log.log_start_offset().0;
        let change = self
            .replica
            .borrow_mut()
            .update(u, log_end, log_start, now_ms());
        let dir = self.log.dir().display();
        let following = match change {
            RoleChange::SameLeadership {
                old_isr,
                replicas_changed,
            } => {
                if let Some(old) = old_isr {
                    count_isr_change(&self.metrics, &old, u.isr);
                }
                if replicas_changed {
                    tracing::info!(dir = %dir, replicas = ?u.replicas, "the partition's replicas changed");
                }
                false
            }
            RoleChange::Leading => {
                let hw = self.replica.borrow().known_high_watermark();
                tracing::info!(dir = %dir, leader_epoch = u.leader_epoch.0, isr = ?u.isr, log_end_offset = log_end, high_watermark = hw, "leading the partition");
                false
            }
            RoleChange::Following => {
                tracing::info!(dir = %dir, leader = u.leader.0, leader_epoch = u.leader_epoch.0, "following the partition's leader");
                true
            }
            RoleChange::Unchanged => false,
        };
        self.changed.notify(usize::MAX);
        following
    }

    /// The leader epoch this replica leads at, or the error for a request that needs the
    /// leader: NOT_LEADER_OR_FOLLOWER, or, for a request naming the epoch it expects
    /// (`current`, -1 for none), FENCED_LEADER_EPOCH when it is older and
    /// UNKNOWN_LEADER_EPOCH when newer than this leader's.
    pub fn check_leader(&self, current: i32) -> Result<LeaderEpoch, i16> {
        let epoch = match &*self.replica.borrow() {
            Replica::Leader(l) => l.leader_epoch.0,
            _ => return Err(ResponseError::NotLeaderOrFollower.code()),
        };
        check_epoch(epoch, current)
    }

    /// Like [`Partition::check_leader`], for a read a follower may serve too (a consumer's
    /// Fetch v11+, KIP-392): the leader epoch checked against the one this replica knows.
    pub fn check_readable(&self, current: i32) -> Result<LeaderEpoch, i16> {
        let epoch = match &*self.replica.borrow() {
            Replica::Leader(l) => l.leader_epoch.0,
            Replica::Follower(f) => f.leader_epoch.0,
            _ => return Err(ResponseError::NotLeaderOrFollower.code()),
        };
        check_epoch(epoch, current)
    }

    /// On a leader, the replica a consumer in `client_rack` should read `fetch_offset` from
    /// instead (KIP-392, `LeaderState::preferred_read_replica`); `None` to read here.
    pub fn preferred_read_replica<'r>(
        &self,
        client_rack: &str,
        fetch_offset: i64,
        rack_of: impl Fn(BrokerId) -> Option<&'r str>,
    ) -> Option<BrokerId> {
        match &*self.replica.borrow() {
            Replica::Leader(l) => {
                l.preferred_read_replica(client_rack, fetch_offset, now_ms(), rack_of)
            }
            _ => None,
        }
    }

    pub fn is_leader(&self) -> bool {
        matches!(&*self.replica.borrow(), Replica::Leader(_))
    }

    /// The offset below which consumers may read: on a leader, the smallest log end in the ISR
    /// (every member's fdatasync'd end under `flush.mode=batch`); on a follower what its leader
    /// last said, never past its own log.
    pub fn high_watermark(&self) -> Offset {
        let local = self.log.high_watermark();
        let (hw, moved) = self.replica.borrow_mut().high_watermark(local.0);
        if moved {
            self.changed.notify(usize::MAX);
        }
        Offset(hw)
    }

    /// NOT_ENOUGH_REPLICAS when an acks=all produce may not be appended (the ISR is below
    /// `min.insync.replicas`).
    pub fn check_acks_all(&self) -> Result<(), i16> {
        produce::admit(&self.replica.borrow(), produce::ACKS_ALL)
            .map(|_| ())
            .map_err(|refused| refused.error_code)
    }

    /// Waits until an acks=all produce appended at leader epoch `epoch` and ending at `end`
    /// (exclusive) is answered
    /// (`sluice_replication::produce::acks_all_answer`, as the simulator's leaders answer it):
    /// 0 once on every ISR member, NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR shrank below
    /// the minimum meanwhile, NOT_LEADER_OR_FOLLOWER when the leadership ended, or
    /// REQUEST_TIMED_OUT after `timeout` (Kafka's produce `timeout_ms`).
    pub async fn wait_acks_all(&self, epoch: LeaderEpoch, end: Offset, timeout: Duration) -> i16 {
        let deadline = Instant::now() + timeout;
        loop {
            let listener = self.changed.listen();
            self.high_watermark();
            let now = Instant::now();
            let answer = acks_all_answer(&self.replica.borrow(), epoch, end.0, now >= deadline);
            if let Some(code) = answer {
                return code;
            }
            futures_lite::future::or(listener, glommio::timer::sleep(deadline - now)).await;
        }
    }

    /// A follower fetched at `fetch_offset`: its progress moves the high watermark and may
    /// bring it into the ISR. Returns the ISR change to send, if any.
    pub fn on_follower_fetch(
        &self,
        follower: i32,
        broker_epoch: i64,
        fetch_offset: i64,
    ) -> Option<IsrChange> {
        let local = self.log.high_watermark().0;
        let (moved, change) = match &mut *self.replica.borrow_mut() {
            Replica::Leader(l) => {
                let own = l.on_log_end(local).is_some();
                let (moved, change) = l.on_fetch(
                    BrokerId(follower),
                    BrokerEpoch(broker_epoch),
                    fetch_offset,
                    now_ms(),
                );
                (own || moved.is_some(), change)
            }
            _ => return None,
        };
        if moved {
            self.changed.notify(usize::MAX);
        }
        change
    }

    /// Time passed: the ISR change that drops followers who fell behind, if any.
    pub fn tick(&self) -> Option<IsrChange> {
        match &mut *self.replica.borrow_mut() {
            Replica::Leader(l) => l.tick(now_ms()),
            _ => None,
        }
    }

    /// The controller answered this leader's AlterPartition (`answered`) for this partition.
    pub fn on_isr_answer(&self, answered: &IsrChange, answer: IsrAnswer) {
        if let Replica::Leader(l) = &mut *self.replica.borrow_mut() {
            let old = l.isr.clone();
            l.on_isr_answer(answered, answer);
            count_isr_change(&self.metrics, &old, &l.isr);
        }
        self.changed.notify(usize::MAX);
    }

    /// The ISR change this leader waits on an answer for, to send again after none came.
    pub fn pending_isr_change(&self) -> Option<IsrChange> {
        match &*self.replica.borrow() {
            Replica::Leader(l) => l.pending_change().cloned(),
            _ => None,
        }
    }

    /// Forgets a proposed ISR change that was not sent (another is still in flight).
    pub fn drop_unsent_isr_change(&self) {
        if let Replica::Leader(l) = &mut *self.replica.borrow_mut() {
            l.drop_unsent();
        }
    }

    /// A follower's record of its leader's high watermark, from a fetch response.
    pub fn set_follower_high_watermark(&self, hw: i64) {
        if let Replica::Follower(f) = &mut *self.replica.borrow_mut() {
            f.high_watermark = hw;
        }
    }

    /// The replica leaves this node (deleted, or moved elsewhere): it neither leads nor
    /// follows from now on, and whoever waits on it looks again.
    pub fn stop_replica(&self) {
        *self.replica.borrow_mut() = Replica::Unknown;
        self.changed.notify(usize::MAX);
    }

    /// The leader and epoch this replica follows, if it is a follower.
    pub fn following(&self) -> Option<Follower> {
        match &*self.replica.borrow() {
            Replica::Follower(f) => Some(f.clone()),
            _ => None,
        }
    }
}
