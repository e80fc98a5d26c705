//! Transaction version 2 (KIP-890 part 2) and the partition leader's transaction verification
//! (KIP-890 part 1) over the wire, as Kafka 4.0 does them:
//!
//! - ApiVersions finalizes `transaction.version` 2 and advertises the request versions that
//!   carry it (InitProducerId 5, AddPartitionsToTxn 5, AddOffsetsToTxn 4, TxnOffsetCommit 5,
//!   EndTxn 5, Produce 12).
//! - At transaction version 2 a Produce v12 adds its partition to the transaction itself (no
//!   AddPartitionsToTxn), EndTxn v5 bumps the epoch and returns it, a retried EndTxn is answered
//!   with the same bumped epoch, committed data becomes readable under read_committed and
//!   aborted data is listed as aborted, and TxnOffsetCommit v5 adds the group's offsets
//!   partition itself (no AddOffsetsToTxn).
//! - Clients at transaction version 0 are verified: a transactional batch or a transactional
//!   offset commit for a partition that is not in the transaction is refused (TRANSACTION_ABORTABLE
//!   for the versions that know it, INVALID_TXN_STATE before) and nothing is appended, so a late
//!   batch cannot start a hanging transaction that holds back the last stable offset.
//! - A broker started with `--transaction-version 0` finalizes level 0 and only verifies.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::describe_producers_request::TopicRequest;
use kafka_protocol::messages::describe_producers_response::ProducerState;
use kafka_protocol::messages::describe_transactions_response::TransactionState;
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, ApiKey, ApiVersionsRequest,
    ApiVersionsResponse, BrokerId, CreateTopicsRequest, CreateTopicsResponse,
    DescribeProducersRequest, DescribeProducersResponse, DescribeTransactionsRequest,
    DescribeTransactionsResponse, EndTxnRequest, EndTxnResponse, FetchResponse,
    FindCoordinatorRequest, FindCoordinatorResponse, GroupId, InitProducerIdRequest,
    InitProducerIdResponse, ListOffsetsRequest, ListOffsetsResponse, OffsetFetchRequest,
    OffsetFetchResponse, ProduceRequest, ProduceResponse, ProducerId, ResponseHeader, TopicName,
    TransactionalId, TxnOffsetCommitRequest, TxnOffsetCommitResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use sluice_engine::batch::{BatchBuilder, BatchHeader, NewRecord, Records};
use sluice_engine::Timestamp;

mod common;

use common::{connect, fetch_request, frame, read_frame, Broker};

/// Error codes the tests expect or retry on.
const NOT_ENOUGH_REPLICAS: i16 = 19;
const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
const COORDINATOR_NOT_AVAILABLE: i16 = 15;
const NOT_COORDINATOR: i16 = 16;
const INVALID_TXN_STATE: i16 = 48;
const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
const CONCURRENT_TRANSACTIONS: i16 = 51;
const UNSTABLE_OFFSET_COMMIT: i16 = 88;
const TRANSACTION_ABORTABLE: i16 = 120;

/// The transactional attribute bit of a record batch.
const TRANSACTIONAL: i16 = 0x10;
/// How long a retried request or a poll may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(10);
/// The coordinators' state topics load after the broker starts; finding one may take longer.
const COORDINATOR_DEADLINE: Duration = Duration::from_secs(30);

fn name(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// Sends one request and decodes its response. Unlike `common::request`, a connection the
/// broker closes (as it does for a version it does not support) fails with a message saying so.
fn call<Req: Encodable, Resp: Decodable>(
    s: &mut TcpStream,
    key: ApiKey,
    version: i16,
    req: &Req,
) -> Resp {
    use std::io::Write;
    s.write_all(&frame(key, version, 7, req))
        .unwrap_or_else(|e| panic!("{key:?} v{version}: sending failed: {e}"));
    let mut body = read_frame(s).unwrap_or_else(|| {
        panic!(
            "{key:?} v{version}: the broker closed the connection or did not answer within \
             10 s (does it support this version?)"
        )
    });
    ResponseHeader::decode(&mut body, key.response_header_version(version))
        .unwrap_or_else(|e| panic!("{key:?} v{version}: bad response header: {e}"));
    Resp::decode(&mut body, version)
        .unwrap_or_else(|e| panic!("{key:?} v{version}: bad response body: {e}"))
}

fn api_versions(s: &mut TcpStream) -> ApiVersionsResponse {
    let r: ApiVersionsResponse = call(
        s,
        ApiKey::ApiVersions,
        4,
        &ApiVersionsRequest::default()
            .with_client_software_name(name("sluice-tests"))
            .with_client_software_version(name("1.0")),
    );
    assert_eq!(r.error_code, 0, "ApiVersions v4 error");
    r
}

fn create_topic(s: &mut TcpStream, topic: &str) {
    let r: CreateTopicsResponse = call(
        s,
        ApiKey::CreateTopics,
        7,
        &CreateTopicsRequest::default()
            .with_timeout_ms(5000)
            .with_topics(vec![CreatableTopic::default()
                .with_name(TopicName(name(topic)))
                .with_num_partitions(1)
                .with_replication_factor(1)]),
    );
    assert_eq!(r.topics[0].error_code, 0, "CreateTopics {topic}");
}

/// FindCoordinator for a transactional id, until the coordinator has loaded.
fn find_txn_coordinator(s: &mut TcpStream, txn_id: &str) -> Coordinator {
    let deadline = Instant::now() + COORDINATOR_DEADLINE;
    loop {
        let r: FindCoordinatorResponse = call(
            s,
            ApiKey::FindCoordinator,
            4,
            &FindCoordinatorRequest::default()
                .with_key_type(1)
                .with_coordinator_keys(vec![name(txn_id)]),
        );
        let c = r.coordinators[0].clone();
        if c.error_code == 0 {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "no transaction coordinator for {txn_id} within {COORDINATOR_DEADLINE:?}: last error {}",
            c.error_code
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// InitProducerId for `txn_id` at `version`, retried while the coordinator is not ready;
/// returns (producer id, epoch).
fn init_producer(s: &mut TcpStream, txn_id: &str, version: i16) -> (i64, i16) {
    find_txn_coordinator(s, txn_id);
    let deadline = Instant::now() + COORDINATOR_DEADLINE;
    loop {
        let r: InitProducerIdResponse = call(
            s,
            ApiKey::InitProducerId,
            version,
            &InitProducerIdRequest::default()
                .with_transactional_id(Some(TransactionalId(name(txn_id))))
                .with_transaction_timeout_ms(60_000)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1),
        );
        match r.error_code {
            0 => {
                assert!(r.producer_id.0 >= 0, "InitProducerId {txn_id}: producer id");
                assert!(r.producer_epoch >= 0, "InitProducerId {txn_id}: epoch");
                return (r.producer_id.0, r.producer_epoch);
            }
            COORDINATOR_LOAD_IN_PROGRESS
            | COORDINATOR_NOT_AVAILABLE
            | NOT_COORDINATOR
            | CONCURRENT_TRANSACTIONS
                if Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            e => panic!("InitProducerId v{version} for {txn_id}: error {e}"),
        }
    }
}

/// A transactional batch of `values` from (pid, epoch) starting at sequence `seq`.
fn txn_batch(pid: i64, epoch: i16, seq: i32, values: &[&str]) -> Bytes {
    let mut b = BatchBuilder::new()
        .producer(pid, epoch, seq)
        .attributes(TRANSACTIONAL);
    for v in values {
        b.push(&NewRecord {
            value: Some(v.as_bytes().to_vec()),
            timestamp: Timestamp(common::now_ms()),
            ..Default::default()
        });
    }
    b.build()
}

/// One Produce of `batch` to partition 0 of `topic`, acks -1; returns (error, base offset).
fn produce_once(
    s: &mut TcpStream,
    version: i16,
    txn_id: &str,
    topic: &str,
    batch: &Bytes,
) -> (i16, i64) {
    let r: ProduceResponse = call(
        s,
        ApiKey::Produce,
        version,
        &ProduceRequest::default()
            .with_transactional_id(Some(TransactionalId(name(txn_id))))
            .with_acks(-1)
            .with_timeout_ms(5000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(name(topic)))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(batch.clone()))])]),
    );
    let p = &r.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

/// Like `produce_once`, and retries the same batch while the answer is NOT_ENOUGH_REPLICAS or
/// CONCURRENT_TRANSACTIONS (neither is ever the answer a test expects).
fn produce(
    s: &mut TcpStream,
    version: i16,
    txn_id: &str,
    topic: &str,
    batch: &Bytes,
) -> (i16, i64) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (error, offset) = produce_once(s, version, txn_id, topic, batch);
        if !matches!(error, NOT_ENOUGH_REPLICAS | CONCURRENT_TRANSACTIONS)
            || Instant::now() >= deadline
        {
            return (error, offset);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// AddPartitionsToTxn v3 (the client's form) of partition 0 of `topic`; returns its error,
/// retried while CONCURRENT_TRANSACTIONS (the previous transaction's markers are being written).
fn add_partition_v3(s: &mut TcpStream, txn_id: &str, pid: i64, epoch: i16, topic: &str) -> i16 {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let r: AddPartitionsToTxnResponse = call(
            s,
            ApiKey::AddPartitionsToTxn,
            3,
            &AddPartitionsToTxnRequest::default()
                .with_v3_and_below_transactional_id(TransactionalId(name(txn_id)))
                .with_v3_and_below_producer_id(ProducerId(pid))
                .with_v3_and_below_producer_epoch(epoch)
                .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                    .with_name(TopicName(name(topic)))
                    .with_partitions(vec![0])]),
        );
        let error = r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code;
        if error != CONCURRENT_TRANSACTIONS || Instant::now() >= deadline {
            return error;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// EndTxn at `version`, retried while CONCURRENT_TRANSACTIONS.
fn end_txn(
    s: &mut TcpStream,
    version: i16,
    txn_id: &str,
    pid: i64,
    epoch: i16,
    commit: bool,
) -> EndTxnResponse {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let r: EndTxnResponse = call(
            s,
            ApiKey::EndTxn,
            version,
            &EndTxnRequest::default()
                .with_transactional_id(TransactionalId(name(txn_id)))
                .with_producer_id(ProducerId(pid))
                .with_producer_epoch(epoch)
                .with_committed(commit),
        );
        if r.error_code != CONCURRENT_TRANSACTIONS || Instant::now() >= deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn describe_txn(s: &mut TcpStream, txn_id: &str) -> TransactionState {
    let r: DescribeTransactionsResponse = call(
        s,
        ApiKey::DescribeTransactions,
        0,
        &DescribeTransactionsRequest::default()
            .with_transactional_ids(vec![TransactionalId(name(txn_id))]),
    );
    let t = r.transaction_states[0].clone();
    assert_eq!(t.error_code, 0, "DescribeTransactions {txn_id}");
    t
}

/// The transaction's partitions as (topic, partition) pairs.
fn txn_partitions(t: &TransactionState) -> Vec<(String, i32)> {
    t.topics
        .iter()
        .flat_map(|topic| {
            topic
                .partitions
                .iter()
                .map(|&p| (topic.topic.0.to_string(), p))
        })
        .collect()
}

/// Polls DescribeTransactions until `txn_id` is in `state`.
fn wait_for_state(s: &mut TcpStream, txn_id: &str, state: &str) -> TransactionState {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let t = describe_txn(s, txn_id);
        if t.transaction_state.as_str() == state {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "{txn_id} did not reach {state} within {DEADLINE:?}: still {}",
            t.transaction_state.as_str()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// ListOffsets v7 for the latest offset of partition 0 of `topic`: the high watermark at
/// isolation 0 (read_uncommitted), the last stable offset at 1 (read_committed).
fn list_latest(s: &mut TcpStream, topic: &str, isolation_level: i8) -> i64 {
    let r: ListOffsetsResponse = call(
        s,
        ApiKey::ListOffsets,
        7,
        &ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_isolation_level(isolation_level)
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(name(topic)))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(0)
                    .with_timestamp(-1)])]),
    );
    let p = &r.topics[0].partitions[0];
    assert_eq!(
        p.error_code, 0,
        "ListOffsets {topic} isolation {isolation_level}"
    );
    p.offset
}

/// A read_committed Fetch v12 of partition 0 of `topic` from offset 0.
fn fetch_committed(s: &mut TcpStream, topic: &str) -> PartitionData {
    let r: FetchResponse = call(
        s,
        ApiKey::Fetch,
        12,
        &fetch_request(topic, 0, 0, 1 << 20).with_isolation_level(1),
    );
    assert_eq!(r.error_code, 0, "Fetch {topic}");
    let p = r.responses[0].partitions[0].clone();
    assert_eq!(p.error_code, 0, "Fetch {topic} partition 0");
    p
}

/// The data batches of fetched `records` (control batches left out) as
/// (base offset, producer id, values).
fn data_batches(records: &Option<Bytes>) -> Vec<(i64, i64, Vec<String>)> {
    let mut out = Vec::new();
    let mut rest: &[u8] = records.as_deref().unwrap_or_default();
    while !rest.is_empty() {
        let header = BatchHeader::parse(rest).expect("a batch header");
        let size = header.total_size().expect("a batch size");
        assert!(
            size <= rest.len(),
            "a truncated batch in the fetch response"
        );
        let batch = &rest[..size];
        if !header.is_control() {
            let values = Records::new(batch)
                .map(|r| {
                    let r = r.expect("a well-formed record");
                    String::from_utf8(r.value.expect("a value").to_vec()).unwrap()
                })
                .collect();
            out.push((header.base_offset().0, header.producer_id(), values));
        }
        rest = &rest[size..];
    }
    out
}

/// TxnOffsetCommit at `version` of `offset` for partition 0 of `topic`, without a group
/// generation (a simple transactional commit); returns the partition's error, retried while
/// the coordinators are not ready or the transaction is busy.
#[allow(clippy::too_many_arguments)]
fn txn_offset_commit(
    s: &mut TcpStream,
    version: i16,
    txn_id: &str,
    group: &str,
    pid: i64,
    epoch: i16,
    topic: &str,
    offset: i64,
) -> i16 {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let r: TxnOffsetCommitResponse = call(
            s,
            ApiKey::TxnOffsetCommit,
            version,
            &TxnOffsetCommitRequest::default()
                .with_transactional_id(TransactionalId(name(txn_id)))
                .with_group_id(GroupId(name(group)))
                .with_producer_id(ProducerId(pid))
                .with_producer_epoch(epoch)
                .with_generation_id(-1)
                .with_member_id(name(""))
                .with_group_instance_id(None)
                .with_topics(vec![TxnOffsetCommitRequestTopic::default()
                    .with_name(TopicName(name(topic)))
                    .with_partitions(vec![TxnOffsetCommitRequestPartition::default()
                        .with_partition_index(0)
                        .with_committed_offset(offset)
                        .with_committed_leader_epoch(-1)
                        .with_committed_metadata(Some(name("")))])]),
        );
        let error = r.topics[0].partitions[0].error_code;
        let retriable = matches!(
            error,
            COORDINATOR_LOAD_IN_PROGRESS
                | COORDINATOR_NOT_AVAILABLE
                | NOT_COORDINATOR
                | CONCURRENT_TRANSACTIONS
        );
        if !retriable || Instant::now() >= deadline {
            return error;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// OffsetFetch v8 of partition 0 of `topic` for `group`, require_stable; returns
/// (group error, partition error, committed offset).
fn offset_fetch_stable(s: &mut TcpStream, group: &str, topic: &str) -> (i16, i16, i64) {
    let r: OffsetFetchResponse = call(
        s,
        ApiKey::OffsetFetch,
        8,
        &OffsetFetchRequest::default()
            .with_require_stable(true)
            .with_groups(vec![OffsetFetchRequestGroup::default()
                .with_group_id(GroupId(name(group)))
                .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                    .with_name(TopicName(name(topic)))
                    .with_partition_indexes(vec![0])]))]),
    );
    let g = &r.groups[0];
    // With a group error Kafka may leave the topics out.
    match g.topics.first().and_then(|t| t.partitions.first()) {
        Some(p) => (g.error_code, p.error_code, p.committed_offset),
        None => (g.error_code, 0, -1),
    }
}

fn describe_producers(s: &mut TcpStream, topic: &str) -> Vec<ProducerState> {
    let r: DescribeProducersResponse = call(
        s,
        ApiKey::DescribeProducers,
        0,
        &DescribeProducersRequest::default().with_topics(vec![TopicRequest::default()
            .with_name(TopicName(name(topic)))
            .with_partition_indexes(vec![0])]),
    );
    let p = &r.topics[0].partitions[0];
    assert_eq!(p.error_code, 0, "DescribeProducers {topic}-0");
    p.active_producers.clone()
}

/// Transaction version 2 end to end with one transactional id: produce without
/// AddPartitionsToTxn, commit and abort with EndTxn v5 (each bumps the epoch), and commit
/// offsets with TxnOffsetCommit v5 without AddOffsetsToTxn.
#[test]
fn transaction_version_2_adds_partitions_implicitly_and_bumps_the_epoch_at_every_end() {
    let broker = Broker::start();
    let mut s = connect(broker.port);

    // 1. The features and versions of transaction version 2.
    let versions = api_versions(&mut s);
    let finalized = versions
        .finalized_features
        .iter()
        .find(|f| f.name.as_str() == "transaction.version")
        .map(|f| f.max_version_level);
    assert_eq!(finalized, Some(2), "finalized transaction.version");
    let supported = versions
        .supported_features
        .iter()
        .find(|f| f.name.as_str() == "transaction.version")
        .map(|f| (f.min_version, f.max_version));
    assert_eq!(supported, Some((0, 2)), "supported transaction.version");
    for (key, max) in [
        (ApiKey::InitProducerId, 5),
        (ApiKey::AddPartitionsToTxn, 5),
        (ApiKey::AddOffsetsToTxn, 4),
        (ApiKey::TxnOffsetCommit, 6),
        (ApiKey::EndTxn, 5),
        (ApiKey::Produce, 13),
    ] {
        let advertised = versions
            .api_keys
            .iter()
            .find(|k| k.api_key == key as i16)
            .map(|k| k.max_version);
        assert_eq!(advertised, Some(max), "advertised max version of {key:?}");
    }

    // 2. A committed transaction: the produce adds the partition itself.
    create_topic(&mut s, "tv2");
    let (pid, e) = init_producer(&mut s, "tv2-a", 5);
    let first = txn_batch(pid, e, 0, &["a0", "a1", "a2"]);
    assert_eq!(
        produce(&mut s, 12, "tv2-a", "tv2", &first),
        (0, 0),
        "Produce v12 without AddPartitionsToTxn at transaction version 2"
    );
    assert_eq!(
        list_latest(&mut s, "tv2", 1),
        0,
        "the last stable offset stays at the open transaction's first offset"
    );
    let open = describe_txn(&mut s, "tv2-a");
    assert_eq!(open.transaction_state.as_str(), "Ongoing");
    assert_eq!(open.producer_id.0, pid);
    assert_eq!(txn_partitions(&open), vec![("tv2".to_string(), 0)]);

    let ended = end_txn(&mut s, 5, "tv2-a", pid, e, true);
    assert_eq!(ended.error_code, 0, "EndTxn v5 commit");
    assert_eq!(
        (ended.producer_id.0, ended.producer_epoch),
        (pid, e + 1),
        "EndTxn v5 returns the bumped epoch"
    );
    let retried = end_txn(&mut s, 5, "tv2-a", pid, e, true);
    assert_eq!(retried.error_code, 0, "a retried EndTxn v5 commit");
    assert_eq!(
        (retried.producer_id.0, retried.producer_epoch),
        (pid, e + 1),
        "a retried EndTxn v5 returns the same bumped epoch"
    );
    wait_for_state(&mut s, "tv2-a", "CompleteCommit");
    assert_eq!(
        list_latest(&mut s, "tv2", 1),
        4,
        "3 committed records and the commit marker are stable"
    );
    let fetched = fetch_committed(&mut s, "tv2");
    assert_eq!(
        data_batches(&fetched.records),
        vec![(0, pid, vec!["a0".into(), "a1".into(), "a2".into()])],
        "read_committed sees the committed records in order"
    );
    assert_eq!(
        fetched.aborted_transactions.unwrap_or_default().len(),
        0,
        "nothing aborted yet"
    );

    // 3. An aborted transaction at the bumped epoch, sequence 0 again. The commit marker moved
    // the partition's producer to the bumped epoch with no sequence yet: a batch that overtook
    // the transaction's first one is out of order and lands nowhere, as in Kafka.
    let e1 = e + 1;
    let overtaking = txn_batch(pid, e1, 2, &["b2"]);
    assert_eq!(
        produce(&mut s, 12, "tv2-a", "tv2", &overtaking).0,
        OUT_OF_ORDER_SEQUENCE_NUMBER,
        "a batch at the bumped epoch that does not start at sequence 0"
    );
    let second = txn_batch(pid, e1, 0, &["b0", "b1"]);
    assert_eq!(
        produce(&mut s, 12, "tv2-a", "tv2", &second),
        (0, 4),
        "Produce v12 of the second transaction at epoch {e1}"
    );
    let aborted = end_txn(&mut s, 5, "tv2-a", pid, e1, false);
    assert_eq!(aborted.error_code, 0, "EndTxn v5 abort");
    assert_eq!(
        (aborted.producer_id.0, aborted.producer_epoch),
        (pid, e + 2),
        "EndTxn v5 abort returns the bumped epoch"
    );
    wait_for_state(&mut s, "tv2-a", "CompleteAbort");
    let fetched = fetch_committed(&mut s, "tv2");
    assert_eq!(
        (fetched.high_watermark, fetched.last_stable_offset),
        (7, 7),
        "4 + 2 aborted records + the abort marker"
    );
    let listed: Vec<(i64, i64)> = fetched
        .aborted_transactions
        .clone()
        .unwrap_or_default()
        .iter()
        .map(|a| (a.producer_id.0, a.first_offset))
        .collect();
    assert_eq!(listed, vec![(pid, 4)], "the aborted transaction is listed");
    assert_eq!(
        data_batches(&fetched.records),
        vec![
            (0, pid, vec!["a0".into(), "a1".into(), "a2".into()]),
            (4, pid, vec!["b0".into(), "b1".into()]),
        ],
        "the aborted batch is in the log for the consumer to drop"
    );

    // 6. Offsets in a transaction without AddOffsetsToTxn.
    let e2 = e + 2;
    assert_eq!(
        produce(&mut s, 12, "tv2-a", "tv2", &txn_batch(pid, e2, 0, &["c0"])),
        (0, 7),
        "Produce v12 of the third transaction at epoch {e2}"
    );
    assert_eq!(
        txn_offset_commit(&mut s, 5, "tv2-a", "tv2-group", pid, e2, "tv2", 42),
        0,
        "TxnOffsetCommit v5 without AddOffsetsToTxn"
    );
    let open = describe_txn(&mut s, "tv2-a");
    let partitions = txn_partitions(&open);
    assert!(
        partitions.iter().any(|(t, _)| t == "__consumer_offsets"),
        "TxnOffsetCommit v5 adds the group's offsets partition: {partitions:?}"
    );
    assert!(
        partitions.contains(&("tv2".to_string(), 0)),
        "the produce added tv2-0: {partitions:?}"
    );
    let (group_error, partition_error, _) = offset_fetch_stable(&mut s, "tv2-group", "tv2");
    assert!(
        group_error == UNSTABLE_OFFSET_COMMIT || partition_error == UNSTABLE_OFFSET_COMMIT,
        "require_stable with a pending transactional offset: group error {group_error}, \
         partition error {partition_error}"
    );
    let ended = end_txn(&mut s, 5, "tv2-a", pid, e2, true);
    assert_eq!(ended.error_code, 0, "EndTxn v5 commit of the offsets");
    assert_eq!((ended.producer_id.0, ended.producer_epoch), (pid, e + 3));
    let deadline = Instant::now() + DEADLINE;
    loop {
        let got = offset_fetch_stable(&mut s, "tv2-group", "tv2");
        if got == (0, 0, 42) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the committed offset 42 is not stable within {DEADLINE:?}: \
             (group error, partition error, offset) = {got:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Transaction version 0 clients are verified by the partition leader (KIP-890 part 1): a
/// transactional batch or offset commit outside the transaction is refused and not appended.
#[test]
fn partition_verification_refuses_batches_and_offsets_outside_the_transaction() {
    let broker = Broker::start();
    let mut s = connect(broker.port);
    for topic in ["tv2-verify", "tv2-late", "tv2-d"] {
        create_topic(&mut s, topic);
    }

    // 4. A batch for a partition that was never added.
    let (pid, epoch) = init_producer(&mut s, "tv0-b", 4);
    let batch = txn_batch(pid, epoch, 0, &["v0", "v1"]);
    assert_eq!(
        produce(&mut s, 11, "tv0-b", "tv2-verify", &batch).0,
        TRANSACTION_ABORTABLE,
        "Produce v11 of a partition not in the transaction"
    );
    assert_eq!(
        produce(&mut s, 10, "tv0-b", "tv2-verify", &batch).0,
        INVALID_TXN_STATE,
        "Produce v10 of a partition not in the transaction"
    );
    assert_eq!(
        list_latest(&mut s, "tv2-verify", 0),
        0,
        "a refused batch is not appended"
    );
    let open: Vec<(i64, i64)> = describe_producers(&mut s, "tv2-verify")
        .iter()
        .filter(|p| p.current_txn_start_offset != -1)
        .map(|p| (p.producer_id.0, p.current_txn_start_offset))
        .collect();
    assert!(
        open.is_empty(),
        "a refused batch opens no transaction on the partition: {open:?}"
    );
    assert_eq!(
        add_partition_v3(&mut s, "tv0-b", pid, epoch, "tv2-verify"),
        0,
        "AddPartitionsToTxn v3"
    );
    assert_eq!(
        produce(&mut s, 11, "tv0-b", "tv2-verify", &batch),
        (0, 0),
        "Produce v11 once the partition is in the transaction"
    );
    let ended = end_txn(&mut s, 4, "tv0-b", pid, epoch, true);
    assert_eq!(ended.error_code, 0, "EndTxn v4 commit");

    // 5. A late batch after the transaction ended cannot start a hanging one.
    let (pid, epoch) = init_producer(&mut s, "tv0-c", 4);
    assert_eq!(
        add_partition_v3(&mut s, "tv0-c", pid, epoch, "tv2-late"),
        0,
        "AddPartitionsToTxn v3"
    );
    let ended = end_txn(&mut s, 4, "tv0-c", pid, epoch, false);
    assert_eq!(ended.error_code, 0, "EndTxn v4 abort");
    wait_for_state(&mut s, "tv0-c", "CompleteAbort");
    assert_eq!(
        produce(
            &mut s,
            11,
            "tv0-c",
            "tv2-late",
            &txn_batch(pid, epoch, 0, &["late"])
        )
        .0,
        TRANSACTION_ABORTABLE,
        "Produce v11 of a batch arriving after its transaction was aborted"
    );
    let committed = list_latest(&mut s, "tv2-late", 1);
    let latest = list_latest(&mut s, "tv2-late", 0);
    assert_eq!(
        committed, latest,
        "the last stable offset is not held back by a hanging transaction"
    );

    // 6. Transactional offsets at version 0 need AddOffsetsToTxn.
    let (pid, epoch) = init_producer(&mut s, "tv0-d", 4);
    assert_eq!(
        add_partition_v3(&mut s, "tv0-d", pid, epoch, "tv2-d"),
        0,
        "AddPartitionsToTxn v3"
    );
    assert_eq!(
        produce(
            &mut s,
            11,
            "tv0-d",
            "tv2-d",
            &txn_batch(pid, epoch, 0, &["d0"])
        ),
        (0, 0),
        "Produce v11 in an open transaction"
    );
    assert_eq!(
        txn_offset_commit(&mut s, 4, "tv0-d", "tv0-group", pid, epoch, "tv2-d", 1),
        TRANSACTION_ABORTABLE,
        "TxnOffsetCommit v4 without AddOffsetsToTxn"
    );
    assert_eq!(
        txn_offset_commit(&mut s, 3, "tv0-d", "tv0-group", pid, epoch, "tv2-d", 1),
        INVALID_TXN_STATE,
        "TxnOffsetCommit v3 without AddOffsetsToTxn"
    );
    let ended = end_txn(&mut s, 4, "tv0-d", pid, epoch, false);
    assert_eq!(ended.error_code, 0, "EndTxn v4 abort");
}

/// A broker run at transaction version 0 finalizes no higher level, and a Produce v12 is only
/// verified there: it does not add its partition to the transaction.
#[test]
fn at_transaction_version_0_produce_v12_is_verified_not_added() {
    let broker = Broker::start_with(&["--transaction-version", "0"]);
    let mut s = connect(broker.port);
    let versions = api_versions(&mut s);
    let above_0: Vec<i16> = versions
        .finalized_features
        .iter()
        .filter(|f| f.name.as_str() == "transaction.version" && f.max_version_level > 0)
        .map(|f| f.max_version_level)
        .collect();
    assert!(
        above_0.is_empty(),
        "finalized transaction.version above 0: {above_0:?}"
    );

    create_topic(&mut s, "tv0-only");
    let (pid, epoch) = init_producer(&mut s, "tv0-e", 4);
    assert_eq!(
        produce(
            &mut s,
            12,
            "tv0-e",
            "tv0-only",
            &txn_batch(pid, epoch, 0, &["x"])
        )
        .0,
        TRANSACTION_ABORTABLE,
        "Produce v12 without AddPartitionsToTxn at transaction version 0"
    );
    assert_eq!(
        list_latest(&mut s, "tv0-only", 0),
        0,
        "a refused batch is not appended"
    );
}

/// `__consumer_offsets` placement of a group, as the broker places it (Java's
/// `String.hashCode`, 50 partitions).
fn offsets_partition(group: &str) -> i32 {
    let mut h: i32 = 0;
    for unit in group.encode_utf16() {
        h = h.wrapping_mul(31).wrapping_add(i32::from(unit));
    }
    (h & 0x7fff_ffff) % 50
}

/// Loading the group coordinators after a restart replays each `__consumer_offsets` partition:
/// a commit marker there applies the offsets of its transaction in that partition only. The
/// same producer's later, still open transaction holds offsets of another group on another
/// partition; they stay pending whatever order the partitions load in, and go with its abort.
#[test]
fn a_restart_applies_each_transactions_offsets_only_where_its_markers_are() {
    let (first, second) = ("load-group-a", "load-group-b");
    assert_ne!(
        offsets_partition(first),
        offsets_partition(second),
        "the two groups must live on different offsets partitions"
    );
    let mut broker = Broker::start();
    let mut s = connect(broker.port);
    create_topic(&mut s, "load");
    let (pid, e) = init_producer(&mut s, "load-x", 5);
    assert_eq!(
        txn_offset_commit(&mut s, 5, "load-x", first, pid, e, "load", 10),
        0,
        "TxnOffsetCommit v5 of the first transaction"
    );
    assert_eq!(end_txn(&mut s, 5, "load-x", pid, e, true).error_code, 0);
    wait_for_state(&mut s, "load-x", "CompleteCommit");
    assert_eq!(
        txn_offset_commit(&mut s, 5, "load-x", second, pid, e + 1, "load", 20),
        0,
        "TxnOffsetCommit v5 of the second transaction"
    );
    drop(s);

    broker.restart();
    let mut s = connect(broker.port);
    let deadline = Instant::now() + COORDINATOR_DEADLINE;
    let applied = loop {
        let got = offset_fetch_stable(&mut s, first, "load");
        if got.0 != COORDINATOR_LOAD_IN_PROGRESS && got.0 != NOT_COORDINATOR {
            break got;
        }
        assert!(
            Instant::now() < deadline,
            "the groups did not load: {got:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(applied, (0, 0, 10), "the committed transaction's offset");
    let (group_error, partition_error, _) = offset_fetch_stable(&mut s, second, "load");
    assert!(
        group_error == UNSTABLE_OFFSET_COMMIT || partition_error == UNSTABLE_OFFSET_COMMIT,
        "the open transaction's offset is still pending after the restart: group error \
         {group_error}, partition error {partition_error}"
    );
    assert_eq!(
        end_txn(&mut s, 5, "load-x", pid, e + 1, false).error_code,
        0,
        "EndTxn v5 abort of the second transaction"
    );
    wait_for_state(&mut s, "load-x", "CompleteAbort");
    assert_eq!(
        offset_fetch_stable(&mut s, second, "load"),
        (0, 0, -1),
        "the aborted transaction's offset is dropped"
    );
}

/// Two EndTxn v5 frames written in one go: the first ends a transaction at `epoch`, the second
/// ends the next one at the epoch the first bumps (`commit_next` says how), as a client does
/// that ends its next transaction at once. Returns both answers.
fn end_then_end_next(
    s: &mut TcpStream,
    txn_id: &str,
    pid: i64,
    epoch: i16,
    commit_next: bool,
) -> (EndTxnResponse, EndTxnResponse) {
    use std::io::Write;
    let end = |epoch: i16, commit: bool| {
        frame(
            ApiKey::EndTxn,
            5,
            7,
            &EndTxnRequest::default()
                .with_transactional_id(TransactionalId(name(txn_id)))
                .with_producer_id(ProducerId(pid))
                .with_producer_epoch(epoch)
                .with_committed(commit),
        )
    };
    let mut both = end(epoch, false).to_vec();
    both.extend_from_slice(&end(epoch + 1, commit_next));
    s.write_all(&both).expect("sending two EndTxn");
    let mut answer = || {
        let mut body = read_frame(s).expect("an EndTxn answer");
        ResponseHeader::decode(&mut body, ApiKey::EndTxn.response_header_version(5))
            .expect("header");
        EndTxnResponse::decode(&mut body, 5).expect("body")
    };
    let first = answer();
    let second = answer();
    (first, second)
}

/// Kafka's KAFKA-18464: while the markers of an end are being written, the next transaction's
/// EndTxn at the epoch that end bumped is told CONCURRENT_TRANSACTIONS (clients retry it), never
/// PRODUCER_FENCED (fatal: a consume-transform-produce loop that aborts and goes on would die).
/// Each round: a transactional batch and a TxnOffsetCommit v5, then the abort and, pipelined
/// behind it, the next transaction's end; the markers (to the topic and to `__consumer_offsets`)
/// take long enough that the second end finds them still being written in most rounds.
#[test]
fn the_next_transactions_end_while_markers_are_written_is_retried_not_fenced() {
    const ROUNDS: usize = 20;
    const PRODUCER_FENCED: i16 = 90;
    let broker = Broker::start();
    let mut s = connect(broker.port);
    create_topic(&mut s, "tv2-next");
    let (pid, mut e) = init_producer(&mut s, "tv2-next-a", 5);
    let mut concurrent = 0;
    for round in 0..ROUNDS {
        let batch = txn_batch(pid, e, 0, &["x0", "x1"]);
        let (error, _) = produce(&mut s, 12, "tv2-next-a", "tv2-next", &batch);
        assert_eq!(error, 0, "round {round}: transactional produce");
        let error = txn_offset_commit(
            &mut s,
            5,
            "tv2-next-a",
            "tv2-next-group",
            pid,
            e,
            "tv2-next",
            round as i64,
        );
        assert_eq!(error, 0, "round {round}: TxnOffsetCommit v5");
        // Alternate the next end: an empty abort, and a commit of nothing (INVALID_TXN_STATE
        // once the abort is complete: an empty transaction cannot commit, as in Kafka).
        let commit_next = round % 2 == 1;
        let (first, second) = end_then_end_next(&mut s, "tv2-next-a", pid, e, commit_next);
        assert_eq!(first.error_code, 0, "round {round}: the abort");
        assert_eq!((first.producer_id.0, first.producer_epoch), (pid, e + 1));
        e += 1;
        assert_ne!(
            second.error_code, PRODUCER_FENCED,
            "round {round}: the next transaction's end was fenced while the markers were written"
        );
        let expected_done = if commit_next { INVALID_TXN_STATE } else { 0 };
        let done = if second.error_code == CONCURRENT_TRANSACTIONS {
            concurrent += 1;
            // The client's retry, once the markers are written.
            end_txn(&mut s, 5, "tv2-next-a", pid, e, commit_next)
        } else {
            second
        };
        assert_eq!(
            done.error_code, expected_done,
            "round {round}: the next end"
        );
        if expected_done == 0 {
            assert_eq!(done.producer_epoch, e + 1);
            e += 1;
        }
    }
    eprintln!("{concurrent} of {ROUNDS} next ends came while the markers were written");
    assert!(
        concurrent > 0,
        "no round's second end came while the markers were written ({ROUNDS} rounds); the test \
         did not exercise the case"
    );
    // Every round left two records and one abort marker; nothing is open, so the last stable
    // offset is the log end.
    assert_eq!(list_latest(&mut s, "tv2-next", 1), 3 * ROUNDS as i64);
}
