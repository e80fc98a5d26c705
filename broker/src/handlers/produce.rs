//! Produce: each partition's batch goes to the shard that owns the partition, which must lead
//! it; the batch is stamped with the leader epoch. The response waits until every append is as
//! durable on the leader as its topic's `flush.mode` says (acks=1), and for acks=all also until
//! the high watermark passed it: every ISR member has it, fdatasync'd under `flush.mode=batch`.
//! acks=all is refused with NOT_ENOUGH_REPLICAS while the ISR is below `min.insync.replicas`,
//! and answered NOT_ENOUGH_REPLICAS_AFTER_APPEND when it shrank below it meanwhile, as in Kafka.
//! acks=0 gets no response at all. A batch refused because
//! of some of its records names them in `record_errors` (KIP-467, Produce v8+), so the producer
//! fails exactly those.

use std::rc::Rc;

use bytes::Bytes;
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, LeaderIdAndEpoch, NodeEndpoint, PartitionProduceResponse,
    TopicProduceResponse,
};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use futures_channel::oneshot;
use sluice_engine::batch::BatchHeader;
use sluice_engine::AppendInfo;
use sluice_replication::produce::{self, Refusal};

use crate::handlers::order::Turn;
use crate::shard::partition::Partition;
use crate::shard::txn_verify as verify;
use crate::shard::{wake, Shard};

struct Outcome {
    error_code: i16,
    error_message: Option<String>,
    /// The records that made the batch be refused (KIP-467): batch index and message.
    record_errors: Vec<(i32, String)>,
    base_offset: i64,
    log_append_time_ms: i64,
    log_start_offset: i64,
}

impl Outcome {
    fn error(code: i16, message: Option<String>) -> Outcome {
        Outcome::from(Refusal::new(code, message))
    }
}

impl From<Refusal> for Outcome {
    fn from(r: Refusal) -> Outcome {
        Outcome {
            error_code: r.error_code,
            error_message: r.message,
            record_errors: r.record_errors,
            base_offset: -1,
            log_append_time_ms: -1,
            log_start_offset: r.log_start_offset.unwrap_or(-1),
        }
    }
}

impl From<AppendInfo> for Outcome {
    fn from(info: AppendInfo) -> Outcome {
        Outcome {
            error_code: 0,
            error_message: None,
            record_errors: Vec::new(),
            base_offset: info.base_offset.0,
            log_append_time_ms: info.log_append_time.0,
            log_start_offset: info.log_start_offset.0,
        }
    }
}

/// What a produce request says about its transaction, for KIP-890's verification.
#[derive(Clone)]
struct Txn {
    transactional_id: Option<String>,
    /// The request's version: 11+ knows TRANSACTION_ABORTABLE, 12+ may rely on the leader to
    /// add the partition (at `transaction.version` 2).
    version: i16,
}

/// A verification that takes longer is logged.
const SLOW_VERIFICATION: std::time::Duration = std::time::Duration::from_secs(1);

/// Appends on the partition's owner shard; `in_order` completes (or is dropped) once the
/// batch holds its place in the log's append order, or is refused.
#[allow(clippy::too_many_arguments)]
async fn append_on_owner(
    shard: &Rc<Shard>,
    topic: String,
    partition: i32,
    records: Option<Bytes>,
    acks: i16,
    timeout: std::time::Duration,
    txn: Txn,
    in_order: oneshot::Sender<()>,
) -> Outcome {
    let image = shard.image();
    let Some(owner) = image.owner(&topic, partition, shard.shared.shards) else {
        let code = image.missing_partition_error(shard.config().node_id, &topic, partition);
        return Outcome::error(code, None);
    };
    let Some(records) = records else {
        return Outcome::error(
            ResponseError::InvalidRecord.code(),
            Some("no records".into()),
        );
    };
    shard
        .invoke_on(owner, move |shard| async move {
            let produce = Produce {
                topic,
                partition,
                records,
                acks,
                timeout,
                txn,
            };
            match produce.append_here(&shard, in_order).await {
                Ok(info) => Outcome::from(info),
                Err(refusal) => Outcome::from(refusal),
            }
        })
        .await
}

/// One partition's part of a produce request, on the partition's owner shard.
struct Produce {
    topic: String,
    partition: i32,
    records: Bytes,
    acks: i16,
    timeout: std::time::Duration,
    txn: Txn,
}

impl Produce {
    /// The leader's side of the produce (`sluice_replication::produce`, which the simulator
    /// runs too), with KIP-890's verification between the checks and the append.
    async fn append_here(
        self,
        shard: &Rc<Shard>,
        in_order: oneshot::Sender<()>,
    ) -> Result<AppendInfo, Refusal> {
        let Produce {
            topic,
            partition,
            records,
            acks,
            timeout,
            ref txn,
        } = self;
        crate::shard::replica_move::wait_out_pause(shard, &topic, partition).await;
        let Some(p) = shard.partition(&topic, partition) else {
            return Err(Refusal::new(
                ResponseError::UnknownTopicOrPartition.code(),
                None,
            ));
        };
        produce::leader_epoch(&p.replica.borrow())?;
        let header = BatchHeader::parse(&records).ok();
        if let Err(refused) = produce::check_batch(header.as_ref()) {
            tracing::warn!(topic = %topic, partition, "produce refused: a client sent a control batch");
            return Err(refused);
        }
        let verified = match header
            .as_ref()
            .and_then(|h| needs_verification(shard, &p, h, txn))
        {
            Some((producer_id, producer_epoch, transactional_id, operation)) => {
                let guard = p.start_txn_verification(producer_id, producer_epoch);
                verify_in_transaction(
                    shard,
                    (&topic, partition),
                    transactional_id,
                    (producer_id, producer_epoch),
                    operation,
                    txn.version,
                )
                .await?;
                Some((producer_id, guard))
            }
            None => None,
        };
        // The leadership may have moved while the coordinator was asked.
        let leader_epoch = produce::admit(&p.replica.borrow(), acks).inspect_err(|r| {
            if r.error_code == ResponseError::NotEnoughReplicas.code() {
                tracing::debug!(topic = %topic, partition, "acks=all refused: the ISR is below min.insync.replicas");
            }
        })?;
        // Checked with no await before the append: a marker written since the verification
        // started ended the transaction the batch was verified against.
        if let Some((producer_id, guard)) = verified {
            if let Err(e) = p.finish_txn_verification(producer_id, guard) {
                tracing::debug!(topic = %topic, partition, producer_id, error = ?e, "transactional produce refused: its transaction ended while it was verified");
                return Err(Refusal::new(
                    e.code(),
                    Some("the transaction ended while the partition was verified".into()),
                ));
            }
        }
        let signal = move || {
            let _ = in_order.send(());
        };
        // Fetches waiting on this shard look again as soon as the batch is readable: a
        // follower copies it while this log makes it durable.
        let waiting = shard.clone();
        let buffered = move || waiting.notify_appended();
        let info = match produce::append(&p.log, &records, leader_epoch, signal, buffered).await {
            Ok(info) => info,
            Err(e) => {
                tracing::warn!(topic = %topic, partition, error = %e, "produce refused");
                return Err(Refusal::of(
                    &e,
                    &topic,
                    partition,
                    p.log.log_start_offset().0,
                ));
            }
        };
        shard.notify_appended();
        let metrics = &shard.shared.metrics;
        let records_in = info.last_offset.0 - info.base_offset.0 + 1;
        crate::metrics::Metrics::count(&metrics.messages_in, records_in.max(0) as u64);
        crate::metrics::Metrics::count(&metrics.bytes_in, records.len() as u64);
        if acks == produce::ACKS_ALL {
            let code = p
                .wait_acks_all(leader_epoch, info.last_offset.next(), timeout)
                .await;
            if code != 0 {
                tracing::debug!(topic = %topic, partition, code, "acks=all produce not acknowledged by the ISR");
                return Err(Refusal {
                    log_start_offset: Some(info.log_start_offset.0),
                    ..Refusal::new(code, None)
                });
            }
        }
        Ok(info)
    }
}

/// Whether a batch must be verified with its transaction coordinator before it is appended
/// (KIP-890): a transaction's first batch here, of a request that names its transactional id
/// (only those can be verified, as in Kafka), when verification is on or the transaction
/// version lets the leader add the partition. Returns the producer, the transactional id and
/// whether to verify or add.
fn needs_verification(
    shard: &Shard,
    p: &Partition,
    header: &BatchHeader<'_>,
    txn: &Txn,
) -> Option<(i64, i16, String, verify::Operation)> {
    let add = txn.version >= verify::PRODUCE_ADD_VERSION && shard.transaction_version() >= 2;
    if !(add || shard.config().transaction_partition_verification_enable) {
        return None;
    }
    let (producer_id, producer_epoch) = (header.producer_id(), header.producer_epoch());
    if !header.is_transactional()
        || producer_id < 0
        || p.log.producer_in_transaction(producer_id, producer_epoch)
        || p.txn_verified(producer_id, producer_epoch)
    {
        return None;
    }
    let operation = if add {
        verify::Operation::Add
    } else {
        verify::Operation::Verify
    };
    Some((
        producer_id,
        producer_epoch,
        txn.transactional_id.clone()?,
        operation,
    ))
}

/// Asks the transaction coordinator whether the partition is in the producer's transaction (or
/// to add it); the refusal the producer gets when it is not.
async fn verify_in_transaction(
    shard: &Rc<Shard>,
    (topic, partition): (&str, i32),
    transactional_id: String,
    (producer_id, producer_epoch): (i64, i16),
    operation: verify::Operation,
    version: i16,
) -> Result<(), Refusal> {
    let tp = crate::txn::TopicPartition::new(topic, partition);
    let started = std::time::Instant::now();
    let answer = verify::verify_or_add(
        shard,
        transactional_id.clone(),
        producer_id,
        producer_epoch,
        tp,
        operation,
    )
    .await;
    // The coordinator answers from memory: a slow answer holds the connection's later
    // produces and is worth a line.
    let elapsed = started.elapsed();
    if elapsed > SLOW_VERIFICATION {
        tracing::warn!(topic = %topic, partition, transactional_id, elapsed_ms = elapsed.as_millis() as u64, "a transaction's partition took long to verify with its coordinator");
    }
    let Some(e) = answer else {
        return Ok(());
    };
    let code = verify::error_for_produce(e, version >= verify::PRODUCE_ABORTABLE_VERSION);
    tracing::debug!(topic = %topic, partition, transactional_id, producer_id, producer_epoch, error = ?e, answered = ?code, "transactional produce not verified");
    Err(Refusal::new(
        code.code(),
        Some(format!(
            "the partition could not be verified in the transaction: {e:?}"
        )),
    ))
}

/// The first version that names topics by id (KIP-516), not by name.
const TOPIC_ID_VERSION: i16 = 13;

/// Returns `None` for acks=0: Kafka sends no response then. `turn` is told the request is in
/// order once every batch holds its place in its log, before the appends are durable.
pub async fn handle(
    shard: &Rc<Shard>,
    client: &super::Client,
    request: ProduceRequest,
    version: i16,
    turn: &mut Turn,
) -> Option<ProduceResponse> {
    use super::authz::{self, operation};
    let acks = request.acks;
    // The authorizer, once per request and topic: WRITE on the transactional id, if any, and
    // on each topic.
    let txn_allowed = request
        .transactional_id
        .as_ref()
        .is_none_or(|id| authz::transactional_id(shard, client, operation::WRITE, id.0.as_str()));
    let txn = Txn {
        transactional_id: request.transactional_id.as_ref().map(|t| t.0.to_string()),
        version,
    };
    let timeout = std::time::Duration::from_millis(request.timeout_ms.max(0) as u64);
    let mut tasks = Vec::new();
    let mut placed = Vec::new();
    let image = shard.image();
    for mut topic in request.topic_data {
        // v13 names topics by id (KIP-516); an id this broker does not know fails its
        // partitions with UNKNOWN_TOPIC_ID, as Kafka's.
        let known = if version >= TOPIC_ID_VERSION {
            match image.topic_by_id(topic.topic_id) {
                Some(t) => {
                    topic.name = TopicName(StrBytes::from_string(t.name.clone()));
                    true
                }
                None => false,
            }
        } else {
            true
        };
        let name = topic.name.0.to_string();
        let topic_allowed = known && authz::topic(shard, client, operation::WRITE, &topic.name);
        for p in topic.partition_data {
            let shard = shard.clone();
            let name = name.clone();
            let index = p.index;
            let txn = txn.clone();
            let task = if !known {
                Err(Outcome::error(
                    ResponseError::UnknownTopicId.code(),
                    Some(format!("unknown topic id {}", topic.topic_id)),
                ))
            } else if !txn_allowed {
                Err(Outcome::error(
                    ResponseError::TransactionalIdAuthorizationFailed.code(),
                    None,
                ))
            } else if !topic_allowed {
                Err(Outcome::error(
                    ResponseError::TopicAuthorizationFailed.code(),
                    None,
                ))
            } else if !matches!(acks, -1..=1) {
                Err(Outcome::error(
                    ResponseError::InvalidRequiredAcks.code(),
                    Some(format!("acks={acks} is not -1, 0 or 1")),
                ))
            } else {
                let (tx, rx) = oneshot::channel();
                placed.push(rx);
                Ok(glommio::spawn_local(async move {
                    append_on_owner(&shard, name, index, p.records, acks, timeout, txn, tx).await
                }))
            };
            tasks.push((topic.name.clone(), topic.topic_id, index, task));
        }
    }
    for rx in placed {
        // Completed on the owner shard's thread: never hand it a glommio waker.
        let _ = wake::owner_woken(rx).await;
    }
    turn.in_order();
    let mut response = ProduceResponse::default();
    let image = shard.image();
    let listener: &str = &client.listener;
    for (name, topic_id, index, task) in tasks {
        let outcome = match task {
            Ok(t) => t.await,
            Err(outcome) => outcome,
        };
        let mut pr = PartitionProduceResponse::default()
            .with_index(index)
            .with_error_code(outcome.error_code)
            .with_base_offset(outcome.base_offset)
            .with_log_append_time_ms(outcome.log_append_time_ms);
        if version >= 5 {
            pr.log_start_offset = outcome.log_start_offset;
        }
        if version >= 8 {
            pr.error_message = outcome.error_message.map(StrBytes::from_string);
            pr.record_errors = outcome
                .record_errors
                .into_iter()
                .map(|(index, message)| {
                    BatchIndexAndErrorMessage::default()
                        .with_batch_index(index)
                        .with_batch_index_error_message(Some(StrBytes::from_string(message)))
                })
                .collect();
        }
        // KIP-951: a partition led elsewhere names its leader, so the client moves there
        // without a metadata round trip.
        if version >= 10 && outcome.error_code == ResponseError::NotLeaderOrFollower.code() {
            if let Some((p, leader)) = image
                .leader_of(&name.0, index)
                .filter(|(p, _)| p.leader >= 0)
            {
                pr.current_leader = LeaderIdAndEpoch::default()
                    .with_leader_id(p.leader.into())
                    .with_leader_epoch(p.leader_epoch);
                if let Some(b) = leader.filter(|b| !b.fenced) {
                    if !response.node_endpoints.iter().any(|e| e.node_id.0 == b.id) {
                        response.node_endpoints.push(
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
        let same = |t: &TopicProduceResponse| {
            if version >= TOPIC_ID_VERSION {
                t.topic_id == topic_id
            } else {
                t.name == name
            }
        };
        match response.responses.iter_mut().find(|t| same(t)) {
            Some(t) => t.partition_responses.push(pr),
            None => {
                let mut t = TopicProduceResponse::default().with_partition_responses(vec![pr]);
                if version >= TOPIC_ID_VERSION {
                    t.topic_id = topic_id;
                } else {
                    t.name = name;
                }
                response.responses.push(t);
            }
        }
    }
    if acks == 0 {
        None
    } else {
        Some(response)
    }
}
