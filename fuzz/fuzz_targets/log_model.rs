//! The partition log (`sluice_engine::Log` over the test storage `MemStorage`) driven by an
//! arbitrary sequence of operations, against a simple model: a list of batches, each a list of
//! records with their offsets, plus the log start and end offsets.
//!
//! Operations: append, read, roll, truncate, DeleteRecords, retention (bytes and time),
//! compaction, timestamp lookup, clean reopen, power loss (unsynced writes dropped or torn), a
//! clock that moves, and an injected I/O failure (`fail_after_on`) that fires on a later data
//! operation. Checked after every operation: the offsets agree with the model, reads return
//! exactly the model's records, and every error is one the operation may give; nothing panics.
//!
//! With `flush.mode = batch` every acknowledged append is synced, so a power loss keeps all of
//! them. When an injected failure makes an operation fail, that operation's effect is in doubt:
//! the power is cut at once, the log reopened, and what it holds must be the model before the
//! operation, with any part of the operation applied (records it would add or remove may or may
//! not be there, certain records must be); the model then takes what the log holds.
//!
//! Where the model needs the segment layout (which batches truncation keeps, which segments
//! retention or DeleteRecords deleted, which segments are closed for compaction) it asks the log
//! for its segment base offsets; it checks that segments only go away when an operation may
//! delete them.

#![no_main]

use std::collections::HashMap;
use std::path::PathBuf;

use arbitrary::Arbitrary;
use bytes::BytesMut;
use futures_lite::future::block_on;
use libfuzzer_sys::fuzz_target;
use sluice_engine::batch::{BatchBuilder, BatchHeader, NewRecord, Records};
use sluice_engine::{
    BatchCache, Clock, CrashMode, LeaderEpoch, Log, LogConfig, LogError, MemStorage, Offset,
    Timestamp,
};

#[derive(Arbitrary, Debug, Clone)]
struct Rec {
    key: u8,
    value_len: u16,
    tombstone: bool,
    /// Timestamp relative to the clock, in ms.
    dts: i8,
}

#[derive(Arbitrary, Debug, Clone)]
enum Op {
    Append {
        records: Vec<Rec>,
    },
    Read {
        from: u16,
        max_bytes: u16,
    },
    ReadOutOfRange {
        below: bool,
    },
    Roll,
    Truncate {
        at: u16,
    },
    DeleteRecords {
        at: u16,
    },
    Retention {
        bytes: u16,
        ms: Option<u16>,
    },
    Compact,
    OffsetForTimestamp {
        ts: i16,
    },
    AdvanceClock {
        ms: u16,
    },
    CleanReopen,
    PowerLoss {
        torn: Option<u64>,
    },
    /// The `countdown`-th next data operation (on `.log` files only, or on any file) fails.
    FailAfter {
        countdown: u8,
        segments_only: bool,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct MRec {
    offset: i64,
    key: Vec<u8>,
    value: Option<Vec<u8>>,
    timestamp: i64,
}

#[derive(Clone, Debug)]
struct MBatch {
    base: i64,
    last: i64,
    max_ts: i64,
    /// Records still in the log (compaction removes some), in offset order; never empty.
    records: Vec<MRec>,
}

#[derive(Clone, Debug, Default)]
struct Model {
    /// Every batch physically in the log, also those below the log start offset that share a
    /// segment with data above it.
    batches: Vec<MBatch>,
    start: i64,
    end: i64,
    /// After recovering from a failed operation the model is rebuilt from reads, which cannot
    /// see batches wholly below the log start: truncation to just above them is then checked
    /// less tightly.
    below_start_unknown: bool,
}

impl Model {
    fn visible_from(&self, from: i64) -> Vec<MRec> {
        self.batches
            .iter()
            .flat_map(|b| b.records.iter())
            .filter(|r| r.offset >= from && r.offset >= self.start)
            .cloned()
            .collect()
    }

    /// Drops the batches of segments the log no longer has (retention, DeleteRecords).
    fn forget_below(&mut self, first_segment: i64) {
        self.batches.retain(|b| b.base >= first_segment);
    }
}

const DIR: &str = "/fuzz/topic-0";
const DELETE_RETENTION_MS: i64 = 500;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 2048,
        index_interval_bytes: 200,
        retention_ms: -1,
        retention_bytes: -1,
        cleanup_delete: true,
        cleanup_compact: true,
        delete_retention_ms: DELETE_RETENTION_MS,
        ..LogConfig::default()
    }
}

async fn open(storage: &MemStorage, clock: &Clock) -> Result<Log<MemStorage>, LogError> {
    Log::open(
        storage.clone(),
        PathBuf::from(DIR),
        config(),
        BatchCache::new(8192),
        clock.clone(),
    )
    .await
}

/// Opens after a crash; an injected failure may still hit the recovery itself, which is then an
/// error (never a panic) and the next start must succeed.
async fn reopen(storage: &mut MemStorage, clock: &Clock) -> Log<MemStorage> {
    match open(storage, clock).await {
        Ok(log) => log,
        Err(e) => {
            assert!(is_storage_error(&e), "open failed with {e}");
            *storage = storage.crash(CrashMode::DropUnsynced);
            disarm(storage);
            open(storage, clock).await.expect("second open")
        }
    }
}

fn disarm(storage: &MemStorage) {
    storage.fail_after_on(u64::MAX, "");
}

fn is_storage_error(e: &LogError) -> bool {
    matches!(
        e,
        LogError::Io { .. } | LogError::Poisoned { .. } | LogError::DiskFull(_)
    )
}

/// Every record from `from` to the log end, batch by batch, with the batches' headers checked.
async fn read_all(
    log: &Log<MemStorage>,
    from: i64,
    max_bytes: usize,
) -> Result<Vec<(i64, i64, i64, Vec<MRec>)>, LogError> {
    let mut out = Vec::new();
    let mut cur = Offset(from);
    let end = log.log_end_offset();
    while cur < end {
        let batches = log.read(cur, max_bytes, Offset(i64::MAX)).await?;
        if batches.is_empty() {
            // Only a compaction gap may stand between `cur` and the end: the comparison with
            // the model says whether records were skipped.
            break;
        }
        for b in batches {
            assert!(
                b.last_offset >= cur,
                "batch ends before the offset asked for"
            );
            let h = BatchHeader::parse(&b.bytes).expect("header");
            assert_eq!(h.base_offset(), b.base_offset);
            assert_eq!(h.last_offset(), b.last_offset);
            let mut recs = Vec::new();
            for r in Records::new(&b.bytes) {
                let r = r.expect("a stored batch has valid records");
                recs.push(MRec {
                    offset: b.base_offset.0 + r.offset_delta as i64,
                    key: r.key.expect("every record has a key").to_vec(),
                    value: r.value.map(|v| v.to_vec()),
                    timestamp: h.base_timestamp().0 + r.timestamp_delta,
                });
            }
            out.push((b.base_offset.0, b.last_offset.0, h.max_timestamp().0, recs));
            cur = b.last_offset.next();
        }
    }
    Ok(out)
}

async fn check_reads(log: &Log<MemStorage>, model: &Model, from: i64, max_bytes: usize) {
    let got: Vec<MRec> = read_all(log, from, max_bytes)
        .await
        .expect("read")
        .into_iter()
        .flat_map(|b| b.3)
        .filter(|r| r.offset >= from)
        .collect();
    assert_eq!(got, model.visible_from(from), "read from {from}");
}

fn check_offsets(log: &Log<MemStorage>, model: &Model) {
    assert_eq!(log.log_end_offset().0, model.end, "log end offset");
    assert_eq!(log.log_start_offset().0, model.start, "log start offset");
    assert!(log.poisoned().is_none(), "poisoned without a failure");
}

fn first_segment(log: &Log<MemStorage>) -> i64 {
    log.segment_base_offsets()[0].0
}

/// The model after a successful truncation to `target` (start ≤ target < end).
fn truncated(model: &Model, bases: &[i64], target: i64) -> Model {
    let keep = bases
        .iter()
        .copied()
        .filter(|&b| b < target)
        .last()
        .unwrap_or(bases[0]);
    let i = model
        .batches
        .iter()
        .position(|b| b.last >= target)
        .unwrap_or(model.batches.len());
    let mut m = model.clone();
    m.batches.truncate(i);
    let prev_end = m.batches.last().map_or(i64::MIN, |b| b.last + 1);
    m.end = keep.max(prev_end);
    m.start = m.start.min(m.end);
    m
}

/// The model after a successful compaction with the given segment bases (the last one active).
fn compacted(model: &Model, bases: &[i64], now: i64) -> Model {
    let active = *bases.last().unwrap();
    let mut latest: HashMap<Vec<u8>, i64> = HashMap::new();
    for b in model.batches.iter().filter(|b| b.base < active) {
        for r in &b.records {
            latest.insert(r.key.clone(), r.offset);
        }
    }
    let horizon = now - DELETE_RETENTION_MS;
    let mut m = model.clone();
    for b in m.batches.iter_mut().filter(|b| b.base < active) {
        let expired = b.max_ts < horizon;
        b.records
            .retain(|r| latest[&r.key] == r.offset && !(r.value.is_none() && expired));
    }
    m.batches.retain(|b| !b.records.is_empty());
    m
}

/// After a failed operation and a power loss: the log must hold `before` with any part of the
/// operation's effect (`after`) applied. Returns the model rebuilt from the log.
async fn reconcile(log: &Log<MemStorage>, before: &Model, after: &Model, what: &str) -> Model {
    let start = log.log_start_offset().0;
    let end = log.log_end_offset().0;
    let lo_end = before.end.min(after.end);
    let hi_end = before.end.max(after.end);
    assert!(
        (lo_end..=hi_end).contains(&end),
        "{what}: log end {end} after recovery, expected {lo_end}..={hi_end}"
    );
    let lo_start = before.start.min(after.start);
    let hi_start = before.start.max(after.start);
    assert!(
        (lo_start..=hi_start).contains(&start) || start == end,
        "{what}: log start {start} after recovery, expected {lo_start}..={hi_start}"
    );
    let batches = read_all(log, start, 1 << 16)
        .await
        .expect("read after recovery");
    let index = |m: &Model| -> HashMap<i64, MRec> {
        m.batches
            .iter()
            .flat_map(|b| b.records.iter())
            .map(|r| (r.offset, r.clone()))
            .collect()
    };
    let (old, new) = (index(before), index(after));
    let mut seen = std::collections::HashSet::new();
    for r in batches
        .iter()
        .flat_map(|b| b.3.iter())
        .filter(|r| r.offset >= start)
    {
        let known = old.get(&r.offset).or(new.get(&r.offset));
        assert_eq!(
            known,
            Some(r),
            "{what}: record at {} after recovery",
            r.offset
        );
        seen.insert(r.offset);
    }
    // Records the operation cannot have removed must be there.
    for (offset, r) in &old {
        if new.get(offset) == Some(r) && *offset >= start && *offset < end {
            assert!(
                seen.contains(offset),
                "{what}: record at {offset} lost by recovery"
            );
        }
    }
    let below_start_unknown = batches.first().is_none_or(|b| b.0 > first_segment(log));
    Model {
        batches: batches
            .into_iter()
            .filter(|b| !b.3.is_empty())
            .map(|(base, last, max_ts, records)| MBatch {
                base,
                last,
                max_ts,
                records,
            })
            .collect(),
        start,
        end,
        below_start_unknown: below_start_unknown || before.below_start_unknown,
    }
}

fn frac(n: u16, lo: i64, hi: i64) -> i64 {
    lo + ((hi - lo) as i128 * n as i128 / u16::MAX as i128) as i64
}

async fn run(ops: Vec<Op>) {
    let clock = Clock::manual(1_000_000);
    let mut storage = MemStorage::new();
    let mut log = open(&storage, &clock).await.expect("first open");
    let mut model = Model::default();
    let mut armed = false;
    let mut value_seed = 0u8;
    for op in ops.into_iter().take(80) {
        let before = model.clone();
        let bases_before: Vec<i64> = log.segment_base_offsets().iter().map(|o| o.0).collect();
        // The model if the operation succeeds, for failure handling; None: nothing in doubt.
        let mut after: Option<Model> = None;
        let mut may_delete_segments = false;
        let op_desc = format!("{op:?}");
        let result: Result<(), LogError> = match op {
            Op::Append { records } => {
                let records: Vec<Rec> = records.into_iter().take(6).collect();
                if records.is_empty() {
                    continue;
                }
                let now = clock.now_ms();
                let mut builder = BatchBuilder::new();
                let mut recs = Vec::new();
                for (i, r) in records.iter().enumerate() {
                    value_seed = value_seed.wrapping_add(1);
                    let value =
                        (!r.tombstone).then(|| vec![value_seed; (r.value_len % 400) as usize]);
                    let key = vec![b'k', r.key % 8];
                    let timestamp = now + r.dts as i64;
                    builder.push(&NewRecord {
                        key: Some(key.clone()),
                        value: value.clone(),
                        headers: vec![],
                        timestamp: Timestamp(timestamp),
                    });
                    recs.push(MRec {
                        offset: model.end + i as i64,
                        key,
                        value,
                        timestamp,
                    });
                }
                let mut m = model.clone();
                m.batches.push(MBatch {
                    base: model.end,
                    last: model.end + recs.len() as i64 - 1,
                    max_ts: recs.iter().map(|r| r.timestamp).max().unwrap(),
                    records: recs,
                });
                m.end += records.len() as i64;
                after = Some(m);
                let batch = builder.build();
                match log.append(BytesMut::from(&batch[..]), LeaderEpoch(1)).await {
                    Ok(info) => {
                        assert_eq!(info.base_offset.0, model.end);
                        assert_eq!(info.last_offset.0, model.end + records.len() as i64 - 1);
                        model = after.clone().unwrap();
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Op::Read { from, max_bytes } => {
                let from = frac(from, model.start, model.end);
                check_reads(&log, &model, from, max_bytes as usize + 1).await;
                Ok(())
            }
            Op::ReadOutOfRange { below } => {
                let from = if below {
                    model.start - 1
                } else {
                    model.end + 1
                };
                if from >= 0 {
                    assert!(matches!(
                        log.read(Offset(from), 100, Offset(i64::MAX)).await,
                        Err(LogError::OffsetOutOfRange { .. })
                    ));
                }
                Ok(())
            }
            Op::Roll => {
                after = Some(model.clone());
                log.roll().await
            }
            Op::Truncate { at } => {
                // Mostly inside the log; now and then below the start (an error).
                let target = frac(at, model.start - 2, model.end + 1).max(0);
                let expect = if target >= model.end {
                    model.clone()
                } else if target < model.start {
                    model.clone()
                } else {
                    truncated(&model, &bases_before, target)
                };
                after = Some(expect.clone());
                match log.truncate_to(Offset(target)).await {
                    Ok(end) => {
                        assert!(target >= model.start, "truncation below the log start");
                        if model.below_start_unknown && end.0 != expect.end {
                            // A batch wholly below the log start (invisible to the model
                            // rebuilt after a failure) may end the log instead.
                            let first_known = expect
                                .batches
                                .first()
                                .map_or(model.end, |b| b.base)
                                .min(target);
                            assert!(
                                end.0 >= bases_before[0] && end.0 <= first_known,
                                "truncate_to({target}) ended the log at {end}"
                            );
                            let start = model.start.min(end.0);
                            model = expect;
                            model.end = end.0;
                            model.start = start;
                        } else {
                            assert_eq!(end.0, expect.end, "truncate_to({target})");
                            model = expect;
                        }
                        Ok(())
                    }
                    Err(LogError::OffsetOutOfRange { .. }) if target < model.start => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Op::DeleteRecords { at } => {
                let target = frac(at, 0, model.end + 1);
                let mut expect = model.clone();
                expect.start = expect.start.max(target);
                after = Some(expect.clone());
                may_delete_segments = true;
                match log.delete_records(Offset(target)).await {
                    Ok(start) => {
                        assert!(target <= model.end, "DeleteRecords past the end accepted");
                        assert_eq!(start.0, expect.start);
                        model = expect;
                        model.forget_below(first_segment(&log));
                        Ok(())
                    }
                    Err(LogError::OffsetOutOfRange { .. }) if target > model.end => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Op::Retention { bytes, ms } => {
                let mut c = config();
                c.retention_bytes = bytes as i64 * 4;
                c.retention_ms = ms.map_or(-1, |ms| ms as i64);
                log.set_config(c);
                after = Some(model.clone());
                may_delete_segments = true;
                let r = log.enforce_retention().await;
                log.set_config(config());
                match r {
                    Ok(outcome) => {
                        model.start = model.start.max(outcome.log_start_offset.0);
                        assert_eq!(outcome.log_start_offset.0, model.start);
                        model.forget_below(first_segment(&log));
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Op::Compact => {
                let expect = compacted(&model, &bases_before, clock.now_ms());
                after = Some(expect.clone());
                match log.compact().await {
                    Ok(_) => {
                        model = expect;
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Op::OffsetForTimestamp { ts } => {
                let ts = clock.now_ms() + ts as i64 / 64;
                let got = log
                    .offset_for_timestamp(Timestamp(ts))
                    .await
                    .expect("lookup");
                let want = model
                    .visible_from(model.start)
                    .into_iter()
                    .find(|r| r.timestamp >= ts)
                    .map(|r| (Offset(r.offset), Timestamp(r.timestamp)));
                assert_eq!(got, want, "offset for timestamp {ts}");
                Ok(())
            }
            Op::AdvanceClock { ms } => {
                clock.advance(ms as i64);
                Ok(())
            }
            Op::CleanReopen => {
                // A failed close leaves the log for recovery; acknowledged data stays either way.
                let closed = log.close().await;
                assert!(closed.is_ok() || armed, "close failed: {closed:?}");
                drop(log);
                log = reopen(&mut storage, &clock).await;
                Ok(())
            }
            Op::PowerLoss { torn } => {
                storage = storage.crash(match torn {
                    Some(seed) => CrashMode::TornSectors { seed },
                    None => CrashMode::DropUnsynced,
                });
                drop(log);
                log = reopen(&mut storage, &clock).await;
                Ok(())
            }
            Op::FailAfter {
                countdown,
                segments_only,
            } => {
                storage.fail_after_on(
                    countdown as u64 % 16,
                    if segments_only { ".log" } else { "" },
                );
                armed = true;
                Ok(())
            }
        };
        match result {
            Ok(()) => {}
            Err(e) => {
                // Only an injected failure may make an operation fail.
                assert!(armed && is_storage_error(&e), "{op_desc} failed: {e}");
                let after = after.expect("only operations with an effect fail");
                storage = storage.crash(CrashMode::DropUnsynced);
                disarm(&storage);
                armed = false;
                drop(log);
                log = reopen(&mut storage, &clock).await;
                model = reconcile(&log, &before, &after, &format!("{op_desc} failed ({e})")).await;
                may_delete_segments = true;
            }
        }
        if !may_delete_segments {
            assert!(
                first_segment(&log) <= bases_before[0],
                "{op_desc}: a segment went away outside retention and DeleteRecords"
            );
        }
        check_offsets(&log, &model);
    }
    check_reads(&log, &model, model.start, 1 << 16).await;
}

fuzz_target!(|ops: Vec<Op>| {
    // To see what a crashing input does: LOG_MODEL_DEBUG=1 <binary> <input>.
    if std::env::var_os("LOG_MODEL_DEBUG").is_some() {
        eprintln!("{ops:#?}");
    }
    block_on(run(ops));
});
