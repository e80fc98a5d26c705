//! sluice-tests: cross-crate integration and fault-injection tests, and the helper binaries they
//! drive.
//!
//! The library holds what a helper binary and the test that drives it must agree on: the
//! deterministic content of the batches a crash test writes ([`content`]), the line protocol a
//! writer reports on ([`protocol`]), and scratch filesystems for full-disk tests
//! ([`loop_mount`]).

pub mod content;
pub mod loop_mount;
pub mod protocol;
