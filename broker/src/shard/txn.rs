//! The transaction coordinators of one shard: one [`TxnCoordinator`] per `__transaction_state`
//! partition this shard leads, and the I/O its two-step transitions ask for.
//!
//! Lifecycle, as the group coordinator's (`Shard::on_offsets_leadership`): when a shard's
//! replica of a `__transaction_state` partition becomes leader, the coordinator is rebuilt from
//! the partition's log with the leader epoch as its coordinator epoch, and the markers of the
//! transactions the previous coordinator left in PrepareCommit/PrepareAbort are written again.
//! Until the load is done requests get COORDINATOR_LOAD_IN_PROGRESS. When the leadership ends
//! the coordinator is dropped; work in flight for it (appends, markers) notices the changed
//! epoch and stops, and clients get NOT_COORDINATOR and find the new coordinator.
//!
//! Requests reach any shard; the handlers hop to the owner shard of the id's partition
//! ([`owner_of`]) and call the coordinator there. Records are appended to the partition with
//! acks=all semantics (every in-sync replica has them before the transition applies), markers
//! are written by each partition's leader: on this node with `write_txn_markers::write_marker`,
//! on another broker with a WriteTxnMarkers request to it. Markers are retried until written or
//! until this shard stops being the coordinator. A periodic task per loaded coordinator aborts
//! transactions past their timeout and expires idle transactional ids.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::{
    ApiKey, ProducerId, RequestKind, ResponseKind, TopicName, WriteTxnMarkersRequest,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use sluice_engine::batch::{BatchBuilder, NewRecord, Records};
use sluice_engine::Timestamp;

use super::markers::{write_marker, Marker};
use super::{wall_ms, Partition, Shard};
use crate::config::BrokerConfig;
pub use crate::txn::partition_for;
use crate::txn::{
    ProducerIds, Step, TopicPartition, TransactionVersion, TxnAppend, TxnConfig, TxnCoordinator,
    TxnListing, TxnMarkers, TxnResponse, TxnResult, TRANSACTION_STATE_TOPIC,
};

/// How long an append to `__transaction_state` waits for the in-sync replicas (Kafka's
/// `request.timeout.ms` default, which its coordinator's appends use).
const APPEND_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a WriteTxnMarkers request to another broker may take.
const REMOTE_MARKER_TIMEOUT: Duration = Duration::from_secs(30);
/// Backoff between attempts to write a marker (the partition's leader moving, a broker down).
const MARKER_RETRY_MIN: Duration = Duration::from_millis(50);
const MARKER_RETRY_MAX: Duration = Duration::from_secs(2);
/// Backoff before a Complete* record that failed to append is appended again.
const COMPLETE_RETRY: Duration = Duration::from_millis(200);
/// Bytes read at once while loading a partition.
const LOAD_READ_BYTES: usize = 4 << 20;

const _: () = assert!(MARKER_RETRY_MIN.as_millis() < MARKER_RETRY_MAX.as_millis());

/// The coordinator's settings from the broker's.
pub fn txn_config(config: &BrokerConfig) -> TxnConfig {
    TxnConfig {
        transaction_max_timeout_ms: config.transaction_max_timeout_ms,
        transactional_id_expiration_ms: config.transactional_id_expiration_ms,
        // The cluster's `transaction.version`: the records the coordinator writes, and how its
        // own aborts bump epochs, are Kafka's at that level.
        transaction_version_level: TransactionVersion(config.transaction_version),
    }
}

/// One `__transaction_state` partition this shard leads.
struct Owned {
    leader_epoch: i32,
    /// `None` while the partition's log is being loaded.
    coordinator: Option<TxnCoordinator>,
}

/// The transaction coordinators of a shard, by `__transaction_state` partition.
#[derive(Default)]
pub struct TxnCoordinators {
    partitions: RefCell<HashMap<i32, Owned>>,
    /// Partition leaders' adds (transaction version 2) waiting for the add in flight for the
    /// same transactional id, to go in one record after it (`verify::local`). An id is a key
    /// while an add for it is in flight.
    pub(super) adds_waiting: RefCell<HashMap<String, Vec<super::txn_verify::WaitingAdd>>>,
}

/// The error for a transactional request when this shard has no loaded coordinator for
/// partition `index`: NOT_COORDINATOR when another broker leads it, COORDINATOR_LOAD_IN_PROGRESS
/// while it is led here and loading, else COORDINATOR_NOT_AVAILABLE.
pub fn no_coordinator(shard: &Shard, index: i32) -> ResponseError {
    let me = shard.config().node_id;
    match shard.image().leader_of(TRANSACTION_STATE_TOPIC, index) {
        Some((info, _)) if info.leader >= 0 && info.leader != me => ResponseError::NotCoordinator,
        Some((info, _)) if info.leader == me => ResponseError::CoordinatorLoadInProgress,
        _ => ResponseError::CoordinatorNotAvailable,
    }
}

/// The shard that owns the `__transaction_state` partition of `transactional_id` on this node,
/// and the partition; the error to answer when there is none.
pub fn owner_of(shard: &Shard, transactional_id: &str) -> Result<(usize, i32), ResponseError> {
    let index = partition_for(
        transactional_id,
        shard.config().transaction_state_log_partitions,
    );
    match shard
        .image()
        .owner(TRANSACTION_STATE_TOPIC, index, shard.shared.shards)
    {
        Some(owner) => Ok((owner, index)),
        None => Err(no_coordinator(shard, index)),
    }
}

/// Runs `f` on the loaded coordinator of partition `index` (on its owner shard).
pub fn with_coordinator<T>(
    shard: &Shard,
    index: i32,
    f: impl FnOnce(&mut TxnCoordinator) -> T,
) -> Result<T, ResponseError> {
    let transaction_version = TransactionVersion(shard.transaction_version());
    let mut partitions = shard.txns.partitions.borrow_mut();
    match partitions.get_mut(&index) {
        Some(Owned {
            coordinator: Some(c),
            ..
        }) => {
            // The cluster's level may have changed since the last call (UpdateFeatures).
            c.set_transaction_version(transaction_version);
            Ok(f(c))
        }
        Some(_) => Err(ResponseError::CoordinatorLoadInProgress),
        None => {
            drop(partitions);
            Err(no_coordinator(shard, index))
        }
    }
}

/// ListTransactions over every coordinator this shard hosts (see [`TxnCoordinator::list`]);
/// COORDINATOR_LOAD_IN_PROGRESS while any of them is loading, as Kafka answers while one of its
/// `__transaction_state` partitions loads.
pub fn list_local(
    shard: &Shard,
    producer_id_filters: &[ProducerId],
    state_filters: &[String],
    duration_filter_ms: i64,
    now_ms: i64,
) -> Result<Vec<TxnListing>, ResponseError> {
    let partitions = shard.txns.partitions.borrow();
    let mut listings = Vec::new();
    for owned in partitions.values() {
        let Some(c) = &owned.coordinator else {
            return Err(ResponseError::CoordinatorLoadInProgress);
        };
        let list = c.list(
            producer_id_filters,
            state_filters,
            duration_filter_ms,
            now_ms,
        );
        listings.extend(list.transaction_states);
    }
    Ok(listings)
}

fn still_leading(shard: &Shard, index: i32, epoch: i32) -> bool {
    shard
        .txns
        .partitions
        .borrow()
        .get(&index)
        .is_some_and(|o| o.leader_epoch == epoch)
}

/// Moves transaction coordination with the leadership of `__transaction_state` partition
/// `index` (called whenever the partition's role is updated).
pub fn on_leadership(shard: &Rc<Shard>, index: i32, p: &Rc<Partition>) {
    let epoch = p.check_leader(-1).ok().map(|e| e.0);
    let current = shard
        .txns
        .partitions
        .borrow()
        .get(&index)
        .map(|o| o.leader_epoch);
    if epoch == current {
        return;
    }
    if shard.txns.partitions.borrow_mut().remove(&index).is_some() {
        tracing::info!(
            partition = index,
            "no longer the transaction coordinator of __transaction_state partition"
        );
    }
    let Some(epoch) = epoch else {
        return;
    };
    shard.txns.partitions.borrow_mut().insert(
        index,
        Owned {
            leader_epoch: epoch,
            coordinator: None,
        },
    );
    let shard = shard.clone();
    let p = p.clone();
    glommio::spawn_local(async move {
        let started = std::time::Instant::now();
        while still_leading(&shard, index, epoch) {
            match load(&shard, &p, epoch).await {
                Ok((coordinator, markers)) => {
                    let mut partitions = shard.txns.partitions.borrow_mut();
                    let Some(owned) = partitions
                        .get_mut(&index)
                        .filter(|o| o.leader_epoch == epoch)
                    else {
                        return; // a newer leadership has its own load
                    };
                    tracing::info!(
                        partition = index,
                        leader_epoch = epoch,
                        transactional_ids = coordinator.len(),
                        markers_to_resend = markers.len(),
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "coordinating the transactions of __transaction_state partition"
                    );
                    owned.coordinator = Some(coordinator);
                    drop(partitions);
                    for m in markers {
                        spawn_markers(&shard, index, epoch, m);
                    }
                    spawn_timeouts(&shard, index, epoch);
                    return;
                }
                Err(e) => {
                    // Never served from a partial view: requests keep getting
                    // COORDINATOR_LOAD_IN_PROGRESS and the load starts over.
                    tracing::error!(partition = index, error = %e, "loading a __transaction_state partition failed; trying again in a second");
                    glommio::timer::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    })
    .detach();
}

/// Drops the coordinators of partitions whose replica left this shard.
pub fn drop_gone(shard: &Shard) {
    let gone: Vec<i32> = shard
        .txns
        .partitions
        .borrow()
        .keys()
        .copied()
        .filter(|&i| shard.partition(TRANSACTION_STATE_TOPIC, i).is_none())
        .collect();
    for index in gone {
        shard.txns.partitions.borrow_mut().remove(&index);
        tracing::info!(
            partition = index,
            "no longer the transaction coordinator of __transaction_state partition"
        );
    }
}

/// Reads the partition's records up to its high watermark and rebuilds the coordinator.
async fn load(
    shard: &Shard,
    p: &Partition,
    epoch: i32,
) -> anyhow::Result<(TxnCoordinator, Vec<TxnMarkers>)> {
    let log = &p.log;
    let end = log.high_watermark();
    let mut cur = log.log_start_offset();
    let mut records: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
    while cur < end {
        let batches = log.read(cur, LOAD_READ_BYTES, end).await?;
        if batches.is_empty() {
            break;
        }
        for b in batches {
            cur = b.last_offset.next();
            for record in Records::new(&b.bytes) {
                let record = record.map_err(|e| anyhow::anyhow!("damaged record: {e:?}"))?;
                let Some(key) = record.key else {
                    continue;
                };
                records.push((key.to_vec(), record.value.map(|v| v.to_vec())));
            }
        }
    }
    Ok(TxnCoordinator::load(
        txn_config(shard.config()),
        epoch,
        records,
    )?)
}

pub(super) fn code_error(code: i16) -> ResponseError {
    ResponseError::try_from_code(code).unwrap_or(ResponseError::UnknownServerError)
}

/// Appends one coordinator record to partition `index` as its leader and waits until every
/// in-sync replica has it.
async fn append_record(shard: &Shard, index: i32, append: &TxnAppend) -> Result<(), ResponseError> {
    let Some(p) = shard.partition(TRANSACTION_STATE_TOPIC, index) else {
        return Err(ResponseError::NotLeaderOrFollower);
    };
    let epoch = p.check_leader(-1).map_err(code_error)?;
    p.check_acks_all().map_err(code_error)?;
    let mut builder = BatchBuilder::new();
    builder.push(&NewRecord {
        key: Some(append.key.to_vec()),
        value: append.value.as_ref().map(|v| v.to_vec()),
        headers: Vec::new(),
        timestamp: Timestamp(wall_ms()),
    });
    let batch = builder.build();
    let info = match p.log.append(BytesMut::from(&batch[..]), epoch).await {
        Ok(info) => info,
        Err(e) => {
            tracing::warn!(transactional_id = %append.transactional_id, error = %e, "could not append to __transaction_state");
            return Err(code_error(crate::errors::log_error_code(&e)));
        }
    };
    shard.notify_appended();
    match p
        .wait_acks_all(epoch, info.last_offset.next(), APPEND_TIMEOUT)
        .await
    {
        0 => Ok(()),
        code => Err(code_error(code)),
    }
}

/// Runs a client request on the loaded coordinator of partition `index` (call on its owner
/// shard) and, when it prepares a transition, appends the record and completes it. `request`
/// gets the coordinator, a producer-id allocator and the time. The allocator is asynchronous
/// here (a block of ids comes from the controller), the coordinator's is not: a request that
/// turns out to need a new producer id is run again with one allocated; no state changes before
/// the coordinator asks for an id.
pub async fn run_request(
    shard: &Rc<Shard>,
    index: i32,
    request: impl Fn(&mut TxnCoordinator, ProducerIds<'_>, i64) -> Step,
) -> Result<TxnResponse, ResponseError> {
    let mut allocated: Option<i64> = None;
    let mut attempt = 0;
    let step = loop {
        attempt += 1;
        let mut needed = false;
        let mut at_hand = allocated.take();
        let step = with_coordinator(shard, index, |c| {
            let mut ids = || match at_hand.take() {
                Some(id) => Ok(id),
                None => {
                    needed = true;
                    Err(ResponseError::CoordinatorLoadInProgress)
                }
            };
            request(c, &mut ids, wall_ms())
        })?;
        if needed && attempt == 1 {
            allocated = Some(
                shard
                    .next_producer_id()
                    .await
                    .ok_or(ResponseError::CoordinatorLoadInProgress)?,
            );
            continue;
        }
        break step;
    };
    match step {
        Step::Respond(response) => Ok(response),
        Step::Append(append) => drive(shard, index, append)
            .await
            .ok_or(ResponseError::NotCoordinator),
    }
}

/// Appends `append`, completes its transition and starts what the completion asks for
/// (markers, a retried Complete* record). Returns the client's response, if one waits; `None`
/// when the coordinator is gone too (the caller answers NOT_COORDINATOR).
pub async fn drive(shard: &Rc<Shard>, index: i32, append: TxnAppend) -> Option<TxnResponse> {
    let result = append_record(shard, index, &append).await;
    let completion = with_coordinator(shard, index, |c| {
        c.complete_append(&append, result, wall_ms())
    })
    .ok()?;
    let epoch = append.coordinator_epoch;
    if let Some(markers) = completion.markers {
        spawn_markers(shard, index, epoch, markers);
    }
    if let Some(retry) = completion.retry {
        let shard = shard.clone();
        glommio::spawn_local(async move {
            glommio::timer::sleep(COMPLETE_RETRY).await;
            if still_leading(&shard, index, epoch) {
                drive_boxed(shard.clone(), index, retry).await;
            }
        })
        .detach();
    }
    completion.response
}

fn drive_boxed(
    shard: Rc<Shard>,
    index: i32,
    append: TxnAppend,
) -> Pin<Box<dyn Future<Output = Option<TxnResponse>>>> {
    Box::pin(async move { drive(&shard, index, append).await })
}

/// Writes a transaction's markers to every partition (retrying each until written), then
/// completes the transaction with its Complete* record.
fn spawn_markers(shard: &Rc<Shard>, index: i32, epoch: i32, markers: TxnMarkers) {
    let shard = shard.clone();
    glommio::spawn_local(async move {
        let marker = Marker {
            producer_id: markers.producer_id.0,
            producer_epoch: markers.producer_epoch,
            commit: markers.result == TxnResult::Commit,
            coordinator_epoch: markers.coordinator_epoch,
        };
        let mut writes = Vec::with_capacity(markers.partitions.len());
        for tp in &markers.partitions {
            let shard = shard.clone();
            let tp = tp.clone();
            writes.push(glommio::spawn_local(async move {
                write_until_done(&shard, index, epoch, tp, marker).await
            }));
        }
        let mut written = true;
        for w in writes {
            written &= w.await;
        }
        if !written || !still_leading(&shard, index, epoch) {
            return;
        }
        let next = with_coordinator(&shard, index, |c| {
            c.complete_markers(&markers.transactional_id, wall_ms())
        });
        if let Ok(Some(append)) = next {
            drive_boxed(shard.clone(), index, append).await;
        }
    })
    .detach();
}

/// Writes one marker until its partition's leader has it. `false`: given up (this shard is
/// no longer the coordinator, or the partition refused the marker as from a fenced producer
/// epoch or coordinator, as Kafka's coordinator stops sending then).
async fn write_until_done(
    shard: &Rc<Shard>,
    index: i32,
    epoch: i32,
    tp: TopicPartition,
    marker: Marker,
) -> bool {
    let mut backoff = MARKER_RETRY_MIN;
    loop {
        if !still_leading(shard, index, epoch) {
            return false;
        }
        let image = shard.image();
        if !image.topics.contains_key(&tp.topic) {
            // A deleted topic has nothing left to mark, as in Kafka.
            return true;
        }
        let me = shard.config().node_id;
        let remote = image
            .leader_of(&tp.topic, tp.partition)
            .and_then(|(info, broker)| {
                (info.leader >= 0 && info.leader != me)
                    .then(|| broker.map(|b| b.address_on(shard.config().inter_broker_listener())))
            });
        let code = match remote {
            Some(Some(addr)) => write_remote(&addr, &tp, marker).await,
            Some(None) => ResponseError::NotLeaderOrFollower.code(),
            None => write_marker(shard, tp.topic.clone(), tp.partition, marker).await,
        };
        if code == 0 {
            return true;
        }
        if code == ResponseError::InvalidProducerEpoch.code()
            || code == ResponseError::TransactionCoordinatorFenced.code()
        {
            tracing::warn!(topic = %tp.topic, partition = tp.partition, producer_id = marker.producer_id, code, "a transaction marker was refused as fenced; no longer sending it");
            return false;
        }
        tracing::debug!(topic = %tp.topic, partition = tp.partition, code, "transaction marker not written yet; retrying");
        glommio::timer::sleep(backoff).await;
        backoff = (backoff * 2).min(MARKER_RETRY_MAX);
    }
}

/// Sends WriteTxnMarkers for one partition to the broker at `addr` (its leader) and returns
/// the partition's error code.
async fn write_remote(addr: &str, tp: &TopicPartition, marker: Marker) -> i16 {
    let request =
        WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
            .with_producer_id(ProducerId(marker.producer_id))
            .with_producer_epoch(marker.producer_epoch)
            .with_transaction_result(marker.commit)
            .with_coordinator_epoch(marker.coordinator_epoch)
            .with_topics(vec![WritableTxnMarkerTopic::default()
                .with_name(TopicName(StrBytes::from_string(tp.topic.clone())))
                .with_partition_indexes(vec![tp.partition])])]);
    const VERSION: i16 = 1;
    let frame = match crate::codec::encode_request(
        ApiKey::WriteTxnMarkers,
        VERSION,
        1,
        &RequestKind::WriteTxnMarkers(request),
    ) {
        Ok(frame) => frame,
        Err(e) => {
            tracing::error!(error = %e, "could not encode WriteTxnMarkers");
            return ResponseError::UnknownServerError.code();
        }
    };
    let answer = match crate::peer::call(
        crate::peer::Route::InterBroker,
        addr,
        frame,
        REMOTE_MARKER_TIMEOUT,
    )
    .await
    {
        Ok(answer) => answer,
        Err(e) => {
            tracing::debug!(addr, error = %e, "WriteTxnMarkers to the partition's leader failed");
            return ResponseError::NotLeaderOrFollower.code();
        }
    };
    match crate::codec::decode_response(ApiKey::WriteTxnMarkers, VERSION, answer) {
        Ok(ResponseKind::WriteTxnMarkers(r)) => r
            .markers
            .first()
            .and_then(|m| m.topics.first())
            .and_then(|t| t.partitions.first())
            .map_or(ResponseError::UnknownServerError.code(), |p| p.error_code),
        _ => ResponseError::UnknownServerError.code(),
    }
}

/// Every `transaction.abort.timed.out.transaction.cleanup.interval.ms` while this leadership
/// lasts: aborts the transactions past their timeout and expires idle transactional ids.
fn spawn_timeouts(shard: &Rc<Shard>, index: i32, epoch: i32) {
    let shard = shard.clone();
    let interval = Duration::from_millis(
        shard
            .config()
            .transaction_abort_timed_out_transaction_cleanup_interval_ms,
    );
    glommio::spawn_local(async move {
        loop {
            glommio::timer::sleep(interval).await;
            if !still_leading(&shard, index, epoch) {
                return;
            }
            let now = wall_ms();
            let Ok(appends) = with_coordinator(&shard, index, |c| {
                let mut appends = c.abort_timed_out(now);
                appends.extend(c.expire_transactional_ids(now));
                appends
            }) else {
                return;
            };
            for append in appends {
                tracing::info!(transactional_id = %append.transactional_id, kind = ?append.kind, "transaction coordinator: timing out");
                let shard = shard.clone();
                glommio::spawn_local(async move {
                    drive(&shard, index, append).await;
                })
                .detach();
            }
        }
    })
    .detach();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_matches_kafka_utils_abs_of_java_hash() {
        // Java: "my-txn".hashCode() == -1061187895; Utils.abs gives 1061187895, % 50 == 45.
        assert_eq!(partition_for("my-txn", 50), 45);
        assert_eq!(partition_for("", 50), 0);
        // "polygenelubricants".hashCode() == Integer.MIN_VALUE, which Utils.abs maps to 0.
        assert_eq!(partition_for("polygenelubricants", 50), 0);
    }
}
