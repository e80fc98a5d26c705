//! Arbitrary bytes from the other end of a TLS session as Sluice sets one up: the server side of
//! an `SSL` listener (`sluice_broker::wire::tls_server_config`, mutual TLS requested, so client
//! certificates are parsed too) or the client side of this node's links to the other nodes
//! (`tls_client_config`, a truststore and the address checked against the certificate).
//!
//! Input: byte 0 bit 0 picks the side; then chunks, each a length byte and that many bytes, fed
//! to the session as reads from the socket, with whatever it wants to send drained after each.
//! Checked: never a panic, the session refuses what it cannot take (an error, then no more
//! input), and nothing grows without bound (the run's memory limits).

#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use rustls::{ClientConfig, ClientConnection, ServerConfig, ServerConnection};
use sluice_broker::wire::{tls_client_config, tls_server_config, ClientAuth, SslConfig};

fn ssl() -> SslConfig {
    SslConfig {
        keystore_type: "PEM".into(),
        keystore_certificate_chain: Some(include_str!("../fixtures/server.pem").into()),
        keystore_key: Some(include_str!("../fixtures/server.key").into()),
        truststore_type: "PEM".into(),
        truststore_certificates: Some(include_str!("../fixtures/ca.pem").into()),
        client_auth: ClientAuth::Requested,
        enabled_protocols: vec!["TLSv1.2".into(), "TLSv1.3".into()],
        ..SslConfig::default()
    }
}

fn configs() -> &'static (Arc<ServerConfig>, Arc<ClientConfig>) {
    static CONFIGS: OnceLock<(Arc<ServerConfig>, Arc<ClientConfig>)> = OnceLock::new();
    CONFIGS.get_or_init(|| {
        let ssl = ssl();
        (
            tls_server_config(&ssl).expect("the fixtures make a server config"),
            tls_client_config(&ssl).expect("the fixtures make a client config"),
        )
    })
}

/// Feeds `chunks` to a session through `read_tls`, draining its output after each; stops at
/// the first error.
fn drive(
    mut read: impl FnMut(&mut &[u8]) -> std::io::Result<usize>,
    mut process: impl FnMut() -> bool,
    mut drain: impl FnMut(),
    chunks: &[u8],
) {
    let mut rest = chunks;
    while let Some((&len, tail)) = rest.split_first() {
        let len = (len as usize).min(tail.len());
        let (mut chunk, next) = tail.split_at(len);
        rest = next;
        while !chunk.is_empty() {
            match read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if !process() {
                return;
            }
            drain();
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&side, chunks)) = data.split_first() else {
        return;
    };
    let (server, client) = configs();
    let mut sink = Vec::new();
    if side & 1 == 0 {
        let conn = std::cell::RefCell::new(
            ServerConnection::new(server.clone()).expect("a server session"),
        );
        drive(
            |chunk| conn.borrow_mut().read_tls(chunk),
            || conn.borrow_mut().process_new_packets().is_ok(),
            || {
                let mut c = conn.borrow_mut();
                while c.wants_write() {
                    sink.clear();
                    if c.write_tls(&mut sink).is_err() {
                        break;
                    }
                }
            },
            chunks,
        );
    } else {
        let name = rustls_pki_types::ServerName::try_from("localhost").expect("a server name");
        let conn = std::cell::RefCell::new(
            ClientConnection::new(client.clone(), name).expect("a client session"),
        );
        {
            // The client speaks first: its ClientHello goes out before any input.
            let mut c = conn.borrow_mut();
            while c.wants_write() {
                sink.clear();
                if c.write_tls(&mut sink).is_err() {
                    break;
                }
            }
        }
        drive(
            |chunk| conn.borrow_mut().read_tls(chunk),
            || conn.borrow_mut().process_new_packets().is_ok(),
            || {
                let mut c = conn.borrow_mut();
                while c.wants_write() {
                    sink.clear();
                    if c.write_tls(&mut sink).is_err() {
                        break;
                    }
                }
            },
            chunks,
        );
    }
});
