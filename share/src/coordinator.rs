//! The share coordinator's state (KIP-932), I/O-free: the persisted state of every share
//! partition whose key falls on one `__share_group_state` partition, as its records say.
//!
//! A share partition's key is Kafka's `group:topicId:partition`; the `__share_group_state`
//! partition that keeps it is the key's Java string hash modulo the topic's partition count, as
//! Kafka places it, and that partition's leader is the share coordinator for it
//! (FindCoordinator key type 2). Each write is a snapshot of the whole state (start offset and
//! the in-flight state batches), appended to that partition; a delete is a tombstone. A leader
//! that takes the partition over replays its log into a [`ShareCoordinator`], whose map then
//! answers reads. Writes are fenced as Kafka fences them: one from an older leader epoch of the
//! share partition than the state's gets FENCED_LEADER_EPOCH, one for an older state epoch
//! (before an offsets reset) FENCED_STATE_EPOCH.
//!
//! The shard drives it (`shard/share_state.rs`): replays the partition on leadership, appends
//! the records the checks here return, and applies them once the in-sync replicas have them.
//!
//! Record format (Sluice's own; the topic is internal and only Sluice reads it), big-endian:
//! key = version u8 (0), group id (u16 length + UTF-8), topic id (16 bytes), partition i32;
//! value = version u8 (0), state epoch i32, leader epoch i32, start offset i64, batch count i32,
//! then per batch first offset i64, last offset i64, state i8 (Kafka's delivery state values),
//! delivery count i16.

use std::collections::HashMap;

use super::partition::{RecordState, StateBatch};

/// The internal topic the share coordinators keep the share partitions' state on.
pub const SHARE_STATE_TOPIC: &str = "__share_group_state";

/// Kafka's error codes this state machine answers.
pub const FENCED_LEADER_EPOCH: i16 = 74;
pub const FENCED_STATE_EPOCH: i16 = 124;

const KEY_VERSION: u8 = 0;
const VALUE_VERSION: u8 = 0;
/// Batches one snapshot may carry: a share partition has at most
/// `group.share.partition.max.record.locks` records in flight (up to 10,000 in Kafka), each at
/// worst its own batch.
pub const SNAPSHOT_BATCHES_MAX: usize = 10_000;

/// One share partition: its group, topic and partition index.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SharePartitionKey {
    pub group_id: String,
    pub topic_id: uuid::Uuid,
    pub partition: i32,
}

impl SharePartitionKey {
    /// Kafka's coordinator key: `group:topicId:partition`, the topic id as Kafka prints ids
    /// (URL-safe base64 without padding).
    pub fn coordinator_key(&self) -> String {
        use base64::Engine;
        let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.topic_id.as_bytes());
        format!("{}:{id}:{}", self.group_id, self.partition)
    }

    /// The `__share_group_state` partition that keeps this share partition's state.
    pub fn state_partition(&self, partitions: i32) -> i32 {
        partition_for_key(&self.coordinator_key(), partitions)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + 2 + self.group_id.len() + 16 + 4);
        out.push(KEY_VERSION);
        out.extend_from_slice(&(self.group_id.len().min(u16::MAX as usize) as u16).to_be_bytes());
        out.extend_from_slice(
            &self.group_id.as_bytes()[..self.group_id.len().min(u16::MAX as usize)],
        );
        out.extend_from_slice(self.topic_id.as_bytes());
        out.extend_from_slice(&self.partition.to_be_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<SharePartitionKey, DecodeError> {
        let mut r = Reader(bytes);
        let version = r.u8()?;
        if version != KEY_VERSION {
            return Err(DecodeError::Version(version));
        }
        let len = r.u16()? as usize;
        let group_id = String::from_utf8(r.take(len)?.to_vec()).map_err(|_| DecodeError::Utf8)?;
        let topic_id = uuid::Uuid::from_slice(r.take(16)?).map_err(|_| DecodeError::Truncated)?;
        let partition = r.i32()?;
        r.end()?;
        Ok(SharePartitionKey {
            group_id,
            topic_id,
            partition,
        })
    }
}

/// The `__share_group_state` partition of a coordinator key, as Kafka places it: the key's
/// Java hash, made non-negative as Kafka's `Utils.abs` does, modulo the partition count.
pub fn partition_for_key(key: &str, partitions: i32) -> i32 {
    let h = java_string_hash(key);
    let abs = if h == i32::MIN { 0 } else { h.abs() };
    abs % partitions.max(1)
}

/// Java's `String.hashCode`, over UTF-16 code units.
fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)))
}

/// A share partition's persisted state (Kafka's ShareSnapshot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareState {
    /// Bumped when the state is reset (an offsets reset): writes made before it are fenced.
    pub state_epoch: i32,
    /// The share partition leader's epoch that wrote it: older leaders are fenced.
    pub leader_epoch: i32,
    pub start_offset: i64,
    pub batches: Vec<StateBatch>,
}

impl ShareState {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + 4 + 4 + 8 + 4 + self.batches.len() * 19);
        out.push(VALUE_VERSION);
        out.extend_from_slice(&self.state_epoch.to_be_bytes());
        out.extend_from_slice(&self.leader_epoch.to_be_bytes());
        out.extend_from_slice(&self.start_offset.to_be_bytes());
        out.extend_from_slice(&(self.batches.len() as i32).to_be_bytes());
        for b in &self.batches {
            out.extend_from_slice(&b.first_offset.to_be_bytes());
            out.extend_from_slice(&b.last_offset.to_be_bytes());
            out.push(b.state.wire() as u8);
            out.extend_from_slice(&(b.delivery_count.min(i16::MAX as u16) as i16).to_be_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<ShareState, DecodeError> {
        let mut r = Reader(bytes);
        let version = r.u8()?;
        if version != VALUE_VERSION {
            return Err(DecodeError::Version(version));
        }
        let state_epoch = r.i32()?;
        let leader_epoch = r.i32()?;
        let start_offset = r.i64()?;
        let count = usize::try_from(r.i32()?).map_err(|_| DecodeError::Truncated)?;
        if count > SNAPSHOT_BATCHES_MAX {
            return Err(DecodeError::TooManyBatches(count));
        }
        let mut batches = Vec::with_capacity(count);
        for _ in 0..count {
            let first_offset = r.i64()?;
            let last_offset = r.i64()?;
            let state = r.u8()? as i8;
            let state = RecordState::from_wire(state).ok_or(DecodeError::State(state))?;
            let delivery_count = r.i16()?.max(0) as u16;
            batches.push(StateBatch {
                first_offset,
                last_offset,
                state,
                delivery_count,
            });
        }
        r.end()?;
        Ok(ShareState {
            state_epoch,
            leader_epoch,
            start_offset,
            batches,
        })
    }
}

/// Why a record of `__share_group_state` does not decode (the partition's data is damaged or
/// written by a newer release).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    Truncated,
    Version(u8),
    Utf8,
    State(i8),
    TooManyBatches(usize),
    Trailing,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Truncated => write!(f, "truncated share state record"),
            DecodeError::Version(v) => {
                write!(
                    f,
                    "share state record version {v} is not known to this release"
                )
            }
            DecodeError::Utf8 => write!(f, "a group id that is not UTF-8"),
            DecodeError::State(s) => write!(f, "unknown delivery state {s}"),
            DecodeError::TooManyBatches(n) => {
                write!(f, "{n} state batches, more than a snapshot may hold")
            }
            DecodeError::Trailing => write!(f, "bytes after the record"),
        }
    }
}

impl std::error::Error for DecodeError {}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn i16(&mut self) -> Result<i16, DecodeError> {
        Ok(i16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn end(&self) -> Result<(), DecodeError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Trailing)
        }
    }
}

/// The state of the share partitions kept on one `__share_group_state` partition.
#[derive(Debug, Default)]
pub struct ShareCoordinator {
    states: HashMap<SharePartitionKey, ShareState>,
}

impl ShareCoordinator {
    /// Applies one record of the partition's log, in log order: a snapshot replaces the
    /// state, a tombstone (no value) deletes it.
    pub fn replay(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<(), DecodeError> {
        let key = SharePartitionKey::decode(key)?;
        match value {
            Some(v) => {
                self.apply(key, ShareState::decode(v)?);
            }
            None => {
                self.states.remove(&key);
            }
        }
        Ok(())
    }

    /// The state of `key`, if it was ever written and not deleted (ReadShareGroupState).
    pub fn read(&self, key: &SharePartitionKey) -> Option<&ShareState> {
        self.states.get(key)
    }

    /// Checks a write (WriteShareGroupState) against the state: the record to append, or the
    /// error that fences it. The state changes only once the record is durable ([`apply`]).
    ///
    /// [`apply`]: ShareCoordinator::apply
    pub fn check_write(
        &self,
        key: &SharePartitionKey,
        write: &ShareState,
    ) -> Result<(Vec<u8>, Vec<u8>), i16> {
        if let Some(current) = self.states.get(key) {
            if write.leader_epoch < current.leader_epoch {
                return Err(FENCED_LEADER_EPOCH);
            }
            if write.state_epoch < current.state_epoch {
                return Err(FENCED_STATE_EPOCH);
            }
        }
        Ok((key.encode(), write.encode()))
    }

    /// A record made durable: the state it carries (a replay does the same), unless the
    /// state is already newer (a reset or a newer leader's record got in between the check and
    /// the append of an older write). Whether it applied.
    pub fn apply(&mut self, key: SharePartitionKey, state: ShareState) -> bool {
        if let Some(current) = self.states.get(&key) {
            let older = (state.state_epoch, state.leader_epoch)
                < (current.state_epoch, current.leader_epoch);
            if older {
                return false;
            }
        }
        self.states.insert(key, state);
        true
    }

    /// InitializeShareGroupState and offset resets: a new state epoch at `start_offset`, with
    /// nothing in flight. The record to append.
    pub fn reset(&self, key: &SharePartitionKey, start_offset: i64) -> (Vec<u8>, ShareState) {
        let current = self.states.get(key);
        let state = ShareState {
            state_epoch: current.map_or(0, |s| s.state_epoch.saturating_add(1)),
            leader_epoch: current.map_or(-1, |s| s.leader_epoch),
            start_offset,
            batches: Vec::new(),
        };
        (state.encode(), state)
    }

    /// DeleteShareGroupState: forgets `key`. Its tombstone's key, to append.
    pub fn delete(&mut self, key: &SharePartitionKey) -> Vec<u8> {
        self.states.remove(key);
        key.encode()
    }

    pub fn len(&self) -> usize {
        self.states.len()
    }

    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(group: &str, partition: i32) -> SharePartitionKey {
        SharePartitionKey {
            group_id: group.into(),
            topic_id: uuid::Uuid::from_u128(0x1234_5678_9abc_def0_1122_3344_5566_7788),
            partition,
        }
    }

    fn state(state_epoch: i32, leader_epoch: i32, start_offset: i64) -> ShareState {
        ShareState {
            state_epoch,
            leader_epoch,
            start_offset,
            batches: vec![
                StateBatch {
                    first_offset: start_offset,
                    last_offset: start_offset + 4,
                    state: RecordState::Available,
                    delivery_count: 2,
                },
                StateBatch {
                    first_offset: start_offset + 5,
                    last_offset: start_offset + 5,
                    state: RecordState::Archived,
                    delivery_count: 5,
                },
            ],
        }
    }

    #[test]
    fn keys_and_states_round_trip_and_damage_is_refused() {
        let k = key("orders", 3);
        assert_eq!(SharePartitionKey::decode(&k.encode()), Ok(k.clone()));
        let s = state(2, 7, 100);
        assert_eq!(ShareState::decode(&s.encode()), Ok(s.clone()));
        let bytes = s.encode();
        assert_eq!(
            ShareState::decode(&bytes[..bytes.len() - 1]),
            Err(DecodeError::Truncated)
        );
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(ShareState::decode(&longer), Err(DecodeError::Trailing));
        let mut newer = bytes;
        newer[0] = 9;
        assert_eq!(ShareState::decode(&newer), Err(DecodeError::Version(9)));
    }

    #[test]
    fn the_coordinator_key_and_its_partition_follow_kafka() {
        let k = key("g", 0);
        assert_eq!(k.coordinator_key(), "g:EjRWeJq83vARIjNEVWZ3iA:0");
        // Java: "g:EjRWeJq83vARIjNEVWZ3iA:0".hashCode(), by the same formula.
        let p = k.state_partition(50);
        assert!((0..50).contains(&p));
        assert_eq!(java_string_hash("a"), 97);
        assert_eq!(java_string_hash("ab"), 97 * 31 + 98);
    }

    #[test]
    fn writes_from_an_older_leader_or_state_epoch_are_fenced() {
        let mut c = ShareCoordinator::default();
        let k = key("g", 0);
        let (_, v) = c.check_write(&k, &state(1, 5, 10)).expect("a first write");
        c.apply(k.clone(), ShareState::decode(&v).expect("decodes"));
        assert_eq!(
            c.check_write(&k, &state(1, 4, 20)),
            Err(FENCED_LEADER_EPOCH)
        );
        assert_eq!(c.check_write(&k, &state(0, 5, 20)), Err(FENCED_STATE_EPOCH));
        assert!(c.check_write(&k, &state(1, 6, 20)).is_ok());
        let (_, reset) = c.reset(&k, 0);
        assert_eq!(reset.state_epoch, 2);
        c.apply(k.clone(), reset);
        assert_eq!(c.check_write(&k, &state(1, 6, 20)), Err(FENCED_STATE_EPOCH));
    }

    #[test]
    fn a_replayed_log_rebuilds_the_state_and_tombstones_delete() {
        let mut log: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        let mut live = ShareCoordinator::default();
        for (i, (group, partition)) in [("a", 0), ("b", 1), ("a", 0), ("c", 2)].iter().enumerate() {
            let k = key(group, *partition);
            let s = state(0, i as i32, 10 * i as i64);
            let (kb, vb) = live.check_write(&k, &s).expect("not fenced");
            live.apply(k, s);
            log.push((kb, Some(vb)));
        }
        let gone = key("b", 1);
        log.push((live.delete(&gone), None));
        let mut replayed = ShareCoordinator::default();
        for (k, v) in &log {
            replayed.replay(k, v.as_deref()).expect("replays");
        }
        assert_eq!(replayed.len(), 2);
        assert_eq!(replayed.read(&gone), None);
        assert_eq!(replayed.read(&key("a", 0)), live.read(&key("a", 0)));
        assert_eq!(
            replayed.read(&key("a", 0)).map(|s| s.start_offset),
            Some(20)
        );
        assert_eq!(replayed.read(&key("c", 2)), live.read(&key("c", 2)));
    }
}
