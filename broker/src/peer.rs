//! Calls to other brokers: a connection with the timeouts every link between nodes has, and one
//! Kafka request and its answer on it (the replica fetchers, the transaction coordinator's
//! markers and verifications, the group coordinator's first load). Frames are encoded and
//! decoded by `codec`.

use std::cell::RefCell;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;

/// The largest frame accepted on the CONTROLLER listener (a snapshot travels in one message).
pub const FRAME_MAX: usize = 256 << 20;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// TCP_USER_TIMEOUT on connections between nodes: one whose sent data the peer has not
/// acknowledged for this long fails, so that a connection into a network partition is
/// dropped and dialled again instead of waiting out TCP's retransmission backoff (which after a
/// long partition resumes minutes after the network heals).
pub const INTERNODE_USER_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn connect(addr: &str) -> std::io::Result<TcpStream> {
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
    let mut size = [0u8; 4];
    reader.read_exact(&mut size).await?;
    let size = i32::from_be_bytes(size);
    let size = usize::try_from(size)
        .ok()
        .filter(|&s| s <= FRAME_MAX)
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

/// Sends one Kafka request frame to `addr` on a fresh connection and returns the response
/// frame's body (after the size), within `timeout`.
pub async fn call(addr: &str, frame: Bytes, timeout: Duration) -> std::io::Result<Vec<u8>> {
    let local = loopback(addr);
    futures_lite::future::or(
        async {
            if let Some(serve) = local {
                return serve(frame).await;
            }
            let stream = connect(addr).await?;
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
