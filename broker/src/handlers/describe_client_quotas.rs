//! DescribeClientQuotas (`kafka-configs --describe --entity-type users|clients|ips`): the
//! quotas of the metadata image whose entities match the filter, as Kafka matches them. Filters
//! are checked as Kafka checks them, so a bad filter is refused here as it would be there.

use kafka_protocol::messages::describe_client_quotas_response::{EntityData, EntryData, ValueData};
use kafka_protocol::messages::{DescribeClientQuotasRequest, DescribeClientQuotasResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use sluice_replication::controller::QUOTA_ENTITY_TYPES;
use sluice_replication::records::QuotaEntity;

use crate::metadata::MetadataImage;

const MATCH_EXACT: i8 = 0;
const MATCH_DEFAULT: i8 = 1;
const MATCH_SPECIFIED: i8 = 2;

fn check(request: &DescribeClientQuotasRequest) -> Result<(), (ResponseError, String)> {
    let mut seen: Vec<&str> = Vec::new();
    for c in &request.components {
        let entity_type = c.entity_type.as_str();
        if !QUOTA_ENTITY_TYPES.contains(&entity_type) {
            return Err((
                ResponseError::UnsupportedVersion,
                format!("Unsupported entity type {entity_type}"),
            ));
        }
        if seen.contains(&entity_type) {
            return Err((
                ResponseError::InvalidRequest,
                format!("Entity type {entity_type} cannot appear more than once in the filter."),
            ));
        }
        seen.push(entity_type);
        match c.match_type {
            MATCH_EXACT if c._match.is_none() => {
                return Err((
                    ResponseError::InvalidRequest,
                    "Request specified MATCH_TYPE_EXACT, but set match string to null.".into(),
                ))
            }
            MATCH_DEFAULT | MATCH_SPECIFIED if c._match.is_some() => {
                let name = if c.match_type == MATCH_DEFAULT {
                    "MATCH_TYPE_DEFAULT"
                } else {
                    "MATCH_TYPE_SPECIFIED"
                };
                return Err((
                    ResponseError::InvalidRequest,
                    format!("Request specified {name}, but also specified a match string."),
                ));
            }
            MATCH_EXACT | MATCH_DEFAULT | MATCH_SPECIFIED => {}
            other => {
                return Err((
                    ResponseError::InvalidRequest,
                    format!("Unknown match type {other}"),
                ))
            }
        }
    }
    if seen.contains(&"ip") && seen.len() > 1 {
        return Err((
            ResponseError::InvalidRequest,
            "Invalid entity filter component combination. IP filter component should not be used with user or clientId filter component.".into(),
        ));
    }
    Ok(())
}

/// Whether `entity` matches every component of the filter (and, when `strict`, has no other
/// type): EXACT names the entity, DEFAULT is the type's default, SPECIFIED any entity of the
/// type, its default included (as Kafka answers it).
fn matches(request: &DescribeClientQuotasRequest, entity: &QuotaEntity) -> bool {
    let all = request.components.iter().all(|c| {
        let Some((_, name)) = entity.iter().find(|(t, _)| t == c.entity_type.as_str()) else {
            return false;
        };
        match c.match_type {
            MATCH_EXACT => name.as_deref() == c._match.as_ref().map(|m| m.as_str()),
            MATCH_DEFAULT => name.is_none(),
            _ => true,
        }
    });
    all && (!request.strict || entity.len() == request.components.len())
}

pub fn handle(
    request: DescribeClientQuotasRequest,
    image: &MetadataImage,
) -> DescribeClientQuotasResponse {
    match check(&request) {
        Ok(()) => {
            let text = |s: &str| StrBytes::from_string(s.to_string());
            let entries = image
                .cluster
                .iter()
                .flat_map(|c| &c.quotas)
                .filter(|(entity, _)| matches(&request, entity))
                .map(|(entity, keys)| {
                    EntryData::default()
                        .with_entity(
                            entity
                                .iter()
                                .map(|(t, n)| {
                                    EntityData::default()
                                        .with_entity_type(text(t))
                                        .with_entity_name(n.as_deref().map(text))
                                })
                                .collect(),
                        )
                        .with_values(
                            keys.iter()
                                .map(|(k, v)| {
                                    ValueData::default().with_key(text(k)).with_value(v.0)
                                })
                                .collect(),
                        )
                })
                .collect();
            DescribeClientQuotasResponse::default()
                .with_error_message(Some(StrBytes::from_static_str("")))
                .with_entries(Some(entries))
        }
        Err((error, message)) => DescribeClientQuotasResponse::default()
            .with_error_code(error.code())
            .with_error_message(Some(StrBytes::from_string(message)))
            .with_entries(None),
    }
}
