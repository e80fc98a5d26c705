//! The Kafka protocol server of one shard: accept connections, read frames, run requests, and
//! write responses in request order.
//!
//! Requests on one connection run concurrently (up to `max.in.flight.requests.per.connection`),
//! so pipelined produces share group commits; a writer task awaits them in the order they arrived
//! and writes each response. A frame with a negative size or one above
//! `socket.request.max.bytes` closes the connection with a log line, before any allocation.
//!
//! Limits, each a Kafka setting where Kafka has one (see `config.rs`):
//! - `max.connections` and `max.connections.per.ip`: a connection over either is accepted and
//!   closed at once, with a log line at most once per `REFUSAL_LOG_INTERVAL`;
//! - `connections.max.idle.ms`: a connection that makes no progress for that long (no complete
//!   request read, no response written) is closed: an idle client, one trickling a request a
//!   byte at a time, and one that never reads its responses alike;
//! - `max.in.flight.requests.per.connection`: a connection's requests read and not yet answered;
//!   at the limit the broker stops reading, so a client that never reads its responses fills the
//!   socket buffers and holds at most that many responses in memory.
//!
//! When the process runs out of file descriptors, accepting fails; the broker says so once per
//! `ACCEPT_ERROR_LOG_INTERVAL` (with how many failures since the last line), keeps serving its open
//! connections, and closes connections waiting in the backlog at once through a reserved
//! descriptor, so that new clients get a closed connection instead of silence; accepting resumes
//! by itself when descriptors are free again.

pub mod alloc;

pub mod splice;

use std::cell::Cell;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::pin::pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Future};
use glommio::channels::local_channel;
use glommio::net::{TcpListener, TcpStream};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ResponseKind};
use kafka_protocol::ResponseError;

use crate::codec::frame;
use crate::codec::response::{Frame, FramePart};
use crate::handlers;
use crate::security::{before_auth, sasl, tls, BeforeAuth};
use crate::shard::Shard;

/// The shortest time between two log lines about refused connections.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(5);
/// The shortest time between two log lines about failing accepts.
pub const ACCEPT_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(5);
/// How long the accept loop waits after an accept error it cannot work around.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
/// Log target of the per-connection lines, the same whatever the crate is called:
/// `RUST_LOG=info,sluice::net=debug` shows every connection's end and why.
const TARGET: &str = "sluice::net";

/// Open client connections over every shard of this process, and per client address. Touched
/// only when a connection opens or closes, never per request.
static OPEN_CONNECTIONS: AtomicUsize = AtomicUsize::new(0);
static OPEN_PER_IP: LazyLock<Mutex<HashMap<IpAddr, usize>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

use crate::loggers::RateLimitedLog;

static REFUSALS: RateLimitedLog = RateLimitedLog::new();
/// Connections closed for their IP's connection_creation_rate.
static THROTTLED: RateLimitedLog = RateLimitedLog::new();
static ACCEPT_ERRORS: RateLimitedLog = RateLimitedLog::new();

/// `max.connections` and `max.connections.per.ip` as they are now: the start-up values, or
/// the dynamic broker configs set since (Kafka changes both without a restart).
#[derive(Clone, Copy)]
struct ConnectionLimits {
    max_connections: usize,
    max_connections_per_ip: usize,
}

impl ConnectionLimits {
    fn of(shard: &Shard) -> ConnectionLimits {
        let config = shard.config();
        let image = shard.image();
        let dynamic = |name: &str, fallback: usize| {
            image
                .dynamic_broker_config(config.node_id, name)
                .and_then(|(v, _)| v.parse::<usize>().ok())
                .unwrap_or(fallback)
        };
        ConnectionLimits {
            max_connections: dynamic("max.connections", config.max_connections),
            max_connections_per_ip: dynamic(
                "max.connections.per.ip",
                config.max_connections_per_ip,
            ),
        }
    }
}

/// A connection's place under `max.connections` and `max.connections.per.ip`; freed on drop.
struct ConnectionSlot {
    ip: Option<IpAddr>,
}

impl ConnectionSlot {
    /// Takes a place, or says which limit refuses it.
    fn acquire(limits: ConnectionLimits, ip: Option<IpAddr>) -> Result<ConnectionSlot, String> {
        let open = OPEN_CONNECTIONS.fetch_add(1, Ordering::SeqCst);
        if open >= limits.max_connections {
            OPEN_CONNECTIONS.fetch_sub(1, Ordering::SeqCst);
            return Err(format!(
                "max.connections ({}) reached",
                limits.max_connections
            ));
        }
        // Holds the place under max.connections; dropped (given back) if the per-IP limit refuses.
        let mut slot = ConnectionSlot { ip: None };
        if let Some(ip) = ip {
            let mut per_ip = OPEN_PER_IP.lock().unwrap_or_else(|e| e.into_inner());
            let count = per_ip.entry(ip).or_insert(0);
            if *count >= limits.max_connections_per_ip {
                if *count == 0 {
                    per_ip.remove(&ip);
                }
                return Err(format!(
                    "max.connections.per.ip ({}) reached for {ip}",
                    limits.max_connections_per_ip
                ));
            }
            *count += 1;
            slot.ip = Some(ip);
        }
        Ok(slot)
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        OPEN_CONNECTIONS.fetch_sub(1, Ordering::SeqCst);
        if let Some(ip) = self.ip {
            let mut per_ip = OPEN_PER_IP.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(count) = per_ip.get_mut(&ip) {
                *count -= 1;
                if *count == 0 {
                    per_ip.remove(&ip);
                }
            }
        }
    }
}

/// A descriptor held in reserve, so that a shard out of descriptors can still accept (and close)
/// a connection waiting in the backlog instead of leaving its client without an answer.
fn reserve_descriptor() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

fn descriptor_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0).then_some(limit.rlim_cur)
}

/// Serves the Kafka protocol on `listener`, the listener named `name`, with its security
/// protocol.
pub async fn serve(shard: Rc<Shard>, listener: TcpListener, name: Rc<str>) {
    let config = shard.config();
    // Checked at start (`BrokerConfig::validate`).
    let protocol = config
        .security_protocol_of(&name)
        .unwrap_or(crate::config::security::SecurityProtocol::Plaintext);
    let tls = if protocol.tls() {
        match tls::Tls::new(&config.ssl) {
            Ok(tls) => Some(Rc::new(tls)),
            Err(e) => {
                tracing::error!(shard = shard.id, error = %format!("{e:#}"), "the SSL listener's key material does not load; this shard serves no connection");
                return;
            }
        }
    } else {
        None
    };
    let sasl = if protocol.sasl() {
        // Checked at start (`server.rs`).
        match sasl::SaslServer::new(config, &name) {
            Ok(server) => Some(Rc::new(server)),
            Err(e) => {
                tracing::error!(shard = shard.id, error = %e, "the SASL listener's settings do not load; this shard serves no connection");
                return;
            }
        }
    } else {
        None
    };
    // Checked at start (`server.rs`).
    let mapper = Rc::new(
        crate::security::principal::PrincipalMapper::parse(&config.ssl.principal_mapping_rules)
            .unwrap_or_default(),
    );
    let mut reserve = reserve_descriptor();
    let mut failing = 0u64;
    loop {
        match listener.accept().await {
            Ok(stream) => {
                if reserve.is_none() {
                    reserve = reserve_descriptor();
                }
                if reserve.is_none() {
                    // This connection took the last descriptor: still exhausted, so it is
                    // closed, and its client knows at once.
                    failing += 1;
                    drop(stream);
                    continue;
                }
                if failing > 0 {
                    tracing::info!(
                        shard = shard.id,
                        failed_accepts = failing,
                        "accepting connections again"
                    );
                    failing = 0;
                }
                let peer = stream.peer_addr().ok();
                let slot = match ConnectionSlot::acquire(
                    ConnectionLimits::of(&shard),
                    peer.map(|p| p.ip()),
                ) {
                    Ok(slot) => slot,
                    Err(limit) => {
                        if let Some(suppressed) = REFUSALS.due(REFUSAL_LOG_INTERVAL) {
                            tracing::warn!(
                                ?peer,
                                refused_since_last_line = suppressed,
                                "refused a connection: {limit}; closing it"
                            );
                        }
                        drop(stream);
                        continue;
                    }
                };
                if let Some(throttle) = connection_throttle(&shard, peer) {
                    // KIP-612: over its connection_creation_rate, the connection is not counted
                    // and is closed once the throttle time has passed, so its client backs off.
                    if let Some(suppressed) = THROTTLED.due(REFUSAL_LOG_INTERVAL) {
                        tracing::info!(?peer, throttle_ms = throttle.as_millis() as u64, throttled_since_last_line = suppressed, "connection over its IP's connection_creation_rate; closing it after the throttle time");
                    }
                    glommio::spawn_local(async move {
                        let _slot = slot;
                        glommio::timer::sleep(throttle).await;
                        drop(stream);
                    })
                    .detach();
                    continue;
                }
                let shard = shard.clone();
                let acceptor = tls.as_ref().map(|t| t.acceptor(shard.id));
                let auth = sasl.clone().map(sasl::Authenticator::new);
                let name = name.clone();
                let mapper = mapper.clone();
                glommio::spawn_local(async move {
                    let _slot = slot;
                    let served = match acceptor {
                        None => match stream.set_nodelay(true) {
                            Ok(()) => {
                                let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
                                connection(shard, stream, Some(fd), auth, peer, name, Rc::from(sasl::ANONYMOUS)).await
                            }
                            Err(e) => Err(anyhow::anyhow!("{e}")),
                        },
                        Some(acceptor) => match handshake(&shard, acceptor, stream, peer).await {
                            Some(stream) => {
                                // Without SASL, the client certificate names the client.
                                let principal = if auth.is_some() {
                                    Ok(sasl::ANONYMOUS.to_string())
                                } else {
                                    crate::security::tls_principal(stream.get_ref().1.peer_certificates(), &mapper)
                                };
                                match principal {
                                    Ok(principal) => connection(shard, stream, None, auth, peer, name, Rc::from(principal)).await,
                                    Err(why) => {
                                        crate::metrics::Metrics::count(&shard.shared.metrics.failed_authentication, 1);
                                        tracing::info!(?peer, "SSL client refused: {why}; closing the connection");
                                        return;
                                    }
                                }
                            }
                            None => return,
                        },
                    };
                    match served {
                        Ok(end) => tracing::debug!(target: TARGET, ?peer, principal = %end.principal, requests = end.requests, "connection closed: {}", end.why),
                        Err(e) => tracing::debug!(target: TARGET, ?peer, error = %e, "connection closed"),
                    }
                })
                .detach();
            }
            Err(e) => {
                let e = std::io::Error::from(e);
                failing += 1;
                let exhausted = out_of_descriptors(&e);
                if let Some(suppressed) = ACCEPT_ERRORS.due(ACCEPT_ERROR_LOG_INTERVAL) {
                    if exhausted {
                        tracing::error!(
                            shard = shard.id,
                            error = %e,
                            open_connections = OPEN_CONNECTIONS.load(Ordering::Relaxed),
                            limit = descriptor_limit(),
                            failed_since_last_line = suppressed,
                            "cannot accept connections: the process is out of file descriptors \
                             (ulimit -n); open connections keep being served, new ones are \
                             closed until descriptors are free"
                        );
                    } else {
                        tracing::warn!(shard = shard.id, error = %e, failed_since_last_line = suppressed, "accept failed; retrying");
                    }
                }
                // Out of descriptors: free the reserved one, so that the next accept takes the
                // waiting connection; it is served if the reserve can be taken back (descriptors
                // came free meanwhile), closed otherwise, so its client learns at once.
                if exhausted && reserve.take().is_some() {
                    continue;
                }
                glommio::timer::sleep(ACCEPT_RETRY).await;
            }
        }
    }
}

/// The throttle time of a new connection from `peer` over its IP's `connection_creation_rate`
/// (KIP-612), counted against it unless it is throttled; `None` within the quota or without
/// one.
fn connection_throttle(shard: &Shard, peer: Option<SocketAddr>) -> Option<Duration> {
    let ip = peer?.ip().to_string();
    let image = shard.image();
    let applied = crate::quota::resolve_ip(&image.cluster.as_ref()?.quotas, &ip)?;
    let quotas = &shard.shared.quotas;
    let throttle = quotas.record(&applied, 1.0);
    if throttle.as_millis() == 0 {
        return None;
    }
    quotas.unrecord(&applied, 1.0);
    Some(throttle)
}

/// How a connection ended, for its log line.
struct End {
    why: &'static str,
    requests: u64,
    /// Who the client authenticated as (`User:<name>`), `User:ANONYMOUS` when it did not.
    principal: Rc<str>,
}

/// Awaits `fut` unless the connection makes no progress for `idle`: `None` then. `progress` is
/// when the connection last read a whole request or wrote a response; it may move while `fut`
/// waits (the writer task moves it).
async fn unless_idle<F: Future>(
    fut: F,
    progress: &Cell<Instant>,
    idle: Duration,
) -> Option<F::Output> {
    let mut fut = pin!(fut);
    loop {
        let deadline = progress.get() + idle;
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        let done = futures_lite::future::or(async { Some(fut.as_mut().await) }, async {
            glommio::timer::sleep(deadline - now).await;
            None
        })
        .await;
        if done.is_some() {
            return done;
        }
    }
}

/// The TLS handshake of a connection accepted on an SSL listener, bounded by
/// `connections.max.idle.ms` (a client that starts one and stops holds its slot no longer).
/// `None` when it failed or took too long, with a log line naming the client's address.
async fn handshake(
    shard: &Shard,
    acceptor: futures_rustls::TlsAcceptor,
    stream: TcpStream,
    peer: Option<SocketAddr>,
) -> Option<futures_rustls::server::TlsStream<tls::Buffered<TcpStream>>> {
    let idle = Duration::from_millis(shard.config().connections_max_idle_ms);
    let _ = stream.set_nodelay(true);
    let stream = tls::buffered(stream);
    let done = futures_lite::future::or(async { Some(acceptor.accept(stream).await) }, async {
        glommio::timer::sleep(idle).await;
        None
    })
    .await;
    match done {
        Some(Ok(stream)) => Some(stream),
        // Closed before or during the handshake, as a port probe does: nothing to report.
        Some(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            tracing::debug!(target: TARGET, ?peer, "connection closed during the SSL handshake");
            None
        }
        Some(Err(e)) => {
            crate::metrics::Metrics::count(&shard.shared.metrics.failed_authentication, 1);
            // Kafka logs a failed SSL handshake with the client's address at INFO.
            tracing::info!(?peer, error = %e, "SSL handshake failed; closing the connection");
            None
        }
        None => {
            tracing::info!(
                ?peer,
                idle_ms = idle.as_millis() as u64,
                "SSL handshake not done within connections.max.idle.ms; closing the connection"
            );
            None
        }
    }
}

/// A request being processed: its response frame, none (acks=0), or `Err` when the request was
/// malformed and the connection must close.
type Pending = glommio::task::JoinHandle<Result<Option<Frame>, ()>>;

/// A response already made, written in its turn.
fn answered(frame: Bytes, turn: crate::handlers::order::Turn) -> Pending {
    glommio::spawn_local(async move {
        turn.finish().await;
        Ok(Some(Frame::Bytes(frame)))
    })
    .detach()
}

/// Serves one connection over `stream`: the socket itself, or a TLS session over it.
/// `splice_fd` is the socket's descriptor when fetched records may be spliced into it (plain
/// TCP); over TLS they are copied, so that they are encrypted. With `auth` (a SASL listener),
/// only ApiVersions and the SASL requests are served until the client authenticates.
async fn connection<S>(
    shard: Rc<Shard>,
    stream: S,
    splice_fd: Option<RawFd>,
    mut auth: Option<sasl::Authenticator>,
    peer: Option<SocketAddr>,
    listener: Rc<str>,
    mut principal: Rc<str>,
) -> anyhow::Result<End>
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let config = shard.config();
    let idle = Duration::from_millis(config.connections_max_idle_ms);
    let max = config.socket_request_max_bytes;
    let progress = Rc::new(Cell::new(Instant::now()));
    let (mut reader, mut writer) = futures_lite::io::split(stream);
    let (tx, rx) =
        local_channel::new_bounded::<Pending>(config.max_in_flight_requests_per_connection.max(1));
    let writer_progress = progress.clone();
    let mut writer_task = Some(glommio::spawn_local(async move {
        // The connection's socket for splices, duplicated on the first zero-copy response.
        let mut splice_socket = None;
        while let Some(pending) = rx.recv().await {
            match pending.await {
                Some(Ok(Some(Frame::Bytes(frame)))) => {
                    writer.write_all(&frame).await?;
                    if splice_fd.is_none() {
                        // A TLS session may keep encrypted bytes until it is flushed.
                        writer.flush().await?;
                    }
                    writer_progress.set(Instant::now());
                }
                Some(Ok(Some(Frame::Spliced(parts)))) => {
                    for part in parts {
                        match part {
                            FramePart::Bytes(bytes) => writer.write_all(&bytes).await?,
                            FramePart::File(extent) => {
                                let Some(raw_fd) = splice_fd else {
                                    // Fetches on a TLS connection are read without splices.
                                    tracing::error!(target: TARGET, ?peer, "a spliced response on a connection that cannot splice; closing it");
                                    return Err(std::io::Error::other("splice over TLS"));
                                };
                                let socket = match &splice_socket {
                                    Some(s) => s,
                                    None => {
                                        splice_socket.insert(splice::socket_for_splice(raw_fd)?)
                                    }
                                };
                                if let Err(e) = splice::splicer()?.send(socket, &extent).await {
                                    // Part of the response is out: the connection cannot go on.
                                    tracing::warn!(target: TARGET, ?peer, error = %e, "splicing fetched records failed; closing the connection");
                                    return Err(e);
                                }
                            }
                        }
                        writer_progress.set(Instant::now());
                    }
                }
                Some(Ok(None)) => {}
                // Malformed request (already logged) or a cancelled task: close, as Kafka does.
                Some(Err(())) | None => break,
            }
        }
        writer.close().await?;
        Ok::<_, std::io::Error>(())
    }));
    let mut requests = 0u64;
    let mut chain = crate::handlers::order::Chain::default();
    let mut idle_at: Option<&'static str> = None;
    // Muted by a quota until then (`crate::quota`): nothing more is read before it.
    let throttled_until = Rc::new(Cell::new(Instant::now()));
    // The share sessions this connection opened (KIP-932): closed, and what their members hold
    // released, when the connection ends, as Kafka does.
    let share_sessions: Rc<crate::shard::share::ConnectionSessions> = Rc::default();
    // When the SASL session ends unless the client logs in again (KIP-368).
    let mut session_expires: Option<Instant> = None;
    let result: anyhow::Result<&'static str> = loop {
        let muted = throttled_until
            .get()
            .saturating_duration_since(Instant::now());
        if !muted.is_zero() {
            glommio::timer::sleep(muted).await;
            progress.set(Instant::now());
        }
        let mut size = [0u8; 4];
        let read = unless_idle(reader.read_exact(&mut size), &progress, idle).await;
        match read {
            None => {
                idle_at = Some("waiting for a request");
                break Ok("idle");
            }
            Some(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                break Ok("closed by the client");
            }
            Some(Err(e)) => break Err(e.into()),
            Some(Ok(())) => {}
        }
        let size = i32::from_be_bytes(size);
        if auth.as_ref().is_some_and(|a| !a.authenticated())
            && frame::body_len(size, config.sasl.max_receive_size as u32).is_none()
        {
            // Before the login, no one makes the broker hold socket.request.max.bytes.
            tracing::warn!(
                ?peer,
                size,
                max = config.sasl.max_receive_size,
                "frame size out of bounds before SASL authentication (sasl.server.max.receive.size); closing the connection"
            );
            break Ok("frame size out of bounds before authentication");
        }
        if frame::body_len(size, max).is_none() {
            tracing::warn!(
                ?peer,
                size,
                max,
                "frame size out of bounds; closing the connection"
            );
            break Ok("frame size out of bounds");
        }
        let mut body = vec![0u8; size as usize];
        match unless_idle(reader.read_exact(&mut body), &progress, idle).await {
            None => {
                idle_at = Some("in the middle of a request");
                break Ok("idle");
            }
            Some(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                break Ok("closed by the client in the middle of a request");
            }
            Some(Err(e)) => break Err(e.into()),
            Some(Ok(())) => {}
        }
        progress.set(Instant::now());
        requests += 1;
        let body = Bytes::from(body);
        if let Some(auth) = auth.as_mut() {
            // KIP-368: a SaslHandshake from a client already in renews its session.
            if auth.authenticated()
                && frame::api_key(&body) == Some(ApiKey::SaslHandshake)
                && auth.begin_reauthentication(Instant::now())
            {
                tracing::debug!(target: TARGET, ?peer, %principal, "SASL re-authentication begins");
            }
        }
        let expired = session_expires.is_some_and(|at| Instant::now() >= at);
        if let Some(auth) = auth.as_mut().filter(|a| !a.authenticated()) {
            // SCRAM credentials as the metadata image holds them now.
            let image = shard.image();
            let scram = |user: &str, mechanism: i8| {
                let cluster = image.cluster.as_ref()?;
                cluster.scram.get(&(user.to_string(), mechanism)).cloned()
            };
            let reauthenticating = auth.reauthenticating();
            let step = match before_auth(auth, &body, &scram) {
                Ok(step) => step,
                Err(e) => {
                    tracing::warn!(?peer, error = %e, "bad request before SASL authentication; closing the connection");
                    break Ok("bad request");
                }
            };
            let metrics = &shard.shared.metrics;
            let serve = matches!(step, BeforeAuth::Serve);
            let (frame, out) = match step {
                BeforeAuth::Serve => (None, None),
                BeforeAuth::Answer(frame) => (Some(frame), None),
                BeforeAuth::In(frame, who) => {
                    if reauthenticating {
                        crate::metrics::Metrics::count(&metrics.successful_reauthentication, 1);
                        tracing::debug!(target: TARGET, ?peer, principal = %who, "SASL re-authentication succeeded");
                    } else {
                        crate::metrics::Metrics::count(&metrics.successful_authentication, 1);
                        tracing::debug!(target: TARGET, ?peer, principal = %who, "SASL authentication succeeded");
                    }
                    session_expires = auth
                        .session_lifetime_ms()
                        .map(|ms| Instant::now() + Duration::from_millis(ms));
                    principal = Rc::from(who);
                    (Some(frame), None)
                }
                BeforeAuth::Out(frame, why) => (frame, Some(why)),
                BeforeAuth::Refuse(why) => {
                    tracing::info!(?peer, "{why}; closing the connection");
                    break Ok("request before SASL authentication");
                }
            };
            if let Some(frame) = frame {
                if tx.send(answered(frame, chain.next())).await.is_err() {
                    break Ok("response writer stopped");
                }
            }
            if let Some(why) = out {
                if reauthenticating {
                    crate::metrics::Metrics::count(&metrics.failed_reauthentication, 1);
                } else {
                    crate::metrics::Metrics::count(&metrics.failed_authentication, 1);
                }
                // Kafka's line for it, at INFO, with the client's address and no secret.
                tracing::info!(
                    ?peer,
                    %principal,
                    "failed SASL {}: {why}; closing the connection",
                    if reauthenticating { "re-authentication" } else { "authentication" }
                );
                let delay = Duration::from_millis(config.sasl.failed_authentication_delay_ms);
                glommio::timer::sleep(delay).await;
                break Ok("SASL authentication failed");
            }
            if !serve {
                continue;
            }
        } else if expired {
            crate::metrics::Metrics::count(&shard.shared.metrics.expired_connections_killed, 1);
            tracing::info!(
                ?peer,
                %principal,
                "a request after the SASL session expired (connections.max.reauth.ms) without a re-authentication; closing the connection"
            );
            break Ok("SASL session expired");
        }
        let identity = Identity {
            zero_copy: splice_fd.is_some(),
            principal: principal.clone(),
            listener: listener.clone(),
            throttled_until: throttled_until.clone(),
            share_sessions: share_sessions.clone(),
        };
        match prepare(&shard, body, peer, identity, chain.next()) {
            Ok(task) => match unless_idle(tx.send(task), &progress, idle).await {
                Some(Ok(())) => {}
                Some(Err(_)) => break Ok("response writer stopped"),
                None => {
                    idle_at = Some("with its responses unread");
                    break Ok("idle");
                }
            },
            Err(e) => {
                tracing::warn!(?peer, error = %e, "bad request; closing the connection");
                break Ok("bad request");
            }
        }
    };
    drop(tx);
    // The writer answers what was read (a client that half-closed still gets every response),
    // unless it makes no progress either.
    if idle_at.is_none() {
        let writer = writer_task.as_mut().expect("writer");
        if unless_idle(writer, &progress, idle).await.is_some() {
            writer_task = None;
        } else {
            idle_at = Some("with its responses unread");
        }
    }
    if let Some(task) = writer_task.take() {
        task.cancel().await;
    }
    shard.close_share_sessions(&share_sessions);
    if let Some(state) = idle_at {
        tracing::info!(
            ?peer,
            idle_ms = config.connections_max_idle_ms,
            requests,
            "closing a connection idle {state} for connections.max.idle.ms"
        );
    }
    result.map(|why| End {
        why,
        requests,
        principal,
    })
}

/// Serves one request frame (its size first) from this node to itself, as a connection of the
/// client listener would, and returns the response frame's body (`peer::set_loopback`).
pub async fn loopback(shard: Rc<Shard>, frame: Bytes) -> std::io::Result<Vec<u8>> {
    let body = frame.slice(4.min(frame.len())..);
    let mut chain = crate::handlers::order::Chain::default();
    let identity = Identity {
        zero_copy: false,
        principal: Rc::from(crate::handlers::authz::NODE_PRINCIPAL),
        // It stands in for a call from another broker.
        listener: Rc::from(shard.config().inter_broker_listener()),
        throttled_until: Rc::new(Cell::new(Instant::now())),
        share_sessions: Rc::default(),
    };
    let task = prepare(&shard, body, None, identity, chain.next())
        .map_err(|e| std::io::Error::other(format!("loopback request: {e}")))?;
    match task.await {
        Some(Ok(Some(Frame::Bytes(frame)))) => Ok(frame[4.min(frame.len())..].to_vec()),
        Some(Ok(Some(Frame::Spliced(_)))) => {
            Err(std::io::Error::other("loopback response spliced"))
        }
        Some(Ok(None)) => Err(std::io::Error::other("loopback request has no response")),
        Some(Err(())) | None => Err(std::io::Error::other("loopback request failed")),
    }
}

/// What a request knows of its connection.
struct Identity {
    /// Fetched records on disk may be spliced to the socket (plain TCP).
    zero_copy: bool,
    principal: Rc<str>,
    /// The listener the connection came in on.
    listener: Rc<str>,
    throttled_until: Rc<Cell<Instant>>,
    share_sessions: Rc<crate::shard::share::ConnectionSessions>,
}

/// Checks the header and starts the request; the returned task yields the response frame.
///
/// The task runs when its [`order::Turn`] comes: a produce once every earlier request of the
/// connection is in order, anything else once every earlier request is done.
fn prepare(
    shard: &Rc<Shard>,
    mut body: Bytes,
    peer: Option<SocketAddr>,
    identity: Identity,
    mut turn: crate::handlers::order::Turn,
) -> anyhow::Result<Pending> {
    let (key, version, header, streams) = match frame::decode_header(&mut body)? {
        frame::Header::Request {
            key,
            version,
            header,
        } => (key, version, header, None),
        // Served like any request; the handler reads and writes the message itself. The
        // ApiVersions key only stands in for ordering, which treats it as any non-produce.
        frame::Header::Streams { key, header } => (ApiKey::ApiVersions, 0, header, Some(key)),
        frame::Header::UnsupportedApiVersions { correlation_id } => {
            // KIP-511: answer an unknown ApiVersions version with v0 and the error, so the
            // client can pick a version both sides know.
            let response = ResponseKind::ApiVersions(handlers::api_versions::handle(
                &ApiVersionsRequest::default(),
                0,
                Some(ResponseError::UnsupportedVersion),
                &shard.image(),
                shard.config(),
            ));
            let frame =
                crate::codec::encode_response(ApiKey::ApiVersions, 0, correlation_id, &response)?;
            return Ok(glommio::spawn_local(async move {
                turn.finish().await;
                Ok(Some(Frame::Bytes(frame)))
            })
            .detach());
        }
    };
    let shard = shard.clone();
    Ok(glommio::spawn_local(async move {
        let _in_flight = shard.request_guard();
        if key == ApiKey::Produce {
            turn.after_earlier_in_order().await;
        } else {
            turn.after_earlier_done().await;
        }
        // Read before a quota muted the connection: held until the mute ends, as if unread.
        let muted = identity.throttled_until.get().saturating_duration_since(Instant::now());
        if !muted.is_zero() {
            glommio::timer::sleep(muted).await;
        }
        let mut client = handlers::Client {
            client_id: header.client_id.as_ref().map(|c| c.to_string()).unwrap_or_default(),
            host: peer.map(|p| format!("/{}", p.ip())).unwrap_or_default(),
            zero_copy: identity.zero_copy,
            principal: identity.principal,
            listener: identity.listener,
            throttled_until: identity.throttled_until,
            share_sessions: identity.share_sessions,
            worked: None,
        };
        // A client with a request_percentage quota: the time this request runs is counted.
        client.worked = client
            .quota(&shard, crate::quota::REQUEST_PERCENTAGE)
            .map(|_| Rc::default());
        let worked = client.worked.clone();
        if let Some(streams_key) = streams {
            let result = {
                let served = std::pin::pin!(handlers::streams_group::dispatch(&shard, streams_key, body, client));
                crate::quota::Timed { fut: served, worked }.await
            };
            turn.finish().await;
            return match result {
                Ok(response) => Ok(Some(Frame::Bytes(crate::codec::streams_group::frame(
                    header.correlation_id,
                    &response,
                )))),
                Err(e) => {
                    tracing::warn!(?peer, api_key = streams_key, error = %e, "malformed or refused streams group request; closing the connection");
                    Err(())
                }
            };
        }
        let result = {
            let dispatched = std::pin::pin!(handlers::dispatch(&shard, key, version, &mut body, client, &mut turn));
            crate::quota::Timed { fut: dispatched, worked }.await
        };
        turn.finish().await;
        match result {
            Ok(Some(answer)) => match crate::codec::encode_answer(key, header.correlation_id, &answer) {
                Ok(frame) => Ok(Some(frame)),
                Err(e) => {
                    let version = answer.version;
                    tracing::error!(?peer, ?key, version, error = %e, "could not encode a response; closing the connection");
                    Err(())
                }
            },
            Ok(None) => Ok(None),
            Err(e) => {
                tracing::warn!(?peer, ?key, version, error = %e, "malformed request; closing the connection");
                Err(())
            }
        }
    })
    .detach())
}
