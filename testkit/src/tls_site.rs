//! An https front for the local site: TLS with a certificate for `localhost` and 127.0.0.1
//! from a CA made for this process, each connection passed on to the plain site from the
//! client's own address (so the site still sees which proxy's egress asked).

use std::net::SocketAddr;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpSocket};
use tokio_rustls::TlsAcceptor;

/// The front: where it listens, and its CA's certificate for the client to trust.
pub struct TlsSite {
    pub addr: SocketAddr,
    pub ca_der: Vec<u8>,
}

impl TlsSite {
    /// An https front for the plain site at `site`.
    pub async fn start(site: SocketAddr) -> Self {
        let (config, ca_der) = server_config();
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the https front");
        let addr = listener.local_addr().expect("an address");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        tokio::spawn(async move {
            while let Ok((client, peer)) = listener.accept().await {
                tokio::spawn(serve(acceptor.clone(), client, peer, site));
            }
        });
        Self { addr, ca_der }
    }

    /// An https URL of `path` on the front.
    pub fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.addr.port())
    }
}

/// One connection: TLS ended here, the plain bytes relayed to the site from the peer's
/// address.
async fn serve(
    acceptor: TlsAcceptor,
    client: tokio::net::TcpStream,
    peer: SocketAddr,
    site: SocketAddr,
) {
    let Ok(mut tls) = acceptor.accept(client).await else {
        return;
    };
    let socket = TcpSocket::new_v4().expect("a socket");
    if socket.bind(SocketAddr::new(peer.ip(), 0)).is_err() {
        return;
    }
    let Ok(mut plain) = socket.connect(site).await else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
}

/// A server configuration with a leaf certificate from a fresh CA, and the CA's DER.
fn server_config() -> (rustls::ServerConfig, Vec<u8>) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("a CA key"))
        .expect("a CA certificate");
    let key = KeyPair::generate().expect("a key");
    let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    let leaf = CertificateParams::new(names)
        .expect("leaf parameters")
        .signed_by(&key, &ca)
        .expect("a leaf certificate");
    let chain = vec![leaf.der().clone(), CertificateDer::from(ca.der().to_vec())];
    let key = PrivateKeyDer::try_from(key.serialize_der()).expect("a private key");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("a certificate and its key");
    (config, ca.der().to_vec())
}
