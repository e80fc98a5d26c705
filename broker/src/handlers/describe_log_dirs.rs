//! DescribeLogDirs: every log directory (`log.dirs`), its volume's total and usable bytes, and
//! the size of every partition asked for (all of them when the topic list is null) under the
//! directory holding it. Sizes come from each partition's owner shard, one job per shard.
//!
//! Partitions that do not exist are left out, and so are topics with none left, as Kafka does;
//! a directory holding none of them is listed with no topics.

use std::collections::BTreeMap;
use std::rc::Rc;

use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::{DescribeLogDirsRequest, DescribeLogDirsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::shard::Shard;

pub async fn handle(shard: &Rc<Shard>, request: DescribeLogDirsRequest) -> DescribeLogDirsResponse {
    let image = shard.image();
    let shards = shard.shared.shards;
    // Each partition asked for that exists, in request order, with its owner.
    let mut wanted: Vec<(String, i32)> = Vec::new();
    match request.topics {
        None => {
            for t in image.topics.values() {
                wanted.extend((0..t.shards.len() as i32).map(|p| (t.name.clone(), p)));
            }
        }
        Some(topics) => {
            let mut seen = std::collections::HashSet::new();
            for t in topics {
                let name = t.topic.0.to_string();
                for p in t.partitions {
                    if image.owner(&name, p, shards).is_some() && seen.insert((name.clone(), p)) {
                        wanted.push((name.clone(), p));
                    }
                }
            }
        }
    }
    let mut by_owner: BTreeMap<usize, Vec<(String, i32)>> = BTreeMap::new();
    for (name, p) in &wanted {
        if let Some(owner) = image.owner(name, *p, shards) {
            by_owner.entry(owner).or_default().push((name.clone(), *p));
        }
    }
    // (log directory, size) of each, from its owner shard, and of the copy of one moving to
    // another log directory (Kafka's future replica: bytes copied, offsets still to copy).
    let mut found: BTreeMap<(String, i32), (usize, i64)> = BTreeMap::new();
    let mut futures: BTreeMap<(String, i32), (usize, i64, i64)> = BTreeMap::new();
    for (owner, partitions) in by_owner {
        let (sizes, moving) = shard
            .invoke_on(owner, move |shard| async move {
                let mut sizes = Vec::new();
                let mut moving = Vec::new();
                for (name, p) in partitions {
                    let Some(part) = shard.partition(&name, p) else {
                        continue;
                    };
                    let Some(dir) = shard.shared.log_dirs.of(part.log.dir()) else {
                        continue;
                    };
                    if let Some(m) = shard.moves.borrow().get(&(name.clone(), p)) {
                        let lag = (part.log.log_end_offset().0 - m.copied_end.get()).max(0);
                        moving.push((
                            (name.clone(), p),
                            (m.dest, m.copied_bytes.get() as i64, lag),
                        ));
                    }
                    sizes.push(((name, p), (dir, part.log.size_bytes() as i64)));
                }
                (sizes, moving)
            })
            .await;
        found.extend(sizes);
        futures.extend(moving);
    }
    let dirs = shard.shared.log_dirs.dirs();
    let mut topics: Vec<Vec<DescribeLogDirsTopic>> = vec![Vec::new(); dirs.len()];
    let mut topic_index: std::collections::HashMap<(usize, String), usize> = Default::default();
    let replicas = wanted.iter().flat_map(|(name, p)| {
        let key = (name.clone(), *p);
        let current = found.get(&key).map(|&(dir, size)| {
            let partition = DescribeLogDirsPartition::default()
                .with_partition_index(*p)
                .with_partition_size(size)
                // Kafka reports max(high watermark - log end, 0) for a current log: always 0.
                .with_offset_lag(0)
                .with_is_future_key(false);
            (dir, partition)
        });
        let future = futures.get(&key).map(|&(dir, size, lag)| {
            let partition = DescribeLogDirsPartition::default()
                .with_partition_index(*p)
                .with_partition_size(size)
                .with_offset_lag(lag)
                .with_is_future_key(true);
            (dir, partition)
        });
        current
            .into_iter()
            .chain(future)
            .map(move |r| (name.clone(), r))
    });
    for (name, (dir, partition)) in replicas.collect::<Vec<_>>() {
        let topics = &mut topics[dir];
        match topic_index.get(&(dir, name.clone())) {
            Some(&i) => topics[i].partitions.push(partition),
            None => {
                topic_index.insert((dir, name.clone()), topics.len());
                topics.push(
                    DescribeLogDirsTopic::default()
                        .with_name(TopicName(StrBytes::from_string(name)))
                        .with_partitions(vec![partition]),
                );
            }
        }
    }
    let mut response = DescribeLogDirsResponse::default();
    for (dir, topics) in dirs.iter().zip(topics) {
        let path = dir.path.to_string_lossy().into_owned();
        if dir.is_offline() {
            // As Kafka answers for an offline directory: the error, and nothing else.
            response.results.push(
                DescribeLogDirsResult::default()
                    .with_error_code(kafka_protocol::ResponseError::KafkaStorageError.code())
                    .with_log_dir(StrBytes::from_string(path))
                    .with_total_bytes(-1)
                    .with_usable_bytes(-1),
            );
            continue;
        }
        let (total_bytes, usable_bytes) = crate::metrics::volume_bytes(&path);
        response.results.push(
            DescribeLogDirsResult::default()
                .with_log_dir(StrBytes::from_string(path))
                .with_topics(topics)
                .with_total_bytes(total_bytes)
                .with_usable_bytes(usable_bytes),
        );
    }
    response
}

#[cfg(test)]
mod v5_tests {
    use super::*;
    use crate::codec::versions::encode_v5;
    use kafka_protocol::protocol::Encodable;

    /// v5 is v4 with one false byte after a directory's usable bytes: for a response of one
    /// directory, just before the last two bytes (the directory's and the response's tagged
    /// fields).
    #[test]
    fn v5_is_v4_with_is_cordoned() {
        let partitions = (0..130)
            .map(|i| {
                DescribeLogDirsPartition::default()
                    .with_partition_index(i)
                    .with_partition_size(1 << 40 | i as i64)
                    .with_offset_lag(0)
                    .with_is_future_key(i % 2 == 0)
            })
            .collect();
        let response = DescribeLogDirsResponse::default()
            .with_throttle_time_ms(7)
            .with_results(vec![DescribeLogDirsResult::default()
                .with_log_dir(StrBytes::from_static_str("/var/lib/sluice/data"))
                .with_topics(vec![
                    DescribeLogDirsTopic::default()
                        .with_name(TopicName(StrBytes::from_static_str("t-é")))
                        .with_partitions(partitions),
                    DescribeLogDirsTopic::default()
                        .with_name(TopicName(StrBytes::from_static_str("empty"))),
                ])
                .with_total_bytes(1 << 41)
                .with_usable_bytes(12345)]);
        let mut v4 = bytes::BytesMut::new();
        response.encode(&mut v4, 4).unwrap();
        let mut v5 = bytes::BytesMut::new();
        encode_v5(&response, &mut v5);
        let mut expected = v4.to_vec();
        expected.insert(expected.len() - 2, 0);
        assert_eq!(v5.to_vec(), expected);
    }
}
