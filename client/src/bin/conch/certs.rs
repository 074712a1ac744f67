//! `conch certs init|node|client`: a CA and certificates for a TLS cluster (see
//! `conch_client::certs`). Works offline; prints the files written.

use std::process::ExitCode;

use conch_client::certs;

use crate::cli::CertsCommand;

pub fn run(command: CertsCommand) -> anyhow::Result<ExitCode> {
    let (what, (cert, key)) = match command {
        CertsCommand::Init { dir } => ("CA", certs::init(&dir)?),
        CertsCommand::Node { dir, id, hosts } => {
            ("node certificate", certs::write_node(&dir, id, &hosts)?)
        }
        CertsCommand::Client { dir, name } => {
            ("client certificate", certs::write_client(&dir, &name)?)
        }
    };
    crate::print_lines([
        format!("{what}: {}", cert.display()),
        format!("key:  {}", key.display()),
    ])?;
    Ok(ExitCode::SUCCESS)
}
