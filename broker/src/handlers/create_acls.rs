//! CreateAcls: there is no authorizer to hold ACLs. Each creation is answered as Kafka answers
//! without `authorizer.class.name`: SECURITY_DISABLED.

use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::{CreateAclsRequest, CreateAclsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::errors::Disabled;

pub fn handle(request: CreateAclsRequest) -> CreateAclsResponse {
    let disabled = Disabled::Authorizer;
    CreateAclsResponse::default().with_results(
        request
            .creations
            .iter()
            .map(|_| {
                AclCreationResult::default()
                    .with_error_code(disabled.code())
                    .with_error_message(Some(StrBytes::from_static_str(disabled.message())))
            })
            .collect(),
    )
}
