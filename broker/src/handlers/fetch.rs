//! Fetch: whole batches from each partition's owner shard, long-polling up to `max.wait.ms`
//! until `min.bytes` are available, woken by appends on the owner shards.
//!
//! Copies: batches come from the owner shard's batch cache (no copy) or from a segment read
//! (one copy out of the DMA buffer, one into the cache); they are then concatenated per
//! partition into the response (one copy) and the response is encoded into the frame (one
//! copy). Zero-copy transfer from segment files is not done yet.
//!
//! Fetch sessions (KIP-227) are not implemented: the response carries session id 0, which
//! tells clients to keep sending full fetch requests.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use sluice_engine::{LogError, Offset};

use super::errors::log_error_code;
use crate::shard::Shard;

/// Longest long-poll honoured, whatever the client asks.
pub const FETCH_WAIT_MS_MAX: i32 = 30_000;

struct Wanted {
    topic: String,
    topic_id: uuid::Uuid,
    partition: i32,
    offset: i64,
    max_bytes: i32,
}

#[derive(Default)]
struct Fetched {
    error_code: i16,
    high_watermark: i64,
    log_start_offset: i64,
    records: Bytes,
}

async fn read_on_owner(shard: &Rc<Shard>, w: &Wanted, budget: usize) -> Fetched {
    let Some(owner) = shard
        .image()
        .owner(&w.topic, w.partition, shard.shared.shards)
    else {
        return Fetched {
            error_code: ResponseError::UnknownTopicOrPartition.code(),
            high_watermark: -1,
            log_start_offset: -1,
            ..Default::default()
        };
    };
    let (topic, partition, offset) = (w.topic.clone(), w.partition, w.offset);
    shard
        .invoke_on(owner, move |shard| async move {
            let Some(p) = shard.partition(&topic, partition) else {
                return Fetched { error_code: ResponseError::UnknownTopicOrPartition.code(), high_watermark: -1, log_start_offset: -1, ..Default::default() };
            };
            let log = &p.log;
            let hw = log.high_watermark();
            let mut fetched = Fetched { error_code: 0, high_watermark: hw.0, log_start_offset: log.log_start_offset().0, records: Bytes::new() };
            if Offset(offset) > hw && Offset(offset) <= log.log_end_offset() {
                // Between the high watermark and the log end: nothing visible yet.
                return fetched;
            }
            match log.read(Offset(offset), budget, hw).await {
                Ok(batches) => {
                    let total: usize = batches.iter().map(|b| b.bytes.len()).sum();
                    if batches.len() == 1 {
                        fetched.records = batches[0].bytes.clone();
                    } else if total > 0 {
                        let mut buf = BytesMut::with_capacity(total);
                        for b in &batches {
                            buf.extend_from_slice(&b.bytes);
                        }
                        fetched.records = buf.freeze();
                    }
                }
                Err(e) => {
                    if !matches!(e, LogError::OffsetOutOfRange { .. }) {
                        tracing::warn!(topic = %topic, partition, offset, error = %e, "fetch failed");
                    }
                    fetched.error_code = log_error_code(&e);
                }
            }
            fetched
        })
        .await
}

/// Waits until any of the listeners fires or the deadline passes.
async fn wait_any(listeners: Vec<Pin<Box<event_listener::EventListener>>>, timeout: Duration) {
    let mut listeners = listeners;
    let woken = futures_lite::future::poll_fn(move |cx| {
        for l in listeners.iter_mut() {
            if l.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        Poll::Pending
    });
    futures_lite::future::or(woken, glommio::timer::sleep(timeout)).await;
}

pub async fn handle(shard: &Rc<Shard>, request: FetchRequest, version: i16) -> FetchResponse {
    let image = shard.image();
    let mut wanted = Vec::new();
    let mut unknown_ids = Vec::new();
    for topic in &request.topics {
        let name = if version >= 13 {
            match image.topic_by_id(topic.topic_id) {
                Some(t) => t.name.clone(),
                None => {
                    unknown_ids.push((
                        topic.topic_id,
                        topic
                            .partitions
                            .iter()
                            .map(|p| p.partition)
                            .collect::<Vec<_>>(),
                    ));
                    continue;
                }
            }
        } else {
            topic.topic.0.to_string()
        };
        for p in &topic.partitions {
            wanted.push(Wanted {
                topic: name.clone(),
                topic_id: topic.topic_id,
                partition: p.partition,
                offset: p.fetch_offset,
                max_bytes: p.partition_max_bytes,
            });
        }
    }
    let max_wait = Duration::from_millis(request.max_wait_ms.clamp(0, FETCH_WAIT_MS_MAX) as u64);
    let deadline = Instant::now() + max_wait;
    let response_max = if request.max_bytes <= 0 {
        i32::MAX as usize
    } else {
        request.max_bytes as usize
    };
    let owners: Vec<usize> = {
        let mut o: Vec<usize> = wanted
            .iter()
            .filter_map(|w| image.owner(&w.topic, w.partition, shard.shared.shards))
            .collect();
        o.sort();
        o.dedup();
        o
    };
    let results = loop {
        // Listen before reading, so an append between the read and the wait is not missed.
        let listeners: Vec<_> = owners
            .iter()
            .map(|&o| Box::pin(shard.shared.appended[o].listen()))
            .collect();
        let mut results = Vec::with_capacity(wanted.len());
        let mut total = 0usize;
        let mut errors = false;
        for w in &wanted {
            let budget = (w.max_bytes.max(0) as usize).min(response_max.saturating_sub(total));
            let fetched = if budget == 0 && total > 0 {
                Fetched {
                    error_code: 0,
                    high_watermark: -1,
                    log_start_offset: -1,
                    records: Bytes::new(),
                }
            } else {
                read_on_owner(shard, w, budget.max(1)).await
            };
            total += fetched.records.len();
            errors |= fetched.error_code != 0;
            results.push(fetched);
        }
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

    let mut response = FetchResponse::default();
    for (w, f) in wanted.iter().zip(results) {
        let mut pd = PartitionData::default()
            .with_partition_index(w.partition)
            .with_error_code(f.error_code)
            .with_high_watermark(f.high_watermark)
            .with_last_stable_offset(f.high_watermark)
            .with_log_start_offset(f.log_start_offset)
            .with_aborted_transactions(Some(vec![]))
            .with_records(Some(f.records));
        if version >= 11 {
            pd.preferred_read_replica = BrokerId(-1);
        }
        let same_topic = |t: &FetchableTopicResponse| {
            if version >= 13 {
                t.topic_id == w.topic_id
            } else {
                t.topic.0.as_str() == w.topic
            }
        };
        match response.responses.iter_mut().find(|t| same_topic(t)) {
            Some(t) => t.partitions.push(pd),
            None => {
                let mut t = FetchableTopicResponse::default().with_partitions(vec![pd]);
                if version >= 13 {
                    t.topic_id = w.topic_id;
                } else {
                    t.topic = TopicName(StrBytes::from_string(w.topic.clone()));
                }
                response.responses.push(t);
            }
        }
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
    response
}
