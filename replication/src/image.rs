//! The metadata image: the cluster's metadata as of one metadata offset.
//!
//! Built only by applying committed records in log order (`apply`), on every node, voters and
//! brokers alike; nothing else writes it. A snapshot is the image written back out as records
//! (`snapshot_records`), so rebuilding from a snapshot is the same `apply` path.
//!
//! What it holds replaces the single-node broker's JSON image: topics with ids and configs,
//! partitions, dynamic broker configs and the producer-id counter. Which shard owns a partition
//! is not cluster metadata (each node places its replicas on its own cores) and is not here.

use std::collections::BTreeMap;

use thiserror::Error;

use crate::records::*;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerRegistration {
    pub id: BrokerId,
    pub incarnation_id: uuid::Uuid,
    pub epoch: BrokerEpoch,
    pub endpoints: Vec<Endpoint>,
    pub rack: Option<String>,
    pub fenced: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionRegistration {
    pub replicas: Vec<BrokerId>,
    pub isr: Vec<BrokerId>,
    pub removing_replicas: Vec<BrokerId>,
    pub adding_replicas: Vec<BrokerId>,
    pub leader: BrokerId,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
    pub eligible_leader_replicas: Vec<BrokerId>,
    pub last_known_elr: Vec<BrokerId>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicImage {
    pub name: String,
    pub id: TopicId,
    pub partitions: BTreeMap<i32, PartitionRegistration>,
}

/// Configs of one resource, Kafka names.
pub type ConfigMap = BTreeMap<String, String>;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetadataImage {
    /// The offset of the last batch applied (0 before any).
    offset: Offset,
    brokers: BTreeMap<BrokerId, BrokerRegistration>,
    topics: BTreeMap<TopicId, TopicImage>,
    topic_ids: BTreeMap<String, TopicId>,
    configs: BTreeMap<(ConfigResourceType, String), ConfigMap>,
    /// The last block handed out, if any; `next_producer_id` is the first id after it.
    producer_ids: Option<ProducerIdsRecord>,
    features: BTreeMap<String, i16>,
    /// SCRAM credentials by user name and mechanism id.
    scram: BTreeMap<(String, i8), UserScramCredentialRecord>,
    /// ACLs by id.
    acls: BTreeMap<uuid::Uuid, crate::acl::AclBinding>,
    /// Client quotas by entity, then key.
    quotas: BTreeMap<QuotaEntity, BTreeMap<String, QuotaValue>>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ApplyError {
    #[error("offset {offset:?} is before the image's offset {image:?}")]
    OffsetWentBack { offset: Offset, image: Offset },
    #[error("topic name {name:?} already exists")]
    DuplicateTopicName { name: String },
    #[error("topic id {id} already exists")]
    DuplicateTopicId { id: TopicId },
    #[error("unknown topic id {id}")]
    UnknownTopic { id: TopicId },
    #[error("partition {partition} of topic {id} already exists")]
    DuplicatePartition { id: TopicId, partition: i32 },
    #[error("unknown partition {partition} of topic {id}")]
    UnknownPartition { id: TopicId, partition: i32 },
    #[error("unknown broker {id}")]
    UnknownBroker { id: BrokerId },
    #[error("broker {id} epoch {epoch:?} does not match the registered {registered:?}")]
    BrokerEpochMismatch {
        id: BrokerId,
        epoch: BrokerEpoch,
        registered: BrokerEpoch,
    },
    #[error("broker {id} registration epoch {epoch:?} is not above {previous:?}")]
    BrokerEpochWentBack {
        id: BrokerId,
        epoch: BrokerEpoch,
        previous: BrokerEpoch,
    },
    #[error("next producer id {next} is not above {previous}")]
    ProducerIdWentBack { next: i64, previous: i64 },
    #[error("topic config for unknown topic {name:?}")]
    ConfigForUnknownTopic { name: String },
}

impl MetadataImage {
    pub fn offset(&self) -> Offset {
        self.offset
    }

    pub fn brokers(&self) -> impl Iterator<Item = &BrokerRegistration> {
        self.brokers.values()
    }

    pub fn broker(&self, id: BrokerId) -> Option<&BrokerRegistration> {
        self.brokers.get(&id)
    }

    /// Registered brokers that are not fenced: those that may lead partitions.
    pub fn unfenced_brokers(&self) -> impl Iterator<Item = &BrokerRegistration> {
        self.brokers.values().filter(|b| !b.fenced)
    }

    pub fn is_unfenced(&self, id: BrokerId) -> bool {
        self.brokers.get(&id).is_some_and(|b| !b.fenced)
    }

    /// Topics in topic id order.
    pub fn topics(&self) -> impl Iterator<Item = &TopicImage> {
        self.topics.values()
    }

    pub fn topic(&self, name: &str) -> Option<&TopicImage> {
        self.topics.get(self.topic_ids.get(name)?)
    }

    pub fn topic_by_id(&self, id: TopicId) -> Option<&TopicImage> {
        self.topics.get(&id)
    }

    pub fn partition(&self, id: TopicId, partition: i32) -> Option<&PartitionRegistration> {
        self.topics.get(&id)?.partitions.get(&partition)
    }

    pub fn configs(&self, resource_type: ConfigResourceType, name: &str) -> Option<&ConfigMap> {
        self.configs.get(&(resource_type, name.to_owned()))
    }

    /// Every resource of `resource_type` with configs set, and its configs.
    pub fn configs_of(
        &self,
        resource_type: ConfigResourceType,
    ) -> impl Iterator<Item = (&str, &ConfigMap)> {
        self.configs
            .iter()
            .filter(move |((t, _), _)| *t == resource_type)
            .map(|((_, name), c)| (name.as_str(), c))
    }

    pub fn topic_configs(&self, topic: &str) -> Option<&ConfigMap> {
        self.configs(ConfigResourceType::Topic, topic)
    }

    /// The first producer id not yet handed out.
    pub fn next_producer_id(&self) -> i64 {
        self.producer_ids.as_ref().map_or(0, |p| p.next_producer_id)
    }

    pub fn feature_level(&self, name: &str) -> Option<i16> {
        self.features.get(name).copied()
    }

    /// Every finalized feature above level 0, by name.
    pub fn features(&self) -> &BTreeMap<String, i16> {
        &self.features
    }

    /// Applies one committed record at `offset`. Records of one batch share its offset. An
    /// error means the record contradicts the image: the log or the controller is wrong.
    /// A user's SCRAM credential for a mechanism (1 SCRAM-SHA-256, 2 SCRAM-SHA-512).
    pub fn scram_credential(
        &self,
        name: &str,
        mechanism: i8,
    ) -> Option<&UserScramCredentialRecord> {
        self.scram.get(&(name.to_string(), mechanism))
    }

    /// Every SCRAM credential, by user name then mechanism.
    pub fn scram_credentials(&self) -> impl Iterator<Item = &UserScramCredentialRecord> {
        self.scram.values()
    }

    /// Every client quota, by entity then key (Kafka's quota names).
    pub fn client_quotas(&self) -> &BTreeMap<QuotaEntity, BTreeMap<String, QuotaValue>> {
        &self.quotas
    }

    /// Every ACL, by id.
    pub fn acls(&self) -> &BTreeMap<uuid::Uuid, crate::acl::AclBinding> {
        &self.acls
    }

    pub fn apply(&mut self, offset: Offset, record: &Record) -> Result<(), ApplyError> {
        if offset < self.offset {
            return Err(ApplyError::OffsetWentBack {
                offset,
                image: self.offset,
            });
        }
        self.apply_record(record)?;
        self.offset = offset;
        Ok(())
    }

    fn apply_record(&mut self, record: &Record) -> Result<(), ApplyError> {
        match record {
            Record::RegisterBroker(r) => {
                if let Some(previous) = self.brokers.get(&r.broker_id) {
                    if r.broker_epoch <= previous.epoch {
                        return Err(ApplyError::BrokerEpochWentBack {
                            id: r.broker_id,
                            epoch: r.broker_epoch,
                            previous: previous.epoch,
                        });
                    }
                }
                self.brokers.insert(
                    r.broker_id,
                    BrokerRegistration {
                        id: r.broker_id,
                        incarnation_id: r.incarnation_id,
                        epoch: r.broker_epoch,
                        endpoints: r.endpoints.clone(),
                        rack: r.rack.clone(),
                        fenced: r.fenced,
                    },
                );
            }
            Record::UnregisterBroker(r) => {
                self.broker_with_epoch(r.broker_id, r.broker_epoch)?;
                self.brokers.remove(&r.broker_id);
            }
            Record::FenceBroker(r) => self.broker_with_epoch(r.id, r.epoch)?.fenced = true,
            Record::UnfenceBroker(r) => self.broker_with_epoch(r.id, r.epoch)?.fenced = false,
            Record::Topic(r) => {
                if self.topic_ids.contains_key(&r.name) {
                    return Err(ApplyError::DuplicateTopicName {
                        name: r.name.clone(),
                    });
                }
                if self.topics.contains_key(&r.topic_id) {
                    return Err(ApplyError::DuplicateTopicId { id: r.topic_id });
                }
                self.topic_ids.insert(r.name.clone(), r.topic_id);
                self.topics.insert(
                    r.topic_id,
                    TopicImage {
                        name: r.name.clone(),
                        id: r.topic_id,
                        partitions: BTreeMap::new(),
                    },
                );
            }
            Record::RemoveTopic(r) => {
                let topic = self
                    .topics
                    .remove(&r.topic_id)
                    .ok_or(ApplyError::UnknownTopic { id: r.topic_id })?;
                self.topic_ids.remove(&topic.name);
                // A topic's configs go with it, as in Kafka.
                self.configs
                    .remove(&(ConfigResourceType::Topic, topic.name));
            }
            Record::Partition(r) => {
                let topic = self
                    .topics
                    .get_mut(&r.topic_id)
                    .ok_or(ApplyError::UnknownTopic { id: r.topic_id })?;
                if topic.partitions.contains_key(&r.partition_id) {
                    return Err(ApplyError::DuplicatePartition {
                        id: r.topic_id,
                        partition: r.partition_id,
                    });
                }
                topic.partitions.insert(
                    r.partition_id,
                    PartitionRegistration {
                        replicas: r.replicas.clone(),
                        isr: r.isr.clone(),
                        removing_replicas: r.removing_replicas.clone(),
                        adding_replicas: r.adding_replicas.clone(),
                        leader: r.leader,
                        leader_epoch: r.leader_epoch,
                        partition_epoch: r.partition_epoch,
                        eligible_leader_replicas: r.eligible_leader_replicas.clone(),
                        last_known_elr: r.last_known_elr.clone(),
                    },
                );
            }
            Record::PartitionChange(r) => {
                let p = self
                    .topics
                    .get_mut(&r.topic_id)
                    .ok_or(ApplyError::UnknownTopic { id: r.topic_id })?
                    .partitions
                    .get_mut(&r.partition_id)
                    .ok_or(ApplyError::UnknownPartition {
                        id: r.topic_id,
                        partition: r.partition_id,
                    })?;
                if let Some(v) = &r.isr {
                    p.isr = v.clone();
                }
                if let Some(v) = &r.replicas {
                    p.replicas = v.clone();
                }
                if let Some(v) = &r.removing_replicas {
                    p.removing_replicas = v.clone();
                }
                if let Some(v) = &r.adding_replicas {
                    p.adding_replicas = v.clone();
                }
                if let Some(v) = &r.eligible_leader_replicas {
                    p.eligible_leader_replicas = v.clone();
                }
                if let Some(v) = &r.last_known_elr {
                    p.last_known_elr = v.clone();
                }
                if let Some(leader) = r.leader {
                    p.leader = leader;
                    p.leader_epoch = LeaderEpoch(p.leader_epoch.0 + 1);
                }
                p.partition_epoch = PartitionEpoch(p.partition_epoch.0 + 1);
            }
            Record::Config(r) => {
                if r.resource_type == ConfigResourceType::Topic
                    && !self.topic_ids.contains_key(&r.resource_name)
                {
                    return Err(ApplyError::ConfigForUnknownTopic {
                        name: r.resource_name.clone(),
                    });
                }
                let key = (r.resource_type, r.resource_name.clone());
                match &r.value {
                    Some(value) => {
                        self.configs
                            .entry(key)
                            .or_default()
                            .insert(r.name.clone(), value.clone());
                    }
                    None => {
                        if let Some(map) = self.configs.get_mut(&key) {
                            map.remove(&r.name);
                            if map.is_empty() {
                                self.configs.remove(&key);
                            }
                        }
                    }
                }
            }
            Record::ProducerIds(r) => {
                let previous = self.next_producer_id();
                if r.next_producer_id <= previous {
                    return Err(ApplyError::ProducerIdWentBack {
                        next: r.next_producer_id,
                        previous,
                    });
                }
                self.producer_ids = Some(r.clone());
            }
            Record::FeatureLevel(r) => {
                // Level 0 means the feature is off, as in Kafka.
                if r.feature_level == 0 {
                    self.features.remove(&r.name);
                } else {
                    self.features.insert(r.name.clone(), r.feature_level);
                }
            }
            Record::UserScramCredential(r) => {
                self.scram.insert((r.name.clone(), r.mechanism), r.clone());
            }
            // The controller removes only what exists; a removal of nothing changes nothing.
            Record::RemoveUserScramCredential(r) => {
                self.scram.remove(&(r.name.clone(), r.mechanism));
            }
            Record::AccessControlEntry(r) => {
                self.acls.insert(r.id, r.acl.clone());
            }
            Record::RemoveAccessControlEntry(r) => {
                self.acls.remove(&r.id);
            }
            Record::ClientQuota(r) => {
                if r.remove {
                    if let Some(keys) = self.quotas.get_mut(&r.entity) {
                        keys.remove(&r.key);
                        if keys.is_empty() {
                            self.quotas.remove(&r.entity);
                        }
                    }
                } else {
                    self.quotas
                        .entry(r.entity.clone())
                        .or_default()
                        .insert(r.key.clone(), r.value);
                }
            }
            Record::NoOp | Record::LeaderChange(_) => {}
        }
        Ok(())
    }

    fn broker_with_epoch(
        &mut self,
        id: BrokerId,
        epoch: BrokerEpoch,
    ) -> Result<&mut BrokerRegistration, ApplyError> {
        let broker = self
            .brokers
            .get_mut(&id)
            .ok_or(ApplyError::UnknownBroker { id })?;
        if broker.epoch != epoch {
            return Err(ApplyError::BrokerEpochMismatch {
                id,
                epoch,
                registered: broker.epoch,
            });
        }
        Ok(broker)
    }

    /// The whole image as records: applying them in order to an empty image at this image's
    /// offset rebuilds an equal image.
    pub fn snapshot_records(&self) -> Vec<Record> {
        let mut records = Vec::new();
        for (name, level) in &self.features {
            records.push(Record::FeatureLevel(FeatureLevelRecord {
                name: name.clone(),
                feature_level: *level,
            }));
        }
        for b in self.brokers.values() {
            records.push(Record::RegisterBroker(RegisterBrokerRecord {
                broker_id: b.id,
                incarnation_id: b.incarnation_id,
                broker_epoch: b.epoch,
                endpoints: b.endpoints.clone(),
                rack: b.rack.clone(),
                fenced: b.fenced,
            }));
        }
        for t in self.topics.values() {
            records.push(Record::Topic(TopicRecord {
                name: t.name.clone(),
                topic_id: t.id,
            }));
            for (&partition_id, p) in &t.partitions {
                records.push(Record::Partition(PartitionRecord {
                    partition_id,
                    topic_id: t.id,
                    replicas: p.replicas.clone(),
                    isr: p.isr.clone(),
                    removing_replicas: p.removing_replicas.clone(),
                    adding_replicas: p.adding_replicas.clone(),
                    leader: p.leader,
                    leader_epoch: p.leader_epoch,
                    partition_epoch: p.partition_epoch,
                    eligible_leader_replicas: p.eligible_leader_replicas.clone(),
                    last_known_elr: p.last_known_elr.clone(),
                }));
            }
        }
        for ((resource_type, resource_name), map) in &self.configs {
            for (name, value) in map {
                records.push(Record::Config(ConfigRecord {
                    resource_type: *resource_type,
                    resource_name: resource_name.clone(),
                    name: name.clone(),
                    value: Some(value.clone()),
                }));
            }
        }
        if let Some(p) = &self.producer_ids {
            records.push(Record::ProducerIds(p.clone()));
        }
        records.extend(
            self.scram
                .values()
                .cloned()
                .map(Record::UserScramCredential),
        );
        records.extend(self.acls.iter().map(|(id, acl)| {
            Record::AccessControlEntry(AccessControlEntryRecord {
                id: *id,
                acl: acl.clone(),
            })
        }));
        for (entity, keys) in &self.quotas {
            for (key, value) in keys {
                records.push(Record::ClientQuota(ClientQuotaRecord {
                    entity: entity.clone(),
                    key: key.clone(),
                    value: *value,
                    remove: false,
                }));
            }
        }
        records
    }

    /// Rebuilds an image from a snapshot's records.
    pub fn from_snapshot(offset: Offset, records: &[Record]) -> Result<MetadataImage, ApplyError> {
        let mut image = MetadataImage::default();
        for record in records {
            image.apply(offset, record)?;
        }
        image.offset = offset;
        Ok(image)
    }

    /// Checks the relations every committed image must keep, for tests and the simulator:
    /// the ISR is within the replicas, a leader is in the ISR and is a registered, unfenced
    /// broker, and the name index matches the topics.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.topic_ids.len() != self.topics.len() {
            return Err(format!(
                "{} topic names for {} topics",
                self.topic_ids.len(),
                self.topics.len()
            ));
        }
        for t in self.topics.values() {
            if self.topic_ids.get(&t.name) != Some(&t.id) {
                return Err(format!("topic {} is not indexed by its name", t.name));
            }
            for (partition, p) in &t.partitions {
                let at = || format!("{}-{partition}", t.name);
                let mut distinct = p.replicas.clone();
                distinct.sort();
                distinct.dedup();
                if distinct.len() != p.replicas.len() {
                    return Err(format!("{}: repeated replica in {:?}", at(), p.replicas));
                }
                if let Some(b) = p
                    .adding_replicas
                    .iter()
                    .chain(&p.removing_replicas)
                    .find(|b| !p.replicas.contains(b))
                {
                    return Err(format!("{}: moving replica {b} is not a replica", at()));
                }
                if let Some(b) = p.isr.iter().find(|b| !p.replicas.contains(b)) {
                    return Err(format!("{}: ISR member {b} is not a replica", at()));
                }
                if p.leader != BrokerId::NONE {
                    if !p.isr.contains(&p.leader) {
                        return Err(format!(
                            "{}: leader {} is not in the ISR {:?}",
                            at(),
                            p.leader,
                            p.isr
                        ));
                    }
                    if !self.is_unfenced(p.leader) {
                        return Err(format!(
                            "{}: leader {} is fenced or not registered",
                            at(),
                            p.leader
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic_id(n: u128) -> TopicId {
        TopicId(uuid::Uuid::from_u128(n))
    }

    fn register(id: i32, epoch: i64, fenced: bool) -> Record {
        Record::RegisterBroker(RegisterBrokerRecord {
            broker_id: BrokerId(id),
            incarnation_id: uuid::Uuid::from_u128(id as u128),
            broker_epoch: BrokerEpoch(epoch),
            endpoints: vec![Endpoint {
                name: "PLAINTEXT".into(),
                host: "127.0.0.1".into(),
                port: 9092 + id as u16,
                security_protocol: 0,
            }],
            rack: Some(format!("rack-{}", id % 2)),
            fenced,
        })
    }

    fn partition(t: TopicId, p: i32, replicas: &[i32]) -> Record {
        let replicas: Vec<BrokerId> = replicas.iter().copied().map(BrokerId).collect();
        Record::Partition(PartitionRecord {
            partition_id: p,
            topic_id: t,
            isr: replicas.clone(),
            leader: replicas[0],
            replicas,
            removing_replicas: vec![],
            adding_replicas: vec![],
            leader_epoch: LeaderEpoch(0),
            partition_epoch: PartitionEpoch(0),
            eligible_leader_replicas: vec![],
            last_known_elr: vec![],
        })
    }

    fn sample() -> MetadataImage {
        let t = topic_id(7);
        let log = vec![
            register(1, 1, true),
            register(2, 2, true),
            Record::UnfenceBroker(BrokerFencingRecord {
                id: BrokerId(1),
                epoch: BrokerEpoch(1),
            }),
            Record::UnfenceBroker(BrokerFencingRecord {
                id: BrokerId(2),
                epoch: BrokerEpoch(2),
            }),
            Record::Topic(TopicRecord {
                name: "orders".into(),
                topic_id: t,
            }),
            Record::Config(ConfigRecord {
                resource_type: ConfigResourceType::Topic,
                resource_name: "orders".into(),
                name: "retention.ms".into(),
                value: Some("1000".into()),
            }),
            partition(t, 0, &[1, 2]),
            partition(t, 1, &[2, 1]),
            Record::PartitionChange(PartitionChangeRecord {
                partition_id: 0,
                topic_id: t,
                isr: Some(vec![BrokerId(2)]),
                leader: Some(BrokerId(2)),
                ..Default::default()
            }),
            Record::Config(ConfigRecord {
                resource_type: ConfigResourceType::Broker,
                resource_name: String::new(),
                name: "log.retention.ms".into(),
                value: Some("5".into()),
            }),
            Record::ProducerIds(ProducerIdsRecord {
                broker_id: BrokerId(1),
                broker_epoch: BrokerEpoch(1),
                next_producer_id: 1000,
            }),
            Record::FeatureLevel(FeatureLevelRecord {
                name: "metadata.version".into(),
                feature_level: 1,
            }),
        ];
        let mut image = MetadataImage::default();
        for (i, r) in log.iter().enumerate() {
            image.apply(Offset(i as i64 + 1), r).unwrap();
        }
        image
    }

    #[test]
    fn lookups_by_name_and_id_agree() {
        let image = sample();
        let t = image.topic("orders").unwrap();
        assert_eq!(image.topic_by_id(t.id).unwrap().name, "orders");
        let p0 = image.partition(t.id, 0).unwrap();
        assert_eq!(p0.leader, BrokerId(2));
        assert_eq!(p0.leader_epoch, LeaderEpoch(1));
        assert_eq!(p0.partition_epoch, PartitionEpoch(1));
        assert_eq!(
            image.topic_configs("orders").unwrap()["retention.ms"],
            "1000"
        );
        assert_eq!(image.next_producer_id(), 1000);
        assert_eq!(image.unfenced_brokers().count(), 2);
        assert_eq!(image.offset(), Offset(12));
        image.check_invariants().unwrap();
    }

    #[test]
    fn snapshot_rebuilds_an_equal_image() {
        let image = sample();
        let records = image.snapshot_records();
        let bytes = encode_batch(&records);
        let decoded = decode_batch(&bytes).unwrap();
        let rebuilt = MetadataImage::from_snapshot(image.offset(), &decoded).unwrap();
        assert_eq!(rebuilt, image);
    }

    #[test]
    fn removing_a_topic_drops_its_name_and_configs() {
        let mut image = sample();
        let id = image.topic("orders").unwrap().id;
        image
            .apply(
                Offset(20),
                &Record::RemoveTopic(RemoveTopicRecord { topic_id: id }),
            )
            .unwrap();
        assert!(image.topic("orders").is_none());
        assert!(image.topic_configs("orders").is_none());
        // The name can be reused by a new topic with a new id.
        image
            .apply(
                Offset(21),
                &Record::Topic(TopicRecord {
                    name: "orders".into(),
                    topic_id: topic_id(8),
                }),
            )
            .unwrap();
    }

    #[test]
    fn contradicting_records_are_refused() {
        let mut image = sample();
        let at = Offset(30);
        assert!(matches!(
            image.apply(at, &register(1, 1, false)),
            Err(ApplyError::BrokerEpochWentBack { .. })
        ));
        assert!(matches!(
            image.apply(
                at,
                &Record::FenceBroker(BrokerFencingRecord {
                    id: BrokerId(2),
                    epoch: BrokerEpoch(9)
                })
            ),
            Err(ApplyError::BrokerEpochMismatch { .. })
        ));
        assert!(matches!(
            image.apply(at, &partition(topic_id(99), 0, &[1])),
            Err(ApplyError::UnknownTopic { .. })
        ));
        assert!(matches!(
            image.apply(Offset(1), &Record::NoOp),
            Err(ApplyError::OffsetWentBack { .. })
        ));
    }

    #[test]
    fn a_fenced_leader_breaks_the_invariants() {
        let mut image = sample();
        image
            .apply(
                Offset(40),
                &Record::FenceBroker(BrokerFencingRecord {
                    id: BrokerId(2),
                    epoch: BrokerEpoch(2),
                }),
            )
            .unwrap();
        assert!(image.check_invariants().is_err());
    }
}
