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
use rustls::{ClientConfig, ClientConnection, Connection, ServerConfig, ServerConnection};
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

/// Writes out whatever the session wants to send (into a sink).
fn drain(conn: &mut Connection, sink: &mut Vec<u8>) {
    while conn.wants_write() {
        sink.clear();
        if conn.write_tls(sink).is_err() {
            break;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&side, chunks)) = data.split_first() else {
        return;
    };
    let (server, client) = configs();
    let mut conn = if side & 1 == 0 {
        Connection::Server(ServerConnection::new(server.clone()).expect("a server session"))
    } else {
        let name = rustls_pki_types::ServerName::try_from("localhost").expect("a server name");
        Connection::Client(ClientConnection::new(client.clone(), name).expect("a client session"))
    };
    let mut sink = Vec::new();
    // A client speaks first: its ClientHello goes out before any input.
    drain(&mut conn, &mut sink);
    // Each chunk as reads from the socket, the session's output drained after each; the first
    // error ends it.
    let mut rest = chunks;
    while let Some((&len, tail)) = rest.split_first() {
        let len = (len as usize).min(tail.len());
        let (mut chunk, next) = tail.split_at(len);
        rest = next;
        while !chunk.is_empty() {
            match conn.read_tls(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if conn.process_new_packets().is_err() {
                return;
            }
            drain(&mut conn, &mut sink);
        }
    }
});
