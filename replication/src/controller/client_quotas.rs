//! Client quotas (AlterClientQuotas), checked as Kafka's controller checks them: the entity's
//! types (`user`, `client-id`, `ip`, each at most once, `ip` alone), each key known for the
//! entity, each value positive and whole where Kafka's is a long. An entry is applied whole or
//! refused whole; every accepted entry goes in one batch.

use super::*;

/// Kafka's client quota entity types.
pub const QUOTA_ENTITY_TYPES: &[&str] = &["user", "client-id", "ip"];
/// Quota keys of user and client-id entities, and whether their values are whole numbers.
pub const CLIENT_QUOTA_KEYS: &[(&str, bool)] = &[
    ("producer_byte_rate", true),
    ("consumer_byte_rate", true),
    ("request_percentage", false),
    ("controller_mutation_rate", false),
];
/// Quota keys of ip entities.
pub const IP_QUOTA_KEYS: &[(&str, bool)] = &[("connection_creation_rate", true)];

/// Kafka's AlterClientQuotas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlterClientQuotasRequest {
    pub entries: Vec<QuotaAlteration>,
    pub validate_only: bool,
}

/// One entry: an entity (in the client's order) and its keys, each set to a value or removed
/// (`None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaAlteration {
    pub entity: QuotaEntity,
    pub ops: Vec<(String, Option<QuotaValue>)>,
}

/// One entry's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaAlterationResult {
    pub error_code: i16,
    pub error_message: Option<String>,
}

/// Why Kafka refuses an entry, or its entity sorted by type.
pub fn check_quota_alteration(entry: &QuotaAlteration) -> Result<QuotaEntity, String> {
    if entry.entity.is_empty() {
        return Err("Invalid empty client quota entity".into());
    }
    let mut entity = entry.entity.clone();
    for (entity_type, _) in &entity {
        if !QUOTA_ENTITY_TYPES.contains(&entity_type.as_str()) {
            return Err(format!("Unhandled client quota entity type: {entity_type}"));
        }
    }
    entity.sort();
    if let Some(w) = entity.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(format!(
            "Client quota entity type {} is named more than once",
            w[0].0
        ));
    }
    let ip = entity.iter().any(|(t, _)| t == "ip");
    if ip && entity.len() > 1 {
        return Err(
            "Invalid quota entity combination, IP entity shouldnot be combined with User or ClientId"
                .into(),
        );
    }
    let keys = if ip { IP_QUOTA_KEYS } else { CLIENT_QUOTA_KEYS };
    for (key, value) in &entry.ops {
        let Some(&(_, whole)) = keys.iter().find(|(k, _)| k == key) else {
            return Err(format!("Invalid configuration key {key}"));
        };
        let Some(QuotaValue(value)) = value else {
            continue;
        };
        if value.is_nan() || *value <= 0.0 || value.is_infinite() {
            return Err(format!("Quota {key} must be greater than 0"));
        }
        if whole && value.fract() != 0.0 {
            return Err(format!("{key} cannot be a fractional value."));
        }
    }
    Ok(entity)
}

impl Controller {
    pub(super) fn alter_client_quotas(
        &mut self,
        r: &AlterClientQuotasRequest,
    ) -> (Vec<Record>, ControllerResponse) {
        let mut batch = Vec::new();
        let mut results = Vec::with_capacity(r.entries.len());
        for entry in &r.entries {
            match check_quota_alteration(entry) {
                Err(why) => results.push(QuotaAlterationResult {
                    error_code: INVALID_REQUEST,
                    error_message: Some(why),
                }),
                Ok(entity) => {
                    let existing = self.image().client_quotas().get(&entity);
                    for (key, value) in &entry.ops {
                        let record = match value {
                            Some(value) => ClientQuotaRecord {
                                entity: entity.clone(),
                                key: key.clone(),
                                value: *value,
                                remove: false,
                            },
                            // Removing a quota that is not set writes nothing.
                            None if existing.is_some_and(|e| e.contains_key(key)) => {
                                ClientQuotaRecord {
                                    entity: entity.clone(),
                                    key: key.clone(),
                                    value: QuotaValue(0.0),
                                    remove: true,
                                }
                            }
                            None => continue,
                        };
                        batch.push(Record::ClientQuota(record));
                    }
                    results.push(QuotaAlterationResult {
                        error_code: NONE,
                        error_message: None,
                    });
                }
            }
        }
        let mut records = Vec::new();
        if !r.validate_only && !batch.is_empty() {
            self.emit(&mut records, batch);
        }
        (records, ControllerResponse::AlterClientQuotas(results))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entity(parts: &[(&str, Option<&str>)]) -> QuotaEntity {
        parts
            .iter()
            .map(|(t, n)| (t.to_string(), n.map(str::to_string)))
            .collect()
    }

    fn alteration(parts: &[(&str, Option<&str>)], ops: &[(&str, Option<f64>)]) -> QuotaAlteration {
        QuotaAlteration {
            entity: entity(parts),
            ops: ops
                .iter()
                .map(|(k, v)| (k.to_string(), v.map(QuotaValue)))
                .collect(),
        }
    }

    #[test]
    fn entries_are_checked_as_kafka_checks_them() {
        let ok = |parts: &[(&str, Option<&str>)], ops: &[(&str, Option<f64>)]| {
            check_quota_alteration(&alteration(parts, ops))
        };
        assert_eq!(
            ok(
                &[("client-id", Some("c")), ("user", None)],
                &[("producer_byte_rate", Some(1024.0))]
            ),
            Ok(entity(&[("client-id", Some("c")), ("user", None)])),
            "sorted by type, defaults kept"
        );
        assert!(ok(&[], &[]).unwrap_err().contains("empty"));
        assert!(ok(&[("group", Some("g"))], &[])
            .unwrap_err()
            .contains("Unhandled client quota entity type: group"));
        assert!(ok(&[("ip", None), ("user", Some("u"))], &[]).is_err());
        assert!(ok(&[("user", Some("a")), ("user", Some("b"))], &[]).is_err());
        assert!(ok(
            &[("user", Some("u"))],
            &[("connection_creation_rate", Some(1.0))]
        )
        .unwrap_err()
        .contains("Invalid configuration key"));
        assert!(
            ok(&[("user", Some("u"))], &[("producer_byte_rate", Some(0.0))])
                .unwrap_err()
                .contains("greater than 0")
        );
        assert!(
            ok(&[("user", Some("u"))], &[("producer_byte_rate", Some(1.5))])
                .unwrap_err()
                .contains("fractional")
        );
        assert!(ok(&[("user", Some("u"))], &[("request_percentage", Some(1.5))]).is_ok());
        assert!(ok(
            &[("ip", Some("10.0.0.1"))],
            &[("connection_creation_rate", Some(5.0))]
        )
        .is_ok());
        assert!(ok(&[("user", Some("u"))], &[("producer_byte_rate", None)]).is_ok());
    }
}
