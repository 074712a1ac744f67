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

/// Hints for transport failures that mean one side speaks TLS and the other does not, or that
/// a certificate was refused. The first ones are certain (only a TLS mismatch or a refused
/// certificate produces them); the ones marked `probable` could also be a connection that broke.
const NOT_TLS: &str = "the node does not seem to serve TLS: drop --cacert/--cert/--key";
const GIVE_CACERT: &str =
    "if the node serves TLS, give --cacert (and --cert/--key if it asks for a client certificate)";
const OTHER_CA: &str = "the node's certificate is not signed by --cacert";
const CLOSED_AFTER_HANDSHAKE: &str = "the node closed the connection after the handshake: it may require a client certificate (--cert/--key) signed by its client CA";
const CERT_REQUIRED: &str = "the node requires a client certificate: give --cert and --key";
const UNKNOWN_CLIENT_CA: &str =
    "the node does not accept this client certificate (signed by another CA)";
const CERT_REVOKED: &str = "the node refused this client certificate: it is revoked";
const CERT_REFUSED: &str = "the node refused this client certificate";
/// TLS's `decrypt_error` alert in a handshake: a signature did not verify. From a node checking
/// a client certificate, that is one signed by another CA of the same name (every CA `conch
/// certs` makes is named `conch CA`), or a key that is not the certificate's.
const SIGNATURE_REFUSED: &str = "the node refused this client certificate: its signature does not verify against the node's client CA (a certificate of another CA, or --key is not --cert's key)";

/// The hints that name a TLS setting as the cause. A connection closed right after a completed
/// handshake is counted among them: it is what a client certificate the node refuses (revoked,
/// of another CA) looks like from here (TLS 1.3 sends that verdict after the client finished its
/// handshake, and the alert does not reach this side's error), while a node that is down
/// refuses the connection instead.
const CERTAIN: [&str; 8] = [
    NOT_TLS,
    OTHER_CA,
    CERT_REQUIRED,
    UNKNOWN_CLIENT_CA,
    CERT_REVOKED,
    CERT_REFUSED,
    SIGNATURE_REFUSED,
    CLOSED_AFTER_HANDSHAKE,
];

/// A hint for transport failures that usually mean one side speaks TLS and the other does not,
/// or that a certificate was refused.
pub(crate) fn mismatch_hint(message: &str, tls: bool) -> Option<&'static str> {
    let lower = message.to_ascii_lowercase();
    if tls
        && (lower.contains("invalidcontenttype")
            || lower.contains("corrupt message")
            || lower.contains("wrong version"))
    {
        return Some(NOT_TLS);
    }
    if !tls && lower.contains("frame with invalid size") {
        // An HTTP/2 client reading a TLS record as a frame header.
        return Some(GIVE_CACERT_CERTAIN);
    }
    if !tls
        && (lower.contains("connection reset")
            || lower.contains("broken pipe")
            || lower.contains("connection closed"))
    {
        return Some(GIVE_CACERT);
    }
    if tls && (lower.contains("unknownissuer") || lower.contains("invalid peer certificate")) {
        return Some(OTHER_CA);
    }
    if tls && lower.contains("certificaterequired") {
        return Some(CERT_REQUIRED);
    }
    if tls && (lower.contains("unknownca") || lower.contains("unknown ca")) {
        return Some(UNKNOWN_CLIENT_CA);
    }
    if tls && (lower.contains("certificaterevoked") || lower.contains("certificate revoked")) {
        return Some(CERT_REVOKED);
    }
    if tls && (lower.contains("alert: decrypterror") || lower.contains("alert: decrypt error")) {
        return Some(SIGNATURE_REFUSED);
    }
    if tls
        && (lower.contains("badcertificate")
            || lower.contains("bad certificate")
            || lower.contains("certificateexpired")
            || lower.contains("unsupportedcertificate"))
    {
        return Some(CERT_REFUSED);
    }
    if tls
        && (lower.contains("broken pipe")
            || lower.contains("connection reset")
            || lower.contains("connection closed"))
    {
        return Some(CLOSED_AFTER_HANDSHAKE);
    }
    None
}

/// The same hint as [`GIVE_CACERT`], for the failure only a TLS node produces.
const GIVE_CACERT_CERTAIN: &str =
    "the node serves TLS: give --cacert (and --cert/--key if it asks for a client certificate)";

/// Whether `text` (a transport failure with its hint) names a TLS setting as the cause: a TLS
/// client and a plaintext node or the other way round, a node certificate of another CA, a
/// client certificate missing, of another CA or revoked (see [`CERTAIN`]). A plaintext
/// connection that broke is not.
// Written here rather than in `error.rs`, which the TLS settings' own errors are built from.
impl Error {
    /// `true` when the TLS settings are what is wrong: unusable files ([`Error::InvalidTls`]),
    /// or no node could be reached because of them (TLS spoken to a plaintext node or the other
    /// way round, a node certificate of another CA, a client certificate missing, of another
    /// CA, or revoked: with TLS on, the last node closed the connection right after the
    /// handshake). A plaintext connection that merely broke is not.
    pub fn is_tls_configuration(&self) -> bool {
        match self {
            Error::InvalidTls { .. } => true,
            Error::Unavailable { last, .. } => certain_tls_problem(last),
            _ => false,
        }
    }
}

pub(crate) fn certain_tls_problem(text: &str) -> bool {
    CERTAIN
        .iter()
        .chain([&GIVE_CACERT_CERTAIN])
        .any(|hint| text.contains(hint))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certain_tls_problems_are_told_from_broken_connections() {
        let with_hint = |text: &str, tls: bool| match mismatch_hint(text, tls) {
            Some(hint) => format!("{text} ({hint})"),
            None => text.to_string(),
        };
        for (text, tls) in [
            ("received corrupt message of type InvalidContentType", true),
            ("invalid peer certificate: UnknownIssuer", true),
            ("received fatal alert: CertificateRequired", true),
            ("received fatal alert: UnknownCA", true),
            ("received fatal alert: CertificateRevoked", true),
            ("received fatal alert: BadCertificate", true),
            ("received fatal alert: DecryptError", true),
            ("http2 error: frame with invalid size", false),
            ("transport error: connection closed", true),
            ("stream closed because of a broken pipe", true),
        ] {
            assert!(
                certain_tls_problem(&with_hint(text, tls)),
                "{text} (tls {tls}): {}",
                with_hint(text, tls)
            );
        }
        for (text, tls) in [
            (
                "tcp connect error: Connection refused (os error 111)",
                false,
            ),
            ("tcp connect error: Connection refused (os error 111)", true),
            ("connection reset by peer", false),
            ("no answer within 5s", true),
        ] {
            assert!(
                !certain_tls_problem(&with_hint(text, tls)),
                "{text} (tls {tls}): {}",
                with_hint(text, tls)
            );
        }
    }
}
