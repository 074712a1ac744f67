//! A small certificate authority for conch clusters: a CA, node certificates and client
//! certificates, as PEM files in one directory (`conch certs`).
//!
//! - `ca.crt`, `ca.key`: the CA (ECDSA P-256, valid 10 years). Give `ca.crt` to conchd as
//!   `--client-ca` and `--peer-ca`, and to clients as `--cacert`. Keep `ca.key` offline.
//! - `node<ID>.crt`, `node<ID>.key`: a node certificate, with the node's hosts and IP addresses
//!   as subject alternative names, valid for server *and* client authentication (a node is both
//!   when it dials its peers). Valid 2 years.
//! - `client-<NAME>.crt`, `client-<NAME>.key`: a client certificate, valid for client
//!   authentication only, so a node never takes it for a peer. Valid 2 years.
//!
//! Keys are written with mode 0600. Certificates are issued by the CA of the same directory,
//! which must have been made by [`init`] (its subject name is fixed).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, date_time_ymd,
};

/// The CA's certificate file name.
pub const CA_CERT: &str = "ca.crt";
/// The CA's key file name.
pub const CA_KEY: &str = "ca.key";
/// The subject common name of every CA made by [`init`].
const CA_NAME: &str = "conch cluster CA";

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
}

fn this_year() -> i32 {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    1970 + (secs / 31_556_952) as i32
}

fn validity(params: &mut CertificateParams, years: i32) {
    let year = this_year();
    params.not_before = date_time_ymd(year - 1, 1, 1);
    params.not_after = date_time_ymd(year + years, 1, 1);
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

/// A new CA.
pub fn new_ca() -> Result<Issued, CertError> {
    let key = KeyPair::generate().map_err(|e| err("generate the CA key", e))?;
    let mut params = ca_params();
    validity(&mut params, 10);
    let cert = params
        .self_signed(&key)
        .map_err(|e| err("sign the CA certificate", e))?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn issue(
    ca_key_pem: &str,
    subject: &str,
    sans: &[String],
    usages: Vec<ExtendedKeyUsagePurpose>,
) -> Result<Issued, CertError> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(|e| err("read the CA key", e))?;
    let issuer = Issuer::new(ca_params(), ca_key);
    let mut params =
        CertificateParams::new(sans.to_vec()).map_err(|e| err("subject alternative names", e))?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, subject);
    params.distinguished_name = name;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = usages;
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, 2);
    let key = KeyPair::generate().map_err(|e| err("generate a key", e))?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| err("sign the certificate", e))?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A node certificate for node `id`, valid for `hosts` (DNS names or IP addresses), for both
/// server and client authentication.
pub fn node_cert(ca_key_pem: &str, id: u64, hosts: &[String]) -> Result<Issued, CertError> {
    if hosts.is_empty() {
        return Err(CertError(
            "a node certificate needs at least one --host (the name or address peers and \
             clients dial)"
                .into(),
        ));
    }
    issue(
        ca_key_pem,
        &format!("conch node {id}"),
        hosts,
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    )
}

/// A client certificate named `name`, for client authentication only.
pub fn client_cert(ca_key_pem: &str, name: &str) -> Result<Issued, CertError> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(CertError(format!(
            "client name {name:?}: use letters, digits, '-', '_' and '.'"
        )));
    }
    issue(
        ca_key_pem,
        name,
        &[],
        vec![ExtendedKeyUsagePurpose::ClientAuth],
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
pub fn write_pair(
    dir: &Path,
    stem: &str,
    issued: &Issued,
) -> Result<(PathBuf, PathBuf), CertError> {
    let cert = dir.join(format!("{stem}.crt"));
    let key = dir.join(format!("{stem}.key"));
    write(&key, &issued.key_pem, true)?;
    write(&cert, &issued.cert_pem, false)?;
    Ok((cert, key))
}

/// `conch certs init DIR`: creates `DIR` if needed and a new CA in it; refuses to replace one.
pub fn init(dir: &Path) -> Result<(PathBuf, PathBuf), CertError> {
    std::fs::create_dir_all(dir).map_err(|e| err(&format!("create {}", dir.display()), e))?;
    let cert = dir.join(CA_CERT);
    if cert.exists() || dir.join(CA_KEY).exists() {
        return Err(CertError(format!(
            "{} already holds a CA ({CA_CERT}/{CA_KEY}); remove them first to make a new one",
            dir.display()
        )));
    }
    write_pair(dir, "ca", &new_ca()?)
}

fn read_ca_key(dir: &Path) -> Result<String, CertError> {
    let path = dir.join(CA_KEY);
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
}

/// `conch certs node DIR --id N --host H...`: `DIR/node<N>.crt` and `.key`, replacing any.
pub fn write_node(dir: &Path, id: u64, hosts: &[String]) -> Result<(PathBuf, PathBuf), CertError> {
    let issued = node_cert(&read_ca_key(dir)?, id, hosts)?;
    write_pair(dir, &format!("node{id}"), &issued)
}

/// `conch certs client DIR --name NAME`: `DIR/client-<NAME>.crt` and `.key`, replacing any.
pub fn write_client(dir: &Path, name: &str) -> Result<(PathBuf, PathBuf), CertError> {
    let issued = client_cert(&read_ca_key(dir)?, name)?;
    write_pair(dir, &format!("client-{name}"), &issued)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_gets_one_ca_and_certificates_issued_by_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = dir.path().join("certs");
        let missing = write_node(&ca, 1, &["127.0.0.1".into()]).expect_err("no CA yet");
        assert!(
            missing.to_string().contains("conch certs init"),
            "{missing}"
        );
        init(&ca).expect("init");
        let again = init(&ca).expect_err("a second CA");
        assert!(again.to_string().contains("already holds a CA"), "{again}");

        let (cert, key) = write_node(&ca, 1, &["127.0.0.1".into(), "node1".into()]).expect("node");
        assert!(
            std::fs::read_to_string(cert)
                .expect("cert")
                .contains("BEGIN CERTIFICATE")
        );
        assert!(
            std::fs::read_to_string(&key)
                .expect("key")
                .contains("PRIVATE KEY")
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&key).expect("key").permissions().mode();
            assert_eq!(mode & 0o077, 0, "the key is private: {mode:o}");
        }
        assert!(
            write_node(&ca, 2, &[]).is_err(),
            "a node certificate needs a host"
        );
        write_client(&ca, "ops").expect("client");
        assert!(write_client(&ca, "a b").is_err(), "names are checked");
    }
}
