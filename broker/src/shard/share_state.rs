//! The share coordinators of one shard and the share-state persister every shard uses
//! (KIP-932): where the share partitions' state survives a restart or a leader move.
//!
//! Coordinator side: one [`ShareCoordinator`] (`crate::share::coordinator`, I/O-free) per
//! `__share_group_state` partition this shard leads, rebuilt from the partition's log when the
//! leadership arrives (requests get COORDINATOR_LOAD_IN_PROGRESS until it is), dropped when it
//! ends, as the transaction coordinators are (`shard/txn.rs`). [`serve`] runs one state
//! operation on it: a read, a write (fenced by leader and state epoch), an initialization (an
//! offsets reset: a new state epoch) or a delete; every change is appended to the partition and
//! waits for the in-sync replicas before it applies or is answered.
//!
//! Persister side: [`persist`] takes an operation for one share partition to the leader of
//! the `__share_group_state` partition its key hashes to: on this node to the owner shard, on
//! another broker with ReadShareGroupState, WriteShareGroupState, InitializeShareGroupState or
//! DeleteShareGroupState (version 0), which `handlers/share_group_state.rs` answers there with
//! [`serve`]; a summary goes as a ReadShareGroupState with no leader epoch, which fences no
//! one and carries the batches (an offsets describe counts the lag from them).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use kafka_protocol::ResponseError;
use sluice_engine::batch::{BatchBuilder, NewRecord, Records};
use sluice_engine::Timestamp;

use super::{wall_ms, Partition, Shard};
use crate::share::coordinator::{
    ShareCoordinator, SharePartitionKey, ShareState, SHARE_STATE_TOPIC,
};
use crate::share::partition::{RecordState, StateBatch};

/// How long an append to `__share_group_state` waits for the in-sync replicas.
const APPEND_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a state request to another broker may take.
const REMOTE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes read at once while loading a partition.
const LOAD_READ_BYTES: usize = 4 << 20;

/// One operation on a share partition's persisted state.
#[derive(Clone, Debug)]
pub enum StateOp {
    /// ReadShareGroupState by a share partition leader of `leader_epoch`: the state, and older
    /// leaders fenced from here on.
    Read { leader_epoch: i32 },
    /// ReadShareGroupStateSummary: the state, with no side effect.
    Summary,
    /// WriteShareGroupState: the whole state (a snapshot).
    Write(ShareState),
    /// InitializeShareGroupState: nothing in flight from `start_offset`, under `state_epoch`
    /// (`None`: one past the current, which fences every leader's older state).
    Initialize {
        state_epoch: Option<i32>,
        start_offset: i64,
    },
    /// DeleteShareGroupState.
    Delete,
}

/// One `__share_group_state` partition this shard leads.
struct Owned {
    leader_epoch: i32,
    /// `None` while the partition's log is being loaded.
    coordinator: Option<ShareCoordinator>,
}

/// The share coordinators of a shard, by `__share_group_state` partition.
#[derive(Default)]
pub struct ShareCoordinators {
    partitions: RefCell<HashMap<i32, Owned>>,
}

fn no_coordinator(shard: &Shard, index: i32) -> i16 {
    let me = shard.config().node_id;
    match shard.image().leader_of(SHARE_STATE_TOPIC, index) {
        Some((info, _)) if info.leader >= 0 && info.leader != me => {
            ResponseError::NotCoordinator.code()
        }
        Some((info, _)) if info.leader == me => ResponseError::CoordinatorLoadInProgress.code(),
        _ => ResponseError::CoordinatorNotAvailable.code(),
    }
}

fn with_coordinator<T>(
    shard: &Shard,
    index: i32,
    f: impl FnOnce(&mut ShareCoordinator) -> T,
) -> Result<T, i16> {
    let mut partitions = shard.share_coordinators.partitions.borrow_mut();
    match partitions.get_mut(&index) {
        Some(Owned {
            coordinator: Some(c),
            ..
        }) => Ok(f(c)),
        Some(_) => Err(ResponseError::CoordinatorLoadInProgress.code()),
        None => {
            drop(partitions);
            Err(no_coordinator(shard, index))
        }
    }
}

fn still_leading(shard: &Shard, index: i32, epoch: i32) -> bool {
    shard
        .share_coordinators
        .partitions
        .borrow()
        .get(&index)
        .is_some_and(|o| o.leader_epoch == epoch)
}

/// Moves share coordination with the leadership of `__share_group_state` partition `index`
/// (called whenever the partition's role is updated).
pub fn on_leadership(shard: &Rc<Shard>, index: i32, p: &Rc<Partition>) {
    let epoch = p.check_leader(-1).ok().map(|e| e.0);
    let partitions = &shard.share_coordinators.partitions;
    let current = partitions.borrow().get(&index).map(|o| o.leader_epoch);
    if epoch == current {
        return;
    }
    if partitions.borrow_mut().remove(&index).is_some() {
        tracing::info!(
            partition = index,
            "no longer the share coordinator of __share_group_state partition"
        );
    }
    let Some(epoch) = epoch else {
        return;
    };
    partitions.borrow_mut().insert(
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
            match load(&p).await {
                Ok(coordinator) => {
                    let mut partitions = shard.share_coordinators.partitions.borrow_mut();
                    let Some(owned) = partitions
                        .get_mut(&index)
                        .filter(|o| o.leader_epoch == epoch)
                    else {
                        return;
                    };
                    tracing::info!(
                        partition = index,
                        leader_epoch = epoch,
                        share_partitions = coordinator.len(),
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "coordinating the share partitions of __share_group_state partition"
                    );
                    owned.coordinator = Some(coordinator);
                    return;
                }
                Err(e) => {
                    tracing::error!(partition = index, error = %e, "loading a __share_group_state partition failed; trying again in a second");
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
        .share_coordinators
        .partitions
        .borrow()
        .keys()
        .copied()
        .filter(|&i| shard.partition(SHARE_STATE_TOPIC, i).is_none())
        .collect();
    for index in gone {
        shard
            .share_coordinators
            .partitions
            .borrow_mut()
            .remove(&index);
        tracing::info!(
            partition = index,
            "no longer the share coordinator of __share_group_state partition"
        );
    }
}

/// Replays the partition's records up to its high watermark.
async fn load(p: &Partition) -> anyhow::Result<ShareCoordinator> {
    let log = &p.log;
    let end = log.high_watermark();
    let mut cur = log.log_start_offset();
    let mut coordinator = ShareCoordinator::default();
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
                coordinator.replay(key, record.value)?;
            }
        }
    }
    Ok(coordinator)
}

/// Appends one record to partition `index` as its leader and waits until every in-sync
/// replica has it.
async fn append(
    shard: &Shard,
    index: i32,
    key: Vec<u8>,
    value: Option<Vec<u8>>,
) -> Result<(), i16> {
    let Some(p) = shard.partition(SHARE_STATE_TOPIC, index) else {
        return Err(ResponseError::NotCoordinator.code());
    };
    let epoch = p.check_leader(-1)?;
    p.check_acks_all()?;
    let mut builder = BatchBuilder::new();
    builder.push(&NewRecord {
        key: Some(key),
        value,
        headers: Vec::new(),
        timestamp: Timestamp(wall_ms()),
    });
    let batch = builder.build();
    let info = match p.log.append(BytesMut::from(&batch[..]), epoch).await {
        Ok(info) => info,
        Err(e) => {
            tracing::warn!(partition = index, error = %e, "could not append to __share_group_state");
            return Err(crate::errors::log_error_code(&e));
        }
    };
    shard.notify_appended();
    match p
        .wait_acks_all(epoch, info.last_offset.next(), APPEND_TIMEOUT)
        .await
    {
        0 => Ok(()),
        code => Err(code),
    }
}

/// Runs `op` for `key` on this shard's coordinator of `__share_group_state` partition `index`
/// (call on its owner shard): the state for a read, `None` otherwise or when there is none.
pub async fn serve(
    shard: &Rc<Shard>,
    index: i32,
    key: SharePartitionKey,
    op: StateOp,
) -> Result<Option<ShareState>, i16> {
    // A change: the record to append and the state it makes (`None`: the key's tombstone).
    let (record, state) = match op {
        StateOp::Summary => return with_coordinator(shard, index, |c| c.read(&key).cloned()),
        StateOp::Read { leader_epoch } => {
            let found = with_coordinator(shard, index, |c| c.read(&key).cloned())?;
            match found {
                // A new leader read it: from now on the older leaders' writes are fenced,
                // which takes a record, as every change of the state does.
                Some(mut state) if leader_epoch > state.leader_epoch => {
                    state.leader_epoch = leader_epoch;
                    (state.encode(), Some(state))
                }
                found => return Ok(found),
            }
        }
        StateOp::Write(state) => {
            let (_, value) = with_coordinator(shard, index, |c| c.check_write(&key, &state))??;
            (value, Some(state))
        }
        StateOp::Initialize {
            state_epoch,
            start_offset,
        } => {
            let (_, mut state) = with_coordinator(shard, index, |c| c.reset(&key, start_offset))?;
            if let Some(e) = state_epoch {
                state.state_epoch = e;
            }
            (state.encode(), Some(state))
        }
        StateOp::Delete => (Vec::new(), None),
    };
    let value = state.as_ref().map(|_| record);
    append(shard, index, key.encode(), value).await?;
    with_coordinator(shard, index, |c| match state {
        Some(s) => {
            c.apply(key, s.clone());
            Some(s)
        }
        None => {
            c.delete(&key);
            None
        }
    })
}

/// Runs `op` for `key` on this broker's share coordinator of its `__share_group_state`
/// partition, on the owner shard: NOT_COORDINATOR when another broker leads that partition.
pub async fn serve_here(
    shard: &Rc<Shard>,
    key: SharePartitionKey,
    op: StateOp,
) -> Result<Option<ShareState>, i16> {
    let index = key.state_partition(shard.config().share_coordinator_state_topic_partitions);
    let owner = {
        let image = shard.image();
        match image.leader_of(SHARE_STATE_TOPIC, index) {
            Some((info, _)) if info.leader == shard.config().node_id => {
                image.owner(SHARE_STATE_TOPIC, index, shard.shared.shards)
            }
            Some((info, _)) if info.leader >= 0 => return Err(ResponseError::NotCoordinator.code()),
            _ => None,
        }
    };
    let Some(owner) = owner else {
        return Err(ResponseError::CoordinatorNotAvailable.code());
    };
    shard
        .invoke_on(
            owner,
            move |s| async move { serve(&s, index, key, op).await },
        )
        .await
}

/// Runs `op` for `key` at its share coordinator, wherever that is.
pub async fn persist(
    shard: &Rc<Shard>,
    key: SharePartitionKey,
    op: StateOp,
) -> Result<Option<ShareState>, i16> {
    let index = key.state_partition(shard.config().share_coordinator_state_topic_partitions);
    let remote = {
        let image = shard.image();
        match image.leader_of(SHARE_STATE_TOPIC, index) {
            Some((info, _)) if info.leader == shard.config().node_id => None,
            Some((info, Some(broker))) if info.leader >= 0 => {
                Some(broker.address_on(shard.config().inter_broker_listener()))
            }
            _ => return Err(ResponseError::CoordinatorNotAvailable.code()),
        }
    };
    match remote {
        None => serve_here(shard, key, op).await,
        Some(addr) => call_remote(&addr, key, op).await,
    }
}

fn to_wire_batches<T: Default>(
    batches: &[StateBatch],
    make: impl Fn(T, &StateBatch) -> T,
) -> Vec<T> {
    batches.iter().map(|b| make(T::default(), b)).collect()
}

/// Sends `op` to the share coordinator at `addr` (version 0 of the state requests).
async fn call_remote(
    addr: &str,
    key: SharePartitionKey,
    op: StateOp,
) -> Result<Option<ShareState>, i16> {
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::StrBytes;
    let group = GroupId(StrBytes::from_string(key.group_id.clone()));
    let topic_id = key.topic_id;
    let partition = key.partition;
    let (api, request) = match &op {
        // A summary is read whole, with no leader epoch (no one fenced): its batches give the
        // lag.
        StateOp::Read { .. } | StateOp::Summary => (
            ApiKey::ReadShareGroupState,
            RequestKind::ReadShareGroupState(
                ReadShareGroupStateRequest::default()
                    .with_group_id(group.0.clone())
                    .with_topics(vec![
                        read_share_group_state_request::ReadStateData::default()
                            .with_topic_id(topic_id)
                            .with_partitions(vec![
                                read_share_group_state_request::PartitionData::default()
                                    .with_partition(partition)
                                    .with_leader_epoch(match op {
                                        StateOp::Read { leader_epoch } => leader_epoch,
                                        _ => -1,
                                    }),
                            ]),
                    ]),
            ),
        ),
        StateOp::Write(state) => (
            ApiKey::WriteShareGroupState,
            RequestKind::WriteShareGroupState(
                WriteShareGroupStateRequest::default()
                    .with_group_id(group.0.clone())
                    .with_topics(vec![
                        write_share_group_state_request::WriteStateData::default()
                            .with_topic_id(topic_id)
                            .with_partitions(vec![
                                write_share_group_state_request::PartitionData::default()
                                    .with_partition(partition)
                                    .with_state_epoch(state.state_epoch)
                                    .with_leader_epoch(state.leader_epoch)
                                    .with_start_offset(state.start_offset)
                                    .with_state_batches(to_wire_batches(
                                        &state.batches,
                                        |w: write_share_group_state_request::StateBatch, b| {
                                            w.with_first_offset(b.first_offset)
                                                .with_last_offset(b.last_offset)
                                                .with_delivery_state(b.state.wire())
                                                .with_delivery_count(
                                                    b.delivery_count.min(i16::MAX as u16) as i16,
                                                )
                                        },
                                    )),
                            ]),
                    ]),
            ),
        ),
        StateOp::Initialize {
            state_epoch,
            start_offset,
        } => (
            ApiKey::InitializeShareGroupState,
            RequestKind::InitializeShareGroupState(
                InitializeShareGroupStateRequest::default()
                    .with_group_id(group.0.clone())
                    .with_topics(vec![
                        initialize_share_group_state_request::InitializeStateData::default()
                            .with_topic_id(topic_id)
                            .with_partitions(vec![
                                initialize_share_group_state_request::PartitionData::default()
                                    .with_partition(partition)
                                    .with_state_epoch(state_epoch.unwrap_or(-1))
                                    .with_start_offset(*start_offset),
                            ]),
                    ]),
            ),
        ),
        StateOp::Delete => (
            ApiKey::DeleteShareGroupState,
            RequestKind::DeleteShareGroupState(
                DeleteShareGroupStateRequest::default()
                    .with_group_id(group.0.clone())
                    .with_topics(vec![
                        delete_share_group_state_request::DeleteStateData::default()
                            .with_topic_id(topic_id)
                            .with_partitions(vec![
                                delete_share_group_state_request::PartitionData::default()
                                    .with_partition(partition),
                            ]),
                    ]),
            ),
        ),
    };
    const VERSION: i16 = 0;
    let frame = crate::codec::encode_request(api, VERSION, 1, &request).map_err(|e| {
        tracing::error!(error = %e, ?api, "could not encode a share state request");
        ResponseError::UnknownServerError.code()
    })?;
    let answer = crate::peer::call(crate::peer::Route::InterBroker, addr, frame, REMOTE_TIMEOUT)
        .await
        .map_err(|e| {
            tracing::debug!(addr, error = %e, ?api, "share state request to the share coordinator failed");
            ResponseError::CoordinatorNotAvailable.code()
        })?;
    let response = crate::codec::decode_response(api, VERSION, answer).map_err(|e| {
        tracing::warn!(addr, error = %e, ?api, "could not decode the share coordinator's answer");
        ResponseError::UnknownServerError.code()
    })?;
    // Each request names one partition; its answer is the first partition of the first topic.
    let unknown = ResponseError::UnknownServerError.code();
    let fail = |code: i16| if code == 0 { Ok(()) } else { Err(code) };
    fn only<T, P>(results: &[T], partitions: impl Fn(&T) -> &[P]) -> Option<&P> {
        results.first().and_then(|t| partitions(t).first())
    }
    match response {
        ResponseKind::ReadShareGroupState(r) => {
            let p = only(&r.results, |t| &t.partitions).ok_or(unknown)?;
            fail(p.error_code)?;
            if p.state_epoch < 0 && p.start_offset < 0 {
                return Ok(None);
            }
            let batches = p
                .state_batches
                .iter()
                .map(|b| {
                    Ok(StateBatch {
                        first_offset: b.first_offset,
                        last_offset: b.last_offset,
                        state: RecordState::from_wire(b.delivery_state).ok_or(unknown)?,
                        delivery_count: b.delivery_count.max(0) as u16,
                    })
                })
                .collect::<Result<Vec<_>, i16>>()?;
            Ok(Some(ShareState {
                state_epoch: p.state_epoch,
                leader_epoch: match op {
                    StateOp::Read { leader_epoch } => leader_epoch,
                    _ => -1,
                },
                start_offset: p.start_offset,
                batches,
            }))
        }
        ResponseKind::WriteShareGroupState(r) => {
            fail(only(&r.results, |t| &t.partitions).map_or(unknown, |p| p.error_code))?;
            match op {
                StateOp::Write(state) => Ok(Some(state)),
                _ => Ok(None),
            }
        }
        ResponseKind::InitializeShareGroupState(r) => {
            fail(only(&r.results, |t| &t.partitions).map_or(unknown, |p| p.error_code))?;
            Ok(None)
        }
        ResponseKind::DeleteShareGroupState(r) => {
            fail(only(&r.results, |t| &t.partitions).map_or(unknown, |p| p.error_code))?;
            Ok(None)
        }
        _ => Err(unknown),
    }
}

/// Deletes the persisted state of `group_id`'s share partitions of `topic` at their share
/// coordinators (those that have one), and forgets them on this broker's shards: the number
/// deleted, or the first error.
pub async fn delete_topic_state(
    shard: &Rc<Shard>,
    group_id: &str,
    topic: &str,
) -> Result<usize, i16> {
    let Some((topic_id, partitions)) = shard
        .image()
        .topics
        .get(topic)
        .map(|m| (m.id, m.shards.len()))
    else {
        return Ok(0);
    };
    let mut deleted = 0;
    for partition in 0..partitions as i32 {
        let key = SharePartitionKey {
            group_id: group_id.to_string(),
            topic_id,
            partition,
        };
        if persist(shard, key.clone(), StateOp::Summary)
            .await?
            .is_some()
        {
            persist(shard, key, StateOp::Delete).await?;
            deleted += 1;
        }
    }
    let (g, t) = (group_id.to_string(), topic.to_string());
    shard
        .invoke_on_all(move |s| {
            let (g, t) = (g.clone(), t.clone());
            async move { s.share_delete_topic(&g, &t) }
        })
        .await;
    Ok(deleted)
}
