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

/// Kafka's default `listener.security.protocol.map`: each protocol's name maps to itself.
pub const DEFAULT_PROTOCOL_MAP: &str =
    "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL";

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
    /// `ssl.keystore.type`: `PEM` (KIP-651), the only type read so far.
    pub keystore_type: String,
    /// `ssl.keystore.location`: a PEM file holding the private key and its certificate chain.
    pub keystore_location: Option<PathBuf>,
    /// `ssl.keystore.password`: for a PKCS#12 keystore; a PEM keystore's key is not encrypted.
    pub keystore_password: Option<String>,
    /// `ssl.key.password`: the password of an encrypted private key.
    pub key_password: Option<String>,
    /// `ssl.keystore.certificate.chain` and `ssl.keystore.key`: the same material inline, as
    /// PEM text (KIP-651).
    pub keystore_certificate_chain: Option<String>,
    pub keystore_key: Option<String>,
    /// `ssl.truststore.type`: `PEM`.
    pub truststore_type: String,
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
            .field("truststore_location", &self.truststore_location)
            .field(
                "truststore_certificates",
                &self.truststore_certificates.as_ref().map(|_| "[inline]"),
            )
            .field("client_auth", &self.client_auth)
            .field("enabled_protocols", &self.enabled_protocols)
            .field("cipher_suites", &self.cipher_suites)
            .finish()
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
