//! librdkafka through the `rdkafka` crate against the real broker: 100,000 keyed messages with
//! acks=all over 12 partitions read back in full, replays from an offset and a timestamp, the
//! admin API (create with validate-only, describe and alter configs, create partitions,
//! DeleteRecords, delete), and all four compressions.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::Broker;
use futures_lite::future::block_on;
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewPartitions, NewTopic, ResourceSpecifier,
    TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};

const TIMEOUT: Duration = Duration::from_secs(30);

fn admin(broker: &Broker) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", broker.address())
        .create()
        .expect("admin client")
}

fn options() -> AdminOptions {
    AdminOptions::new().operation_timeout(Some(TIMEOUT))
}

fn create_topic(broker: &Broker, name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        topic = topic.set(k, v);
    }
    let results = block_on(admin(broker).create_topics([&topic], &options())).unwrap();
    assert_eq!(results, vec![Ok(name.to_string())]);
}

/// Where a message was acknowledged (partition, offset), or why it failed.
type Report = Result<(i32, i64), String>;

/// Delivery reports by message index.
struct Reports {
    delivered: Mutex<Vec<Option<Report>>>,
}

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, index: usize) {
        let report = match result {
            Ok(m) => Ok((m.partition(), m.offset())),
            Err((e, _)) => Err(e.to_string()),
        };
        self.delivered.lock().unwrap()[index] = Some(report);
    }
}

fn producer(broker: &Broker, extra: &[(&str, &str)], count: usize) -> ThreadedProducer<Reports> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", broker.address())
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "5");
    for &(k, v) in extra {
        config.set(k, v);
    }
    config
        .create_with_context(Reports {
            delivered: Mutex::new(vec![None; count]),
        })
        .expect("producer")
}

/// Sends every record, waits for every delivery report and returns them, all successful.
fn produce_all(
    producer: &ThreadedProducer<Reports>,
    topic: &str,
    records: &[(Option<Vec<u8>>, Vec<u8>)],
) -> Vec<(i32, i64)> {
    for (i, (key, payload)) in records.iter().enumerate() {
        let mut record = BaseRecord::with_opaque_to(topic, i).payload(payload);
        if let Some(key) = key {
            record = record.key(key);
        }
        let mut record = record;
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((e, r)) => {
                    assert!(e.to_string().contains("Queue full"), "send {i} failed: {e}");
                    record = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(120)).expect("flush");
    let delivered = producer.context().delivered.lock().unwrap();
    delivered
        .iter()
        .enumerate()
        .map(|(i, r)| match r {
            Some(Ok(at)) => *at,
            Some(Err(e)) => panic!("message {i} failed: {e}"),
            None => panic!("message {i} has no delivery report"),
        })
        .collect()
}

struct Read {
    partition: i32,
    offset: i64,
    timestamp: i64,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
}

fn consumer(broker: &Broker) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", broker.address())
        .set("group.id", "rdkafka-test-unused")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "error")
        .create()
        .expect("consumer")
}

/// Reads `count` messages from the given start offsets, and then checks nothing more comes.
fn read(broker: &Broker, topic: &str, starts: &[(i32, Offset)], count: usize) -> Vec<Read> {
    let c = consumer(broker);
    let mut tpl = TopicPartitionList::new();
    for (p, offset) in starts {
        tpl.add_partition_offset(topic, *p, *offset).unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut out = Vec::with_capacity(count);
    let deadline = Instant::now() + Duration::from_secs(120);
    while out.len() < count {
        assert!(
            Instant::now() < deadline,
            "read {} of {count} messages in 120 s",
            out.len()
        );
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => out.push(Read {
                partition: m.partition(),
                offset: m.offset(),
                timestamp: m.timestamp().to_millis().unwrap(),
                key: m.key().map(<[u8]>::to_vec),
                payload: m.payload().unwrap_or_default().to_vec(),
            }),
            Some(Err(e)) => panic!("consume error: {e}"),
            None => {}
        }
    }
    // Nothing beyond what was produced.
    let end = Instant::now() + Duration::from_millis(700);
    while Instant::now() < end {
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            panic!(
                "unexpected extra message at {}:{}",
                m.partition(),
                m.offset()
            );
        }
    }
    out
}

/// The payload of message `i`: its index, then bytes that depend on it, 40 to 167 bytes.
fn payload(i: usize) -> Vec<u8> {
    let mut p = (i as u64).to_le_bytes().to_vec();
    let len = 32 + i % 128;
    p.extend((0..len).map(|j| (i.wrapping_mul(31).wrapping_add(j * 7) % 251) as u8));
    p
}

fn index_of(payload: &[u8]) -> usize {
    u64::from_le_bytes(payload[..8].try_into().unwrap()) as usize
}

#[test]
fn hundred_thousand_keyed_messages_round_trip_with_replays() {
    const COUNT: usize = 100_000;
    const KEYS: usize = 3_000;
    let broker = Broker::start();
    let topic = "rdkafka-keyed";
    create_topic(&broker, topic, 12, &[]);

    let records: Vec<(Option<Vec<u8>>, Vec<u8>)> = (0..COUNT)
        .map(|i| (Some(format!("key-{}", i % KEYS).into_bytes()), payload(i)))
        .collect();
    let p = producer(&broker, &[], COUNT / 2);
    // Half now; a timestamp between the halves (a little later than every first-half
    // timestamp); the second half.
    let first = produce_all(&p, topic, &records[..COUNT / 2]);
    std::thread::sleep(Duration::from_millis(20));
    let split_ms = common::now_ms();
    std::thread::sleep(Duration::from_millis(20));
    let p2 = producer(&broker, &[], COUNT - COUNT / 2);
    let second = produce_all(&p2, topic, &records[COUNT / 2..]);
    let delivered: Vec<(i32, i64)> = first.into_iter().chain(second).collect();

    let starts: Vec<(i32, Offset)> = (0..12).map(|p| (p, Offset::Beginning)).collect();
    let all = read(&broker, topic, &starts, COUNT);
    assert_eq!(all.len(), COUNT);

    let mut by_partition: BTreeMap<i32, Vec<&Read>> = BTreeMap::new();
    for m in &all {
        by_partition.entry(m.partition).or_default().push(m);
    }
    assert_eq!(by_partition.len(), 12, "3,000 keys land in every partition");
    let mut partition_of_key: HashMap<Vec<u8>, i32> = HashMap::new();
    for (p, msgs) in &by_partition {
        for (n, m) in msgs.iter().enumerate() {
            // Offsets 0, 1, 2, … with no gap, and produce order within the partition.
            assert_eq!(m.offset, n as i64, "partition {p}");
            let i = index_of(&m.payload);
            assert_eq!(m.payload, payload(i), "payload of message {i}");
            assert_eq!(
                m.key.as_deref(),
                records[i].0.as_deref(),
                "key of message {i}"
            );
            assert_eq!(
                delivered[i],
                (*p, m.offset),
                "message {i} where acknowledged"
            );
            if n > 0 {
                assert!(index_of(&msgs[n - 1].payload) < i, "produce order in {p}");
            }
            let owner = partition_of_key.entry(m.key.clone().unwrap()).or_insert(*p);
            assert_eq!(*owner, *p, "same key, same partition");
        }
    }
    assert_eq!(partition_of_key.len(), KEYS);

    // Replay partition 3 from the middle.
    let p3 = &by_partition[&3];
    let from = (p3.len() / 2) as i64;
    let replay = read(
        &broker,
        topic,
        &[(3, Offset::Offset(from))],
        p3.len() - from as usize,
    );
    assert_eq!(replay[0].offset, from);
    assert!(replay
        .iter()
        .zip(&p3[from as usize..])
        .all(|(a, b)| a.offset == b.offset && a.payload == b.payload));

    // Replay from a timestamp: offsets_for_times gives, in every partition, the first message
    // stamped at or after it, which is the first message of the second half.
    let c = consumer(&broker);
    let mut query = TopicPartitionList::new();
    for p in 0..12 {
        query
            .add_partition_offset(topic, p, Offset::Offset(split_ms))
            .unwrap();
    }
    let found = c.offsets_for_times(query, TIMEOUT).unwrap();
    for p in 0..12 {
        let msgs = &by_partition[&p];
        let expected = msgs
            .iter()
            .find(|m| m.timestamp >= split_ms)
            .map(|m| m.offset);
        let first_of_second_half = msgs
            .iter()
            .find(|m| index_of(&m.payload) >= COUNT / 2)
            .map(|m| m.offset);
        assert_eq!(expected, first_of_second_half, "partition {p}");
        let got = found.find_partition(topic, p).unwrap().offset();
        match expected {
            Some(offset) => assert_eq!(got, Offset::Offset(offset), "partition {p}"),
            None => assert_eq!(got, Offset::End, "partition {p}"),
        }
    }
    let p5_from = match found.find_partition(topic, 5).unwrap().offset() {
        Offset::Offset(o) => o,
        other => panic!("partition 5: {other:?}"),
    };
    let tail = read(
        &broker,
        topic,
        &[(5, Offset::Offset(p5_from))],
        by_partition[&5].len() - p5_from as usize,
    );
    assert!(tail.iter().all(|m| index_of(&m.payload) >= COUNT / 2));
}

fn topic_config(broker: &Broker, topic: &str, name: &str) -> Option<String> {
    let results =
        block_on(admin(broker).describe_configs([&ResourceSpecifier::Topic(topic)], &options()))
            .unwrap();
    let resource = results.into_iter().next().unwrap().expect("describe topic");
    resource.get(name).and_then(|e| e.value.clone())
}

fn partitions(broker: &Broker, topic: &str) -> Option<usize> {
    let m = consumer(broker)
        .fetch_metadata(Some(topic), TIMEOUT)
        .unwrap();
    let t = &m.topics()[0];
    t.error().is_none().then(|| t.partitions().len())
}

#[test]
fn admin_configs_partitions_delete_records_and_delete() {
    let broker = Broker::start_with(&["--num-partitions", "1"]);
    let topic = "rdkafka-admin";
    let admin = admin(&broker);

    // validate_only checks and creates nothing.
    let new = NewTopic::new(topic, 2, TopicReplication::Fixed(1)).set("retention.ms", "3600000");
    let checked = block_on(admin.create_topics([&new], &options().validate_only(true))).unwrap();
    assert_eq!(checked, vec![Ok(topic.to_string())]);
    let listed = consumer(&broker).fetch_metadata(None, TIMEOUT).unwrap();
    assert!(listed.topics().iter().all(|t| t.name() != topic));

    let created = block_on(admin.create_topics([&new], &options())).unwrap();
    assert_eq!(created, vec![Ok(topic.to_string())]);
    let again = block_on(admin.create_topics([&new], &options())).unwrap();
    assert!(
        matches!(&again[0], Err((t, code)) if t == topic && format!("{code:?}").contains("TopicAlreadyExists")),
        "{again:?}"
    );
    assert_eq!(
        topic_config(&broker, topic, "retention.ms").as_deref(),
        Some("3600000")
    );
    assert_eq!(
        topic_config(&broker, topic, "cleanup.policy").as_deref(),
        Some("delete")
    );

    let alter = AlterConfig::new(ResourceSpecifier::Topic(topic)).set("retention.ms", "7200000");
    let altered = block_on(admin.alter_configs([&alter], &options())).unwrap();
    assert!(altered[0].is_ok(), "{altered:?}");
    assert_eq!(
        topic_config(&broker, topic, "retention.ms").as_deref(),
        Some("7200000")
    );

    let grown =
        block_on(admin.create_partitions([&NewPartitions::new(topic, 4)], &options())).unwrap();
    assert_eq!(grown, vec![Ok(topic.to_string())]);
    assert_eq!(partitions(&broker, topic), Some(4));

    // 100 messages in partition 2, the first 40 deleted.
    let records: Vec<(Option<Vec<u8>>, Vec<u8>)> = (0..100).map(|i| (None, payload(i))).collect();
    let p = producer(&broker, &[], 100);
    for (i, (_, payload)) in records.iter().enumerate() {
        p.send(
            BaseRecord::<(), _, _>::with_opaque_to(topic, i)
                .payload(payload)
                .partition(2),
        )
        .unwrap();
    }
    p.flush(TIMEOUT).unwrap();
    let mut upto = TopicPartitionList::new();
    upto.add_partition_offset(topic, 2, Offset::Offset(40))
        .unwrap();
    let deleted = block_on(admin.delete_records(&upto, &options())).unwrap();
    let low = deleted.find_partition(topic, 2).unwrap();
    assert!(low.error().is_ok(), "{:?}", low.error());
    assert_eq!(low.offset(), Offset::Offset(40));
    let c = consumer(&broker);
    assert_eq!(c.fetch_watermarks(topic, 2, TIMEOUT).unwrap(), (40, 100));
    let rest = read(&broker, topic, &[(2, Offset::Beginning)], 60);
    assert_eq!(rest[0].offset, 40);
    assert_eq!(rest[0].payload, payload(40));
    assert_eq!(rest[59].payload, payload(99));

    let gone = block_on(admin.delete_topics(&[topic], &options())).unwrap();
    assert_eq!(gone, vec![Ok(topic.to_string())]);
    let deadline = Instant::now() + TIMEOUT;
    while partitions(&broker, topic).is_some() {
        assert!(Instant::now() < deadline, "{topic} still listed");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn all_four_compressions_round_trip() {
    let broker = Broker::start();
    for codec in ["gzip", "snappy", "lz4", "zstd"] {
        let topic = format!("rdkafka-{codec}");
        create_topic(&broker, &topic, 3, &[]);
        // Compressible: repeated text with the index in it.
        let records: Vec<(Option<Vec<u8>>, Vec<u8>)> = (0..3000)
            .map(|i| {
                let mut p = (i as u64).to_le_bytes().to_vec();
                p.extend(format!("{codec} message {i} ").repeat(8).into_bytes());
                (Some(format!("k{}", i % 10).into_bytes()), p)
            })
            .collect();
        let p = producer(&broker, &[("compression.type", codec)], records.len());
        let delivered = produce_all(&p, &topic, &records);
        let starts: Vec<(i32, Offset)> = (0..3).map(|p| (p, Offset::Beginning)).collect();
        let all = read(&broker, &topic, &starts, records.len());
        let mut seen = vec![false; records.len()];
        for m in &all {
            let i = index_of(&m.payload);
            assert_eq!(m.payload, records[i].1, "{codec} message {i}");
            assert_eq!(m.key.as_deref(), records[i].0.as_deref());
            assert_eq!(delivered[i], (m.partition, m.offset), "{codec} message {i}");
            assert!(!seen[i], "{codec} message {i} twice");
            seen[i] = true;
        }
        assert!(seen.iter().all(|&s| s), "{codec}: every message");
    }
}
