//! DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics and brokers, under
//! Kafka's names, types (KIP-569) and defaults.
//!
//! A broker lists every config Kafka 4.x has (`config_catalog.rs`): Sluice's value where Sluice
//! reads the setting, Kafka's default where it only accepts it, then Sluice's own settings.
//! Dynamic broker configs (per broker, or the cluster-wide default under the empty name) are
//! stored in the metadata image, durably, and applied by every shard when the image arrives:
//! the `log.*` topic defaults (their synonyms, `topic_config::TOPIC_SETTINGS`) and the connection
//! limits take effect at once, as in Kafka. Configs Kafka cannot change without a restart are
//! refused.

use std::collections::BTreeMap;
use std::rc::Rc;

use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use kafka_protocol::messages::describe_configs_response::DescribeConfigsSynonym;

use crate::config::settings::BROKER_SETTINGS;
use crate::config::BrokerConfig;
use crate::config_catalog::BROKER_CONFIGS;
use crate::metadata::{MetadataImage, TopicMeta};
use crate::shard::Shard;
use crate::topic_config::TOPIC_SETTINGS;

pub const RESOURCE_TOPIC: i8 = 2;
/// A group's configs (KIP-848).
const RESOURCE_GROUP: i8 = 32;
pub use crate::cluster::broker_configs::RESOURCE_BROKER;
use crate::cluster::broker_configs::{RESTART_ONLY_IN_SLUICE, TYPE_STRING};
// DescribeConfigs `config_source`, Kafka's values.
const SOURCE_TOPIC_CONFIG: i8 = 1;
const SOURCE_DYNAMIC_BROKER_CONFIG: i8 = 2;
const SOURCE_DYNAMIC_DEFAULT_BROKER_CONFIG: i8 = 3;
const SOURCE_STATIC_BROKER_CONFIG: i8 = 4;
const SOURCE_DEFAULT_CONFIG: i8 = 5;
const SOURCE_GROUP_CONFIG: i8 = 8;

/// What Sluice says of a Kafka broker setting it accepts but does not use.
const ACCEPTED_ONLY: &str =
    "A Kafka broker setting that Sluice accepts and reports with Kafka's default; it has no effect in Sluice.";

/// Broker settings Sluice reads (`config/settings.rs`), under Kafka's names and Sluice's own,
/// with their value in this process and what they do here; unset ones are left out.
fn sluice_broker_settings(config: &BrokerConfig) -> Vec<(&'static str, String, &'static str)> {
    BROKER_SETTINGS
        .iter()
        .filter_map(|s| (s.get)(config).map(|v| (s.name, v, s.doc)))
        .collect()
}

/// One config as DescribeConfigs reports it.
struct Described {
    name: String,
    value: Option<String>,
    source: i8,
    read_only: bool,
    sensitive: bool,
    config_type: i8,
    documentation: &'static str,
    /// Most specific first, the entry's own source included.
    synonyms: Vec<(String, Option<String>, i8)>,
}

/// A config's traits besides its value: what DescribeConfigs says of it.
struct Traits {
    read_only: bool,
    sensitive: bool,
    config_type: i8,
    documentation: &'static str,
}

impl Described {
    /// A config whose value and source are those of its most specific synonym (the first).
    fn new(name: String, synonyms: Vec<(String, Option<String>, i8)>, traits: Traits) -> Described {
        let (value, source) = synonyms
            .first()
            .map(|(_, v, s)| (v.clone(), *s))
            .unwrap_or((None, SOURCE_DEFAULT_CONFIG));
        Described {
            name,
            value,
            source,
            read_only: traits.read_only,
            sensitive: traits.sensitive,
            config_type: traits.config_type,
            documentation: traits.documentation,
            synonyms,
        }
    }

    fn result(
        self,
        include_synonyms: bool,
        include_documentation: bool,
        version: i16,
    ) -> DescribeConfigsResourceResult {
        let value = if self.sensitive { None } else { self.value };
        let mut r = DescribeConfigsResourceResult::default()
            .with_name(StrBytes::from_string(self.name))
            .with_value(value.map(StrBytes::from_string))
            .with_read_only(self.read_only)
            .with_config_source(self.source)
            .with_is_sensitive(self.sensitive);
        if include_synonyms {
            r.synonyms = self
                .synonyms
                .into_iter()
                .map(|(name, value, source)| {
                    DescribeConfigsSynonym::default()
                        .with_name(StrBytes::from_string(name))
                        .with_value(if self.sensitive {
                            None
                        } else {
                            value.map(StrBytes::from_string)
                        })
                        .with_source(source)
                })
                .collect();
        }
        if version >= 3 {
            r.config_type = self.config_type;
            if include_documentation {
                r.documentation = Some(StrBytes::from_static_str(self.documentation));
            }
        }
        r
    }
}

/// Every broker config under Kafka's names (with Sluice's value where Sluice reads it, else
/// Kafka's default), then Sluice's own settings.
fn describe_broker(config: &BrokerConfig, image: &MetadataImage) -> Vec<Described> {
    let sluice: BTreeMap<&str, (String, &str)> = sluice_broker_settings(config)
        .into_iter()
        .map(|(k, v, doc)| (k, (v, doc)))
        .collect();
    let mut out = Vec::new();
    for def in BROKER_CONFIGS {
        let ours = sluice.get(def.name);
        let mut synonyms = Vec::new();
        for (resource, source) in [
            (config.node_id.to_string(), SOURCE_DYNAMIC_BROKER_CONFIG),
            (String::new(), SOURCE_DYNAMIC_DEFAULT_BROKER_CONFIG),
        ] {
            if let Some(v) = image
                .broker_configs
                .get(&resource)
                .and_then(|m| m.get(def.name))
            {
                synonyms.push((def.name.to_string(), Some(v.clone()), source));
            }
        }
        if let Some((v, _)) = ours {
            if def.default != Some(v.as_str()) {
                synonyms.push((
                    def.name.to_string(),
                    Some(v.clone()),
                    SOURCE_STATIC_BROKER_CONFIG,
                ));
            }
        }
        if let Some(d) = def.default {
            synonyms.push((
                def.name.to_string(),
                Some(d.to_string()),
                SOURCE_DEFAULT_CONFIG,
            ));
        }
        out.push(Described::new(
            def.name.to_string(),
            synonyms,
            Traits {
                read_only: def.read_only || RESTART_ONLY_IN_SLUICE.contains(&def.name),
                sensitive: def.sensitive,
                config_type: def.config_type,
                documentation: ours.map_or(ACCEPTED_ONLY, |(_, doc)| doc),
            },
        ));
    }
    for (name, (value, doc)) in &sluice {
        if BROKER_CONFIGS.iter().any(|d| d.name == *name) {
            continue;
        }
        let config_type =
            crate::config::settings::find(name).map_or(TYPE_STRING, |s| s.kind.config_type());
        out.push(Described::new(
            name.to_string(),
            vec![(
                name.to_string(),
                Some(value.clone()),
                SOURCE_STATIC_BROKER_CONFIG,
            )],
            Traits {
                read_only: !crate::config::settings::find(name).is_some_and(|s| s.dynamic),
                sensitive: false,
                config_type,
                documentation: doc,
            },
        ));
    }
    out
}

/// A topic's configs, every one Kafka has and Sluice's own (`topic_config::TOPIC_SETTINGS`):
/// its override, else a dynamic broker default under the synonym, else this broker's static
/// setting of the synonym, else the default.
fn describe_topic(
    config: &BrokerConfig,
    image: &MetadataImage,
    topic: &TopicMeta,
) -> Vec<Described> {
    let statics: BTreeMap<&str, String> = sluice_broker_settings(config)
        .into_iter()
        .map(|(k, v, _)| (k, v))
        .collect();
    let mut out = Vec::new();
    for setting in TOPIC_SETTINGS {
        let key = setting.name;
        let default = setting.default_value();
        let mut synonyms = Vec::new();
        if let Some(v) = topic.configs.get(key) {
            synonyms.push((key.to_string(), Some(v.clone()), SOURCE_TOPIC_CONFIG));
        }
        let kafka = crate::topic_config::kafka_def(key);
        // Sluice's synonym, else the one Kafka lists (for the configs Sluice only accepts).
        let broker_synonym = setting
            .broker_synonym
            .or_else(|| kafka.and_then(|d| d.broker_synonym));
        if let Some(broker_key) = broker_synonym {
            if let Some((v, source)) = image.dynamic_broker_config(config.node_id, broker_key) {
                synonyms.push((broker_key.to_string(), Some(v.to_string()), source));
            }
            if let Some(v) = statics.get(broker_key).filter(|v| v.as_str() != default) {
                synonyms.push((
                    broker_key.to_string(),
                    Some(v.clone()),
                    SOURCE_STATIC_BROKER_CONFIG,
                ));
            }
            synonyms.push((
                broker_key.to_string(),
                Some(default.to_string()),
                SOURCE_DEFAULT_CONFIG,
            ));
        } else {
            synonyms.push((
                key.to_string(),
                Some(default.to_string()),
                SOURCE_DEFAULT_CONFIG,
            ));
        }
        out.push(Described::new(
            key.to_string(),
            synonyms,
            Traits {
                read_only: kafka.is_some_and(|d| d.read_only),
                sensitive: kafka.is_some_and(|d| d.sensitive),
                config_type: setting.config_type(),
                documentation: setting.doc,
            },
        ));
    }
    out
}

/// The error for a config resource the client may not `operation` (DESCRIBE_CONFIGS or
/// ALTER_CONFIGS), if it may not.
pub fn refused_configs(
    shard: &Shard,
    client: &super::Client,
    operation: i8,
    resource_type: i8,
    name: &str,
) -> Option<i16> {
    use super::authz::{self, resource_type as rt};
    let (allowed, error) = match resource_type {
        RESOURCE_TOPIC => (
            authz::allowed(shard, client, operation, rt::TOPIC, name),
            ResponseError::TopicAuthorizationFailed,
        ),
        RESOURCE_GROUP => (
            authz::group(shard, client, operation, name),
            ResponseError::GroupAuthorizationFailed,
        ),
        _ => (
            authz::cluster(shard, client, operation),
            ResponseError::ClusterAuthorizationFailed,
        ),
    };
    (!allowed).then(|| error.code())
}

pub async fn describe(
    shard: &Rc<Shard>,
    client: &super::Client,
    request: DescribeConfigsRequest,
    version: i16,
) -> DescribeConfigsResponse {
    let mut response = DescribeConfigsResponse::default();
    let config = shard.config().clone();
    let image = shard.image();
    for resource in request.resources {
        let name = resource.resource_name.to_string();
        // The authorizer: DESCRIBE_CONFIGS on the topic, the group, or (broker and logger
        // resources) the cluster.
        if let Some(code) = refused_configs(
            shard,
            client,
            super::authz::operation::DESCRIBE_CONFIGS,
            resource.resource_type,
            &name,
        ) {
            response.results.push(
                DescribeConfigsResult::default()
                    .with_resource_type(resource.resource_type)
                    .with_resource_name(resource.resource_name.clone())
                    .with_error_code(code)
                    .with_error_message(None),
            );
            continue;
        }
        let wanted = |key: &str| {
            resource
                .configuration_keys
                .as_ref()
                .is_none_or(|keys| keys.iter().any(|k| k.as_str() == key))
        };
        let mut result = DescribeConfigsResult::default()
            .with_resource_type(resource.resource_type)
            .with_resource_name(resource.resource_name.clone());
        if resource.resource_type == crate::loggers::RESOURCE_BROKER_LOGGER {
            // Kafka's answers, messages included, for another broker's or a malformed id.
            let refused = if name.is_empty() {
                Some("Broker id must not be empty".to_string())
            } else if name.parse::<i32>().is_err() {
                Some(format!("Broker id must be an integer, but it is: {name}"))
            } else if name != config.node_id.to_string() {
                Some(format!(
                    "Unexpected broker id, expected {} but received {name}",
                    config.node_id
                ))
            } else {
                None
            };
            match refused {
                Some(message) => {
                    result.error_code = ResponseError::InvalidRequest.code();
                    result.error_message = Some(StrBytes::from_string(message));
                }
                None => {
                    result.error_message = Some(StrBytes::from_static_str(""));
                    result.configs =
                        crate::loggers::describe(resource.configuration_keys.as_deref());
                }
            }
            response.results.push(result);
            continue;
        }
        let described = match resource.resource_type {
            RESOURCE_TOPIC => match image.topics.get(&name) {
                Some(topic) => describe_topic(&config, &image, topic),
                None => {
                    // With an empty message, as Kafka's.
                    result.error_code = ResponseError::UnknownTopicOrPartition.code();
                    result.error_message = Some(StrBytes::from_static_str(""));
                    Vec::new()
                }
            },
            // The cluster-wide defaults: only those set, as Kafka lists them.
            RESOURCE_BROKER if name.is_empty() => image
                .broker_configs
                .get("")
                .into_iter()
                .flatten()
                .map(|(k, v)| {
                    let def = BROKER_CONFIGS.iter().find(|d| d.name == k);
                    Described::new(
                        k.clone(),
                        vec![(
                            k.clone(),
                            Some(v.clone()),
                            SOURCE_DYNAMIC_DEFAULT_BROKER_CONFIG,
                        )],
                        Traits {
                            read_only: false,
                            sensitive: def.is_some_and(|d| d.sensitive),
                            config_type: def.map_or(TYPE_STRING, |d| d.config_type),
                            documentation: ACCEPTED_ONLY,
                        },
                    )
                })
                .collect(),
            RESOURCE_BROKER if name == config.node_id.to_string() => {
                describe_broker(&config, &image)
            }
            RESOURCE_BROKER => {
                result.error_code = ResponseError::InvalidRequest.code();
                result.error_message = Some(StrBytes::from_string(format!(
                    "broker {name} is not this broker ({})",
                    config.node_id
                )));
                Vec::new()
            }
            // A group's configs: those it set (source GROUP_CONFIG), the others with the
            // broker's value they default to.
            RESOURCE_GROUP => {
                let own = image
                    .cluster
                    .as_ref()
                    .and_then(|c| c.group_configs.get(&name));
                crate::group::configs::described(&config, own)
                    .into_iter()
                    .map(|(k, v, set)| {
                        let source = if set {
                            SOURCE_GROUP_CONFIG
                        } else {
                            SOURCE_DEFAULT_CONFIG
                        };
                        Described::new(
                            k.to_string(),
                            vec![(k.to_string(), Some(v), source)],
                            Traits {
                                read_only: false,
                                sensitive: false,
                                config_type: TYPE_STRING,
                                documentation: "",
                            },
                        )
                    })
                    .collect()
            }
            other => {
                result.error_code = ResponseError::InvalidRequest.code();
                result.error_message = Some(StrBytes::from_string(format!(
                    "resource type {other} is not supported"
                )));
                Vec::new()
            }
        };
        result.configs = described
            .into_iter()
            .filter(|d| wanted(&d.name))
            .map(|d| {
                d.result(
                    request.include_synonyms,
                    request.include_documentation,
                    version,
                )
            })
            .collect();
        response.results.push(result);
    }
    response
}
