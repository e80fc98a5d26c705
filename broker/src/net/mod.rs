//! The Kafka protocol server of one shard: accept connections, read frames, run requests, and
//! write responses in request order.
//!
//! Requests on one connection run concurrently (up to `IN_FLIGHT_PER_CONNECTION_MAX`), so
//! pipelined produces share group commits; a writer task awaits them in the order they arrived
//! and writes each response. A frame with a negative size or one above
//! `socket.request.max.bytes` closes the connection with a log line, before any allocation.

pub mod frame;

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::{TcpListener, TcpStream};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ResponseKind};
use kafka_protocol::ResponseError;

use crate::handlers;
use crate::shard::Shard;

/// Requests of one connection being processed before the reader stops reading more.
pub const IN_FLIGHT_PER_CONNECTION_MAX: usize = 64;

pub async fn serve(shard: Rc<Shard>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok(stream) => {
                let shard = shard.clone();
                glommio::spawn_local(async move {
                    let peer = stream.peer_addr().ok();
                    if let Err(e) = connection(shard, stream, peer).await {
                        tracing::debug!(?peer, error = %e, "connection closed");
                    }
                })
                .detach();
            }
            Err(e) => {
                // Out of descriptors or a transient accept error: keep serving the others.
                tracing::warn!(error = %e, "accept failed");
                glommio::timer::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// A request being processed: its response frame, none (acks=0), or `Err` when the request was
/// malformed and the connection must close.
type Pending = glommio::task::JoinHandle<Result<Option<Bytes>, ()>>;

async fn connection(
    shard: Rc<Shard>,
    stream: TcpStream,
    peer: Option<SocketAddr>,
) -> anyhow::Result<()> {
    stream
        .set_nodelay(true)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let (mut reader, mut writer) = futures_lite::io::split(stream);
    let (tx, rx) = local_channel::new_bounded::<Pending>(IN_FLIGHT_PER_CONNECTION_MAX);
    let writer_task = glommio::spawn_local(async move {
        while let Some(pending) = rx.recv().await {
            match pending.await {
                Some(Ok(Some(frame))) => writer.write_all(&frame).await?,
                Some(Ok(None)) => {}
                // Malformed request (already logged) or a cancelled task: close, as Kafka does.
                Some(Err(())) | None => break,
            }
        }
        writer.close().await?;
        Ok::<_, std::io::Error>(())
    });
    let max = shard.config().socket_request_max_bytes;
    let result = loop {
        let mut size = [0u8; 4];
        if let Err(e) = reader.read_exact(&mut size).await {
            break if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Ok(())
            } else {
                Err(e.into())
            };
        }
        let size = i32::from_be_bytes(size);
        if frame::body_len(size, max).is_none() {
            tracing::warn!(
                ?peer,
                size,
                max,
                "frame size out of bounds; closing the connection"
            );
            break Ok(());
        }
        let mut body = vec![0u8; size as usize];
        if let Err(e) = reader.read_exact(&mut body).await {
            break Err(e.into());
        }
        let body = Bytes::from(body);
        match prepare(&shard, body, peer) {
            Ok(task) => {
                if tx.send(task).await.is_err() {
                    break Ok(());
                }
            }
            Err(e) => {
                tracing::warn!(?peer, error = %e, "bad request; closing the connection");
                break Ok(());
            }
        }
    };
    drop(tx);
    let _ = writer_task.await;
    result
}

/// Checks the header and starts the request; the returned task yields the response frame.
fn prepare(
    shard: &Rc<Shard>,
    mut body: Bytes,
    peer: Option<SocketAddr>,
) -> anyhow::Result<Pending> {
    let (key, version, header) = match frame::decode_header(&mut body)? {
        frame::Header::Request {
            key,
            version,
            header,
        } => (key, version, header),
        frame::Header::UnsupportedApiVersions { correlation_id } => {
            // KIP-511: answer an unknown ApiVersions version with v0 and the error, so the
            // client can pick a version both sides know.
            let response = ResponseKind::ApiVersions(handlers::api_versions::handle(
                &ApiVersionsRequest::default(),
                Some(ResponseError::UnsupportedVersion),
            ));
            let frame =
                handlers::encode_response(ApiKey::ApiVersions, 0, correlation_id, &response)?;
            return Ok(glommio::spawn_local(async move { Ok(Some(frame)) }).detach());
        }
    };
    let shard = shard.clone();
    Ok(glommio::spawn_local(async move {
        let _in_flight = shard.request_guard();
        let client = handlers::Client {
            client_id: header.client_id.as_ref().map(|c| c.to_string()).unwrap_or_default(),
            host: peer.map(|p| format!("/{}", p.ip())).unwrap_or_default(),
        };
        match handlers::dispatch(&shard, key, version, &mut body, client).await {
            Ok(Some((response, version))) => match handlers::encode_response(key, version, header.correlation_id, &response) {
                Ok(frame) => Ok(Some(frame)),
                Err(e) => {
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
