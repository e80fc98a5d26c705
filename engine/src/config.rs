//! Per-log configuration, named and defaulted as Kafka's topic configs are.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::compression::Compression;

/// `flush.mode`: when an append counts as done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushMode {
    /// fdatasync before the append is acknowledged, group-committed (the default).
    Batch,
    /// Written to the device before acknowledgement; fdatasync every `flush.ms`
    /// (the caller drives it through [`crate::Log::flush_if_due`]).
    Interval,
    /// Written to the device before acknowledgement; fdatasync only on roll and shutdown.
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimestampType {
    CreateTime,
    LogAppendTime,
}

/// `compression.type`: the codec the log stores batches with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompressionType {
    /// Keep each batch's own codec (Kafka's `producer`, the default).
    Producer,
    /// Recompress every batch whose codec differs (`uncompressed`, `gzip`, `snappy`, `lz4`,
    /// `zstd`).
    Codec(Compression),
}

impl CompressionType {
    /// The codec a batch sent with `codec` is stored with.
    pub fn target(self, codec: Compression) -> Compression {
        match self {
            CompressionType::Producer => codec,
            CompressionType::Codec(target) => target,
        }
    }
}

#[derive(Clone, Debug)]
pub struct LogConfig {
    /// `segment.bytes`
    pub segment_bytes: u64,
    /// `segment.ms`
    pub segment_ms: i64,
    /// `retention.ms`; negative means unlimited.
    pub retention_ms: i64,
    /// `retention.bytes`; negative means unlimited.
    pub retention_bytes: i64,
    /// `max.message.bytes`: the largest record batch accepted.
    pub max_message_bytes: u32,
    /// `index.interval.bytes`: bytes between offset index entries.
    pub index_interval_bytes: u32,
    /// `flush.mode` (Sluice's own; Kafka has only `flush.ms` and `flush.messages`).
    pub flush_mode: FlushMode,
    /// `flush.ms`, used by `flush.mode = interval`.
    pub flush_ms: i64,
    /// `cleanup.policy` contains `delete`.
    pub cleanup_delete: bool,
    /// `cleanup.policy` contains `compact`.
    pub cleanup_compact: bool,
    /// `delete.retention.ms`: how long tombstones survive compaction.
    pub delete_retention_ms: i64,
    /// `message.timestamp.type`
    pub message_timestamp_type: TimestampType,
    /// `compression.type`
    pub compression_type: CompressionType,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1 << 30,
            segment_ms: 7 * 24 * 3600 * 1000,
            retention_ms: 7 * 24 * 3600 * 1000,
            retention_bytes: -1,
            max_message_bytes: 1_048_588,
            index_interval_bytes: 4096,
            flush_mode: FlushMode::Batch,
            flush_ms: 1000,
            cleanup_delete: true,
            cleanup_compact: false,
            delete_retention_ms: 24 * 3600 * 1000,
            message_timestamp_type: TimestampType::CreateTime,
            compression_type: CompressionType::Producer,
        }
    }
}

/// Where the log gets "now" from. Tests drive a manual clock.
#[derive(Clone, Debug, Default)]
pub enum Clock {
    #[default]
    System,
    Manual(Rc<Cell<i64>>),
}

impl Clock {
    pub fn manual(start_ms: i64) -> Clock {
        Clock::Manual(Rc::new(Cell::new(start_ms)))
    }

    pub fn now_ms(&self) -> i64 {
        match self {
            Clock::System => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0),
            Clock::Manual(t) => t.get(),
        }
    }

    /// Advances a manual clock; a no-op on the system clock.
    pub fn advance(&self, ms: i64) {
        if let Clock::Manual(t) = self {
            t.set(t.get() + ms);
        }
    }
}
