//! The group APIs' versions that name topics by id, past the codec's versions: OffsetCommit 10,
//! OffsetFetch 10 and TxnOffsetCommit 6 are their previous versions with each topic's name
//! replaced by its 16-byte id (Kafka's generated schemas show nothing else changed).
//!
//! A request is rewritten into the previous version's bytes with each id standing in as a
//! placeholder name (a NUL, which no topic name may hold, and the id in hex), and decoded by the
//! codec. The handler, which has the metadata image, resolves placeholders to names
//! ([`resolve`]) and names back to placeholders in its answer ([`to_placeholder`]); an id that
//! names no topic stays a placeholder and is answered UNKNOWN_TOPIC_ID. The codec encodes the
//! answer at the previous version, and [`response_to_ids`] turns its placeholders back into ids.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::metadata::MetadataImage;

/// The (key, version) pairs that name topics by id here, with the version whose bytes the
/// codec reads and writes for them.
pub fn codec_version(key: ApiKey, version: i16) -> Option<i16> {
    match (key, version) {
        (ApiKey::OffsetCommit, 10) | (ApiKey::OffsetFetch, 10) => Some(9),
        (ApiKey::TxnOffsetCommit, 6) => Some(5),
        _ => None,
    }
}

const PLACEHOLDER_MARK: char = '\0';

/// The name an id stands in as until the handler resolves it.
pub fn placeholder(id: uuid::Uuid) -> String {
    format!("{PLACEHOLDER_MARK}{}", id.simple())
}

/// The id a placeholder name stands for.
pub fn placeholder_id(name: &str) -> Option<uuid::Uuid> {
    name.strip_prefix(PLACEHOLDER_MARK)
        .and_then(|hex| uuid::Uuid::try_parse(hex).ok())
}

/// A placeholder becomes its topic's name, where the image has a topic of that id.
pub fn resolve(image: &MetadataImage, name: &mut TopicName) {
    if let Some(t) = placeholder_id(&name.0).and_then(|id| image.topic_by_id(id)) {
        *name = TopicName(StrBytes::from_string(t.name.clone()));
    }
}

/// A topic's name becomes the placeholder of its id (the nil id for a topic no longer there).
pub fn to_placeholder(image: &MetadataImage, name: &mut TopicName) {
    if placeholder_id(&name.0).is_some() {
        return;
    }
    let id = image
        .topics
        .get(name.0.as_str())
        .map_or(uuid::Uuid::nil(), |t| t.id);
    *name = TopicName(StrBytes::from_string(placeholder(id)));
}

/// Whether a topic name is a placeholder the handler could not resolve.
pub fn is_unknown_id(name: &str) -> bool {
    placeholder_id(name).is_some()
}

use super::compact::Rewrite;

/// The by-id versions' steps of a [`Rewrite`].
trait ById {
    fn id_to_name(&mut self) -> anyhow::Result<()>;
    fn name_to_id(&mut self) -> anyhow::Result<()>;
    fn commit_topics(&mut self, id_to_name: bool) -> anyhow::Result<()>;
}

impl ById for Rewrite {
    /// A topic id in `src` becomes its placeholder name in `out`.
    fn id_to_name(&mut self) -> anyhow::Result<()> {
        let id = uuid::Uuid::from_slice(&self.take(16)?)?;
        self.put_string(&placeholder(id));
        Ok(())
    }

    /// A placeholder name in `src` becomes its topic id in `out`.
    fn name_to_id(&mut self) -> anyhow::Result<()> {
        let n = self.read_uvarint()?.saturating_sub(1) as usize;
        let name = std::str::from_utf8(&self.take(n)?)?.to_string();
        let id = placeholder_id(&name).unwrap_or_default();
        self.put(id.as_bytes());
        Ok(())
    }

    /// The topics of an OffsetCommit (or TxnOffsetCommit) request, in either direction.
    fn commit_topics(&mut self, id_to_name: bool) -> anyhow::Result<()> {
        for _ in 0..self.array()?.unwrap_or(0) {
            if id_to_name {
                self.id_to_name()?;
            } else {
                self.name_to_id()?;
            }
            for _ in 0..self.array()?.unwrap_or(0) {
                // partition_index, committed_offset, committed_leader_epoch, then metadata.
                self.copy(4 + 8 + 4)?;
                self.string()?;
                self.tagged_fields()?;
            }
            self.tagged_fields()?;
        }
        Ok(())
    }
}

/// A request body at a by-id version, as the previous version's bytes with placeholder names.
pub fn request_to_names(key: ApiKey, body: &mut Bytes) -> anyhow::Result<Bytes> {
    let mut r = Rewrite::new(std::mem::take(body));
    match key {
        ApiKey::OffsetCommit => {
            r.string()?; // group_id
            r.copy(4)?; // generation_id_or_member_epoch
            r.string()?; // member_id
            r.string()?; // group_instance_id
            r.commit_topics(true)?;
        }
        ApiKey::TxnOffsetCommit => {
            r.string()?; // transactional_id
            r.string()?; // group_id
            r.copy(8 + 2 + 4)?; // producer_id, producer_epoch, generation_id_or_member_epoch
            r.string()?; // member_id
            r.string()?; // group_instance_id
            r.commit_topics(true)?;
        }
        ApiKey::OffsetFetch => {
            for _ in 0..r.array()?.unwrap_or(0) {
                r.string()?; // group_id
                r.string()?; // member_id
                r.copy(4)?; // member_epoch
                for _ in 0..r.array()?.unwrap_or(0) {
                    r.id_to_name()?;
                    let partitions = r.array()?.unwrap_or(0);
                    r.copy(4 * partitions)?;
                    r.tagged_fields()?;
                }
                r.tagged_fields()?;
            }
            r.copy(1)?; // require_stable
        }
        _ => anyhow::bail!("{key:?} names no topics by id"),
    }
    r.finish()
}

/// A response encoded at the previous version with placeholder names, as the by-id version's
/// bytes, appended to `out`.
pub fn response_to_ids(key: ApiKey, encoded: Bytes, out: &mut BytesMut) -> anyhow::Result<()> {
    let mut r = Rewrite::new(encoded);
    r.copy(4)?; // throttle_time_ms
    match key {
        ApiKey::OffsetCommit | ApiKey::TxnOffsetCommit => {
            for _ in 0..r.array()?.unwrap_or(0) {
                r.name_to_id()?;
                for _ in 0..r.array()?.unwrap_or(0) {
                    r.copy(4 + 2)?; // partition_index, error_code
                    r.tagged_fields()?;
                }
                r.tagged_fields()?;
            }
        }
        ApiKey::OffsetFetch => {
            for _ in 0..r.array()?.unwrap_or(0) {
                r.string()?; // group_id
                for _ in 0..r.array()?.unwrap_or(0) {
                    r.name_to_id()?;
                    for _ in 0..r.array()?.unwrap_or(0) {
                        r.copy(4 + 8 + 4)?; // partition_index, offset, leader epoch
                        r.string()?; // metadata
                        r.copy(2)?; // error_code
                        r.tagged_fields()?;
                    }
                    r.tagged_fields()?;
                }
                r.copy(2)?; // error_code
                r.tagged_fields()?;
            }
        }
        _ => anyhow::bail!("{key:?} names no topics by id"),
    }
    out.put_slice(&r.finish()?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::offset_commit_response::{
        OffsetCommitResponsePartition, OffsetCommitResponseTopic,
    };
    use kafka_protocol::messages::{GroupId, OffsetCommitRequest, OffsetCommitResponse};
    use kafka_protocol::protocol::{Decodable, Encodable};

    #[test]
    fn an_offset_commit_by_id_reads_as_the_previous_version_with_placeholders() {
        let id = uuid::Uuid::new_v4();
        // Version 10's bytes: version 9's with the name's bytes replaced by the id's.
        let v9 = OffsetCommitRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_generation_id_or_member_epoch(3)
            .with_member_id(StrBytes::from_static_str("m"))
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("t")))
                .with_partitions(vec![OffsetCommitRequestPartition::default()
                    .with_partition_index(2)
                    .with_committed_offset(42)])]);
        let mut encoded = BytesMut::new();
        v9.encode(&mut encoded, 9).unwrap();
        let name_at = encoded
            .windows(2)
            .position(|w| w == [2, b't'])
            .expect("the topic name");
        let mut v10 = BytesMut::new();
        v10.put_slice(&encoded[..name_at]);
        v10.put_slice(id.as_bytes());
        v10.put_slice(&encoded[name_at + 2..]);
        let whole = v10.freeze();
        let mut body = whole.clone();
        let mut rewritten = request_to_names(ApiKey::OffsetCommit, &mut body).unwrap();
        let read = OffsetCommitRequest::decode(&mut rewritten, 9).unwrap();
        assert_eq!(read.topics[0].name.0.as_str(), placeholder(id));
        assert_eq!(read.topics[0].partitions[0].committed_offset, 42);
        assert_eq!(read.generation_id_or_member_epoch, 3);

        // The answer: the placeholder becomes the id again, 16 bytes where the name was.
        let answer =
            OffsetCommitResponse::default().with_topics(vec![OffsetCommitResponseTopic::default()
                .with_name(TopicName(StrBytes::from_string(placeholder(id))))
                .with_partitions(vec![
                    OffsetCommitResponsePartition::default().with_partition_index(2)
                ])]);
        let mut encoded = BytesMut::new();
        answer.encode(&mut encoded, 9).unwrap();
        let mut out = BytesMut::new();
        response_to_ids(ApiKey::OffsetCommit, encoded.freeze(), &mut out).unwrap();
        // throttle (4), topics (1), id (16), partitions (1), index (4), error (2), tags (1, 1, 1).
        assert_eq!(out.len(), 4 + 1 + 16 + 1 + 4 + 2 + 3);
        assert_eq!(&out[5..21], id.as_bytes());
        // Truncated requests are errors, never panics.
        for cut in 0..whole.len() {
            assert!(request_to_names(ApiKey::OffsetCommit, &mut whole.slice(..cut)).is_err());
        }
    }
}
