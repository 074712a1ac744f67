//! `conch certs init|node|client`: a CA and certificates for a TLS cluster (see
//! `conch_client::certs`). Works offline; prints the files written. Any failure (a CA already
//! there, no CA yet, a bad name, an unwritable directory) is one line and exit 64.

use std::process::ExitCode;

use conch_client::certs;

use crate::cli::CertsCommand;

pub fn run(command: CertsCommand) -> anyhow::Result<ExitCode> {
    let usage = |e: certs::CertError| crate::exit::usage(e.to_string());
    let (what, (cert, key)) = match command {
        CertsCommand::Init { dir } => ("CA", certs::init(&dir).map_err(usage)?),
        CertsCommand::Node { dir, id, hosts } => (
            "node certificate",
            certs::write_node(&dir, id, &hosts).map_err(usage)?,
        ),
        CertsCommand::Client { dir, name } => (
            "client certificate",
            certs::write_client(&dir, &name).map_err(usage)?,
        ),
    };
    crate::print_lines([
        format!("{what}: {}", cert.display()),
        format!("key:  {}", key.display()),
    ])?;
    Ok(ExitCode::SUCCESS)
}
