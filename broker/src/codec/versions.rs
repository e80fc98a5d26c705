//! Kafka versions past the codec's, read and written by hand where the schema differs from the
//! previous version's by a field or two.

use bytes::{Buf, Bytes};
use kafka_protocol::messages::{ApiVersionsRequest, DeleteGroupsResponse, DescribeLogDirsResponse};
use kafka_protocol::protocol::StrBytes;

/// Where a version 5 request's cluster id and node id travel from `decode_v5` to `handle`: tag
/// numbers the wire cannot carry (tags are unsigned there).
pub const CLUSTER_ID_TAG: i32 = -1;
pub const NODE_ID_TAG: i32 = -2;

/// Reads an ApiVersions version 5 request body: version 4's fields, then the cluster id
/// (compact nullable string) and node id (int32) the client means to reach, then tagged fields.
pub fn decode_v5(body: &mut Bytes) -> anyhow::Result<ApiVersionsRequest> {
    use super::compact::read_uvarint as varint;
    fn string(b: &mut Bytes) -> anyhow::Result<Option<Bytes>> {
        let len = varint(b)?;
        if len == 0 {
            return Ok(None);
        }
        let len = usize::try_from(len - 1)?;
        anyhow::ensure!(b.remaining() >= len, "ApiVersions 5: truncated string");
        Ok(Some(b.split_to(len)))
    }
    let text = |bytes: Option<Bytes>| -> anyhow::Result<StrBytes> {
        Ok(StrBytes::try_from(bytes.unwrap_or_default())?)
    };
    let mut request = ApiVersionsRequest::default()
        .with_client_software_name(text(string(body)?)?)
        .with_client_software_version(text(string(body)?)?);
    let cluster_id = string(body)?;
    anyhow::ensure!(body.remaining() >= 4, "ApiVersions 5: no node id");
    let node_id = body.get_i32();
    for _ in 0..varint(body)? {
        let _tag = varint(body)?;
        let size = usize::try_from(varint(body)?)?;
        anyhow::ensure!(
            body.remaining() >= size,
            "ApiVersions 5: truncated tagged field"
        );
        body.advance(size);
    }
    if let Some(id) = cluster_id {
        request.unknown_tagged_fields.insert(CLUSTER_ID_TAG, id);
    }
    request
        .unknown_tagged_fields
        .insert(NODE_ID_TAG, Bytes::copy_from_slice(&node_id.to_be_bytes()));
    Ok(request)
}

/// Encodes `response` as DescribeLogDirs v5 (after the response header): v4's fields with
/// KIP-1066's `IsCordoned` after each directory's usable bytes, always false here (no
/// directory is cordoned). The codec stops at v4; Kafka's v5 schema is v4's plus that field.
/// Unknown tagged fields are not carried (this broker sets none).
pub fn encode_v5(response: &DescribeLogDirsResponse, buf: &mut bytes::BytesMut) {
    use super::compact::{len as compact_len, no_tagged_fields, string as compact_string};
    use bytes::BufMut;
    buf.put_i32(response.throttle_time_ms);
    buf.put_i16(response.error_code);
    compact_len(buf, response.results.len());
    for r in &response.results {
        buf.put_i16(r.error_code);
        compact_string(buf, &r.log_dir);
        compact_len(buf, r.topics.len());
        for t in &r.topics {
            compact_string(buf, &t.name.0);
            compact_len(buf, t.partitions.len());
            for p in &t.partitions {
                buf.put_i32(p.partition_index);
                buf.put_i64(p.partition_size);
                buf.put_i64(p.offset_lag);
                buf.put_u8(u8::from(p.is_future_key));
                no_tagged_fields(buf);
            }
            no_tagged_fields(buf);
        }
        buf.put_i64(r.total_bytes);
        buf.put_i64(r.usable_bytes);
        // IsCordoned.
        buf.put_u8(0);
        no_tagged_fields(buf);
    }
    no_tagged_fields(buf);
}

/// DeleteGroups version 3's response (KIP-1043): version 2's with an error message per group,
/// past the codec's versions.
pub fn encode_delete_v3(response: &DeleteGroupsResponse, buf: &mut bytes::BytesMut) {
    use super::compact;
    use bytes::BufMut;
    buf.put_i32(response.throttle_time_ms);
    compact::len(buf, response.results.len());
    for r in &response.results {
        compact::string(buf, &r.group_id.0);
        buf.put_i16(r.error_code);
        // Kafka 4.4 leaves the message out for every error DeleteGroups gives here (GROUP_ID_NOT_FOUND,
        // NON_EMPTY_GROUP, the coordinator's), as the differential test shows.
        compact::nullable_string(buf, None);
        compact::no_tagged_fields(buf);
    }
    compact::no_tagged_fields(buf);
}

/// A version 2 request body as version 1's bytes: the same with each marker's
/// `transaction_version` (an int8 after `coordinator_epoch`) left out.
pub fn v2_as_v1(body: &mut bytes::Bytes) -> anyhow::Result<bytes::Bytes> {
    let mut r = super::compact::Rewrite::new(std::mem::take(body));
    for _ in 0..r.array()?.unwrap_or(0) {
        r.copy(8 + 2 + 1)?; // producer_id, producer_epoch, transaction_result
        for _ in 0..r.array()?.unwrap_or(0) {
            r.string()?; // name
            let partitions = r.array()?.unwrap_or(0);
            r.copy(4 * partitions)?;
            r.tagged_fields()?;
        }
        r.copy(4)?; // coordinator_epoch
        r.take(1)?; // transaction_version
        r.tagged_fields()?;
    }
    r.finish()
}

/// Where a decoded request keeps what its newer version adds and the codec's older one lacks,
/// and a response what its handler adds for the newer version's encoding: an unknown tagged
/// field no client can send (tags are unsigned varints far below this), taken off again before
/// anything is encoded.
pub const NEWER_FIELDS_TAG: i32 = i32::MAX;

/// ShareFetch 2's request (KIP-1206, KIP-1222) as version 1's bytes, and the two fields it adds
/// after `batch_size`: the acquire mode (0 batch-optimized, 1 record-limit) and whether its
/// acknowledgements are RENEWs.
pub fn share_fetch_v2_as_v1(body: &mut bytes::Bytes) -> anyhow::Result<(bytes::Bytes, i8, bool)> {
    let mut r = super::compact::Rewrite::new(std::mem::take(body));
    r.string()?; // group_id
    r.string()?; // member_id
                 // share_session_epoch, max_wait_ms, min_bytes, max_bytes, max_records, batch_size
    r.copy(6 * 4)?;
    let mode = r.take(1)?[0] as i8;
    let renew = r.take(1)?[0] != 0;
    Ok((r.rest(), mode, renew))
}

/// ShareAcknowledge 2's request (KIP-1222) as version 1's bytes, and whether its
/// acknowledgements are RENEWs (the bool it adds after `share_session_epoch`).
pub fn share_acknowledge_v2_as_v1(body: &mut bytes::Bytes) -> anyhow::Result<(bytes::Bytes, bool)> {
    let mut r = super::compact::Rewrite::new(std::mem::take(body));
    r.string()?; // group_id
    r.string()?; // member_id
    r.copy(4)?; // share_session_epoch
    let renew = r.take(1)?[0] != 0;
    Ok((r.rest(), renew))
}

/// ShareAcknowledge 2's response: version 1's with `acquisition_lock_timeout_ms` (int32) after
/// the top-level error message.
pub fn share_acknowledge_v1_as_v2(
    v1: bytes::Bytes,
    lock_ms: i32,
    buf: &mut bytes::BytesMut,
) -> anyhow::Result<()> {
    let mut r = super::compact::Rewrite::new(v1);
    r.copy(4 + 2)?; // throttle_time_ms, error_code
    r.string()?; // error_message
    r.put(&lock_ms.to_be_bytes());
    buf.extend_from_slice(&r.rest());
    Ok(())
}

/// DescribeShareGroupOffsets' response, version 0 or 1 (1 adds each partition's `lag`, which
/// the handler leaves under [`NEWER_FIELDS_TAG`]; the codec has version 0 only).
pub fn encode_describe_share_group_offsets(
    response: &kafka_protocol::messages::DescribeShareGroupOffsetsResponse,
    version: i16,
    buf: &mut bytes::BytesMut,
) {
    use super::compact;
    use bytes::BufMut;
    buf.put_i32(response.throttle_time_ms);
    compact::len(buf, response.groups.len());
    for g in &response.groups {
        compact::string(buf, &g.group_id.0);
        compact::len(buf, g.topics.len());
        for t in &g.topics {
            compact::string(buf, &t.topic_name.0);
            buf.put_slice(t.topic_id.as_bytes());
            compact::len(buf, t.partitions.len());
            for p in &t.partitions {
                buf.put_i32(p.partition_index);
                buf.put_i64(p.start_offset);
                buf.put_i32(p.leader_epoch);
                if version >= 1 {
                    let lag = p
                        .unknown_tagged_fields
                        .get(&NEWER_FIELDS_TAG)
                        .and_then(|b| <[u8; 8]>::try_from(&b[..]).ok())
                        .map_or(-1, i64::from_be_bytes);
                    buf.put_i64(lag);
                }
                buf.put_i16(p.error_code);
                compact::nullable_string(buf, p.error_message.as_deref());
                compact::no_tagged_fields(buf);
            }
            compact::no_tagged_fields(buf);
        }
        buf.put_i16(g.error_code);
        compact::nullable_string(buf, g.error_message.as_deref());
        compact::no_tagged_fields(buf);
    }
    compact::no_tagged_fields(buf);
}
