//! `sluice consume`: print the records of a topic, like `kafka-console-consumer.sh` and
//! `kcat -C`.
//!
//! Start offsets come from ListOffsets (earliest, latest or by timestamp) or from `--offset`;
//! then Fetch (no consumer group, no fetch session) is sent to each partition's leader in
//! turn. Batches are checked (length, magic, CRC) before their records are printed.
//! Compressed batches (gzip, snappy, lz4, zstd) are decompressed with the engine's codecs.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{anyhow, bail, Context};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, ListOffsetsRequest};
use kafka_protocol::ResponseError;
use serde::Serialize;
use sluice_engine::batch::{self, BatchHeader, Records, LOG_OVERHEAD};

use super::client::{check, describe_error, find_topic, is_retriable, topic_name, Client, Cluster};
use super::{plural, Connection};

/// Longest a Fetch waits for new records. Short, because leaders are fetched from in turn.
pub const FETCH_WAIT_MS: i32 = 500;
/// Bytes asked per partition at first; doubled while a single batch does not fit.
const PARTITION_FETCH_BYTES: i32 = 1 << 20;
/// Most bytes asked per partition, and per Fetch response.
pub const FETCH_BYTES_MAX: i32 = 64 << 20;
/// Consecutive retriable errors (a leader moving, a topic being created) before giving up.
const RETRIES_MAX: u32 = 20;
/// Pause before retrying after a retriable error.
const RETRY_MS: u64 = 250;

const _: () = assert!(PARTITION_FETCH_BYTES <= FETCH_BYTES_MAX);
const _: () = assert!((FETCH_BYTES_MAX as usize) < super::client::RESPONSE_BYTES_MAX);
const _: () = assert!((FETCH_WAIT_MS as u128) < super::client::RESPONSE_TIMEOUT.as_millis() / 2);

/// ListOffsets timestamps with special meanings.
const LATEST: i64 = -1;
const EARLIEST: i64 = -2;

#[derive(clap::Args, Debug)]
pub struct ConsumeArgs {
    #[command(flatten)]
    connection: Connection,
    /// Topic to read.
    topic: String,
    /// Read only this partition (default: every partition).
    #[arg(long)]
    partition: Option<i32>,
    #[command(flatten)]
    start: Start,
    /// Stop after this many records.
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Stop once every partition read has reached its high watermark.
    #[arg(long)]
    exit_at_end: bool,
    /// `text`: one tab-separated line per record, key and value as raw bytes. `json`: one
    /// object per line; a key, value or header value that is not UTF-8 becomes {"hex": "..."}.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

/// Where to start reading; the default is `--from-latest`, as in Kafka's console consumer.
#[derive(clap::Args, Debug)]
#[group(multiple = false)]
struct Start {
    /// Start at each partition's log start offset.
    #[arg(long)]
    from_beginning: bool,
    /// Start at each partition's high watermark: only records produced from now on (default).
    #[arg(long)]
    from_latest: bool,
    /// Start at this offset in every partition read.
    #[arg(long, value_name = "OFFSET")]
    offset: Option<i64>,
    /// Start at the first record whose timestamp is at or after MS (milliseconds since the
    /// Unix epoch), or at the high watermark when there is none.
    #[arg(long, value_name = "MS")]
    from_timestamp: Option<i64>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Text,
    Json,
}

/// One record as printed.
struct Printed<'a> {
    partition: i32,
    offset: i64,
    timestamp: i64,
    log_append_time: bool,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
    headers: &'a [(&'a [u8], Option<&'a [u8]>)],
}

#[derive(Serialize)]
struct JsonRecord<'a> {
    topic: &'a str,
    partition: i32,
    offset: i64,
    timestamp: i64,
    timestamp_type: &'static str,
    key: serde_json::Value,
    value: serde_json::Value,
    headers: Vec<JsonHeader>,
}

#[derive(Serialize)]
struct JsonHeader {
    key: serde_json::Value,
    value: serde_json::Value,
}

fn json_bytes(b: Option<&[u8]>) -> serde_json::Value {
    match b {
        None => serde_json::Value::Null,
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => serde_json::Value::String(s.to_string()),
            Err(_) => {
                let hex: String = b.iter().map(|byte| format!("{byte:02x}")).collect();
                serde_json::json!({ "hex": hex })
            }
        },
    }
}

fn write_record(
    out: &mut impl Write,
    format: Format,
    topic: &str,
    r: &Printed<'_>,
) -> std::io::Result<()> {
    let timestamp_type = if r.log_append_time {
        "LogAppendTime"
    } else {
        "CreateTime"
    };
    match format {
        Format::Text => {
            write!(
                out,
                "Partition:{}\tOffset:{}\t{timestamp_type}:{}\tKey:",
                r.partition, r.offset, r.timestamp
            )?;
            out.write_all(r.key.unwrap_or(b"null"))?;
            out.write_all(b"\tHeaders:")?;
            for (i, (k, v)) in r.headers.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                out.write_all(k)?;
                out.write_all(b"=")?;
                out.write_all(v.unwrap_or(b"null"))?;
            }
            out.write_all(b"\tValue:")?;
            out.write_all(r.value.unwrap_or(b"null"))?;
            out.write_all(b"\n")
        }
        Format::Json => {
            let record = JsonRecord {
                topic,
                partition: r.partition,
                offset: r.offset,
                timestamp: r.timestamp,
                timestamp_type,
                key: json_bytes(r.key),
                value: json_bytes(r.value),
                headers: r
                    .headers
                    .iter()
                    .map(|(k, v)| JsonHeader {
                        key: json_bytes(Some(k)),
                        value: json_bytes(*v),
                    })
                    .collect(),
            };
            serde_json::to_writer(&mut *out, &record)?;
            out.write_all(b"\n")
        }
    }
}

/// Splits fetched bytes into whole batches. A partial batch at the end (the broker cuts
/// responses at the byte limit) is left out; `Err` for bytes that cannot be a v2 batch.
fn split_batches(mut data: &[u8]) -> anyhow::Result<Vec<&[u8]>> {
    let mut batches = Vec::new();
    // Byte 16 is the magic in every message format.
    while data.len() > 16 {
        let magic = data[16] as i8;
        if magic != batch::MAGIC_V2 {
            bail!("message format v{magic} is not supported (only record batches, v2)");
        }
        let Ok(header) = BatchHeader::parse(data) else {
            break;
        };
        let Some(size) = header.total_size() else {
            bail!(
                "batch at offset {} has an impossible length {}",
                header.base_offset().0,
                header.batch_length()
            );
        };
        if size > data.len() {
            break;
        }
        batches.push(&data[..size]);
        data = &data[size..];
    }
    Ok(batches)
}

/// Prints records and counts them.
struct Printer {
    topic: String,
    format: Format,
    /// `--count`: stop after this many records.
    count: Option<u64>,
    consumed: u64,
}

impl Printer {
    fn done(&self) -> bool {
        self.count.is_some_and(|n| self.consumed >= n)
    }

    /// Prints the records at or after `position` in the fetched bytes; returns the offset
    /// after the last whole batch.
    fn print_batches(
        &mut self,
        partition: i32,
        position: i64,
        records: &[u8],
        out: &mut impl Write,
    ) -> anyhow::Result<i64> {
        let mut next = position;
        for bytes in split_batches(records)? {
            let header =
                batch::verify(bytes).map_err(|e| anyhow!("corrupt batch from the broker: {e}"))?;
            let last_offset = header.last_offset().0;
            if last_offset < next {
                continue;
            }
            if header.is_control() {
                // Transaction markers are not records of the topic.
                next = last_offset + 1;
                continue;
            }
            let base_offset = header.base_offset().0;
            let section = batch::records_section(bytes).map_err(|e| {
                anyhow!(
                    "batch at {}-{partition} offset {base_offset}: {e}",
                    self.topic
                )
            })?;
            for record in Records::section(&section, header.record_count()) {
                let record = record.map_err(|e| anyhow!("batch at offset {base_offset}: {e}"))?;
                let offset = base_offset + record.offset_delta as i64;
                if offset < position {
                    continue;
                }
                let timestamp = if header.is_log_append_time() {
                    header.max_timestamp().0
                } else {
                    header.base_timestamp().0 + record.timestamp_delta
                };
                let printed = Printed {
                    partition,
                    offset,
                    timestamp,
                    log_append_time: header.is_log_append_time(),
                    key: record.key,
                    value: record.value,
                    headers: &record.headers,
                };
                write_record(out, self.format, &self.topic, &printed)
                    .context("writing to stdout")?;
                self.consumed += 1;
                if self.done() {
                    return Ok(offset + 1);
                }
            }
            next = last_offset + 1;
        }
        Ok(next)
    }
}

struct Consumer {
    cluster: Cluster,
    topic: String,
    /// Partition → leader broker id.
    leaders: BTreeMap<i32, i32>,
    printer: Printer,
}

pub fn run(args: &ConsumeArgs) -> anyhow::Result<()> {
    let client = Client::bootstrap(&args.connection.bootstrap_server)?;
    client.version(ApiKey::Fetch)?;
    client.version(ApiKey::ListOffsets)?;
    let mut consumer = Consumer {
        cluster: Cluster::new(client),
        topic: args.topic.clone(),
        leaders: BTreeMap::new(),
        printer: Printer {
            topic: args.topic.clone(),
            format: args.format,
            count: args.count,
            consumed: 0,
        },
    };
    consumer.refresh_leaders()?;
    let partitions: Vec<i32> = match args.partition {
        Some(p) if consumer.leaders.contains_key(&p) => vec![p],
        Some(p) => bail!(
            "topic {} has partitions 0 to {}; there is no partition {p}",
            args.topic,
            consumer.leaders.len() as i32 - 1
        ),
        None => consumer.leaders.keys().copied().collect(),
    };
    let start = &args.start;
    let mut positions: BTreeMap<i32, i64> = if let Some(offset) = start.offset {
        if offset < 0 {
            bail!("--offset {offset}: offsets are at least 0");
        }
        partitions.iter().map(|&p| (p, offset)).collect()
    } else if let Some(ts) = start.from_timestamp {
        if ts < 0 {
            bail!("--from-timestamp {ts}: timestamps are milliseconds since the epoch, at least 0");
        }
        let found = consumer.list_offsets(&partitions, ts)?;
        // No record at or after the timestamp: start where the next record will be.
        let missing: Vec<i32> = found
            .iter()
            .filter(|(_, &o)| o < 0)
            .map(|(&p, _)| p)
            .collect();
        let latest = consumer.list_offsets(&missing, LATEST)?;
        found
            .into_iter()
            .map(|(p, o)| (p, if o < 0 { latest[&p] } else { o }))
            .collect()
    } else if start.from_beginning {
        consumer.list_offsets(&partitions, EARLIEST)?
    } else {
        consumer.list_offsets(&partitions, LATEST)?
    };
    let mut ends: BTreeMap<i32, i64> = if args.exit_at_end {
        consumer.list_offsets(&partitions, LATEST)?
    } else {
        BTreeMap::new()
    };

    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result = consumer.fetch_loop(&mut positions, &mut ends, &mut out);
    out.flush().context("writing to stdout")?;
    let summary = format!(
        "Consumed {} from {}",
        plural(consumer.printer.consumed, "record"),
        args.topic
    );
    eprintln!("{summary}");
    result
}

impl Consumer {
    fn refresh_leaders(&mut self) -> anyhow::Result<()> {
        let response = self.cluster.metadata(Some(&[&self.topic]), false)?;
        let topic = find_topic(&response, &self.topic)?;
        self.leaders = topic
            .partitions
            .iter()
            .map(|p| (p.partition_index, p.leader_id.0))
            .collect();
        if self.leaders.is_empty() {
            bail!("topic {} has no partitions", self.topic);
        }
        Ok(())
    }

    /// ListOffsets for `partitions` at `timestamp` (or `LATEST`, `EARLIEST`), from each leader.
    /// An offset of -1 means no record has a timestamp at or after the one asked for.
    fn list_offsets(
        &mut self,
        partitions: &[i32],
        timestamp: i64,
    ) -> anyhow::Result<BTreeMap<i32, i64>> {
        let mut offsets = BTreeMap::new();
        let mut by_leader: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
        for &p in partitions {
            by_leader.entry(self.leader(p)?).or_default().push(p);
        }
        for (leader, partitions) in by_leader {
            let request = ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_topics(vec![ListOffsetsTopic::default()
                    .with_name(topic_name(&self.topic))
                    .with_partitions(
                        partitions
                            .iter()
                            .map(|&p| {
                                ListOffsetsPartition::default()
                                    .with_partition_index(p)
                                    .with_current_leader_epoch(-1)
                                    .with_timestamp(timestamp)
                            })
                            .collect(),
                    )]);
            let (response, _) = self.cluster.broker(leader)?.send(&request)?;
            for &p in &partitions {
                let answer = response
                    .topics
                    .iter()
                    .filter(|t| t.name.0.as_str() == self.topic)
                    .flat_map(|t| t.partitions.iter())
                    .find(|r| r.partition_index == p)
                    .ok_or_else(|| {
                        anyhow!("the ListOffsets response does not mention partition {p}")
                    })?;
                check(
                    answer.error_code,
                    None,
                    format!("listing offsets of {}-{p}", self.topic),
                )?;
                offsets.insert(p, answer.offset);
            }
        }
        Ok(offsets)
    }

    fn leader(&self, partition: i32) -> anyhow::Result<i32> {
        match self.leaders.get(&partition) {
            Some(&l) if l >= 0 => Ok(l),
            Some(_) => Err(anyhow!("{}-{partition} has no leader", self.topic)),
            None => Err(anyhow!("{} has no partition {partition}", self.topic)),
        }
    }

    fn fetch_loop(
        &mut self,
        positions: &mut BTreeMap<i32, i64>,
        ends: &mut BTreeMap<i32, i64>,
        out: &mut impl Write,
    ) -> anyhow::Result<()> {
        let exit_at_end = !ends.is_empty();
        let mut fetch_bytes: BTreeMap<i32, i32> = positions
            .keys()
            .map(|&p| (p, PARTITION_FETCH_BYTES))
            .collect();
        let mut retries = 0u32;
        loop {
            if self.printer.done() {
                return Ok(());
            }
            let active: Vec<i32> = positions
                .iter()
                .filter(|(p, &pos)| !exit_at_end || pos < ends[p])
                .map(|(&p, _)| p)
                .collect();
            if active.is_empty() {
                return Ok(());
            }
            let mut by_leader: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
            for &p in &active {
                by_leader.entry(self.leader(p)?).or_default().push(p);
            }
            let mut retry = false;
            for (leader, partitions) in by_leader {
                let request = FetchRequest::default()
                    .with_replica_id(BrokerId(-1))
                    .with_max_wait_ms(FETCH_WAIT_MS)
                    .with_min_bytes(1)
                    .with_max_bytes(FETCH_BYTES_MAX)
                    .with_isolation_level(0)
                    .with_session_id(0)
                    .with_session_epoch(-1)
                    .with_topics(vec![FetchTopic::default()
                        .with_topic(topic_name(&self.topic))
                        .with_partitions(
                            partitions
                                .iter()
                                .map(|&p| {
                                    FetchPartition::default()
                                        .with_partition(p)
                                        .with_current_leader_epoch(-1)
                                        .with_fetch_offset(positions[&p])
                                        .with_log_start_offset(-1)
                                        .with_partition_max_bytes(fetch_bytes[&p])
                                })
                                .collect(),
                        )]);
                let (response, _) = self.cluster.broker(leader)?.send(&request)?;
                check(
                    response.error_code,
                    None,
                    format!("fetching from broker {leader}"),
                )?;
                for topic in response
                    .responses
                    .iter()
                    .filter(|t| t.topic.0.as_str() == self.topic)
                {
                    for data in &topic.partitions {
                        let p = data.partition_index;
                        let Some(&position) = positions.get(&p) else {
                            continue;
                        };
                        if data.error_code != 0 {
                            if data.error_code == ResponseError::OffsetOutOfRange.code() {
                                return Err(self.out_of_range(p, position));
                            }
                            if is_retriable(data.error_code) && retries < RETRIES_MAX {
                                retry = true;
                                continue;
                            }
                            bail!(describe_error(
                                data.error_code,
                                None,
                                format!("fetching {}-{p} at offset {position}", self.topic)
                            ));
                        }
                        if exit_at_end && data.high_watermark >= 0 {
                            ends.insert(p, data.high_watermark);
                        }
                        let records = data.records.as_deref().unwrap_or(&[]);
                        let next = self
                            .printer
                            .print_batches(p, position, records, out)
                            .with_context(|| {
                                format!("reading {}-{p} at offset {position}", self.topic)
                            })?;
                        if next == position && records.len() > LOG_OVERHEAD {
                            // Bytes came back but not one whole batch: the batch is larger than
                            // what was asked for.
                            let asked = fetch_bytes[&p];
                            if asked >= FETCH_BYTES_MAX {
                                bail!(
                                    "{}-{p} at offset {position}: a batch is larger than {FETCH_BYTES_MAX} bytes",
                                    self.topic
                                );
                            }
                            fetch_bytes.insert(p, asked.saturating_mul(2).min(FETCH_BYTES_MAX));
                        }
                        positions.insert(p, next);
                        if self.printer.done() {
                            out.flush().context("writing to stdout")?;
                            return Ok(());
                        }
                    }
                }
                out.flush().context("writing to stdout")?;
            }
            if retry {
                retries += 1;
                std::thread::sleep(std::time::Duration::from_millis(RETRY_MS));
                self.refresh_leaders()?;
            } else {
                retries = 0;
            }
        }
    }

    /// The error for a position outside the log, naming the range that is there.
    fn out_of_range(&mut self, partition: i32, position: i64) -> anyhow::Error {
        let range = self
            .list_offsets(&[partition], EARLIEST)
            .and_then(|earliest| {
                let latest = self.list_offsets(&[partition], LATEST)?;
                Ok((earliest[&partition], latest[&partition]))
            });
        let base = describe_error(
            ResponseError::OffsetOutOfRange.code(),
            None,
            format!("fetching {}-{partition} at offset {position}", self.topic),
        );
        match range {
            Ok((earliest, latest)) => anyhow!(
                "{base}: the partition holds offsets {earliest} (log start offset) to {latest} (high watermark)"
            ),
            Err(_) => anyhow!(base),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_engine::batch::{BatchBuilder, NewRecord};
    use sluice_engine::Timestamp;

    fn batch(values: &[&str]) -> Vec<u8> {
        let mut b = BatchBuilder::new();
        for v in values {
            b.push(&NewRecord {
                key: None,
                value: Some(v.as_bytes().to_vec()),
                headers: vec![(b"h".to_vec(), Some(b"1".to_vec()))],
                timestamp: Timestamp(1000),
            });
        }
        b.build().to_vec()
    }

    #[test]
    fn a_partial_batch_at_the_end_is_left_for_the_next_fetch() {
        let mut data = batch(&["a", "b"]);
        let second = batch(&["c"]);
        data.extend_from_slice(&second[..second.len() - 3]);
        let batches = split_batches(&data).unwrap();
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].len(), data.len() - (second.len() - 3));
        assert!(split_batches(&[]).unwrap().is_empty());
    }

    #[test]
    fn compressed_batches_are_read_and_records_already_read_skipped() {
        let mut printer = Printer {
            topic: "t".into(),
            format: Format::Text,
            count: None,
            consumed: 0,
        };
        // Offsets 0-1 uncompressed, then two records per codec; start at offset 1.
        use sluice_engine::compression::Compression;
        let codecs = [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ];
        let mut data = Vec::new();
        for (i, codec) in codecs.into_iter().enumerate() {
            let base = 2 * i as i64;
            let mut b = BatchBuilder::new().compression(codec);
            for i in 0..2 {
                b.push(&NewRecord {
                    key: None,
                    value: Some(format!("v{}", base + i).into_bytes()),
                    headers: Vec::new(),
                    timestamp: Timestamp(1000 + i),
                });
            }
            let mut bytes = b.build().to_vec();
            batch::stamp(
                &mut bytes,
                sluice_engine::Offset(base),
                sluice_engine::LeaderEpoch(0),
            );
            data.extend_from_slice(&bytes);
        }
        let mut out = Vec::new();
        let next = printer.print_batches(0, 1, &data, &mut out).unwrap();
        assert_eq!(next, 10);
        assert_eq!(printer.consumed, 9);
        let text = String::from_utf8(out).unwrap();
        let values: Vec<&str> = text
            .lines()
            .map(|l| l.rsplit(':').next().unwrap())
            .collect();
        assert_eq!(
            values,
            ["v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9"]
        );

        printer.count = Some(13);
        let mut out = Vec::new();
        assert_eq!(printer.print_batches(0, 4, &data, &mut out).unwrap(), 8);
        assert!(printer.done());
    }

    #[test]
    fn old_message_formats_are_refused() {
        let mut data = batch(&["a"]);
        data[16] = 1;
        assert!(split_batches(&data).is_err());
    }

    #[test]
    fn text_output_names_every_field() {
        let headers = [(&b"h"[..], Some(&b"1"[..])), (&b"n"[..], None)];
        let r = Printed {
            partition: 2,
            offset: 7,
            timestamp: 1000,
            log_append_time: false,
            key: Some(b"k"),
            value: Some(b"v\tw"),
            headers: &headers,
        };
        let mut out = Vec::new();
        write_record(&mut out, Format::Text, "t", &r).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "Partition:2\tOffset:7\tCreateTime:1000\tKey:k\tHeaders:h=1,n=null\tValue:v\tw\n"
        );
    }

    #[test]
    fn json_output_is_one_object_per_line_with_hex_for_binary() {
        let headers = [(&b"h"[..], Some(&b"\xff"[..]))];
        let r = Printed {
            partition: 0,
            offset: 1,
            timestamp: 5,
            log_append_time: true,
            key: None,
            value: Some(b"v"),
            headers: &headers,
        };
        let mut out = Vec::new();
        write_record(&mut out, Format::Json, "t", &r).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with('\n') && text.lines().count() == 1);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["topic"], "t");
        assert_eq!(v["offset"], 1);
        assert_eq!(v["timestamp_type"], "LogAppendTime");
        assert!(v["key"].is_null());
        assert_eq!(v["value"], "v");
        assert_eq!(v["headers"][0]["key"], "h");
        assert_eq!(v["headers"][0]["value"]["hex"], "ff");
    }
}
