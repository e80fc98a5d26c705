//! Every broker setting, declared once: its name (Kafka's where Kafka has the setting), its type,
//! its default, how a value is checked and applied, how it is read back, and what it does. The
//! command-line flags (the name with dashes), the TOML file (the name), DescribeConfigs (the
//! value in force and the documentation), `sluice --help` and `broker/SETTINGS.md` all come from
//! [`BROKER_SETTINGS`]; `BrokerConfig::default()` applies each default. Checks that involve two
//! settings (a heartbeat below its session timeout) are `BrokerConfig::validate`'s.
//!
//! Adding a setting: a field in `BrokerConfig` (config.rs, with its placeholder in
//! `BrokerConfig::unset`) and an entry here.

use std::fmt::Display;
use std::path::PathBuf;
use std::str::FromStr;

use crate::config::security::{self, ClientAuth};
use crate::config::{
    parse_voters, BrokerConfig, MigrationPolicy, LEADER_SELECTOR, RACK_AWARE_REPLICA_SELECTOR,
};

/// Kafka's authorizer, the one `authorizer.class.name` may name.
pub const STANDARD_AUTHORIZER: &str = "org.apache.kafka.metadata.authorizer.StandardAuthorizer";

/// A setting's type, as DescribeConfigs reports it (KIP-569) and as `--help` names its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Boolean,
    String,
    Int,
    Short,
    Long,
    List,
    /// A secret: DescribeConfigs reports it as sensitive, with no value.
    Password,
}

impl Kind {
    /// DescribeConfigs `config_type`.
    pub fn config_type(self) -> i8 {
        match self {
            Kind::Boolean => 1,
            Kind::String => 2,
            Kind::Int => 3,
            Kind::Short => 4,
            Kind::Long => 5,
            Kind::List => 7,
            Kind::Password => 9,
        }
    }

    fn value_name(self) -> &'static str {
        match self {
            Kind::Boolean => "true|false",
            Kind::String => "TEXT",
            Kind::Int | Kind::Short | Kind::Long => "N",
            Kind::List => "A,B,...",
            Kind::Password => "SECRET",
        }
    }
}

/// One broker setting.
pub struct Setting {
    /// The TOML key and DescribeConfigs name; the flag is `--` and the name with dashes.
    pub name: &'static str,
    /// A flag name kept from earlier releases instead of the derived one (`--data-dir`).
    pub flag: Option<&'static str>,
    /// Whether a dynamic broker config of this name (IncrementalAlterConfigs, per broker or
    /// cluster-wide) takes effect without a restart.
    pub dynamic: bool,
    pub kind: Kind,
    /// The value a broker starts with, as text; `None` when unset by default (the doc says
    /// what then holds).
    pub default: Option<&'static str>,
    /// What it does here, one or two sentences: `--help`, DescribeConfigs and SETTINGS.md.
    pub doc: &'static str,
    /// Checks a value and applies it; the error names the setting and what it takes.
    pub set: fn(&mut BrokerConfig, &str) -> Result<(), String>,
    /// The value in force, for DescribeConfigs; `None` leaves the setting out (unset, or not
    /// one a broker reports).
    pub get: fn(&BrokerConfig) -> Option<String>,
}

impl Setting {
    /// The command-line flag, without the dashes in front.
    pub fn flag(&self) -> String {
        self.flag
            .map(str::to_string)
            .unwrap_or_else(|| self.name.replace('.', "-"))
    }
}

/// The setting named `name`.
pub fn find(name: &str) -> Option<&'static Setting> {
    BROKER_SETTINGS.iter().find(|s| s.name == name)
}

fn number<T: FromStr>(name: &str, v: &str) -> Result<T, String> {
    v.trim()
        .parse()
        .map_err(|_| format!("{name}: {v:?} is not a number of the range it takes"))
}

fn at_least<T: FromStr + PartialOrd + Display>(name: &str, v: &str, min: T) -> Result<T, String> {
    let n: T = number(name, v)?;
    if n < min {
        return Err(format!("{name} must be at least {min}, not {n}"));
    }
    Ok(n)
}

fn boolean(name: &str, v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{name}: {v:?} is neither true nor false")),
    }
}

/// `log.dirs`: at least one directory, none named twice (made absolute to compare, as Kafka
/// refuses duplicate log directories).
fn parse_log_dirs(v: &str) -> Result<Vec<PathBuf>, String> {
    let dirs: Vec<PathBuf> = v
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .collect();
    if dirs.is_empty() {
        return Err("log.dirs names no directory".into());
    }
    let mut seen = std::collections::HashSet::new();
    for d in &dirs {
        let absolute = std::path::absolute(d).unwrap_or_else(|_| d.clone());
        if !seen.insert(absolute) {
            return Err(format!("log.dirs names {} twice", d.display()));
        }
    }
    Ok(dirs)
}

/// Text that may be empty to mean unset.
fn optional(v: &str) -> Option<String> {
    Some(v.trim().to_string()).filter(|v| !v.is_empty())
}

fn show(v: impl ToString) -> Option<String> {
    Some(v.to_string())
}

/// Every broker setting, Kafka's first, then Sluice's own. DescribeConfigs lists them in
/// Kafka's catalog order, Sluice's own after.
pub static BROKER_SETTINGS: &[Setting] = &[
    // ---- Identity and roles.
    Setting {
        name: "node.id",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("1"),
        doc: "This node's id in the cluster.",
        set: |c, v| {
            c.node_id = at_least("node.id", v, 0)?;
            Ok(())
        },
        get: |c| show(c.node_id),
    },
    Setting {
        name: "broker.id",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: None,
        doc: "The same as node.id.",
        set: |c, v| {
            c.node_id = at_least("broker.id", v, 0)?;
            Ok(())
        },
        get: |c| show(c.node_id),
    },
    Setting {
        name: "cluster.id",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: None,
        doc: "Sluice: the cluster this node belongs to (Kafka keeps it in meta.properties alone); the formatted storage's (meta.properties) must \
              match it. Unset, the storage's id stands (a new single node makes a random one).",
        set: |c, v| {
            crate::config::validate_cluster_id(v.trim())
                .map_err(|e| format!("cluster.id: {e}"))?;
            c.cluster_id = v.trim().to_string();
            c.cluster_id_configured = true;
            Ok(())
        },
        get: |_| None,
    },
    Setting {
        name: "process.roles",
        flag: None,
        dynamic: false,
        kind: Kind::List,
        default: Some("broker,controller"),
        doc: "broker, controller, or both: a combined node, as the single-node default is.",
        set: |c, v| {
            c.process_roles = v.parse()?;
            Ok(())
        },
        get: |c| show(c.process_roles),
    },
    Setting {
        name: "controller.quorum.voters",
        flag: None,
        dynamic: false,
        kind: Kind::List,
        default: None,
        doc: "The controllers, id@host:port each, e.g. 1@127.0.0.1:9093,2@127.0.0.1:9095. \
              Unset for a single node, whose quorum is itself.",
        set: |c, v| {
            c.controller_quorum_voters = parse_voters(v).map_err(|e| e.to_string())?;
            Ok(())
        },
        get: |c| c.is_cluster().then(|| c.voters_text()),
    },
    Setting {
        name: "controller.listener.names",
        flag: None,
        dynamic: false,
        kind: Kind::List,
        default: Some("CONTROLLER"),
        doc: "Which of the listeners carry the controller quorum's traffic (the first is used).",
        set: |c, v| {
            c.set_controller_listener_names(v);
            Ok(())
        },
        get: |c| show(c.controller_listener_names.join(",")),
    },
    Setting {
        name: "broker.rack",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: None,
        doc: "The rack of this broker: replicas of a partition are spread over racks, and \
              Metadata reports it.",
        set: |c, v| {
            c.broker_rack = optional(v);
            Ok(())
        },
        get: |c| c.broker_rack.clone(),
    },
    Setting {
        name: "broker.session.timeout.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("9000"),
        doc: "A broker that sends no heartbeat to the active controller for this long is fenced.",
        set: |c, v| {
            c.broker_session_timeout_ms = at_least("broker.session.timeout.ms", v, 1)?;
            Ok(())
        },
        get: |c| show(c.broker_session_timeout_ms),
    },
    Setting {
        name: "broker.heartbeat.interval.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("2000"),
        doc: "How often a broker heartbeats to the active controller; less than \
              broker.session.timeout.ms.",
        set: |c, v| {
            c.broker_heartbeat_interval_ms = at_least("broker.heartbeat.interval.ms", v, 1)?;
            Ok(())
        },
        get: |c| show(c.broker_heartbeat_interval_ms),
    },
    // ---- Listeners and connections.
    Setting {
        name: "listeners",
        flag: None,
        dynamic: false,
        kind: Kind::List,
        default: Some("PLAINTEXT://127.0.0.1:9092"),
        doc: "Where the Kafka protocol is served, and the controller quorum on the listener \
              controller.listener.names names, e.g. \
              PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093; changing it needs a \
              restart.",
        set: |c, v| c.set_listeners(v).map_err(|e| e.to_string()),
        get: |c| c.listeners_text.clone(),
    },
    Setting {
        name: "advertised.listeners",
        flag: None,
        dynamic: false,
        kind: Kind::List,
        default: None,
        doc: "The address clients are told to connect to, e.g. PLAINTEXT://broker1:9092; unset, \
              the client listener's.",
        set: |c, v| c.set_advertised(v).map_err(|e| e.to_string()),
        get: |c| {
            show(
                c.broker_listeners
                    .iter()
                    .map(|l| format!("{}://{}:{}", l.name, l.advertised_host, l.advertised_port))
                    .collect::<Vec<_>>()
                    .join(","),
            )
        },
    },
    Setting {
        name: "inter.broker.listener.name",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: None,
        doc: "The listener brokers reach each other on (replica fetches, transaction markers, \
              group loads); unset, the first listener that is not a controller listener.",
        set: |c, v| {
            c.inter_broker_listener_name = optional(v);
            Ok(())
        },
        get: |c| show(c.inter_broker_listener()),
    },
    Setting {
        name: "sasl.mechanism.inter.broker.protocol",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: Some("GSSAPI"),
        doc: "The SASL mechanism a broker logs in to other brokers with when the inter-broker \
              listener is SASL: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (Kafka's default, GSSAPI, \
              is not run), with the username and password in that listener's \
              listener.name.<listener>.<mechanism>.sasl.jaas.config.",
        set: |c, v| {
            c.sasl_mechanism_inter_broker_protocol = v.trim().to_string();
            Ok(())
        },
        get: |c| show(&c.sasl_mechanism_inter_broker_protocol),
    },
    Setting {
        name: "sasl.mechanism.controller.protocol",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: Some("GSSAPI"),
        doc: "The SASL mechanism nodes log in to the controllers with when the controller \
              listener is SASL: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, with the username and \
              password in listener.name.<controller listener>.<mechanism>.sasl.jaas.config.",
        set: |c, v| {
            c.sasl_mechanism_controller_protocol = v.trim().to_string();
            Ok(())
        },
        get: |c| show(&c.sasl_mechanism_controller_protocol),
    },
    Setting {
        name: "listener.security.protocol.map",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: Some(security::DEFAULT_PROTOCOL_MAP),
        doc: "Each listener name's security protocol, NAME:PROTOCOL entries (PLAINTEXT, SSL, \
              SASL_PLAINTEXT, SASL_SSL), e.g. CLIENT:SASL_SSL,CONTROLLER:PLAINTEXT.",
        set: |c, v| {
            c.security_protocol_map = security::parse_protocol_map(v)?;
            Ok(())
        },
        get: |c| {
            show(
                c.security_protocol_map
                    .iter()
                    .map(|(n, p)| format!("{n}:{p}"))
                    .collect::<Vec<_>>()
                    .join(","),
            )
        },
    },
    Setting {
        name: "sasl.enabled.mechanisms",
        flag: None,
        dynamic: false,
        kind: Kind::List,
        default: Some("GSSAPI"),
        doc: "The SASL mechanisms of SASL listeners: PLAIN, with its users in \
              listener.name.<listener>.plain.sasl.jaas.config (Kafka's PlainLoginModule, \
              user_<name>=\"<password>\" options); SCRAM-SHA-256 and SCRAM-SHA-512, with the \
              credentials of the metadata log (AlterUserScramCredentials, kafka-configs \
              --entity-type users, storage format --add-scram). Kafka's default, GSSAPI, is not \
              run: a SASL listener needs this set.",
        set: |c, v| {
            c.sasl.enabled_mechanisms = security::list(v)
                .into_iter()
                .map(|m| m.to_ascii_uppercase())
                .collect();
            Ok(())
        },
        get: |c| show(c.sasl.enabled_mechanisms.join(",")),
    },
    Setting {
        name: "connection.failed.authentication.delay.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("100"),
        doc: "How long a connection whose SASL authentication failed stays open, answered, \
              before it is closed: a client retrying a wrong password at once is slowed down.",
        set: |c, v| {
            c.sasl.failed_authentication_delay_ms = number("connection.failed.authentication.delay.ms", v)?;
            Ok(())
        },
        get: |c| show(c.sasl.failed_authentication_delay_ms),
    },
    Setting {
        name: "sasl.server.max.receive.size",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("524288"),
        doc: "The largest request a SASL listener reads before the client authenticated \
              (ApiVersions and the SASL requests): a larger size closes the connection before \
              anything is allocated for it, so that no one who has not logged in makes the \
              broker hold socket.request.max.bytes.",
        set: |c, v| {
            let size: u64 = number("sasl.server.max.receive.size", v)?;
            if size == 0 || size > i32::MAX as u64 {
                return Err(format!("sasl.server.max.receive.size must be in 1..={}", i32::MAX));
            }
            c.sasl.max_receive_size = size as usize;
            Ok(())
        },
        get: |c| show(c.sasl.max_receive_size),
    },
    Setting {
        name: "connections.max.reauth.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Long,
        default: Some("0"),
        doc: "KIP-368: when positive, a SASL session lasts this long (or until its OAUTHBEARER \
              token expires, if sooner); the SaslAuthenticate response tells the client, which \
              logs in again on the same connection before then (SaslHandshake and \
              SaslAuthenticate, same mechanism and principal). A request that comes after its \
              session expired closes the connection (counted in \
              kafka_server_socket_server_metrics_expired_connections_killed_count_total). 0: sessions \
              last as long as their connection, unless an OAUTHBEARER token's expiry ends them.",
        set: |c, v| {
            c.sasl.max_reauth_ms = number("connections.max.reauth.ms", v)?;
            Ok(())
        },
        get: |c| show(c.sasl.max_reauth_ms),
    },
    Setting {
        name: "ssl.keystore.type",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: Some("PEM"),
        doc: "The format of the SSL listener's keystore: PEM (KIP-651: a private key and its \
              certificate chain in one file, or inline) or PKCS12 (with \
              ssl.keystore.password). Kafka's default is JKS, which Sluice does not read \
              (keytool -importkeystore -deststoretype PKCS12 converts one).",
        set: |c, v| {
            let t = v.trim().to_ascii_uppercase();
            if t != "PEM" && t != "PKCS12" {
                return Err(format!(
                    "ssl.keystore.type: {t} keystores are not read; use PEM or PKCS12"
                ));
            }
            c.ssl.keystore_type = t;
            Ok(())
        },
        get: |c| show(&c.ssl.keystore_type),
    },
    Setting {
        name: "ssl.keystore.location",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: None,
        doc: "The SSL listener's keystore file: its private key (PKCS#8, PKCS#1 or SEC1; an \
              encrypted PKCS#8 key with ssl.key.password) and certificate chain, PEM; or a \
              PKCS#12 store (ssl.keystore.type=PKCS12). Read again when the file changes, \
              without a restart.",
        set: |c, v| {
            c.ssl.keystore_location = optional(v).map(PathBuf::from);
            Ok(())
        },
        get: |c| c.ssl.keystore_location.as_ref().map(|p| p.display().to_string()),
    },
    Setting {
        name: "ssl.keystore.password",
        flag: None,
        dynamic: false,
        kind: Kind::Password,
        default: None,
        doc: "A PKCS#12 keystore's password (a PEM keystore has none: accepted and unused).",
        set: |c, v| {
            c.ssl.keystore_password = optional(v);
            Ok(())
        },
        get: |c| c.ssl.keystore_password.as_ref().map(|_| "[hidden]".into()),
    },
    Setting {
        name: "ssl.key.password",
        flag: None,
        dynamic: false,
        kind: Kind::Password,
        default: None,
        doc: "The password of a PEM keystore's encrypted private key (PKCS#8 \
              \"ENCRYPTED PRIVATE KEY\", PBES2 as openssl pkcs8 -topk8 writes it).",
        set: |c, v| {
            c.ssl.key_password = optional(v);
            Ok(())
        },
        get: |c| c.ssl.key_password.as_ref().map(|_| "[hidden]".into()),
    },
    Setting {
        name: "ssl.keystore.certificate.chain",
        flag: None,
        dynamic: false,
        kind: Kind::Password,
        default: None,
        doc: "The SSL listener's certificate chain as PEM text, instead of a keystore file.",
        set: |c, v| {
            c.ssl.keystore_certificate_chain = optional(v);
            Ok(())
        },
        get: |c| c.ssl.keystore_certificate_chain.as_ref().map(|_| "[hidden]".into()),
    },
    Setting {
        name: "ssl.keystore.key",
        flag: None,
        dynamic: false,
        kind: Kind::Password,
        default: None,
        doc: "The SSL listener's private key as PEM text, instead of a keystore file.",
        set: |c, v| {
            c.ssl.keystore_key = optional(v);
            Ok(())
        },
        get: |c| c.ssl.keystore_key.as_ref().map(|_| "[hidden]".into()),
    },
    Setting {
        name: "ssl.truststore.type",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: Some("PEM"),
        doc: "The format of the truststore client certificates are checked against: PEM, or \
              PKCS12 (with ssl.truststore.password).",
        set: |c, v| {
            let t = v.trim().to_ascii_uppercase();
            if t != "PEM" && t != "PKCS12" {
                return Err(format!(
                    "ssl.truststore.type: {t} truststores are not read; use PEM or PKCS12"
                ));
            }
            c.ssl.truststore_type = t;
            Ok(())
        },
        get: |c| show(&c.ssl.truststore_type),
    },
    Setting {
        name: "ssl.truststore.location",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: None,
        doc: "PEM certificates of the authorities that sign client certificates (mutual TLS, \
              ssl.client.auth). Read again when the file changes.",
        set: |c, v| {
            c.ssl.truststore_location = optional(v).map(PathBuf::from);
            Ok(())
        },
        get: |c| c.ssl.truststore_location.as_ref().map(|p| p.display().to_string()),
    },
    Setting {
        name: "ssl.truststore.password",
        flag: None,
        dynamic: false,
        kind: Kind::Password,
        default: None,
        doc: "A PKCS#12 truststore's password (a PEM truststore has none: accepted and unused).",
        set: |c, v| {
            c.ssl.truststore_password = optional(v);
            Ok(())
        },
        get: |c| c.ssl.truststore_password.as_ref().map(|_| "[hidden]".into()),
    },
    Setting {
        name: "ssl.truststore.certificates",
        flag: None,
        dynamic: false,
        kind: Kind::Password,
        default: None,
        doc: "The truststore's certificates as PEM text, instead of a file.",
        set: |c, v| {
            c.ssl.truststore_certificates = optional(v);
            Ok(())
        },
        get: |c| c.ssl.truststore_certificates.as_ref().map(|_| "[hidden]".into()),
    },
    Setting {
        name: "ssl.client.auth",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: Some("none"),
        doc: "Whether SSL clients show a certificate: none, requested (checked if shown) or \
              required (mutual TLS); checked against the truststore.",
        set: |c, v| {
            c.ssl.client_auth = ClientAuth::parse(v)?;
            Ok(())
        },
        get: |c| show(c.ssl.client_auth.name()),
    },
    Setting {
        name: "ssl.enabled.protocols",
        flag: None,
        dynamic: false,
        kind: Kind::List,
        default: Some("TLSv1.2,TLSv1.3"),
        doc: "The TLS versions SSL listeners speak: TLSv1.2, TLSv1.3.",
        set: |c, v| {
            let list = security::list(v);
            if let Some(bad) = list.iter().find(|p| !matches!(p.as_str(), "TLSv1.2" | "TLSv1.3")) {
                return Err(format!(
                    "ssl.enabled.protocols: {bad:?} is not TLSv1.2 or TLSv1.3"
                ));
            }
            if list.is_empty() {
                return Err("ssl.enabled.protocols is empty".into());
            }
            c.ssl.enabled_protocols = list;
            Ok(())
        },
        get: |c| show(c.ssl.enabled_protocols.join(",")),
    },
    Setting {
        name: "ssl.cipher.suites",
        flag: None,
        dynamic: false,
        kind: Kind::List,
        default: Some(""),
        doc: "The cipher suites SSL listeners offer, by IANA name \
              (TLS_AES_256_GCM_SHA384, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, ...); empty for \
              every suite of the enabled versions.",
        set: |c, v| {
            c.ssl.cipher_suites = security::list(v);
            Ok(())
        },
        get: |c| show(c.ssl.cipher_suites.join(",")),
    },
    Setting {
        name: "sasl.oauthbearer.jwks.endpoint.url",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: None,
        doc: "Where OAUTHBEARER's signing keys are (a JWKS): an https: (or http:) URL, fetched \
              at start and again every sasl.oauthbearer.jwks.endpoint.refresh.ms and when a \
              token names a key the set lacks (trusting ssl.truststore.* when it is set, the \
              Web PKI's authorities otherwise); or a file: URL, read again when the file \
              changes. Set (or with listener.name.<l>.oauthbearer.sasl.server.callback.\
              handler.class naming Kafka's OAuthBearerValidatorCallbackHandler), tokens must be \
              signed by one of its keys; unset, unsigned tokens are accepted (Kafka's unsecured \
              default, for tests and development).",
        set: |c, v| {
            c.sasl.oauth.jwks_endpoint_url = optional(v);
            Ok(())
        },
        get: |c| c.sasl.oauth.jwks_endpoint_url.clone(),
    },
    Setting {
        name: "sasl.oauthbearer.jwks.endpoint.refresh.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Long,
        default: Some("3600000"),
        doc: "How often an https JWKS is fetched again.",
        set: |c, v| {
            c.sasl.oauth.jwks_refresh_ms = number("sasl.oauthbearer.jwks.endpoint.refresh.ms", v)?;
            Ok(())
        },
        get: |c| show(c.sasl.oauth.jwks_refresh_ms),
    },
    Setting {
        name: "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Long,
        default: Some("100"),
        doc: "The first wait before fetching an https JWKS again after a failed fetch; it \
              doubles up to sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms.",
        set: |c, v| {
            c.sasl.oauth.jwks_retry_backoff_ms =
                number("sasl.oauthbearer.jwks.endpoint.retry.backoff.ms", v)?;
            Ok(())
        },
        get: |c| show(c.sasl.oauth.jwks_retry_backoff_ms),
    },
    Setting {
        name: "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Long,
        default: Some("10000"),
        doc: "The longest wait between fetches of an https JWKS that keep failing.",
        set: |c, v| {
            c.sasl.oauth.jwks_retry_backoff_max_ms =
                number("sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms", v)?;
            Ok(())
        },
        get: |c| show(c.sasl.oauth.jwks_retry_backoff_max_ms),
    },
    Setting {
        name: "sasl.oauthbearer.expected.audience",
        flag: None,
        dynamic: false,
        kind: Kind::List,
        default: Some(""),
        doc: "Audiences one of which a signed OAUTHBEARER token's aud claim must name; empty, \
              the audience is not checked.",
        set: |c, v| {
            c.sasl.oauth.expected_audience = security::list(v);
            Ok(())
        },
        get: |c| show(c.sasl.oauth.expected_audience.join(",")),
    },
    Setting {
        name: "sasl.oauthbearer.expected.issuer",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: None,
        doc: "The issuer a signed OAUTHBEARER token's iss claim must name; unset, not checked.",
        set: |c, v| {
            c.sasl.oauth.expected_issuer = optional(v);
            Ok(())
        },
        get: |c| c.sasl.oauth.expected_issuer.clone(),
    },
    Setting {
        name: "sasl.oauthbearer.sub.claim.name",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: Some("sub"),
        doc: "The claim of a signed OAUTHBEARER token that names its principal.",
        set: |c, v| {
            c.sasl.oauth.sub_claim_name = v.trim().to_string();
            Ok(())
        },
        get: |c| show(&c.sasl.oauth.sub_claim_name),
    },
    Setting {
        name: "sasl.oauthbearer.clock.skew.seconds",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("30"),
        doc: "How far a signed OAUTHBEARER token's times may be off this broker's clock.",
        set: |c, v| {
            c.sasl.oauth.clock_skew_seconds = number("sasl.oauthbearer.clock.skew.seconds", v)?;
            Ok(())
        },
        get: |c| show(c.sasl.oauth.clock_skew_seconds),
    },
    Setting {
        name: "ssl.principal.mapping.rules",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: Some("DEFAULT"),
        doc: "How the subject of a client's certificate on an SSL listener becomes its principal \
              (User:<name>): DEFAULT keeps the distinguished name as Java writes it \
              (CN=alice,OU=tests); RULE:pattern/replacement/[LU] entries, tried in order, \
              replace the whole name (L lower-cases, U upper-cases), e.g. \
              RULE:^CN=([^,]*).*$/$1/L,DEFAULT. A name no rule applies to is refused.",
        set: |c, v| {
            c.ssl.principal_mapping_rules = v.trim().to_string();
            Ok(())
        },
        get: |c| show(&c.ssl.principal_mapping_rules),
    },
    Setting {
        name: "socket.request.max.bytes",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("104857600"),
        doc: "The largest request frame; a larger one closes its connection before anything is \
              allocated.",
        set: |c, v| {
            c.socket_request_max_bytes = at_least("socket.request.max.bytes", v, 1)?;
            Ok(())
        },
        get: |c| show(c.socket_request_max_bytes),
    },
    Setting {
        name: "max.connections",
        flag: None,
        dynamic: true,
        kind: Kind::Int,
        // Kafka's: no limit but the process's descriptors (Int.MaxValue).
        default: Some("2147483647"),
        doc: "Client connections held open at once over all shards; more are accepted and \
              closed at once, with a rate-limited log line. Changes without a restart.",
        set: |c, v| {
            c.max_connections = number("max.connections", v)?;
            Ok(())
        },
        get: |c| show(c.max_connections),
    },
    Setting {
        name: "max.connections.per.ip",
        flag: None,
        dynamic: true,
        kind: Kind::Int,
        default: Some("2147483647"),
        doc: "Client connections held open at once from one address. Changes without a restart.",
        set: |c, v| {
            c.max_connections_per_ip = number("max.connections.per.ip", v)?;
            Ok(())
        },
        get: |c| show(c.max_connections_per_ip),
    },
    Setting {
        name: "connections.max.idle.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Long,
        default: Some("600000"),
        doc: "A connection that makes no progress for this long (no complete request read and no \
              response written) is closed; bytes of an unfinished request are no progress.",
        set: |c, v| {
            c.connections_max_idle_ms = number("connections.max.idle.ms", v)?;
            Ok(())
        },
        get: |c| show(c.connections_max_idle_ms),
    },
    Setting {
        name: "quota.window.num",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("11"),
        doc: "How many samples a client quota's rate is measured over (producer_byte_rate, \
              consumer_byte_rate; set with AlterClientQuotas, kafka-configs --entity-type \
              users|clients). The rate is what the samples hold over their time, at least all \
              but one full sample.",
        set: |c, v| {
            c.quota_window_num = at_least("quota.window.num", v, 2)?;
            Ok(())
        },
        get: |c| show(c.quota_window_num),
    },
    Setting {
        name: "quota.window.size.seconds",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("1"),
        doc: "The time span of each client quota sample.",
        set: |c, v| {
            c.quota_window_size_seconds = at_least("quota.window.size.seconds", v, 1)?;
            Ok(())
        },
        get: |c| show(c.quota_window_size_seconds),
    },
    // ---- Storage and topics.
    Setting {
        name: "log.dirs",
        flag: Some("data-dir"),
        dynamic: false,
        kind: Kind::List,
        default: Some("./data"),
        doc: "The directories holding partition logs, comma-separated, each its own disk: a \
              new replica goes to the one with the most usable space (fewest partitions among \
              directories of one file system). The first also holds the metadata log.",
        set: |c, v| {
            c.log_dirs = parse_log_dirs(v)?;
            c.data_dir = c.log_dirs[0].clone();
            Ok(())
        },
        get: |c| {
            show(
                c.log_dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            )
        },
    },
    Setting {
        name: "num.partitions",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("1"),
        doc: "Partitions of auto-created topics and of CreateTopics asking for -1.",
        set: |c, v| {
            c.num_partitions = at_least("num.partitions", v, 1)?;
            Ok(())
        },
        get: |c| show(c.num_partitions),
    },
    Setting {
        name: "authorizer.class.name",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: Some(""),
        doc: "The authorizer: empty for none (every principal may do everything, and the ACL \
              APIs answer SECURITY_DISABLED, as Kafka), or Kafka's \
              org.apache.kafka.metadata.authorizer.StandardAuthorizer, whose rules Sluice runs \
              over the ACLs of the metadata log (CreateAcls, kafka-acls).",
        set: |c, v| {
            c.authorizer = match v.trim() {
                "" => false,
                STANDARD_AUTHORIZER => true,
                other => {
                    return Err(format!(
                        "authorizer.class.name: {other} is not an authorizer Sluice runs; \
                         set it to {STANDARD_AUTHORIZER} or leave it empty"
                    ))
                }
            };
            Ok(())
        },
        get: |c| show(if c.authorizer { STANDARD_AUTHORIZER } else { "" }),
    },
    Setting {
        name: "super.users",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: Some(""),
        doc: "Principals the authorizer allows everything, separated by semicolons, e.g. \
              User:admin;User:ops.",
        set: |c, v| {
            c.authorizer_config.super_users = v
                .split(';')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect();
            Ok(())
        },
        get: |c| show(c.authorizer_config.super_users.join(";")),
    },
    Setting {
        name: "allow.everyone.if.no.acl.found",
        flag: None,
        dynamic: false,
        kind: Kind::Boolean,
        default: Some("false"),
        doc: "With the authorizer: whether a resource no ACL names is open to every principal.",
        set: |c, v| {
            c.authorizer_config.allow_if_no_acl = boolean("allow.everyone.if.no.acl.found", v)?;
            Ok(())
        },
        get: |c| show(c.authorizer_config.allow_if_no_acl),
    },
    Setting {
        name: "auto.create.topics.enable",
        flag: None,
        dynamic: false,
        kind: Kind::Boolean,
        default: Some("true"),
        doc: "Whether Metadata for an unknown topic creates it.",
        set: |c, v| {
            c.auto_create_topics = boolean("auto.create.topics.enable", v)?;
            Ok(())
        },
        get: |c| show(c.auto_create_topics),
    },
    Setting {
        name: "default.replication.factor",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("1"),
        doc: "Replicas of topics created without a replication factor (auto-created ones, \
              CreateTopics asking for -1).",
        set: |c, v| {
            c.default_replication_factor = at_least("default.replication.factor", v, 1)?;
            Ok(())
        },
        get: |c| show(c.default_replication_factor),
    },
    Setting {
        name: "min.insync.replicas",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("1"),
        doc: "In-sync replicas an acks=all produce needs, for topics that set none; the \
              controller keeps it as the cluster-wide dynamic default (KIP-966).",
        set: |c, v| {
            c.min_insync_replicas = at_least("min.insync.replicas", v, 1)?;
            Ok(())
        },
        get: |c| show(c.min_insync_replicas),
    },
    Setting {
        name: "log.retention.check.interval.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Long,
        default: Some("300000"),
        doc: "How often each shard applies time and size retention to its partitions.",
        set: |c, v| {
            c.log_retention_check_interval_ms = at_least("log.retention.check.interval.ms", v, 1)?;
            Ok(())
        },
        get: |c| show(c.log_retention_check_interval_ms),
    },
    Setting {
        name: "log.cleaner.backoff.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Long,
        // Sluice's default, one minute (Kafka's is 15 s): Kafka's cleaner cleans only logs past
        // `min.cleanable.dirty.ratio`; Sluice has no such tracking yet, so each pass reads
        // every closed segment of every compacted log, and four times as often would cost
        // reads for little gain.
        default: Some("60000"),
        doc: "How often each shard compacts its cleanup.policy=compact partitions.",
        set: |c, v| {
            c.log_cleaner_backoff_ms = at_least("log.cleaner.backoff.ms", v, 1)?;
            Ok(())
        },
        get: |c| show(c.log_cleaner_backoff_ms),
    },
    // ---- Fetch.
    Setting {
        name: "fetch.max.bytes",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        // Sluice's default, 8 MiB (Kafka's is 55 MiB): at 2 MiB a consumer of a producer at full
        // rate fell behind (perf/README.md, workload (a): 71 of 456 MB/s); at 8 MiB it kept pace.
        default: Some("8388608"),
        doc: "The most record bytes one fetch response carries, whatever the client asks; its \
              first batch always goes.",
        set: |c, v| {
            c.fetch_max_bytes = at_least("fetch.max.bytes", v, 1)?;
            Ok(())
        },
        get: |c| show(c.fetch_max_bytes),
    },
    Setting {
        name: "replica.fetch.wait.max.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("500"),
        doc: "How long a follower's fetch waits at its leader for new records.",
        set: |c, v| {
            c.replica_fetch_wait_max_ms = number("replica.fetch.wait.max.ms", v)?;
            Ok(())
        },
        get: |c| show(c.replica_fetch_wait_max_ms),
    },
    Setting {
        name: "replica.lag.time.max.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Long,
        default: Some("30000"),
        doc: "An in-sync follower that has not caught up with its leader for this long leaves \
              the ISR.",
        set: |c, v| {
            c.replica_lag_time_max_ms = at_least("replica.lag.time.max.ms", v, 1)?;
            Ok(())
        },
        get: |c| show(c.replica_lag_time_max_ms),
    },
    Setting {
        name: "replica.selector.class",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: None,
        doc: "Where leaders send consumers to read (KIP-392): \
              org.apache.kafka.common.replica.RackAwareReplicaSelector (or its last part) sends \
              a consumer with a client.rack to an in-sync replica in its rack; unset, or \
              LeaderSelector, the leader serves.",
        set: |c, v| {
            let class = optional(v);
            if let Some(class) = &class {
                if ![RACK_AWARE_REPLICA_SELECTOR, LEADER_SELECTOR]
                    .iter()
                    .any(|known| class == known || known.ends_with(&format!(".{class}")))
                {
                    return Err(format!(
                        "replica.selector.class {class:?} is not one Sluice has: \
                         {RACK_AWARE_REPLICA_SELECTOR} or {LEADER_SELECTOR}"
                    ));
                }
            }
            c.replica_selector_class = class;
            Ok(())
        },
        get: |c| c.replica_selector_class.clone(),
    },
    // ---- Leaders.
    Setting {
        name: "auto.leader.rebalance.enable",
        flag: None,
        dynamic: false,
        kind: Kind::Boolean,
        default: Some("true"),
        doc: "Whether the controller gives partitions back to their preferred replica once it \
              is in sync.",
        set: |c, v| {
            c.auto_leader_rebalance_enable = boolean("auto.leader.rebalance.enable", v)?;
            Ok(())
        },
        get: |c| show(c.auto_leader_rebalance_enable),
    },
    Setting {
        name: "leader.imbalance.check.interval.seconds",
        flag: None,
        dynamic: false,
        kind: Kind::Long,
        default: Some("300"),
        doc: "How often the controller looks for partitions not led by their preferred replica.",
        set: |c, v| {
            c.leader_imbalance_check_interval_seconds =
                at_least("leader.imbalance.check.interval.seconds", v, 1)?;
            Ok(())
        },
        get: |c| show(c.leader_imbalance_check_interval_seconds),
    },
    Setting {
        name: "unclean.leader.election.enable",
        flag: None,
        dynamic: false,
        kind: Kind::Boolean,
        default: Some("false"),
        doc: "Whether an out-of-sync replica may lead a partition no in-sync replica can lead, \
              for topics that set none (it may lose acknowledged records).",
        set: |c, v| {
            c.unclean_leader_election_enable = boolean("unclean.leader.election.enable", v)?;
            Ok(())
        },
        get: |c| show(c.unclean_leader_election_enable),
    },
    // ---- Groups.
    Setting {
        name: "group.initial.rebalance.delay.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("3000"),
        doc: "How long a new classic group waits for more members before its first assignment.",
        set: |c, v| {
            c.group_initial_rebalance_delay_ms = number("group.initial.rebalance.delay.ms", v)?;
            Ok(())
        },
        get: |c| show(c.group_initial_rebalance_delay_ms),
    },
    Setting {
        name: "group.min.session.timeout.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("6000"),
        doc: "The shortest session timeout a classic group member may ask for.",
        set: |c, v| {
            c.group_min_session_timeout_ms = number("group.min.session.timeout.ms", v)?;
            Ok(())
        },
        get: |c| show(c.group_min_session_timeout_ms),
    },
    Setting {
        name: "group.max.session.timeout.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("1800000"),
        doc: "The longest session timeout a classic group member may ask for.",
        set: |c, v| {
            c.group_max_session_timeout_ms = number("group.max.session.timeout.ms", v)?;
            Ok(())
        },
        get: |c| show(c.group_max_session_timeout_ms),
    },
    Setting {
        name: "group.consumer.session.timeout.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("45000"),
        doc: "How long a group.protocol=consumer member may go without a heartbeat before it \
              leaves its group and its partitions move to the others.",
        set: |c, v| {
            c.group_consumer_session_timeout_ms = number("group.consumer.session.timeout.ms", v)?;
            Ok(())
        },
        get: |c| show(c.group_consumer_session_timeout_ms),
    },
    Setting {
        name: "group.consumer.heartbeat.interval.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("5000"),
        doc: "How often group.protocol=consumer members are told to heartbeat; less than the \
              session timeout.",
        set: |c, v| {
            let ms: u64 = at_least("group.consumer.heartbeat.interval.ms", v, 1)?;
            if ms > i32::MAX as u64 {
                return Err(format!(
                    "group.consumer.heartbeat.interval.ms must be at most {}, not {ms}",
                    i32::MAX
                ));
            }
            c.group_consumer_heartbeat_interval_ms = ms;
            Ok(())
        },
        get: |c| show(c.group_consumer_heartbeat_interval_ms),
    },
    Setting {
        name: "group.streams.session.timeout.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("45000"),
        doc: "How long a streams group member (a Kafka Streams instance with \
              group.protocol=streams) may go without a heartbeat before it leaves its group and \
              its tasks move to the others.",
        set: |c, v| {
            c.group_streams_session_timeout_ms =
                at_least("group.streams.session.timeout.ms", v, 1)?;
            Ok(())
        },
        get: |c| show(c.group_streams_session_timeout_ms),
    },
    Setting {
        name: "group.streams.heartbeat.interval.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("5000"),
        doc: "How often streams group members are told to heartbeat; less than the session \
              timeout.",
        set: |c, v| {
            let ms: u64 = at_least("group.streams.heartbeat.interval.ms", v, 1)?;
            if ms > i32::MAX as u64 {
                return Err(format!(
                    "group.streams.heartbeat.interval.ms must be at most {}, not {ms}",
                    i32::MAX
                ));
            }
            c.group_streams_heartbeat_interval_ms = ms;
            Ok(())
        },
        get: |c| show(c.group_streams_heartbeat_interval_ms),
    },
    Setting {
        name: "group.streams.num.standby.replicas",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("0"),
        doc: "Standby tasks the streams group assignor places for each active task, each on \
              another Kafka Streams process than the task's active one.",
        set: |c, v| {
            let n: u64 = number("group.streams.num.standby.replicas", v)?;
            if n > 2 {
                return Err(format!(
                    "group.streams.num.standby.replicas must be at most 2 \
                     (group.streams.max.standby.replicas), not {n}"
                ));
            }
            c.group_streams_num_standby_replicas = n;
            Ok(())
        },
        get: |c| show(c.group_streams_num_standby_replicas),
    },
    Setting {
        name: "group.share.session.timeout.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("45000"),
        doc: "How long a share group member may go without a heartbeat before it leaves its group and \
              the records it holds are released.",
        set: |c, v| {
            c.group_share_session_timeout_ms = at_least("group.share.session.timeout.ms", v, 1)?;
            Ok(())
        },
        get: |c| show(c.group_share_session_timeout_ms),
    },
    Setting {
        name: "group.share.heartbeat.interval.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("5000"),
        doc: "How often share group members are told to heartbeat; less than the session timeout.",
        set: |c, v| {
            c.group_share_heartbeat_interval_ms = at_least("group.share.heartbeat.interval.ms", v, 1)?;
            Ok(())
        },
        get: |c| show(c.group_share_heartbeat_interval_ms),
    },
    Setting {
        name: "group.share.record.lock.duration.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("30000"),
        doc: "How long a share consumer holds the records it acquired before they are released for \
              another delivery; a group's share.record.lock.duration.ms overrides it.",
        set: |c, v| {
            c.group_share_record_lock_duration_ms = at_least("group.share.record.lock.duration.ms", v, 1)?;
            Ok(())
        },
        get: |c| show(c.group_share_record_lock_duration_ms),
    },
    Setting {
        name: "group.share.min.record.lock.duration.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("15000"),
        doc: "The shortest acquisition lock a broker or group setting may ask for.",
        set: |c, v| {
            c.group_share_min_record_lock_duration_ms = at_least("group.share.min.record.lock.duration.ms", v, 1)?;
            Ok(())
        },
        get: |c| show(c.group_share_min_record_lock_duration_ms),
    },
    Setting {
        name: "group.share.max.record.lock.duration.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("60000"),
        doc: "The longest acquisition lock a broker or group setting may ask for.",
        set: |c, v| {
            c.group_share_max_record_lock_duration_ms = at_least("group.share.max.record.lock.duration.ms", v, 1)?;
            Ok(())
        },
        get: |c| show(c.group_share_max_record_lock_duration_ms),
    },
    Setting {
        name: "group.share.delivery.count.limit",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("5"),
        doc: "How many times a record is delivered to share consumers before it is archived (a poison \
              record); a group's share.delivery.count.limit overrides it.",
        set: |c, v| {
            c.group_share_delivery_count_limit = at_least("group.share.delivery.count.limit", v, 2)?;
            Ok(())
        },
        get: |c| show(c.group_share_delivery_count_limit),
    },
    Setting {
        name: "group.share.partition.max.record.locks",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("2000"),
        doc: "How many records of one partition a share group may have acquired at once.",
        set: |c, v| {
            c.group_share_partition_max_record_locks = at_least("group.share.partition.max.record.locks", v, 100)?;
            Ok(())
        },
        get: |c| show(c.group_share_partition_max_record_locks),
    },
    Setting {
        name: "group.share.max.size",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("200"),
        doc: "How many members one share group may have.",
        set: |c, v| {
            c.group_share_max_size = at_least("group.share.max.size", v, 1)?;
            Ok(())
        },
        get: |c| show(c.group_share_max_size),
    },
    Setting {
        name: "share.coordinator.state.topic.num.partitions",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("50"),
        doc: "Partitions of __share_group_state, which holds the share partitions' persisted \
              state (the share coordinators').",
        set: |c, v| {
            c.share_coordinator_state_topic_partitions =
                at_least("share.coordinator.state.topic.num.partitions", v, 1)?;
            Ok(())
        },
        get: |c| show(c.share_coordinator_state_topic_partitions),
    },
    Setting {
        name: "share.coordinator.state.topic.replication.factor",
        flag: None,
        dynamic: false,
        kind: Kind::Short,
        default: None,
        doc: "Replicas of __share_group_state: unset, 3 in a cluster (as Kafka) and 1 on a \
              single node; it is not created until the cluster has that many brokers.",
        set: |c, v| {
            c.share_coordinator_state_topic_replication_factor_set = Some(at_least(
                "share.coordinator.state.topic.replication.factor",
                v,
                1,
            )?);
            Ok(())
        },
        get: |c| show(c.share_coordinator_state_topic_replication_factor()),
    },
    Setting {
        name: "share.coordinator.state.topic.min.isr",
        flag: None,
        dynamic: false,
        kind: Kind::Short,
        default: None,
        doc: "min.insync.replicas of __share_group_state: unset, 2 in a cluster (as Kafka) and \
              1 on a single node; never above its replication factor.",
        set: |c, v| {
            c.share_coordinator_state_topic_min_isr_set =
                Some(at_least("share.coordinator.state.topic.min.isr", v, 1)?);
            Ok(())
        },
        get: |c| show(c.share_coordinator_state_topic_min_isr()),
    },
    Setting {
        name: "group.consumer.migration.policy",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: Some("bidirectional"),
        doc: "Whether a classic group converts to a consumer group when a group.protocol=consumer \
              member joins (upgrade), and back when the last one leaves (downgrade): disabled, \
              upgrade, downgrade or bidirectional.",
        set: |c, v| {
            c.group_consumer_migration_policy = v.trim().parse::<MigrationPolicy>()?;
            Ok(())
        },
        get: |c| show(c.group_consumer_migration_policy.name()),
    },
    Setting {
        name: "offsets.topic.num.partitions",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("50"),
        doc: "Partitions of __consumer_offsets, which holds committed offsets; a group lives on \
              abs(hashCode) % this, as in Kafka.",
        set: |c, v| {
            c.offsets_topic_partitions = at_least("offsets.topic.num.partitions", v, 1)?;
            Ok(())
        },
        get: |c| show(c.offsets_topic_partitions),
    },
    Setting {
        name: "offsets.topic.replication.factor",
        flag: None,
        dynamic: false,
        kind: Kind::Short,
        default: None,
        doc: "Replicas of __consumer_offsets: unset, 3 in a cluster (as Kafka) and 1 on a single \
              node; it is not created until the cluster has that many brokers.",
        set: |c, v| {
            c.offsets_topic_replication_factor_set =
                Some(at_least("offsets.topic.replication.factor", v, 1)?);
            Ok(())
        },
        get: |c| show(c.offsets_topic_replication_factor()),
    },
    // ---- Transactions.
    Setting {
        name: "transaction.state.log.num.partitions",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("50"),
        doc: "Partitions of __transaction_state, which holds the transaction coordinators' state.",
        set: |c, v| {
            c.transaction_state_log_partitions =
                at_least("transaction.state.log.num.partitions", v, 1)?;
            Ok(())
        },
        get: |c| show(c.transaction_state_log_partitions),
    },
    Setting {
        name: "transaction.state.log.replication.factor",
        flag: None,
        dynamic: false,
        kind: Kind::Short,
        default: None,
        doc: "Replicas of __transaction_state: unset, 3 in a cluster (as Kafka) and 1 on a \
              single node; it is not created until the cluster has that many brokers.",
        set: |c, v| {
            c.transaction_state_log_replication_factor_set =
                Some(at_least("transaction.state.log.replication.factor", v, 1)?);
            Ok(())
        },
        get: |c| show(c.transaction_state_log_replication_factor()),
    },
    Setting {
        name: "transaction.state.log.min.isr",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: None,
        doc: "min.insync.replicas of __transaction_state: unset, 2 in a cluster (as Kafka) and \
              1 on a single node; never above its replication factor.",
        set: |c, v| {
            c.transaction_state_log_min_isr_set =
                Some(at_least("transaction.state.log.min.isr", v, 1)?);
            Ok(())
        },
        get: |c| show(c.transaction_state_log_min_isr()),
    },
    Setting {
        name: "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("10000"),
        doc: "How often transaction coordinators abort transactions past their timeout and \
              forget transactional ids past transactional.id.expiration.ms.",
        set: |c, v| {
            c.transaction_abort_timed_out_transaction_cleanup_interval_ms = at_least(
                "transaction.abort.timed.out.transaction.cleanup.interval.ms",
                v,
                1,
            )?;
            Ok(())
        },
        get: |c| show(c.transaction_abort_timed_out_transaction_cleanup_interval_ms),
    },
    Setting {
        name: "transaction.max.timeout.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("900000"),
        doc: "The longest transaction.timeout.ms a producer may ask for.",
        set: |c, v| {
            c.transaction_max_timeout_ms = at_least("transaction.max.timeout.ms", v, 1)?;
            Ok(())
        },
        get: |c| show(c.transaction_max_timeout_ms),
    },
    Setting {
        name: "transactional.id.expiration.ms",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("604800000"),
        doc: "How long a transactional id without transactions is kept.",
        set: |c, v| {
            c.transactional_id_expiration_ms = at_least("transactional.id.expiration.ms", v, 1)?;
            Ok(())
        },
        get: |c| show(c.transactional_id_expiration_ms),
    },
    Setting {
        name: "transaction.partition.verification.enable",
        flag: None,
        dynamic: false,
        kind: Kind::Boolean,
        default: Some("true"),
        doc: "Whether a partition leader verifies with the coordinator that a transaction's \
              first batch belongs to an ongoing transaction (KIP-890 part 1).",
        set: |c, v| {
            c.transaction_partition_verification_enable =
                boolean("transaction.partition.verification.enable", v)?;
            Ok(())
        },
        get: |c| show(c.transaction_partition_verification_enable),
    },
    // ---- Sluice's own.
    Setting {
        name: "transaction.version",
        flag: None,
        dynamic: false,
        kind: Kind::Short,
        default: Some("2"),
        doc: "Sluice: the transaction.version feature level (KIP-890) until kafka-features \
              writes one into the metadata log: 2, as a new Kafka 4 cluster, bumps the producer \
              epoch at every transaction end; 0 and 1 keep clients on the KIP-98 protocol.",
        set: |c, v| {
            let level: i16 = number("transaction.version", v)?;
            if !(0..=2).contains(&level) {
                return Err(format!(
                    "transaction.version must be 0, 1 or 2 (got {level}); Kafka 4 defaults to 2"
                ));
            }
            c.transaction_version = level;
            Ok(())
        },
        get: |c| show(c.transaction_version),
    },
    Setting {
        name: "cores",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("0"),
        doc: "Sluice: shards to run, one per core; 0 runs one on every core.",
        set: |c, v| {
            c.cores = number("cores", v)?;
            Ok(())
        },
        get: |c| show(c.cores),
    },
    Setting {
        name: "metrics.listener",
        flag: None,
        dynamic: false,
        kind: Kind::String,
        default: None,
        doc: "Sluice: serve Prometheus metrics at http://HOST:PORT/metrics; off when unset.",
        set: |c, v| {
            c.metrics_listener = optional(v);
            Ok(())
        },
        get: |c| c.metrics_listener.clone(),
    },
    Setting {
        name: "batch.cache.bytes",
        flag: None,
        dynamic: false,
        kind: Kind::Long,
        default: Some("268435456"),
        doc: "Sluice: the batch cache budget of each shard, for tail reads.",
        set: |c, v| {
            c.batch_cache_bytes = number("batch.cache.bytes", v)?;
            Ok(())
        },
        get: |c| show(c.batch_cache_bytes),
    },
    Setting {
        name: "fetch.cold.max.bytes",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        // 2 MiB: a consumer catching up then takes its backlog in 2 MiB responses rather than
        // 16 MiB ones, which kept a producer's p99 on the same shards near 6.5 ms instead of
        // 17-22 ms at the same catch-up rate (perf/README.md, workload (e)).
        default: Some("2097152"),
        doc: "Sluice: of a fetch response's record bytes, the most read from disk rather than \
              memory, so a consumer catching up does not hold the disk behind producers; its \
              first batch always goes.",
        set: |c, v| {
            c.fetch_cold_max_bytes = at_least("fetch.cold.max.bytes", v, 1)?;
            Ok(())
        },
        get: |c| show(c.fetch_cold_max_bytes),
    },
    Setting {
        name: "fetch.zero.copy",
        flag: None,
        dynamic: false,
        kind: Kind::Boolean,
        default: Some("true"),
        doc: "Sluice: records on disk go from the segment files to the socket by splice, never \
              through the broker's memory; false copies them.",
        set: |c, v| {
            c.fetch_zero_copy = boolean("fetch.zero.copy", v)?;
            Ok(())
        },
        get: |c| show(c.fetch_zero_copy),
    },
    Setting {
        name: "max.in.flight.requests.per.connection",
        flag: None,
        dynamic: false,
        kind: Kind::Int,
        default: Some("64"),
        doc: "Sluice: requests of one connection read and not yet answered before the broker \
              stops reading from it.",
        set: |c, v| {
            c.max_in_flight_requests_per_connection =
                at_least("max.in.flight.requests.per.connection", v, 1)?;
            Ok(())
        },
        get: |c| show(c.max_in_flight_requests_per_connection),
    },
];

/// The settings given on the command line, each as its flag (`--group-min-session-timeout-ms
/// 6000`), in the order of [`BROKER_SETTINGS`].
#[derive(Clone, Debug, Default)]
pub struct SettingArgs {
    pub given: Vec<(&'static str, String)>,
}

impl clap::FromArgMatches for SettingArgs {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut args = SettingArgs::default();
        args.update_from_arg_matches(matches)?;
        Ok(args)
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        for s in BROKER_SETTINGS {
            if let Some(v) = matches.get_one::<String>(s.name) {
                self.given.retain(|(name, _)| *name != s.name);
                self.given.push((s.name, v.clone()));
            }
        }
        Ok(())
    }
}

impl clap::Args for SettingArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        BROKER_SETTINGS.iter().fold(cmd, |cmd, s| {
            let default = s
                .default
                .map(|d| format!(" Default {d}."))
                .unwrap_or_default();
            cmd.arg(
                clap::Arg::new(s.name)
                    .long(s.flag())
                    .value_name(s.kind.value_name())
                    .help(format!("{} (`{}`){default}", s.doc, s.name)),
            )
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// `broker/SETTINGS.md`: every setting with its flag, type, default and what it does.
#[cfg(test)]
fn settings_markdown() -> String {
    let mut out = String::from(
        "# Broker settings\n\n\
         Generated from `broker/src/config/settings.rs` (the unit test \
         `settings_md_is_generated_from_the_table` checks it; `SLUICE_WRITE_SETTINGS_MD=1 cargo \
         test -p sluice-broker settings_md` writes it). Each is a key of the TOML file \
         (`--config`), a flag, and a DescribeConfigs entry of the broker; flags win over the \
         file. Kafka's broker settings that Sluice does not read are accepted by DescribeConfigs \
         and IncrementalAlterConfigs with Kafka's defaults, not here.\n\n\
         | Setting | Flag | Type | Default | Dynamic | What it does |\n|---|---|---|---|---|---|\n",
    );
    for s in BROKER_SETTINGS {
        let kind = format!("{:?}", s.kind).to_lowercase();
        out.push_str(&format!(
            "| `{}` | `--{}` | {kind} | {} | {} |\n",
            s.name,
            s.flag(),
            s.default
                .map_or("(unset)".to_string(), |d| format!("`{d}`")),
            s.doc.replace('|', "\\|"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_dirs_are_a_list_whose_first_holds_the_metadata() {
        let mut c = BrokerConfig::default();
        c.set("log.dirs", " /d1/data , /d2/data,/d3 ").unwrap();
        assert_eq!(
            c.log_dirs,
            vec![
                PathBuf::from("/d1/data"),
                PathBuf::from("/d2/data"),
                PathBuf::from("/d3")
            ]
        );
        assert_eq!(c.data_dir, PathBuf::from("/d1/data"));
        let twice = c.set("log.dirs", "/d1,/d2,/d1").unwrap_err().to_string();
        assert!(twice.contains("/d1 twice"), "{twice}");
        assert!(c.set("log.dirs", " , ").is_err());
    }

    #[test]
    fn every_default_applies_and_reads_back_as_declared() {
        let c = BrokerConfig::default();
        for s in BROKER_SETTINGS {
            if let Some(d) = s.default {
                assert_eq!((s.get)(&c).as_deref(), Some(d), "{}", s.name);
            }
        }
        c.validate().unwrap();
    }

    /// Kafka's StandardAuthorizer reads these from the broker's properties itself, so Kafka's
    /// config catalog (`config_catalog.rs`) does not list them; they are Kafka's all the same.
    const AUTHORIZER_PROPERTIES: &[&str] = &["super.users", "allow.everyone.if.no.acl.found"];

    #[test]
    fn names_and_flags_are_unique_and_kafkas_types_are_kafkas() {
        let mut names = std::collections::HashSet::new();
        let mut flags = std::collections::HashSet::new();
        for s in BROKER_SETTINGS {
            assert!(names.insert(s.name), "{} twice", s.name);
            assert!(flags.insert(s.flag()), "--{} twice", s.flag());
            if let Some(def) = crate::config_catalog::BROKER_CONFIGS
                .iter()
                .find(|d| d.name == s.name)
            {
                assert_eq!(def.config_type, s.kind.config_type(), "{}", s.name);
                // What Sluice changes without a restart, Kafka does too.
                assert!(!s.dynamic || !def.read_only, "{}", s.name);
            } else if !AUTHORIZER_PROPERTIES.contains(&s.name) {
                assert!(s.doc.starts_with("Sluice: "), "{} is Sluice's own", s.name);
            }
        }
    }

    #[test]
    fn bad_values_are_refused_with_the_settings_name() {
        let mut c = BrokerConfig::default();
        for (name, bad) in [
            ("num.partitions", "three"),
            ("num.partitions", "0"),
            ("log.cleaner.backoff.ms", "0"),
            ("fetch.zero.copy", "yes"),
            ("transaction.version", "3"),
            ("replica.selector.class", "Nearest"),
            ("group.consumer.migration.policy", "sideways"),
            ("node.id", "-1"),
        ] {
            let e = c.set(name, bad).unwrap_err().to_string();
            assert!(e.contains(name), "{name}={bad}: {e}");
        }
        assert!(c.set("no.such.setting", "1").is_err());
        c.set("replica.selector.class", "RackAwareReplicaSelector")
            .unwrap();
        assert!(c.replica_selector_rack_aware());
    }

    #[test]
    fn settings_md_is_generated_from_the_table() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("SETTINGS.md");
        let want = settings_markdown();
        if std::env::var_os("SLUICE_WRITE_SETTINGS_MD").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "broker/SETTINGS.md is not what the table says; write it with \
             SLUICE_WRITE_SETTINGS_MD=1 cargo test -p sluice-broker settings_md"
        );
    }
}
