//! Node certificates, CRLs, rotation and dialing, with certificates made at test time.

use super::*;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType,
    ExtendedKeyUsagePurpose as Eku, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
    RevokedCertParams, SanType, SerialNumber,
};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::ServerName;

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
        crate::base::private_file::write(&path, text).expect("write");
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
    let now =
        time::OffsetDateTime::from_unix_timestamp(time::OffsetDateTime::now_utc().unix_timestamp())
            .expect("now");
    let soon = now + time::Duration::days(10);
    let tls = load(dir.path(), &ca, &leaf_until(&ca, soon), None);
    assert_eq!(tls.earliest_expiry(), Some(soon.unix_timestamp()));
    // A renewed certificate copied in place: the next expiry is the new one's.
    let later = now + time::Duration::days(400);
    let renewed = leaf_until(&ca, later);
    crate::base::private_file::write(&dir.path().join("node.crt"), &renewed.pem).expect("write");
    crate::base::private_file::write(&dir.path().join("node.key"), &renewed.key_pem)
        .expect("write");
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
