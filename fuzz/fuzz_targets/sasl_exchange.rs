//! Arbitrary tokens through a SASL listener's authentication (`sluice_broker::wire::
//! Authenticator`, the state machine a connection runs before it serves anything): PLAIN and
//! SCRAM-SHA-256/512 (RFC 5802's messages: GS2 header, saslname escapes, nonces, base64 proofs),
//! after a version 1 handshake (SaslAuthenticate requests) or a version 0 one (bare tokens).
//!
//! Input: byte 0 picks the mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or one not enabled),
//! byte 1 bit 0 the handshake version; then tokens, each a length byte and that many bytes.
//! Checked: never a panic; the exchange ends at the first refusal; whoever gets in is alice,
//! the only user, and only after a token that carried her name.

#![no_main]

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::OnceLock;

use bytes::Bytes;
use kafka_protocol::messages::{SaslAuthenticateRequest, SaslHandshakeRequest};
use kafka_protocol::protocol::StrBytes;
use libfuzzer_sys::fuzz_target;
use sluice_broker::wire::{Authenticator, Outcome, SaslServer, ScramMechanism};

const MECHANISMS: [&str; 4] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI"];

type Credential = sluice_replication::records::UserScramCredentialRecord;

/// alice's SCRAM credentials (password "alice-pw"), derived once.
fn credentials() -> &'static [Credential; 2] {
    static CREDENTIALS: OnceLock<[Credential; 2]> = OnceLock::new();
    CREDENTIALS.get_or_init(|| {
        [ScramMechanism::Sha256, ScramMechanism::Sha512].map(|m| {
            let salted = m.salted_password(b"alice-pw", b"salt", 4096);
            m.credential("alice", b"salt", &salted, 4096)
        })
    })
}

fn lookup(user: &str, mechanism: i8) -> Option<Credential> {
    credentials()
        .iter()
        .find(|c| c.name == user && c.mechanism == mechanism)
        .cloned()
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let server = Rc::new(SaslServer::with_users(
        MECHANISMS[..3].iter().map(|m| m.to_string()).collect(),
        HashMap::from([("alice".to_string(), "alice-pw".to_string())]),
    ));
    let mut auth = Authenticator::new(server);
    let mechanism = MECHANISMS[data[0] as usize % MECHANISMS.len()];
    let version = i16::from(data[1] & 1);
    let handshake =
        SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism));
    match auth.on_handshake(&handshake, version) {
        Outcome::Answer(_) => {}
        Outcome::Out(..) => return,
        Outcome::In(..) => panic!("in at the handshake"),
    }
    let mut rest = &data[2..];
    let mut named_alice = false;
    while let Some((&len, tail)) = rest.split_first() {
        let len = (len as usize).min(tail.len());
        let (token, tail) = tail.split_at(len);
        rest = tail;
        named_alice |= token.windows(5).any(|w| w == b"alice");
        let principal = if auth.expects_raw_token() {
            match auth.on_raw_token(token, &lookup) {
                Ok((_, principal)) => principal,
                Err(_) => return,
            }
        } else {
            let request =
                SaslAuthenticateRequest::default().with_auth_bytes(Bytes::copy_from_slice(token));
            match auth.on_authenticate(&request, &lookup) {
                Outcome::Answer(_) => None,
                Outcome::In(_, principal) => Some(principal),
                Outcome::Out(..) => return,
            }
        };
        if let Some(principal) = principal {
            assert_eq!(principal, "User:alice");
            assert!(named_alice, "in without naming the user");
            assert!(auth.authenticated());
            return;
        }
    }
});
