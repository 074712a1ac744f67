//! Transport security: TLS on the node's port, optional client certificates, mutual TLS between
//! nodes, and certificate rotation without a restart.
//!
//! - `--tls-cert`/`--tls-key` (PEM) make the node serve TLS; `--client-ca` makes a client
//!   certificate mandatory and checks it against that CA; `--peer-ca` makes node-to-node traffic
//!   mutual TLS: the dialing node presents its own certificate and checks the peer's against the
//!   peer CA.
//! - The handshake accepts a client certificate chaining to the client CA or to the peer CA; a
//!   certificate chaining to neither is refused there. The peer service then also requires a
//!   *node certificate*: one chaining to the peer CA that is valid for server authentication
//!   (extended key usage `serverAuth`, or none). Node certificates serve as both ends, so they
//!   carry `serverAuth` and `clientAuth`; client certificates carry only `clientAuth`. That tells
//!   them apart when the client and peer CA are the same.
//! - The files are polled every [`POLL_INTERVAL`] and re-read on SIGHUP. A new, valid set
//!   replaces the old one for every new connection (incoming and outgoing); an invalid one is
//!   refused with one log line and the old set stays in use. Established connections keep the
//!   certificates they were authenticated with.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, TrustAnchor, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tonic::codegen::http::Uri;

/// How often the certificate and key files are checked for changes.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);
/// How long a TLS handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How many accepted node certificates are remembered, so a peer RPC does not re-verify a chain.
const NODE_CERT_CACHE: usize = 16;

/// The files TLS is configured from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
    pub peer_ca: Option<PathBuf>,
}

impl TlsFiles {
    fn paths(&self) -> Vec<&Path> {
        let mut paths = vec![self.cert.as_path(), self.key.as_path()];
        paths.extend(self.client_ca.as_deref());
        paths.extend(self.peer_ca.as_deref());
        paths
    }

    /// The modification times of every file (`None` for one that cannot be read now).
    fn stamp(&self) -> Vec<Option<SystemTime>> {
        self.paths()
            .iter()
            .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("read {flag} {path}: {source}")]
    Read {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{flag} {path}: {reason}")]
    Invalid {
        flag: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// One loaded, consistent set of certificates.
struct Material {
    server: Arc<ServerConfig>,
    /// How this node dials its peers, with `--peer-ca`.
    peer_client: Option<Arc<ClientConfig>>,
    peer_anchors: Vec<TrustAnchor<'static>>,
    stamp: Vec<Option<SystemTime>>,
}

/// The node's TLS state: the current certificates, swapped as a whole on rotation.
pub struct Tls {
    files: TlsFiles,
    current: RwLock<Arc<Material>>,
    /// Leaf certificates already verified as node certificates under the current material.
    node_certs: Mutex<Vec<CertificateDer<'static>>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("files", &self.files).finish()
    }
}

impl Tls {
    /// Reads and checks every file; any problem is an error naming the flag and the file.
    pub fn load(files: TlsFiles) -> Result<Tls, TlsError> {
        let material = build(&files)?;
        Ok(Tls {
            files,
            current: RwLock::new(Arc::new(material)),
            node_certs: Mutex::new(Vec::new()),
        })
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    fn material(&self) -> Arc<Material> {
        Arc::clone(&self.current.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Re-reads the files when any of them changed since the last load (or always, with
    /// `force`). Returns whether a new set is now in use; an invalid new set is an error and
    /// leaves the old one in use.
    pub fn reload(&self, force: bool) -> Result<bool, TlsError> {
        let stamp = self.files.stamp();
        if !force && stamp == self.material().stamp {
            return Ok(false);
        }
        let result = build(&self.files);
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(material) => {
                *current = Arc::new(material);
                self.node_certs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clear();
                Ok(true)
            }
            Err(e) => {
                // Do not retry the same broken files every poll: wait for the next change.
                let kept = Material {
                    server: Arc::clone(&current.server),
                    peer_client: current.peer_client.clone(),
                    peer_anchors: current.peer_anchors.clone(),
                    stamp,
                };
                *current = Arc::new(kept);
                Err(e)
            }
        }
    }

    /// Whether node-to-node traffic is mutual TLS (`--peer-ca`).
    pub fn peer_mtls(&self) -> bool {
        self.files.peer_ca.is_some()
    }

    /// Whether a client certificate is mandatory (`--client-ca`).
    pub fn client_certs_required(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// Whether `chain` (leaf first, as presented in the handshake) is a node certificate: it
    /// chains to the peer CA and is valid for server authentication.
    pub fn is_node_certificate(&self, chain: &[CertificateDer<'static>]) -> bool {
        let Some(leaf) = chain.first() else {
            return false;
        };
        {
            let cache = self.node_certs.lock().unwrap_or_else(|p| p.into_inner());
            if cache.contains(leaf) {
                return true;
            }
        }
        let material = self.material();
        if material.peer_anchors.is_empty() {
            return false;
        }
        let Ok(cert) = webpki::EndEntityCert::try_from(leaf) else {
            return false;
        };
        let verified = cert
            .verify_for_usage(
                webpki::ALL_VERIFICATION_ALGS,
                &material.peer_anchors,
                &chain[1..],
                UnixTime::now(),
                webpki::KeyUsage::server_auth(),
                None,
                None,
            )
            .is_ok();
        if verified {
            let mut cache = self.node_certs.lock().unwrap_or_else(|p| p.into_inner());
            if cache.len() >= NODE_CERT_CACHE {
                cache.remove(0);
            }
            cache.push(leaf.clone());
        }
        verified
    }

    /// A connector dialing peers with mutual TLS under the current certificates.
    pub fn peer_connector(self: &Arc<Self>) -> PeerConnector {
        PeerConnector {
            tls: Arc::clone(self),
        }
    }
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        flag,
        path: path.to_path_buf(),
        source,
    })
}

fn invalid(flag: &'static str, path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::Invalid {
        flag,
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn read_certs(flag: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(flag, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(flag, path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(flag, path, "holds no PEM CERTIFICATE block"));
    }
    for cert in &certs {
        webpki::EndEntityCert::try_from(cert)
            .map_err(|e| invalid(flag, path, format!("not a valid certificate: {e}")))?;
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read("--tls-key", path)?;
    PrivateKeyDer::from_pem_slice(&bytes)
        .map_err(|e| invalid("--tls-key", path, format!("not a PEM private key: {e}")))
}

fn read_roots(flag: &'static str, path: &Path, roots: &mut RootCertStore) -> Result<(), TlsError> {
    for cert in read_certs(flag, path)? {
        roots
            .add(cert)
            .map_err(|e| invalid(flag, path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(())
}

fn build(files: &TlsFiles) -> Result<Material, TlsError> {
    // The stamp is taken before reading, so a write during the read is seen at the next poll.
    let stamp = files.stamp();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config_err = |e: rustls::Error| TlsError::Config(e.to_string());
    let certs = read_certs("--tls-cert", &files.cert)?;
    let key = read_key(&files.key)?;

    let mut client_roots = RootCertStore::empty();
    if let Some(path) = &files.client_ca {
        read_roots("--client-ca", path, &mut client_roots)?;
    }
    let mut peer_roots = RootCertStore::empty();
    let mut peer_anchors = Vec::new();
    if let Some(path) = &files.peer_ca {
        read_roots("--peer-ca", path, &mut peer_roots)?;
        peer_anchors = peer_roots.roots.clone();
    }

    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(config_err)?;
    let mut accepted = client_roots.clone();
    accepted.roots.extend(peer_roots.roots.iter().cloned());
    let builder = if accepted.is_empty() {
        builder.with_no_client_auth()
    } else {
        let mut verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(accepted), Arc::clone(&provider));
        if files.client_ca.is_none() {
            verifier = verifier.allow_unauthenticated();
        }
        let verifier = verifier
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        builder.with_client_cert_verifier(verifier)
    };
    let mut server = builder
        .with_single_cert(certs.clone(), key.clone_key())
        .map_err(|e| {
            invalid(
                "--tls-key",
                &files.key,
                format!("does not fit --tls-cert: {e}"),
            )
        })?;
    server.alpn_protocols = vec![b"h2".to_vec()];

    let peer_client = if files.peer_ca.is_some() {
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(config_err)?
            .with_root_certificates(peer_roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| {
                invalid(
                    "--tls-key",
                    &files.key,
                    format!("does not fit --tls-cert: {e}"),
                )
            })?;
        client.alpn_protocols = vec![b"h2".to_vec()];
        Some(Arc::new(client))
    } else {
        None
    };
    Ok(Material {
        server: Arc::new(server),
        peer_client,
        peer_anchors,
        stamp,
    })
}

/// Re-reads the files when they change (polled) and on SIGHUP, until the process ends.
pub async fn watch(tls: Arc<Tls>) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = match signal(SignalKind::hangup()) {
        Ok(hangup) => Some(hangup),
        Err(e) => {
            tracing::warn!(error = %e, "no SIGHUP handler: certificates are reloaded only when their files change");
            None
        }
    };
    let mut poll = tokio::time::interval(POLL_INTERVAL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let force = tokio::select! {
            _ = poll.tick() => false,
            Some(()) = async {
                match hangup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            } => true,
        };
        match tls.reload(force) {
            Ok(true) => tracing::info!("TLS certificates reloaded"),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "new TLS files refused; the previous certificates stay in use")
            }
        }
    }
}

/// The TLS connections accepted on `listener`: each handshake runs in its own task, so a slow
/// or silent client delays no one. A failed handshake is logged and dropped.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<Tls>,
) -> impl futures::Stream<Item = std::io::Result<tokio_rustls::server::TlsStream<TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = tx.closed() => return,
            };
            let (stream, remote) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accept");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // Nagle's algorithm with delayed ACKs stalls replies by ~40 ms.
            let _ = stream.set_nodelay(true);
            let acceptor = TlsAcceptor::from(Arc::clone(&tls.material().server));
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(%remote, error = %e, "TLS handshake refused")
                    }
                    Err(_) => tracing::warn!(%remote, "TLS handshake timed out"),
                }
            });
        }
    });
    futures::stream::unfold(rx, |mut rx| async move {
        let next = rx.recv().await?;
        Some((next, rx))
    })
}

/// Dials a peer with mutual TLS: TCP, then a handshake presenting this node's certificate and
/// checking the peer's against the peer CA, for the host named in the URI.
#[derive(Clone)]
pub struct PeerConnector {
    tls: Arc<Tls>,
}

type Connecting = Pin<
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
        let config = self.tls.material().peer_client.clone();
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
            let name = ServerName::try_from(host.clone()).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{host}: {e}"))
            })?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let stream = TlsConnector::from(config).connect(name, tcp).await?;
            Ok(TokioIo::new(stream))
        })
    }
}
