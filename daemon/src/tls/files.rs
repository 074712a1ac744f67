//! Reading the certificate, key, CA and CRL files (PEM) into the material a handshake uses,
//! refusing a set that does not fit together.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rustls::client::Resumption;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use rustls::pki_types::pem::PemObject;

use super::dial::NodeServerVerifier;
use super::node_cert::PeerTrust;
use super::{Material, Peer, TlsError, TlsFiles};

pub(super) fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        flag,
        path: path.to_path_buf(),
        source,
    })
}

pub(super) fn invalid(flag: &'static str, path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::Invalid {
        flag,
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

pub(super) fn read_certs(
    flag: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
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

pub(super) fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    if let Some(problem) = crate::base::private_file::problem(path) {
        return Err(invalid("--tls-key", path, problem));
    }
    let bytes = read("--tls-key", path)?;
    PrivateKeyDer::from_pem_slice(&bytes)
        .map_err(|e| invalid("--tls-key", path, format!("not a PEM private key: {e}")))
}

/// Adds the CA certificates in `path` to `roots` and returns them.
pub(super) fn read_roots(
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
pub(super) fn read_crls(
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

pub(super) fn build(files: &TlsFiles) -> Result<Material, TlsError> {
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
pub(super) fn earliest_not_after<'a>(
    certs: impl Iterator<Item = &'a CertificateDer<'static>>,
) -> Option<i64> {
    certs
        .filter_map(|der| x509_parser::parse_x509_certificate(der).ok())
        .map(|(_, cert)| cert.validity().not_after.timestamp())
        .min()
}
