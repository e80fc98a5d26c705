//! The producer and consumer threads: librdkafka clients driven at the workload's rate.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rand::SeedableRng;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::util::Timeout;
use rdkafka::{ClientContext, Message};

use crate::payload::{filler, key_bytes, now_ns, sent_ns, stamp, Keys};
use crate::stats::{Meter, Transactions};
use crate::workload::Workload;

/// Records every delivery report: publish latency from the message's intended send time.
struct Reports {
    meter: Arc<Meter>,
}

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    /// The intended send time, nanoseconds since the Unix epoch.
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, intended_ns: usize) {
        match result {
            Ok(message) => {
                let latency_ns = now_ns().saturating_sub(intended_ns as u64);
                self.meter.record(message.payload_len(), latency_ns / 1000);
            }
            Err((e, _)) => self.meter.error(|| format!("delivery failed: {e}")),
        }
    }
}

/// A client of the broker at `bootstrap`, with the workload's properties for every client.
pub fn client(bootstrap: &str, w: &Workload) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap);
    for (k, v) in &w.client_config {
        c.set(k, v);
    }
    c
}

pub fn producer_config(bootstrap: &str, w: &Workload) -> ClientConfig {
    let mut c = client(bootstrap, w);
    c.set("acks", &w.acks)
        .set("compression.type", &w.compression)
        .set("batch.size", w.batch_size.to_string())
        .set("linger.ms", w.linger_ms.to_string())
        // A bounded client queue, as the Java producer's 32 MiB buffer.memory: at the maximum
        // rate the producer waits for the broker instead of queueing without end.
        .set("queue.buffering.max.kbytes", "32768")
        .set("message.timeout.ms", "120000");
    if w.transactional {
        // librdkafka refuses a message timeout above the transaction timeout; a minute is
        // Kafka's default transaction timeout and within any broker's maximum (15 minutes).
        c.set("transaction.timeout.ms", TRANSACTION_TIMEOUT_MS.to_string())
            .set("message.timeout.ms", TRANSACTION_TIMEOUT_MS.to_string());
    }
    for (k, v) in &w.producer_config {
        c.set(k, v);
    }
    c
}

pub fn consumer_config(bootstrap: &str, group: &str, w: &Workload) -> ClientConfig {
    let mut c = client(bootstrap, w);
    c.set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "true");
    if w.transactional {
        // Only committed records, once their commit marker is written: end-to-end latency then
        // includes the commit. (librdkafka's default, set here so that no one has to know it.)
        c.set("isolation.level", "read_committed");
    }
    for (k, v) in &w.consumer_config {
        c.set(k, v);
    }
    c
}

/// What one producer thread does.
pub struct ProducerPlan {
    pub index: u32,
    pub topics: Arc<Vec<String>>,
    /// Messages per second for this producer; 0 = as fast as the broker takes them.
    pub rate: f64,
    /// Stop after sending this many payload bytes.
    pub limit_bytes: Option<u64>,
    /// The producer's `transactional.id` on a transactional workload (unique per run).
    pub transactional_id: Option<String>,
}

/// `transaction.timeout.ms` of the transactional producers (and their `message.timeout.ms`).
const TRANSACTION_TIMEOUT_MS: u32 = 60_000;
/// How long a producer waits for `init_transactions`, `commit_transaction` and
/// `abort_transaction`: the transaction timeout, after which the coordinator aborts anyway.
const TRANSACTION_CALL_TIMEOUT: Duration = Duration::from_millis(TRANSACTION_TIMEOUT_MS as u64);
/// Attempts at one commit that fails with a retriable error, before the transaction is aborted.
const COMMIT_ATTEMPTS_MAX: u32 = 3;
/// How often a committing producer checks whether its records are all acknowledged.
const DELIVERED_CHECK_INTERVAL: Duration = Duration::from_micros(200);

/// The transaction a transactional producer has open.
struct OpenTransaction {
    started: Instant,
    records: u64,
}

impl OpenTransaction {
    fn new() -> OpenTransaction {
        OpenTransaction {
            started: Instant::now(),
            records: 0,
        }
    }

    /// Whether the workload's count or time bound says to commit now.
    fn due(&self, w: &Workload) -> bool {
        (w.records_per_transaction > 0 && self.records >= w.records_per_transaction)
            || (w.transaction_interval_ms > 0
                && self.started.elapsed() >= Duration::from_millis(w.transaction_interval_ms))
    }
}

fn timeout(d: Duration) -> Timeout {
    Timeout::After(d)
}

/// Waits until every record sent has been acknowledged and its delivery report handled (by the
/// producer's polling thread), or `timeout` has passed. `commit_transaction` of the rdkafka crate
/// first flushes with its own `flush`, which, while anything is outstanding, polls in slices of
/// 100 ms that each run to their end: every commit would then take a multiple of 100 ms,
/// whatever the broker. Once nothing is outstanding that flush returns at once, so this wait
/// leaves the commit to librdkafka's own flush and the EndTxn round trip.
fn wait_delivered(producer: &ThreadedProducer<Reports>, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while producer.in_flight_count() > 0 && Instant::now() < deadline {
        std::thread::sleep(DELIVERED_CHECK_INTERVAL);
    }
}

/// `begin_transaction`; false (the failure counted) when the producer cannot go on.
fn begin(producer: &ThreadedProducer<Reports>, transactions: &Transactions) -> bool {
    match producer.begin_transaction() {
        Ok(()) => true,
        Err(e) => {
            transactions.failed(|| format!("begin_transaction failed: {e}"));
            false
        }
    }
}

/// Commits the open transaction, retrying a retriable failure up to `COMMIT_ATTEMPTS_MAX`
/// times and aborting it when the commit cannot succeed; every failed attempt and every abort
/// is counted. With `begin_next`, begins the next transaction. Returns false when the producer
/// cannot go on (a fatal error, or an abort or begin that failed).
fn end_transaction(
    producer: &ThreadedProducer<Reports>,
    transactions: &Transactions,
    open: &OpenTransaction,
    begin_next: bool,
) -> bool {
    for attempt in 1..=COMMIT_ATTEMPTS_MAX {
        let start = Instant::now();
        wait_delivered(producer, TRANSACTION_CALL_TIMEOUT);
        match producer.commit_transaction(timeout(TRANSACTION_CALL_TIMEOUT)) {
            Ok(()) => {
                // An empty transaction (a stop right after a commit) commits nothing.
                if open.records > 0 {
                    let latency_us = start.elapsed().as_micros() as u64;
                    transactions.committed(open.records, latency_us);
                }
                return !begin_next || begin(producer, transactions);
            }
            Err(e) => {
                transactions
                    .failed(|| format!("commit_transaction failed (attempt {attempt}): {e}"));
                let (fatal, retriable) = match &e {
                    KafkaError::Transaction(r) => (r.is_fatal(), r.is_retriable()),
                    _ => (false, false),
                };
                if fatal {
                    return false;
                }
                if !retriable {
                    break;
                }
            }
        }
    }
    match producer.abort_transaction(timeout(TRANSACTION_CALL_TIMEOUT)) {
        Ok(()) => {
            transactions.aborted(open.records);
            !begin_next || begin(producer, transactions)
        }
        Err(e) => {
            transactions.failed(|| format!("abort_transaction failed: {e}"));
            false
        }
    }
}

pub fn spawn_producer(
    plan: ProducerPlan,
    mut config: ClientConfig,
    w: &Workload,
    meter: Arc<Meter>,
    transactions: Arc<Transactions>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<JoinHandle<()>> {
    if let Some(id) = &plan.transactional_id {
        config.set("transactional.id", id);
    }
    let producer: ThreadedProducer<Reports> = config
        .create_with_context(Reports {
            meter: meter.clone(),
        })
        .context("creating a producer")?;
    let w = w.clone();
    let handle = std::thread::Builder::new()
        .name(format!("producer-{}", plan.index))
        .spawn(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed + plan.index as u64);
            let mut payload = filler(w.message_size, &mut rng);
            let mut keys = Keys::new(w.keys, w.key_count, w.zipf_exponent, plan.index as u64);
            let mut key = String::new();
            let start = Instant::now();
            let start_ns = now_ns();
            let mut sent_bytes = 0u64;
            let mut seq = 0u64;
            let transactional = plan.transactional_id.is_some();
            if transactional {
                if let Err(e) = producer.init_transactions(timeout(TRANSACTION_CALL_TIMEOUT)) {
                    transactions.failed(|| format!("init_transactions failed: {e}"));
                    return;
                }
                if !begin(&producer, &transactions) {
                    return;
                }
            }
            let mut open = OpenTransaction::new();
            'send: while !stop.load(Ordering::Relaxed) {
                if plan.limit_bytes.is_some_and(|limit| sent_bytes >= limit) {
                    break;
                }
                // On a fixed rate, message n is due at start + n / rate and its latency counts
                // from then, even when the producer is late (no coordinated omission).
                let intended_ns = if plan.rate > 0.0 {
                    let due = Duration::from_secs_f64(seq as f64 / plan.rate);
                    let elapsed = start.elapsed();
                    if due > elapsed {
                        std::thread::sleep(due - elapsed);
                    }
                    start_ns + due.as_nanos() as u64
                } else {
                    now_ns()
                };
                stamp(&mut payload, intended_ns, seq);
                let topic = &plan.topics[(seq % plan.topics.len() as u64) as usize];
                let mut record =
                    BaseRecord::with_opaque_to(topic, intended_ns as usize).payload(&payload[..]);
                if let Some(k) = keys.next(&mut rng) {
                    key_bytes(k, &mut key);
                    record = record.key(key.as_bytes());
                }
                loop {
                    match producer.send(record) {
                        Ok(()) => break,
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                            if stop.load(Ordering::Relaxed) {
                                break 'send;
                            }
                            record = r;
                            std::thread::sleep(Duration::from_micros(200));
                        }
                        Err((e, _)) => {
                            meter.error(|| format!("send failed: {e}"));
                            std::thread::sleep(Duration::from_millis(10));
                            break;
                        }
                    }
                }
                sent_bytes += w.message_size as u64;
                seq += 1;
                if transactional {
                    open.records += 1;
                    if open.due(&w) {
                        if !end_transaction(&producer, &transactions, &open, true) {
                            // Counted; a producer whose transactions cannot go on stops.
                            return;
                        }
                        open = OpenTransaction::new();
                    }
                }
            }
            // The last transaction is committed like the others, so that read_committed
            // consumers can read all that was acknowledged.
            if transactional && !end_transaction(&producer, &transactions, &open, false) {
                return;
            }
            if let Err(e) = producer.flush(Duration::from_secs(120)) {
                meter.error(|| format!("flush failed: {e}"));
            }
        })?;
    Ok(handle)
}

/// How often a consumer thread publishes how many partitions it is assigned.
const ASSIGNMENT_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// One consumer thread of a group: counts what it reads into `consumed` (the group's counter),
/// records end-to-end latency from the payload's send time, and keeps `assigned` at the number
/// of partitions the group has given it (checked every `ASSIGNMENT_CHECK_INTERVAL`).
pub fn spawn_consumer(
    name: String,
    config: ClientConfig,
    topics: Arc<Vec<String>>,
    meter: Arc<Meter>,
    consumed: Arc<AtomicU64>,
    assigned: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<JoinHandle<()>> {
    let consumer: BaseConsumer = config.create().context("creating a consumer")?;
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    consumer.subscribe(&names).context("subscribing")?;
    let handle = std::thread::Builder::new().name(name).spawn(move || {
        let mut checked = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            if checked.elapsed() >= ASSIGNMENT_CHECK_INTERVAL {
                checked = Instant::now();
                let count = consumer.assignment().map_or(0, |a| a.count());
                assigned.store(count as u64, Ordering::Relaxed);
            }
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(message)) => {
                    let payload = message.payload().unwrap_or_default();
                    let latency_ns = sent_ns(payload)
                        .map(|sent| now_ns().saturating_sub(sent))
                        .unwrap_or(0);
                    meter.record(payload.len(), latency_ns / 1000);
                    consumed.fetch_add(1, Ordering::Relaxed);
                }
                Some(Err(e)) => meter.error(|| format!("consume failed: {e}")),
                None => {}
            }
        }
        consumer.unsubscribe();
    })?;
    Ok(handle)
}
