//! Decoding a request frame, exactly as a connection does it: the size prefix, the request
//! header, then the body for its API and version. Pure functions over bytes, shared by the
//! connection loop (`net/mod.rs`), the handlers (`handlers::decode_request`), the fuzz target
//! `request_decode` (`fuzz/`) and the regression tests below.

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind};
use kafka_protocol::protocol::Decodable;

/// Bytes before the header's client id: api key, api version, correlation id.
const HEADER_FIXED: usize = 8;

/// The body length a frame's 4-byte size prefix announces, or `None` when the size is negative
/// or above `max` (`socket.request.max.bytes`): the connection is then closed, nothing allocated.
pub fn body_len(size: i32, max: u32) -> Option<usize> {
    if size < 0 || size as u32 > max {
        None
    } else {
        Some(size as usize)
    }
}

/// What a request's header says.
#[derive(Debug)]
pub enum Header {
    /// A supported API and version; the body follows.
    Request {
        key: ApiKey,
        version: i16,
        header: RequestHeader,
    },
    /// StreamsGroupHeartbeat or StreamsGroupDescribe (`codec/streams_group.rs`): API keys the
    /// codec crate does not know, with the raw key; the body follows.
    Streams { key: i16, header: RequestHeader },
    /// ApiVersions at a version this broker does not know: answered with v0 and
    /// UNSUPPORTED_VERSION (KIP-511), so the client can pick a version both sides know.
    UnsupportedApiVersions { correlation_id: i32 },
}

/// The API key of a request's body (after the size), if it names one.
pub fn api_key(body: &[u8]) -> Option<ApiKey> {
    let raw = i16::from_be_bytes(body.get(..2)?.try_into().ok()?);
    ApiKey::try_from(raw).ok()
}

/// Decodes the request header at the front of `body` and leaves `body` at the request body.
/// An unknown API key, an unsupported version (other than ApiVersions') or a malformed header
/// is an error: the connection closes.
pub fn decode_header(body: &mut Bytes) -> anyhow::Result<Header> {
    if body.len() < HEADER_FIXED {
        anyhow::bail!("request of {} bytes is shorter than a header", body.len());
    }
    let raw_key = i16::from_be_bytes([body[0], body[1]]);
    let version = i16::from_be_bytes([body[2], body[3]]);
    let correlation_id = i32::from_be_bytes([body[4], body[5], body[6], body[7]]);
    {
        use crate::codec::streams_group::{
            STREAMS_GROUP_DESCRIBE, STREAMS_GROUP_HEARTBEAT, VERSION,
        };
        if raw_key == STREAMS_GROUP_HEARTBEAT || raw_key == STREAMS_GROUP_DESCRIBE {
            anyhow::ensure!(
                version == VERSION,
                "streams group API {raw_key} v{version} is not supported"
            );
            // Flexible: request header version 2.
            let header = RequestHeader::decode(body, 2)?;
            return Ok(Header::Streams {
                key: raw_key,
                header,
            });
        }
    }
    let key =
        ApiKey::try_from(raw_key).map_err(|_| anyhow::anyhow!("unknown API key {raw_key}"))?;
    if !crate::codec::supported(key, version) {
        if key == ApiKey::ApiVersions {
            return Ok(Header::UnsupportedApiVersions { correlation_id });
        }
        anyhow::bail!("{key:?} v{version} is not supported");
    }
    let header = RequestHeader::decode(
        body,
        key.request_header_version(crate::codec::codec_version(key, version)),
    )?;
    Ok(Header::Request {
        key,
        version,
        header,
    })
}

/// A whole frame decoded by [`decode_frame`].
#[derive(Debug)]
pub enum Decoded {
    Request {
        header: RequestHeader,
        version: i16,
        request: Box<RequestKind>,
    },
    UnsupportedApiVersions {
        correlation_id: i32,
    },
}

/// The whole path of one frame as a connection takes it (size prefix, header, body), for the
/// fuzz target and tests: `frame` holds the 4-byte size prefix and at least the bytes it
/// announces (more are ignored, as they would belong to the next frame).
pub fn decode_frame(frame: &[u8], max: u32) -> anyhow::Result<Decoded> {
    let Some(prefix) = frame.get(..4) else {
        anyhow::bail!("frame of {} bytes has no size prefix", frame.len());
    };
    let size = i32::from_be_bytes(prefix.try_into().expect("4 bytes"));
    let Some(len) = body_len(size, max) else {
        anyhow::bail!("frame size {size} out of bounds (max {max})");
    };
    let Some(body) = frame.get(4..4 + len) else {
        anyhow::bail!("frame of {size} bytes ends after {} bytes", frame.len() - 4);
    };
    let mut body = Bytes::copy_from_slice(body);
    match decode_header(&mut body)? {
        Header::Request {
            key,
            version,
            header,
        } => {
            let request = crate::codec::decode_request(key, version, &mut body)?;
            Ok(Decoded::Request {
                header,
                version,
                request: Box::new(request),
            })
        }
        Header::UnsupportedApiVersions { correlation_id } => {
            Ok(Decoded::UnsupportedApiVersions { correlation_id })
        }
        Header::Streams { key, .. } => anyhow::bail!("streams group API {key} is not served here"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::messages::{ApiVersionsRequest, MetadataRequest};
    use kafka_protocol::protocol::{Encodable, StrBytes};

    fn frame(key: ApiKey, version: i16, body: &impl Encodable) -> Vec<u8> {
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(7)
            .with_client_id(Some(StrBytes::from_static_str("t")));
        let mut buf = BytesMut::new();
        header
            .encode(&mut buf, key.request_header_version(version))
            .unwrap();
        body.encode(&mut buf, version).unwrap();
        let mut out = (buf.len() as i32).to_be_bytes().to_vec();
        out.extend_from_slice(&buf);
        out
    }

    #[test]
    fn frames_decode_as_the_connection_decodes_them() {
        let f = frame(ApiKey::Metadata, 12, &MetadataRequest::default());
        match decode_frame(&f, 1 << 20).unwrap() {
            Decoded::Request {
                header, version, ..
            } => {
                assert_eq!((header.correlation_id, version), (7, 12));
            }
            other => panic!("{other:?}"),
        }
        let mut f = frame(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
        f[6..8].copy_from_slice(&99i16.to_be_bytes());
        assert!(matches!(
            decode_frame(&f, 1 << 20).unwrap(),
            Decoded::UnsupportedApiVersions { correlation_id: 7 }
        ));
        assert!(decode_frame(&f, 4).is_err(), "above the frame limit");
        assert!(decode_frame(&f[..f.len() - 1], 1 << 20).is_err(), "short");
        assert_eq!(body_len(-1, 100), None);
        assert_eq!(body_len(101, 100), None);
        assert_eq!(body_len(100, 100), Some(100));
        let mut f = frame(ApiKey::Metadata, 12, &MetadataRequest::default());
        f[6..8].copy_from_slice(&14i16.to_be_bytes());
        assert!(decode_frame(&f, 1 << 20).is_err(), "unsupported version");
    }

    /// Found by the `request_decode` fuzz target: a 19-byte AlterConfigs v0 body claiming
    /// 8,912,896 resources made kafka-protocol 0.18 reserve 17 MB before failing on the second
    /// resource (`Vec::with_capacity(count)` from the wire). Claims of 2^31-1 elements ask for
    /// more than any machine has; without the allocator guard (`net/alloc.rs`) they aborted the
    /// process. Each must be an error, and the process must live on.
    #[test]
    fn huge_array_counts_are_errors_not_aborts() {
        let found: &[u8] = &[
            0, 0, 0, 19, 0, 33, 0, 0, 0, 0, 0, 136, 0, 0, 0, 3, 0, 0, 0, 1, 0, 4, 115, 101, 101,
            100, 255, 255, 255, 255, 0, 0, 117, 48, 0, 0, 0, 0, 0, 1, 0, 9, 103, 114, 101, 101, 0,
            1, 0, 4, 115, 101, 116, 105, 110, 103, 115, 0, 0, 0, 1, 101, 100, 0, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0, 87, 0, 0, 0, 0,
        ];
        assert!(decode_frame(found, 1 << 20).is_err());
        // Metadata v4 (non-flexible, i32 count) and v12 (flexible, varint count) claiming the
        // most topics their encodings allow, with no topic following.
        let mut v4 = frame(ApiKey::Metadata, 4, &MetadataRequest::default());
        let at = v4.len() - 5; // topics count, then allow_auto_topic_creation
        v4[at..at + 4].copy_from_slice(&i32::MAX.to_be_bytes());
        assert!(decode_frame(&v4, 1 << 20).is_err());
        let mut v12 = frame(ApiKey::Metadata, 12, &MetadataRequest::default());
        // Body: topics (compact array), allow_auto_topic_creation, include_topic_authorized
        // operations, tagged fields. Replace the topics' varint with u32::MAX.
        let body_at = v12.len() - 4;
        v12.splice(body_at..body_at + 1, [0xff, 0xff, 0xff, 0xff, 0x0f]);
        let size = (v12.len() - 4) as i32;
        v12[..4].copy_from_slice(&size.to_be_bytes());
        assert!(decode_frame(&v12, 1 << 20).is_err());
    }
}
