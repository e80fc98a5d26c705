//! Share groups' records (KIP-932), I/O-free, from the `sluice-share` crate (share/): the share
//! partition state machine (`partition`) and the share coordinator's persisted state
//! (`coordinator`). The shard drives them (`shard/share.rs`, `shard/share_state.rs`); the
//! group's membership is the group coordinator's (`group/share.rs`).

pub use sluice_share::{coordinator, partition};
