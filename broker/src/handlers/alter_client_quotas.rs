//! AlterClientQuotas: this broker neither stores nor enforces client quotas, so it cannot set
//! one. Each entry is first checked as Kafka checks it (so a bad entry gets Kafka's error), and
//! a valid one is refused with a message saying why (`Disabled::ClientQuotas`), rather than
//! accepted and silently ignored.

use kafka_protocol::messages::alter_client_quotas_request::EntryData;
use kafka_protocol::messages::alter_client_quotas_response::{self, EntityData};
use kafka_protocol::messages::{AlterClientQuotasRequest, AlterClientQuotasResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::describe_client_quotas::ENTITY_TYPES;
use crate::errors::Disabled;

/// Quota keys of user and client-id entities, and whether their values are whole numbers.
const CLIENT_KEYS: &[(&str, bool)] = &[
    ("producer_byte_rate", true),
    ("consumer_byte_rate", true),
    ("request_percentage", false),
    ("controller_mutation_rate", false),
];
/// Quota keys of ip entities.
const IP_KEYS: &[(&str, bool)] = &[("connection_creation_rate", true)];

fn check(entry: &EntryData) -> Result<(), String> {
    if entry.entity.is_empty() {
        return Err("Invalid empty client quota entity".into());
    }
    let mut types: Vec<&str> = Vec::new();
    for e in &entry.entity {
        let t = e.entity_type.as_str();
        if !ENTITY_TYPES.contains(&t) {
            return Err(format!("Unhandled client quota entity type: {t}"));
        }
        types.push(t);
    }
    let ip = types.contains(&"ip");
    if ip && types.iter().any(|t| *t != "ip") {
        return Err(
            "Invalid quota entity combination, IP entity shouldnot be combined with User or ClientId"
                .into(),
        );
    }
    let keys = if ip { IP_KEYS } else { CLIENT_KEYS };
    for op in &entry.ops {
        let key = op.key.as_str();
        let Some(&(_, whole)) = keys.iter().find(|(k, _)| *k == key) else {
            return Err(format!("Invalid configuration key {key}"));
        };
        if op.remove {
            continue;
        }
        if op.value <= 0.0 {
            return Err(format!("Quota {key} must be greater than 0"));
        }
        if whole && op.value.fract() != 0.0 {
            return Err(format!("{key} cannot be a fractional value."));
        }
    }
    Ok(())
}

pub fn handle(request: AlterClientQuotasRequest) -> AlterClientQuotasResponse {
    let entries = request
        .entries
        .iter()
        .map(|entry| {
            let (code, message) = match check(entry) {
                Err(message) => (ResponseError::InvalidRequest.code(), message),
                Ok(()) => (
                    Disabled::ClientQuotas.code(),
                    Disabled::ClientQuotas.message().to_string(),
                ),
            };
            alter_client_quotas_response::EntryData::default()
                .with_error_code(code)
                .with_error_message(Some(StrBytes::from_string(message)))
                .with_entity(
                    entry
                        .entity
                        .iter()
                        .map(|e| {
                            EntityData::default()
                                .with_entity_type(e.entity_type.clone())
                                .with_entity_name(e.entity_name.clone())
                        })
                        .collect(),
                )
        })
        .collect();
    AlterClientQuotasResponse::default().with_entries(entries)
}
