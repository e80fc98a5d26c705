//! DeleteAcls: there is no authorizer, so no ACL matches. Each filter is answered as Kafka
//! answers without `authorizer.class.name`: SECURITY_DISABLED.

use kafka_protocol::messages::delete_acls_response::DeleteAclsFilterResult;
use kafka_protocol::messages::{DeleteAclsRequest, DeleteAclsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::errors::Disabled;

pub fn handle(request: DeleteAclsRequest) -> DeleteAclsResponse {
    let disabled = Disabled::Authorizer;
    DeleteAclsResponse::default().with_filter_results(
        request
            .filters
            .iter()
            .map(|_| {
                DeleteAclsFilterResult::default()
                    .with_error_code(disabled.code())
                    .with_error_message(Some(StrBytes::from_static_str(disabled.message())))
            })
            .collect(),
    )
}
