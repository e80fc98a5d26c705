//! Opening a log: find the segments, trust what was sealed, scan what was not.
//!
//! - Leftovers of interrupted work (`*.tmp`, `*.log.cleaned`) are deleted.
//! - A closed segment with valid index files (checked by their CRC trailers and the recorded
//!   segment size) is trusted: it was fdatasync'd before its indexes were written.
//!   Without them it is scanned and its indexes rebuilt.
//! - The last segment is trusted only after a clean shutdown (the marker file). Otherwise it is
//!   scanned batch by batch, every CRC checked, and truncated at the first torn or corrupt
//!   batch: everything after it was never acknowledged under `flush.mode = batch`.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;

use super::{Log, LogStats, State, CLEAN_SHUTDOWN_FILE};
use crate::batch_cache::BatchCache;
use crate::config::{Clock, LogConfig};
use crate::error::{LogError, Result};
use crate::segment::offset_index::OffsetIndex;
use crate::segment::reader::{scan_segment, ScanEnd};
use crate::segment::time_index::TimeIndex;
use crate::segment::{self, Segment};
use crate::storage::{read_file, Storage, StorageFile};
use crate::types::{LeaderEpoch, Offset, Timestamp};

impl<S: Storage> Log<S> {
    /// Opens (or creates) the log in `dir`, recovering it if it was not closed cleanly.
    pub async fn open(
        storage: S,
        dir: impl Into<PathBuf>,
        config: LogConfig,
        cache: Rc<BatchCache>,
        clock: Clock,
    ) -> Result<Log<S>> {
        let dir = dir.into();
        let io = |context| move |e| LogError::io(context, e);
        storage
            .create_dir_all(&dir)
            .await
            .map_err(io("creating the log directory"))?;
        let names = storage
            .list_dir(&dir)
            .await
            .map_err(io("listing the log directory"))?;
        for name in &names {
            if name.ends_with(".tmp") || name.ends_with(".cleaned") {
                tracing::info!(dir = %dir.display(), file = %name, "removing leftover of interrupted work");
                storage
                    .remove(&dir.join(name))
                    .await
                    .map_err(io("removing a leftover file"))?;
            }
        }
        let clean = names.iter().any(|n| n == CLEAN_SHUTDOWN_FILE);
        let mut bases: Vec<Offset> = names
            .iter()
            .filter_map(|n| segment::parse_log_name(n))
            .collect();
        bases.sort();
        let checkpoint_start = Self::read_log_start_checkpoint(&storage, &dir).await;
        if bases.is_empty() {
            let base = checkpoint_start.unwrap_or(Offset(0));
            storage
                .open(&segment::log_path(&dir, base), true)
                .await
                .map_err(io("creating the first segment"))?;
            storage
                .sync_dir(&dir)
                .await
                .map_err(io("syncing the log directory"))?;
            bases.push(base);
        }

        let interval = config.index_interval_bytes;
        let mut segments = BTreeMap::new();
        let mut scanned_epochs: Vec<(LeaderEpoch, Offset)> = Vec::new();
        let last_index = bases.len() - 1;
        for (i, &base) in bases.iter().enumerate() {
            let path = segment::log_path(&dir, base);
            let file = Rc::new(
                storage
                    .open(&path, false)
                    .await
                    .map_err(io("opening a segment"))?,
            );
            let file_size = file.size().await.map_err(io("sizing a segment"))?;
            let is_last = i == last_index;
            let mut loaded = None;
            if !is_last || clean {
                loaded = Self::load_sealed(&storage, &dir, base, file.clone(), file_size).await;
            }
            let seg = match loaded {
                Some(seg) => seg,
                None => {
                    let result = scan_segment(file.clone(), base, file_size, interval, is_last)
                        .await
                        .map_err(io("scanning a segment"))?;
                    if let ScanEnd::Invalid { position, reason } = &result.end {
                        tracing::warn!(
                            segment = %path.display(), position, %reason,
                            dropped_bytes = file_size - position,
                            "recovery truncates the segment at a torn or corrupt batch"
                        );
                    }
                    let seg = result.segment;
                    if seg.size < file_size {
                        file.truncate(seg.size)
                            .await
                            .map_err(io("truncating a recovered segment"))?;
                        file.fdatasync()
                            .await
                            .map_err(io("syncing a recovered segment"))?;
                    }
                    scanned_epochs.extend(result.epochs);
                    seg
                }
            };
            let mut seg = seg;
            // Retention's fallback age for segments without record timestamps, as Kafka's
            // `lastModified`; a storage without times counts the segment as written now.
            seg.last_modified_ms = Some(
                storage
                    .modified_ms(&path)
                    .await
                    .map_err(io("reading a segment's modification time"))?
                    .unwrap_or_else(|| clock.now_ms()),
            );
            if let Some((_, prev)) = segments.last_key_value() {
                let prev: &Segment<S::File> = prev;
                if seg.base_offset < prev.next_offset {
                    return Err(LogError::Corrupt {
                        segment: base,
                        position: 0,
                        reason: format!(
                            "segment starts at {} inside the previous one, which ends at {}",
                            base, prev.next_offset
                        ),
                    });
                }
            }
            segments.insert(base, seg);
        }

        let last = segments.values().next_back().expect("at least one segment");
        let log_end_offset = last.next_offset;
        let first_base = *segments.keys().next().expect("at least one segment");
        let log_start_offset = checkpoint_start
            .unwrap_or(first_base)
            .max(first_base)
            .min(log_end_offset);

        let mut epochs = Self::read_epochs_checkpoint(&storage, &dir).await;
        for (epoch, offset) in scanned_epochs {
            if epochs.last().is_none_or(|&(e, _)| epoch > e) {
                epochs.push((epoch, offset));
            }
        }
        epochs.retain(|&(_, o)| o < log_end_offset);

        let cache_id = cache.register_log();
        let now = clock.now_ms();
        let log = Log {
            dir,
            storage,
            config: RefCell::new(config),
            clock,
            cache,
            cache_id,
            io: async_lock::Mutex::new(()),
            sync: async_lock::Mutex::new(()),
            state: RefCell::new(State {
                segments,
                log_start_offset,
                log_end_offset,
                written_end: log_end_offset,
                synced_end: log_end_offset,
                poisoned: None,
                closed: false,
                epochs,
                epochs_dirty: true,
                last_flush_ms: now,
                appends_blocked: false,
                producers: Default::default(),
                next_ticket: 0,
                serving_ticket: 0,
                abandoned_tickets: Default::default(),
            }),
            stats: RefCell::new(LogStats::default()),
            turn_event: event_listener::Event::new(),
        };
        {
            let _io = log.io.lock().await;
            let last_base = log.state.borrow().active().base_offset;
            log.activate_locked(last_base).await?;
            if clean {
                let marker = log.dir.join(CLEAN_SHUTDOWN_FILE);
                log.storage
                    .remove(&marker)
                    .await
                    .map_err(io("removing the clean-shutdown marker"))?;
            }
            log.storage
                .sync_dir(&log.dir)
                .await
                .map_err(io("syncing the log directory"))?;
            log.write_epochs_checkpoint().await;
        }
        log.rebuild_producer_state().await?;
        log.state.borrow().check_invariants();
        tracing::info!(
            dir = %log.dir.display(), clean, segments = log.segment_count(),
            log_start_offset = log_start_offset.0, log_end_offset = log_end_offset.0,
            "log opened"
        );
        Ok(log)
    }

    /// Loads a sealed segment from its index files, or `None` if they are missing or do not
    /// describe the file as it is.
    async fn load_sealed(
        storage: &S,
        dir: &std::path::Path,
        base: Offset,
        file: Rc<S::File>,
        file_size: u64,
    ) -> Option<Segment<S::File>> {
        let index_bytes = read_file(storage, &segment::index_path(dir, base))
            .await
            .ok()?;
        let time_bytes = read_file(storage, &segment::time_index_path(dir, base))
            .await
            .ok()?;
        let (offset_index, size, next_offset) = OffsetIndex::decode(&index_bytes)?;
        let (time_index, max_timestamp, offset_of_max_timestamp) = TimeIndex::decode(&time_bytes)?;
        if size != file_size || next_offset < base.0 {
            return None;
        }
        let mut seg = Segment::new(base, file);
        seg.restore_from_indexes(
            offset_index,
            time_index,
            size,
            Offset(next_offset),
            Timestamp(max_timestamp),
            Offset(offset_of_max_timestamp),
        );
        Some(seg)
    }
}
