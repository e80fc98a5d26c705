//! Share groups' records (KIP-932), I/O-free: which records of a partition are in flight to
//! which member (`partition.rs`), and the share coordinator's persisted state of them
//! (`coordinator.rs`). In the broker, the shard that leads the partition drives the first
//! (`shard/share.rs`), the shard that leads a `__share_group_state` partition the second
//! (`shard/share_state.rs`); the group's membership is the group coordinator's
//! (`group/share.rs`). The replication crate's deterministic simulator drives the first too, with
//! share consumers reading through leader changes (`replication/tests/sim/share.rs`).
//!
//! A crate of its own so that both can use it: the broker above, the simulator beside it.

pub mod coordinator;
// A few accessors (the holder of an offset, the next lock deadline...) are read only by tests.
#[allow(dead_code)]
pub mod partition;
