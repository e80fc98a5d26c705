//! `sluice topic`: create, list, describe and delete topics, and change their configs, with
//! CreateTopics, Metadata, DescribeConfigs, DeleteTopics and IncrementalAlterConfigs. Output
//! follows `kafka-topics.sh`.

use anyhow::{anyhow, bail};
use clap::Subcommand;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreateTopicsRequest, DeleteTopicsRequest, DescribeConfigsRequest,
    IncrementalAlterConfigsRequest,
};

use super::client::{check, find_topic, str_bytes, topic_name, Client, REQUEST_TIMEOUT_MS};
use super::{parse_key_value, Connection};

/// `ConfigResource.Type.TOPIC` in DescribeConfigs and IncrementalAlterConfigs.
const RESOURCE_TYPE_TOPIC: i8 = 2;
/// `ConfigSource.DYNAMIC_TOPIC_CONFIG`: a topic-level override, what `describe` shows.
const CONFIG_SOURCE_DYNAMIC_TOPIC: i8 = 1;
/// IncrementalAlterConfigs operations (`AlterConfigOp.OpType`).
const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;

#[derive(clap::Args, Debug)]
pub struct TopicArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: TopicCommand,
}

#[derive(Subcommand, Debug)]
enum TopicCommand {
    /// Create a topic (CreateTopics).
    Create {
        /// Topic name: ASCII letters, digits, '.', '_' and '-'.
        name: String,
        /// Number of partitions; the broker's `num.partitions` when not given.
        #[arg(long)]
        partitions: Option<i32>,
        /// Replicas of each partition; the broker's default when not given.
        #[arg(long)]
        replication_factor: Option<i16>,
        /// A topic config override, e.g. `--config cleanup.policy=compact` (repeatable).
        #[arg(long = "config", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        configs: Vec<(String, String)>,
        /// Succeed without a change when the topic already exists.
        #[arg(long)]
        if_not_exists: bool,
    },
    /// List topic names (Metadata).
    List {
        /// Leave out internal topics such as `__consumer_offsets`.
        #[arg(long)]
        exclude_internal: bool,
    },
    /// Show partitions, leaders, replicas, ISR and config overrides (Metadata, DescribeConfigs).
    Describe {
        /// Topic to describe; every topic when not given.
        name: Option<String>,
    },
    /// Delete a topic and its data (DeleteTopics).
    Delete { name: String },
    /// Set or remove topic config overrides (IncrementalAlterConfigs).
    AlterConfig {
        name: String,
        /// Set an override, e.g. `--set retention.ms=3600000` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        set: Vec<(String, String)>,
        /// Remove an override, returning to the broker default (repeatable).
        #[arg(long = "delete", value_name = "KEY")]
        delete: Vec<String>,
    },
}

pub fn run(args: &TopicArgs) -> anyhow::Result<()> {
    let mut client = Client::bootstrap(&args.connection.bootstrap_server)?;
    match &args.command {
        TopicCommand::Create {
            name,
            partitions,
            replication_factor,
            configs,
            if_not_exists,
        } => create(
            &mut client,
            name,
            *partitions,
            *replication_factor,
            configs,
            *if_not_exists,
        ),
        TopicCommand::List { exclude_internal } => list(&mut client, *exclude_internal),
        TopicCommand::Describe { name } => describe(&mut client, name.as_deref()),
        TopicCommand::Delete { name } => delete(&mut client, name),
        TopicCommand::AlterConfig { name, set, delete } => {
            alter_config(&mut client, name, set, delete)
        }
    }
}

fn create(
    client: &mut Client,
    name: &str,
    partitions: Option<i32>,
    replication_factor: Option<i16>,
    configs: &[(String, String)],
    if_not_exists: bool,
) -> anyhow::Result<()> {
    let version = client.version(ApiKey::CreateTopics)?;
    let topic = CreatableTopic::default()
        .with_name(topic_name(name))
        .with_num_partitions(partitions.unwrap_or(-1))
        .with_replication_factor(replication_factor.unwrap_or(-1))
        .with_configs(
            configs
                .iter()
                .map(|(k, v)| {
                    CreatableTopicConfig::default()
                        .with_name(str_bytes(k))
                        .with_value(Some(str_bytes(v)))
                })
                .collect(),
        );
    let request = CreateTopicsRequest::default()
        .with_topics(vec![topic])
        .with_timeout_ms(REQUEST_TIMEOUT_MS);
    let response = client.send_at(&request, version)?;
    let result = response
        .topics
        .iter()
        .find(|t| t.name.0.as_str() == name)
        .ok_or_else(|| anyhow!("the CreateTopics response does not mention topic {name:?}"))?;
    if if_not_exists
        && result.error_code == kafka_protocol::ResponseError::TopicAlreadyExists.code()
    {
        println!("Topic {name} already exists.");
        return Ok(());
    }
    check(
        result.error_code,
        result.error_message.as_ref(),
        format!("creating topic {name:?}"),
    )?;
    if version >= 5 {
        println!(
            "Created topic {name} with {} partitions and replication factor {}.",
            result.num_partitions, result.replication_factor
        );
    } else {
        println!("Created topic {name}.");
    }
    Ok(())
}

/// Kafka's internal topics (`org.apache.kafka.common.internals.Topic`), for brokers that do not
/// flag them `is_internal` in Metadata.
const INTERNAL_TOPICS: &[&str] = &["__consumer_offsets", "__transaction_state"];

fn list(client: &mut Client, exclude_internal: bool) -> anyhow::Result<()> {
    let response = client.metadata(None, false)?;
    let mut names: Vec<&str> = response
        .topics
        .iter()
        .filter(|t| !exclude_internal || !t.is_internal)
        .filter_map(|t| t.name.as_ref().map(|n| n.0.as_str()))
        .filter(|n| !exclude_internal || !INTERNAL_TOPICS.contains(n))
        .collect();
    names.sort_unstable();
    for name in names {
        println!("{name}");
    }
    Ok(())
}

fn describe(client: &mut Client, name: Option<&str>) -> anyhow::Result<()> {
    let response = match name {
        Some(n) => client.metadata(Some(&[n]), false)?,
        None => client.metadata(None, false)?,
    };
    let mut topics: Vec<&MetadataResponseTopic> = match name {
        Some(n) => vec![find_topic(&response, n)?],
        None => response.topics.iter().collect(),
    };
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    let configs_supported = client.supports(ApiKey::DescribeConfigs);
    if !configs_supported {
        eprintln!(
            "note: the broker at {} does not support DescribeConfigs; topic configs are not shown",
            client.address()
        );
    }
    for topic in topics {
        let name = topic.name.as_ref().map(|n| n.0.as_str()).unwrap_or("");
        check(topic.error_code, None, format!("topic {name:?}"))?;
        let mut partitions: Vec<_> = topic.partitions.iter().collect();
        partitions.sort_by_key(|p| p.partition_index);
        let replication_factor = partitions
            .iter()
            .map(|p| p.replica_nodes.len())
            .max()
            .unwrap_or(0);
        let mut line = format!("Topic: {name}");
        if !topic.topic_id.is_nil() {
            line.push_str(&format!("\tTopicId: {}", topic.topic_id));
        }
        line.push_str(&format!(
            "\tPartitionCount: {}\tReplicationFactor: {replication_factor}",
            partitions.len()
        ));
        if configs_supported {
            let overrides = topic_overrides(client, name)?;
            let shown: Vec<String> = overrides.iter().map(|(k, v)| format!("{k}={v}")).collect();
            line.push_str(&format!("\tConfigs: {}", shown.join(",")));
        }
        println!("{line}");
        for p in partitions {
            let leader = if p.leader_id.0 < 0 {
                "none".to_string()
            } else {
                p.leader_id.0.to_string()
            };
            let mut line = format!(
                "\tTopic: {name}\tPartition: {}\tLeader: {leader}\tReplicas: {}\tIsr: {}",
                p.partition_index,
                ids(&p.replica_nodes),
                ids(&p.isr_nodes)
            );
            if !p.offline_replicas.is_empty() {
                line.push_str(&format!("\tOffline: {}", ids(&p.offline_replicas)));
            }
            if p.error_code != 0 {
                line.push_str(&format!(
                    "\tError: {}",
                    super::client::error_name(p.error_code)
                ));
            }
            println!("{line}");
        }
    }
    Ok(())
}

fn ids(nodes: &[BrokerId]) -> String {
    let ids: Vec<String> = nodes.iter().map(|b| b.0.to_string()).collect();
    ids.join(",")
}

/// The topic's config overrides (not the broker defaults), sorted by name.
fn topic_overrides(client: &mut Client, name: &str) -> anyhow::Result<Vec<(String, String)>> {
    let request =
        DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(RESOURCE_TYPE_TOPIC)
            .with_resource_name(str_bytes(name))
            .with_configuration_keys(None)]);
    let (response, _) = client.send(&request)?;
    let result = response
        .results
        .iter()
        .find(|r| r.resource_name.as_str() == name)
        .ok_or_else(|| anyhow!("the DescribeConfigs response does not mention topic {name:?}"))?;
    check(
        result.error_code,
        result.error_message.as_ref(),
        format!("describing the configs of topic {name:?}"),
    )?;
    let mut overrides: Vec<(String, String)> = result
        .configs
        .iter()
        .filter(|c| c.config_source == CONFIG_SOURCE_DYNAMIC_TOPIC)
        .map(|c| {
            let value = if c.is_sensitive {
                "(sensitive)".to_string()
            } else {
                c.value
                    .as_ref()
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "null".into())
            };
            (c.name.to_string(), value)
        })
        .collect();
    overrides.sort();
    Ok(overrides)
}

fn delete(client: &mut Client, name: &str) -> anyhow::Result<()> {
    let version = client.version(ApiKey::DeleteTopics)?;
    let mut request = DeleteTopicsRequest::default().with_timeout_ms(REQUEST_TIMEOUT_MS);
    if version >= 6 {
        request.topics = vec![DeleteTopicState::default().with_name(Some(topic_name(name)))];
    } else {
        request.topic_names = vec![topic_name(name)];
    }
    let response = client.send_at(&request, version)?;
    let result = match response.responses.as_slice() {
        [only] => only,
        _ => response
            .responses
            .iter()
            .find(|r| r.name.as_ref().is_some_and(|n| n.0.as_str() == name))
            .ok_or_else(|| anyhow!("the DeleteTopics response does not mention topic {name:?}"))?,
    };
    check(
        result.error_code,
        result.error_message.as_ref(),
        format!("deleting topic {name:?}"),
    )?;
    println!("Deleted topic {name}.");
    Ok(())
}

fn alter_config(
    client: &mut Client,
    name: &str,
    set: &[(String, String)],
    delete: &[String],
) -> anyhow::Result<()> {
    if set.is_empty() && delete.is_empty() {
        bail!("nothing to change: give --set KEY=VALUE or --delete KEY");
    }
    if let Some(key) = delete.iter().find(|k| set.iter().any(|(s, _)| s == *k)) {
        bail!("{key} is both set and deleted");
    }
    let version = client.version(ApiKey::IncrementalAlterConfigs)?;
    let mut configs: Vec<AlterableConfig> = set
        .iter()
        .map(|(k, v)| {
            AlterableConfig::default()
                .with_name(str_bytes(k))
                .with_config_operation(OP_SET)
                .with_value(Some(str_bytes(v)))
        })
        .collect();
    configs.extend(delete.iter().map(|k| {
        AlterableConfig::default()
            .with_name(str_bytes(k))
            .with_config_operation(OP_DELETE)
            .with_value(None)
    }));
    let request = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(RESOURCE_TYPE_TOPIC)
            .with_resource_name(str_bytes(name))
            .with_configs(configs),
    ]);
    let response = client.send_at(&request, version)?;
    let result = response
        .responses
        .iter()
        .find(|r| r.resource_name.as_str() == name)
        .ok_or_else(|| {
            anyhow!("the IncrementalAlterConfigs response does not mention topic {name:?}")
        })?;
    check(
        result.error_code,
        result.error_message.as_ref(),
        format!("altering the configs of topic {name:?}"),
    )?;
    let mut changes: Vec<String> = set.iter().map(|(k, v)| format!("set {k}={v}")).collect();
    changes.extend(delete.iter().map(|k| format!("deleted {k}")));
    println!("Updated topic {name}: {}.", changes.join(", "));
    Ok(())
}
