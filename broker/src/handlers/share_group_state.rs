//! The share coordinator's requests (KIP-932), sent by share partition leaders:
//! ReadShareGroupState, WriteShareGroupState, InitializeShareGroupState,
//! DeleteShareGroupState and ReadShareGroupStateSummary. Each partition goes to this broker's
//! coordinator of the `__share_group_state` partition its key hashes to
//! (`shard/share_state.rs`); a key whose partition another broker leads gets NOT_COORDINATOR.
//! Only brokers send them: CLUSTER_ACTION on the cluster (`authz.rs`).

use std::rc::Rc;

use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::shard::share_state::{serve_here, StateOp};
use crate::shard::Shard;
use crate::share::coordinator::{SharePartitionKey, ShareState};
use crate::share::partition::{RecordState, StateBatch};

fn key(group_id: &StrBytes, topic_id: uuid::Uuid, partition: i32) -> SharePartitionKey {
    SharePartitionKey {
        group_id: group_id.to_string(),
        topic_id,
        partition,
    }
}

fn message(code: i16) -> Option<StrBytes> {
    (code != 0).then(|| {
        StrBytes::from_string(
            ResponseError::try_from_code(code)
                .map_or_else(|| format!("error {code}"), |e| e.to_string()),
        )
    })
}

pub async fn read(
    shard: &Rc<Shard>,
    request: ReadShareGroupStateRequest,
) -> ReadShareGroupStateResponse {
    use read_share_group_state_response::{PartitionResult, ReadStateResult};
    let mut response = ReadShareGroupStateResponse::default();
    for t in request.topics {
        let mut out = ReadStateResult::default().with_topic_id(t.topic_id);
        for p in t.partitions {
            let op = StateOp::Read {
                leader_epoch: p.leader_epoch,
            };
            let mut r = PartitionResult::default()
                .with_partition(p.partition)
                .with_state_epoch(-1)
                .with_start_offset(-1);
            match serve_here(shard, key(&request.group_id, t.topic_id, p.partition), op).await {
                Ok(Some(state)) => {
                    r.state_epoch = state.state_epoch;
                    r.start_offset = state.start_offset;
                    r.state_batches = state
                        .batches
                        .iter()
                        .map(|b| {
                            read_share_group_state_response::StateBatch::default()
                                .with_first_offset(b.first_offset)
                                .with_last_offset(b.last_offset)
                                .with_delivery_state(b.state.wire())
                                .with_delivery_count(b.delivery_count.min(i16::MAX as u16) as i16)
                        })
                        .collect();
                }
                // Never written: state epoch and start offset -1, which the reader takes as
                // "initialize from share.auto.offset.reset".
                Ok(None) => {}
                Err(code) => {
                    r.error_code = code;
                    r.error_message = message(code);
                }
            }
            out.partitions.push(r);
        }
        response.results.push(out);
    }
    response
}

pub async fn summary(
    shard: &Rc<Shard>,
    request: ReadShareGroupStateSummaryRequest,
) -> ReadShareGroupStateSummaryResponse {
    use read_share_group_state_summary_response::{PartitionResult, ReadStateSummaryResult};
    let mut response = ReadShareGroupStateSummaryResponse::default();
    for t in request.topics {
        let mut out = ReadStateSummaryResult::default().with_topic_id(t.topic_id);
        for p in t.partitions {
            let mut r = PartitionResult::default()
                .with_partition(p.partition)
                .with_state_epoch(-1)
                .with_leader_epoch(-1)
                .with_start_offset(-1);
            let k = key(&request.group_id, t.topic_id, p.partition);
            match serve_here(shard, k, StateOp::Summary).await {
                Ok(Some(state)) => {
                    r.state_epoch = state.state_epoch;
                    r.leader_epoch = state.leader_epoch;
                    r.start_offset = state.start_offset;
                }
                Ok(None) => {}
                Err(code) => {
                    r.error_code = code;
                    r.error_message = message(code);
                }
            }
            out.partitions.push(r);
        }
        response.results.push(out);
    }
    response
}

pub async fn write(
    shard: &Rc<Shard>,
    request: WriteShareGroupStateRequest,
) -> WriteShareGroupStateResponse {
    use write_share_group_state_response::{PartitionResult, WriteStateResult};
    let mut response = WriteShareGroupStateResponse::default();
    for t in request.topics {
        let mut out = WriteStateResult::default().with_topic_id(t.topic_id);
        for p in t.partitions {
            let mut r = PartitionResult::default().with_partition(p.partition);
            let batches: Result<Vec<StateBatch>, String> = p
                .state_batches
                .iter()
                .map(|b| {
                    let state = RecordState::from_wire(b.delivery_state)
                        .ok_or_else(|| format!("unknown delivery state {}", b.delivery_state))?;
                    if b.last_offset < b.first_offset {
                        return Err(format!(
                            "a state batch from {} to {}",
                            b.first_offset, b.last_offset
                        ));
                    }
                    Ok(StateBatch {
                        first_offset: b.first_offset,
                        last_offset: b.last_offset,
                        state,
                        delivery_count: b.delivery_count.max(0) as u16,
                    })
                })
                .collect();
            let code = match batches {
                Err(why) => {
                    tracing::info!(group = %request.group_id, why, "WriteShareGroupState refused");
                    r.error_message = Some(StrBytes::from_string(why));
                    ResponseError::InvalidRequest.code()
                }
                Ok(batches) => {
                    let state = ShareState {
                        state_epoch: p.state_epoch,
                        leader_epoch: p.leader_epoch,
                        start_offset: p.start_offset,
                        batches,
                    };
                    let k = key(&request.group_id, t.topic_id, p.partition);
                    match serve_here(shard, k, StateOp::Write(state)).await {
                        Ok(_) => 0,
                        Err(code) => {
                            r.error_message = message(code);
                            code
                        }
                    }
                }
            };
            r.error_code = code;
            out.partitions.push(r);
        }
        response.results.push(out);
    }
    response
}

pub async fn initialize(
    shard: &Rc<Shard>,
    request: InitializeShareGroupStateRequest,
) -> InitializeShareGroupStateResponse {
    use initialize_share_group_state_response::{InitializeStateResult, PartitionResult};
    let mut response = InitializeShareGroupStateResponse::default();
    for t in request.topics {
        let mut out = InitializeStateResult::default().with_topic_id(t.topic_id);
        for p in t.partitions {
            let op = StateOp::Initialize {
                state_epoch: (p.state_epoch >= 0).then_some(p.state_epoch),
                start_offset: p.start_offset,
            };
            let k = key(&request.group_id, t.topic_id, p.partition);
            let code = serve_here(shard, k, op).await.err().unwrap_or(0);
            out.partitions.push(
                PartitionResult::default()
                    .with_partition(p.partition)
                    .with_error_code(code)
                    .with_error_message(message(code)),
            );
        }
        response.results.push(out);
    }
    response
}

pub async fn delete(
    shard: &Rc<Shard>,
    request: DeleteShareGroupStateRequest,
) -> DeleteShareGroupStateResponse {
    use delete_share_group_state_response::{DeleteStateResult, PartitionResult};
    let mut response = DeleteShareGroupStateResponse::default();
    for t in request.topics {
        let mut out = DeleteStateResult::default().with_topic_id(t.topic_id);
        for p in t.partitions {
            let k = key(&request.group_id, t.topic_id, p.partition);
            let code = serve_here(shard, k, StateOp::Delete)
                .await
                .err()
                .unwrap_or(0);
            out.partitions.push(
                PartitionResult::default()
                    .with_partition(p.partition)
                    .with_error_code(code)
                    .with_error_message(message(code)),
            );
        }
        response.results.push(out);
    }
    response
}

/// The answer to a state request from a client without CLUSTER_ACTION: `code` for every
/// partition. `None` for other requests.
pub fn refused(request: &RequestKind, code: i16) -> Option<ResponseKind> {
    macro_rules! each {
        ($r:expr, $module:ident, $result:ident, $response:ident) => {{
            use $module::PartitionResult;
            $response::default().with_results(
                $r.topics
                    .iter()
                    .map(|t| {
                        $module::$result::default()
                            .with_topic_id(t.topic_id)
                            .with_partitions(
                                t.partitions
                                    .iter()
                                    .map(|p| {
                                        PartitionResult::default()
                                            .with_partition(p.partition)
                                            .with_error_code(code)
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            )
        }};
    }
    Some(match request {
        RequestKind::ReadShareGroupState(r) => ResponseKind::ReadShareGroupState(each!(
            r,
            read_share_group_state_response,
            ReadStateResult,
            ReadShareGroupStateResponse
        )),
        RequestKind::ReadShareGroupStateSummary(r) => {
            ResponseKind::ReadShareGroupStateSummary(each!(
                r,
                read_share_group_state_summary_response,
                ReadStateSummaryResult,
                ReadShareGroupStateSummaryResponse
            ))
        }
        RequestKind::WriteShareGroupState(r) => ResponseKind::WriteShareGroupState(each!(
            r,
            write_share_group_state_response,
            WriteStateResult,
            WriteShareGroupStateResponse
        )),
        RequestKind::InitializeShareGroupState(r) => {
            ResponseKind::InitializeShareGroupState(each!(
                r,
                initialize_share_group_state_response,
                InitializeStateResult,
                InitializeShareGroupStateResponse
            ))
        }
        RequestKind::DeleteShareGroupState(r) => ResponseKind::DeleteShareGroupState(each!(
            r,
            delete_share_group_state_response,
            DeleteStateResult,
            DeleteShareGroupStateResponse
        )),
        _ => return None,
    })
}
