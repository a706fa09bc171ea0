//! Canaries: listeners on loopback addresses a guard must never let a request reach. Each
//! counts what reaches it and answers nothing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{TcpListener, UdpSocket};

/// A listener that counts the connections it accepts, and answers none.
pub async fn canary(ip: &str) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind((ip, 0)).await.expect("a canary");
    let (addr, hits) = (
        // A bound listener has an address.
        listener.local_addr().expect("an address"),
        Arc::new(AtomicUsize::new(0)),
    );
    let counted = Arc::clone(&hits);
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            counted.fetch_add(1, Ordering::Relaxed);
        }
    });
    (addr, hits)
}

/// A UDP socket that counts the datagrams it receives (STUN, QUIC).
pub async fn udp_canary(ip: &str) -> (SocketAddr, Arc<AtomicUsize>) {
    let socket = UdpSocket::bind((ip, 0)).await.expect("a UDP canary");
    let (addr, hits) = (
        socket.local_addr().expect("an address"),
        Arc::new(AtomicUsize::new(0)),
    );
    let counted = Arc::clone(&hits);
    tokio::spawn(async move {
        let mut datagram = [0; 2048];
        while socket.recv_from(&mut datagram).await.is_ok() {
            counted.fetch_add(1, Ordering::Relaxed);
        }
    });
    (addr, hits)
}
