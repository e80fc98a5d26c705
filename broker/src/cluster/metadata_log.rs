//! `__cluster_metadata`: the controller quorum's raft log on this node's disk.
//!
//! Layout under `<data>/__cluster_metadata-0/`:
//!
//! - `log/`: an engine log holding one record batch per raft entry, at offset `index - 1`
//!   (raft indexes start at 1), with the entry's term as the batch's partition leader epoch and
//!   the protobuf-encoded entry as its one record's value;
//! - `quorum-state`: the raft hard state (term, vote, commit), overwritten in place in one of two
//!   checksummed slots (`QuorumStateFile`), so that it never needs a free block once created;
//! - `<index>-<term>.checkpoint`: snapshots of the metadata image (the newest two are kept),
//!   a magic, a CRC-32C and the protobuf-encoded raft snapshot.
//!
//! `MetadataStore::persist` makes a `Ready` durable in the order raft needs: a received snapshot
//! (which replaces the log), the entries (truncating any conflicting suffix), one fdatasync, the
//! hard state, then a snapshot this node took, after which the entries it covers are deleted.
//! `open` reads it all back as the `PersistedState` the metadata node starts from, and repairs
//! what a crash between those steps can leave.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::BytesMut;
use sluice_engine::batch::{BatchBuilder, NewRecord, Records};
use sluice_engine::{
    BatchCache, Clock, DmaStorage, LeaderEpoch, Log, LogConfig, Offset, Timestamp,
};
use sluice_replication::quorum::codec;
use sluice_replication::quorum::{Entry, HardState, PersistedState, Ready, Snapshot};

pub use crate::config::METADATA_DIR;
const LOG_DIR: &str = "log";
const QUORUM_STATE: &str = "quorum-state";
const SNAPSHOT_SUFFIX: &str = ".checkpoint";
const SNAPSHOT_MAGIC: &[u8; 4] = b"SLMS";
/// Snapshot files kept: the newest, and the one before it in case the newest is damaged.
const SNAPSHOTS_KEPT: usize = 2;
/// Small segments, so that a snapshot lets the entries before it go soon.
const SEGMENT_BYTES: u64 = 8 << 20;

#[derive(serde::Serialize, serde::Deserialize, Default, PartialEq, Eq, Debug)]
struct QuorumStateFile {
    term: u64,
    vote: u64,
    commit: u64,
    data_version: u32,
}

pub struct MetadataStore {
    dir: PathBuf,
    log: Log<DmaStorage>,
    hard_state: HardState,
    quorum_state: QuorumStateSlots,
}

fn log_config() -> LogConfig {
    LogConfig {
        segment_bytes: SEGMENT_BYTES,
        retention_ms: -1,
        retention_bytes: -1,
        // Written as appended; `persist` fdatasyncs once for all of a Ready's entries.
        flush_mode: sluice_engine::FlushMode::None,
        cleanup_delete: false,
        max_message_bytes: 64 << 20,
        ..LogConfig::default()
    }
}

fn snapshot_name(index: u64, term: u64) -> String {
    format!("{index:020}-{term:010}{SNAPSHOT_SUFFIX}")
}

fn parse_snapshot_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(SNAPSHOT_SUFFIX)?;
    let (index, term) = stem.split_once('-')?;
    Some((index.parse().ok()?, term.parse().ok()?))
}

fn encode_snapshot_file(snapshot: &Snapshot) -> Vec<u8> {
    let body = codec::encode_snapshot(snapshot);
    let mut out = Vec::with_capacity(body.len() + 16);
    out.extend_from_slice(SNAPSHOT_MAGIC);
    out.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
    out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

fn decode_snapshot_file(bytes: &[u8]) -> Result<Snapshot, String> {
    if bytes.len() < 16 || &bytes[..4] != SNAPSHOT_MAGIC {
        return Err("not a metadata snapshot".into());
    }
    let crc = u32::from_be_bytes(bytes[4..8].try_into().expect("4 bytes"));
    let len = u64::from_be_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let body = &bytes[16..];
    if body.len() as u64 != len {
        return Err(format!("{} bytes where the header says {len}", body.len()));
    }
    if crc32c::crc32c(body) != crc {
        return Err("checksum mismatch".into());
    }
    codec::decode_snapshot(body)
}

/// Writes `bytes` to `path` durably: a temporary file, fsync, rename, directory fsync.
fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(dir)?.sync_all()
}

fn entry_batch(entry: &Entry) -> BytesMut {
    let mut builder = BatchBuilder::new();
    builder.push(&NewRecord {
        key: None,
        value: Some(codec::encode_entry(entry)),
        headers: Vec::new(),
        timestamp: Timestamp(0),
    });
    BytesMut::from(&builder.build()[..])
}

impl MetadataStore {
    pub fn dir(data_dir: &Path) -> PathBuf {
        data_dir.join(METADATA_DIR)
    }

    /// Opens (creating) the store and reads back what was persisted.
    pub async fn open(
        data_dir: &Path,
        cache: Rc<BatchCache>,
    ) -> anyhow::Result<(MetadataStore, PersistedState)> {
        let dir = Self::dir(data_dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
        let (quorum_state, hard_state) = QuorumStateSlots::open(&dir)?;
        let snapshot = newest_snapshot(&dir)?;
        let log = Log::open(
            DmaStorage::new(),
            dir.join(LOG_DIR),
            log_config(),
            cache,
            Clock::System,
        )
        .await
        .map_err(|e| anyhow::anyhow!("opening {}: {e}", dir.join(LOG_DIR).display()))?;
        let store = MetadataStore {
            dir,
            log,
            hard_state: hard_state.clone(),
            quorum_state,
        };
        let mut entries = store.read_entries().await?;
        if let Some(snap) = &snapshot {
            let (index, term) = (snap.get_metadata().index, snap.get_metadata().term);
            let first = store.log.log_start_offset().0 as u64 + 1;
            let last = store.log.log_end_offset().0 as u64;
            // The entries after the snapshot are this log's only if the log agrees with the
            // snapshot at its index (raft's log matching): compacted up to exactly there, or
            // holding the snapshot's term there. Anything else is what a crash left while the
            // log was being replaced by this snapshot: start the log over after it.
            let agrees = if first == index + 1 {
                true
            } else if first <= index && index <= last {
                entries
                    .iter()
                    .find(|e| e.index == index)
                    .is_some_and(|e| e.term == term)
            } else {
                false
            };
            if !agrees {
                if first > index + 1 {
                    tracing::warn!(
                        snapshot = index,
                        log_start = first,
                        "the metadata log starts after its newest snapshot; starting it over there"
                    );
                }
                store
                    .log
                    .truncate_fully_and_start_at(Offset(index as i64))
                    .await
                    .map_err(|e| anyhow::anyhow!("resetting the metadata log: {e}"))?;
                entries.clear();
            }
            entries.retain(|e| e.index > index);
        } else if store.log.log_start_offset() != Offset(0) && !entries.is_empty() {
            anyhow::bail!(
                "{}: the metadata log starts at offset {} and there is no snapshot before it",
                store.dir.display(),
                store.log.log_start_offset().0
            );
        }
        tracing::info!(
            dir = %store.dir.display(),
            snapshot = snapshot.as_ref().map_or(0, |s| s.get_metadata().index),
            entries = entries.len(),
            term = hard_state.term,
            "opened the metadata log"
        );
        Ok((
            store,
            PersistedState {
                hard_state,
                snapshot,
                entries,
            },
        ))
    }

    async fn read_entries(&self) -> anyhow::Result<Vec<Entry>> {
        let mut out: Vec<Entry> = Vec::new();
        let mut cur = self.log.log_start_offset();
        let end = self.log.log_end_offset();
        while cur < end {
            let batches = self
                .log
                .read(cur, 1 << 20, end)
                .await
                .map_err(|e| anyhow::anyhow!("reading the metadata log at {}: {e}", cur.0))?;
            if batches.is_empty() {
                break;
            }
            for batch in batches {
                for record in Records::new(&batch.bytes) {
                    let record = record.map_err(|e| {
                        anyhow::anyhow!("metadata log batch at {}: {e}", batch.base_offset.0)
                    })?;
                    let offset = batch.base_offset.0 + record.offset_delta as i64;
                    let entry = codec::decode_entry(record.value.unwrap_or_default())
                        .map_err(|e| anyhow::anyhow!("metadata log entry at {offset}: {e}"))?;
                    if entry.index != offset as u64 + 1 {
                        anyhow::bail!(
                            "metadata log entry at offset {offset} has raft index {}",
                            entry.index
                        );
                    }
                    out.push(entry);
                }
                cur = batch.last_offset.next();
            }
        }
        Ok(out)
    }

    /// Makes a Ready's persistence part durable; `persisted_messages` may go out after.
    pub async fn persist(&mut self, ready: &Ready) -> anyhow::Result<()> {
        if let Some(snapshot) = &ready.snapshot {
            let index = snapshot.get_metadata().index;
            self.write_snapshot(snapshot)?;
            self.log
                .truncate_fully_and_start_at(Offset(index as i64))
                .await
                .map_err(|e| anyhow::anyhow!("replacing the metadata log by a snapshot: {e}"))?;
        }
        if let Some(first) = ready.entries.first() {
            let at = Offset(first.index as i64 - 1);
            if at < self.log.log_end_offset() {
                self.log
                    .truncate_to(at)
                    .await
                    .map_err(|e| anyhow::anyhow!("truncating the metadata log: {e}"))?;
            }
            if at != self.log.log_end_offset() {
                anyhow::bail!(
                    "metadata log entries from index {} would leave a gap after offset {}",
                    first.index,
                    self.log.log_end_offset().0
                );
            }
            for entry in &ready.entries {
                self.log
                    .append(entry_batch(entry), LeaderEpoch(entry.term as i32))
                    .await
                    .map_err(|e| anyhow::anyhow!("appending to the metadata log: {e}"))?;
            }
            self.log
                .flush()
                .await
                .map_err(|e| anyhow::anyhow!("syncing the metadata log: {e}"))?;
        }
        if let Some(hs) = &ready.hard_state {
            if *hs != self.hard_state {
                self.quorum_state
                    .write(hs)
                    .map_err(|e| anyhow::anyhow!("writing {QUORUM_STATE}: {e}"))?;
                self.hard_state = hs.clone();
            }
        }
        if let Some(snapshot) = &ready.compacted {
            // A snapshot of this node's own is an optimisation: when it cannot be written (a
            // full disk), the entries it would replace stay, and the node goes on.
            if let Err(e) = self.write_snapshot(snapshot) {
                tracing::warn!(error = %e, "could not write a metadata snapshot; the log keeps its entries");
                return Ok(());
            }
            let index = snapshot.get_metadata().index as i64;
            let to = Offset(index.min(self.log.log_end_offset().0));
            self.log
                .delete_records(to)
                .await
                .map_err(|e| anyhow::anyhow!("compacting the metadata log: {e}"))?;
        }
        Ok(())
    }

    fn write_snapshot(&self, snapshot: &Snapshot) -> anyhow::Result<()> {
        let meta = snapshot.get_metadata();
        let name = snapshot_name(meta.index, meta.term);
        write_durably(&self.dir, &name, &encode_snapshot_file(snapshot))
            .map_err(|e| anyhow::anyhow!("writing snapshot {name}: {e}"))?;
        let mut names = snapshot_names(&self.dir)?;
        names.sort();
        let excess = names.len().saturating_sub(SNAPSHOTS_KEPT);
        for (_, old) in names.into_iter().take(excess) {
            let _ = std::fs::remove_file(self.dir.join(old));
        }
        Ok(())
    }

    pub async fn close(&self) {
        if let Err(e) = self.log.close().await {
            tracing::error!(error = %e, "the metadata log did not close cleanly; it will be recovered on start");
        }
    }
}

/// `quorum-state`: two slots of [`SLOT_BYTES`], each `SLQS`, a CRC-32C of what follows it in the
/// slot, a sequence number (u64), the JSON's length (u16) and the hard state as JSON (term, vote,
/// commit, data_version, as Kafka's file), zero padded (FORMAT.md). Each write overwrites the
/// slot the last one did not use, then fdatasyncs: a write torn by a crash fails its checksum,
/// and the other slot, the state before it, is read. The file is allocated once, when created,
/// so a full disk cannot stop a vote or a term change (tests/python/test_disk_full.py).
struct QuorumStateSlots {
    file: std::fs::File,
    /// The sequence number of the newest valid slot (0: none yet).
    seq: u64,
}

const SLOT_BYTES: usize = 512;
const SLOT_MAGIC: &[u8; 4] = b"SLQS";

fn encode_slot(seq: u64, state: &QuorumStateFile) -> Vec<u8> {
    let json = serde_json::to_vec(state).expect("serializes");
    let mut body = Vec::with_capacity(SLOT_BYTES);
    body.extend_from_slice(&seq.to_be_bytes());
    body.extend_from_slice(&(json.len() as u16).to_be_bytes());
    body.extend_from_slice(&json);
    let mut slot = Vec::with_capacity(SLOT_BYTES);
    slot.extend_from_slice(SLOT_MAGIC);
    slot.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
    slot.extend_from_slice(&body);
    assert!(slot.len() <= SLOT_BYTES, "the hard state fits a slot");
    slot.resize(SLOT_BYTES, 0);
    slot
}

/// A slot's sequence number and state, if it holds a whole one.
fn decode_slot(slot: &[u8]) -> Option<(u64, QuorumStateFile)> {
    if slot.len() < 18 || &slot[..4] != SLOT_MAGIC {
        return None;
    }
    let crc = u32::from_be_bytes(slot[4..8].try_into().ok()?);
    let seq = u64::from_be_bytes(slot[8..16].try_into().ok()?);
    let len = u16::from_be_bytes(slot[16..18].try_into().ok()?) as usize;
    let body = slot.get(8..18 + len)?;
    if crc32c::crc32c(body) != crc {
        return None;
    }
    Some((seq, serde_json::from_slice(&slot[18..18 + len]).ok()?))
}

impl QuorumStateSlots {
    /// Opens `quorum-state`, creating it (both slots allocated) if missing, and converting the
    /// whole-file JSON of earlier versions.
    fn open(dir: &Path) -> anyhow::Result<(QuorumStateSlots, HardState)> {
        let path = dir.join(QUORUM_STATE);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => anyhow::bail!("reading {}: {e}", path.display()),
        };
        let slotted = !bytes.is_empty() && bytes[0] != b'{';
        let (seq, state) = if bytes.is_empty() {
            (0, QuorumStateFile::default())
        } else if !slotted {
            let state: QuorumStateFile = serde_json::from_slice(&bytes)
                .map_err(|e| anyhow::anyhow!("{} is damaged: {e}", path.display()))?;
            (0, state)
        } else {
            bytes
                .chunks(SLOT_BYTES)
                .take(2)
                .filter_map(decode_slot)
                .max_by_key(|(seq, _)| *seq)
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "{} is damaged: neither slot holds a hard state",
                        path.display()
                    )
                })?
        };
        let mut seq = seq;
        if !slotted || bytes.len() != 2 * SLOT_BYTES {
            // New, or in the old format: written whole, once, with the state in both slots
            // (sequence numbers 0 and 1), so that a torn first write still leaves one.
            let mut whole = encode_slot(0, &state);
            whole.extend_from_slice(&encode_slot(1, &state));
            write_durably(dir, QUORUM_STATE, &whole)
                .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
            seq = 1;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| anyhow::anyhow!("opening {}: {e}", path.display()))?;
        let hard_state = HardState {
            term: state.term,
            vote: state.vote,
            commit: state.commit,
        };
        Ok((QuorumStateSlots { file, seq }, hard_state))
    }

    fn write(&mut self, hs: &HardState) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let seq = self.seq + 1;
        let state = QuorumStateFile {
            term: hs.term,
            vote: hs.vote,
            commit: hs.commit,
            data_version: 1,
        };
        let slot = seq % 2;
        self.file
            .write_all_at(&encode_slot(seq, &state), slot * SLOT_BYTES as u64)?;
        self.file.sync_data()?;
        self.seq = seq;
        Ok(())
    }
}

fn snapshot_names(dir: &Path) -> anyhow::Result<Vec<((u64, u64), String)>> {
    let mut out = Vec::new();
    for entry in
        std::fs::read_dir(dir).map_err(|e| anyhow::anyhow!("listing {}: {e}", dir.display()))?
    {
        let name = entry
            .map_err(|e| anyhow::anyhow!("listing {}: {e}", dir.display()))?
            .file_name()
            .to_string_lossy()
            .into_owned();
        if let Some(key) = parse_snapshot_name(&name) {
            out.push((key, name));
        }
    }
    Ok(out)
}

/// The newest snapshot that reads back whole; damaged ones are skipped with a warning.
fn newest_snapshot(dir: &Path) -> anyhow::Result<Option<Snapshot>> {
    let mut names = snapshot_names(dir)?;
    names.sort();
    for (_, name) in names.into_iter().rev() {
        let path = dir.join(&name);
        let bytes =
            std::fs::read(&path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        match decode_snapshot_file(&bytes) {
            Ok(s) => return Ok(Some(s)),
            Err(e) => {
                tracing::warn!(snapshot = %path.display(), error = %e, "skipping a damaged metadata snapshot")
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<F: std::future::Future<Output = ()> + 'static>(f: impl FnOnce() -> F + Send + 'static) {
        glommio::LocalExecutorBuilder::default()
            .spawn(f)
            .expect("executor")
            .join()
            .expect("executor thread");
    }

    #[test]
    fn the_hard_state_survives_a_torn_write_and_old_files_convert() {
        let dir = tempfile::tempdir().unwrap();
        let hs = |term, vote, commit| HardState { term, vote, commit };
        let (mut slots, first) = QuorumStateSlots::open(dir.path()).unwrap();
        assert_eq!(first, HardState::default());
        let len = std::fs::metadata(dir.path().join(QUORUM_STATE))
            .unwrap()
            .len();
        assert_eq!(len, 2 * SLOT_BYTES as u64);
        for t in 1..=5 {
            slots.write(&hs(t, 1, t * 10)).unwrap();
        }
        drop(slots);
        // Overwritten in place: the file never grows.
        let path = dir.path().join(QUORUM_STATE);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
        assert_eq!(QuorumStateSlots::open(dir.path()).unwrap().1, hs(5, 1, 50));
        // A crash in the middle of the next write: that slot fails its checksum and the state
        // before it is read.
        let (mut slots, _) = QuorumStateSlots::open(dir.path()).unwrap();
        slots.write(&hs(6, 2, 60)).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let newest = (slots.seq % 2) as usize * SLOT_BYTES;
        bytes[newest + 20] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(QuorumStateSlots::open(dir.path()).unwrap().1, hs(5, 1, 50));
        // Both slots damaged: an error, never a silent reset to term 0.
        let bytes = vec![7u8; 2 * SLOT_BYTES];
        std::fs::write(&path, &bytes).unwrap();
        assert!(QuorumStateSlots::open(dir.path()).is_err());
        // The whole-file JSON of earlier versions is read and rewritten as slots.
        std::fs::write(
            &path,
            br#"{"term":9,"vote":3,"commit":77,"data_version":1}"#,
        )
        .unwrap();
        assert_eq!(QuorumStateSlots::open(dir.path()).unwrap().1, hs(9, 3, 77));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
        assert_eq!(QuorumStateSlots::open(dir.path()).unwrap().1, hs(9, 3, 77));
    }

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            data: format!("batch {index} of term {term}").into_bytes(),
            ..Default::default()
        }
    }

    fn snapshot(index: u64, term: u64) -> Snapshot {
        let mut s = Snapshot::default();
        s.mut_metadata().index = index;
        s.mut_metadata().term = term;
        s.mut_metadata().mut_conf_state().voters = vec![1, 2, 3];
        s.data = format!("image at {index}").into_bytes();
        s
    }

    async fn reopen(dir: &Path) -> (MetadataStore, PersistedState) {
        MetadataStore::open(dir, BatchCache::new(1 << 20))
            .await
            .expect("open")
    }

    #[test]
    fn the_metadata_log_keeps_entries_hard_state_and_snapshots_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_path_buf();
        run(move || async move {
            let (mut store, persisted) = reopen(&data).await;
            assert_eq!(persisted, PersistedState::default());
            let hs = HardState {
                term: 1,
                vote: 2,
                commit: 3,
            };
            store
                .persist(&Ready {
                    entries: (1..=5).map(|i| entry(i, 1)).collect(),
                    hard_state: Some(hs.clone()),
                    ..Ready::default()
                })
                .await
                .unwrap();
            drop(store); // unclean: no close
            let (mut store, persisted) = reopen(&data).await;
            assert_eq!(persisted.hard_state, hs);
            assert_eq!(
                persisted.entries,
                (1..=5).map(|i| entry(i, 1)).collect::<Vec<_>>()
            );
            assert!(persisted.snapshot.is_none());

            // A new leader overwrites the uncommitted tail from index 4.
            store
                .persist(&Ready {
                    entries: vec![entry(4, 2), entry(5, 2), entry(6, 2)],
                    ..Ready::default()
                })
                .await
                .unwrap();
            // This node's own snapshot at 4: entries up to it may go.
            store
                .persist(&Ready {
                    compacted: Some(snapshot(4, 2)),
                    ..Ready::default()
                })
                .await
                .unwrap();
            store.close().await;
            let (mut store, persisted) = reopen(&data).await;
            assert_eq!(persisted.snapshot, Some(snapshot(4, 2)));
            assert_eq!(persisted.entries, vec![entry(5, 2), entry(6, 2)]);

            // The leader's snapshot past our log replaces it.
            store
                .persist(&Ready {
                    snapshot: Some(snapshot(10, 3)),
                    entries: vec![entry(11, 3)],
                    hard_state: Some(HardState {
                        term: 3,
                        vote: 1,
                        commit: 10,
                    }),
                    ..Ready::default()
                })
                .await
                .unwrap();
            drop(store);
            let (store, persisted) = reopen(&data).await;
            assert_eq!(persisted.snapshot, Some(snapshot(10, 3)));
            assert_eq!(persisted.entries, vec![entry(11, 3)]);
            assert_eq!(persisted.hard_state.term, 3);
            drop(store);

            // A crash after a received snapshot was written and before the log was replaced:
            // the log (ending at 11) disagrees with a snapshot at 20 and starts over after it.
            let meta = MetadataStore::dir(&data);
            write_durably(
                &meta,
                &snapshot_name(20, 4),
                &encode_snapshot_file(&snapshot(20, 4)),
            )
            .unwrap();
            let (mut store, persisted) = reopen(&data).await;
            assert_eq!(persisted.snapshot, Some(snapshot(20, 4)));
            assert!(persisted.entries.is_empty());
            store
                .persist(&Ready {
                    entries: vec![entry(21, 4)],
                    ..Ready::default()
                })
                .await
                .unwrap();
            store.close().await;
            let (mut store, persisted) = reopen(&data).await;
            assert_eq!(persisted.entries, vec![entry(21, 4)]);
            // Only the newest two snapshots are kept.
            store
                .persist(&Ready {
                    compacted: Some(snapshot(21, 4)),
                    ..Ready::default()
                })
                .await
                .unwrap();
            let mut names: Vec<_> = snapshot_names(&meta)
                .unwrap()
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            names.sort();
            assert_eq!(names, vec![(20, 4), (21, 4)]);
            store.close().await;

            // A damaged newest snapshot is skipped for the one before it.
            std::fs::write(meta.join(snapshot_name(30, 5)), b"SLMS garbage").unwrap();
            assert_eq!(newest_snapshot(&meta).unwrap(), Some(snapshot(21, 4)));
        });
    }
}
