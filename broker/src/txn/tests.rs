//! The coordinator driven as a request handler would drive it, with an in-memory
//! `__transaction_state` log.

use std::collections::BTreeMap;

use bytes::Bytes;
use kafka_protocol::messages::ProducerId;
use kafka_protocol::ResponseError;

use super::*;

const TIMEOUT_MS: i32 = 60_000;
const COORDINATOR_EPOCH: i32 = 5;
const TV0: TransactionVersion = TransactionVersion::TV_0;
const TV2: TransactionVersion = TransactionVersion::TV_2;

type Log = Vec<(Bytes, Option<Bytes>)>;

/// A coordinator, a producer id allocator and the records appended so far.
struct H {
    c: TxnCoordinator,
    next_producer_id: i64,
    log: Log,
    now: i64,
}

impl H {
    fn new() -> H {
        H::with(TxnConfig::default())
    }

    fn with(config: TxnConfig) -> H {
        H {
            c: TxnCoordinator::new(config, COORDINATOR_EPOCH),
            next_producer_id: 1000,
            log: Vec::new(),
            now: 1_000_000,
        }
    }

    /// A coordinator loaded from records made of `values`.
    fn loaded(config: TxnConfig, values: &[(&str, TxnLogValue)]) -> (H, Vec<TxnMarkers>) {
        let mut h = H::with(config);
        h.log = values
            .iter()
            .map(|(id, v)| (encode_key(id), Some(v.encode(1))))
            .collect();
        let (c, markers) = TxnCoordinator::load(config, COORDINATOR_EPOCH, h.log.clone()).unwrap();
        h.c = c;
        (h, markers)
    }

    fn init_with(&mut self, id: &str, timeout_ms: i32, expected: Option<(i64, i16)>) -> Step {
        let next = &mut self.next_producer_id;
        let mut ids = || -> Result<i64, ResponseError> {
            *next += 1;
            Ok(*next)
        };
        let expected = expected.map(|(p, e)| (ProducerId(p), e));
        self.c
            .init_producer_id(id, timeout_ms, expected, &mut ids, self.now)
    }

    fn init(&mut self, id: &str, expected: Option<(i64, i16)>) -> Step {
        self.init_with(id, TIMEOUT_MS, expected)
    }

    fn add(
        &mut self,
        id: &str,
        pid: i64,
        epoch: i16,
        parts: &[(&str, i32)],
        tv: TransactionVersion,
    ) -> Step {
        let parts: Vec<TopicPartition> = parts
            .iter()
            .map(|(t, p)| TopicPartition::new(t, *p))
            .collect();
        self.c
            .add_partitions(id, ProducerId(pid), epoch, &parts, tv, self.now)
    }

    fn end(
        &mut self,
        id: &str,
        pid: i64,
        epoch: i16,
        result: TxnResult,
        tv: TransactionVersion,
    ) -> Step {
        let next = &mut self.next_producer_id;
        let mut ids = || -> Result<i64, ResponseError> {
            *next += 1;
            Ok(*next)
        };
        self.c
            .end_txn(id, ProducerId(pid), epoch, result, tv, &mut ids, self.now)
    }

    fn complete(&mut self, a: &TxnAppend, result: Result<(), ResponseError>) -> Completion {
        if result.is_ok() {
            self.log.push((a.key.clone(), a.value.clone()));
        }
        let completion = self.c.complete_append(a, result, self.now);
        self.c.check_invariants();
        completion
    }

    fn append(&mut self, step: Step) -> Completion {
        let Step::Append(a) = step else {
            panic!("expected an append, got {step:?}")
        };
        self.complete(&a, Ok(()))
    }

    fn init_ok(&mut self, id: &str) -> (i64, i16) {
        let step = self.init(id, None);
        match self.append(step).response {
            Some(TxnResponse::InitProducerId {
                error: None,
                producer_id,
                producer_epoch,
            }) => (producer_id.0, producer_epoch),
            other => panic!("{other:?}"),
        }
    }

    /// InitProducerId, then one partition added: an Ongoing transaction.
    fn begin(&mut self, id: &str, tv: TransactionVersion) -> (i64, i16) {
        let (pid, epoch) = self.init_ok(id);
        let step = self.add(id, pid, epoch, &[("t", 0)], tv);
        assert_eq!(
            self.append(step).response,
            Some(TxnResponse::AddPartitions { error: None })
        );
        (pid, epoch)
    }

    fn markers_done(&mut self, id: &str) -> Completion {
        let a = self
            .c
            .complete_markers(id, self.now)
            .expect("waiting for markers");
        assert_eq!(a.kind, AppendKind::Complete);
        self.complete(&a, Ok(()))
    }

    fn data(&self, id: &str) -> TxnData {
        self.c.get(id).expect("a known id").data.clone()
    }

    fn state(&self, id: &str) -> TxnState {
        self.c.get(id).expect("a known id").state()
    }

    fn pending(&self, id: &str) -> Option<TxnState> {
        self.c.get(id).expect("a known id").pending_state()
    }
}

fn respond(step: Step) -> TxnResponse {
    match step {
        Step::Respond(r) => r,
        other => panic!("expected a response, got {other:?}"),
    }
}

fn init_error(step: Step) -> Option<ResponseError> {
    match respond(step) {
        TxnResponse::InitProducerId { error, .. } => error,
        other => panic!("{other:?}"),
    }
}

fn add_error(step: Step) -> Option<ResponseError> {
    match respond(step) {
        TxnResponse::AddPartitions { error } | TxnResponse::AddOffsets { error } => error,
        other => panic!("{other:?}"),
    }
}

fn end_result(step: Step) -> (Option<ResponseError>, i64, i16) {
    match respond(step) {
        TxnResponse::EndTxn {
            error,
            producer_id,
            producer_epoch,
        } => (error, producer_id.0, producer_epoch),
        other => panic!("{other:?}"),
    }
}

fn end_error(step: Step) -> Option<ResponseError> {
    end_result(step).0
}

fn value(
    state: TxnState,
    pid: i64,
    epoch: i16,
    partitions: &[(&str, i32)],
    tv: i16,
    now: i64,
) -> TxnLogValue {
    let data = TxnData {
        producer_id: pid,
        previous_producer_id: pid,
        next_producer_id: NO_PRODUCER_ID,
        producer_epoch: epoch,
        last_producer_epoch: NO_PRODUCER_EPOCH,
        txn_timeout_ms: TIMEOUT_MS,
        state,
        partitions: partitions
            .iter()
            .map(|(t, p)| TopicPartition::new(t, *p))
            .collect(),
        txn_start_timestamp_ms: if state == TxnState::Empty { -1 } else { now },
        txn_last_update_timestamp_ms: now,
        client_transaction_version: TransactionVersion(tv),
    };
    data.to_log_value()
}

const ERR_CONCURRENT: Option<ResponseError> = Some(ResponseError::ConcurrentTransactions);
const ERR_FENCED: Option<ResponseError> = Some(ResponseError::ProducerFenced);
const ERR_MAPPING: Option<ResponseError> = Some(ResponseError::InvalidProducerIdMapping);
const ERR_STATE: Option<ResponseError> = Some(ResponseError::InvalidTxnState);

// ---------------------------------------------------------------- InitProducerId

#[test]
fn init_gives_a_new_id_epoch_zero_then_bumps_the_epoch() {
    let mut h = H::new();
    let (pid, epoch) = h.init_ok("a");
    assert_eq!((pid, epoch), (1001, 0));
    assert_eq!(h.state("a"), TxnState::Empty);
    assert_eq!(h.init_ok("a"), (1001, 1));
    assert_eq!(h.init_ok("b"), (1002, 0));
}

#[test]
fn init_rejects_an_empty_id_and_bad_timeouts() {
    let mut h = H::new();
    assert_eq!(
        init_error(h.init("", None)),
        Some(ResponseError::InvalidRequest)
    );
    assert_eq!(
        init_error(h.init_with("a", 0, None)),
        Some(ResponseError::InvalidTransactionTimeout)
    );
    assert_eq!(
        init_error(h.init_with("a", TRANSACTION_MAX_TIMEOUT_MS_DEFAULT + 1, None)),
        Some(ResponseError::InvalidTransactionTimeout)
    );
    assert!(h.c.get("a").is_none());
    let step = h.init_with("a", TRANSACTION_MAX_TIMEOUT_MS_DEFAULT, None);
    assert!(matches!(step, Step::Append(_)));
}

#[test]
fn init_reports_a_failed_producer_id_allocation() {
    let mut h = H::new();
    let mut ids =
        || -> Result<i64, ResponseError> { Err(ResponseError::CoordinatorLoadInProgress) };
    let step = h.c.init_producer_id("a", TIMEOUT_MS, None, &mut ids, 0);
    assert_eq!(
        init_error(step),
        Some(ResponseError::CoordinatorLoadInProgress)
    );
    assert!(h.c.get("a").is_none());
}

#[test]
fn a_pending_transition_blocks_every_request_on_the_id() {
    let mut h = H::new();
    let (pid, epoch) = h.init_ok("a");
    let Step::Append(a) = h.add("a", pid, epoch, &[("t", 0)], TV0) else {
        panic!()
    };
    assert_eq!(h.pending("a"), Some(TxnState::Ongoing));
    assert_eq!(init_error(h.init("a", None)), ERR_CONCURRENT);
    assert_eq!(
        add_error(h.add("a", pid, epoch, &[("t", 1)], TV0)),
        ERR_CONCURRENT
    );
    assert_eq!(
        end_error(h.end("a", pid, epoch, TxnResult::Commit, TV0)),
        ERR_CONCURRENT
    );
    assert_eq!(
        end_error(h.end("a", pid, epoch, TxnResult::Commit, TV2)),
        ERR_CONCURRENT
    );
    // Other ids are not blocked.
    assert!(matches!(h.init("b", None), Step::Append(_)));
    h.complete(&a, Ok(()));
    assert_eq!(h.state("a"), TxnState::Ongoing);
}

#[test]
fn init_with_an_expected_epoch_follows_kip_360() {
    let mut h = H::new();
    let (pid, _) = h.init_ok("a");
    // The producer continues after an error: bump.
    let step = h.init("a", Some((pid, 0)));
    h.append(step);
    assert_eq!(h.data("a").producer_epoch, 1);
    // The same request retried (its response was lost): the same epoch, no bump.
    let step = h.init("a", Some((pid, 0)));
    let c = h.append(step);
    assert_eq!(
        c.response,
        Some(TxnResponse::InitProducerId {
            error: None,
            producer_id: ProducerId(pid),
            producer_epoch: 1
        })
    );
    // A stale epoch, or another producer id, is fenced.
    assert_eq!(init_error(h.init("a", Some((pid, 7)))), ERR_FENCED);
    assert_eq!(init_error(h.init("a", Some((4242, 1)))), ERR_FENCED);
    assert_eq!(h.pending("a"), None);
}

#[test]
fn expected_producer_needs_both_fields_or_neither() {
    assert_eq!(expected_producer(ProducerId(-1), -1), Ok(None));
    assert_eq!(
        expected_producer(ProducerId(5), 2),
        Ok(Some((ProducerId(5), 2)))
    );
    assert_eq!(
        expected_producer(ProducerId(5), -1),
        Err(ResponseError::InvalidRequest)
    );
    assert_eq!(
        expected_producer(ProducerId(-1), 3),
        Err(ResponseError::InvalidRequest)
    );
}

#[test]
fn old_clients_get_invalid_producer_epoch_for_fencing() {
    assert_eq!(
        error_for_client(ERR_FENCED, false),
        Some(ResponseError::InvalidProducerEpoch)
    );
    assert_eq!(error_for_client(ERR_FENCED, true), ERR_FENCED);
    assert_eq!(error_for_client(None, false), None);
}

#[test]
fn init_on_an_exhausted_epoch_rotates_the_producer_id() {
    let exhausted = i16::MAX - 1;
    let v = value(TxnState::CompleteCommit, 50, exhausted, &[], 2, 10);
    let (mut h, markers) = H::loaded(TxnConfig::default(), &[("a", v)]);
    assert!(markers.is_empty());
    let step = h.init("a", Some((50, exhausted)));
    h.append(step);
    let d = h.data("a");
    assert_eq!((d.producer_id, d.producer_epoch), (1001, 0));
    assert_eq!(d.previous_producer_id, 50);
    assert_eq!(d.last_producer_epoch, exhausted);
    // The rotation retried with the old id and exhausted epoch is recognised, not fenced.
    let step = h.init("a", Some((50, exhausted)));
    let c = h.append(step);
    assert_eq!(
        c.response,
        Some(TxnResponse::InitProducerId {
            error: None,
            producer_id: ProducerId(1001),
            producer_epoch: 0
        })
    );
}

#[test]
fn init_during_an_ongoing_transaction_fences_and_aborts_it() {
    // Cluster at transaction version 2: the fence bumps once and the abort once more.
    let mut h = H::new();
    let (pid, epoch) = h.begin("a", TV0);
    assert_eq!(epoch, 0);
    let step = h.init("a", None);
    let Step::Append(a) = &step else { panic!() };
    assert_eq!(a.kind, AppendKind::FenceForInitProducerId);
    // The fence is in memory at once, before the append.
    assert_eq!(h.data("a").producer_epoch, 1);
    let c = h.append(step);
    assert_eq!(
        c.response,
        Some(TxnResponse::InitProducerId {
            error: ERR_CONCURRENT,
            producer_id: ProducerId(-1),
            producer_epoch: -1
        })
    );
    let markers = c.markers.unwrap();
    assert_eq!(markers.result, TxnResult::Abort);
    assert_eq!((markers.producer_id.0, markers.producer_epoch), (pid, 2));
    assert_eq!(markers.coordinator_epoch, COORDINATOR_EPOCH);
    assert_eq!(markers.partitions, vec![TopicPartition::new("t", 0)]);
    assert_eq!(h.state("a"), TxnState::PrepareAbort);
    // While the markers are written everything waits.
    assert_eq!(init_error(h.init("a", None)), ERR_CONCURRENT);
    assert_eq!(
        add_error(h.add("a", pid, epoch, &[("t", 1)], TV0)),
        ERR_CONCURRENT
    );
    h.markers_done("a");
    assert_eq!(h.state("a"), TxnState::CompleteAbort);
    // The old producer is fenced; the new one gets a fresh epoch.
    assert_eq!(
        add_error(h.add("a", pid, epoch, &[("t", 1)], TV0)),
        ERR_FENCED
    );
    assert_eq!(h.init_ok("a"), (pid, 3));
}

#[test]
fn init_fence_at_transaction_version_0_bumps_once() {
    let config = TxnConfig {
        transaction_version_level: TV0,
        ..TxnConfig::default()
    };
    let mut h = H::with(config);
    let (pid, _) = h.begin("a", TV0);
    let step = h.init("a", None);
    let c = h.append(step);
    assert_eq!(c.markers.unwrap().producer_epoch, 1);
    h.markers_done("a");
    assert_eq!(h.init_ok("a"), (pid, 2));
}

#[test]
fn init_while_markers_are_written_is_concurrent() {
    let mut h = H::new();
    let (pid, epoch) = h.begin("a", TV0);
    let step = h.end("a", pid, epoch, TxnResult::Commit, TV0);
    h.append(step);
    assert_eq!(h.state("a"), TxnState::PrepareCommit);
    assert_eq!(init_error(h.init("a", None)), ERR_CONCURRENT);
}

// ---------------------------------------------------------------- AddPartitionsToTxn

#[test]
fn add_partitions_starts_a_transaction_and_extends_it() {
    let mut h = H::new();
    let (pid, epoch) = h.init_ok("a");
    h.now += 10;
    let step = h.add("a", pid, epoch, &[("t", 0), ("u", 3)], TV0);
    h.append(step);
    let d = h.data("a");
    assert_eq!(d.state, TxnState::Ongoing);
    assert_eq!(d.txn_start_timestamp_ms, h.now);
    // Partitions already in the transaction: answered at once, no record.
    assert_eq!(add_error(h.add("a", pid, epoch, &[("u", 3)], TV0)), None);
    let log_len = h.log.len();
    h.now += 10;
    let step = h.add("a", pid, epoch, &[("t", 1)], TV0);
    h.append(step);
    assert_eq!(h.log.len(), log_len + 1);
    let d = h.data("a");
    assert_eq!(d.partitions.len(), 3);
    // The start time is the first partition's.
    assert_eq!(d.txn_start_timestamp_ms, h.now - 10);
}

#[test]
fn add_partitions_errors() {
    let mut h = H::new();
    assert_eq!(
        add_error(h.add("nobody", 1, 0, &[("t", 0)], TV0)),
        ERR_MAPPING
    );
    assert_eq!(
        add_error(h.add("", 1, 0, &[("t", 0)], TV0)),
        Some(ResponseError::InvalidRequest)
    );
    let (pid, epoch) = h.begin("a", TV0);
    assert_eq!(
        add_error(h.add("a", pid + 1, epoch, &[("t", 1)], TV0)),
        ERR_MAPPING
    );
    let step = h.end("a", pid, epoch, TxnResult::Commit, TV0);
    h.append(step);
    assert_eq!(
        add_error(h.add("a", pid, epoch, &[("t", 1)], TV0)),
        ERR_CONCURRENT
    );
    h.markers_done("a");
    let (_, epoch2) = h.init_ok("a");
    assert_eq!(
        add_error(h.add("a", pid, epoch, &[("t", 1)], TV0)),
        ERR_FENCED
    );
    // After a completed transaction the next one starts afresh.
    h.now += 100;
    let step = h.add("a", pid, epoch2, &[("t", 5)], TV2);
    h.append(step);
    let d = h.data("a");
    assert_eq!(d.txn_start_timestamp_ms, h.now);
    assert_eq!(d.client_transaction_version, TV2);
    assert_eq!(d.partitions.len(), 1);
}

#[test]
fn add_offsets_adds_the_groups_offsets_partition() {
    let mut h = H::new();
    let (pid, epoch) = h.init_ok("a");
    let step = h.c.add_offsets("a", ProducerId(pid), epoch, 17, h.now);
    let c = h.append(step);
    assert_eq!(c.response, Some(TxnResponse::AddOffsets { error: None }));
    assert!(h
        .data("a")
        .partitions
        .contains(&TopicPartition::new("__consumer_offsets", 17)));
    let step = h.c.add_offsets("a", ProducerId(pid), epoch + 1, 17, h.now);
    assert_eq!(respond(step), TxnResponse::AddOffsets { error: ERR_FENCED });
}

#[test]
fn verify_only_answers_without_changing_anything() {
    let mut h = H::new();
    let (pid, epoch) = h.begin("a", TV2);
    let parts = [TopicPartition::new("t", 0), TopicPartition::new("t", 1)];
    let before = h.data("a");
    let answer = h.c.verify_partitions("a", ProducerId(pid), epoch, &parts);
    assert_eq!(
        answer,
        vec![
            (parts[0].clone(), None),
            (parts[1].clone(), Some(ResponseError::TransactionAbortable))
        ]
    );
    assert_eq!(h.data("a"), before);
    let all = |e| vec![(parts[0].clone(), e), (parts[1].clone(), e)];
    assert_eq!(
        h.c.verify_partitions("a", ProducerId(pid + 1), epoch, &parts),
        all(ERR_MAPPING)
    );
    assert_eq!(
        h.c.verify_partitions("a", ProducerId(pid), epoch + 1, &parts),
        all(ERR_FENCED)
    );
    assert_eq!(
        h.c.verify_partitions("zz", ProducerId(pid), epoch, &parts),
        all(ERR_MAPPING)
    );
    let step = h.end("a", pid, epoch, TxnResult::Abort, TV2);
    h.append(step);
    // The epoch was bumped by the TV2 end.
    assert_eq!(
        h.c.verify_partitions("a", ProducerId(pid), epoch + 1, &parts),
        all(ERR_CONCURRENT)
    );
}

// ---------------------------------------------------------------- EndTxn, version 0/1

#[test]
fn end_txn_v1_commit_writes_markers_then_completes() {
    let mut h = H::new();
    let (pid, epoch) = h.begin("a", TV0);
    let step = h.end("a", pid, epoch, TxnResult::Commit, TV0);
    let c = h.append(step);
    assert_eq!(
        c.response,
        Some(TxnResponse::EndTxn {
            error: None,
            producer_id: ProducerId(-1),
            producer_epoch: -1
        })
    );
    let m = c.markers.unwrap();
    assert_eq!(
        (m.producer_id.0, m.producer_epoch, m.result),
        (pid, epoch, TxnResult::Commit)
    );
    assert_eq!(h.state("a"), TxnState::PrepareCommit);
    assert_eq!(h.pending("a"), Some(TxnState::CompleteCommit));
    // Retries while the markers are written wait, whatever they ask.
    assert_eq!(
        end_error(h.end("a", pid, epoch, TxnResult::Commit, TV0)),
        ERR_CONCURRENT
    );
    assert_eq!(
        end_error(h.end("a", pid, epoch, TxnResult::Abort, TV0)),
        ERR_CONCURRENT
    );
    assert!(h.c.complete_markers("b", h.now).is_none());
    h.markers_done("a");
    assert_eq!(h.state("a"), TxnState::CompleteCommit);
    assert!(h.data("a").partitions.is_empty());
    assert!(h.c.complete_markers("a", h.now).is_none());
    // A retried commit succeeds; an abort of a committed transaction is refused.
    assert_eq!(
        end_error(h.end("a", pid, epoch, TxnResult::Commit, TV0)),
        None
    );
    assert_eq!(
        end_error(h.end("a", pid, epoch, TxnResult::Abort, TV0)),
        ERR_STATE
    );
}

#[test]
fn end_txn_v1_errors() {
    let mut h = H::new();
    assert_eq!(
        end_error(h.end("a", 1, 0, TxnResult::Commit, TV0)),
        ERR_MAPPING
    );
    let (pid, epoch) = h.init_ok("a");
    // Nothing to end.
    assert_eq!(
        end_error(h.end("a", pid, epoch, TxnResult::Commit, TV0)),
        ERR_STATE
    );
    assert_eq!(
        end_error(h.end("a", pid, epoch, TxnResult::Abort, TV0)),
        ERR_STATE
    );
    let step = h.add("a", pid, epoch, &[("t", 0)], TV0);
    h.append(step);
    assert_eq!(
        end_error(h.end("a", pid + 1, epoch, TxnResult::Commit, TV0)),
        ERR_MAPPING
    );
    assert_eq!(
        end_error(h.end("a", pid, epoch + 1, TxnResult::Commit, TV0)),
        ERR_FENCED
    );
    let step = h.end("a", pid, epoch, TxnResult::Abort, TV0);
    h.append(step);
    h.markers_done("a");
    assert_eq!(h.state("a"), TxnState::CompleteAbort);
    assert_eq!(
        end_error(h.end("a", pid, epoch, TxnResult::Abort, TV0)),
        None
    );
    assert_eq!(
        end_error(h.end("a", pid, epoch, TxnResult::Commit, TV0)),
        ERR_STATE
    );
}

// ---------------------------------------------------------------- EndTxn, version 2

#[test]
fn end_txn_v2_bumps_the_epoch_and_returns_it() {
    let mut h = H::new();
    let (pid, epoch) = h.begin("a", TV2);
    let step = h.end("a", pid, epoch, TxnResult::Commit, TV2);
    let c = h.append(step);
    assert_eq!(
        c.response,
        Some(TxnResponse::EndTxn {
            error: None,
            producer_id: ProducerId(pid),
            producer_epoch: epoch + 1
        })
    );
    // Markers carry the bumped epoch, fencing late writes of the old one.
    assert_eq!(c.markers.unwrap().producer_epoch, epoch + 1);
    // A retry (old epoch) while the markers are written waits, and so does the next
    // transaction's end at the bumped epoch (Kafka's KAFKA-18464): a client ending the next
    // transaction right away must retry, not be fenced.
    assert_eq!(
        end_error(h.end("a", pid, epoch, TxnResult::Commit, TV2)),
        ERR_CONCURRENT
    );
    assert_eq!(
        end_error(h.end("a", pid, epoch + 1, TxnResult::Commit, TV2)),
        ERR_CONCURRENT
    );
    assert_eq!(
        end_error(h.end("a", pid, epoch + 1, TxnResult::Abort, TV2)),
        ERR_CONCURRENT
    );
    assert_eq!(
        end_error(h.end("a", pid, epoch, TxnResult::Abort, TV2)),
        ERR_CONCURRENT
    );
    h.markers_done("a");
    assert_eq!(h.data("a").producer_epoch, epoch + 1);
    // The retried commit succeeds with the epoch to continue with.
    assert_eq!(
        end_result(h.end("a", pid, epoch, TxnResult::Commit, TV2)),
        (None, pid, epoch + 1)
    );
    // The next transaction's epoch is the bumped one.
    let step = h.add("a", pid, epoch + 1, &[("t", 0)], TV2);
    h.append(step);
    assert_eq!(h.state("a"), TxnState::Ongoing);
}

#[test]
fn end_txn_v2_idle_state_table() {
    let mut h = H::new();
    let (pid, e) = h.init_ok("a");
    // Empty: abort retry PF, commit retry PF, commit current ITS, abort current EB.
    h.init_ok("a");
    let e = e + 1;
    assert_eq!(
        end_error(h.end("a", pid, e - 1, TxnResult::Abort, TV2)),
        ERR_FENCED
    );
    assert_eq!(
        end_error(h.end("a", pid, e - 1, TxnResult::Commit, TV2)),
        ERR_FENCED
    );
    assert_eq!(
        end_error(h.end("a", pid, e, TxnResult::Commit, TV2)),
        ERR_STATE
    );
    let step = h.end("a", pid, e, TxnResult::Abort, TV2);
    let c = h.append(step);
    // An abort with nothing added has no markers to write.
    assert!(c.markers.unwrap().partitions.is_empty());
    h.markers_done("a");
    let e = e + 1;
    assert_eq!(h.state("a"), TxnState::CompleteAbort);
    assert_eq!(h.data("a").producer_epoch, e);
    // CompleteAbort: abort retry NONE, commit retry ITS, commit current ITS, abort current EB.
    assert_eq!(
        end_result(h.end("a", pid, e - 1, TxnResult::Abort, TV2)),
        (None, pid, e)
    );
    assert_eq!(
        end_error(h.end("a", pid, e - 1, TxnResult::Commit, TV2)),
        ERR_STATE
    );
    assert_eq!(
        end_error(h.end("a", pid, e, TxnResult::Commit, TV2)),
        ERR_STATE
    );
    // CompleteCommit: commit retry NONE, abort retry ITS, commit current ITS, abort current EB.
    let step = h.add("a", pid, e, &[("t", 0)], TV2);
    h.append(step);
    let step = h.end("a", pid, e, TxnResult::Commit, TV2);
    h.append(step);
    h.markers_done("a");
    let e = e + 1;
    assert_eq!(h.state("a"), TxnState::CompleteCommit);
    assert_eq!(
        end_result(h.end("a", pid, e - 1, TxnResult::Commit, TV2)),
        (None, pid, e)
    );
    assert_eq!(
        end_error(h.end("a", pid, e - 1, TxnResult::Abort, TV2)),
        ERR_STATE
    );
    assert_eq!(
        end_error(h.end("a", pid, e, TxnResult::Commit, TV2)),
        ERR_STATE
    );
    let step = h.end("a", pid, e, TxnResult::Abort, TV2);
    assert!(matches!(step, Step::Append(_)));
    // Older epochs are fenced in every state.
    h.append(step);
    h.markers_done("a");
    assert_eq!(
        end_error(h.end("a", pid, e - 1, TxnResult::Abort, TV2)),
        ERR_FENCED
    );
}

#[test]
fn end_txn_v2_on_an_exhausted_epoch_moves_to_a_new_producer_id() {
    let exhausted = i16::MAX - 1;
    let v = value(TxnState::Ongoing, 50, exhausted, &[("t", 0)], 2, 10);
    let (mut h, _) = H::loaded(TxnConfig::default(), &[("a", v)]);
    let step = h.end("a", 50, exhausted, TxnResult::Commit, TV2);
    let c = h.append(step);
    // The response already names the identity to continue with...
    assert_eq!(
        c.response,
        Some(TxnResponse::EndTxn {
            error: None,
            producer_id: ProducerId(1001),
            producer_epoch: 0
        })
    );
    // ...while the markers fence the old id at its last epoch.
    let m = c.markers.unwrap();
    assert_eq!((m.producer_id.0, m.producer_epoch), (50, i16::MAX));
    assert_eq!(h.data("a").next_producer_id, 1001);
    h.markers_done("a");
    let d = h.data("a");
    assert_eq!((d.producer_id, d.producer_epoch), (1001, 0));
    assert_eq!(d.previous_producer_id, 50);
    assert_eq!(d.next_producer_id, NO_PRODUCER_ID);
    // The retried end, still under the old id, succeeds.
    assert_eq!(
        end_result(h.end("a", 50, exhausted, TxnResult::Commit, TV2)),
        (None, 1001, 0)
    );
    let step = h.add("a", 1001, 0, &[("t", 0)], TV2);
    h.append(step);
    assert_eq!(h.state("a"), TxnState::Ongoing);
}

// ---------------------------------------------------------------- appends that fail

#[test]
fn a_failed_append_drops_the_transition_and_answers_the_coordinator_error() {
    let mut h = H::new();
    let (pid, epoch) = h.init_ok("a");
    let before = h.data("a");
    let Step::Append(a) = h.add("a", pid, epoch, &[("t", 0)], TV0) else {
        panic!()
    };
    let c = h.complete(&a, Err(ResponseError::NotEnoughReplicas));
    assert_eq!(
        c.response,
        Some(TxnResponse::AddPartitions {
            error: Some(ResponseError::CoordinatorNotAvailable)
        })
    );
    assert_eq!(h.data("a"), before);
    assert_eq!(h.pending("a"), None);
    let Step::Append(a) = h.init("a", None) else {
        panic!()
    };
    let c = h.complete(&a, Err(ResponseError::NotLeaderOrFollower));
    assert_eq!(
        init_error(Step::Respond(c.response.unwrap())),
        Some(ResponseError::NotCoordinator)
    );
    assert_eq!(h.data("a"), before);
}

#[test]
fn a_failed_complete_record_is_retried() {
    let mut h = H::new();
    let (pid, epoch) = h.begin("a", TV0);
    let step = h.end("a", pid, epoch, TxnResult::Commit, TV0);
    h.append(step);
    let a = h.c.complete_markers("a", h.now).unwrap();
    let c = h.complete(&a, Err(ResponseError::RequestTimedOut));
    assert_eq!(c.retry.as_ref(), Some(&a));
    assert_eq!(c.response, None);
    assert_eq!(h.pending("a"), Some(TxnState::CompleteCommit));
    assert_eq!(
        end_error(h.end("a", pid, epoch, TxnResult::Commit, TV0)),
        ERR_CONCURRENT
    );
    h.complete(&a, Ok(()));
    assert_eq!(h.state("a"), TxnState::CompleteCommit);
}

#[test]
fn an_append_from_an_older_coordinator_is_not_applied() {
    let mut h = H::new();
    let (pid, epoch) = h.init_ok("a");
    let Step::Append(a) = h.add("a", pid, epoch, &[("t", 0)], TV0) else {
        panic!()
    };
    // The partition moved away and back: a new coordinator epoch.
    let (c, _) =
        TxnCoordinator::load(TxnConfig::default(), COORDINATOR_EPOCH + 1, h.log.clone()).unwrap();
    h.c = c;
    let c = h.c.complete_append(&a, Ok(()), h.now);
    assert_eq!(
        c.response,
        Some(TxnResponse::AddPartitions {
            error: Some(ResponseError::NotCoordinator)
        })
    );
    assert_eq!(h.state("a"), TxnState::Empty);
}

// ---------------------------------------------------------------- timeouts and expiration

#[test]
fn a_timed_out_transaction_is_aborted_and_its_producer_fenced() {
    let mut h = H::new();
    let start = h.now;
    let (pid, epoch) = h.begin("a", TV0);
    h.init_ok("idle");
    assert!(h.c.timed_out(start + i64::from(TIMEOUT_MS)).is_empty());
    let late = start + i64::from(TIMEOUT_MS) + 1;
    assert_eq!(
        h.c.timed_out(late),
        vec![TimedOutTxn {
            transactional_id: "a".into(),
            producer_id: ProducerId(pid),
            producer_epoch: epoch
        }]
    );
    h.now = late;
    let appends = h.c.abort_timed_out(late);
    assert_eq!(appends.len(), 1);
    assert_eq!(appends[0].kind, AppendKind::TimeoutAbort);
    // Nothing more is timed out while the abort is in flight.
    assert!(h.c.timed_out(late).is_empty());
    let c = h.complete(&appends[0], Ok(()));
    assert_eq!(c.response, None);
    let m = c.markers.unwrap();
    // Fence bump, then the transaction version 2 bump of the abort.
    assert_eq!((m.producer_epoch, m.result), (epoch + 2, TxnResult::Abort));
    h.markers_done("a");
    assert_eq!(h.state("a"), TxnState::CompleteAbort);
    assert_eq!(
        end_error(h.end("a", pid, epoch, TxnResult::Commit, TV0)),
        ERR_FENCED
    );
    assert_eq!(
        add_error(h.add("a", pid, epoch, &[("t", 0)], TV0)),
        ERR_FENCED
    );
}

#[test]
fn a_failed_fence_is_not_bumped_twice() {
    let config = TxnConfig {
        transaction_version_level: TV0,
        ..TxnConfig::default()
    };
    let mut h = H::with(config);
    let (_, epoch) = h.begin("a", TV0);
    h.now += i64::from(TIMEOUT_MS) + 1;
    let appends = h.c.abort_timed_out(h.now);
    h.complete(&appends[0], Err(ResponseError::NotEnoughReplicas));
    assert_eq!(h.state("a"), TxnState::Ongoing);
    assert_eq!(h.data("a").producer_epoch, epoch + 1);
    assert!(h.c.get("a").unwrap().has_failed_epoch_fence);
    let appends = h.c.abort_timed_out(h.now);
    let c = h.complete(&appends[0], Ok(()));
    assert_eq!(c.markers.unwrap().producer_epoch, epoch + 1);
    assert!(!h.c.get("a").unwrap().has_failed_epoch_fence);
}

#[test]
fn idle_transactional_ids_expire_with_a_tombstone() {
    let mut h = H::new();
    h.init_ok("idle");
    let (pid, epoch) = h.begin("busy", TV0);
    h.init_ok("done");
    let step = h.add("done", 1003, 0, &[("t", 0)], TV0);
    h.append(step);
    let step = h.end("done", 1003, 0, TxnResult::Commit, TV0);
    h.append(step);
    h.markers_done("done");
    let expiration = TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT;
    h.now += expiration - 1;
    assert!(h.c.expire_transactional_ids(h.now).is_empty());
    h.now += 1;
    let appends = h.c.expire_transactional_ids(h.now);
    let ids: Vec<&str> = appends
        .iter()
        .map(|a| a.transactional_id.as_str())
        .collect();
    assert_eq!(ids, vec!["done", "idle"]);
    assert!(appends
        .iter()
        .all(|a| a.value.is_none() && a.kind == AppendKind::Expire));
    assert_eq!(h.pending("idle"), Some(TxnState::Dead));
    assert_eq!(init_error(h.init("idle", None)), ERR_CONCURRENT);
    h.complete(&appends[0], Err(ResponseError::NotEnoughReplicas));
    h.complete(&appends[1], Ok(()));
    assert!(h.c.get("idle").is_none());
    assert_eq!(
        h.c.describe("idle"),
        Err(ResponseError::TransactionalIdNotFound)
    );
    assert_eq!(h.state("done"), TxnState::CompleteCommit);
    assert_eq!(h.pending("done"), None);
    // An ongoing transaction never expires (it times out instead).
    assert_eq!(h.state("busy"), TxnState::Ongoing);
    assert_eq!(h.data("busy").producer_id, pid);
    assert_eq!(h.data("busy").producer_epoch, epoch);
    // The tombstone is in the log: a reload forgets the id too.
    let (c, _) =
        TxnCoordinator::load(TxnConfig::default(), COORDINATOR_EPOCH, h.log.clone()).unwrap();
    assert!(c.get("idle").is_none());
    assert!(c.get("done").is_some());
}

// ---------------------------------------------------------------- loading

#[test]
fn loading_reports_transactions_left_in_prepare() {
    let values = [
        (
            "c",
            value(TxnState::PrepareCommit, 7, 3, &[("t", 0), ("t", 1)], 0, 10),
        ),
        ("a", value(TxnState::PrepareAbort, 8, 1, &[("u", 2)], 2, 10)),
        ("o", value(TxnState::Ongoing, 9, 0, &[("u", 0)], 0, 10)),
    ];
    let (mut h, markers) = H::loaded(TxnConfig::default(), &values);
    assert_eq!(markers.len(), 2);
    assert_eq!(markers[0].transactional_id, "a");
    assert_eq!(markers[0].result, TxnResult::Abort);
    assert_eq!(markers[1].transactional_id, "c");
    assert_eq!(markers[1].result, TxnResult::Commit);
    assert_eq!(
        (markers[1].producer_id.0, markers[1].producer_epoch),
        (7, 3)
    );
    assert_eq!(markers[1].partitions.len(), 2);
    assert_eq!(markers[1].coordinator_epoch, COORDINATOR_EPOCH);
    assert_eq!(
        end_error(h.end("c", 7, 3, TxnResult::Commit, TV0)),
        ERR_CONCURRENT
    );
    assert_eq!(init_error(h.init("c", None)), ERR_CONCURRENT);
    h.markers_done("c");
    h.markers_done("a");
    assert_eq!(h.state("c"), TxnState::CompleteCommit);
    assert_eq!(h.state("a"), TxnState::CompleteAbort);
    assert_eq!(h.state("o"), TxnState::Ongoing);
}

#[test]
fn loading_skips_foreign_keys_and_fails_on_damage() {
    let good = (
        encode_key("a"),
        Some(value(TxnState::Empty, 1, 0, &[], 0, 0).encode(1)),
    );
    let foreign = (Bytes::from_static(&[0, 9, 0, 0]), None);
    let (c, _) =
        TxnCoordinator::load(TxnConfig::default(), 1, vec![foreign.clone(), good.clone()]).unwrap();
    assert_eq!(c.len(), 1);
    let damaged = (encode_key("b"), Some(Bytes::from_static(&[0, 1, 0])));
    let err = TxnCoordinator::load(TxnConfig::default(), 1, vec![good, damaged]).unwrap_err();
    assert!(matches!(err, LoadError::Decode { index: 1, .. }), "{err}");
    let mut bad_status = value(TxnState::Empty, 1, 0, &[], 0, 0);
    bad_status.transaction_status = 42;
    let err = TxnCoordinator::load(
        TxnConfig::default(),
        1,
        vec![(encode_key("c"), Some(bad_status.encode(0)))],
    )
    .unwrap_err();
    assert_eq!(
        err,
        LoadError::UnknownStatus {
            index: 0,
            status: 42
        }
    );
}

/// The state a coordinator rebuilds from the log is the state it had, except the in-memory
/// `last_producer_epoch`, which Kafka does not persist either.
fn assert_replays(live: &TxnCoordinator, log: &Log) {
    let (loaded, _) =
        TxnCoordinator::load(*live.config(), live.coordinator_epoch(), log.clone()).unwrap();
    let ids = |c: &TxnCoordinator| {
        c.iter()
            .map(|m| m.transactional_id.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(live), ids(&loaded));
    for md in live.iter() {
        let other = loaded.get(&md.transactional_id).unwrap();
        let mut a = md.data.clone();
        let mut b = other.data.clone();
        a.last_producer_epoch = NO_PRODUCER_EPOCH;
        b.last_producer_epoch = NO_PRODUCER_EPOCH;
        if live.config().transaction_version_level.log_value_version() == 0 {
            // Value version 0 has no tagged fields.
            a.previous_producer_id = NO_PRODUCER_ID;
            a.next_producer_id = NO_PRODUCER_ID;
            a.client_transaction_version = TV0;
        }
        assert_eq!(a, b, "{}", md.transactional_id);
        assert_eq!(
            md.pending_state(),
            other.pending_state(),
            "{}",
            md.transactional_id
        );
    }
}

#[test]
fn replaying_the_log_rebuilds_the_same_state() {
    let mut h = H::new();
    // Committed (TV0), aborted (TV2), ongoing, waiting for markers, fenced by InitProducerId,
    // rotated, expired.
    let (p, e) = h.begin("committed", TV0);
    let step = h.end("committed", p, e, TxnResult::Commit, TV0);
    h.append(step);
    h.markers_done("committed");
    let (p, e) = h.begin("aborted", TV2);
    let step = h.end("aborted", p, e, TxnResult::Abort, TV2);
    h.append(step);
    h.markers_done("aborted");
    let (p, e) = h.begin("ongoing", TV0);
    let step = h.add("ongoing", p, e, &[("v", 4)], TV0);
    h.append(step);
    let (p, e) = h.begin("waiting", TV2);
    let step = h.end("waiting", p, e, TxnResult::Commit, TV2);
    h.append(step);
    h.begin("fenced", TV0);
    let step = h.init("fenced", None);
    h.append(step);
    h.markers_done("fenced");
    h.init_ok("fenced");
    h.init_ok("expired");
    h.now += TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT;
    for a in h.c.expire_transactional_ids(h.now) {
        if a.transactional_id == "expired" {
            h.complete(&a, Ok(()));
        } else {
            h.complete(&a, Err(ResponseError::NotEnoughReplicas));
        }
    }
    assert!(h.c.get("expired").is_none());
    assert_replays(&h.c, &h.log);
    // And at transaction version 0, which writes value version 0.
    let config = TxnConfig {
        transaction_version_level: TV0,
        ..TxnConfig::default()
    };
    let mut h = H::with(config);
    let (p, e) = h.begin("a", TV0);
    let step = h.end("a", p, e, TxnResult::Abort, TV0);
    h.append(step);
    h.begin("b", TV0);
    assert_replays(&h.c, &h.log);
}

#[test]
fn the_record_version_follows_the_clusters_transaction_version() {
    let mut h = H::new();
    h.init_ok("a");
    let value = h.log[0].1.clone().unwrap();
    assert_eq!(&value[..2], &[0, 1]);
    assert_eq!(decode_key(&h.log[0].0).unwrap(), "a");
    let config = TxnConfig {
        transaction_version_level: TransactionVersion::TV_1,
        ..TxnConfig::default()
    };
    let mut h = H::with(config);
    h.init_ok("a");
    assert_eq!(&h.log[0].1.as_ref().unwrap()[..2], &[0, 0]);
}

// ---------------------------------------------------------------- Describe / List

#[test]
fn describe_and_list_use_kafkas_state_names() {
    let mut h = H::new();
    let start = h.now;
    let (pa, _) = h.init_ok("a");
    let (pb, _) = h.begin("b", TV0);
    let step = h.add("b", pb, 0, &[("t", 2), ("s", 1)], TV0);
    h.append(step);
    let d = h.c.describe("b").unwrap();
    assert_eq!(d.state, "Ongoing");
    assert_eq!(d.producer_id.0, pb);
    assert_eq!(d.transaction_timeout_ms, TIMEOUT_MS);
    assert_eq!(d.transaction_start_time_ms, start);
    assert_eq!(
        d.topics,
        vec![("s".to_string(), vec![1]), ("t".to_string(), vec![0, 2])]
    );
    assert_eq!(h.c.describe("a").unwrap().state, "Empty");
    assert_eq!(h.c.describe("a").unwrap().transaction_start_time_ms, -1);
    assert_eq!(h.c.describe(""), Err(ResponseError::InvalidRequest));
    assert_eq!(
        h.c.describe("zz"),
        Err(ResponseError::TransactionalIdNotFound)
    );

    let names = |l: &TxnList| {
        l.transaction_states
            .iter()
            .map(|t| (t.transactional_id.clone(), t.state))
            .collect::<Vec<_>>()
    };
    let all = h.c.list(&[], &[], -1, h.now);
    assert_eq!(
        names(&all),
        vec![("a".into(), "Empty"), ("b".into(), "Ongoing")]
    );
    let l =
        h.c.list(&[], &["Ongoing".into(), "Bogus".into()], -1, h.now);
    assert_eq!(names(&l), vec![("b".into(), "Ongoing")]);
    assert_eq!(l.unknown_state_filters, vec!["Bogus".to_string()]);
    let l = h.c.list(&[ProducerId(pa)], &[], -1, h.now);
    assert_eq!(names(&l), vec![("a".into(), "Empty")]);
    // KIP-994: only transactions running longer than the duration.
    let l = h.c.list(&[], &["Ongoing".into()], 50, start + 100);
    assert_eq!(names(&l).len(), 1);
    let l = h.c.list(&[], &["Ongoing".into()], 100, start + 100);
    assert!(l.transaction_states.is_empty());
}

// ---------------------------------------------------------------- random requests

/// xorshift64*: deterministic, seeded.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Random requests from a few producers, appends completed out of order, some failing, time
/// jumping. Checked after every step: the coordinator's invariants; an id with a transition
/// pending never gets a second record in flight; no producer id's epoch ever goes down. Without
/// failures, the log replays into the same state.
fn random_requests(seed: u64, failure_percent: u64, steps: usize) {
    const IDS: [&str; 4] = ["a", "b", "c", "d"];
    let mut rng = Rng(seed);
    let mut h = H::new();
    // What each producer believes its identity is.
    let mut producers: BTreeMap<&str, (i64, i16)> = BTreeMap::new();
    let mut in_flight: Vec<TxnAppend> = Vec::new();
    let mut waiting_markers: Vec<String> = Vec::new();
    let mut max_epoch: BTreeMap<i64, i16> = BTreeMap::new();
    // So that the run is known to reach every state and path, not just to pass.
    let mut states_seen = std::collections::BTreeSet::new();
    let (mut timeout_aborts, mut expirations, mut fenced) = (0, 0, 0);
    let ids_key =
        |id: &str| -> &'static str { IDS.into_iter().find(|i| *i == id).expect("one of IDS") };

    for _ in 0..steps {
        let id = IDS[rng.below(IDS.len() as u64) as usize];
        let tv = if rng.chance(50) { TV2 } else { TV0 };
        let (pid, epoch) = producers.get(id).copied().unwrap_or((1, 0));
        // A producer sometimes retries with its previous epoch.
        let epoch = if rng.chance(10) {
            epoch.saturating_sub(1)
        } else {
            epoch
        };
        let pending_before =
            h.c.get(id)
                .is_some_and(|m| m.pending_transition_in_progress());
        let identity_before =
            h.c.get(id)
                .map(|m| (m.data.producer_id, m.data.producer_epoch));
        let op = rng.below(12);
        let step = match op {
            0 | 1 => {
                let expected = if rng.chance(30) {
                    producers.get(id).copied()
                } else {
                    None
                };
                Some(h.init(id, expected))
            }
            2 | 3 => {
                let partition = rng.below(3) as i32;
                Some(h.add(id, pid, epoch, &[("t", partition)], tv))
            }
            4 => {
                let result = if rng.chance(50) {
                    TxnResult::Commit
                } else {
                    TxnResult::Abort
                };
                Some(h.end(id, pid, epoch, result, tv))
            }
            5..=7 if !in_flight.is_empty() => {
                let a = in_flight.swap_remove(rng.below(in_flight.len() as u64) as usize);
                let result = if rng.chance(failure_percent) {
                    Err(ResponseError::NotEnoughReplicas)
                } else {
                    Ok(())
                };
                let c = h.complete(&a, result);
                match c.response {
                    Some(TxnResponse::InitProducerId {
                        error: None,
                        producer_id,
                        producer_epoch,
                    }) => {
                        producers.insert(
                            ids_key(&a.transactional_id),
                            (producer_id.0, producer_epoch),
                        );
                    }
                    Some(TxnResponse::EndTxn {
                        error: None,
                        producer_id,
                        producer_epoch,
                    }) if producer_id.0 >= 0 => {
                        producers.insert(
                            ids_key(&a.transactional_id),
                            (producer_id.0, producer_epoch),
                        );
                    }
                    _ => {}
                }
                if let Some(m) = c.markers {
                    waiting_markers.push(m.transactional_id);
                }
                in_flight.extend(c.retry);
                None
            }
            8 if !waiting_markers.is_empty() => {
                let id =
                    waiting_markers.swap_remove(rng.below(waiting_markers.len() as u64) as usize);
                in_flight.extend(h.c.complete_markers(&id, h.now));
                None
            }
            9 => {
                h.now += if rng.chance(5) {
                    TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT
                } else {
                    rng.below(30_000) as i64
                };
                None
            }
            10 => {
                let appends = h.c.abort_timed_out(h.now);
                timeout_aborts += appends.len();
                in_flight.extend(appends);
                None
            }
            _ => {
                let appends = h.c.expire_transactional_ids(h.now);
                expirations += appends.len();
                in_flight.extend(appends);
                None
            }
        };
        match step {
            Some(Step::Respond(r)) => {
                let error = match r {
                    TxnResponse::InitProducerId { error, .. }
                    | TxnResponse::AddPartitions { error }
                    | TxnResponse::AddOffsets { error }
                    | TxnResponse::EndTxn { error, .. } => error,
                };
                fenced += usize::from(error == ERR_FENCED);
            }
            Some(Step::Append(a)) => {
                assert!(
                    !pending_before,
                    "{id}: a second transition while one is pending"
                );
                // Only the current producer changes its transaction: a fenced one never does.
                if (2..=4).contains(&op) {
                    assert_eq!(identity_before, Some((pid, epoch)), "{id}: {:?}", a.kind);
                }
                in_flight.push(a);
            }
            None => {}
        }
        h.c.check_invariants();
        // At most one record in flight per id.
        let mut seen = std::collections::BTreeSet::new();
        for a in &in_flight {
            assert!(
                seen.insert(a.transactional_id.clone()),
                "{}: two records in flight",
                a.transactional_id
            );
        }
        for md in h.c.iter() {
            states_seen.insert(md.state());
            let d = &md.data;
            let max = max_epoch.entry(d.producer_id).or_insert(d.producer_epoch);
            assert!(
                d.producer_epoch >= *max,
                "{}: producer {} went from epoch {} to {}",
                md.transactional_id,
                d.producer_id,
                max,
                d.producer_epoch
            );
            *max = d.producer_epoch;
        }
    }

    if failure_percent == 0 {
        // Finish everything in flight, then replay.
        while !in_flight.is_empty() || !waiting_markers.is_empty() {
            if let Some(a) = in_flight.pop() {
                let c = h.complete(&a, Ok(()));
                waiting_markers.extend(c.markers.map(|m| m.transactional_id));
            } else if let Some(id) = waiting_markers.pop() {
                in_flight.extend(h.c.complete_markers(&id, h.now));
            }
        }
        // Ids created by an InitProducerId that never completed are not in the log.
        let log = h.log.clone();
        let (loaded, _) =
            TxnCoordinator::load(*h.c.config(), COORDINATOR_EPOCH, log.clone()).unwrap();
        let unlogged: Vec<String> =
            h.c.iter()
                .filter(|m| loaded.get(&m.transactional_id).is_none())
                .map(|m| m.transactional_id.clone())
                .collect();
        for id in &unlogged {
            assert_eq!(h.data(id).producer_epoch, NO_PRODUCER_EPOCH, "{id}");
        }
        assert!(unlogged.is_empty(), "{unlogged:?}");
        assert_replays(&h.c, &log);
    }
    assert_eq!(
        states_seen.len(),
        6,
        "states reached: {states_seen:?} (seed {seed})"
    );
    assert!(timeout_aborts > 0, "no timeout abort (seed {seed})");
    assert!(expirations > 0, "no expiration (seed {seed})");
    assert!(fenced > 0, "nothing fenced (seed {seed})");
}

#[test]
fn random_requests_keep_the_invariants() {
    for seed in 1u64..=8 {
        random_requests(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 10, 3_000);
    }
}

#[test]
fn random_requests_without_failures_replay_from_the_log() {
    for seed in 1u64..=8 {
        random_requests(seed.wrapping_mul(0x2545_f491_4f6c_dd1d), 0, 3_000);
    }
}
