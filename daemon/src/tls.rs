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

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use hyper_util::rt::TokioIo;
use rustls::client::Resumption;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{
    CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName, TrustAnchor, UnixTime,
};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, OtherError, RootCertStore, ServerConfig,
    SignatureScheme,
};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tonic::codegen::http::Uri;
use x509_parser::prelude::GeneralName;

/// How often the certificate and key files are checked for changes.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);
/// How long a TLS handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How many accepted node certificates are remembered, so a peer RPC does not re-verify a chain.
const NODE_CERT_CACHE: usize = 16;
/// A refused peer certificate is logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(10);
/// A node certificate names its node with the subjectAltName URI `urn:conch:node:<id>` (the id
/// in decimal, no sign, no leading zero). `conch certs node` writes the same form.
pub const NODE_URI_PREFIX: &str = "urn:conch:node:";

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

/// What node certificates are checked against: the peer CA and its CRLs.
struct PeerTrust {
    anchors: Vec<TrustAnchor<'static>>,
    crls: Vec<webpki::CertRevocationList<'static>>,
    algorithms: WebPkiSupportedAlgorithms,
    /// Leaf certificates already verified as node certificates under this trust, with the node
    /// they name and when they expire (newest last, at most [`NODE_CERT_CACHE`]).
    verified: Mutex<Vec<VerifiedLeaf>>,
}

struct VerifiedLeaf {
    leaf: CertificateDer<'static>,
    node: u64,
    not_after: UnixTime,
}

impl PeerTrust {
    /// The node `leaf` (presented with `intermediates`) is a node certificate of, at `now`.
    fn node_of(
        &self,
        leaf: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<u64, NodeCertError> {
        if let Some(node) = self.cached(leaf, now) {
            return Ok(node);
        }
        let cert = webpki::EndEntityCert::try_from(leaf).map_err(NodeCertError::Chain)?;
        let crls: Vec<&webpki::CertRevocationList<'_>> = self.crls.iter().collect();
        // The CRLs are the peer CA's: they speak for the leaf only, and a leaf of another
        // issuer (there is none under a single peer CA) has no status to check.
        let revocation = webpki::RevocationOptionsBuilder::new(&crls).ok().map(|b| {
            b.with_depth(webpki::RevocationCheckDepth::EndEntity)
                .with_status_policy(webpki::UnknownStatusPolicy::Allow)
                .build()
        });
        cert.verify_for_usage(
            self.algorithms.all,
            &self.anchors,
            intermediates,
            now,
            webpki::KeyUsage::server_auth(),
            revocation,
            None,
        )
        .map_err(|e| match e {
            webpki::Error::CertRevoked => NodeCertError::Revoked,
            e => NodeCertError::Chain(e),
        })?;
        let (node, not_after) = node_named_by(leaf)?;
        let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if verified.len() >= NODE_CERT_CACHE {
            verified.remove(0);
        }
        verified.push(VerifiedLeaf {
            leaf: leaf.clone().into_owned(),
            node,
            not_after,
        });
        Ok(node)
    }

    fn cached(&self, leaf: &CertificateDer<'_>, now: UnixTime) -> Option<u64> {
        let verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        verified
            .iter()
            .find(|v| v.leaf == *leaf && now <= v.not_after)
            .map(|v| v.node)
    }
}

/// The node a certificate names, and when it expires; refuses one without an explicit extended
/// key usage for both server and client authentication, or without exactly one node URI.
fn node_named_by(leaf: &CertificateDer<'_>) -> Result<(u64, UnixTime), NodeCertError> {
    let not_node = |reason: String| NodeCertError::NotNode(reason);
    let (_, cert) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| not_node(format!("it cannot be read: {e}")))?;
    let usage = cert
        .extended_key_usage()
        .map_err(|e| not_node(format!("its extended key usage cannot be read: {e}")))?
        .ok_or_else(|| {
            not_node(
                "it has no extended key usage extension (a node certificate lists serverAuth \
                 and clientAuth)"
                    .into(),
            )
        })?;
    if !(usage.value.server_auth && usage.value.client_auth) {
        return Err(not_node(
            "its extended key usage does not list both serverAuth and clientAuth".into(),
        ));
    }
    let names = cert
        .subject_alternative_name()
        .map_err(|e| not_node(format!("its subjectAltName cannot be read: {e}")))?;
    let uris: Vec<&str> = names
        .iter()
        .flat_map(|san| san.value.general_names.iter())
        .filter_map(|name| match name {
            GeneralName::URI(uri) if uri.starts_with(NODE_URI_PREFIX) => Some(*uri),
            _ => None,
        })
        .collect();
    let node = match uris.as_slice() {
        [] => Err(not_node(format!(
            "its subjectAltName holds no {NODE_URI_PREFIX}<id> URI"
        ))),
        [uri] => parse_node_uri(uri).ok_or_else(|| {
            not_node(format!(
                "{uri:?} does not name a node ({NODE_URI_PREFIX} and a positive integer)"
            ))
        }),
        _ => Err(not_node(
            "its subjectAltName holds several node URIs".into(),
        )),
    }?;
    let expires = u64::try_from(cert.validity().not_after.timestamp()).unwrap_or(0);
    Ok((
        node,
        UnixTime::since_unix_epoch(Duration::from_secs(expires)),
    ))
}

/// The id in `urn:conch:node:<id>`: a positive decimal integer without sign or leading zero.
fn parse_node_uri(uri: &str) -> Option<u64> {
    let digits = uri.strip_prefix(NODE_URI_PREFIX)?;
    if digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
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
    if let Some(problem) = crate::private_file::problem(path) {
        return Err(invalid("--tls-key", path, problem));
    }
    let bytes = read("--tls-key", path)?;
    PrivateKeyDer::from_pem_slice(&bytes)
        .map_err(|e| invalid("--tls-key", path, format!("not a PEM private key: {e}")))
}

/// Adds the CA certificates in `path` to `roots` and returns them.
fn read_roots(
    flag: &'static str,
    path: &Path,
    roots: &mut RootCertStore,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = read_certs(flag, path)?;
    for cert in &certs {
        roots
            .add(cert.clone())
            .map_err(|e| invalid(flag, path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(certs)
}

/// The CRLs in `path` (`--peer-crl`), each checked to be signed by one of `cas`: a CRL of
/// another CA would silently revoke nothing, and one with a bad signature would make every
/// node certificate of the CA fail to verify.
fn read_crls(
    path: &Path,
    cas: &[CertificateDer<'static>],
) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let flag = "--peer-crl";
    let bytes = read(flag, path)?;
    let crls = CertificateRevocationListDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(flag, path, format!("not a PEM CRL file: {e}")))?;
    if crls.is_empty() {
        return Err(invalid(flag, path, "holds no PEM X509 CRL block"));
    }
    let cas: Vec<_> = cas
        .iter()
        .filter_map(|ca| x509_parser::parse_x509_certificate(ca).ok())
        .map(|(_, ca)| ca)
        .collect();
    for (i, der) in crls.iter().enumerate() {
        let which = match crls.len() {
            1 => "the CRL".to_string(),
            _ => format!("CRL {}", i + 1),
        };
        webpki::OwnedCertRevocationList::from_der(der)
            .map_err(|e| invalid(flag, path, format!("{which} is not valid: {e}")))?;
        let (_, crl) = x509_parser::parse_x509_crl(der)
            .map_err(|e| invalid(flag, path, format!("{which} is not valid: {e}")))?;
        let signed = cas.iter().any(|ca| {
            ca.subject().as_raw() == crl.issuer().as_raw()
                && crl.verify_signature(ca.public_key()).is_ok()
        });
        if !signed {
            return Err(invalid(
                flag,
                path,
                format!("{which} is not signed by the --peer-ca CA"),
            ));
        }
    }
    Ok(crls)
}

fn build(files: &TlsFiles) -> Result<Material, TlsError> {
    // The stamp is taken before reading, so a write during the read is seen at the next poll.
    let stamp = files.stamp();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config_err = |e: rustls::Error| TlsError::Config(e.to_string());
    let certs = read_certs("--tls-cert", &files.cert)?;
    let key = read_key(&files.key)?;

    let mut client_roots = RootCertStore::empty();
    let mut client_cas = Vec::new();
    if let Some(path) = &files.client_ca {
        client_cas = read_roots("--client-ca", path, &mut client_roots)?;
    }
    let mut peer_roots = RootCertStore::empty();
    let mut peer_cas = Vec::new();
    if let Some(path) = &files.peer_ca {
        peer_cas = read_roots("--peer-ca", path, &mut peer_roots)?;
    }
    let crls = match (&files.peer_crl, &files.peer_ca) {
        (Some(path), Some(_)) => read_crls(path, &peer_cas)?,
        (Some(path), None) => {
            return Err(invalid(
                "--peer-crl",
                path,
                "needs --peer-ca (it revokes certificates of the peer CA)",
            ));
        }
        (None, _) => Vec::new(),
    };
    let expires_at = earliest_not_after(certs.iter().chain(&client_cas).chain(&peer_cas));

    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(config_err)?;
    let mut accepted = client_roots.clone();
    accepted.roots.extend(peer_roots.roots.iter().cloned());
    let builder = if accepted.is_empty() {
        builder.with_no_client_auth()
    } else {
        // The CRLs speak for the peer CA's certificates only; a certificate of another client
        // CA has no revocation status here and is accepted on its chain alone.
        let mut verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(accepted), Arc::clone(&provider))
                .with_crls(crls.iter().cloned())
                .only_check_end_entity_revocation()
                .allow_unknown_revocation_status();
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
    let mut page = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(config_err)?
        .with_no_client_auth()
        .with_cert_resolver(Arc::clone(&server.cert_resolver));
    page.alpn_protocols = vec![b"http/1.1".to_vec()];
    let not_after = certs.first().and_then(|leaf| {
        x509_parser::parse_x509_certificate(leaf)
            .ok()
            .map(|(_, cert)| cert.validity().not_after.timestamp())
    });

    let peer = if files.peer_ca.is_some() {
        let mut owned_crls = Vec::with_capacity(crls.len());
        for crl in &crls {
            let owned = webpki::OwnedCertRevocationList::from_der(crl)
                .map_err(|e| TlsError::Config(format!("--peer-crl: {e}")))?;
            owned_crls.push(webpki::CertRevocationList::from(owned));
        }
        let trust = Arc::new(PeerTrust {
            anchors: peer_roots.roots.clone(),
            crls: owned_crls,
            algorithms: provider.signature_verification_algorithms,
            verified: Mutex::new(Vec::new()),
        });
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(config_err)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NodeServerVerifier {
                trust: Arc::clone(&trust),
                node: None,
            }))
            .with_client_auth_cert(certs, key)
            .map_err(|e| {
                invalid(
                    "--tls-key",
                    &files.key,
                    format!("does not fit --tls-cert: {e}"),
                )
            })?;
        client.alpn_protocols = vec![b"h2".to_vec()];
        // A resumed session skips the certificate check: a session made with node 2 must not
        // stand for node 3 when both are reached at one host name. Peer connections are
        // long-lived, so full handshakes cost little.
        client.resumption = Resumption::disabled();
        Some(Peer {
            client: Arc::new(client),
            trust,
        })
    } else {
        None
    };
    Ok(Material {
        server: Arc::new(server),
        page: Arc::new(page),
        not_after,
        peer,
        stamp,
        expires_at,
    })
}

/// The earliest end of validity among `certs`, in seconds since the Unix epoch (certificates
/// that cannot be read are left out; `read_certs` already refused those of the files).
fn earliest_not_after<'a>(certs: impl Iterator<Item = &'a CertificateDer<'static>>) -> Option<i64> {
    certs
        .filter_map(|der| x509_parser::parse_x509_certificate(der).ok())
        .map(|(_, cert)| cert.validity().not_after.timestamp())
        .min()
}

/// Re-reads the files whenever they change (polled every [`POLL_INTERVAL`]), until the node
/// stops. Installs no signal handler: a program reloads at once with [`Tls::reload_now`] (the
/// `conchd` binary does on SIGHUP).
pub async fn watch(tls: Arc<Tls>) {
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
pub fn incoming(
    listener: TcpListener,
    tls: Arc<Tls>,
    gate: Arc<crate::connections::Gate>,
    tasks: &crate::tasks::Tasks,
) -> impl futures::Stream<
    Item = std::io::Result<tokio_rustls::server::TlsStream<crate::connections::Guarded<TcpStream>>>,
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
                        gate.count(crate::connections::Reason::Handshake, Some(remote));
                        tracing::warn!(%remote, error = %e, "TLS handshake refused")
                    }
                    Err(_) => {
                        gate.count(crate::connections::Reason::Handshake, Some(remote));
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

/// Checks the certificate of a peer this node dials: a node certificate as [`Tls::node_id_of`]
/// defines it and, when the node dialed is known, one naming that node.
///
/// Host names and IP addresses in the certificate are not checked. A peer may be reached at an
/// address it does not know itself (`--peer-routes`, a relay, a proxy, a NAT), and the node URI
/// answers the question that matters: which member is at the other end. A node certificate of
/// another member at the address dialed for node N (swapped or stale addresses) is refused, so
/// its replies never count as N's.
struct NodeServerVerifier {
    trust: Arc<PeerTrust>,
    node: Option<u64>,
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
struct DialRefused {
    node: Option<u64>,
    reason: NodeCertError,
}

static LAST_DIAL_REFUSAL: Mutex<Option<Instant>> = Mutex::new(None);

impl NodeServerVerifier {
    fn check(
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
    tls: Arc<Tls>,
    node: Option<u64>,
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
fn handshake_error(e: std::io::Error, host: &str, port: u16) -> std::io::Error {
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

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType,
        ExtendedKeyUsagePurpose as Eku, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
        RevokedCertParams, SanType, SerialNumber,
    };

    /// A CA that signs test certificates and CRLs.
    struct Ca {
        params: CertificateParams,
        key: KeyPair,
        pem: String,
    }

    impl Ca {
        fn new() -> Ca {
            let key = KeyPair::generate().expect("key");
            let mut params = CertificateParams::default();
            params
                .distinguished_name
                .push(DnType::CommonName, "test peer CA");
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            let pem = params.self_signed(&key).expect("self-sign").pem();
            Ca { params, key, pem }
        }

        fn issuer(&self) -> Issuer<'_, &KeyPair> {
            Issuer::from_params(&self.params, &self.key)
        }

        /// A leaf with serial `serial`, these extended key usages and these URIs (besides
        /// 127.0.0.1); returns (cert PEM, key PEM, DER).
        fn leaf(&self, serial: u8, usages: &[Eku], uris: &[&str]) -> Leaf {
            let key = KeyPair::generate().expect("key");
            let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("params");
            params.serial_number = Some(SerialNumber::from(vec![serial]));
            params.extended_key_usages = usages.to_vec();
            for uri in uris {
                let uri = (*uri).to_string().try_into().expect("ia5 string");
                params.subject_alt_names.push(SanType::URI(uri));
            }
            let cert = params.signed_by(&key, &self.issuer()).expect("sign");
            Leaf {
                pem: cert.pem(),
                key_pem: key.serialize_pem(),
                der: cert.der().clone(),
            }
        }

        /// A CRL revoking these serials.
        fn crl(&self, serials: &[u8]) -> String {
            let now = time::OffsetDateTime::now_utc();
            let params = CertificateRevocationListParams {
                this_update: now,
                next_update: now + time::Duration::days(30),
                crl_number: SerialNumber::from(vec![1]),
                issuing_distribution_point: None,
                revoked_certs: serials
                    .iter()
                    .map(|s| RevokedCertParams {
                        serial_number: SerialNumber::from(vec![*s]),
                        revocation_time: now,
                        reason_code: None,
                        invalidity_date: None,
                    })
                    .collect(),
                key_identifier_method: KeyIdMethod::Sha256,
            };
            params
                .signed_by(&self.issuer())
                .expect("sign CRL")
                .pem()
                .expect("pem")
        }
    }

    struct Leaf {
        pem: String,
        key_pem: String,
        der: CertificateDer<'static>,
    }

    const NODE: &[Eku] = &[Eku::ServerAuth, Eku::ClientAuth];

    /// This node's TLS with `ca` as client and peer CA, and `crl` (if any) as `--peer-crl`.
    fn load(dir: &Path, ca: &Ca, own: &Leaf, crl: Option<&str>) -> Tls {
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            crate::private_file::write(&path, text).expect("write");
            path
        };
        let ca_path = write("ca.crt", &ca.pem);
        Tls::load(TlsFiles {
            cert: write("node.crt", &own.pem),
            key: write("node.key", &own.key_pem),
            client_ca: Some(ca_path.clone()),
            peer_ca: Some(ca_path),
            peer_crl: crl.map(|crl| write("ca.crl", crl)),
        })
        .expect("valid TLS files")
    }

    /// A node certificate of `ca` for node 1 that expires at `not_after`.
    fn leaf_until(ca: &Ca, not_after: time::OffsetDateTime) -> Leaf {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("params");
        params.extended_key_usages = NODE.to_vec();
        params
            .subject_alt_names
            .push(SanType::URI("urn:conch:node:1".try_into().expect("ia5")));
        params.not_after = not_after;
        let cert = params.signed_by(&key, &ca.issuer()).expect("sign");
        Leaf {
            pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }

    /// The expiry the metric exports is the first among the certificates in use, and follows
    /// a rotation.
    #[test]
    fn the_earliest_expiry_is_the_first_certificate_to_end() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = Ca::new();
        // Whole seconds: a certificate's validity has no finer resolution.
        let now = time::OffsetDateTime::from_unix_timestamp(
            time::OffsetDateTime::now_utc().unix_timestamp(),
        )
        .expect("now");
        let soon = now + time::Duration::days(10);
        let tls = load(dir.path(), &ca, &leaf_until(&ca, soon), None);
        assert_eq!(tls.earliest_expiry(), Some(soon.unix_timestamp()));
        // A renewed certificate copied in place: the next expiry is the new one's.
        let later = now + time::Duration::days(400);
        let renewed = leaf_until(&ca, later);
        crate::private_file::write(&dir.path().join("node.crt"), &renewed.pem).expect("write");
        crate::private_file::write(&dir.path().join("node.key"), &renewed.key_pem).expect("write");
        assert_eq!(tls.reload(true).ok(), Some(true));
        assert_eq!(tls.earliest_expiry(), Some(later.unix_timestamp()));
    }

    #[test]
    fn only_a_proper_node_certificate_names_a_node() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = Ca::new();
        let own = ca.leaf(1, NODE, &["urn:conch:node:1"]);
        let proper = ca.leaf(2, NODE, &["urn:conch:node:2"]);
        let no_eku = ca.leaf(3, &[], &["urn:conch:node:2"]);
        let client_only = ca.leaf(4, &[Eku::ClientAuth], &["urn:conch:node:2"]);
        let no_uri = ca.leaf(5, NODE, &[]);
        let revoked = ca.leaf(6, NODE, &["urn:conch:node:2"]);
        let two_uris = ca.leaf(7, NODE, &["urn:conch:node:2", "urn:conch:node:3"]);
        let bad_uri = ca.leaf(8, NODE, &["urn:conch:node:02"]);
        let other_uri = ca.leaf(9, NODE, &["urn:conch:node:2", "spiffe://x/y"]);
        let stranger = Ca::new().leaf(10, NODE, &["urn:conch:node:2"]);
        let tls = load(dir.path(), &ca, &own, Some(&ca.crl(&[6])));

        let id = |leaf: &Leaf| tls.node_id_of(std::slice::from_ref(&leaf.der));
        assert_eq!(id(&proper), Some(2));
        assert_eq!(id(&proper), Some(2), "from the cache");
        assert_eq!(id(&other_uri), Some(2), "other URIs are no node's");
        assert_eq!(id(&own), Some(1));
        for (what, leaf) in [
            ("no extended key usage", &no_eku),
            ("clientAuth only", &client_only),
            ("no node URI", &no_uri),
            ("revoked", &revoked),
            ("two node URIs", &two_uris),
            ("a leading zero", &bad_uri),
            ("another CA", &stranger),
        ] {
            assert_eq!(id(leaf), None, "{what}");
        }
        assert_eq!(tls.node_id_of(&[]), None, "no certificate");
        let why = |leaf: &Leaf| {
            tls.check_node(std::slice::from_ref(&leaf.der))
                .expect_err("refused")
                .to_string()
        };
        assert!(
            why(&no_eku).contains("no extended key usage"),
            "{}",
            why(&no_eku)
        );
        assert!(why(&revoked).contains("revoked"), "{}", why(&revoked));
        assert!(why(&no_uri).contains("urn:conch:node:"), "{}", why(&no_uri));
    }

    #[test]
    fn a_new_crl_cuts_off_a_verified_node_certificate() {
        // t=0   node 2's certificate is accepted (and cached)
        // t=1   a CRL revoking it is installed and reloaded -> refused, no restart
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = Ca::new();
        let own = ca.leaf(1, NODE, &["urn:conch:node:1"]);
        let two = ca.leaf(2, NODE, &["urn:conch:node:2"]);
        let tls = load(dir.path(), &ca, &own, Some(&ca.crl(&[])));
        assert_eq!(tls.node_id_of(std::slice::from_ref(&two.der)), Some(2));
        std::fs::write(dir.path().join("ca.crl"), ca.crl(&[2])).expect("write CRL");
        assert!(tls.reload(true).expect("a valid CRL"));
        assert_eq!(tls.node_id_of(std::slice::from_ref(&two.der)), None);
    }

    #[test]
    fn a_crl_of_another_ca_or_without_peer_ca_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = Ca::new();
        let own = ca.leaf(1, NODE, &["urn:conch:node:1"]);
        let foreign = Ca::new().crl(&[1]);
        let tls = load(dir.path(), &ca, &own, Some(&ca.crl(&[])));
        std::fs::write(dir.path().join("ca.crl"), &foreign).expect("write CRL");
        let err = tls.reload(true).expect_err("another CA's CRL").to_string();
        assert!(
            err.contains("--peer-crl") && err.contains("not signed by"),
            "{err}"
        );
        std::fs::write(dir.path().join("ca.crl"), "garbage").expect("write CRL");
        let err = tls.reload(true).expect_err("no CRL").to_string();
        assert!(err.contains("--peer-crl"), "{err}");
        let files = TlsFiles {
            peer_ca: None,
            ..tls.files().clone()
        };
        let err = Tls::load(files).expect_err("no peer CA").to_string();
        assert!(err.contains("needs --peer-ca"), "{err}");
    }

    #[test]
    fn dialing_node_n_accepts_only_node_ns_certificate() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = Ca::new();
        let own = ca.leaf(1, NODE, &["urn:conch:node:1"]);
        let two = ca.leaf(2, NODE, &["urn:conch:node:2"]);
        let revoked = ca.leaf(3, NODE, &["urn:conch:node:3"]);
        let client = ca.leaf(4, &[Eku::ClientAuth], &[]);
        let tls = load(dir.path(), &ca, &own, Some(&ca.crl(&[3])));
        let material = tls.material();
        let trust = &material.peer.as_ref().expect("peer mTLS").trust;
        let dial = |node: Option<u64>, leaf: &Leaf| {
            let verifier = NodeServerVerifier {
                trust: Arc::clone(trust),
                node,
            };
            // The name is not checked: any will do.
            let name = ServerName::try_from("elsewhere.example").expect("name");
            let accepted = verifier
                .verify_server_cert(&leaf.der, &[], &name, &[], UnixTime::now())
                .is_ok();
            let checked = verifier.check(&leaf.der, &[], UnixTime::now());
            assert_eq!(accepted, checked.is_ok());
            checked.map_err(|e| e.to_string())
        };
        assert_eq!(dial(Some(2), &two), Ok(()));
        assert_eq!(dial(None, &two), Ok(()), "any node");
        let wrong = dial(Some(3), &two).expect_err("node 2 is not node 3");
        assert!(
            wrong.contains("node 3") && wrong.contains("it names node 2"),
            "{wrong}"
        );
        let revoked = dial(Some(3), &revoked).expect_err("revoked");
        assert!(revoked.contains("revoked"), "{revoked}");
        assert!(dial(None, &client).is_err(), "a client certificate");
        assert!(material.peer_client_for(Some(2)).is_some());
    }
}
