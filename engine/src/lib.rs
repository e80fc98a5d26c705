//! sluice-engine: the partition log.
//!
//! A [`Log`] is one partition replica's directory of segments. It validates and stores Kafka
//! RecordBatch v2 bytes exactly as they travel on the wire, assigns offsets, makes appends
//! durable per `flush.mode`, serves reads from a per-shard [`BatchCache`] or the segment files,
//! answers ListOffsets, applies retention and compaction, truncates for replication and
//! recovers after a crash. It never opens a socket and knows nothing of the Kafka protocol
//! beyond the record batch format.
//!
//! Everything here is single-threaded: a log and its cache belong to one shard.

pub mod batch;
pub mod batch_cache;
pub mod compression;
pub mod config;
pub mod error;
pub mod log;
pub mod producer_state;
pub mod segment;
pub mod storage;
pub mod types;
pub mod waits;

pub use batch_cache::BatchCache;
pub use compression::Compression;
pub use config::{Clock, CompressionType, FlushMode, LogConfig, TimestampType};
pub use error::{BatchError, LogError};
pub use log::{AppendInfo, CompactionOutcome, Log, RetentionOutcome};
pub use segment::reader::{FileExtent, ReadBatch};
pub use storage::{CrashMode, DmaStorage, MemStorage, Storage};
pub use types::{LeaderEpoch, Offset, Timestamp};
