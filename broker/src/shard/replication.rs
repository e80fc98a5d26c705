//! Partition replication on a shard: the replica fetchers that copy the partitions this shard
//! follows from their leaders, the ISR changes its leaders send to the controller, and the
//! timer that takes lagging followers out of the ISR.
//!
//! One fetcher per (leader broker, shard), as Kafka's `num.replica.fetchers` = 1 per shard: it
//! sends Kafka's Fetch (version 15, with this broker's id and epoch as the replica state) for
//! every partition the shard follows from that leader, appends what comes back as the leader
//! stored it (`Log::append_as_follower`), makes it durable (`Log::flush_for_replica`) and only
//! then fetches again, from the new log end. So the offset a follower reports is on its disk
//! under `flush.mode=batch`, and the leader's high watermark, hence acks=all, counts only
//! records that every ISR member has fdatasync'd. A follower whose log diverged (the leader
//! answers a diverging epoch, KIP-320) truncates to where the logs agree
//! (`sluice_replication::replica::truncation_offset`) and fetches from there.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_lite::{AsyncWriteExt, FutureExt};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ReplicaState};
use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, RequestKind, ResponseKind};
use sluice_replication::controller::AlterPartitionItem;
use sluice_replication::follower::{self, Applied, FetchedPartition};
use sluice_replication::records::{LeaderEpoch, TopicId};
use sluice_replication::replica::{self, IsrAnswer, IsrChange};

use super::partition::Partition;
use super::Shard;
use crate::codec::{decode_response, encode_request};
use crate::peer;

/// The Fetch version followers send: topic ids and the replica state (KIP-903).
const FETCH_VERSION: i16 = 15;
/// `replica.fetch.max.bytes`, Kafka's default: at most this much per partition per fetch.
const REPLICA_FETCH_MAX_BYTES: i32 = 1 << 20;
/// `replica.fetch.response.max.bytes`, Kafka's default.
const REPLICA_FETCH_RESPONSE_MAX_BYTES: i32 = 10 << 20;
/// `replica.fetch.backoff.ms`, Kafka's default: the pause after a failed fetch.
const REPLICA_FETCH_BACKOFF: Duration = Duration::from_millis(1000);
/// How long a fetcher whose every partition is throttled waits for the bucket to refill.
const THROTTLE_PAUSE: Duration = Duration::from_millis(100);
/// How long a fetch may take beyond its wait at the leader before the connection is dropped.
const REPLICA_SOCKET_TIMEOUT: Duration = Duration::from_secs(30);
/// A refused AlterPartition is not proposed again sooner than this: the image that brings the
/// state it was refused for is usually a moment behind.
const ISR_RETRY_BACKOFF: Duration = Duration::from_millis(200);

/// Starts a fetcher for `leader` on this shard unless one runs already.
pub fn ensure_fetcher(shard: &Rc<Shard>, leader: i32) {
    if !shard.fetchers.borrow_mut().insert(leader) {
        return;
    }
    let shard = shard.clone();
    glommio::spawn_local(async move {
        fetch_from(&shard, leader).await;
        shard.fetchers.borrow_mut().remove(&leader);
    })
    .detach();
}

/// A partition this fetcher copies, for one round.
struct Followed {
    topic: String,
    topic_id: uuid::Uuid,
    partition: i32,
    leader_epoch: i32,
    replica: Rc<Partition>,
    /// Named by the topic's `follower.replication.throttled.replicas` for this broker.
    throttled: bool,
}

/// Kafka's follower replication throttle: `follower.replication.throttled.rate` (bytes per
/// second, a dynamic config of this broker or the cluster default) over the partitions a
/// topic's `follower.replication.throttled.replicas` names for this broker (`*`, or
/// `partition:broker` pairs), as `kafka-reassign-partitions --throttle` sets them. A token
/// bucket per shard, holding at most a second of the shard's share of the rate; while it is
/// empty the fetchers leave throttled partitions out of their fetches, as Kafka's do.
#[derive(Debug)]
pub struct ReplicaThrottle {
    /// Bytes that may still be fetched (negative: taken beyond the rate).
    available: f64,
    last: std::time::Instant,
}

impl Default for ReplicaThrottle {
    fn default() -> Self {
        ReplicaThrottle {
            available: 0.0,
            last: std::time::Instant::now(),
        }
    }
}

impl ReplicaThrottle {
    /// Adds what `rate` (bytes per second) allowed since the last call; whether throttled
    /// partitions may be fetched now.
    fn refill(&mut self, rate: f64) -> bool {
        let now = std::time::Instant::now();
        let elapsed = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.available = (self.available + rate * elapsed).min(rate);
        self.available > 0.0
    }

    fn take(&mut self, bytes: usize) {
        self.available -= bytes as f64;
    }
}

/// This shard's share of `follower.replication.throttled.rate`, if one is set.
fn throttle_rate(shard: &Shard) -> Option<f64> {
    let image = shard.image();
    let (value, _) = image.dynamic_broker_config(
        shard.config().node_id,
        "follower.replication.throttled.rate",
    )?;
    let rate: f64 = value.parse().ok().filter(|r: &f64| *r > 0.0)?;
    Some(rate / shard.config().cores.max(1) as f64)
}

/// Whether a topic's `*.replication.throttled.replicas` value names `partition` on `broker`.
pub fn names_replica(value: &str, partition: i32, broker: i32) -> bool {
    let value = value.trim();
    value == "*"
        || value.split(',').any(|pair| {
            pair.trim().split_once(':').is_some_and(|(p, b)| {
                p.trim().parse() == Ok(partition) && b.trim().parse() == Ok(broker)
            })
        })
}

/// The partitions this shard follows from `leader`, in a stable order.
fn followed_from(shard: &Shard, leader: i32) -> Vec<Followed> {
    let image = shard.image();
    let mut out: Vec<Followed> = shard
        .partitions
        .borrow()
        .iter()
        .filter_map(|((topic, partition), p)| {
            let f = p.following().filter(|f| f.leader.0 == leader)?;
            // A log that failed a write or sync takes no more records (the leader sees it fall
            // behind and takes it out of the ISR).
            if p.log.poisoned().is_some() {
                return None;
            }
            let meta = image.topics.get(topic)?;
            let throttled = meta
                .configs
                .get("follower.replication.throttled.replicas")
                .is_some_and(|v| names_replica(v, *partition, shard.config().node_id));
            Some(Followed {
                topic: topic.clone(),
                topic_id: meta.id,
                partition: *partition,
                leader_epoch: f.leader_epoch.0,
                replica: p.clone(),
                throttled,
            })
        })
        .collect();
    out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    out
}

/// A link to the leader's inter-broker listener, opened on first use and again after an error.
struct Connection {
    stream: Option<peer::Link>,
    /// When to replace the link by a new one, before its SASL session ends (KIP-368).
    renew_at: Option<Instant>,
    correlation_id: i32,
}

impl Connection {
    async fn call(&mut self, addr: &str, request: &RequestKind) -> std::io::Result<ResponseKind> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let frame = encode_request(ApiKey::Fetch, FETCH_VERSION, self.correlation_id, request)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        if self.renew_at.is_some_and(|at| Instant::now() >= at) {
            self.stream = None;
        }
        if self.stream.is_none() {
            // (connect sets TCP_NODELAY.)
            let (link, renew_at) =
                peer::connect_for_session(addr, peer::Route::InterBroker).await?;
            self.stream = Some(link);
            self.renew_at = renew_at;
        }
        let stream = self.stream.as_mut().expect("connected");
        stream.write_all(&frame).await?;
        stream.flush().await?;
        let body = peer::read_frame(stream).await?;
        if body.len() < 4
            || i32::from_be_bytes(body[..4].try_into().expect("4 bytes")) != self.correlation_id
        {
            return Err(std::io::Error::other("response to another request"));
        }
        decode_response(ApiKey::Fetch, FETCH_VERSION, body)
            .map_err(|e| std::io::Error::other(e.to_string()))
    }
}

/// Copies every partition this shard follows from `leader` until there are none left.
async fn fetch_from(shard: &Rc<Shard>, leader: i32) {
    let mut connection = Connection {
        stream: None,
        renew_at: None,
        correlation_id: 0,
    };
    let wait_ms = shard.config().replica_fetch_wait_max_ms;
    let mut failures = 0u32;
    tracing::info!(leader, shard = shard.id, "replica fetcher started");
    loop {
        let mut followed = followed_from(shard, leader);
        if followed.is_empty() {
            tracing::info!(
                leader,
                shard = shard.id,
                "replica fetcher stopped: nothing left to follow"
            );
            return;
        }
        let rate = throttle_rate(shard);
        if let Some(rate) = rate {
            if !shard.replica_throttle.borrow_mut().refill(rate) {
                followed.retain(|f| !f.throttled);
                if followed.is_empty() {
                    glommio::timer::sleep(THROTTLE_PAUSE).await;
                    continue;
                }
            }
        }
        let image = shard.image();
        let address = image
            .cluster
            .as_ref()
            .and_then(|c| c.broker(leader))
            .filter(|b| !b.fenced)
            .map(|b| b.address_on(shard.config().inter_broker_listener()));
        let Some(address) = address else {
            glommio::timer::sleep(REPLICA_FETCH_BACKOFF).await;
            continue;
        };
        make_durable(&followed).await;
        let request = fetch_request(shard, &followed, wait_ms);
        let timeout = Duration::from_millis(wait_ms) + REPLICA_SOCKET_TIMEOUT;
        let answer = connection
            .call(&address, &request)
            .or(async {
                glommio::timer::sleep(timeout).await;
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no fetch response in time",
                ))
            })
            .await;
        let response = match answer {
            Ok(ResponseKind::Fetch(r)) => r,
            Ok(_) => unreachable!("a Fetch is answered by a Fetch"),
            Err(e) => {
                connection.stream = None;
                failures += 1;
                if failures == 1 || failures.is_multiple_of(30) {
                    tracing::warn!(leader, %address, error = %e, failures, "replica fetch failed; retrying");
                }
                glommio::timer::sleep(REPLICA_FETCH_BACKOFF).await;
                continue;
            }
        };
        failures = 0;
        if response.error_code != 0 {
            tracing::warn!(
                leader,
                error_code = response.error_code,
                "the leader refused the replica fetch"
            );
            glommio::timer::sleep(REPLICA_FETCH_BACKOFF).await;
            continue;
        }
        if rate.is_some() {
            let by_key: std::collections::HashSet<(uuid::Uuid, i32)> = followed
                .iter()
                .filter(|f| f.throttled)
                .map(|f| (f.topic_id, f.partition))
                .collect();
            let bytes: usize = response
                .responses
                .iter()
                .flat_map(|t| {
                    t.partitions
                        .iter()
                        .filter(|p| by_key.contains(&(t.topic_id, p.partition_index)))
                })
                .map(|p| p.records.as_ref().map_or(0, |r| r.len()))
                .sum();
            shard.replica_throttle.borrow_mut().take(bytes);
        }
        if !apply_response(&followed, response).await {
            glommio::timer::sleep(REPLICA_FETCH_BACKOFF).await;
        }
    }
}

fn fetch_request(shard: &Shard, followed: &[Followed], wait_ms: u64) -> RequestKind {
    let mut topics: Vec<FetchTopic> = Vec::new();
    for f in followed {
        let log = &f.replica.log;
        let last_epoch = log.leader_epochs().last().map(|(e, _)| LeaderEpoch(e.0));
        let replica::FetchPosition::At {
            fetch_offset,
            last_fetched_epoch,
        } = replica::fetch_position(log.log_end_offset().0, log.high_watermark().0, last_epoch)
        else {
            // Made durable before the next round (`make_durable`).
            continue;
        };
        let partition = FetchPartition::default()
            .with_partition(f.partition)
            .with_current_leader_epoch(f.leader_epoch)
            .with_fetch_offset(fetch_offset)
            .with_last_fetched_epoch(last_fetched_epoch.0)
            .with_log_start_offset(log.log_start_offset().0)
            .with_partition_max_bytes(REPLICA_FETCH_MAX_BYTES);
        match topics.last_mut() {
            Some(t) if t.topic_id == f.topic_id => t.partitions.push(partition),
            _ => topics.push(
                FetchTopic::default()
                    .with_topic_id(f.topic_id)
                    .with_partitions(vec![partition]),
            ),
        }
    }
    let broker_epoch = shard.shared.broker_epoch.load(Ordering::Acquire);
    RequestKind::Fetch(
        FetchRequest::default()
            .with_replica_state(
                ReplicaState::default()
                    .with_replica_id(BrokerId(shard.config().node_id))
                    .with_replica_epoch(broker_epoch),
            )
            .with_max_wait_ms(wait_ms as i32)
            .with_min_bytes(1)
            .with_max_bytes(REPLICA_FETCH_RESPONSE_MAX_BYTES)
            .with_isolation_level(0)
            .with_session_id(0)
            .with_session_epoch(-1)
            .with_topics(topics),
    )
}

/// Makes durable what the followed logs hold past their durable end (records a partition
/// wrote while it led, their fdatasync still running when it became a follower), so that each
/// fetches from its log end ([`replica::fetch_position`]).
async fn make_durable(followed: &[Followed]) {
    let flushes: Vec<_> = followed
        .iter()
        .filter(|f| f.replica.log.high_watermark() < f.replica.log.log_end_offset())
        .map(|f| {
            let p = f.replica.clone();
            glommio::spawn_local(async move {
                if let Err(e) = p.log.flush_for_replica().await {
                    tracing::error!(dir = %p.log.dir().display(), error = %e, "making a follower's log durable failed");
                }
            })
        })
        .collect();
    for f in flushes {
        f.await;
    }
}

/// Appends, truncates or starts over each partition as the leader answered, then makes the
/// appended records durable. Returns false when a partition needs a pause before the next
/// fetch (the leader is not the leader any more, or a log failed).
async fn apply_response(
    followed: &[Followed],
    response: kafka_protocol::messages::FetchResponse,
) -> bool {
    let mut healthy = true;
    let mut appended: Vec<Rc<Partition>> = Vec::new();
    // By topic id and partition: no search per partition of the response.
    let by_key: std::collections::HashMap<(uuid::Uuid, i32), &Followed> = followed
        .iter()
        .map(|f| ((f.topic_id, f.partition), f))
        .collect();
    for topic in response.responses {
        for pd in topic.partitions {
            let Some(&f) = by_key.get(&(topic.topic_id, pd.partition_index)) else {
                continue;
            };
            match apply_partition(f, pd).await {
                Ok(true) => appended.push(f.replica.clone()),
                Ok(false) => {}
                Err(()) => healthy = false,
            }
        }
    }
    // One fdatasync per partition that took records, all at once.
    let flushes: Vec<_> = appended
        .into_iter()
        .map(|p| {
            glommio::spawn_local(async move {
                if let Err(e) = p.log.flush_for_replica().await {
                    tracing::error!(dir = %p.log.dir().display(), error = %e, "making replicated records durable failed");
                    return false;
                }
                true
            })
        })
        .collect();
    for f in flushes {
        healthy &= f.await;
    }
    healthy
}

/// One partition of a fetch response, applied by the follower component the simulator drives
/// too (`sluice_replication::follower`). `Ok(true)` when records were appended.
async fn apply_partition(
    f: &Followed,
    pd: kafka_protocol::messages::fetch_response::PartitionData,
) -> Result<bool, ()> {
    // The leadership may have changed while the fetch was out.
    if f.replica
        .following()
        .is_none_or(|now| now.leader_epoch.0 != f.leader_epoch)
    {
        return Ok(false);
    }
    let log = &f.replica.log;
    let end = log.log_end_offset().0;
    let diverging = (pd.diverging_epoch.epoch >= 0 || pd.diverging_epoch.end_offset >= 0)
        .then_some((
            LeaderEpoch(pd.diverging_epoch.epoch),
            pd.diverging_epoch.end_offset,
        ));
    let answer = FetchedPartition {
        error_code: pd.error_code,
        high_watermark: pd.high_watermark,
        log_start_offset: pd.log_start_offset,
        diverging,
        batches: pd.records.map(whole_batches).unwrap_or_default(),
    };
    let (topic, partition) = (&f.topic, f.partition);
    let applied = match follower::apply(log, answer).await {
        Ok(applied) => applied,
        Err(e) => {
            tracing::error!(%topic, partition, error = %e, "applying replicated records failed");
            return Err(());
        }
    };
    if applied.takes_high_watermark() {
        f.replica.set_follower_high_watermark(pd.high_watermark);
    }
    match applied {
        Applied::Appended | Applied::Nothing => {}
        Applied::StoppedBelowLogEnd { base_offset, .. } => {
            tracing::warn!(%topic, partition, base_offset, log_end_offset = end, "a replicated batch starts below the log end; fetching again from there");
        }
        Applied::Truncated { to } => {
            tracing::info!(%topic, partition, diverging_epoch = pd.diverging_epoch.epoch, leader_end_offset = pd.diverging_epoch.end_offset, truncate_to = to, "follower log diverged from its leader's; truncating");
        }
        Applied::StartedOver { at } => {
            tracing::info!(%topic, partition, log_end_offset = end, leader_log_start_offset = at, "follower behind the leader's log start; starting over there");
        }
        Applied::TruncatedToHighWatermark { to } => {
            tracing::info!(%topic, partition, log_end_offset = end, leader_high_watermark = to, "follower ahead of its leader; truncating to the leader's high watermark");
        }
        Applied::Retry => return Err(()),
        Applied::Refused(error_code) => {
            tracing::debug!(%topic, partition, error_code, "the leader refused a partition of the replica fetch");
            return Err(());
        }
    }
    Ok(applied.appended())
}

/// The whole record batches of a fetched records section; a partial batch at the end (the
/// leader cut the response at its byte limit) is left for the next fetch.
pub fn whole_batches(records: Bytes) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while records.len() - at >= 12 {
        let length = i32::from_be_bytes(records[at + 8..at + 12].try_into().expect("4 bytes"));
        let Some(size) = usize::try_from(length).ok().map(|l| l + 12) else {
            break;
        };
        if records.len() - at < size {
            break;
        }
        out.push(records.slice(at..at + size));
        at += size;
    }
    out
}

/// Sends a leader's ISR change to the controller (AlterPartition, through shard 0's metadata
/// node) and applies the answer. One change per partition is in flight at a time; a change
/// proposed meanwhile is dropped, and the next fetch or tick proposes again.
pub fn send_isr_change(
    shard: &Rc<Shard>,
    topic: &str,
    partition: i32,
    p: &Rc<Partition>,
    change: IsrChange,
) {
    if p.isr_change_in_flight.replace(true) {
        p.drop_unsent_isr_change();
        return;
    }
    let Some(topic_id) = shard.image().topics.get(topic).map(|t| t.id) else {
        p.isr_change_in_flight.set(false);
        p.drop_unsent_isr_change();
        return;
    };
    tracing::info!(topic, partition, isr = ?change.new_isr.iter().map(|(b, _)| b.0).collect::<Vec<_>>(), "asking the controller to change the ISR");
    let shard = shard.clone();
    let p = p.clone();
    let topic = topic.to_string();
    glommio::spawn_local(async move {
        loop {
            let item = AlterPartitionItem {
                topic_id: TopicId(topic_id),
                partition_id: partition,
                leader_epoch: change.leader_epoch,
                partition_epoch: change.partition_epoch,
                new_isr: change.new_isr.clone(),
            };
            let asked = std::time::Instant::now();
            let answer = shard
                .invoke_on(0, move |s0| async move {
                    let controller = s0.controller()?;
                    controller.alter_partition(vec![item]).await
                })
                .await;
            sluice_engine::waits::record(sluice_engine::waits::Wait::Controller, asked.elapsed(), || {
                format!("AlterPartition of {topic}-{partition}")
            });
            let result = answer
                .filter(|r| r.error_code == 0)
                .and_then(|r| r.partitions.into_iter().next());
            match result {
                Some(r) if r.error_code == 0 => {
                    tracing::info!(topic, partition, isr = ?r.isr.iter().map(|b| b.0).collect::<Vec<_>>(), partition_epoch = r.partition_epoch.0, "ISR changed");
                    p.on_isr_answer(&change, IsrAnswer::Committed {
                        isr: r.isr,
                        partition_epoch: r.partition_epoch,
                    });
                    break;
                }
                Some(r) => {
                    tracing::debug!(topic, partition, error_code = r.error_code, "the controller refused the ISR change");
                    glommio::timer::sleep(ISR_RETRY_BACKOFF).await;
                    p.on_isr_answer(&change, IsrAnswer::Refused {
                        leader_epoch: r.leader_epoch,
                        isr: r.isr,
                        partition_epoch: r.partition_epoch,
                    });
                    break;
                }
                None => {
                    // No answer: the controller may have committed it. It stays pending (its
                    // members count for the high watermark) and goes again, unless an image
                    // settled it meanwhile.
                    glommio::timer::sleep(ISR_RETRY_BACKOFF).await;
                    if p.pending_isr_change().as_ref() != Some(&change) {
                        break;
                    }
                    tracing::debug!(topic, partition, "no answer to the ISR change; sending it again");
                }
            }
        }
        p.isr_change_in_flight.set(false);
    })
    .detach();
}

/// Every half `replica.lag.time.max.ms` (as Kafka's ISR expiration), the partitions this
/// shard leads drop followers that fell behind from their ISR.
pub async fn expire_lagging_followers(shard: Rc<Shard>) {
    let period = Duration::from_millis((shard.config().replica_lag_time_max_ms / 2).max(50));
    loop {
        glommio::timer::sleep(period).await;
        let leaders: Vec<((String, i32), Rc<Partition>)> = shard
            .partitions
            .borrow()
            .iter()
            .filter(|(_, p)| p.is_leader())
            .map(|(k, p)| (k.clone(), p.clone()))
            .collect();
        for ((topic, partition), p) in leaders {
            if let Some(change) = p.tick() {
                send_isr_change(&shard, &topic, partition, &p, change);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    #[test]
    fn whole_batches_leave_a_partial_one_for_the_next_fetch() {
        let one =
            sluice_engine::batch::simple_batch(&[(None, Some(b"a"))], sluice_engine::Timestamp(1));
        let two = sluice_engine::batch::simple_batch(
            &[(Some(b"k"), Some(b"bb"))],
            sluice_engine::Timestamp(2),
        );
        let mut all = BytesMut::new();
        all.extend_from_slice(&one);
        all.extend_from_slice(&two);
        all.extend_from_slice(&one[..20]);
        let got = whole_batches(all.freeze());
        assert_eq!(got.len(), 2);
        assert_eq!(&got[0][..], &one[..]);
        assert_eq!(&got[1][..], &two[..]);
        assert!(whole_batches(Bytes::from_static(&[0; 11])).is_empty());
    }
}
