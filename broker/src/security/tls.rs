//! TLS on an `SSL` listener: the rustls server configuration built from Kafka's `ssl.*`
//! settings (`config/security.rs`), and the handshake of an accepted connection.
//!
//! The handshake and the records after it run in user space (futures-rustls over the shard's
//! glommio socket). Fetch responses on such a connection are not spliced from the segment
//! files: the splice would bypass the encryption. They take the copying path instead (the batch
//! cache, or an O_DIRECT read), which the broker says once in its log at start. Handing the
//! session's keys to the kernel (kTLS) after the handshake would let splices go on; this kernel
//! lacks kTLS, so that path is not built yet.
//!
//! Key material is read again when its files change (Kafka's dynamic `ssl.keystore.*`): each
//! shard looks at the files' modification times at most once per [`RELOAD_CHECK`], when it
//! accepts a connection, and new handshakes use the new configuration; a file that fails to load
//! leaves the previous configuration in force, with a log line.

use std::cell::RefCell;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use futures_rustls::TlsAcceptor;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, SupportedProtocolVersion};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::security::{ClientAuth, SslConfig};

/// The socket's read buffer under a TLS session: rustls reads 4 KiB at a time, and without it
/// each 4 KiB would be a receive of its own.
pub const READ_BUFFER: usize = 64 << 10;

/// A socket read through [`READ_BUFFER`], for a TLS session over it.
pub type Buffered<S> = futures_lite::io::BufReader<S>;

/// `stream` with its read buffer.
pub fn buffered<S: futures_lite::AsyncRead>(stream: S) -> Buffered<S> {
    futures_lite::io::BufReader::with_capacity(READ_BUFFER, stream)
}

/// How often a shard looks whether the key material's files changed.
pub const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// The rustls server configuration of `ssl`.
pub fn server_config(ssl: &SslConfig) -> anyhow::Result<Arc<ServerConfig>> {
    let provider = Arc::new(provider(&ssl.cipher_suites)?);
    let versions = versions(&ssl.enabled_protocols)?;
    let (chain, key) = keystore(ssl)?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .context("ssl.enabled.protocols and ssl.cipher.suites have nothing in common")?;
    let builder = match ssl.client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        auth => {
            let roots = Arc::new(truststore(
                ssl,
                &format!("ssl.client.auth={}", ssl.client_auth.name()),
            )?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider);
            let verifier = if auth == ClientAuth::Requested {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(
                verifier
                    .build()
                    .context("ssl.truststore: no usable certificate authority")?,
            )
        }
    };
    let config = builder
        .with_single_cert(chain, key)
        .context("the keystore's private key does not match its certificate")?;
    Ok(Arc::new(config))
}

/// The rustls client configuration this node opens its own connections to other nodes with
/// (an `SSL` or `SASL_SSL` inter-broker or controller listener): it trusts the authorities of
/// `ssl.truststore.*`, checks the other node's certificate names the address it dials (Kafka's
/// default `ssl.endpoint.identification.algorithm=https`), and shows the keystore's
/// certificate when asked (mutual TLS), as Kafka's brokers do.
pub fn client_config(ssl: &SslConfig) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let provider = Arc::new(provider(&ssl.cipher_suites)?);
    let versions = versions(&ssl.enabled_protocols)?;
    let roots = truststore(ssl, "TLS to the other nodes")?;
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .context("ssl.enabled.protocols and ssl.cipher.suites have nothing in common")?
        .with_root_certificates(roots);
    let has_keystore = ssl.keystore_location.is_some() || ssl.keystore_certificate_chain.is_some();
    let config = if has_keystore {
        let (chain, key) = keystore(ssl)?;
        builder
            .with_client_auth_cert(chain, key)
            .context("the keystore's private key does not match its certificate")?
    } else {
        builder.with_no_client_auth()
    };
    Ok(Arc::new(config))
}

/// The ring provider with the suites `ssl.cipher.suites` names (IANA names; all when empty).
fn provider(names: &[String]) -> anyhow::Result<CryptoProvider> {
    // ring rather than rustls's default aws-lc-rs: one small C build instead of a large one in
    // every fresh CI build. rustls marks ring's provider deprecated for lacking post-quantum key
    // exchange (X25519MLKEM768), which Kafka's own JSSE listeners do not offer either.
    #[allow(deprecated)]
    let mut provider = rustls::crypto::ring::default_provider();
    if names.is_empty() {
        return Ok(provider);
    }
    let iana = |s: &rustls::SupportedCipherSuite| -> Option<String> {
        // rustls names TLS 1.3's suites TLS13_*; IANA (and Kafka's settings) TLS_*.
        s.suite().as_str().map(|n| n.replacen("TLS13_", "TLS_", 1))
    };
    for name in names {
        if !provider
            .cipher_suites
            .iter()
            .any(|s| iana(s).as_deref() == Some(name.as_str()))
        {
            let known: Vec<String> = provider.cipher_suites.iter().filter_map(iana).collect();
            anyhow::bail!(
                "ssl.cipher.suites: {name} is not a suite this broker offers ({})",
                known.join(", ")
            );
        }
    }
    provider
        .cipher_suites
        .retain(|s| iana(s).is_some_and(|n| names.contains(&n)));
    Ok(provider)
}

fn versions(names: &[String]) -> anyhow::Result<Vec<&'static SupportedProtocolVersion>> {
    let mut out = Vec::new();
    for name in names {
        out.push(match name.as_str() {
            "TLSv1.2" => &rustls::version::TLS12,
            "TLSv1.3" => &rustls::version::TLS13,
            other => anyhow::bail!("ssl.enabled.protocols: {other} is not TLSv1.2 or TLSv1.3"),
        });
    }
    if out.is_empty() {
        anyhow::bail!("ssl.enabled.protocols is empty");
    }
    Ok(out)
}

/// The PEM text of the keystore: the file, or the inline chain and key.
fn keystore_pem(ssl: &SslConfig) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    match (
        &ssl.keystore_location,
        &ssl.keystore_certificate_chain,
        &ssl.keystore_key,
    ) {
        (Some(path), _, _) => {
            let pem = std::fs::read(path)
                .with_context(|| format!("ssl.keystore.location {}", path.display()))?;
            Ok((pem.clone(), pem))
        }
        (None, Some(chain), Some(key)) => Ok((chain.as_bytes().to_vec(), key.as_bytes().to_vec())),
        (None, Some(_), None) => {
            anyhow::bail!("ssl.keystore.certificate.chain needs ssl.keystore.key")
        }
        _ => anyhow::bail!("an SSL listener needs ssl.keystore.location"),
    }
}

/// The keystore's certificate chain and private key: a PEM file or inline PEM (its key
/// decrypted with `ssl.key.password` when it is an encrypted PKCS#8 key), or a PKCS#12 store.
fn keystore(
    ssl: &SslConfig,
) -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    if ssl.keystore_type == "PKCS12" {
        return pkcs12_keystore(ssl);
    }
    let (chain_pem, key_pem) = keystore_pem(ssl)?;
    let chain = CertificateDer::pem_slice_iter(&chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .context("the keystore's certificates are not valid PEM")?;
    if chain.is_empty() {
        anyhow::bail!("the keystore holds no certificate (PEM \"CERTIFICATE\" sections)");
    }
    Ok((
        chain,
        pem_private_key(&key_pem, ssl.key_password.as_deref())?,
    ))
}

const ENCRYPTED_BEGIN: &str = "-----BEGIN ENCRYPTED PRIVATE KEY-----";
const ENCRYPTED_END: &str = "-----END ENCRYPTED PRIVATE KEY-----";

/// The private key of PEM text; an `ENCRYPTED PRIVATE KEY` (PKCS#8, PBES2) is decrypted with
/// `password`. No error quotes the key or the password.
fn pem_private_key(pem: &[u8], password: Option<&str>) -> anyhow::Result<PrivateKeyDer<'static>> {
    let text = String::from_utf8_lossy(pem);
    if let Some(start) = text.find(ENCRYPTED_BEGIN) {
        let Some(password) = password else {
            anyhow::bail!("the keystore's private key is encrypted: set ssl.key.password");
        };
        let stop = text[start..]
            .find(ENCRYPTED_END)
            .map(|end| start + end + ENCRYPTED_END.len())
            .context("the keystore's encrypted private key has no END line")?;
        let (_, der) = pkcs8::der::pem::decode_vec(text[start..stop].as_bytes()).map_err(|_| {
            anyhow::anyhow!("the keystore's encrypted private key is not valid PEM")
        })?;
        let info = pkcs8::EncryptedPrivateKeyInfoRef::try_from(der.as_slice())
            .map_err(|_| anyhow::anyhow!("the keystore's encrypted private key is not PKCS#8"))?;
        let key = info.decrypt(password).map_err(|_| {
            anyhow::anyhow!(
                "the keystore's encrypted private key does not decrypt with ssl.key.password \
                 (a wrong password, or an encryption other than PBES2)"
            )
        })?;
        return Ok(PrivateKeyDer::Pkcs8(key.as_bytes().to_vec().into()));
    }
    PrivateKeyDer::from_pem_slice(pem).map_err(|_| {
        anyhow::anyhow!(
            "the keystore holds no private key (PEM \"PRIVATE KEY\", \"ENCRYPTED PRIVATE KEY\", \
             \"RSA PRIVATE KEY\" or \"EC PRIVATE KEY\")"
        )
    })
}

/// A PKCS#12 store's bytes and password, for `what` (`keystore` or `truststore`).
fn pkcs12_file(
    what: &str,
    location: Option<&Path>,
    password: Option<&str>,
) -> anyhow::Result<(Vec<u8>, String)> {
    let path = location.with_context(|| format!("a PKCS12 {what} needs ssl.{what}.location"))?;
    let bytes =
        std::fs::read(path).with_context(|| format!("ssl.{what}.location {}", path.display()))?;
    let password =
        password.with_context(|| format!("a PKCS12 {what} needs ssl.{what}.password"))?;
    Ok((bytes, password.to_string()))
}

fn pkcs12_keystore(
    ssl: &SslConfig,
) -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let (bytes, password) = pkcs12_file(
        "keystore",
        ssl.keystore_location.as_deref(),
        ssl.keystore_password.as_deref(),
    )?;
    let store = p12_keystore::KeyStore::from_pkcs12(
        &bytes,
        &password,
        p12_keystore::Pkcs12ImportPolicy::Strict,
    )
    .map_err(|e| {
        anyhow::anyhow!("the PKCS12 keystore does not open with ssl.keystore.password: {e}")
    })?;
    let (_, entry) = store
        .private_key_chain()
        .context("the PKCS12 keystore holds no private key with its certificate chain")?;
    let chain: Vec<CertificateDer<'static>> = entry
        .certs()
        .iter()
        .map(|c| CertificateDer::from(c.as_der().to_vec()))
        .collect();
    if chain.is_empty() {
        anyhow::bail!("the PKCS12 keystore's private key has no certificate");
    }
    Ok((
        chain,
        PrivateKeyDer::Pkcs8(entry.key().as_der().to_vec().into()),
    ))
}

fn truststore(ssl: &SslConfig, needed_for: &str) -> anyhow::Result<RootCertStore> {
    if ssl.truststore_location.is_none() && ssl.truststore_certificates.is_none() {
        anyhow::bail!("{needed_for} needs a truststore: set ssl.truststore.location");
    }
    let mut roots = RootCertStore::empty();
    for cert in truststore_certificates(ssl)? {
        roots
            .add(cert)
            .context("a truststore certificate is not a usable authority")?;
    }
    Ok(roots)
}

/// The certificates of `ssl.truststore.*`: a PEM file or inline PEM, or a PKCS#12 store (every
/// certificate in it, whether or not Java's keytool marked it trusted). At least one.
pub fn truststore_certificates(ssl: &SslConfig) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = if ssl.truststore_type == "PKCS12" {
        let (bytes, password) = pkcs12_file(
            "truststore",
            ssl.truststore_location.as_deref(),
            ssl.truststore_password.as_deref(),
        )?;
        let store = p12_keystore::KeyStore::from_pkcs12(
            &bytes,
            &password,
            p12_keystore::Pkcs12ImportPolicy::Raw,
        )
        .map_err(|e| {
            anyhow::anyhow!("the PKCS12 truststore does not open with ssl.truststore.password: {e}")
        })?;
        store
            .entries()
            .filter_map(|(_, entry)| match entry {
                p12_keystore::KeyStoreEntry::Certificate(cert) => {
                    Some(CertificateDer::from(cert.as_der().to_vec()))
                }
                _ => None,
            })
            .collect()
    } else {
        let pem = match (&ssl.truststore_location, &ssl.truststore_certificates) {
            (Some(path), _) => std::fs::read(path)
                .with_context(|| format!("ssl.truststore.location {}", path.display()))?,
            (None, Some(inline)) => inline.as_bytes().to_vec(),
            (None, None) => anyhow::bail!("no truststore: set ssl.truststore.location"),
        };
        CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .context("the truststore is not valid PEM")?
    };
    if certs.is_empty() {
        anyhow::bail!("the truststore holds no certificate");
    }
    Ok(certs)
}

/// A shard's TLS acceptor, built again when the key material's files change.
pub struct Tls {
    ssl: SslConfig,
    state: RefCell<State>,
}

struct State {
    acceptor: TlsAcceptor,
    /// The files' modification times the acceptor was built from.
    stamps: Vec<Option<SystemTime>>,
    checked: Instant,
}

impl Tls {
    pub fn new(ssl: &SslConfig) -> anyhow::Result<Tls> {
        let stamps = stamps(ssl);
        let config = server_config(ssl)?;
        Ok(Tls {
            ssl: ssl.clone(),
            state: RefCell::new(State {
                acceptor: TlsAcceptor::from(config),
                stamps,
                checked: Instant::now(),
            }),
        })
    }

    /// The acceptor for a new connection: the current key material's.
    pub fn acceptor(&self, shard: usize) -> TlsAcceptor {
        let mut state = self.state.borrow_mut();
        if state.checked.elapsed() >= RELOAD_CHECK {
            state.checked = Instant::now();
            let now = stamps(&self.ssl);
            if now != state.stamps {
                state.stamps = now;
                match server_config(&self.ssl) {
                    Ok(config) => {
                        state.acceptor = TlsAcceptor::from(config);
                        tracing::info!(
                            shard,
                            "SSL key material changed on disk: reloaded; new connections use it"
                        );
                    }
                    Err(e) => tracing::warn!(
                        shard,
                        error = %format!("{e:#}"),
                        "SSL key material changed on disk but does not load; the previous stays in force"
                    ),
                }
            }
        }
        state.acceptor.clone()
    }
}

fn files(ssl: &SslConfig) -> [Option<&Path>; 2] {
    [
        ssl.keystore_location.as_deref(),
        ssl.truststore_location.as_deref(),
    ]
}

fn stamps(ssl: &SslConfig) -> Vec<Option<SystemTime>> {
    files(ssl)
        .into_iter()
        .flatten()
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}

/// Whether this kernel offers kernel TLS (the `tls` upper-layer protocol).
pub fn kernel_tls_available() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp")
        .is_ok_and(|ulps| ulps.split_whitespace().any(|u| u == "tls"))
}
