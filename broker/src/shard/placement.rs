//! The reads of a coordinator's first load (`group/placement.rs`): every other
//! `__consumer_offsets` partition, from its leader, with Kafka's ListOffsets and Fetch, into
//! [`Strays`].

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, ListOffsetsRequest, RequestKind, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use sluice_engine::batch::BatchHeader;

use super::Shard;
use crate::group::offsets_topic::OFFSETS_TOPIC;
use crate::group::placement::{Commits, Strays};

/// The versions sent: the newest that name topics rather than ids.
const LIST_OFFSETS_VERSION: i16 = 7;
const FETCH_VERSION: i16 = 12;
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Between attempts while a partition to read has no leader or does not answer yet.
const RETRY: Duration = Duration::from_millis(100);

/// Reads every other offsets partition from its leader and returns the commits of the groups
/// that now belong to `index` and were placed there before; tried again while `still_leading`
/// holds and a partition has no leader or does not answer.
pub async fn read_strays(
    shard: &Rc<Shard>,
    index: i32,
    still_leading: &impl Fn() -> bool,
) -> Option<HashMap<String, Commits>> {
    let started = std::time::Instant::now();
    let mut warned = false;
    loop {
        if !still_leading() {
            return None;
        }
        match read_once(shard, index).await {
            Ok(groups) => return Some(groups),
            Err(why) => {
                // A new cluster's offsets partitions open together: a few tries are normal.
                if !warned && started.elapsed() > Duration::from_secs(10) {
                    tracing::warn!(partition = index, error = %why, "still waiting to read the other offsets partitions for groups placed there by an earlier release");
                    warned = true;
                } else {
                    tracing::debug!(partition = index, error = %why, "reading the other offsets partitions; trying again");
                }
                glommio::timer::sleep(RETRY).await;
            }
        }
    }
}

async fn read_once(shard: &Rc<Shard>, index: i32) -> Result<HashMap<String, Commits>, String> {
    let partitions = shard.config().offsets_topic_partitions;
    let mut by_leader: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    {
        let image = shard.image();
        for p in (0..partitions).filter(|&p| p != index) {
            let addr = image
                .leader_of(OFFSETS_TOPIC, p)
                .and_then(|(info, broker)| {
                    (info.leader >= 0)
                        .then_some(broker)
                        .flatten()
                        .filter(|b| !b.fenced)
                        .map(|b| b.address_on(shard.config().inter_broker_listener()))
                });
            let addr = addr.ok_or_else(|| format!("{OFFSETS_TOPIC}-{p} has no leader"))?;
            by_leader.entry(addr).or_default().push(p);
        }
    }
    let mut strays = Strays::new(index, partitions);
    for (addr, parts) in by_leader {
        read_from(&addr, &parts, &mut strays).await?;
    }
    Ok(strays.finish())
}

async fn call(
    addr: &str,
    key: ApiKey,
    version: i16,
    request: RequestKind,
) -> Result<ResponseKind, String> {
    let frame = crate::codec::encode_request(key, version, 1, &request)
        .map_err(|e| format!("encoding {key:?}: {e}"))?;
    let body = crate::peer::call(crate::peer::Route::InterBroker, addr, frame, CALL_TIMEOUT)
        .await
        .map_err(|e| format!("{key:?} to {addr}: {e}"))?;
    crate::codec::decode_response(key, version, body)
        .map_err(|e| format!("decoding {key:?} from {addr}: {e}"))
}

fn topic_name() -> TopicName {
    TopicName(StrBytes::from_static_str(OFFSETS_TOPIC))
}

/// Reads `parts` from their log start to their high watermark at `addr`, into `strays`.
async fn read_from(addr: &str, parts: &[i32], strays: &mut Strays) -> Result<(), String> {
    let request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(0)
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(topic_name())
            .with_partitions(
                parts
                    .iter()
                    .map(|&p| {
                        ListOffsetsPartition::default()
                            .with_partition_index(p)
                            .with_current_leader_epoch(-1)
                            .with_timestamp(-2)
                    })
                    .collect(),
            )]);
    let ResponseKind::ListOffsets(answer) = call(
        addr,
        ApiKey::ListOffsets,
        LIST_OFFSETS_VERSION,
        RequestKind::ListOffsets(request),
    )
    .await?
    else {
        return Err("ListOffsets answered with another response".into());
    };
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    for t in answer.topics {
        for p in t.partitions {
            if p.error_code != 0 {
                return Err(format!(
                    "ListOffsets of {OFFSETS_TOPIC}-{}: error {}",
                    p.partition_index, p.error_code
                ));
            }
            next.insert(p.partition_index, p.offset);
        }
    }
    if let Some(p) = parts.iter().find(|p| !next.contains_key(p)) {
        return Err(format!("ListOffsets left out {OFFSETS_TOPIC}-{p}"));
    }
    while !next.is_empty() {
        let request = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_min_bytes(1)
            .with_max_bytes(8 << 20)
            .with_isolation_level(0)
            .with_session_id(0)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(topic_name())
                .with_partitions(
                    next.iter()
                        .map(|(&p, &offset)| {
                            FetchPartition::default()
                                .with_partition(p)
                                .with_current_leader_epoch(-1)
                                .with_fetch_offset(offset)
                                .with_last_fetched_epoch(-1)
                                .with_log_start_offset(-1)
                                .with_partition_max_bytes(1 << 20)
                        })
                        .collect(),
                )]);
        let ResponseKind::Fetch(answer) = call(
            addr,
            ApiKey::Fetch,
            FETCH_VERSION,
            RequestKind::Fetch(request),
        )
        .await?
        else {
            return Err("Fetch answered with another response".into());
        };
        if answer.error_code != 0 {
            return Err(format!("Fetch: error {}", answer.error_code));
        }
        let mut progressed = false;
        for t in answer.responses {
            for pd in t.partitions {
                let p = pd.partition_index;
                let Some(&at) = next.get(&p) else { continue };
                if pd.error_code != 0 {
                    return Err(format!(
                        "Fetch of {OFFSETS_TOPIC}-{p}: error {}",
                        pd.error_code
                    ));
                }
                let mut position = at;
                for batch in super::replication::whole_batches(pd.records.unwrap_or_default()) {
                    let Ok(header) = BatchHeader::parse(&batch) else {
                        break;
                    };
                    let last = header.last_offset().0;
                    // A fetch from inside a batch returns the whole batch.
                    if last >= position {
                        strays.apply(p, &batch);
                        position = last + 1;
                    }
                }
                if position >= pd.high_watermark {
                    next.remove(&p);
                    progressed = true;
                } else if position > at {
                    next.insert(p, position);
                    progressed = true;
                }
            }
        }
        if !progressed {
            return Err(format!(
                "reading {OFFSETS_TOPIC} at {addr} made no progress"
            ));
        }
    }
    Ok(())
}
