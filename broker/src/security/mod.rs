//! How connections prove who they are: TLS (`tls`), SASL (`sasl`) and SCRAM's arithmetic
//! (`scram`), for the client listeners (`net`), the CONTROLLER listener (`cluster::transport`)
//! and this node's own links to the other nodes (`peer`).

pub mod oauthbearer;
pub mod principal;
pub mod sasl;
pub mod scram;
pub mod tls;

/// The principal of a TLS session without SASL: `User:` and the mapped subject of the client's
/// certificate (`principal`), `User:ANONYMOUS` without one. An error (the certificate does not
/// parse, or no mapping rule applies) refuses the client, as Kafka refuses it.
pub fn tls_principal(
    certificates: Option<&[rustls_pki_types::CertificateDer<'_>]>,
    mapper: &principal::PrincipalMapper,
) -> Result<String, String> {
    match certificates.and_then(|c| c.first()) {
        None => Ok(sasl::ANONYMOUS.to_string()),
        Some(cert) => {
            let dn = principal::subject_name(cert.as_ref())?;
            Ok(format!("User:{}", mapper.name(&dn)?))
        }
    }
}

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, ResponseKind};

/// What a frame read before SASL authentication ended is to the connection.
pub enum BeforeAuth {
    /// ApiVersions: served as on any connection.
    Serve,
    /// A SASL request, answered: this frame.
    Answer(Bytes),
    /// The SASL request's answer; the client is in as `principal`.
    In(Bytes, String),
    /// A failed login: its answer if it has one (a bare token after a version 0 handshake
    /// gets none, as in Kafka), then the connection closes after the failed-authentication
    /// delay; `why` names no secret.
    Out(Option<Bytes>, String),
    /// Anything else: close at once, as Kafka does.
    Refuse(String),
}

/// Runs a frame read before the client authenticated through its [`sasl::Authenticator`].
pub fn before_auth(
    auth: &mut sasl::Authenticator,
    body: &Bytes,
    scram: sasl::ScramLookup<'_>,
) -> anyhow::Result<BeforeAuth> {
    use kafka_protocol::messages::RequestKind;
    if auth.expects_raw_token() {
        // After a version 0 handshake the tokens come bare, and go back bare.
        return Ok(match auth.on_raw_token(body, scram) {
            Ok((answer, principal)) => {
                let mut frame = Vec::with_capacity(4 + answer.len());
                frame.extend_from_slice(&(answer.len() as u32).to_be_bytes());
                frame.extend_from_slice(&answer);
                match principal {
                    Some(principal) => BeforeAuth::In(Bytes::from(frame), principal),
                    None => BeforeAuth::Answer(Bytes::from(frame)),
                }
            }
            Err(why) => BeforeAuth::Out(None, why),
        });
    }
    let mut rest = body.clone();
    let (key, version, header) = match crate::codec::frame::decode_header(&mut rest)? {
        crate::codec::frame::Header::Request {
            key,
            version,
            header,
        } => (key, version, header),
        crate::codec::frame::Header::UnsupportedApiVersions { .. } => return Ok(BeforeAuth::Serve),
        crate::codec::frame::Header::Streams { key, .. } => {
            return Ok(BeforeAuth::Refuse(format!(
                "streams group API {key} before SASL authentication"
            )))
        }
    };
    if key == ApiKey::ApiVersions {
        return Ok(BeforeAuth::Serve);
    }
    if !sasl::Authenticator::allowed_before(key) {
        return Ok(BeforeAuth::Refuse(format!(
            "{key:?} before SASL authentication"
        )));
    }
    let encode = |response: ResponseKind| {
        crate::codec::encode_response(key, version, header.correlation_id, &response)
    };
    let outcome = match crate::codec::decode_request(key, version, &mut rest)? {
        RequestKind::SaslHandshake(r) => auth
            .on_handshake(&r, version)
            .map(ResponseKind::SaslHandshake),
        RequestKind::SaslAuthenticate(r) => auth
            .on_authenticate(&r, scram)
            .map(ResponseKind::SaslAuthenticate),
        _ => anyhow::bail!("{key:?} decoded as another request"),
    };
    Ok(match outcome {
        sasl::Outcome::Answer(r) => BeforeAuth::Answer(encode(r)?),
        sasl::Outcome::In(r, principal) => BeforeAuth::In(encode(r)?, principal),
        sasl::Outcome::Out(r, why) => BeforeAuth::Out(Some(encode(r)?), why),
    })
}
