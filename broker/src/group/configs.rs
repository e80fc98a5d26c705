//! A group's own configs (Kafka's `GroupConfig`, `kafka-configs --entity-type groups`): set with
//! IncrementalAlterConfigs on a GROUP resource, kept in the metadata log like a topic's, and read
//! by the coordinators and share partitions, each falling back to the broker's `group.*` setting.
//!
//! The controller checks names and value shapes here ([`validate`]); bounds that depend on the
//! broker (a lock duration between `group.share.min/max.record.lock.duration.ms`) are applied
//! where the value is used, by clamping, so a group config never stops a group from working.

use std::collections::BTreeMap;

use crate::config::BrokerConfig;

/// How a group config's value is checked.
#[derive(Clone, Copy)]
enum Kind {
    /// An integer of at least this.
    Int(i64),
    Bool,
    /// One of these words.
    OneOf(&'static [&'static str]),
    /// `latest`, `earliest` or `by_duration:<ISO-8601 duration>`.
    OffsetReset,
    /// Free text or a list.
    Text,
}

/// Every group config Kafka 4.4 knows, with its check.
const GROUP_CONFIGS: &[(&str, Kind)] = &[
    ("consumer.session.timeout.ms", Kind::Int(1)),
    ("consumer.heartbeat.interval.ms", Kind::Int(1)),
    ("consumer.assignment.interval.ms", Kind::Int(0)),
    ("consumer.assignor.offload.enable", Kind::Bool),
    ("share.session.timeout.ms", Kind::Int(1)),
    ("share.heartbeat.interval.ms", Kind::Int(1)),
    ("share.record.lock.duration.ms", Kind::Int(1)),
    ("share.delivery.count.limit", Kind::Int(2)),
    ("share.partition.max.record.locks", Kind::Int(100)),
    ("share.auto.offset.reset", Kind::OffsetReset),
    (
        "share.isolation.level",
        Kind::OneOf(&["read_committed", "read_uncommitted"]),
    ),
    ("share.renew.acknowledge.enable", Kind::Bool),
    ("share.assignment.interval.ms", Kind::Int(0)),
    ("share.assignor.offload.enable", Kind::Bool),
    ("streams.session.timeout.ms", Kind::Int(1)),
    ("streams.heartbeat.interval.ms", Kind::Int(1)),
    ("streams.num.standby.replicas", Kind::Int(0)),
    ("streams.initial.rebalance.delay.ms", Kind::Int(0)),
    ("streams.assignment.interval.ms", Kind::Int(0)),
    ("streams.rack.aware.assignment.tags", Kind::Text),
    ("streams.assignor.offload.enable", Kind::Bool),
    ("streams.task.offset.interval.ms", Kind::Int(0)),
    ("streams.num.warmup.replicas", Kind::Int(0)),
    ("streams.acceptable.recovery.lag", Kind::Int(0)),
    ("streams.assignor.name", Kind::Text),
    ("errors.deadletterqueue.topic.name", Kind::Text),
    ("errors.deadletterqueue.copy.record.enable", Kind::Bool),
];

/// The controller's check of a group's configs: every name known, every value of its shape.
pub fn validate(configs: &BTreeMap<String, String>) -> Result<(), String> {
    for (name, value) in configs {
        let Some((_, kind)) = GROUP_CONFIGS.iter().find(|(n, _)| n == name) else {
            return Err(format!("Unknown group config name: {name}"));
        };
        let invalid = || format!("Invalid value {value} for configuration {name}");
        match kind {
            Kind::Int(min) => {
                let n: i64 = value.trim().parse().map_err(|_| invalid())?;
                if n < *min || n > i64::from(i32::MAX) {
                    return Err(format!(
                        "Invalid value {value} for configuration {name}: Value must be at least {min}"
                    ));
                }
            }
            Kind::Bool => {
                if !matches!(value.trim().to_ascii_lowercase().as_str(), "true" | "false") {
                    return Err(invalid());
                }
            }
            Kind::OneOf(words) => {
                if !words.contains(&value.trim()) {
                    return Err(invalid());
                }
            }
            Kind::OffsetReset => {
                OffsetReset::parse(value).ok_or_else(invalid)?;
            }
            Kind::Text => {}
        }
    }
    Ok(())
}

/// `share.auto.offset.reset`: where a share partition starts when its group first reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffsetReset {
    Latest,
    Earliest,
    /// The first record with a timestamp at or after now minus this many ms.
    ByDuration(i64),
}

impl OffsetReset {
    pub fn parse(value: &str) -> Option<OffsetReset> {
        let value = value.trim();
        match value.to_ascii_lowercase().as_str() {
            "latest" => Some(OffsetReset::Latest),
            "earliest" => Some(OffsetReset::Earliest),
            _ => {
                let duration = value.strip_prefix("by_duration:")?;
                iso8601_duration_ms(duration).map(OffsetReset::ByDuration)
            }
        }
    }
}

/// An ISO-8601 duration as Java's `Duration.parse` reads it (`PnDTnHnMn.nS`), in ms; not
/// negative.
fn iso8601_duration_ms(text: &str) -> Option<i64> {
    let rest = text.strip_prefix('P').or_else(|| text.strip_prefix('p'))?;
    let (days, time) = match rest.find(['T', 't']) {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let mut ms = 0f64;
    if !days.is_empty() {
        let n: f64 = days.strip_suffix(['D', 'd'])?.parse().ok()?;
        ms += n * 86_400_000.0;
    }
    if let Some(mut time) = time {
        if time.is_empty() {
            return None;
        }
        for (unit, scale) in [('H', 3_600_000.0), ('M', 60_000.0), ('S', 1_000.0)] {
            if let Some(i) = time.find([unit, unit.to_ascii_lowercase()]) {
                let n: f64 = time[..i].parse().ok()?;
                ms += n * scale;
                time = &time[i + 1..];
            }
        }
        if !time.is_empty() {
            return None;
        }
    } else if days.is_empty() {
        return None;
    }
    (ms >= 0.0 && ms.is_finite()).then_some(ms as i64)
}

/// What a share group runs with: its own configs over the broker's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareGroupConfig {
    pub session_timeout_ms: u64,
    pub heartbeat_interval_ms: u64,
    pub record_lock_duration_ms: u64,
    pub delivery_count_limit: u16,
    pub partition_max_record_locks: u32,
    pub auto_offset_reset: OffsetReset,
    pub read_committed: bool,
}

impl ShareGroupConfig {
    /// The configs of a group whose own configs are `own` (none set: the broker's).
    pub fn resolve(broker: &BrokerConfig, own: Option<&BTreeMap<String, String>>) -> Self {
        let get = |name: &str| own.and_then(|c| c.get(name)).map(|v| v.trim());
        let int = |name: &str, default: u64| {
            get(name)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(default)
        };
        ShareGroupConfig {
            session_timeout_ms: int(
                "share.session.timeout.ms",
                broker.group_share_session_timeout_ms,
            ),
            heartbeat_interval_ms: int(
                "share.heartbeat.interval.ms",
                broker.group_share_heartbeat_interval_ms,
            ),
            record_lock_duration_ms: int(
                "share.record.lock.duration.ms",
                broker.group_share_record_lock_duration_ms,
            )
            .clamp(
                broker.group_share_min_record_lock_duration_ms,
                broker.group_share_max_record_lock_duration_ms,
            ),
            delivery_count_limit: int(
                "share.delivery.count.limit",
                broker.group_share_delivery_count_limit,
            )
            .clamp(2, u64::from(u16::MAX)) as u16,
            partition_max_record_locks: int(
                "share.partition.max.record.locks",
                broker.group_share_partition_max_record_locks,
            )
            .clamp(1, u64::from(u32::MAX)) as u32,
            auto_offset_reset: get("share.auto.offset.reset")
                .and_then(OffsetReset::parse)
                .unwrap_or(OffsetReset::Latest),
            read_committed: get("share.isolation.level") == Some("read_committed"),
        }
    }
}

/// What a streams group runs with: its own configs over the broker's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamsGroupConfig {
    pub session_timeout_ms: u64,
    pub heartbeat_interval_ms: u64,
    pub num_standby_replicas: usize,
}

impl StreamsGroupConfig {
    pub fn resolve(broker: &BrokerConfig, own: Option<&BTreeMap<String, String>>) -> Self {
        let int = |name: &str, default: u64| {
            own.and_then(|c| c.get(name))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(default)
        };
        StreamsGroupConfig {
            session_timeout_ms: int(
                "streams.session.timeout.ms",
                broker.group_streams_session_timeout_ms,
            ),
            heartbeat_interval_ms: int(
                "streams.heartbeat.interval.ms",
                broker.group_streams_heartbeat_interval_ms,
            ),
            // Kafka's group.streams.max.standby.replicas (2) bounds it.
            num_standby_replicas: int(
                "streams.num.standby.replicas",
                broker.group_streams_num_standby_replicas,
            )
            .min(2) as usize,
        }
    }
}

/// The group configs DescribeConfigs shows for a group: each name with the group's value or
/// the default it runs with, and whether the group set it.
pub fn described(
    broker: &BrokerConfig,
    own: Option<&BTreeMap<String, String>>,
) -> Vec<(&'static str, String, bool)> {
    let default = |name: &str| -> String {
        match name {
            "consumer.session.timeout.ms" => broker.group_consumer_session_timeout_ms.to_string(),
            "consumer.heartbeat.interval.ms" => {
                broker.group_consumer_heartbeat_interval_ms.to_string()
            }
            "share.session.timeout.ms" => broker.group_share_session_timeout_ms.to_string(),
            "share.heartbeat.interval.ms" => broker.group_share_heartbeat_interval_ms.to_string(),
            "share.record.lock.duration.ms" => {
                broker.group_share_record_lock_duration_ms.to_string()
            }
            "share.delivery.count.limit" => broker.group_share_delivery_count_limit.to_string(),
            "share.partition.max.record.locks" => {
                broker.group_share_partition_max_record_locks.to_string()
            }
            "share.auto.offset.reset" => "latest".into(),
            "share.isolation.level" => "read_uncommitted".into(),
            "share.renew.acknowledge.enable" => "true".into(),
            "streams.session.timeout.ms" => broker.group_streams_session_timeout_ms.to_string(),
            "streams.heartbeat.interval.ms" => {
                broker.group_streams_heartbeat_interval_ms.to_string()
            }
            "streams.num.standby.replicas" => broker.group_streams_num_standby_replicas.to_string(),
            "streams.initial.rebalance.delay.ms" => "3000".into(),
            "streams.num.warmup.replicas" => "2".into(),
            "streams.acceptable.recovery.lag" => "10000".into(),
            "consumer.assignor.offload.enable"
            | "share.assignor.offload.enable"
            | "streams.assignor.offload.enable"
            | "errors.deadletterqueue.copy.record.enable" => "false".into(),
            "consumer.assignment.interval.ms"
            | "share.assignment.interval.ms"
            | "streams.assignment.interval.ms" => "1000".into(),
            "streams.task.offset.interval.ms" => "60000".into(),
            _ => String::new(),
        }
    };
    GROUP_CONFIGS
        .iter()
        .map(|(name, _)| match own.and_then(|c| c.get(*name)) {
            Some(v) => (*name, v.clone(), true),
            None => (*name, default(name), false),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn unknown_names_and_bad_values_are_refused() {
        assert!(validate(&map(&[("share.auto.offset.reset", "earliest")])).is_ok());
        assert!(validate(&map(&[("share.auto.offset.reset", "by_duration:PT1H")])).is_ok());
        assert!(validate(&map(&[("share.auto.offset.reset", "oldest")])).is_err());
        assert!(validate(&map(&[("share.isolation.level", "read_committed")])).is_ok());
        assert!(validate(&map(&[("share.isolation.level", "committed")])).is_err());
        assert!(validate(&map(&[("share.delivery.count.limit", "1")])).is_err());
        assert!(validate(&map(&[("share.record.lock.duration.ms", "x")])).is_err());
        assert_eq!(
            validate(&map(&[("no.such.config", "1")])),
            Err("Unknown group config name: no.such.config".to_string())
        );
    }

    #[test]
    fn durations_read_as_java_reads_them() {
        assert_eq!(iso8601_duration_ms("PT1H"), Some(3_600_000));
        assert_eq!(iso8601_duration_ms("P1D"), Some(86_400_000));
        assert_eq!(iso8601_duration_ms("P1DT2H3M4.5S"), Some(93_784_500));
        assert_eq!(iso8601_duration_ms("PT"), None);
        assert_eq!(iso8601_duration_ms("P"), None);
        assert_eq!(iso8601_duration_ms("PT-1S"), None);
        assert_eq!(iso8601_duration_ms("1H"), None);
    }

    #[test]
    fn a_group_config_overrides_the_broker_and_is_kept_within_its_bounds() {
        let broker = BrokerConfig {
            group_share_record_lock_duration_ms: 30_000,
            group_share_min_record_lock_duration_ms: 15_000,
            group_share_max_record_lock_duration_ms: 60_000,
            group_share_delivery_count_limit: 5,
            ..BrokerConfig::default()
        };
        let none = ShareGroupConfig::resolve(&broker, None);
        assert_eq!(none.record_lock_duration_ms, 30_000);
        assert_eq!(none.delivery_count_limit, 5);
        assert_eq!(none.auto_offset_reset, OffsetReset::Latest);
        assert!(!none.read_committed);
        let own = map(&[
            ("share.record.lock.duration.ms", "1000"),
            ("share.delivery.count.limit", "3"),
            ("share.auto.offset.reset", "earliest"),
            ("share.isolation.level", "read_committed"),
        ]);
        let set = ShareGroupConfig::resolve(&broker, Some(&own));
        assert_eq!(set.record_lock_duration_ms, 15_000);
        assert_eq!(set.delivery_count_limit, 3);
        assert_eq!(set.auto_offset_reset, OffsetReset::Earliest);
        assert!(set.read_committed);
    }
}
