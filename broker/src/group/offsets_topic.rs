//! Records of the internal `__consumer_offsets` topic, in Kafka's formats so its tools can read
//! them: an offset commit is key v1 `(group, topic, partition)` → value v3 `(offset, leader
//! epoch, metadata, commit timestamp)`; a null value deletes the commit. The topic is compacted,
//! so the latest record per key is what survives.

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitKey {
    pub group: String,
    pub topic: String,
    pub partition: i32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitValue {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp: i64,
}

fn put_string(b: &mut BytesMut, s: &str) {
    b.put_i16(s.len() as i16);
    b.put_slice(s.as_bytes());
}

fn get_string(b: &mut Bytes) -> Option<String> {
    if b.remaining() < 2 {
        return None;
    }
    let len = b.get_i16();
    if len < 0 {
        return Some(String::new());
    }
    if b.remaining() < len as usize {
        return None;
    }
    String::from_utf8(b.split_to(len as usize).to_vec()).ok()
}

pub fn encode_key(k: &CommitKey) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(1);
    put_string(&mut b, &k.group);
    put_string(&mut b, &k.topic);
    b.put_i32(k.partition);
    b.freeze()
}

pub fn encode_value(v: &CommitValue) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(3);
    b.put_i64(v.offset);
    b.put_i32(v.leader_epoch);
    put_string(&mut b, &v.metadata);
    b.put_i64(v.commit_timestamp);
    b.freeze()
}

/// Decodes an offset-commit key; `None` for other record kinds (group metadata) or damage.
pub fn decode_key(bytes: &[u8]) -> Option<CommitKey> {
    let mut b = Bytes::copy_from_slice(bytes);
    if b.remaining() < 2 {
        return None;
    }
    let version = b.get_i16();
    if version > 1 {
        return None;
    }
    let group = get_string(&mut b)?;
    let topic = get_string(&mut b)?;
    if b.remaining() < 4 {
        return None;
    }
    Some(CommitKey {
        group,
        topic,
        partition: b.get_i32(),
    })
}

pub fn decode_value(bytes: &[u8]) -> Option<CommitValue> {
    let mut b = Bytes::copy_from_slice(bytes);
    if b.remaining() < 10 {
        return None;
    }
    let version = b.get_i16();
    let offset = b.get_i64();
    let leader_epoch = if version >= 3 {
        if b.remaining() < 4 {
            return None;
        }
        b.get_i32()
    } else {
        -1
    };
    let metadata = get_string(&mut b)?;
    let commit_timestamp = if b.remaining() >= 8 { b.get_i64() } else { -1 };
    Some(CommitValue {
        offset,
        leader_epoch,
        metadata,
        commit_timestamp,
    })
}

/// Java's `String.hashCode` of a group id: over its UTF-16 code units.
fn java_hash(group: &str) -> i32 {
    let mut h: i32 = 0;
    for unit in group.encode_utf16() {
        h = h.wrapping_mul(31).wrapping_add(i32::from(unit));
    }
    h
}

/// Kafka's placement of a group on `__consumer_offsets`: `Utils.abs(groupId.hashCode()) %
/// partitions`, where `Utils.abs(Integer.MIN_VALUE)` is 0.
pub fn partition_for(group: &str, partitions: i32) -> i32 {
    let h = java_hash(group);
    let abs = if h == i32::MIN { 0 } else { h.abs() };
    abs % partitions.max(1)
}

/// Where releases before this one placed a group: `(hash & 0x7fffffff) % partitions`. The same
/// partition as Kafka's for a hash that is not negative; a group with a negative one may have
/// commits there, which its coordinator takes over once (`placement.rs`).
pub fn legacy_partition_for(group: &str, partitions: i32) -> i32 {
    (java_hash(group) & 0x7fff_ffff) % partitions.max(1)
}

/// The key version of Sluice's own record that says a partition's coordinator has taken over
/// the commits that earlier releases placed elsewhere (`placement.rs`). Kafka's key versions
/// are small (0-1 offset commits, 2 group metadata, 3 and up the consumer and share group
/// records); this one is far from them, and Kafka's own readers skip unknown versions.
pub const PLACEMENT_KEY_VERSION: i16 = 32_000;

/// The placement record's key: its version, then the placement it records (1: Kafka's).
pub fn encode_placement_key() -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(PLACEMENT_KEY_VERSION);
    b.put_i16(1);
    b.freeze()
}

/// Whether a record key is the placement record's.
pub fn is_placement_key(bytes: &[u8]) -> bool {
    bytes.len() >= 2 && i16::from_be_bytes([bytes[0], bytes[1]]) == PLACEMENT_KEY_VERSION
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let k = CommitKey {
            group: "g".into(),
            topic: "t".into(),
            partition: 3,
        };
        assert_eq!(decode_key(&encode_key(&k)), Some(k));
        let v = CommitValue {
            offset: 42,
            leader_epoch: 1,
            metadata: "m".into(),
            commit_timestamp: 7,
        };
        assert_eq!(decode_value(&encode_value(&v)), Some(v));
    }

    #[test]
    fn placement_is_kafkas_and_the_legacy_one_is_kept_for_the_upgrade() {
        // Java: "my-group".hashCode() == -1906497762; Kafka puts it on 1906497762 % 50 == 12,
        // earlier releases on (-1906497762 & 0x7fffffff) % 50 == 36.
        assert_eq!(partition_for("my-group", 50), 12);
        assert_eq!(legacy_partition_for("my-group", 50), 36);
        // A hash that is not negative: the same partition both ways ("upgraders" hashes to
        // 1182437725).
        assert_eq!(partition_for("upgraders", 50), 25);
        assert_eq!(legacy_partition_for("upgraders", 50), 25);
        assert_eq!(partition_for("", 50), 0);
        // "polygenelubricants".hashCode() == Integer.MIN_VALUE, whose Utils.abs is 0.
        assert_eq!(partition_for("polygenelubricants", 50), 0);
        assert_eq!(legacy_partition_for("polygenelubricants", 50), 0);
        assert!(is_placement_key(&encode_placement_key()));
        assert!(decode_key(&encode_placement_key()).is_none());
        assert!(!is_placement_key(&encode_key(&CommitKey {
            group: "g".into(),
            topic: "t".into(),
            partition: 0
        })));
    }
}
