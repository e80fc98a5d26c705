//! A partition replica on its owner shard: the log plus what the Kafka layer needs around it.

use sluice_engine::{DmaStorage, LeaderEpoch, Log};

/// The leader epoch of every partition: a single node has led each one since it was created,
/// and no election ever happened. Appends stamp it; Metadata and OffsetForLeaderEpoch report it.
pub const LEADER_EPOCH: LeaderEpoch = LeaderEpoch(0);

pub struct Partition {
    pub log: Log<DmaStorage>,
}

impl Partition {
    pub fn new(log: Log<DmaStorage>) -> Partition {
        Partition { log }
    }
}
