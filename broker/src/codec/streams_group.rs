//! StreamsGroupHeartbeat (API key 88) and StreamsGroupDescribe (89), KIP-1071's streams group
//! APIs, version 0 of each. The kafka-protocol crate has no codec for them, so their messages are
//! read and written here, field by field as Kafka 4.4's schemas lay them out (all flexible:
//! compact strings and arrays, tagged fields after every struct; a nullable struct is an int8,
//! -1 for null, 1 before its fields).

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::compact;

pub const STREAMS_GROUP_HEARTBEAT: i16 = 88;
pub const STREAMS_GROUP_DESCRIBE: i16 = 89;
/// The versions served: 0 of both (1 adds the KIP-1331 topology description).
pub const VERSION: i16 = 0;

/// A response frame: size, response header v1 (correlation id, no tagged fields), body.
pub fn frame(correlation_id: i32, body: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(9 + body.len());
    buf.put_u32((4 + 1 + body.len()) as u32);
    buf.put_i32(correlation_id);
    compact::no_tagged_fields(&mut buf);
    buf.put_slice(body);
    buf.freeze()
}

/// Reads a flexible message.
pub struct Reader {
    buf: Bytes,
}

impl Reader {
    pub fn new(buf: Bytes) -> Reader {
        Reader { buf }
    }

    fn need(&self, n: usize) -> anyhow::Result<()> {
        anyhow::ensure!(self.buf.remaining() >= n, "truncated request");
        Ok(())
    }

    pub fn i8(&mut self) -> anyhow::Result<i8> {
        self.need(1)?;
        Ok(self.buf.get_i8())
    }

    pub fn i16(&mut self) -> anyhow::Result<i16> {
        self.need(2)?;
        Ok(self.buf.get_i16())
    }

    pub fn u16(&mut self) -> anyhow::Result<u16> {
        self.need(2)?;
        Ok(self.buf.get_u16())
    }

    pub fn i32(&mut self) -> anyhow::Result<i32> {
        self.need(4)?;
        Ok(self.buf.get_i32())
    }

    pub fn i64(&mut self) -> anyhow::Result<i64> {
        self.need(8)?;
        Ok(self.buf.get_i64())
    }

    pub fn bool(&mut self) -> anyhow::Result<bool> {
        Ok(self.i8()? != 0)
    }

    fn uvarint(&mut self) -> anyhow::Result<u64> {
        compact::read_uvarint(&mut self.buf)
    }

    pub fn nullable_string(&mut self) -> anyhow::Result<Option<String>> {
        let Some(n) = self.uvarint()?.checked_sub(1) else {
            return Ok(None);
        };
        let n = n as usize;
        self.need(n)?;
        let bytes = self.buf.split_to(n);
        Ok(Some(String::from_utf8(bytes.to_vec())?))
    }

    pub fn string(&mut self) -> anyhow::Result<String> {
        self.nullable_string()?
            .ok_or_else(|| anyhow::anyhow!("null where a string is required"))
    }

    /// A compact nullable array, each element read by `item`. The claimed count is not trusted
    /// for an allocation: every element takes at least one byte.
    pub fn nullable_array<T>(
        &mut self,
        mut item: impl FnMut(&mut Reader) -> anyhow::Result<T>,
    ) -> anyhow::Result<Option<Vec<T>>> {
        let Some(n) = self.uvarint()?.checked_sub(1) else {
            return Ok(None);
        };
        anyhow::ensure!(
            n as usize <= self.buf.remaining(),
            "array of {n} elements in {} bytes",
            self.buf.remaining()
        );
        let mut out = Vec::with_capacity(n as usize);
        for _ in 0..n {
            out.push(item(self)?);
        }
        Ok(Some(out))
    }

    pub fn array<T>(
        &mut self,
        item: impl FnMut(&mut Reader) -> anyhow::Result<T>,
    ) -> anyhow::Result<Vec<T>> {
        self.nullable_array(item)?
            .ok_or_else(|| anyhow::anyhow!("null where an array is required"))
    }

    /// Whether a nullable struct follows (its int8 marker).
    pub fn present(&mut self) -> anyhow::Result<bool> {
        Ok(self.i8()? >= 0)
    }

    /// Skips a tagged-fields section (none are defined for these messages).
    pub fn tagged_fields(&mut self) -> anyhow::Result<()> {
        let count = self.uvarint()?;
        for _ in 0..count {
            self.uvarint()?;
            let size = self.uvarint()? as usize;
            self.need(size)?;
            self.buf.advance(size);
        }
        Ok(())
    }

    pub fn finish(mut self) -> anyhow::Result<()> {
        self.tagged_fields()?;
        anyhow::ensure!(!self.buf.has_remaining(), "bytes after the message");
        Ok(())
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: String,
}

/// An internal topic of a subtopology: a changelog or a repartition topic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicInfo {
    pub name: String,
    /// 0: not enforced (always 0 for changelogs: they have as many as the subtopology's tasks).
    pub partitions: i32,
    /// 0: the broker's default.
    pub replication_factor: i16,
    pub configs: Vec<KeyValue>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subtopology {
    pub id: String,
    pub source_topics: Vec<String>,
    pub source_topic_regex: Vec<String>,
    pub state_changelog_topics: Vec<TopicInfo>,
    pub repartition_sink_topics: Vec<String>,
    pub repartition_source_topics: Vec<TopicInfo>,
    /// Indexes into the source, regex and repartition source topics.
    pub copartition_groups: Vec<[Vec<i16>; 3]>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    pub epoch: i32,
    pub subtopologies: Vec<Subtopology>,
}

/// Tasks by subtopology: each subtopology's partitions.
pub type Tasks = Vec<(String, Vec<i32>)>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskOffset {
    pub subtopology: String,
    pub partition: i32,
    pub offset: i64,
}

/// The fields the coordinator does not use yet (the endpoint epoch, the member's standby and
/// warm-up tasks) are read to keep to the layout.
#[allow(dead_code)]
#[derive(Clone, Debug, Default)]
pub struct HeartbeatRequest {
    pub group_id: String,
    pub member_id: String,
    pub member_epoch: i32,
    pub endpoint_information_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub topology: Option<Topology>,
    pub active_tasks: Option<Tasks>,
    pub standby_tasks: Option<Tasks>,
    pub warmup_tasks: Option<Tasks>,
    pub process_id: Option<String>,
    pub user_endpoint: Option<Endpoint>,
    pub client_tags: Option<Vec<KeyValue>>,
    pub task_offsets: Option<Vec<TaskOffset>>,
    pub task_end_offsets: Option<Vec<TaskOffset>>,
    pub shutdown_application: bool,
}

fn key_value(r: &mut Reader) -> anyhow::Result<KeyValue> {
    let kv = KeyValue {
        key: r.string()?,
        value: r.string()?,
    };
    r.tagged_fields()?;
    Ok(kv)
}

fn topic_info(r: &mut Reader) -> anyhow::Result<TopicInfo> {
    let t = TopicInfo {
        name: r.string()?,
        partitions: r.i32()?,
        replication_factor: r.i16()?,
        configs: r.array(key_value)?,
    };
    r.tagged_fields()?;
    Ok(t)
}

fn tasks(r: &mut Reader) -> anyhow::Result<(String, Vec<i32>)> {
    let t = (r.string()?, r.array(|r| r.i32())?);
    r.tagged_fields()?;
    Ok(t)
}

fn task_offset(r: &mut Reader) -> anyhow::Result<TaskOffset> {
    let t = TaskOffset {
        subtopology: r.string()?,
        partition: r.i32()?,
        offset: r.i64()?,
    };
    r.tagged_fields()?;
    Ok(t)
}

fn subtopology(r: &mut Reader) -> anyhow::Result<Subtopology> {
    let s = Subtopology {
        id: r.string()?,
        source_topics: r.array(|r| r.string())?,
        source_topic_regex: r.array(|r| r.string())?,
        state_changelog_topics: r.array(topic_info)?,
        repartition_sink_topics: r.array(|r| r.string())?,
        repartition_source_topics: r.array(topic_info)?,
        copartition_groups: r.array(|r| {
            let g = [
                r.array(|r| r.i16())?,
                r.array(|r| r.i16())?,
                r.array(|r| r.i16())?,
            ];
            r.tagged_fields()?;
            Ok(g)
        })?,
    };
    r.tagged_fields()?;
    Ok(s)
}

impl HeartbeatRequest {
    pub fn decode(body: Bytes) -> anyhow::Result<HeartbeatRequest> {
        let mut r = Reader::new(body);
        let req = HeartbeatRequest {
            group_id: r.string()?,
            member_id: r.string()?,
            member_epoch: r.i32()?,
            endpoint_information_epoch: r.i32()?,
            instance_id: r.nullable_string()?,
            rack_id: r.nullable_string()?,
            rebalance_timeout_ms: r.i32()?,
            topology: if r.present()? {
                let t = Topology {
                    epoch: r.i32()?,
                    subtopologies: r.array(subtopology)?,
                };
                r.tagged_fields()?;
                Some(t)
            } else {
                None
            },
            active_tasks: r.nullable_array(tasks)?,
            standby_tasks: r.nullable_array(tasks)?,
            warmup_tasks: r.nullable_array(tasks)?,
            process_id: r.nullable_string()?,
            user_endpoint: if r.present()? {
                let e = Endpoint {
                    host: r.string()?,
                    port: r.u16()?,
                };
                r.tagged_fields()?;
                Some(e)
            } else {
                None
            },
            client_tags: r.nullable_array(key_value)?,
            task_offsets: r.nullable_array(task_offset)?,
            task_end_offsets: r.nullable_array(task_offset)?,
            shutdown_application: r.bool()?,
        };
        r.finish()?;
        Ok(req)
    }
}

/// A status the coordinator reports to the members (the response's `Status`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub code: i8,
    pub detail: String,
}

pub mod status {
    pub const STALE_TOPOLOGY: i8 = 0;
    pub const MISSING_SOURCE_TOPICS: i8 = 1;
    pub const INCORRECTLY_PARTITIONED_TOPICS: i8 = 2;
    pub const MISSING_INTERNAL_TOPICS: i8 = 3;
    pub const SHUTDOWN_APPLICATION: i8 = 4;
}

#[derive(Clone, Debug, Default)]
pub struct HeartbeatResponse {
    pub error_code: i16,
    pub error_message: Option<String>,
    pub member_id: String,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    pub acceptable_recovery_lag: i32,
    pub task_offset_interval_ms: i32,
    pub status: Option<Vec<Status>>,
    pub active_tasks: Option<Tasks>,
    pub standby_tasks: Option<Tasks>,
    pub warmup_tasks: Option<Tasks>,
    pub endpoint_information_epoch: i32,
    /// Each member's endpoint with the topic partitions of its active and standby tasks.
    pub partitions_by_user_endpoint: Option<Vec<EndpointPartitions>>,
}

#[derive(Clone, Debug)]
pub struct EndpointPartitions {
    pub endpoint: Endpoint,
    pub active: Vec<(String, Vec<i32>)>,
    pub standby: Vec<(String, Vec<i32>)>,
}

fn put_tasks(buf: &mut BytesMut, tasks: &[(String, Vec<i32>)]) {
    compact::len(buf, tasks.len());
    for (id, partitions) in tasks {
        compact::string(buf, id);
        compact::len(buf, partitions.len());
        for p in partitions {
            buf.put_i32(*p);
        }
        compact::no_tagged_fields(buf);
    }
}

fn put_nullable_tasks(buf: &mut BytesMut, tasks: Option<&Tasks>) {
    match tasks {
        Some(t) => put_tasks(buf, t),
        None => buf.put_u8(0),
    }
}

fn put_endpoint(buf: &mut BytesMut, e: &Endpoint) {
    compact::string(buf, &e.host);
    buf.put_u16(e.port);
    compact::no_tagged_fields(buf);
}

fn put_key_values(buf: &mut BytesMut, kvs: &[KeyValue]) {
    compact::len(buf, kvs.len());
    for kv in kvs {
        compact::string(buf, &kv.key);
        compact::string(buf, &kv.value);
        compact::no_tagged_fields(buf);
    }
}

fn put_topic_infos(buf: &mut BytesMut, topics: &[TopicInfo]) {
    compact::len(buf, topics.len());
    for t in topics {
        compact::string(buf, &t.name);
        buf.put_i32(t.partitions);
        buf.put_i16(t.replication_factor);
        put_key_values(buf, &t.configs);
        compact::no_tagged_fields(buf);
    }
}

fn put_strings(buf: &mut BytesMut, strings: &[String]) {
    compact::len(buf, strings.len());
    for s in strings {
        compact::string(buf, s);
    }
}

fn put_task_offsets(buf: &mut BytesMut, offsets: &[TaskOffset]) {
    compact::len(buf, offsets.len());
    for o in offsets {
        compact::string(buf, &o.subtopology);
        buf.put_i32(o.partition);
        buf.put_i64(o.offset);
        compact::no_tagged_fields(buf);
    }
}

impl HeartbeatResponse {
    pub fn encode(&self, buf: &mut BytesMut) {
        buf.put_i32(0); // throttle_time_ms
        buf.put_i16(self.error_code);
        compact::nullable_string(buf, self.error_message.as_deref());
        compact::string(buf, &self.member_id);
        buf.put_i32(self.member_epoch);
        buf.put_i32(self.heartbeat_interval_ms);
        buf.put_i32(self.acceptable_recovery_lag);
        buf.put_i32(self.task_offset_interval_ms);
        match &self.status {
            Some(status) => {
                compact::len(buf, status.len());
                for s in status {
                    buf.put_i8(s.code);
                    compact::string(buf, &s.detail);
                    compact::no_tagged_fields(buf);
                }
            }
            None => buf.put_u8(0),
        }
        put_nullable_tasks(buf, self.active_tasks.as_ref());
        put_nullable_tasks(buf, self.standby_tasks.as_ref());
        put_nullable_tasks(buf, self.warmup_tasks.as_ref());
        buf.put_i32(self.endpoint_information_epoch);
        match &self.partitions_by_user_endpoint {
            Some(list) => {
                compact::len(buf, list.len());
                for e in list {
                    put_endpoint(buf, &e.endpoint);
                    for side in [&e.active, &e.standby] {
                        compact::len(buf, side.len());
                        for (topic, partitions) in side {
                            compact::string(buf, topic);
                            compact::len(buf, partitions.len());
                            for p in partitions {
                                buf.put_i32(*p);
                            }
                            compact::no_tagged_fields(buf);
                        }
                    }
                    compact::no_tagged_fields(buf);
                }
            }
            None => buf.put_u8(0),
        }
        compact::no_tagged_fields(buf);
    }
}

#[derive(Clone, Debug)]
pub struct DescribeRequest {
    pub group_ids: Vec<String>,
    pub include_authorized_operations: bool,
}

impl DescribeRequest {
    pub fn decode(body: Bytes) -> anyhow::Result<DescribeRequest> {
        let mut r = Reader::new(body);
        let req = DescribeRequest {
            group_ids: r.array(|r| r.string())?,
            include_authorized_operations: r.bool()?,
        };
        r.finish()?;
        Ok(req)
    }
}

#[derive(Clone, Debug, Default)]
pub struct Assignment {
    pub active: Tasks,
    pub standby: Tasks,
    pub warmup: Tasks,
}

#[derive(Clone, Debug)]
pub struct DescribedMember {
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub topology_epoch: i32,
    pub process_id: String,
    pub user_endpoint: Option<Endpoint>,
    pub client_tags: Vec<KeyValue>,
    pub task_offsets: Vec<TaskOffset>,
    pub task_end_offsets: Vec<TaskOffset>,
    pub assignment: Assignment,
    pub target_assignment: Assignment,
}

#[derive(Clone, Debug, Default)]
pub struct DescribedGroup {
    pub error_code: i16,
    pub error_message: Option<String>,
    pub group_id: String,
    pub group_state: String,
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    pub topology: Option<Topology>,
    pub members: Vec<DescribedMember>,
    pub authorized_operations: i32,
}

fn put_assignment(buf: &mut BytesMut, a: &Assignment) {
    put_tasks(buf, &a.active);
    put_tasks(buf, &a.standby);
    put_tasks(buf, &a.warmup);
    compact::no_tagged_fields(buf);
}

pub fn encode_describe_response(groups: &[DescribedGroup], buf: &mut BytesMut) {
    buf.put_i32(0); // throttle_time_ms
    compact::len(buf, groups.len());
    for g in groups {
        buf.put_i16(g.error_code);
        compact::nullable_string(buf, g.error_message.as_deref());
        compact::string(buf, &g.group_id);
        compact::string(buf, &g.group_state);
        buf.put_i32(g.group_epoch);
        buf.put_i32(g.assignment_epoch);
        match &g.topology {
            Some(t) => {
                buf.put_i8(1);
                buf.put_i32(t.epoch);
                compact::len(buf, t.subtopologies.len());
                for s in &t.subtopologies {
                    compact::string(buf, &s.id);
                    put_strings(buf, &s.source_topics);
                    put_strings(buf, &s.repartition_sink_topics);
                    put_topic_infos(buf, &s.state_changelog_topics);
                    put_topic_infos(buf, &s.repartition_source_topics);
                    compact::no_tagged_fields(buf);
                }
                compact::no_tagged_fields(buf);
            }
            None => buf.put_i8(-1),
        }
        compact::len(buf, g.members.len());
        for m in &g.members {
            compact::string(buf, &m.member_id);
            buf.put_i32(m.member_epoch);
            compact::nullable_string(buf, m.instance_id.as_deref());
            compact::nullable_string(buf, m.rack_id.as_deref());
            compact::string(buf, &m.client_id);
            compact::string(buf, &m.client_host);
            buf.put_i32(m.topology_epoch);
            compact::string(buf, &m.process_id);
            match &m.user_endpoint {
                Some(e) => {
                    buf.put_i8(1);
                    put_endpoint(buf, e);
                }
                None => buf.put_i8(-1),
            }
            put_key_values(buf, &m.client_tags);
            put_task_offsets(buf, &m.task_offsets);
            put_task_offsets(buf, &m.task_end_offsets);
            put_assignment(buf, &m.assignment);
            put_assignment(buf, &m.target_assignment);
            buf.put_i8(0); // is_classic
            compact::no_tagged_fields(buf);
        }
        buf.put_i32(g.authorized_operations);
        compact::no_tagged_fields(buf);
    }
    compact::no_tagged_fields(buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A heartbeat as a Streams client sends it on joining, written by hand after Kafka's
    /// schema, reads back field by field.
    #[test]
    fn heartbeat_request_reads_back() {
        let mut b = BytesMut::new();
        compact::string(&mut b, "app");
        compact::string(&mut b, "m1");
        b.put_i32(0);
        b.put_i32(-1);
        compact::nullable_string(&mut b, None);
        compact::nullable_string(&mut b, Some("rack-a"));
        b.put_i32(30_000);
        b.put_i8(1); // topology
        b.put_i32(2);
        compact::len(&mut b, 1);
        compact::string(&mut b, "0");
        put_strings(&mut b, &["words".to_string()]);
        put_strings(&mut b, &[]);
        put_topic_infos(
            &mut b,
            &[TopicInfo {
                name: "app-store-changelog".into(),
                partitions: 0,
                replication_factor: 0,
                configs: vec![KeyValue {
                    key: "cleanup.policy".into(),
                    value: "compact".into(),
                }],
            }],
        );
        put_strings(&mut b, &["app-repartition".to_string()]);
        put_topic_infos(&mut b, &[]);
        compact::len(&mut b, 1);
        for v in [vec![0i16], vec![], vec![]] {
            compact::len(&mut b, v.len());
            for i in v {
                b.put_i16(i);
            }
        }
        compact::no_tagged_fields(&mut b);
        compact::no_tagged_fields(&mut b); // subtopology
        compact::no_tagged_fields(&mut b); // topology
        put_tasks(&mut b, &[("0".into(), vec![1, 2])]);
        b.put_u8(0); // standby: null
        put_tasks(&mut b, &[]);
        compact::nullable_string(&mut b, Some("p1"));
        b.put_i8(1);
        put_endpoint(
            &mut b,
            &Endpoint {
                host: "h".into(),
                port: 8080,
            },
        );
        b.put_u8(0);
        put_task_offsets(
            &mut b,
            &[TaskOffset {
                subtopology: "0".into(),
                partition: 1,
                offset: 7,
            }],
        );
        b.put_u8(0);
        b.put_i8(1);
        compact::no_tagged_fields(&mut b);
        let req = HeartbeatRequest::decode(b.freeze()).unwrap();
        assert_eq!(req.group_id, "app");
        assert_eq!(req.rack_id.as_deref(), Some("rack-a"));
        assert_eq!(req.rebalance_timeout_ms, 30_000);
        let t = req.topology.unwrap();
        assert_eq!(t.epoch, 2);
        assert_eq!(t.subtopologies[0].source_topics, ["words"]);
        assert_eq!(
            t.subtopologies[0].state_changelog_topics[0].configs[0].value,
            "compact"
        );
        assert_eq!(
            t.subtopologies[0].repartition_sink_topics,
            ["app-repartition"]
        );
        assert_eq!(
            t.subtopologies[0].copartition_groups,
            [[vec![0], vec![], vec![]]]
        );
        assert_eq!(req.active_tasks, Some(vec![("0".to_string(), vec![1, 2])]));
        assert_eq!(req.standby_tasks, None);
        assert_eq!(req.warmup_tasks, Some(vec![]));
        assert_eq!(req.user_endpoint.unwrap().port, 8080);
        assert_eq!(req.task_offsets.unwrap()[0].offset, 7);
        assert!(req.task_end_offsets.is_none());
        assert!(req.shutdown_application);
    }

    #[test]
    fn truncated_or_lying_requests_are_errors() {
        let mut b = BytesMut::new();
        compact::string(&mut b, "app");
        assert!(HeartbeatRequest::decode(b.clone().freeze()).is_err());
        // An array that claims a billion elements in a few bytes.
        let mut d = BytesMut::new();
        compact::uvarint(&mut d, 1_000_000_000);
        d.put_slice(&[1, 2, 3]);
        assert!(DescribeRequest::decode(d.freeze()).is_err());
    }
}
