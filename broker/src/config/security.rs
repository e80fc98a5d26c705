//! The security settings of a listener, under Kafka's names: which security protocol a
//! listener speaks (`listener.security.protocol.map`) and the TLS key material and policy of an
//! `SSL` listener (`ssl.*`). `net/tls.rs` turns them into a rustls server configuration.

use std::fmt;
use std::path::PathBuf;

/// Kafka's security protocols.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn parse(name: &str) -> Option<SecurityProtocol> {
        Some(match name.trim().to_ascii_uppercase().as_str() {
            "PLAINTEXT" => SecurityProtocol::Plaintext,
            "SSL" => SecurityProtocol::Ssl,
            "SASL_PLAINTEXT" => SecurityProtocol::SaslPlaintext,
            "SASL_SSL" => SecurityProtocol::SaslSsl,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    /// Kafka's id of the protocol (`SecurityProtocol.id`), as broker registrations carry it.
    pub fn id(self) -> i16 {
        match self {
            SecurityProtocol::Plaintext => 0,
            SecurityProtocol::Ssl => 1,
            SecurityProtocol::SaslPlaintext => 2,
            SecurityProtocol::SaslSsl => 3,
        }
    }

    /// Whether clients on such a listener authenticate with SASL first.
    pub fn sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }

    /// Whether connections on such a listener are encrypted with TLS.
    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }
}

impl fmt::Display for SecurityProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Kafka's default `listener.security.protocol.map`, in its order: each protocol's name maps to itself.
pub const DEFAULT_PROTOCOL_MAP: &str =
    "SASL_SSL:SASL_SSL,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT";

/// Parses `listener.security.protocol.map`: `NAME:PROTOCOL` entries, comma-separated.
pub fn parse_protocol_map(value: &str) -> Result<Vec<(String, SecurityProtocol)>, String> {
    let mut out: Vec<(String, SecurityProtocol)> = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, protocol) = entry.split_once(':').ok_or_else(|| {
            format!("listener.security.protocol.map: {entry:?} is not NAME:PROTOCOL")
        })?;
        let protocol = SecurityProtocol::parse(protocol).ok_or_else(|| {
            format!(
                "listener.security.protocol.map: {protocol:?} is not one of PLAINTEXT, SSL, \
                 SASL_PLAINTEXT, SASL_SSL"
            )
        })?;
        let name = name.trim().to_string();
        if out.iter().any(|(n, _)| *n == name) {
            return Err(format!("listener.security.protocol.map names {name} twice"));
        }
        out.push((name, protocol));
    }
    Ok(out)
}

/// `ssl.client.auth`: whether a client on an SSL listener must show a certificate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClientAuth {
    #[default]
    None,
    Requested,
    Required,
}

impl ClientAuth {
    pub fn parse(value: &str) -> Result<ClientAuth, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(ClientAuth::None),
            "requested" => Ok(ClientAuth::Requested),
            "required" => Ok(ClientAuth::Required),
            other => Err(format!(
                "ssl.client.auth: {other:?} is not one of none, requested, required"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ClientAuth::None => "none",
            ClientAuth::Requested => "requested",
            ClientAuth::Required => "required",
        }
    }
}

/// The `ssl.*` settings of an SSL listener. Passwords are kept here and nowhere else: no log
/// line or DescribeConfigs answer shows them (their settings are Kafka's sensitive ones).
#[derive(Clone, Default)]
pub struct SslConfig {
    /// `ssl.keystore.type`: `PEM` (KIP-651) or `PKCS12`.
    pub keystore_type: String,
    /// `ssl.keystore.location`: the private key and its certificate chain, a PEM file or a
    /// PKCS#12 store.
    pub keystore_location: Option<PathBuf>,
    /// `ssl.keystore.password`: a PKCS#12 keystore's password.
    pub keystore_password: Option<String>,
    /// `ssl.key.password`: the password of an encrypted private key (a PEM keystore's
    /// `ENCRYPTED PRIVATE KEY`).
    pub key_password: Option<String>,
    /// `ssl.keystore.certificate.chain` and `ssl.keystore.key`: the same material inline, as
    /// PEM text (KIP-651).
    pub keystore_certificate_chain: Option<String>,
    pub keystore_key: Option<String>,
    /// `ssl.truststore.type`: `PEM` or `PKCS12`.
    pub truststore_type: String,
    /// `ssl.truststore.password`: a PKCS#12 truststore's password.
    pub truststore_password: Option<String>,
    /// `ssl.truststore.location`: PEM certificates of the authorities client certificates are
    /// checked against (mutual TLS).
    pub truststore_location: Option<PathBuf>,
    /// `ssl.truststore.certificates`: the same, inline.
    pub truststore_certificates: Option<String>,
    /// `ssl.client.auth`
    pub client_auth: ClientAuth,
    /// `ssl.enabled.protocols`: `TLSv1.2`, `TLSv1.3`.
    pub enabled_protocols: Vec<String>,
    /// `ssl.cipher.suites`: IANA names (`TLS_AES_128_GCM_SHA256`,
    /// `TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384`, ...); empty for every suite rustls offers.
    pub cipher_suites: Vec<String>,
    /// `ssl.principal.mapping.rules`: how a client certificate's subject becomes its principal
    /// (`security::principal`, which checks them at start).
    pub principal_mapping_rules: String,
}

impl fmt::Debug for SslConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hidden = |p: &Option<String>| p.as_ref().map(|_| "[hidden]");
        f.debug_struct("SslConfig")
            .field("keystore_type", &self.keystore_type)
            .field("keystore_location", &self.keystore_location)
            .field("keystore_password", &hidden(&self.keystore_password))
            .field("key_password", &hidden(&self.key_password))
            .field(
                "keystore_certificate_chain",
                &self.keystore_certificate_chain.as_ref().map(|_| "[inline]"),
            )
            .field("keystore_key", &hidden(&self.keystore_key))
            .field("truststore_type", &self.truststore_type)
            .field("truststore_password", &hidden(&self.truststore_password))
            .field("truststore_location", &self.truststore_location)
            .field(
                "truststore_certificates",
                &self.truststore_certificates.as_ref().map(|_| "[inline]"),
            )
            .field("client_auth", &self.client_auth)
            .field("enabled_protocols", &self.enabled_protocols)
            .field("cipher_suites", &self.cipher_suites)
            .field("principal_mapping_rules", &self.principal_mapping_rules)
            .finish()
    }
}

/// The SASL mechanisms a broker can run.
pub const SASL_MECHANISMS: &[&str] = &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"];

/// Kafka's login module for OAUTHBEARER.
pub const OAUTHBEARER_LOGIN_MODULE: &str =
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule";

/// The settings of OAUTHBEARER's signed-token checks (`sasl.oauthbearer.*`).
#[derive(Clone, Debug, Default)]
pub struct OAuthConfig {
    /// `sasl.oauthbearer.jwks.endpoint.url`
    pub jwks_endpoint_url: Option<String>,
    /// `sasl.oauthbearer.jwks.endpoint.refresh.ms`: how often an https JWKS is fetched again.
    pub jwks_refresh_ms: u64,
    /// `sasl.oauthbearer.jwks.endpoint.retry.backoff.ms` and `...retry.backoff.max.ms`: the
    /// first and the longest wait before fetching again after a failure.
    pub jwks_retry_backoff_ms: u64,
    pub jwks_retry_backoff_max_ms: u64,
    /// `sasl.oauthbearer.expected.audience`
    pub expected_audience: Vec<String>,
    /// `sasl.oauthbearer.expected.issuer`
    pub expected_issuer: Option<String>,
    /// `sasl.oauthbearer.sub.claim.name`
    pub sub_claim_name: String,
    /// `sasl.oauthbearer.clock.skew.seconds`
    pub clock_skew_seconds: u64,
    /// `listener.name.<listener>.oauthbearer.sasl.server.callback.handler.class`, by lower-case
    /// listener name.
    pub callback_handlers: Vec<(String, String)>,
}

impl OAuthConfig {
    /// Whether tokens are checked against a JWKS (Kafka's `OAuthBearerValidatorCallbackHandler`,
    /// or a JWKS URL set) rather than accepted unsigned.
    pub fn signed(&self) -> bool {
        self.jwks_endpoint_url.is_some() || !self.callback_handlers.is_empty()
    }
}

/// The SASL settings of the SASL listeners.
#[derive(Clone, Default)]
pub struct SaslConfig {
    /// `sasl.enabled.mechanisms`
    pub enabled_mechanisms: Vec<String>,
    /// `listener.name.<listener>.<mechanism>.sasl.jaas.config`, by lower-case listener name and
    /// mechanism. Holds passwords: never logged.
    pub jaas: Vec<(String, String, Jaas)>,
    /// `connection.failed.authentication.delay.ms`
    pub failed_authentication_delay_ms: u64,
    /// `sasl.server.max.receive.size`: the largest frame read before a client authenticated.
    pub max_receive_size: usize,
    /// `connections.max.reauth.ms`: how long an authenticated session lasts before the client
    /// must log in again on its connection (KIP-368); 0, for ever.
    pub max_reauth_ms: u64,
    /// `sasl.oauthbearer.*`
    pub oauth: OAuthConfig,
}

impl fmt::Debug for SaslConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SaslConfig")
            .field("enabled_mechanisms", &self.enabled_mechanisms)
            .field(
                "jaas",
                &self
                    .jaas
                    .iter()
                    .map(|(l, m, j)| format!("{l}.{m}: {}", j.module))
                    .collect::<Vec<_>>(),
            )
            .field(
                "failed_authentication_delay_ms",
                &self.failed_authentication_delay_ms,
            )
            .field("max_receive_size", &self.max_receive_size)
            .field("max_reauth_ms", &self.max_reauth_ms)
            .finish()
    }
}

impl SaslConfig {
    /// The JAAS configuration of `mechanism` on the listener `listener`.
    pub fn jaas_of(&self, listener: &str, mechanism: &str) -> Option<&Jaas> {
        let (listener, mechanism) = (
            listener.to_ascii_lowercase(),
            mechanism.to_ascii_lowercase(),
        );
        self.jaas
            .iter()
            .find(|(l, m, _)| *l == listener && *m == mechanism)
            .map(|(_, _, j)| j)
    }

    /// Sets `listener.name.<listener>.<mechanism>.sasl.jaas.config`; `Ok(false)` when `name`
    /// is not of that form.
    pub fn set_prefixed(&mut self, name: &str, value: &str) -> Result<bool, String> {
        let Some(rest) = name.strip_prefix("listener.name.") else {
            return Ok(false);
        };
        if let Some(listener) = rest.strip_suffix(".oauthbearer.sasl.server.callback.handler.class")
        {
            let listener = listener.to_ascii_lowercase();
            self.oauth.callback_handlers.retain(|(l, _)| *l != listener);
            if !value.trim().is_empty() {
                self.oauth
                    .callback_handlers
                    .push((listener, value.trim().to_string()));
            }
            return Ok(true);
        }
        let Some(rest) = rest.strip_suffix(".sasl.jaas.config") else {
            return Ok(false);
        };
        let Some((listener, mechanism)) = rest.split_once('.') else {
            return Err(format!(
                "{name}: name the listener and the mechanism, \
                 listener.name.<listener>.<mechanism>.sasl.jaas.config"
            ));
        };
        let jaas = Jaas::parse(value).map_err(|e| format!("{name}: {e}"))?;
        let (listener, mechanism) = (
            listener.to_ascii_lowercase(),
            mechanism.to_ascii_lowercase(),
        );
        self.jaas
            .retain(|(l, m, _)| !(*l == listener && *m == mechanism));
        self.jaas.push((listener, mechanism, jaas));
        Ok(true)
    }
}

/// One JAAS login module entry, as Kafka reads `sasl.jaas.config`:
/// `<module class> required key="value" ...;`.
#[derive(Clone, PartialEq, Eq)]
pub struct Jaas {
    pub module: String,
    pub options: Vec<(String, String)>,
}

/// Shows the module and the option names, never their values (passwords).
impl fmt::Debug for Jaas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Jaas")
            .field("module", &self.module)
            .field(
                "options",
                &self
                    .options
                    .iter()
                    .map(|(k, _)| k.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Kafka's login module for PLAIN: its `user_<name>="<password>"` options are the users.
pub const PLAIN_LOGIN_MODULE: &str = "org.apache.kafka.common.security.plain.PlainLoginModule";
pub const SCRAM_LOGIN_MODULE: &str = "org.apache.kafka.common.security.scram.ScramLoginModule";

impl Jaas {
    /// Parses one entry. Values are quoted (`"..."`, with `\"` and `\\` escapes) or bare words.
    /// The error never quotes a value: values hold passwords.
    pub fn parse(text: &str) -> Result<Jaas, String> {
        let mut chars = text.trim().chars().peekable();
        let word = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>| {
            while chars.peek().is_some_and(|c| c.is_whitespace()) {
                chars.next();
            }
            let mut w = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() || c == '=' || c == ';' {
                    break;
                }
                w.push(c);
                chars.next();
            }
            w
        };
        let module = word(&mut chars);
        if module.is_empty() {
            return Err("the JAAS entry names no login module".into());
        }
        let flag = word(&mut chars);
        if !matches!(
            flag.as_str(),
            "required" | "requisite" | "sufficient" | "optional"
        ) {
            return Err(format!(
                "the login module {module} needs a control flag (required) before its options"
            ));
        }
        let mut options = Vec::new();
        loop {
            while chars.peek().is_some_and(|c| c.is_whitespace()) {
                chars.next();
            }
            match chars.peek() {
                None => return Err("the JAAS entry does not end with ';'".into()),
                Some(';') => {
                    chars.next();
                    break;
                }
                _ => {}
            }
            let key = word(&mut chars);
            if key.is_empty() || chars.next() != Some('=') {
                return Err(format!("option {key:?} of {module} has no '=' and value"));
            }
            let mut value = String::new();
            if chars.peek() == Some(&'"') {
                chars.next();
                loop {
                    match chars.next() {
                        None => return Err(format!("the value of {key} has no closing quote")),
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c) => value.push(c),
                            None => return Err(format!("the value of {key} ends in '\\'")),
                        },
                        Some(c) => value.push(c),
                    }
                }
            } else {
                value = word(&mut chars);
            }
            options.push((key, value));
        }
        if chars.any(|c| !c.is_whitespace()) {
            return Err("one login module entry per listener and mechanism".into());
        }
        Ok(Jaas { module, options })
    }

    /// PLAIN's users and passwords (`user_<name>` options).
    pub fn plain_users(&self) -> Vec<(String, String)> {
        self.options
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("user_")?.to_string(), v.clone())))
            .collect()
    }
}

/// A comma-separated list, trimmed, empty entries dropped.
pub fn list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_protocol_map_is_kafkas() {
        let map =
            parse_protocol_map("CLIENT:SASL_SSL, REPLICATION:ssl,CONTROLLER:PLAINTEXT").unwrap();
        assert_eq!(
            map,
            vec![
                ("CLIENT".to_string(), SecurityProtocol::SaslSsl),
                ("REPLICATION".to_string(), SecurityProtocol::Ssl),
                ("CONTROLLER".to_string(), SecurityProtocol::Plaintext),
            ]
        );
        assert!(parse_protocol_map("CLIENT")
            .unwrap_err()
            .contains("NAME:PROTOCOL"));
        assert!(parse_protocol_map("CLIENT:TLS")
            .unwrap_err()
            .contains("not one of"));
        assert!(parse_protocol_map("A:SSL,A:SSL")
            .unwrap_err()
            .contains("twice"));
        assert_eq!(parse_protocol_map(DEFAULT_PROTOCOL_MAP).unwrap().len(), 4);
    }

    #[test]
    fn jaas_entries_read_as_kafka_writes_them() {
        let j = Jaas::parse(
            r#"org.apache.kafka.common.security.plain.PlainLoginModule required
               username="admin" password="admin-secret"
               user_admin="admin-secret" user_alice="al\"ice;pw" user_bob=bare;"#,
        )
        .unwrap();
        assert_eq!(j.module, PLAIN_LOGIN_MODULE);
        assert_eq!(j.options[0], ("username".to_string(), "admin".to_string()));
        assert_eq!(
            j.plain_users(),
            vec![
                ("admin".to_string(), "admin-secret".to_string()),
                ("alice".to_string(), "al\"ice;pw".to_string()),
                ("bob".to_string(), "bare".to_string()),
            ]
        );
        for (bad, says) in [
            ("", "no login module"),
            ("M user_a=\"x\";", "control flag"),
            ("M required user_a=\"x\"", "does not end"),
            ("M required user_a=\"secret;", "no closing quote"),
            ("M required user_a;", "has no '='"),
            ("M required; N required;", "one login module"),
        ] {
            let e = Jaas::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
            assert!(!e.contains("secret"), "{bad:?}: {e}");
        }
        let mut sasl = SaslConfig::default();
        assert_eq!(
            sasl.set_prefixed("sasl.enabled.mechanisms", "PLAIN"),
            Ok(false)
        );
        assert_eq!(
            sasl.set_prefixed(
                "listener.name.CLIENT.PLAIN.sasl.jaas.config",
                "M required user_a=\"b\";"
            ),
            Ok(true)
        );
        assert!(sasl.jaas_of("client", "plain").is_some());
        assert!(!format!("{sasl:?}").contains("\"b\""));
        let shown = format!("{j:?}");
        assert!(
            shown.contains("user_alice") && !shown.contains("admin-secret"),
            "{shown}"
        );
    }

    #[test]
    fn passwords_never_show_in_debug_output() {
        let ssl = SslConfig {
            keystore_password: Some("hunter2".into()),
            key_password: Some("s3cret".into()),
            keystore_key: Some("-----BEGIN PRIVATE KEY-----xyz".into()),
            ..SslConfig::default()
        };
        let shown = format!("{ssl:?}");
        assert!(!shown.contains("hunter2") && !shown.contains("s3cret") && !shown.contains("xyz"));
        assert!(shown.contains("[hidden]"));
    }
}
