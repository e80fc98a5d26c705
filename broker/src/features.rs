//! Feature levels (KIP-584): what this build supports of each of Kafka 4.4's features and the
//! level the cluster runs at, which ApiVersions reports, `kafka-features` shows and UpdateFeatures
//! changes.
//!
//! The finalized levels live in the metadata log as FeatureLevel records once an UpdateFeatures
//! has written them: the first one writes every feature's level, `metadata.version` with them,
//! so an image that has `metadata.version` holds the whole truth (a feature it lacks is at 0).
//! Before that, the levels are this build's defaults and the broker's `transaction.version`
//! setting, as a cluster formatted by `kafka-storage format --feature` starts from its flags.

use crate::config::BrokerConfig;
use crate::metadata::MetadataImage;

/// One of Kafka's features: the levels this build supports, and the one a cluster runs at until
/// UpdateFeatures says otherwise (`None`: the `transaction.version` setting).
pub struct Feature {
    pub name: &'static str,
    pub min_version: i16,
    pub max_version: i16,
    default: Option<i16>,
}

pub const METADATA_VERSION: &str = "metadata.version";
pub const TRANSACTION_VERSION: &str = "transaction.version";
pub const SHARE_VERSION: &str = "share.version";
pub const STREAMS_VERSION: &str = "streams.version";

/// `metadata.version` 4.0-IV3 (`kafka-features version-mapping --release-version 4.0`).
pub const METADATA_VERSION_4_0: i16 = 25;

/// Kafka 4.4's features, with the levels this build implements.
pub const FEATURES: &[Feature] = &[
    // 4.0-IV3, whose API versions this broker implements. Only that level: the metadata log is
    // Sluice's own, not one whose format could run at an older level.
    Feature {
        name: METADATA_VERSION,
        min_version: METADATA_VERSION_4_0,
        max_version: METADATA_VERSION_4_0,
        default: Some(METADATA_VERSION_4_0),
    },
    // A static voter set (`controller.quorum.voters`); KIP-853's dynamic quorum is level 1.
    Feature {
        name: "kraft.version",
        min_version: 0,
        max_version: 0,
        default: Some(0),
    },
    // KIP-966: the controller always keeps eligible leader replicas and elects from them.
    Feature {
        name: "eligible.leader.replicas.version",
        min_version: 1,
        max_version: 1,
        default: Some(1),
    },
    // Level 1 is the KIP-848 consumer group protocol (ConsumerGroupHeartbeat), served beside the
    // classic one.
    Feature {
        name: "group.version",
        min_version: 1,
        max_version: 1,
        default: Some(1),
    },
    // Level 2 is KIP-890 part 2: EndTxn v5 bumps the epoch, Produce v12 and TxnOffsetCommit v5
    // add their partitions to the transaction at the leader. Clients read the finalized level to
    // pick the protocol (the Java client from 4.0).
    Feature {
        name: TRANSACTION_VERSION,
        min_version: 0,
        max_version: 2,
        default: None,
    },
    // Share groups (KIP-932), on by default as in Kafka 4.2+.
    Feature {
        name: SHARE_VERSION,
        min_version: 0,
        max_version: 1,
        default: Some(1),
    },
    // Streams groups (KIP-1071): StreamsGroupHeartbeat and StreamsGroupDescribe, on by default
    // as in Kafka 4.4.
    Feature {
        name: STREAMS_VERSION,
        min_version: 0,
        max_version: 1,
        default: Some(1),
    },
];

pub fn feature(name: &str) -> Option<&'static Feature> {
    FEATURES.iter().find(|f| f.name == name)
}

/// The levels the metadata log finalized, if an UpdateFeatures has written them.
fn logged(image: &MetadataImage) -> Option<&std::collections::BTreeMap<String, i16>> {
    let features = &image.cluster.as_ref()?.features;
    features.contains_key(METADATA_VERSION).then_some(features)
}

/// The level the cluster runs `feature` at.
pub fn level(image: &MetadataImage, config: &BrokerConfig, feature: &Feature) -> i16 {
    match logged(image) {
        Some(levels) => levels.get(feature.name).copied().unwrap_or(0),
        None => feature.default.unwrap_or(config.transaction_version),
    }
}

/// The cluster's `transaction.version`.
pub fn transaction_version(image: &MetadataImage, config: &BrokerConfig) -> i16 {
    level(
        image,
        config,
        feature(TRANSACTION_VERSION).expect("a feature"),
    )
}

/// Every feature with its finalized level.
pub fn finalized(image: &MetadataImage, config: &BrokerConfig) -> Vec<(&'static Feature, i16)> {
    FEATURES
        .iter()
        .map(|f| (f, level(image, config, f)))
        .collect()
}

/// Whether share groups (KIP-932) are on: `share.version` finalized at 1 or more.
pub fn share_groups_enabled(image: &MetadataImage, config: &BrokerConfig) -> bool {
    feature(SHARE_VERSION).is_some_and(|f| level(image, config, f) >= 1)
}

/// Whether streams groups (KIP-1071) are on: `streams.version` finalized at 1 or more.
pub fn streams_groups_enabled(image: &MetadataImage, config: &BrokerConfig) -> bool {
    feature(STREAMS_VERSION).is_some_and(|f| level(image, config, f) >= 1)
}

/// The APIs of share groups, which a cluster with `share.version` 0 does not serve.
pub fn is_share_api(key: kafka_protocol::messages::ApiKey) -> bool {
    use kafka_protocol::messages::ApiKey::*;
    matches!(
        key,
        ShareGroupHeartbeat
            | ShareGroupDescribe
            | ShareFetch
            | ShareAcknowledge
            | DescribeShareGroupOffsets
            | AlterShareGroupOffsets
            | DeleteShareGroupOffsets
            | ReadShareGroupState
            | WriteShareGroupState
            | InitializeShareGroupState
            | DeleteShareGroupState
            | ReadShareGroupStateSummary
    )
}

/// ApiVersions' `finalized_features_epoch`: the metadata offset the levels were read at, which
/// grows with every change (clients keep the levels of the highest epoch they have seen).
pub fn epoch(image: &MetadataImage) -> i64 {
    image.cluster.as_ref().map_or(0, |c| c.offset.max(0))
}

/// Kafka's UpdateFeatures upgrade types (v1+).
pub const UPGRADE: i8 = 1;
pub const SAFE_DOWNGRADE: i8 = 2;
pub const UNSAFE_DOWNGRADE: i8 = 3;

/// Checks one requested level against this build and the level the cluster runs at, with
/// Kafka's rules: known feature, supported level, an upgrade does not lower it and a downgrade
/// does not raise it. `Err` is INVALID_UPDATE_VERSION's message.
pub fn check_update(current: i16, name: &str, level: i16, upgrade_type: i8) -> Result<(), String> {
    let Some(f) = feature(name) else {
        return Err(format!(
            "Invalid update version {level} for feature {name}. The controller does not support \
             the given feature."
        ));
    };
    let level = level.max(0);
    if level != 0 && !(f.min_version..=f.max_version).contains(&level) {
        return Err(format!(
            "Invalid update version {level} for feature {name}. Broker supports versions \
             {}-{}",
            f.min_version, f.max_version
        ));
    }
    if level == 0 && f.min_version > 0 {
        return Err(format!(
            "Invalid update version 0 for feature {name}. Broker supports versions {}-{}",
            f.min_version, f.max_version
        ));
    }
    match upgrade_type {
        UPGRADE if level < current => Err(format!(
            "Invalid update version {level} for feature {name}. Can't downgrade the version of \
             this feature without setting the upgrade type to either safe or unsafe downgrade."
        )),
        SAFE_DOWNGRADE | UNSAFE_DOWNGRADE if level > current => Err(format!(
            "Invalid update version {level} for feature {name}. Can't downgrade to a newer \
             version."
        )),
        UPGRADE | SAFE_DOWNGRADE | UNSAFE_DOWNGRADE => Ok(()),
        other => Err(format!("Invalid upgrade type {other} for feature {name}.")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_follow_kafkas_rules() {
        assert!(check_update(2, TRANSACTION_VERSION, 1, SAFE_DOWNGRADE).is_ok());
        assert!(check_update(0, TRANSACTION_VERSION, 2, UPGRADE).is_ok());
        assert!(check_update(2, TRANSACTION_VERSION, 2, UPGRADE).is_ok());
        assert!(check_update(2, TRANSACTION_VERSION, 0, UNSAFE_DOWNGRADE).is_ok());
        let lower = check_update(2, TRANSACTION_VERSION, 1, UPGRADE).unwrap_err();
        assert!(lower.contains("Can't downgrade"), "{lower}");
        let raise = check_update(1, TRANSACTION_VERSION, 2, SAFE_DOWNGRADE).unwrap_err();
        assert!(raise.contains("newer"), "{raise}");
        let beyond = check_update(2, TRANSACTION_VERSION, 3, UPGRADE).unwrap_err();
        assert!(beyond.contains("supports versions 0-2"), "{beyond}");
        assert!(check_update(0, "share.version", 1, UPGRADE).is_ok());
        assert!(check_update(0, "share.version", 2, UPGRADE).is_err());
        assert!(check_update(1, "group.version", 0, UNSAFE_DOWNGRADE).is_err());
        assert!(check_update(0, "no.such.feature", 1, UPGRADE).is_err());
    }

    #[test]
    fn levels_come_from_the_log_once_it_has_them() {
        let config = BrokerConfig {
            transaction_version: 1,
            ..BrokerConfig::default()
        };
        let mut image = MetadataImage::default();
        assert_eq!(transaction_version(&image, &config), 1);
        let mut view = crate::metadata::view::ClusterView::default();
        // A level written without metadata.version is not the whole truth yet.
        view.features.insert(TRANSACTION_VERSION.into(), 2);
        image.cluster = Some(std::sync::Arc::new(view.clone()));
        assert_eq!(transaction_version(&image, &config), 1);
        view.features
            .insert(METADATA_VERSION.into(), METADATA_VERSION_4_0);
        image.cluster = Some(std::sync::Arc::new(view.clone()));
        assert_eq!(transaction_version(&image, &config), 2);
        // Level 0 is no record at all.
        view.features.remove(TRANSACTION_VERSION);
        image.cluster = Some(std::sync::Arc::new(view));
        assert_eq!(transaction_version(&image, &config), 0);
        let levels = finalized(&image, &config);
        assert_eq!(levels.len(), 7);
        assert!(levels
            .iter()
            .any(|(f, l)| f.name == "group.version" && *l == 0));
    }
}
