//! sluice-replication: the controller quorum, the metadata image and ISR replication.
//!
//! Empty for now: the single-node broker comes first (see the cluster section of DESIGN.md for
//! what will live here). It depends on the engine only, and never on the broker.
