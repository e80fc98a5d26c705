//! Arbitrary bytes through the broker's own request path (`sluice_broker::wire`, the code a
//! connection runs): the 4-byte size prefix against the frame limit, the request header, then
//! the body for its API and version. Any input must give an error or a request, never a panic,
//! an abort or an allocation the frame limit does not bound.
//!
//! Two ways to read the input, so that the fuzzer reaches every API and version quickly:
//! - it starts with a zero byte (as every real frame under 16 MiB does): a stream of frames,
//!   decoded one after another as a connection reads them;
//! - otherwise: byte 1 picks an entry of the broker's `SUPPORTED` table, byte 2 a version in its
//!   range; a valid header for that API and version is put in front of the remaining bytes,
//!   which become the request body.

#![no_main]

use bytes::BytesMut;
use kafka_protocol::messages::RequestHeader;
use kafka_protocol::protocol::{Encodable, StrBytes};
use libfuzzer_sys::fuzz_target;
use sluice_broker::wire;

/// The frame limit (`socket.request.max.bytes`) for this target; no allocation may exceed it.
const MAX_FRAME: u32 = 1 << 20;

fn frames(mut data: &[u8]) {
    while data.len() >= 4 {
        let _ = wire::decode_frame(data, MAX_FRAME);
        let size = i32::from_be_bytes(data[..4].try_into().unwrap());
        match wire::body_len(size, MAX_FRAME) {
            Some(len) if data.len() >= 4 + len => data = &data[4 + len..],
            // Out of bounds or cut short: the connection closes here.
            _ => return,
        }
    }
}

fn structured(data: &[u8]) {
    if data.len() < 3 {
        return;
    }
    let (key, min, max) = wire::SUPPORTED[data[1] as usize % wire::SUPPORTED.len()];
    let version = min + (data[2] as i16 % (max - min + 1));
    let header = RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(1)
        .with_client_id(Some(StrBytes::from_static_str("fuzz")));
    let mut frame = BytesMut::from(&[0u8; 4][..]);
    header
        .encode(&mut frame, key.request_header_version(version))
        .expect("header encodes");
    frame.extend_from_slice(&data[3..]);
    let size = (frame.len() - 4) as u32;
    frame[..4].copy_from_slice(&size.to_be_bytes());
    if let Ok(wire::Decoded::Request {
        header, version: v, ..
    }) = wire::decode_frame(&frame, MAX_FRAME)
    {
        assert_eq!(header.request_api_key, key as i16);
        assert_eq!(v, version);
    }
}

fuzz_target!(|data: &[u8]| {
    match data.first() {
        Some(0) => frames(data),
        Some(_) => structured(data),
        None => {}
    }
});
