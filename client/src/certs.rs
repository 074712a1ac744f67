//! A small certificate authority for conch clusters: a CA, node certificates, client
//! certificates and a revocation list, as PEM files in one directory (`conch certs`).
//!
//! - `ca.crt`, `ca.key`: the CA (ECDSA P-256, valid [`CA_DAYS`] days unless told otherwise).
//!   Give `ca.crt` to conchd as `--client-ca` and `--peer-ca`, and to clients as `--cacert`.
//!   Keep `ca.key` offline.
//! - `ca.crl`: the CA's certificate revocation list, made empty by [`init`] and extended by
//!   [`revoke`]. Give it to conchd as `--peer-crl`.
//! - `node<ID>.crt`, `node<ID>.key`: a node certificate. Its extended key usage lists server
//!   *and* client authentication (a node is both when it dials its peers), and its subject
//!   alternative names hold the URI `urn:conch:node:<ID>` ([`NODE_URI_PREFIX`]), by which peers
//!   tell which node it is, plus the node's hosts and IP addresses, which clients check.
//! - `client-<NAME>.crt`, `client-<NAME>.key`: a client certificate, valid for client
//!   authentication only and naming no node, so a node never takes it for a peer.
//!
//! Node and client certificates are valid [`LEAF_DAYS`] days unless told otherwise, never past
//! the CA's own end. Every certificate gets a random 128-bit serial number (what a revocation
//! names). Keys are written with mode 0600; every file is written through a rename, so a node
//! polling it never sees half a file. Certificates are issued by the CA of the same directory,
//! which must have been made by [`init`] (its subject name is fixed).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
    RevokedCertParams, SanType, SerialNumber,
};
use time::OffsetDateTime;

/// The CA's certificate file name.
pub const CA_CERT: &str = "ca.crt";
/// The CA's key file name.
pub const CA_KEY: &str = "ca.key";
/// The CA's certificate revocation list.
pub const CA_CRL: &str = "ca.crl";
/// A node certificate names its node with the subjectAltName URI `urn:conch:node:<id>`; conchd
/// reads the same form.
pub const NODE_URI_PREFIX: &str = "urn:conch:node:";
/// How long a new CA is valid by default: 10 years.
pub const CA_DAYS: u32 = 3650;
/// How long a node or client certificate is valid by default: 2 years.
pub const LEAF_DAYS: u32 = 730;
/// The longest lifetime `--days` accepts: 100 years.
pub const MAX_DAYS: u32 = 36_500;
/// The subject common name of every CA made by [`init`].
pub const CA_NAME: &str = "conch cluster CA";

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CertError(String);

fn err(context: &str, e: impl std::fmt::Display) -> CertError {
    CertError(format!("{context}: {e}"))
}

/// A certificate and its private key, PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
    /// The end of its validity.
    pub not_after: SystemTime,
}

/// The files of an issued certificate.
#[derive(Debug, Clone)]
pub struct Written {
    /// The certificate file.
    pub cert: PathBuf,
    /// Its private key file.
    pub key: PathBuf,
    /// The end of the certificate's validity.
    pub not_after: SystemTime,
}

/// A random positive serial number of 16 bytes.
fn random_serial() -> Result<SerialNumber, CertError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| err("make a random serial number", e))?;
    // Positive, and still 16 bytes long once encoded.
    bytes[0] = (bytes[0] & 0x7f).max(1);
    Ok(SerialNumber::from_slice(&bytes))
}

fn check_days(days: u32) -> Result<(), CertError> {
    if !(1..=MAX_DAYS).contains(&days) {
        return Err(CertError(format!(
            "--days {days}: a lifetime must be between 1 and {MAX_DAYS} days"
        )));
    }
    Ok(())
}

/// Valid from a day ago (a node whose clock is a little behind still accepts it) for `days`
/// days from now.
fn validity(params: &mut CertificateParams, days: u32) -> Result<OffsetDateTime, CertError> {
    check_days(days)?;
    let now = OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(i64::from(days));
    params.serial_number = Some(random_serial()?);
    Ok(params.not_after)
}

fn system_time(t: OffsetDateTime) -> SystemTime {
    SystemTime::from(t)
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, CA_NAME);
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// A new CA, valid `days` days.
pub fn new_ca(days: u32) -> Result<Issued, CertError> {
    let key = KeyPair::generate().map_err(|e| err("generate the CA key", e))?;
    let mut params = ca_params();
    let not_after = validity(&mut params, days)?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| err("sign the CA certificate", e))?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_after: system_time(not_after),
    })
}

/// The CA of one directory: its key, and the end of its certificate's validity.
struct Ca {
    key: KeyPair,
    not_after: OffsetDateTime,
    /// The DER of `ca.crt`.
    cert_der: Vec<u8>,
}

impl Ca {
    fn issuer(&self) -> Issuer<'static, &KeyPair> {
        Issuer::new(ca_params(), &self.key)
    }

    /// This CA's certificate, parsed (to check what claims to be issued by it).
    fn parsed(&self) -> Result<x509_parser::certificate::X509Certificate<'_>, CertError> {
        x509_parser::parse_x509_certificate(&self.cert_der)
            .map(|(_, cert)| cert)
            .map_err(|e| err(&format!("read {CA_CERT}"), e))
    }
}

fn issue(
    ca: &Ca,
    subject: &str,
    hosts: &[String],
    node_uri: Option<String>,
    usages: Vec<ExtendedKeyUsagePurpose>,
    days: u32,
) -> Result<Issued, CertError> {
    let mut params =
        CertificateParams::new(hosts.to_vec()).map_err(|e| err("subject alternative names", e))?;
    if let Some(uri) = node_uri {
        let uri = uri
            .try_into()
            .map_err(|e| err("subject alternative names", e))?;
        params.subject_alt_names.insert(0, SanType::URI(uri));
    }
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, subject);
    params.distinguished_name = name;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = usages;
    params.use_authority_key_identifier_extension = true;
    let not_after = validity(&mut params, days)?;
    if not_after > ca.not_after {
        let left = (ca.not_after - OffsetDateTime::now_utc()).whole_days();
        return Err(CertError(format!(
            "--days {days}: the certificate would outlive the CA (valid until {}); use \
             --days {} or less, or make a new CA",
            ca.not_after.date(),
            left.max(0)
        )));
    }
    let key = KeyPair::generate().map_err(|e| err("generate a key", e))?;
    let cert = params
        .signed_by(&key, &ca.issuer())
        .map_err(|e| err("sign the certificate", e))?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_after: system_time(not_after),
    })
}

/// A node certificate for node `id`, valid for `hosts` (DNS names or IP addresses), for both
/// server and client authentication, naming the node with `urn:conch:node:<id>`.
fn node_cert(ca: &Ca, id: u64, hosts: &[String], days: u32) -> Result<Issued, CertError> {
    if id == 0 {
        return Err(CertError("--id: a node id is a positive integer".into()));
    }
    if hosts.is_empty() {
        return Err(CertError(
            "a node certificate needs at least one --host (the name or address peers and \
             clients dial)"
                .into(),
        ));
    }
    issue(
        ca,
        &format!("conch node {id}"),
        hosts,
        Some(format!("{NODE_URI_PREFIX}{id}")),
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        days,
    )
}

fn check_client_name(name: &str) -> Result<(), CertError> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(CertError(format!(
            "client name {name:?}: use letters, digits, '-', '_' and '.'"
        )));
    }
    Ok(())
}

/// A client certificate named `name`, for client authentication only.
fn client_cert(ca: &Ca, name: &str, days: u32) -> Result<Issued, CertError> {
    check_client_name(name)?;
    issue(
        ca,
        name,
        &[],
        None,
        vec![ExtendedKeyUsagePurpose::ClientAuth],
        days,
    )
}

/// Writes `bytes` to `path` through a temporary file and a rename, so a reader (a node
/// watching its certificate) never sees half a file. Keys get mode 0600.
fn write(path: &Path, bytes: &str, private: bool) -> Result<(), CertError> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if private { 0o600 } else { 0o644 });
    }
    let mut file = options
        .open(&tmp)
        .map_err(|e| err(&format!("write {}", tmp.display()), e))?;
    file.write_all(bytes.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| err(&format!("write {}", tmp.display()), e))?;
    std::fs::rename(&tmp, path).map_err(|e| err(&format!("write {}", path.display()), e))
}

/// Writes a certificate and key as `<dir>/<stem>.crt` and `<dir>/<stem>.key` (key first, so a
/// node polling the pair sees the new key no later than the new certificate).
pub fn write_pair(dir: &Path, stem: &str, issued: &Issued) -> Result<Written, CertError> {
    let cert = dir.join(format!("{stem}.crt"));
    let key = dir.join(format!("{stem}.key"));
    write(&key, &issued.key_pem, true)?;
    write(&cert, &issued.cert_pem, false)?;
    Ok(Written {
        cert,
        key,
        not_after: issued.not_after,
    })
}

/// `conch certs init DIR`: creates `DIR` if needed, a new CA valid `days` days in it, and its
/// empty revocation list (`ca.crl`); refuses to replace a CA.
pub fn init(dir: &Path, days: u32) -> Result<Written, CertError> {
    std::fs::create_dir_all(dir).map_err(|e| err(&format!("create {}", dir.display()), e))?;
    let cert = dir.join(CA_CERT);
    if cert.exists() || dir.join(CA_KEY).exists() {
        return Err(CertError(format!(
            "{} already holds a CA ({CA_CERT}/{CA_KEY}); remove them first to make a new one",
            dir.display()
        )));
    }
    let written = write_pair(dir, "ca", &new_ca(days)?)?;
    let ca = read_ca(dir)?;
    write(
        &dir.join(CA_CRL),
        &sign_crl(&ca, Vec::new(), vec![1])?,
        false,
    )?;
    Ok(written)
}

fn read_ca(dir: &Path) -> Result<Ca, CertError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).map_err(|e| {
            err(
                &format!(
                    "read {} (make a CA first: conch certs init {})",
                    path.display(),
                    dir.display()
                ),
                e,
            )
        })
    };
    let key_pem = read(CA_KEY)?;
    let cert_pem = read(CA_CERT)?;
    let key = KeyPair::from_pem(&key_pem).map_err(|e| err("read the CA key", e))?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
        .map_err(|e| err(&format!("read {}", dir.join(CA_CERT).display()), e))?;
    let (_, cert) = x509_parser::parse_x509_certificate(&pem.contents)
        .map_err(|e| err(&format!("read {}", dir.join(CA_CERT).display()), e))?;
    let not_after = cert.validity().not_after.to_datetime();
    Ok(Ca {
        key,
        not_after,
        cert_der: pem.contents.clone(),
    })
}

/// `conch certs node DIR --id N --host H...`: `DIR/node<N>.crt` and `.key`, valid `days` days,
/// replacing any.
pub fn write_node(dir: &Path, id: u64, hosts: &[String], days: u32) -> Result<Written, CertError> {
    let issued = node_cert(&read_ca(dir)?, id, hosts, days)?;
    write_pair(dir, &format!("node{id}"), &issued)
}

/// `conch certs client DIR --name NAME`: `DIR/client-<NAME>.crt` and `.key`, valid `days`
/// days, replacing any.
pub fn write_client(dir: &Path, name: &str, days: u32) -> Result<Written, CertError> {
    let issued = client_cert(&read_ca(dir)?, name, days)?;
    write_pair(dir, &format!("client-{name}"), &issued)
}

/// Whose certificate [`revoke`] revokes: the one in the CA's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// `node<ID>.crt`.
    Node(u64),
    /// `client-<NAME>.crt`.
    Client(String),
}

impl Holder {
    fn stem(&self) -> Result<String, CertError> {
        match self {
            Holder::Node(id) => Ok(format!("node{id}")),
            Holder::Client(name) => {
                check_client_name(name)?;
                Ok(format!("client-{name}"))
            }
        }
    }
}

/// What [`revoke`] did.
#[derive(Debug, Clone)]
pub struct Revocation {
    /// The certificate revoked.
    pub cert: PathBuf,
    /// Its serial number, in hex.
    pub serial: String,
    /// The revocation list written.
    pub crl: PathBuf,
    /// Whether the list held the certificate already.
    pub already: bool,
    /// How many certificates the list revokes now.
    pub revoked: usize,
}

/// A CRL of `ca` revoking `revoked`, numbered `number` (big-endian), as PEM. It is valid until
/// the CA expires: a new one is issued at each revocation, not on a schedule.
fn sign_crl(
    ca: &Ca,
    revoked: Vec<RevokedCertParams>,
    number: Vec<u8>,
) -> Result<String, CertError> {
    let now = OffsetDateTime::now_utc();
    let params = CertificateRevocationListParams {
        this_update: now,
        next_update: ca.not_after.max(now + time::Duration::days(1)),
        crl_number: SerialNumber::from(number),
        issuing_distribution_point: None,
        revoked_certs: revoked,
        key_identifier_method: KeyIdMethod::Sha256,
    };
    params
        .signed_by(&ca.issuer())
        .and_then(|crl| crl.pem())
        .map_err(|e| err("sign the revocation list", e))
}

/// Big-endian `number + 1`.
fn next_number(mut number: Vec<u8>) -> Vec<u8> {
    for byte in number.iter_mut().rev() {
        let (sum, carry) = byte.overflowing_add(1);
        *byte = sum;
        if !carry {
            return number;
        }
    }
    number.insert(0, 1);
    number
}

/// The revoked entries and the number of `DIR/ca.crl`, checked to be this CA's.
fn read_crl(ca: &Ca, path: &Path) -> Result<(Vec<RevokedCertParams>, Vec<u8>), CertError> {
    let context = format!("read {}", path.display());
    let text = std::fs::read(path).map_err(|e| err(&context, e))?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&text).map_err(|e| err(&context, e))?;
    let (_, crl) = x509_parser::parse_x509_crl(&pem.contents).map_err(|e| err(&context, e))?;
    let ca_cert = ca.parsed()?;
    if crl.issuer().as_raw() != ca_cert.subject().as_raw()
        || crl.verify_signature(ca_cert.public_key()).is_err()
    {
        return Err(CertError(format!(
            "{} is not this CA's revocation list; move it away to start a new one",
            path.display()
        )));
    }
    let revoked = crl
        .iter_revoked_certificates()
        .map(|entry| RevokedCertParams {
            serial_number: SerialNumber::from_slice(entry.raw_serial()),
            revocation_time: entry.revocation_date.to_datetime(),
            reason_code: None,
            invalidity_date: None,
        })
        .collect();
    let number = crl
        .crl_number()
        .map(|n| n.to_bytes_be())
        .unwrap_or_default();
    Ok((revoked, number))
}

/// The serial number in a certificate PEM file, checked to be issued by this CA.
fn serial_of(ca: &Ca, path: &Path) -> Result<Vec<u8>, CertError> {
    let context = format!("read {} (the certificate to revoke)", path.display());
    let text = std::fs::read(path).map_err(|e| err(&context, e))?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&text).map_err(|e| err(&context, e))?;
    let (_, cert) =
        x509_parser::parse_x509_certificate(&pem.contents).map_err(|e| err(&context, e))?;
    let ca_cert = ca.parsed()?;
    if cert.issuer().as_raw() != ca_cert.subject().as_raw()
        || cert.verify_signature(Some(ca_cert.public_key())).is_err()
    {
        return Err(CertError(format!(
            "{} was not issued by the CA in this directory",
            path.display()
        )));
    }
    Ok(cert.raw_serial().to_vec())
}

/// Serial numbers compare as integers: a leading zero byte (which DER adds before a high bit)
/// does not count.
fn same_serial(a: &[u8], b: &[u8]) -> bool {
    let trim = |s: &[u8]| -> Vec<u8> { s.iter().copied().skip_while(|b| *b == 0).collect() };
    trim(a) == trim(b)
}

/// `conch certs revoke node ID | client NAME --dir DIR`: adds the serial number of
/// `DIR/node<ID>.crt` (or `DIR/client-<NAME>.crt`) to `DIR/ca.crl`, keeping every certificate
/// it revoked before, and signs the list again with a higher number. Nodes given the list as
/// `--peer-crl` refuse the certificate from the moment they re-read it.
pub fn revoke(dir: &Path, holder: &Holder) -> Result<Revocation, CertError> {
    let ca = read_ca(dir)?;
    let cert = dir.join(format!("{}.crt", holder.stem()?));
    let serial = serial_of(&ca, &cert)?;
    let crl = dir.join(CA_CRL);
    let (mut revoked, number) = if crl.exists() {
        read_crl(&ca, &crl)?
    } else {
        (Vec::new(), Vec::new())
    };
    let already = revoked
        .iter()
        .any(|r| same_serial(r.serial_number.as_ref(), &serial));
    if !already {
        revoked.push(RevokedCertParams {
            serial_number: SerialNumber::from_slice(&serial),
            revocation_time: OffsetDateTime::now_utc(),
            reason_code: None,
            invalidity_date: None,
        });
        write(
            &crl,
            &sign_crl(&ca, revoked.clone(), next_number(number))?,
            false,
        )?;
    }
    Ok(Revocation {
        cert,
        serial: serial
            .iter()
            .skip_while(|b| **b == 0)
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":"),
        crl,
        already,
        revoked: revoked.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(path: &Path) -> (Vec<u8>, Vec<u8>) {
        let text = std::fs::read(path).expect("read");
        let (_, pem) = x509_parser::pem::parse_x509_pem(&text).expect("pem");
        (pem.label.into_bytes(), pem.contents)
    }

    #[test]
    fn a_directory_gets_one_ca_and_certificates_issued_by_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = dir.path().join("certs");
        let missing = write_node(&ca, 1, &["127.0.0.1".into()], LEAF_DAYS).expect_err("no CA");
        assert!(
            missing.to_string().contains("conch certs init"),
            "{missing}"
        );
        init(&ca, CA_DAYS).expect("init");
        let again = init(&ca, CA_DAYS).expect_err("a second CA");
        assert!(again.to_string().contains("already holds a CA"), "{again}");
        assert!(ca.join(CA_CRL).exists(), "an empty revocation list");

        let node =
            write_node(&ca, 1, &["127.0.0.1".into(), "node1".into()], LEAF_DAYS).expect("node");
        assert!(
            std::fs::read_to_string(&node.cert)
                .expect("cert")
                .contains("BEGIN CERTIFICATE")
        );
        assert!(
            std::fs::read_to_string(&node.key)
                .expect("key")
                .contains("PRIVATE KEY")
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&node.key)
                .expect("key")
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "the key is private: {mode:o}");
        }
        assert!(
            write_node(&ca, 2, &[], LEAF_DAYS).is_err(),
            "a node certificate needs a host"
        );
        write_client(&ca, "ops", LEAF_DAYS).expect("client");
        assert!(
            write_client(&ca, "a b", LEAF_DAYS).is_err(),
            "names are checked"
        );
    }

    #[test]
    fn a_node_certificate_names_its_node_and_both_usages() {
        let dir = tempfile::tempdir().expect("tempdir");
        init(dir.path(), CA_DAYS).expect("init");
        let node = write_node(dir.path(), 2, &["10.0.0.2".into()], 30).expect("node");
        let (_, der) = parse(&node.cert);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("cert");
        let usage = cert.extended_key_usage().expect("eku").expect("present");
        assert!(usage.value.server_auth && usage.value.client_auth);
        let names = cert
            .subject_alternative_name()
            .expect("san")
            .expect("present");
        let text: Vec<String> = names
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert!(
            text.contains(&"URI(urn:conch:node:2)".to_string()),
            "{text:?}"
        );
        assert!(
            text.contains(&"IPAddress(0a:00:00:02)".to_string()),
            "{text:?}"
        );
        let days = cert.validity().not_after - cert.validity().not_before;
        assert_eq!(
            days.map(|d| d.whole_days()),
            Some(31),
            "30 days, from a day ago"
        );

        let client = write_client(dir.path(), "ops", LEAF_DAYS).expect("client");
        let (_, der) = parse(&client.cert);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("cert");
        let usage = cert.extended_key_usage().expect("eku").expect("present");
        assert!(!usage.value.server_auth && usage.value.client_auth);

        let again = write_node(dir.path(), 2, &["10.0.0.2".into()], 30).expect("node");
        let (_, der2) = parse(&again.cert);
        let (_, cert2) = x509_parser::parse_x509_certificate(&der2).expect("cert");
        let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("cert");
        assert_ne!(cert.raw_serial(), cert2.raw_serial(), "random serials");
        assert!(cert2.raw_serial().len() >= 16, "{:?}", cert2.raw_serial());
    }

    #[test]
    fn lifetimes_are_bounded_by_the_flag_and_the_ca() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(init(dir.path(), 0).is_err(), "zero days");
        init(dir.path(), 100).expect("a short-lived CA");
        let long = write_node(dir.path(), 1, &["h".into()], LEAF_DAYS).expect_err("outlives");
        assert!(long.to_string().contains("outlive the CA"), "{long}");
        write_node(dir.path(), 1, &["h".into()], 99).expect("within the CA's life");
        assert!(write_client(dir.path(), "ops", MAX_DAYS + 1).is_err());
    }

    #[test]
    fn revocations_accumulate_in_one_signed_list() {
        // t=0  init: an empty list
        // t=1  revoke node 1            -> 1 revoked
        // t=2  revoke client ops        -> 2 revoked, node 1 still there
        // t=3  revoke node 1 again      -> already, unchanged
        let dir = tempfile::tempdir().expect("tempdir");
        init(dir.path(), CA_DAYS).expect("init");
        write_node(dir.path(), 1, &["h".into()], LEAF_DAYS).expect("node");
        write_client(dir.path(), "ops", LEAF_DAYS).expect("client");
        let serials = |path: &Path| {
            let (label, der) = parse(path);
            assert_eq!(label, b"X509 CRL");
            let (_, crl) = x509_parser::parse_x509_crl(&der).expect("crl");
            let number = crl.crl_number().map(|n| n.to_bytes_be());
            let serials: Vec<Vec<u8>> = crl
                .iter_revoked_certificates()
                .map(|r| r.raw_serial().to_vec())
                .collect();
            (serials, number)
        };
        let (empty, first) = serials(&dir.path().join(CA_CRL));
        assert!(empty.is_empty());

        let node = revoke(dir.path(), &Holder::Node(1)).expect("revoke node");
        assert!(!node.already);
        assert_eq!(node.revoked, 1);
        let client = revoke(dir.path(), &Holder::Client("ops".into())).expect("revoke client");
        assert_eq!(client.revoked, 2);
        let (list, number) = serials(&client.crl);
        assert_eq!(list.len(), 2);
        assert!(number > first, "{number:?} > {first:?}");
        let again = revoke(dir.path(), &Holder::Node(1)).expect("again");
        assert!(again.already);
        assert_eq!(serials(&again.crl).0.len(), 2);

        let missing = revoke(dir.path(), &Holder::Node(7)).expect_err("no node7.crt");
        assert!(missing.to_string().contains("node7.crt"), "{missing}");
        let other = tempfile::tempdir().expect("tempdir");
        init(other.path(), CA_DAYS).expect("init");
        std::fs::copy(dir.path().join("node1.crt"), other.path().join("node1.crt")).expect("copy");
        let foreign = revoke(other.path(), &Holder::Node(1)).expect_err("another CA's");
        assert!(foreign.to_string().contains("not issued by"), "{foreign}");
    }

    #[test]
    fn crl_numbers_count_up() {
        assert_eq!(next_number(vec![]), vec![1]);
        assert_eq!(next_number(vec![1]), vec![2]);
        assert_eq!(next_number(vec![0xff]), vec![1, 0]);
        assert_eq!(next_number(vec![1, 0xff]), vec![2, 0]);
        assert!(same_serial(&[0, 0x80], &[0x80]));
    }
}
