//! Crash safety over the test storage backend, which drops every write that was not
//! fdatasync'd (or keeps a random subset of its sectors: a torn write) when the "power" fails.
//!
//! - Under `flush.mode = batch`, every acknowledged append survives a power loss, with
//!   concurrent appenders, rolls and group commit in play; the recovered log is a clean prefix
//!   of what was appended (no gap, no garbage, no batch that was never appended).
//! - Under `flush.mode = none`, nothing is promised for unsynced appends, but the log is still a
//!   clean prefix.
//! - A failed write or fsync poisons the log; the recovered log holds every append acknowledged
//!   before the failure.
//! - A torn or bit-flipped last batch is truncated on recovery, at every byte position.
//! - A bit flip inside a closed segment is reported on read and never served.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::BytesMut;
use futures_lite::future::block_on;
use glommio::LocalExecutorBuilder;
use rand::{Rng, SeedableRng};
use sluice_engine::batch::{simple_batch, BatchHeader, Records};
use sluice_engine::{
    BatchCache, Clock, CrashMode, FlushMode, LeaderEpoch, Log, LogConfig, LogError, MemStorage,
    Offset, Timestamp,
};

fn run<F: std::future::Future<Output = ()> + 'static>(f: impl FnOnce() -> F + Send + 'static) {
    LocalExecutorBuilder::default()
        .spawn(f)
        .expect("executor")
        .join()
        .expect("executor thread");
}

/// The value of the record at `offset`: derived from the offset alone, so any batch found in
/// the log can be checked against what the writer would have written there.
fn value_for(seq: u64, len: usize) -> Vec<u8> {
    let mut v = seq.to_be_bytes().to_vec();
    v.extend((0..len).map(|i| (seq as usize * 31 + i) as u8));
    v
}

fn config(flush_mode: FlushMode) -> LogConfig {
    LogConfig {
        segment_bytes: 8 << 10,
        index_interval_bytes: 512,
        flush_mode,
        ..LogConfig::default()
    }
}

async fn open(storage: &MemStorage, dir: &Path, config: LogConfig) -> Log<MemStorage> {
    Log::open(
        storage.clone(),
        dir.to_path_buf(),
        config,
        BatchCache::new(1 << 20),
        Clock::System,
    )
    .await
    .expect("open after crash")
}

/// Reads the whole log and checks it is a clean prefix: contiguous from the log start, every
/// batch one that the writer produced (one record whose value carries a sequence number).
/// Returns, per offset, the sequence number found there.
async fn read_clean_prefix(log: &Log<MemStorage>) -> Vec<u64> {
    let mut seqs = Vec::new();
    let mut cur = log.log_start_offset();
    let end = log.log_end_offset();
    while cur < end {
        let batches = log
            .read(cur, 1 << 16, Offset(i64::MAX))
            .await
            .expect("read");
        assert!(
            !batches.is_empty(),
            "read stopped at {cur} before the log end {end}"
        );
        for b in batches {
            assert_eq!(b.base_offset, cur, "gap or overlap in the recovered log");
            let records: Vec<_> = Records::new(&b.bytes).map(|r| r.expect("record")).collect();
            assert_eq!(records.len(), 1);
            let value = records[0].value.expect("value");
            let seq = u64::from_be_bytes(value[..8].try_into().unwrap());
            assert_eq!(
                value,
                &value_for(seq, value.len() - 8)[..],
                "batch content is not what was written"
            );
            seqs.push(seq);
            cur = b.last_offset.next();
        }
    }
    seqs
}

/// Runs `appenders` concurrent appenders until `acks_before_crash` appends are acknowledged,
/// then cuts the power. Returns the acknowledged (offset, seq) pairs and the restarted storage.
async fn append_until_crash(
    log: Rc<Log<MemStorage>>,
    storage: &MemStorage,
    appenders: usize,
    acks_before_crash: usize,
    next_seq: Rc<RefCell<u64>>,
    crash: CrashMode,
    rng_seed: u64,
) -> (Vec<(i64, u64)>, MemStorage) {
    let acked: Rc<RefCell<Vec<(i64, u64)>>> = Rc::new(RefCell::new(Vec::new()));
    let mut tasks = Vec::new();
    for a in 0..appenders {
        let log = log.clone();
        let acked = acked.clone();
        let next_seq = next_seq.clone();
        let mut rng = rand::rngs::StdRng::seed_from_u64(rng_seed ^ (a as u64 * 7919));
        tasks.push(glommio::spawn_local(async move {
            loop {
                let seq = {
                    let mut s = next_seq.borrow_mut();
                    *s += 1;
                    *s
                };
                let value = value_for(seq, rng.gen_range(10..900));
                let batch = simple_batch(&[(None, Some(&value))], Timestamp(seq as i64));
                match log.append(BytesMut::from(&batch[..]), LeaderEpoch(0)).await {
                    Ok(info) => acked.borrow_mut().push((info.base_offset.0, seq)),
                    Err(_) => return,
                }
            }
        }));
    }
    let started = std::time::Instant::now();
    while acked.borrow().len() < acks_before_crash {
        assert!(
            started.elapsed().as_secs() < 20,
            "appenders stalled: {} acks, poisoned: {:?}",
            acked.borrow().len(),
            log.poisoned()
        );
        futures_lite::future::yield_now().await;
    }
    // No await between reading the acknowledgements and the power cut.
    let acks = acked.borrow().clone();
    let restarted = storage.crash(crash);
    for t in tasks {
        t.cancel().await;
    }
    (acks, restarted)
}

fn power_loss_rounds(mode: FlushMode, crash_of: fn(u64) -> CrashMode, seed: u64) {
    run(move || async move {
        let dir = PathBuf::from("/crash/topic-0");
        let mut storage = MemStorage::new();
        let next_seq = Rc::new(RefCell::new(0u64));
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut all_acked: Vec<(i64, u64)> = Vec::new();
        for round in 0..60 {
            let log = Rc::new(open(&storage, &dir, config(mode)).await);
            // What survived must be a clean prefix and hold everything acknowledged so far.
            let seqs = read_clean_prefix(&log).await;
            if mode == FlushMode::Batch {
                for &(offset, seq) in &all_acked {
                    assert!(
                        (offset as usize) < seqs.len(),
                        "round {round}: acknowledged offset {offset} lost (log end {})",
                        seqs.len()
                    );
                    assert_eq!(
                        seqs[offset as usize], seq,
                        "round {round}: offset {offset} holds other data"
                    );
                }
            }
            // Acknowledgements past the recovered end are void under flush.mode=none.
            all_acked.retain(|&(o, _)| (o as usize) < seqs.len());
            let appenders = rng.gen_range(1..6);
            let acks = rng.gen_range(1..40);
            let (acked, restarted) = append_until_crash(
                log.clone(),
                &storage,
                appenders,
                acks,
                next_seq.clone(),
                crash_of(rng.gen()),
                rng.gen(),
            )
            .await;
            all_acked.extend(acked);
            drop(log);
            storage = restarted;
        }
        let log = open(&storage, &dir, config(mode)).await;
        let seqs = read_clean_prefix(&log).await;
        if mode == FlushMode::Batch {
            assert!(all_acked
                .iter()
                .all(|&(o, s)| seqs.get(o as usize) == Some(&s)));
        }
        println!(
            "{mode:?}: 60 power losses, {} acknowledged appends checked, {} batches recovered",
            all_acked.len(),
            seqs.len()
        );
    });
}

#[test]
fn acknowledged_appends_survive_power_loss_with_group_commit() {
    power_loss_rounds(FlushMode::Batch, |_| CrashMode::DropUnsynced, 1);
}

#[test]
fn acknowledged_appends_survive_torn_writes() {
    power_loss_rounds(FlushMode::Batch, |seed| CrashMode::TornSectors { seed }, 2);
}

#[test]
fn unsynced_log_recovers_to_a_clean_prefix() {
    power_loss_rounds(FlushMode::None, |seed| CrashMode::TornSectors { seed }, 3);
}

#[test]
fn failed_write_or_fsync_poisons_the_log_and_recovery_keeps_every_ack() {
    let mut poisoned_runs = 0;
    let mut refused_allocations = 0;
    for countdown in 0..60u64 {
        let (poisoned, refused) = block_on(async move {
            let dir = PathBuf::from("/poison/topic-0");
            let storage = MemStorage::new();
            let log = open(&storage, &dir, config(FlushMode::Batch)).await;
            // Fail the countdown-th write, fdatasync, preallocation or truncation of a segment.
            storage.fail_after_on(countdown, ".log");
            let mut acked = Vec::new();
            let mut poisoned = false;
            let mut refused = 0;
            for seq in 0..80u64 {
                let batch = simple_batch(&[(None, Some(&value_for(seq, 300)))], Timestamp(1));
                match log.append(BytesMut::from(&batch[..]), LeaderEpoch(0)).await {
                    Ok(info) => {
                        assert!(!poisoned, "an append succeeded after the log was poisoned");
                        acked.push((info.base_offset.0, seq));
                    }
                    Err(LogError::Poisoned { .. }) => poisoned = true,
                    // A failed preallocation writes nothing: that append is refused, the log
                    // stays healthy.
                    Err(LogError::Io { context, .. }) if context.contains("preallocat") => {
                        refused += 1
                    }
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
            assert!(
                poisoned || refused > 0,
                "countdown {countdown}: the injected failure never surfaced"
            );
            assert_eq!(poisoned, log.poisoned().is_some());
            if poisoned {
                assert!(matches!(
                    log.read(Offset(0), 100, Offset(i64::MAX)).await,
                    Err(LogError::Poisoned { .. })
                ));
            }
            let restarted = storage.crash(CrashMode::DropUnsynced);
            drop(log);
            let log = open(&restarted, &dir, config(FlushMode::Batch)).await;
            let seqs = read_clean_prefix(&log).await;
            for (offset, seq) in acked {
                assert_eq!(
                    seqs.get(offset as usize),
                    Some(&seq),
                    "countdown {countdown}: ack at {offset} lost"
                );
            }
            (poisoned, refused)
        });
        poisoned_runs += poisoned as u32;
        refused_allocations += refused;
    }
    println!("60 injected failures: {poisoned_runs} poisoned the log, {refused_allocations} refused appends");
    assert!(poisoned_runs > 40);
}

/// Writes `n` single-record batches and returns the storage, the path of the (only) segment and
/// the byte range of the last batch in it.
async fn log_with_batches(n: u64) -> (MemStorage, PathBuf, std::ops::Range<usize>) {
    let dir = PathBuf::from("/torn/topic-0");
    let storage = MemStorage::new();
    let log = open(&storage, &dir, LogConfig::default()).await;
    let mut start = 0;
    let mut end = 0;
    for seq in 0..n {
        let batch = simple_batch(
            &[(Some(b"key"), Some(&value_for(seq, 40)))],
            Timestamp(seq as i64),
        );
        start = end;
        end += batch.len();
        log.append(BytesMut::from(&batch[..]), LeaderEpoch(4))
            .await
            .unwrap();
    }
    drop(log); // no clean shutdown: recovery scans the segment
    (storage, dir.join("00000000000000000000.log"), start..end)
}

#[test]
fn torn_last_batch_is_truncated_at_every_byte_position() {
    block_on(async {
        let (_, _, range) = log_with_batches(5).await;
        for cut in range.clone() {
            let (storage, segment, range) = log_with_batches(5).await;
            // The write reached the device only up to `cut`; the rest reads as zeros.
            let changed = storage
                .with_file_bytes(&segment, |b| {
                    let changed = b[cut..range.end].iter().any(|&x| x != 0);
                    b[cut..range.end].fill(0);
                    changed
                })
                .unwrap();
            let log = open(&storage, segment.parent().unwrap(), LogConfig::default()).await;
            if !changed {
                // The lost bytes were zeros anyway: the batch is whole and must be kept.
                assert_eq!(log.log_end_offset(), Offset(5));
                continue;
            }
            assert_eq!(
                log.log_end_offset(),
                Offset(4),
                "cut at {cut} of {range:?}: torn batch not truncated"
            );
            assert_eq!(read_clean_prefix(&log).await, vec![0, 1, 2, 3]);
            // The log keeps working after the truncation.
            let batch = simple_batch(&[(Some(b"key"), Some(&value_for(4, 40)))], Timestamp(9));
            assert_eq!(
                log.append(BytesMut::from(&batch[..]), LeaderEpoch(4))
                    .await
                    .unwrap()
                    .base_offset,
                Offset(4)
            );
        }
    });
}

#[test]
fn bit_flip_in_last_batch_is_detected_at_every_byte_position() {
    block_on(async {
        let (_, _, range) = log_with_batches(5).await;
        let mut undetectable = Vec::new();
        for at in range.clone() {
            for bit in [0u8, 3, 7] {
                let (storage, segment, _) = log_with_batches(5).await;
                storage
                    .with_file_bytes(&segment, |b| b[at] ^= 1 << bit)
                    .unwrap();
                let log = open(&storage, segment.parent().unwrap(), LogConfig::default()).await;
                let relative = at - range.start;
                if log.log_end_offset() == Offset(5) {
                    // Kafka's format leaves the partition leader epoch (bytes 12..16) outside
                    // the CRC; nothing else may slip through.
                    undetectable.push(relative);
                    continue;
                }
                assert_eq!(
                    log.log_end_offset(),
                    Offset(4),
                    "flip at byte {relative} bit {bit}"
                );
                assert_eq!(read_clean_prefix(&log).await, vec![0, 1, 2, 3]);
            }
        }
        undetectable.dedup();
        assert_eq!(
            undetectable,
            vec![12, 13, 14, 15],
            "only the leader epoch field is outside every check"
        );
    });
}

#[test]
fn bit_flip_in_closed_segment_is_reported_on_read_and_never_served() {
    block_on(async {
        let dir = PathBuf::from("/rot/topic-0");
        let storage = MemStorage::new();
        let log = open(&storage, &dir, config(FlushMode::Batch)).await;
        for seq in 0..100u64 {
            let batch = simple_batch(&[(None, Some(&value_for(seq, 200)))], Timestamp(1));
            log.append(BytesMut::from(&batch[..]), LeaderEpoch(0))
                .await
                .unwrap();
        }
        assert!(log.segment_count() >= 3);
        log.close().await.unwrap();
        drop(log);
        // Rot one byte in the middle of a record value of the first (closed) segment.
        let first = dir.join("00000000000000000000.log");
        let flipped_at = 61 + 20;
        storage
            .with_file_bytes(&first, |b| b[flipped_at] ^= 0x10)
            .unwrap();
        let log = open(&storage, &dir, config(FlushMode::Batch)).await;
        match log.read(Offset(0), 1 << 20, Offset(i64::MAX)).await {
            Err(LogError::Corrupt {
                segment, position, ..
            }) => {
                assert_eq!(segment, Offset(0));
                assert_eq!(position, 0);
            }
            other => panic!(
                "corrupt batch was not reported: {:?}",
                other.map(|b| b.len())
            ),
        }
        // Later batches of the same segment and other segments are still served.
        let later = log
            .read(Offset(1), 1 << 20, Offset(i64::MAX))
            .await
            .unwrap();
        assert_eq!(later[0].base_offset, Offset(1));
        let h = BatchHeader::parse(&later[0].bytes).unwrap();
        assert_eq!(h.last_offset(), Offset(1));
        let last_segment = *log.segment_base_offsets().last().unwrap();
        assert!(!log
            .read(last_segment, 100, Offset(i64::MAX))
            .await
            .unwrap()
            .is_empty());
    });
}
