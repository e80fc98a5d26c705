//! Edge cases of the log on real files (DmaStorage, glommio), each found while writing the
//! kill -9 and full-disk tests: concurrent appends across a segment roll, and a log directory
//! given as a relative path.

use std::future::Future;
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use glommio::LocalExecutorBuilder;
use sluice_engine::batch::{simple_batch, Records};
use sluice_engine::{
    BatchCache, Clock, DmaStorage, LeaderEpoch, Log, LogConfig, Offset, Timestamp,
};

const SEGMENT_BYTES: u64 = 64 << 10;

fn batch(tag: u8, value_bytes: usize) -> BytesMut {
    let value = vec![tag; value_bytes];
    BytesMut::from(&simple_batch(&[(Some(&[tag][..]), Some(&value[..]))], Timestamp(1000))[..])
}

fn run<F: Future<Output = ()> + 'static>(f: impl FnOnce() -> F + Send + 'static) {
    LocalExecutorBuilder::default()
        .spawn(f)
        .expect("executor")
        .join()
        .expect("the executor thread panicked: see the message above");
}

async fn open(dir: &Path) -> Log<DmaStorage> {
    let config = LogConfig {
        segment_bytes: SEGMENT_BYTES,
        ..LogConfig::default()
    };
    Log::open(
        DmaStorage::new(),
        dir,
        config,
        BatchCache::new(16 << 20),
        Clock::System,
    )
    .await
    .unwrap_or_else(|e| panic!("opening the log in {}: {e}", dir.display()))
}

/// Reads the whole log and returns the first key byte of every record, checking on the way
/// that batches follow each other with no gap.
async fn read_tags(log: &Log<DmaStorage>) -> Vec<u8> {
    let mut tags = Vec::new();
    let mut next = log.log_start_offset();
    while next < log.log_end_offset() {
        let batches = log.read(next, 1 << 20, Offset(i64::MAX)).await.unwrap();
        assert!(!batches.is_empty(), "nothing read at {next}");
        for b in batches {
            assert_eq!(b.base_offset, next, "offsets must be contiguous");
            for record in Records::new(&b.bytes) {
                tags.push(record.unwrap().key.unwrap()[0]);
            }
            next = b.last_offset.next();
        }
    }
    tags
}

/// glommio closes dropped files on its next I/O cycle; give it one.
async fn settle() {
    glommio::timer::sleep(Duration::from_millis(20)).await;
}

/// A roll awaits device work (creating and preallocating the new segment, flushing and sealing
/// the old one). An append that still fits the old segment does not need the io lock, but it
/// must wait for the roll instead of being buffered into the old segment while the roll is in
/// flight. The kill -9 test found this (its writer crashed on the `active().next_offset ==
/// log_end_offset` invariant right after a roll); fixed in the engine since.
#[test]
fn an_append_that_fits_while_another_rolls_lands_in_order() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("topic-0");
    run(move || async move {
        let log = Rc::new(open(&path).await);
        // Fill the first segment until a 1000-byte batch no longer fits but a small one does.
        let small = batch(b's', 10);
        let filler = batch(b'f', 1000);
        let mut expected = Vec::new();
        while log.size_bytes() + (filler.len() + small.len()) as u64 <= SEGMENT_BYTES {
            log.append(filler.clone(), LeaderEpoch(0)).await.unwrap();
            expected.push(b'f');
        }
        let big = batch(b'b', filler.len() + small.len() + 100);
        assert!(log.size_bytes() + big.len() as u64 > SEGMENT_BYTES);
        assert!(log.size_bytes() + small.len() as u64 <= SEGMENT_BYTES);

        // The big append starts first and rolls; the small one runs while the roll awaits.
        let rolling = glommio::spawn_local({
            let log = log.clone();
            async move { log.append(big, LeaderEpoch(0)).await.unwrap() }
        });
        let fitting = glommio::spawn_local({
            let log = log.clone();
            async move { log.append(small, LeaderEpoch(0)).await.unwrap() }
        });
        let big_info = rolling.await;
        let small_info = fitting.await;
        let mut tail = [(big_info.base_offset, b'b'), (small_info.base_offset, b's')];
        tail.sort();
        expected.extend(tail.iter().map(|&(_, tag)| tag));

        assert_eq!(log.log_end_offset(), Offset(expected.len() as i64));
        assert_eq!(read_tags(&log).await, expected);
        log.close().await.unwrap();
        drop(log);
        settle().await;
    });
}

/// `path` (which need not exist yet) relative to the current directory.
fn relative_to_cwd(path: &Path) -> PathBuf {
    let cwd = std::env::current_dir().unwrap().canonicalize().unwrap();
    let parent = path.parent().unwrap().canonicalize().unwrap();
    let path = parent.join(path.file_name().unwrap());
    let common = cwd
        .components()
        .zip(path.components())
        .take_while(|(a, b)| a == b)
        .count();
    let mut relative = PathBuf::new();
    for _ in cwd.components().skip(common) {
        relative.push(Component::ParentDir);
    }
    for component in path.components().skip(common) {
        relative.push(component);
    }
    relative
}

/// The broker's default data directory is `./data`, so logs are opened by relative paths.
#[test]
fn a_log_opens_in_a_relative_directory() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = relative_to_cwd(&dir.path().join("topic-0"));
    assert!(path.is_relative(), "{}", path.display());
    run(move || async move {
        let log = open(&path).await;
        log.append(batch(b'a', 100), LeaderEpoch(0)).await.unwrap();
        log.close().await.unwrap();
        drop(log);
        let log = open(&path).await;
        assert_eq!(read_tags(&log).await, vec![b'a']);
        log.close().await.unwrap();
        drop(log);
        settle().await;
    });
}
