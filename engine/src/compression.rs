//! The record batch codecs Kafka defines: the records section of a v2 batch (everything after
//! the 61-byte header) is compressed as a whole with the codec named in attribute bits 0-2.
//!
//! The log decompresses a compressed batch on append (to validate its records and compute its
//! max timestamp, as Kafka's `LogValidator` does), recompresses it when the topic's
//! `compression.type` names another codec, and decompresses again for compaction and for
//! ListOffsets by timestamp. Plain functions over byte slices: no state, usable on any shard.
//!
//! What each codec reads and writes, as Kafka's own clients and broker do:
//! - gzip: RFC 1952 members (several concatenated members are read as one stream).
//! - snappy: written in the xerial framing of Kafka's Java client (snappy-java's
//!   `SnappyOutputStream`): an 8-byte magic, two big-endian i32 versions, then blocks of a
//!   big-endian i32 length and raw snappy of at most [`SNAPPY_BLOCK_BYTES`] input bytes each.
//!   Read in that framing or as one raw snappy block (what librdkafka and others send).
//! - lz4: the LZ4 frame format with independent 64 KiB blocks and no checksums but the
//!   descriptor's, as Kafka writes it (Kafka's reader refuses dependent blocks).
//! - zstd: standard zstd frames, level 3 (Kafka's default level).

use std::io::Read;

use crate::error::BatchError;

/// Attribute bits 0-2 of a batch: its codec.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compression {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

/// The most bytes a batch's records may decompress to. A batch arrives at most
/// `max.message.bytes` large (1 MiB by default), and producers bound their batches by the
/// uncompressed size (librdkafka's `batch.size`, 1 MB by default; the Java client's estimate of
/// 16 KiB compressed), so 64 MiB is far beyond what a producer builds and still keeps a
/// malicious batch (zstd expands zeros some 30,000 times) from taking the shard's memory.
pub const DECOMPRESSED_BYTES_MAX: usize = 64 << 20;

/// Input bytes per xerial snappy block: snappy-java's default block size, which Kafka's Java
/// client keeps.
pub const SNAPPY_BLOCK_BYTES: usize = 32 << 10;

/// zstd level for batches the log compresses: Kafka's `compression.zstd.level` default.
pub const ZSTD_LEVEL: i32 = 3;

/// The xerial snappy stream header: magic, then version 1 and minimum compatible version 1.
const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
const XERIAL_HEADER_SIZE: usize = 16;
const XERIAL_VERSION: i32 = 1;

impl Compression {
    /// The codec of a batch with these attributes; ids 5-7 are not codecs.
    pub fn from_attributes(attributes: i16) -> Result<Compression, BatchError> {
        match attributes & crate::batch::ATTR_COMPRESSION_MASK {
            0 => Ok(Compression::None),
            1 => Ok(Compression::Gzip),
            2 => Ok(Compression::Snappy),
            3 => Ok(Compression::Lz4),
            4 => Ok(Compression::Zstd),
            codec => Err(BatchError::UnknownCompression { codec }),
        }
    }

    /// The id stored in attribute bits 0-2.
    pub fn id(self) -> i16 {
        match self {
            Compression::None => 0,
            Compression::Gzip => 1,
            Compression::Snappy => 2,
            Compression::Lz4 => 3,
            Compression::Zstd => 4,
        }
    }

    /// Kafka's name for the codec (`compression.type` values; "none" is `uncompressed` there).
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

fn corrupt(codec: Compression, reason: impl std::fmt::Display) -> BatchError {
    BatchError::BadCompression {
        codec: codec.name(),
        reason: reason.to_string(),
    }
}

/// Reads a whole decoder, failing once it yields more than `max` bytes.
fn read_bounded(
    codec: Compression,
    mut reader: impl Read,
    max: usize,
) -> Result<Vec<u8>, BatchError> {
    let mut out = Vec::new();
    let read = (&mut reader)
        .take(max as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| corrupt(codec, e))?;
    if read > max {
        return Err(BatchError::DecompressedTooLarge { max });
    }
    Ok(out)
}

/// Decompresses a records section compressed with `codec`, refusing output above `max` bytes.
pub fn decompress(codec: Compression, data: &[u8], max: usize) -> Result<Vec<u8>, BatchError> {
    match codec {
        Compression::None => {
            if data.len() > max {
                return Err(BatchError::DecompressedTooLarge { max });
            }
            Ok(data.to_vec())
        }
        Compression::Gzip => read_bounded(codec, flate2::read::MultiGzDecoder::new(data), max),
        Compression::Snappy => snappy_decompress(data, max),
        Compression::Lz4 => read_bounded(codec, lz4_flex::frame::FrameDecoder::new(data), max),
        Compression::Zstd => {
            let decoder =
                zstd::stream::read::Decoder::with_buffer(data).map_err(|e| corrupt(codec, e))?;
            read_bounded(codec, decoder, max)
        }
    }
}

/// Compresses a records section with `codec`, in the framing Kafka writes (see the module doc).
pub fn compress(codec: Compression, data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    // Writing into a Vec cannot fail, so the encoders' io::Results are programmer errors here.
    match codec {
        Compression::None => data.to_vec(),
        Compression::Gzip => {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            encoder.write_all(data).expect("gzip into memory");
            encoder.finish().expect("gzip into memory")
        }
        Compression::Snappy => snappy_compress_xerial(data),
        Compression::Lz4 => {
            let info = lz4_flex::frame::FrameInfo::new()
                .block_size(lz4_flex::frame::BlockSize::Max64KB)
                .block_mode(lz4_flex::frame::BlockMode::Independent)
                .block_checksums(false)
                .content_checksum(false);
            let mut encoder = lz4_flex::frame::FrameEncoder::with_frame_info(info, Vec::new());
            encoder.write_all(data).expect("lz4 into memory");
            encoder.finish().expect("lz4 into memory")
        }
        Compression::Zstd => zstd::bulk::compress(data, ZSTD_LEVEL).expect("zstd into memory"),
    }
}

fn snappy_compress_xerial(data: &[u8]) -> Vec<u8> {
    let mut encoder = snap::raw::Encoder::new();
    let mut out = Vec::with_capacity(XERIAL_HEADER_SIZE + data.len() / 2);
    out.extend_from_slice(&XERIAL_MAGIC);
    out.extend_from_slice(&XERIAL_VERSION.to_be_bytes());
    out.extend_from_slice(&XERIAL_VERSION.to_be_bytes());
    for block in data.chunks(SNAPPY_BLOCK_BYTES) {
        let compressed = encoder
            .compress_vec(block)
            .expect("a snappy block of 32 KiB is within snappy's input limit");
        out.extend_from_slice(&(compressed.len() as i32).to_be_bytes());
        out.extend_from_slice(&compressed);
    }
    out
}

/// One raw snappy block appended to `out`, within the `max` bytes `out` may reach. The
/// uncompressed length snappy stores up front is checked before anything is allocated.
fn snappy_raw_into(block: &[u8], out: &mut Vec<u8>, max: usize) -> Result<(), BatchError> {
    let codec = Compression::Snappy;
    let len = snap::raw::decompress_len(block).map_err(|e| corrupt(codec, e))?;
    if len > max - out.len() {
        return Err(BatchError::DecompressedTooLarge { max });
    }
    let start = out.len();
    out.resize(start + len, 0);
    let written = snap::raw::Decoder::new()
        .decompress(block, &mut out[start..])
        .map_err(|e| corrupt(codec, e))?;
    if written != len {
        return Err(corrupt(codec, "block shorter than its stated length"));
    }
    Ok(())
}

fn snappy_decompress(data: &[u8], max: usize) -> Result<Vec<u8>, BatchError> {
    let mut out = Vec::new();
    if !data.starts_with(&XERIAL_MAGIC) {
        snappy_raw_into(data, &mut out, max)?;
        return Ok(out);
    }
    let mut at = 0;
    while at < data.len() {
        // snappy-java reads concatenated streams, each with its own header, as one.
        if data[at..].starts_with(&XERIAL_MAGIC) {
            if data.len() - at < XERIAL_HEADER_SIZE {
                return Err(corrupt(Compression::Snappy, "truncated xerial header"));
            }
            at += XERIAL_HEADER_SIZE;
            continue;
        }
        let Some(len) = data.get(at..at + 4) else {
            return Err(corrupt(
                Compression::Snappy,
                "truncated xerial block length",
            ));
        };
        let len = i32::from_be_bytes(len.try_into().expect("four bytes"));
        at += 4;
        let end = usize::try_from(len)
            .ok()
            .and_then(|len| at.checked_add(len))
            .filter(|&end| end <= data.len())
            .ok_or_else(|| corrupt(Compression::Snappy, "xerial block runs past the data"))?;
        snappy_raw_into(&data[at..end], &mut out, max)?;
        at = end;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CODECS: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

    /// Compressible and incompressible bytes, several snappy and lz4 blocks long.
    fn sample() -> Vec<u8> {
        let mut data = Vec::new();
        for i in 0..20_000u32 {
            data.extend_from_slice(format!("record {i} of the sample ").as_bytes());
        }
        let mut x = 0x2545_f491u32;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            data.push(x as u8);
        }
        data
    }

    #[test]
    fn every_codec_round_trips() {
        let data = sample();
        for codec in CODECS {
            let compressed = compress(codec, &data);
            if codec != Compression::None {
                assert!(compressed.len() < data.len(), "{codec:?} did not compress");
            }
            let back = decompress(codec, &compressed, DECOMPRESSED_BYTES_MAX).unwrap();
            assert!(back == data, "{codec:?} changed the bytes");
            assert_eq!(decompress(codec, &compress(codec, b""), 16).unwrap(), b"");
        }
    }

    #[test]
    fn codec_ids_are_kafkas() {
        for (id, codec) in CODECS.iter().enumerate() {
            assert_eq!(codec.id(), id as i16);
            assert_eq!(
                Compression::from_attributes(id as i16 | 0x18).unwrap(),
                *codec
            );
        }
        for id in 5..8 {
            assert!(matches!(
                Compression::from_attributes(id),
                Err(BatchError::UnknownCompression { codec }) if codec == id
            ));
        }
    }

    #[test]
    fn snappy_is_written_in_xerial_blocks_and_read_raw_too() {
        let data = sample();
        let framed = compress(Compression::Snappy, &data);
        assert_eq!(&framed[..8], &XERIAL_MAGIC);
        assert_eq!(&framed[8..16], &[0, 0, 0, 1, 0, 0, 0, 1]);
        // Walk the blocks: each decodes to at most one block of input.
        let (mut at, mut blocks, mut total) = (XERIAL_HEADER_SIZE, 0, 0);
        while at < framed.len() {
            let len = i32::from_be_bytes(framed[at..at + 4].try_into().unwrap()) as usize;
            let block = &framed[at + 4..at + 4 + len];
            let n = snap::raw::decompress_len(block).unwrap();
            assert!(n <= SNAPPY_BLOCK_BYTES);
            total += n;
            blocks += 1;
            at += 4 + len;
        }
        assert_eq!(total, data.len());
        assert_eq!(blocks, data.len().div_ceil(SNAPPY_BLOCK_BYTES));
        let raw = snap::raw::Encoder::new().compress_vec(&data).unwrap();
        assert!(decompress(Compression::Snappy, &raw, DECOMPRESSED_BYTES_MAX).unwrap() == data);
        // Two xerial streams back to back read as one.
        let mut two = framed.clone();
        two.extend_from_slice(&compress(Compression::Snappy, b"tail"));
        let mut want = data.clone();
        want.extend_from_slice(b"tail");
        assert!(decompress(Compression::Snappy, &two, DECOMPRESSED_BYTES_MAX).unwrap() == want);
    }

    #[test]
    fn lz4_frames_are_what_kafka_reads() {
        let framed = compress(Compression::Lz4, &sample());
        assert_eq!(
            &framed[..4],
            &0x184D_2204u32.to_le_bytes(),
            "LZ4 frame magic"
        );
        // FLG: version 01, independent blocks, no block or content checksum, no content size.
        assert_eq!(framed[4], 0b0110_0000);
        // BD: 64 KiB blocks.
        assert_eq!(framed[5], 4 << 4);
    }

    #[test]
    fn output_beyond_the_limit_is_refused_for_every_codec() {
        let zeros = vec![0u8; 1 << 20];
        for codec in CODECS {
            let compressed = compress(codec, &zeros);
            assert!(
                matches!(
                    decompress(codec, &compressed, (1 << 20) - 1),
                    Err(BatchError::DecompressedTooLarge { .. })
                ),
                "{codec:?}"
            );
            assert_eq!(
                decompress(codec, &compressed, 1 << 20).unwrap().len(),
                1 << 20
            );
        }
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        let data = sample();
        for codec in CODECS.into_iter().skip(1) {
            let compressed = compress(codec, &data[..5000]);
            // (lz4_flex reads a frame cut inside its end mark as complete: every block is there.)
            for cut in [0, 1, 7, 16, compressed.len() / 2, compressed.len() - 5] {
                assert!(
                    decompress(codec, &compressed[..cut], DECOMPRESSED_BYTES_MAX)
                        .map_or(true, |out| out != data[..5000]),
                    "{codec:?} cut at {cut}"
                );
            }
            let mut flipped = compressed.clone();
            for i in (0..flipped.len()).step_by(7) {
                flipped[i] ^= 0x5a;
            }
            let _ = decompress(codec, &flipped, DECOMPRESSED_BYTES_MAX);
        }
    }
}
