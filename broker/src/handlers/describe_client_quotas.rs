//! DescribeClientQuotas: no quotas are set on this broker (it has no quota store), so a valid
//! filter matches nothing, as on a Kafka where none were set. Filters are checked as Kafka checks
//! them, so a bad filter is refused here as it would be there.

use kafka_protocol::messages::{DescribeClientQuotasRequest, DescribeClientQuotasResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

/// The client quota entity types Kafka knows.
pub const ENTITY_TYPES: &[&str] = &["user", "client-id", "ip"];
const MATCH_EXACT: i8 = 0;
const MATCH_DEFAULT: i8 = 1;
const MATCH_SPECIFIED: i8 = 2;

fn check(request: &DescribeClientQuotasRequest) -> Result<(), (ResponseError, String)> {
    let mut seen: Vec<&str> = Vec::new();
    for c in &request.components {
        let entity_type = c.entity_type.as_str();
        if !ENTITY_TYPES.contains(&entity_type) {
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

pub fn handle(request: DescribeClientQuotasRequest) -> DescribeClientQuotasResponse {
    match check(&request) {
        Ok(()) => DescribeClientQuotasResponse::default()
            .with_error_message(Some(StrBytes::from_static_str("")))
            .with_entries(Some(vec![])),
        Err((error, message)) => DescribeClientQuotasResponse::default()
            .with_error_code(error.code())
            .with_error_message(Some(StrBytes::from_string(message)))
            .with_entries(None),
    }
}
