//! `sluice produce`: the lines of stdin become records of one topic, like
//! `kafka-console-producer.sh` and `kcat -P`.
//!
//! Records are gathered into one uncompressed batch per partition and sent, one Produce request
//! per partition leader, whenever stdin has nothing more buffered (so interactive input goes
//! out line by line and piped input in large batches) or a batch is full. Keyed records go to
//! the partition Kafka's Java client would choose (murmur2 of the key); records without a key go
//! round-robin over the partitions.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, ProduceRequest};
use sluice_engine::batch::{BatchBuilder, NewRecord};
use sluice_engine::Timestamp;

use super::client::{
    check, find_topic, is_retriable, topic_name, Client, Cluster, REQUEST_TIMEOUT_MS,
};
use super::{parse_key_value, plural, Connection};

/// Largest batch sent for one partition: half of Kafka's default `max.message.bytes` (1 MiB), so
/// a batch of ordinary lines is never refused for its size.
const BATCH_BYTES_MAX: usize = 512 << 10;
/// Largest line read from stdin; a longer one is an error rather than an unbounded buffer.
const LINE_BYTES_MAX: usize = 16 << 20;
/// Bytes buffered from stdin at most, and so about the most one Produce request carries.
const STDIN_BUFFER_BYTES: usize = 1 << 20;
/// Metadata attempts while a topic that was just auto-created has no leader yet.
const METADATA_ATTEMPTS_MAX: u32 = 20;
/// Pause between those attempts.
const METADATA_RETRY_MS: u64 = 250;
/// Bytes a record adds to a batch beyond its key, value and headers (length, attributes,
/// deltas, lengths), an upper bound used to keep batches under `BATCH_BYTES_MAX`.
const RECORD_OVERHEAD_BYTES: usize = 32;

const _: () = assert!(LINE_BYTES_MAX >= BATCH_BYTES_MAX);

#[derive(clap::Args, Debug)]
pub struct ProduceArgs {
    #[command(flatten)]
    connection: Connection,
    /// Topic to write to; created if the broker auto-creates topics.
    topic: String,
    /// Split each line at the first SEP into key and value. Without it, lines are values
    /// without a key.
    #[arg(long, value_name = "SEP")]
    key_separator: Option<String>,
    /// Write every record to this partition instead of choosing by key.
    #[arg(long)]
    partition: Option<i32>,
    /// Acknowledgements to wait for: all (or -1), 1, or 0 (no response at all).
    #[arg(long, default_value = "all", value_parser = parse_acks)]
    acks: i16,
    /// Compression codec of the batches written. Only `none` is implemented.
    #[arg(long, value_enum, default_value_t = Compression::None)]
    compression: Compression,
    /// A header added to every record, e.g. `--header source=cli` (repeatable).
    #[arg(long = "header", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    headers: Vec<(String, String)>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Compression {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

fn parse_acks(s: &str) -> Result<i16, String> {
    match s {
        "all" | "-1" => Ok(-1),
        "1" => Ok(1),
        "0" => Ok(0),
        _ => Err(format!("expected all, -1, 1 or 0, got {s:?}")),
    }
}

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`), which the Java client's
/// default partitioner applies to the key.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let length = data.len();
    let mut h: u32 = SEED ^ (length as u32);
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= (tail[2] as u32) << 16;
    }
    if tail.len() >= 2 {
        h ^= (tail[1] as u32) << 8;
    }
    if !tail.is_empty() {
        h ^= tail[0] as u32;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition Kafka's default partitioner gives a keyed record.
pub fn partition_for_key(key: &[u8], partitions: i32) -> i32 {
    assert!(partitions > 0, "a topic has at least one partition");
    (murmur2(key) & 0x7fff_ffff) % partitions
}

/// What one partition received.
#[derive(Default)]
struct Written {
    records: u64,
    /// First and last offset assigned, unknown with acks=0.
    offsets: Option<(i64, i64)>,
}

/// A batch being filled for one partition.
struct Pending {
    builder: BatchBuilder,
    bytes: usize,
}

struct Producer {
    cluster: Cluster,
    topic: String,
    /// Partition index → leader broker id.
    leaders: BTreeMap<i32, i32>,
    acks: i16,
    pending: BTreeMap<i32, Pending>,
    written: BTreeMap<i32, Written>,
}

pub fn run(args: &ProduceArgs) -> anyhow::Result<()> {
    if args.compression != Compression::None {
        bail!(
            "--compression {:?}: this tool writes uncompressed batches only; use --compression none",
            args.compression
        );
    }
    if args.key_separator.as_deref() == Some("") {
        bail!("--key-separator must not be empty");
    }
    let client = Client::bootstrap(&args.connection.bootstrap_server)?;
    client.version(ApiKey::Produce)?;
    let mut cluster = Cluster::new(client);
    let leaders = topic_leaders(&mut cluster, &args.topic)?;
    let partition_count = leaders.len() as i32;
    if let Some(p) = args.partition {
        if !leaders.contains_key(&p) {
            bail!(
                "topic {} has partitions 0 to {}; there is no partition {p}",
                args.topic,
                partition_count - 1
            );
        }
    }
    let headers: Vec<(Vec<u8>, Option<Vec<u8>>)> = args
        .headers
        .iter()
        .map(|(k, v)| (k.clone().into_bytes(), Some(v.clone().into_bytes())))
        .collect();
    let headers_bytes: usize = headers
        .iter()
        .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len) + 10)
        .sum();
    let mut producer = Producer {
        cluster,
        topic: args.topic.clone(),
        leaders,
        acks: args.acks,
        pending: BTreeMap::new(),
        written: BTreeMap::new(),
    };

    let stdin = std::io::stdin();
    let mut reader = BufReader::with_capacity(STDIN_BUFFER_BYTES, stdin.lock());
    let mut line = Vec::new();
    let mut line_number: u64 = 0;
    let mut round_robin: i32 = 0;
    let result = (|| -> anyhow::Result<()> {
        loop {
            line.clear();
            let n = (&mut reader)
                .take(LINE_BYTES_MAX as u64 + 1)
                .read_until(b'\n', &mut line)
                .context("reading stdin")?;
            if n == 0 {
                break;
            }
            line_number += 1;
            if line.len() > LINE_BYTES_MAX {
                bail!("line {line_number} is longer than {LINE_BYTES_MAX} bytes");
            }
            if line.last() == Some(&b'\n') {
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
            }
            let (key, value) = match &args.key_separator {
                None => (None, line.clone()),
                Some(sep) => {
                    let sep = sep.as_bytes();
                    let at = line
                        .windows(sep.len())
                        .position(|w| w == sep)
                        .ok_or_else(|| {
                            anyhow!(
                                "line {line_number} has no key separator {:?}",
                                String::from_utf8_lossy(sep)
                            )
                        })?;
                    (Some(line[..at].to_vec()), line[at + sep.len()..].to_vec())
                }
            };
            let partition = match (args.partition, &key) {
                (Some(p), _) => p,
                (None, Some(k)) => partition_for_key(k, partition_count),
                (None, None) => {
                    round_robin = (round_robin + 1) % partition_count;
                    round_robin
                }
            };
            let size = key.as_ref().map_or(0, Vec::len)
                + value.len()
                + headers_bytes
                + RECORD_OVERHEAD_BYTES;
            let record = NewRecord {
                key,
                value: Some(value),
                headers: headers.clone(),
                timestamp: Timestamp(now_ms()),
            };
            let full = producer
                .pending
                .get(&partition)
                .is_some_and(|p| p.bytes + size > BATCH_BYTES_MAX);
            if full {
                producer.flush()?;
            }
            let pending = producer
                .pending
                .entry(partition)
                .or_insert_with(|| Pending {
                    builder: BatchBuilder::new(),
                    bytes: 0,
                });
            pending.builder.push(&record);
            pending.bytes += size;
            // Nothing more buffered means the next read would wait for input: send now, so a
            // person typing sees each line go out.
            if reader.buffer().is_empty() {
                producer.flush()?;
            }
        }
        producer.flush()
    })();
    // After an error, say what did reach the broker, if anything did.
    if result.is_ok() || !producer.written.is_empty() {
        producer.print_summary();
    }
    result
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Partition → leader of `topic`, waiting a little for a topic that was just auto-created.
fn topic_leaders(cluster: &mut Cluster, topic: &str) -> anyhow::Result<BTreeMap<i32, i32>> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let response = cluster.metadata(Some(&[topic]), true)?;
        let retry = match find_topic(&response, topic) {
            Ok(t) => {
                let leaders: BTreeMap<i32, i32> = t
                    .partitions
                    .iter()
                    .map(|p| (p.partition_index, p.leader_id.0))
                    .collect();
                if !leaders.is_empty() && leaders.values().all(|&l| l >= 0) {
                    return Ok(leaders);
                }
                if attempt >= METADATA_ATTEMPTS_MAX {
                    bail!("topic {topic:?} has partitions without a leader");
                }
                true
            }
            Err(e) => {
                let code = response
                    .topics
                    .iter()
                    .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
                    .map_or(0, |t| t.error_code);
                if !is_retriable(code) || attempt >= METADATA_ATTEMPTS_MAX {
                    return Err(e);
                }
                true
            }
        };
        if retry {
            std::thread::sleep(std::time::Duration::from_millis(METADATA_RETRY_MS));
        }
    }
}

impl Producer {
    /// Sends every pending batch, one Produce request per leader, and records the offsets.
    fn flush(&mut self) -> anyhow::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut by_leader: BTreeMap<i32, Vec<(i32, Pending)>> = BTreeMap::new();
        for (partition, pending) in std::mem::take(&mut self.pending) {
            let leader = self.leaders[&partition];
            by_leader
                .entry(leader)
                .or_default()
                .push((partition, pending));
        }
        for (leader, batches) in by_leader {
            let counts: BTreeMap<i32, i32> = batches
                .iter()
                .map(|(p, b)| (*p, b.builder.record_count()))
                .collect();
            let partition_data = batches
                .into_iter()
                .map(|(partition, pending)| {
                    PartitionProduceData::default()
                        .with_index(partition)
                        .with_records(Some(pending.builder.build()))
                })
                .collect();
            let request = ProduceRequest::default()
                .with_acks(self.acks)
                .with_timeout_ms(REQUEST_TIMEOUT_MS)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(topic_name(&self.topic))
                    .with_partition_data(partition_data)]);
            let client = self.cluster.broker(leader)?;
            let version = client.version(ApiKey::Produce)?;
            if self.acks == 0 {
                client.send_without_response(&request, version)?;
                for (partition, count) in counts {
                    self.written.entry(partition).or_default().records += count as u64;
                }
                continue;
            }
            let response = client.send_at(&request, version)?;
            for (partition, count) in counts {
                let answer = response
                    .responses
                    .iter()
                    .filter(|t| t.name.0.as_str() == self.topic)
                    .flat_map(|t| t.partition_responses.iter())
                    .find(|p| p.index == partition)
                    .ok_or_else(|| {
                        anyhow!(
                            "the Produce response does not mention partition {partition} of {}",
                            self.topic
                        )
                    })?;
                let what = format!("producing to {}-{partition}", self.topic);
                check(answer.error_code, answer.error_message.as_ref(), &what)?;
                if let Some(e) = answer.record_errors.first() {
                    bail!(
                        "{what}: record {} refused: {}",
                        e.batch_index,
                        e.batch_index_error_message
                            .as_ref()
                            .map_or("", |m| m.as_str())
                    );
                }
                let first = answer.base_offset;
                let last = first + count as i64 - 1;
                let w = self.written.entry(partition).or_default();
                w.records += count as u64;
                w.offsets = Some(match w.offsets {
                    None => (first, last),
                    Some((a, b)) => (a.min(first), b.max(last)),
                });
            }
        }
        Ok(())
    }

    fn print_summary(&self) {
        let total: u64 = self.written.values().map(|w| w.records).sum();
        let acks = match self.acks {
            -1 => "all".to_string(),
            a => a.to_string(),
        };
        println!(
            "Produced {} to {} in {} (acks={acks})",
            plural(total, "record"),
            self.topic,
            plural(self.written.len() as u64, "partition")
        );
        for (partition, w) in &self.written {
            match w.offsets {
                Some((first, last)) => println!(
                    "  partition {partition}: {}, offsets {first} to {last}",
                    plural(w.records, "record")
                ),
                None => println!(
                    "  partition {partition}: {}, offsets unknown (acks=0)",
                    plural(w.records, "record")
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_kafkas_java_implementation() {
        // Values from Apache Kafka's UtilsTest.testMurmur2.
        assert_eq!(murmur2(b"21"), -973932308);
        assert_eq!(murmur2(b"foobar"), -790332482);
        assert_eq!(murmur2(b"a-little-bit-long-string"), -985981536);
        assert_eq!(murmur2(b"a-little-bit-longer-string"), -1486304829);
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"),
            -58897971
        );
        assert_eq!(murmur2(b"abc"), 479470107);
    }

    #[test]
    fn keyed_records_land_in_a_partition_within_range() {
        for key in [&b""[..], b"k", b"key-42", b"\xff\xfe"] {
            let p = partition_for_key(key, 3);
            assert!((0..3).contains(&p), "{p}");
        }
    }

    #[test]
    fn acks_take_kafkas_spellings() {
        assert_eq!(parse_acks("all"), Ok(-1));
        assert_eq!(parse_acks("-1"), Ok(-1));
        assert_eq!(parse_acks("1"), Ok(1));
        assert_eq!(parse_acks("0"), Ok(0));
        assert!(parse_acks("2").is_err());
    }
}
