//! `sluice group` against a real broker: a consumer group made by a small group member of the
//! test's own (JoinGroup with the member-id round trip, SyncGroup assigning itself every
//! partition, OffsetCommit, heartbeats, LeaveGroup) and, when `kcat` is installed, by
//! `kcat -G`; then `group list`, `describe`, `reset-offsets` and `delete` as processes.
//!
//! The member speaks the Kafka protocol through the CLI's own blocking client, compiled into
//! this test from `src/cli/client.rs`.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    FindCoordinatorRequest, GroupId, HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest,
    OffsetCommitRequest, SyncGroupRequest,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

mod common;
use common::{now_ms, parse_produce_summary, Broker};

#[allow(dead_code)]
#[path = "../src/cli/client.rs"]
mod client;
use client::{str_bytes, topic_name, Client};

const JOIN_GROUP_VERSION: i16 = 5;
const SYNC_GROUP_VERSION: i16 = 3;
const HEARTBEAT_VERSION: i16 = 3;
const LEAVE_GROUP_VERSION: i16 = 3;
const OFFSET_COMMIT_VERSION: i16 = 7;
const FIND_COORDINATOR_VERSION: i16 = 3;
const SESSION_TIMEOUT_MS: i32 = 30_000;
const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);
/// What the broker is started with, so that a new group forms quickly.
const INITIAL_REBALANCE_DELAY_MS: &str = "300";
/// How long a group may take to reach the state a test waits for.
const STATE_TIMEOUT: Duration = Duration::from_secs(10);
/// The client id the CLI's client sends, and so what `describe` shows for the member.
const CLIENT_ID: &str = "sluice-cli";

/// ConsumerProtocolSubscription v0: the topics, no user data.
fn subscription(topics: &[&str]) -> Bytes {
    let mut b = 0i16.to_be_bytes().to_vec();
    b.extend_from_slice(&(topics.len() as i32).to_be_bytes());
    for t in topics {
        b.extend_from_slice(&(t.len() as i16).to_be_bytes());
        b.extend_from_slice(t.as_bytes());
    }
    b.extend_from_slice(&(-1i32).to_be_bytes());
    Bytes::from(b)
}

/// ConsumerProtocolAssignment v3 with some user data, which `describe` must skip.
fn assignment(topic: &str, partitions: &[i32]) -> Bytes {
    let mut b = 3i16.to_be_bytes().to_vec();
    b.extend_from_slice(&1i32.to_be_bytes());
    b.extend_from_slice(&(topic.len() as i16).to_be_bytes());
    b.extend_from_slice(topic.as_bytes());
    b.extend_from_slice(&(partitions.len() as i32).to_be_bytes());
    for p in partitions {
        b.extend_from_slice(&p.to_be_bytes());
    }
    b.extend_from_slice(&2i32.to_be_bytes());
    b.extend_from_slice(b"ud");
    Bytes::from(b)
}

/// A consumer group member that assigns itself every partition of one topic and heartbeats on
/// a thread of its own until it leaves.
struct Member {
    address: String,
    group: String,
    id: String,
    generation: i32,
    stop: mpsc::Sender<()>,
    heartbeats: Option<JoinHandle<(Client, Vec<i16>)>>,
}

impl Member {
    fn join(address: &str, group: &str, topic: &str, partitions: &[i32]) -> Member {
        let mut c = Client::connect(address).expect("connect");

        // The coordinator: this single broker.
        let response = c
            .send_at(
                &FindCoordinatorRequest::default()
                    .with_key(str_bytes(group))
                    .with_key_type(0),
                FIND_COORDINATOR_VERSION,
            )
            .unwrap();
        assert_eq!(response.error_code, 0, "{response:?}");
        assert_eq!(
            format!("{}:{}", response.host.as_str(), response.port),
            address
        );

        let join = |c: &mut Client, member_id: &str| {
            let request = JoinGroupRequest::default()
                .with_group_id(GroupId(str_bytes(group)))
                .with_session_timeout_ms(SESSION_TIMEOUT_MS)
                .with_rebalance_timeout_ms(SESSION_TIMEOUT_MS)
                .with_member_id(str_bytes(member_id))
                .with_protocol_type(str_bytes("consumer"))
                .with_protocols(vec![JoinGroupRequestProtocol::default()
                    .with_name(str_bytes("range"))
                    .with_metadata(subscription(&[topic]))]);
            c.send_at(&request, JOIN_GROUP_VERSION).unwrap()
        };
        // KIP-394: the first JoinGroup only hands out the member id.
        let first = join(&mut c, "");
        assert_eq!(
            first.error_code,
            ResponseError::MemberIdRequired.code(),
            "{first:?}"
        );
        let id = first.member_id.to_string();
        assert!(id.starts_with(CLIENT_ID), "{id}");
        let joined = join(&mut c, &id);
        assert_eq!(joined.error_code, 0, "{joined:?}");
        assert_eq!(joined.member_id.as_str(), id);
        assert_eq!(joined.leader.as_str(), id, "the only member leads");
        assert_eq!(joined.protocol_name.as_deref(), Some("range"));
        assert_eq!(joined.members.len(), 1);
        assert_eq!(joined.members[0].metadata, subscription(&[topic]));
        let generation = joined.generation_id;

        let mine = assignment(topic, partitions);
        let synced = c
            .send_at(
                &SyncGroupRequest::default()
                    .with_group_id(GroupId(str_bytes(group)))
                    .with_generation_id(generation)
                    .with_member_id(str_bytes(&id))
                    .with_assignments(vec![SyncGroupRequestAssignment::default()
                        .with_member_id(str_bytes(&id))
                        .with_assignment(mine.clone())]),
                SYNC_GROUP_VERSION,
            )
            .unwrap();
        assert_eq!(synced.error_code, 0, "{synced:?}");
        assert_eq!(synced.assignment, mine);

        let (stop, stopped) = mpsc::channel::<()>();
        let heartbeat = HeartbeatRequest::default()
            .with_group_id(GroupId(str_bytes(group)))
            .with_generation_id(generation)
            .with_member_id(str_bytes(&id));
        let heartbeats = std::thread::spawn(move || {
            let mut errors = Vec::new();
            while let Err(mpsc::RecvTimeoutError::Timeout) =
                stopped.recv_timeout(HEARTBEAT_INTERVAL)
            {
                let response = c.send_at(&heartbeat, HEARTBEAT_VERSION).unwrap();
                if response.error_code != 0 {
                    errors.push(response.error_code);
                }
            }
            (c, errors)
        });
        Member {
            address: address.to_string(),
            group: group.to_string(),
            id,
            generation,
            stop,
            heartbeats: Some(heartbeats),
        }
    }

    /// Commits offsets as this member, on a connection of its own.
    fn commit(&self, topic: &str, offsets: &[(i32, i64)]) {
        let mut c = Client::connect(&self.address).unwrap();
        let response = c
            .send_at(
                &OffsetCommitRequest::default()
                    .with_group_id(GroupId(str_bytes(&self.group)))
                    .with_generation_id_or_member_epoch(self.generation)
                    .with_member_id(str_bytes(&self.id))
                    .with_topics(vec![OffsetCommitRequestTopic::default()
                        .with_name(topic_name(topic))
                        .with_partitions(
                            offsets
                                .iter()
                                .map(|&(p, o)| {
                                    OffsetCommitRequestPartition::default()
                                        .with_partition_index(p)
                                        .with_committed_offset(o)
                                        .with_committed_leader_epoch(-1)
                                        .with_committed_metadata(Some(StrBytes::default()))
                                })
                                .collect(),
                        )]),
                OFFSET_COMMIT_VERSION,
            )
            .unwrap();
        for t in &response.topics {
            for p in &t.partitions {
                assert_eq!(p.error_code, 0, "{response:?}");
            }
        }
    }

    /// Stops heartbeating and leaves the group; asserts that no heartbeat failed.
    fn leave(mut self) {
        let (mut c, errors) = self.stop_heartbeats();
        assert!(errors.is_empty(), "heartbeats failed: {errors:?}");
        let response = c
            .send_at(
                &LeaveGroupRequest::default()
                    .with_group_id(GroupId(str_bytes(&self.group)))
                    .with_members(vec![
                        MemberIdentity::default().with_member_id(str_bytes(&self.id))
                    ]),
                LEAVE_GROUP_VERSION,
            )
            .unwrap();
        assert_eq!(response.error_code, 0, "{response:?}");
        assert_eq!(response.members.len(), 1);
        assert_eq!(response.members[0].error_code, 0, "{response:?}");
    }

    fn stop_heartbeats(&mut self) -> (Client, Vec<i16>) {
        let _ = self.stop.send(());
        self.heartbeats
            .take()
            .expect("heartbeats run until the member leaves")
            .join()
            .expect("the heartbeat thread")
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if self.heartbeats.is_some() {
            let _ = self.stop.send(());
        }
    }
}

/// `sluice group describe` output, split into its parts.
#[derive(Debug)]
struct Described {
    fields: BTreeMap<String, String>,
    /// MEMBER-ID INSTANCE-ID CLIENT-ID HOST ASSIGNMENT
    members: Vec<Vec<String>>,
    /// TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG MEMBER-ID HOST CLIENT-ID, by partition.
    offsets: BTreeMap<i32, Vec<String>>,
}

impl Described {
    fn field(&self, name: &str) -> &str {
        self.fields
            .get(name)
            .unwrap_or_else(|| panic!("no {name:?} in {self:?}"))
    }

    /// Committed offset of each partition of `events`, `None` for "-".
    fn committed(&self) -> BTreeMap<i32, Option<i64>> {
        self.offsets
            .iter()
            .map(|(&p, row)| (p, row[2].parse().ok()))
            .collect()
    }
}

fn parse_describe(out: &str) -> Described {
    let mut fields = BTreeMap::new();
    let mut members = Vec::new();
    let mut offsets = BTreeMap::new();
    let mut table: Option<&str> = None;
    for line in out.lines() {
        if line.is_empty() {
            table = None;
            continue;
        }
        let cells: Vec<String> = line.split_whitespace().map(String::from).collect();
        match table {
            None if cells[0] == "MEMBER-ID" => {
                assert_eq!(
                    cells,
                    [
                        "MEMBER-ID",
                        "INSTANCE-ID",
                        "CLIENT-ID",
                        "HOST",
                        "ASSIGNMENT"
                    ]
                );
                table = Some("members");
            }
            None if cells[0] == "TOPIC" => {
                assert_eq!(
                    cells,
                    [
                        "TOPIC",
                        "PARTITION",
                        "CURRENT-OFFSET",
                        "LOG-END-OFFSET",
                        "LAG",
                        "MEMBER-ID",
                        "HOST",
                        "CLIENT-ID"
                    ]
                );
                table = Some("offsets");
            }
            None => {
                let (k, v) = line.split_once(": ").expect("a `Key: value` line");
                fields.insert(k.to_string(), v.to_string());
            }
            Some("members") => {
                assert_eq!(cells.len(), 5, "{line}");
                members.push(cells);
            }
            Some(_) => {
                assert_eq!(cells.len(), 8, "{line}");
                assert_eq!(cells[0], "events", "{line}");
                offsets.insert(cells[1].parse().unwrap(), cells);
            }
        }
    }
    Described {
        fields,
        members,
        offsets,
    }
}

/// Describes `group` until it is in `state`; a few seconds at most.
fn wait_for_state(broker: &Broker, group: &str, state: &str) -> Described {
    let deadline = Instant::now() + STATE_TIMEOUT;
    loop {
        let d = parse_describe(&broker.ok(&["group", "describe", group], ""));
        if d.field("State") == state {
            return d;
        }
        assert!(
            Instant::now() < deadline,
            "group {group} is still {} after {STATE_TIMEOUT:?}, not {state}",
            d.field("State")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The rows of a plan or list table, header checked and left out.
fn parse_table(out: &str, header: &[&str]) -> Vec<Vec<String>> {
    let mut lines = out.lines();
    let first: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(first, header, "{out}");
    lines
        .take_while(|l| !l.is_empty() && !l.starts_with("Committed "))
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

const PLAN_HEADER: &[&str] = &["TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"];
const LIST_HEADER: &[&str] = &["GROUP", "STATE", "PROTOCOL-TYPE"];

/// `reset-offsets` plan rows as (partition, current, new).
fn parse_plan(out: &str) -> Vec<(i32, Option<i64>, i64)> {
    parse_table(out, PLAN_HEADER)
        .into_iter()
        .map(|r| {
            assert_eq!(r.len(), 4, "{r:?}");
            assert_eq!(r[0], "events");
            (
                r[1].parse().unwrap(),
                r[2].parse().ok(),
                r[3].parse().unwrap(),
            )
        })
        .collect()
}

fn listed(broker: &Broker, args: &[&str]) -> BTreeMap<String, (String, String)> {
    let out = broker.run(args, "");
    assert!(out.success, "{}", out.stderr);
    if out.stdout.is_empty() {
        assert!(out.stderr.contains("No groups."), "{}", out.stderr);
        return BTreeMap::new();
    }
    parse_table(&out.stdout, LIST_HEADER)
        .into_iter()
        .map(|r| (r[0].clone(), (r[1].clone(), r[2].clone())))
        .collect()
}

#[test]
fn group_subcommands_against_a_real_broker() {
    let broker = Broker::start_with(&[
        "--group-initial-rebalance-delay-ms",
        INITIAL_REBALANCE_DELAY_MS,
    ]);
    let address = broker.address();
    for args in [
        &["group", "--help"][..],
        &["group", "describe", "--help"],
        &["group", "reset-offsets", "--help"],
    ] {
        let out = broker.ok(args, "");
        assert!(out.contains("Usage: sluice"), "{out}");
    }
    assert!(listed(&broker, &["group", "list"]).is_empty());

    broker.ok(&["topic", "create", "events", "--partitions", "3"], "");
    let input: String = (0..300).map(|i| format!("record {i}\n")).collect();
    let produced = broker.ok(&["produce", "events"], &input);
    let mut ends: BTreeMap<i32, i64> = parse_produce_summary(&produced)
        .into_iter()
        .map(|(p, (count, _, _))| (p, count as i64))
        .collect();
    assert_eq!(ends.len(), 3, "{produced}");
    assert_eq!(ends.values().sum::<i64>(), 300);

    broker.fails(
        &["group", "describe", "g1"],
        "",
        "group \"g1\": GROUP_ID_NOT_FOUND",
    );

    // A member of group g1 owning every partition, with offsets committed.
    let member = Member::join(&address, "g1", "events", &[0, 1, 2]);
    let committed: BTreeMap<i32, i64> = BTreeMap::from([(0, 10), (1, 20), (2, 30)]);
    member.commit(
        "events",
        &committed.iter().map(|(&p, &o)| (p, o)).collect::<Vec<_>>(),
    );

    let groups = listed(&broker, &["group", "list"]);
    assert_eq!(
        groups.get("g1"),
        Some(&("Stable".to_string(), "consumer".to_string())),
        "{groups:?}"
    );
    assert!(listed(&broker, &["group", "list", "--state", "empty"]).is_empty());
    assert!(listed(&broker, &["group", "list", "--state", "stable"]).contains_key("g1"));

    let d = parse_describe(&broker.ok(&["group", "describe", "g1"], ""));
    assert_eq!(d.field("Group"), "g1");
    assert_eq!(d.field("State"), "Stable");
    assert_eq!(d.field("Protocol type"), "consumer");
    assert_eq!(d.field("Protocol"), "range");
    assert_eq!(d.field("Members"), "1");
    assert_eq!(
        d.members,
        vec![vec![
            member.id.clone(),
            "-".into(),
            CLIENT_ID.into(),
            "/127.0.0.1".into(),
            "events:0,1,2".into()
        ]]
    );
    assert_eq!(d.offsets.len(), 3, "{d:?}");
    for (p, row) in &d.offsets {
        let (current, end) = (committed[p], ends[p]);
        assert_eq!(
            row[2..],
            [
                current.to_string(),
                end.to_string(),
                (end - current).to_string(),
                member.id.clone(),
                "/127.0.0.1".into(),
                CLIENT_ID.into()
            ],
            "partition {p}: {row:?}"
        );
    }

    // A dry run prints the plan, says nothing was committed, and warns of the member.
    let dry = broker.run(
        &[
            "group",
            "reset-offsets",
            "g1",
            "--topic",
            "events",
            "--to-earliest",
        ],
        "",
    );
    assert!(dry.success, "{}", dry.stderr);
    assert_eq!(
        parse_plan(&dry.stdout),
        vec![(0, Some(10), 0), (1, Some(20), 0), (2, Some(30), 0)]
    );
    assert!(dry.stderr.contains("Dry run"), "{}", dry.stderr);
    assert!(dry.stderr.contains("1 active member"), "{}", dry.stderr);
    let d = parse_describe(&broker.ok(&["group", "describe", "g1"], ""));
    assert_eq!(
        d.committed(),
        BTreeMap::from([(0, Some(10)), (1, Some(20)), (2, Some(30))])
    );

    // Neither --execute nor delete while the member is active.
    let refused = broker.fails(
        &[
            "group",
            "reset-offsets",
            "g1",
            "--topic",
            "events",
            "--to-earliest",
            "--execute",
        ],
        "",
        "committing offsets for group \"g1\": UNKNOWN_MEMBER_ID (25) for all 3 partitions",
    );
    assert!(
        refused.contains("the group has 1 active member (state Stable)"),
        "{refused}"
    );
    let refused = broker.fails(
        &["group", "delete", "g1"],
        "",
        "deleting group \"g1\": NON_EMPTY_GROUP (68)",
    );
    assert!(
        refused.contains("the group has 1 active member (state Stable)"),
        "{refused}"
    );
    let d = parse_describe(&broker.ok(&["group", "describe", "g1"], ""));
    assert_eq!(d.field("State"), "Stable");
    assert_eq!(
        d.committed(),
        BTreeMap::from([(0, Some(10)), (1, Some(20)), (2, Some(30))])
    );

    // Once the member has left, the group is Empty and keeps its offsets. (Kafka empties it
    // at once; this broker first spends its fallback rebalance timeout in PreparingRebalance,
    // see `a_group_is_empty_as_soon_as_its_last_member_leaves`, so wait for it here.)
    member.leave();
    let d = wait_for_state(&broker, "g1", "Empty");
    assert_eq!(d.field("Members"), "0");
    assert!(d.members.is_empty());
    for (p, row) in &d.offsets {
        assert_eq!(row[2], committed[p].to_string());
        assert_eq!(row[5..], ["-", "-", "-"], "no owner: {row:?}");
    }
    assert_eq!(
        listed(&broker, &["group", "list"]).get("g1"),
        Some(&("Empty".to_string(), "consumer".to_string()))
    );

    // Resets, each checked with describe.
    let reset = |args: &[&str]| -> Vec<(i32, Option<i64>, i64)> {
        let mut all = vec!["group", "reset-offsets", "g1"];
        all.extend_from_slice(args);
        all.push("--execute");
        let out = broker.ok(&all, "");
        assert!(
            out.contains("Committed new offsets of ") && out.contains(" for group g1."),
            "{out}"
        );
        parse_plan(&out)
    };
    let check = |expected: &[(i32, i64)], ends: &BTreeMap<i32, i64>| {
        let d = parse_describe(&broker.ok(&["group", "describe", "g1"], ""));
        assert_eq!(d.field("State"), "Empty");
        for &(p, offset) in expected {
            let row = &d.offsets[&p];
            assert_eq!(
                row[2..5],
                [
                    offset.to_string(),
                    ends[&p].to_string(),
                    (ends[&p] - offset).to_string()
                ],
                "partition {p}: {row:?}"
            );
        }
    };

    let plan = reset(&["--topic", "events", "--to-earliest"]);
    assert_eq!(
        plan,
        vec![(0, Some(10), 0), (1, Some(20), 0), (2, Some(30), 0)]
    );
    check(&[(0, 0), (1, 0), (2, 0)], &ends);

    let plan = reset(&["--topic", "events", "--to-latest"]);
    assert_eq!(
        plan,
        vec![
            (0, Some(0), ends[&0]),
            (1, Some(0), ends[&1]),
            (2, Some(0), ends[&2])
        ]
    );
    check(&[(0, ends[&0]), (1, ends[&1]), (2, ends[&2])], &ends);

    // One partition only; the others keep their offsets.
    let plan = reset(&["--topic", "events:1", "--to-offset", "5"]);
    assert_eq!(plan, vec![(1, Some(ends[&1]), 5)]);
    check(&[(0, ends[&0]), (1, 5), (2, ends[&2])], &ends);

    // An offset beyond the log is moved to its end, with a note.
    let out = broker.run(
        &[
            "group",
            "reset-offsets",
            "g1",
            "--topic",
            "events:0,2",
            "--to-offset",
            "100000",
            "--execute",
        ],
        "",
    );
    assert!(out.success, "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("100000 is after the log end offset {}", ends[&0])),
        "{}",
        out.stderr
    );
    assert_eq!(
        parse_plan(&out.stdout),
        vec![(0, Some(ends[&0]), ends[&0]), (2, Some(ends[&2]), ends[&2])]
    );

    // Shifts, kept within the log.
    let plan = reset(&["--all-topics", "--shift-by", "-30"]);
    assert_eq!(
        plan,
        vec![
            (0, Some(ends[&0]), ends[&0] - 30),
            (1, Some(5), 0),
            (2, Some(ends[&2]), ends[&2] - 30)
        ]
    );
    check(&[(0, ends[&0] - 30), (1, 0), (2, ends[&2] - 30)], &ends);
    let plan = reset(&["--topic", "events", "--shift-by", "7"]);
    assert_eq!(
        plan,
        vec![
            (0, Some(ends[&0] - 30), ends[&0] - 23),
            (1, Some(0), 7),
            (2, Some(ends[&2] - 30), ends[&2] - 23)
        ]
    );
    check(&[(0, ends[&0] - 23), (1, 7), (2, ends[&2] - 23)], &ends);

    // By time: records produced after `middle` start at the old ends.
    std::thread::sleep(Duration::from_millis(20));
    let middle = now_ms();
    std::thread::sleep(Duration::from_millis(20));
    let late: String = (0..30).map(|i| format!("late {i}\n")).collect();
    let produced = broker.ok(&["produce", "events"], &late);
    let old_ends = ends.clone();
    for (p, (count, first, _)) in parse_produce_summary(&produced) {
        assert_eq!(first, ends[&p], "{produced}");
        *ends.get_mut(&p).unwrap() += count as i64;
    }
    assert_eq!(ends.values().sum::<i64>(), 330);
    let middle = middle.to_string();
    reset(&["--topic", "events", "--to-datetime", &middle]);
    check(
        &[(0, old_ends[&0]), (1, old_ends[&1]), (2, old_ends[&2])],
        &ends,
    );
    reset(&["--topic", "events", "--to-datetime", "0"]);
    check(&[(0, 0), (1, 0), (2, 0)], &ends);
    let future = (now_ms() + 3_600_000).to_string();
    reset(&["--topic", "events", "--to-datetime", &future]);
    check(&[(0, ends[&0]), (1, ends[&1]), (2, ends[&2])], &ends);

    // Bad requests.
    broker.fails(
        &[
            "group",
            "reset-offsets",
            "g1",
            "--topic",
            "nope",
            "--to-earliest",
        ],
        "",
        "topic \"nope\": UNKNOWN_TOPIC_OR_PARTITION",
    );
    broker.fails(
        &[
            "group",
            "reset-offsets",
            "g1",
            "--topic",
            "events:7",
            "--to-earliest",
        ],
        "",
        "topic events has 3 partitions; there is no partition 7",
    );
    broker.fails(
        &["group", "reset-offsets", "g1", "--topic", "events"],
        "",
        "--to-earliest",
    );
    broker.fails(
        &["group", "reset-offsets", "g1", "--to-earliest"],
        "",
        "--topic",
    );
    broker.fails(
        &[
            "group",
            "reset-offsets",
            "fresh",
            "--topic",
            "events",
            "--shift-by",
            "1",
        ],
        "",
        "there is no committed offset to shift",
    );
    broker.fails(
        &[
            "group",
            "reset-offsets",
            "fresh",
            "--all-topics",
            "--to-earliest",
        ],
        "",
        "group fresh has no committed offsets",
    );

    // Offsets for a group that does not exist yet create it.
    let out = broker.ok(
        &[
            "group",
            "reset-offsets",
            "g2",
            "--topic",
            "events",
            "--to-offset",
            "3",
            "--execute",
        ],
        "",
    );
    assert_eq!(
        parse_plan(&out),
        vec![(0, None, 3), (1, None, 3), (2, None, 3)]
    );
    let d = parse_describe(&broker.ok(&["group", "describe", "g2"], ""));
    assert_eq!(d.field("State"), "Empty");
    assert_eq!(
        d.committed(),
        BTreeMap::from([(0, Some(3)), (1, Some(3)), (2, Some(3))])
    );

    // Deletion.
    let out = broker.ok(&["group", "delete", "g1"], "");
    assert_eq!(out, "Deleted group g1.\n");
    let groups = listed(&broker, &["group", "list"]);
    assert!(!groups.contains_key("g1"), "{groups:?}");
    assert!(groups.contains_key("g2"), "{groups:?}");
    broker.fails(
        &["group", "describe", "g1"],
        "",
        "group \"g1\": GROUP_ID_NOT_FOUND",
    );
    broker.fails(
        &["group", "delete", "g1"],
        "",
        "deleting group \"g1\": GROUP_ID_NOT_FOUND (69)",
    );

    // A real consumer: kcat's balanced consumer (librdkafka) reads everything, commits and
    // leaves.
    let has_kcat = Command::new("kcat")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_kcat {
        eprintln!("kcat is not installed: skipping the kcat -G part");
        return;
    }
    let out_path = broker.dir.path().join("kcat.out");
    let err_path = broker.dir.path().join("kcat.err");
    let mut kcat = Command::new("kcat")
        .args(["-b", &address, "-G", "kc", "events"])
        .args(["-X", "auto.offset.reset=earliest", "-e", "-q"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("start kcat");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = kcat.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = kcat.kill();
            let _ = kcat.wait();
            panic!(
                "kcat -G did not finish within 60 s: {}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(status.success(), "kcat: {status}: {err}");
    let read = std::fs::read_to_string(&out_path).unwrap();
    assert_eq!(read.lines().count(), 330, "{err}");
    // kcat left the group when it exited.
    let d = wait_for_state(&broker, "kc", "Empty");
    assert_eq!(d.field("Protocol type"), "consumer");
    for (p, row) in &d.offsets {
        assert_eq!(
            row[2..5],
            [ends[p].to_string(), ends[p].to_string(), "0".to_string()],
            "kcat committed everything it read: {row:?}"
        );
    }
    assert_eq!(d.offsets.len(), 3);
    let out = broker.ok(&["group", "delete", "kc"], "");
    assert_eq!(out, "Deleted group kc.\n");
}

/// Kafka empties a group as soon as its last member leaves: with no member left to wait for,
/// the rebalance that the leave starts completes at once (generation + 1, state Empty), so
/// the group can be deleted or its offsets reset right away.
#[test]
fn a_group_is_empty_as_soon_as_its_last_member_leaves() {
    let broker = Broker::start_with(&[
        "--group-initial-rebalance-delay-ms",
        INITIAL_REBALANCE_DELAY_MS,
    ]);
    broker.ok(&["topic", "create", "events", "--partitions", "1"], "");
    let member = Member::join(&broker.address(), "g", "events", &[0]);
    member.leave();
    let left = Instant::now();
    let d = parse_describe(&broker.ok(&["group", "describe", "g"], ""));
    let state = d.field("State").to_string();
    let deleted = broker.run(&["group", "delete", "g"], "");
    if state != "Empty" || !deleted.success {
        // How long it took, for the report.
        let d = wait_for_state(&broker, "g", "Empty");
        panic!(
            "right after the last member left: state {state}, delete: {}; Empty after {:?} \
             (members: {})",
            deleted.stderr.trim(),
            left.elapsed(),
            d.field("Members")
        );
    }
    assert_eq!(deleted.stdout, "Deleted group g.\n");
}

/// Committed offsets survive a restart; a deleted group does not come back.
#[test]
fn a_deleted_group_stays_deleted_after_a_restart() {
    let mut broker = Broker::start_with(&[
        "--group-initial-rebalance-delay-ms",
        INITIAL_REBALANCE_DELAY_MS,
    ]);
    broker.ok(&["topic", "create", "events", "--partitions", "1"], "");
    let input: String = (0..10).map(|i| format!("record {i}\n")).collect();
    broker.ok(&["produce", "events"], &input);
    for group in ["kept", "gone"] {
        broker.ok(
            &[
                "group",
                "reset-offsets",
                group,
                "--topic",
                "events",
                "--to-offset",
                "4",
                "--execute",
            ],
            "",
        );
    }
    broker.ok(&["group", "delete", "gone"], "");
    broker.restart();
    let groups = listed(&broker, &["group", "list"]);
    let d = parse_describe(&broker.ok(&["group", "describe", "kept"], ""));
    assert_eq!(d.committed(), BTreeMap::from([(0, Some(4))]));
    assert_eq!(d.offsets[&0][3..5], ["10", "6"]);
    assert_eq!(
        groups.keys().collect::<Vec<_>>(),
        ["kept"],
        "only the group that was not deleted"
    );
    broker.fails(
        &["group", "describe", "gone"],
        "",
        "group \"gone\": GROUP_ID_NOT_FOUND",
    );
}
