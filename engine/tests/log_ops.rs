//! Behaviour of the log's housekeeping: compaction, time-based retention and rolling,
//! LogAppendTime, ListOffsets lookups and index reuse after a clean shutdown.

use std::collections::BTreeMap;
use std::path::PathBuf;

use bytes::BytesMut;
use futures_lite::future::block_on;
use sluice_engine::batch::{
    records_section, simple_batch, BatchBuilder, BatchHeader, NewRecord, Records,
};
use sluice_engine::{
    BatchCache, BatchError, Clock, Compression, CompressionType, FlushMode, LeaderEpoch, Log,
    LogConfig, LogError, MemStorage, Offset, Timestamp, TimestampType,
};

async fn open(storage: &MemStorage, dir: &str, config: LogConfig, clock: Clock) -> Log<MemStorage> {
    Log::open(
        storage.clone(),
        PathBuf::from(dir),
        config,
        BatchCache::new(1 << 20),
        clock,
    )
    .await
    .expect("open")
}

async fn append(
    log: &Log<MemStorage>,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    ts: i64,
) -> Offset {
    let b = simple_batch(&[(key, value)], Timestamp(ts));
    log.append(BytesMut::from(&b[..]), LeaderEpoch(0))
        .await
        .expect("append")
        .base_offset
}

/// (offset, key, value) of every record from the log start.
async fn all_records(log: &Log<MemStorage>) -> Vec<(i64, Option<Vec<u8>>, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut cur = log.log_start_offset();
    loop {
        let batches = log.read(cur, 1 << 20, Offset(i64::MAX)).await.unwrap();
        if batches.is_empty() {
            return out;
        }
        for b in batches {
            for r in Records::new(&b.bytes) {
                let r = r.unwrap();
                out.push((
                    b.base_offset.0 + r.offset_delta as i64,
                    r.key.map(<[u8]>::to_vec),
                    r.value.map(<[u8]>::to_vec),
                ));
            }
            cur = b.last_offset.next();
        }
    }
}

#[test]
fn compaction_keeps_the_latest_value_per_key_and_drops_old_tombstones() {
    block_on(async {
        let storage = MemStorage::new();
        let clock = Clock::manual(1_000_000);
        let config = LogConfig {
            segment_bytes: 2048,
            cleanup_compact: true,
            cleanup_delete: false,
            delete_retention_ms: 10_000,
            ..LogConfig::default()
        };
        let log = open(&storage, "/compact/t-0", config.clone(), clock.clone()).await;
        let mut latest: BTreeMap<Vec<u8>, (i64, Option<Vec<u8>>)> = BTreeMap::new();
        for i in 0..300i64 {
            let key = format!("k{}", i % 17).into_bytes();
            // Every 50th write of a key is a tombstone.
            let value = if i % 50 == 7 {
                None
            } else {
                Some(format!("v{i}").into_bytes())
            };
            let offset = append(&log, Some(&key), value.as_deref(), clock.now_ms()).await;
            latest.insert(key, (offset.0, value));
            clock.advance(10);
        }
        // A key whose last word is a tombstone, in a closed segment.
        let offset = append(&log, Some(b"k3"), None, clock.now_ms()).await;
        latest.insert(b"k3".to_vec(), (offset.0, None));
        log.roll().await.unwrap();
        let before = all_records(&log).await;
        assert_eq!(before.len(), 301);
        let outcome = log.compact().await.unwrap();
        assert!(
            outcome.segments_rewritten > 0 && outcome.records_removed > 200,
            "{outcome:?}"
        );
        let after = all_records(&log).await;
        // Offsets never move; every record kept is unchanged.
        let by_offset: BTreeMap<i64, _> = before.iter().map(|r| (r.0, r.clone())).collect();
        for r in &after {
            assert_eq!(by_offset[&r.0], *r);
        }
        // The latest value of every key survives, and a closed segment holds no superseded
        // record.
        let active_base = log.segment_base_offsets().last().unwrap().0;
        for (key, (offset, value)) in &latest {
            let found = after
                .iter()
                .find(|r| r.0 == *offset)
                .unwrap_or_else(|| panic!("latest of {key:?} lost"));
            assert_eq!(&found.2, value);
        }
        for r in after.iter().filter(|r| r.0 < active_base) {
            let (latest_offset, _) = latest[r.1.as_ref().unwrap()];
            let superseded_in_closed = latest_offset < active_base && latest_offset != r.0;
            assert!(
                !superseded_in_closed,
                "record {} superseded by {latest_offset} was kept",
                r.0
            );
        }
        // Tombstones younger than delete.retention.ms stay.
        let tombstones_kept = after.iter().filter(|r| r.2.is_none()).count();
        assert_eq!(tombstones_kept, 1, "the young tombstone of k3 must stay");
        // Once they are old enough, compaction drops them.
        clock.advance(20_000);
        log.roll().await.unwrap();
        log.compact().await.unwrap();
        let later = all_records(&log).await;
        let active_base = log.segment_base_offsets().last().unwrap().0;
        assert!(
            later
                .iter()
                .filter(|r| r.0 < active_base)
                .all(|r| r.2.is_some()),
            "old tombstones survived"
        );
        assert!(
            !later.iter().any(|r| r.1.as_deref() == Some(&b"k3"[..])),
            "k3 is deleted for good"
        );
        println!(
            "compaction: 301 records -> {} -> {}, tombstones kept while young: {tombstones_kept}",
            after.len(),
            later.len()
        );
        // The compacted log reopens (indexes rewritten) and after an unclean reopen too.
        log.close().await.unwrap();
        drop(log);
        let log = open(&storage, "/compact/t-0", config.clone(), clock.clone()).await;
        assert_eq!(all_records(&log).await, later);
        assert_eq!(log.log_end_offset(), Offset(301));
        // Keyless records are refused on a compacted topic.
        let b = simple_batch(&[(None, Some(b"x"))], Timestamp(1));
        assert!(matches!(
            log.append(BytesMut::from(&b[..]), LeaderEpoch(0)).await,
            Err(LogError::InvalidBatch(_))
        ));
    });
}

#[test]
fn time_retention_deletes_expired_segments_and_segment_ms_rolls() {
    block_on(async {
        let storage = MemStorage::new();
        let clock = Clock::manual(10_000_000);
        let config = LogConfig {
            segment_ms: 1000,
            retention_ms: 5000,
            ..LogConfig::default()
        };
        let log = open(&storage, "/retain/t-0", config, clock.clone()).await;
        for _ in 0..10 {
            append(&log, None, Some(b"v"), clock.now_ms()).await;
            clock.advance(1000);
        }
        // segment.ms rolled once per second.
        assert_eq!(log.segment_count(), 10);
        let outcome = log.enforce_retention().await.unwrap();
        // Records at t0..t0+9s, now t0+10s, retention 5s: the first 5 segments are older than
        // 5 s (max timestamps t0..t0+4s < t0+5s).
        assert_eq!(outcome.segments_deleted, 5, "{outcome:?}");
        assert_eq!(log.log_start_offset(), Offset(5));
        assert!(matches!(
            log.read(Offset(4), 100, Offset(i64::MAX)).await,
            Err(LogError::OffsetOutOfRange { .. })
        ));
        assert_eq!(all_records(&log).await.len(), 5);
        // Everything expires, the active segment too: it is rolled and deleted.
        clock.advance(100_000);
        log.enforce_retention().await.unwrap();
        assert_eq!(log.log_start_offset(), Offset(10));
        assert_eq!(log.log_end_offset(), Offset(10));
        assert_eq!(
            append(&log, None, Some(b"after"), clock.now_ms()).await,
            Offset(10)
        );
    });
}

#[test]
fn log_append_time_stamps_the_broker_time() {
    block_on(async {
        let storage = MemStorage::new();
        let clock = Clock::manual(777_000);
        let config = LogConfig {
            message_timestamp_type: TimestampType::LogAppendTime,
            ..LogConfig::default()
        };
        let log = open(&storage, "/lat/t-0", config, clock.clone()).await;
        let b = simple_batch(&[(None, Some(b"v"))], Timestamp(5));
        let info = log
            .append(BytesMut::from(&b[..]), LeaderEpoch(0))
            .await
            .unwrap();
        assert_eq!(info.log_append_time, Timestamp(777_000));
        let read = log.read(Offset(0), 100, Offset(i64::MAX)).await.unwrap();
        let h = sluice_engine::batch::verify(&read[0].bytes).unwrap();
        assert!(h.is_log_append_time());
        assert_eq!(h.max_timestamp(), Timestamp(777_000));
        assert_eq!(
            log.offset_for_timestamp(Timestamp(700_000)).await.unwrap(),
            Some((Offset(0), Timestamp(777_000)))
        );
    });
}

#[test]
fn list_offsets_by_timestamp_and_max_timestamp_across_segments() {
    block_on(async {
        let storage = MemStorage::new();
        let config = LogConfig {
            segment_bytes: 1024,
            index_interval_bytes: 128,
            ..LogConfig::default()
        };
        let log = open(&storage, "/ts/t-0", config.clone(), Clock::System).await;
        // Timestamps rise by 10 with one out-of-order record carrying the max.
        for i in 0..100i64 {
            let ts = if i == 42 { 5_000 } else { 1_000 + i * 10 };
            append(&log, None, Some(&[i as u8; 40]), ts).await;
        }
        assert!(log.segment_count() > 3);
        check_lookups(&log).await;
        log.close().await.unwrap();
        drop(log);
        let log = open(&storage, "/ts/t-0", config, Clock::System).await;
        check_lookups(&log).await;
    });
}

async fn check_lookups(log: &Log<MemStorage>) {
    assert_eq!(
        log.offset_for_timestamp(Timestamp(0)).await.unwrap(),
        Some((Offset(0), Timestamp(1000)))
    );
    assert_eq!(
        log.offset_for_timestamp(Timestamp(1_505)).await.unwrap(),
        Some((Offset(42), Timestamp(5000)))
    );
    assert_eq!(
        log.offset_for_timestamp(Timestamp(1_425)).await.unwrap(),
        Some((Offset(42), Timestamp(5000)))
    );
    assert_eq!(
        log.offset_for_timestamp(Timestamp(1_410)).await.unwrap(),
        Some((Offset(41), Timestamp(1410)))
    );
    assert_eq!(
        log.offset_for_timestamp(Timestamp(5_001)).await.unwrap(),
        None
    );
    assert_eq!(
        log.max_timestamp_offset().await.unwrap(),
        Some((Offset(42), Timestamp(5000)))
    );
}

#[test]
fn clean_reopen_trusts_indexes_and_unclean_reopen_rebuilds_them() {
    block_on(async {
        let storage = MemStorage::new();
        let config = LogConfig {
            segment_bytes: 4096,
            index_interval_bytes: 256,
            ..LogConfig::default()
        };
        let log = open(&storage, "/idx/t-0", config.clone(), Clock::System).await;
        for i in 0..200i64 {
            append(&log, Some(&i.to_be_bytes()), Some(&[1; 100]), i).await;
        }
        let info = log.segments_info();
        log.close().await.unwrap();
        drop(log);
        let reopened = open(&storage, "/idx/t-0", config.clone(), Clock::System).await;
        assert_eq!(reopened.segments_info(), info);
        let records = all_records(&reopened).await;
        assert_eq!(records.len(), 200);
        drop(reopened); // unclean
                        // Lose the index files of a closed segment: it is scanned and rebuilt.
        let second = info[1].0 .0;
        storage
            .with_file_bytes(
                &PathBuf::from(format!("/idx/t-0/{second:020}.index")),
                |b| b.truncate(3),
            )
            .unwrap();
        let rebuilt = open(&storage, "/idx/t-0", config, Clock::System).await;
        assert_eq!(rebuilt.segments_info(), info);
        assert_eq!(all_records(&rebuilt).await, records);
        let r = rebuilt
            .read(Offset(150), 10, Offset(i64::MAX))
            .await
            .unwrap();
        assert_eq!(r[0].base_offset, Offset(150));
        assert_eq!(BatchHeader::parse(&r[0].bytes).unwrap().record_count(), 1);
    });
}

#[test]
fn interval_flush_syncs_only_when_due() {
    block_on(async {
        let storage = MemStorage::new();
        let clock = Clock::manual(0);
        let config = LogConfig {
            flush_mode: FlushMode::Interval,
            flush_ms: 1000,
            ..LogConfig::default()
        };
        let log = open(&storage, "/interval/t-0", config, clock.clone()).await;
        append(&log, None, Some(b"a"), 1).await;
        assert_eq!(log.log_end_offset(), Offset(1));
        assert_eq!(
            log.durable_end_offset(),
            Offset(0),
            "interval mode acknowledges before fdatasync"
        );
        log.flush_if_due().await.unwrap();
        assert_eq!(log.durable_end_offset(), Offset(0), "not due yet");
        clock.advance(1000);
        log.flush_if_due().await.unwrap();
        assert_eq!(log.durable_end_offset(), Offset(1));
    });
}

fn producer_batch(pid: i64, epoch: i16, seq: i32, n: usize) -> BytesMut {
    let mut b = sluice_engine::batch::BatchBuilder::new().producer(pid, epoch, seq);
    for i in 0..n {
        b.push(&sluice_engine::batch::NewRecord {
            value: Some(format!("p{pid}-s{}", seq as usize + i).into_bytes()),
            timestamp: Timestamp(1),
            ..Default::default()
        });
    }
    BytesMut::from(&b.build()[..])
}

#[test]
fn idempotent_retries_are_deduplicated_across_clean_and_unclean_restarts() {
    block_on(async {
        let storage = MemStorage::new();
        let config = LogConfig {
            segment_bytes: 1024,
            ..LogConfig::default()
        };
        let log = open(&storage, "/idem/t-0", config.clone(), Clock::System).await;
        let mut seq = 0;
        let mut last = None;
        for _ in 0..20 {
            let info = log
                .append(producer_batch(42, 0, seq, 3), LeaderEpoch(0))
                .await
                .unwrap();
            last = Some((seq, info));
            seq += 3;
        }
        let (last_seq, last_info) = last.unwrap();
        // A retry of the last batch is answered with its original offsets, and not appended.
        let end = log.log_end_offset();
        let retry = log
            .append(producer_batch(42, 0, last_seq, 3), LeaderEpoch(0))
            .await
            .unwrap();
        assert_eq!(
            (retry.base_offset, retry.last_offset),
            (last_info.base_offset, last_info.last_offset)
        );
        assert_eq!(log.log_end_offset(), end);
        // A gap in the sequence and an old epoch are refused.
        assert!(matches!(
            log.append(producer_batch(42, 0, seq + 1, 1), LeaderEpoch(0))
                .await,
            Err(LogError::Producer(
                sluice_engine::producer_state::ProducerError::OutOfOrderSequence { .. }
            ))
        ));
        assert!(matches!(
            log.append(producer_batch(42, -1, 0, 1), LeaderEpoch(0))
                .await,
            Err(LogError::Producer(
                sluice_engine::producer_state::ProducerError::InvalidEpoch { .. }
            ))
        ));
        assert!(log.segment_count() > 2, "rolls wrote snapshots");
        // Clean restart: the snapshot written at close knows the producer.
        log.close().await.unwrap();
        drop(log);
        let log = open(&storage, "/idem/t-0", config.clone(), Clock::System).await;
        let retry = log
            .append(producer_batch(42, 0, last_seq, 3), LeaderEpoch(0))
            .await
            .unwrap();
        assert_eq!(retry.base_offset, last_info.base_offset);
        let info = log
            .append(producer_batch(42, 0, seq, 2), LeaderEpoch(0))
            .await
            .unwrap();
        assert_eq!(info.base_offset, end);
        // Unclean restart: the state is rebuilt from the last snapshot plus the log after it.
        drop(log);
        let log = open(&storage, "/idem/t-0", config, Clock::System).await;
        let retry = log
            .append(producer_batch(42, 0, seq, 2), LeaderEpoch(0))
            .await
            .unwrap();
        assert_eq!(
            retry.base_offset, info.base_offset,
            "retry after a crash must not be appended twice"
        );
        assert_eq!(log.log_end_offset(), Offset(info.last_offset.0 + 1));
        // A new epoch starts at sequence 0.
        let bumped = log
            .append(producer_batch(42, 1, 0, 1), LeaderEpoch(0))
            .await
            .unwrap();
        assert_eq!(bumped.base_offset, Offset(info.last_offset.0 + 1));
    });
}

#[test]
fn segments_without_timestamps_age_from_their_last_write_not_from_1970() {
    block_on(async {
        let storage = MemStorage::new();
        let clock = Clock::manual(1_000_000_000);
        let config = LogConfig {
            retention_ms: 60_000,
            ..LogConfig::default()
        };
        let log = open(&storage, "/retain/no-ts-0", config.clone(), clock.clone()).await;
        // Producers that send no timestamp write -1: the batch's max timestamp is -1.
        for _ in 0..3 {
            append(&log, None, Some(b"v"), -1).await;
            log.roll().await.unwrap();
        }
        append(&log, None, Some(b"active"), -1).await;
        assert_eq!(log.segment_count(), 4);
        clock.advance(59_000);
        let outcome = log.enforce_retention().await.unwrap();
        assert_eq!(outcome.segments_deleted, 0, "{outcome:?}");
        assert_eq!(all_records(&log).await.len(), 4);
        // Reopened, the segments take their files' times (the simulated disk has none: "now").
        log.close().await.unwrap();
        drop(log);
        let log = open(&storage, "/retain/no-ts-0", config.clone(), clock.clone()).await;
        clock.advance(59_000);
        assert_eq!(log.enforce_retention().await.unwrap().segments_deleted, 0);
        assert_eq!(all_records(&log).await.len(), 4);
        // Once they have not been written for longer than retention.ms, they go, the active
        // one too (rolled first).
        clock.advance(2_000);
        let outcome = log.enforce_retention().await.unwrap();
        assert_eq!(outcome.segments_deleted, 4, "{outcome:?}");
        assert_eq!(log.log_start_offset(), Offset(4));
        assert_eq!(log.log_end_offset(), Offset(4));
    });
}

#[test]
fn retention_keeps_the_active_segment_while_an_older_one_stays() {
    block_on(async {
        let storage = MemStorage::new();
        let clock = Clock::manual(1_000_000_000);
        let config = LogConfig {
            retention_ms: 60_000,
            ..LogConfig::default()
        };
        let log = open(&storage, "/retain/mixed-0", config, clock.clone()).await;
        // A fresh closed segment, then an active one with timestamps from 1970: Kafka walks
        // from the oldest segment and stops at the first that stays, so nothing goes.
        append(&log, None, Some(b"fresh"), clock.now_ms()).await;
        log.roll().await.unwrap();
        append(&log, None, Some(b"old"), 1_000).await;
        let outcome = log.enforce_retention().await.unwrap();
        assert_eq!(outcome.segments_deleted, 0, "{outcome:?}");
        assert_eq!(all_records(&log).await.len(), 2);
        // With only 1970 timestamps, the log is expired as a whole, as in Kafka.
        let log2 = open(
            &storage,
            "/retain/old-0",
            LogConfig {
                retention_ms: 60_000,
                ..LogConfig::default()
            },
            clock.clone(),
        )
        .await;
        append(&log2, None, Some(b"old"), 1_000).await;
        assert_eq!(log2.enforce_retention().await.unwrap().segments_deleted, 1);
        assert_eq!(log2.log_start_offset(), Offset(1));
    });
}

// ---- compressed batches ------------------------------------------------------------------

const CODECS: [Compression; 5] = [
    Compression::None,
    Compression::Gzip,
    Compression::Snappy,
    Compression::Lz4,
    Compression::Zstd,
];

/// A record to append: key, value, timestamp.
type NewKeyValue = (Option<Vec<u8>>, Option<Vec<u8>>, i64);

/// One batch of `records` compressed with `codec`, from an idempotent
/// producer whose sequence numbers count the records (`base_sequence` is the first one's).
fn compressed_batch(codec: Compression, base_sequence: i32, records: &[NewKeyValue]) -> BytesMut {
    let mut b = BatchBuilder::new()
        .producer(77, 3, base_sequence)
        .compression(codec);
    for (key, value, ts) in records {
        b.push(&NewRecord {
            key: key.clone(),
            value: value.clone(),
            headers: vec![(b"h".to_vec(), Some(b"x".to_vec()))],
            timestamp: Timestamp(*ts),
        });
    }
    BytesMut::from(&b.build()[..])
}

type StoredRecord = (i64, Option<Vec<u8>>, Option<Vec<u8>>, i64);

/// Every stored batch's codec and its records (offset, key, value, timestamp), decompressed.
async fn stored(log: &Log<MemStorage>) -> Vec<(i16, Vec<StoredRecord>)> {
    let mut out = Vec::new();
    let mut cur = log.log_start_offset();
    loop {
        let batches = log.read(cur, 1 << 20, Offset(i64::MAX)).await.unwrap();
        if batches.is_empty() {
            return out;
        }
        for b in batches {
            let header = sluice_engine::batch::verify(&b.bytes).expect("stored batches verify");
            let section = records_section(&b.bytes).unwrap();
            let records = Records::section(&section, header.record_count())
                .map(|r| {
                    let r = r.unwrap();
                    (
                        b.base_offset.0 + r.offset_delta as i64,
                        r.key.map(<[u8]>::to_vec),
                        r.value.map(<[u8]>::to_vec),
                        header.base_timestamp().0 + r.timestamp_delta,
                    )
                })
                .collect();
            out.push((header.compression(), records));
            cur = b.last_offset.next();
        }
    }
}

#[test]
fn compaction_filters_inside_compressed_batches_and_keeps_their_codec() {
    for codec in CODECS {
        block_on(async {
            let storage = MemStorage::new();
            let clock = Clock::manual(1_000_000);
            let config = LogConfig {
                segment_bytes: 1500,
                cleanup_compact: true,
                cleanup_delete: false,
                ..LogConfig::default()
            };
            let dir = format!("/compact-{}/t-0", codec.name());
            let log = open(&storage, &dir, config.clone(), clock.clone()).await;
            // 30 batches of 8 records over 11 keys; one key ends in a tombstone.
            let mut written = Vec::new();
            for b in 0..30i64 {
                let records: Vec<_> = (0..8i64)
                    .map(|i| {
                        let n = b * 8 + i;
                        let key = format!("key-{}", (n * 7) % 11).into_bytes();
                        let value = (n != 200).then(|| format!("value-{n}").repeat(3).into_bytes());
                        (Some(key), value, clock.now_ms() + i)
                    })
                    .collect();
                let info = log
                    .append(
                        compressed_batch(codec, b as i32 * 8, &records),
                        LeaderEpoch(0),
                    )
                    .await
                    .unwrap();
                for (i, (k, v, ts)) in records.into_iter().enumerate() {
                    written.push((info.base_offset.0 + i as i64, k, v, ts));
                }
                clock.advance(10);
            }
            log.roll().await.unwrap();
            let before = stored(&log).await;
            assert!(before.iter().all(|(c, _)| *c == codec.id()));
            let outcome = log.compact().await.unwrap();
            assert!(outcome.records_removed > 150, "{codec:?}: {outcome:?}");
            let after = stored(&log).await;
            // Every batch keeps its codec; every record kept is unchanged at its offset.
            assert!(after.iter().all(|(c, _)| *c == codec.id()), "{codec:?}");
            let kept: Vec<StoredRecord> = after.into_iter().flat_map(|(_, r)| r).collect();
            // The model: the latest record of every key, tombstones included (they are young).
            let mut latest = BTreeMap::new();
            for r in &written {
                latest.insert(r.1.clone(), r.clone());
            }
            let mut expected: Vec<StoredRecord> = latest.into_values().collect();
            expected.sort();
            assert_eq!(kept, expected, "{codec:?}");
            // The offset range of the log never moves.
            assert_eq!(log.log_end_offset(), Offset(240));
            log.close().await.unwrap();
            drop(log);
            let log = open(&storage, &dir, config, clock.clone()).await;
            let reopened: Vec<StoredRecord> = stored(&log)
                .await
                .into_iter()
                .flat_map(|(_, r)| r)
                .collect();
            assert_eq!(reopened, expected, "{codec:?} after reopen");
        });
    }
}

#[test]
fn offset_for_timestamp_finds_the_record_inside_a_compressed_batch() {
    for codec in CODECS {
        block_on(async {
            let storage = MemStorage::new();
            let config = LogConfig {
                segment_bytes: 4096,
                ..LogConfig::default()
            };
            let dir = format!("/ts-{}/t-0", codec.name());
            let log = open(&storage, &dir, config, Clock::System).await;
            // Ten batches of ten records, timestamps 1000, 1010, ...; record 57 carries the max.
            for b in 0..10i64 {
                let records: Vec<_> = (0..10i64)
                    .map(|i| {
                        let n = b * 10 + i;
                        let ts = if n == 57 { 9_000 } else { 1_000 + n * 10 };
                        (None, Some(vec![n as u8; 30]), ts)
                    })
                    .collect();
                log.append(
                    compressed_batch(codec, b as i32 * 10, &records),
                    LeaderEpoch(0),
                )
                .await
                .unwrap();
            }
            let at = |ts| log.offset_for_timestamp(Timestamp(ts));
            assert_eq!(
                at(1_505).await.unwrap(),
                Some((Offset(51), Timestamp(1_510))),
                "{codec:?}"
            );
            assert_eq!(
                at(1_000).await.unwrap(),
                Some((Offset(0), Timestamp(1_000)))
            );
            assert_eq!(
                at(1_575).await.unwrap(),
                Some((Offset(57), Timestamp(9_000)))
            );
            assert_eq!(
                at(1_555).await.unwrap(),
                Some((Offset(56), Timestamp(1_560)))
            );
            // Record 57 carries 9000: it is the first at or after any time up to then.
            assert_eq!(
                at(1_585).await.unwrap(),
                Some((Offset(57), Timestamp(9_000)))
            );
            assert_eq!(at(9_001).await.unwrap(), None);
            assert_eq!(
                log.max_timestamp_offset().await.unwrap(),
                Some((Offset(57), Timestamp(9_000))),
                "{codec:?}"
            );
        });
    }
}

#[test]
fn compression_type_recompresses_batches_on_append_keeping_their_records() {
    let records: Vec<_> = (0..50i64)
        .map(|i| {
            let key = (i % 5 != 0).then(|| format!("k{i}").into_bytes());
            (
                key,
                Some(format!("payload {i} ").repeat(8).into_bytes()),
                2_000 + (i * 13) % 29,
            )
        })
        .collect();
    for topic in
        std::iter::once(CompressionType::Producer).chain(CODECS.map(CompressionType::Codec))
    {
        for sent in CODECS {
            block_on(async {
                let storage = MemStorage::new();
                let config = LogConfig {
                    compression_type: topic,
                    ..LogConfig::default()
                };
                let log = open(&storage, "/recompress/t-0", config, Clock::System).await;
                log.append(
                    compressed_batch(Compression::None, 0, &records[..1]),
                    LeaderEpoch(0),
                )
                .await
                .unwrap();
                let info = log
                    .append(compressed_batch(sent, 1, &records), LeaderEpoch(2))
                    .await
                    .unwrap();
                assert_eq!(
                    (info.base_offset, info.last_offset),
                    (Offset(1), Offset(50))
                );
                let batches = log
                    .read(Offset(1), 1 << 20, Offset(i64::MAX))
                    .await
                    .unwrap();
                assert_eq!(batches.len(), 1);
                let header = sluice_engine::batch::verify(&batches[0].bytes).unwrap();
                assert_eq!(
                    header.compression(),
                    topic.target(sent).id(),
                    "{topic:?} {sent:?}"
                );
                assert_eq!(header.base_offset(), Offset(1));
                assert_eq!(header.partition_leader_epoch(), LeaderEpoch(2));
                assert_eq!(header.last_offset_delta(), 49);
                assert_eq!(
                    (
                        header.producer_id(),
                        header.producer_epoch(),
                        header.base_sequence()
                    ),
                    (77, 3, 1)
                );
                assert_eq!(header.base_timestamp(), Timestamp(2_000));
                assert_eq!(header.max_timestamp(), Timestamp(2_028));
                let got: Vec<_> = stored(&log)
                    .await
                    .into_iter()
                    .skip(1)
                    .flat_map(|(_, r)| r)
                    .collect();
                let want: Vec<_> = records
                    .iter()
                    .enumerate()
                    .map(|(i, (k, v, ts))| (1 + i as i64, k.clone(), v.clone(), *ts))
                    .collect();
                assert_eq!(got, want, "{topic:?} {sent:?}");
            });
        }
    }
}

#[test]
fn a_batch_that_recompresses_beyond_max_message_bytes_is_refused() {
    block_on(async {
        let storage = MemStorage::new();
        let config = LogConfig {
            compression_type: CompressionType::Codec(Compression::None),
            max_message_bytes: 4_000,
            ..LogConfig::default()
        };
        let log = open(&storage, "/too-large/t-0", config, Clock::System).await;
        let records: Vec<_> = (0..100)
            .map(|_| (None, Some(vec![0u8; 100]), 1_000))
            .collect();
        let batch = compressed_batch(Compression::Zstd, 0, &records);
        assert!(batch.len() < 4_000);
        assert!(matches!(
            log.append(batch, LeaderEpoch(0)).await,
            Err(LogError::InvalidBatch(BatchError::TooLarge {
                max: 4_000,
                ..
            }))
        ));
        assert_eq!(log.log_end_offset(), Offset(0));
    });
}

#[test]
fn keyless_records_of_a_compressed_batch_are_named_on_a_compacted_topic() {
    block_on(async {
        let storage = MemStorage::new();
        let config = LogConfig {
            cleanup_compact: true,
            ..LogConfig::default()
        };
        let log = open(&storage, "/keyless/t-0", config, Clock::System).await;
        let records: Vec<_> = (0..6)
            .map(|i| {
                (
                    (i % 4 != 1).then(|| vec![b'k', i as u8]),
                    Some(b"v".to_vec()),
                    1_000,
                )
            })
            .collect();
        for codec in CODECS {
            match log
                .append(compressed_batch(codec, 0, &records), LeaderEpoch(0))
                .await
            {
                Err(LogError::InvalidBatch(BatchError::MissingKey { batch_indexes })) => {
                    assert_eq!(batch_indexes, vec![1, 5], "{codec:?}")
                }
                other => panic!("{codec:?}: {other:?}"),
            }
        }
        assert_eq!(log.log_end_offset(), Offset(0));
    });
}

#[test]
fn a_log_emptied_and_started_over_continues_from_the_new_offset_across_restarts() {
    block_on(async {
        let storage = MemStorage::new();
        let config = LogConfig {
            segment_bytes: 4096,
            ..LogConfig::default()
        };
        let log = open(&storage, "/start-over", config.clone(), Clock::System).await;
        for i in 0..300 {
            append(
                &log,
                Some(b"k"),
                Some(format!("v{i}").as_bytes()),
                1_000 + i,
            )
            .await;
        }
        assert!(log.segment_count() > 1, "several segments to remove");
        log.truncate_fully_and_start_at(Offset(1_000))
            .await
            .unwrap();
        assert_eq!(log.log_start_offset(), Offset(1_000));
        assert_eq!(log.log_end_offset(), Offset(1_000));
        assert_eq!(log.segment_count(), 1);
        assert!(all_records(&log).await.is_empty());
        assert_eq!(
            append(&log, Some(b"k"), Some(b"after"), 5_000).await,
            Offset(1_000)
        );
        drop(log);
        // Unclean reopen (no close): the start offset and the new batch are there.
        let log = open(&storage, "/start-over", config.clone(), Clock::System).await;
        assert_eq!(log.log_start_offset(), Offset(1_000));
        assert_eq!(
            all_records(&log).await,
            vec![(1_000, Some(b"k".to_vec()), Some(b"after".to_vec()))]
        );
        // Started over past nothing at all: an empty log reopens empty at the offset.
        log.truncate_fully_and_start_at(Offset(7)).await.unwrap();
        log.close().await.unwrap();
        let log = open(&storage, "/start-over", config, Clock::System).await;
        assert_eq!(
            (log.log_start_offset(), log.log_end_offset()),
            (Offset(7), Offset(7))
        );
        assert_eq!(append(&log, None, Some(b"x"), 6_000).await, Offset(7));
        assert!(log.truncate_fully_and_start_at(Offset(-1)).await.is_err());
    });
}

/// Every batch of `log`, as stored, from its start.
async fn raw_batches(log: &Log<MemStorage>) -> Vec<bytes::Bytes> {
    let mut out = Vec::new();
    let mut cur = log.log_start_offset();
    loop {
        let batches = log.read(cur, 1 << 20, Offset(i64::MAX)).await.unwrap();
        if batches.is_empty() {
            return out;
        }
        for b in batches {
            cur = b.last_offset.next();
            out.push(b.bytes);
        }
    }
}

#[test]
fn a_follower_stores_the_leaders_batches_as_they_are_and_knows_its_producers() {
    block_on(async {
        let storage = MemStorage::new();
        let config = LogConfig {
            segment_bytes: 256,
            compression_type: CompressionType::Codec(Compression::Gzip),
            ..LogConfig::default()
        };
        let leader = open(&storage, "/follow/leader-0", config.clone(), Clock::System).await;
        let mut seq = 0;
        for epoch in [0, 0, 3, 3, 3, 7] {
            leader
                .append(producer_batch(42, 0, seq, 3), LeaderEpoch(epoch))
                .await
                .unwrap();
            seq += 3;
            append(&leader, Some(b"k"), None, 5).await;
        }
        let from_leader = raw_batches(&leader).await;
        assert_eq!(from_leader.len(), 12);

        // The follower has no recompression to do: the topic config says gzip, the batches
        // are gzip already, and a follower never recompresses anyway.
        let follower = open(
            &storage,
            "/follow/follower-0",
            LogConfig {
                compression_type: CompressionType::Producer,
                ..config.clone()
            },
            Clock::System,
        )
        .await;
        for b in &from_leader {
            follower
                .append_as_follower(BytesMut::from(&b[..]))
                .await
                .unwrap();
        }
        assert_eq!(
            follower.flush_for_replica().await.unwrap(),
            leader.log_end_offset()
        );
        assert_eq!(follower.durable_end_offset(), leader.log_end_offset());
        assert_eq!(raw_batches(&follower).await, from_leader, "byte for byte");
        assert_eq!(
            follower.leader_epochs(),
            vec![
                (LeaderEpoch(0), Offset(0)),
                (LeaderEpoch(3), Offset(8)),
                (LeaderEpoch(7), Offset(20))
            ]
        );
        assert_eq!(follower.leader_epochs(), leader.leader_epochs());
        assert!(
            follower.segment_count() > 2,
            "the follower rolls its own segments"
        );

        // A batch that does not continue the log is refused and changes nothing.
        let end = follower.log_end_offset();
        assert!(matches!(
            follower
                .append_as_follower(BytesMut::from(&from_leader[3][..]))
                .await,
            Err(LogError::UnexpectedAppendOffset { base_offset, log_end_offset })
                if base_offset == Offset(7) && log_end_offset == end
        ));
        let mut corrupt = BytesMut::from(&from_leader[0][..]);
        let last = corrupt.len() - 1;
        corrupt[last] ^= 0xff;
        assert!(follower.append_as_follower(corrupt).await.is_err());
        assert_eq!(follower.log_end_offset(), end);

        // The producer state came with the batches: as leader after a crash, the follower
        // answers the producer's retry with the original offsets and takes its next batch.
        drop(follower);
        let follower = open(
            &storage,
            "/follow/follower-0",
            config.clone(),
            Clock::System,
        )
        .await;
        assert_eq!(raw_batches(&follower).await, from_leader);
        let retry = follower
            .append(producer_batch(42, 0, seq - 3, 3), LeaderEpoch(8))
            .await
            .unwrap();
        assert_eq!(retry.base_offset, Offset(20));
        let next = follower
            .append(producer_batch(42, 0, seq, 1), LeaderEpoch(8))
            .await
            .unwrap();
        assert_eq!(next.base_offset, end);

        // Truncated back into epoch 3 (KIP-101), the follower takes the leader's batches from
        // there again.
        assert_eq!(follower.truncate_to(Offset(12)).await.unwrap(), Offset(12));
        assert_eq!(
            follower.leader_epochs(),
            vec![(LeaderEpoch(0), Offset(0)), (LeaderEpoch(3), Offset(8))]
        );
        for b in &from_leader[6..] {
            follower
                .append_as_follower(BytesMut::from(&b[..]))
                .await
                .unwrap();
        }
        follower.flush_for_replica().await.unwrap();
        assert_eq!(raw_batches(&follower).await, from_leader);
    });
}

#[test]
fn a_follower_takes_batches_past_a_compaction_gap() {
    block_on(async {
        let storage = MemStorage::new();
        let leader = open(
            &storage,
            "/gap/leader-0",
            LogConfig::default(),
            Clock::System,
        )
        .await;
        for i in 0..5 {
            append(&leader, Some(b"k"), Some(&[i]), 5).await;
        }
        let batches = raw_batches(&leader).await;
        let follower = open(
            &storage,
            "/gap/follower-0",
            LogConfig::default(),
            Clock::System,
        )
        .await;
        // Offsets 1 and 2 were compacted away on the leader.
        for i in [0, 3, 4] {
            follower
                .append_as_follower(BytesMut::from(&batches[i][..]))
                .await
                .unwrap();
        }
        follower.flush_for_replica().await.unwrap();
        assert_eq!(follower.log_end_offset(), Offset(5));
        let got: Vec<i64> = all_records(&follower).await.iter().map(|r| r.0).collect();
        assert_eq!(got, vec![0, 3, 4]);
        let read = follower.read(Offset(1), 1 << 20, Offset(5)).await.unwrap();
        assert_eq!(
            read[0].base_offset,
            Offset(3),
            "a read inside the gap starts past it"
        );
    });
}

/// An acks=all append waiting in its fdatasync while a truncation (a follower cut back by
/// KIP-320) removes whole segments: the sync's end must find a whole log, not one whose
/// segments are gone while its end offset still names them.
#[test]
fn a_sync_in_flight_while_a_truncation_removes_segments() {
    block_on(async {
        let storage = MemStorage::new();
        let config = LogConfig {
            segment_bytes: 1024,
            ..LogConfig::default()
        };
        let log = open(&storage, "/race/t-0", config, Clock::System).await;
        let value = [7u8; 200];
        for _ in 0..20 {
            append(&log, None, Some(&value), 1).await;
        }
        assert!(log.segment_count() >= 4, "{} segments", log.segment_count());
        let end = log.log_end_offset();
        let cut = Offset(2);
        let (appended, truncated) = futures_lite::future::zip(
            async {
                let b = simple_batch(&[(None, Some(&value[..]))], Timestamp(1));
                log.append(BytesMut::from(&b[..]), LeaderEpoch(0)).await
            },
            async {
                // Let the append reach its fdatasync first.
                futures_lite::future::yield_now().await;
                log.truncate_to(cut).await
            },
        )
        .await;
        let truncated = truncated.expect("truncate");
        assert_eq!(truncated, cut);
        // Either the append was durable before the truncation began (and acknowledged: the
        // replication layer decides what a truncation may take), or it was cut away first
        // and is refused; never acknowledged from a log in between.
        match appended {
            Ok(info) => assert_eq!(info.base_offset, end),
            Err(LogError::Truncated { .. }) => {}
            Err(e) => panic!("unexpected {e}"),
        }
        assert_eq!(log.log_end_offset(), cut);
        assert!(log.segment_base_offsets().iter().all(|&b| b <= cut));
        let offsets: Vec<i64> = all_records(&log).await.iter().map(|r| r.0).collect();
        assert_eq!(offsets, vec![0, 1]);
        // The log takes appends at the cut again.
        assert_eq!(append(&log, None, Some(&value), 1).await, cut);
    });
}
