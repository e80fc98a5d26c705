//! `sluice cluster`: the cluster id, controller and brokers from Metadata, topic and partition
//! counts, under-replicated and offline partitions, consumer lag per group, and the API versions of the broker
//! connected to, in the format of `kafka-broker-api-versions.sh`; with `--bootstrap-controller` (or `--quorum`, through the
//! broker), the controller quorum as `kafka-metadata-quorum describe --status --replication`
//! shows it.

use kafka_protocol::messages::ApiKey;

use super::client::{api_name, check, Client};
use super::Connection;

/// Under-replicated or offline partitions listed by name; more are counted.
const PARTITIONS_SHOWN: usize = 20;

#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    #[command(flatten)]
    connection: Connection,
    /// A controller's CONTROLLER listener, `HOST:PORT`: show the controller quorum (leader,
    /// epoch, high watermark, voters and observers with their lag) instead.
    #[arg(long, value_name = "HOST:PORT")]
    bootstrap_controller: Option<String>,
    /// Show the controller quorum, asked through the broker (`--bootstrap-server`), as
    /// `kafka-metadata-quorum --bootstrap-server` does; the single-node broker's quorum is
    /// itself.
    #[arg(long, conflicts_with = "bootstrap_controller")]
    quorum: bool,
}

/// The quorum of `__cluster_metadata`, asked of a controller (DescribeQuorum).
fn describe_quorum(address: &str) -> anyhow::Result<()> {
    use kafka_protocol::messages::describe_quorum_request::{PartitionData, TopicData};
    use kafka_protocol::messages::{DescribeQuorumRequest, TopicName};
    let mut client = Client::bootstrap(address)?;
    let request = DescribeQuorumRequest::default().with_topics(vec![TopicData::default()
        .with_topic_name(TopicName(super::client::str_bytes("__cluster_metadata")))
        .with_partitions(vec![PartitionData::default().with_partition_index(0)])]);
    let (response, _) = client.send(&request)?;
    check(
        response.error_code,
        response.error_message.as_ref(),
        "DescribeQuorum",
    )?;
    let Some(p) = response.topics.first().and_then(|t| t.partitions.first()) else {
        anyhow::bail!("DescribeQuorum answered no partition");
    };
    check(p.error_code, p.error_message.as_ref(), "DescribeQuorum")?;
    let ids = |rs: &[kafka_protocol::messages::describe_quorum_response::ReplicaState]| {
        rs.iter()
            .map(|r| r.replica_id.0.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("LeaderId: {}", p.leader_id.0);
    println!("LeaderEpoch: {}", p.leader_epoch);
    println!("HighWatermark: {}", p.high_watermark);
    println!("CurrentVoters: [{}]", ids(&p.current_voters));
    println!("CurrentObservers: [{}]", ids(&p.observers));
    println!("NodeId\tLogEndOffset\tLag\tStatus");
    let leader_end = p
        .current_voters
        .iter()
        .find(|r| r.replica_id == p.leader_id)
        .map_or(p.high_watermark, |r| r.log_end_offset);
    for (r, voter) in p
        .current_voters
        .iter()
        .map(|r| (r, true))
        .chain(p.observers.iter().map(|r| (r, false)))
    {
        let status = match (r.replica_id == p.leader_id, voter) {
            (true, _) => "Leader",
            (false, true) => "Follower",
            (false, false) => "Observer",
        };
        let lag = if r.log_end_offset < 0 {
            "unknown".to_string()
        } else {
            (leader_end - r.log_end_offset).max(0).to_string()
        };
        println!("{}\t{}\t{lag}\t{status}", r.replica_id.0, r.log_end_offset);
    }
    Ok(())
}

pub fn run(args: &ClusterArgs) -> anyhow::Result<()> {
    if let Some(controller) = &args.bootstrap_controller {
        return describe_quorum(controller);
    }
    if args.quorum {
        return describe_quorum(&args.connection.bootstrap_server);
    }
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
    // The health signals: partitions with fewer in-sync replicas than replicas, and
    // partitions with no leader (unreadable and unwritable).
    let mut under = Vec::new();
    let mut offline = Vec::new();
    for t in &response.topics {
        let name = t.name.as_ref().map_or("", |n| n.0.as_str());
        for p in &t.partitions {
            let ids = |v: &[kafka_protocol::messages::BrokerId]| {
                v.iter()
                    .map(|b| b.0.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let line = format!(
                "  {name}-{}\tleader: {}\treplicas: [{}]\tisr: [{}]",
                p.partition_index,
                p.leader_id.0,
                ids(&p.replica_nodes),
                ids(&p.isr_nodes)
            );
            if p.leader_id.0 < 0 {
                offline.push(line);
            } else if p.isr_nodes.len() < p.replica_nodes.len() {
                under.push(line);
            }
        }
    }
    under.sort();
    offline.sort();
    for (what, list) in [("Under-replicated", &under), ("Offline", &offline)] {
        println!("{what} partitions: {}", list.len());
        for line in list.iter().take(PARTITIONS_SHOWN) {
            println!("{line}");
        }
        if list.len() > PARTITIONS_SHOWN {
            println!("  ... and {} more", list.len() - PARTITIONS_SHOWN);
        }
    }
    // Consumer lag: per group, the log ends minus its commits, over its committed partitions.
    match super::group_lags(&args.connection.bootstrap_server, None) {
        Ok(lags) => {
            let mut groups: std::collections::BTreeMap<&str, (i64, usize)> = Default::default();
            for (group, _, _, lag) in &lags {
                let g = groups.entry(group.as_str()).or_default();
                g.0 += lag;
                g.1 += 1;
            }
            println!("Consumer groups with commits: {}", groups.len());
            for (group, (lag, partitions)) in groups {
                println!("  {group}\tlag: {lag}\tpartitions: {partitions}");
            }
        }
        Err(e) => eprintln!("note: consumer lag not available: {e:#}"),
    }
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
