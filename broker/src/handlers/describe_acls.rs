//! DescribeAcls: there is no authorizer, so there are no ACLs to list. Answered as Kafka answers
//! without `authorizer.class.name`: SECURITY_DISABLED.

use kafka_protocol::messages::{DescribeAclsRequest, DescribeAclsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::errors::Disabled;

pub fn handle(_request: DescribeAclsRequest) -> DescribeAclsResponse {
    let disabled = Disabled::AuthorizerDescribe;
    DescribeAclsResponse::default()
        .with_error_code(disabled.code())
        .with_error_message(Some(StrBytes::from_static_str(disabled.message())))
}
