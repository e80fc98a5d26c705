//! Prometheus metrics on an HTTP port (`metrics.listener`, e.g. `127.0.0.1:9644`), under the
//! names Kafka's metrics get from the Prometheus JMX exporter (`kafka_server_replicamanager_*`,
//! `kafka_controller_kafkacontroller_*`, `kafka_server_brokertopicmetrics_*`), and consumer lag
//! as kafka-exporter names it (`kafka_consumergroup_lag`).
//!
//! Nothing here takes a lock on the data path. Shards count events (ISR shrinks and
//! expansions, produced and fetched bytes) with relaxed atomic adds into [`Metrics`], and once a
//! second each shard stores its partition gauges (partitions, leaders, under-replicated,
//! under min ISR) into its own slot; shard 0 adds the controller's. The exporter is a thread
//! of its own: per scrape it reads the atomics and the consumer lag of the groups this broker
//! coordinates from the source `server.rs` gives it (today the broker asks itself over the
//! Kafka protocol, as any client would).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

/// A shard's partition gauges, stored by the shard once a second.
#[derive(Default, Debug)]
pub struct ShardGauges {
    pub partitions: AtomicI64,
    pub leaders: AtomicI64,
    /// Partitions it leads with fewer in-sync replicas than replicas.
    pub under_replicated: AtomicI64,
    /// Partitions it leads with fewer in-sync replicas than `min.insync.replicas`.
    pub under_min_isr: AtomicI64,
}

/// Every metric of this node, written by the shards, read by the exporter.
#[derive(Default, Debug)]
pub struct Metrics {
    pub shards: Vec<ShardGauges>,
    pub isr_shrinks: AtomicU64,
    pub isr_expands: AtomicU64,
    /// Records and bytes appended by produce requests.
    pub messages_in: AtomicU64,
    pub bytes_in: AtomicU64,
    /// Record bytes in fetch responses: to consumers, and to followers.
    pub bytes_out: AtomicU64,
    pub replication_bytes_out: AtomicU64,
    /// 1 on the active controller (shard 0 stores it).
    pub active_controller: AtomicI64,
    /// Partitions without a leader, as the active controller counts them (0 elsewhere).
    pub offline_partitions: AtomicI64,
    /// SASL logins that succeeded and that failed (a refused mechanism, a wrong password, an
    /// unknown user); TLS handshakes that failed count as failed too, as in Kafka.
    pub successful_authentication: AtomicU64,
    pub failed_authentication: AtomicU64,
    /// Re-authentications (KIP-368) that succeeded and that failed, and connections closed for
    /// a request after their session expired.
    pub successful_reauthentication: AtomicU64,
    pub failed_reauthentication: AtomicU64,
    pub expired_connections_killed: AtomicU64,
    /// Throttles by quota: (quota key, user, client id) to responses throttled and their
    /// throttle time in ms. Touched only when a client is throttled.
    pub throttles: std::sync::Mutex<Throttles>,
    /// The log directories (`log.dirs`) as (absolute path, directory id), set once at start:
    /// each scrape asks their volumes for total and usable bytes.
    pub log_dirs: std::sync::OnceLock<Vec<(String, String)>>,
    /// Log directories a storage error took offline.
    pub offline_log_dirs: AtomicI64,
}

/// (quota key, user, client id) to (responses throttled, throttle time in ms).
pub type Throttles = std::collections::BTreeMap<(&'static str, String, String), (u64, u64)>;

impl Metrics {
    pub fn new(shards: usize) -> Metrics {
        Metrics {
            shards: (0..shards).map(|_| ShardGauges::default()).collect(),
            ..Default::default()
        }
    }

    pub fn count(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn sum(&self, gauge: impl Fn(&ShardGauges) -> &AtomicI64) -> i64 {
        self.shards
            .iter()
            .map(|s| gauge(s).load(Ordering::Relaxed))
            .sum()
    }

    /// Counts a throttle of `ms` under the quota `key` for the client `user`, `client_id` (the
    /// quota entity's names; empty where the entity leaves one out).
    pub fn throttled(&self, key: &'static str, user: &str, client_id: &str, ms: u64) {
        let mut throttles = self.throttles.lock().unwrap_or_else(|e| e.into_inner());
        let entry = throttles
            .entry((key, user.to_string(), client_id.to_string()))
            .or_default();
        entry.0 += 1;
        entry.1 += ms;
    }

    /// The text exposition of every metric, with `lags` as (group, topic, partition, lag).
    pub fn render(&self, lags: &[(String, String, i32, i64)]) -> String {
        let mut registry = Registry::default();
        let gauge = |v: i64| ConstGauge::new(v);
        let counter = |a: &AtomicU64| ConstCounter::new(a.load(Ordering::Relaxed));
        registry.register(
            "kafka_server_replicamanager_partitioncount",
            "Partition replicas on this broker",
            gauge(self.sum(|s| &s.partitions)),
        );
        registry.register(
            "kafka_server_replicamanager_leadercount",
            "Partitions this broker leads",
            gauge(self.sum(|s| &s.leaders)),
        );
        registry.register(
            "kafka_server_replicamanager_underreplicatedpartitions",
            "Partitions this broker leads with fewer in-sync replicas than replicas",
            gauge(self.sum(|s| &s.under_replicated)),
        );
        registry.register(
            "kafka_server_replicamanager_underminisrpartitioncount",
            "Partitions this broker leads with fewer in-sync replicas than min.insync.replicas",
            gauge(self.sum(|s| &s.under_min_isr)),
        );
        registry.register(
            "kafka_server_replicamanager_isrshrinks",
            "ISR shrinks of partitions this broker leads",
            counter(&self.isr_shrinks),
        );
        registry.register(
            "kafka_server_replicamanager_isrexpands",
            "ISR expansions of partitions this broker leads",
            counter(&self.isr_expands),
        );
        registry.register(
            "kafka_server_brokertopicmetrics_messagesin",
            "Records appended by produce requests",
            counter(&self.messages_in),
        );
        registry.register(
            "kafka_server_brokertopicmetrics_bytesin",
            "Record bytes appended by produce requests",
            counter(&self.bytes_in),
        );
        registry.register(
            "kafka_server_brokertopicmetrics_bytesout",
            "Record bytes sent to consumers",
            counter(&self.bytes_out),
        );
        registry.register(
            "kafka_server_brokertopicmetrics_replicationbytesout",
            "Record bytes sent to follower replicas",
            counter(&self.replication_bytes_out),
        );
        registry.register(
            "kafka_controller_kafkacontroller_activecontrollercount",
            "1 on the active controller",
            gauge(self.active_controller.load(Ordering::Relaxed)),
        );
        registry.register(
            "kafka_controller_kafkacontroller_offlinepartitionscount",
            "Partitions without a leader (counted by the active controller)",
            gauge(self.offline_partitions.load(Ordering::Relaxed)),
        );
        registry.register(
            "kafka_server_socket_server_metrics_successful_authentication",
            "SASL logins that succeeded",
            counter(&self.successful_authentication),
        );
        registry.register(
            "kafka_server_socket_server_metrics_failed_authentication",
            "SASL logins and TLS handshakes that failed",
            counter(&self.failed_authentication),
        );
        registry.register(
            "kafka_server_socket_server_metrics_successful_reauthentication",
            "SASL re-authentications (KIP-368) that succeeded",
            counter(&self.successful_reauthentication),
        );
        registry.register(
            "kafka_server_socket_server_metrics_failed_reauthentication",
            "SASL re-authentications (KIP-368) that failed",
            counter(&self.failed_reauthentication),
        );
        registry.register(
            "kafka_server_socket_server_metrics_expired_connections_killed_count",
            "Connections closed because a request came after their SASL session expired",
            counter(&self.expired_connections_killed),
        );
        let lag = Family::<Vec<(String, String)>, Gauge>::default();
        let lag_sum = Family::<Vec<(String, String)>, Gauge>::default();
        for (group, topic, partition, l) in lags {
            let group = label_value(group);
            lag.get_or_create(&vec![
                ("consumergroup".to_string(), group.clone()),
                ("topic".to_string(), label_value(topic)),
                ("partition".to_string(), partition.to_string()),
            ])
            .set(*l);
            lag_sum
                .get_or_create(&vec![("consumergroup".to_string(), group)])
                .inc_by(*l);
        }
        registry.register(
            "kafka_consumergroup_lag",
            "Log end offset minus the committed offset, per partition of the groups this broker coordinates",
            lag,
        );
        registry.register(
            "kafka_consumergroup_lag_sum",
            "The lag of a group this broker coordinates, over its partitions",
            lag_sum,
        );
        // Kafka's quota sensor groups (Produce, Fetch, Request, ControllerMutation), with the
        // quota entity's user and client id.
        let throttles = self
            .throttles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for (key, group) in [
            ("producer_byte_rate", "produce"),
            ("consumer_byte_rate", "fetch"),
            ("request_percentage", "request"),
            ("controller_mutation_rate", "controllermutation"),
        ] {
            let count = Family::<Vec<(String, String)>, prometheus_client::metrics::counter::Counter>::default();
            let time = Family::<Vec<(String, String)>, prometheus_client::metrics::counter::Counter>::default();
            for ((_, user, client_id), (n, ms)) in
                throttles.iter().filter(|((k, _, _), _)| *k == key)
            {
                let labels = vec![
                    ("user".to_string(), label_value(user)),
                    ("client_id".to_string(), label_value(client_id)),
                ];
                count.get_or_create(&labels).inc_by(*n);
                time.get_or_create(&labels).inc_by(*ms);
            }
            registry.register(
                format!("kafka_server_{group}_throttled"),
                format!("Responses throttled by the {key} quota, per quota entity"),
                count,
            );
            registry.register(
                format!("kafka_server_{group}_throttle_time_ms"),
                format!("Throttle time given under the {key} quota (ms), per quota entity"),
                time,
            );
        }
        register_waits(&mut registry);
        self.register_log_dirs(&mut registry);
        let mut out = String::new();
        encode(&mut out, &registry).expect("encoding into a String cannot fail");
        out
    }
}

impl Metrics {
    /// Total and usable bytes of each log directory's volume (one statvfs each), by
    /// `log_dir` and `directory_id`.
    fn register_log_dirs(&self, registry: &mut Registry) {
        registry.register(
            "kafka_log_logmanager_offlinelogdirectorycount",
            "Log directories a storage error took offline",
            ConstGauge::new(self.offline_log_dirs.load(Ordering::Relaxed)),
        );
        let Some(dirs) = self.log_dirs.get() else {
            return;
        };
        let total = Family::<Vec<(String, String)>, Gauge>::default();
        let usable = Family::<Vec<(String, String)>, Gauge>::default();
        for (path, id) in dirs {
            let (t, u) = volume_bytes(path);
            let labels = vec![
                ("log_dir".to_string(), label_value(path)),
                ("directory_id".to_string(), id.clone()),
            ];
            total.get_or_create(&labels).set(t);
            usable.get_or_create(&labels).set(u);
        }
        registry.register(
            "sluice_log_dir_total_bytes",
            "Size of the volume holding each log directory (-1 when it cannot be asked)",
            total,
        );
        registry.register(
            "sluice_log_dir_usable_bytes",
            "Bytes still usable on the volume holding each log directory (-1 when it cannot be asked)",
            usable,
        );
    }
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
        tracing::warn!(path, error = %std::io::Error::last_os_error(), "statvfs of a log directory failed");
        return (-1, -1);
    }
    let block = stat.f_frsize as i64;
    (
        (stat.f_blocks as i64).saturating_mul(block),
        (stat.f_bavail as i64).saturating_mul(block),
    )
}

/// What the shards waited on (`sluice_engine::waits`), per cause: waits timed, the slow ones
/// (100 ms or more, each also logged), their total and the longest.
fn register_waits(registry: &mut Registry) {
    use prometheus_client::metrics::counter::Counter;
    use sluice_engine::waits::{tallies, Wait};
    use std::sync::atomic::AtomicU64 as Bits;
    let count = Family::<Vec<(String, String)>, Counter>::default();
    let slow = Family::<Vec<(String, String)>, Counter>::default();
    let seconds = Family::<Vec<(String, String)>, Counter<f64, Bits>>::default();
    let max = Family::<Vec<(String, String)>, Gauge<f64, Bits>>::default();
    for wait in Wait::ALL {
        let t = tallies(wait);
        let labels = vec![("cause".to_string(), wait.name().to_string())];
        count.get_or_create(&labels).inc_by(t.count);
        slow.get_or_create(&labels).inc_by(t.slow);
        seconds.get_or_create(&labels).inc_by(t.total.as_secs_f64());
        max.get_or_create(&labels).set(t.max.as_secs_f64());
    }
    registry.register(
        "sluice_shard_waits",
        "Waits a shard timed, by cause: fdatasync, a job queued for another shard, a controller round trip, the reactor probe's timer",
        count,
    );
    registry.register(
        "sluice_shard_slow_waits",
        "Of those, the ones of 100 ms or more (each is logged with its cause, at most once a second per cause)",
        slow,
    );
    registry.register(
        "sluice_shard_wait_seconds",
        "Time spent in those waits (for the reactor: how late its timer fired)",
        seconds,
    );
    registry.register(
        "sluice_shard_wait_max_seconds",
        "The longest of those waits since the broker started",
        max,
    );
}

/// A label value escaped as the exposition format wants it (backslash, double quote and
/// newline), which prometheus-client's text encoder leaves to the caller: a Kafka group id may
/// hold any of them.
fn label_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Consumer lag as (group, topic, partition, lag), read once per scrape.
pub type LagSource = Box<dyn Fn() -> anyhow::Result<Vec<(String, String, i32, i64)>> + Send>;

/// Serves `GET /metrics` on `listener` from a thread of its own until the process ends, with
/// the lag `lags` reads (`None` on a controller-only node).
pub fn serve(listener: &str, metrics: Arc<Metrics>, lags: Option<LagSource>) -> anyhow::Result<()> {
    let server = tiny_http::Server::http(listener)
        .map_err(|e| anyhow::anyhow!("cannot listen on {listener} (metrics): {e}"))?;
    tracing::info!(listener, "serving Prometheus metrics at /metrics");
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for request in server.incoming_requests() {
                let path = request.url().split('?').next().unwrap_or("").to_string();
                if request.method() != &tiny_http::Method::Get || path != "/metrics" {
                    let _ = request.respond(
                        tiny_http::Response::from_string("only GET /metrics is served here\n")
                            .with_status_code(404),
                    );
                    continue;
                }
                let lags = match &lags {
                    Some(read) => read().unwrap_or_else(|e| {
                        tracing::warn!(error = %format!("{e:#}"), "consumer lag for the metrics could not be read");
                        Vec::new()
                    }),
                    None => Vec::new(),
                };
                let body = metrics.render(&lags);
                let header = tiny_http::Header::from_bytes(
                    &b"Content-Type"[..],
                    &b"application/openmetrics-text; version=1.0.0; charset=utf-8"[..],
                )
                .expect("a valid header");
                let _ = request.respond(tiny_http::Response::from_string(body).with_header(header));
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_sums_the_shards_and_names_the_lag_labels() {
        let m = Metrics::new(2);
        m.shards[0].partitions.store(3, Ordering::Relaxed);
        m.shards[1].partitions.store(4, Ordering::Relaxed);
        m.shards[1].under_replicated.store(1, Ordering::Relaxed);
        Metrics::count(&m.isr_shrinks, 2);
        let text = m.render(&[
            ("g\"1".into(), "t".into(), 0, 5),
            ("g\"1".into(), "t".into(), 1, 7),
        ]);
        assert!(
            text.contains("kafka_server_replicamanager_partitioncount 7\n"),
            "{text}"
        );
        assert!(text.contains("kafka_server_replicamanager_underreplicatedpartitions 1\n"));
        assert!(text.contains("kafka_server_replicamanager_isrshrinks_total 2\n"));
        assert!(
            text.contains(
                "kafka_consumergroup_lag{consumergroup=\"g\\\"1\",topic=\"t\",partition=\"1\"} 7\n"
            ),
            "{text}"
        );
        assert!(text.contains("kafka_consumergroup_lag_sum{consumergroup=\"g\\\"1\"} 12\n"));
        assert!(text.ends_with("# EOF\n"));
    }
}
