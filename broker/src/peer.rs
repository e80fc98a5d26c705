//! Calls to other nodes: a connection with the timeouts every link between nodes has, and one
//! Kafka request and its answer on it (the replica fetchers, the transaction coordinator's
//! markers and verifications, the group coordinator's first load, calls to the controllers).
//! Frames are encoded and decoded by `codec`.
//!
//! A link speaks the security protocol of the listener it dials ([`Route`]): the inter-broker
//! listener's (`inter.broker.listener.name`) to brokers, the controller listener's to
//! controllers. Over `SSL` and `SASL_SSL` it is a TLS session that checks the other node's
//! certificate against `ssl.truststore.*` and shows this node's own; over `SASL_*` this node
//! logs in (SaslHandshake and SaslAuthenticate, `sasl.mechanism.inter.broker.protocol` or
//! `sasl.mechanism.controller.protocol`) with the username and password of that listener's
//! JAAS entry, before the first request, as Kafka's brokers do.

use std::cell::RefCell;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

use std::sync::Arc;
use std::task::{Context, Poll};

use anyhow::Context as _;
use bytes::Bytes;
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use glommio::net::TcpStream;
use kafka_protocol::messages::{
    ApiKey, RequestKind, ResponseKind, SaslAuthenticateRequest, SaslHandshakeRequest,
};
use kafka_protocol::protocol::StrBytes;

use crate::config::BrokerConfig;

/// The largest frame accepted on the CONTROLLER listener (a snapshot travels in one message).
pub const FRAME_MAX: usize = 256 << 20;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// TCP_USER_TIMEOUT on connections between nodes: one whose sent data the peer has not
/// acknowledged for this long fails, so that a connection into a network partition is
/// dropped and dialled again instead of waiting out TCP's retransmission backoff (which after a
/// long partition resumes minutes after the network heals).
pub const INTERNODE_USER_TIMEOUT: Duration = Duration::from_secs(5);

/// Refused logins to other nodes are logged at most this often.
const LOGIN_REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
static LOGIN_REFUSALS: crate::loggers::RateLimitedLog = crate::loggers::RateLimitedLog::new();

/// Which listener of the other node a link dials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// A broker's `inter.broker.listener.name` listener.
    InterBroker,
    /// A controller's listener (the first of `controller.listener.names`).
    Controller,
}

/// How this node opens links on one route.
struct Dialer {
    tls: Option<Arc<rustls::ClientConfig>>,
    login: Option<Login>,
}

/// A SASL login. No `Debug`: it holds a password.
struct Login {
    mechanism: String,
    user: String,
    password: String,
}

/// How this node opens links to the other nodes, per route; made once from the settings
/// (which `BrokerConfig::validate` checked).
#[derive(Clone)]
pub struct Dialers {
    inter_broker: Arc<Dialer>,
    controller: Arc<Dialer>,
}

impl Dialers {
    pub fn new(config: &BrokerConfig) -> anyhow::Result<Dialers> {
        let dialer = |listener: &str,
                      protocol: crate::config::security::SecurityProtocol,
                      mechanism: &str|
         -> anyhow::Result<Dialer> {
            let tls = if protocol.tls() {
                Some(
                    crate::security::tls::client_config(&config.ssl).with_context(|| {
                        format!("TLS to the other nodes' {listener} listener ({protocol})")
                    })?,
                )
            } else {
                None
            };
            let login = if protocol.sasl() {
                let (user, password) = config.login(listener, mechanism)?;
                Some(Login {
                    mechanism: mechanism.to_string(),
                    user,
                    password,
                })
            } else {
                None
            };
            Ok(Dialer { tls, login })
        };
        let inter = config.inter_broker_listener();
        let inter_protocol = config
            .security_protocol_of(inter)
            .unwrap_or(crate::config::security::SecurityProtocol::Plaintext);
        Ok(Dialers {
            inter_broker: Arc::new(dialer(
                inter,
                inter_protocol,
                &config.sasl_mechanism_inter_broker_protocol,
            )?),
            controller: Arc::new(dialer(
                config.controller_listener_name(),
                config.controller_security_protocol(),
                &config.sasl_mechanism_controller_protocol,
            )?),
        })
    }
}

thread_local! {
    /// This shard's dialers; plaintext links without them (a single node).
    static DIALERS: RefCell<Option<Dialers>> = const { RefCell::new(None) };
}

/// Links opened from this shard's thread dial with `dialers`.
pub fn set_dialers(dialers: Dialers) {
    DIALERS.with(|d| *d.borrow_mut() = Some(dialers));
}

fn dialer(route: Route) -> Option<Arc<Dialer>> {
    DIALERS.with(|d| {
        d.borrow().as_ref().map(|d| match route {
            Route::InterBroker => d.inter_broker.clone(),
            Route::Controller => d.controller.clone(),
        })
    })
}

/// A link to another node: the socket, or a TLS session over it.
pub enum Link {
    Plain(TcpStream),
    Tls(Box<futures_rustls::client::TlsStream<crate::security::tls::Buffered<TcpStream>>>),
}

impl AsyncRead for Link {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Link::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Link::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Link {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Link::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Link::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Link::Plain(s) => Pin::new(s).poll_flush(cx),
            Link::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Link::Plain(s) => Pin::new(s).poll_close(cx),
            Link::Tls(s) => Pin::new(s.as_mut()).poll_close(cx),
        }
    }
}

/// Opens a link to `addr` on `route`: connected, its TLS handshake done and this node logged
/// in, within the connect timeout each.
pub async fn connect(addr: &str, route: Route) -> std::io::Result<Link> {
    Ok(connect_for_session(addr, route).await?.0)
}

/// [`connect`], and when a link kept open should be replaced by a new one: before the end of
/// its SASL session, when the other node's sessions end (KIP-368, `connections.max.reauth.ms`),
/// since this node does not log in again on a link it has; `None`: never.
pub async fn connect_for_session(
    addr: &str,
    route: Route,
) -> std::io::Result<(Link, Option<Instant>)> {
    let stream = connect_tcp(addr).await?;
    let Some(dialer) = dialer(route) else {
        return Ok((Link::Plain(stream), None));
    };
    let mut link = match &dialer.tls {
        None => Link::Plain(stream),
        Some(config) => {
            let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let name = rustls_pki_types::ServerName::try_from(host.to_string())
                .map_err(|_| std::io::Error::other(format!("{host} is not a TLS server name")))?;
            let connector = futures_rustls::TlsConnector::from(config.clone());
            let stream = crate::security::tls::buffered(stream);
            let session = within(
                CONNECT_TIMEOUT,
                "TLS handshake",
                connector.connect(name, stream),
            )
            .await?;
            Link::Tls(Box::new(session))
        }
    };
    let mut renew = None;
    if let Some(login) = &dialer.login {
        let logged_in = within(CONNECT_TIMEOUT, "SASL login", sasl_login(&mut link, login)).await;
        if let Ok(Some(lifetime)) = logged_in {
            // Kafka's clients renew at 85 to 95% of the session: here at 80%, a fetch's wait
            // (replica.fetch.wait.max.ms) before it.
            renew = Some(Instant::now() + lifetime.mul_f64(0.8));
        }
        if let Err(e) = logged_in {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                if let Some(suppressed) = LOGIN_REFUSALS.due(LOGIN_REFUSAL_LOG_INTERVAL) {
                    // Kafka's brokers log a refused inter-broker login as an error, each time.
                    tracing::error!(%addr, ?route, error = %e, refused_since_last_line = suppressed, "another node refused this node's SASL login; check this node's username and password (the listener's sasl.jaas.config)");
                }
            }
            return Err(e);
        }
    }
    Ok((link, renew))
}

/// `fut`, or a timed-out error naming `what` after `timeout`.
async fn within<T>(
    timeout: Duration,
    what: &str,
    fut: impl Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    futures_lite::future::or(fut, async {
        glommio::timer::sleep(timeout).await;
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{what} timed out"),
        ))
    })
    .await
}

/// Logs in over `link` with SaslHandshake (version 1) and SaslAuthenticate requests; the
/// session's lifetime, when the other node gives it one.
async fn sasl_login(link: &mut Link, login: &Login) -> std::io::Result<Option<Duration>> {
    let refused = |why: String| std::io::Error::new(std::io::ErrorKind::PermissionDenied, why);
    let handshake = RequestKind::SaslHandshake(
        SaslHandshakeRequest::default()
            .with_mechanism(StrBytes::from_string(login.mechanism.clone())),
    );
    match exchange(link, ApiKey::SaslHandshake, 1, 1, &handshake).await? {
        ResponseKind::SaslHandshake(r) if r.error_code == 0 => {}
        ResponseKind::SaslHandshake(r) => {
            let enabled: Vec<String> = r.mechanisms.iter().map(|m| m.to_string()).collect();
            return Err(refused(format!(
                "the other node does not run SASL {} (it runs {})",
                login.mechanism,
                enabled.join(", ")
            )));
        }
        _ => {
            return Err(std::io::Error::other(
                "SaslHandshake answered as another API",
            ))
        }
    }
    let (_, lifetime) = match crate::security::scram::Mechanism::from_name(&login.mechanism) {
        None => {
            // PLAIN: authorization id (none), user, password.
            let mut token = Vec::with_capacity(2 + login.user.len() + login.password.len());
            token.push(0);
            token.extend_from_slice(login.user.as_bytes());
            token.push(0);
            token.extend_from_slice(login.password.as_bytes());
            authenticate(link, login, 2, token).await?
        }
        Some(mechanism) => {
            let mut scram = crate::security::scram::ClientExchange::new(
                mechanism,
                &login.user,
                &login.password,
            );
            let (server_first, _) = authenticate(link, login, 2, scram.first()).await?;
            let last = scram.last(&server_first).map_err(refused)?;
            let (server_final, lifetime) = authenticate(link, login, 3, last).await?;
            scram.verify(&server_final).map_err(refused)?;
            (server_final, lifetime)
        }
    };
    Ok(lifetime)
}

/// One SaslAuthenticate round: `token` sent, the server's answer back, and the session's
/// lifetime if the server gave one.
async fn authenticate(
    link: &mut Link,
    login: &Login,
    correlation_id: i32,
    token: Vec<u8>,
) -> std::io::Result<(Bytes, Option<Duration>)> {
    let request = RequestKind::SaslAuthenticate(
        SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token)),
    );
    match exchange(link, ApiKey::SaslAuthenticate, 2, correlation_id, &request).await? {
        ResponseKind::SaslAuthenticate(r) if r.error_code == 0 => {
            let lifetime = (r.session_lifetime_ms > 0)
                .then(|| Duration::from_millis(r.session_lifetime_ms as u64));
            Ok((r.auth_bytes, lifetime))
        }
        ResponseKind::SaslAuthenticate(r) => Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "SASL {} login as {} refused: {}",
                login.mechanism,
                login.user,
                r.error_message
                    .as_deref()
                    .unwrap_or("authentication failed")
            ),
        )),
        _ => Err(std::io::Error::other(
            "SaslAuthenticate answered as another API",
        )),
    }
}

/// Sends one request on `link` and decodes its response.
async fn exchange(
    link: &mut Link,
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    request: &RequestKind,
) -> std::io::Result<ResponseKind> {
    let frame = crate::codec::encode_request(key, version, correlation_id, request)
        .map_err(|e| std::io::Error::other(format!("{key:?}: {e}")))?;
    link.write_all(&frame).await?;
    link.flush().await?;
    let body = read_frame(link).await?;
    crate::codec::decode_response(key, version, body)
        .map_err(|e| std::io::Error::other(format!("{key:?} response: {e}")))
}

/// A TCP connection to `addr` with the options of links between nodes.
async fn connect_tcp(addr: &str) -> std::io::Result<TcpStream> {
    let addr: SocketAddr = match addr.parse() {
        Ok(a) => a,
        Err(_) => std::net::ToSocketAddrs::to_socket_addrs(addr)?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("{addr} does not resolve")))?,
    };
    let stream = futures_lite::future::or(
        async { TcpStream::connect(addr).await.map_err(std::io::Error::from) },
        async {
            glommio::timer::sleep(CONNECT_TIMEOUT).await;
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connect timed out",
            ))
        },
    )
    .await?;
    stream.set_nodelay(true).map_err(std::io::Error::from)?;
    set_user_timeout(&stream, INTERNODE_USER_TIMEOUT)?;
    Ok(stream)
}

/// Sets TCP_USER_TIMEOUT (Linux): unacknowledged data older than `timeout` fails the socket.
pub fn set_user_timeout(stream: &TcpStream, timeout: Duration) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let ms = libc::c_uint::try_from(timeout.as_millis()).unwrap_or(libc::c_uint::MAX);
    // SAFETY: a valid socket descriptor for the duration of the call, and a pointer to a
    // c_uint with its size, as setsockopt(2) takes for TCP_USER_TIMEOUT.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            (&ms as *const libc::c_uint).cast(),
            std::mem::size_of::<libc::c_uint>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Reads one frame's body (after its size).
pub async fn read_frame<R: futures_lite::AsyncRead + Unpin>(
    reader: &mut R,
) -> std::io::Result<Vec<u8>> {
    read_frame_within(reader, FRAME_MAX).await
}

/// [`read_frame`], with frames larger than `max` an error before anything is allocated.
pub async fn read_frame_within<R: futures_lite::AsyncRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> std::io::Result<Vec<u8>> {
    let mut size = [0u8; 4];
    reader.read_exact(&mut size).await?;
    let size = i32::from_be_bytes(size);
    let size = usize::try_from(size)
        .ok()
        .filter(|&s| s <= max)
        .ok_or_else(|| std::io::Error::other(format!("frame size {size} out of bounds")))?;
    let mut body = vec![0u8; size];
    reader.read_exact(&mut body).await?;
    Ok(body)
}

/// Serves one request frame (size included) on this shard, as its listener would, and returns
/// the response frame's body.
pub type Loopback = Rc<dyn Fn(Bytes) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<u8>>>>>>;

thread_local! {
    /// This shard's own listener address and how to serve a request sent to it in-process.
    static LOOPBACK: RefCell<Option<(String, Loopback)>> = const { RefCell::new(None) };
}

/// Calls from this shard to `own_address` are served by `serve`, without a connection. The
/// server sets it when this node's listener speaks TLS or SASL, which the plaintext calls of
/// this module do not: a single node's group coordinators read the offsets partitions from
/// their leader, which is the node itself.
pub fn set_loopback(own_address: String, serve: Loopback) {
    LOOPBACK.with(|l| *l.borrow_mut() = Some((own_address, serve)));
}

fn loopback(addr: &str) -> Option<Loopback> {
    LOOPBACK.with(|l| {
        l.borrow()
            .as_ref()
            .filter(|(own, _)| own == addr)
            .map(|(_, serve)| serve.clone())
    })
}

/// Sends one Kafka request frame to `addr` on `route` on a fresh link and returns the response
/// frame's body (after the size), within `timeout`.
pub async fn call(
    route: Route,
    addr: &str,
    frame: Bytes,
    timeout: Duration,
) -> std::io::Result<Vec<u8>> {
    let local = loopback(addr);
    futures_lite::future::or(
        async {
            if let Some(serve) = local {
                return serve(frame).await;
            }
            let stream = connect(addr, route).await?;
            let (mut reader, mut writer) = futures_lite::io::split(stream);
            writer.write_all(&frame).await?;
            writer.flush().await?;
            read_frame(&mut reader).await
        },
        async {
            glommio::timer::sleep(timeout).await;
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer from {addr} within {timeout:?}"),
            ))
        },
    )
    .await
}
