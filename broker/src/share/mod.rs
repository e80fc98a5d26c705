//! Share groups' records (KIP-932), I/O-free: which records of a partition are in flight to
//! which member (`partition.rs`), and the share coordinator's persisted state of them
//! (`coordinator.rs`). The shard that leads the partition drives it
//! (`shard/share.rs`); the group's membership is the group coordinator's (`group/share.rs`).

// The state's persisted form (`state_batches`, `restore`, the wire values of the states) is for
// the share coordinator on `__share_group_state`, which is not built yet: the in-flight state is
// in memory only (broker/README.md).
#[allow(dead_code)]
pub mod partition;

// The share coordinator's state on `__share_group_state`, not wired in yet (see its docs).
#[allow(dead_code)]
pub mod coordinator;
