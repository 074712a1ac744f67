//! `conch certs init|node|client|revoke`: a CA, certificates and a revocation list for a TLS
//! cluster (see `conch_client::certs`). Works offline; prints the files written, how long each
//! certificate is valid, and after a revocation what to do next. Any failure (a CA already
//! there, no CA yet, a bad name or lifetime, an unwritable directory) is one line and exit 64.

use std::process::ExitCode;
use std::time::SystemTime;

use conch_client::certs::{self, Holder};

use crate::cli::{CertsCommand, RevokeHolder};
use crate::timefmt::rfc3339;

pub(crate) fn run(command: CertsCommand) -> anyhow::Result<ExitCode> {
    let usage = |e: certs::CertError| crate::exit::usage(e.to_string());
    let (what, days, written, crl) = match command {
        CertsCommand::Init { dir, days } => {
            let written = certs::init(&dir, days).map_err(usage)?;
            ("CA", days, written, Some(dir.join(certs::CA_CRL)))
        }
        CertsCommand::Node {
            dir,
            id,
            hosts,
            days,
        } => (
            "node certificate",
            days,
            certs::write_node(&dir, id, &hosts, days).map_err(usage)?,
            None,
        ),
        CertsCommand::Client { dir, name, days } => (
            "client certificate",
            days,
            certs::write_client(&dir, &name, days).map_err(usage)?,
            None,
        ),
        CertsCommand::Revoke { holder } => return revoke(holder),
    };
    let mut lines = vec![
        format!("{what}: {}", written.cert.display()),
        format!("key:  {}", written.key.display()),
        format!(
            "valid until {} ({days} days)",
            rfc3339(written.not_after.max(SystemTime::UNIX_EPOCH))
        ),
    ];
    if let Some(crl) = crl {
        lines.push(format!(
            "revocation list: {} (give it to every node as --peer-crl)",
            crl.display()
        ));
    }
    crate::print_lines(lines)?;
    Ok(ExitCode::SUCCESS)
}

fn revoke(holder: RevokeHolder) -> anyhow::Result<ExitCode> {
    let (dir, holder) = match holder {
        RevokeHolder::Node { id, dir } => (dir, Holder::Node(id)),
        RevokeHolder::Client { name, dir } => (dir, Holder::Client(name)),
    };
    let done = certs::revoke(&dir, &holder).map_err(|e| crate::exit::usage(e.to_string()))?;
    let state = if done.already {
        "was already revoked"
    } else {
        "revoked"
    };
    let mut lines = vec![
        format!(
            "{} (serial {}) {state}: {} now lists {} certificate(s)",
            done.cert.display(),
            done.serial,
            done.crl.display(),
            done.revoked
        ),
        format!(
            "next: copy {} to every node, where --peer-crl points; nodes re-read it within \
             seconds (or on SIGHUP), no restart",
            done.crl.display()
        ),
    ];
    if let Holder::Node(id) = holder {
        lines.push(format!(
            "then: conch certs node {} --id {id} --host ... issues node {id} a new certificate",
            dir.display()
        ));
    }
    crate::print_lines(lines)?;
    Ok(ExitCode::SUCCESS)
}
