//! SASL OAUTHBEARER (RFC 7628), as Kafka's broker checks it. The client's one message is a
//! GS2 header and `auth=Bearer <token>` among `\x01`-separated pairs; its token is a JWT whose
//! subject is the principal (`User:<sub>`).
//!
//! Two ways to check a token, chosen per listener as Kafka chooses them:
//! - **Unsecured** (Kafka's default, `OAuthBearerUnsecuredValidatorCallbackHandler`, for tests
//!   and development): an unsigned JWS (`alg: none`), its expiry, principal claim and required
//!   scopes checked under the listener's JAAS options (`unsecuredValidatorPrincipalClaimName`,
//!   `unsecuredValidatorScopeClaimName`, `unsecuredValidatorRequiredScope`,
//!   `unsecuredValidatorAllowableClockSkewMs`).
//! - **Signed** (`OAuthBearerValidatorCallbackHandler`, KIP-768): the token's signature checked
//!   against the keys of `sasl.oauthbearer.jwks.endpoint.url` (an `https:` endpoint fetched by
//!   [`RemoteJwks`], or a `file:` URL read again when the file changes), asymmetric algorithms
//!   only, then its expiry (with
//!   `sasl.oauthbearer.clock.skew.seconds`), audience (`sasl.oauthbearer.expected.audience`),
//!   issuer (`sasl.oauthbearer.expected.issuer`) and subject claim
//!   (`sasl.oauthbearer.sub.claim.name`).
//!
//! A refused token is answered with RFC 7628's error (`{"status":"invalid_token"}`) and, after
//! the client's `\x01`, SASL_AUTHENTICATION_FAILED; the reason goes to the log, never the token.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;
use base64::Engine as _;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

use crate::config::security::{OAuthConfig, SslConfig};

/// Kafka's class names for the server callback handler that checks signed tokens.
pub const VALIDATOR_CALLBACK_HANDLER: &str =
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler";

/// RFC 7628's error answer to a refused token.
pub const INVALID_TOKEN: &[u8] = br#"{"status":"invalid_token"}"#;

/// How a listener checks bearer tokens.
pub enum Validator {
    Unsecured(Unsecured),
    Signed(Signed),
}

/// Kafka's unsecured validator's options (the listener's JAAS entry).
pub struct Unsecured {
    pub principal_claim: String,
    pub scope_claim: String,
    pub required_scopes: Vec<String>,
    pub clock_skew_ms: u64,
}

/// Signed tokens against a JWKS.
pub struct Signed {
    jwks: Jwks,
    audience: Vec<String>,
    issuer: Option<String>,
    sub_claim: String,
    clock_skew_s: u64,
}

impl Validator {
    /// The validator `oauth` and the listener's JAAS options describe.
    pub fn new(
        oauth: &OAuthConfig,
        ssl: &SslConfig,
        jaas_options: &[(String, String)],
    ) -> Result<Validator, String> {
        if oauth.signed() {
            let url = oauth.jwks_endpoint_url.as_deref().ok_or_else(|| {
                format!("{VALIDATOR_CALLBACK_HANDLER} needs sasl.oauthbearer.jwks.endpoint.url")
            })?;
            let jwks = if url.starts_with("https://") || url.starts_with("http://") {
                Jwks::Remote(RemoteJwks::of(url, oauth, ssl)?)
            } else {
                let path = url
                    .strip_prefix("file://")
                    .or_else(|| url.strip_prefix("file:"))
                    .ok_or_else(|| {
                        format!(
                            "sasl.oauthbearer.jwks.endpoint.url {url}: an https:, http: or file: URL"
                        )
                    })?;
                Jwks::File {
                    path: PathBuf::from(path),
                    keys: Mutex::new(None),
                }
            };
            let signed = Signed {
                jwks,
                audience: oauth.expected_audience.clone(),
                issuer: oauth.expected_issuer.clone(),
                sub_claim: oauth.sub_claim_name.clone(),
                clock_skew_s: oauth.clock_skew_seconds,
            };
            signed.keys()?;
            return Ok(Validator::Signed(signed));
        }
        let option = |name: &str| {
            jaas_options
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        Ok(Validator::Unsecured(Unsecured {
            principal_claim: option("unsecuredValidatorPrincipalClaimName")
                .unwrap_or_else(|| "sub".into()),
            scope_claim: option("unsecuredValidatorScopeClaimName")
                .unwrap_or_else(|| "scope".into()),
            required_scopes: option("unsecuredValidatorRequiredScope")
                .map(|s| s.split_whitespace().map(str::to_string).collect())
                .unwrap_or_default(),
            clock_skew_ms: match option("unsecuredValidatorAllowableClockSkewMs") {
                Some(v) => v.parse().map_err(|_| {
                    format!("unsecuredValidatorAllowableClockSkewMs {v:?} is not a number")
                })?,
                None => 0,
            },
        }))
    }

    /// The principal's name the client-first message `message` proves and when its token
    /// expires (milliseconds since the epoch), or why not.
    pub fn authenticate(&self, message: &[u8]) -> Result<(String, u64), String> {
        let token = bearer_token(message)?;
        match self {
            Validator::Unsecured(u) => u.validate(token, now_ms()),
            Validator::Signed(s) => s.validate(token),
        }
    }
}

/// Now, in milliseconds since the epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The token of the client-first message: `gs2-header \x01 (key=value \x01)* \x01`, one pair
/// `auth=Bearer <token>`.
pub fn bearer_token(message: &[u8]) -> Result<&str, String> {
    let text = std::str::from_utf8(message)
        .map_err(|_| "the OAUTHBEARER message is not UTF-8".to_string())?;
    let (gs2, rest) = text
        .split_once('\u{1}')
        .ok_or("the OAUTHBEARER message has no \\x01 after its GS2 header")?;
    if !(gs2.starts_with("n,") || gs2.starts_with("y,")) || !gs2.ends_with(',') {
        return Err("the OAUTHBEARER message's GS2 header is not n,[a=<authzid>],".into());
    }
    let pairs = rest
        .strip_suffix("\u{1}\u{1}")
        .ok_or("the OAUTHBEARER message does not end with \\x01\\x01")?;
    let mut token = None;
    for pair in pairs.split('\u{1}') {
        let (key, value) = pair
            .split_once('=')
            .ok_or("an OAUTHBEARER pair is not key=value")?;
        if key == "auth" {
            let t = value
                .strip_prefix("Bearer ")
                .ok_or("the auth pair is not \"Bearer <token>\"")?
                .trim();
            token = Some(t);
        }
    }
    token
        .filter(|t| !t.is_empty())
        .ok_or_else(|| "no auth=Bearer <token> pair".into())
}

impl Unsecured {
    /// Kafka's unsecured checks: `alg: none`, an expiry not past (with the allowed skew), a
    /// principal claim, the required scopes.
    fn validate(&self, token: &str, now_ms: u64) -> Result<(String, u64), String> {
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("the token is not a JWS (header.payload.signature)".into());
        };
        if !signature.is_empty() {
            return Err("an unsecured token carries no signature".into());
        }
        let header = json_part(header, "header")?;
        if header.get("alg").and_then(Value::as_str) != Some("none") {
            return Err("an unsecured token's alg is none".into());
        }
        let claims = json_part(payload, "claims")?;
        let exp = claims
            .get("exp")
            .and_then(Value::as_f64)
            .ok_or("the token has no exp claim")?;
        let exp_ms = (exp * 1000.0) as u64;
        if now_ms > exp_ms.saturating_add(self.clock_skew_ms) {
            return Err(format!("the token expired at {exp_ms} ms"));
        }
        if let Some(iat) = claims.get("iat").and_then(Value::as_f64) {
            if (iat * 1000.0) as u64 > exp_ms {
                return Err("the token was issued after it expires".into());
            }
        }
        let principal = claims
            .get(&self.principal_claim)
            .and_then(Value::as_str)
            .filter(|p| !p.trim().is_empty())
            .ok_or_else(|| format!("the token has no {} claim", self.principal_claim))?;
        let scopes = scopes(claims.get(&self.scope_claim));
        if let Some(missing) = self.required_scopes.iter().find(|s| !scopes.contains(s)) {
            return Err(format!("the token lacks the required scope {missing}"));
        }
        Ok((principal.to_string(), exp_ms))
    }
}

/// A scope claim: one space-separated string, or a list.
fn scopes(claim: Option<&Value>) -> Vec<String> {
    match claim {
        Some(Value::String(s)) => s.split_whitespace().map(str::to_string).collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

fn json_part(part: &str, what: &str) -> Result<Value, String> {
    let bytes = BASE64URL
        .decode(part.trim_end_matches('='))
        .map_err(|_| format!("the token's {what} is not base64url"))?;
    serde_json::from_slice(&bytes).map_err(|_| format!("the token's {what} is not JSON"))
}

/// Where the signing keys come from.
enum Jwks {
    /// A file, read again when it changes: the key set and the modification time it was read
    /// at.
    File {
        path: PathBuf,
        keys: Mutex<Option<(SystemTime, Arc<JwkSet>)>>,
    },
    Remote(Arc<RemoteJwks>),
}

/// A JWKS served over HTTP(S), fetched by a thread of its own, one per URL in the process (every
/// shard's validator shares it): at start, every `sasl.oauthbearer.jwks.endpoint.refresh.ms`,
/// and early when a token names a key the set lacks (a rotation), at most once a second; a
/// failed fetch is tried again after the retry backoff, doubling, and the last good set stays
/// in force meanwhile.
pub struct RemoteJwks {
    keys: Mutex<Arc<JwkSet>>,
    /// Asks the fetching thread for an early fetch.
    wake: std::sync::mpsc::SyncSender<()>,
}

/// The least time between two fetches a token asked for.
const EARLY_FETCH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

impl RemoteJwks {
    /// The process's fetcher of `url`, started (and its first fetch done) on first use.
    fn of(url: &str, oauth: &OAuthConfig, ssl: &SslConfig) -> Result<Arc<RemoteJwks>, String> {
        static REMOTES: std::sync::LazyLock<
            Mutex<std::collections::HashMap<String, Arc<RemoteJwks>>>,
        > = std::sync::LazyLock::new(Default::default);
        let mut remotes = REMOTES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(remote) = remotes.get(url) {
            return Ok(remote.clone());
        }
        let agent = http_agent(ssl)?;
        let first = fetch(&agent, url)?;
        let (wake, woken) = std::sync::mpsc::sync_channel(1);
        let remote = Arc::new(RemoteJwks {
            keys: Mutex::new(first),
            wake,
        });
        let refresh = std::time::Duration::from_millis(oauth.jwks_refresh_ms.max(1));
        let first_backoff = std::time::Duration::from_millis(oauth.jwks_retry_backoff_ms.max(1));
        let max_backoff = std::time::Duration::from_millis(oauth.jwks_retry_backoff_max_ms.max(1));
        let (me, url_owned) = (remote.clone(), url.to_string());
        std::thread::Builder::new()
            .name("jwks-refresh".into())
            .spawn(move || {
                let mut fetched = std::time::Instant::now();
                let mut wait = refresh;
                let mut backoff = first_backoff;
                loop {
                    match woken.recv_timeout(wait) {
                        Ok(()) if fetched.elapsed() < EARLY_FETCH_INTERVAL => {
                            wait = EARLY_FETCH_INTERVAL - fetched.elapsed();
                            continue;
                        }
                        Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                    fetched = std::time::Instant::now();
                    match fetch(&agent, &url_owned) {
                        Ok(set) => {
                            *me.keys.lock().unwrap_or_else(|e| e.into_inner()) = set;
                            wait = refresh;
                            backoff = first_backoff;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "fetching the OAUTHBEARER JWKS failed; the keys fetched before stay in force");
                            wait = backoff;
                            backoff = (backoff * 2).min(max_backoff);
                        }
                    }
                }
            })
            .map_err(|e| format!("cannot start the JWKS fetcher: {e}"))?;
        remotes.insert(url.to_string(), remote.clone());
        Ok(remote)
    }
}

/// The HTTP client of JWKS fetches: trusting `ssl.truststore.*` when it is set, the Web PKI's
/// authorities otherwise; bounded in time.
fn http_agent(ssl: &SslConfig) -> Result<ureq::Agent, String> {
    let mut tls = ureq::tls::TlsConfig::builder();
    if ssl.truststore_location.is_some() || ssl.truststore_certificates.is_some() {
        let certs = super::tls::truststore_certificates(ssl)
            .map_err(|e| format!("the JWKS endpoint's authorities: {e:#}"))?;
        let certs = certs
            .iter()
            .map(|c| ureq::tls::Certificate::from_der(c.as_ref()).to_owned())
            .collect();
        tls = tls.root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs)));
    }
    Ok(ureq::Agent::config_builder()
        .tls_config(tls.build())
        .timeout_global(Some(std::time::Duration::from_secs(10)))
        .build()
        .into())
}

/// One fetch of the JWKS at `url`: a key set with at least one key.
fn fetch(agent: &ureq::Agent, url: &str) -> Result<Arc<JwkSet>, String> {
    let body = agent
        .get(url)
        .call()
        .and_then(|mut r| r.body_mut().read_to_vec())
        .map_err(|e| format!("the JWKS at {url}: {e}"))?;
    let set: JwkSet = serde_json::from_slice(&body)
        .map_err(|e| format!("the JWKS at {url} is not a JWK set: {e}"))?;
    if set.keys.is_empty() {
        return Err(format!("the JWKS at {url} holds no key"));
    }
    Ok(Arc::new(set))
}

impl Signed {
    /// The key set: the file's, read again when it changed, or the last fetched.
    fn keys(&self) -> Result<Arc<JwkSet>, String> {
        let (path, keys) = match &self.jwks {
            Jwks::Remote(remote) => {
                return Ok(remote
                    .keys
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone())
            }
            Jwks::File { path, keys } => (path, keys),
        };
        let modified = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .map_err(|e| format!("the JWKS file {}: {e}", path.display()))?;
        let mut keys = keys.lock().expect("the JWKS lock is never poisoned");
        if let Some((at, set)) = keys.as_ref() {
            if *at == modified {
                return Ok(set.clone());
            }
        }
        let text =
            std::fs::read(path).map_err(|e| format!("the JWKS file {}: {e}", path.display()))?;
        let set: JwkSet = serde_json::from_slice(&text)
            .map_err(|e| format!("the JWKS file {} is not a JWK set: {e}", path.display()))?;
        if set.keys.is_empty() {
            return Err(format!("the JWKS file {} holds no key", path.display()));
        }
        let set = Arc::new(set);
        *keys = Some((modified, set.clone()));
        Ok(set)
    }

    /// A token named a key the set lacks: an early fetch, for a remote set.
    fn missing_key(&self) {
        if let Jwks::Remote(remote) = &self.jwks {
            let _ = remote.wake.try_send(());
        }
    }

    fn validate(&self, token: &str) -> Result<(String, u64), String> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| format!("the token's header: {e}"))?;
        // Asymmetric algorithms only: a key set's public key is no HMAC secret.
        if !matches!(
            header.alg,
            Algorithm::RS256
                | Algorithm::RS384
                | Algorithm::RS512
                | Algorithm::PS256
                | Algorithm::PS384
                | Algorithm::PS512
                | Algorithm::ES256
                | Algorithm::ES384
                | Algorithm::EdDSA
        ) {
            return Err(format!(
                "the token's algorithm {:?} is not accepted",
                header.alg
            ));
        }
        let keys = self.keys()?;
        let jwk = match &header.kid {
            Some(kid) => match keys.find(kid) {
                Some(jwk) => jwk,
                None => {
                    self.missing_key();
                    return Err(format!("no key {kid:?} in the JWKS"));
                }
            },
            None if keys.keys.len() == 1 => &keys.keys[0],
            None => return Err("the token names no key (kid) and the JWKS holds several".into()),
        };
        let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("the JWKS key: {e}"))?;
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.clock_skew_s;
        validation.validate_exp = true;
        if self.audience.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&self.audience);
        }
        if let Some(issuer) = &self.issuer {
            validation.set_issuer(&[issuer]);
        }
        let data = jsonwebtoken::decode::<Value>(token, &key, &validation)
            .map_err(|e| format!("the token is refused: {e}"))?;
        let expires_ms = data
            .claims
            .get("exp")
            .and_then(Value::as_f64)
            .map_or(u64::MAX, |exp| (exp * 1000.0) as u64);
        data.claims
            .get(&self.sub_claim)
            .and_then(Value::as_str)
            .filter(|s| !s.trim().is_empty())
            .map(|s| (s.to_string(), expires_ms))
            .ok_or_else(|| format!("the token has no {} claim", self.sub_claim))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unsecured_token(claims: &str) -> String {
        format!(
            "{}.{}.",
            BASE64URL.encode(r#"{"alg":"none"}"#),
            BASE64URL.encode(claims)
        )
    }

    fn message(token: &str) -> Vec<u8> {
        format!("n,,\u{1}auth=Bearer {token}\u{1}\u{1}").into_bytes()
    }

    fn unsecured(required: &[&str]) -> Unsecured {
        Unsecured {
            principal_claim: "sub".into(),
            scope_claim: "scope".into(),
            required_scopes: required.iter().map(|s| s.to_string()).collect(),
            clock_skew_ms: 0,
        }
    }

    #[test]
    fn the_message_carries_one_bearer_token() {
        assert_eq!(bearer_token(&message("abc")).unwrap(), "abc");
        let with_extension = b"n,a=alice,\x01host=h\x01auth=Bearer t.k.\x01ext=1\x01\x01";
        assert_eq!(bearer_token(with_extension).unwrap(), "t.k.");
        for bad in [
            &b"n,,auth=Bearer x"[..],
            b"p=x,,\x01auth=Bearer x\x01\x01",
            b"n,,\x01auth=Basic x\x01\x01",
            b"n,,\x01\x01",
            b"n,,\x01auth=Bearer x\x01",
        ] {
            assert!(bearer_token(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn unsecured_tokens_are_checked_as_kafka_checks_them() {
        let now = 1_700_000_000_000;
        let good =
            unsecured_token(r#"{"sub":"alice","exp":1700000100,"iat":1700000000,"scope":"a b"}"#);
        assert_eq!(unsecured(&["a"]).validate(&good, now).unwrap().0, "alice");
        assert!(
            unsecured(&["c"]).validate(&good, now).is_err(),
            "missing scope"
        );
        let expired = unsecured_token(r#"{"sub":"alice","exp":1699999999}"#);
        assert!(unsecured(&[]).validate(&expired, now).is_err());
        let skewed = Unsecured {
            clock_skew_ms: 5_000,
            ..unsecured(&[])
        };
        assert_eq!(skewed.validate(&expired, now).unwrap().0, "alice");
        let no_sub = unsecured_token(r#"{"exp":1700000100}"#);
        assert!(unsecured(&[]).validate(&no_sub, now).is_err());
        let signed = format!("{}sig", unsecured_token(r#"{"sub":"a","exp":1700000100}"#));
        assert!(unsecured(&[]).validate(&signed, now).is_err());
        let other_alg = format!(
            "{}.{}.",
            BASE64URL.encode(r#"{"alg":"HS256"}"#),
            BASE64URL.encode(r#"{"sub":"a","exp":1700000100}"#)
        );
        assert!(unsecured(&[]).validate(&other_alg, now).is_err());
        assert!(unsecured(&[]).validate("not-a-jwt", now).is_err());
    }
}
