//! DescribeAcls (`kafka-acls --list`): without `authorizer.class.name`, SECURITY_DISABLED, as
//! Kafka answers. With it, the client needs DESCRIBE on the cluster, and gets the ACLs of this
//! node's image the filter matches, grouped by resource pattern in Kafka's way.

use std::collections::BTreeMap;

use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{DescribeAclsRequest, DescribeAclsResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use sluice_replication::acl::AclFilter;

use super::{authz, Client};
use crate::errors::Disabled;
use crate::shard::Shard;

pub fn handle(
    shard: &Shard,
    client: &Client,
    request: DescribeAclsRequest,
) -> DescribeAclsResponse {
    let refuse = |code: i16, message: &str| {
        DescribeAclsResponse::default()
            .with_error_code(code)
            .with_error_message(Some(StrBytes::from_string(message.to_string())))
    };
    if !shard.config().authorizer {
        let disabled = Disabled::AuthorizerDescribe;
        return refuse(disabled.code(), disabled.message());
    }
    if !authz::cluster(shard, client, authz::operation::DESCRIBE) {
        return refuse(
            ResponseError::ClusterAuthorizationFailed.code(),
            "Cluster authorization failed.",
        );
    }
    let filter = AclFilter {
        resource_type: request.resource_type_filter,
        resource_name: request.resource_name_filter.map(|n| n.to_string()),
        pattern_type: request.pattern_type_filter,
        principal: request.principal_filter.map(|p| p.to_string()),
        host: request.host_filter.map(|h| h.to_string()),
        operation: request.operation,
        permission: request.permission_type,
    };
    if let Some(why) = filter.invalid() {
        return refuse(ResponseError::InvalidRequest.code(), why);
    }
    let image = shard.image();
    let mut resources: BTreeMap<(i8, String, i8), Vec<AclDescription>> = BTreeMap::new();
    for acl in image.cluster.iter().flat_map(|c| &c.acls) {
        if filter.matches(acl) {
            resources
                .entry((
                    acl.resource_type,
                    acl.resource_name.clone(),
                    acl.pattern_type,
                ))
                .or_default()
                .push(
                    AclDescription::default()
                        .with_principal(StrBytes::from_string(acl.principal.clone()))
                        .with_host(StrBytes::from_string(acl.host.clone()))
                        .with_operation(acl.operation)
                        .with_permission_type(acl.permission),
                );
        }
    }
    DescribeAclsResponse::default()
        .with_error_message(None)
        .with_resources(
            resources
                .into_iter()
                .map(|((resource_type, name, pattern_type), acls)| {
                    DescribeAclsResource::default()
                        .with_resource_type(resource_type)
                        .with_resource_name(StrBytes::from_string(name))
                        .with_pattern_type(pattern_type)
                        .with_acls(acls)
                })
                .collect(),
        )
}
