//! The shard's side of the group coordinator (`group/`): it runs the coordinator's timers,
//! makes commits durable in the group's `__consumer_offsets` partition before the coordinator
//! applies them, and loads a partition's groups from its log when this shard's replica becomes
//! the leader. Everything a group request decides is decided in `group/`.

use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::ResponseError;
use sluice_engine::batch::{BatchBuilder, NewRecord, ATTR_TRANSACTIONAL};
use sluice_engine::Timestamp;

use super::Shard;
use crate::group::offsets_topic::{self, CommitKey, CommitValue, OFFSETS_TOPIC};
use crate::group::{
    consumer, Committed, GroupEffect, JoinRequest, JoinResult, Reply, SyncRequest, SyncResult,
};

/// How long a commit waits for the in-sync replicas of its offsets partition (Kafka's
/// `offsets.commit.timeout.ms` default).
const OFFSETS_COMMIT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often expired sessions are looked for.
const SESSION_SWEEP: Duration = Duration::from_millis(200);

fn err(e: ResponseError) -> i16 {
    e.code()
}

impl Shard {
    /// Starts the session-expiry sweep of this shard's groups.
    pub fn start_group_timers(self: &Rc<Self>) {
        let shard = self.clone();
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(SESSION_SWEEP).await;
                let effects =
                    shard
                        .groups
                        .expire_sessions(Instant::now(), shard.config(), &shard.image());
                shard.run_group_effects(effects);
                shard.expire_share_members();
            }
        })
        .detach();
    }

    /// Arms what the coordinator asked for.
    fn run_group_effects(self: &Rc<Self>, effects: Vec<GroupEffect>) {
        for effect in effects {
            match effect {
                GroupEffect::RebalanceDeadline {
                    group_id,
                    round,
                    after,
                } => {
                    let shard = self.clone();
                    glommio::spawn_local(async move {
                        glommio::timer::sleep(after).await;
                        shard
                            .groups
                            .rebalance_deadline(&group_id, round, Instant::now());
                    })
                    .detach();
                }
            }
        }
    }

    /// KIP-848 ConsumerGroupHeartbeat on the coordinator shard.
    pub fn consumer_heartbeat(
        self: &Rc<Self>,
        group_id: &str,
        req: consumer::HeartbeatRequest,
    ) -> consumer::HeartbeatResult {
        // One name space for all groups: a share group's id is not a consumer group's.
        if self.groups.share_groups.borrow().contains_key(group_id)
            || self.is_streams_group(group_id)
        {
            return consumer::HeartbeatResult {
                error: err(ResponseError::GroupIdNotFound),
                message: Some(format!("Group {group_id} is not a consumer group.")),
                ..Default::default()
            };
        }
        let (result, effects) = self.groups.consumer_heartbeat(
            group_id,
            req,
            Instant::now(),
            self.config(),
            &self.image(),
        );
        self.run_group_effects(effects);
        result
    }

    /// Whether `group_id` is a streams group with members (KIP-1071).
    fn is_streams_group(&self, group_id: &str) -> bool {
        self.groups
            .groups
            .borrow()
            .get(group_id)
            .and_then(|g| g.streams.as_ref())
            .is_some_and(|s| !s.members.is_empty())
    }

    /// StreamsGroupHeartbeat (KIP-1071) on the coordinator shard; `refresh` answers a member
    /// again without a request (after the internal topics it needed were created).
    pub fn streams_heartbeat(
        self: &Rc<Self>,
        group_id: &str,
        req: Option<crate::codec::streams_group::HeartbeatRequest>,
        member_id: &str,
        client_id: String,
        client_host: String,
    ) -> Option<crate::group::streams::Outcome> {
        use crate::codec::streams_group::HeartbeatResponse;
        use crate::group::streams::{Context, Outcome};
        let image = self.image();
        let own = image
            .cluster
            .as_ref()
            .and_then(|c| c.group_configs.get(group_id));
        let config = crate::group::configs::StreamsGroupConfig::resolve(self.config(), own);
        let heartbeat_interval_ms = i32::try_from(config.heartbeat_interval_ms).unwrap_or(i32::MAX);
        let refuse = |message: String| {
            Some(Outcome {
                response: HeartbeatResponse {
                    error_code: err(ResponseError::GroupIdNotFound),
                    error_message: Some(message),
                    member_id: member_id.to_string(),
                    heartbeat_interval_ms,
                    ..Default::default()
                },
                create: Vec::new(),
            })
        };
        if self.groups.share_groups.borrow().contains_key(group_id) {
            return refuse(format!("Group {group_id} is not a streams group."));
        }
        let partitions_of = |t: &str| image.topics.get(t).map(|m| m.shards.len() as i32);
        let cx = Context {
            now: Instant::now(),
            client_id,
            client_host,
            partitions_of: &partitions_of,
            num_standby_replicas: config.num_standby_replicas,
            heartbeat_interval_ms,
            max_size: crate::group::GROUP_MEMBERS_MAX,
        };
        let mut groups = self.groups.groups.borrow_mut();
        let group = groups
            .entry(group_id.to_string())
            .or_insert_with(|| crate::group::Group::new(group_id));
        if !group.members.is_empty()
            || group
                .consumer
                .as_ref()
                .is_some_and(|c| !c.members.is_empty())
        {
            return refuse(format!("Group {group_id} is not a streams group."));
        }
        let s = group.streams.get_or_insert_with(Default::default);
        let before = s.epoch;
        let outcome = match req {
            Some(req) => Some(s.heartbeat(req, &cx)),
            None => s.refresh(member_id, &cx),
        };
        if s.epoch != before {
            tracing::info!(group = %group_id, epoch = s.epoch, members = s.members.len(), state = s.state(), "streams group epoch bumped");
        }
        // A refused join leaves no group behind (nothing to list or describe).
        if s.members.is_empty() && s.topology.is_none() {
            group.streams = None;
            if group.consumer.is_none() && group.offsets.is_empty() && group.pending_txn.is_empty()
            {
                groups.remove(group_id);
            }
        }
        outcome
    }

    /// ShareGroupHeartbeat (KIP-932) on the coordinator shard. A member that left has the
    /// records it holds released on every shard.
    pub fn share_heartbeat(
        self: &Rc<Self>,
        group_id: &str,
        req: crate::group::share::ShareHeartbeat,
    ) -> crate::group::share::ShareHeartbeatResult {
        use crate::group::share::ShareHeartbeatResult;
        let taken = self.groups.groups.borrow().get(group_id).is_some_and(|g| {
            !g.members.is_empty()
                || g.consumer.as_ref().is_some_and(|c| !c.members.is_empty())
                || g.streams.as_ref().is_some_and(|s| !s.members.is_empty())
                || !g.offsets.is_empty()
        });
        if taken {
            return ShareHeartbeatResult {
                error: ResponseError::GroupIdNotFound.code(),
                message: Some(format!("Group {group_id} is not a share group.")),
                ..Default::default()
            };
        }
        let image = self.image();
        let max_size = self.config().group_share_max_size as usize;
        let mut groups = self.groups.share_groups.borrow_mut();
        let group = groups.entry(group_id.to_string()).or_default();
        let before = group.epoch;
        let result = group.heartbeat(req, Instant::now(), max_size, &|t: &str| {
            image.topics.get(t).map(|m| (m.id, m.shards.len() as i32))
        });
        if group.epoch != before {
            tracing::info!(group = %group_id, epoch = group.epoch, members = group.members.len(), "share group epoch bumped");
        }
        drop(groups);
        if let Some(member) = &result.left {
            self.release_share_member(group_id, member);
        }
        result
    }

    /// Releases what `member` of share group `group_id` holds, on every shard, in the
    /// background.
    pub fn release_share_member(self: &Rc<Self>, group_id: &str, member: &str) {
        let shard = self.clone();
        let (group_id, member) = (group_id.to_string(), member.to_string());
        glommio::spawn_local(async move {
            let released: usize = shard
                .invoke_on_all(move |s| {
                    let (g, m) = (group_id.clone(), member.clone());
                    async move { s.share_release(&g, &m) }
                })
                .await
                .into_iter()
                .sum();
            if released > 0 {
                tracing::debug!(
                    released,
                    "records of a share group member that left released"
                );
            }
        })
        .detach();
    }

    /// Share group members past their session timeout leave.
    fn expire_share_members(self: &Rc<Self>) {
        let image = self.image();
        let now = Instant::now();
        let mut gone = Vec::new();
        for (id, group) in self.groups.share_groups.borrow_mut().iter_mut() {
            if group.members.is_empty() {
                continue;
            }
            let own = image.cluster.as_ref().and_then(|c| c.group_configs.get(id));
            let timeout = crate::group::configs::ShareGroupConfig::resolve(self.config(), own)
                .session_timeout_ms;
            let expired = group.expire(now, Duration::from_millis(timeout), &|t: &str| {
                image.topics.get(t).map(|m| (m.id, m.shards.len() as i32))
            });
            for member in expired {
                tracing::info!(group = %id, member = %member, "share group member session expired");
                gone.push((id.clone(), member));
            }
        }
        for (group, member) in gone {
            self.release_share_member(&group, &member);
        }
    }

    /// JoinGroup on the coordinator shard: answered once the join phase completes.
    pub async fn join_group(self: &Rc<Self>, req: JoinRequest) -> JoinResult {
        if self
            .groups
            .share_groups
            .borrow()
            .contains_key(&req.group_id)
            || self.is_streams_group(&req.group_id)
        {
            return JoinResult {
                error: err(ResponseError::InconsistentGroupProtocol),
                member_id: req.member_id,
                generation: -1,
                ..Default::default()
            };
        }
        let (reply, effects) = self
            .groups
            .join(req, Instant::now(), self.config(), &self.image());
        self.run_group_effects(effects);
        match reply {
            Reply::Now(result) => result,
            Reply::Later(rx) => rx.await.unwrap_or_else(|_| JoinResult {
                error: err(ResponseError::RebalanceInProgress),
                generation: -1,
                ..Default::default()
            }),
        }
    }

    /// SyncGroup on the coordinator shard: answered once the leader's assignments are in.
    pub async fn sync_group(
        self: &Rc<Self>,
        group_id: &str,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
    ) -> SyncResult {
        let req = SyncRequest {
            group_id,
            member_id,
            instance_id,
            generation,
            assignments,
        };
        let reply = self.groups.sync(req, Instant::now(), &self.image());
        match reply {
            Reply::Now(result) => result,
            Reply::Later(rx) => rx.await.unwrap_or_else(|_| SyncResult {
                error: err(ResponseError::RebalanceInProgress),
                ..Default::default()
            }),
        }
    }

    pub fn heartbeat(
        &self,
        group_id: &str,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
    ) -> i16 {
        self.groups
            .heartbeat(group_id, member_id, instance_id, generation, Instant::now())
    }

    /// Removes members by id or group instance id; per member an error code.
    pub fn leave_group(
        self: &Rc<Self>,
        group_id: &str,
        leaving: Vec<(String, Option<String>)>,
    ) -> (i16, Vec<i16>) {
        let (codes, effects) = self.groups.leave(
            group_id,
            leaving,
            Instant::now(),
            self.config(),
            &self.image(),
        );
        self.run_group_effects(effects);
        codes
    }

    /// Appends commits (or deletions, `None`) to the group's offsets partition and, once durable,
    /// applies them to the coordinator.
    pub async fn store_offsets(
        self: &Rc<Self>,
        group_id: &str,
        commits: Vec<((String, i32), Option<Committed>)>,
    ) -> Result<(), i16> {
        if commits.is_empty() {
            return Ok(());
        }
        self.append_offsets(group_id, &commits, None).await?;
        self.groups.apply_commits(group_id, commits);
        Ok(())
    }

    /// TxnOffsetCommit: appends `commits` to the group's offsets partition as a transactional
    /// batch of `producer_id` (the transaction's markers reach that partition through
    /// AddOffsetsToTxn); they stay pending until the transaction's marker applies or drops them
    /// ([`Shard::complete_txn_offsets`]), as Kafka's group coordinator does.
    pub async fn store_txn_offsets(
        self: &Rc<Self>,
        group_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        commits: Vec<((String, i32), Committed)>,
    ) -> Result<(), i16> {
        if commits.is_empty() {
            return Ok(());
        }
        let as_records: Vec<_> = commits
            .iter()
            .map(|(k, c)| (k.clone(), Some(c.clone())))
            .collect();
        self.append_offsets(group_id, &as_records, Some((producer_id, producer_epoch)))
            .await?;
        self.groups.add_txn_commits(group_id, producer_id, commits);
        Ok(())
    }

    /// A marker for `producer_id`'s transaction was written to `__consumer_offsets` partition
    /// `index` (led here): the transaction's offsets for the groups of that partition are
    /// applied (commit) or dropped (abort).
    pub fn complete_txn_offsets(&self, index: i32, producer_id: i64, commit: bool) {
        if !self.shared.is_coordinator(index) {
            // Still loading: the load reads up to the high watermark, past this marker.
            return;
        }
        let partitions = self.config().offsets_topic_partitions;
        self.groups
            .complete_txn(index, partitions, producer_id, commit);
    }

    /// Appends offset records for `group_id` (a tombstone for `None`) to its offsets partition
    /// and waits until every in-sync replica has them. With `producer`, the batch is that
    /// producer's transactional batch.
    async fn append_offsets(
        self: &Rc<Self>,
        group_id: &str,
        commits: &[((String, i32), Option<Committed>)],
        producer: Option<(i64, i16)>,
    ) -> Result<(), i16> {
        let partitions = self.config().offsets_topic_partitions;
        let p = offsets_topic::partition_for(group_id, partitions);
        let now = super::wall_ms();
        let records = commits
            .iter()
            .map(|((topic, partition), committed)| {
                let key = offsets_topic::encode_key(&CommitKey {
                    group: group_id.to_string(),
                    topic: topic.clone(),
                    partition: *partition,
                });
                let value = committed.as_ref().map(|c| {
                    offsets_topic::encode_value(&CommitValue {
                        offset: c.offset,
                        leader_epoch: c.leader_epoch,
                        metadata: c.metadata.clone(),
                        commit_timestamp: now,
                    })
                });
                NewRecord {
                    key: Some(key.to_vec()),
                    value: value.map(|v| v.to_vec()),
                    headers: Vec::new(),
                    timestamp: Timestamp(now),
                }
            })
            .collect();
        self.append_to_offsets_partition(p, records, producer, group_id)
            .await
    }

    /// Appends `records` to `__consumer_offsets` partition `p` (led here) and waits until every
    /// in-sync replica has them; with `producer`, as that producer's transactional batch.
    /// `group_id` names the group for the log lines.
    async fn append_to_offsets_partition(
        self: &Rc<Self>,
        p: i32,
        records: Vec<NewRecord>,
        producer: Option<(i64, i16)>,
        group_id: &str,
    ) -> Result<(), i16> {
        let Some(log) = self.partition(OFFSETS_TOPIC, p) else {
            return Err(err(ResponseError::CoordinatorNotAvailable));
        };
        let mut builder = BatchBuilder::new();
        if let Some((producer_id, producer_epoch)) = producer {
            // No sequence: the coordinator writes it, not the producer (as Kafka's does).
            builder = builder
                .producer(producer_id, producer_epoch, -1)
                .attributes(ATTR_TRANSACTIONAL);
        }
        for record in &records {
            builder.push(record);
        }
        let batch = builder.build();
        // Stamped with the offsets partition's leader epoch, as every leader's append is, and
        // acknowledged once every in-sync replica has it (Kafka writes commits with acks=all).
        // Errors are Kafka's for a commit: the client finds the coordinator again or retries.
        let epoch = log
            .check_leader(-1)
            .map_err(|_| err(ResponseError::NotCoordinator))?;
        log.check_acks_all()
            .map_err(|_| err(ResponseError::CoordinatorNotAvailable))?;
        let info = match log.log.append(BytesMut::from(&batch[..]), epoch).await {
            Ok(info) => info,
            Err(e) => {
                tracing::error!(group = %group_id, error = %e, "could not store committed offsets");
                return Err(match crate::errors::log_error_code(&e) {
                    c if c == err(ResponseError::MessageTooLarge)
                        || c == err(ResponseError::RecordListTooLarge) =>
                    {
                        err(ResponseError::InvalidCommitOffsetSize)
                    }
                    c if c == err(ResponseError::KafkaStorageError) => {
                        err(ResponseError::NotCoordinator)
                    }
                    c => c,
                });
            }
        };
        self.notify_appended();
        let code = log
            .wait_acks_all(epoch, info.last_offset.next(), OFFSETS_COMMIT_TIMEOUT)
            .await;
        if code != 0 {
            tracing::debug!(group = %group_id, code, "committed offsets not acknowledged by the in-sync replicas");
            return Err(if code == err(ResponseError::NotLeaderOrFollower) {
                err(ResponseError::NotCoordinator)
            } else {
                err(ResponseError::CoordinatorNotAvailable)
            });
        }
        Ok(())
    }

    /// Rebuilds the groups of `__consumer_offsets` partition `index` from its log, as the
    /// coordinator of the leadership `still_leading` checks: it stops as soon as that
    /// leadership ends, so a load never applies what a newer one has read after it.
    pub async fn load_offsets_of(
        self: &Rc<Self>,
        index: i32,
        partition: &super::Partition,
        still_leading: impl Fn() -> bool,
    ) -> anyhow::Result<usize> {
        let mut loaded = 0usize;
        let mut placed = false;
        let partitions = self.config().offsets_topic_partitions;
        let log = &partition.log;
        let mut cur = log.log_start_offset();
        // Up to the high watermark as it is when the load ends, not as it was when it began:
        // transaction markers written meanwhile are replayed here (their live completion,
        // `complete_txn_offsets`, skips a partition still loading), and the check that ends
        // the loop and the caller's `set_coordinator` run with no await between, so every
        // marker is applied by exactly one of the two.
        loop {
            let end = log.high_watermark();
            if cur >= end {
                break;
            }
            let batches = log.read(cur, 4 << 20, end).await?;
            if batches.is_empty() || !still_leading() {
                break;
            }
            for b in batches {
                cur = b.last_offset.next();
                let replayed = self.groups.replay(index, partitions, &b.bytes);
                loaded += replayed.commits;
                placed |= replayed.placed;
            }
        }
        self.groups.finish_load(index, partitions);
        if !placed {
            loaded += self.take_over_strays(index, &still_leading).await?;
        }
        Ok(loaded)
    }

    /// Takes over the commits of the groups of partition `index` that earlier releases placed
    /// on other partitions, and records that it did (`group/placement.rs`). Their count.
    async fn take_over_strays(
        self: &Rc<Self>,
        index: i32,
        still_leading: &impl Fn() -> bool,
    ) -> anyhow::Result<usize> {
        let Some(strays) = super::placement::read_strays(self, index, still_leading).await else {
            return Ok(0); // no longer leading: the next leadership loads again
        };
        let partitions = self.config().offsets_topic_partitions;
        let mut taken = 0usize;
        for (group_id, commits) in strays {
            let fresh = self.groups.missing_commits(&group_id, commits);
            if fresh.is_empty() || !still_leading() {
                continue;
            }
            let as_records: Vec<_> = fresh
                .iter()
                .map(|(at, c)| (at.clone(), Some(c.clone())))
                .collect();
            self.append_offsets(&group_id, &as_records, None)
                .await
                .map_err(|code| {
                    anyhow::anyhow!(
                        "storing the commits of group {group_id} taken over: error {code}"
                    )
                })?;
            taken += fresh.len();
            let commits = self.groups.adopt_commits(&group_id, fresh);
            tracing::info!(group = %group_id, from = offsets_topic::legacy_partition_for(&group_id, partitions), to = index, commits, "took over the commits of a group an earlier release placed on another offsets partition");
        }
        if !still_leading() {
            return Ok(taken);
        }
        let now = super::wall_ms();
        let record = NewRecord {
            key: Some(offsets_topic::encode_placement_key().to_vec()),
            // Never null: a tombstone would be compacted away, and with it the record.
            value: Some(0i16.to_be_bytes().to_vec()),
            headers: Vec::new(),
            timestamp: Timestamp(now),
        };
        self.append_to_offsets_partition(index, vec![record], None, "")
            .await
            .map_err(|code| anyhow::anyhow!("storing the placement record: error {code}"))?;
        Ok(taken)
    }

    /// Drops the groups of `__consumer_offsets` partition `index` from memory (this broker no
    /// longer coordinates them).
    pub fn unload_groups(&self, index: i32) {
        let partitions = self.config().offsets_topic_partitions;
        let gone = self.groups.unload(index, partitions);
        if gone > 0 {
            tracing::info!(
                shard = self.id,
                partition = index,
                groups = gone,
                "unloaded groups: no longer their coordinator"
            );
        }
    }
}

/// The error for a group request when this broker has no coordinator for the group: in a
/// cluster whose offsets partition for the group is led by another broker, NOT_COORDINATOR (the
/// client asks FindCoordinator again and moves, as with Kafka); led here but still loading,
/// COORDINATOR_LOAD_IN_PROGRESS; else COORDINATOR_NOT_AVAILABLE (the offsets topic is not there
/// yet, or its partition has no leader).
pub fn no_coordinator(shard: &Shard, group_id: &str) -> i16 {
    let p = offsets_topic::partition_for(group_id, shard.config().offsets_topic_partitions);
    let image = shard.image();
    match image.leader_of(OFFSETS_TOPIC, p) {
        Some((info, _)) if info.leader >= 0 && info.leader != shard.config().node_id => {
            ResponseError::NotCoordinator.code()
        }
        // Led here, its groups still loading from the log: the client retries.
        Some((info, _)) if info.leader == shard.config().node_id => {
            ResponseError::CoordinatorLoadInProgress.code()
        }
        _ => ResponseError::CoordinatorNotAvailable.code(),
    }
}

/// The shard that coordinates `group_id`: the owner of its `__consumer_offsets` partition,
/// while this node leads that partition and has loaded its groups.
pub fn coordinator_shard(shard: &Shard, group_id: &str) -> Option<usize> {
    let p = offsets_topic::partition_for(group_id, shard.config().offsets_topic_partitions);
    if !shard.shared.is_coordinator(p) {
        return None;
    }
    shard.image().owner(OFFSETS_TOPIC, p, shard.shared.shards)
}
