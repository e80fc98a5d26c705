//! Compaction of a log holding transactions: aborted records removed, committed ones compacted
//! like any others, markers kept while their transaction has batches in the log and then until
//! `delete.retention.ms`, nothing touched at or past the last stable offset, and the aborted
//! list and producer state the same after a crash as before it.

use std::path::{Path, PathBuf};

use bytes::BytesMut;
use futures_lite::future::block_on;
use sluice_engine::batch::{control_batch, BatchBuilder, BatchHeader, NewRecord, Records};
use sluice_engine::batch::{simple_batch, ATTR_TRANSACTIONAL};
use sluice_engine::producer_state::{control_type, AbortedTxn, CONTROL_TYPE_COMMIT};
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
        let producers = log.active_producers();
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
        assert_eq!(log.active_producers(), producers);

        // Power loss, and no snapshot to start from: the producer state and the aborted list
        // are replayed from the compacted log alone and come back the same, thanks to the
        // emptied batches (P2's and P3's last sequences) and the markers kept with them.
        drop(log);
        remove_snapshots(&storage).await;
        let storage = storage.crash(CrashMode::DropUnsynced);
        let log = open(&storage, &clock).await;
        assert_eq!(contents(&log).await, after_first);
        assert_eq!(log.active_producers(), producers);
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
        let producers = log.active_producers();
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
        assert_eq!(log.active_producers(), producers);

        // A power loss right after: the snapshot written before the abort marker went is the
        // one loaded (the one written at the last roll still lists P2's abort), so the aborted
        // list does not name a transaction whose marker is gone.
        drop(log);
        let storage = storage.crash(CrashMode::DropUnsynced);
        let log = open(&storage, &clock).await;
        assert_eq!(contents(&log).await, after_third);
        assert_eq!(aborted(&log), vec![]);
        assert_eq!(log.active_producers(), producers);
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
