//! CreateAcls (`kafka-acls --add`): without `authorizer.class.name`, SECURITY_DISABLED for each
//! creation, as Kafka answers. With it, the client needs ALTER on the cluster; the ACLs are
//! checked and stored by the controller, and answered once this node's image has them.

use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::{CreateAclsRequest, CreateAclsResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::{authz, Client};
use crate::errors::Disabled;
use crate::shard::Shard;

pub async fn handle(
    shard: &std::rc::Rc<Shard>,
    client: &Client,
    request: CreateAclsRequest,
    version: i16,
) -> CreateAclsResponse {
    let each = |code: i16, message: &'static str| {
        CreateAclsResponse::default().with_results(
            request
                .creations
                .iter()
                .map(|_| {
                    AclCreationResult::default()
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
    crate::cluster::create_acls(shard, request, version).await
}
