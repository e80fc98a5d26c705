//! A follower's side of partition replication: what it does with its leader's answer for one
//! partition (Kafka's `AbstractFetcherThread.processFetchRequest`). The broker's replica fetcher
//! and the simulator's followers both call [`apply`] on their own logs, so a seed of the
//! simulator exercises the code the broker runs; the fetcher only sends the fetches, makes the
//! appended records durable and paces itself by the [`Applied`] it gets back.
//!
//! In order: OFFSET_OUT_OF_RANGE starts the log over at the leader's start or truncates it back
//! to the leader's high watermark ([`start_over`]); another error is the leader refusing the
//! partition; a diverging epoch (KIP-320) truncates to where both logs agree
//! ([`truncation_offset`]); otherwise the whole batches are appended as the leader stored them.
//! A batch that does not start at the log end stops the append: this fetcher asked from the
//! log end, so the log changed under it, and skipping the batch could keep records the leader
//! does not have under the ones it does. It fetches again from the end.

use bytes::{Bytes, BytesMut};
use sluice_engine::{LeaderEpoch as LogEpoch, Log, LogError, Offset, Storage};

use crate::error_code::{self, OFFSET_OUT_OF_RANGE};
use crate::records::LeaderEpoch;
use crate::replica::{start_over, truncation_offset, StartOver};

/// The leader's answer for one partition of a follower's fetch.
#[derive(Clone, Debug, Default)]
pub struct FetchedPartition {
    pub error_code: i16,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    /// KIP-320: the leader's (epoch, end offset) where this follower's log diverged.
    pub diverging: Option<(LeaderEpoch, i64)>,
    /// Whole record batches, as the leader stored them.
    pub batches: Vec<Bytes>,
}

/// What [`apply`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// Records appended, not yet durable; the leader's high watermark is to be taken.
    Appended,
    /// Nothing new; the leader's high watermark is to be taken.
    Nothing,
    /// A batch started below the log end: the records before it (if `appended`) are in; the
    /// rest is fetched again from the end.
    StoppedBelowLogEnd { appended: bool, base_offset: i64 },
    /// The log diverged from the leader's and was truncated to `to`.
    Truncated { to: i64 },
    /// The log was behind the leader's start: it starts over there, empty.
    StartedOver { at: i64 },
    /// The log ran past the leader's high watermark: truncated back to it.
    TruncatedToHighWatermark { to: i64 },
    /// OFFSET_OUT_OF_RANGE with nothing this follower can do yet: fetch again later.
    Retry,
    /// The leader refused the partition with this error code: fetch again later.
    Refused(i16),
}

impl Applied {
    /// Whether the answer's high watermark is the follower's now (the answer carried records,
    /// or none, for this log as it is).
    pub fn takes_high_watermark(self) -> bool {
        matches!(
            self,
            Applied::Appended | Applied::Nothing | Applied::StoppedBelowLogEnd { .. }
        )
    }

    /// Whether the log took records that must be made durable before the next fetch.
    pub fn appended(self) -> bool {
        matches!(
            self,
            Applied::Appended | Applied::StoppedBelowLogEnd { appended: true, .. }
        )
    }
}

/// Applies `answer` to the follower's `log`. Errors are the log's (a failed write or
/// truncation); the caller treats them as a failed disk.
pub async fn apply<S: Storage>(
    log: &Log<S>,
    answer: FetchedPartition,
) -> Result<Applied, LogError> {
    let end = log.log_end_offset().0;
    if answer.error_code == OFFSET_OUT_OF_RANGE {
        return Ok(
            match start_over(end, answer.log_start_offset, answer.high_watermark) {
                StartOver::At(at) => {
                    log.truncate_fully_and_start_at(Offset(at)).await?;
                    Applied::StartedOver { at }
                }
                StartOver::TruncateTo(to) => {
                    log.truncate_to(Offset(to)).await?;
                    Applied::TruncatedToHighWatermark { to }
                }
                StartOver::Retry => Applied::Retry,
            },
        );
    }
    if answer.error_code != error_code::NONE {
        return Ok(Applied::Refused(answer.error_code));
    }
    if let Some((epoch, leader_end)) = answer.diverging {
        let epochs: Vec<(LeaderEpoch, i64)> = log
            .leader_epochs()
            .into_iter()
            .map(|(e, o): (LogEpoch, Offset)| (LeaderEpoch(e.0), o.0))
            .collect();
        let to = truncation_offset(&epochs, end, epoch, leader_end).max(log.log_start_offset().0);
        log.truncate_to(Offset(to)).await?;
        return Ok(Applied::Truncated { to });
    }
    let mut appended = false;
    for batch in answer.batches {
        match log.append_as_follower(BytesMut::from(&batch[..])).await {
            Ok(_) => appended = true,
            Err(LogError::UnexpectedAppendOffset { base_offset, .. }) => {
                return Ok(Applied::StoppedBelowLogEnd {
                    appended,
                    base_offset: base_offset.0,
                });
            }
            Err(e) => return Err(e),
        }
    }
    Ok(if appended {
        Applied::Appended
    } else {
        Applied::Nothing
    })
}
