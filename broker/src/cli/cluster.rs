//! `sluice cluster`: the cluster id, controller and brokers from Metadata, topic and partition
//! counts, and the API versions of the broker connected to, in the format of
//! `kafka-broker-api-versions.sh`.

use kafka_protocol::messages::ApiKey;

use super::client::{api_name, check, Client};
use super::Connection;

#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    #[command(flatten)]
    connection: Connection,
}

pub fn run(args: &ClusterArgs) -> anyhow::Result<()> {
    let mut client = Client::bootstrap(&args.connection.bootstrap_server)?;
    let response = client.metadata(None, false)?;
    check(response.error_code, None, "Metadata")?;
    let cluster_id = response
        .cluster_id
        .as_ref()
        .map_or("(not reported)", |c| c.as_str());
    println!("Cluster ID: {cluster_id}");
    let controller = response.controller_id.0;
    if controller < 0 {
        println!("Controller: none");
    } else {
        println!("Controller: {controller}");
    }
    println!("Brokers: {}", response.brokers.len());
    let mut brokers: Vec<_> = response.brokers.iter().collect();
    brokers.sort_by_key(|b| b.node_id);
    for b in brokers {
        let mut line = format!("  {}\t{}:{}", b.node_id.0, b.host.as_str(), b.port);
        if let Some(rack) = &b.rack {
            line.push_str(&format!("\track: {}", rack.as_str()));
        }
        if b.node_id.0 == controller {
            line.push_str("\t(controller)");
        }
        println!("{line}");
    }
    let partitions: usize = response.topics.iter().map(|t| t.partitions.len()).sum();
    println!(
        "Topics: {} ({partitions} partitions)",
        response.topics.len()
    );
    println!("ApiVersions of {}:", client.address());
    for (&key, &(min, max)) in client.broker_versions() {
        let usable = match ApiKey::try_from(key)
            .ok()
            .and_then(|k| client.version_of(k))
        {
            Some(v) => format!("usable: {v}"),
            None => "not used by this client".to_string(),
        };
        println!("  {}({key}): {min} to {max} [{usable}]", api_name(key));
    }
    Ok(())
}
