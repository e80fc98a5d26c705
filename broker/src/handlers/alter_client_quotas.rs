//! AlterClientQuotas (`kafka-configs --alter --entity-type users|clients|ips`): the client needs
//! ALTER_CONFIGS on the cluster, as in Kafka; the entries are checked and stored by the
//! controller (`sluice_replication::controller::client_quotas`), and answered once this node's
//! image has them. Enforcement is `crate::quota`'s.

use kafka_protocol::messages::alter_client_quotas_response::{self, EntityData};
use kafka_protocol::messages::{AlterClientQuotasRequest, AlterClientQuotasResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::{authz, Client};
use crate::shard::Shard;

pub async fn handle(
    shard: &std::rc::Rc<Shard>,
    client: &Client,
    request: AlterClientQuotasRequest,
    version: i16,
) -> AlterClientQuotasResponse {
    if !authz::cluster(shard, client, authz::operation::ALTER_CONFIGS) {
        let code = ResponseError::ClusterAuthorizationFailed.code();
        let entries = request
            .entries
            .iter()
            .map(|entry| {
                alter_client_quotas_response::EntryData::default()
                    .with_error_code(code)
                    .with_error_message(Some(StrBytes::from_static_str(
                        "Cluster authorization failed.",
                    )))
                    .with_entity(
                        entry
                            .entity
                            .iter()
                            .map(|e| {
                                EntityData::default()
                                    .with_entity_type(e.entity_type.clone())
                                    .with_entity_name(e.entity_name.clone())
                            })
                            .collect(),
                    )
            })
            .collect();
        return AlterClientQuotasResponse::default().with_entries(entries);
    }
    crate::cluster::alter_client_quotas(shard, request, version).await
}
