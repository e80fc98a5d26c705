//! A producer's record batch through the engine's validation (`sluice_engine::batch`): length,
//! magic, CRC-32C, record count against the last offset delta, and the walk over every record of
//! an uncompressed batch (varints, key, value, headers). Compressed batches are stored as sent
//! and not decompressed by the engine, so only their header is checked. Any input must give an
//! error or a valid batch, never a panic; a batch that passes must survive what the log then
//! does to it (stamping offsets, LogAppendTime) and still verify.
//!
//! Byte 0 is a set of flags, the rest is the batch: bit 0 rewrites the batch length field to
//! match, bit 1 recomputes the CRC, so that the fuzzer gets past both and explores the records.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_engine::batch::{self, BatchHeader, Records};
use sluice_engine::{LeaderEpoch, Offset, Timestamp};

/// `max.message.bytes` for this target.
const MAX_MESSAGE_BYTES: u32 = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut b = rest.to_vec();
    if flags & 1 != 0 && b.len() >= 12 {
        let length = (b.len() - 12) as i32;
        b[8..12].copy_from_slice(&length.to_be_bytes());
    }
    if flags & 2 != 0 && b.len() >= batch::BATCH_HEADER_SIZE {
        let crc = batch::compute_crc(&b);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
    }

    // What a reader does with any stored bytes: verify, then walk the records.
    if let Ok(header) = batch::verify(&b) {
        let _ = (
            header.last_offset_delta(),
            header.record_count(),
            header.is_control(),
        );
        for record in Records::new(&b) {
            if record.is_err() {
                break;
            }
        }
    }
    // The records walk also on bytes that never verified.
    for record in Records::new(&b).take(1 << 16) {
        if record.is_err() {
            break;
        }
    }

    if batch::validate_for_append(&b, MAX_MESSAGE_BYTES, false).is_err() {
        return;
    }
    // Accepted: everything the log relies on afterwards must hold.
    let header = BatchHeader::parse(&b).expect("an accepted batch has a header");
    let count = header.record_count();
    assert!(count > 0);
    assert_eq!(header.last_offset_delta(), count - 1);
    if header.compression() == 0 {
        let records: Vec<_> = Records::new(&b)
            .map(|r| r.expect("an accepted batch's records parse"))
            .collect();
        assert_eq!(records.len(), count as usize);
        for (i, r) in records.iter().enumerate() {
            assert_eq!(r.offset_delta, i as i32);
        }
    }
    // The log stamps a base offset (at most i64::MAX - i32::MAX, so the last offset fits) and a
    // leader epoch outside the CRC, and for LogAppendTime topics the time inside it.
    let base = Offset(i64::from_be_bytes([flags; 8]) & 0x0000_ffff_ffff_ffff);
    batch::stamp(&mut b, base, LeaderEpoch(flags as i32));
    let stamped = batch::verify(&b).expect("stamping keeps the CRC valid");
    assert_eq!(stamped.base_offset(), base);
    assert_eq!(stamped.last_offset(), Offset(base.0 + count as i64 - 1));
    batch::stamp_log_append_time(&mut b, Timestamp(1_700_000_000_000));
    let stamped = batch::verify(&b).expect("LogAppendTime keeps the CRC valid");
    assert!(stamped.is_log_append_time());
    batch::validate_for_append(&b, MAX_MESSAGE_BYTES, false).expect("still valid after stamping");
});
