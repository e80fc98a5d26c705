//! The log on real O_DIRECT files through glommio: append, read back, reopen cleanly and after
//! a simulated crash (no clean-shutdown marker).

use bytes::BytesMut;
use glommio::LocalExecutorBuilder;
use sluice_engine::batch::simple_batch;
use sluice_engine::{
    BatchCache, Clock, DmaStorage, LeaderEpoch, Log, LogConfig, Offset, Timestamp,
};

fn run<F: std::future::Future<Output = ()> + 'static>(f: impl FnOnce() -> F + Send + 'static) {
    LocalExecutorBuilder::default()
        .spawn(f)
        .expect("executor")
        .join()
        .expect("executor thread");
}

#[test]
fn appends_survive_clean_and_unclean_reopen_on_real_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("topic-0");
    run(move || async move {
        let cache = BatchCache::new(64 << 20);
        let config = LogConfig {
            segment_bytes: 256 << 10,
            ..LogConfig::default()
        };
        let log = Log::open(
            DmaStorage::new(),
            &path,
            config.clone(),
            cache.clone(),
            Clock::System,
        )
        .await
        .unwrap();
        let mut expected = Vec::new();
        for i in 0..200u32 {
            let value = vec![(i % 251) as u8; 1000 + (i as usize % 7) * 100];
            let batch = simple_batch(
                &[(Some(&i.to_be_bytes()), Some(&value))],
                Timestamp(1000 + i as i64),
            );
            let info = log
                .append(BytesMut::from(&batch[..]), LeaderEpoch(0))
                .await
                .unwrap();
            assert_eq!(info.base_offset, Offset(i as i64));
            expected.push(value);
        }
        assert!(log.segment_count() > 1, "small segments must roll");
        log.close().await.unwrap();

        for clean in [true, false] {
            if !clean {
                std::fs::remove_file(path.join(".sluice-clean-shutdown")).ok();
            }
            let cache = BatchCache::new(64 << 20);
            let log = Log::open(
                DmaStorage::new(),
                &path,
                config.clone(),
                cache,
                Clock::System,
            )
            .await
            .unwrap();
            assert_eq!(log.log_end_offset(), Offset(200));
            let mut got = Vec::new();
            let mut cur = Offset(0);
            while cur < log.log_end_offset() {
                let batches = log.read(cur, 64 << 10, Offset(i64::MAX)).await.unwrap();
                assert!(!batches.is_empty());
                for b in batches {
                    assert_eq!(b.base_offset, cur);
                    for r in sluice_engine::batch::Records::new(&b.bytes) {
                        got.push(r.unwrap().value.unwrap().to_vec());
                    }
                    cur = b.last_offset.next();
                }
            }
            assert_eq!(got, expected);
            if clean {
                // Leave it unclean for the next round: no close.
                drop(log);
            }
        }
    });
}
