//! Records of the internal `__transaction_state` topic, in Kafka's byte formats so that Kafka's
//! tools (`kafka-dump-log --transaction-log-decoder`, `kafka-transactions`) can read them. The
//! topic is compacted: the latest record per transactional id is its state, and a record with a
//! null value (a tombstone) deletes an expired transactional id.
//!
//! Key, `TransactionLogKey` (the leading `int16` is the key version, 0, which Kafka 4 also reads as
//! the coordinator record type `TRANSACTION_LOG`):
//!
//! ```text
//! int16  version            0
//! int16  length             N (a non-nullable string)
//! N      transactional_id   UTF-8
//! ```
//!
//! Value, `TransactionLogValue`, prefixed by its `int16` version. Version 0 is not flexible;
//! version 1 is the first flexible version (KIP-482 compact lengths and tagged fields). Kafka 4
//! writes version 1 when the cluster's `transaction.version` is 2 (the default of a new Kafka 4
//! cluster) and version 0 below that; both are read.
//!
//! ```text
//! v0                                          v1
//! int16  version = 0                          int16   version = 1
//! int64  producer_id                          int64   producer_id
//! int16  producer_epoch                       int16   producer_epoch
//! int32  transaction_timeout_ms               int32   transaction_timeout_ms
//! int8   transaction_status (state id)        int8    transaction_status
//! int32  partitions count, -1 = null          uvarint partitions count + 1, 0 = null
//!   int16 topic length, topic bytes             uvarint topic length + 1, topic bytes
//!   int32 partition ids count                   uvarint partition ids count + 1
//!   int32 partition id ...                      int32   partition id ...
//!                                               uvarint 0 (no tagged fields in the entry)
//! int64  last_update_timestamp_ms             int64   last_update_timestamp_ms
//! int64  start_timestamp_ms                   int64   start_timestamp_ms
//!                                             uvarint tagged field count, then per field
//!                                                     uvarint tag, uvarint size, data:
//!                                               tag 0 int64 PreviousProducerId  (default -1)
//!                                               tag 1 int64 NextProducerId      (default -1)
//!                                               tag 2 int16 ClientTransactionVersion (default 0)
//!                                               tag 3 int16 NextProducerEpoch   (default -1)
//! ```
//!
//! As Kafka's generated code does, a tagged field is written only when it differs from its
//! default, in ascending tag order; unknown tags are skipped when reading. The state ids are
//! Kafka's: Empty 0, Ongoing 1, PrepareCommit 2, PrepareAbort 3, CompleteCommit 4,
//! CompleteAbort 5, Dead 6, PrepareEpochFence 7. Kafka leaves the partitions null in the Empty
//! state and ignores them there when reading.

use std::fmt;

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub const TRANSACTION_STATE_TOPIC: &str = "__transaction_state";

/// The only key version (`TransactionLogKey` has version 0 alone).
pub const KEY_VERSION: i16 = 0;
/// The value versions Kafka defines: 0, and 1 (flexible).
pub const VALUE_VERSION_MIN: i16 = 0;
pub const VALUE_VERSION_MAX: i16 = 1;

const TAG_PREVIOUS_PRODUCER_ID: u32 = 0;
const TAG_NEXT_PRODUCER_ID: u32 = 1;
const TAG_CLIENT_TRANSACTION_VERSION: u32 = 2;
const TAG_NEXT_PRODUCER_EPOCH: u32 = 3;

/// Transactional ids are Kafka strings: an `int16` length in both versions' keys.
pub const TRANSACTIONAL_ID_BYTES_MAX: usize = i16::MAX as usize;
/// A bound on the entries of one value, far above what a transaction touches, so that a damaged
/// length cannot make the decoder reserve gigabytes.
const ARRAY_LEN_MAX: usize = 1 << 20;

/// One `(topic, partition ids)` entry of `TransactionPartitions`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnLogPartitions {
    pub topic: String,
    pub partition_ids: Vec<i32>,
}

/// `TransactionLogValue`, field for field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnLogValue {
    pub producer_id: i64,
    /// v1 tag 0; -1 when absent.
    pub previous_producer_id: i64,
    /// v1 tag 1; -1 when absent.
    pub next_producer_id: i64,
    pub producer_epoch: i16,
    /// v1 tag 3 (KIP-939, two-phase commit); -1 when absent. Sluice never sets it but keeps it.
    pub next_producer_epoch: i16,
    pub transaction_timeout_ms: i32,
    /// The state's id as Kafka numbers them.
    pub transaction_status: i8,
    /// Null in the Empty state.
    pub transaction_partitions: Option<Vec<TxnLogPartitions>>,
    pub transaction_last_update_timestamp_ms: i64,
    pub transaction_start_timestamp_ms: i64,
    /// v1 tag 2; 0 when absent (and always 0 in version 0).
    pub client_transaction_version: i16,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    Truncated { need: usize, have: usize },
    UnknownKeyVersion(i16),
    UnknownValueVersion(i16),
    InvalidLength { field: &'static str, length: i64 },
    InvalidUtf8 { field: &'static str },
    VarintTooLong,
    TaggedFieldSize { tag: u32, size: usize },
    TrailingBytes { count: usize },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated { need, have } => {
                write!(f, "truncated: need {need} bytes, have {have}")
            }
            DecodeError::UnknownKeyVersion(v) => write!(f, "unknown key version {v}"),
            DecodeError::UnknownValueVersion(v) => write!(f, "unknown value version {v}"),
            DecodeError::InvalidLength { field, length } => {
                write!(f, "invalid length {length} of {field}")
            }
            DecodeError::InvalidUtf8 { field } => write!(f, "{field} is not UTF-8"),
            DecodeError::VarintTooLong => f.write_str("unsigned varint longer than 5 bytes"),
            DecodeError::TaggedFieldSize { tag, size } => {
                write!(f, "tagged field {tag} has size {size}")
            }
            DecodeError::TrailingBytes { count } => write!(f, "{count} bytes after the value"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// A decoded record: the transactional id and its value, `None` for a tombstone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnLogRecord {
    pub transactional_id: String,
    pub value: Option<TxnLogValue>,
}

pub fn encode_key(transactional_id: &str) -> Bytes {
    assert!(
        transactional_id.len() <= TRANSACTIONAL_ID_BYTES_MAX,
        "transactional id of {} bytes",
        transactional_id.len()
    );
    let mut b = BytesMut::with_capacity(4 + transactional_id.len());
    b.put_i16(KEY_VERSION);
    b.put_i16(transactional_id.len() as i16);
    b.put_slice(transactional_id.as_bytes());
    b.freeze()
}

/// Decodes a key; `UnknownKeyVersion` for keys of other record types (Kafka skips those when
/// loading, as left-overs of an aborted upgrade).
pub fn decode_key(bytes: &[u8]) -> Result<String, DecodeError> {
    let mut b = bytes;
    let version = get_i16(&mut b)?;
    if version != KEY_VERSION {
        return Err(DecodeError::UnknownKeyVersion(version));
    }
    let id = get_string(&mut b, "TransactionalId")?;
    if !b.is_empty() {
        return Err(DecodeError::TrailingBytes { count: b.len() });
    }
    Ok(id)
}

/// Decodes a whole record; a `None` value is a tombstone.
pub fn decode_record(key: &[u8], value: Option<&[u8]>) -> Result<TxnLogRecord, DecodeError> {
    let transactional_id = decode_key(key)?;
    let value = value.map(decode_value).transpose()?;
    Ok(TxnLogRecord {
        transactional_id,
        value,
    })
}

impl TxnLogValue {
    /// Encodes in `version` (0 or 1). Version 0 has no tagged fields, so the previous and next
    /// producer ids and the client's transaction version are not kept, exactly as in Kafka.
    pub fn encode(&self, version: i16) -> Bytes {
        assert!(
            (VALUE_VERSION_MIN..=VALUE_VERSION_MAX).contains(&version),
            "value version {version}"
        );
        let flexible = version >= 1;
        let mut b = BytesMut::with_capacity(64);
        b.put_i16(version);
        b.put_i64(self.producer_id);
        b.put_i16(self.producer_epoch);
        b.put_i32(self.transaction_timeout_ms);
        b.put_i8(self.transaction_status);
        match &self.transaction_partitions {
            None if flexible => put_uvarint(&mut b, 0),
            None => b.put_i32(-1),
            Some(entries) => {
                put_array_len(&mut b, entries.len(), flexible);
                for entry in entries {
                    put_string(&mut b, &entry.topic, flexible);
                    put_array_len(&mut b, entry.partition_ids.len(), flexible);
                    for &p in &entry.partition_ids {
                        b.put_i32(p);
                    }
                    if flexible {
                        put_uvarint(&mut b, 0);
                    }
                }
            }
        }
        b.put_i64(self.transaction_last_update_timestamp_ms);
        b.put_i64(self.transaction_start_timestamp_ms);
        if flexible {
            let mut tags: Vec<(u32, Vec<u8>)> = Vec::new();
            if self.previous_producer_id != -1 {
                tags.push((
                    TAG_PREVIOUS_PRODUCER_ID,
                    self.previous_producer_id.to_be_bytes().to_vec(),
                ));
            }
            if self.next_producer_id != -1 {
                tags.push((
                    TAG_NEXT_PRODUCER_ID,
                    self.next_producer_id.to_be_bytes().to_vec(),
                ));
            }
            if self.client_transaction_version != 0 {
                tags.push((
                    TAG_CLIENT_TRANSACTION_VERSION,
                    self.client_transaction_version.to_be_bytes().to_vec(),
                ));
            }
            if self.next_producer_epoch != -1 {
                tags.push((
                    TAG_NEXT_PRODUCER_EPOCH,
                    self.next_producer_epoch.to_be_bytes().to_vec(),
                ));
            }
            put_uvarint(&mut b, tags.len() as u32);
            for (tag, data) in tags {
                put_uvarint(&mut b, tag);
                put_uvarint(&mut b, data.len() as u32);
                b.put_slice(&data);
            }
        }
        b.freeze()
    }
}

/// Decodes a value of any version Kafka defines.
pub fn decode_value(bytes: &[u8]) -> Result<TxnLogValue, DecodeError> {
    let mut b = bytes;
    let version = get_i16(&mut b)?;
    if !(VALUE_VERSION_MIN..=VALUE_VERSION_MAX).contains(&version) {
        return Err(DecodeError::UnknownValueVersion(version));
    }
    let flexible = version >= 1;
    need(b, 8 + 2 + 4 + 1)?;
    let producer_id = b.get_i64();
    let producer_epoch = b.get_i16();
    let transaction_timeout_ms = b.get_i32();
    let transaction_status = b.get_i8();
    let transaction_partitions = match get_array_len(&mut b, flexible, "TransactionPartitions")? {
        None => None,
        Some(n) => {
            let mut entries = Vec::with_capacity(n.min(1024));
            for _ in 0..n {
                let topic = get_string_v(&mut b, flexible, "Topic")?;
                let count = get_array_len(&mut b, flexible, "PartitionIds")?.ok_or(
                    DecodeError::InvalidLength {
                        field: "PartitionIds",
                        length: -1,
                    },
                )?;
                need(b, count * 4)?;
                let partition_ids = (0..count).map(|_| b.get_i32()).collect();
                if flexible {
                    skip_tagged_fields(&mut b)?;
                }
                entries.push(TxnLogPartitions {
                    topic,
                    partition_ids,
                });
            }
            Some(entries)
        }
    };
    need(b, 16)?;
    let transaction_last_update_timestamp_ms = b.get_i64();
    let transaction_start_timestamp_ms = b.get_i64();
    let mut value = TxnLogValue {
        producer_id,
        previous_producer_id: -1,
        next_producer_id: -1,
        producer_epoch,
        next_producer_epoch: -1,
        transaction_timeout_ms,
        transaction_status,
        transaction_partitions,
        transaction_last_update_timestamp_ms,
        transaction_start_timestamp_ms,
        client_transaction_version: 0,
    };
    if flexible {
        let count = get_uvarint(&mut b)?;
        for _ in 0..count {
            let tag = get_uvarint(&mut b)?;
            let size = get_uvarint(&mut b)? as usize;
            need(b, size)?;
            let (mut data, rest) = b.split_at(size);
            b = rest;
            let expected = match tag {
                TAG_PREVIOUS_PRODUCER_ID | TAG_NEXT_PRODUCER_ID => 8,
                TAG_CLIENT_TRANSACTION_VERSION | TAG_NEXT_PRODUCER_EPOCH => 2,
                // A tag from a later Kafka: skipped, as Kafka's readers do.
                _ => continue,
            };
            if size != expected {
                return Err(DecodeError::TaggedFieldSize { tag, size });
            }
            match tag {
                TAG_PREVIOUS_PRODUCER_ID => value.previous_producer_id = data.get_i64(),
                TAG_NEXT_PRODUCER_ID => value.next_producer_id = data.get_i64(),
                TAG_CLIENT_TRANSACTION_VERSION => value.client_transaction_version = data.get_i16(),
                _ => value.next_producer_epoch = data.get_i16(),
            }
        }
    }
    if !b.is_empty() {
        return Err(DecodeError::TrailingBytes { count: b.len() });
    }
    Ok(value)
}

fn need(b: &[u8], n: usize) -> Result<(), DecodeError> {
    if b.len() < n {
        return Err(DecodeError::Truncated {
            need: n,
            have: b.len(),
        });
    }
    Ok(())
}

fn get_i16(b: &mut &[u8]) -> Result<i16, DecodeError> {
    need(b, 2)?;
    Ok(b.get_i16())
}

fn put_uvarint(b: &mut BytesMut, mut v: u32) {
    while v >= 0x80 {
        b.put_u8((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    b.put_u8(v as u8);
}

fn get_uvarint(b: &mut &[u8]) -> Result<u32, DecodeError> {
    let mut v: u32 = 0;
    for i in 0..5 {
        need(b, 1)?;
        let byte = b.get_u8();
        v |= u32::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(DecodeError::VarintTooLong)
}

fn put_array_len(b: &mut BytesMut, n: usize, flexible: bool) {
    assert!(n <= ARRAY_LEN_MAX, "array of {n} entries");
    if flexible {
        put_uvarint(b, n as u32 + 1);
    } else {
        b.put_i32(n as i32);
    }
}

/// `None` for a null array.
fn get_array_len(
    b: &mut &[u8],
    flexible: bool,
    field: &'static str,
) -> Result<Option<usize>, DecodeError> {
    let length: i64 = if flexible {
        i64::from(get_uvarint(b)?) - 1
    } else {
        need(b, 4)?;
        i64::from(b.get_i32())
    };
    if length == -1 {
        return Ok(None);
    }
    if length < 0 || length as usize > ARRAY_LEN_MAX {
        return Err(DecodeError::InvalidLength { field, length });
    }
    Ok(Some(length as usize))
}

fn put_string(b: &mut BytesMut, s: &str, flexible: bool) {
    assert!(
        s.len() <= TRANSACTIONAL_ID_BYTES_MAX,
        "string of {} bytes",
        s.len()
    );
    if flexible {
        put_uvarint(b, s.len() as u32 + 1);
    } else {
        b.put_i16(s.len() as i16);
    }
    b.put_slice(s.as_bytes());
}

fn get_string(b: &mut &[u8], field: &'static str) -> Result<String, DecodeError> {
    get_string_v(b, false, field)
}

fn get_string_v(b: &mut &[u8], flexible: bool, field: &'static str) -> Result<String, DecodeError> {
    let length: i64 = if flexible {
        i64::from(get_uvarint(b)?) - 1
    } else {
        i64::from(get_i16(b)?)
    };
    // The strings here are not nullable.
    if length < 0 || length as usize > TRANSACTIONAL_ID_BYTES_MAX {
        return Err(DecodeError::InvalidLength { field, length });
    }
    let length = length as usize;
    need(b, length)?;
    let whole = *b;
    let (s, rest) = whole.split_at(length);
    *b = rest;
    String::from_utf8(s.to_vec()).map_err(|_| DecodeError::InvalidUtf8 { field })
}

fn skip_tagged_fields(b: &mut &[u8]) -> Result<(), DecodeError> {
    let count = get_uvarint(b)?;
    for _ in 0..count {
        let _tag = get_uvarint(b)?;
        let size = get_uvarint(b)? as usize;
        need(b, size)?;
        b.advance(size);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TxnLogValue {
        TxnLogValue {
            producer_id: 4000,
            previous_producer_id: 3999,
            next_producer_id: -1,
            producer_epoch: 7,
            next_producer_epoch: -1,
            transaction_timeout_ms: 60_000,
            transaction_status: 1,
            transaction_partitions: Some(vec![
                TxnLogPartitions {
                    topic: "a".into(),
                    partition_ids: vec![0, 2],
                },
                TxnLogPartitions {
                    topic: "bb".into(),
                    partition_ids: vec![1],
                },
            ]),
            transaction_last_update_timestamp_ms: 1_700_000_000_123,
            transaction_start_timestamp_ms: 1_700_000_000_000,
            client_transaction_version: 2,
        }
    }

    #[test]
    fn key_round_trips_and_matches_kafka_bytes() {
        let key = encode_key("tx-1");
        assert_eq!(&key[..], &[0, 0, 0, 4, b't', b'x', b'-', b'1']);
        assert_eq!(decode_key(&key).unwrap(), "tx-1");
    }

    #[test]
    fn key_of_another_version_is_reported() {
        assert_eq!(
            decode_key(&[0, 1, 0, 0]),
            Err(DecodeError::UnknownKeyVersion(1))
        );
    }

    #[test]
    fn value_v1_round_trips() {
        let v = sample();
        assert_eq!(decode_value(&v.encode(1)).unwrap(), v);
        let mut all_tags = sample();
        all_tags.next_producer_id = 5000;
        all_tags.next_producer_epoch = 3;
        assert_eq!(decode_value(&all_tags.encode(1)).unwrap(), all_tags);
    }

    #[test]
    fn value_v0_round_trips_without_tagged_fields() {
        let v = sample();
        let decoded = decode_value(&v.encode(0)).unwrap();
        let mut expected = v;
        expected.previous_producer_id = -1;
        expected.client_transaction_version = 0;
        assert_eq!(decoded, expected);
    }

    #[test]
    fn null_partitions_round_trip_in_both_versions() {
        let mut v = sample();
        v.transaction_status = 0;
        v.transaction_partitions = None;
        v.transaction_start_timestamp_ms = -1;
        assert_eq!(decode_value(&v.encode(1)).unwrap(), v);
        let mut v0 = v.clone();
        v0.previous_producer_id = -1;
        v0.client_transaction_version = 0;
        assert_eq!(decode_value(&v.encode(0)).unwrap(), v0);
    }

    /// Bytes assembled by hand from `TransactionLogValue.json` (v1 flexible, tags 0..3) and
    /// `TransactionLogKey.json`.
    #[test]
    fn value_v1_matches_hand_assembled_bytes() {
        let v = TxnLogValue {
            producer_id: 1,
            previous_producer_id: 2,
            next_producer_id: -1,
            producer_epoch: 3,
            next_producer_epoch: -1,
            transaction_timeout_ms: 0x0102_0304,
            transaction_status: 2,
            transaction_partitions: Some(vec![TxnLogPartitions {
                topic: "t".into(),
                partition_ids: vec![5],
            }]),
            transaction_last_update_timestamp_ms: 6,
            transaction_start_timestamp_ms: 7,
            client_transaction_version: 2,
        };
        #[rustfmt::skip]
        let expected: Vec<u8> = vec![
            0, 1,                               // version 1
            0, 0, 0, 0, 0, 0, 0, 1,             // ProducerId
            0, 3,                               // ProducerEpoch
            1, 2, 3, 4,                         // TransactionTimeoutMs
            2,                                  // TransactionStatus = PrepareCommit
            2,                                  // compact array: 1 entry
            2, b't',                            //   compact string "t"
            2, 0, 0, 0, 5,                      //   compact int32 array [5]
            0,                                  //   entry: no tagged fields
            0, 0, 0, 0, 0, 0, 0, 6,             // TransactionLastUpdateTimestampMs
            0, 0, 0, 0, 0, 0, 0, 7,             // TransactionStartTimestampMs
            2,                                  // two tagged fields
            0, 8, 0, 0, 0, 0, 0, 0, 0, 2,       //   tag 0 PreviousProducerId = 2
            2, 2, 0, 2,                         //   tag 2 ClientTransactionVersion = 2
        ];
        assert_eq!(&v.encode(1)[..], &expected[..]);
        assert_eq!(decode_value(&expected).unwrap(), v);
    }

    #[test]
    fn value_v0_matches_hand_assembled_bytes() {
        #[rustfmt::skip]
        let bytes: Vec<u8> = vec![
            0, 0,                               // version 0
            0, 0, 0, 0, 0, 0, 0, 9,             // ProducerId
            0, 1,                               // ProducerEpoch
            0, 0, 0x27, 0x10,                   // TransactionTimeoutMs = 10000
            5,                                  // TransactionStatus = CompleteAbort
            0, 0, 0, 0,                         // empty partitions array
            0, 0, 0, 0, 0, 0, 0, 3,             // TransactionLastUpdateTimestampMs
            0, 0, 0, 0, 0, 0, 0, 2,             // TransactionStartTimestampMs
        ];
        let v = decode_value(&bytes).unwrap();
        assert_eq!(
            v,
            TxnLogValue {
                producer_id: 9,
                previous_producer_id: -1,
                next_producer_id: -1,
                producer_epoch: 1,
                next_producer_epoch: -1,
                transaction_timeout_ms: 10_000,
                transaction_status: 5,
                transaction_partitions: Some(vec![]),
                transaction_last_update_timestamp_ms: 3,
                transaction_start_timestamp_ms: 2,
                client_transaction_version: 0,
            }
        );
        assert_eq!(&v.encode(0)[..], &bytes[..]);
    }

    #[test]
    fn unknown_tagged_fields_are_skipped() {
        let v = sample();
        let mut bytes = v.encode(1).to_vec();
        // Replace the tagged-field section (count 2: tags 0 and 2) with one that adds tag 9.
        let tail = 1 + (1 + 1 + 8) + (1 + 1 + 2);
        bytes.truncate(bytes.len() - tail);
        bytes.extend_from_slice(&[3, 0, 8]);
        bytes.extend_from_slice(&3999i64.to_be_bytes());
        bytes.extend_from_slice(&[2, 2, 0, 2, 9, 3, 0xaa, 0xbb, 0xcc]);
        assert_eq!(decode_value(&bytes).unwrap(), v);
    }

    #[test]
    fn damage_is_an_error_not_a_panic() {
        let bytes = sample().encode(1);
        for cut in 0..bytes.len() {
            assert!(decode_value(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(
            decode_value(&[0, 2]),
            Err(DecodeError::UnknownValueVersion(2))
        );
        let mut long = bytes.to_vec();
        long.push(0);
        assert_eq!(
            decode_value(&long),
            Err(DecodeError::TrailingBytes { count: 1 })
        );
    }

    /// Flipped and dropped bytes anywhere in a value give an error or some value, never a panic
    /// (a seeded stand-in for the fuzz target the request decoder has).
    #[test]
    fn mutated_values_never_panic() {
        let mut state: u64 = 0x853c_49e6_748f_ea9b;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for version in [0, 1] {
            let good = sample().encode(version).to_vec();
            for _ in 0..20_000 {
                let mut bytes = good.clone();
                for _ in 0..1 + next() % 4 {
                    let i = (next() % bytes.len() as u64) as usize;
                    match next() % 3 {
                        0 => bytes[i] = next() as u8,
                        1 => {
                            bytes.remove(i);
                        }
                        _ => bytes.insert(i, next() as u8),
                    }
                    if bytes.is_empty() {
                        break;
                    }
                }
                let _ = decode_value(&bytes);
                let _ = decode_key(&bytes);
            }
        }
    }

    #[test]
    fn tombstone_decodes_to_no_value() {
        let key = encode_key("gone");
        assert_eq!(
            decode_record(&key, None).unwrap(),
            TxnLogRecord {
                transactional_id: "gone".into(),
                value: None
            }
        );
    }
}
