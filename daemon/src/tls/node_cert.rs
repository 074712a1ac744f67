//! What a node certificate is, checked against the peer CA and its CRLs: the node it names,
//! with a small cache of leaves already verified.

use std::sync::Mutex;
use std::time::Duration;

use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, TrustAnchor, UnixTime};
use x509_parser::prelude::GeneralName;

use super::{NODE_CERT_CACHE, NODE_URI_PREFIX, NodeCertError};

/// What node certificates are checked against: the peer CA and its CRLs.
pub(super) struct PeerTrust {
    pub(super) anchors: Vec<TrustAnchor<'static>>,
    pub(super) crls: Vec<webpki::CertRevocationList<'static>>,
    pub(super) algorithms: WebPkiSupportedAlgorithms,
    /// Leaf certificates already verified as node certificates under this trust, with the node
    /// they name and when they expire (newest last, at most [`NODE_CERT_CACHE`]).
    pub(super) verified: Mutex<Vec<VerifiedLeaf>>,
}

pub(super) struct VerifiedLeaf {
    pub(super) leaf: CertificateDer<'static>,
    pub(super) node: u64,
    pub(super) not_after: UnixTime,
}

impl PeerTrust {
    /// The node `leaf` (presented with `intermediates`) is a node certificate of, at `now`.
    pub(super) fn node_of(
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

    pub(super) fn cached(&self, leaf: &CertificateDer<'_>, now: UnixTime) -> Option<u64> {
        let verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        verified
            .iter()
            .find(|v| v.leaf == *leaf && now <= v.not_after)
            .map(|v| v.node)
    }
}

/// The node a certificate names, and when it expires; refuses one without an explicit extended
/// key usage for both server and client authentication, or without exactly one node URI.
pub(super) fn node_named_by(leaf: &CertificateDer<'_>) -> Result<(u64, UnixTime), NodeCertError> {
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
pub(super) fn parse_node_uri(uri: &str) -> Option<u64> {
    let digits = uri.strip_prefix(NODE_URI_PREFIX)?;
    if digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}
