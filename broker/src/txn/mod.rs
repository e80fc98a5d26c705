//! The transaction coordinator (KIP-98, with KIP-360's producer recovery and KIP-890's
//! transaction version 2), as a sans-IO core: no sockets, no logs, no clocks. It owns the
//! transactional ids of one `__transaction_state` partition and lives on the shard that leads
//! that partition, as the group coordinator lives with its `__consumer_offsets` partition. The
//! request handlers drive it; a broker that becomes the partition's leader builds it with
//! [`TxnCoordinator::load`] and one that stops leading drops it.
//!
//! # Two-step transitions
//!
//! A transactional id is in one of Kafka's states: Empty, Ongoing, PrepareCommit, PrepareAbort,
//! CompleteCommit, CompleteAbort (Dead and PrepareEpochFence exist only as the target of a
//! transition in flight). No request changes a state directly. Like Kafka's coordinator, a
//! request is validated and, when it must change something, *prepares* the transition: the
//! target state becomes the id's pending state and a [`TxnAppend`] (the record that makes the
//! target durable) is returned in [`Step::Append`]. The caller appends that record to the
//! partition with acks=all and then calls [`TxnCoordinator::complete_append`] with the outcome;
//! only then is the transition applied and the client's response produced
//! ([`Completion::response`]). A failed append drops the transition and answers the error. While a
//! transition is pending every conflicting request on that id answers CONCURRENT_TRANSACTIONS,
//! so at most one record per id is ever in flight.
//!
//! # What the caller does
//!
//! 1. Call a request method with the request's fields, `now_ms` and, where a new producer id may
//!    be needed, a [`ProducerIds`] allocator. On [`Step::Respond`], reply.
//! 2. On [`Step::Append`], append the record (key, value; a `None` value is a tombstone), then
//!    call `complete_append` and reply with `response`, if any.
//! 3. When a completion carries [`TxnMarkers`] (an EndTxn, or the coordinator's own abort, is now
//!    durable), send WriteTxnMarkers for those partitions (producer id, epoch, commit flag and
//!    coordinator epoch given), retrying until each is written, then call
//!    [`TxnCoordinator::complete_markers`] and append the Complete* record it returns, as in
//!    step 2. A Complete* record that fails to append comes back in [`Completion::retry`].
//! 4. Periodically (Kafka: every `transaction.abort.timed.out.transaction.cleanup.interval.ms`,
//!    ten seconds) call [`TxnCoordinator::abort_timed_out`], and (every
//!    `transactional.id.expiration` cleanup interval, one hour) call
//!    [`TxnCoordinator::expire_transactional_ids`]; append what they return as in step 2.
//! 5. After [`TxnCoordinator::load`], write the markers it returns (transactions the previous
//!    coordinator left in PrepareCommit/PrepareAbort) as in step 3.
//!
//! The records are Kafka's own (`records.rs`), so Kafka's tools read a Sluice
//! `__transaction_state` and a Sluice coordinator loads what Kafka wrote.

// `shard.rs` wires the coordinator into the broker, `verify.rs` the partition leaders' side of
// KIP-890. Parts of the core and of the re-exports below are used by the tests only.
#![allow(dead_code, unused_imports)]

mod coordinator;
mod metadata;
mod records;
#[cfg(test)]
mod tests;

pub use coordinator::{
    error_for_client, expected_producer, AppendKind, Completion, LoadError, ProducerIds, Step,
    TimedOutTxn, TxnAppend, TxnConfig, TxnCoordinator, TxnDescription, TxnList, TxnListing,
    TxnMarkers, TxnResponse, TxnResult, TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT,
    TRANSACTION_MAX_TIMEOUT_MS_DEFAULT,
};
pub use metadata::{
    is_epoch_exhausted, TopicPartition, TransactionVersion, TxnData, TxnMetadata, TxnState,
    NO_PRODUCER_EPOCH, NO_PRODUCER_ID,
};
pub use records::{
    decode_key, decode_record, decode_value, encode_key, DecodeError, TxnLogPartitions,
    TxnLogRecord, TxnLogValue, TRANSACTION_STATE_TOPIC,
};

/// Kafka's placement of a transactional id on `__transaction_state`:
/// `Utils.abs(transactionalId.hashCode()) % numPartitions`, with Java's `String.hashCode` over
/// UTF-16 code units and `Utils.abs(Integer.MIN_VALUE) == 0`.
pub fn partition_for(transactional_id: &str, partitions: i32) -> i32 {
    let mut h: i32 = 0;
    for unit in transactional_id.encode_utf16() {
        h = h.wrapping_mul(31).wrapping_add(i32::from(unit));
    }
    let abs = if h == i32::MIN { 0 } else { h.abs() };
    abs % partitions.max(1)
}
