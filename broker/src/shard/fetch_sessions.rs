//! Fetch sessions (KIP-227) of one shard: the partitions each client fetches, in the order they
//! are read and answered, with what it was last told about each, so that an incremental
//! response carries only the partitions that changed. I/O-free; the fetch handler drives them.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use indexmap::IndexMap;
use kafka_protocol::ResponseError;

use super::read::{ReadResult, Work};

/// One partition a fetch asks for.
#[derive(Clone, Debug)]
pub struct Wanted {
    pub topic: Arc<str>,
    pub topic_id: uuid::Uuid,
    pub partition: i32,
    pub offset: i64,
    pub max_bytes: i32,
    /// The leader epoch the client expects (-1: none).
    pub current_leader_epoch: i32,
    /// A follower's epoch of its last fetched batch (-1: none; KIP-320).
    pub last_fetched_epoch: i32,
}

/// Fetch sessions (KIP-227) open on one shard; a client keeps its session on one connection,
/// so a session lives on the shard that accepted it.
pub const FETCH_SESSIONS_PER_SHARD_MAX: usize = 1000;

/// What the offsets of a partition were when the session last answered for it, before it ever
/// did: never a real offset, so the first answer always counts as news.
const OFFSET_NEVER_SENT: i64 = -2;

type SessionKey = (Arc<str>, i32);

/// A partition in a session: what the client last asked for it and was last told about it.
struct SessionPartition {
    wanted: Wanted,
    high_watermark: i64,
    last_stable_offset: i64,
    log_start_offset: i64,
    /// Returned records in the response being built: moves to the back of the session.
    served: bool,
}

impl SessionPartition {
    fn new(wanted: Wanted) -> SessionPartition {
        SessionPartition {
            wanted,
            high_watermark: OFFSET_NEVER_SENT,
            last_stable_offset: OFFSET_NEVER_SENT,
            log_start_offset: OFFSET_NEVER_SENT,
            served: false,
        }
    }
}

/// A fetch session: the partitions a client fetches, in the order they are read and answered,
/// with what it was last told about each, so an incremental response carries only partitions
/// that changed.
pub struct FetchSession {
    next_epoch: i32,
    partitions: IndexMap<SessionKey, SessionPartition>,
    last_used: Instant,
}

#[derive(Default)]
pub struct FetchSessions {
    sessions: std::collections::HashMap<i32, FetchSession>,
}

/// A fetch after `FetchSessions::apply`: the partitions to read, in order, the session id to
/// answer with (0 for none) and whether the response is incremental.
#[derive(Debug)]
pub struct Applied {
    pub wanted: Vec<Wanted>,
    pub session_id: i32,
    pub incremental: bool,
}

impl FetchSessions {
    fn create(&mut self, partitions: &[Wanted], work: &mut Work) -> i32 {
        if self.sessions.len() >= FETCH_SESSIONS_PER_SHARD_MAX {
            let oldest = self
                .sessions
                .iter()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(&id, _)| id);
            if let Some(id) = oldest {
                self.sessions.remove(&id);
            }
        }
        let mut id = (uuid::Uuid::new_v4().as_u128() as i32) & 0x7fff_ffff;
        while id == 0 || self.sessions.contains_key(&id) {
            id = (uuid::Uuid::new_v4().as_u128() as i32) & 0x7fff_ffff;
        }
        let mut map = IndexMap::with_capacity(partitions.len());
        for w in partitions {
            // A partition named twice keeps its first place and its last request, as an
            // incremental update of it would.
            match map.get_mut(&(w.topic.clone(), w.partition)) {
                Some(SessionPartition { wanted, .. }) => *wanted = w.clone(),
                None => {
                    map.insert(
                        (w.topic.clone(), w.partition),
                        SessionPartition::new(w.clone()),
                    );
                }
            }
        }
        work.add(partitions.len());
        self.sessions.insert(
            id,
            FetchSession {
                next_epoch: 1,
                partitions: map,
                last_used: Instant::now(),
            },
        );
        id
    }

    /// What the request does to the sessions: sessionless, a new full session, or an
    /// incremental step in an existing one (`forgotten` partitions leave it first, then
    /// `wanted` ones are updated in place or join at the back). Errors are top-level codes.
    pub fn apply(
        &mut self,
        session_id: i32,
        epoch: i32,
        version: i16,
        wanted: Vec<Wanted>,
        forgotten: &[(Arc<str>, i32)],
        work: &mut Work,
    ) -> Result<Applied, i16> {
        const FINAL_EPOCH: i32 = -1;
        if version < 7 || epoch == FINAL_EPOCH {
            if session_id > 0 {
                self.sessions.remove(&session_id);
            }
            return Ok(Applied {
                wanted,
                session_id: 0,
                incremental: false,
            });
        }
        if epoch == 0 {
            if session_id > 0 {
                self.sessions.remove(&session_id);
            }
            let new_id = self.create(&wanted, work);
            return Ok(Applied {
                wanted,
                session_id: new_id,
                incremental: false,
            });
        }
        let Some(session) = self.sessions.get_mut(&session_id) else {
            return Err(ResponseError::FetchSessionIdNotFound.code());
        };
        if session.next_epoch != epoch {
            return Err(ResponseError::InvalidFetchSessionEpoch.code());
        }
        session.next_epoch = if epoch == i32::MAX { 1 } else { epoch + 1 };
        session.last_used = Instant::now();
        if !forgotten.is_empty() {
            // One pass however many partitions are forgotten (`shift_remove` of each would shift
            // the whole map each time).
            let gone: HashSet<&SessionKey> = forgotten.iter().collect();
            session.partitions.retain(|key, _| !gone.contains(key));
            work.add(forgotten.len() + session.partitions.len());
        }
        work.add(wanted.len());
        for w in wanted {
            match session.partitions.get_mut(&(w.topic.clone(), w.partition)) {
                Some(p) => p.wanted = w,
                None => {
                    session
                        .partitions
                        .insert((w.topic.clone(), w.partition), SessionPartition::new(w));
                }
            }
        }
        work.add(session.partitions.len());
        Ok(Applied {
            wanted: session
                .partitions
                .values()
                .map(|p| p.wanted.clone())
                .collect(),
            session_id,
            incremental: true,
        })
    }

    /// Records what the response tells the client about each of `wanted` (read as `results`),
    /// and returns which partitions it carries: all of them unless `incremental`, else those
    /// with news. Partitions that returned records move to the back of the session, as in Kafka:
    /// when a response fills up, the next one starts with the partitions left out.
    pub fn record(
        &mut self,
        session_id: i32,
        wanted: &[Wanted],
        results: &[ReadResult],
        incremental: bool,
        work: &mut Work,
    ) -> Vec<bool> {
        let mut keep = vec![true; wanted.len()];
        // Gone meanwhile (evicted while this fetch waited): answered as a full response.
        let Some(session) = self.sessions.get_mut(&session_id) else {
            return keep;
        };
        let mut served = 0usize;
        for ((w, f), keep) in wanted.iter().zip(results).zip(keep.iter_mut()) {
            // Looked up again by key: the session may have changed while the fetch waited.
            let Some(p) = session.partitions.get_mut(&(w.topic.clone(), w.partition)) else {
                continue;
            };
            let changed = !f.records.is_empty()
                || f.error_code != 0
                || f.preferred_read_replica >= 0
                || p.high_watermark != f.high_watermark
                || p.last_stable_offset != f.last_stable_offset
                || p.log_start_offset != f.log_start_offset;
            *keep = !incremental || changed;
            p.high_watermark = f.high_watermark;
            p.last_stable_offset = f.last_stable_offset;
            p.log_start_offset = f.log_start_offset;
            if !f.records.is_empty() {
                p.served = true;
                served += 1;
            }
        }
        work.add(wanted.len());
        if served > 0 {
            // One stable partition of the whole map: served partitions after the others, each
            // group in its order.
            let all = std::mem::take(&mut session.partitions);
            let mut back = Vec::with_capacity(served);
            let mut front = IndexMap::with_capacity(all.len());
            for (key, p) in all {
                if p.served {
                    back.push((key, p));
                } else {
                    front.insert(key, p);
                }
            }
            for (key, mut p) in back {
                p.served = false;
                front.insert(key, p);
            }
            work.add(front.len());
            session.partitions = front;
        }
        keep
    }

    /// The session's partitions in order (tests).
    #[cfg(test)]
    pub(crate) fn order(&self, session_id: i32) -> Vec<(String, i32)> {
        self.sessions[&session_id]
            .partitions
            .keys()
            .map(|(t, p)| (t.to_string(), *p))
            .collect()
    }
}
