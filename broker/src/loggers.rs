//! Broker loggers (Kafka's `BROKER_LOGGER` config resource, type 8): `kafka-configs
//! --entity-type broker-loggers` reads and changes log levels while the broker runs.
//!
//! Sluice logs through `tracing`; a Kafka logger name here is a tracing target written with dots,
//! as Kafka's logger names are and as `kafka-configs` requires (`root`, a crate or module path
//! such as `sluice_broker.cluster` for `sluice_broker::cluster`, or `sluice.fetch` for the
//! `sluice::fetch` target), and a level is Kafka's
//! (`TRACE`, `DEBUG`, `INFO`, `WARN`, `ERROR`, `FATAL`, which tracing logs as `ERROR`). The
//! levels are process-wide, like the log itself: one filter for every shard's thread, replaced
//! through `tracing-subscriber`'s reload handle. Nothing here is on the data path; the state
//! sits behind a mutex taken only by these admin requests.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use kafka_protocol::messages::describe_configs_response::DescribeConfigsResourceResult;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use tracing_subscriber::EnvFilter;

/// DescribeConfigs resource type of broker loggers.
pub const RESOURCE_BROKER_LOGGER: i8 = 8;
/// DescribeConfigs `config_source` of a logger's level (Kafka's DYNAMIC_BROKER_LOGGER_CONFIG).
const SOURCE_DYNAMIC_BROKER_LOGGER_CONFIG: i8 = 6;
/// The root logger: every target without a level of its own.
pub const ROOT: &str = "root";
/// Kafka's levels, as it lists them in its error message.
const LEVELS: [&str; 6] = ["DEBUG", "ERROR", "FATAL", "INFO", "TRACE", "WARN"];

/// The loggers Sluice has: the root, its crates, the broker's modules, and its own targets.
/// Any module below one of them is a logger too. Written with dots (`target_of` gives the tracing
/// target).
const LOGGERS: &[&str] = &[
    ROOT,
    "sluice.fetch",
    "sluice_broker",
    "sluice_broker.cli",
    "sluice_broker.cluster",
    "sluice_broker.group",
    "sluice_broker.handlers",
    "sluice_broker.net",
    "sluice_broker.server",
    "sluice_broker.shard",
    "sluice_broker.txn",
    "sluice_engine",
    "sluice_engine.log",
    "sluice_engine.segment",
    "sluice_replication",
];

/// The filter's reload handle, set once at start (`install`).
type Handle = tracing_subscriber::reload::Handle<
    EnvFilter,
    tracing_subscriber::fmt::Formatter<
        tracing_subscriber::fmt::format::DefaultFields,
        tracing_subscriber::fmt::format::Format,
        fn() -> std::io::Stderr,
    >,
>;

struct State {
    handle: Handle,
    /// The root level the process started with (`RUST_LOG`'s, else INFO), and the directives
    /// `RUST_LOG` gave beside it.
    base_root: String,
    base_directives: Vec<String>,
    /// Levels set at run time, by logger (`root` included).
    set: BTreeMap<String, String>,
}

static STATE: OnceLock<Mutex<State>> = OnceLock::new();

/// Installs the process's log subscriber: `RUST_LOG` (default `info`) to stderr, with levels
/// that broker-logger requests can change.
pub fn install() {
    let spec = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
    let filter = EnvFilter::try_new(&spec).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr as fn() -> std::io::Stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter_reloading();
    let handle = builder.reload_handle();
    builder.init();
    let mut base_root = "info".to_string();
    let mut base_directives = Vec::new();
    for d in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if d.contains('=') {
            base_directives.push(d.to_string());
        } else {
            base_root = d.to_string();
        }
    }
    let _ = STATE.set(Mutex::new(State {
        handle,
        base_root,
        base_directives,
        set: BTreeMap::new(),
    }));
}

/// Kafka's level name of a tracing level directive (`info` → `INFO`; `off` → `OFF`).
fn kafka_level(level: &str) -> String {
    level.to_ascii_uppercase()
}

/// A Kafka level as a tracing directive level.
fn tracing_level(level: &str) -> &'static str {
    match level {
        "TRACE" => "trace",
        "DEBUG" => "debug",
        "INFO" => "info",
        "WARN" => "warn",
        _ => "error",
    }
}

fn known(logger: &str) -> bool {
    LOGGERS
        .iter()
        .any(|l| *l == logger || (*l != ROOT && logger.starts_with(&format!("{l}."))))
}

/// The tracing target of a logger (`sluice_broker.cluster` → `sluice_broker::cluster`).
fn target_of(logger: &str) -> String {
    logger.replace('.', "::")
}

/// The logger of a tracing target; the inverse of [`target_of`].
fn logger_of(target: &str) -> String {
    target.replace("::", ".")
}

/// The level in force for `logger`: its own, else its nearest parent's, else the root's.
fn effective(state: &State, logger: &str) -> String {
    if let Some(level) = state.set.get(logger) {
        return level.clone();
    }
    if logger != ROOT {
        let mut best: Option<(usize, String)> = None;
        for (target, level) in state.set.iter().map(|(t, l)| (t.clone(), l.clone())).chain(
            state
                .base_directives
                .iter()
                .filter_map(|d| d.split_once('='))
                .map(|(t, l)| (logger_of(t), kafka_level(l))),
        ) {
            if target != ROOT
                && (logger == target || logger.starts_with(&format!("{target}.")))
                && best.as_ref().is_none_or(|(len, _)| target.len() > *len)
            {
                best = Some((target.len(), level));
            }
        }
        if let Some((_, level)) = best {
            return level;
        }
    }
    state
        .set
        .get(ROOT)
        .cloned()
        .unwrap_or_else(|| kafka_level(&state.base_root))
}

/// DescribeConfigs of this broker's loggers: every logger Sluice has (or those asked for that
/// exist), with the level in force.
pub fn describe(keys: Option<&[StrBytes]>) -> Vec<DescribeConfigsResourceResult> {
    let Some(state) = STATE.get() else {
        return Vec::new();
    };
    let state = state.lock().expect("logger state");
    let mut names: Vec<String> = LOGGERS.iter().map(|l| l.to_string()).collect();
    names.extend(
        state
            .set
            .keys()
            .filter(|k| !LOGGERS.contains(&k.as_str()))
            .cloned(),
    );
    names.sort();
    names.dedup();
    if let Some(keys) = keys {
        names.retain(|n| keys.iter().any(|k| k.as_str() == n));
    }
    names
        .into_iter()
        .map(|name| {
            let level = effective(&state, &name);
            DescribeConfigsResourceResult::default()
                .with_name(StrBytes::from_string(name))
                .with_value(Some(StrBytes::from_string(level)))
                .with_read_only(false)
                .with_config_source(SOURCE_DYNAMIC_BROKER_LOGGER_CONFIG)
                .with_is_sensitive(false)
                .with_config_type(0)
                .with_documentation(Some(StrBytes::from_static_str("")))
        })
        .collect()
}

/// One change of IncrementalAlterConfigs on broker loggers: the config name, the operation
/// (0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT) and the value.
pub struct Change<'a> {
    pub name: &'a str,
    pub operation: i8,
    pub value: Option<&'a str>,
}

/// Checks and (unless `validate_only`) applies a resource's changes, all or none, as Kafka's
/// broker does: the error code and message of the resource.
pub fn alter(changes: &[Change<'_>], validate_only: bool) -> Result<(), (i16, String)> {
    let invalid_request = |m: String| (ResponseError::InvalidRequest.code(), m);
    let invalid_config = |m: String| (ResponseError::InvalidConfig.code(), m);
    let mut seen = std::collections::BTreeSet::new();
    for c in changes {
        if !seen.insert(c.name) {
            return Err(invalid_request("Error due to duplicate config keys".into()));
        }
    }
    let mut next: Vec<(&str, Option<&str>)> = Vec::new();
    for c in changes {
        match c.operation {
            0 => {
                let Some(level) = c.value else {
                    return Err(invalid_request(format!(
                        "Null value not supported for : {}",
                        c.name
                    )));
                };
                if !known(c.name) {
                    return Err(invalid_config(format!("Logger {} does not exist!", c.name)));
                }
                if !LEVELS.contains(&level) {
                    return Err(invalid_config(format!(
                        "Cannot set the log level of {} to {level} as it is not a supported log \
                         level. Valid log levels are {}",
                        c.name,
                        LEVELS.join(", ")
                    )));
                }
                next.push((c.name, Some(level)));
            }
            1 => {
                if c.name == ROOT {
                    return Err(invalid_request(
                        "Removing the log level of the root logger is not allowed".into(),
                    ));
                }
                if !known(c.name) {
                    return Err(invalid_config(format!("Logger {} does not exist!", c.name)));
                }
                next.push((c.name, None));
            }
            2 => {
                return Err(invalid_request(
                    "APPEND operation is not allowed for the BROKER_LOGGER resource".into(),
                ))
            }
            3 => {
                return Err(invalid_request(
                    "SUBTRACT operation is not allowed for the BROKER_LOGGER resource".into(),
                ))
            }
            other => {
                return Err(invalid_request(format!(
                    "Unknown operation type {other} is not allowed for the BROKER_LOGGER resource"
                )))
            }
        }
    }
    if validate_only {
        return Ok(());
    }
    let Some(state) = STATE.get() else {
        return Err(invalid_request("this process has no log to change".into()));
    };
    let mut state = state.lock().expect("logger state");
    for (name, level) in next {
        match level {
            Some(level) => {
                state.set.insert(name.to_string(), level.to_string());
            }
            None => {
                state.set.remove(name);
            }
        }
        tracing::info!(
            logger = name,
            level = level.unwrap_or("(inherited)"),
            "log level changed"
        );
    }
    let filter = EnvFilter::try_new(spec(&state)).map_err(|e| invalid_config(e.to_string()))?;
    state
        .handle
        .reload(filter)
        .map_err(|e| invalid_request(format!("cannot change the log levels: {e}")))
}

/// The filter directives: the root level, `RUST_LOG`'s own directives, then the levels set at
/// run time (later directives for the same target win).
fn spec(state: &State) -> String {
    let root = state
        .set
        .get(ROOT)
        .map_or(state.base_root.clone(), |l| tracing_level(l).to_string());
    let mut parts = vec![root];
    parts.extend(state.base_directives.iter().cloned());
    parts.extend(
        state
            .set
            .iter()
            .filter(|(t, _)| t.as_str() != ROOT)
            .map(|(t, l)| format!("{}={}", target_of(t), tracing_level(l))),
    );
    parts.join(",")
}

/// A log line at most once per interval, counting what happened in between.
pub struct RateLimitedLog {
    /// Milliseconds since `EPOCH` of the last line, plus one (0 = never).
    last_ms: std::sync::atomic::AtomicU64,
    suppressed: std::sync::atomic::AtomicU64,
}

static EPOCH: std::sync::LazyLock<std::time::Instant> =
    std::sync::LazyLock::new(std::time::Instant::now);

impl RateLimitedLog {
    pub const fn new() -> Self {
        RateLimitedLog {
            last_ms: std::sync::atomic::AtomicU64::new(0),
            suppressed: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// `Some(events suppressed since the last line)` when a line is due now.
    pub fn due(&self, interval: std::time::Duration) -> Option<u64> {
        let now = EPOCH.elapsed().as_millis() as u64 + 1;
        let last = self.last_ms.load(std::sync::atomic::Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= interval.as_millis() as u64;
        if due
            && self
                .last_ms
                .compare_exchange(
                    last,
                    now,
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(
                self.suppressed
                    .swap(0, std::sync::atomic::Ordering::Relaxed),
            );
        }
        self.suppressed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_checked_as_kafka_checks_them() {
        let set = |name, value| Change {
            name,
            operation: 0,
            value: Some(value),
        };
        assert!(alter(&[set("sluice_broker.cluster", "DEBUG")], true).is_ok());
        assert!(alter(&[set("sluice_broker.cluster.node", "TRACE")], true).is_ok());
        assert_eq!(
            target_of("sluice_broker.cluster.node"),
            "sluice_broker::cluster::node"
        );
        assert_eq!(logger_of("sluice::fetch"), "sluice.fetch");
        assert_eq!(
            alter(&[set("kafka.server.ReplicaManager", "DEBUG")], true)
                .unwrap_err()
                .0,
            40
        );
        assert_eq!(alter(&[set(ROOT, "LOUD")], true).unwrap_err().0, 40);
        assert_eq!(alter(&[set(ROOT, "debug")], true).unwrap_err().0, 40);
        let delete_root = Change {
            name: ROOT,
            operation: 1,
            value: None,
        };
        assert_eq!(alter(&[delete_root], true).unwrap_err().0, 42);
        let append = Change {
            name: ROOT,
            operation: 2,
            value: Some("DEBUG"),
        };
        assert_eq!(alter(&[append], true).unwrap_err().0, 42);
        assert_eq!(
            alter(&[set(ROOT, "INFO"), set(ROOT, "WARN")], true)
                .unwrap_err()
                .0,
            42
        );
    }
}
