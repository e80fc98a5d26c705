//! A full disk, for real: a log on a small loop-mounted ext4 filesystem, appended to until the
//! filesystem has no room left.
//!
//! The engine's promise (DESIGN.md, "Storage engine"): a full disk rejects appends with a clear
//! error, poisons nothing, and keeps serving reads; once space is freed, appends succeed again.
//! Each scenario checks, in order:
//!
//! 1. appends succeed until one fails with a disk-full error, not a panic, not another error,
//!    and the log is not poisoned;
//! 2. every acknowledged batch reads back with its exact content;
//! 3. the same append, retried, fails the same clean way while the disk stays full;
//! 4. a crash while full (drop without close) and a reopen still full: the log opens, serves
//!    every acknowledged batch, and still refuses the append cleanly;
//! 5. after a filler file written before the log was opened is deleted, appends succeed again;
//! 6. a clean close and a reopen keep everything acknowledged.
//!
//! Two sizes of segment reach the wall two ways: 4 MiB segments are preallocated whole when they
//! are created, so the failure comes from a roll; 64 MiB segments grow in 16 MiB preallocation
//! steps, so it comes from growing the active segment (and its fallback to just the room the
//! batch needs).
//!
//! Needs root and loop devices (it mounts a filesystem); elsewhere it prints SKIP and passes.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use glommio::LocalExecutorBuilder;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_engine::batch::simple_batch;
use sluice_engine::{
    BatchCache, Clock, DmaStorage, LeaderEpoch, Log, LogConfig, LogError, Offset, Timestamp,
};
use sluice_tests::content::check_same_batch;
use sluice_tests::loop_mount::{free_bytes, LoopMount, MountError};

const IMAGE_BYTES: u64 = 48 << 20;
/// Written before the log opens and deleted to free space once the log has hit the wall.
const FILLER_BYTES: u64 = 16 << 20;
/// Record values are 1 KiB..256 KiB: a few hundred appends fill the filesystem.
const VALUE_BYTES_MIN: usize = 1 << 10;
const VALUE_BYTES_MAX: usize = 256 << 10;
/// More appends than can fit on the filesystem even at the smallest size: if none fails by
/// then, the disk never filled and the test is broken.
const APPENDS_MAX: u64 = IMAGE_BYTES / VALUE_BYTES_MIN as u64;
/// Small: reads after the wall should come from the segment files, not from memory.
const CACHE_BYTES: u64 = 1 << 20;
/// Appended once space is freed (after the refused batch). Small enough that the reopen at the
/// end can still preallocate the active segment.
const AFTER_FREE_BYTES: u64 = 2 << 20;
/// How many times the failed append is retried while the disk is full.
const RETRIES: u32 = 3;

/// How strictly a disk-full failure is recognised.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Expect {
    /// Only `LogError::DiskFull`, as the engine promises.
    DiskFull,
    /// Also `LogError::Io` carrying ENOSPC's error kind: what the engine returns today on
    /// `DmaStorage` (see `full_disk_is_reported_as_disk_full`). Everything else is still
    /// checked, so the behaviour around a full disk keeps its coverage meanwhile.
    DiskFullOrIoStorageFull,
}

fn is_disk_full(error: &LogError, expect: Expect) -> bool {
    match error {
        LogError::DiskFull(_) => true,
        LogError::Io { source, .. } if source.kind() == ErrorKind::StorageFull => {
            expect == Expect::DiskFullOrIoStorageFull
        }
        _ => false,
    }
}

/// Mounts a scratch filesystem, or says why the test is skipped here.
fn mount_or_skip(test: &str) -> Option<LoopMount> {
    match LoopMount::create(IMAGE_BYTES) {
        Ok(mount) => Some(mount),
        Err(MountError::Unavailable(why)) => {
            println!("SKIP {test}: cannot mount a scratch ext4 filesystem: {why}");
            None
        }
        Err(e) => panic!("{test}: scratch ext4 filesystem {e}"),
    }
}

fn run_in_executor<T: Send + 'static, F: std::future::Future<Output = T> + 'static>(
    f: impl FnOnce() -> F + Send + 'static,
) -> T {
    LocalExecutorBuilder::default()
        .name("disk-full")
        .spawn(f)
        .expect("executor")
        .join()
        .expect("the executor thread panicked: see the message above")
}

/// One appended batch and what the log said about it.
struct Acked {
    base_offset: Offset,
    last_offset: Offset,
    batch: Bytes,
}

fn make_batch(rng: &mut StdRng, seq: u64) -> Bytes {
    let len = rng.gen_range(VALUE_BYTES_MIN..=VALUE_BYTES_MAX);
    let value: Vec<u8> = (0..len)
        .map(|i| (seq as usize * 131 + i * 7 + i / 4096) as u8)
        .collect();
    simple_batch(
        &[(Some(&seq.to_be_bytes()[..]), Some(&value[..]))],
        Timestamp(1_700_000_000_000 + seq as i64),
    )
}

struct Scenario {
    name: &'static str,
    segment_bytes: u64,
    expect: Expect,
}

async fn open(dir: &Path, segment_bytes: u64) -> Result<Log<DmaStorage>, LogError> {
    let config = LogConfig {
        segment_bytes,
        ..LogConfig::default()
    };
    Log::open(
        DmaStorage::new(),
        dir,
        config,
        BatchCache::new(CACHE_BYTES),
        Clock::System,
    )
    .await
}

/// Reads the whole log and checks it holds exactly the acknowledged batches.
async fn check_all_readable(log: &Log<DmaStorage>, acked: &[Acked], when: &str) {
    let end = acked.last().map_or(Offset(0), |a| a.last_offset.next());
    assert_eq!(log.log_end_offset(), end, "{when}: log end offset");
    let mut next = 0;
    let mut offset = Offset(0);
    while offset < end {
        let batches = log
            .read(offset, 1 << 20, Offset(i64::MAX))
            .await
            .unwrap_or_else(|e| panic!("{when}: read at {offset} failed: {e}"));
        assert!(!batches.is_empty(), "{when}: nothing read at {offset}");
        for batch in batches {
            let want = &acked[next];
            assert_eq!(batch.base_offset, want.base_offset, "{when}: batch {next}");
            assert_eq!(batch.last_offset, want.last_offset, "{when}: batch {next}");
            check_same_batch(&batch.bytes, &want.batch, want.base_offset, LeaderEpoch(0))
                .unwrap_or_else(|e| panic!("{when}: {e}"));
            next += 1;
            offset = batch.last_offset.next();
        }
    }
    assert_eq!(next, acked.len(), "{when}: batches read");
}

async fn append(
    log: &Log<DmaStorage>,
    batch: &Bytes,
    acked: &mut Vec<Acked>,
) -> Result<(), LogError> {
    let info = log
        .append(BytesMut::from(&batch[..]), LeaderEpoch(0))
        .await?;
    let expected_base = acked.last().map_or(Offset(0), |a| a.last_offset.next());
    assert_eq!(info.base_offset, expected_base, "offsets are contiguous");
    acked.push(Acked {
        base_offset: info.base_offset,
        last_offset: info.last_offset,
        batch: batch.clone(),
    });
    Ok(())
}

/// Retries `batch` while the disk is full: each attempt must fail cleanly, as disk full.
async fn expect_refused(log: &Log<DmaStorage>, batch: &Bytes, scenario: &Scenario, when: &str) {
    for attempt in 0..RETRIES {
        let result = log.append(BytesMut::from(&batch[..]), LeaderEpoch(0)).await;
        match result {
            Err(e) if is_disk_full(&e, scenario.expect) => {}
            Err(e) => panic!("{when}: retry {attempt} failed, but not as disk full: {e:?}"),
            Ok(info) => panic!("{when}: retry {attempt} succeeded at {info:?} on a full disk"),
        }
        assert_eq!(
            log.poisoned(),
            None,
            "{when}: a full disk must not poison the log"
        );
    }
}

fn syncfs(path: &Path) {
    let dir = std::fs::File::open(path).expect("open the mount point");
    // SAFETY: `dir` is an open descriptor for the duration of the call.
    let rc = unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) };
    assert_eq!(rc, 0, "syncfs: {}", std::io::Error::last_os_error());
}

async fn full_disk_scenario(mount_point: PathBuf, scenario: Scenario, seed: u64) {
    let name = scenario.name;
    let filler = mount_point.join("filler");
    std::fs::write(&filler, vec![0xf1u8; FILLER_BYTES as usize]).expect("filler file");
    syncfs(&mount_point);
    let dir = mount_point.join("topic-0");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut acked = Vec::new();

    // 1. Append until the disk is full.
    let log = open(&dir, scenario.segment_bytes)
        .await
        .expect("open the log");
    let mut seq = 0u64;
    let refused = loop {
        assert!(
            seq < APPENDS_MAX,
            "{name}: {seq} appends and the disk never filled"
        );
        let batch = make_batch(&mut rng, seq);
        seq += 1;
        match append(&log, &batch, &mut acked).await {
            Ok(()) => {}
            Err(e) if is_disk_full(&e, scenario.expect) => {
                if !matches!(e, LogError::DiskFull(_)) {
                    println!("{name}: NOTE: disk full reported as {e:?}, not LogError::DiskFull");
                }
                break batch;
            }
            Err(e) => panic!("{name}: append {seq} failed, but not as disk full: {e:?}"),
        }
    };
    assert_eq!(
        log.poisoned(),
        None,
        "{name}: a full disk must not poison the log"
    );
    let acked_before_full = acked.len();
    let acked_bytes: usize = acked.iter().map(|a| a.batch.len()).sum();
    println!(
        "{name}: disk full after {acked_before_full} appends ({acked_bytes} bytes, {} segments); \
         {} bytes left free",
        log.segment_count(),
        free_bytes(&mount_point)
    );

    // 2. and 3. Reads still served; the refused append is refused again.
    check_all_readable(&log, &acked, "after the disk filled").await;
    expect_refused(&log, &refused, &scenario, "while full").await;
    check_all_readable(&log, &acked, "after retries on a full disk").await;

    // 4. A crash while full, and recovery on a disk that is still full.
    drop(log);
    settle().await;
    let free_space = || {
        std::fs::remove_file(&filler).expect("delete the filler");
        syncfs(&mount_point);
    };
    let log = match open(&dir, scenario.segment_bytes).await {
        Ok(log) => {
            check_all_readable(&log, &acked, "reopened on a full disk").await;
            expect_refused(&log, &refused, &scenario, "reopened on a full disk").await;
            free_space();
            log
        }
        Err(e)
            if scenario.expect == Expect::DiskFullOrIoStorageFull
                && is_disk_full(&e, scenario.expect) =>
        {
            // The same engine bug, seen from Log::open: the active segment's preallocation
            // fails with an error it does not recognise as a full disk.
            println!("{name}: NOTE: reopening on a full disk failed: {e:?}");
            free_space();
            open(&dir, scenario.segment_bytes)
                .await
                .unwrap_or_else(|e| panic!("{name}: reopening after freeing space failed: {e:?}"))
        }
        Err(e) => panic!("{name}: reopening on a full disk failed: {e:?}"),
    };
    // 5. Space is free again: appends succeed, the refused batch first.
    append(&log, &refused, &mut acked)
        .await
        .unwrap_or_else(|e| panic!("{name}: append after freeing space failed: {e:?}"));
    let mut appended_bytes = refused.len() as u64;
    while appended_bytes < AFTER_FREE_BYTES {
        let batch = make_batch(&mut rng, seq);
        seq += 1;
        appended_bytes += batch.len() as u64;
        append(&log, &batch, &mut acked)
            .await
            .unwrap_or_else(|e| panic!("{name}: append after freeing space failed: {e:?}"));
    }
    assert_eq!(log.poisoned(), None);
    check_all_readable(&log, &acked, "after freeing space").await;
    println!(
        "{name}: {} more appends after freeing space; {} segments",
        acked.len() - acked_before_full,
        log.segment_count()
    );

    // 6. Clean close, reopen, everything still there.
    log.close()
        .await
        .unwrap_or_else(|e| panic!("{name}: close failed: {e:?}"));
    drop(log);
    let log = open(&dir, scenario.segment_bytes)
        .await
        .expect("reopen after close");
    check_all_readable(&log, &acked, "reopened after a clean close").await;
    log.close().await.expect("final close");
    drop(log);
    settle().await;
}

/// Lets the executor run an I/O cycle, so that files the log dropped are really closed (glommio
/// closes a dropped file asynchronously); otherwise the filesystem stays busy and cannot be
/// unmounted.
async fn settle() {
    glommio::timer::sleep(Duration::from_millis(20)).await;
}

fn run(scenario: Scenario) {
    let Some(mount) = mount_or_skip(scenario.name) else {
        return;
    };
    let seed: u64 = rand::random();
    println!(
        "{}: {} byte ext4 at {}, {} bytes free, seed {seed}",
        scenario.name,
        IMAGE_BYTES,
        mount.path().display(),
        mount.free_bytes()
    );
    let mount_point = mount.path().to_path_buf();
    run_in_executor(move || full_disk_scenario(mount_point, scenario, seed));
    // `mount` drops here, or while a failure unwinds: the filesystem is unmounted either way.
}

#[test]
fn full_disk_on_roll_refuses_appends_cleanly_and_recovers() {
    run(Scenario {
        name: "full_disk_on_roll",
        segment_bytes: 4 << 20,
        expect: Expect::DiskFull,
    });
}

#[test]
fn full_disk_while_growing_a_segment_refuses_appends_cleanly_and_recovers() {
    run(Scenario {
        name: "full_disk_while_growing",
        segment_bytes: 64 << 20,
        expect: Expect::DiskFull,
    });
}
