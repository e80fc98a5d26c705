//! `sluice reassign`: move a partition's replicas, drain a broker, list and cancel reassignments
//! (AlterPartitionReassignments, ListPartitionReassignments), as `kafka-reassign-partitions`
//! does; and `sluice elect-leaders` (ElectLeaders), as `kafka-leader-election` does.
//!
//! A move waits until the controller reports it done (the new replicas caught up and the old
//! ones left), with a progress line, unless `--no-wait`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use clap::Subcommand;
use kafka_protocol::messages::alter_partition_reassignments_request::{
    ReassignablePartition, ReassignableTopic,
};
use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
use kafka_protocol::messages::list_partition_reassignments_request::ListPartitionReassignmentsTopics;
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, BrokerId, ElectLeadersRequest,
    ListPartitionReassignmentsRequest,
};

use super::client::{check, describe_error, topic_name, Client, REQUEST_TIMEOUT_MS};
use super::Connection;

#[derive(clap::Args, Debug)]
pub struct ReassignArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: ReassignCommand,
}

#[derive(clap::Args, Debug, Clone)]
struct Wait {
    /// Return once the controller accepted the change, without waiting for it to finish.
    #[arg(long)]
    no_wait: bool,
    /// Give up waiting after this many seconds (the reassignment goes on).
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
}

#[derive(Subcommand, Debug)]
enum ReassignCommand {
    /// Give a partition new replicas, the preferred leader first: `--replicas 4,2,3`.
    Move {
        topic: String,
        #[arg(long)]
        partition: i32,
        #[arg(long, value_delimiter = ',', required = true)]
        replicas: Vec<i32>,
        #[command(flatten)]
        wait: Wait,
    },
    /// Move every replica off a broker, each to the broker with the fewest replicas that does
    /// not hold the partition yet (before taking the broker out of the cluster).
    Drain {
        #[arg(long)]
        broker: i32,
        #[command(flatten)]
        wait: Wait,
    },
    /// Show the reassignments in progress: replicas, adding and removing.
    List,
    /// Stop a partition's reassignment, going back to the replicas it had.
    Cancel {
        topic: String,
        #[arg(long)]
        partition: i32,
    },
}

#[derive(clap::Args, Debug)]
pub struct ElectLeadersArgs {
    #[command(flatten)]
    connection: Connection,
    /// Only this topic's partitions (every partition when not given).
    #[arg(long)]
    topic: Option<String>,
    /// Only this partition of `--topic`.
    #[arg(long, requires = "topic")]
    partition: Option<i32>,
    /// UNCLEAN: give leaderless partitions a replica that may lack acknowledged records.
    /// PREFERRED (the default) gives each partition back to its first replica.
    #[arg(long)]
    unclean: bool,
}

/// (topic, partition) → the target replicas.
type Targets = BTreeMap<(String, i32), Vec<i32>>;

pub fn run(args: &ReassignArgs) -> anyhow::Result<()> {
    let mut client = Client::bootstrap(&args.connection.bootstrap_server)?;
    match &args.command {
        ReassignCommand::Move {
            topic,
            partition,
            replicas,
            wait,
        } => {
            let targets = Targets::from([((topic.clone(), *partition), replicas.clone())]);
            execute(&mut client, &targets, wait)
        }
        ReassignCommand::Drain { broker, wait } => {
            let targets = drain_plan(&mut client, *broker)?;
            if targets.is_empty() {
                println!("Broker {broker} holds no replicas.");
                return Ok(());
            }
            for ((topic, partition), replicas) in &targets {
                println!("{topic}-{partition}: -> {}", join(replicas));
            }
            execute(&mut client, &targets, wait)
        }
        ReassignCommand::List => {
            let ongoing = list(&mut client, None)?;
            if ongoing.is_empty() {
                println!("No partition reassignments in progress.");
            }
            for o in ongoing {
                println!(
                    "{}-{}: replicas {} adding {} removing {}",
                    o.topic,
                    o.partition,
                    join(&o.replicas),
                    join(&o.adding),
                    join(&o.removing)
                );
            }
            Ok(())
        }
        ReassignCommand::Cancel { topic, partition } => {
            let targets = BTreeMap::from([((topic.clone(), *partition), None)]);
            alter(&mut client, &targets)?;
            println!("Cancelled the reassignment of {topic}-{partition}.");
            Ok(())
        }
    }
}

fn join(ids: &[i32]) -> String {
    let v: Vec<String> = ids.iter().map(i32::to_string).collect();
    format!("[{}]", v.join(","))
}

/// Where each replica on `broker` goes: the live broker with the fewest replicas that does not
/// hold that partition, counting the moves planned so far.
fn drain_plan(client: &mut Client, broker: i32) -> anyhow::Result<Targets> {
    let metadata = client.metadata(None, false)?;
    let mut load: BTreeMap<i32, usize> = metadata
        .brokers
        .iter()
        .map(|b| (b.node_id.0, 0))
        .filter(|(id, _)| *id != broker)
        .collect();
    let mut partitions = Vec::new();
    for t in &metadata.topics {
        let name = t.name.as_ref().map_or("", |n| n.0.as_str()).to_string();
        check(t.error_code, None, format!("topic {name:?}"))?;
        for p in &t.partitions {
            let replicas: Vec<i32> = p.replica_nodes.iter().map(|b| b.0).collect();
            for r in &replicas {
                if let Some(n) = load.get_mut(r) {
                    *n += 1;
                }
            }
            partitions.push(((name.clone(), p.partition_index), replicas));
        }
    }
    partitions.sort();
    let mut targets = Targets::new();
    for (key, replicas) in partitions {
        let Some(at) = replicas.iter().position(|r| *r == broker) else {
            continue;
        };
        let to = load
            .iter()
            .filter(|(id, _)| !replicas.contains(id))
            .min_by_key(|(id, n)| (**n, **id))
            .map(|(id, _)| *id)
            .ok_or_else(|| {
                anyhow!(
                    "no broker left to move {}-{} to: it is on every other broker already",
                    key.0,
                    key.1
                )
            })?;
        *load.get_mut(&to).expect("a live broker") += 1;
        let mut target = replicas.clone();
        target[at] = to;
        targets.insert(key, target);
    }
    Ok(targets)
}

/// Sends the reassignments (`None`: cancel) and fails on the first partition refused.
fn alter(
    client: &mut Client,
    targets: &BTreeMap<(String, i32), Option<Vec<i32>>>,
) -> anyhow::Result<()> {
    let mut topics: BTreeMap<&str, Vec<ReassignablePartition>> = BTreeMap::new();
    for ((topic, partition), replicas) in targets {
        topics.entry(topic).or_default().push(
            ReassignablePartition::default()
                .with_partition_index(*partition)
                .with_replicas(
                    replicas
                        .as_ref()
                        .map(|r| r.iter().copied().map(BrokerId).collect()),
                ),
        );
    }
    let request = AlterPartitionReassignmentsRequest::default()
        .with_timeout_ms(REQUEST_TIMEOUT_MS)
        .with_topics(
            topics
                .into_iter()
                .map(|(name, partitions)| {
                    ReassignableTopic::default()
                        .with_name(topic_name(name))
                        .with_partitions(partitions)
                })
                .collect(),
        );
    let (response, _) = client.send(&request)?;
    check(
        response.error_code,
        response.error_message.as_ref(),
        "AlterPartitionReassignments",
    )?;
    let mut refused = Vec::new();
    for t in &response.responses {
        for p in &t.partitions {
            if p.error_code != 0 {
                refused.push(describe_error(
                    p.error_code,
                    p.error_message.as_ref(),
                    format!("{}-{}", t.name.0.as_str(), p.partition_index),
                ));
            }
        }
    }
    if !refused.is_empty() {
        bail!("{}", refused.join("; "));
    }
    Ok(())
}

struct Ongoing {
    topic: String,
    partition: i32,
    replicas: Vec<i32>,
    adding: Vec<i32>,
    removing: Vec<i32>,
}

fn list(client: &mut Client, only: Option<&Targets>) -> anyhow::Result<Vec<Ongoing>> {
    let topics = only.map(|targets| {
        let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for (topic, partition) in targets.keys() {
            by_topic.entry(topic).or_default().push(*partition);
        }
        by_topic
            .into_iter()
            .map(|(name, partitions)| {
                ListPartitionReassignmentsTopics::default()
                    .with_name(topic_name(name))
                    .with_partition_indexes(partitions)
            })
            .collect()
    });
    let request = ListPartitionReassignmentsRequest::default()
        .with_timeout_ms(REQUEST_TIMEOUT_MS)
        .with_topics(topics);
    let (response, _) = client.send(&request)?;
    check(
        response.error_code,
        response.error_message.as_ref(),
        "ListPartitionReassignments",
    )?;
    let ids = |v: &[BrokerId]| v.iter().map(|b| b.0).collect::<Vec<_>>();
    let mut out = Vec::new();
    for t in &response.topics {
        for p in &t.partitions {
            out.push(Ongoing {
                topic: t.name.0.to_string(),
                partition: p.partition_index,
                replicas: ids(&p.replicas),
                adding: ids(&p.adding_replicas),
                removing: ids(&p.removing_replicas),
            });
        }
    }
    Ok(out)
}

fn execute(client: &mut Client, targets: &Targets, wait: &Wait) -> anyhow::Result<()> {
    let asked = targets
        .iter()
        .map(|(k, v)| (k.clone(), Some(v.clone())))
        .collect();
    alter(client, &asked)?;
    eprintln!(
        "Reassignment of {} accepted.",
        super::plural(targets.len() as u64, "partition")
    );
    if wait.no_wait {
        return Ok(());
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs(wait.timeout_secs);
    let mut last = usize::MAX;
    loop {
        let ongoing = list(client, Some(targets))?;
        if ongoing.is_empty() {
            break;
        }
        if ongoing.len() != last {
            eprintln!(
                "  {} of {} still moving ({} s)",
                ongoing.len(),
                targets.len(),
                started.elapsed().as_secs()
            );
            last = ongoing.len();
        }
        if Instant::now() >= deadline {
            bail!(
                "{} still moving after {} s (the reassignment goes on; `sluice reassign list` shows it)",
                super::plural(ongoing.len() as u64, "partition"),
                wait.timeout_secs
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // Done as the controller sees it: check the replica sets the brokers report.
    let names: Vec<&str> = {
        let mut v: Vec<&str> = targets.keys().map(|(t, _)| t.as_str()).collect();
        v.dedup();
        v
    };
    let metadata = client.metadata(Some(&names), false)?;
    for ((topic, partition), target) in targets {
        let replicas: Option<Vec<i32>> = metadata
            .topics
            .iter()
            .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
            .and_then(|t| {
                t.partitions
                    .iter()
                    .find(|p| p.partition_index == *partition)
            })
            .map(|p| p.replica_nodes.iter().map(|b| b.0).collect());
        match replicas {
            Some(r) if &r == target => {}
            // The broker asked may not have the final image yet; the controller has.
            other => eprintln!(
                "note: {topic}-{partition} reported with replicas {:?} (moved to {})",
                other,
                join(target)
            ),
        }
    }
    println!(
        "Reassignment of {} complete in {:.1} s.",
        super::plural(targets.len() as u64, "partition"),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `sluice elect-leaders`.
pub fn elect(args: &ElectLeadersArgs) -> anyhow::Result<()> {
    let mut client = Client::bootstrap(&args.connection.bootstrap_server)?;
    let partitions = match &args.topic {
        None => None,
        Some(topic) => {
            let ids = match args.partition {
                Some(p) => vec![p],
                None => {
                    let metadata = client.metadata(Some(&[topic.as_str()]), false)?;
                    let t = super::client::find_topic(&metadata, topic)?;
                    t.partitions.iter().map(|p| p.partition_index).collect()
                }
            };
            Some(vec![TopicPartitions::default()
                .with_topic(topic_name(topic))
                .with_partitions(ids)])
        }
    };
    let request = ElectLeadersRequest::default()
        .with_election_type(if args.unclean { 1 } else { 0 })
        .with_timeout_ms(REQUEST_TIMEOUT_MS)
        .with_topic_partitions(partitions);
    let (response, _) = client.send(&request)?;
    check(response.error_code, None, "ElectLeaders")?;
    let mut elected = 0;
    let mut failed = Vec::new();
    for t in &response.replica_election_results {
        for p in &t.partition_result {
            let name = format!("{}-{}", t.topic.0.as_str(), p.partition_id);
            match p.error_code {
                0 => {
                    elected += 1;
                    println!("Elected a leader for {name}.");
                }
                // ELECTION_NOT_NEEDED: the partition has the leader asked for.
                84 => println!("{name} has its leader already."),
                code => failed.push(describe_error(code, p.error_message.as_ref(), name)),
            }
        }
    }
    println!("Leaders elected: {elected}.");
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}
