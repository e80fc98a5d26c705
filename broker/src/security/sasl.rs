//! SASL authentication on a `SASL_PLAINTEXT` or `SASL_SSL` listener, as Kafka runs it: after
//! ApiVersions, a SaslHandshake names the mechanism, then SaslAuthenticate requests carry its
//! tokens; until the client is in, nothing else is served (the connection closes, as Kafka's
//! does on any other request).
//!
//! [`Authenticator`] is a connection's authentication, I/O-free: it takes the decoded SASL
//! requests and says what to answer and whether the client is in, out (the connection closes
//! after `connection.failed.authentication.delay.ms`) or still talking. `net/mod.rs` reads the
//! frames and writes the answers.
//!
//! Mechanisms: PLAIN (RFC 4616), its users and passwords from Kafka's `PlainLoginModule`
//! options (`user_<name>="<password>"`) in `listener.name.<l>.plain.sasl.jaas.config`; and
//! SCRAM-SHA-256 and SCRAM-SHA-512 (`scram.rs`), two round trips, with the credentials the
//! metadata log holds as of each step (the caller passes them in: [`ScramLookup`]).
//! Passwords and proofs are compared in constant time and never logged; a refusal does not say
//! whether the user exists.
//!
//! Re-authentication (KIP-368): with `connections.max.reauth.ms`, or an OAUTHBEARER token that
//! expires, a login's session has a lifetime, sent in the SaslAuthenticate response; the client
//! logs in again on its connection before it ends (a SaslHandshake from a client already in
//! starts it: [`Authenticator::begin_reauthentication`]), with the same mechanism and as the
//! same principal. The connection closes one that does not, on its next request.

use std::collections::HashMap;
use std::rc::Rc;

use bytes::Bytes;
use kafka_protocol::messages::{
    ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use subtle::ConstantTimeEq;

use super::scram;
use crate::config::BrokerConfig;
use sluice_replication::records::UserScramCredentialRecord;

/// A user's SCRAM credential for a mechanism id, as the metadata image holds it now.
pub type ScramLookup<'a> = &'a dyn Fn(&str, i8) -> Option<UserScramCredentialRecord>;

/// Kafka's principal for a client that did not authenticate.
pub const ANONYMOUS: &str = "User:ANONYMOUS";

/// What a listener's SASL accepts: its mechanisms and their credentials. One per shard.
pub struct SaslServer {
    mechanisms: Vec<String>,
    /// PLAIN's users and their passwords.
    plain: HashMap<String, String>,
    /// How OAUTHBEARER's tokens are checked, when it is enabled.
    oauth: Option<super::oauthbearer::Validator>,
    /// `connections.max.reauth.ms`: 0, sessions do not expire (unless their token does).
    max_reauth_ms: u64,
}

impl SaslServer {
    /// The SASL of the listener `listener`; an error when its OAUTHBEARER settings do not
    /// make a validator (the server checks each SASL listener so at start).
    pub fn new(config: &BrokerConfig, listener: &str) -> Result<SaslServer, String> {
        let plain = config
            .sasl
            .jaas_of(listener, "PLAIN")
            .map(|j| j.plain_users().into_iter().collect())
            .unwrap_or_default();
        let mechanisms = config.sasl.enabled_mechanisms.clone();
        let oauth = if mechanisms.iter().any(|m| m == "OAUTHBEARER") {
            let options = config
                .sasl
                .jaas_of(listener, "OAUTHBEARER")
                .map(|j| j.options.clone())
                .unwrap_or_default();
            Some(
                super::oauthbearer::Validator::new(&config.sasl.oauth, &config.ssl, &options)
                    .map_err(|e| format!("listener {listener}, OAUTHBEARER: {e}"))?,
            )
        } else {
            None
        };
        Ok(SaslServer {
            mechanisms,
            plain,
            oauth,
            max_reauth_ms: config.sasl.max_reauth_ms,
        })
    }

    /// A server with these mechanisms and PLAIN users, as the settings would give it.
    pub fn with_users(mechanisms: Vec<String>, plain: HashMap<String, String>) -> SaslServer {
        SaslServer {
            mechanisms,
            plain,
            oauth: None,
            max_reauth_ms: 0,
        }
    }

    /// The same server with sessions that last `ms` (`connections.max.reauth.ms`).
    pub fn with_max_reauth_ms(mut self, ms: u64) -> SaslServer {
        self.max_reauth_ms = ms;
        self
    }

    /// PLAIN's check: the password of `user`, compared in constant time.
    fn plain_ok(&self, user: &str, password: &[u8]) -> bool {
        match self.plain.get(user) {
            Some(expected) => expected.as_bytes().ct_eq(password).into(),
            None => {
                // The same work for an unknown user as for a known one.
                let _ = password.ct_eq(password);
                false
            }
        }
    }
}

#[derive(Debug)]
enum State {
    /// Waiting for SaslHandshake.
    Handshake,
    /// The mechanism is chosen; waiting for its token: in a SaslAuthenticate request, or bare
    /// (`raw`, after a version 0 handshake).
    Token {
        mechanism: String,
        raw: bool,
    },
    /// SCRAM's server-first message sent; waiting for the client's final one.
    ScramFinal {
        exchange: Box<scram::ServerFirst>,
        raw: bool,
    },
    /// An OAUTHBEARER token refused and RFC 7628's error sent; waiting for the client's `\x01`
    /// before failing (`why` for the log).
    OAuthRefused {
        why: String,
        raw: bool,
    },
    Authenticated,
}

/// What the connection does after a SASL request.
#[derive(Debug)]
pub enum Outcome<R> {
    /// Answer it and read on.
    Answer(R),
    /// Answer it: the client is in, as this principal.
    In(R, String),
    /// Answer it, wait `connection.failed.authentication.delay.ms`, and close: `why` for the log
    /// (it names no password).
    Out(R, String),
}

impl<R> Outcome<R> {
    /// The same outcome with its answer turned into another type.
    pub fn map<T>(self, f: impl FnOnce(R) -> T) -> Outcome<T> {
        match self {
            Outcome::Answer(r) => Outcome::Answer(f(r)),
            Outcome::In(r, principal) => Outcome::In(f(r), principal),
            Outcome::Out(r, why) => Outcome::Out(f(r), why),
        }
    }
}

/// A client's login, which its re-authentications must keep (KIP-368).
#[derive(Debug, Clone)]
struct Session {
    mechanism: String,
    principal: String,
    /// How long it lasts, as the SaslAuthenticate response told the client; `None`: for ever.
    lifetime_ms: Option<u64>,
}

/// One connection's authentication.
pub struct Authenticator {
    server: Rc<SaslServer>,
    state: State,
    /// The last login, once there is one.
    session: Option<Session>,
    /// Whether the exchange under way is a re-authentication of `session`.
    reauthenticating: bool,
    /// When the last re-authentication began: Kafka takes at most one a second.
    reauthentication_began: Option<std::time::Instant>,
}

impl Authenticator {
    pub fn new(server: Rc<SaslServer>) -> Authenticator {
        Authenticator {
            server,
            state: State::Handshake,
            session: None,
            reauthenticating: false,
            reauthentication_began: None,
        }
    }

    pub fn authenticated(&self) -> bool {
        matches!(self.state, State::Authenticated)
    }

    /// Whether the exchange under way re-authenticates a client already in.
    pub fn reauthenticating(&self) -> bool {
        self.reauthenticating
    }

    /// How long the session of the last login lasts (`None`: as long as the connection).
    pub fn session_lifetime_ms(&self) -> Option<u64> {
        self.session.as_ref().and_then(|s| s.lifetime_ms)
    }

    /// A SaslHandshake from a client already in: starts its re-authentication when its session
    /// expires (re-authentication is on) and the last one began a second ago or more; otherwise
    /// `false`, and the handshake is served as any request (refused: the client is in).
    pub fn begin_reauthentication(&mut self, now: std::time::Instant) -> bool {
        if !self.authenticated() || self.session_lifetime_ms().is_none() {
            return false;
        }
        if self
            .reauthentication_began
            .is_some_and(|began| now.duration_since(began) < std::time::Duration::from_secs(1))
        {
            return false;
        }
        self.reauthentication_began = Some(now);
        self.reauthenticating = true;
        self.state = State::Handshake;
        true
    }

    /// The client proved it is `principal` with `mechanism` (its credential good until
    /// `credential_expires_ms`, for a token): in, with the session's lifetime in the answer, as
    /// Kafka computes it; or out, when a re-authentication names another principal.
    fn admit(
        &mut self,
        mechanism: &str,
        principal: String,
        credential_expires_ms: Option<u64>,
        answer: SaslAuthenticateResponse,
    ) -> Outcome<SaslAuthenticateResponse> {
        if self.reauthenticating {
            let previous = self.session.as_ref().map(|s| s.principal.as_str());
            if previous != Some(principal.as_str()) {
                let why = format!(
                    "Cannot change principals during re-authentication from {}: {principal}",
                    previous.unwrap_or("?")
                );
                return Outcome::Out(
                    answer
                        .with_error_code(ResponseError::SaslAuthenticationFailed.code())
                        .with_error_message(Some(StrBytes::from_string(why.clone()))),
                    why,
                );
            }
        }
        let max = self.server.max_reauth_ms;
        let credential = credential_expires_ms
            .map(|expires| expires.saturating_sub(super::oauthbearer::now_ms()));
        let lifetime_ms = match (credential, max) {
            (None, 0) => None,
            (None, max) => Some(max),
            (Some(credential), 0) => Some(credential),
            (Some(credential), max) => Some(credential.min(max)),
        };
        self.state = State::Authenticated;
        self.reauthenticating = false;
        self.session = Some(Session {
            mechanism: mechanism.to_string(),
            principal: principal.clone(),
            lifetime_ms,
        });
        let lifetime = lifetime_ms.map_or(0, |ms| ms.min(i64::MAX as u64) as i64);
        Outcome::In(answer.with_session_lifetime_ms(lifetime), principal)
    }

    /// Whether `key` may be sent before the client is in.
    pub fn allowed_before(key: ApiKey) -> bool {
        matches!(
            key,
            ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
        )
    }

    /// Whether the next frame is a bare token (after a version 0 handshake), not a request.
    pub fn expects_raw_token(&self) -> bool {
        matches!(
            self.state,
            State::Token { raw: true, .. }
                | State::ScramFinal { raw: true, .. }
                | State::OAuthRefused { raw: true, .. }
        )
    }

    /// A bare token after a version 0 handshake: what to send back bare (nothing, for PLAIN;
    /// SCRAM's messages), and whether the client is in; or why the connection closes (Kafka
    /// sends nothing then).
    pub fn on_raw_token(
        &mut self,
        token: &[u8],
        scram: ScramLookup<'_>,
    ) -> Result<(Bytes, Option<String>), String> {
        let request =
            SaslAuthenticateRequest::default().with_auth_bytes(Bytes::copy_from_slice(token));
        match self.on_authenticate(&request, scram) {
            Outcome::In(r, principal) => Ok((r.auth_bytes, Some(principal))),
            Outcome::Answer(r) => Ok((r.auth_bytes, None)),
            Outcome::Out(_, why) => Err(why),
        }
    }

    pub fn on_handshake(
        &mut self,
        request: &SaslHandshakeRequest,
        version: i16,
    ) -> Outcome<SaslHandshakeResponse> {
        let enabled = self
            .server
            .mechanisms
            .iter()
            .map(|m| StrBytes::from_string(m.clone()))
            .collect();
        let answer = SaslHandshakeResponse::default().with_mechanisms(enabled);
        if !matches!(self.state, State::Handshake) {
            return Outcome::Out(
                answer.with_error_code(ResponseError::IllegalSaslState.code()),
                "a second SaslHandshake before the first ended".into(),
            );
        }
        let mechanism = request.mechanism.to_string();
        if let Some(session) = self.session.as_ref().filter(|_| self.reauthenticating) {
            if session.mechanism != mechanism {
                return Outcome::Out(
                    answer.with_error_code(ResponseError::UnsupportedSaslMechanism.code()),
                    format!(
                        "SASL mechanism {mechanism:?} requested for the re-authentication of a {} session",
                        session.mechanism
                    ),
                );
            }
        }
        if !self.server.mechanisms.contains(&mechanism) {
            return Outcome::Out(
                answer.with_error_code(ResponseError::UnsupportedSaslMechanism.code()),
                format!("SASL mechanism {mechanism:?} is not enabled on this listener"),
            );
        }
        self.state = State::Token {
            mechanism,
            raw: version == 0,
        };
        Outcome::Answer(answer)
    }

    pub fn on_authenticate(
        &mut self,
        request: &SaslAuthenticateRequest,
        scram: ScramLookup<'_>,
    ) -> Outcome<SaslAuthenticateResponse> {
        let failed = |message: &str| {
            SaslAuthenticateResponse::default()
                .with_error_code(ResponseError::SaslAuthenticationFailed.code())
                .with_error_message(Some(StrBytes::from_string(message.to_string())))
        };
        let (mechanism, raw) = match std::mem::replace(&mut self.state, State::Handshake) {
            State::Token { mechanism, raw } => (mechanism, raw),
            State::ScramFinal { exchange, .. } => {
                let mechanism = exchange.mechanism_name();
                return match exchange.finish(&request.auth_bytes) {
                    Ok((last, user)) => self.admit(
                        mechanism,
                        format!("User:{user}"),
                        None,
                        SaslAuthenticateResponse::default().with_auth_bytes(Bytes::from(last)),
                    ),
                    Err(why) => Outcome::Out(failed(&scram_refusal(mechanism)), why),
                };
            }
            State::OAuthRefused { why, .. } => {
                return Outcome::Out(
                    failed("Authentication failed: the OAuth bearer token is invalid"),
                    why,
                );
            }
            other => {
                self.state = other;
                return Outcome::Out(
                    SaslAuthenticateResponse::default()
                        .with_error_code(ResponseError::IllegalSaslState.code())
                        .with_error_message(Some(StrBytes::from_static_str(
                            "SaslAuthenticate before SaslHandshake",
                        ))),
                    "SaslAuthenticate before SaslHandshake".into(),
                );
            }
        };
        if let Some(m) = scram::Mechanism::from_name(&mechanism) {
            let nonce = scram::random_nonce();
            return match scram::first(m, &request.auth_bytes, &nonce, |user| scram(user, m.id())) {
                Ok(exchange) => {
                    let answer = Bytes::copy_from_slice(exchange.message());
                    self.state = State::ScramFinal {
                        exchange: Box::new(exchange),
                        raw,
                    };
                    Outcome::Answer(SaslAuthenticateResponse::default().with_auth_bytes(answer))
                }
                Err(why) => Outcome::Out(failed(&scram_refusal(m.name())), why),
            };
        }
        match mechanism.as_str() {
            "OAUTHBEARER" => {
                let checked = match &self.server.oauth {
                    Some(validator) => validator.authenticate(&request.auth_bytes),
                    None => Err("OAUTHBEARER has no validator".to_string()),
                };
                match checked {
                    Ok((user, expires_ms)) => self.admit(
                        "OAUTHBEARER",
                        format!("User:{user}"),
                        Some(expires_ms),
                        SaslAuthenticateResponse::default().with_auth_bytes(Bytes::new()),
                    ),
                    Err(why) => {
                        // RFC 7628: the error, then the client's \x01, then the failure.
                        self.state = State::OAuthRefused { why, raw };
                        Outcome::Answer(
                            SaslAuthenticateResponse::default().with_auth_bytes(
                                Bytes::from_static(super::oauthbearer::INVALID_TOKEN),
                            ),
                        )
                    }
                }
            }
            "PLAIN" => match plain_token(&request.auth_bytes) {
                Err(why) => Outcome::Out(failed(&format!("Authentication failed: {why}")), why),
                Ok((user, password)) => {
                    if self.server.plain_ok(&user, &password) {
                        self.admit(
                            "PLAIN",
                            format!("User:{user}"),
                            None,
                            SaslAuthenticateResponse::default().with_auth_bytes(Bytes::new()),
                        )
                    } else {
                        Outcome::Out(
                            failed("Authentication failed: Invalid username or password"),
                            format!("invalid username or password for user {user:?}"),
                        )
                    }
                }
            },
            other => Outcome::Out(
                failed("Authentication failed: unsupported mechanism"),
                format!("no authenticator for {other}"),
            ),
        }
    }
}

/// What a client whose SCRAM exchange failed is told, whatever the reason (Kafka's words).
fn scram_refusal(mechanism: &str) -> String {
    format!(
        "Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
    )
}

/// PLAIN's message (RFC 4616): `[authzid] NUL authcid NUL passwd`. An authorization id other
/// than the user is refused, as Kafka refuses it.
fn plain_token(token: &[u8]) -> Result<(String, Vec<u8>), String> {
    let mut parts = token.splitn(3, |&b| b == 0);
    let (Some(authzid), Some(user), Some(password)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err("a PLAIN message is [authzid] NUL user NUL password".into());
    };
    let user = std::str::from_utf8(user)
        .map_err(|_| "the PLAIN user name is not UTF-8".to_string())?
        .to_string();
    if user.is_empty() {
        return Err("the PLAIN message names no user".into());
    }
    if !authzid.is_empty() && authzid != user.as_bytes() {
        return Err("the PLAIN message asks for an authorization id other than its user".into());
    }
    Ok((user, password.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> Rc<SaslServer> {
        Rc::new(SaslServer {
            mechanisms: vec!["PLAIN".into()],
            plain: [("alice".to_string(), "alice-pw".to_string())].into(),
            oauth: None,
            max_reauth_ms: 0,
        })
    }

    fn no_scram(_: &str, _: i8) -> Option<UserScramCredentialRecord> {
        None
    }

    fn scram_server() -> Rc<SaslServer> {
        Rc::new(SaslServer {
            mechanisms: vec!["SCRAM-SHA-256".into(), "SCRAM-SHA-512".into()],
            plain: HashMap::new(),
            oauth: None,
            max_reauth_ms: 0,
        })
    }

    #[test]
    fn oauthbearer_answers_a_refused_token_with_rfc_7628s_error_then_fails() {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let server = Rc::new(SaslServer {
            max_reauth_ms: 0,
            mechanisms: vec!["OAUTHBEARER".into()],
            plain: HashMap::new(),
            oauth: Some(super::super::oauthbearer::Validator::Unsecured(
                super::super::oauthbearer::Unsecured {
                    principal_claim: "sub".into(),
                    scope_claim: "scope".into(),
                    required_scopes: Vec::new(),
                    clock_skew_ms: 0,
                },
            )),
        });
        let token = |exp: u64| {
            format!(
                "n,,\x01auth=Bearer {}.{}.\x01\x01",
                b64.encode(r#"{"alg":"none"}"#),
                b64.encode(format!(r#"{{"sub":"carol","exp":{exp}}}"#))
            )
        };
        let handshake = SaslHandshakeRequest::default()
            .with_mechanism(StrBytes::from_static_str("OAUTHBEARER"));
        let authenticate =
            |bytes: Vec<u8>| SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(bytes));
        let mut good = Authenticator::new(server.clone());
        assert!(matches!(
            good.on_handshake(&handshake, 1),
            Outcome::Answer(_)
        ));
        match good.on_authenticate(
            &authenticate(token(u64::MAX / 2000).into_bytes()),
            &no_scram,
        ) {
            Outcome::In(r, principal) => {
                assert_eq!(principal, "User:carol");
                assert!(r.auth_bytes.is_empty() && r.error_code == 0);
            }
            other => panic!("{other:?}"),
        }
        // Even without connections.max.reauth.ms, the session ends with its token (KIP-368).
        let in_an_hour = super::super::oauthbearer::now_ms() / 1000 + 3600;
        let mut short = Authenticator::new(server.clone());
        short.on_handshake(&handshake, 1);
        match short.on_authenticate(&authenticate(token(in_an_hour).into_bytes()), &no_scram) {
            Outcome::In(r, _) => {
                assert!(
                    (3_598_000..=3_600_000).contains(&r.session_lifetime_ms),
                    "{r:?}"
                )
            }
            other => panic!("{other:?}"),
        }
        let mut expired = Authenticator::new(server);
        assert!(matches!(
            expired.on_handshake(&handshake, 1),
            Outcome::Answer(_)
        ));
        match expired.on_authenticate(&authenticate(token(1).into_bytes()), &no_scram) {
            Outcome::Answer(r) => {
                assert_eq!(r.error_code, 0);
                assert_eq!(&r.auth_bytes[..], br#"{"status":"invalid_token"}"#);
            }
            other => panic!("{other:?}"),
        }
        match expired.on_authenticate(&authenticate(vec![1]), &no_scram) {
            Outcome::Out(r, why) => {
                assert_eq!(r.error_code, ResponseError::SaslAuthenticationFailed.code());
                assert!(why.contains("expired"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn scram_takes_two_round_trips_with_the_image_credentials() {
        use scram::tests::{credential, Client};
        for m in scram::Mechanism::ALL {
            let stored = credential(m, "bob", "bob-pw", 4096);
            let lookup = |user: &str, mechanism: i8| {
                (user == "bob" && mechanism == m.id()).then(|| stored.clone())
            };
            for (password, ok) in [("bob-pw", true), ("bob-pW", false)] {
                let mut a = Authenticator::new(scram_server());
                a.on_handshake(&handshake(m.name()), 1);
                let client = Client::new(m, "bob", password, "nonce-1");
                let server_first = match a.on_authenticate(&token(&client.first()), &lookup) {
                    Outcome::Answer(r) => r.auth_bytes,
                    other => panic!("{other:?}"),
                };
                assert!(!a.authenticated());
                let (last, expected) = client.last(&server_first);
                match a.on_authenticate(&token(&last), &lookup) {
                    Outcome::In(r, principal) if ok => {
                        assert_eq!(&r.auth_bytes[..], &expected[..]);
                        assert_eq!(principal, "User:bob");
                    }
                    Outcome::Out(r, why) if !ok => {
                        assert_eq!(r.error_code, ResponseError::SaslAuthenticationFailed.code());
                        assert_eq!(
                            r.error_message.as_deref(),
                            Some(format!("Authentication failed during authentication due to invalid credentials with SASL mechanism {}", m.name()).as_str())
                        );
                        assert!(!why.contains("bob-p"), "{why}");
                    }
                    other => panic!("{other:?}"),
                }
                assert_eq!(a.authenticated(), ok);
            }
            // The other mechanism's credential does not count; neither does a bare-token
            // exchange skip a step.
            let other = scram::Mechanism::ALL.into_iter().find(|o| *o != m).unwrap();
            let mut a = Authenticator::new(scram_server());
            a.on_handshake(&handshake(other.name()), 0);
            let client = Client::new(other, "bob", "bob-pw", "n");
            let (first, principal) = a.on_raw_token(&client.first(), &lookup).unwrap();
            assert!(principal.is_none() && a.expects_raw_token());
            let (last, _) = client.last(&first);
            assert!(a.on_raw_token(&last, &lookup).is_err());
            // With the right credential, bare tokens work too.
            let mut a = Authenticator::new(scram_server());
            a.on_handshake(&handshake(m.name()), 0);
            let client = Client::new(m, "bob", "bob-pw", "n");
            let (first, _) = a.on_raw_token(&client.first(), &lookup).unwrap();
            let (last, expected) = client.last(&first);
            let (answer, principal) = a.on_raw_token(&last, &lookup).unwrap();
            assert_eq!(&answer[..], &expected[..]);
            assert_eq!(principal.as_deref(), Some("User:bob"));
            assert!(a.authenticated());
        }
    }

    fn handshake(mechanism: &'static str) -> SaslHandshakeRequest {
        SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism))
    }

    fn token(bytes: &[u8]) -> SaslAuthenticateRequest {
        SaslAuthenticateRequest::default().with_auth_bytes(Bytes::copy_from_slice(bytes))
    }

    #[test]
    fn plain_lets_a_user_in_with_its_password_only() {
        let mut a = Authenticator::new(server());
        assert!(
            matches!(a.on_handshake(&handshake("PLAIN"), 1), Outcome::Answer(r) if r.error_code == 0)
        );
        match a.on_authenticate(&token(b"\0alice\0alice-pw"), &no_scram) {
            Outcome::In(r, principal) => {
                assert_eq!(r.error_code, 0);
                assert_eq!(principal, "User:alice");
            }
            other => panic!("{other:?}"),
        }
        assert!(a.authenticated());
        for bad in [
            &b"\0alice\0wrong"[..],
            b"\0bob\0alice-pw",
            b"\0alice\0alice-p",
            b"\0alice\0alice-pw\0",
        ] {
            let mut a = Authenticator::new(server());
            a.on_handshake(&handshake("PLAIN"), 1);
            match a.on_authenticate(&token(bad), &no_scram) {
                Outcome::Out(r, why) => {
                    assert_eq!(r.error_code, ResponseError::SaslAuthenticationFailed.code());
                    assert_eq!(
                        r.error_message.as_deref(),
                        Some("Authentication failed: Invalid username or password")
                    );
                    assert!(!why.contains("pw"), "{why}");
                }
                other => panic!("{other:?}"),
            }
            assert!(!a.authenticated());
        }
        // Malformed messages and another authorization id.
        for (bad, says) in [
            (&b"alice-pw"[..], "NUL"),
            (b"\0\0alice-pw", "no user"),
            (b"bob\0alice\0alice-pw", "authorization id"),
        ] {
            let mut a = Authenticator::new(server());
            a.on_handshake(&handshake("PLAIN"), 1);
            match a.on_authenticate(&token(bad), &no_scram) {
                Outcome::Out(r, why) => {
                    assert_eq!(r.error_code, ResponseError::SaslAuthenticationFailed.code());
                    assert!(why.contains(says), "{why}");
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_version_0_handshake_takes_a_bare_token() {
        let mut a = Authenticator::new(server());
        a.on_handshake(&handshake("PLAIN"), 0);
        assert!(a.expects_raw_token());
        let (answer, principal) = a.on_raw_token(b"\0alice\0alice-pw", &no_scram).unwrap();
        assert!(answer.is_empty());
        assert_eq!(principal.as_deref(), Some("User:alice"));
        assert!(a.authenticated() && !a.expects_raw_token());
        let mut a = Authenticator::new(server());
        a.on_handshake(&handshake("PLAIN"), 0);
        let why = a.on_raw_token(b"\0alice\0nope", &no_scram).unwrap_err();
        assert!(why.contains("invalid username or password"), "{why}");
        assert!(!a.authenticated());
        let mut a = Authenticator::new(server());
        a.on_handshake(&handshake("PLAIN"), 1);
        assert!(!a.expects_raw_token());
    }

    #[test]
    fn mechanisms_and_order_are_checked() {
        let mut a = Authenticator::new(server());
        match a.on_handshake(&handshake("SCRAM-SHA-256"), 1) {
            Outcome::Out(r, _) => {
                assert_eq!(r.error_code, ResponseError::UnsupportedSaslMechanism.code());
                assert_eq!(r.mechanisms, vec![StrBytes::from_static_str("PLAIN")]);
            }
            other => panic!("{other:?}"),
        }
        let mut a = Authenticator::new(server());
        match a.on_authenticate(&token(b"\0alice\0alice-pw"), &no_scram) {
            Outcome::Out(r, _) => assert_eq!(r.error_code, ResponseError::IllegalSaslState.code()),
            other => panic!("{other:?}"),
        }
        assert!(!a.authenticated());
        let mut a = Authenticator::new(server());
        a.on_handshake(&handshake("PLAIN"), 1);
        assert!(
            matches!(a.on_handshake(&handshake("PLAIN"), 1), Outcome::Out(r, _) if r.error_code == ResponseError::IllegalSaslState.code())
        );
        assert!(Authenticator::allowed_before(ApiKey::ApiVersions));
        assert!(!Authenticator::allowed_before(ApiKey::Metadata));
        assert!(!Authenticator::allowed_before(ApiKey::Produce));
    }

    #[test]
    fn a_session_with_a_lifetime_is_renewed_on_its_connection_by_the_same_principal_only() {
        let renewing = Rc::new(
            SaslServer::with_users(
                vec!["PLAIN".into()],
                [
                    ("alice".to_string(), "alice-pw".to_string()),
                    ("bob".to_string(), "bob-pw".to_string()),
                ]
                .into(),
            )
            .with_max_reauth_ms(3000),
        );
        let login = |a: &mut Authenticator, secret: &[u8]| {
            a.on_handshake(&handshake("PLAIN"), 1);
            a.on_authenticate(&token(secret), &no_scram)
        };
        let start = std::time::Instant::now();
        let mut a = Authenticator::new(renewing.clone());
        match login(&mut a, b"\0alice\0alice-pw") {
            Outcome::In(r, _) => assert_eq!(r.session_lifetime_ms, 3000),
            other => panic!("{other:?}"),
        }
        assert_eq!(a.session_lifetime_ms(), Some(3000));
        assert!(a.begin_reauthentication(start));
        assert!(a.reauthenticating() && !a.authenticated());
        match login(&mut a, b"\0alice\0alice-pw") {
            Outcome::In(r, principal) => {
                assert_eq!(
                    (r.session_lifetime_ms, principal.as_str()),
                    (3000, "User:alice")
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(a.authenticated() && !a.reauthenticating());
        // At most one re-authentication a second.
        assert!(!a.begin_reauthentication(start + std::time::Duration::from_millis(500)));
        // Another principal, even with its right password, ends the connection.
        assert!(a.begin_reauthentication(start + std::time::Duration::from_secs(1)));
        match login(&mut a, b"\0bob\0bob-pw") {
            Outcome::Out(r, why) => {
                assert_eq!(r.error_code, ResponseError::SaslAuthenticationFailed.code());
                assert!(
                    why.contains("User:alice") && why.contains("User:bob"),
                    "{why}"
                );
            }
            other => panic!("{other:?}"),
        }
        // So does another mechanism.
        let mut a = Authenticator::new(renewing);
        login(&mut a, b"\0alice\0alice-pw");
        assert!(a.begin_reauthentication(start));
        match a.on_handshake(&handshake("SCRAM-SHA-256"), 1) {
            Outcome::Out(r, _) => {
                assert_eq!(r.error_code, ResponseError::UnsupportedSaslMechanism.code())
            }
            other => panic!("{other:?}"),
        }
        // Without connections.max.reauth.ms, a session lasts as long as its connection, and a
        // second handshake is no re-authentication.
        let mut a = Authenticator::new(server());
        match login(&mut a, b"\0alice\0alice-pw") {
            Outcome::In(r, _) => assert_eq!(r.session_lifetime_ms, 0),
            other => panic!("{other:?}"),
        }
        assert_eq!(a.session_lifetime_ms(), None);
        assert!(!a.begin_reauthentication(start));
        assert!(a.authenticated());
    }
}
