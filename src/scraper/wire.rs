//! Counting wire bytes the way a proxy provider bills them. A relay on loopback sits in
//! front of each proxy. It counts every byte in each direction on each connection the client
//! opens to it: request and response headers, bodies as sent (compressed or not), CONNECT
//! and TLS. A fetch claims its connection's count after each hop. A fetch may also set a
//! limit on what a connection carries for it, and the relay cuts the connection there.
//! reqwest does not let a layer wrap its connections, so the counting happens between
//! reqwest and the proxy, on the socket.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use super::Lookup;

/// The header of the relay's response when it could not reach the client's proxy. Both an
/// HTTP request and a CONNECT can read it. The response is a 502 whose header holds the
/// relay's own token, so neither the proxy's own 502 nor anything a site sends can pass for
/// it.
const UNREACHABLE: &str = "x-conveyor-relay";

/// How long the relay tries to reach its proxy.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The relay of one proxy: where the client connects, and its connections by the client's
/// port.
pub(super) struct Relay {
    addr: SocketAddr,
    open: Open,
    /// The random token in this relay's response for an unreachable proxy. It is never
    /// forwarded.
    token: String,
}

/// The relay's connections, by the client's port.
type Open = Arc<Mutex<HashMap<u16, Arc<Conn>>>>;

/// One connection through the relay: its bytes since they were last claimed, and the limit
/// on what it may carry until the next claim. Past the limit, the relay cuts it.
#[derive(Debug)]
pub(super) struct Conn {
    count: AtomicU64,
    most: AtomicU64,
    cut: AtomicBool,
    cutting: Notify,
}

impl Conn {
    fn new() -> Self {
        Self {
            count: AtomicU64::new(0),
            most: AtomicU64::new(u64::MAX),
            cut: AtomicBool::new(false),
            cutting: Notify::new(),
        }
    }

    /// Counts `bytes`. Returns false once the connection reached its limit (it is cut).
    fn carries(&self, bytes: u64) -> bool {
        let count = self.count.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if count < self.most.load(Ordering::Relaxed) {
            return true;
        }
        self.cut();
        false
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::Relaxed);
        self.cutting.notify_one();
    }
}

/// The proxy a relay connects to: its name (resolved at each connection, as the client
/// would) or address, and port.
#[derive(Clone)]
pub(super) struct Upstream {
    pub host: String,
    pub port: u16,
    pub lookup: Arc<dyn Lookup>,
}

impl Relay {
    /// A relay on 127.0.0.1 to `upstream`, accepting on the runtime it is started on.
    pub(super) fn start(upstream: Upstream) -> io::Result<Self> {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let listener = TcpListener::from_std(listener)?;
        let open = Arc::new(Mutex::new(HashMap::new()));
        let token = format!("{:032x}", fastrand::u128(..));
        let answer = format!(
            "HTTP/1.1 502 Bad Gateway\r\n{UNREACHABLE}: {token}\r\ncontent-length: 0\r\n\r\n"
        );
        tokio::spawn(accept(listener, upstream, open.clone(), answer.into()));
        Ok(Self { addr, open, token })
    }

    /// Whether `response` is this relay's own response saying it could not reach its proxy.
    /// Only the relay knows its token, so a header of that name from a site or a proxy does
    /// not match.
    pub(super) fn unreachable(&self, response: &reqwest::Response) -> bool {
        response
            .headers()
            .get_all(UNREACHABLE)
            .iter()
            .any(|value| value.as_bytes() == self.token.as_bytes())
    }

    pub(super) fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The byte count of `response`'s connection. [`claim`] it once the hop's body is read,
    /// before the connection can serve another request. The count outlives the connection.
    pub(super) fn count_of(&self, response: &reqwest::Response) -> Option<Arc<Conn>> {
        let info = response
            .extensions()
            .get::<hyper_util::client::legacy::connect::HttpInfo>()?;
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(&info.local_addr().port()).cloned()
    }
}

/// The bytes on a connection since they were last claimed: a hop's request and response,
/// plus the connection's setup (CONNECT, TLS) if the hop was its first. The limit is lifted,
/// since the next request on the connection may belong to another fetch.
pub(super) fn claim(conn: Option<Arc<Conn>>) -> u64 {
    conn.map_or(0, |conn| {
        conn.most.store(u64::MAX, Ordering::Relaxed);
        conn.count.swap(0, Ordering::Relaxed)
    })
}

/// Cuts the connection once it has carried `most` bytes since its last claim (at once, if
/// it already has). `most` is what a fetch may still spend on it.
pub(super) fn limit(conn: Option<&Arc<Conn>>, most: u64) {
    if let Some(conn) = conn {
        conn.most.store(most, Ordering::Relaxed);
        if conn.count.load(Ordering::Relaxed) >= most {
            conn.cut();
        }
    }
}

/// Whether the relay cut the connection at its limit.
pub(super) fn was_cut(conn: Option<&Arc<Conn>>) -> bool {
    conn.is_some_and(|conn| conn.cut.load(Ordering::Relaxed))
}

async fn accept(listener: TcpListener, upstream: Upstream, open: Open, unreachable: Arc<str>) {
    loop {
        let (client, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!(error = %err, "proxy relay: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let conn = Arc::new(Conn::new());
        let mut table = open.lock().unwrap_or_else(PoisonError::into_inner);
        table.insert(peer.port(), conn.clone());
        drop(table);
        let (upstream, open, unreachable) = (upstream.clone(), open.clone(), unreachable.clone());
        tokio::spawn(async move {
            relay(client, &upstream, &conn, unreachable.as_bytes()).await;
            let mut table = open.lock().unwrap_or_else(PoisonError::into_inner);
            table.remove(&peer.port());
            let unclaimed = conn.count.load(Ordering::Relaxed);
            if unclaimed > 0 {
                tracing::debug!(
                    unclaimed,
                    "proxy relay: a connection closed with bytes no fetch claimed"
                );
            }
        });
    }
}

/// Relays one connection to the proxy in both directions, counting every byte. It runs
/// until either side closes, or until the connection reaches its limit; then both sides are
/// closed at once. If the proxy is out of reach, the client gets `unreachable`, but only
/// once its request is in. A response sent before the request is not an answer to the
/// client's HTTP, but a connection that spoke out of turn.
async fn relay(mut client: TcpStream, upstream: &Upstream, conn: &Conn, unreachable: &[u8]) {
    let proxy = match tokio::time::timeout(CONNECT_TIMEOUT, connect(upstream)).await {
        Ok(Ok(proxy)) => proxy,
        _ => {
            let _ = tokio::time::timeout(CONNECT_TIMEOUT, request_head(&mut client)).await;
            let _ = client.write_all(unreachable).await;
            let _ = client.shutdown().await;
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = proxy.set_nodelay(true);
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_proxy, mut to_proxy) = proxy.into_split();
    let both = async {
        tokio::join!(
            pump(&mut from_client, &mut to_proxy, conn),
            pump(&mut from_proxy, &mut to_client, conn),
        )
    };
    tokio::select! {
        _ = both => {}
        () = conn.cutting.notified() => {
            tracing::debug!("proxy relay: a connection cut at the most its fetch may spend");
        }
    }
}

/// Reads the client's request headers (up to the blank line, at most 64 KiB), then drops
/// them.
async fn request_head(client: &mut TcpStream) {
    let (mut head, mut chunk) = (Vec::new(), [0u8; 4096]);
    while head.len() < 64 * 1024 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match client.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
}

async fn connect(upstream: &Upstream) -> io::Result<TcpStream> {
    let ips = match upstream.host.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => upstream.lookup.lookup(upstream.host.clone()).await?,
    };
    let addrs: Vec<SocketAddr> = ips
        .into_iter()
        .map(|ip| SocketAddr::new(ip, upstream.port))
        .collect();
    TcpStream::connect(addrs.as_slice()).await
}

/// Copies bytes one way and counts them, until the reader ends, either side fails, or the
/// connection reaches its limit. The read that crosses the limit is counted but not passed
/// on. Then it shuts down the writer's side so the other end sees the close.
async fn pump<R, W>(from: &mut R, to: &mut W, conn: &Conn)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0; 16 * 1024];
    loop {
        let read = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if !conn.carries(read as u64) || to.write_all(&buf[..read]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scraper::policy::SystemLookup;

    fn to(addr: SocketAddr) -> Upstream {
        Upstream {
            host: addr.ip().to_string(),
            port: addr.port(),
            lookup: Arc::new(SystemLookup),
        }
    }

    #[tokio::test]
    async fn a_relay_counts_every_byte_both_ways_and_a_claim_takes_them_once() {
        // Arrange: an upstream that answers each read with twice its bytes.
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = upstream.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut peer, _) = upstream.accept().await.unwrap();
            let mut buf = [0; 64];
            while let Ok(read @ 1..) = peer.read(&mut buf).await {
                let twice = [&buf[..read], &buf[..read]].concat();
                peer.write_all(&twice).await.unwrap();
            }
        });
        let relay = Relay::start(to(addr)).unwrap();

        // Act: 10 bytes out, 20 back.
        let mut client = TcpStream::connect(("127.0.0.1", relay.port()))
            .await
            .unwrap();
        client.write_all(b"0123456789").await.unwrap();
        let mut answer = [0; 20];
        client.read_exact(&mut answer).await.unwrap();
        let port = client.local_addr().unwrap().port();
        let count = relay.open.lock().unwrap().get(&port).cloned();

        // Assert
        assert_eq!(claim(count.clone()), 30);
        assert_eq!(claim(count), 0, "claimed once");
    }

    #[tokio::test]
    async fn a_relay_cuts_a_connection_once_it_carried_the_most_set_for_it() {
        // Arrange: an upstream that sends without end.
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = upstream.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut peer, _) = upstream.accept().await.unwrap();
            while peer.write_all(&[0; 4096]).await.is_ok() {}
        });
        let relay = Relay::start(to(addr)).unwrap();
        let mut client = TcpStream::connect(("127.0.0.1", relay.port()))
            .await
            .unwrap();
        client.write_all(b"GET").await.unwrap();
        let mut first = [0; 1];
        client.read_exact(&mut first).await.unwrap();
        let port = client.local_addr().unwrap().port();
        let conn = relay.open.lock().unwrap().get(&port).cloned();

        // Act
        limit(conn.as_ref(), 100_000);
        let mut rest = Vec::new();
        let ended = client.read_to_end(&mut rest);
        let ended = tokio::time::timeout(Duration::from_secs(10), ended).await;

        // Assert: closed at its most, what it carried counted (a read's buffer past it).
        assert!(ended.is_ok(), "the connection was cut");
        assert!(was_cut(conn.as_ref()));
        let carried = claim(conn);
        assert!(
            (100_000..100_000 + 16 * 1024).contains(&carried),
            "{carried}"
        );
        assert!(rest.len() < 100_000, "{}", rest.len());
    }

    /// A relay to an address nothing listens on (bound, then let go).
    fn relay_to_nothing() -> Relay {
        let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = gone.local_addr().unwrap();
        drop(gone);
        Relay::start(to(addr)).unwrap()
    }

    #[tokio::test]
    async fn a_relay_whose_proxy_is_out_of_reach_answers_so() {
        // Arrange
        let relay = relay_to_nothing();

        // Act
        let mut client = TcpStream::connect(("127.0.0.1", relay.port()))
            .await
            .unwrap();
        client
            .write_all(b"GET http://x/ HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();

        // Assert
        assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
        let header = format!("{UNREACHABLE}: {}\r\n", relay.token);
        assert!(answer.contains(&header), "{answer}");
    }

    #[tokio::test]
    async fn a_relay_whose_proxy_is_out_of_reach_answers_only_once_the_request_is_in() {
        // Arrange: a client that connects and waits.
        let relay = relay_to_nothing();
        let mut client = TcpStream::connect(("127.0.0.1", relay.port()))
            .await
            .unwrap();

        // Act: nothing sent for a moment, then the request.
        let mut early = [0u8; 1];
        let before = tokio::time::timeout(Duration::from_millis(300), client.read(&mut early));
        let before = before.await;
        client
            .write_all(b"GET http://x/ HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();

        // Assert: no byte before the request (hyper reads one as a broken connection).
        assert!(before.is_err(), "the relay spoke first: {before:?}");
        assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
    }
}
