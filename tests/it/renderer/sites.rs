//! What the renderer's tests stand up on loopback: a DNS table, canary listeners that count
//! what reaches them, and a raw site answering fixed responses by path.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

pub use conveyor_testkit::canary::{canary, udp_canary};
use conveyor_worker::scraper::policy::Lookup;
use futures_util::future::BoxFuture;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Names as a test's DNS would answer them.
pub struct Table(pub HashMap<String, Vec<IpAddr>>);

impl Table {
    pub fn of(names: &[(&str, &[&str])]) -> Self {
        let table = names.iter().map(|(name, ips)| {
            let ips = ips.iter().map(|ip| ip.parse().expect("an address"));
            ((*name).to_owned(), ips.collect())
        });
        Self(table.collect())
    }
}

impl Lookup for Table {
    fn lookup(&self, host: String) -> BoxFuture<'static, io::Result<Vec<IpAddr>>> {
        let found = self.0.get(&host).cloned();
        Box::pin(async move { found.ok_or_else(|| io::ErrorKind::NotFound.into()) })
    }
}

/// A request's head, read whole: a proxy may send it in several writes, and an answer
/// before its end would cut them off.
pub async fn read_head(stream: &mut TcpStream) -> Vec<u8> {
    let mut head = Vec::new();
    let mut chunk = [0; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(read) => head.extend_from_slice(&chunk[..read]),
        }
    }
    head
}

/// A site on 127.0.0.1 that answers each path in `answers` with its raw response, and any
/// other path `404`.
pub async fn raw_site(answers: HashMap<String, Vec<u8>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a site");
    let addr = listener.local_addr().unwrap();
    let answers = Arc::new(answers);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let answers = Arc::clone(&answers);
            tokio::spawn(async move {
                let head = read_head(&mut stream).await;
                let head = String::from_utf8_lossy(&head);
                let path = head.split(' ').nth(1).unwrap_or("/");
                let missing =
                    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
                let answer = answers.get(path).map_or(&missing[..], Vec::as_slice);
                let _ = stream.write_all(answer).await;
            });
        }
    });
    addr
}

/// A `200` of `body` with `content_type`.
pub fn ok(content_type: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A `302` to `location`.
pub fn found(location: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 302 Found\r\nlocation: {location}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )
    .into_bytes()
}
