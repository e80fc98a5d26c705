//! A partition replica on its owner shard: the log plus what the Kafka layer needs around it.

use sluice_engine::{DmaStorage, Log};

pub struct Partition {
    pub log: Log<DmaStorage>,
}

impl Partition {
    pub fn new(log: Log<DmaStorage>) -> Partition {
        Partition { log }
    }
}
