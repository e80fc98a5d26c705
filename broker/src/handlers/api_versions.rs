//! ApiVersions: exactly the APIs and versions this broker implements.

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::ResponseError;

use super::SUPPORTED;

pub fn handle(_request: &ApiVersionsRequest, error: Option<ResponseError>) -> ApiVersionsResponse {
    let mut response = ApiVersionsResponse::default();
    response.error_code = error.map(|e| e.code()).unwrap_or(0);
    response.api_keys = SUPPORTED
        .iter()
        .map(|&(key, min, max)| {
            ApiVersion::default()
                .with_api_key(key as i16)
                .with_min_version(min)
                .with_max_version(max)
        })
        .collect();
    response
}
