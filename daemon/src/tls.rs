//! Transport security: TLS on the node's port, optional client certificates, mutual TLS between
//! nodes, revocation of node certificates, and certificate rotation without a restart.
//!
//! - `--tls-cert`/`--tls-key` (PEM) make the node serve TLS; `--client-ca` makes a client
//!   certificate mandatory and checks it against that CA; `--peer-ca` makes node-to-node traffic
//!   mutual TLS: the dialing node presents its own certificate and checks the peer's against the
//!   peer CA; `--peer-crl` (PEM CRLs signed by the peer CA) revokes certificates of that CA.
//! - A *node certificate* chains to the peer CA, is not revoked, carries an explicit extended
//!   key usage extension listing both `serverAuth` and `clientAuth`, and names its node with
//!   exactly one subjectAltName URI `urn:conch:node:<id>` ([`NODE_URI_PREFIX`]). A certificate
//!   without the extension is refused although webpki would take it as valid for any usage: CAs
//!   commonly issue such certificates to things that are not nodes. Client certificates carry
//!   `clientAuth` only and no node URI, which tells them apart when the client and peer CA are
//!   the same.
//! - The handshake accepts a client certificate chaining to the client CA or to the peer CA and
//!   not revoked by `--peer-crl`; anything else is refused there. The peer service then asks
//!   [`Tls::node_id_of`] for the node the connection's certificate names and refuses a
//!   connection that presented no node certificate.
//! - Dialing node N, a node accepts only a node certificate naming N (see [`PeerConnector`]);
//!   the host names and addresses in the certificate are not checked.
//! - The files are polled every [`POLL_INTERVAL`] and re-read on SIGHUP. A new, valid set
//!   replaces the old one for every new connection (incoming and outgoing) and for every later
//!   node certificate check; an invalid one is refused with one log line and the old set stays
//!   in use. Established connections keep the certificates they were authenticated with, but
//!   the peer service checks the connection's certificate on every call, so a certificate
//!   revoked by a new CRL is refused from then on.
//!
//! This file holds the node's TLS state and its rotation; `tls/files.rs` reads the files,
//! `tls/node_cert.rs` says what a node certificate is, `tls/dial.rs` dials a node.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::{ClientConfig, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

mod dial;
mod files;
mod node_cert;
#[cfg(test)]
mod tests;

use dial::NodeServerVerifier;
pub(crate) use dial::PeerConnector;
use files::build;
use node_cert::PeerTrust;

/// How often the certificate and key files are checked for changes.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_secs(2);
/// How long a TLS handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How many accepted node certificates are remembered, so a peer RPC does not re-verify a chain.
const NODE_CERT_CACHE: usize = 16;
/// A refused peer certificate is logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(10);
/// A node certificate names its node with the subjectAltName URI `urn:conch:node:<id>` (the id
/// in decimal, no sign, no leading zero). `conch certs node` writes the same form.
pub(crate) const NODE_URI_PREFIX: &str = "urn:conch:node:";

/// The files TLS is configured from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
    pub peer_ca: Option<PathBuf>,
    /// CRLs of the peer CA (`--peer-crl`); needs `peer_ca`.
    pub peer_crl: Option<PathBuf>,
}

impl TlsFiles {
    fn paths(&self) -> Vec<&Path> {
        let mut paths = vec![self.cert.as_path(), self.key.as_path()];
        paths.extend(self.client_ca.as_deref());
        paths.extend(self.peer_ca.as_deref());
        paths.extend(self.peer_crl.as_deref());
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

/// Why a certificate chain is not a node certificate (or not the expected node's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeCertError {
    #[error("no certificate was presented")]
    Missing,
    #[error("it does not verify against --peer-ca: {0}")]
    Chain(webpki::Error),
    #[error("it is revoked by --peer-crl")]
    Revoked,
    #[error("{0}")]
    NotNode(String),
    #[error("it names node {found}")]
    OtherNode { found: u64 },
}

/// One loaded, consistent set of certificates.
struct Material {
    server: Arc<ServerConfig>,
    /// The status page's configuration: this node's certificate, HTTP/1.1, no client
    /// certificate asked for (a browser has none; the page asks for a token instead).
    page: Arc<ServerConfig>,
    /// When this node's own certificate (`--tls-cert`'s first) expires, in seconds since the
    /// Unix epoch, if it can be read.
    not_after: Option<i64>,
    /// How this node dials and checks its peers, with `--peer-ca`.
    peer: Option<Peer>,
    stamp: Vec<Option<SystemTime>>,
    /// When the first of the certificates in use expires (the `--tls-cert` chain and the CAs
    /// of `--client-ca` and `--peer-ca`), in seconds since the Unix epoch.
    expires_at: Option<i64>,
}

#[derive(Clone)]
struct Peer {
    /// The configuration peers are dialed with, accepting any node certificate;
    /// [`Material::peer_client_for`] narrows it to one node.
    client: Arc<ClientConfig>,
    trust: Arc<PeerTrust>,
}

impl Material {
    /// The configuration to dial node `node` with (any node, for `None`).
    fn peer_client_for(&self, node: Option<u64>) -> Option<Arc<ClientConfig>> {
        let peer = self.peer.as_ref()?;
        if node.is_none() {
            return Some(Arc::clone(&peer.client));
        }
        let mut client = (*peer.client).clone();
        client
            .dangerous()
            .set_certificate_verifier(Arc::new(NodeServerVerifier {
                trust: Arc::clone(&peer.trust),
                node,
            }));
        Some(Arc::new(client))
    }
}

/// The node's TLS state: the current certificates, swapped as a whole on rotation.
pub struct Tls {
    files: TlsFiles,
    current: RwLock<Arc<Material>>,
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
                Ok(true)
            }
            Err(e) => {
                // Do not retry the same broken files every poll: wait for the next change.
                let kept = Material {
                    server: Arc::clone(&current.server),
                    page: Arc::clone(&current.page),
                    not_after: current.not_after,
                    peer: current.peer.clone(),
                    stamp,
                    expires_at: current.expires_at,
                };
                *current = Arc::new(kept);
                Err(e)
            }
        }
    }

    /// Re-reads every file now, changed or not (e.g. on SIGHUP), and logs the outcome. Returns
    /// whether a new set is in use; an invalid set is refused and the previous one stays.
    pub fn reload_now(&self) -> Result<bool, TlsError> {
        self.reload_and_log(true)
    }

    fn reload_and_log(&self, force: bool) -> Result<bool, TlsError> {
        let result = self.reload(force);
        match &result {
            Ok(true) => tracing::info!("TLS certificates reloaded"),
            Ok(false) => {}
            Err(e) => tracing::warn!(
                error = %e,
                "new TLS files refused; the previous certificates stay in use"
            ),
        }
        result
    }

    /// When the first of the certificates in use expires, in seconds since the Unix epoch:
    /// the `--tls-cert` chain and the CAs of `--client-ca` and `--peer-ca`. After a rotation,
    /// the new files' (a refused new set leaves the old value, as it leaves the old files).
    pub fn earliest_expiry(&self) -> Option<i64> {
        self.material().expires_at
    }

    /// Whether node-to-node traffic is mutual TLS (`--peer-ca`).
    pub fn peer_mtls(&self) -> bool {
        self.files.peer_ca.is_some()
    }

    /// When this node's certificate expires (seconds since the Unix epoch), as last loaded.
    pub fn not_after(&self) -> Option<i64> {
        self.material().not_after
    }

    /// Accepts the status page's TLS connections with the certificate in use now.
    pub fn page_acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(&self.material().page))
    }

    /// Whether a client certificate is mandatory (`--client-ca`).
    pub fn client_certs_required(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// The node `chain` (leaf first, as presented in the handshake) is a node certificate of:
    /// it chains to the peer CA, is not revoked by `--peer-crl`, lists `serverAuth` and
    /// `clientAuth` in an explicit extended key usage extension, and names exactly one node
    /// (`urn:conch:node:<id>`). `None` for anything else, and always without `--peer-ca`.
    pub fn node_id_of(&self, chain: &[CertificateDer<'static>]) -> Option<u64> {
        self.check_node(chain)
            .inspect_err(|e| tracing::debug!(error = %e, "not a node certificate"))
            .ok()
    }

    /// [`Tls::node_id_of`], saying why a chain is refused.
    pub fn check_node(&self, chain: &[CertificateDer<'_>]) -> Result<u64, NodeCertError> {
        let (leaf, intermediates) = chain.split_first().ok_or(NodeCertError::Missing)?;
        let material = self.material();
        let Some(peer) = &material.peer else {
            return Err(NodeCertError::NotNode(
                "this node has no --peer-ca to check node certificates against".into(),
            ));
        };
        peer.trust.node_of(leaf, intermediates, UnixTime::now())
    }

    /// A connector dialing peers with mutual TLS under the current certificates. With `node`,
    /// the peer must present a node certificate of that node; with `None`, any node certificate
    /// (for a dial whose target's id is not known).
    pub fn peer_connector(self: &Arc<Self>, node: Option<u64>) -> PeerConnector {
        PeerConnector {
            tls: Arc::clone(self),
            node,
        }
    }
}

/// Re-reads the files whenever they change (polled every [`POLL_INTERVAL`]), until the node
/// stops. Installs no signal handler: a program reloads at once with [`Tls::reload_now`] (the
/// `conchd` binary does on SIGHUP).
pub(crate) async fn watch(tls: Arc<Tls>) {
    let mut poll = tokio::time::interval(POLL_INTERVAL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        poll.tick().await;
        let _ = tls.reload_and_log(false);
    }
}

/// The TLS connections accepted on `listener` that `gate` admits (before their handshake):
/// each handshake runs in its own task, so a slow or silent client delays no one. A failed
/// handshake is counted, logged and dropped.
pub(crate) fn incoming(
    listener: TcpListener,
    tls: Arc<Tls>,
    gate: Arc<crate::net::connections::Gate>,
    tasks: &crate::base::tasks::Tasks,
) -> impl futures::Stream<
    Item = std::io::Result<
        tokio_rustls::server::TlsStream<crate::net::connections::Guarded<TcpStream>>,
    >,
> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let handshakes = tasks.clone();
    tasks.spawn(async move {
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
            let Ok(slot) = gate.admit(Some(remote)) else {
                continue;
            };
            // Nagle's algorithm with delayed ACKs stalls replies by ~40 ms.
            let _ = stream.set_nodelay(true);
            let stream = slot.wrap(stream);
            let acceptor = TlsAcceptor::from(Arc::clone(&tls.material().server));
            let tx = tx.clone();
            let gate = Arc::clone(&gate);
            handshakes.spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => {
                        gate.count(crate::net::connections::Reason::Handshake, Some(remote));
                        tracing::warn!(%remote, error = %e, "TLS handshake refused")
                    }
                    Err(_) => {
                        gate.count(crate::net::connections::Reason::Handshake, Some(remote));
                        tracing::warn!(%remote, "TLS handshake timed out")
                    }
                }
            });
        }
    });
    futures::stream::unfold(rx, |mut rx| async move {
        let next = rx.recv().await?;
        Some((next, rx))
    })
}
