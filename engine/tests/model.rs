//! Property tests: the log against a simple in-memory model.
//!
//! Random sequences of append, read, roll, truncate, DeleteRecords, retention, timestamp lookup,
//! clean reopen and power loss run against a `Log` over `MemStorage` and against a `Vec` of
//! records; after every step the offsets agree, and reads return exactly the model's records.

use std::path::PathBuf;

use bytes::BytesMut;
use futures_lite::future::block_on;
use proptest::prelude::*;
use sluice_engine::batch::{BatchBuilder, NewRecord, Records};
use sluice_engine::{
    BatchCache, Clock, CrashMode, LeaderEpoch, Log, LogConfig, MemStorage, Offset, Timestamp,
};

#[derive(Clone, Debug, PartialEq, Eq)]
struct ModelRecord {
    offset: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    timestamp: i64,
}

#[derive(Default)]
struct Model {
    /// Batches as (base offset, records).
    batches: Vec<(i64, Vec<ModelRecord>)>,
    log_start: i64,
    log_end: i64,
}

impl Model {
    fn records_from(&self, from: i64) -> Vec<ModelRecord> {
        self.batches
            .iter()
            .flat_map(|(_, r)| r.iter())
            .filter(|r| r.offset >= from)
            .cloned()
            .collect()
    }
}

#[derive(Clone, Debug)]
enum Op {
    Append { records: Vec<(u8, u16, i64)> },
    Read { from_frac: f64, max_bytes: usize },
    Roll,
    Truncate { frac: f64 },
    DeleteRecords { frac: f64 },
    RetentionBytes { bytes: i64 },
    OffsetForTimestamp { ts: i64 },
    CleanReopen,
    PowerLoss,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => prop::collection::vec((0u8..16, 0u16..400, -5i64..20), 1..6).prop_map(|records| Op::Append { records }),
        3 => (0.0f64..=1.0, 1usize..3000).prop_map(|(from_frac, max_bytes)| Op::Read { from_frac, max_bytes }),
        1 => Just(Op::Roll),
        1 => (0.0f64..=1.0).prop_map(|frac| Op::Truncate { frac }),
        1 => (0.0f64..=1.0).prop_map(|frac| Op::DeleteRecords { frac }),
        1 => (0i64..6000).prop_map(|bytes| Op::RetentionBytes { bytes }),
        2 => (900i64..1400).prop_map(|ts| Op::OffsetForTimestamp { ts }),
        1 => Just(Op::CleanReopen),
        1 => Just(Op::PowerLoss),
    ]
}

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 1500,
        index_interval_bytes: 256,
        retention_ms: -1,
        ..LogConfig::default()
    }
}

async fn open(storage: &MemStorage, dir: &std::path::Path, config: LogConfig) -> Log<MemStorage> {
    Log::open(
        storage.clone(),
        dir.to_path_buf(),
        config,
        BatchCache::new(4096),
        Clock::manual(1_000_000),
    )
    .await
    .expect("open")
}

async fn read_all(log: &Log<MemStorage>, from: i64, max_bytes: usize) -> Vec<ModelRecord> {
    let mut out = Vec::new();
    let mut cur = Offset(from);
    loop {
        let batches = log
            .read(cur, max_bytes, Offset(i64::MAX))
            .await
            .expect("read");
        if batches.is_empty() {
            break;
        }
        for b in &batches {
            assert!(
                b.last_offset >= cur,
                "read returned a batch ending before the requested offset"
            );
            for r in Records::new(&b.bytes) {
                let r = r.expect("valid record");
                let h = sluice_engine::batch::BatchHeader::parse(&b.bytes).unwrap();
                let offset = b.base_offset.0 + r.offset_delta as i64;
                if offset >= from {
                    out.push(ModelRecord {
                        offset,
                        key: r.key.map(|k| k.to_vec()),
                        value: r.value.map(|v| v.to_vec()),
                        timestamp: h.base_timestamp().0 + r.timestamp_delta,
                    });
                }
            }
            cur = b.last_offset.next();
        }
    }
    out
}

fn check_offsets(log: &Log<MemStorage>, model: &Model) {
    assert_eq!(log.log_end_offset().0, model.log_end, "log end offset");
    assert_eq!(
        log.log_start_offset().0,
        model.log_start,
        "log start offset"
    );
}

fn run_ops(ops: Vec<Op>) {
    block_on(async move {
        let dir = PathBuf::from("/model/topic-0");
        let mut storage = MemStorage::new();
        let mut log = open(&storage, &dir, config()).await;
        let mut model = Model::default();
        let mut ts_base = 1000i64;
        for op in ops {
            match op {
                Op::Append { records } => {
                    let mut builder = BatchBuilder::new();
                    let mut model_records = Vec::new();
                    for (i, (key, len, dts)) in records.iter().enumerate() {
                        let value = vec![*key ^ (model.log_end as u8); *len as usize];
                        let ts = ts_base + dts;
                        builder.push(&NewRecord {
                            key: Some(vec![*key]),
                            value: Some(value.clone()),
                            headers: vec![],
                            timestamp: Timestamp(ts),
                        });
                        model_records.push(ModelRecord {
                            offset: model.log_end + i as i64,
                            key: Some(vec![*key]),
                            value: Some(value),
                            timestamp: ts,
                        });
                    }
                    ts_base += 3;
                    let batch = builder.build();
                    let info = log
                        .append(BytesMut::from(&batch[..]), LeaderEpoch(1))
                        .await
                        .expect("append");
                    assert_eq!(info.base_offset.0, model.log_end);
                    assert_eq!(info.last_offset.0, model.log_end + records.len() as i64 - 1);
                    model.batches.push((model.log_end, model_records));
                    model.log_end += records.len() as i64;
                }
                Op::Read {
                    from_frac,
                    max_bytes,
                } => {
                    let from = model.log_start
                        + ((model.log_end - model.log_start) as f64 * from_frac) as i64;
                    let got = read_all(&log, from, max_bytes).await;
                    assert_eq!(got, model.records_from(from), "read from {from}");
                    if from > model.log_end || from < model.log_start {
                        unreachable!();
                    }
                }
                Op::Roll => log.roll().await.expect("roll"),
                Op::Truncate { frac } => {
                    let target =
                        model.log_start + ((model.log_end - model.log_start) as f64 * frac) as i64;
                    let end = log.truncate_to(Offset(target)).await.expect("truncate").0;
                    // The batch holding the target goes entirely, with everything after it.
                    if let Some(i) = model
                        .batches
                        .iter()
                        .position(|(_, r)| r.last().unwrap().offset >= target)
                    {
                        model.log_end = model.batches[i].0;
                        model.batches.truncate(i);
                    }
                    assert_eq!(end, model.log_end, "truncate_to({target}) end");
                    model.log_start = model.log_start.min(model.log_end);
                }
                Op::DeleteRecords { frac } => {
                    let target =
                        model.log_start + ((model.log_end - model.log_start) as f64 * frac) as i64;
                    let start = log
                        .delete_records(Offset(target))
                        .await
                        .expect("delete records");
                    model.log_start = model.log_start.max(target);
                    assert_eq!(start.0, model.log_start);
                    model
                        .batches
                        .retain(|(_, r)| r.last().unwrap().offset >= model.log_start);
                }
                Op::RetentionBytes { bytes } => {
                    let mut c = config();
                    c.retention_bytes = bytes;
                    log.set_config(c);
                    let outcome = log.enforce_retention().await.expect("retention");
                    log.set_config(config());
                    let info = log.segments_info();
                    let total: u64 = info.iter().map(|s| s.1).sum();
                    if info.len() > 1 {
                        assert!(
                            total - info[0].1 < bytes as u64,
                            "retention left a deletable segment: {info:?} budget {bytes}"
                        );
                    }
                    model.log_start = model.log_start.max(outcome.log_start_offset.0);
                    model
                        .batches
                        .retain(|(_, r)| r.last().unwrap().offset >= model.log_start);
                }
                Op::OffsetForTimestamp { ts } => {
                    let got = log
                        .offset_for_timestamp(Timestamp(ts))
                        .await
                        .expect("lookup");
                    let want = model
                        .records_from(model.log_start)
                        .into_iter()
                        .find(|r| r.timestamp >= ts)
                        .map(|r| (Offset(r.offset), Timestamp(r.timestamp)));
                    assert_eq!(got, want, "offset for timestamp {ts}");
                }
                Op::CleanReopen => {
                    log.close().await.expect("close");
                    drop(log);
                    log = open(&storage, &dir, config()).await;
                }
                Op::PowerLoss => {
                    // Every append above was acknowledged under flush.mode=batch, so nothing
                    // may be lost.
                    storage = storage.crash(CrashMode::DropUnsynced);
                    drop(log);
                    log = open(&storage, &dir, config()).await;
                }
            }
            check_offsets(&log, &model);
        }
        let got = read_all(&log, model.log_start, 1 << 20).await;
        assert_eq!(got, model.records_from(model.log_start));
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn log_matches_model(ops in prop::collection::vec(op(), 1..60)) {
        run_ops(ops);
    }
}

#[test]
fn reads_respect_byte_budget_and_return_first_batch_whole() {
    block_on(async {
        let storage = MemStorage::new();
        let dir = PathBuf::from("/budget/t-0");
        let log = open(&storage, &dir, LogConfig::default()).await;
        for i in 0..10u8 {
            let b = sluice_engine::batch::simple_batch(&[(None, Some(&[i; 500]))], Timestamp(5));
            log.append(BytesMut::from(&b[..]), LeaderEpoch(0))
                .await
                .unwrap();
        }
        let one = log.read(Offset(0), 10, Offset(i64::MAX)).await.unwrap();
        assert_eq!(
            one.len(),
            1,
            "first batch is returned whole even above the budget"
        );
        let size = one[0].bytes.len();
        let three = log
            .read(Offset(0), size * 3 + size / 2, Offset(i64::MAX))
            .await
            .unwrap();
        assert_eq!(three.len(), 3);
        let capped = log.read(Offset(2), 1 << 20, Offset(5)).await.unwrap();
        assert_eq!(
            capped.iter().map(|b| b.base_offset.0).collect::<Vec<_>>(),
            vec![2, 3, 4]
        );
        assert!(matches!(
            log.read(Offset(11), 100, Offset(i64::MAX)).await,
            Err(sluice_engine::LogError::OffsetOutOfRange { .. })
        ));
        assert!(log
            .read(Offset(10), 100, Offset(i64::MAX))
            .await
            .unwrap()
            .is_empty());
    });
}
