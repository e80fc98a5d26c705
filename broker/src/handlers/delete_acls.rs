//! DeleteAcls (`kafka-acls --remove`): without `authorizer.class.name`, SECURITY_DISABLED for
//! each filter, as Kafka answers. With it, the client needs ALTER on the cluster; the controller
//! deletes every ACL a filter matches and each filter lists what it matched.

use kafka_protocol::messages::delete_acls_response::DeleteAclsFilterResult;
use kafka_protocol::messages::{DeleteAclsRequest, DeleteAclsResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::{authz, Client};
use crate::errors::Disabled;
use crate::shard::Shard;

pub async fn handle(
    shard: &std::rc::Rc<Shard>,
    client: &Client,
    request: DeleteAclsRequest,
    version: i16,
) -> DeleteAclsResponse {
    let each = |code: i16, message: &'static str| {
        DeleteAclsResponse::default().with_filter_results(
            request
                .filters
                .iter()
                .map(|_| {
                    DeleteAclsFilterResult::default()
                        .with_error_code(code)
                        .with_error_message(Some(StrBytes::from_static_str(message)))
                })
                .collect(),
        )
    };
    if !shard.config().authorizer {
        let disabled = Disabled::Authorizer;
        return each(disabled.code(), disabled.message());
    }
    if !authz::cluster(shard, client, authz::operation::ALTER) {
        return each(
            ResponseError::ClusterAuthorizationFailed.code(),
            "Cluster authorization failed.",
        );
    }
    crate::cluster::delete_acls(shard, request, version).await
}
