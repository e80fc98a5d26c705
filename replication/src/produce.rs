//! A leader's side of a produce for one partition (Kafka's `Partition.appendRecordsToLeader`
//! and `DelayedProduce`): whether the replica may take the batch, the append, what a refused
//! append answers, and when an acks=all produce is answered. The broker's produce handler and
//! the simulator's leaders both run these, so a seed of the simulator exercises the decisions
//! the broker makes; around them the broker adds only what needs the network (KIP-890's
//! verification with the transaction coordinator) and the waiting.
//!
//! In order: the replica must lead ([`leader_epoch`]); a control batch is the transaction
//! coordinator's to write ([`check_batch`]); acks=all is refused with NOT_ENOUGH_REPLICAS while
//! the ISR is below `min.insync.replicas` ([`admit`], which also gives the leader epoch the
//! batch is stamped with); the log appends it ([`append`]) or refuses it ([`Refusal::of`]);
//! an acks=all produce is then answered once the high watermark passed it, or with the error
//! that ended the wait ([`acks_all_answer`]).

use bytes::BytesMut;
use sluice_engine::batch::BatchHeader;
use sluice_engine::{AppendInfo, BatchError, LeaderEpoch as LogEpoch, Log, LogError, Storage};

use crate::error_code::{self, of_log_error};
use crate::replica::ReplicaRole;

/// Kafka's `acks` value for "every in-sync replica".
pub const ACKS_ALL: i16 = -1;

/// Kafka's cap on the record errors its partition error message spells out.
const RECORD_ERRORS_IN_MESSAGE_MAX: usize = 3;

/// Why a produce was not appended, as the partition's part of the Produce response says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub error_code: i16,
    pub message: Option<String>,
    /// The records that made the batch be refused (KIP-467): batch index and message.
    pub record_errors: Vec<(i32, String)>,
    /// The partition's log start offset, for the errors Kafka reports it with.
    pub log_start_offset: Option<i64>,
}

impl Refusal {
    pub fn new(error_code: i16, message: Option<String>) -> Refusal {
        Refusal {
            error_code,
            message,
            record_errors: Vec::new(),
            log_start_offset: None,
        }
    }

    /// The refusal of an append the log refused with `error`, on `topic`-`partition` whose log
    /// starts at `log_start_offset`: Kafka's error code, the records at fault worded as Kafka's
    /// `LogValidator` words them, and the log start offset where Kafka reports it.
    pub fn of(error: &LogError, topic: &str, partition: i32, log_start_offset: i64) -> Refusal {
        let error_code = of_log_error(error);
        let mut refusal = match record_errors(error, topic, partition) {
            Some((records, message)) => Refusal {
                record_errors: records,
                ..Refusal::new(error_code, Some(message))
            },
            None => Refusal::new(error_code, Some(error.to_string())),
        };
        if reports_log_start_offset(error_code) {
            refusal.log_start_offset = Some(log_start_offset);
        }
        refusal
    }
}

/// Whether Kafka's Produce answer for a refusal with `error_code` carries the partition's log
/// start offset. Kafka leaves it at -1 for a missing partition, a too large or corrupt batch
/// and a storage error, and reports it for every other refusal (records refused by
/// validation, producer state errors).
pub fn reports_log_start_offset(error_code: i16) -> bool {
    ![
        error_code::MESSAGE_TOO_LARGE,
        error_code::CORRUPT_MESSAGE,
        error_code::KAFKA_STORAGE_ERROR,
        error_code::NOT_LEADER_OR_FOLLOWER,
        error_code::UNKNOWN_TOPIC_OR_PARTITION,
    ]
    .contains(&error_code)
}

/// The per-record errors of `error` (KIP-467) and the partition's message that sums them up;
/// `None` when the error is about the batch as a whole.
fn record_errors(
    error: &LogError,
    topic: &str,
    partition: i32,
) -> Option<(Vec<(i32, String)>, String)> {
    let LogError::InvalidBatch(BatchError::MissingKey { batch_indexes }) = error else {
        return None;
    };
    let records: Vec<(i32, String)> = batch_indexes
        .iter()
        .map(|&index| {
            (
                index,
                format!(
                    "Compacted topic cannot accept message without key in topic partition \
                     {topic}-{partition}"
                ),
            )
        })
        .collect();
    // Java's `List.toString` of Kafka's `RecordError`s.
    let shown: Vec<String> = records
        .iter()
        .take(RECORD_ERRORS_IN_MESSAGE_MAX)
        .map(|(index, message)| format!("RecordError(batchIndex={index}, message='{message}')"))
        .collect();
    let message = format!(
        "One or more records have been rejected due to {} record errors in total, and only \
         showing the first three errors at most: [{}]",
        records.len(),
        shown.join(", ")
    );
    Some((records, message))
}

/// The leader epoch this replica leads at, or NOT_LEADER_OR_FOLLOWER.
pub fn leader_epoch(role: &ReplicaRole) -> Result<LogEpoch, Refusal> {
    match role {
        ReplicaRole::Leader(l) => Ok(LogEpoch(l.leader_epoch.0)),
        _ => Err(Refusal::new(error_code::NOT_LEADER_OR_FOLLOWER, None)),
    }
}

/// Refuses a batch no client may write: a control batch (markers are the transaction
/// coordinator's, written with WriteTxnMarkers, as in Kafka).
pub fn check_batch(header: Option<&BatchHeader<'_>>) -> Result<(), Refusal> {
    if header.is_some_and(|h| h.is_control()) {
        return Err(Refusal::new(
            error_code::INVALID_RECORD,
            Some("Clients are not allowed to write control records".into()),
        ));
    }
    Ok(())
}

/// Whether the leader takes a produce with `acks` now, and the leader epoch its batch is
/// stamped with: NOT_LEADER_OR_FOLLOWER off a leader, NOT_ENOUGH_REPLICAS for acks=all while
/// the committed ISR is below `min.insync.replicas` (checked before the append, as Kafka does).
pub fn admit(role: &ReplicaRole, acks: i16) -> Result<LogEpoch, Refusal> {
    let epoch = leader_epoch(role)?;
    if let (ReplicaRole::Leader(l), ACKS_ALL) = (role, acks) {
        l.check_acks_all().map_err(|code| {
            Refusal::new(
                code,
                Some("the in-sync replicas are fewer than min.insync.replicas".into()),
            )
        })?;
    }
    Ok(epoch)
}

/// Appends `records` on the leader's log at `epoch`: the log stamps offsets into its own copy.
/// `in_order` runs once the batch holds its place in the log's append order (or is refused),
/// `buffered` once it is readable, before it is durable; the future ends when it is as durable
/// as the topic's `flush.mode` says.
pub async fn append<S: Storage>(
    log: &Log<S>,
    records: &[u8],
    epoch: LogEpoch,
    in_order: impl FnOnce(),
    buffered: impl FnOnce(),
) -> Result<AppendInfo, LogError> {
    log.append_signalling(BytesMut::from(records), epoch, in_order, buffered)
        .await
}

/// The answer to an acks=all produce appended at leader epoch `epoch` whose records end at
/// `end_offset` (exclusive), or `None` while it waits: 0 once the high watermark passed it with
/// enough replicas in the ISR, NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR shrank below the
/// minimum meanwhile, NOT_LEADER_OR_FOLLOWER once the leadership it was appended under ended
/// (even if this replica leads again at a later epoch: its records may have been truncated
/// away and the offsets taken by others), REQUEST_TIMED_OUT once the produce's `timeout_ms`
/// passed (`timed_out`).
pub fn acks_all_answer(
    role: &ReplicaRole,
    epoch: LogEpoch,
    end_offset: i64,
    timed_out: bool,
) -> Option<i16> {
    let answer = match role {
        ReplicaRole::Leader(l) if l.leader_epoch.0 == epoch.0 => l.acks_all_done(end_offset),
        _ => Some(error_code::NOT_LEADER_OR_FOLLOWER),
    };
    match answer {
        None if timed_out => Some(error_code::REQUEST_TIMED_OUT),
        answer => answer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{BrokerId, LeaderEpoch, PartitionEpoch};
    use crate::replica::{Follower, ReplicaConfig, RoleUpdate};

    const ME: BrokerId = BrokerId(1);

    fn leader(isr: &[BrokerId], min_insync_replicas: usize) -> ReplicaRole {
        let mut role = ReplicaRole::Unknown;
        let replicas = [BrokerId(1), BrokerId(2), BrokerId(3)];
        role.update(
            RoleUpdate {
                me: ME,
                leader: ME,
                leader_epoch: LeaderEpoch(4),
                partition_epoch: PartitionEpoch(7),
                replicas: &replicas,
                isr,
                config: ReplicaConfig {
                    min_insync_replicas,
                    ..ReplicaConfig::default()
                },
            },
            10,
            0,
            0,
        );
        role
    }

    #[test]
    fn only_a_leader_takes_a_produce_at_its_epoch() {
        let follower = ReplicaRole::Follower(Follower {
            leader: BrokerId(2),
            leader_epoch: LeaderEpoch(4),
            high_watermark: 3,
        });
        for role in [ReplicaRole::Unknown, follower] {
            assert_eq!(
                admit(&role, 1).unwrap_err().error_code,
                error_code::NOT_LEADER_OR_FOLLOWER
            );
        }
        let l = leader(&[BrokerId(1), BrokerId(2), BrokerId(3)], 2);
        assert_eq!(admit(&l, 1), Ok(LogEpoch(4)));
        assert_eq!(admit(&l, ACKS_ALL), Ok(LogEpoch(4)));
    }

    #[test]
    fn acks_all_needs_min_insync_replicas_before_the_append() {
        let l = leader(&[BrokerId(1)], 2);
        assert_eq!(
            admit(&l, 1),
            Ok(LogEpoch(4)),
            "acks=1 does not look at the ISR"
        );
        assert_eq!(admit(&l, 0), Ok(LogEpoch(4)));
        let refused = admit(&l, ACKS_ALL).unwrap_err();
        assert_eq!(refused.error_code, error_code::NOT_ENOUGH_REPLICAS);
        assert_eq!(refused.log_start_offset, None);
    }

    #[test]
    fn acks_all_is_answered_by_the_high_watermark_the_isr_or_the_clock() {
        let l = leader(&[BrokerId(1), BrokerId(2)], 2);
        let at = LogEpoch(4);
        let hw = l.known_high_watermark();
        assert_eq!(acks_all_answer(&l, at, hw + 1, false), None);
        assert_eq!(
            acks_all_answer(&l, at, hw + 1, true),
            Some(error_code::REQUEST_TIMED_OUT)
        );
        assert_eq!(acks_all_answer(&l, at, hw, false), Some(error_code::NONE));
        // Passed by the high watermark, but the ISR is below the minimum now.
        let shrunk = leader(&[BrokerId(1)], 2);
        assert_eq!(
            acks_all_answer(&shrunk, at, shrunk.known_high_watermark(), true),
            Some(error_code::NOT_ENOUGH_REPLICAS_AFTER_APPEND)
        );
        assert_eq!(
            acks_all_answer(&ReplicaRole::Unknown, at, 0, false),
            Some(error_code::NOT_LEADER_OR_FOLLOWER)
        );
    }

    #[test]
    fn acks_all_is_answered_only_by_the_leadership_it_was_appended_under() {
        // Appended at epoch 3; the replica lost the leadership and leads again at 4. The high
        // watermark at 4 says nothing of records a new leader may have truncated meanwhile.
        let l = leader(&[BrokerId(1), BrokerId(2)], 2);
        let hw = l.known_high_watermark();
        assert_eq!(
            acks_all_answer(&l, LogEpoch(4), hw, false),
            Some(error_code::NONE)
        );
        assert_eq!(
            acks_all_answer(&l, LogEpoch(3), hw, false),
            Some(error_code::NOT_LEADER_OR_FOLLOWER)
        );
        let mut following = ReplicaRole::Unknown;
        following.update(
            RoleUpdate {
                me: ME,
                leader: BrokerId(2),
                leader_epoch: LeaderEpoch(5),
                partition_epoch: PartitionEpoch(8),
                replicas: &[BrokerId(1), BrokerId(2), BrokerId(3)],
                isr: &[BrokerId(1), BrokerId(2)],
                config: ReplicaConfig::default(),
            },
            10,
            0,
            0,
        );
        assert!(matches!(following, ReplicaRole::Follower(Follower { .. })));
        assert_eq!(
            acks_all_answer(&following, LogEpoch(4), 0, false),
            Some(error_code::NOT_LEADER_OR_FOLLOWER)
        );
    }

    #[test]
    fn refusals_say_what_kafka_says() {
        let missing = LogError::InvalidBatch(BatchError::MissingKey {
            batch_indexes: vec![0, 2, 3, 5],
        });
        let r = Refusal::of(&missing, "t", 1, 17);
        assert_eq!(r.error_code, error_code::INVALID_RECORD);
        assert_eq!(r.log_start_offset, Some(17));
        assert_eq!(
            r.record_errors.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [0, 2, 3, 5]
        );
        let message = r.message.unwrap();
        assert!(message.contains("due to 4 record errors"), "{message}");
        assert_eq!(message.matches("RecordError(").count(), 3, "{message}");
        let closed = Refusal::of(&LogError::Closed, "t", 1, 17);
        assert_eq!(closed.error_code, error_code::NOT_LEADER_OR_FOLLOWER);
        assert_eq!(closed.log_start_offset, None);
        assert!(closed.record_errors.is_empty());
    }

    #[test]
    fn keyless_records_become_kafkas_record_errors() {
        let error = LogError::InvalidBatch(BatchError::MissingKey {
            batch_indexes: vec![0, 2, 3, 9],
        });
        assert_eq!(of_log_error(&error), error_code::INVALID_RECORD);
        let (records, message) = record_errors(&error, "orders", 4).unwrap();
        assert_eq!(
            records.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            vec![0, 2, 3, 9]
        );
        let one = "Compacted topic cannot accept message without key in topic partition orders-4";
        assert!(records.iter().all(|(_, m)| m == one));
        assert_eq!(
            message,
            format!(
                "One or more records have been rejected due to 4 record errors in total, and \
                 only showing the first three errors at most: [RecordError(batchIndex=0, \
                 message='{one}'), RecordError(batchIndex=2, message='{one}'), \
                 RecordError(batchIndex=3, message='{one}')]"
            )
        );
        let whole = LogError::InvalidBatch(BatchError::TooLarge { size: 9, max: 1 });
        assert_eq!(record_errors(&whole, "orders", 4), None);
    }

    #[test]
    fn control_batches_are_refused() {
        let marker =
            sluice_engine::batch::control_batch(5, 0, true, 0, sluice_engine::Timestamp(0));
        let header = BatchHeader::parse(&marker).unwrap();
        assert_eq!(
            check_batch(Some(&header)).unwrap_err().error_code,
            error_code::INVALID_RECORD
        );
        assert_eq!(check_batch(None), Ok(()));
    }
}
