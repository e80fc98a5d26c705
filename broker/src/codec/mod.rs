//! The wire: which APIs and versions this broker speaks (`SUPPORTED`), and how their bodies are
//! read and written. The codec crate reads and writes Kafka's versions up to its own; the
//! versions past them are rewritten here to a version it knows (`codec_version`, `topic_ids`,
//! `versions`). Responses that splice records from segment files are cut around them
//! (`response`).

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use response::{Frame, SplicedBuf, Splices};

pub mod compact;
pub mod frame;
pub mod response;
pub mod streams_group;
pub mod topic_ids;
pub mod versions;

/// Every API this broker implements, with the versions it implements. ApiVersions advertises
/// exactly this table; anything else is refused. Where Kafka 4 has a newer version, the comment
/// says why it is left out.
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    // 11 adds TRANSACTION_ABORTABLE for a transactional batch whose partition is not in the
    // transaction (KIP-890 part 1); 12 has the leader add the partition instead, at
    // `transaction.version` 2 (part 2). 13 names topics by id (KIP-516), which the produce
    // handler does not read yet.
    (ApiKey::Produce, 3, 13),
    // 16 adds leader endpoints to NOT_LEADER_OR_FOLLOWER answers, for a leader elsewhere (there
    // is none: this node leads every partition); 17 and 18 add follower fields consumers leave
    // unset.
    (ApiKey::Fetch, 4, 18),
    // 9 adds LATEST_TIERED (no tiered storage: answered -1), 10 a timeout for remote lookups
    // (every lookup is local), 11 EARLIEST_PENDING_UPLOAD (answered -1 too). 11 is past the
    // codec's versions: its bytes are 10's (`codec_version`).
    (ApiKey::ListOffsets, 1, 11),
    // 13 adds a top-level error code, never set here (no re-bootstrap is ever needed).
    (ApiKey::Metadata, 0, 13),
    // 4 lists features whose supported range starts at 0; 5 checks the cluster and node the
    // client names (KIP-1242), past the codec's versions (`api_versions::decode_v5`).
    (ApiKey::ApiVersions, 0, 5),
    // Version 0 of the handshake is followed by bare SASL tokens outside Kafka's framing; 1 by
    // SaslAuthenticate requests, which current clients send (net/sasl.rs). librdkafka looks
    // for version 0 before it uses either. 2 of SaslAuthenticate adds the session lifetime
    // (KIP-368), 0 here: no re-authentication yet.
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::ElectLeaders, 0, 2),
    (ApiKey::AlterPartitionReassignments, 0, 1),
    (ApiKey::ListPartitionReassignments, 0, 0),
    // 1 replaces allow_downgrade with upgrade_type; 2 drops nothing the broker sends.
    (ApiKey::UpdateFeatures, 0, 2),
    (ApiKey::DeleteRecords, 0, 2),
    // 5 adds TRANSACTION_ABORTABLE (KIP-890); 6 is two-phase commit (KIP-939), past the
    // codec's versions.
    (ApiKey::InitProducerId, 0, 5),
    // 4 and 5 are the partition leaders' form (KIP-890): several transactions per request,
    // each either verified (`verify_only`) or added on the producer's behalf (transaction
    // version 2). Clients send 0 to 3.
    (ApiKey::AddPartitionsToTxn, 0, 5),
    // 4 adds TRANSACTION_ABORTABLE (KIP-890).
    (ApiKey::AddOffsetsToTxn, 0, 4),
    // 4 adds TRANSACTION_ABORTABLE; 5 adds the group's partition to the transaction itself
    // (transaction version 2: no AddOffsetsToTxn); 6 names topics by id, past the codec's
    // versions (`topic_ids`).
    (ApiKey::TxnOffsetCommit, 0, 6),
    // 5 bumps the producer epoch at every end (transaction version 2).
    (ApiKey::EndTxn, 0, 5),
    // 2 lists fenced brokers when asked (KIP-1073).
    (ApiKey::DescribeCluster, 0, 2),
    // Answered by the quorum's leader, as Kafka's brokers forward it to the controller.
    (ApiKey::DescribeQuorum, 0, 2),
    // 5 adds TRANSACTION_ABORTABLE; 6 the share-partition key type (KIP-932), which a broker
    // without share groups answers INVALID_REQUEST for, as Kafka's does with them off.
    (ApiKey::FindCoordinator, 0, 6),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    // 9 is the KIP-848 members' version (the request is 8's; a consumer-protocol member must
    // use it); 10 names topics by id, past the codec's versions (`topic_ids`).
    (ApiKey::OffsetCommit, 2, 10),
    // 9 adds the member id and epoch, checked for consumer groups (KIP-848); 10 names topics by
    // id, past the codec's versions (`topic_ids`).
    (ApiKey::OffsetFetch, 1, 10),
    // 5 adds the group type filter (KIP-848).
    (ApiKey::ListGroups, 0, 5),
    // 6 adds an error message per group (KIP-1043).
    (ApiKey::DescribeGroups, 0, 6),
    // 3 adds an error message per group (KIP-1043), past the codec's versions: the request is
    // 2's, the response is encoded here (`groups_admin::encode_delete_v3`).
    (ApiKey::DeleteGroups, 0, 3),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    (ApiKey::ConsumerGroupDescribe, 0, 1),
    // Share groups (KIP-932): 1 is the first stable version (0 was Kafka 4.0's early access).
    // ShareFetch and ShareAcknowledge 2 add the record-limit acquire mode and RENEW
    // acknowledgements (KIP-1206, KIP-1222), past the codec's versions
    // (`versions::share_fetch_v2_as_v1` and the others).
    (ApiKey::ShareGroupHeartbeat, 1, 1),
    (ApiKey::ShareGroupDescribe, 1, 1),
    (ApiKey::ShareFetch, 1, 2),
    (ApiKey::ShareAcknowledge, 1, 2),
    // 1 adds each partition's lag (KIP-1226), past the codec's versions: the request is 0's,
    // the response is encoded here (`versions::encode_describe_share_group_offsets`).
    (ApiKey::DescribeShareGroupOffsets, 0, 1),
    (ApiKey::AlterShareGroupOffsets, 0, 0),
    (ApiKey::DeleteShareGroupOffsets, 0, 0),
    // The share coordinator's, from share partition leaders. Kafka 4.4 has Write and Summary
    // 1 (a delivery-complete count), which only its own brokers send: Sluice's send 0.
    (ApiKey::InitializeShareGroupState, 0, 0),
    (ApiKey::ReadShareGroupState, 0, 0),
    (ApiKey::WriteShareGroupState, 0, 0),
    (ApiKey::DeleteShareGroupState, 0, 0),
    (ApiKey::ReadShareGroupStateSummary, 0, 0),
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    (ApiKey::DescribeTopicPartitions, 0, 0),
    // 5 adds IsCordoned (KIP-1066; no directory is ever cordoned), past the codec's
    // versions: the request is 4's, the response is encoded here (`describe_log_dirs`).
    (ApiKey::DescribeLogDirs, 1, 5),
    (ApiKey::AlterReplicaLogDirs, 1, 2),
    (ApiKey::ListConfigResources, 0, 1),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::DescribeTransactions, 0, 0),
    // 1 adds the duration filter (KIP-994), 2 the transactional id pattern (KIP-1152).
    (ApiKey::ListTransactions, 0, 2),
    // 0 is gone from Kafka 4; 2 adds each marker's transaction version (KIP-890), past the
    // codec's versions (`write_txn_markers::v2_as_v1`).
    (ApiKey::WriteTxnMarkers, 1, 2),
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
    (ApiKey::DescribeClientQuotas, 0, 1),
    (ApiKey::AlterClientQuotas, 0, 1),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    (ApiKey::AlterUserScramCredentials, 0, 0),
];

pub fn supported(key: ApiKey, version: i16) -> bool {
    SUPPORTED
        .iter()
        .any(|&(k, min, max)| k == key && (min..=max).contains(&version))
}

/// Decodes a request body for its API and version (the header already taken off `body`).
pub fn decode_request(key: ApiKey, version: i16, body: &mut Bytes) -> anyhow::Result<RequestKind> {
    if (key, version) == (ApiKey::ApiVersions, 5) {
        return versions::decode_v5(body).map(RequestKind::ApiVersions);
    }
    if let Some(codec) = topic_ids::codec_version(key, version) {
        let mut named = topic_ids::request_to_names(key, body)?;
        return RequestKind::decode(key, &mut named, codec);
    }
    if (key, version) == (ApiKey::WriteTxnMarkers, 2) {
        let mut v1 = versions::v2_as_v1(body)?;
        return RequestKind::decode(key, &mut v1, 1);
    }
    if (key, version) == (ApiKey::ShareFetch, 2) {
        let (mut v1, mode, renew) = versions::share_fetch_v2_as_v1(body)?;
        let mut request = RequestKind::decode(key, &mut v1, 1)?;
        if let RequestKind::ShareFetch(r) = &mut request {
            r.unknown_tagged_fields.insert(
                versions::NEWER_FIELDS_TAG,
                Bytes::from(vec![mode as u8, u8::from(renew)]),
            );
        }
        return Ok(request);
    }
    if (key, version) == (ApiKey::ShareAcknowledge, 2) {
        let (mut v1, renew) = versions::share_acknowledge_v2_as_v1(body)?;
        let mut request = RequestKind::decode(key, &mut v1, 1)?;
        if let RequestKind::ShareAcknowledge(r) = &mut request {
            r.unknown_tagged_fields.insert(
                versions::NEWER_FIELDS_TAG,
                Bytes::from(vec![u8::from(renew)]),
            );
        }
        return Ok(request);
    }
    RequestKind::decode(key, body, codec_version(key, version))
}

/// The version whose bytes the codec reads and writes for `key` at `version`: Kafka versions
/// newer than the codec's whose request (and, but for DescribeLogDirs, response) schema is
/// the previous version's unchanged, as Kafka's generated schemas show.
pub fn codec_version(key: ApiKey, version: i16) -> i16 {
    if let Some(codec) = topic_ids::codec_version(key, version) {
        return codec;
    }
    match (key, version) {
        (ApiKey::ListOffsets, 11) => 10,
        (ApiKey::DescribeLogDirs, 5) => 4,
        // The response; the request is read by `api_versions::decode_v5`.
        (ApiKey::ApiVersions, 5) => 4,
        // The request; the response is encoded by `groups_admin::encode_delete_v3`.
        (ApiKey::DeleteGroups, 3) => 2,
        // The response; the request is read by `write_txn_markers::v2_as_v1`.
        (ApiKey::WriteTxnMarkers, 2) => 1,
        // The responses (ShareAcknowledge's rewritten by `versions::share_acknowledge_v1_as_v2`);
        // the requests are read by `versions::share_*_v2_as_v1`.
        (ApiKey::ShareFetch, 2) | (ApiKey::ShareAcknowledge, 2) => 1,
        (ApiKey::DescribeShareGroupOffsets, 1) => 0,
        _ => version,
    }
}

/// A handler's response, with the records a fetch response splices from segment files.
pub struct Answer {
    pub response: ResponseKind,
    pub version: i16,
    pub splices: Splices,
}

/// The frame of an answer: encoded in one buffer, or cut around the records it splices.
pub fn encode_answer(key: ApiKey, correlation_id: i32, answer: &Answer) -> anyhow::Result<Frame> {
    if answer.splices.is_empty() {
        return Ok(Frame::Bytes(encode_response(
            key,
            answer.version,
            correlation_id,
            &answer.response,
        )?));
    }
    let header_version = key.response_header_version(answer.version);
    let header =
        kafka_protocol::messages::ResponseHeader::default().with_correlation_id(correlation_id);
    let mut buf = SplicedBuf::new(&answer.splices, 4096);
    buf.put_slice(&[0; 4]);
    kafka_protocol::protocol::Encodable::encode(&header, &mut buf, header_version)?;
    let ResponseKind::Fetch(response) = &answer.response else {
        anyhow::bail!("only fetch responses splice records");
    };
    kafka_protocol::protocol::Encodable::encode(response, &mut buf, answer.version)?;
    Ok(buf.finish())
}

/// Encodes a response frame: size prefix, response header, body.
pub fn encode_response(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    response: &ResponseKind,
) -> anyhow::Result<Bytes> {
    let header_version = key.response_header_version(codec_version(key, version));
    let header =
        kafka_protocol::messages::ResponseHeader::default().with_correlation_id(correlation_id);
    // A fetch response carries megabytes of records: size the frame once rather than let it
    // grow by doubling (each step a copy of everything so far and fresh pages to fault in).
    let body = match response {
        ResponseKind::Fetch(r) => {
            kafka_protocol::protocol::Encodable::compute_size(r, version).unwrap_or(0)
        }
        _ => 0,
    };
    let mut buf = BytesMut::with_capacity(64 + body);
    buf.extend_from_slice(&[0; 4]);
    kafka_protocol::protocol::Encodable::encode(&header, &mut buf, header_version)?;
    match response {
        ResponseKind::DescribeLogDirs(r) if version >= 5 => {
            versions::encode_v5(r, &mut buf);
        }
        ResponseKind::DeleteGroups(r) if version >= 3 => {
            versions::encode_delete_v3(r, &mut buf);
        }
        ResponseKind::DescribeShareGroupOffsets(r) => {
            versions::encode_describe_share_group_offsets(r, version, &mut buf);
        }
        ResponseKind::ShareAcknowledge(r) if version >= 2 => {
            let mut r = r.clone();
            let lock_ms = r
                .unknown_tagged_fields
                .remove(&versions::NEWER_FIELDS_TAG)
                .and_then(|b| <[u8; 4]>::try_from(&b[..]).ok())
                .map_or(0, i32::from_be_bytes);
            let mut v1 = BytesMut::new();
            ResponseKind::ShareAcknowledge(r).encode(&mut v1, 1)?;
            versions::share_acknowledge_v1_as_v2(v1.freeze(), lock_ms, &mut buf)?;
        }
        _ if topic_ids::codec_version(key, version).is_some() => {
            let mut named = BytesMut::new();
            response.encode(&mut named, codec_version(key, version))?;
            topic_ids::response_to_ids(key, named.freeze(), &mut buf)?;
        }
        _ => response.encode(&mut buf, codec_version(key, version))?,
    }
    let size = (buf.len() - 4) as u32;
    buf[0..4].copy_from_slice(&size.to_be_bytes());
    Ok(buf.freeze())
}

/// Encodes a request frame: size, header (client id `sluice`), body.
pub fn encode_request(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    request: &RequestKind,
) -> anyhow::Result<Bytes> {
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&[0; 4]);
    let header = RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("sluice")));
    header.encode(&mut buf, key.request_header_version(version))?;
    request.encode(&mut buf, version)?;
    let size = (buf.len() - 4) as u32;
    buf[0..4].copy_from_slice(&size.to_be_bytes());
    Ok(buf.freeze())
}

/// Decodes a response frame's body (after the size) for `key` at `version`.
pub fn decode_response(key: ApiKey, version: i16, body: Vec<u8>) -> anyhow::Result<ResponseKind> {
    let mut body = Bytes::from(body);
    ResponseHeader::decode(&mut body, key.response_header_version(version))?;
    ResponseKind::decode(key, &mut body, version)
}
