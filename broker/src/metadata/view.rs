//! What a broker serves from the cluster's metadata image: the live brokers with their client
//! endpoints, each partition's leader, replicas, ISR and leader epoch, and the controller; and
//! the broker's own per-node image (topics, configs, owner shards of the replicas on this
//! node) built from it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use sluice_replication::image::MetadataImage as ClusterImage;
use sluice_replication::records::{
    ConfigResourceType, QuotaEntity, QuotaValue, UserScramCredentialRecord,
};

use super::{MetadataImage, TopicMeta, NOT_HOSTED};

/// A broker as clients see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerInfo {
    pub id: i32,
    /// The address of its first listener.
    pub host: String,
    pub port: u16,
    /// Every listener it registered: name, host, port.
    pub listeners: Vec<(String, String, u16)>,
    pub rack: Option<String>,
    pub fenced: bool,
    /// The epoch of its latest registration.
    pub epoch: i64,
}

impl BrokerInfo {
    /// Its host and port on the listener `name`, as Kafka answers a client on that listener;
    /// its first listener's when it registered none of that name (a broker registered before
    /// its listeners changed).
    pub fn on(&self, name: &str) -> (&str, u16) {
        self.listeners
            .iter()
            .find(|(n, _, _)| n == name)
            .map_or((self.host.as_str(), self.port), |(_, h, p)| {
                (h.as_str(), *p)
            })
    }

    /// `host:port` on the listener `name`.
    pub fn address_on(&self, name: &str) -> String {
        let (host, port) = self.on(name);
        format!("{host}:{port}")
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionInfo {
    /// -1 when the partition has no leader.
    pub leader: i32,
    pub leader_epoch: i32,
    /// Bumped by every change of the partition's state (AlterPartition's optimistic check).
    pub partition_epoch: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    pub eligible_leader_replicas: Vec<i32>,
}

/// The cluster part of a broker's image.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// The metadata offset it reflects.
    pub offset: i64,
    /// Every registered broker, fenced ones included, by id.
    pub brokers: BTreeMap<i32, BrokerInfo>,
    /// Partitions by topic name, by index.
    pub partitions: HashMap<String, Vec<PartitionInfo>>,
    /// The controller clients are told of (-1 when none): this broker, which forwards admin
    /// requests to the active controller (`ClusterNode::controller_for_clients`).
    pub controller_id: i32,
    /// Finalized feature levels from the metadata log (UpdateFeatures), by name; empty until
    /// the first UpdateFeatures (`crate::features`).
    pub features: BTreeMap<String, i16>,
    /// SCRAM credentials by user name and mechanism id (`crate::security::scram`).
    pub scram: BTreeMap<(String, i8), UserScramCredentialRecord>,
    /// Every ACL of the cluster (`handlers/authz.rs`).
    pub acls: Vec<sluice_replication::acl::AclBinding>,
    /// Client quotas by entity, then key (`crate::quota`).
    pub quotas: BTreeMap<QuotaEntity, BTreeMap<String, QuotaValue>>,
    /// Groups' own configs (`crate::group::configs`), by group id.
    pub group_configs: BTreeMap<String, BTreeMap<String, String>>,
}

impl ClusterView {
    pub fn partition(&self, topic: &str, partition: i32) -> Option<&PartitionInfo> {
        self.partitions
            .get(topic)?
            .get(usize::try_from(partition).ok()?)
    }

    /// Unfenced brokers, by id: the ones Metadata lists.
    pub fn live_brokers(&self) -> impl Iterator<Item = &BrokerInfo> {
        self.brokers.values().filter(|b| !b.fenced)
    }

    pub fn broker(&self, id: i32) -> Option<&BrokerInfo> {
        self.brokers.get(&id)
    }
}

/// The owner shard of a replica on this node: the partitions of a topic go round the shards
/// from a place that depends on the topic id, so that a topic's partitions spread evenly and
/// every topic starts on a different shard. A pure function of ids, hence stable across
/// restarts with the same `--cores`; with another count a partition simply opens on another
/// shard (its directory does not depend on the shard).
pub fn owner_shard(topic_id: uuid::Uuid, partition: i32, shards: usize) -> u16 {
    let start = topic_id.as_u128().to_le_bytes()[..8]
        .iter()
        .fold(0u64, |h, &b| h.wrapping_mul(31).wrapping_add(b as u64));
    ((start.wrapping_add(partition as u64)) % shards.max(1) as u64) as u16
}

/// The broker image for `cluster` as seen by node `node_id` running `shards` shards: every
/// topic, with owner shards for the partitions that have a replica here and [`NOT_HOSTED`]
/// for the others; topic configs; dynamic broker configs.
pub fn broker_image(
    cluster: &ClusterImage,
    node_id: i32,
    shards: usize,
    controller_id: i32,
) -> MetadataImage {
    let mut image = MetadataImage {
        version: cluster.offset().0.max(0) as u64,
        shards,
        next_producer_id: cluster.next_producer_id(),
        ..Default::default()
    };
    let mut view = ClusterView {
        offset: cluster.offset().0,
        controller_id,
        features: cluster.features().clone(),
        scram: cluster
            .scram_credentials()
            .map(|c| ((c.name.clone(), c.mechanism), c.clone()))
            .collect(),
        acls: cluster.acls().values().cloned().collect(),
        quotas: cluster.client_quotas().clone(),
        group_configs: cluster
            .configs_of(ConfigResourceType::Group)
            .map(|(name, c)| (name.to_string(), c.clone()))
            .collect(),
        ..ClusterView::default()
    };
    for b in cluster.brokers() {
        let endpoint = b
            .endpoints
            .iter()
            .find(|e| e.name != "CONTROLLER")
            .or(b.endpoints.first());
        view.brokers.insert(
            b.id.0,
            BrokerInfo {
                id: b.id.0,
                host: endpoint.map_or_else(String::new, |e| e.host.clone()),
                port: endpoint.map_or(0, |e| e.port),
                listeners: b
                    .endpoints
                    .iter()
                    .map(|e| (e.name.clone(), e.host.clone(), e.port))
                    .collect(),
                rack: b.rack.clone(),
                fenced: b.fenced,
                epoch: b.epoch.0,
            },
        );
    }
    for topic in cluster.topics() {
        let mut shards_of = Vec::with_capacity(topic.partitions.len());
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for (&index, p) in &topic.partitions {
            debug_assert_eq!(index as usize, partitions.len(), "partitions are dense");
            let here = p.replicas.iter().any(|r| r.0 == node_id);
            shards_of.push(if here {
                owner_shard(topic.id.0, index, shards)
            } else {
                NOT_HOSTED
            });
            partitions.push(PartitionInfo {
                leader: p.leader.0,
                leader_epoch: p.leader_epoch.0,
                partition_epoch: p.partition_epoch.0,
                replicas: p.replicas.iter().map(|r| r.0).collect(),
                isr: p.isr.iter().map(|r| r.0).collect(),
                eligible_leader_replicas: p.eligible_leader_replicas.iter().map(|r| r.0).collect(),
            });
        }
        image.topics.insert(
            topic.name.clone(),
            TopicMeta {
                name: topic.name.clone(),
                id: topic.id.0,
                shards: shards_of,
                configs: cluster
                    .topic_configs(&topic.name)
                    .cloned()
                    .unwrap_or_default(),
            },
        );
        view.partitions.insert(topic.name.clone(), partitions);
    }
    for id in std::iter::once(String::new()).chain(view.brokers.keys().map(|b| b.to_string())) {
        if let Some(configs) = cluster.configs(ConfigResourceType::Broker, &id) {
            image.broker_configs.insert(id, configs.clone());
        }
    }
    image.cluster = Some(Arc::new(view));
    image
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_shards_spread_a_topic_and_stay_put() {
        let id = uuid::Uuid::new_v4();
        let owners: Vec<u16> = (0..12).map(|p| owner_shard(id, p, 4)).collect();
        for s in 0..4 {
            assert_eq!(owners.iter().filter(|&&o| o == s).count(), 3, "{owners:?}");
        }
        assert_eq!(
            owners,
            (0..12).map(|p| owner_shard(id, p, 4)).collect::<Vec<_>>()
        );
        assert!((0..12).all(|p| owner_shard(id, p, 1) == 0));
    }
}
