//! Fetch: whole batches from each partition's owner shard, long-polling up to `max.wait.ms`
//! until `min.bytes` are available, woken by appends on the owner shards.
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
use sluice_engine::{FileExtent, LogError, Offset};

use super::errors::log_error_code;
use crate::net::response::{placeholder_range, Splices};
use crate::shard::Shard;

/// Longest long-poll honoured, whatever the client asks.
pub const FETCH_WAIT_MS_MAX: i32 = 30_000;

#[derive(Clone)]
pub struct Wanted {
    topic: String,
    topic_id: uuid::Uuid,
    partition: i32,
    offset: i64,
    max_bytes: i32,
}

/// Fetch sessions (KIP-227) open on one shard; a client keeps its session on one connection,
/// so a session lives on the shard that accepted it.
pub const FETCH_SESSIONS_PER_SHARD_MAX: usize = 1000;

/// A fetch session: the partitions a client fetches, with what it was last told about each,
/// so an incremental response carries only partitions that changed.
pub struct FetchSession {
    next_epoch: i32,
    partitions: Vec<(Wanted, i64, i64)>,
    last_used: Instant,
}

#[derive(Default)]
pub struct FetchSessions {
    sessions: std::collections::HashMap<i32, FetchSession>,
}

impl FetchSessions {
    fn create(&mut self, partitions: Vec<Wanted>) -> i32 {
        if self.sessions.len() >= FETCH_SESSIONS_PER_SHARD_MAX {
            let oldest = self
                .sessions
                .iter()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(&id, _)| id);
            if let Some(id) = oldest {
                self.sessions.remove(&id);
            }
        }
        let mut id = (uuid::Uuid::new_v4().as_u128() as i32) & 0x7fff_ffff;
        while id == 0 || self.sessions.contains_key(&id) {
            id = (uuid::Uuid::new_v4().as_u128() as i32) & 0x7fff_ffff;
        }
        self.sessions.insert(
            id,
            FetchSession {
                next_epoch: 1,
                partitions: partitions.into_iter().map(|w| (w, -2, -2)).collect(),
                last_used: Instant::now(),
            },
        );
        id
    }
}

/// What the request does to the shard's sessions: sessionless, a new full session, or an
/// incremental step in an existing one. Returns the partitions to fetch, the session id to
/// answer with and whether the response is incremental, or a top-level error.
fn apply_session(
    shard: &Shard,
    request: &FetchRequest,
    version: i16,
    wanted: Vec<Wanted>,
) -> Result<(Vec<Wanted>, i32, bool), i16> {
    const FINAL_EPOCH: i32 = -1;
    let mut sessions = shard.fetch_sessions.borrow_mut();
    let (id, epoch) = (request.session_id, request.session_epoch);
    if version < 7 || epoch == FINAL_EPOCH {
        if id > 0 {
            sessions.sessions.remove(&id);
        }
        return Ok((wanted, 0, false));
    }
    if epoch == 0 {
        if id > 0 {
            sessions.sessions.remove(&id);
        }
        let new_id = sessions.create(wanted.clone());
        return Ok((wanted, new_id, false));
    }
    let Some(session) = sessions.sessions.get_mut(&id) else {
        return Err(ResponseError::FetchSessionIdNotFound.code());
    };
    if session.next_epoch != epoch {
        return Err(ResponseError::InvalidFetchSessionEpoch.code());
    }
    session.next_epoch = if epoch == i32::MAX { 1 } else { epoch + 1 };
    session.last_used = Instant::now();
    let image = shard.image();
    for forgotten in &request.forgotten_topics_data {
        let name = if version >= 13 {
            image
                .topic_by_id(forgotten.topic_id)
                .map(|t| t.name.clone())
                .unwrap_or_default()
        } else {
            forgotten.topic.0.to_string()
        };
        session
            .partitions
            .retain(|(w, _, _)| !(w.topic == name && forgotten.partitions.contains(&w.partition)));
    }
    for w in wanted {
        match session
            .partitions
            .iter_mut()
            .find(|(s, _, _)| s.topic == w.topic && s.partition == w.partition)
        {
            Some((s, _, _)) => *s = w,
            None => session.partitions.push((w, -2, -2)),
        }
    }
    Ok((
        session
            .partitions
            .iter()
            .map(|(w, _, _)| w.clone())
            .collect(),
        id,
        true,
    ))
}

#[derive(Default)]
struct Fetched {
    error_code: i16,
    high_watermark: i64,
    log_start_offset: i64,
    records: Records,
}

/// A partition's records: in memory, or where they lie in a segment file.
enum Records {
    Memory(Bytes),
    File(FileExtent),
}

impl Fetched {
    /// A partition that failed: Kafka answers its offsets as unknown (-1) then.
    fn failed(error_code: i16) -> Fetched {
        Fetched {
            error_code,
            high_watermark: -1,
            log_start_offset: -1,
            records: Records::default(),
        }
    }
}

impl Default for Records {
    fn default() -> Records {
        Records::Memory(Bytes::new())
    }
}

impl Records {
    fn len(&self) -> usize {
        match self {
            Records::Memory(b) => b.len(),
            Records::File(e) => e.len as usize,
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Reads `w` on its owner shard: at most `budget` bytes of records, except that when `first` (the
/// response has no records yet) one batch larger than that still goes, so the consumer makes
/// progress, as in Kafka.
async fn read_on_owner(shard: &Rc<Shard>, w: &Wanted, budget: usize, first: bool) -> Fetched {
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
            let mut fetched = Fetched { error_code: 0, high_watermark: hw.0, log_start_offset: log.log_start_offset().0, records: Records::default() };
            if Offset(offset) > hw && Offset(offset) <= log.log_end_offset() {
                // Between the high watermark and the log end: nothing visible yet.
                return fetched;
            }
            if shard.config().fetch_zero_copy && placeholder_range().is_some() {
                match log.read_extent(Offset(offset), budget, hw, first).await {
                    Ok(Some(extent)) => {
                        fetched.records = Records::File(extent);
                        return fetched;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        if !matches!(e, LogError::OffsetOutOfRange { .. } | LogError::Closed) {
                            tracing::warn!(topic = %topic, partition, offset, error = %e, "fetch failed");
                        }
                        return Fetched::failed(log_error_code(&e));
                    }
                }
            }
            match log.read(Offset(offset), budget, hw).await {
                Ok(mut batches) => {
                    if !first {
                        // The log returns a first batch whatever its size; here it must fit.
                        let mut room = budget;
                        let fit = batches
                            .iter()
                            .take_while(|b| {
                                let fits = b.bytes.len() <= room;
                                room = room.saturating_sub(b.bytes.len());
                                fits
                            })
                            .count();
                        batches.truncate(fit);
                    }
                    let total: usize = batches.iter().map(|b| b.bytes.len()).sum();
                    if batches.len() == 1 {
                        fetched.records = Records::Memory(batches[0].bytes.clone());
                    } else if total > 0 {
                        let mut buf = BytesMut::with_capacity(total);
                        for b in &batches {
                            buf.extend_from_slice(&b.bytes);
                        }
                        fetched.records = Records::Memory(buf.freeze());
                    }
                }
                Err(e) => {
                    if !matches!(e, LogError::OffsetOutOfRange { .. } | LogError::Closed) {
                        tracing::warn!(topic = %topic, partition, offset, error = %e, "fetch failed");
                    }
                    return Fetched::failed(log_error_code(&e));
                }
            }
            fetched
        })
        .await
}

/// Fills in the offsets of the partitions at `indexes`, left out of a full response: they are
/// listed with no records and their true high watermark and log start, as Kafka does. One job
/// per owner shard, all at once, rather than a round trip per partition.
async fn offsets_only(
    shard: &Rc<Shard>,
    wanted: &[Wanted],
    indexes: &[usize],
    results: &mut [Fetched],
) {
    let mut by_owner: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for &i in indexes {
        let w = &wanted[i];
        match shard
            .image()
            .owner(&w.topic, w.partition, shard.shared.shards)
        {
            Some(owner) => by_owner.entry(owner).or_default().push(i),
            None => {
                results[i].error_code = ResponseError::UnknownTopicOrPartition.code();
                results[i].high_watermark = -1;
                results[i].log_start_offset = -1;
            }
        }
    }
    let jobs: Vec<_> = by_owner
        .into_iter()
        .map(|(owner, indexes)| {
            let names: Vec<(String, i32)> = indexes
                .iter()
                .map(|&i| (wanted[i].topic.clone(), wanted[i].partition))
                .collect();
            let shard = shard.clone();
            let job = glommio::spawn_local(async move {
                shard
                    .invoke_on(owner, move |s| async move {
                        names
                            .iter()
                            .map(|(topic, p)| {
                                s.partition(topic, *p)
                                    .map(|p| (p.log.high_watermark().0, p.log.log_start_offset().0))
                            })
                            .collect::<Vec<_>>()
                    })
                    .await
            });
            (indexes, job)
        })
        .collect();
    for (indexes, job) in jobs {
        for (i, found) in indexes.into_iter().zip(job.await) {
            match found {
                Some((hw, start)) => {
                    results[i].high_watermark = hw;
                    results[i].log_start_offset = start;
                }
                None => {
                    results[i].error_code = ResponseError::UnknownTopicOrPartition.code();
                    results[i].high_watermark = -1;
                    results[i].log_start_offset = -1;
                }
            }
        }
    }
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
    // Other shards notify `appended` and drop the listeners' wakers on their own threads: never
    // let those be glommio task wakers (see `shard::wake`).
    let woken = crate::shard::wake::owner_woken(woken);
    futures_lite::future::or(woken, glommio::timer::sleep(timeout)).await;
}

/// Answers a fetch; the records it splices from segment files are in `splices`.
pub async fn handle(
    shard: &Rc<Shard>,
    request: FetchRequest,
    version: i16,
    splices: &mut Splices,
) -> FetchResponse {
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
    let (wanted, session_id, incremental) = match apply_session(shard, &request, version, wanted) {
        Ok(x) => x,
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
    let max_wait = Duration::from_millis(request.max_wait_ms.clamp(0, FETCH_WAIT_MS_MAX) as u64);
    let deadline = Instant::now() + max_wait;
    // The broker's `fetch.max.bytes` bounds what the client asks for.
    let response_max = if request.max_bytes <= 0 {
        i32::MAX as usize
    } else {
        request.max_bytes as usize
    }
    .min(shard.config().fetch_max_bytes);
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
        let mut full = Vec::new();
        for (i, w) in wanted.iter().enumerate() {
            let budget = (w.max_bytes.max(0) as usize).min(response_max.saturating_sub(total));
            if budget == 0 && total > 0 {
                // The response is full; the partition's offsets are looked up below.
                full.push(i);
                results.push(Fetched::default());
                continue;
            }
            let fetched = read_on_owner(shard, w, budget.max(1), total == 0).await;
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
            offsets_only(shard, &wanted, &full, &mut results).await;
            break results;
        }
        wait_any(listeners, deadline - now).await;
    };

    let mut response = FetchResponse::default();
    if version >= 7 {
        response.session_id = session_id;
    }
    // In an incremental response, a partition appears only if something about it changed.
    let mut keep = vec![true; wanted.len()];
    if session_id > 0 {
        let mut sessions = shard.fetch_sessions.borrow_mut();
        if let Some(session) = sessions.sessions.get_mut(&session_id) {
            for (i, (w, f)) in wanted.iter().zip(results.iter()).enumerate() {
                if let Some((_, hw, start)) = session
                    .partitions
                    .iter_mut()
                    .find(|(s, _, _)| s.topic == w.topic && s.partition == w.partition)
                {
                    let changed = !f.records.is_empty()
                        || f.error_code != 0
                        || *hw != f.high_watermark
                        || *start != f.log_start_offset;
                    keep[i] = !incremental || changed;
                    *hw = f.high_watermark;
                    *start = f.log_start_offset;
                }
            }
            // Partitions that returned records move to the back of the session, as in Kafka:
            // when a response fills up, the next one starts with the partitions left out.
            let served: Vec<(&str, i32)> = wanted
                .iter()
                .zip(results.iter())
                .filter(|(_, f)| !f.records.is_empty())
                .map(|(w, _)| (w.topic.as_str(), w.partition))
                .collect();
            if !served.is_empty() {
                let (back, front): (Vec<_>, Vec<_>) = std::mem::take(&mut session.partitions)
                    .into_iter()
                    .partition(|(s, _, _)| served.contains(&(s.topic.as_str(), s.partition)));
                session.partitions = front;
                session.partitions.extend(back);
            }
        }
    }
    for ((w, f), keep) in wanted.iter().zip(results).zip(keep) {
        if !keep {
            continue;
        }
        let records = match f.records {
            Records::Memory(bytes) => bytes,
            // No room for another placeholder (never with sane limits): the partition goes
            // without records this time, as when the response is full.
            Records::File(extent) => splices.placeholder(extent).unwrap_or_default(),
        };
        let mut pd = PartitionData::default()
            .with_partition_index(w.partition)
            .with_error_code(f.error_code)
            .with_high_watermark(f.high_watermark)
            .with_last_stable_offset(f.high_watermark)
            .with_log_start_offset(f.log_start_offset)
            .with_aborted_transactions(Some(vec![]))
            .with_records(Some(records));
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
