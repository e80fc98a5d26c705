//! DescribeCluster: the brokers, the controller and the cluster id. Version 2 (KIP-1073) lists
//! fenced brokers too when asked, marked as such.

use std::rc::Rc;

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::{BrokerId, DescribeClusterRequest, DescribeClusterResponse};
use kafka_protocol::protocol::StrBytes;

use crate::shard::Shard;

pub fn handle(
    shard: &Rc<Shard>,
    request: &DescribeClusterRequest,
    listener: &str,
) -> DescribeClusterResponse {
    let config = shard.config();
    if let Some(cluster) = shard.image().cluster.clone() {
        let mut response = DescribeClusterResponse::default()
            .with_cluster_id(StrBytes::from_string(config.cluster_id.clone()))
            .with_controller_id(BrokerId(cluster.controller_id));
        for b in cluster
            .brokers
            .values()
            .filter(|b| !b.fenced || request.include_fenced_brokers)
        {
            response.brokers.push(
                DescribeClusterBroker::default()
                    .with_broker_id(BrokerId(b.id))
                    .with_host(StrBytes::from_string(b.on(listener).0.to_string()))
                    .with_port(b.on(listener).1 as i32)
                    .with_rack(b.rack.clone().map(StrBytes::from_string))
                    .with_is_fenced(b.fenced),
            );
        }
        return response;
    }
    let mut response = DescribeClusterResponse::default()
        .with_cluster_id(StrBytes::from_string(config.cluster_id.clone()))
        .with_controller_id(BrokerId(config.node_id));
    response.brokers.push(
        DescribeClusterBroker::default()
            .with_broker_id(BrokerId(config.node_id))
            .with_host(StrBytes::from_string(
                config.advertised_on(listener).0.to_string(),
            ))
            .with_port(config.advertised_on(listener).1 as i32),
    );
    response
}
