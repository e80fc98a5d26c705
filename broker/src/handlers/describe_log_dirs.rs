//! DescribeLogDirs: the one log directory (`log.dirs`), its volume's total and usable bytes,
//! and the size of every partition asked for (all of them when the topic list is null). Sizes
//! come from each partition's owner shard, one job per shard.
//!
//! Partitions that do not exist are left out, and so are topics with none left, as Kafka does.

use std::collections::BTreeMap;
use std::rc::Rc;

use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::{DescribeLogDirsRequest, DescribeLogDirsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::shard::Shard;

/// The log directory as Kafka names it: absolute (not resolved through symlinks).
pub fn log_dir(shard: &Shard) -> String {
    let dir = &shard.config().data_dir;
    std::path::absolute(dir)
        .unwrap_or_else(|_| dir.clone())
        .to_string_lossy()
        .into_owned()
}

/// (total, usable) bytes of the volume holding `path`, as Kafka's `FileStore` reports them:
/// usable is what an unprivileged writer may still use. -1 each if the volume cannot be asked.
/// One statvfs call: it reads the file system's superblock counters and does no I/O.
pub fn volume_bytes(path: &str) -> (i64, i64) {
    let Ok(c_path) = std::ffi::CString::new(path) else {
        return (-1, -1);
    };
    // SAFETY: statvfs is plain old data, for which all zero bytes is a valid value.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a NUL-terminated string and `stat` a valid, writable statvfs.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    if rc != 0 {
        tracing::warn!(path, error = %std::io::Error::last_os_error(), "statvfs of the log directory failed");
        return (-1, -1);
    }
    let block = stat.f_frsize as i64;
    (
        (stat.f_blocks as i64).saturating_mul(block),
        (stat.f_bavail as i64).saturating_mul(block),
    )
}

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
    let mut sizes: BTreeMap<(String, i32), i64> = BTreeMap::new();
    for (owner, partitions) in by_owner {
        let found = shard
            .invoke_on(owner, move |shard| async move {
                partitions
                    .into_iter()
                    .filter_map(|(name, p)| {
                        let part = shard.partition(&name, p)?;
                        Some(((name, p), part.log.size_bytes() as i64))
                    })
                    .collect::<Vec<_>>()
            })
            .await;
        sizes.extend(found);
    }
    let mut topics: Vec<DescribeLogDirsTopic> = Vec::new();
    let mut topic_index: std::collections::HashMap<String, usize> = Default::default();
    for (name, p) in wanted {
        let Some(&size) = sizes.get(&(name.clone(), p)) else {
            continue;
        };
        let partition = DescribeLogDirsPartition::default()
            .with_partition_index(p)
            .with_partition_size(size)
            // Kafka reports max(high watermark - log end, 0) for a current log: always 0.
            .with_offset_lag(0)
            .with_is_future_key(false);
        match topic_index.get(&name) {
            Some(&i) => topics[i].partitions.push(partition),
            None => {
                topic_index.insert(name.clone(), topics.len());
                topics.push(
                    DescribeLogDirsTopic::default()
                        .with_name(TopicName(StrBytes::from_string(name)))
                        .with_partitions(vec![partition]),
                );
            }
        }
    }
    let dir = log_dir(shard);
    let (total_bytes, usable_bytes) = volume_bytes(&dir);
    let mut response = DescribeLogDirsResponse::default();
    response.results.push(
        DescribeLogDirsResult::default()
            .with_log_dir(StrBytes::from_string(dir))
            .with_topics(topics)
            .with_total_bytes(total_bytes)
            .with_usable_bytes(usable_bytes),
    );
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
