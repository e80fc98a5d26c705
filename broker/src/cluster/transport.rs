//! The CONTROLLER listener and the connections between nodes.
//!
//! Every frame is a Kafka request or response frame (4-byte size, then header and body). Two
//! kinds travel on these connections:
//!
//! - **Raft messages**, Sluice's own API key [`RAFT_API_KEY`] (never a Kafka one): a request
//!   header whose client id is the sender's cluster id, then the protobuf-encoded raft message.
//!   One way, no response; a receiver drops the connection of a peer from another cluster
//!   with an error line.
//! - **Kafka requests** for the controller (ApiVersions, DescribeQuorum, BrokerRegistration,
//!   BrokerHeartbeat, Envelope with forwarded admin requests), answered in order.
//!
//! A node keeps one outbound connection per other voter (reconnecting with backoff) and sends
//! its raft messages there; it reads what comes back on it, so a connection works both ways.
//! Messages to a node that is not a voter (a broker-only node, a raft learner) go back over the
//! connection that node opened; such a node opens every connection with a hello, a raft frame
//! addressed to node 0 (no node), so that every voter can reach it before it has anything to
//! say: a leader adding it as a learner sends first.
//! Raft messages are dropped when a peer's queue is full or its connection is down: raft
//! retransmits, and must never wait on a slow peer.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures_lite::AsyncWriteExt;
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use glommio::net::TcpListener;

use crate::peer::{
    connect, read_frame, read_frame_within, set_user_timeout, Route, INTERNODE_USER_TIMEOUT,
};
use crate::security::{before_auth, BeforeAuth};
use futures_lite::{AsyncRead, AsyncWrite};
use sluice_replication::quorum::{codec, node_id_of, raft_id, Message};
use sluice_replication::records::UserScramCredentialRecord;

/// Sluice's API key for raft messages between controllers: outside Kafka's range.
pub const RAFT_API_KEY: i16 = 32_000;
/// Raft messages queued for one peer before new ones are dropped.
const PEER_QUEUE: usize = 4_096;
const RECONNECT_MIN: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(1);
/// The `to` of a hello frame: raft's "no node".
const HELLO_TO: u64 = 0;

/// What the transport hands to the node: raft messages, and controller requests to answer.
pub trait Inbound {
    fn raft_message(&self, message: Message);
    /// Answers one Kafka request frame (header included), or `None` to close the connection.
    fn request(self: Rc<Self>, frame: Bytes) -> futures_lite::future::BoxedLocal<Option<Bytes>>;
    /// The SCRAM credential of `user` for the mechanism id `mechanism`, as the metadata log
    /// holds it now (a SASL SCRAM controller listener).
    fn scram_credential(&self, user: &str, mechanism: i8) -> Option<UserScramCredentialRecord>;
    /// Whether `principal`, connecting from `host`, may speak to the controllers: Kafka's
    /// CLUSTER_ACTION on the cluster, when ACLs are enforced.
    fn may_join(&self, principal: &str, host: &str) -> bool;
    /// Counts a failed authentication on the CONTROLLER listener.
    fn authentication_failed(&self);
}

/// How the CONTROLLER listener secures the connections it accepts: its security protocol's
/// TLS and SASL (`listener.security.protocol.map`), with the client listeners' settings.
pub struct ListenerSecurity {
    pub tls: Option<crate::security::tls::Tls>,
    pub sasl: Option<Rc<crate::security::sasl::SaslServer>>,
    /// `connection.failed.authentication.delay.ms`
    pub failed_authentication_delay: Duration,
    /// How long a connection may take to finish its handshake and login.
    pub handshake_timeout: Duration,
    /// `sasl.server.max.receive.size`: the largest frame read before the login.
    pub max_receive_size: usize,
    /// `ssl.principal.mapping.rules`, for a client certificate without SASL.
    pub principal_mapper: crate::security::principal::PrincipalMapper,
}

/// Encodes a raft message as a frame.
pub fn raft_frame(cluster_id: &str, message: &Message) -> Bytes {
    let body = codec::encode_message(message);
    let mut buf = BytesMut::with_capacity(14 + cluster_id.len() + body.len());
    buf.put_u32(0);
    buf.put_i16(RAFT_API_KEY);
    buf.put_i16(0);
    buf.put_i32(0);
    buf.put_i16(cluster_id.len() as i16);
    buf.put_slice(cluster_id.as_bytes());
    buf.put_slice(&body);
    let size = (buf.len() - 4) as u32;
    buf[0..4].copy_from_slice(&size.to_be_bytes());
    buf.freeze()
}

/// Splits a raft frame's body (after the size) into the sender's cluster id and its message.
pub fn parse_raft_frame(body: &[u8]) -> Result<(String, Message), String> {
    if body.len() < 10 {
        return Err("raft frame shorter than its header".into());
    }
    let len = i16::from_be_bytes([body[8], body[9]]);
    let len = usize::try_from(len).map_err(|_| "raft frame without a cluster id".to_string())?;
    let id = body
        .get(10..10 + len)
        .ok_or("raft frame's cluster id runs past it")?;
    let cluster_id = String::from_utf8(id.to_vec()).map_err(|_| "cluster id is not UTF-8")?;
    let message = codec::decode_message(&body[10 + len..])?;
    Ok((cluster_id, message))
}

pub struct Transport {
    pub node_id: u64,
    pub cluster_id: String,
    /// Voters' CONTROLLER addresses, `host:port`.
    voters: HashMap<u64, String>,
    /// Queues of frames to each peer's connection.
    routes: RefCell<HashMap<u64, Rc<LocalSender<Bytes>>>>,
}

impl Transport {
    pub fn new(node_id: u64, cluster_id: String, voters: HashMap<u64, String>) -> Rc<Transport> {
        Rc::new(Transport {
            node_id,
            cluster_id,
            voters,
            routes: RefCell::new(HashMap::new()),
        })
    }

    pub fn voter_address(&self, id: u64) -> Option<&str> {
        self.voters.get(&id).map(String::as_str)
    }

    /// Sends raft messages, dropping what cannot be queued.
    pub fn send(&self, messages: Vec<Message>) {
        for message in messages {
            // Routes are keyed by node id; raft messages carry raft ids.
            let to = node_id_of(message.to);
            let frame = raft_frame(&self.cluster_id, &message);
            let routes = self.routes.borrow();
            match routes.get(&to) {
                Some(queue) => {
                    if queue.try_send(frame).is_err() {
                        tracing::debug!(
                            to,
                            "raft queue full or connection gone; dropping a message"
                        );
                    }
                }
                None => tracing::debug!(to, "no route to node; dropping a raft message"),
            }
        }
    }

    /// Starts the outbound connection to every other voter.
    pub fn connect_to_voters<I: Inbound + 'static>(self: &Rc<Self>, inbound: Rc<I>) {
        let hello = (!self.voters.contains_key(&self.node_id)).then(|| {
            raft_frame(
                &self.cluster_id,
                &Message {
                    from: raft_id(self.node_id),
                    to: HELLO_TO,
                    ..Default::default()
                },
            )
        });
        for (&id, addr) in &self.voters {
            if id == self.node_id {
                continue;
            }
            let (tx, rx) = local_channel::new_bounded::<Bytes>(PEER_QUEUE);
            let rx = Rc::new(rx);
            self.routes.borrow_mut().insert(id, Rc::new(tx));
            let addr = addr.clone();
            let inbound = inbound.clone();
            let me = self.clone();
            let hello = hello.clone();
            glommio::spawn_local(async move {
                let mut backoff = RECONNECT_MIN;
                loop {
                    match connect(&addr, Route::Controller).await {
                        Ok(stream) => {
                            backoff = RECONNECT_MIN;
                            tracing::debug!(peer = id, %addr, "connected to controller");
                            let why = run_connection(&me, stream, inbound.clone(), Some(&rx), hello.clone())
                                .await;
                            tracing::debug!(peer = id, %addr, why, "controller connection ended");
                        }
                        Err(e) => tracing::trace!(peer = id, %addr, error = %e, "cannot connect to controller"),
                    }
                    // What queued while disconnected goes out after the reconnect: late raft
                    // messages are ones raft ignores.
                    glommio::timer::sleep(backoff).await;
                    backoff = (backoff * 2).min(RECONNECT_MAX);
                }
            })
            .detach();
        }
    }

    /// Serves the CONTROLLER listener: each connection's TLS handshake and SASL login first,
    /// as `security` asks, then raft messages and controller requests.
    pub async fn serve<I: Inbound + 'static>(
        self: Rc<Self>,
        listener: TcpListener,
        inbound: Rc<I>,
        security: Rc<ListenerSecurity>,
    ) {
        loop {
            match listener.accept().await {
                Ok(stream) => {
                    if let Err(e) = set_user_timeout(&stream, INTERNODE_USER_TIMEOUT) {
                        tracing::debug!(error = %e, "could not set TCP_USER_TIMEOUT");
                    }
                    let _ = stream.set_nodelay(true);
                    let peer = stream.peer_addr().ok();
                    let me = self.clone();
                    let inbound = inbound.clone();
                    let security = security.clone();
                    let acceptor = security.tls.as_ref().map(|t| t.acceptor(0));
                    glommio::spawn_local(async move {
                        let why = match acceptor {
                            None => secured(&me, stream, inbound, &security, peer, crate::security::sasl::ANONYMOUS.to_string()).await,
                            Some(acceptor) => {
                                let handshake = futures_lite::future::or(
                                    async {
                                        Some(
                                            acceptor
                                                .accept(crate::security::tls::buffered(stream))
                                                .await,
                                        )
                                    },
                                    async {
                                        glommio::timer::sleep(security.handshake_timeout).await;
                                        None
                                    },
                                )
                                .await;
                                match handshake {
                                    Some(Ok(tls)) if security.sasl.is_none() => {
                                        match crate::security::tls_principal(tls.get_ref().1.peer_certificates(), &security.principal_mapper) {
                                            Ok(principal) => secured(&me, tls, inbound, &security, peer, principal).await,
                                            Err(why) => {
                                                inbound.authentication_failed();
                                                tracing::info!(?peer, "SSL client refused on the CONTROLLER listener: {why}; closing the connection");
                                                "SSL client refused"
                                            }
                                        }
                                    }
                                    Some(Ok(tls)) => secured(&me, tls, inbound, &security, peer, crate::security::sasl::ANONYMOUS.to_string()).await,
                                    Some(Err(e)) => {
                                        inbound.authentication_failed();
                                        tracing::info!(?peer, error = %e, "SSL handshake on the CONTROLLER listener failed; closing the connection");
                                        "SSL handshake failed"
                                    }
                                    None => {
                                        tracing::info!(?peer, "SSL handshake on the CONTROLLER listener not done in time; closing the connection");
                                        "SSL handshake timed out"
                                    }
                                }
                            }
                        };
                        tracing::debug!(?peer, why, "controller listener connection ended");
                    })
                    .detach();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "CONTROLLER listener accept failed; retrying");
                    glommio::timer::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// An accepted connection after its TLS handshake, if any: its SASL login, if the listener
/// asks for one, and the authorizer's check, then served.
async fn secured<S, I>(
    transport: &Rc<Transport>,
    mut stream: S,
    inbound: Rc<I>,
    security: &ListenerSecurity,
    peer: Option<std::net::SocketAddr>,
    mut principal: String,
) -> &'static str
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
    I: Inbound + 'static,
{
    if let Some(server) = &security.sasl {
        let login = futures_lite::future::or(
            async { Some(login(&mut stream, server, &inbound, security, peer).await) },
            async {
                glommio::timer::sleep(security.handshake_timeout).await;
                None
            },
        )
        .await;
        match login {
            Some(Ok(who)) => principal = who,
            Some(Err(why)) => return why,
            None => {
                tracing::info!(?peer, "SASL login on the CONTROLLER listener not done in time; closing the connection");
                return "SASL login timed out";
            }
        }
    }
    let host = peer.map(|p| p.ip().to_string()).unwrap_or_default();
    if !inbound.may_join(&principal, &host) {
        tracing::info!(target: "sluice::authorizer", %principal, %host, "denied: speaking to the controllers needs CLUSTER_ACTION on the cluster; closing the connection");
        return "not authorized";
    }
    run_connection(transport, stream, inbound, None, None).await
}

/// The SASL exchange of a connection to the CONTROLLER listener: ApiVersions and the SASL
/// requests only, as on the client listeners. The principal once logged in.
async fn login<S, I>(
    stream: &mut S,
    server: &Rc<crate::security::sasl::SaslServer>,
    inbound: &Rc<I>,
    security: &ListenerSecurity,
    peer: Option<std::net::SocketAddr>,
) -> Result<String, &'static str>
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
    I: Inbound + 'static,
{
    let mut auth = crate::security::sasl::Authenticator::new(server.clone());
    loop {
        let body = Bytes::from(
            read_frame_within(stream, security.max_receive_size)
                .await
                .map_err(|e| {
                    if e.kind() != std::io::ErrorKind::UnexpectedEof {
                        tracing::info!(?peer, error = %e, "no SASL login on the CONTROLLER listener (sasl.server.max.receive.size bounds its frames); closing the connection");
                    }
                    "closed before its SASL login"
                })?,
        );
        let scram = |user: &str, mechanism: i8| inbound.scram_credential(user, mechanism);
        let step = before_auth(&mut auth, &body, &scram).map_err(|e| {
            tracing::info!(?peer, error = %e, "bad request before SASL authentication on the CONTROLLER listener; closing the connection");
            "bad request"
        })?;
        let (answer, outcome) = match step {
            BeforeAuth::Serve => {
                let answer = inbound.clone().request(body).await.ok_or("bad request")?;
                (Some(answer), None)
            }
            BeforeAuth::Answer(frame) => (Some(frame), None),
            BeforeAuth::In(frame, who) => (Some(frame), Some(Ok(who))),
            BeforeAuth::Out(frame, why) => (frame, Some(Err(why))),
            BeforeAuth::Refuse(why) => {
                tracing::info!(
                    ?peer,
                    "{why} on the CONTROLLER listener; closing the connection"
                );
                return Err("request before SASL authentication");
            }
        };
        if let Some(answer) = answer {
            stream
                .write_all(&answer)
                .await
                .map_err(|_| "write failed")?;
            stream.flush().await.map_err(|_| "write failed")?;
        }
        match outcome {
            None => {}
            Some(Ok(who)) => {
                tracing::debug!(?peer, principal = %who, "SASL login on the CONTROLLER listener");
                return Ok(who);
            }
            Some(Err(why)) => {
                inbound.authentication_failed();
                tracing::info!(
                    ?peer,
                    "failed SASL authentication on the CONTROLLER listener: {why}; closing the connection"
                );
                glommio::timer::sleep(security.failed_authentication_delay).await;
                // Closed as the client listeners close it (a TLS session says so first), so
                // that the client reads the refusal before the end of the connection.
                let _ = stream.close().await;
                return Err("SASL authentication failed");
            }
        }
    }
}

/// One connection, either direction: a writer task drains `outbound` (a peer queue, for our
/// own outbound connections) and the connection's own queue (responses, and raft messages to
/// a non-voter that connected here); the reader steps raft messages and answers requests.
async fn run_connection<S, I>(
    transport: &Rc<Transport>,
    stream: S,
    inbound: Rc<I>,
    outbound: Option<&Rc<LocalReceiver<Bytes>>>,
    hello: Option<Bytes>,
) -> &'static str
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
    I: Inbound + 'static,
{
    let (mut reader, mut writer) = futures_lite::io::split(stream);
    let (tx, rx) = local_channel::new_bounded::<Bytes>(PEER_QUEUE);
    if let Some(hello) = hello {
        let _ = tx.try_send(hello);
    }
    let tx = Rc::new(tx);
    let writer_task = glommio::spawn_local(async move {
        while let Some(frame) = rx.recv().await {
            // A TLS session keeps what it encrypted until flushed.
            if writer.write_all(&frame).await.is_err() || writer.flush().await.is_err() {
                break;
            }
        }
        let _ = writer.close().await;
    });
    // Our own connection to a voter: its peer queue feeds the writer too.
    let forwarder = outbound.map(|queue| {
        let queue = queue.clone();
        let tx = tx.clone();
        glommio::spawn_local(async move {
            while let Some(frame) = queue.recv().await {
                if tx.send(frame).await.is_err() {
                    break;
                }
            }
        })
    });
    let mut registered: Option<u64> = None;
    let why = loop {
        let frame = read_frame(&mut reader).await;
        let body = match frame {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break "closed by the peer",
            Err(e) => {
                tracing::debug!(error = %e, "controller connection read failed");
                break "read failed";
            }
        };
        if body.len() >= 2 && i16::from_be_bytes([body[0], body[1]]) == RAFT_API_KEY {
            match parse_raft_frame(&body) {
                Ok((cluster_id, message)) => {
                    if cluster_id != transport.cluster_id {
                        tracing::error!(
                            from = message.from,
                            their_cluster = %cluster_id,
                            our_cluster = %transport.cluster_id,
                            "a node of another cluster sent a raft message; closing its connection \
                             (a node never joins a cluster other than the one it was formatted for)"
                        );
                        break "another cluster";
                    }
                    if message.from == HELLO_TO {
                        tracing::warn!("a raft frame from no node; closing the connection");
                        break "raft frame from no node";
                    }
                    let from = node_id_of(message.from);
                    if !transport.voters.contains_key(&from) && registered != Some(from) {
                        // A node that is not a voter gets its messages back over this connection.
                        transport.routes.borrow_mut().insert(from, tx.clone());
                        registered = Some(from);
                    }
                    if message.to != HELLO_TO {
                        inbound.raft_message(message);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "malformed raft frame; closing the connection");
                    break "malformed raft frame";
                }
            }
            continue;
        }
        match inbound.clone().request(Bytes::from(body)).await {
            Some(response) => {
                if tx.send(response).await.is_err() {
                    break "writer gone";
                }
            }
            None => break "bad request",
        }
    };
    if let Some(id) = registered {
        // Only our own route: the node may have connected again meanwhile (a restart, or a
        // half-open connection noticed late), and its new connection's route must stay.
        let mut routes = transport.routes.borrow_mut();
        if routes.get(&id).is_some_and(|r| Rc::ptr_eq(r, &tx)) {
            routes.remove(&id);
        }
    }
    if let Some(f) = forwarder {
        f.cancel().await;
    }
    drop(tx);
    writer_task.await;
    why
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raft_frames_round_trip_with_their_cluster_id() {
        let message = Message {
            from: 2,
            to: 3,
            term: 9,
            ..Default::default()
        };
        let frame = raft_frame("abc", &message);
        let size = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(size, frame.len() - 4);
        let (cluster, back) = parse_raft_frame(&frame[4..]).unwrap();
        assert_eq!(cluster, "abc");
        assert_eq!(back, message);
        assert!(parse_raft_frame(&frame[4..10]).is_err());
    }
}
