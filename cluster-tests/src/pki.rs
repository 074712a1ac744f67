//! Certificates made at test time for TLS clusters, and the registry that makes every harness
//! channel to a TLS node speak TLS.
//!
//! A [`Pki`] is a directory with a CA and its revocation list (made by `conch_client::certs`,
//! the code behind `conch certs`), one node certificate per node (for 127.0.0.1) and a client
//! certificate. Every node is started with the revocation list as `--peer-crl`. A node address
//! registered with [`register`] is dialed by [`crate::net`] over TLS with that client
//! certificate; unregistered addresses stay plaintext.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Context;
use conch_client::certs;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// The client certificate every harness channel to a TLS node presents.
pub const HARNESS_CLIENT: &str = "harness";

static TLS_NODES: Mutex<BTreeMap<String, ClientTlsConfig>> = Mutex::new(BTreeMap::new());

/// Dial `addr` over TLS with `config` from now on.
pub fn register(addr: &str, config: ClientTlsConfig) {
    TLS_NODES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(addr.to_string(), config);
}

/// Dial `addr` in plaintext again.
pub fn unregister(addr: &str) {
    TLS_NODES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(addr);
}

/// The TLS configuration to dial `addr` with, if it is a registered TLS node.
pub fn lookup(addr: &str) -> Option<ClientTlsConfig> {
    TLS_NODES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(addr)
        .cloned()
}

/// A CA and the certificates it issued, in one directory.
#[derive(Debug, Clone)]
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    /// A new CA in `dir` (created).
    pub fn create(dir: &Path) -> anyhow::Result<Pki> {
        certs::init(dir, certs::CA_DAYS)
            .with_context(|| format!("make a CA in {}", dir.display()))?;
        Ok(Pki {
            dir: dir.to_path_buf(),
        })
    }

    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join(certs::CA_CERT)
    }

    /// Issues (or re-issues) node `id`'s certificate for 127.0.0.1; returns (cert, key).
    pub fn node(&self, id: u64) -> anyhow::Result<(PathBuf, PathBuf)> {
        let written = certs::write_node(
            &self.dir,
            id,
            &["127.0.0.1".to_string(), "localhost".to_string()],
            certs::LEAF_DAYS,
        )?;
        Ok((written.cert, written.key))
    }

    /// Issues a client certificate; returns (cert, key).
    pub fn client(&self, name: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
        let written = certs::write_client(&self.dir, name, certs::LEAF_DAYS)?;
        Ok((written.cert, written.key))
    }

    /// The CA's revocation list (`--peer-crl`).
    pub fn crl(&self) -> PathBuf {
        self.dir.join(certs::CA_CRL)
    }

    /// conchd's TLS flags for node `id` (its certificate must have been issued): TLS, client
    /// certificates required, peer mutual TLS, all with this CA, and its revocation list.
    pub fn node_args(&self, id: u64) -> Vec<String> {
        let ca = self.ca_cert().display().to_string();
        vec![
            "--tls-cert".into(),
            self.dir.join(format!("node{id}.crt")).display().to_string(),
            "--tls-key".into(),
            self.dir.join(format!("node{id}.key")).display().to_string(),
            "--client-ca".into(),
            ca.clone(),
            "--peer-ca".into(),
            ca,
            "--peer-crl".into(),
            self.crl().display().to_string(),
        ]
    }

    /// A certificate of this CA as some corporate CAs issue them: v3 with only
    /// `basicConstraints=CA:FALSE`, no extended key usage. It even names node 2, so only the
    /// missing extended key usage keeps it from passing as node 2's. Returns (cert, key) files.
    pub fn no_eku(&self) -> anyhow::Result<(PathBuf, PathBuf)> {
        let ca_key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(self.dir.join("ca.key"))?)?;
        let mut ca = rcgen::CertificateParams::default();
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, conch_client::certs::CA_NAME);
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])?;
        params.is_ca = rcgen::IsCa::ExplicitNoCa;
        params
            .subject_alt_names
            .push(rcgen::SanType::URI("urn:conch:node:2".try_into()?));
        params.use_authority_key_identifier_extension = true;
        let key = rcgen::KeyPair::generate()?;
        let cert = params.signed_by(&key, &issuer)?;
        let (cert_path, key_path) = (self.dir.join("no-eku.crt"), self.dir.join("no-eku.key"));
        std::fs::write(&cert_path, cert.pem())?;
        std::fs::write(&key_path, key.serialize_pem())?;
        Ok((cert_path, key_path))
    }

    /// A tonic client configuration trusting this CA and presenting `cert`.
    pub fn tls_as(&self, cert: &Path, key: &Path) -> anyhow::Result<ClientTlsConfig> {
        let read = |p: &Path| std::fs::read(p).with_context(|| format!("read {}", p.display()));
        Ok(ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(&self.ca_cert())?))
            .identity(Identity::from_pem(read(cert)?, read(key)?)))
    }

    /// A tonic client configuration trusting this CA and presenting client `name`'s
    /// certificate (issued first if absent).
    pub fn client_tls(&self, name: &str) -> anyhow::Result<ClientTlsConfig> {
        let cert = self.dir.join(format!("client-{name}.crt"));
        let key = self.dir.join(format!("client-{name}.key"));
        if !cert.exists() {
            self.client(name)?;
        }
        let read = |p: &Path| std::fs::read(p).with_context(|| format!("read {}", p.display()));
        Ok(ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(&self.ca_cert())?))
            .identity(Identity::from_pem(read(&cert)?, read(&key)?)))
    }

    /// A `conch_client` TLS configuration for client `name` (issued first if absent).
    pub fn conch_client_tls(&self, name: &str) -> anyhow::Result<conch_client::ClientTls> {
        let cert = self.dir.join(format!("client-{name}.crt"));
        let key = self.dir.join(format!("client-{name}.key"));
        if !cert.exists() {
            self.client(name)?;
        }
        Ok(conch_client::ClientTls::from_files(
            &self.ca_cert(),
            Some(&cert),
            Some(&key),
        )?)
    }
}
