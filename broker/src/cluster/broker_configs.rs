//! Dynamic broker configs as the controller checks them before storing them in the metadata
//! log: Kafka's catalog (`config_catalog.rs`) names them, types them and gives their defaults.

use std::collections::BTreeMap;

use kafka_protocol::ResponseError;

use crate::config_catalog::BROKER_CONFIGS;
use crate::metadata::log_config;

/// DescribeConfigs and AlterConfigs `resource_type` of a broker.
pub const RESOURCE_BROKER: i8 = 4;
// DescribeConfigs `config_type` (KIP-569).
pub const TYPE_BOOLEAN: i8 = 1;
pub const TYPE_STRING: i8 = 2;
pub const TYPE_INT: i8 = 3;
pub const TYPE_SHORT: i8 = 4;
pub const TYPE_LONG: i8 = 5;
pub const TYPE_DOUBLE: i8 = 6;

/// Broker configs Kafka changes without a restart that Sluice reads only at start: refused,
/// rather than stored and silently not applied.
pub const RESTART_ONLY_IN_SLUICE: &[&str] = &["listeners"];

/// Checks one dynamic broker config value: a known name Kafka changes without a restart (and
/// Sluice too), of the right type; a topic default also as the topic config it stands for.
pub fn check_broker_config(name: &str, value: &str) -> Result<(), (i16, String)> {
    // Kafka stores broker configs it does not know (plugins read their own), and so does Sluice.
    let Some(def) = BROKER_CONFIGS.iter().find(|d| d.name == name) else {
        return Ok(());
    };
    if def.read_only || RESTART_ONLY_IN_SLUICE.contains(&name) {
        return Err((
            ResponseError::InvalidRequest.code(),
            format!("cannot update {name} dynamically; it is read at start-up"),
        ));
    }
    let ok = match def.config_type {
        TYPE_BOOLEAN => value == "true" || value == "false",
        TYPE_INT => value.parse::<i32>().is_ok(),
        TYPE_SHORT => value.parse::<i16>().is_ok(),
        TYPE_LONG => value.parse::<i64>().is_ok(),
        TYPE_DOUBLE => value.parse::<f64>().is_ok(),
        _ => true,
    };
    // A bad value is an invalid request for Kafka here (INVALID_CONFIG is for topics).
    if !ok {
        return Err((
            ResponseError::InvalidRequest.code(),
            format!("invalid value {value:?} for {name}"),
        ));
    }
    if let Some((topic_key, _)) = crate::topic_config::broker_synonyms().find(|(_, b)| *b == name) {
        let one = BTreeMap::from([(topic_key.to_string(), value.to_string())]);
        log_config(&one).map_err(|e| (ResponseError::InvalidRequest.code(), e))?;
    }
    Ok(())
}

/// A dynamic broker config's default, for APPEND and SUBTRACT on a broker without its own value.
pub fn broker_config_default(name: &str) -> Option<String> {
    BROKER_CONFIGS
        .iter()
        .find(|d| d.name == name)
        .and_then(|d| d.default)
        .map(str::to_string)
}
