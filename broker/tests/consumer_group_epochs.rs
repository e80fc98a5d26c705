//! KIP-848 member epochs against the real broker, with raw ConsumerGroupHeartbeat and
//! OffsetCommit requests: a member that joins while another one owns every partition is never
//! answered "epoch 0" together with partitions (a client takes such an answer to mean "no
//! generation" and commits without its member id); it moves to the group's target epoch at once,
//! gets the partitions once their owner has released them, at that epoch, and commits with it.
//! Also `--group-consumer-session-timeout-ms` and `--group-consumer-heartbeat-interval-ms`.

use std::collections::BTreeSet;
use std::net::TcpStream;
use std::time::Duration;

use kafka_protocol::messages::consumer_group_heartbeat_request::TopicPartitions;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    ApiKey, ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse, GroupId,
    OffsetCommitRequest, OffsetCommitResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

mod common;
use common::{request, Broker};

const TOPIC: &str = "epochs";
const PARTITIONS: usize = 6;
const HEARTBEAT_VERSION: i16 = 1;
// Version 9 is the consumer protocol's (Kafka refuses older ones from its members with
// UNSUPPORTED_VERSION, and so does Sluice).
const OFFSET_COMMIT_VERSION: i16 = 9;
const SESSION_TIMEOUT_MS: u64 = 6_000;
const HEARTBEAT_INTERVAL_MS: u64 = 1_000;

type Tp = (uuid::Uuid, i32);

fn start() -> Broker {
    let broker = Broker::start_with(&[
        "--group-consumer-session-timeout-ms",
        &SESSION_TIMEOUT_MS.to_string(),
        "--group-consumer-heartbeat-interval-ms",
        &HEARTBEAT_INTERVAL_MS.to_string(),
    ]);
    broker.create_topic(TOPIC, PARTITIONS as i32);
    broker
}

fn connect(broker: &Broker) -> TcpStream {
    let stream = TcpStream::connect(broker.address()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream
}

/// One member as the Java client drives it: its own member id, the epoch and partitions of the
/// last response it applied.
struct Member {
    id: String,
    epoch: i32,
    owned: BTreeSet<Tp>,
    stream: TcpStream,
}

struct Answer {
    epoch: i32,
    assignment: BTreeSet<Tp>,
    interval_ms: i32,
}

impl Member {
    fn new(broker: &Broker, id: &str) -> Member {
        Member {
            id: id.to_string(),
            epoch: 0,
            owned: BTreeSet::new(),
            stream: connect(broker),
        }
    }

    /// Heartbeats with its epoch and what it owns; checks the answer carries no partitions
    /// without an epoch. Does not apply the answer.
    fn heartbeat(&mut self, group: &str) -> Answer {
        let joining = self.epoch == 0;
        let owned = self
            .owned
            .iter()
            .fold(
                std::collections::BTreeMap::<uuid::Uuid, Vec<i32>>::new(),
                |mut m, (t, p)| {
                    m.entry(*t).or_default().push(*p);
                    m
                },
            )
            .into_iter()
            .map(|(t, ps)| {
                TopicPartitions::default()
                    .with_topic_id(t)
                    .with_partitions(ps)
            })
            .collect();
        let req = ConsumerGroupHeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
            .with_member_id(StrBytes::from_string(self.id.clone()))
            .with_member_epoch(self.epoch)
            .with_rebalance_timeout_ms(30_000)
            .with_subscribed_topic_names(
                joining.then(|| vec![TopicName(StrBytes::from_static_str(TOPIC))]),
            )
            .with_topic_partitions(Some(owned));
        let resp: ConsumerGroupHeartbeatResponse = request(
            &mut self.stream,
            ApiKey::ConsumerGroupHeartbeat,
            HEARTBEAT_VERSION,
            &req,
        );
        assert_eq!(
            resp.error_code, 0,
            "{}: heartbeat at epoch {}: {:?}",
            self.id, self.epoch, resp.error_message
        );
        assert_eq!(
            resp.member_id.as_deref(),
            Some(self.id.as_str()),
            "the client's member id is kept"
        );
        let assignment: BTreeSet<Tp> = resp
            .assignment
            .expect("the broker sends the assignment")
            .topic_partitions
            .iter()
            .flat_map(|t| t.partitions.iter().map(move |p| (t.topic_id, *p)))
            .collect();
        assert!(
            assignment.is_empty() || resp.member_epoch >= 1,
            "{}: partitions {assignment:?} at member epoch {}",
            self.id,
            resp.member_epoch
        );
        Answer {
            epoch: resp.member_epoch,
            assignment,
            interval_ms: resp.heartbeat_interval_ms,
        }
    }

    /// Heartbeats and applies the answer, as a client does once it has reconciled.
    fn beat(&mut self, group: &str) -> Answer {
        let a = self.heartbeat(group);
        self.epoch = a.epoch;
        self.owned = a.assignment.clone();
        a
    }

    /// Commits offset 0 for what it owns (or for `partitions`) at `epoch`; the error code.
    fn commit(&mut self, group: &str, epoch: i32, partitions: &BTreeSet<Tp>) -> i16 {
        let req = OffsetCommitRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
            .with_generation_id_or_member_epoch(epoch)
            .with_member_id(StrBytes::from_string(self.id.clone()))
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
                .with_partitions(
                    partitions
                        .iter()
                        .map(|(_, p)| {
                            OffsetCommitRequestPartition::default()
                                .with_partition_index(*p)
                                .with_committed_offset(0)
                                .with_committed_leader_epoch(-1)
                        })
                        .collect(),
                )]);
        let resp: OffsetCommitResponse = request(
            &mut self.stream,
            ApiKey::OffsetCommit,
            OFFSET_COMMIT_VERSION,
            &req,
        );
        let codes: BTreeSet<i16> = resp
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
            .collect();
        assert_eq!(
            codes.len(),
            1,
            "one outcome for the whole commit: {codes:?}"
        );
        codes.into_iter().next().unwrap()
    }
}

#[test]
fn a_newcomer_gets_partitions_only_at_an_epoch_it_can_commit_with() {
    let broker = start();
    let group = "epochs";
    let mut a = Member::new(&broker, "member-a");
    let first = a.beat(group);
    assert_eq!(
        first.interval_ms, HEARTBEAT_INTERVAL_MS as i32,
        "the configured interval"
    );
    assert!(a.epoch >= 1);
    assert_eq!(
        a.owned.len(),
        PARTITIONS,
        "a lone member gets every partition"
    );
    let a_epoch = a.epoch;
    let all = a.owned.clone();
    assert_eq!(a.beat(group).epoch, a_epoch, "stable");
    assert_eq!(a.commit(group, a_epoch, &all), 0);

    // B joins with epoch 0 while A owns everything: B moves to the new target epoch at once and
    // gets nothing yet (everything is still A's).
    let mut b = Member::new(&broker, "member-b");
    let joined = b.beat(group);
    assert!(
        joined.epoch > a_epoch,
        "the newcomer is at the group's new epoch, not {}",
        joined.epoch
    );
    assert!(joined.assignment.is_empty(), "A still owns every partition");
    let b_epoch = joined.epoch;
    // Until A has let go, B keeps getting nothing (and never epoch 0).
    let again = b.beat(group);
    assert_eq!((again.epoch, again.assignment.len()), (b_epoch, 0));

    // A is told to revoke half; it keeps its epoch (and may commit with it) until it reports
    // that it let go.
    let told = a.heartbeat(group);
    assert_eq!(told.epoch, a_epoch, "A keeps its epoch while it revokes");
    assert_eq!(told.assignment.len(), PARTITIONS / 2);
    assert!(told.assignment.is_subset(&all));
    let revoked: BTreeSet<Tp> = all.difference(&told.assignment).copied().collect();
    assert_eq!(
        a.commit(group, a_epoch, &revoked),
        0,
        "A commits what it revokes"
    );
    let still = b.beat(group);
    assert_eq!(
        (still.epoch, still.assignment.len()),
        (b_epoch, 0),
        "nothing moves before A reports it let go"
    );
    a.epoch = told.epoch;
    a.owned = told.assignment.clone();
    let acked = a.beat(group);
    assert_eq!(
        acked.epoch, b_epoch,
        "A reaches the new epoch once it has let go"
    );
    assert_eq!(acked.assignment, told.assignment);

    // Now B gets the released partitions, at the epoch it already had.
    let handed = b.beat(group);
    assert_eq!(handed.epoch, b_epoch);
    assert_eq!(handed.assignment, revoked, "B gets exactly what A released");
    assert!(handed.assignment.is_disjoint(&a.owned));
    assert_eq!(
        b.commit(group, b_epoch, &revoked),
        0,
        "B commits at the epoch it was given the partitions with"
    );
    assert_eq!(a.commit(group, b_epoch, &a.owned.clone()), 0);
    assert_eq!(
        b.commit(group, 0, &revoked),
        ResponseError::StaleMemberEpoch.code(),
        "epoch 0 is not B's epoch"
    );
    let stable = b.beat(group);
    assert_eq!((stable.epoch, stable.assignment), (b_epoch, revoked));
}

#[test]
fn a_silent_member_leaves_after_the_configured_session_timeout() {
    let broker = start();
    let group = "sessions";
    let mut a = Member::new(&broker, "member-a");
    a.beat(group);
    let mut quiet = Member::new(&broker, "member-quiet");
    quiet.beat(group);
    // Silent for half the session: still a member.
    std::thread::sleep(Duration::from_millis(SESSION_TIMEOUT_MS / 2));
    a.beat(group);
    quiet.beat(group);
    // Silent for longer than the session, while A keeps heartbeating: gone.
    for _ in 0..(SESSION_TIMEOUT_MS + 2_000) / HEARTBEAT_INTERVAL_MS {
        std::thread::sleep(Duration::from_millis(HEARTBEAT_INTERVAL_MS));
        a.beat(group);
    }
    for _ in 0..4 {
        a.beat(group);
    }
    assert_eq!(a.owned.len(), PARTITIONS, "A has every partition again");
    let req = ConsumerGroupHeartbeatRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str("sessions")))
        .with_member_id(StrBytes::from_string(quiet.id.clone()))
        .with_member_epoch(quiet.epoch)
        .with_rebalance_timeout_ms(30_000);
    let resp: ConsumerGroupHeartbeatResponse = request(
        &mut quiet.stream,
        ApiKey::ConsumerGroupHeartbeat,
        HEARTBEAT_VERSION,
        &req,
    );
    assert_eq!(resp.error_code, ResponseError::UnknownMemberId.code());
}

#[test]
fn the_heartbeat_interval_must_be_below_the_session_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let out = common::run_sluice(
        dir.path(),
        &[
            "--data-dir",
            dir.path().join("data").to_str().unwrap(),
            "--listeners",
            "PLAINTEXT://127.0.0.1:0",
            "--group-consumer-session-timeout-ms",
            "3000",
            "--group-consumer-heartbeat-interval-ms",
            "3000",
        ],
        &[],
        "",
    );
    assert!(!out.success, "the broker must refuse to start");
    assert!(
        out.stderr.contains("group.consumer.heartbeat.interval.ms"),
        "{}",
        out.stderr
    );
}
