//! Streams groups (KIP-1071, `group.protocol=streams`): Kafka Streams instances heartbeat with
//! StreamsGroupHeartbeat, the first to join registers the application's topology, and the
//! coordinator assigns its tasks (one per subtopology and input partition) to the members.
//!
//! The topology is configured against the cluster's topics on every heartbeat: a subtopology has
//! as many tasks as its largest source topic (a repartition topic that does not exist yet takes
//! its count from the subtopologies that write to it, or its declared one); its changelogs need
//! that many partitions. Source topics that are missing leave the group NotReady, with
//! MISSING_SOURCE_TOPICS; internal topics that are missing are returned for the shard to create
//! (MISSING_INTERNAL_TOPICS until they exist), as Kafka's coordinator does; no task is assigned
//! until everything exists.
//!
//! Active tasks move as KIP-848 partitions do (`consumer.rs`): the group epoch rises with every
//! change of members, topology or partition counts, the target assignment is recomputed for
//! it (sticky and balanced over the members, standbys on other processes), and a task is never
//! given to a member while another may still run it: the previous owner revokes first and
//! keeps its epoch until it reports the task gone. Standby tasks go where the target says at
//! once. Warm-up tasks are not used (the assignor places actives directly). Membership is in
//! memory, as for the other groups: after a coordinator moves, members rejoin.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;

use crate::codec::streams_group::{
    status, Assignment, DescribedGroup, DescribedMember, Endpoint, HeartbeatRequest,
    HeartbeatResponse, KeyValue, Status, TaskOffset, Tasks, TopicInfo, Topology,
};

/// A task: a subtopology and a partition.
pub type Task = (String, i32);

/// An internal topic the group needs and the cluster does not have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingTopic {
    pub name: String,
    pub partitions: i32,
    pub replication_factor: i16,
    pub configs: Vec<KeyValue>,
}

#[derive(Clone, Debug)]
pub struct StreamsMember {
    pub id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub process_id: String,
    pub user_endpoint: Option<Endpoint>,
    pub client_tags: Vec<KeyValue>,
    pub topology_epoch: i32,
    pub rebalance_timeout_ms: i32,
    pub epoch: i32,
    /// The active tasks the coordinator last told the member to run.
    pub active: BTreeSet<Task>,
    pub standby: BTreeSet<Task>,
    /// The active tasks the member last reported running.
    pub owned: BTreeSet<Task>,
    /// Active tasks the member was told to let go of and has not reported released.
    pub revoking: BTreeSet<Task>,
    pub task_offsets: Vec<TaskOffset>,
    pub task_end_offsets: Vec<TaskOffset>,
    pub last_heartbeat: Instant,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Target {
    pub active: BTreeSet<Task>,
    pub standby: BTreeSet<Task>,
}

/// What the topology needs of the cluster, as last configured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Configured {
    /// Tasks per subtopology; empty unless every topic exists.
    pub tasks: BTreeMap<String, i32>,
    pub status: Vec<(i8, String)>,
    pub missing: Vec<MissingTopic>,
}

#[derive(Debug, Default)]
pub struct StreamsGroup {
    pub epoch: i32,
    pub assignment_epoch: i32,
    pub topology: Option<Topology>,
    pub configured: Configured,
    pub members: BTreeMap<String, StreamsMember>,
    pub target: BTreeMap<String, Target>,
    /// A member asked every instance of the application to shut down.
    pub shutdown_requested: bool,
}

/// What a heartbeat needs of the broker besides the request.
pub struct Context<'a> {
    pub now: Instant,
    pub client_id: String,
    pub client_host: String,
    /// A topic's partition count, `None` if it does not exist.
    pub partitions_of: &'a dyn Fn(&str) -> Option<i32>,
    pub num_standby_replicas: usize,
    pub heartbeat_interval_ms: i32,
    pub max_size: usize,
}

/// A heartbeat's answer and the internal topics to create.
pub struct Outcome {
    pub response: HeartbeatResponse,
    pub create: Vec<MissingTopic>,
}

fn tasks_of(set: &BTreeSet<Task>) -> Tasks {
    let mut by: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for (s, p) in set {
        by.entry(s.clone()).or_default().push(*p);
    }
    by.into_iter().collect()
}

fn set_of(tasks: Tasks) -> BTreeSet<Task> {
    tasks
        .into_iter()
        .flat_map(|(s, ps)| ps.into_iter().map(move |p| (s.clone(), p)))
        .collect()
}

/// Configures `topology` against the cluster's topics.
pub fn configure(topology: &Topology, partitions_of: &dyn Fn(&str) -> Option<i32>) -> Configured {
    let mut missing_sources: BTreeSet<String> = BTreeSet::new();
    let mut source_counts: BTreeMap<String, i32> = BTreeMap::new();
    for s in &topology.subtopologies {
        let mut n = 0;
        for t in &s.source_topics {
            match partitions_of(t) {
                Some(p) => n = n.max(p),
                None => {
                    missing_sources.insert(t.clone());
                }
            }
        }
        source_counts.insert(s.id.clone(), n);
    }
    // Repartition topics: their actual count, else their declared one, else the largest task
    // count of the subtopologies writing to them, resolved until nothing changes.
    let mut repartition: BTreeMap<String, i32> = BTreeMap::new();
    for s in &topology.subtopologies {
        for t in &s.repartition_source_topics {
            let n = partitions_of(&t.name).unwrap_or(t.partitions.max(0));
            repartition.insert(t.name.clone(), n);
        }
    }
    let mut tasks: BTreeMap<String, i32> = source_counts.clone();
    for _ in 0..=topology.subtopologies.len() {
        let mut changed = false;
        for s in &topology.subtopologies {
            let n = s
                .repartition_source_topics
                .iter()
                .map(|t| repartition[&t.name])
                .chain([source_counts[&s.id]])
                .max()
                .unwrap_or(0);
            if tasks[&s.id] != n {
                tasks.insert(s.id.clone(), n);
                changed = true;
            }
            for sink in &s.repartition_sink_topics {
                if let Some(r) = repartition.get_mut(sink) {
                    if *r == 0 && n > 0 && partitions_of(sink).is_none() {
                        *r = n;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    let mut out = Configured::default();
    if !missing_sources.is_empty() {
        let list: Vec<&str> = missing_sources.iter().map(String::as_str).collect();
        out.status.push((
            status::MISSING_SOURCE_TOPICS,
            format!("Source topics {} are missing.", list.join(", ")),
        ));
        return out;
    }
    let mut wrong: Vec<String> = Vec::new();
    let need =
        |t: &TopicInfo, n: i32, out: &mut Configured, wrong: &mut Vec<String>| match partitions_of(
            &t.name,
        ) {
            None => {
                if !out.missing.iter().any(|m| m.name == t.name) {
                    out.missing.push(MissingTopic {
                        name: t.name.clone(),
                        partitions: n,
                        replication_factor: t.replication_factor,
                        configs: t.configs.clone(),
                    });
                }
            }
            Some(p) if p != n => wrong.push(format!("{} has {p} partitions, not {n}", t.name)),
            Some(_) => {}
        };
    for s in &topology.subtopologies {
        let n = tasks[&s.id];
        for t in &s.repartition_source_topics {
            // Its own count where it has one (declared, or resolved from its writers).
            let want = match repartition[&t.name] {
                0 => n,
                declared => declared,
            };
            need(t, want, &mut out, &mut wrong);
        }
        for t in &s.state_changelog_topics {
            need(t, n, &mut out, &mut wrong);
        }
        for g in &s.copartition_groups {
            let counts: BTreeSet<i32> = g[0]
                .iter()
                .filter_map(|&i| s.source_topics.get(i as usize))
                .filter_map(|t| partitions_of(t))
                .chain(
                    g[2].iter()
                        .filter_map(|&i| s.repartition_source_topics.get(i as usize))
                        .map(|t| repartition[&t.name]),
                )
                .collect();
            if counts.len() > 1 {
                wrong.push(format!(
                    "the copartitioned topics of subtopology {} differ in partitions",
                    s.id
                ));
            }
        }
    }
    if !out.missing.is_empty() {
        let names: Vec<&str> = out.missing.iter().map(|m| m.name.as_str()).collect();
        out.status.push((
            status::MISSING_INTERNAL_TOPICS,
            format!("Internal topics are missing: {}", names.join(", ")),
        ));
    }
    if !wrong.is_empty() {
        out.status.push((
            status::INCORRECTLY_PARTITIONED_TOPICS,
            format!("Topics are incorrectly partitioned: {}", wrong.join("; ")),
        ));
    }
    if out.status.is_empty() {
        out.tasks = tasks;
    }
    out
}

impl StreamsGroup {
    pub fn state(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self.configured.tasks.is_empty() && !self.configured.status.is_empty() {
            "NotReady"
        } else if self.assignment_epoch < self.epoch {
            "Assigning"
        } else if self.members.values().any(|m| {
            let t = self.target.get(&m.id).cloned().unwrap_or_default();
            m.epoch != self.assignment_epoch
                || !m.revoking.is_empty()
                || t.active != m.active
                || t.standby != m.standby
        }) {
            "Reconciling"
        } else {
            "Stable"
        }
    }

    pub fn heartbeat(&mut self, req: HeartbeatRequest, cx: &Context) -> Outcome {
        let fail = |e: ResponseError, message: String| Outcome {
            response: HeartbeatResponse {
                error_code: e.code(),
                error_message: Some(message),
                member_id: req.member_id.clone(),
                member_epoch: req.member_epoch,
                heartbeat_interval_ms: cx.heartbeat_interval_ms,
                ..Default::default()
            },
            create: Vec::new(),
        };
        if req.member_id.is_empty() {
            return fail(
                ResponseError::InvalidRequest,
                "MemberId can't be empty.".into(),
            );
        }
        if req.member_epoch < 0 {
            if req.member_epoch != -1 && req.member_epoch != -2 {
                return fail(
                    ResponseError::InvalidRequest,
                    format!("MemberEpoch {} is not valid.", req.member_epoch),
                );
            }
            if self.members.remove(&req.member_id).is_some() {
                self.target.remove(&req.member_id);
                if self.members.is_empty() {
                    self.shutdown_requested = false;
                }
                self.epoch += 1;
                self.recompute(cx.num_standby_replicas);
            }
            let mut response = HeartbeatResponse {
                member_id: req.member_id,
                member_epoch: req.member_epoch,
                heartbeat_interval_ms: cx.heartbeat_interval_ms,
                ..Default::default()
            };
            response.status = Some(Vec::new());
            return Outcome {
                response,
                create: Vec::new(),
            };
        }
        let mut changed = false;
        if req.member_epoch == 0 {
            let Some(topology) = &req.topology else {
                return fail(
                    ResponseError::InvalidRequest,
                    "Topology must be non-null when joining the group.".into(),
                );
            };
            if topology.subtopologies.is_empty() {
                return fail(
                    ResponseError::StreamsInvalidTopology,
                    "The topology has no subtopologies.".into(),
                );
            }
            if req.process_id.as_deref().unwrap_or("").is_empty() {
                return fail(
                    ResponseError::InvalidRequest,
                    "ProcessId can't be null or empty when joining the group.".into(),
                );
            }
            if !self.members.contains_key(&req.member_id) && self.members.len() >= cx.max_size {
                return fail(
                    ResponseError::GroupMaxSizeReached,
                    format!(
                        "The streams group has reached its maximum size of {}.",
                        cx.max_size
                    ),
                );
            }
            // The first member (or a newer topology, once no member runs the old one) sets the
            // group's topology.
            let newer = self
                .topology
                .as_ref()
                .is_none_or(|t| topology.epoch > t.epoch && self.members.is_empty());
            if newer {
                self.topology = Some(topology.clone());
                changed = true;
            }
            if let Some(instance) = &req.instance_id {
                let old = self
                    .members
                    .values()
                    .find(|m| m.instance_id.as_ref() == Some(instance) && m.id != req.member_id)
                    .map(|m| m.id.clone());
                if let Some(old) = old {
                    self.members.remove(&old);
                    self.target.remove(&old);
                    changed = true;
                }
            }
            if !self.members.contains_key(&req.member_id) {
                changed = true;
            }
            let m = self
                .members
                .entry(req.member_id.clone())
                .or_insert_with(|| StreamsMember {
                    id: req.member_id.clone(),
                    instance_id: None,
                    rack_id: None,
                    client_id: String::new(),
                    client_host: String::new(),
                    process_id: String::new(),
                    user_endpoint: None,
                    client_tags: Vec::new(),
                    topology_epoch: 0,
                    rebalance_timeout_ms: 0,
                    epoch: 0,
                    active: BTreeSet::new(),
                    standby: BTreeSet::new(),
                    owned: BTreeSet::new(),
                    revoking: BTreeSet::new(),
                    task_offsets: Vec::new(),
                    task_end_offsets: Vec::new(),
                    last_heartbeat: cx.now,
                });
            // A member (re)joining runs nothing yet.
            m.epoch = 0;
            m.topology_epoch = topology.epoch;
            m.active.clear();
            m.standby.clear();
            m.owned.clear();
            m.revoking.clear();
        } else {
            let Some(m) = self.members.get(&req.member_id) else {
                return fail(
                    ResponseError::UnknownMemberId,
                    format!("Member {} is not a member of the group.", req.member_id),
                );
            };
            if req.member_epoch > m.epoch {
                return fail(
                    ResponseError::FencedMemberEpoch,
                    format!(
                        "The streams group member has a greater member epoch ({}) than the one known by the group coordinator ({}). The member must abandon all its partitions and rejoin.",
                        req.member_epoch, m.epoch
                    ),
                );
            }
        }
        let m = self
            .members
            .get_mut(&req.member_id)
            .expect("the member exists");
        m.last_heartbeat = cx.now;
        m.client_id = cx.client_id.clone();
        m.client_host = cx.client_host.clone();
        if req.rebalance_timeout_ms >= 0 {
            m.rebalance_timeout_ms = req.rebalance_timeout_ms;
        }
        if let Some(i) = req.instance_id {
            m.instance_id = Some(i);
        }
        if let Some(r) = req.rack_id {
            m.rack_id = Some(r);
        }
        if let Some(p) = req.process_id {
            if p != m.process_id {
                m.process_id = p;
                changed = true;
            }
        }
        if let Some(e) = req.user_endpoint {
            m.user_endpoint = Some(e);
        }
        if let Some(tags) = req.client_tags {
            m.client_tags = tags;
        }
        if let Some(o) = req.task_offsets {
            m.task_offsets = o;
        }
        if let Some(o) = req.task_end_offsets {
            m.task_end_offsets = o;
        }
        if let Some(active) = req.active_tasks {
            m.owned = set_of(active);
        }
        if req.shutdown_application {
            self.shutdown_requested = true;
        }
        self.respond(&req.member_id, changed, cx)
    }

    /// Answers a member again after the broker created the internal topics its last heartbeat
    /// asked for, so it gets its tasks without waiting a heartbeat interval; `None` if it left.
    pub fn refresh(&mut self, member_id: &str, cx: &Context) -> Option<Outcome> {
        if !self.members.contains_key(member_id) {
            return None;
        }
        Some(self.respond(member_id, false, cx))
    }

    /// The end of a heartbeat: the topology configured against the cluster, the target
    /// recomputed if anything `changed`, the member reconciled and answered.
    fn respond(&mut self, member_id: &str, mut changed: bool, cx: &Context) -> Outcome {
        let member_topology_epoch = self.members[member_id].topology_epoch;
        // The topology against the cluster as it is now: a topic created or grown changes the
        // tasks, and with them the assignment.
        let mut create = Vec::new();
        if let Some(topology) = &self.topology {
            let configured = configure(topology, cx.partitions_of);
            create = configured.missing.clone();
            if configured != self.configured {
                if configured.tasks != self.configured.tasks {
                    changed = true;
                }
                self.configured = configured;
            }
        }
        if changed {
            self.epoch += 1;
            self.recompute(cx.num_standby_replicas);
        }
        self.reconcile(member_id);
        let mut statuses: Vec<Status> = self
            .configured
            .status
            .iter()
            .map(|(code, detail)| Status {
                code: *code,
                detail: detail.clone(),
            })
            .collect();
        let group_topology_epoch = self.topology.as_ref().map_or(0, |t| t.epoch);
        if member_topology_epoch < group_topology_epoch {
            statuses.push(Status {
                code: status::STALE_TOPOLOGY,
                detail: format!(
                    "The member's topology epoch {member_topology_epoch} is behind the group's {group_topology_epoch}."
                ),
            });
        }
        if self.shutdown_requested {
            statuses.push(Status {
                code: status::SHUTDOWN_APPLICATION,
                detail: "A member of the group requested the shutdown of the application.".into(),
            });
        }
        let m = &self.members[member_id];
        let response = HeartbeatResponse {
            member_id: m.id.clone(),
            member_epoch: m.epoch,
            heartbeat_interval_ms: cx.heartbeat_interval_ms,
            acceptable_recovery_lag: 10_000,
            task_offset_interval_ms: 60_000,
            status: Some(statuses),
            active_tasks: Some(tasks_of(&m.active)),
            standby_tasks: Some(tasks_of(&m.standby)),
            warmup_tasks: Some(Vec::new()),
            ..Default::default()
        };
        Outcome { response, create }
    }

    /// Moves one member towards its target: revoke active tasks first, keeping the epoch until
    /// the member has let go; then the target's epoch with the free part of its active tasks
    /// (those others still hold follow once released) and all its standbys.
    fn reconcile(&mut self, member_id: &str) {
        let target = self.target.get(member_id).cloned().unwrap_or_default();
        let taken: BTreeSet<Task> = self
            .members
            .values()
            .filter(|m| m.id != member_id)
            .flat_map(|m| m.active.iter().chain(&m.owned).chain(&m.revoking).cloned())
            .collect();
        let assignment_epoch = self.assignment_epoch;
        let m = self.members.get_mut(member_id).expect("member exists");
        let owned = &m.owned;
        m.revoking.retain(|t| owned.contains(t));
        let dropped: BTreeSet<Task> = m.active.difference(&target.active).cloned().collect();
        if !dropped.is_empty() {
            m.active.retain(|t| target.active.contains(t));
            m.revoking.extend(dropped);
        }
        // Standbys never wait: only a task's active copy is exclusive.
        m.standby = target
            .standby
            .iter()
            .filter(|t| !m.active.contains(*t) && !m.revoking.contains(*t))
            .cloned()
            .collect();
        if !m.revoking.is_empty() {
            return;
        }
        let free: Vec<Task> = target
            .active
            .iter()
            .filter(|t| !m.active.contains(*t) && !taken.contains(*t))
            .cloned()
            .collect();
        m.active.extend(free);
        m.epoch = assignment_epoch;
    }

    /// Recomputes the target assignment: every task active on one member, sticky to where it
    /// was and balanced (no member more than one task above another), then standbys on members
    /// of other processes, least loaded first.
    pub fn recompute(&mut self, num_standby_replicas: usize) {
        let all: Vec<Task> = self
            .configured
            .tasks
            .iter()
            .flat_map(|(s, &n)| (0..n).map(move |p| (s.clone(), p)))
            .collect();
        let mut target: BTreeMap<String, Target> = self
            .members
            .keys()
            .map(|id| (id.clone(), Target::default()))
            .collect();
        if !all.is_empty() && !self.members.is_empty() && !self.shutdown_requested {
            let n = self.members.len();
            let low = all.len() / n;
            let mut extra = all.len() % n;
            let valid: BTreeSet<&Task> = all.iter().collect();
            let mut placed: BTreeSet<Task> = BTreeSet::new();
            for id in self.members.keys() {
                let mut kept: Vec<Task> = self
                    .target
                    .get(id)
                    .map(|t| {
                        t.active
                            .iter()
                            .filter(|t| valid.contains(t))
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                let quota = if extra > 0 && kept.len() > low {
                    extra -= 1;
                    low + 1
                } else {
                    low
                };
                kept.truncate(quota);
                for t in kept {
                    placed.insert(t.clone());
                    target.get_mut(id).expect("member").active.insert(t);
                }
            }
            for t in &all {
                if placed.contains(t) {
                    continue;
                }
                let id = self
                    .members
                    .keys()
                    .min_by_key(|id| (target[*id].active.len(), (*id).clone()))
                    .expect("members")
                    .clone();
                target
                    .get_mut(&id)
                    .expect("member")
                    .active
                    .insert(t.clone());
            }
            for t in &all {
                let active_on = target
                    .iter()
                    .find(|(_, x)| x.active.contains(t))
                    .map(|(id, _)| self.members[id].process_id.clone());
                for _ in 0..num_standby_replicas {
                    let previous =
                        |id: &String| self.target.get(id).is_some_and(|x| x.standby.contains(t));
                    let choice = self
                        .members
                        .values()
                        .filter(|m| Some(&m.process_id) != active_on.as_ref())
                        .filter(|m| {
                            // One copy of a task per process.
                            !target.iter().any(|(id, x)| {
                                self.members[id].process_id == m.process_id && x.standby.contains(t)
                            })
                        })
                        .min_by_key(|m| {
                            let x = &target[&m.id];
                            (
                                !previous(&m.id),
                                x.active.len() + x.standby.len(),
                                m.id.clone(),
                            )
                        })
                        .map(|m| m.id.clone());
                    match choice {
                        Some(id) => {
                            target
                                .get_mut(&id)
                                .expect("member")
                                .standby
                                .insert(t.clone());
                        }
                        None => break,
                    }
                }
            }
        }
        self.target = target;
        self.assignment_epoch = self.epoch;
    }

    /// Members silent for longer than `session_timeout` leave; their tasks move to the others.
    pub fn expire(
        &mut self,
        now: Instant,
        session_timeout: Duration,
        num_standby: usize,
    ) -> Vec<String> {
        let expired: Vec<String> = self
            .members
            .values()
            .filter(|m| now.saturating_duration_since(m.last_heartbeat) > session_timeout)
            .map(|m| m.id.clone())
            .collect();
        if expired.is_empty() {
            return expired;
        }
        for id in &expired {
            self.members.remove(id);
            self.target.remove(id);
        }
        if self.members.is_empty() {
            self.shutdown_requested = false;
        }
        self.epoch += 1;
        self.recompute(num_standby);
        expired
    }

    /// Whether `member_id` may commit (or fetch) offsets at `epoch`: a member at its current
    /// epoch, as for consumer groups.
    pub fn check_member(&self, member_id: &str, epoch: i32) -> i16 {
        match self.members.get(member_id) {
            None => ResponseError::UnknownMemberId.code(),
            Some(m) if m.epoch != epoch => ResponseError::StaleMemberEpoch.code(),
            Some(_) => 0,
        }
    }

    pub fn describe(&self, group_id: &str) -> DescribedGroup {
        let assignment = |active: &BTreeSet<Task>, standby: &BTreeSet<Task>| Assignment {
            active: tasks_of(active),
            standby: tasks_of(standby),
            warmup: Vec::new(),
        };
        DescribedGroup {
            group_id: group_id.to_string(),
            group_state: self.state().to_string(),
            group_epoch: self.epoch,
            assignment_epoch: self.assignment_epoch,
            topology: self.topology.clone(),
            members: self
                .members
                .values()
                .map(|m| {
                    let t = self.target.get(&m.id).cloned().unwrap_or_default();
                    DescribedMember {
                        member_id: m.id.clone(),
                        member_epoch: m.epoch,
                        instance_id: m.instance_id.clone(),
                        rack_id: m.rack_id.clone(),
                        client_id: m.client_id.clone(),
                        client_host: m.client_host.clone(),
                        topology_epoch: m.topology_epoch,
                        process_id: m.process_id.clone(),
                        user_endpoint: m.user_endpoint.clone(),
                        client_tags: m.client_tags.clone(),
                        task_offsets: m.task_offsets.clone(),
                        task_end_offsets: m.task_end_offsets.clone(),
                        assignment: assignment(&m.active, &m.standby),
                        target_assignment: assignment(&t.active, &t.standby),
                    }
                })
                .collect(),
            authorized_operations: i32::MIN,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::streams_group::Subtopology;

    fn word_count() -> Topology {
        // Subtopology 0 reads `words` and writes the repartition topic; 1 reads it and counts.
        Topology {
            epoch: 1,
            subtopologies: vec![
                Subtopology {
                    id: "0".into(),
                    source_topics: vec!["words".into()],
                    repartition_sink_topics: vec!["app-rep".into()],
                    ..Default::default()
                },
                Subtopology {
                    id: "1".into(),
                    repartition_source_topics: vec![TopicInfo {
                        name: "app-rep".into(),
                        ..Default::default()
                    }],
                    state_changelog_topics: vec![TopicInfo {
                        name: "app-counts-changelog".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            ],
        }
    }

    fn join(member: &str, process: &str) -> HeartbeatRequest {
        HeartbeatRequest {
            group_id: "app".into(),
            member_id: member.into(),
            member_epoch: 0,
            rebalance_timeout_ms: 30_000,
            topology: Some(word_count()),
            active_tasks: Some(Vec::new()),
            standby_tasks: Some(Vec::new()),
            warmup_tasks: Some(Vec::new()),
            process_id: Some(process.into()),
            ..Default::default()
        }
    }

    fn beat(member: &str, epoch: i32, owned: &Tasks) -> HeartbeatRequest {
        HeartbeatRequest {
            group_id: "app".into(),
            member_id: member.into(),
            member_epoch: epoch,
            active_tasks: Some(owned.clone()),
            ..Default::default()
        }
    }

    fn run(
        g: &mut StreamsGroup,
        req: HeartbeatRequest,
        topics: &BTreeMap<String, i32>,
        standbys: usize,
    ) -> Outcome {
        let partitions_of = |t: &str| topics.get(t).copied();
        let cx = Context {
            now: Instant::now(),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            partitions_of: &partitions_of,
            num_standby_replicas: standbys,
            heartbeat_interval_ms: 5000,
            max_size: 100,
        };
        g.heartbeat(req, &cx)
    }

    fn topics(counts: &[(&str, i32)]) -> BTreeMap<String, i32> {
        counts.iter().map(|&(t, n)| (t.to_string(), n)).collect()
    }

    fn count(tasks: &Tasks) -> usize {
        tasks.iter().map(|(_, p)| p.len()).sum()
    }

    #[test]
    fn missing_sources_then_internal_topics_then_tasks() {
        let mut g = StreamsGroup::default();
        let mut topics = BTreeMap::new();
        let out = run(&mut g, join("a", "p1"), &topics, 0);
        let st = out.response.status.unwrap();
        assert_eq!(st[0].code, status::MISSING_SOURCE_TOPICS);
        assert!(st[0].detail.contains("words"));
        assert!(out.create.is_empty());
        assert_eq!(g.state(), "NotReady");
        topics.insert("words".to_string(), 4);
        let out = run(
            &mut g,
            beat("a", out.response.member_epoch, &vec![]),
            &topics,
            0,
        );
        assert_eq!(
            out.response.status.unwrap()[0].code,
            status::MISSING_INTERNAL_TOPICS
        );
        // The repartition topic takes its writers' 4 tasks; the changelog its reader's.
        let made: Vec<(String, i32)> = out
            .create
            .iter()
            .map(|m| (m.name.clone(), m.partitions))
            .collect();
        assert_eq!(
            made,
            [
                ("app-rep".to_string(), 4),
                ("app-counts-changelog".to_string(), 4)
            ]
        );
        assert_eq!(count(out.response.active_tasks.as_ref().unwrap()), 0);
        for (name, n) in made {
            topics.insert(name, n);
        }
        let out = run(
            &mut g,
            beat("a", out.response.member_epoch, &vec![]),
            &topics,
            0,
        );
        assert!(out.create.is_empty());
        assert_eq!(out.response.status, Some(vec![]));
        assert_eq!(count(out.response.active_tasks.as_ref().unwrap()), 8);
        assert_eq!(g.state(), "Stable");
    }

    /// A repartition topic keeps the count the application declared for it; a changelog has one
    /// partition per task of its subtopology.
    #[test]
    fn declared_repartition_counts_are_kept() {
        let mut t = word_count();
        t.subtopologies[1].source_topics = vec!["other".into()];
        t.subtopologies[1].repartition_source_topics[0].partitions = 3;
        let topics = topics(&[("words", 4), ("other", 6)]);
        let c = configure(&t, &|x: &str| topics.get(x).copied());
        let made: Vec<(&str, i32)> = c
            .missing
            .iter()
            .map(|m| (m.name.as_str(), m.partitions))
            .collect();
        assert_eq!(made, [("app-rep", 3), ("app-counts-changelog", 6)]);
        assert!(
            c.tasks.is_empty(),
            "nothing is assigned while topics are missing"
        );
    }

    /// A task moves to a new member only after its previous owner reported it released.
    #[test]
    fn tasks_are_revoked_before_they_move() {
        let mut g = StreamsGroup::default();
        let topics = topics(&[("words", 2), ("app-rep", 2), ("app-counts-changelog", 2)]);
        let a = run(&mut g, join("a", "p1"), &topics, 0).response;
        let a_tasks = a.active_tasks.clone().unwrap();
        assert_eq!(count(&a_tasks), 4);
        let b = run(&mut g, join("b", "p2"), &topics, 0).response;
        // Everything is still a's: b waits, at the new epoch, with nothing.
        assert_eq!(count(b.active_tasks.as_ref().unwrap()), 0);
        assert_eq!(b.member_epoch, g.epoch);
        // a hears it must give up two; it keeps its epoch until it has.
        let a2 = run(&mut g, beat("a", a.member_epoch, &a_tasks), &topics, 0).response;
        let kept = a2.active_tasks.clone().unwrap();
        assert_eq!(count(&kept), 2);
        assert_eq!(a2.member_epoch, a.member_epoch);
        let b2 = run(&mut g, beat("b", b.member_epoch, &vec![]), &topics, 0).response;
        assert_eq!(
            count(b2.active_tasks.as_ref().unwrap()),
            0,
            "a still runs them"
        );
        let a3 = run(&mut g, beat("a", a2.member_epoch, &kept), &topics, 0).response;
        assert_eq!(a3.member_epoch, g.epoch);
        let b3 = run(&mut g, beat("b", b2.member_epoch, &vec![]), &topics, 0).response;
        let given = set_of(b3.active_tasks.unwrap());
        assert_eq!(given.len(), 2);
        assert!(given.is_disjoint(&set_of(kept)));
        assert_eq!(g.state(), "Stable");
    }

    #[test]
    fn standbys_go_to_other_processes() {
        let mut g = StreamsGroup::default();
        let topics = topics(&[("words", 3), ("app-rep", 3), ("app-counts-changelog", 3)]);
        for (m, p) in [("a", "p1"), ("b", "p1"), ("c", "p2")] {
            run(&mut g, join(m, p), &topics, 1);
        }
        let process = |id: &str| g.members[id].process_id.clone();
        let mut standbys = 0;
        for (id, t) in &g.target {
            for task in &t.standby {
                standbys += 1;
                let active = g
                    .target
                    .iter()
                    .find(|(_, x)| x.active.contains(task))
                    .unwrap()
                    .0;
                assert_ne!(process(id), process(active), "{task:?}");
            }
        }
        assert_eq!(standbys, 6);
        let actives: usize = g.target.values().map(|t| t.active.len()).sum();
        assert_eq!(actives, 6);
        assert!(g.target.values().all(|t| t.active.len() == 2));
    }

    #[test]
    fn expired_and_leaving_members_hand_their_tasks_on() {
        let mut g = StreamsGroup::default();
        let topics = topics(&[("words", 2), ("app-rep", 2), ("app-counts-changelog", 2)]);
        run(&mut g, join("a", "p1"), &topics, 0);
        run(&mut g, join("b", "p2"), &topics, 0);
        let mut leave = beat("a", -1, &vec![]);
        leave.active_tasks = None;
        run(&mut g, leave, &topics, 0);
        assert_eq!(g.target["b"].active.len(), 4);
        let later = Instant::now() + Duration::from_secs(60);
        assert_eq!(g.expire(later, Duration::from_secs(45), 0), ["b"]);
        assert_eq!(g.state(), "Empty");
        assert_eq!(
            run(&mut g, beat("b", 3, &vec![]), &topics, 0)
                .response
                .error_code,
            ResponseError::UnknownMemberId.code()
        );
    }
}
