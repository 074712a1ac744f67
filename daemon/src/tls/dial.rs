//! Dialing a node: the verifier that accepts only a node certificate (naming the node dialed,
//! when known), and the connector peer channels dial through.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, OtherError, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::codegen::http::Uri;

use super::node_cert::PeerTrust;
use super::{LOG_EVERY, NodeCertError, Tls};

/// Checks the certificate of a peer this node dials: a node certificate as [`Tls::node_id_of`]
/// defines it and, when the node dialed is known, one naming that node.
///
/// Host names and IP addresses in the certificate are not checked. A peer may be reached at an
/// address it does not know itself (`--peer-routes`, a relay, a proxy, a NAT), and the node URI
/// answers the question that matters: which member is at the other end. A node certificate of
/// another member at the address dialed for node N (swapped or stale addresses) is refused, so
/// its replies never count as N's.
pub(super) struct NodeServerVerifier {
    pub(super) trust: Arc<PeerTrust>,
    pub(super) node: Option<u64>,
}

impl std::fmt::Debug for NodeServerVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeServerVerifier")
            .field("node", &self.node)
            .finish()
    }
}

/// A peer's certificate refused while dialing it.
#[derive(Debug, thiserror::Error)]
#[error("expected a node certificate{}: {reason}", .node.map(|n| format!(" of node {n}")).unwrap_or_default())]
pub(super) struct DialRefused {
    pub(super) node: Option<u64>,
    pub(super) reason: NodeCertError,
}

pub(super) static LAST_DIAL_REFUSAL: Mutex<Option<Instant>> = Mutex::new(None);

impl NodeServerVerifier {
    pub(super) fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<(), DialRefused> {
        let reason = match self.trust.node_of(end_entity, intermediates, now) {
            Ok(found) if self.node.is_none_or(|node| node == found) => return Ok(()),
            Ok(found) => NodeCertError::OtherNode { found },
            Err(reason) => reason,
        };
        Err(DialRefused {
            node: self.node,
            reason,
        })
    }
}

impl ServerCertVerifier for NodeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Err(refused) = self.check(end_entity, intermediates, now) else {
            return Ok(ServerCertVerified::assertion());
        };
        let mut logged = LAST_DIAL_REFUSAL.lock().unwrap_or_else(|p| p.into_inner());
        if logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
            tracing::warn!(error = %refused, "refused the certificate of a peer this node dialed");
            *logged = Some(Instant::now());
        }
        Err(rustls::Error::InvalidCertificate(CertificateError::Other(
            OtherError(Arc::new(refused)),
        )))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.trust.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.trust.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.trust.algorithms.supported_schemes()
    }
}

/// Dials a peer with mutual TLS: TCP, then a handshake presenting this node's certificate and
/// checking the peer's with [`NodeServerVerifier`] (for the node this connector was made for).
#[derive(Clone)]
pub struct PeerConnector {
    pub(super) tls: Arc<Tls>,
    pub(super) node: Option<u64>,
}

pub(super) type Connecting = Pin<
    Box<
        dyn Future<Output = std::io::Result<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>>>
            + Send,
    >,
>;

impl tower::Service<Uri> for PeerConnector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let config = self.tls.material().peer_client_for(self.node);
        Box::pin(async move {
            let Some(config) = config else {
                return Err(std::io::Error::other(
                    "this node serves TLS but has no --peer-ca to check its peers against",
                ));
            };
            let host = uri
                .host()
                .ok_or_else(|| std::io::Error::other(format!("no host in {uri}")))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri.port_u16().unwrap_or(7001);
            // The name is sent as SNI (for a DNS name); the certificate is checked for the node
            // it names, not for this name.
            let name = ServerName::try_from(host.clone()).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{host}: {e}"))
            })?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let stream = TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(|e| handshake_error(e, &host, port))?;
            Ok(TokioIo::new(stream))
        })
    }
}

/// A failed handshake with a peer; a certificate [`NodeServerVerifier`] refused is named in
/// words (rustls shows such an error in its debug form).
pub(super) fn handshake_error(e: std::io::Error, host: &str, port: u16) -> std::io::Error {
    let refused = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .and_then(|inner| match inner {
            rustls::Error::InvalidCertificate(CertificateError::Other(other)) => {
                Some(other.0.to_string())
            }
            _ => None,
        });
    match refused {
        Some(reason) => std::io::Error::new(
            e.kind(),
            format!("TLS handshake with {host}:{port}: {reason}"),
        ),
        None => e,
    }
}
