//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka runs them: the credentials
//! (salt, stored key, server key, iterations) come from the metadata log, where
//! AlterUserScramCredentials and `storage format --add-scram` put them; no password is kept.
//!
//! [`first`] answers the client's first message, [`ServerFirst::finish`] checks its proof in
//! the final one. Both are pure: the server nonce comes from the caller, so the RFC's test
//! vectors run as they are written. Failures name no secret; the client is told only that its
//! credentials are invalid, for an unknown user and a wrong password alike.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use ring::{digest, hmac, pbkdf2};
use sluice_replication::records::UserScramCredentialRecord;
use subtle::ConstantTimeEq;

/// A SCRAM mechanism with Kafka's id and name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    Sha256,
    Sha512,
}

impl Mechanism {
    pub const ALL: [Mechanism; 2] = [Mechanism::Sha256, Mechanism::Sha512];

    pub fn from_name(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    pub fn from_id(id: i8) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.id() == id)
    }

    /// Kafka's ScramMechanism id.
    pub fn id(self) -> i8 {
        match self {
            Mechanism::Sha256 => 1,
            Mechanism::Sha512 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha256 => "SCRAM-SHA-256",
            Mechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    fn hmac(self) -> hmac::Algorithm {
        match self {
            Mechanism::Sha256 => hmac::HMAC_SHA256,
            Mechanism::Sha512 => hmac::HMAC_SHA512,
        }
    }

    fn digest(self) -> &'static digest::Algorithm {
        match self {
            Mechanism::Sha256 => &digest::SHA256,
            Mechanism::Sha512 => &digest::SHA512,
        }
    }

    fn pbkdf2(self) -> pbkdf2::Algorithm {
        match self {
            Mechanism::Sha256 => pbkdf2::PBKDF2_HMAC_SHA256,
            Mechanism::Sha512 => pbkdf2::PBKDF2_HMAC_SHA512,
        }
    }

    fn mac(self, key: &[u8], message: &[u8]) -> Vec<u8> {
        hmac::sign(&hmac::Key::new(self.hmac(), key), message)
            .as_ref()
            .to_vec()
    }

    /// Hi(password, salt, iterations): the salted password (PBKDF2).
    /// The client's proof for the exchange `auth` (RFC 5802's AuthMessage) from the salted
    /// password, and the server-final message (`v=<server signature>`) that proves the server
    /// knows it too.
    pub fn client_proof(self, salted: &[u8], auth: &str) -> (Vec<u8>, Vec<u8>) {
        let client_key = self.mac(salted, b"Client Key");
        let stored = digest::digest(self.digest(), &client_key);
        let signature = self.mac(stored.as_ref(), auth.as_bytes());
        let proof = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let server_key = self.mac(salted, b"Server Key");
        let expected = format!(
            "v={}",
            BASE64.encode(self.mac(&server_key, auth.as_bytes()))
        );
        (proof, expected.into_bytes())
    }

    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut out = vec![0; self.digest().output_len()];
        let iterations = std::num::NonZeroU32::new(iterations.max(1)).expect("at least 1");
        pbkdf2::derive(self.pbkdf2(), iterations, salt, password, &mut out);
        out
    }

    /// The credential stored for a salted password: its stored key and server key.
    pub fn credential(
        self,
        name: &str,
        salt: &[u8],
        salted_password: &[u8],
        iterations: i32,
    ) -> UserScramCredentialRecord {
        // Nothing to derive from nothing: the controller refuses an empty credential.
        let (stored_key, server_key) = if salted_password.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            let client_key = self.mac(salted_password, b"Client Key");
            (
                digest::digest(self.digest(), &client_key).as_ref().to_vec(),
                self.mac(salted_password, b"Server Key"),
            )
        };
        UserScramCredentialRecord {
            name: name.to_string(),
            mechanism: self.id(),
            salt: salt.to_vec(),
            stored_key,
            server_key,
            iterations,
        }
    }
}

/// The client side of an exchange: this node logging in to another (a SASL inter-broker or
/// controller listener). The server's nonce must extend ours and its final signature must
/// prove it knows the password's salted key; every refusal names no secret.
pub struct ClientExchange {
    mechanism: Mechanism,
    password: String,
    first_bare: String,
    nonce: String,
    /// The server signature the final message must carry, once the proof is sent.
    expected: Option<Vec<u8>>,
}

impl ClientExchange {
    pub fn new(mechanism: Mechanism, user: &str, password: &str) -> ClientExchange {
        let nonce = random_nonce();
        ClientExchange {
            mechanism,
            password: password.to_string(),
            first_bare: format!(
                "n={},r={nonce}",
                user.replace('=', "=3D").replace(',', "=2C")
            ),
            nonce,
            expected: None,
        }
    }

    /// The client-first message.
    pub fn first(&self) -> Vec<u8> {
        format!("n,,{}", self.first_bare).into_bytes()
    }

    /// The client-final message for the server-first one.
    pub fn last(&mut self, server_first: &[u8]) -> Result<Vec<u8>, Refusal> {
        let server_first = std::str::from_utf8(server_first)
            .map_err(|_| "the server's first SCRAM message is not UTF-8".to_string())?;
        let (mut nonce, mut salt, mut iterations) = (None, None, None);
        for part in server_first.split(',') {
            match part.split_once('=') {
                Some(("r", r)) => nonce = Some(r),
                Some(("s", s)) => salt = BASE64.decode(s).ok(),
                Some(("i", i)) => iterations = i.parse::<u32>().ok(),
                _ => {}
            }
        }
        let nonce = nonce
            .filter(|n| n.starts_with(&self.nonce) && n.len() > self.nonce.len())
            .ok_or_else(|| "the server's SCRAM nonce does not extend ours".to_string())?;
        let salt = salt.ok_or_else(|| "the server's SCRAM message has no salt".to_string())?;
        let iterations = iterations
            .filter(|&i| i >= sluice_replication::controller::SCRAM_ITERATIONS_MIN as u32)
            .ok_or_else(|| {
                format!(
                    "the server asks for fewer than {} SCRAM iterations",
                    sluice_replication::controller::SCRAM_ITERATIONS_MIN
                )
            })?;
        let m = self.mechanism;
        let salted = m.salted_password(self.password.as_bytes(), &salt, iterations);
        let without_proof = format!("c={},r={nonce}", BASE64.encode("n,,"));
        let auth = format!("{},{server_first},{without_proof}", self.first_bare);
        let (proof, expected) = m.client_proof(&salted, &auth);
        self.expected = Some(expected);
        Ok(format!("{without_proof},p={}", BASE64.encode(proof)).into_bytes())
    }

    /// Checks the server-final message.
    pub fn verify(&self, server_final: &[u8]) -> Result<(), Refusal> {
        if let Some(e) = server_final.strip_prefix(b"e=") {
            return Err(format!(
                "the server refused: {}",
                String::from_utf8_lossy(e)
            ));
        }
        match &self.expected {
            Some(expected) if bool::from(expected.as_slice().ct_eq(server_final)) => Ok(()),
            _ => Err("the server's SCRAM signature is wrong: it does not know the password".into()),
        }
    }
}

/// A fresh random server nonce: letters and digits only, as Kafka's are.
pub fn random_nonce() -> String {
    random_bytes(16)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Random bytes (a salt).
pub fn random_bytes(n: usize) -> Vec<u8> {
    use ring::rand::SecureRandom as _;
    let mut raw = vec![0u8; n];
    ring::rand::SystemRandom::new()
        .fill(&mut raw)
        .expect("the system's random source");
    raw
}

/// Why an exchange failed: for the log, never with a secret in it.
pub type Refusal = String;

/// The exchange after the server's first message, waiting for the client's final one.
#[derive(Debug)]
pub struct ServerFirst {
    mechanism: Mechanism,
    user: String,
    credential: Option<UserScramCredentialRecord>,
    /// The GS2 header the client sent, which its final message must echo (base64) in `c=`.
    gs2_header: String,
    client_first_bare: String,
    /// The message sent: `r=<client nonce><server nonce>,s=<salt>,i=<iterations>`.
    message: String,
    nonce: String,
}

impl ServerFirst {
    /// The server's first message, to send.
    pub fn message(&self) -> &[u8] {
        self.message.as_bytes()
    }

    pub fn mechanism_name(&self) -> &'static str {
        self.mechanism.name()
    }

    /// Checks the client's final message: the channel binding, the nonce and the proof. On
    /// success, the server's final message (its signature) and the user.
    pub fn finish(self, client_final: &[u8]) -> Result<(Vec<u8>, String), Refusal> {
        let client_final = std::str::from_utf8(client_final)
            .map_err(|_| "the SCRAM final message is not UTF-8".to_string())?;
        let (without_proof, proof) = client_final
            .rsplit_once(",p=")
            .ok_or("the SCRAM final message has no proof")?;
        let mut parts = without_proof.split(',');
        let binding = parts
            .next()
            .and_then(|p| p.strip_prefix("c="))
            .ok_or("the SCRAM final message has no channel binding")?;
        let nonce = parts
            .next()
            .and_then(|p| p.strip_prefix("r="))
            .ok_or("the SCRAM final message has no nonce")?;
        if BASE64.decode(binding).ok().as_deref() != Some(self.gs2_header.as_bytes()) {
            return Err("the SCRAM channel binding does not match the first message".into());
        }
        // Kafka's check: the nonce ends with the server's. librdkafka before 1.8 puts its own
        // nonce in front of the server's (which already starts with it), and Kafka lets it in.
        if !nonce.ends_with(&self.nonce) {
            return Err("the SCRAM nonce does not match the server's".into());
        }
        let proof = BASE64
            .decode(proof)
            .map_err(|_| "the SCRAM proof is not base64".to_string())?;
        let Some(credential) = self.credential else {
            // An unknown user: refused here, after the same round trips as a known one.
            return Err(format!(
                "no {} credential for user {:?}",
                self.mechanism.name(),
                self.user
            ));
        };
        let auth_message = format!(
            "{},{},{without_proof}",
            self.client_first_bare, self.message
        );
        let m = self.mechanism;
        let signature = m.mac(&credential.stored_key, auth_message.as_bytes());
        if proof.len() != signature.len() {
            return Err(format!(
                "a SCRAM proof of the wrong length for user {:?}",
                self.user
            ));
        }
        let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
        let stored = digest::digest(m.digest(), &client_key);
        if !bool::from(stored.as_ref().ct_eq(&credential.stored_key)) {
            return Err(format!("invalid credentials for user {:?}", self.user));
        }
        let server_signature = m.mac(&credential.server_key, auth_message.as_bytes());
        Ok((
            format!("v={}", BASE64.encode(server_signature)).into_bytes(),
            self.user,
        ))
    }
}

/// Answers the client's first message (`<gs2 header><client-first-bare>`, with `n=<user>` and
/// `r=<nonce>`) with the user's salt and iterations. `lookup` gives the user's credential.
/// An unknown user gets an answer as any other (a made-up salt), and fails at the proof, so
/// that the exchange does not tell which users exist.
pub fn first(
    mechanism: Mechanism,
    client_first: &[u8],
    server_nonce: &str,
    lookup: impl FnOnce(&str) -> Option<UserScramCredentialRecord>,
) -> Result<ServerFirst, Refusal> {
    let client_first = std::str::from_utf8(client_first)
        .map_err(|_| "the SCRAM first message is not UTF-8".to_string())?;
    // gs2-header = gs2-cbind-flag "," [ authzid ] ","; Kafka supports no channel binding.
    let (flag, rest) = client_first
        .split_once(',')
        .ok_or("the SCRAM first message has no GS2 header")?;
    if flag != "n" && flag != "y" {
        return Err(format!("SCRAM channel binding {flag:?} is not supported"));
    }
    let (authzid, bare) = rest
        .split_once(',')
        .ok_or("the SCRAM first message has no GS2 header")?;
    let gs2_header = format!("{flag},{authzid},");
    let mut user = None;
    let mut client_nonce = None;
    for (i, attribute) in bare.split(',').enumerate() {
        match (i, attribute.split_once('=')) {
            (0, Some(("n", name))) => user = Some(decode_saslname(name)?),
            (1, Some(("r", nonce))) if !nonce.is_empty() => client_nonce = Some(nonce),
            (0 | 1, _) => return Err("the SCRAM first message is not n=<user>,r=<nonce>".into()),
            (_, Some(("tokenauth", "true"))) => {
                return Err("delegation token authentication is not supported".into())
            }
            // Other extensions are the client's business.
            (_, Some(_)) => {}
            (_, None) => return Err("a SCRAM extension without a value".into()),
        }
    }
    let (Some(user), Some(client_nonce)) = (user, client_nonce) else {
        return Err("the SCRAM first message is not n=<user>,r=<nonce>".into());
    };
    if user.is_empty() {
        return Err("the SCRAM first message names no user".into());
    }
    if let Some(authzid) = authzid.strip_prefix("a=") {
        if decode_saslname(authzid)? != user {
            return Err(
                "the SCRAM first message asks for an authorization id other than its user".into(),
            );
        }
    } else if !authzid.is_empty() {
        return Err("the SCRAM first message's authorization id is malformed".into());
    }
    let credential = lookup(&user);
    let (salt, iterations) = match &credential {
        Some(c) => (c.salt.clone(), c.iterations),
        None => (
            mechanism.mac(unknown_user_key(), user.as_bytes())[..16].to_vec(),
            4096,
        ),
    };
    let nonce = format!("{client_nonce}{server_nonce}");
    Ok(ServerFirst {
        mechanism,
        message: format!("r={nonce},s={},i={iterations}", BASE64.encode(salt)),
        nonce,
        gs2_header,
        client_first_bare: bare.to_string(),
        user,
        credential,
    })
}

/// The key of the made-up salts of unknown users: random per process, so that a salt does not
/// give away that it was made up, yet the same for every attempt.
fn unknown_user_key() -> &'static [u8] {
    static KEY: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    KEY.get_or_init(|| random_bytes(32))
}

/// A SCRAM `saslname`: `=2C` is a comma, `=3D` an equals sign, and no other `=` may appear.
fn decode_saslname(name: &str) -> Result<String, Refusal> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find('=') {
        out.push_str(&rest[..at]);
        match rest.get(at..at + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err("a SCRAM user name with an invalid escape".into()),
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// The client side of an exchange, for tests: its first message, and its final message for
    /// the server's first.
    pub struct Client {
        pub mechanism: Mechanism,
        pub password: String,
        pub first_bare: String,
        pub gs2_header: String,
        /// Put in front of the nonce the final message echoes (as librdkafka before 1.8 did).
        pub echo_prefix: String,
    }

    impl Client {
        pub fn new(mechanism: Mechanism, user: &str, password: &str, nonce: &str) -> Client {
            Client {
                mechanism,
                password: password.into(),
                first_bare: format!(
                    "n={},r={nonce}",
                    user.replace('=', "=3D").replace(',', "=2C")
                ),
                gs2_header: "n,,".into(),
                echo_prefix: String::new(),
            }
        }

        pub fn first(&self) -> Vec<u8> {
            format!("{}{}", self.gs2_header, self.first_bare).into_bytes()
        }

        /// The final message, and the server signature it expects back.
        pub fn last(&self, server_first: &[u8]) -> (Vec<u8>, Vec<u8>) {
            let server_first = std::str::from_utf8(server_first).unwrap();
            let mut nonce = "";
            let mut salt = Vec::new();
            let mut iterations = 0;
            for part in server_first.split(',') {
                match part.split_once('=').unwrap() {
                    ("r", r) => nonce = r,
                    ("s", s) => salt = BASE64.decode(s).unwrap(),
                    ("i", i) => iterations = i.parse().unwrap(),
                    _ => {}
                }
            }
            let m = self.mechanism;
            let salted = m.salted_password(self.password.as_bytes(), &salt, iterations);
            let without_proof = format!(
                "c={},r={}{nonce}",
                BASE64.encode(&self.gs2_header),
                self.echo_prefix
            );
            let auth = format!("{},{server_first},{without_proof}", self.first_bare);
            let (proof, expected) = m.client_proof(&salted, &auth);
            (
                format!("{without_proof},p={}", BASE64.encode(proof)).into_bytes(),
                expected,
            )
        }
    }

    pub fn credential(
        m: Mechanism,
        user: &str,
        password: &str,
        iterations: i32,
    ) -> UserScramCredentialRecord {
        let salt = b"a-test-salt".to_vec();
        m.credential(
            user,
            &salt,
            &m.salted_password(password.as_bytes(), &salt, iterations as u32),
            iterations,
        )
    }

    #[test]
    fn rfc_7677_test_vector() {
        // RFC 7677 section 3: user "user", password "pencil".
        let m = Mechanism::Sha256;
        let salt = BASE64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let stored = m.credential(
            "user",
            &salt,
            &m.salted_password(b"pencil", &salt, 4096),
            4096,
        );
        let server = first(
            m,
            b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
            "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
            |u| (u == "user").then(|| stored.clone()),
        )
        .unwrap();
        assert_eq!(
            server.message(),
            b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let (last, user) = server
            .finish(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
            .unwrap();
        assert_eq!(last, b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
        assert_eq!(user, "user");
    }

    #[test]
    fn both_mechanisms_let_the_right_password_in_only() {
        for m in Mechanism::ALL {
            let stored = credential(m, "al,i=ce", "secret", 4096);
            let run = |password: &str| {
                let client = Client::new(m, "al,i=ce", password, "cnonce");
                let server = first(m, &client.first(), "snonce", |u| {
                    (u == "al,i=ce").then(|| stored.clone())
                })?;
                let (last, expected) = client.last(server.message());
                let (answer, user) = server.finish(&last)?;
                assert_eq!(answer, expected);
                Ok::<_, Refusal>(user)
            };
            assert_eq!(run("secret").unwrap(), "al,i=ce");
            let why = run("secreT").unwrap_err();
            assert!(
                why.contains("invalid credentials") && !why.contains("secre"),
                "{why}"
            );
        }
    }

    #[test]
    fn this_nodes_own_login_gets_in_and_checks_the_server_knows_the_password() {
        for m in Mechanism::ALL {
            let stored = credential(m, "broker", "inter-secret", 4096);
            let run = |password: &str| {
                let mut client = ClientExchange::new(m, "broker", password);
                let server = first(m, &client.first(), "snonce", |u| {
                    (u == "broker").then(|| stored.clone())
                })?;
                let last = client.last(server.message())?;
                let (answer, user) = server.finish(&last)?;
                client.verify(&answer)?;
                Ok::<_, Refusal>(user)
            };
            assert_eq!(run("inter-secret").unwrap(), "broker", "{m:?}");
            assert!(run("wrong").is_err(), "{m:?}");
            // A server that does not know the password cannot forge its signature.
            let mut client = ClientExchange::new(m, "broker", "inter-secret");
            let server = first(m, &client.first(), "snonce", |_| {
                Some(credential(m, "broker", "other", 4096))
            })
            .unwrap();
            client.last(server.message()).unwrap();
            assert!(client.verify(b"v=AAAA").is_err());
            assert!(client.verify(b"e=invalid-proof").is_err());
            // A server nonce that does not extend ours, or too few iterations, is refused.
            let mut client = ClientExchange::new(m, "broker", "inter-secret");
            assert!(client.last(b"r=other,s=c2FsdA==,i=4096").is_err());
            let nonce = format!("r={}x,s=c2FsdA==,i=1", client.nonce);
            assert!(client.last(nonce.as_bytes()).is_err());
        }
    }

    #[test]
    fn an_unknown_user_looks_like_any_other_until_the_proof() {
        let m = Mechanism::Sha512;
        let client = Client::new(m, "mallory", "x", "cnonce");
        let server = first(m, &client.first(), "snonce", |_| None).unwrap();
        let again = first(m, &client.first(), "snonce", |_| None).unwrap();
        assert_eq!(
            server.message(),
            again.message(),
            "the same made-up salt each time"
        );
        let (last, _) = client.last(server.message());
        assert!(server
            .finish(&last)
            .unwrap_err()
            .contains("no SCRAM-SHA-512 credential"));
    }

    #[test]
    fn malformed_and_mismatched_messages_are_refused() {
        let m = Mechanism::Sha256;
        let stored = credential(m, "alice", "pw", 4096);
        let lookup = |_: &str| Some(stored.clone());
        for bad in [
            &b"n=alice,r=x"[..],
            b"p=tls-unique,,n=alice,r=x",
            b"n,,r=x,n=alice",
            b"n,,n=,r=x",
            b"n,,n=alice",
            b"n,,n=al=ice,r=x",
            b"n,a=bob,n=alice,r=x",
            b"n,,n=alice,r=x,tokenauth=true",
            b"n,,n=alice,r=\xff",
        ] {
            assert!(
                first(m, bad, "s", lookup).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(first(m, b"n,a=alice,n=alice,r=x,ext=1", "s", lookup).is_ok());
        let client = Client::new(m, "alice", "pw", "c");
        let server = || first(m, &client.first(), "s", lookup).unwrap();
        let (last, _) = client.last(server().message());
        let last = String::from_utf8(last).unwrap();
        for (bad, says) in [
            (last.replacen("c=biws", "c=eSws", 1), "channel binding"),
            (last.replacen("r=cs", "r=cS", 1), "nonce"),
            (last.replacen(",r=cs", ",r=cs-", 1), "nonce"),
            (last.replacen(",p=", ",q=", 1), "no proof"),
            (
                format!("{},p=AAAA", last.rsplit_once(",p=").unwrap().0),
                "length",
            ),
            (format!("{last}!"), "not base64"),
        ] {
            let why = server().finish(bad.as_bytes()).unwrap_err();
            assert!(why.contains(says), "{why}");
        }
        assert!(server().finish(last.as_bytes()).is_ok());
    }

    #[test]
    fn librdkafka_before_1_8_doubling_its_nonce_gets_in_as_with_kafka() {
        // Its final message carries r=<client nonce><client nonce><server nonce>, and its
        // proof is over that message.
        let m = Mechanism::Sha256;
        let stored = credential(m, "bob", "pw", 4096);
        let mut client = Client::new(m, "bob", "pw", "cn");
        client.echo_prefix = "cn".into();
        let server = first(m, &client.first(), "sn", |_| Some(stored.clone())).unwrap();
        let (last, expected) = client.last(server.message());
        assert!(String::from_utf8_lossy(&last).contains(",r=cncnsn,"));
        assert_eq!(server.finish(&last).unwrap().0, expected);
    }
}
