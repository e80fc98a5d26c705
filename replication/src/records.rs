//! Metadata records: the only way the metadata image changes.
//!
//! Every change to cluster metadata is one or more records, committed through the controller
//! quorum's raft log in batches (one batch per raft entry) and applied in order on every node.
//! A snapshot of the image is a batch of records too. The byte layout of every record is in
//! `replication/FORMAT.md`; keep the two in step.
//!
//! Decoding is total: any byte string yields a record or a `DecodeError`, never a panic, and no
//! allocation is larger than the input that claims it (every count is checked against the bytes
//! left before anything is reserved).
//!
//! Record type ids are Kafka's own metadata record ids where Kafka has the record; the bodies
//! are Sluice's fixed-width encoding (big-endian, no varints, no tagged fields), versioned per
//! record type so a later version can add fields.

use std::fmt;

use thiserror::Error;

/// A broker's node id (`node.id`), Kafka's `BrokerId`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BrokerId(pub i32);

impl BrokerId {
    /// Kafka's "no leader" value in a partition's `leader` field.
    pub const NONE: BrokerId = BrokerId(-1);
}

impl fmt::Display for BrokerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A broker's epoch: the metadata offset of the record that registered it. It grows with every
/// registration, so a request carrying an old epoch comes from a previous incarnation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BrokerEpoch(pub i64);

/// A topic's id (Kafka's topic id, a UUID that is never all zeros).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicId(pub uuid::Uuid);

impl fmt::Display for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A partition's leader epoch: grows every time its leader changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaderEpoch(pub i32);

/// A partition's epoch: grows with every change to the partition (leader, ISR, replicas).
/// AlterPartition requests carry it so a stale ISR change is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartitionEpoch(pub i32);

/// A metadata offset: the raft index of the entry that holds a record batch. Every record of a
/// batch has its entry's offset. Offset 0 means "nothing applied yet".
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Offset(pub i64);

/// Kafka's ConfigResource types that carry configs in the metadata log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ConfigResourceType {
    Topic,
    Broker,
    /// A group's configs (KIP-848 and KIP-932: session timeouts, share-group settings).
    Group,
}

impl ConfigResourceType {
    /// Kafka's `ConfigResource.Type` ids.
    pub fn id(self) -> i8 {
        match self {
            ConfigResourceType::Topic => 2,
            ConfigResourceType::Broker => 4,
            ConfigResourceType::Group => 32,
        }
    }

    pub fn from_id(id: i8) -> Option<Self> {
        match id {
            2 => Some(ConfigResourceType::Topic),
            4 => Some(ConfigResourceType::Broker),
            32 => Some(ConfigResourceType::Group),
            _ => None,
        }
    }
}

/// One listener a broker serves on (Kafka's `BrokerEndpoint`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    /// The listener name, e.g. `PLAINTEXT`.
    pub name: String,
    pub host: String,
    pub port: u16,
    /// Kafka's `SecurityProtocol` id (0 = PLAINTEXT).
    pub security_protocol: i16,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterBrokerRecord {
    pub broker_id: BrokerId,
    /// Random per process start; a registration with the same incarnation is a retry.
    pub incarnation_id: uuid::Uuid,
    pub broker_epoch: BrokerEpoch,
    pub endpoints: Vec<Endpoint>,
    pub rack: Option<String>,
    pub fenced: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnregisterBrokerRecord {
    pub broker_id: BrokerId,
    pub broker_epoch: BrokerEpoch,
}

/// Body of both FenceBroker and UnfenceBroker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerFencingRecord {
    pub id: BrokerId,
    pub epoch: BrokerEpoch,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicRecord {
    pub name: String,
    pub topic_id: TopicId,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoveTopicRecord {
    pub topic_id: TopicId,
}

/// A partition's whole state, as created and as written into snapshots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionRecord {
    pub partition_id: i32,
    pub topic_id: TopicId,
    pub replicas: Vec<BrokerId>,
    pub isr: Vec<BrokerId>,
    /// Replicas being removed by a reassignment (a subset of `replicas`).
    pub removing_replicas: Vec<BrokerId>,
    /// Replicas being added by a reassignment (a subset of `replicas`).
    pub adding_replicas: Vec<BrokerId>,
    /// `BrokerId::NONE` when the partition has no leader.
    pub leader: BrokerId,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
    /// KIP-966: replicas not in the ISR that are still safe to elect.
    pub eligible_leader_replicas: Vec<BrokerId>,
    /// KIP-966: the ELR as last seen when it became empty, for last-resort recovery.
    pub last_known_elr: Vec<BrokerId>,
}

/// A partial change to a partition; `None` leaves a field as it is. Applying it bumps the
/// partition epoch, and the leader epoch when `leader` is set.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PartitionChangeRecord {
    pub partition_id: i32,
    pub topic_id: TopicId,
    pub isr: Option<Vec<BrokerId>>,
    pub leader: Option<BrokerId>,
    pub replicas: Option<Vec<BrokerId>>,
    pub removing_replicas: Option<Vec<BrokerId>>,
    pub adding_replicas: Option<Vec<BrokerId>>,
    pub eligible_leader_replicas: Option<Vec<BrokerId>>,
    pub last_known_elr: Option<Vec<BrokerId>>,
}

impl Default for TopicId {
    fn default() -> Self {
        TopicId(uuid::Uuid::nil())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigRecord {
    pub resource_type: ConfigResourceType,
    /// The topic name, or for brokers the node id as a string ("" = cluster-wide default).
    pub resource_name: String,
    pub name: String,
    /// `None` deletes the config.
    pub value: Option<String>,
}

/// The next block of producer ids handed to a broker (AllocateProducerIds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerIdsRecord {
    pub broker_id: BrokerId,
    pub broker_epoch: BrokerEpoch,
    /// The first producer id not yet handed out after this block.
    pub next_producer_id: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureLevelRecord {
    pub name: String,
    pub feature_level: i16,
}

/// Written by a newly active controller as its first batch; once it is committed the controller
/// has applied everything its predecessors committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderChangeRecord {
    pub leader_id: BrokerId,
    /// The raft term the leader was elected in (Kafka's quorum epoch).
    pub leader_epoch: i32,
}

/// A user's SCRAM credential for one mechanism (AlterUserScramCredentials, `storage format
/// --add-scram`): the salt and the keys RFC 5802 derives from the salted password, never the
/// password itself.
#[derive(Clone, PartialEq, Eq)]
pub struct UserScramCredentialRecord {
    pub name: String,
    /// Kafka's ScramMechanism id: 1 SCRAM-SHA-256, 2 SCRAM-SHA-512.
    pub mechanism: i8,
    pub salt: Vec<u8>,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
    pub iterations: i32,
}

/// The keys are as good as a password to whoever holds the metadata log: kept out of `{:?}`.
impl fmt::Debug for UserScramCredentialRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserScramCredentialRecord")
            .field("name", &self.name)
            .field("mechanism", &self.mechanism)
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

/// One ACL, under the id CreateAcls gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessControlEntryRecord {
    pub id: uuid::Uuid,
    pub acl: crate::acl::AclBinding,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoveAccessControlEntryRecord {
    pub id: uuid::Uuid,
}

/// The entity a client quota applies to: `(entity type, name)` pairs sorted by type, Kafka's
/// types (`user`, `client-id`, `ip`); a `None` name is the type's default entity.
pub type QuotaEntity = Vec<(String, Option<String>)>;

/// A quota value (Kafka's are doubles): compared by its bits, so records and images stay `Eq`.
#[derive(Clone, Copy, Debug)]
pub struct QuotaValue(pub f64);

impl PartialEq for QuotaValue {
    fn eq(&self, other: &QuotaValue) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}
impl Eq for QuotaValue {}

/// One client quota set or removed (AlterClientQuotas, `kafka-configs --entity-type users
/// --alter --add-config producer_byte_rate=...`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientQuotaRecord {
    pub entity: QuotaEntity,
    /// Kafka's quota key: `producer_byte_rate`, `consumer_byte_rate`, `request_percentage`,
    /// `controller_mutation_rate`, `connection_creation_rate`.
    pub key: String,
    pub value: QuotaValue,
    pub remove: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoveUserScramCredentialRecord {
    pub name: String,
    pub mechanism: i8,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    RegisterBroker(RegisterBrokerRecord),
    UnregisterBroker(UnregisterBrokerRecord),
    Topic(TopicRecord),
    Partition(PartitionRecord),
    Config(ConfigRecord),
    PartitionChange(PartitionChangeRecord),
    FenceBroker(BrokerFencingRecord),
    UnfenceBroker(BrokerFencingRecord),
    RemoveTopic(RemoveTopicRecord),
    FeatureLevel(FeatureLevelRecord),
    ProducerIds(ProducerIdsRecord),
    UserScramCredential(UserScramCredentialRecord),
    RemoveUserScramCredential(RemoveUserScramCredentialRecord),
    AccessControlEntry(AccessControlEntryRecord),
    RemoveAccessControlEntry(RemoveAccessControlEntryRecord),
    ClientQuota(ClientQuotaRecord),
    NoOp,
    LeaderChange(LeaderChangeRecord),
}

/// Record type ids: Kafka's metadata record api keys; LeaderChange is in the control range.
pub mod record_type {
    pub const REGISTER_BROKER: u16 = 0;
    pub const UNREGISTER_BROKER: u16 = 1;
    pub const TOPIC: u16 = 2;
    pub const PARTITION: u16 = 3;
    pub const CONFIG: u16 = 4;
    pub const PARTITION_CHANGE: u16 = 5;
    pub const ACCESS_CONTROL_ENTRY: u16 = 6;
    pub const FENCE_BROKER: u16 = 7;
    pub const UNFENCE_BROKER: u16 = 8;
    pub const REMOVE_TOPIC: u16 = 9;
    pub const USER_SCRAM_CREDENTIAL: u16 = 11;
    pub const FEATURE_LEVEL: u16 = 12;
    pub const CLIENT_QUOTA: u16 = 14;
    pub const PRODUCER_IDS: u16 = 15;
    pub const REMOVE_ACCESS_CONTROL_ENTRY: u16 = 16;
    pub const NO_OP: u16 = 20;
    pub const REMOVE_USER_SCRAM_CREDENTIAL: u16 = 22;
    pub const LEADER_CHANGE: u16 = 0x8002;
}

/// The only body version of every record type today.
pub const RECORD_VERSION: u8 = 0;
/// The batch header's format version.
pub const BATCH_VERSION: u8 = 0;

/// Largest record frame accepted. The biggest real record is a Partition record of a
/// few hundred replicas; 1 MiB leaves room without letting garbage claim gigabytes.
pub const RECORD_BYTES_MAX: u32 = 1 << 20;
/// Largest string (Kafka's 16-bit string length, non-negative).
pub const STRING_BYTES_MAX: usize = i16::MAX as usize;
/// Frame header: length (4) + record type (2) + version (1).
pub const FRAME_HEADER_BYTES: usize = 7;
/// Batch header: version (1) + CRC-32 (4) + record count (4).
pub const BATCH_HEADER_BYTES: usize = 9;
/// Bits defined in PartitionChange's `fields_present`.
const PARTITION_CHANGE_FIELDS_MASK: u16 = 0x7f;

const _: () = assert!(STRING_BYTES_MAX < RECORD_BYTES_MAX as usize);

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("truncated: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    #[error("record frame of {len} bytes exceeds the limit of {max}")]
    FrameTooLarge { len: u32, max: u32 },
    #[error("record frame length {len} is shorter than its header")]
    FrameTooShort { len: u32 },
    #[error("unknown record type {record_type}")]
    UnknownType { record_type: u16 },
    #[error("record type {record_type} version {version} is not supported")]
    UnsupportedVersion { record_type: u16, version: u8 },
    #[error("record type {record_type} has {extra} bytes after its body")]
    TrailingBytes { record_type: u16, extra: usize },
    #[error("invalid boolean byte {byte}")]
    InvalidBool { byte: u8 },
    #[error("string is not UTF-8")]
    InvalidUtf8,
    #[error("invalid length {len}")]
    InvalidLength { len: i64 },
    #[error("array of {count} elements cannot fit in {remaining} bytes")]
    CountTooLarge { count: u32, remaining: usize },
    #[error("unknown config resource type {id}")]
    UnknownResourceType { id: i8 },
    #[error("unknown PartitionChange field bits {bits:#x}")]
    UnknownFields { bits: u16 },
    #[error("batch version {version} is not supported")]
    UnsupportedBatchVersion { version: u8 },
    #[error("batch checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch { stored: u32, computed: u32 },
    #[error("batch claims {claimed} records but holds {found}")]
    RecordCountMismatch { claimed: u32, found: u32 },
}

// ----- primitive writer -----

struct Writer<'a> {
    buf: &'a mut Vec<u8>,
}

impl Writer<'_> {
    fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    fn bool(&mut self, v: bool) {
        self.buf.push(u8::from(v));
    }
    fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn i16(&mut self, v: i16) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn i8(&mut self, v: i8) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn uuid(&mut self, v: &uuid::Uuid) {
        self.buf.extend_from_slice(v.as_bytes());
    }
    fn string(&mut self, s: &str) {
        // Callers validate lengths (topic names ≤ 249, configs bounded by the request size);
        // a longer string here is a programmer error.
        assert!(s.len() <= STRING_BYTES_MAX, "string of {} bytes", s.len());
        self.i16(s.len() as i16);
        self.buf.extend_from_slice(s.as_bytes());
    }
    fn nullable_string(&mut self, s: Option<&str>) {
        match s {
            None => self.i16(-1),
            Some(s) => self.string(s),
        }
    }
    fn bytes(&mut self, b: &[u8]) {
        // Salts and keys: tens of bytes.
        assert!(
            b.len() <= STRING_BYTES_MAX,
            "bytes field of {} bytes",
            b.len()
        );
        self.i16(b.len() as i16);
        self.buf.extend_from_slice(b);
    }
    fn brokers(&mut self, ids: &[BrokerId]) {
        self.u32(u32::try_from(ids.len()).expect("replica list fits u32"));
        for id in ids {
            self.i32(id.0);
        }
    }
}

// ----- primitive reader -----

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Truncated {
                need: n,
                have: self.buf.len(),
            });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    fn i8(&mut self) -> Result<i8, DecodeError> {
        Ok(i8::from_be_bytes(self.array()?))
    }
    fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            byte => Err(DecodeError::InvalidBool { byte }),
        }
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    fn i16(&mut self) -> Result<i16, DecodeError> {
        Ok(i16::from_be_bytes(self.array()?))
    }
    fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    fn uuid(&mut self) -> Result<uuid::Uuid, DecodeError> {
        Ok(uuid::Uuid::from_bytes(self.array()?))
    }
    fn string(&mut self) -> Result<String, DecodeError> {
        let len = self.i16()?;
        if len < 0 {
            return Err(DecodeError::InvalidLength { len: len.into() });
        }
        self.string_body(len as usize)
    }
    fn bytes(&mut self) -> Result<Vec<u8>, DecodeError> {
        let len = self.i16()?;
        if len < 0 {
            return Err(DecodeError::InvalidLength { len: len.into() });
        }
        Ok(self.take(len as usize)?.to_vec())
    }
    fn string_body(&mut self, len: usize) -> Result<String, DecodeError> {
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| DecodeError::InvalidUtf8)
    }
    fn nullable_string(&mut self) -> Result<Option<String>, DecodeError> {
        match self.i16()? {
            -1 => Ok(None),
            len if len < 0 => Err(DecodeError::InvalidLength { len: len.into() }),
            len => self.string_body(len as usize).map(Some),
        }
    }
    /// Reads an element count and checks that `count` elements of at least `element_bytes_min`
    /// bytes each fit in what is left, before anything is allocated.
    fn count(&mut self, element_bytes_min: usize) -> Result<usize, DecodeError> {
        let count = self.u32()?;
        let remaining = self.buf.len();
        if (count as usize).saturating_mul(element_bytes_min) > remaining {
            return Err(DecodeError::CountTooLarge { count, remaining });
        }
        Ok(count as usize)
    }
    fn brokers(&mut self) -> Result<Vec<BrokerId>, DecodeError> {
        let count = self.count(4)?;
        (0..count).map(|_| self.i32().map(BrokerId)).collect()
    }
}

// ----- records -----

impl Record {
    pub fn record_type(&self) -> u16 {
        use record_type::*;
        match self {
            Record::RegisterBroker(_) => REGISTER_BROKER,
            Record::UnregisterBroker(_) => UNREGISTER_BROKER,
            Record::Topic(_) => TOPIC,
            Record::Partition(_) => PARTITION,
            Record::Config(_) => CONFIG,
            Record::PartitionChange(_) => PARTITION_CHANGE,
            Record::FenceBroker(_) => FENCE_BROKER,
            Record::UnfenceBroker(_) => UNFENCE_BROKER,
            Record::RemoveTopic(_) => REMOVE_TOPIC,
            Record::FeatureLevel(_) => FEATURE_LEVEL,
            Record::ProducerIds(_) => PRODUCER_IDS,
            Record::UserScramCredential(_) => USER_SCRAM_CREDENTIAL,
            Record::RemoveUserScramCredential(_) => REMOVE_USER_SCRAM_CREDENTIAL,
            Record::AccessControlEntry(_) => ACCESS_CONTROL_ENTRY,
            Record::RemoveAccessControlEntry(_) => REMOVE_ACCESS_CONTROL_ENTRY,
            Record::ClientQuota(_) => CLIENT_QUOTA,
            Record::NoOp => NO_OP,
            Record::LeaderChange(_) => LEADER_CHANGE,
        }
    }

    /// Appends this record's frame (header and body) to `buf`.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        let start = buf.len();
        buf.extend_from_slice(&[0; 4]);
        let mut w = Writer { buf };
        w.u16(self.record_type());
        w.u8(RECORD_VERSION);
        self.encode_body(&mut w);
        let len = u32::try_from(buf.len() - start - 4).expect("record fits u32");
        assert!(
            len <= RECORD_BYTES_MAX,
            "record of {len} bytes is too large"
        );
        buf[start..start + 4].copy_from_slice(&len.to_be_bytes());
    }

    fn encode_body(&self, w: &mut Writer<'_>) {
        match self {
            Record::RegisterBroker(r) => {
                w.i32(r.broker_id.0);
                w.uuid(&r.incarnation_id);
                w.i64(r.broker_epoch.0);
                w.u32(u32::try_from(r.endpoints.len()).expect("endpoints fit u32"));
                for e in &r.endpoints {
                    w.string(&e.name);
                    w.string(&e.host);
                    w.u16(e.port);
                    w.i16(e.security_protocol);
                }
                w.nullable_string(r.rack.as_deref());
                w.bool(r.fenced);
            }
            Record::UnregisterBroker(r) => {
                w.i32(r.broker_id.0);
                w.i64(r.broker_epoch.0);
            }
            Record::Topic(r) => {
                w.string(&r.name);
                w.uuid(&r.topic_id.0);
            }
            Record::Partition(r) => {
                w.i32(r.partition_id);
                w.uuid(&r.topic_id.0);
                w.brokers(&r.replicas);
                w.brokers(&r.isr);
                w.brokers(&r.removing_replicas);
                w.brokers(&r.adding_replicas);
                w.i32(r.leader.0);
                w.i32(r.leader_epoch.0);
                w.i32(r.partition_epoch.0);
                w.brokers(&r.eligible_leader_replicas);
                w.brokers(&r.last_known_elr);
            }
            Record::Config(r) => {
                w.i8(r.resource_type.id());
                w.string(&r.resource_name);
                w.string(&r.name);
                w.nullable_string(r.value.as_deref());
            }
            Record::PartitionChange(r) => {
                w.i32(r.partition_id);
                w.uuid(&r.topic_id.0);
                let lists = [
                    &r.isr,
                    &None, // the leader's slot (bit 1), written below
                    &r.replicas,
                    &r.removing_replicas,
                    &r.adding_replicas,
                    &r.eligible_leader_replicas,
                    &r.last_known_elr,
                ];
                let mut present = 0u16;
                for (bit, list) in lists.iter().enumerate() {
                    if list.is_some() {
                        present |= 1 << bit;
                    }
                }
                if r.leader.is_some() {
                    present |= 1 << 1;
                }
                w.u16(present);
                if let Some(isr) = &r.isr {
                    w.brokers(isr);
                }
                if let Some(leader) = r.leader {
                    w.i32(leader.0);
                }
                for list in lists.iter().skip(2).copied().flatten() {
                    w.brokers(list);
                }
            }
            Record::FenceBroker(r) | Record::UnfenceBroker(r) => {
                w.i32(r.id.0);
                w.i64(r.epoch.0);
            }
            Record::RemoveTopic(r) => w.uuid(&r.topic_id.0),
            Record::FeatureLevel(r) => {
                w.string(&r.name);
                w.i16(r.feature_level);
            }
            Record::ProducerIds(r) => {
                w.i32(r.broker_id.0);
                w.i64(r.broker_epoch.0);
                w.i64(r.next_producer_id);
            }
            Record::UserScramCredential(r) => {
                w.string(&r.name);
                w.i8(r.mechanism);
                w.bytes(&r.salt);
                w.bytes(&r.stored_key);
                w.bytes(&r.server_key);
                w.i32(r.iterations);
            }
            Record::RemoveUserScramCredential(r) => {
                w.string(&r.name);
                w.i8(r.mechanism);
            }
            Record::AccessControlEntry(r) => {
                w.uuid(&r.id);
                w.i8(r.acl.resource_type);
                w.string(&r.acl.resource_name);
                w.i8(r.acl.pattern_type);
                w.string(&r.acl.principal);
                w.string(&r.acl.host);
                w.i8(r.acl.operation);
                w.i8(r.acl.permission);
            }
            Record::RemoveAccessControlEntry(r) => w.uuid(&r.id),
            Record::ClientQuota(r) => {
                w.u32(u32::try_from(r.entity.len()).expect("entity parts fit u32"));
                for (entity_type, name) in &r.entity {
                    w.string(entity_type);
                    w.nullable_string(name.as_deref());
                }
                w.string(&r.key);
                w.u64(r.value.0.to_bits());
                w.bool(r.remove);
            }
            Record::NoOp => {}
            Record::LeaderChange(r) => {
                w.i32(r.leader_id.0);
                w.i32(r.leader_epoch);
            }
        }
    }

    /// Decodes one record frame from the front of `buf`, returning it and the bytes it used.
    pub fn decode(buf: &[u8]) -> Result<(Record, usize), DecodeError> {
        let mut r = Reader { buf };
        let len = r.u32()?;
        if len > RECORD_BYTES_MAX {
            return Err(DecodeError::FrameTooLarge {
                len,
                max: RECORD_BYTES_MAX,
            });
        }
        if (len as usize) < FRAME_HEADER_BYTES - 4 {
            return Err(DecodeError::FrameTooShort { len });
        }
        let frame = r.take(len as usize)?;
        let mut r = Reader { buf: frame };
        let record_type = r.u16()?;
        let version = r.u8()?;
        let record = Self::decode_body(record_type, version, &mut r)?;
        if !r.buf.is_empty() {
            return Err(DecodeError::TrailingBytes {
                record_type,
                extra: r.buf.len(),
            });
        }
        Ok((record, 4 + len as usize))
    }

    fn decode_body(
        record_type: u16,
        version: u8,
        r: &mut Reader<'_>,
    ) -> Result<Record, DecodeError> {
        use record_type::*;
        let known = matches!(
            record_type,
            REGISTER_BROKER
                | UNREGISTER_BROKER
                | TOPIC
                | PARTITION
                | CONFIG
                | PARTITION_CHANGE
                | FENCE_BROKER
                | UNFENCE_BROKER
                | REMOVE_TOPIC
                | FEATURE_LEVEL
                | PRODUCER_IDS
                | USER_SCRAM_CREDENTIAL
                | REMOVE_USER_SCRAM_CREDENTIAL
                | ACCESS_CONTROL_ENTRY
                | REMOVE_ACCESS_CONTROL_ENTRY
                | CLIENT_QUOTA
                | NO_OP
                | LEADER_CHANGE
        );
        if !known {
            return Err(DecodeError::UnknownType { record_type });
        }
        if version != RECORD_VERSION {
            return Err(DecodeError::UnsupportedVersion {
                record_type,
                version,
            });
        }
        Ok(match record_type {
            REGISTER_BROKER => {
                let broker_id = BrokerId(r.i32()?);
                let incarnation_id = r.uuid()?;
                let broker_epoch = BrokerEpoch(r.i64()?);
                // An endpoint is at least two empty strings, a port and a protocol: 8 bytes.
                let count = r.count(8)?;
                let mut endpoints = Vec::with_capacity(count);
                for _ in 0..count {
                    endpoints.push(Endpoint {
                        name: r.string()?,
                        host: r.string()?,
                        port: r.u16()?,
                        security_protocol: r.i16()?,
                    });
                }
                Record::RegisterBroker(RegisterBrokerRecord {
                    broker_id,
                    incarnation_id,
                    broker_epoch,
                    endpoints,
                    rack: r.nullable_string()?,
                    fenced: r.bool()?,
                })
            }
            UNREGISTER_BROKER => Record::UnregisterBroker(UnregisterBrokerRecord {
                broker_id: BrokerId(r.i32()?),
                broker_epoch: BrokerEpoch(r.i64()?),
            }),
            TOPIC => Record::Topic(TopicRecord {
                name: r.string()?,
                topic_id: TopicId(r.uuid()?),
            }),
            PARTITION => Record::Partition(PartitionRecord {
                partition_id: r.i32()?,
                topic_id: TopicId(r.uuid()?),
                replicas: r.brokers()?,
                isr: r.brokers()?,
                removing_replicas: r.brokers()?,
                adding_replicas: r.brokers()?,
                leader: BrokerId(r.i32()?),
                leader_epoch: LeaderEpoch(r.i32()?),
                partition_epoch: PartitionEpoch(r.i32()?),
                eligible_leader_replicas: r.brokers()?,
                last_known_elr: r.brokers()?,
            }),
            CONFIG => {
                let id = r.i8()?;
                let resource_type = ConfigResourceType::from_id(id)
                    .ok_or(DecodeError::UnknownResourceType { id })?;
                Record::Config(ConfigRecord {
                    resource_type,
                    resource_name: r.string()?,
                    name: r.string()?,
                    value: r.nullable_string()?,
                })
            }
            PARTITION_CHANGE => {
                let partition_id = r.i32()?;
                let topic_id = TopicId(r.uuid()?);
                let present = r.u16()?;
                if present & !PARTITION_CHANGE_FIELDS_MASK != 0 {
                    return Err(DecodeError::UnknownFields {
                        bits: present & !PARTITION_CHANGE_FIELDS_MASK,
                    });
                }
                let has = |bit: u16| present & (1 << bit) != 0;
                let list = |bit: u16, r: &mut Reader<'_>| -> Result<_, DecodeError> {
                    if has(bit) {
                        r.brokers().map(Some)
                    } else {
                        Ok(None)
                    }
                };
                let isr = list(0, r)?;
                let leader = if has(1) {
                    Some(BrokerId(r.i32()?))
                } else {
                    None
                };
                Record::PartitionChange(PartitionChangeRecord {
                    partition_id,
                    topic_id,
                    isr,
                    leader,
                    replicas: list(2, r)?,
                    removing_replicas: list(3, r)?,
                    adding_replicas: list(4, r)?,
                    eligible_leader_replicas: list(5, r)?,
                    last_known_elr: list(6, r)?,
                })
            }
            FENCE_BROKER | UNFENCE_BROKER => {
                let body = BrokerFencingRecord {
                    id: BrokerId(r.i32()?),
                    epoch: BrokerEpoch(r.i64()?),
                };
                if record_type == FENCE_BROKER {
                    Record::FenceBroker(body)
                } else {
                    Record::UnfenceBroker(body)
                }
            }
            REMOVE_TOPIC => Record::RemoveTopic(RemoveTopicRecord {
                topic_id: TopicId(r.uuid()?),
            }),
            FEATURE_LEVEL => Record::FeatureLevel(FeatureLevelRecord {
                name: r.string()?,
                feature_level: r.i16()?,
            }),
            PRODUCER_IDS => Record::ProducerIds(ProducerIdsRecord {
                broker_id: BrokerId(r.i32()?),
                broker_epoch: BrokerEpoch(r.i64()?),
                next_producer_id: r.i64()?,
            }),
            USER_SCRAM_CREDENTIAL => Record::UserScramCredential(UserScramCredentialRecord {
                name: r.string()?,
                mechanism: r.i8()?,
                salt: r.bytes()?,
                stored_key: r.bytes()?,
                server_key: r.bytes()?,
                iterations: r.i32()?,
            }),
            REMOVE_USER_SCRAM_CREDENTIAL => {
                Record::RemoveUserScramCredential(RemoveUserScramCredentialRecord {
                    name: r.string()?,
                    mechanism: r.i8()?,
                })
            }
            ACCESS_CONTROL_ENTRY => Record::AccessControlEntry(AccessControlEntryRecord {
                id: r.uuid()?,
                acl: crate::acl::AclBinding {
                    resource_type: r.i8()?,
                    resource_name: r.string()?,
                    pattern_type: r.i8()?,
                    principal: r.string()?,
                    host: r.string()?,
                    operation: r.i8()?,
                    permission: r.i8()?,
                },
            }),
            REMOVE_ACCESS_CONTROL_ENTRY => {
                Record::RemoveAccessControlEntry(RemoveAccessControlEntryRecord { id: r.uuid()? })
            }
            CLIENT_QUOTA => {
                // Each part is two strings of at least their two length bytes.
                let count = r.count(4)?;
                let mut entity = Vec::with_capacity(count);
                for _ in 0..count {
                    entity.push((r.string()?, r.nullable_string()?));
                }
                Record::ClientQuota(ClientQuotaRecord {
                    entity,
                    key: r.string()?,
                    value: QuotaValue(f64::from_bits(r.u64()?)),
                    remove: r.bool()?,
                })
            }
            NO_OP => Record::NoOp,
            LEADER_CHANGE => Record::LeaderChange(LeaderChangeRecord {
                leader_id: BrokerId(r.i32()?),
                leader_epoch: r.i32()?,
            }),
            _ => unreachable!("record type {record_type} checked above"),
        })
    }
}

/// Encodes records as one batch: the payload of a raft entry, or a whole snapshot.
pub fn encode_batch(records: &[Record]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(BATCH_HEADER_BYTES + 64 * records.len());
    buf.push(BATCH_VERSION);
    buf.extend_from_slice(&[0; 4]);
    buf.extend_from_slice(
        &u32::try_from(records.len())
            .expect("record count fits u32")
            .to_be_bytes(),
    );
    for record in records {
        record.encode(&mut buf);
    }
    let crc = crc32fast::hash(&buf[5..]);
    buf[1..5].copy_from_slice(&crc.to_be_bytes());
    buf
}

/// Decodes a batch written by `encode_batch`, checking its version, checksum and count.
pub fn decode_batch(buf: &[u8]) -> Result<Vec<Record>, DecodeError> {
    let mut r = Reader { buf };
    let version = r.u8()?;
    if version != BATCH_VERSION {
        return Err(DecodeError::UnsupportedBatchVersion { version });
    }
    let stored = r.u32()?;
    let computed = crc32fast::hash(r.buf);
    if stored != computed {
        return Err(DecodeError::ChecksumMismatch { stored, computed });
    }
    let claimed = r.count(FRAME_HEADER_BYTES)? as u32;
    let mut records = Vec::with_capacity(claimed as usize);
    let mut rest = r.buf;
    while !rest.is_empty() {
        let (record, used) = Record::decode(rest)?;
        records.push(record);
        rest = &rest[used..];
        if records.len() > claimed as usize {
            break;
        }
    }
    if records.len() != claimed as usize {
        return Err(DecodeError::RecordCountMismatch {
            claimed,
            found: records.len() as u32,
        });
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn brokers() -> impl Strategy<Value = Vec<BrokerId>> {
        proptest::collection::vec(any::<i32>().prop_map(BrokerId), 0..6)
    }
    fn opt_brokers() -> impl Strategy<Value = Option<Vec<BrokerId>>> {
        proptest::option::of(brokers())
    }
    fn name() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9._-]{0,20}"
    }
    fn topic_id() -> impl Strategy<Value = TopicId> {
        any::<u128>().prop_map(|v| TopicId(uuid::Uuid::from_u128(v)))
    }

    fn record() -> impl Strategy<Value = Record> {
        let endpoint = (name(), name(), any::<u16>(), any::<i16>()).prop_map(
            |(name, host, port, security_protocol)| Endpoint {
                name,
                host,
                port,
                security_protocol,
            },
        );
        prop_oneof![
            (
                any::<i32>(),
                any::<u128>(),
                any::<i64>(),
                proptest::collection::vec(endpoint, 0..3),
                proptest::option::of(name()),
                any::<bool>()
            )
                .prop_map(|(id, inc, epoch, endpoints, rack, fenced)| {
                    Record::RegisterBroker(RegisterBrokerRecord {
                        broker_id: BrokerId(id),
                        incarnation_id: uuid::Uuid::from_u128(inc),
                        broker_epoch: BrokerEpoch(epoch),
                        endpoints,
                        rack,
                        fenced,
                    })
                }),
            (any::<i32>(), any::<i64>()).prop_map(|(id, e)| Record::UnregisterBroker(
                UnregisterBrokerRecord {
                    broker_id: BrokerId(id),
                    broker_epoch: BrokerEpoch(e)
                }
            )),
            (name(), topic_id())
                .prop_map(|(name, topic_id)| Record::Topic(TopicRecord { name, topic_id })),
            (
                (
                    any::<i32>(),
                    topic_id(),
                    brokers(),
                    brokers(),
                    brokers(),
                    brokers()
                ),
                (
                    any::<i32>(),
                    any::<i32>(),
                    any::<i32>(),
                    brokers(),
                    brokers()
                )
            )
                .prop_map(
                    |((p, t, replicas, isr, rem, add), (l, le, pe, elr, lkelr))| {
                        Record::Partition(PartitionRecord {
                            partition_id: p,
                            topic_id: t,
                            replicas,
                            isr,
                            removing_replicas: rem,
                            adding_replicas: add,
                            leader: BrokerId(l),
                            leader_epoch: LeaderEpoch(le),
                            partition_epoch: PartitionEpoch(pe),
                            eligible_leader_replicas: elr,
                            last_known_elr: lkelr,
                        })
                    }
                ),
            (any::<bool>(), name(), name(), proptest::option::of(name())).prop_map(
                |(topic, resource_name, name, value)| Record::Config(ConfigRecord {
                    resource_type: if topic {
                        ConfigResourceType::Topic
                    } else {
                        ConfigResourceType::Broker
                    },
                    resource_name,
                    name,
                    value
                })
            ),
            (
                (
                    any::<i32>(),
                    topic_id(),
                    opt_brokers(),
                    proptest::option::of(any::<i32>())
                ),
                (
                    opt_brokers(),
                    opt_brokers(),
                    opt_brokers(),
                    opt_brokers(),
                    opt_brokers()
                )
            )
                .prop_map(|((p, t, isr, leader), (replicas, rem, add, elr, lk))| {
                    Record::PartitionChange(PartitionChangeRecord {
                        partition_id: p,
                        topic_id: t,
                        isr,
                        leader: leader.map(BrokerId),
                        replicas,
                        removing_replicas: rem,
                        adding_replicas: add,
                        eligible_leader_replicas: elr,
                        last_known_elr: lk,
                    })
                }),
            (any::<i32>(), any::<i64>(), any::<bool>()).prop_map(|(id, e, fence)| {
                let body = BrokerFencingRecord {
                    id: BrokerId(id),
                    epoch: BrokerEpoch(e),
                };
                if fence {
                    Record::FenceBroker(body)
                } else {
                    Record::UnfenceBroker(body)
                }
            }),
            topic_id().prop_map(|topic_id| Record::RemoveTopic(RemoveTopicRecord { topic_id })),
            (name(), any::<i16>()).prop_map(|(name, feature_level)| Record::FeatureLevel(
                FeatureLevelRecord {
                    name,
                    feature_level
                }
            )),
            (any::<i32>(), any::<i64>(), any::<i64>()).prop_map(|(b, e, n)| {
                Record::ProducerIds(ProducerIdsRecord {
                    broker_id: BrokerId(b),
                    broker_epoch: BrokerEpoch(e),
                    next_producer_id: n,
                })
            }),
            (
                name(),
                any::<i8>(),
                proptest::collection::vec(any::<u8>(), 0..64),
                proptest::collection::vec(any::<u8>(), 0..64),
                proptest::collection::vec(any::<u8>(), 0..64),
                any::<i32>()
            )
                .prop_map(
                    |(name, mechanism, salt, stored_key, server_key, iterations)| {
                        Record::UserScramCredential(UserScramCredentialRecord {
                            name,
                            mechanism,
                            salt,
                            stored_key,
                            server_key,
                            iterations,
                        })
                    }
                ),
            (name(), any::<i8>()).prop_map(|(name, mechanism)| {
                Record::RemoveUserScramCredential(RemoveUserScramCredentialRecord {
                    name,
                    mechanism,
                })
            }),
            (
                any::<u128>(),
                (any::<i8>(), name(), any::<i8>()),
                (name(), name(), any::<i8>(), any::<i8>())
            )
                .prop_map(
                    |(
                        id,
                        (resource_type, resource_name, pattern_type),
                        (principal, host, operation, permission),
                    )| {
                        Record::AccessControlEntry(AccessControlEntryRecord {
                            id: uuid::Uuid::from_u128(id),
                            acl: crate::acl::AclBinding {
                                resource_type,
                                resource_name,
                                pattern_type,
                                principal,
                                host,
                                operation,
                                permission,
                            },
                        })
                    }
                ),
            any::<u128>().prop_map(|id| Record::RemoveAccessControlEntry(
                RemoveAccessControlEntryRecord {
                    id: uuid::Uuid::from_u128(id)
                }
            )),
            (
                proptest::collection::vec((name(), proptest::option::of(name())), 0..3),
                name(),
                any::<f64>(),
                any::<bool>()
            )
                .prop_map(|(entity, key, value, remove)| {
                    Record::ClientQuota(ClientQuotaRecord {
                        entity,
                        key,
                        value: QuotaValue(value),
                        remove,
                    })
                }),
            Just(Record::NoOp),
            (any::<i32>(), any::<i32>()).prop_map(|(l, e)| Record::LeaderChange(
                LeaderChangeRecord {
                    leader_id: BrokerId(l),
                    leader_epoch: e
                }
            )),
        ]
    }

    proptest! {
        #[test]
        fn every_record_round_trips(records in proptest::collection::vec(record(), 0..8)) {
            for record in &records {
                let mut buf = Vec::new();
                record.encode(&mut buf);
                let (decoded, used) = Record::decode(&buf).unwrap();
                prop_assert_eq!(used, buf.len());
                prop_assert_eq!(&decoded, record);
            }
            let batch = encode_batch(&records);
            prop_assert_eq!(decode_batch(&batch).unwrap(), records);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Record::decode(&bytes);
            let _ = decode_batch(&bytes);
        }

        #[test]
        fn garbage_with_a_valid_checksum_never_panics(
            count in 0u32..1000,
            body in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            // Past the checksum, so the record decoder itself sees the garbage.
            let mut buf = vec![BATCH_VERSION, 0, 0, 0, 0];
            buf.extend_from_slice(&count.to_be_bytes());
            buf.extend_from_slice(&body);
            let crc = crc32fast::hash(&buf[5..]);
            buf[1..5].copy_from_slice(&crc.to_be_bytes());
            let _ = decode_batch(&buf);
        }

        #[test]
        fn every_truncation_of_a_record_is_an_error(record in record()) {
            let mut buf = Vec::new();
            record.encode(&mut buf);
            for cut in 0..buf.len() {
                prop_assert!(Record::decode(&buf[..cut]).is_err());
            }
        }
    }

    #[test]
    fn huge_counts_are_refused_before_allocating() {
        // A Partition record claiming four billion replicas in a few bytes.
        let mut buf = Vec::new();
        Record::Partition(PartitionRecord {
            partition_id: 0,
            topic_id: TopicId::default(),
            replicas: vec![],
            isr: vec![],
            removing_replicas: vec![],
            adding_replicas: vec![],
            leader: BrokerId::NONE,
            leader_epoch: LeaderEpoch(0),
            partition_epoch: PartitionEpoch(0),
            eligible_leader_replicas: vec![],
            last_known_elr: vec![],
        })
        .encode(&mut buf);
        let replicas_at = FRAME_HEADER_BYTES + 4 + 16;
        buf[replicas_at..replicas_at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            Record::decode(&buf),
            Err(DecodeError::CountTooLarge {
                count: u32::MAX,
                ..
            })
        ));
        let mut frame = vec![0xff, 0xff, 0xff, 0xff];
        frame.extend_from_slice(&[0; 8]);
        assert!(matches!(
            Record::decode(&frame),
            Err(DecodeError::FrameTooLarge { .. })
        ));
    }

    #[test]
    fn a_flipped_bit_fails_the_batch_checksum() {
        let mut batch = encode_batch(&[Record::NoOp, Record::NoOp]);
        let last = batch.len() - 1;
        batch[last] ^= 1;
        assert!(matches!(
            decode_batch(&batch),
            Err(DecodeError::ChecksumMismatch { .. })
        ));
    }

    #[test]
    fn unknown_types_and_versions_are_errors() {
        let mut buf = Vec::new();
        Record::NoOp.encode(&mut buf);
        buf[6] = 1;
        assert_eq!(
            Record::decode(&buf).unwrap_err(),
            DecodeError::UnsupportedVersion {
                record_type: record_type::NO_OP,
                version: 1
            }
        );
        buf[4..6].copy_from_slice(&999u16.to_be_bytes());
        assert_eq!(
            Record::decode(&buf).unwrap_err(),
            DecodeError::UnknownType { record_type: 999 }
        );
    }
}
