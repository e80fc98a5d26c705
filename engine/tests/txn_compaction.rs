//! Compaction of a log holding transactions: aborted records removed, committed ones compacted
//! like any others, markers kept while their transaction has batches in the log and then until
//! `delete.retention.ms`, nothing touched at or past the last stable offset, and the aborted
//! list and producer state the same after a crash as before it.

use std::path::{Path, PathBuf};

use bytes::BytesMut;
use futures_lite::future::block_on;
use sluice_engine::batch::{control_batch, BatchBuilder, BatchHeader, NewRecord, Records};
use sluice_engine::batch::{simple_batch, ATTR_TRANSACTIONAL};
use sluice_engine::producer_state::{
    control_type, AbortedTxn, ActiveProducer, CONTROL_TYPE_COMMIT,
};
use sluice_engine::{
    BatchCache, Clock, CrashMode, LeaderEpoch, Log, LogConfig, MemStorage, Offset, Storage,
    Timestamp,
};

const DIR: &str = "/txn-compact/t-0";
const DELETE_RETENTION_MS: i64 = 10_000;

fn config() -> LogConfig {
    LogConfig {
        cleanup_compact: true,
        cleanup_delete: false,
        delete_retention_ms: DELETE_RETENTION_MS,
        ..LogConfig::default()
    }
}

async fn open(storage: &MemStorage, clock: &Clock) -> Log<MemStorage> {
    Log::open(
        storage.clone(),
        PathBuf::from(DIR),
        config(),
        BatchCache::new(1 << 20),
        clock.clone(),
    )
    .await
    .expect("open")
}

/// Appends one batch of `(key, value)` records from producer `pid` (`pid < 0`: a plain batch;
/// else idempotent, transactional when `txn`). Returns its base offset.
async fn produce(
    log: &Log<MemStorage>,
    clock: &Clock,
    producer: Option<(i64, i32, bool)>,
    records: &[(&str, &str)],
) -> i64 {
    let ts = Timestamp(clock.now_ms());
    let bytes = match producer {
        None => {
            let kvs: Vec<_> = records
                .iter()
                .map(|(k, v)| (Some(k.as_bytes()), Some(v.as_bytes())))
                .collect();
            simple_batch(&kvs, ts)
        }
        Some((pid, seq, txn)) => {
            let mut b = BatchBuilder::new().producer(pid, 0, seq);
            if txn {
                b = b.attributes(ATTR_TRANSACTIONAL);
            }
            for (k, v) in records {
                b.push(&NewRecord {
                    key: Some(k.as_bytes().to_vec()),
                    value: Some(v.as_bytes().to_vec()),
                    headers: Vec::new(),
                    timestamp: ts,
                });
            }
            b.build()
        }
    };
    log.append(BytesMut::from(&bytes[..]), LeaderEpoch(0))
        .await
        .expect("append")
        .base_offset
        .0
}

async fn end_txn(log: &Log<MemStorage>, clock: &Clock, pid: i64, commit: bool) -> i64 {
    let b = control_batch(pid, 0, commit, 1, Timestamp(clock.now_ms()));
    log.append(BytesMut::from(&b[..]), LeaderEpoch(0))
        .await
        .expect("append a marker")
        .base_offset
        .0
}

/// The log from its start as readable lines: `"<offset> <key>=<value>"` per record,
/// `"<offset> commit P<pid>"`/`"<offset> abort P<pid>"` per marker, and
/// `"<offset> empty P<pid>"` for a batch compaction emptied.
async fn contents(log: &Log<MemStorage>) -> Vec<String> {
    let mut out = Vec::new();
    for b in raw_batches(log).await {
        let header = BatchHeader::parse(&b.1).unwrap();
        let pid = header.producer_id();
        if header.is_control() {
            let kind = if control_type(&b.1) == Some(CONTROL_TYPE_COMMIT) {
                "commit"
            } else {
                "abort"
            };
            out.push(format!("{} {kind} P{pid}", b.0));
            continue;
        }
        if header.record_count() == 0 {
            out.push(format!("{} empty P{pid}", b.0));
            continue;
        }
        for r in Records::new(&b.1) {
            let r = r.unwrap();
            out.push(format!(
                "{} {}={}",
                b.0 + r.offset_delta as i64,
                String::from_utf8_lossy(r.key.unwrap()),
                String::from_utf8_lossy(r.value.unwrap())
            ));
        }
    }
    out
}

/// (base offset, bytes) of every batch from the log start.
async fn raw_batches(log: &Log<MemStorage>) -> Vec<(i64, bytes::Bytes)> {
    let mut out = Vec::new();
    let mut cur = log.log_start_offset();
    loop {
        let batches = log.read(cur, 1 << 20, Offset(i64::MAX)).await.unwrap();
        if batches.is_empty() {
            return out;
        }
        for b in batches {
            cur = b.last_offset.next();
            out.push((b.base_offset.0, b.bytes));
        }
    }
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The log's producers, compared across reopens without the coordinator epoch of their last
/// marker: that is kept in memory only (engine/FORMAT.md), so a reopen from a snapshot forgets it
/// unless a marker after the snapshot is replayed.
fn producers_of(log: &Log<MemStorage>) -> Vec<ActiveProducer> {
    let mut producers = log.active_producers();
    for p in &mut producers {
        p.coordinator_epoch = -1;
    }
    producers
}

fn aborted(log: &Log<MemStorage>) -> Vec<AbortedTxn> {
    log.aborted_transactions(Offset(0), Offset(i64::MAX))
}

async fn remove_snapshots(storage: &MemStorage) {
    for name in storage.list_dir(Path::new(DIR)).await.unwrap() {
        if name.ends_with(".snapshot") {
            storage.remove(&Path::new(DIR).join(name)).await.unwrap();
        }
    }
}

#[test]
fn compaction_removes_aborted_records_and_keeps_markers_while_their_transactions_have_batches() {
    block_on(async {
        let storage = MemStorage::new();
        let clock = Clock::manual(1_000_000);
        let log = open(&storage, &clock).await;
        // Segment [0, 11): decided transactions.
        assert_eq!(produce(&log, &clock, None, &[("a", "a0")]).await, 0);
        // P1 commits a1 and b1; P2 aborts a2 and c2 (its a2 must not hide P1's a1 and its c2
        // must go although no later record has key c); P3 commits d3, which d10 supersedes.
        let p1 = Some((1, 0, true));
        assert_eq!(
            produce(&log, &clock, p1, &[("a", "a1"), ("b", "b1")]).await,
            1
        );
        assert_eq!(
            produce(
                &log,
                &clock,
                Some((2, 0, true)),
                &[("a", "a2"), ("c", "c2")]
            )
            .await,
            3
        );
        assert_eq!(end_txn(&log, &clock, 1, true).await, 5);
        assert_eq!(end_txn(&log, &clock, 2, false).await, 6);
        assert_eq!(produce(&log, &clock, None, &[("b", "b7")]).await, 7);
        assert_eq!(
            produce(&log, &clock, Some((3, 0, true)), &[("d", "d3")]).await,
            8
        );
        assert_eq!(end_txn(&log, &clock, 3, true).await, 9);
        assert_eq!(produce(&log, &clock, None, &[("d", "d10")]).await, 10);
        log.roll().await.unwrap();
        // Segment [11, 13): P4's transaction stays open, so the LSO is 11; b12 lies past it
        // and must not make b7 look superseded.
        assert_eq!(
            produce(&log, &clock, Some((4, 0, true)), &[("a", "a4")]).await,
            11
        );
        assert_eq!(produce(&log, &clock, None, &[("b", "b12")]).await, 12);
        log.roll().await.unwrap();
        // The active segment.
        assert_eq!(produce(&log, &clock, None, &[("e", "e13")]).await, 13);
        let hw = log.high_watermark();
        assert_eq!(hw, Offset(14));
        assert_eq!(log.first_unstable_offset(hw), Some(Offset(11)));
        let p2_abort = AbortedTxn {
            producer_id: 2,
            first_offset: Offset(3),
            last_offset: Offset(6),
            last_stable_offset: Offset(1),
        };
        assert_eq!(aborted(&log), vec![p2_abort]);

        // A high watermark inside the first segment leaves nothing cleanable.
        let outcome = log.compact_up_to(Offset(5)).await.unwrap();
        assert_eq!(outcome.segments_rewritten, 0, "{outcome:?}");
        assert_eq!(outcome.cleanable_end, Offset(0));

        let past_lso: Vec<_> = raw_batches(&log)
            .await
            .into_iter()
            .filter(|b| b.0 >= 11)
            .collect();
        let producers = producers_of(&log);
        let outcome = log.compact().await.unwrap();
        assert_eq!(outcome.cleanable_end, Offset(11), "{outcome:?}");
        assert_eq!(outcome.segments_rewritten, 1, "{outcome:?}");
        // a0, b1, a2, c2, d3.
        assert_eq!(outcome.records_removed, 5, "{outcome:?}");
        assert_eq!(outcome.markers_removed, 0, "{outcome:?}");
        let after_first = strs(&[
            "1 a=a1",
            // P2's and P3's batches lost every record but are their producers' last batches:
            // their headers stay, and so do their transactions' markers.
            "3 empty P2",
            "5 commit P1",
            "6 abort P2",
            "7 b=b7",
            "8 empty P3",
            "9 commit P3",
            "10 d=d10",
            "11 a=a4",
            "12 b=b12",
            "13 e=e13",
        ]);
        assert_eq!(contents(&log).await, after_first);
        // Nothing at or past the LSO changed, byte for byte.
        let past_lso_after: Vec<_> = raw_batches(&log)
            .await
            .into_iter()
            .filter(|b| b.0 >= 11)
            .collect();
        assert_eq!(past_lso_after, past_lso);
        // The kept part of P1's batch keeps its producer fields and transactional bit.
        let first = &raw_batches(&log).await[0];
        let h = BatchHeader::parse(&first.1).unwrap();
        assert_eq!(
            (h.producer_id(), h.base_sequence(), h.last_offset_delta()),
            (1, 0, 1)
        );
        assert!(h.is_transactional());
        assert_eq!(aborted(&log), vec![p2_abort]);
        assert_eq!(producers_of(&log), producers);

        // Power loss, and no snapshot to start from: the producer state and the aborted list
        // are replayed from the compacted log alone and come back the same, thanks to the
        // emptied batches (P2's and P3's last sequences) and the markers kept with them.
        drop(log);
        remove_snapshots(&storage).await;
        let storage = storage.crash(CrashMode::DropUnsynced);
        let log = open(&storage, &clock).await;
        assert_eq!(contents(&log).await, after_first);
        assert_eq!(producers_of(&log), producers);
        assert_eq!(aborted(&log), vec![p2_abort]);
        assert_eq!(
            log.first_unstable_offset(log.high_watermark()),
            Some(Offset(11))
        );
        // Compacting again changes nothing.
        let outcome = log.compact().await.unwrap();
        assert_eq!(outcome.segments_rewritten, 0, "{outcome:?}");

        // P4 commits; P1, P2 and P3 write again, so their old batches are no longer their
        // last ones.
        assert_eq!(end_txn(&log, &clock, 4, true).await, 14);
        assert_eq!(
            produce(&log, &clock, Some((1, 2, false)), &[("h", "h15")]).await,
            15
        );
        assert_eq!(
            produce(&log, &clock, Some((2, 2, false)), &[("f", "f16")]).await,
            16
        );
        assert_eq!(
            produce(&log, &clock, Some((3, 1, false)), &[("g", "g17")]).await,
            17
        );
        log.roll().await.unwrap();
        assert_eq!(log.first_unstable_offset(log.high_watermark()), None);

        // Every transaction but P4's is now empty; their markers are younger than
        // delete.retention.ms and stay, and so does P2's entry in the aborted list.
        clock.advance(DELETE_RETENTION_MS / 2);
        let outcome = log.compact().await.unwrap();
        assert_eq!(outcome.cleanable_end, Offset(18), "{outcome:?}");
        assert_eq!(outcome.markers_removed, 0, "{outcome:?}");
        let after_second = strs(&[
            "5 commit P1",
            "6 abort P2",
            "9 commit P3",
            "10 d=d10",
            "11 a=a4",
            "12 b=b12",
            "13 e=e13",
            "14 commit P4",
            "15 h=h15",
            "16 f=f16",
            "17 g=g17",
        ]);
        assert_eq!(contents(&log).await, after_second);
        assert_eq!(aborted(&log), vec![p2_abort]);

        // Once older than delete.retention.ms they go; P4's marker stays with a4.
        clock.advance(DELETE_RETENTION_MS);
        let producers = producers_of(&log);
        let outcome = log.compact().await.unwrap();
        assert_eq!(outcome.markers_removed, 3, "{outcome:?}");
        let after_third = strs(&[
            "10 d=d10",
            "11 a=a4",
            "12 b=b12",
            "13 e=e13",
            "14 commit P4",
            "15 h=h15",
            "16 f=f16",
            "17 g=g17",
        ]);
        assert_eq!(contents(&log).await, after_third);
        assert_eq!(aborted(&log), vec![]);
        assert_eq!(producers_of(&log), producers);

        // A power loss right after: the snapshot written before the abort marker went is the
        // one loaded (the one written at the last roll still lists P2's abort), so the aborted
        // list does not name a transaction whose marker is gone.
        drop(log);
        let storage = storage.crash(CrashMode::DropUnsynced);
        let log = open(&storage, &clock).await;
        assert_eq!(contents(&log).await, after_third);
        assert_eq!(aborted(&log), vec![]);
        assert_eq!(producers_of(&log), producers);
        assert_eq!(log.first_unstable_offset(log.high_watermark()), None);
        // The producers continue their sequences.
        assert_eq!(
            produce(&log, &clock, Some((2, 3, false)), &[("f", "f18")]).await,
            18
        );
        assert_eq!(
            produce(&log, &clock, Some((3, 2, true)), &[("g", "g19")]).await,
            19
        );
    });
}

#[test]
fn delete_records_past_an_abort_drops_it_from_the_aborted_list_across_a_crash() {
    block_on(async {
        let storage = MemStorage::new();
        let clock = Clock::manual(1_000_000);
        let log = open(&storage, &clock).await;
        produce(&log, &clock, Some((1, 0, true)), &[("a", "a0")]).await;
        assert_eq!(end_txn(&log, &clock, 1, false).await, 1);
        produce(&log, &clock, Some((2, 0, true)), &[("b", "b2")]).await;
        assert_eq!(end_txn(&log, &clock, 2, false).await, 3);
        produce(&log, &clock, None, &[("c", "c4")]).await;
        log.roll().await.unwrap();
        assert_eq!(aborted(&log).len(), 2);
        // The log start passes the first abort's marker but not the second's.
        log.delete_records(Offset(2)).await.unwrap();
        let listed = log.aborted_transactions(Offset(2), Offset(i64::MAX));
        assert_eq!(
            listed.iter().map(|a| a.producer_id).collect::<Vec<_>>(),
            vec![2]
        );
        produce(&log, &clock, None, &[("d", "d5")]).await;
        log.roll().await.unwrap();
        drop(log);
        let storage = storage.crash(CrashMode::DropUnsynced);
        let log = open(&storage, &clock).await;
        assert_eq!(log.log_start_offset(), Offset(2));
        assert_eq!(
            aborted(&log)
                .iter()
                .map(|a| (a.producer_id, a.first_offset.0, a.last_offset.0))
                .collect::<Vec<_>>(),
            vec![(2, 2, 3)]
        );
    });
}

/// What a randomized run appended: every data record, and every transaction's fate.
#[derive(Clone, Debug)]
struct MRec {
    offset: i64,
    key: String,
    value: String,
    /// Index into `Txn`s, for transactional records.
    txn: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Open,
    Committed,
    Aborted,
}

#[derive(Clone, Debug)]
struct MTxn {
    pid: i64,
    fate: Fate,
    marker: Option<i64>,
}

/// What the log holds: data records `(offset, key, value)`, marker offsets, and the
/// `(base offset, producer id)` of every transactional data batch (emptied ones included).
type Holdings = (Vec<(i64, String, String)>, Vec<i64>, Vec<(i64, i64)>);

async fn holdings(log: &Log<MemStorage>) -> Holdings {
    let mut records = Vec::new();
    let mut markers = Vec::new();
    let mut txn_batches = Vec::new();
    for (base, bytes) in raw_batches(log).await {
        let header = BatchHeader::parse(&bytes).unwrap();
        if header.is_control() {
            markers.push(base);
            continue;
        }
        if header.is_transactional() {
            txn_batches.push((base, header.producer_id()));
        }
        for r in Records::new(&bytes) {
            let r = r.unwrap();
            records.push((
                base + r.offset_delta as i64,
                String::from_utf8(r.key.unwrap().to_vec()).unwrap(),
                String::from_utf8(r.value.unwrap().to_vec()).unwrap(),
            ));
        }
    }
    (records, markers, txn_batches)
}

/// A small deterministic generator (xorshift), so that a failing seed can be rerun.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

async fn check_compaction(log: &Log<MemStorage>, model: &[MRec], txns: &[MTxn], seed: u64) {
    let before = holdings(log).await;
    let hw = log.high_watermark();
    let lso = log.first_unstable_offset(hw);
    let outcome = log.compact().await.unwrap();
    let end = outcome.cleanable_end.0;
    let after = holdings(log).await;
    let ctx = format!("seed {seed}, {outcome:?}");
    assert_eq!(log.first_unstable_offset(hw), lso, "{ctx}");
    if let Some(lso) = lso {
        assert!(end <= lso.0, "cleaned past the LSO {lso}: {ctx}");
    }
    let by_offset: std::collections::HashMap<i64, &MRec> =
        model.iter().map(|r| (r.offset, r)).collect();
    let aborted = |r: &MRec| r.txn.is_some_and(|t| txns[t].fate == Fate::Aborted);
    // Records kept are as appended; past the cleanable end nothing changed.
    for (o, k, v) in &after.0 {
        let m = by_offset[o];
        assert_eq!((&m.key, &m.value), (k, v), "{ctx}");
    }
    let tail = |h: &Holdings| {
        (
            h.0.iter()
                .filter(|r| r.0 >= end)
                .cloned()
                .collect::<Vec<_>>(),
            h.1.iter()
                .filter(|&&o| o >= end)
                .copied()
                .collect::<Vec<_>>(),
        )
    };
    assert_eq!(tail(&after), tail(&before), "{ctx}");
    let kept: std::collections::HashSet<i64> = after.0.iter().map(|r| r.0).collect();
    for r in model {
        // The latest record of each key that was not aborted survives.
        let latest = !aborted(r)
            && !model
                .iter()
                .any(|l| l.key == r.key && l.offset > r.offset && !aborted(l));
        if latest {
            assert!(kept.contains(&r.offset), "latest {r:?} lost: {ctx}");
        }
        if r.offset < end && kept.contains(&r.offset) {
            assert!(!aborted(r), "aborted {r:?} kept: {ctx}");
            let superseded = model
                .iter()
                .any(|l| l.key == r.key && l.offset > r.offset && l.offset < end && !aborted(l));
            assert!(!superseded, "superseded {r:?} kept: {ctx}");
        }
    }
    // A transactional batch left in the log keeps its transaction's marker.
    for &(base, pid) in &after.2 {
        let marker = txns
            .iter()
            .filter(|t| t.pid == pid)
            .filter_map(|t| t.marker)
            .filter(|&m| m > base)
            .min();
        if let Some(m) = marker {
            assert!(
                after.1.contains(&m),
                "marker {m} of batch {base} gone: {ctx}"
            );
        }
    }
    // The aborted list names no marker that is gone.
    for a in aborted_all(log) {
        assert!(
            after.1.contains(&a.last_offset.0),
            "{a:?} outlived its marker: {ctx}"
        );
    }
}

fn aborted_all(log: &Log<MemStorage>) -> Vec<AbortedTxn> {
    log.aborted_transactions(Offset(i64::MIN), Offset(i64::MAX))
}

#[test]
fn randomized_transactions_compact_against_a_model_and_survive_crashes() {
    for seed in 1..=40u64 {
        block_on(async {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut storage = MemStorage::new();
            let clock = Clock::manual(1_000_000);
            let mut log = open(&storage, &clock).await;
            let mut model: Vec<MRec> = Vec::new();
            let mut txns: Vec<MTxn> = Vec::new();
            let mut open_txn: [Option<usize>; 4] = [None; 4];
            let mut seqs = [0i32; 4];
            let mut n = 0;
            for _ in 0..120 {
                clock.advance(rng.below(2_000) as i64);
                match rng.below(20) {
                    0..=5 => {
                        let key = format!("k{}", rng.below(6));
                        let value = format!("v{n}");
                        n += 1;
                        let o = produce(&log, &clock, None, &[(&key, &value)]).await;
                        model.push(MRec {
                            offset: o,
                            key,
                            value,
                            txn: None,
                        });
                    }
                    6..=11 => {
                        let p = 1 + rng.below(3) as usize;
                        let t = *open_txn[p].get_or_insert_with(|| {
                            txns.push(MTxn {
                                pid: p as i64,
                                fate: Fate::Open,
                                marker: None,
                            });
                            txns.len() - 1
                        });
                        let count = 1 + rng.below(2) as usize;
                        let recs: Vec<(String, String)> = (0..count)
                            .map(|i| (format!("k{}", rng.below(6)), format!("v{}", n + i)))
                            .collect();
                        n += count;
                        let pairs: Vec<(&str, &str)> =
                            recs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                        let o =
                            produce(&log, &clock, Some((p as i64, seqs[p], true)), &pairs).await;
                        seqs[p] += count as i32;
                        for (i, (key, value)) in recs.into_iter().enumerate() {
                            model.push(MRec {
                                offset: o + i as i64,
                                key,
                                value,
                                txn: Some(t),
                            });
                        }
                    }
                    12..=14 => {
                        let p = 1 + rng.below(3) as usize;
                        if let Some(t) = open_txn[p].take() {
                            let commit = rng.below(2) == 0;
                            let m = end_txn(&log, &clock, p as i64, commit).await;
                            txns[t].marker = Some(m);
                            txns[t].fate = if commit {
                                Fate::Committed
                            } else {
                                Fate::Aborted
                            };
                        }
                    }
                    15 | 16 => log.roll().await.unwrap(),
                    17 | 18 => {
                        if rng.below(3) == 0 {
                            clock.advance(DELETE_RETENTION_MS);
                        }
                        check_compaction(&log, &model, &txns, seed).await;
                    }
                    _ => {
                        // A power loss, sometimes with no snapshot to start from.
                        let producers = producers_of(&log);
                        let aborted = aborted_all(&log);
                        let contents_before = holdings(&log).await;
                        let replay = rng.below(2) == 0;
                        drop(log);
                        if replay {
                            remove_snapshots(&storage).await;
                        }
                        storage = storage.crash(CrashMode::DropUnsynced);
                        log = open(&storage, &clock).await;
                        assert_eq!(holdings(&log).await, contents_before, "seed {seed}");
                        assert_eq!(producers_of(&log), producers, "seed {seed}");
                        let markers = |v: Vec<AbortedTxn>| {
                            v.iter()
                                .map(|a| (a.producer_id, a.last_offset))
                                .collect::<Vec<_>>()
                        };
                        if replay {
                            // A replay cannot know where an aborted transaction began once
                            // its first batches are compacted away; its marker it knows.
                            assert_eq!(markers(aborted_all(&log)), markers(aborted), "seed {seed}");
                        } else {
                            // `last_stable_offset` is a search hint that depends on when the
                            // high watermark last passed the markers (not snapshotted), so
                            // only the ranges must match.
                            let ranges = |v: Vec<AbortedTxn>| {
                                v.iter()
                                    .map(|a| (a.producer_id, a.first_offset, a.last_offset))
                                    .collect::<Vec<_>>()
                            };
                            assert_eq!(ranges(aborted_all(&log)), ranges(aborted), "seed {seed}");
                        }
                    }
                }
            }
            log.roll().await.unwrap();
            clock.advance(2 * DELETE_RETENTION_MS);
            check_compaction(&log, &model, &txns, seed).await;
        });
    }
}
