//! Fetch: whole batches from each partition's owner shard, long-polling up to `max.wait.ms`
//! until `min.bytes` are available, woken by appends on the owner shards.
//!
//! The partitions of a fetch are read through `shard::read`: one job per owner shard carrying
//! all of that shard's partitions, every shard at once, then one pass in request order that
//! applies `fetch.max.bytes` (the request's, capped by the broker's), `partition_max_bytes` and
//! the first-batch-whole rule. This file owns what is Fetch-specific around it: fetch sessions,
//! which partitions an incremental response carries, and the response's encoding.
//!
//! Records on disk and not in the batch cache are spliced from the segment file to the socket
//! (`fetch.zero.copy`, `Log::read_extent`, `net/splice.rs`): they never enter user space. Others
//! come from the owner shard's batch cache (no copy) or from an O_DIRECT segment read (one copy
//! out of the DMA buffer, shared with the cache); they are then concatenated per partition into
//! the response (one copy) and the response is encoded into the frame (one copy).
//! broker/README.md says when each path is taken.
//!
//! Fetch sessions (KIP-227): a client that opens a session sends only changed partitions and
//! gets back only partitions with news (records, a moved high watermark or log start, errors).
//! A session's partitions are an insertion-ordered hash map keyed by (topic, partition): a
//! lookup is constant time, and the order is the order partitions are read and answered in.
//!
//! Every pass over the partitions of a fetch counts its steps (`Work`); the total is logged at
//! debug level under the target `sluice::fetch`, and tests assert it is linear in the partitions.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, LeaderIdAndEpoch, NodeEndpoint, PartitionData,
};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, ProducerId, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use sluice_engine::Offset;

use crate::codec::response::Splices;
use crate::metadata::MetadataImage;
use crate::shard::fetch_sessions::{Applied, Wanted};
use crate::shard::read::{read_partitions, PartitionRead, ReadResult, Records, Work};
use crate::shard::Shard;

/// Longest long-poll honoured, whatever the client asks.
pub const FETCH_WAIT_MS_MAX: i32 = 30_000;

/// The tracing target of the per-fetch work line (`RUST_LOG=info,sluice::fetch=debug`).
pub const WORK_LOG_TARGET: &str = "sluice::fetch";

/// The first Fetch version with the consumer's rack and `preferred_read_replica` (KIP-392).
const CLIENT_RACK_VERSION: i16 = 11;

/// The partitions `request` asks for, topic ids resolved to names, and the partitions of topic
/// ids the image does not know (answered UNKNOWN_TOPIC_ID).
fn wanted_partitions(
    image: &MetadataImage,
    request: &FetchRequest,
    version: i16,
) -> (Vec<Wanted>, Vec<(uuid::Uuid, Vec<i32>)>) {
    let mut wanted = Vec::new();
    let mut unknown_ids = Vec::new();
    for topic in &request.topics {
        let name: Arc<str> = if version >= 13 {
            match image.topic_by_id(topic.topic_id) {
                Some(t) => t.name.as_str().into(),
                None => {
                    unknown_ids.push((
                        topic.topic_id,
                        topic.partitions.iter().map(|p| p.partition).collect(),
                    ));
                    continue;
                }
            }
        } else {
            topic.topic.0.as_str().into()
        };
        for p in &topic.partitions {
            wanted.push(Wanted {
                topic: name.clone(),
                topic_id: topic.topic_id,
                partition: p.partition,
                offset: p.fetch_offset,
                max_bytes: p.partition_max_bytes,
                current_leader_epoch: p.current_leader_epoch,
                last_fetched_epoch: p.last_fetched_epoch,
            });
        }
    }
    (wanted, unknown_ids)
}

/// The partitions an incremental request removes from its session.
fn forgotten_partitions(
    image: &MetadataImage,
    request: &FetchRequest,
    version: i16,
) -> Vec<(Arc<str>, i32)> {
    let mut out = Vec::new();
    for forgotten in &request.forgotten_topics_data {
        let name: Arc<str> = if version >= 13 {
            match image.topic_by_id(forgotten.topic_id) {
                Some(t) => t.name.as_str().into(),
                // Deleted since: the session's partitions of it stay until the client forgets
                // them by a name it still has, or the session ends.
                None => continue,
            }
        } else {
            forgotten.topic.0.as_str().into()
        };
        out.extend(forgotten.partitions.iter().map(|&p| (name.clone(), p)));
    }
    out
}

/// The response's topics: `wanted` with their `results`, those `keep` says, in order.
/// Consecutive partitions of one topic share a topic entry, as in Kafka's own response (a
/// topic split by a session's rotation appears once per run), so there is no search per
/// partition.
fn assemble(
    version: i16,
    read_committed: bool,
    wanted: &[Wanted],
    results: Vec<ReadResult>,
    keep: &[bool],
    splices: &mut Splices,
    work: &mut Work,
) -> Vec<FetchableTopicResponse> {
    let mut topics: Vec<FetchableTopicResponse> = Vec::new();
    let mut current: Option<&Arc<str>> = None;
    let unknown = ResponseError::UnknownTopicOrPartition.code();
    for ((w, f), &keep) in wanted.iter().zip(results).zip(keep) {
        if !keep {
            continue;
        }
        let records = match f.records {
            Records::Batches(batches) => Records::concatenated(batches),
            // No room for another placeholder (never with sane limits): the partition goes
            // without records this time, as when the response is full.
            Records::File(extent) => splices.placeholder(extent).unwrap_or_default(),
        };
        // Kafka lists aborted transactions only in a read-committed answer of a partition it
        // read; the list is null for a read-uncommitted one and for a failed read, and empty
        // (the field's default) for a partition it does not know.
        let aborted_transactions =
            (f.error_code == unknown || (f.error_code == 0 && read_committed)).then(|| {
                f.aborted_transactions
                    .iter()
                    .map(|a| {
                        AbortedTransaction::default()
                            .with_producer_id(ProducerId(a.producer_id))
                            .with_first_offset(a.first_offset.0)
                    })
                    .collect()
            });
        let mut pd = PartitionData::default()
            .with_partition_index(w.partition)
            .with_error_code(f.error_code)
            .with_high_watermark(f.high_watermark)
            .with_last_stable_offset(f.last_stable_offset)
            .with_log_start_offset(f.log_start_offset)
            .with_aborted_transactions(aborted_transactions)
            .with_records(Some(records));
        if version >= CLIENT_RACK_VERSION {
            pd.preferred_read_replica = BrokerId(f.preferred_read_replica);
        }
        if let (Some((epoch, end_offset)), true) = (f.diverging_epoch, version >= 12) {
            pd.diverging_epoch = pd
                .diverging_epoch
                .with_epoch(epoch)
                .with_end_offset(end_offset);
        }
        let same = current.is_some_and(|t| Arc::ptr_eq(t, &w.topic) || **t == *w.topic);
        match topics.last_mut() {
            Some(t) if same => t.partitions.push(pd),
            _ => {
                let mut t = FetchableTopicResponse::default().with_partitions(vec![pd]);
                if version >= 13 {
                    t.topic_id = w.topic_id;
                } else {
                    t.topic = TopicName(StrBytes::from_string(w.topic.to_string()));
                }
                topics.push(t);
                current = Some(&w.topic);
            }
        }
    }
    work.add(wanted.len());
    topics
}

/// KIP-951: each partition answered NOT_LEADER_OR_FOLLOWER names its leader and epoch (from
/// version 12), and the response the leaders' endpoints (from 16), so that the client moves
/// without a metadata round trip. Walks the response in `assemble`'s order.
fn leader_hints(
    image: &MetadataImage,
    listener: &str,
    version: i16,
    wanted: &[Wanted],
    keep: &[bool],
    response: &mut FetchResponse,
) {
    let not_leader = ResponseError::NotLeaderOrFollower.code();
    let mut kept = wanted.iter().zip(keep).filter(|(_, &k)| k).map(|(w, _)| w);
    let mut endpoints: Vec<NodeEndpoint> = Vec::new();
    for t in &mut response.responses {
        for pd in &mut t.partitions {
            let Some(w) = kept.next() else { return };
            if pd.error_code != not_leader {
                continue;
            }
            let Some((p, leader)) = image
                .leader_of(&w.topic, w.partition)
                .filter(|(p, _)| p.leader >= 0)
            else {
                continue;
            };
            pd.current_leader = LeaderIdAndEpoch::default()
                .with_leader_id(p.leader.into())
                .with_leader_epoch(p.leader_epoch);
            if let Some(b) = leader.filter(|b| !b.fenced && version >= 16) {
                if !endpoints.iter().any(|e| e.node_id.0 == b.id) {
                    endpoints.push(
                        NodeEndpoint::default()
                            .with_node_id(b.id.into())
                            .with_host(StrBytes::from_string(b.on(listener).0.to_string()))
                            .with_port(b.on(listener).1 as i32)
                            .with_rack(b.rack.clone().map(StrBytes::from_string)),
                    );
                }
            }
        }
    }
    response.node_endpoints = endpoints;
}

/// Waits until any of the listeners fires or the deadline passes.
pub async fn wait_any(listeners: Vec<Pin<Box<event_listener::EventListener>>>, timeout: Duration) {
    let mut listeners = listeners;
    let woken = futures_lite::future::poll_fn(move |cx| {
        for l in listeners.iter_mut() {
            if l.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        Poll::Pending
    });
    // Other shards notify `appended` and drop the listeners' wakers on their own threads: never
    // let those be glommio task wakers (see `shard::wake`).
    let woken = crate::shard::wake::owner_woken(woken);
    futures_lite::future::or(woken, glommio::timer::sleep(timeout)).await;
}

/// Answers a fetch; the records it splices from segment files are in `splices`.
pub async fn handle(
    shard: &Rc<Shard>,
    client: &super::Client,
    request: FetchRequest,
    version: i16,
    splices: &mut Splices,
) -> FetchResponse {
    use super::authz::{self, operation};
    let image = shard.image();
    let mut work = Work::default();
    let follower = if version >= 15 {
        request.replica_state.replica_id.0 >= 0
    } else {
        request.replica_id.0 >= 0
    };
    // The authorizer: a follower needs CLUSTER_ACTION; a consumer READ on each topic, those
    // it may not read answered TOPIC_AUTHORIZATION_FAILED.
    if follower && !authz::cluster(shard, client, operation::CLUSTER_ACTION) {
        return FetchResponse::default()
            .with_error_code(ResponseError::ClusterAuthorizationFailed.code());
    }
    let (wanted, unknown_ids) = wanted_partitions(&image, &request, version);
    let forgotten = forgotten_partitions(&image, &request, version);
    work.add(wanted.len() + forgotten.len());
    let applied = shard.fetch_sessions.borrow_mut().apply(
        request.session_id,
        request.session_epoch,
        version,
        wanted,
        &forgotten,
        &mut work,
    );
    let Applied {
        wanted,
        session_id,
        incremental,
    } = match applied {
        Ok(applied) => applied,
        Err(code) => {
            tracing::debug!(
                session_id = request.session_id,
                epoch = request.session_epoch,
                code,
                "fetch session error"
            );
            return FetchResponse::default().with_error_code(code);
        }
    };
    // Checked after the session is applied, as Kafka does: a partition already in an
    // incremental session is checked on every fetch too, so a revoked READ takes effect at once.
    // Denied partitions stay in the session and are answered with the error each time.
    let (wanted, denied) = if shard.config().authorizer && !follower {
        let mut verdicts: std::collections::HashMap<Arc<str>, bool> = Default::default();
        wanted.into_iter().partition(|w: &Wanted| {
            *verdicts.entry(w.topic.clone()).or_insert_with(|| {
                authz::allowed(
                    shard,
                    client,
                    operation::READ,
                    authz::resource_type::TOPIC,
                    &w.topic,
                )
            })
        })
    } else {
        (wanted, Vec::new())
    };
    let max_wait = Duration::from_millis(request.max_wait_ms.clamp(0, FETCH_WAIT_MS_MAX) as u64);
    let deadline = Instant::now() + max_wait;
    // The broker's `fetch.max.bytes` bounds what the client asks for.
    let response_max = if request.max_bytes <= 0 {
        i32::MAX as usize
    } else {
        request.max_bytes as usize
    }
    .min(shard.config().fetch_max_bytes);
    // A follower's fetch (replica id from the request header field before version 15, from
    // the replica state since): the leader tracks its progress.
    let replica = if version >= 15 {
        Some((
            request.replica_state.replica_id.0,
            request.replica_state.replica_epoch,
        ))
    } else {
        Some((request.replica_id.0, -1))
    }
    .filter(|(id, _)| *id >= 0);
    // A consumer's Fetch v11+ carries its rack (KIP-392) and may read from a follower.
    let client_rack: Option<Arc<str>> = (replica.is_none() && version >= CLIENT_RACK_VERSION)
        .then(|| request.rack_id.as_str().into());
    let reads: Vec<PartitionRead> = wanted
        .iter()
        .map(|w| PartitionRead {
            topic: w.topic.clone(),
            partition: w.partition,
            fetch_offset: Offset(w.offset),
            max_bytes: w.max_bytes.max(0) as usize,
            current_leader_epoch: w.current_leader_epoch,
            last_fetched_epoch: w.last_fetched_epoch,
            replica,
            read_committed: request.isolation_level == 1,
            client_rack: client_rack.clone(),
        })
        .collect();
    // The shards that own any of the partitions: a long poll waits for appends there.
    let mut owners = vec![false; shard.shared.shards];
    for w in &wanted {
        if let Some(o) = image.owner(&w.topic, w.partition, shard.shared.shards) {
            owners[o] = true;
        }
    }
    work.add(wanted.len());
    let mut rounds = 0u32;
    let results = loop {
        rounds += 1;
        // Listen before reading, so an append between the read and the wait is not missed.
        let listeners: Vec<_> = owners
            .iter()
            .enumerate()
            .filter(|(_, &owns)| owns)
            .map(|(o, _)| Box::pin(shard.shared.appended[o].listen()))
            .collect();
        let results =
            read_partitions(shard, &reads, response_max, splices.possible(), &mut work).await;
        let total: usize = results.iter().map(|r| r.records.len()).sum();
        // A diverging epoch goes back at once too: the follower truncates before it can fetch.
        let errors = results
            .iter()
            .any(|r| r.error_code != 0 || r.diverging_epoch.is_some());
        let now = Instant::now();
        if total >= request.min_bytes.max(0) as usize
            || errors
            || now >= deadline
            || wanted.is_empty()
        {
            break results;
        }
        wait_any(listeners, deadline - now).await;
    };

    let sent: usize = results.iter().map(|r| r.records.len()).sum();
    let metrics = &shard.shared.metrics;
    crate::metrics::Metrics::count(
        if replica.is_some() {
            &metrics.replication_bytes_out
        } else {
            &metrics.bytes_out
        },
        sent as u64,
    );
    let mut response = FetchResponse::default();
    if version >= 7 {
        response.session_id = session_id;
    }
    // In an incremental response, a partition appears only if something about it changed.
    let keep = if session_id > 0 {
        shard.fetch_sessions.borrow_mut().record(
            session_id,
            &wanted,
            &results,
            incremental,
            &mut work,
        )
    } else {
        vec![true; wanted.len()]
    };
    let read_committed = request.isolation_level == 1;
    response.responses = assemble(
        version,
        read_committed,
        &wanted,
        results,
        &keep,
        splices,
        &mut work,
    );
    if version >= 12 {
        leader_hints(
            &image,
            &client.listener,
            version,
            &wanted,
            &keep,
            &mut response,
        );
    }
    for w in denied {
        let partition = PartitionData::default()
            .with_partition_index(w.partition)
            .with_error_code(ResponseError::TopicAuthorizationFailed.code())
            .with_high_watermark(-1);
        response.responses.push(
            FetchableTopicResponse::default()
                .with_topic(TopicName(StrBytes::from_string(w.topic.to_string())))
                .with_topic_id(w.topic_id)
                .with_partitions(vec![partition]),
        );
    }
    for (id, partitions) in unknown_ids {
        let parts = partitions
            .into_iter()
            .map(|p| {
                PartitionData::default()
                    .with_partition_index(p)
                    .with_error_code(ResponseError::UnknownTopicId.code())
                    .with_high_watermark(-1)
            })
            .collect();
        response.responses.push(
            FetchableTopicResponse::default()
                .with_topic_id(id)
                .with_partitions(parts),
        );
    }
    tracing::debug!(
        target: WORK_LOG_TARGET,
        session_id,
        incremental,
        partitions = wanted.len(),
        rounds,
        work = work.0,
        "fetch answered"
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::fetch_sessions::FetchSessions;

    fn wanted(topic: &Arc<str>, partitions: std::ops::Range<i32>) -> Vec<Wanted> {
        partitions
            .map(|p| Wanted {
                topic: topic.clone(),
                topic_id: uuid::Uuid::nil(),
                partition: p,
                offset: 0,
                max_bytes: 1 << 20,
                current_leader_epoch: -1,
                last_fetched_epoch: -1,
            })
            .collect()
    }

    fn nothing_new(n: usize, high_watermark: i64) -> Vec<ReadResult> {
        (0..n)
            .map(|_| ReadResult {
                error_code: 0,
                high_watermark,
                last_stable_offset: high_watermark,
                aborted_transactions: Vec::new(),
                log_start_offset: 0,
                records: Records::default(),
                cold: false,
                diverging_epoch: None,
                preferred_read_replica: -1,
            })
            .collect()
    }

    /// A full fetch that opens a session of `partitions`, answered with nothing new.
    fn open(sessions: &mut FetchSessions, all: &[Wanted]) -> i32 {
        let mut work = Work::default();
        let applied = sessions
            .apply(0, 0, 12, all.to_vec(), &[], &mut work)
            .expect("a new session");
        let keep = sessions.record(
            applied.session_id,
            &applied.wanted,
            &nothing_new(all.len(), 5),
            applied.incremental,
            &mut work,
        );
        assert!(
            keep.iter().all(|&k| k),
            "a full response lists every partition"
        );
        applied.session_id
    }

    #[test]
    fn an_incremental_fetch_with_nothing_new_at_10_000_partitions_does_linear_work() {
        const PARTITIONS: usize = 10_000;
        let topic: Arc<str> = "big".into();
        let all = wanted(&topic, 0..PARTITIONS as i32);
        let mut sessions = FetchSessions::default();
        let id = open(&mut sessions, &all);
        let mut work = Work::default();
        let applied = sessions
            .apply(id, 1, 12, Vec::new(), &[], &mut work)
            .expect("the session");
        assert!(applied.incremental);
        assert_eq!(applied.wanted.len(), PARTITIONS);
        let mut results = nothing_new(PARTITIONS, 5);
        crate::shard::read::fill_in_order(
            &mut results,
            &applied
                .wanted
                .iter()
                .map(|w| PartitionRead {
                    topic: w.topic.clone(),
                    partition: w.partition,
                    fetch_offset: Offset(w.offset),
                    max_bytes: w.max_bytes as usize,
                    current_leader_epoch: w.current_leader_epoch,
                    last_fetched_epoch: w.last_fetched_epoch,
                    replica: None,
                    read_committed: false,
                    client_rack: None,
                })
                .collect::<Vec<_>>(),
            1 << 20,
            usize::MAX,
            &mut work,
        );
        let keep = sessions.record(id, &applied.wanted, &results, true, &mut work);
        assert!(keep.iter().all(|&k| !k), "nothing changed, nothing listed");
        let topics = assemble(
            12,
            false,
            &applied.wanted,
            results,
            &keep,
            &mut Splices::default(),
            &mut work,
        );
        assert!(topics.is_empty());
        // Session lookup, fill, record and assembly: a few steps per partition, never a search.
        assert!(
            work.0 <= 5 * PARTITIONS as u64,
            "{} steps for {PARTITIONS} partitions",
            work.0
        );
        assert!(work.0 >= 4 * PARTITIONS as u64, "every pass is counted");
    }

    #[test]
    fn served_partitions_move_to_the_back_in_one_pass() {
        const PARTITIONS: usize = 10_000;
        let topic: Arc<str> = "big".into();
        let all = wanted(&topic, 0..PARTITIONS as i32);
        let mut sessions = FetchSessions::default();
        let id = open(&mut sessions, &all);
        let mut work = Work::default();
        let applied = sessions
            .apply(id, 1, 12, Vec::new(), &[], &mut work)
            .unwrap();
        // Every even partition returned records.
        let mut results = nothing_new(PARTITIONS, 5);
        for (i, r) in results.iter_mut().enumerate() {
            if i % 2 == 0 {
                r.records = Records::Batches(vec![bytes::Bytes::from_static(b"batch")]);
            }
        }
        let keep = sessions.record(id, &applied.wanted, &results, true, &mut work);
        assert_eq!(keep.iter().filter(|&&k| k).count(), PARTITIONS / 2);
        assert!(keep.iter().enumerate().all(|(i, &k)| k == (i % 2 == 0)));
        let order = sessions.order(id);
        let expected: Vec<(String, i32)> = (1..PARTITIONS as i32)
            .step_by(2)
            .chain((0..PARTITIONS as i32).step_by(2))
            .map(|p| ("big".to_string(), p))
            .collect();
        assert_eq!(order, expected);
        assert!(work.0 <= 4 * PARTITIONS as u64, "{} steps", work.0);
    }

    #[test]
    fn incremental_requests_update_in_place_add_at_the_back_and_forget() {
        let a: Arc<str> = "a".into();
        let b: Arc<str> = "b".into();
        let mut sessions = FetchSessions::default();
        let id = open(&mut sessions, &wanted(&a, 0..3));
        let mut update = wanted(&a, 1..2);
        update[0].offset = 7;
        update.extend(wanted(&b, 0..1));
        let mut work = Work::default();
        let applied = sessions
            .apply(id, 1, 12, update, &[(a.clone(), 0)], &mut work)
            .unwrap();
        let got: Vec<(String, i32, i64)> = applied
            .wanted
            .iter()
            .map(|w| (w.topic.to_string(), w.partition, w.offset))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a".to_string(), 1, 7),
                ("a".to_string(), 2, 0),
                ("b".to_string(), 0, 0)
            ]
        );
        // A stale epoch and an unknown session are top-level errors.
        assert_eq!(
            sessions
                .apply(id, 1, 12, Vec::new(), &[], &mut work)
                .unwrap_err(),
            ResponseError::InvalidFetchSessionEpoch.code()
        );
        assert_eq!(
            sessions
                .apply(id + 1, 1, 12, Vec::new(), &[], &mut work)
                .unwrap_err(),
            ResponseError::FetchSessionIdNotFound.code()
        );
    }

    #[test]
    fn consecutive_partitions_of_a_topic_share_one_topic_entry() {
        let a: Arc<str> = "a".into();
        let b: Arc<str> = "b".into();
        let mut all = wanted(&a, 0..2);
        all.extend(wanted(&b, 0..2));
        all.extend(wanted(&a, 2..3));
        let results = nothing_new(all.len(), 3);
        let topics = assemble(
            12,
            false,
            &all,
            results,
            &[true; 5],
            &mut Splices::default(),
            &mut Work::default(),
        );
        let shape: Vec<(String, Vec<i32>)> = topics
            .iter()
            .map(|t| {
                (
                    t.topic.0.to_string(),
                    t.partitions.iter().map(|p| p.partition_index).collect(),
                )
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                ("a".to_string(), vec![0, 1]),
                ("b".to_string(), vec![0, 1]),
                ("a".to_string(), vec![2])
            ]
        );
    }
}
