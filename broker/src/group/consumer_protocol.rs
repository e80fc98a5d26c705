//! The consumer protocol embedded in classic groups of protocol type `consumer`: the
//! ConsumerProtocolSubscription a member sends in JoinGroup's metadata and the
//! ConsumerProtocolAssignment SyncGroup hands back, each a version (i16) followed by the struct
//! at that version, as Kafka's `ConsumerProtocol` writes them.
//!
//! The classic coordinator relays these bytes unread. They are read only where the coordinator
//! itself assigns partitions to classic members: when a classic group converts to a consumer
//! group (KIP-848's online migration) and for classic members of a consumer group.

use std::collections::BTreeMap;

use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition;
use kafka_protocol::messages::{
    ConsumerProtocolAssignment, ConsumerProtocolSubscription, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

/// The protocol type of groups whose members embed the consumer protocol.
pub const PROTOCOL_TYPE: &str = "consumer";

/// The newest version of both structs; a newer one is read as this one, as Kafka does (newer
/// versions only add fields at the end).
const HIGHEST_VERSION: i16 = 3;

fn split_version(bytes: &Bytes) -> Result<(i16, Bytes), String> {
    let mut body = bytes.clone();
    if body.len() < 2 {
        return Err("shorter than its version".into());
    }
    let version = body.get_i16();
    if version < 0 {
        return Err(format!("negative version {version}"));
    }
    Ok((version, body))
}

/// The version a member's metadata is written in: its assignments are written in the same.
pub fn version(metadata: &Bytes) -> i16 {
    split_version(metadata).map_or(0, |(v, _)| v.min(HIGHEST_VERSION))
}

pub fn decode_subscription(metadata: &Bytes) -> Result<ConsumerProtocolSubscription, String> {
    let (version, mut body) = split_version(metadata)?;
    ConsumerProtocolSubscription::decode(&mut body, version.min(HIGHEST_VERSION))
        .map_err(|e| format!("malformed ConsumerProtocolSubscription: {e}"))
}

pub fn decode_assignment(bytes: &Bytes) -> Result<ConsumerProtocolAssignment, String> {
    if bytes.is_empty() {
        // A member that never synced.
        return Ok(ConsumerProtocolAssignment::default());
    }
    let (version, mut body) = split_version(bytes)?;
    ConsumerProtocolAssignment::decode(&mut body, version.min(HIGHEST_VERSION))
        .map_err(|e| format!("malformed ConsumerProtocolAssignment: {e}"))
}

/// An assignment of `partitions` (by topic name), written at `version`.
pub fn encode_assignment(version: i16, partitions: &BTreeMap<String, Vec<i32>>) -> Bytes {
    let version = version.clamp(0, HIGHEST_VERSION);
    let assignment = ConsumerProtocolAssignment::default().with_assigned_partitions(
        partitions
            .iter()
            .map(|(topic, ps)| {
                TopicPartition::default()
                    .with_topic(TopicName(StrBytes::from_string(topic.clone())))
                    .with_partitions(ps.clone())
            })
            .collect(),
    );
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&version.to_be_bytes());
    assignment
        .encode(&mut buf, version)
        .expect("every field of the assignment is valid at every version");
    buf.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assignment_reads_back_at_every_version() {
        let mut partitions = BTreeMap::new();
        partitions.insert("a".to_string(), vec![0, 2]);
        partitions.insert("b".to_string(), vec![1]);
        for v in 0..=HIGHEST_VERSION {
            let bytes = encode_assignment(v, &partitions);
            assert_eq!(version(&bytes), v);
            let back = decode_assignment(&bytes).expect("decodes");
            let got: BTreeMap<String, Vec<i32>> = back
                .assigned_partitions
                .into_iter()
                .map(|t| (t.topic.0.to_string(), t.partitions))
                .collect();
            assert_eq!(got, partitions);
        }
    }

    #[test]
    fn a_subscription_as_the_java_client_writes_it() {
        // Version 1: topics ["t"], user data null, owned partitions [("t", [0])].
        let bytes = Bytes::from_static(&[
            0, 1, // version
            0, 0, 0, 1, 0, 1, b't', // topics
            0xff, 0xff, 0xff, 0xff, // user data: null
            0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1, 0, 0, 0, 0, // owned partitions
        ]);
        let s = decode_subscription(&bytes).expect("decodes");
        assert_eq!(s.topics, vec![StrBytes::from_static_str("t")]);
        assert_eq!(s.owned_partitions.len(), 1);
        assert_eq!(s.owned_partitions[0].partitions, vec![0]);
        assert!(decode_subscription(&Bytes::from_static(&[0])).is_err());
        assert!(decode_subscription(&Bytes::from_static(&[0xff, 0xff, 0, 0])).is_err());
    }
}
