//! Small per-partition files that outlive segments: `log-start-offset` (moved by DeleteRecords)
//! and `leader-epoch-checkpoint` (the leader epoch cache, in Kafka's text format).
//! Both are replaced atomically (write, fdatasync, rename, directory sync).

use std::path::PathBuf;

use super::Log;
use crate::error::{LogError, Result};
use crate::storage::{read_file, write_file_atomic, Storage};
use crate::types::{LeaderEpoch, Offset};

pub const LOG_START_OFFSET_FILE: &str = "log-start-offset";
pub const LEADER_EPOCH_CHECKPOINT_FILE: &str = "leader-epoch-checkpoint";
const LOG_START_MAGIC: &[u8; 4] = b"SLSO";

pub fn encode_log_start_offset(offset: Offset) -> Vec<u8> {
    let mut out = Vec::with_capacity(20);
    out.extend_from_slice(LOG_START_MAGIC);
    out.extend_from_slice(&1u32.to_be_bytes());
    out.extend_from_slice(&offset.0.to_be_bytes());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

pub fn decode_log_start_offset(bytes: &[u8]) -> Option<Offset> {
    if bytes.len() != 20 || &bytes[..4] != LOG_START_MAGIC || bytes[4..8] != 1u32.to_be_bytes() {
        return None;
    }
    if crc32fast::hash(&bytes[..16]).to_be_bytes() != bytes[16..20] {
        return None;
    }
    Some(Offset(i64::from_be_bytes(bytes[8..16].try_into().unwrap())))
}

/// Kafka's format: version line `0`, entry count line, then `epoch offset` lines.
pub fn encode_epochs(epochs: &[(LeaderEpoch, Offset)]) -> Vec<u8> {
    let mut s = format!("0\n{}\n", epochs.len());
    for (e, o) in epochs {
        s.push_str(&format!("{} {}\n", e.0, o.0));
    }
    s.into_bytes()
}

pub fn decode_epochs(bytes: &[u8]) -> Option<Vec<(LeaderEpoch, Offset)>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut lines = text.lines();
    if lines.next()? != "0" {
        return None;
    }
    let count: usize = lines.next()?.parse().ok()?;
    let mut out = Vec::with_capacity(count.min(1024));
    for _ in 0..count {
        let mut parts = lines.next()?.split(' ');
        let e = parts.next()?.parse().ok()?;
        let o = parts.next()?.parse().ok()?;
        out.push((LeaderEpoch(e), Offset(o)));
    }
    if lines.next().is_some() || out.windows(2).any(|w| w[0].0 >= w[1].0 || w[0].1 > w[1].1) {
        return None;
    }
    Some(out)
}

impl<S: Storage> Log<S> {
    fn checkpoint_path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub(crate) async fn write_log_start_checkpoint(&self, offset: Offset) -> Result<()> {
        write_file_atomic(
            &self.storage,
            &self.checkpoint_path(LOG_START_OFFSET_FILE),
            &encode_log_start_offset(offset),
        )
        .await
        .map_err(|e| LogError::io("writing the log-start-offset checkpoint", e))
    }

    pub(crate) async fn read_log_start_checkpoint(
        storage: &S,
        dir: &std::path::Path,
    ) -> Option<Offset> {
        let path = dir.join(LOG_START_OFFSET_FILE);
        if !storage.exists(&path).await {
            return None;
        }
        match read_file(storage, &path).await {
            Ok(bytes) => {
                let decoded = decode_log_start_offset(&bytes);
                if decoded.is_none() {
                    tracing::warn!(path = %path.display(), "damaged log-start-offset checkpoint ignored");
                }
                decoded
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "unreadable log-start-offset checkpoint ignored");
                None
            }
        }
    }

    pub(crate) async fn read_epochs_checkpoint(
        storage: &S,
        dir: &std::path::Path,
    ) -> Vec<(LeaderEpoch, Offset)> {
        let path = dir.join(LEADER_EPOCH_CHECKPOINT_FILE);
        if !storage.exists(&path).await {
            return Vec::new();
        }
        match read_file(storage, &path)
            .await
            .ok()
            .and_then(|b| decode_epochs(&b))
        {
            Some(epochs) => epochs,
            None => {
                tracing::warn!(path = %path.display(), "damaged leader-epoch-checkpoint ignored; rebuilt from the log tail");
                Vec::new()
            }
        }
    }

    /// Best effort: a lost epoch checkpoint is rebuilt from batch headers on recovery.
    pub(crate) async fn write_epochs_checkpoint(&self) {
        let epochs = {
            let mut st = self.state.borrow_mut();
            st.epochs_dirty = false;
            st.epochs.clone()
        };
        let path = self.checkpoint_path(LEADER_EPOCH_CHECKPOINT_FILE);
        if let Err(e) = write_file_atomic(&self.storage, &path, &encode_epochs(&epochs)).await {
            tracing::warn!(path = %path.display(), error = %e, "could not write leader-epoch-checkpoint");
            self.state.borrow_mut().epochs_dirty = true;
        }
    }
}

/// Producer state snapshots kept per partition; older ones are deleted.
const PRODUCER_SNAPSHOTS_KEPT: usize = 2;

pub fn snapshot_name(offset: Offset) -> String {
    format!("{:020}.snapshot", offset.0)
}

fn parse_snapshot_name(name: &str) -> Option<Offset> {
    let stem = name.strip_suffix(".snapshot")?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok().map(Offset)
}

impl<S: Storage> Log<S> {
    async fn snapshot_offsets(&self) -> Vec<Offset> {
        let mut offsets: Vec<Offset> = match self.storage.list_dir(&self.dir).await {
            Ok(names) => names
                .iter()
                .filter_map(|n| parse_snapshot_name(n))
                .collect(),
            Err(_) => Vec::new(),
        };
        offsets.sort();
        offsets
    }

    /// Writes the producer state as of the log end (the caller holds the io lock and no append
    /// can buffer meanwhile), then prunes old snapshots. Best effort: a missing snapshot only
    /// means a longer replay on open. Returns whether the snapshot was written.
    pub(crate) async fn write_producer_snapshot_locked(&self) -> bool {
        let (offset, bytes) = {
            let mut st = self.state.borrow_mut();
            let start = st.log_start_offset;
            st.producers.trim_aborted(start);
            (st.log_end_offset, st.producers.encode(st.log_end_offset))
        };
        let path = self.dir.join(snapshot_name(offset));
        if let Err(e) = write_file_atomic(&self.storage, &path, &bytes).await {
            tracing::warn!(path = %path.display(), error = %e, "could not write a producer state snapshot");
            return false;
        }
        let offsets = self.snapshot_offsets().await;
        if offsets.len() > PRODUCER_SNAPSHOTS_KEPT {
            for old in &offsets[..offsets.len() - PRODUCER_SNAPSHOTS_KEPT] {
                let _ = self
                    .storage
                    .remove(&self.dir.join(snapshot_name(*old)))
                    .await;
            }
        }
        true
    }

    /// Rebuilds producer state from the latest usable snapshot at or below the log end, plus
    /// the batches after it. Snapshots past the log end (after a truncation) are deleted.
    pub(crate) async fn rebuild_producer_state(&self) -> Result<()> {
        let end = self.state.borrow().log_end_offset;
        let mut state = crate::producer_state::ProducerStateManager::default();
        let mut from = self.state.borrow().log_start_offset;
        for offset in self.snapshot_offsets().await.into_iter().rev() {
            let path = self.dir.join(snapshot_name(offset));
            if offset > end {
                let _ = self.storage.remove(&path).await;
                continue;
            }
            match read_file(&self.storage, &path)
                .await
                .ok()
                .and_then(|b| crate::producer_state::ProducerStateManager::decode(&b))
            {
                Some((loaded, at)) if at == offset => {
                    state = loaded;
                    from = from.max(offset);
                    break;
                }
                _ => {
                    tracing::warn!(path = %path.display(), "damaged producer state snapshot ignored")
                }
            }
        }
        let mut cur = from;
        while cur < end {
            let batches = self.read(cur, 4 << 20, end).await?;
            if batches.is_empty() {
                break;
            }
            for b in batches {
                let header = crate::batch::BatchHeader::parse(&b.bytes)?;
                state.record(&header, b.base_offset, b.last_offset);
                cur = b.last_offset.next();
            }
        }
        self.state.borrow_mut().producers = state;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_round_trip_and_reject_damage() {
        let bytes = encode_log_start_offset(Offset(1234));
        assert_eq!(decode_log_start_offset(&bytes), Some(Offset(1234)));
        let mut bad = bytes.clone();
        bad[10] ^= 1;
        assert_eq!(decode_log_start_offset(&bad), None);
        let epochs = vec![(LeaderEpoch(0), Offset(0)), (LeaderEpoch(3), Offset(50))];
        assert_eq!(decode_epochs(&encode_epochs(&epochs)), Some(epochs));
        assert_eq!(decode_epochs(b"0\n2\n1 5\n"), None);
    }
}
