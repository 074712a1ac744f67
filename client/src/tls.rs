//! TLS for the client: the CA that node certificates are checked against (`--cacert`), and
//! optionally a client certificate and key (`--cert`, `--key`) for nodes started with
//! `--client-ca`. With TLS set, every endpoint (and every leader hint) is dialed over TLS.

use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::error::{Error, Result};

/// TLS settings of a [`Client`](crate::Client), checked when built.
#[derive(Clone)]
pub struct ClientTls {
    ca_pem: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("client_certificate", &self.identity.is_some())
            .finish()
    }
}

fn tls_error(what: impl Into<String>) -> Error {
    Error::InvalidTls { what: what.into() }
}

fn read(flag: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| tls_error(format!("{flag} {}: {e}", path.display())))
}

fn check_certs(flag: &str, path: &str, pem: &[u8]) -> Result<()> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| tls_error(format!("{flag} {path}: not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(tls_error(format!(
            "{flag} {path}: holds no PEM CERTIFICATE block"
        )));
    }
    Ok(())
}

fn check_key(flag: &str, path: &str, pem: &[u8]) -> Result<()> {
    PrivateKeyDer::from_pem_slice(pem)
        .map(|_| ())
        .map_err(|e| tls_error(format!("{flag} {path}: not a PEM private key: {e}")))
}

impl ClientTls {
    /// Reads the CA and, if given, the client certificate and key (both or neither). Errors
    /// name the option and the file.
    pub fn from_files(ca: &Path, cert: Option<&Path>, key: Option<&Path>) -> Result<ClientTls> {
        let ca_pem = read("--cacert", ca)?;
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((
                PathBuf::from(cert),
                read("--cert", cert)?,
                PathBuf::from(key),
                read("--key", key)?,
            )),
            (Some(_), None) => return Err(tls_error("--cert needs --key")),
            (None, Some(_)) => return Err(tls_error("--key needs --cert")),
            (None, None) => None,
        };
        check_certs("--cacert", &ca.display().to_string(), &ca_pem)?;
        let identity = match identity {
            Some((cert_path, cert, key_path, key)) => {
                check_certs("--cert", &cert_path.display().to_string(), &cert)?;
                check_key("--key", &key_path.display().to_string(), &key)?;
                Some((cert, key))
            }
            None => None,
        };
        Ok(ClientTls { ca_pem, identity })
    }

    /// The same from PEM text already in memory.
    pub fn from_pem(ca: &[u8], identity: Option<(&[u8], &[u8])>) -> Result<ClientTls> {
        check_certs("CA", "(memory)", ca)?;
        if let Some((cert, key)) = identity {
            check_certs("certificate", "(memory)", cert)?;
            check_key("key", "(memory)", key)?;
        }
        Ok(ClientTls {
            ca_pem: ca.to_vec(),
            identity: identity.map(|(c, k)| (c.to_vec(), k.to_vec())),
        })
    }

    pub(crate) fn tonic_config(&self) -> ClientTlsConfig {
        let mut config =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(self.ca_pem.clone()));
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert.clone(), key.clone()));
        }
        config
    }
}

/// A hint for transport failures that usually mean one side speaks TLS and the other does not.
pub(crate) fn mismatch_hint(message: &str, tls: bool) -> Option<&'static str> {
    let lower = message.to_ascii_lowercase();
    if tls
        && (lower.contains("invalidcontenttype")
            || lower.contains("corrupt message")
            || lower.contains("wrong version"))
    {
        return Some("the node does not seem to serve TLS: drop --cacert/--cert/--key");
    }
    if !tls
        && (lower.contains("connection reset")
            || lower.contains("broken pipe")
            || lower.contains("frame with invalid size")
            || lower.contains("connection closed"))
    {
        return Some(
            "if the node serves TLS, give --cacert (and --cert/--key if it asks for a client certificate)",
        );
    }
    if tls && (lower.contains("unknownissuer") || lower.contains("invalid peer certificate")) {
        return Some("the node's certificate is not signed by --cacert");
    }
    if tls
        && (lower.contains("broken pipe")
            || lower.contains("connection reset")
            || lower.contains("connection closed"))
    {
        return Some(
            "the node closed the connection after the handshake: it may require a client certificate (--cert/--key) signed by its client CA",
        );
    }
    if tls && lower.contains("certificaterequired") {
        return Some("the node requires a client certificate: give --cert and --key");
    }
    if tls && (lower.contains("unknownca") || lower.contains("unknown ca")) {
        return Some("the node does not accept this client certificate (signed by another CA)");
    }
    None
}
