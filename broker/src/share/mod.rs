//! Share groups' records (KIP-932), I/O-free: which records of a partition are in flight to
//! which member (`partition.rs`), and the share coordinator's persisted state of them
//! (`coordinator.rs`). The shard that leads the partition drives the first
//! (`shard/share.rs`), the shard that leads a `__share_group_state` partition the second
//! (`shard/share_state.rs`); the group's membership is the group coordinator's
//! (`group/share.rs`).

pub mod coordinator;
// A few accessors (the holder of an offset, the next lock deadline...) are read only by its tests.
#[allow(dead_code)]
pub mod partition;
