//! Every topic config, declared once: Kafka's facts (type, default) come from the generated
//! catalog (`config_catalog::TOPIC_CONFIGS`, read from a reference Kafka 4.4); what Sluice does
//! with each (honours it, accepts it because ignoring it loses nothing, or takes only Kafka's
//! default), its broker synonym and Sluice's own documentation are here. DescribeConfigs,
//! validation (CreateTopics, AlterConfigs, IncrementalAlterConfigs), the defaults APPEND and
//! SUBTRACT start from, and the dynamic broker defaults a topic runs with all derive from this
//! table.

use crate::config_catalog::{TopicConfigDef, TOPIC_CONFIGS};

/// What Sluice does with a topic config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// The log, the replication or the controller acts on it.
    Honoured,
    /// Accepted, validated and described, and ignored: ignoring it loses no record and weakens
    /// no guarantee a client can observe (README lists them).
    Ignored,
    /// Only Kafka's default is accepted: any other value asks for something Sluice does not do
    /// yet, and ignoring it would lose records or a promise (refused with INVALID_CONFIG).
    DefaultOnly,
}

/// One topic config as Sluice takes it.
pub struct TopicSetting {
    pub name: &'static str,
    pub support: Support,
    /// The broker config whose dynamic value (per broker or cluster-wide) a topic without its
    /// own value runs with, and DescribeConfigs lists as its synonym.
    pub broker_synonym: Option<&'static str>,
    /// Sluice's default where it differs from Kafka's, or for Sluice's own settings; `None`
    /// takes Kafka's from the catalog.
    pub default: Option<&'static str>,
    pub doc: &'static str,
}

const fn honoured(
    name: &'static str,
    broker_synonym: Option<&'static str>,
    doc: &'static str,
) -> TopicSetting {
    TopicSetting {
        name,
        support: Support::Honoured,
        broker_synonym,
        default: None,
        doc,
    }
}

const fn ignored(name: &'static str, doc: &'static str) -> TopicSetting {
    TopicSetting {
        name,
        support: Support::Ignored,
        broker_synonym: None,
        default: None,
        doc,
    }
}

const fn default_only(name: &'static str, doc: &'static str) -> TopicSetting {
    TopicSetting {
        name,
        support: Support::DefaultOnly,
        broker_synonym: None,
        default: None,
        doc,
    }
}

/// Every topic config Kafka 4.4 has (checked against the catalog by a test), then Sluice's own.
pub const TOPIC_SETTINGS: &[TopicSetting] = &[
    honoured("cleanup.policy", Some("log.cleanup.policy"), "delete (retention removes old segments), compact (the latest value per key is kept), or both."),
    ignored("compression.gzip.level", "The gzip level when the broker recompresses; Sluice uses its codec's default level (accepted, not used)."),
    ignored("compression.lz4.level", "The lz4 level when the broker recompresses; Sluice uses its codec's default level (accepted, not used)."),
    honoured("compression.type", Some("compression.type"), "The codec batches are stored with: producer (as sent), uncompressed, gzip, snappy, lz4 or zstd."),
    ignored("compression.zstd.level", "The zstd level when the broker recompresses; Sluice uses its codec's default level (accepted, not used)."),
    honoured("delete.retention.ms", Some("log.cleaner.delete.retention.ms"), "How long compaction keeps tombstones (null values) readable."),
    default_only("errors.deadletterqueue.group.enable", "Whether groups may write a dead-letter queue to this topic; Sluice has no dead-letter queues yet, so only false is accepted."),
    ignored("file.delete.delay.ms", "How long a deleted segment's files stay before removal; Sluice removes them once no read uses them (accepted, not used)."),
    ignored("flush.messages", "Kafka's fsync every N messages; Sluice's flush.mode decides instead (batch, the default, fdatasyncs every produce before it is acknowledged) (accepted, not used)."),
    TopicSetting {
        name: "flush.ms",
        support: Support::Honoured,
        broker_synonym: Some("log.flush.interval.ms"),
        default: Some("1000"),
        doc: "Under flush.mode=interval, how often written data is fdatasync'd.",
    },
    honoured("follower.replication.throttled.replicas", None, "Replicas (partition:broker, or *) whose fetching as followers counts against follower.replication.throttled.rate."),
    honoured("index.interval.bytes", Some("log.index.interval.bytes"), "Bytes between two entries of the sparse offset and time indexes."),
    honoured("leader.replication.throttled.replicas", None, "Replicas (partition:broker, or *) named for the leader-side throttle; accepted, the follower side enforces the throttle."),
    ignored("local.retention.bytes", "Tiered storage: the bytes kept on local disk; Sluice has no tiered storage yet, so everything stays local under retention.bytes (accepted, not used)."),
    ignored("local.retention.ms", "Tiered storage: how long records stay on local disk; Sluice has no tiered storage yet, so everything stays local under retention.ms (accepted, not used)."),
    ignored("max.compaction.lag.ms", "The longest a record may stay uncompacted; Sluice compacts when its cleaner finds dirty segments, without this bound (accepted, not used)."),
    ignored("max.decompressed.message.bytes", "The most bytes a compressed batch may decompress to when the broker decompresses it (accepted, not used)."),
    honoured("max.message.bytes", Some("message.max.bytes"), "The largest record batch a produce may append."),
    ignored("message.timestamp.after.max.ms", "How far in the future a CreateTime timestamp may be; Sluice accepts every timestamp (accepted, not used)."),
    ignored("message.timestamp.before.max.ms", "How far in the past a CreateTime timestamp may be; Sluice accepts every timestamp (accepted, not used)."),
    honoured("message.timestamp.type", Some("log.message.timestamp.type"), "CreateTime (the producer's timestamps) or LogAppendTime (the broker's clock)."),
    ignored("min.cleanable.dirty.ratio", "The share of a log that must be uncompacted before compaction runs; Sluice's cleaner decides by dirty segments (accepted, not used)."),
    default_only("min.compaction.lag.ms", "The least time a record stays uncompacted; Sluice's compaction does not hold records back yet, so only 0 is accepted."),
    honoured("min.insync.replicas", Some("min.insync.replicas"), "The in-sync replicas an acks=all produce needs; fewer refuse it with NOT_ENOUGH_REPLICAS."),
    ignored("preallocate", "Whether segment files are preallocated; Sluice always preallocates ahead of its O_DIRECT writes (accepted, not used)."),
    ignored("remote.copy.lag.bytes", "Tiered storage: bytes a segment waits before its copy; Sluice has no tiered storage yet (accepted, not used)."),
    ignored("remote.copy.lag.ms", "Tiered storage: time a segment waits before its copy; Sluice has no tiered storage yet (accepted, not used)."),
    ignored("remote.log.copy.disable", "Tiered storage: stop copying segments; Sluice has no tiered storage yet (accepted, not used)."),
    ignored("remote.log.delete.on.disable", "Tiered storage: delete remote segments when tiering is turned off; Sluice has no tiered storage yet (accepted, not used)."),
    default_only("remote.storage.enable", "Tiered storage for this topic; Sluice has no tiered storage yet, so only false is accepted."),
    honoured("retention.bytes", Some("log.retention.bytes"), "The most bytes a partition keeps before its oldest segments go; -1 for no limit."),
    honoured("retention.ms", Some("log.retention.ms"), "How long records are kept, measured from a segment's largest record timestamp (or its last write, without timestamps); -1 for ever."),
    honoured("segment.bytes", Some("log.segment.bytes"), "The size at which a segment is closed and a new one started."),
    ignored("segment.index.bytes", "The largest offset index file of a segment; Sluice's sparse indexes grow with their segment (accepted, not used)."),
    ignored("segment.jitter.ms", "A random delay subtracted from segment.ms per segment; Sluice rolls at segment.ms (accepted, not used)."),
    honoured("segment.ms", Some("log.roll.ms"), "The age at which a segment is closed and a new one started."),
    honoured("unclean.leader.election.enable", Some("unclean.leader.election.enable"), "Whether an out-of-sync replica may lead when no in-sync one can (it may lose acknowledged records)."),
    TopicSetting {
        name: "flush.mode",
        support: Support::Honoured,
        broker_synonym: None,
        default: Some("batch"),
        doc: "Sluice: batch (fdatasync before a produce is acknowledged, group-committed), interval (every flush.ms) or none.",
    },
];

/// DescribeConfigs `config_type` of a string, for Sluice's own settings.
const TYPE_STRING: i8 = 2;

/// A topic config by name.
pub fn setting(name: &str) -> Option<&'static TopicSetting> {
    TOPIC_SETTINGS.iter().find(|s| s.name == name)
}

/// Kafka's definition of a topic config (`None` for Sluice's own).
pub fn kafka_def(name: &str) -> Option<&'static TopicConfigDef> {
    TOPIC_CONFIGS.iter().find(|d| d.name == name)
}

impl TopicSetting {
    /// The value a topic without its own (and without a dynamic broker default) runs with.
    pub fn default_value(&self) -> &'static str {
        self.default
            .or_else(|| kafka_def(self.name).and_then(|d| d.default))
            .unwrap_or("")
    }

    /// DescribeConfigs `config_type`.
    pub fn config_type(&self) -> i8 {
        kafka_def(self.name).map_or(TYPE_STRING, |d| d.config_type)
    }
}

/// (topic config, broker config) pairs: the dynamic broker defaults a topic runs with.
pub fn broker_synonyms() -> impl Iterator<Item = (&'static str, &'static str)> {
    TOPIC_SETTINGS
        .iter()
        .filter(|s| s.support == Support::Honoured)
        .filter_map(|s| s.broker_synonym.map(|b| (s.name, b)))
}

/// Checks a value against Kafka's type for the config, and for the configs Sluice does not
/// honour, against Kafka's range (honoured ones are checked by the log's own parser too).
pub fn check_value(setting: &TopicSetting, value: &str) -> Result<(), String> {
    let name = setting.name;
    let kind = setting.config_type();
    let typed = match kind {
        1 => value == "true" || value == "false",
        3 => value.trim().parse::<i32>().is_ok(),
        4 => value.trim().parse::<i16>().is_ok(),
        5 => value.trim().parse::<i64>().is_ok(),
        6 => value.trim().parse::<f64>().is_ok_and(f64::is_finite),
        _ => true,
    };
    if !typed {
        let what = match kind {
            1 => "true or false",
            3 => "a 32-bit integer",
            4 => "a 16-bit integer",
            5 => "a 64-bit integer",
            _ => "a number",
        };
        return Err(format!("{name}={value:?}: expected {what}"));
    }
    let int = || value.trim().parse::<i64>().unwrap_or(0);
    let at_least = |min: i64| {
        if int() < min {
            Err(format!("{name}={value} must be at least {min}"))
        } else {
            Ok(())
        }
    };
    match name {
        "file.delete.delay.ms"
        | "flush.messages"
        | "message.timestamp.after.max.ms"
        | "message.timestamp.before.max.ms"
        | "min.compaction.lag.ms"
        | "max.decompressed.message.bytes" => at_least(0)?,
        "max.compaction.lag.ms" => at_least(1)?,
        "segment.index.bytes" => at_least(4)?,
        "local.retention.bytes" | "local.retention.ms" => at_least(-2)?,
        "remote.copy.lag.bytes" => at_least(-1)?,
        "remote.copy.lag.ms" | "segment.jitter.ms" => at_least(0)?,
        "compression.gzip.level" if !(int() == -1 || (1..=9).contains(&int())) => {
            return Err(format!("{name}={value}: expected -1 or 1 to 9"));
        }
        "compression.lz4.level" if !(1..=17).contains(&int()) => {
            return Err(format!("{name}={value}: expected 1 to 17"));
        }
        "compression.zstd.level" if !(-131072..=22).contains(&int()) => {
            return Err(format!("{name}={value}: expected -131072 to 22"));
        }
        "min.cleanable.dirty.ratio"
            if !(0.0..=1.0).contains(&value.trim().parse::<f64>().unwrap_or(-1.0)) =>
        {
            return Err(format!("{name}={value}: expected 0 to 1"));
        }
        _ => {}
    }
    if setting.support == Support::DefaultOnly {
        let default = setting.default_value();
        let same = match kind {
            1 => value == default,
            _ => value.trim().parse::<i64>().ok() == default.parse::<i64>().ok(),
        };
        if !same {
            return Err(format!(
                "{name}={value} is not supported yet: Sluice takes only {default} ({})",
                setting.doc
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kafka_topic_config_is_declared_once() {
        for def in TOPIC_CONFIGS {
            let n = TOPIC_SETTINGS.iter().filter(|s| s.name == def.name).count();
            assert_eq!(n, 1, "{} is declared {n} times", def.name);
        }
        for s in TOPIC_SETTINGS {
            assert!(
                kafka_def(s.name).is_some() || s.default.is_some(),
                "{}: Sluice's own setting needs a default",
                s.name
            );
            assert!(!s.doc.is_empty(), "{}", s.name);
        }
    }

    #[test]
    fn values_are_checked_by_kafkas_types_and_ranges() {
        let check = |name: &str, value: &str| check_value(setting(name).unwrap(), value);
        assert!(check("file.delete.delay.ms", "60000").is_ok());
        assert!(check("file.delete.delay.ms", "-1").is_err());
        assert!(check("file.delete.delay.ms", "soon").is_err());
        assert!(check("segment.index.bytes", "10485760").is_ok());
        assert!(
            check("segment.index.bytes", "3000000000").is_err(),
            "an int"
        );
        assert!(check("preallocate", "yes").is_err());
        assert!(check("min.cleanable.dirty.ratio", "0.25").is_ok());
        assert!(check("min.cleanable.dirty.ratio", "1.5").is_err());
        assert!(check("compression.gzip.level", "9").is_ok());
        assert!(check("compression.gzip.level", "0").is_err());
        // Only the default where ignoring would lose something.
        assert!(check("min.compaction.lag.ms", "0").is_ok());
        assert!(check("min.compaction.lag.ms", "1000").is_err());
        assert!(check("remote.storage.enable", "false").is_ok());
        assert!(check("remote.storage.enable", "true").is_err());
        assert!(check("errors.deadletterqueue.group.enable", "true").is_err());
    }
}
