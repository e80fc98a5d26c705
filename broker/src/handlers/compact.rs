//! Writing the flexible versions' compact fields by hand, for the few responses past the
//! codec's versions (`codec_version`): unsigned varints, compact lengths and strings.

use bytes::{BufMut, BytesMut};

pub fn uvarint(buf: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

/// A compact array's or string's length: the length plus one.
pub fn len(buf: &mut BytesMut, len: usize) {
    uvarint(buf, len as u64 + 1);
}

pub fn string(buf: &mut BytesMut, s: &str) {
    len(buf, s.len());
    buf.put_slice(s.as_bytes());
}

/// A compact nullable string: 0 for null.
pub fn nullable_string(buf: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => string(buf, s),
        None => buf.put_u8(0),
    }
}

/// An empty tagged-fields section.
pub fn no_tagged_fields(buf: &mut BytesMut) {
    buf.put_u8(0);
}
