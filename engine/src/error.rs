//! The engine's one error type. The broker maps each variant to a Kafka error code in exactly
//! one place (`broker/src/errors.rs`).

use std::io;

use crate::types::Offset;

#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("batch is truncated: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    #[error("batch length field says {length} bytes but {have} bytes were given")]
    LengthMismatch { length: i64, have: usize },
    #[error("unsupported record batch magic {magic} (only magic 2 is stored)")]
    BadMagic { magic: i8 },
    #[error("record batch CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadCrc { stored: u32, computed: u32 },
    #[error("record count {record_count} disagrees with last offset delta {last_offset_delta}")]
    BadRecordCount {
        record_count: i32,
        last_offset_delta: i32,
    },
    #[error("record {index} of the batch is malformed: {reason}")]
    BadRecord { index: i32, reason: &'static str },
    #[error("batch of {size} bytes exceeds max.message.bytes {max}")]
    TooLarge { size: usize, max: u32 },
    /// Records without a key sent to a compacted topic. `batch_indexes` are their positions in
    /// the batch (Kafka's `batch_index`), so the producer can fail exactly those (KIP-467).
    #[error("a compacted topic requires every record to have a key; records {batch_indexes:?} have none")]
    MissingKey { batch_indexes: Vec<i32> },
    #[error("compression codec {codec} is not one Kafka defines")]
    UnknownCompression { codec: i16 },
    #[error("{codec} records do not decompress: {reason}")]
    BadCompression { codec: &'static str, reason: String },
    #[error("records decompress to more than {max} bytes")]
    DecompressedTooLarge { max: usize },
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("invalid record batch: {0}")]
    InvalidBatch(#[from] BatchError),
    #[error("offset {offset} is out of range [{log_start_offset}, {log_end_offset}]")]
    OffsetOutOfRange {
        offset: Offset,
        log_start_offset: Offset,
        log_end_offset: Offset,
    },
    #[error("idempotent producer: {0}")]
    Producer(#[from] crate::producer_state::ProducerError),
    #[error("the log is closed (shutting down)")]
    Closed,
    /// A replica was handed a batch that does not continue its log (Kafka's
    /// `UnexpectedAppendOffsetException`): the follower must truncate or refetch.
    #[error("batch at offset {base_offset} does not continue the log ending at {log_end_offset}")]
    UnexpectedAppendOffset {
        base_offset: Offset,
        log_end_offset: Offset,
    },
    #[error("offset {offset} was truncated away before it became durable")]
    Truncated { offset: Offset },
    #[error("disk full: {0}")]
    DiskFull(io::Error),
    #[error("log is poisoned by an earlier storage failure: {reason}")]
    Poisoned { reason: String },
    #[error("corrupt data in segment {segment} at position {position}: {reason}")]
    Corrupt {
        segment: Offset,
        position: u64,
        reason: String,
    },
    #[error("storage error while {context}: {source}")]
    Io {
        context: &'static str,
        #[source]
        source: io::Error,
    },
}

impl LogError {
    pub(crate) fn io(context: &'static str, source: io::Error) -> LogError {
        LogError::Io { context, source }
    }
}

pub type Result<T, E = LogError> = std::result::Result<T, E>;

/// True for the errors a full filesystem produces.
/// glommio's errors arrive as `io::Error`s that keep only the kind, so both are checked.
pub(crate) fn is_disk_full(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ENOSPC) | Some(libc::EDQUOT)
    ) || matches!(
        error.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    )
}
