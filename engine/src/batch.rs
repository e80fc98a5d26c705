//! Kafka RecordBatch v2: the unit the log stores, byte for byte as it travels on the wire.
//!
//! ```text
//! offset size field                    in CRC
//!      0    8 base_offset              no   (stamped by the log)
//!      8    4 batch_length             no   (bytes after this field)
//!     12    4 partition_leader_epoch   no   (stamped by the log)
//!     16    1 magic (= 2)              no
//!     17    4 crc (CRC-32C of 21..end) no
//!     21    2 attributes               yes  (bits 0-2 compression, 3 timestamp type,
//!                                            4 transactional, 5 control)
//!     23    4 last_offset_delta        yes
//!     27    8 base_timestamp           yes
//!     35    8 max_timestamp            yes
//!     43    8 producer_id              yes
//!     51    2 producer_epoch           yes
//!     53    4 base_sequence            yes
//!     57    4 record_count             yes
//!     61    . records                  yes
//! ```
//! All integers are big-endian. Records inside use zig-zag varints (see [`Record`]).

use std::borrow::Cow;

use bytes::{BufMut, Bytes, BytesMut};

use crate::compression::{self, Compression, DECOMPRESSED_BYTES_MAX};
use crate::error::BatchError;
use crate::types::{LeaderEpoch, Offset, Timestamp};

pub const BATCH_HEADER_SIZE: usize = 61;
/// Bytes before the batch_length field's count starts (base_offset + batch_length).
pub const LOG_OVERHEAD: usize = 12;
pub const MAGIC_V2: i8 = 2;
const CRC_START: usize = 21;

pub const ATTR_COMPRESSION_MASK: i16 = 0x07;
pub const ATTR_LOG_APPEND_TIME: i16 = 0x08;
pub const ATTR_TRANSACTIONAL: i16 = 0x10;
pub const ATTR_CONTROL: i16 = 0x20;

fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}
fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes(b[at..at + 2].try_into().unwrap())
}

/// A read-only view of a batch header. `bytes` holds at least the header.
#[derive(Clone, Copy, Debug)]
pub struct BatchHeader<'a> {
    bytes: &'a [u8],
}

impl<'a> BatchHeader<'a> {
    /// Parses the fixed header. Checks only that enough bytes are present.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, BatchError> {
        if bytes.len() < BATCH_HEADER_SIZE {
            return Err(BatchError::Truncated {
                need: BATCH_HEADER_SIZE,
                have: bytes.len(),
            });
        }
        Ok(BatchHeader { bytes })
    }

    /// The bytes the header was parsed from (the whole batch, where the caller had it).
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
    pub fn base_offset(&self) -> Offset {
        Offset(be_i64(self.bytes, 0))
    }
    pub fn batch_length(&self) -> i32 {
        be_i32(self.bytes, 8)
    }
    /// Total size of the batch on disk and on the wire, or `None` for a nonsensical length.
    pub fn total_size(&self) -> Option<usize> {
        let length = self.batch_length();
        if length < (BATCH_HEADER_SIZE - LOG_OVERHEAD) as i32 {
            return None;
        }
        Some(length as usize + LOG_OVERHEAD)
    }
    pub fn partition_leader_epoch(&self) -> LeaderEpoch {
        LeaderEpoch(be_i32(self.bytes, 12))
    }
    pub fn magic(&self) -> i8 {
        self.bytes[16] as i8
    }
    pub fn crc(&self) -> u32 {
        be_i32(self.bytes, 17) as u32
    }
    pub fn attributes(&self) -> i16 {
        be_i16(self.bytes, 21)
    }
    pub fn compression(&self) -> i16 {
        self.attributes() & ATTR_COMPRESSION_MASK
    }
    pub fn is_control(&self) -> bool {
        self.attributes() & ATTR_CONTROL != 0
    }
    pub fn is_transactional(&self) -> bool {
        self.attributes() & ATTR_TRANSACTIONAL != 0
    }
    pub fn is_log_append_time(&self) -> bool {
        self.attributes() & ATTR_LOG_APPEND_TIME != 0
    }
    pub fn last_offset_delta(&self) -> i32 {
        be_i32(self.bytes, 23)
    }
    pub fn last_offset(&self) -> Offset {
        Offset(self.base_offset().0 + self.last_offset_delta() as i64)
    }
    pub fn base_timestamp(&self) -> Timestamp {
        Timestamp(be_i64(self.bytes, 27))
    }
    pub fn max_timestamp(&self) -> Timestamp {
        Timestamp(be_i64(self.bytes, 35))
    }
    pub fn producer_id(&self) -> i64 {
        be_i64(self.bytes, 43)
    }
    pub fn producer_epoch(&self) -> i16 {
        be_i16(self.bytes, 51)
    }
    pub fn base_sequence(&self) -> i32 {
        be_i32(self.bytes, 53)
    }
    pub fn record_count(&self) -> i32 {
        be_i32(self.bytes, 57)
    }
}

/// CRC-32C over the part of the batch the CRC covers.
pub fn compute_crc(batch: &[u8]) -> u32 {
    crc32c::crc32c(&batch[CRC_START..])
}

/// Checks the parts of a stored batch that a reader relies on: length, magic and CRC.
/// Used on every batch read back from disk and on every batch recovery scans.
pub fn verify(batch: &[u8]) -> Result<BatchHeader<'_>, BatchError> {
    let header = BatchHeader::parse(batch)?;
    let Some(size) = header.total_size() else {
        return Err(BatchError::LengthMismatch {
            length: header.batch_length() as i64 + LOG_OVERHEAD as i64,
            have: batch.len(),
        });
    };
    if size != batch.len() {
        return Err(BatchError::LengthMismatch {
            length: size as i64,
            have: batch.len(),
        });
    }
    if header.magic() != MAGIC_V2 {
        return Err(BatchError::BadMagic {
            magic: header.magic(),
        });
    }
    let computed = compute_crc(batch);
    if computed != header.crc() {
        return Err(BatchError::BadCrc {
            stored: header.crc(),
            computed,
        });
    }
    Ok(header)
}

/// What [`validate_for_append`] found in a valid batch.
#[derive(Debug)]
pub struct ValidBatch<'a> {
    /// The batch's codec.
    pub compression: Compression,
    /// The largest record timestamp. Kafka's `LogValidator` computes it from the records, not
    /// from the header: librdkafka sends a max timestamp of 0 with records of timestamp -1.
    pub max_timestamp: Timestamp,
    /// The records section, decompressed: borrowed from the batch when it is uncompressed.
    pub records: Cow<'a, [u8]>,
}

/// The records section of a batch (the bytes after its header), decompressed if need be.
pub fn records_section(batch: &[u8]) -> Result<Cow<'_, [u8]>, BatchError> {
    let header = BatchHeader::parse(batch)?;
    let compression = Compression::from_attributes(header.attributes())?;
    let section = &batch[BATCH_HEADER_SIZE..];
    Ok(match compression {
        Compression::None => Cow::Borrowed(section),
        codec => Cow::Owned(compression::decompress(
            codec,
            section,
            DECOMPRESSED_BYTES_MAX,
        )?),
    })
}

/// Full validation of a batch arriving from a producer, before the log assigns offsets.
/// `max_message_bytes` is the topic's `max.message.bytes`; `keys_required` is set for a
/// compacted topic, where every record of a data batch needs a key.
///
/// Compressed batches are decompressed and their records checked like uncompressed ones, as
/// Kafka's `LogValidator` does. Records without a key are collected, not stopped at, so that
/// the producer learns every one of them (`BatchError::MissingKey`).
pub fn validate_for_append(
    batch: &[u8],
    max_message_bytes: u32,
    keys_required: bool,
) -> Result<ValidBatch<'_>, BatchError> {
    if batch.len() > max_message_bytes as usize {
        return Err(BatchError::TooLarge {
            size: batch.len(),
            max: max_message_bytes,
        });
    }
    let header = verify(batch)?;
    let count = header.record_count();
    let delta = header.last_offset_delta();
    if count <= 0 || delta != count - 1 {
        return Err(BatchError::BadRecordCount {
            record_count: count,
            last_offset_delta: delta,
        });
    }
    let compression = Compression::from_attributes(header.attributes())?;
    let records = records_section(batch)?;
    let keys_required = keys_required && !header.is_control();
    let mut seen = 0;
    let mut max_delta = i64::MIN;
    let mut keyless = Vec::new();
    for record in Records::section(&records, count) {
        let record = record?;
        if record.offset_delta != seen {
            return Err(BatchError::BadRecord {
                index: seen,
                reason: "offset delta out of sequence",
            });
        }
        if keys_required && record.key.is_none() {
            keyless.push(seen);
        }
        max_delta = max_delta.max(record.timestamp_delta);
        seen += 1;
    }
    if seen != count {
        return Err(BatchError::BadRecordCount {
            record_count: count,
            last_offset_delta: seen - 1,
        });
    }
    if !keyless.is_empty() {
        return Err(BatchError::MissingKey {
            batch_indexes: keyless,
        });
    }
    Ok(ValidBatch {
        compression,
        max_timestamp: Timestamp(header.base_timestamp().0.saturating_add(max_delta)),
        records,
    })
}

/// A copy of `batch` with another records section: `records` (already compressed as
/// `attributes` say) holding `record_count` records. Every other header field is kept (base
/// offset, leader epoch, last offset delta, timestamps, producer id, epoch and sequence); the
/// length and the CRC are recomputed.
pub fn rebuild(batch: &[u8], attributes: i16, record_count: i32, records: &[u8]) -> BytesMut {
    assert!(record_count > 0, "a record batch holds at least one record");
    rebuild_any(batch, attributes, record_count, records)
}

/// `batch`'s header with no records: what compaction keeps of a producer's last batch once it
/// has removed every record in it, so that the producer's epoch and last sequence stay in the
/// log for whoever rebuilds producer state from it (a follower, or a replay without a
/// snapshot), as Kafka's cleaner does. Base offset, last offset delta, timestamps and producer
/// fields are kept; the codec bits are cleared, as there is nothing to decompress.
pub fn emptied(batch: &[u8]) -> BytesMut {
    let header = BatchHeader::parse(batch).expect("a stored batch has a header");
    rebuild_any(batch, header.attributes() & !ATTR_COMPRESSION_MASK, 0, &[])
}

fn rebuild_any(batch: &[u8], attributes: i16, record_count: i32, records: &[u8]) -> BytesMut {
    assert!(
        batch.len() >= BATCH_HEADER_SIZE,
        "rebuilding a batch of {} bytes",
        batch.len()
    );
    let size = BATCH_HEADER_SIZE + records.len();
    let mut b = BytesMut::with_capacity(size);
    b.extend_from_slice(&batch[..BATCH_HEADER_SIZE]);
    b.extend_from_slice(records);
    b[8..12].copy_from_slice(&((size - LOG_OVERHEAD) as i32).to_be_bytes());
    b[21..23].copy_from_slice(&attributes.to_be_bytes());
    b[57..61].copy_from_slice(&record_count.to_be_bytes());
    let crc = compute_crc(&b);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

/// `batch` with its records (`records`, the decompressed section) compressed with `codec`
/// instead: what a topic whose `compression.type` differs from the producer's codec stores, as
/// Kafka does. The records are kept byte for byte, so are offsets, timestamps and producer
/// fields.
pub fn recompress(batch: &[u8], records: &[u8], codec: Compression) -> BytesMut {
    let header = BatchHeader::parse(batch).expect("a validated batch has a header");
    let attributes = (header.attributes() & !ATTR_COMPRESSION_MASK) | codec.id();
    rebuild(
        batch,
        attributes,
        header.record_count(),
        &compression::compress(codec, records),
    )
}

/// Sets a `CreateTime` batch's max timestamp to what its records hold, recomputing the CRC (the
/// field is inside it), as Kafka's `LogValidator` does.
pub fn stamp_max_timestamp(batch: &mut [u8], max_timestamp: Timestamp) {
    batch[35..43].copy_from_slice(&max_timestamp.0.to_be_bytes());
    let crc = compute_crc(batch);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
}

/// Stamps the fields outside the CRC that the log owns.
pub fn stamp(batch: &mut [u8], base_offset: Offset, leader_epoch: LeaderEpoch) {
    batch[0..8].copy_from_slice(&base_offset.0.to_be_bytes());
    batch[12..16].copy_from_slice(&leader_epoch.0.to_be_bytes());
}

/// Rewrites a batch for a `LogAppendTime` topic: sets the timestamp type and the max timestamp,
/// then recomputes the CRC (both fields are inside it).
pub fn stamp_log_append_time(batch: &mut [u8], now: Timestamp) {
    let attributes = be_i16(batch, 21) | ATTR_LOG_APPEND_TIME;
    batch[21..23].copy_from_slice(&attributes.to_be_bytes());
    batch[35..43].copy_from_slice(&now.0.to_be_bytes());
    let crc = compute_crc(batch);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
}

/// One record of a batch (of its decompressed records section when the batch is compressed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub attributes: i8,
    pub timestamp_delta: i64,
    pub offset_delta: i32,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: Vec<(&'a [u8], Option<&'a [u8]>)>,
    /// The record's bytes including its length prefix, for copying it unchanged.
    pub raw: &'a [u8],
}

/// Iterates the records of an uncompressed batch, or of a records section. Stops at the first
/// malformed record.
pub struct Records<'a> {
    data: &'a [u8],
    at: usize,
    index: i32,
    count: i32,
    failed: bool,
}

impl<'a> Records<'a> {
    pub fn new(batch: &'a [u8]) -> Records<'a> {
        let count = if batch.len() >= BATCH_HEADER_SIZE {
            be_i32(batch, 57)
        } else {
            0
        };
        Records {
            data: batch,
            at: BATCH_HEADER_SIZE,
            index: 0,
            count,
            failed: false,
        }
    }

    /// The `count` records of a records section: a batch's bytes after its header, decompressed
    /// (see [`records_section`]).
    pub fn section(records: &'a [u8], count: i32) -> Records<'a> {
        Records {
            data: records,
            at: 0,
            index: 0,
            count,
            failed: false,
        }
    }

    fn parse_one(&mut self) -> Result<Record<'a>, &'static str> {
        let start = self.at;
        let length = read_varint(self.data, &mut self.at)?;
        if length < 0 {
            return Err("negative record length");
        }
        let body_start = self.at;
        let end = body_start
            .checked_add(length as usize)
            .filter(|&end| end <= self.data.len())
            .ok_or("record length runs past the batch")?;
        let body = &self.data[..end];
        let mut at = body_start;
        if at >= end {
            return Err("record has no attributes");
        }
        let attributes = body[at] as i8;
        at += 1;
        let timestamp_delta = read_varlong(body, &mut at)?;
        let offset_delta = read_varint(body, &mut at)?;
        let key = read_bytes(body, &mut at)?;
        let value = read_bytes(body, &mut at)?;
        let header_count = read_varint(body, &mut at)?;
        if header_count < 0 || header_count as usize > end - at {
            return Err("bad header count");
        }
        let mut headers = Vec::with_capacity(header_count as usize);
        for _ in 0..header_count {
            let Some(hkey) = read_bytes(body, &mut at)? else {
                return Err("null header key");
            };
            let hvalue = read_bytes(body, &mut at)?;
            headers.push((hkey, hvalue));
        }
        if at != end {
            return Err("record length disagrees with its fields");
        }
        self.at = end;
        Ok(Record {
            attributes,
            timestamp_delta,
            offset_delta,
            key,
            value,
            headers,
            raw: &self.data[start..end],
        })
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.index >= self.count {
            if !self.failed && self.index == self.count && self.at != self.data.len() {
                self.failed = true;
                return Some(Err(BatchError::BadRecord {
                    index: self.index,
                    reason: "bytes left after the last record",
                }));
            }
            return None;
        }
        match self.parse_one() {
            Ok(record) => {
                self.index += 1;
                Some(Ok(record))
            }
            Err(reason) => {
                self.failed = true;
                Some(Err(BatchError::BadRecord {
                    index: self.index,
                    reason,
                }))
            }
        }
    }
}

fn read_varlong(b: &[u8], at: &mut usize) -> Result<i64, &'static str> {
    let mut value: u64 = 0;
    let mut shift = 0;
    loop {
        let byte = *b.get(*at).ok_or("varint runs past the end")?;
        *at += 1;
        value |= ((byte & 0x7f) as u64) << shift;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 63 {
            return Err("varint too long");
        }
    }
    Ok(((value >> 1) as i64) ^ -((value & 1) as i64))
}

fn read_varint(b: &[u8], at: &mut usize) -> Result<i32, &'static str> {
    let v = read_varlong(b, at)?;
    i32::try_from(v).map_err(|_| "varint out of range")
}

fn read_bytes<'a>(b: &'a [u8], at: &mut usize) -> Result<Option<&'a [u8]>, &'static str> {
    let len = read_varint(b, at)?;
    if len < 0 {
        return Ok(None);
    }
    let end = at
        .checked_add(len as usize)
        .filter(|&end| end <= b.len())
        .ok_or("field runs past the record")?;
    let slice = &b[*at..end];
    *at = end;
    Ok(Some(slice))
}

pub fn put_varlong(buf: &mut impl BufMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        buf.put_u8((z as u8) | 0x80);
        z >>= 7;
    }
    buf.put_u8(z as u8);
}

pub fn put_varint(buf: &mut impl BufMut, v: i32) {
    put_varlong(buf, v as i64)
}

fn put_nullable(buf: &mut impl BufMut, b: Option<&[u8]>) {
    match b {
        None => put_varint(buf, -1),
        Some(b) => {
            put_varint(buf, b.len() as i32);
            buf.put_slice(b);
        }
    }
}

/// A record to put into a batch with [`BatchBuilder`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NewRecord {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    pub timestamp: Timestamp,
}

/// Builds v2 batches: for tests, tools, benchmarks and the broker's own internal records.
/// Base offset is 0 and the partition leader epoch -1; the log stamps both. Uncompressed unless
/// [`BatchBuilder::compression`] says otherwise.
#[derive(Debug)]
pub struct BatchBuilder {
    compression: Compression,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    attributes: i16,
    records: BytesMut,
    count: i32,
    base_timestamp: Option<i64>,
    max_timestamp: i64,
}

impl Default for BatchBuilder {
    fn default() -> Self {
        BatchBuilder::new()
    }
}

impl BatchBuilder {
    pub fn new() -> BatchBuilder {
        BatchBuilder {
            compression: Compression::None,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            attributes: 0,
            records: BytesMut::new(),
            count: 0,
            base_timestamp: None,
            max_timestamp: -1,
        }
    }

    pub fn producer(mut self, producer_id: i64, producer_epoch: i16, base_sequence: i32) -> Self {
        self.producer_id = producer_id;
        self.producer_epoch = producer_epoch;
        self.base_sequence = base_sequence;
        self
    }

    pub fn attributes(mut self, attributes: i16) -> Self {
        self.attributes = attributes;
        self
    }

    /// Compresses the records with `codec` (attribute bits 0-2 then follow it).
    pub fn compression(mut self, codec: Compression) -> Self {
        self.compression = codec;
        self
    }

    pub fn record_count(&self) -> i32 {
        self.count
    }

    pub fn push(&mut self, record: &NewRecord) {
        let base = *self.base_timestamp.get_or_insert(record.timestamp.0);
        self.max_timestamp = self.max_timestamp.max(record.timestamp.0);
        let mut body = BytesMut::new();
        body.put_i8(0);
        put_varlong(&mut body, record.timestamp.0 - base);
        put_varint(&mut body, self.count);
        put_nullable(&mut body, record.key.as_deref());
        put_nullable(&mut body, record.value.as_deref());
        put_varint(&mut body, record.headers.len() as i32);
        for (k, v) in &record.headers {
            put_nullable(&mut body, Some(k));
            put_nullable(&mut body, v.as_deref());
        }
        put_varint(&mut self.records, body.len() as i32);
        self.records.put_slice(&body);
        self.count += 1;
    }

    pub fn build(self) -> Bytes {
        assert!(self.count > 0, "a record batch holds at least one record");
        let records = compression::compress(self.compression, &self.records);
        // Without a codec the attributes go as given, compression bits included: tests build
        // batches that only claim to be compressed.
        let attributes = match self.compression {
            Compression::None => self.attributes,
            codec => (self.attributes & !ATTR_COMPRESSION_MASK) | codec.id(),
        };
        let size = BATCH_HEADER_SIZE + records.len();
        let mut b = BytesMut::with_capacity(size);
        b.put_i64(0);
        b.put_i32((size - LOG_OVERHEAD) as i32);
        b.put_i32(-1);
        b.put_i8(MAGIC_V2);
        b.put_u32(0);
        b.put_i16(attributes);
        b.put_i32(self.count - 1);
        b.put_i64(self.base_timestamp.unwrap_or(-1));
        b.put_i64(self.max_timestamp);
        b.put_i64(self.producer_id);
        b.put_i16(self.producer_epoch);
        b.put_i32(self.base_sequence);
        b.put_i32(self.count);
        b.put_slice(&records);
        let crc = compute_crc(&b);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b.freeze()
    }
}

/// A transaction marker (a control batch) as a partition leader writes it for WriteTxnMarkers:
/// transactional and control attributes, no sequence, and one record whose key is
/// `(version 0, type)` (`type` 0 aborts, 1 commits) and whose value is
/// `(version 0, coordinator_epoch)`, as in Kafka's `EndTransactionMarker`.
pub fn control_batch(
    producer_id: i64,
    producer_epoch: i16,
    commit: bool,
    coordinator_epoch: i32,
    timestamp: Timestamp,
) -> Bytes {
    let mut key = Vec::with_capacity(4);
    key.extend_from_slice(&0i16.to_be_bytes());
    key.extend_from_slice(&i16::from(commit).to_be_bytes());
    let mut value = Vec::with_capacity(6);
    value.extend_from_slice(&0i16.to_be_bytes());
    value.extend_from_slice(&coordinator_epoch.to_be_bytes());
    let mut b = BatchBuilder::new()
        .producer(producer_id, producer_epoch, -1)
        .attributes(ATTR_TRANSACTIONAL | ATTR_CONTROL);
    b.push(&NewRecord {
        key: Some(key),
        value: Some(value),
        headers: Vec::new(),
        timestamp,
    });
    b.build()
}

/// Convenience for tests and tools: one batch from (key, value) pairs at one timestamp.
/// A key and a value, each nullable.
pub type KeyValue<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);

pub fn simple_batch(records: &[KeyValue<'_>], timestamp: Timestamp) -> Bytes {
    let mut builder = BatchBuilder::new();
    for (key, value) in records {
        builder.push(&NewRecord {
            key: key.map(|k| k.to_vec()),
            value: value.map(|v| v.to_vec()),
            headers: Vec::new(),
            timestamp,
        });
    }
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_batch_validates_and_iterates() {
        let mut b = BatchBuilder::new();
        for i in 0..5u8 {
            b.push(&NewRecord {
                key: Some(vec![i]),
                value: if i == 3 { None } else { Some(vec![i; 10]) },
                headers: vec![(b"h".to_vec(), Some(vec![i]))],
                timestamp: Timestamp(1000 + i as i64),
            });
        }
        let batch = b.build();
        validate_for_append(&batch, 1 << 20, false).unwrap();
        let header = BatchHeader::parse(&batch).unwrap();
        assert_eq!(header.record_count(), 5);
        assert_eq!(header.last_offset_delta(), 4);
        assert_eq!(header.max_timestamp(), Timestamp(1004));
        let records: Vec<_> = Records::new(&batch).map(|r| r.unwrap()).collect();
        assert_eq!(records.len(), 5);
        assert_eq!(records[3].value, None);
        assert_eq!(records[4].key, Some(&[4u8][..]));
        assert_eq!(records[2].timestamp_delta, 2);
        assert_eq!(records[1].headers, vec![(&b"h"[..], Some(&[1u8][..]))]);
    }

    #[test]
    fn stamping_keeps_crc_valid() {
        let mut batch = simple_batch(&[(None, Some(b"v"))], Timestamp(5)).to_vec();
        stamp(&mut batch, Offset(77), LeaderEpoch(3));
        let h = verify(&batch).unwrap();
        assert_eq!(h.base_offset(), Offset(77));
        assert_eq!(h.partition_leader_epoch(), LeaderEpoch(3));
        stamp_log_append_time(&mut batch, Timestamp(999));
        let h = verify(&batch).unwrap();
        assert!(h.is_log_append_time());
        assert_eq!(h.max_timestamp(), Timestamp(999));
    }

    #[test]
    fn every_single_bit_flip_in_the_crc_range_is_caught() {
        let batch = simple_batch(&[(Some(b"k"), Some(b"value"))], Timestamp(5)).to_vec();
        for byte in 17..batch.len() {
            for bit in 0..8 {
                let mut b = batch.clone();
                b[byte] ^= 1 << bit;
                assert!(verify(&b).is_err(), "flip at {byte}:{bit} not detected");
            }
        }
    }

    #[test]
    fn lying_lengths_are_rejected() {
        let batch = simple_batch(&[(None, Some(b"abc"))], Timestamp(1)).to_vec();
        let mut longer = batch.clone();
        longer.extend_from_slice(&[0; 4]);
        assert!(matches!(
            validate_for_append(&longer, 1 << 20, false),
            Err(BatchError::LengthMismatch { .. })
        ));
        assert!(matches!(
            validate_for_append(&batch[..40], 1 << 20, false),
            Err(BatchError::Truncated { .. })
        ));
        assert!(matches!(
            validate_for_append(&batch, 10, false),
            Err(BatchError::TooLarge { .. })
        ));
        let mut magic = batch.clone();
        magic[16] = 1;
        assert!(matches!(
            validate_for_append(&magic, 1 << 20, false),
            Err(BatchError::BadMagic { magic: 1 })
        ));
    }

    #[test]
    fn record_count_must_match_records() {
        let mut batch =
            simple_batch(&[(None, Some(b"a")), (None, Some(b"b"))], Timestamp(1)).to_vec();
        batch[57..61].copy_from_slice(&3i32.to_be_bytes());
        batch[23..27].copy_from_slice(&2i32.to_be_bytes());
        let crc = compute_crc(&batch);
        batch[17..21].copy_from_slice(&crc.to_be_bytes());
        assert!(validate_for_append(&batch, 1 << 20, false).is_err());
    }

    const CODECS: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

    /// An idempotent producer's batch of `n` records with headers, some keyless, timestamps out
    /// of order, compressed with `codec`.
    fn producer_batch(codec: Compression, n: u8) -> Bytes {
        let mut b = BatchBuilder::new()
            .producer(4242, 7, 1000)
            .compression(codec);
        for i in 0..n {
            b.push(&NewRecord {
                key: (i % 3 != 1).then(|| vec![b'k', i]),
                value: Some(vec![i; 40]),
                headers: vec![(b"h".to_vec(), Some(vec![i]))],
                timestamp: Timestamp(5_000 + ((i as i64 * 7) % 11)),
            });
        }
        b.build()
    }

    /// (offset delta, timestamp delta, key, value) of a record.
    type Fields = (i32, i64, Option<Vec<u8>>, Option<Vec<u8>>);

    fn records_of(batch: &[u8]) -> Vec<Fields> {
        let section = records_section(batch).unwrap();
        let count = BatchHeader::parse(batch).unwrap().record_count();
        Records::section(&section, count)
            .map(|r| {
                let r = r.unwrap();
                (
                    r.offset_delta,
                    r.timestamp_delta,
                    r.key.map(<[u8]>::to_vec),
                    r.value.map(<[u8]>::to_vec),
                )
            })
            .collect()
    }

    #[test]
    fn compressed_batches_are_validated_record_by_record() {
        let plain = producer_batch(Compression::None, 20);
        for codec in CODECS {
            let batch = producer_batch(codec, 20);
            let header = BatchHeader::parse(&batch).unwrap();
            assert_eq!(header.compression(), codec.id());
            let valid = validate_for_append(&batch, 1 << 20, false).unwrap();
            assert_eq!(valid.compression, codec);
            assert_eq!(valid.max_timestamp, Timestamp(5_010));
            assert_eq!(&valid.records[..], &plain[BATCH_HEADER_SIZE..]);
            assert_eq!(records_of(&batch), records_of(&plain));
        }
    }

    #[test]
    fn the_max_timestamp_of_a_compressed_batch_comes_from_its_records() {
        // librdkafka sends max_timestamp 0 with records of timestamp -1; the records decide.
        for codec in CODECS {
            let mut b = BatchBuilder::new().compression(codec);
            for _ in 0..3 {
                b.push(&NewRecord {
                    value: Some(b"v".to_vec()),
                    timestamp: Timestamp::NONE,
                    ..NewRecord::default()
                });
            }
            let mut batch = b.build().to_vec();
            batch[35..43].copy_from_slice(&0i64.to_be_bytes());
            let crc = compute_crc(&batch);
            batch[17..21].copy_from_slice(&crc.to_be_bytes());
            let valid = validate_for_append(&batch, 1 << 20, false).unwrap();
            assert_eq!(valid.max_timestamp, Timestamp::NONE, "{codec:?}");
        }
    }

    #[test]
    fn keyless_records_are_all_named_in_compressed_batches_too() {
        for codec in CODECS {
            let batch = producer_batch(codec, 8);
            match validate_for_append(&batch, 1 << 20, true) {
                Err(BatchError::MissingKey { batch_indexes }) => {
                    assert_eq!(batch_indexes, vec![1, 4, 7], "{codec:?}")
                }
                other => panic!("{codec:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn recompressed_batches_keep_offsets_timestamps_and_producer_fields() {
        for from in CODECS {
            let mut original = producer_batch(from, 30).to_vec();
            stamp(&mut original, Offset(900), LeaderEpoch(5));
            let plain = records_section(&original).unwrap().into_owned();
            for to in CODECS {
                let rebuilt = recompress(&original, &plain, to);
                let old = verify(&original).unwrap();
                let new = verify(&rebuilt).expect("the recompressed batch's CRC is valid");
                assert_eq!(new.compression(), to.id(), "{from:?} -> {to:?}");
                assert_eq!(
                    new.attributes() & !ATTR_COMPRESSION_MASK,
                    old.attributes() & !ATTR_COMPRESSION_MASK
                );
                assert_eq!(new.base_offset(), Offset(900));
                assert_eq!(new.partition_leader_epoch(), LeaderEpoch(5));
                assert_eq!(new.last_offset_delta(), old.last_offset_delta());
                assert_eq!(new.record_count(), 30);
                assert_eq!(new.base_timestamp(), old.base_timestamp());
                assert_eq!(new.max_timestamp(), old.max_timestamp());
                assert_eq!(
                    (new.producer_id(), new.producer_epoch(), new.base_sequence()),
                    (4242, 7, 1000)
                );
                assert_eq!(records_of(&rebuilt), records_of(&original));
                validate_for_append(&rebuilt, 1 << 20, false).unwrap();
            }
        }
    }

    #[test]
    fn a_batch_with_an_unknown_codec_or_undecodable_records_is_refused() {
        let mut batch = producer_batch(Compression::Gzip, 5).to_vec();
        batch[22] = (batch[22] & !0x07) | 6;
        let crc = compute_crc(&batch);
        batch[17..21].copy_from_slice(&crc.to_be_bytes());
        assert!(matches!(
            validate_for_append(&batch, 1 << 20, false),
            Err(BatchError::UnknownCompression { codec: 6 })
        ));
        let mut batch = producer_batch(Compression::Zstd, 5).to_vec();
        let last = batch.len() - 3;
        batch[last] ^= 0xff;
        let crc = compute_crc(&batch);
        batch[17..21].copy_from_slice(&crc.to_be_bytes());
        assert!(matches!(
            validate_for_append(&batch, 1 << 20, false),
            Err(BatchError::BadCompression { codec: "zstd", .. })
        ));
    }
}
