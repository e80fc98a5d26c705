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
use rdkafka::{ClientContext, Message};

use crate::payload::{filler, key_bytes, now_ns, sent_ns, stamp, Keys};
use crate::stats::Meter;
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

pub fn producer_config(bootstrap: &str, w: &Workload) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("acks", &w.acks)
        .set("compression.type", &w.compression)
        .set("batch.size", w.batch_size.to_string())
        .set("linger.ms", w.linger_ms.to_string())
        // A bounded client queue, as the Java producer's 32 MiB buffer.memory: at the maximum
        // rate the producer waits for the broker instead of queueing without end.
        .set("queue.buffering.max.kbytes", "32768")
        .set("message.timeout.ms", "120000");
    for (k, v) in &w.producer_config {
        c.set(k, v);
    }
    c
}

pub fn consumer_config(bootstrap: &str, group: &str, w: &Workload) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "true");
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
}

pub fn spawn_producer(
    plan: ProducerPlan,
    config: ClientConfig,
    w: &Workload,
    meter: Arc<Meter>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<JoinHandle<()>> {
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
