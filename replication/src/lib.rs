//! sluice-replication: the sans-IO core of Sluice's cluster.
//!
//! - `records`: the metadata records and their byte format (`FORMAT.md`).
//! - `image`: the metadata image, built only by applying committed records.
//! - `controller`: the controller state machine (Kafka's QuorumController): requests and time
//!   in, records to commit and responses out.
//! - `placement`: rack-aware replica placement for new partitions.
//! - `replica`, `produce`, `follower`: a partition replica's part in replication: the leader's
//!   state (ISR, high watermark), its side of a produce, a follower's side of a fetch.
//! - `quorum`: the raft-rs driver and the metadata node that ties raft, controller and image
//!   together; the broker feeds it messages, time and persistence acknowledgements.
//!
//! No socket, file, clock or glommio type crosses into this crate: the broker drives it with
//! real ones, and the simulator in `tests/sim.rs` with simulated ones. It depends on the engine
//! only, and never on the broker.

pub mod acl;
pub mod controller;
pub mod error_code;
pub mod follower;
pub mod image;
pub mod placement;
pub mod produce;
pub mod quorum;
pub mod records;
pub mod replica;
