//! A small blocking Kafka client for the operator subcommands: one `TcpStream` per broker, one
//! request in flight at a time, frames encoded and decoded with the `kafka-protocol` crate.
//!
//! Lifecycle: [`Client::connect`] opens a connection and sends ApiVersions first; every later
//! request uses the highest version both this client and the broker speak. [`Cluster`] adds
//! the brokers named in Metadata, so that produce and fetch go to each partition's leader.
//! Nothing here runs on a shard: the CLI never starts glommio.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse,
    RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use kafka_protocol::ResponseError;

/// How long to wait for a TCP connection to a broker.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for any response. Longer than every long-poll this client asks for
/// (`consume::FETCH_WAIT_MS`) and than the broker's request timeouts we send.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest response frame accepted. Fetch asks for at most `consume::FETCH_BYTES_MAX` plus
/// framing, so a larger size means a confused peer, not a big answer.
pub const RESPONSE_BYTES_MAX: usize = 256 << 20;
/// Timeout sent in CreateTopics, DeleteTopics and Produce requests.
pub const REQUEST_TIMEOUT_MS: i32 = 30_000;

const _: () = assert!((REQUEST_TIMEOUT_MS as u64) < RESPONSE_TIMEOUT.as_millis() as u64);

/// The versions of each API this client implements: (API, lowest, highest). The highest a
/// broker also supports is used. Lower bounds are where the fields this client relies on
/// appeared: record batches v2 (Produce 3, Fetch 4), Metadata without implicit topic creation
/// (4), `num_partitions = -1` in CreateTopics (4), all of a group's offsets with null topics
/// in OffsetFetch (2), group states in ListGroups (4 has them; earlier versions are shown
/// without). Fetch stays below 13, which names topics by id instead of by name; OffsetFetch
/// and OffsetCommit stay at 8, the last versions before KIP-848's member epochs.
pub const CLIENT_VERSIONS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::Metadata, 4, 12),
    (ApiKey::Produce, 3, 11),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 8),
    (ApiKey::CreateTopics, 4, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::DescribeGroups, 0, 5),
    // For KIP-848 groups, which DescribeGroups does not describe.
    (ApiKey::ConsumerGroupDescribe, 0, 1),
    // Share groups (KIP-932): members, and each partition's start offset.
    (ApiKey::ShareGroupDescribe, 1, 1),
    (ApiKey::DescribeShareGroupOffsets, 0, 0),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::OffsetFetch, 2, 8),
    (ApiKey::OffsetCommit, 2, 8),
    // `sluice reassign` and `sluice elect-leaders`.
    (ApiKey::AlterPartitionReassignments, 0, 1),
    (ApiKey::ListPartitionReassignments, 0, 0),
    (ApiKey::ElectLeaders, 0, 2),
    // `sluice cluster --bootstrap-controller`: the controller quorum.
    (ApiKey::DescribeQuorum, 0, 2),
    // `sluice transactions`. WriteTxnMarkers 1 is the version every Kafka 4 broker takes.
    (ApiKey::ListTransactions, 0, 2),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::WriteTxnMarkers, 1, 1),
];

/// Kafka's name for an error code, as in `org.apache.kafka.common.protocol.Errors`:
/// `UNKNOWN_TOPIC_OR_PARTITION`.
pub fn error_name(code: i16) -> String {
    match ResponseError::try_from_code(code) {
        None => "NONE".into(),
        Some(ResponseError::Unknown(c)) => format!("UNKNOWN_ERROR_CODE_{c}"),
        Some(e) => {
            // The crate names errors in CamelCase after Kafka's SCREAMING_SNAKE names.
            let camel = format!("{e}");
            let mut name = String::with_capacity(camel.len() + 8);
            for (i, c) in camel.chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    name.push('_');
                }
                name.push(c.to_ascii_uppercase());
            }
            name
        }
    }
}

/// Whether Kafka says a request failing with this code may succeed when retried.
pub fn is_retriable(code: i16) -> bool {
    ResponseError::try_from_code(code).is_some_and(|e| e.is_retriable())
}

/// Turns a Kafka error code into an error naming it: `{what}: UNKNOWN_TOPIC_OR_PARTITION (3):
/// {broker's message}`.
pub fn check(code: i16, message: Option<&StrBytes>, what: impl Display) -> anyhow::Result<()> {
    if code == 0 {
        return Ok(());
    }
    Err(anyhow!(describe_error(code, message, what)))
}

pub fn describe_error(code: i16, message: Option<&StrBytes>, what: impl Display) -> String {
    let mut text = format!("{what}: {} ({code})", error_name(code));
    if let Some(m) = message.filter(|m| !m.is_empty()) {
        text.push_str(": ");
        text.push_str(m.as_str());
    }
    text
}

pub fn api_name(key: i16) -> String {
    match ApiKey::try_from(key) {
        Ok(k) => format!("{k:?}"),
        Err(()) => format!("api key {key}"),
    }
}

pub fn str_bytes(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

pub fn topic_name(s: &str) -> TopicName {
    TopicName(str_bytes(s))
}

/// One connection to one broker.
pub struct Client {
    address: String,
    stream: TcpStream,
    correlation_id: i32,
    /// What the broker advertised in ApiVersions: API key → (lowest, highest).
    broker_versions: BTreeMap<i16, (i16, i16)>,
}

impl Client {
    /// Connects to `address` (`host:port`) and learns the broker's API versions.
    pub fn connect(address: &str) -> anyhow::Result<Client> {
        let addrs: Vec<_> = address
            .to_socket_addrs()
            .with_context(|| format!("cannot resolve broker address {address:?}"))?
            .collect();
        let mut last_error = None;
        let mut stream = None;
        for addr in &addrs {
            match TcpStream::connect_timeout(addr, CONNECT_TIMEOUT) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last_error = Some(e),
            }
        }
        let Some(stream) = stream else {
            return Err(match last_error {
                Some(e) => anyhow!("cannot connect to the broker at {address}: {e}"),
                None => anyhow!("broker address {address:?} resolves to no address"),
            });
        };
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(RESPONSE_TIMEOUT))?;
        stream.set_write_timeout(Some(RESPONSE_TIMEOUT))?;
        let mut client = Client {
            address: address.to_string(),
            stream,
            correlation_id: 0,
            broker_versions: BTreeMap::new(),
        };
        client.negotiate()?;
        Ok(client)
    }

    /// Connects to the first reachable broker of a comma-separated bootstrap list.
    pub fn bootstrap(servers: &str) -> anyhow::Result<Client> {
        let mut errors = Vec::new();
        for address in servers.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match Client::connect(address) {
                Ok(c) => return Ok(c),
                Err(e) => errors.push(format!("{e:#}")),
            }
        }
        if errors.is_empty() {
            bail!("--bootstrap-server names no broker");
        }
        bail!("{}", errors.join("; "))
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    /// The broker's advertised versions: API key → (lowest, highest).
    pub fn broker_versions(&self) -> &BTreeMap<i16, (i16, i16)> {
        &self.broker_versions
    }

    /// ApiVersions at the highest version this client knows; a broker that does not know that
    /// version answers with v0 and the error UNSUPPORTED_VERSION (KIP-511), and lists the
    /// versions it does know, so the client asks again with one of those.
    fn negotiate(&mut self) -> anyhow::Result<()> {
        let mut version = 3;
        for _ in 0..2 {
            let request = ApiVersionsRequest::default()
                .with_client_software_name(StrBytes::from_static_str("sluice-cli"))
                .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
            let body = self.round_trip(ApiKey::ApiVersions, &request, version)?;
            let response = decode_api_versions(body, version)?;
            self.broker_versions = response
                .api_keys
                .iter()
                .map(|k| (k.api_key, (k.min_version, k.max_version)))
                .collect();
            if response.error_code == ResponseError::UnsupportedVersion.code() && version > 0 {
                let broker_max = self
                    .broker_versions
                    .get(&(ApiKey::ApiVersions as i16))
                    .map(|&(_, max)| max)
                    .unwrap_or(0);
                version = broker_max.clamp(0, version - 1);
                continue;
            }
            return check(
                response.error_code,
                None,
                format!("ApiVersions v{version} to {}", self.address),
            );
        }
        bail!(
            "the broker at {} refused every ApiVersions version this client speaks",
            self.address
        )
    }

    /// The version to use for `key`: the highest both sides support, or `None`.
    pub fn version_of(&self, key: ApiKey) -> Option<i16> {
        let &(_, ours_min, ours_max) = CLIENT_VERSIONS.iter().find(|(k, _, _)| *k == key)?;
        let &(theirs_min, theirs_max) = self.broker_versions.get(&(key as i16))?;
        let crate_range = key.valid_versions();
        let min = ours_min.max(theirs_min).max(crate_range.min);
        let max = ours_max.min(theirs_max).min(crate_range.max);
        (min <= max).then_some(max)
    }

    pub fn supports(&self, key: ApiKey) -> bool {
        self.version_of(key).is_some()
    }

    /// Like [`Client::version_of`], but an error saying clearly what is missing.
    pub fn version(&self, key: ApiKey) -> anyhow::Result<i16> {
        if let Some(v) = self.version_of(key) {
            return Ok(v);
        }
        let ours = CLIENT_VERSIONS
            .iter()
            .find(|(k, _, _)| *k == key)
            .map(|&(_, min, max)| format!("{min} to {max}"))
            .unwrap_or_else(|| "none".into());
        match self.broker_versions.get(&(key as i16)) {
            None => bail!(
                "the broker at {} does not support {key:?} (it does not list the API in ApiVersions)",
                self.address
            ),
            Some(&(min, max)) => bail!(
                "the broker at {} does not support {key:?} at a version this client speaks \
                 (broker: {min} to {max}, client: {ours})",
                self.address
            ),
        }
    }

    /// Sends `request` at the negotiated version and waits for its response.
    pub fn send<R: Request>(&mut self, request: &R) -> anyhow::Result<(R::Response, i16)> {
        let key = api_key::<R>();
        let version = self.version(key)?;
        Ok((self.send_at(request, version)?, version))
    }

    /// Sends `request` at `version` and waits for its response.
    pub fn send_at<R: Request>(
        &mut self,
        request: &R,
        version: i16,
    ) -> anyhow::Result<R::Response> {
        let key = api_key::<R>();
        let mut body = self.round_trip(key, request, version)?;
        let response = R::Response::decode(&mut body, version).with_context(|| {
            format!(
                "decoding a {key:?} v{version} response from {}",
                self.address
            )
        })?;
        Ok(response)
    }

    /// Sends a request the broker does not answer (Produce with acks=0).
    pub fn send_without_response<R: Request>(
        &mut self,
        request: &R,
        version: i16,
    ) -> anyhow::Result<()> {
        let key = api_key::<R>();
        self.write_request(key, request, version)?;
        Ok(())
    }

    fn write_request<M: Encodable>(
        &mut self,
        key: ApiKey,
        request: &M,
        version: i16,
    ) -> anyhow::Result<i32> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let correlation_id = self.correlation_id;
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("sluice-cli")));
        let mut frame = BytesMut::with_capacity(256);
        frame.extend_from_slice(&[0; 4]);
        header
            .encode(&mut frame, key.request_header_version(version))
            .with_context(|| format!("encoding a {key:?} v{version} request header"))?;
        request
            .encode(&mut frame, version)
            .with_context(|| format!("encoding a {key:?} v{version} request"))?;
        let size = u32::try_from(frame.len() - 4).context("request frame too large")?;
        frame[..4].copy_from_slice(&size.to_be_bytes());
        self.stream
            .write_all(&frame)
            .with_context(|| format!("sending {key:?} to {}", self.address))?;
        Ok(correlation_id)
    }

    /// Writes one request and reads its response frame; returns the body after the header.
    fn round_trip<M: Encodable>(
        &mut self,
        key: ApiKey,
        request: &M,
        version: i16,
    ) -> anyhow::Result<Bytes> {
        let correlation_id = self.write_request(key, request, version)?;
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).map_err(|e| {
            let why = match e.kind() {
                std::io::ErrorKind::UnexpectedEof => {
                    "the broker closed the connection (it may not support this request)".to_string()
                }
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                    format!("no response within {}s", RESPONSE_TIMEOUT.as_secs())
                }
                _ => e.to_string(),
            };
            anyhow!("{key:?} v{version} to {}: {why}", self.address)
        })?;
        let size = i32::from_be_bytes(size);
        if size < 0 || size as usize > RESPONSE_BYTES_MAX {
            bail!(
                "{key:?} v{version} to {}: response frame of {size} bytes is out of bounds",
                self.address
            );
        }
        let mut body = vec![0u8; size as usize];
        self.stream
            .read_exact(&mut body)
            .with_context(|| format!("reading a {key:?} response from {}", self.address))?;
        let mut body = Bytes::from(body);
        let header = ResponseHeader::decode(&mut body, key.response_header_version(version))
            .with_context(|| format!("decoding a {key:?} response header"))?;
        if header.correlation_id != correlation_id {
            bail!(
                "{key:?} to {}: response for correlation id {} while waiting for {correlation_id}",
                self.address,
                header.correlation_id
            );
        }
        Ok(body)
    }

    /// Metadata for `topics` (all topics when `None`).
    pub fn metadata(
        &mut self,
        topics: Option<&[&str]>,
        allow_auto_topic_creation: bool,
    ) -> anyhow::Result<MetadataResponse> {
        let request = MetadataRequest::default()
            .with_topics(topics.map(|names| {
                names
                    .iter()
                    .map(|n| MetadataRequestTopic::default().with_name(Some(topic_name(n))))
                    .collect()
            }))
            .with_allow_auto_topic_creation(allow_auto_topic_creation);
        let (response, _) = self.send(&request)?;
        Ok(response)
    }
}

fn api_key<R: Request>() -> ApiKey {
    ApiKey::try_from(R::KEY).expect("every request type of the crate has a known API key")
}

/// Decodes an ApiVersions response, falling back to v0, the version a broker answers with when
/// it does not know the version asked for.
fn decode_api_versions(body: Bytes, version: i16) -> anyhow::Result<ApiVersionsResponse> {
    match ApiVersionsResponse::decode(&mut body.clone(), version) {
        Ok(r) => Ok(r),
        Err(first) => ApiVersionsResponse::decode(&mut body.clone(), 0)
            .ok()
            .filter(|r| r.error_code != 0)
            .ok_or_else(|| anyhow!("decoding an ApiVersions v{version} response: {first}")),
    }
}

/// Metadata of one topic from a response, or an error naming the Kafka error.
pub fn find_topic<'a>(
    response: &'a MetadataResponse,
    name: &str,
) -> anyhow::Result<&'a MetadataResponseTopic> {
    let topic = response
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == name))
        .ok_or_else(|| anyhow!("the broker's metadata does not mention topic {name:?}"))?;
    check(topic.error_code, None, format!("topic {name:?}"))?;
    Ok(topic)
}

/// Connections to the brokers of a cluster, opened when first needed, for requests that must
/// go to a partition's leader.
pub struct Cluster {
    /// The connection made to the bootstrap server, until it is known which broker it is.
    bootstrap: Option<Client>,
    /// Broker id → advertised `host:port`, from the latest Metadata.
    brokers: BTreeMap<i32, String>,
    connections: BTreeMap<i32, Client>,
}

impl Cluster {
    pub fn new(bootstrap: Client) -> Cluster {
        Cluster {
            bootstrap: Some(bootstrap),
            brokers: BTreeMap::new(),
            connections: BTreeMap::new(),
        }
    }

    /// Any connection, for Metadata and other requests any broker answers.
    pub fn any(&mut self) -> &mut Client {
        match self.bootstrap {
            Some(ref mut c) => c,
            None => self
                .connections
                .values_mut()
                .next()
                .expect("the bootstrap connection moves into `connections`, never away"),
        }
    }

    /// Metadata for `topics`, remembering the brokers it names.
    pub fn metadata(
        &mut self,
        topics: Option<&[&str]>,
        allow_auto_topic_creation: bool,
    ) -> anyhow::Result<MetadataResponse> {
        let response = self.any().metadata(topics, allow_auto_topic_creation)?;
        self.brokers = response
            .brokers
            .iter()
            .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
            .collect();
        Ok(response)
    }

    /// The connection to broker `id`, opening it if needed.
    pub fn broker(&mut self, id: i32) -> anyhow::Result<&mut Client> {
        if !self.connections.contains_key(&id) {
            let Some(address) = self.brokers.get(&id).cloned() else {
                bail!("broker {id} is not in the cluster's metadata");
            };
            // With one broker in the cluster, the bootstrap connection is that broker, even
            // when its advertised address differs from the one we were given.
            let client = match self.bootstrap.take() {
                Some(c) if self.brokers.len() == 1 || c.address() == address => c,
                other => {
                    self.bootstrap = other;
                    Client::connect(&address).with_context(|| {
                        format!("connecting to broker {id} at its advertised address {address}")
                    })?
                }
            };
            self.connections.insert(id, client);
        }
        Ok(self.connections.get_mut(&id).expect("inserted above"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_names_are_kafkas() {
        assert_eq!(error_name(3), "UNKNOWN_TOPIC_OR_PARTITION");
        assert_eq!(error_name(36), "TOPIC_ALREADY_EXISTS");
        assert_eq!(error_name(17), "INVALID_TOPIC_EXCEPTION");
        assert_eq!(error_name(-1), "UNKNOWN_SERVER_ERROR");
        assert_eq!(error_name(0), "NONE");
        assert_eq!(error_name(30_000), "UNKNOWN_ERROR_CODE_30000");
    }

    #[test]
    fn broker_errors_name_the_code_and_carry_the_message() {
        let e = check(36, Some(&str_bytes("topic already exists")), "topic \"a\"").unwrap_err();
        assert_eq!(
            e.to_string(),
            "topic \"a\": TOPIC_ALREADY_EXISTS (36): topic already exists"
        );
        assert!(check(0, None, "x").is_ok());
    }

    #[test]
    fn client_versions_are_within_what_the_crate_encodes() {
        for &(key, min, max) in CLIENT_VERSIONS {
            let range = key.valid_versions();
            assert!(min <= max, "{key:?}: {min} > {max}");
            assert!(
                range.min <= min && max <= range.max,
                "{key:?}: {min}..{max} vs {range}"
            );
        }
    }
}
