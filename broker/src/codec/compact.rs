//! Writing the flexible versions' compact fields by hand, and rewriting a message from one
//! version's bytes to another's ([`Rewrite`]), for the few versions past the codec's
//! (`codec_version`).

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub fn uvarint(buf: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

/// Reads an unsigned varint (at most five bytes) from the front of `src`.
pub fn read_uvarint(src: &mut Bytes) -> anyhow::Result<u64> {
    let mut value = 0u64;
    for shift in (0..35).step_by(7) {
        anyhow::ensure!(src.has_remaining(), "truncated request");
        let byte = src.get_u8();
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    anyhow::bail!("varint too long")
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

/// Copies a message from `src` to `out`, rewriting where the two versions differ.
pub struct Rewrite {
    src: Bytes,
    out: BytesMut,
}

impl Rewrite {
    pub fn new(src: Bytes) -> Rewrite {
        Rewrite {
            src,
            out: BytesMut::new(),
        }
    }

    /// Takes `n` bytes of `src` without copying them.
    pub fn take(&mut self, n: usize) -> anyhow::Result<Bytes> {
        self.need(n)?;
        Ok(self.src.split_to(n))
    }

    /// Writes bytes to `out` that `src` does not have.
    pub fn put(&mut self, bytes: &[u8]) {
        self.out.put_slice(bytes);
    }

    pub fn put_string(&mut self, s: &str) {
        string(&mut self.out, s);
    }

    fn need(&self, n: usize) -> anyhow::Result<()> {
        anyhow::ensure!(self.src.remaining() >= n, "truncated request");
        Ok(())
    }

    pub fn copy(&mut self, n: usize) -> anyhow::Result<()> {
        self.need(n)?;
        let bytes = self.src.split_to(n);
        self.out.put_slice(&bytes);
        Ok(())
    }

    pub fn read_uvarint(&mut self) -> anyhow::Result<u64> {
        read_uvarint(&mut self.src)
    }

    /// Copies a compact array's length; the element count, `None` for a null array.
    pub fn array(&mut self) -> anyhow::Result<Option<usize>> {
        let n = self.read_uvarint()?;
        uvarint(&mut self.out, n);
        Ok(n.checked_sub(1).map(|n| n as usize))
    }

    /// Copies a compact (nullable) string.
    pub fn string(&mut self) -> anyhow::Result<()> {
        let n = self.read_uvarint()?;
        uvarint(&mut self.out, n);
        self.copy(n.saturating_sub(1) as usize)
    }

    pub fn tagged_fields(&mut self) -> anyhow::Result<()> {
        let count = self.read_uvarint()?;
        uvarint(&mut self.out, count);
        for _ in 0..count {
            let tag = self.read_uvarint()?;
            uvarint(&mut self.out, tag);
            let size = self.read_uvarint()?;
            uvarint(&mut self.out, size);
            self.copy(size as usize)?;
        }
        Ok(())
    }

    /// What was written, followed by the rest of `src` unchanged.
    pub fn rest(mut self) -> Bytes {
        let rest = std::mem::take(&mut self.src);
        self.out.put_slice(&rest);
        self.out.freeze()
    }

    /// The message's last tagged fields; nothing may follow them.
    pub fn finish(mut self) -> anyhow::Result<Bytes> {
        self.tagged_fields()?;
        anyhow::ensure!(!self.src.has_remaining(), "bytes after the message");
        Ok(self.out.freeze())
    }
}
