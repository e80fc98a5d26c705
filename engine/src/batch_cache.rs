//! A per-shard cache of recently written and read batches, bounded in bytes.
//!
//! Tail fetches are served from here without touching the device. One cache serves every log on
//! a shard; each log registers for an id. Eviction is least-recently-used across all logs. The
//! cache only ever holds batches exactly as they are in the log, so a hit needs no checks; logs
//! drop their entries when they truncate, delete or compact.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use bytes::Bytes;

use crate::types::Offset;

struct Entry {
    last_offset: Offset,
    bytes: Bytes,
    seq: u64,
}

#[derive(Default)]
struct Inner {
    max_bytes: u64,
    bytes: u64,
    next_log_id: u64,
    next_seq: u64,
    logs: HashMap<u64, BTreeMap<Offset, Entry>>,
    lru: BTreeMap<u64, (u64, Offset)>,
    hits: u64,
    misses: u64,
    evictions: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheStats {
    pub bytes: u64,
    pub max_bytes: u64,
    pub entries: usize,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

pub struct BatchCache {
    inner: RefCell<Inner>,
}

impl BatchCache {
    pub fn new(max_bytes: u64) -> Rc<BatchCache> {
        Rc::new(BatchCache {
            inner: RefCell::new(Inner {
                max_bytes,
                ..Inner::default()
            }),
        })
    }

    pub fn register_log(&self) -> u64 {
        let mut inner = self.inner.borrow_mut();
        inner.next_log_id += 1;
        let id = inner.next_log_id;
        inner.logs.insert(id, BTreeMap::new());
        id
    }

    pub fn unregister_log(&self, log: u64) {
        self.remove_matching(log, |_, _| true);
        self.inner.borrow_mut().logs.remove(&log);
    }

    /// Shrinks or grows the budget; shrinking evicts at once (memory pressure).
    pub fn set_max_bytes(&self, max_bytes: u64) {
        let mut inner = self.inner.borrow_mut();
        inner.max_bytes = max_bytes;
        inner.evict();
    }

    pub fn insert(&self, log: u64, base_offset: Offset, last_offset: Offset, bytes: Bytes) {
        let mut inner = self.inner.borrow_mut();
        let len = bytes.len() as u64;
        if len > inner.max_bytes / 4 {
            // One batch must not flush the whole cache.
            return;
        }
        inner.next_seq += 1;
        let seq = inner.next_seq;
        let Some(entries) = inner.logs.get_mut(&log) else {
            return;
        };
        let old = entries.insert(
            base_offset,
            Entry {
                last_offset,
                bytes,
                seq,
            },
        );
        if let Some(old) = old {
            inner.lru.remove(&old.seq);
            inner.bytes -= old.bytes.len() as u64;
        }
        inner.lru.insert(seq, (log, base_offset));
        inner.bytes += len;
        inner.evict();
    }

    /// The cached batch that holds `offset`, if any.
    pub fn get(&self, log: u64, offset: Offset) -> Option<(Offset, Offset, Bytes)> {
        let mut inner = self.inner.borrow_mut();
        inner.next_seq += 1;
        let seq = inner.next_seq;
        let found = inner.logs.get_mut(&log).and_then(|entries| {
            let (&base, entry) = entries.range_mut(..=offset).next_back()?;
            if entry.last_offset < offset {
                return None;
            }
            let old_seq = entry.seq;
            entry.seq = seq;
            Some((base, entry.last_offset, entry.bytes.clone(), old_seq))
        });
        match found {
            Some((base, last, bytes, old_seq)) => {
                inner.lru.remove(&old_seq);
                inner.lru.insert(seq, (log, base));
                inner.hits += 1;
                Some((base, last, bytes))
            }
            None => {
                inner.misses += 1;
                None
            }
        }
    }

    /// Drops batches that end at or after `offset` (the log was truncated there).
    pub fn remove_from(&self, log: u64, offset: Offset) {
        self.remove_matching(log, |_, last| last >= offset);
    }

    /// Drops batches that end before `offset` (the log start moved there).
    pub fn remove_before(&self, log: u64, offset: Offset) {
        self.remove_matching(log, |_, last| last < offset);
    }

    pub fn clear_log(&self, log: u64) {
        self.remove_matching(log, |_, _| true);
    }

    fn remove_matching(&self, log: u64, pred: impl Fn(Offset, Offset) -> bool) {
        let mut inner = self.inner.borrow_mut();
        let Inner {
            logs, lru, bytes, ..
        } = &mut *inner;
        if let Some(entries) = logs.get_mut(&log) {
            entries.retain(|&base, e| {
                if pred(base, e.last_offset) {
                    lru.remove(&e.seq);
                    *bytes -= e.bytes.len() as u64;
                    false
                } else {
                    true
                }
            });
        }
    }

    pub fn stats(&self) -> CacheStats {
        let inner = self.inner.borrow();
        CacheStats {
            bytes: inner.bytes,
            max_bytes: inner.max_bytes,
            entries: inner.lru.len(),
            hits: inner.hits,
            misses: inner.misses,
            evictions: inner.evictions,
        }
    }
}

impl Inner {
    fn evict(&mut self) {
        while self.bytes > self.max_bytes {
            let Some((_, (log, base))) = self.lru.pop_first() else {
                break;
            };
            if let Some(entry) = self.logs.get_mut(&log).and_then(|e| e.remove(&base)) {
                self.bytes -= entry.bytes.len() as u64;
                self.evictions += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_stays_within_budget_and_evicts_least_recent() {
        let cache = BatchCache::new(1000);
        let log = cache.register_log();
        for i in 0..10 {
            cache.insert(
                log,
                Offset(i * 10),
                Offset(i * 10 + 9),
                Bytes::from(vec![0u8; 200]),
            );
            assert!(cache.stats().bytes <= 1000);
        }
        assert!(cache.get(log, Offset(0)).is_none());
        assert!(cache.get(log, Offset(95)).is_some());
        assert_eq!(cache.stats().entries, 5);
        // Touching 50 makes 60 the oldest.
        assert!(cache.get(log, Offset(55)).is_some());
        cache.insert(log, Offset(100), Offset(109), Bytes::from(vec![0u8; 200]));
        assert!(cache.get(log, Offset(55)).is_some());
        assert!(cache.get(log, Offset(65)).is_none());
    }

    #[test]
    fn truncation_and_start_moves_drop_entries() {
        let cache = BatchCache::new(1 << 20);
        let log = cache.register_log();
        for i in 0..5 {
            cache.insert(
                log,
                Offset(i * 10),
                Offset(i * 10 + 9),
                Bytes::from_static(b"x"),
            );
        }
        cache.remove_from(log, Offset(35));
        assert!(cache.get(log, Offset(35)).is_none());
        assert!(cache.get(log, Offset(25)).is_some());
        cache.remove_before(log, Offset(15));
        assert!(cache.get(log, Offset(5)).is_none());
        assert!(cache.get(log, Offset(15)).is_some());
        assert_eq!(cache.stats().bytes, 2);
        cache.set_max_bytes(1);
        assert_eq!(cache.stats().entries, 1);
    }
}
