//! `sluice transactions`: list, describe and abort transactions and find hanging ones, like
//! Kafka's `kafka-transactions.sh`, with the same subcommands, options and columns.
//!
//! ListTransactions goes to every broker (each answers for the transaction coordinators it
//! hosts); DescribeTransactions to the transactional id's coordinator, found with
//! FindCoordinator; DescribeProducers and WriteTxnMarkers to the partition's leader. `abort`
//! writes an abort marker for a producer's open transaction in one partition, as Kafka's
//! `Admin.abortTransaction` does: the producer id, epoch and coordinator epoch come from
//! DescribeProducers when the transaction is named by its start offset. `find-hanging` lists the
//! open transactions older than `--max-transaction-timeout` that their coordinator does not know
//! as ongoing in that partition: those hold the last stable offset back until aborted.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{anyhow, bail};
use clap::Subcommand;
use kafka_protocol::messages::describe_producers_request::TopicRequest;
use kafka_protocol::messages::describe_producers_response::ProducerState;
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::{
    ApiKey, DescribeProducersRequest, DescribeTransactionsRequest, FindCoordinatorRequest,
    ListTransactionsRequest, ProducerId, TransactionalId, WriteTxnMarkersRequest,
};
use kafka_protocol::ResponseError;

use super::client::{check, describe_error, str_bytes, topic_name, Client, Cluster};
use super::group::print_table;
use super::Connection;

/// FindCoordinator `key_type` of a transactional id.
const KEY_TYPE_TRANSACTION: i8 = 1;
/// Attempts while the coordinator moves or loads, and the pause between them.
const COORDINATOR_ATTEMPTS_MAX: u32 = 20;
const RETRY_MS: u64 = 250;
/// `find-hanging --max-transaction-timeout` default, in minutes: Kafka's
/// `transaction.max.timeout.ms` default (15 minutes). A transaction open longer than the
/// longest timeout a coordinator allows should have been aborted by it.
const MAX_TRANSACTION_TIMEOUT_MIN_DEFAULT: u64 = 15;

#[derive(clap::Args, Debug)]
pub struct TransactionsArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: TransactionsCommand,
}

#[derive(Subcommand, Debug)]
enum TransactionsCommand {
    /// List the transactions of every broker's coordinators (ListTransactions).
    List {
        /// Only transactions in this state, e.g. `Ongoing` (repeatable; Kafka's state names).
        #[arg(long = "state", value_name = "STATE")]
        states: Vec<String>,
        /// Only transactions of this producer id (repeatable).
        #[arg(long = "producer-id", value_name = "ID")]
        producer_ids: Vec<i64>,
        /// Only transactions running for longer than this many milliseconds.
        #[arg(long, value_name = "MS")]
        duration_filter: Option<i64>,
        /// Only transactional ids this regular expression matches entirely (RE2 syntax).
        #[arg(long, value_name = "REGEX")]
        transactional_id_pattern: Option<String>,
    },
    /// Show a transaction's state, producer, timeout, start time and partitions
    /// (DescribeTransactions at its coordinator).
    Describe {
        #[arg(long, value_name = "ID")]
        transactional_id: String,
    },
    /// Show the producers a partition remembers and their open transactions (DescribeProducers).
    DescribeProducers {
        #[arg(long)]
        topic: String,
        #[arg(long)]
        partition: i32,
        /// Ask this broker (a replica) instead of the partition's leader.
        #[arg(long, value_name = "ID")]
        broker_id: Option<i32>,
    },
    /// Abort a producer's open transaction in one partition by writing its abort marker
    /// (WriteTxnMarkers at the partition's leader).
    Abort(AbortArgs),
    /// List open transactions older than the longest transaction timeout that their
    /// coordinator does not know as ongoing in that partition.
    FindHanging {
        /// Every partition this broker leads.
        #[arg(
            long,
            value_name = "ID",
            required_unless_present = "topic",
            conflicts_with = "topic"
        )]
        broker_id: Option<i32>,
        /// The partitions of this topic.
        #[arg(long)]
        topic: Option<String>,
        /// Only this partition of --topic.
        #[arg(long, requires = "topic")]
        partition: Option<i32>,
        /// Transactions open longer than this many minutes are candidates.
        #[arg(long, value_name = "MINUTES", default_value_t = MAX_TRANSACTION_TIMEOUT_MIN_DEFAULT)]
        max_transaction_timeout: u64,
    },
}

#[derive(clap::Args, Debug)]
struct AbortArgs {
    #[arg(long)]
    topic: String,
    #[arg(long)]
    partition: i32,
    /// The first offset of the transaction to abort (its producer is found with
    /// DescribeProducers).
    #[arg(long, value_name = "OFFSET", required_unless_present = "producer_id", conflicts_with_all = ["producer_id", "producer_epoch", "coordinator_epoch"])]
    start_offset: Option<i64>,
    /// The producer whose transaction to abort, with --producer-epoch and --coordinator-epoch.
    #[arg(long, value_name = "ID", requires_all = ["producer_epoch", "coordinator_epoch"])]
    producer_id: Option<i64>,
    #[arg(long, value_name = "EPOCH")]
    producer_epoch: Option<i16>,
    #[arg(long, value_name = "EPOCH")]
    coordinator_epoch: Option<i32>,
}

pub fn run(args: &TransactionsArgs) -> anyhow::Result<()> {
    let client = Client::bootstrap(&args.connection.bootstrap_server)?;
    let mut cluster = Cluster::new(client);
    match &args.command {
        TransactionsCommand::List {
            states,
            producer_ids,
            duration_filter,
            transactional_id_pattern,
        } => {
            let filters = Filters {
                states: states.clone(),
                producer_ids: producer_ids.clone(),
                duration_filter_ms: duration_filter.unwrap_or(-1),
                pattern: transactional_id_pattern.clone(),
            };
            let rows = list(&mut cluster, &filters)?
                .into_iter()
                .map(|t| {
                    vec![
                        t.transactional_id,
                        t.coordinator.to_string(),
                        t.producer_id.to_string(),
                        t.state,
                    ]
                })
                .collect::<Vec<_>>();
            print_table(
                &[
                    "TransactionalId",
                    "Coordinator",
                    "ProducerId",
                    "TransactionState",
                ],
                &rows,
            );
            Ok(())
        }
        TransactionsCommand::Describe { transactional_id } => {
            describe(&mut cluster, transactional_id)
        }
        TransactionsCommand::DescribeProducers {
            topic,
            partition,
            broker_id,
        } => {
            let producers = describe_producers(&mut cluster, topic, *partition, *broker_id)?;
            let rows = producers
                .iter()
                .map(|p| {
                    vec![
                        p.producer_id.0.to_string(),
                        p.producer_epoch.to_string(),
                        p.coordinator_epoch.to_string(),
                        p.last_sequence.to_string(),
                        p.last_timestamp.to_string(),
                        optional(p.current_txn_start_offset),
                    ]
                })
                .collect::<Vec<_>>();
            print_table(
                &[
                    "ProducerId",
                    "ProducerEpoch",
                    "LatestCoordinatorEpoch",
                    "LastSequence",
                    "LastTimestamp",
                    "CurrentTransactionStartOffset",
                ],
                &rows,
            );
            Ok(())
        }
        TransactionsCommand::Abort(a) => abort(&mut cluster, a),
        TransactionsCommand::FindHanging {
            broker_id,
            topic,
            partition,
            max_transaction_timeout,
        } => find_hanging(
            &mut cluster,
            *broker_id,
            topic.as_deref(),
            *partition,
            Duration::from_secs(max_transaction_timeout.saturating_mul(60)),
        ),
    }
}

/// `None` for Kafka's "absent" (-1), as Kafka's tool prints an empty optional.
fn optional(value: i64) -> String {
    if value < 0 {
        "None".to_string()
    } else {
        value.to_string()
    }
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

struct Filters {
    states: Vec<String>,
    producer_ids: Vec<i64>,
    duration_filter_ms: i64,
    pattern: Option<String>,
}

struct Listed {
    transactional_id: String,
    coordinator: i32,
    producer_id: i64,
    state: String,
}

/// ListTransactions at every broker; each lists the transactions of its coordinators.
fn list(cluster: &mut Cluster, filters: &Filters) -> anyhow::Result<Vec<Listed>> {
    let metadata = cluster.metadata(Some(&[]), false)?;
    let mut brokers: Vec<i32> = metadata.brokers.iter().map(|b| b.node_id.0).collect();
    brokers.sort_unstable();
    let mut out = Vec::new();
    for id in brokers {
        let client = cluster.broker(id)?;
        let version = client.version(ApiKey::ListTransactions)?;
        let mut request = ListTransactionsRequest::default()
            .with_state_filters(filters.states.iter().map(|s| str_bytes(s)).collect())
            .with_producer_id_filters(
                filters
                    .producer_ids
                    .iter()
                    .map(|&p| ProducerId(p))
                    .collect(),
            );
        if filters.duration_filter_ms >= 0 {
            if version < 1 {
                bail!(
                    "broker {id} does not support --duration-filter (ListTransactions v{version})"
                );
            }
            request.duration_filter = filters.duration_filter_ms;
        }
        if let Some(pattern) = &filters.pattern {
            if version < 2 {
                bail!("broker {id} does not support --transactional-id-pattern (ListTransactions v{version})");
            }
            request.transactional_id_pattern = Some(str_bytes(pattern));
        }
        let response = client.send_at(&request, version)?;
        check(
            response.error_code,
            None,
            format!("ListTransactions at broker {id}"),
        )?;
        if !response.unknown_state_filters.is_empty() {
            let unknown: Vec<&str> = response
                .unknown_state_filters
                .iter()
                .map(|s| s.as_str())
                .collect();
            bail!("unknown transaction states: {}", unknown.join(", "));
        }
        for t in response.transaction_states {
            out.push(Listed {
                transactional_id: t.transactional_id.0.to_string(),
                coordinator: id,
                producer_id: t.producer_id.0,
                state: t.transaction_state.to_string(),
            });
        }
    }
    out.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
    Ok(out)
}

fn is_coordinator_error(code: i16) -> bool {
    [
        ResponseError::NotCoordinator,
        ResponseError::CoordinatorNotAvailable,
        ResponseError::CoordinatorLoadInProgress,
    ]
    .iter()
    .any(|e| e.code() == code)
}

/// The broker id of `transactional_id`'s coordinator (FindCoordinator), or its error code.
fn find_coordinator(
    cluster: &mut Cluster,
    transactional_id: &str,
) -> anyhow::Result<Result<i32, i16>> {
    let client = cluster.any();
    let version = client.version(ApiKey::FindCoordinator)?;
    if version < 1 {
        bail!("the broker's FindCoordinator (v0) cannot look up transaction coordinators");
    }
    let mut request = FindCoordinatorRequest::default().with_key_type(KEY_TYPE_TRANSACTION);
    if version >= 4 {
        request.coordinator_keys = vec![str_bytes(transactional_id)];
    } else {
        request.key = str_bytes(transactional_id);
    }
    let response = client.send_at(&request, version)?;
    let (code, node) = if version >= 4 {
        let c = response
            .coordinators
            .iter()
            .find(|c| c.key.as_str() == transactional_id)
            .ok_or_else(|| {
                anyhow!("the FindCoordinator response does not mention {transactional_id:?}")
            })?;
        (c.error_code, c.node_id.0)
    } else {
        (response.error_code, response.node_id.0)
    };
    Ok(if code == 0 { Ok(node) } else { Err(code) })
}

struct Described {
    coordinator: i32,
    producer_id: i64,
    producer_epoch: i16,
    state: String,
    timeout_ms: i32,
    start_time_ms: i64,
    partitions: BTreeSet<(String, i32)>,
}

/// DescribeTransactions at the coordinator, found again while it moves or loads. `Err` is the
/// error code the coordinator answered for the id.
fn describe_at_coordinator(
    cluster: &mut Cluster,
    transactional_id: &str,
) -> anyhow::Result<Result<Described, i16>> {
    cluster.metadata(Some(&[]), false)?;
    let mut attempt = 1;
    loop {
        let outcome = match find_coordinator(cluster, transactional_id)? {
            Err(code) => Err(code),
            Ok(node) => {
                let client = cluster.broker(node)?;
                let request = DescribeTransactionsRequest::default()
                    .with_transactional_ids(vec![TransactionalId(str_bytes(transactional_id))]);
                let (response, _) = client.send(&request)?;
                let t = response
                    .transaction_states
                    .into_iter()
                    .find(|t| t.transactional_id.0.as_str() == transactional_id)
                    .ok_or_else(|| anyhow!("the DescribeTransactions response does not mention {transactional_id:?}"))?;
                if t.error_code != 0 {
                    Err(t.error_code)
                } else {
                    Ok(Described {
                        coordinator: node,
                        producer_id: t.producer_id.0,
                        producer_epoch: t.producer_epoch,
                        state: t.transaction_state.to_string(),
                        timeout_ms: t.transaction_timeout_ms,
                        start_time_ms: t.transaction_start_time_ms,
                        partitions: t
                            .topics
                            .iter()
                            .flat_map(|topic| {
                                topic
                                    .partitions
                                    .iter()
                                    .map(|&p| (topic.topic.0.to_string(), p))
                            })
                            .collect(),
                    })
                }
            }
        };
        match outcome {
            Err(code) if is_coordinator_error(code) && attempt < COORDINATOR_ATTEMPTS_MAX => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(RETRY_MS));
                cluster.metadata(Some(&[]), false)?;
            }
            other => return Ok(other),
        }
    }
}

fn describe(cluster: &mut Cluster, transactional_id: &str) -> anyhow::Result<()> {
    let d = match describe_at_coordinator(cluster, transactional_id)? {
        Ok(d) => d,
        Err(code) => bail!(describe_error(
            code,
            None,
            format!("transactional id {transactional_id:?}")
        )),
    };
    let now = wall_ms();
    let (start, duration) = if d.start_time_ms < 0 {
        ("None".to_string(), "None".to_string())
    } else {
        (
            d.start_time_ms.to_string(),
            (now - d.start_time_ms).max(0).to_string(),
        )
    };
    let partitions: Vec<String> = d
        .partitions
        .iter()
        .map(|(t, p)| format!("{t}-{p}"))
        .collect();
    print_table(
        &[
            "CoordinatorId",
            "TransactionalId",
            "ProducerId",
            "ProducerEpoch",
            "TransactionState",
            "TransactionTimeoutMs",
            "CurrentTransactionStartTimeMs",
            "TransactionDurationMs",
            "TopicPartitions",
        ],
        &[vec![
            d.coordinator.to_string(),
            transactional_id.to_string(),
            d.producer_id.to_string(),
            d.producer_epoch.to_string(),
            d.state,
            d.timeout_ms.to_string(),
            start,
            duration,
            partitions.join(","),
        ]],
    );
    Ok(())
}

/// Partition → its leader's broker id, for `topics` (all topics when `None`).
fn leaders(
    cluster: &mut Cluster,
    topics: Option<&[&str]>,
) -> anyhow::Result<BTreeMap<(String, i32), i32>> {
    let metadata = cluster.metadata(topics, false)?;
    let mut out = BTreeMap::new();
    for t in &metadata.topics {
        let Some(name) = &t.name else { continue };
        if topics.is_some() {
            check(t.error_code, None, format!("topic {:?}", name.0.as_str()))?;
        } else if t.error_code != 0 || t.is_internal {
            continue;
        }
        for p in &t.partitions {
            out.insert((name.0.to_string(), p.partition_index), p.leader_id.0);
        }
    }
    Ok(out)
}

/// DescribeProducers for `partitions` at `broker`: partition → its producers.
fn producers_at(
    cluster: &mut Cluster,
    broker: i32,
    partitions: &[(String, i32)],
) -> anyhow::Result<BTreeMap<(String, i32), Vec<ProducerState>>> {
    let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (t, p) in partitions {
        by_topic.entry(t).or_default().push(*p);
    }
    let request = DescribeProducersRequest::default().with_topics(
        by_topic
            .iter()
            .map(|(t, ps)| {
                TopicRequest::default()
                    .with_name(topic_name(t))
                    .with_partition_indexes(ps.clone())
            })
            .collect(),
    );
    let (response, _) = cluster.broker(broker)?.send(&request)?;
    let mut out = BTreeMap::new();
    for t in response.topics {
        for p in t.partitions {
            let what = format!("{}-{}", t.name.0.as_str(), p.partition_index);
            check(p.error_code, p.error_message.as_ref(), &what)?;
            out.insert(
                (t.name.0.to_string(), p.partition_index),
                p.active_producers,
            );
        }
    }
    Ok(out)
}

fn describe_producers(
    cluster: &mut Cluster,
    topic: &str,
    partition: i32,
    broker_id: Option<i32>,
) -> anyhow::Result<Vec<ProducerState>> {
    let leaders = leaders(cluster, Some(&[topic]))?;
    let tp = (topic.to_string(), partition);
    let broker = match broker_id {
        Some(b) => b,
        None => match leaders.get(&tp) {
            None => bail!("topic {topic:?} has no partition {partition}"),
            Some(&l) if l < 0 => bail!("{topic}-{partition} has no leader"),
            Some(&l) => l,
        },
    };
    let mut found = producers_at(cluster, broker, std::slice::from_ref(&tp))?;
    Ok(found.remove(&tp).unwrap_or_default())
}

fn abort(cluster: &mut Cluster, a: &AbortArgs) -> anyhow::Result<()> {
    let (producer_id, producer_epoch, coordinator_epoch) = match a.start_offset {
        Some(start) => {
            let producers = describe_producers(cluster, &a.topic, a.partition, None)?;
            let p = producers
                .iter()
                .find(|p| p.current_txn_start_offset == start)
                .ok_or_else(|| {
                    anyhow!(
                        "no open transaction starts at offset {start} in {}-{}",
                        a.topic,
                        a.partition
                    )
                })?;
            let producer_epoch = i16::try_from(p.producer_epoch)
                .map_err(|_| anyhow!("producer epoch {} out of range", p.producer_epoch))?;
            // An unknown coordinator epoch (-1) is sent as 0, as Kafka's tool does.
            (p.producer_id.0, producer_epoch, p.coordinator_epoch.max(0))
        }
        None => (
            a.producer_id.expect("clap requires it"),
            a.producer_epoch.expect("clap requires it"),
            a.coordinator_epoch.expect("clap requires it"),
        ),
    };
    let leaders = leaders(cluster, Some(&[a.topic.as_str()]))?;
    let leader = match leaders.get(&(a.topic.clone(), a.partition)) {
        None => bail!("topic {:?} has no partition {}", a.topic, a.partition),
        Some(&l) if l < 0 => bail!("{}-{} has no leader", a.topic, a.partition),
        Some(&l) => l,
    };
    let request =
        WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
            .with_producer_id(ProducerId(producer_id))
            .with_producer_epoch(producer_epoch)
            .with_transaction_result(false)
            .with_coordinator_epoch(coordinator_epoch)
            .with_topics(vec![WritableTxnMarkerTopic::default()
                .with_name(topic_name(&a.topic))
                .with_partition_indexes(vec![a.partition])])]);
    let (response, _) = cluster.broker(leader)?.send(&request)?;
    let code = response
        .markers
        .first()
        .and_then(|m| m.topics.first())
        .and_then(|t| t.partitions.first())
        .map(|p| p.error_code)
        .ok_or_else(|| anyhow!("the WriteTxnMarkers response names no partition"))?;
    check(
        code,
        None,
        format!("aborting in {}-{}", a.topic, a.partition),
    )?;
    eprintln!(
        "aborted the open transaction of producer {producer_id} (epoch {producer_epoch}) in {}-{}",
        a.topic, a.partition
    );
    Ok(())
}

/// An open transaction in one partition, as its leader's DescribeProducers shows it.
struct OpenTxn {
    tp: (String, i32),
    producer: ProducerState,
}

fn find_hanging(
    cluster: &mut Cluster,
    broker_id: Option<i32>,
    topic: Option<&str>,
    partition: Option<i32>,
    max_transaction_timeout: Duration,
) -> anyhow::Result<()> {
    let leaders = match topic {
        Some(t) => leaders(cluster, Some(&[t]))?,
        None => leaders(cluster, None)?,
    };
    let mut by_leader: BTreeMap<i32, Vec<(String, i32)>> = BTreeMap::new();
    for (tp, &leader) in &leaders {
        if partition.is_some_and(|p| p != tp.1) || broker_id.is_some_and(|b| b != leader) {
            continue;
        }
        if leader < 0 {
            eprintln!("note: {}-{} has no leader; skipped", tp.0, tp.1);
            continue;
        }
        by_leader.entry(leader).or_default().push(tp.clone());
    }
    if let (Some(t), Some(p)) = (topic, partition) {
        if !leaders.contains_key(&(t.to_string(), p)) {
            bail!("topic {t:?} has no partition {p}");
        }
    }
    // Candidates: transactions open longer than the longest timeout a coordinator allows.
    let now = wall_ms();
    let max_ms = max_transaction_timeout.as_millis() as i64;
    let mut candidates = Vec::new();
    for (leader, tps) in by_leader {
        for (tp, producers) in producers_at(cluster, leader, &tps)? {
            for producer in producers {
                if producer.current_txn_start_offset >= 0 && now - producer.last_timestamp > max_ms
                {
                    candidates.push(OpenTxn {
                        tp: tp.clone(),
                        producer,
                    });
                }
            }
        }
    }
    // Which transactional id each candidate's producer id belongs to, if any coordinator knows.
    let mut hanging = Vec::new();
    if !candidates.is_empty() {
        let producer_ids: Vec<i64> = candidates
            .iter()
            .map(|c| c.producer.producer_id.0)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let filters = Filters {
            states: Vec::new(),
            producer_ids,
            duration_filter_ms: -1,
            pattern: None,
        };
        let ids: BTreeMap<i64, String> = list(cluster, &filters)?
            .into_iter()
            .map(|t| (t.producer_id, t.transactional_id))
            .collect();
        let mut descriptions: BTreeMap<String, Option<Described>> = BTreeMap::new();
        for c in candidates {
            let Some(id) = ids.get(&c.producer.producer_id.0) else {
                hanging.push(c);
                continue;
            };
            if !descriptions.contains_key(id) {
                let d = describe_at_coordinator(cluster, id)?.ok();
                descriptions.insert(id.clone(), d);
            }
            let known = descriptions[id].as_ref().is_some_and(|d| {
                d.producer_id == c.producer.producer_id.0
                    && matches!(
                        d.state.as_str(),
                        "Ongoing" | "PrepareCommit" | "PrepareAbort"
                    )
                    && d.partitions.contains(&c.tp)
            });
            if !known {
                hanging.push(c);
            }
        }
    }
    let rows: Vec<Vec<String>> = hanging
        .iter()
        .map(|h| {
            let p = &h.producer;
            vec![
                h.tp.0.clone(),
                h.tp.1.to_string(),
                p.producer_id.0.to_string(),
                p.producer_epoch.to_string(),
                p.coordinator_epoch.to_string(),
                p.current_txn_start_offset.to_string(),
                p.last_timestamp.to_string(),
                ((now - p.last_timestamp) / 60_000).to_string(),
            ]
        })
        .collect();
    print_table(
        &[
            "Topic",
            "Partition",
            "ProducerId",
            "ProducerEpoch",
            "CoordinatorEpoch",
            "StartOffset",
            "LastTimestamp",
            "Duration(min)",
        ],
        &rows,
    );
    Ok(())
}
