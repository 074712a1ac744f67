//! Exit codes, and the mapping from errors to them.
//!
//! The codes and what each means are the README's "Exit status" table (its gRPC table is checked
//! against [`code_for_grpc`] by a test below). In short: the command's own status when it ran;
//! `--who` 0/1 (someone holds / nobody does); 64 usage; 65 absent or duplicate; 69 no node
//! answered; 70 internal; 75 busy (no slot in time); 77 access control; 78 TLS settings
//! (EX_CONFIG); 79 slot lost; 80 hold limit; 81 revoked by an administrator; 82 quota or limit;
//! 126/127 the command could not be executed / was not found.

use std::process::ExitStatus;

use tonic::Code;

pub(crate) const USAGE: u8 = 64;
/// The cluster refused what was asked: absent, or a duplicate.
pub(crate) const REFUSED: u8 = 65;
pub(crate) const UNAVAILABLE: u8 = 69;
pub(crate) const SOFTWARE: u8 = 70;
pub(crate) const NO_SLOT: u8 = 75;
/// The TLS settings are wrong (EX_CONFIG): an unusable `--cacert`/`--cert`/`--key`, TLS spoken
/// to a plaintext node or the other way round, a certificate the other side refuses.
pub(crate) const CONFIG: u8 = 78;
/// Access control refused the call: no token, an unknown or revoked one, or one without the
/// permission (EX_NOPERM).
pub(crate) const NO_PERMISSION: u8 = 77;
pub(crate) const SLOT_LOST: u8 = 79;
/// The hold limit (`--max-hold`, or the semaphore's) ended the command.
pub(crate) const HOLD_LIMIT: u8 = 80;
/// An administrator revoked the slot (`conch revoke`); the reason was printed.
pub(crate) const REVOKED: u8 = 81;
/// A quota or limit refused the request (`RESOURCE_EXHAUSTED`): not "busy", since waiting does
/// not help until something is freed or the quota raised.
pub(crate) const QUOTA: u8 = 82;
pub(crate) const CANNOT_EXECUTE: u8 = 126;
pub(crate) const COMMAND_NOT_FOUND: u8 = 127;

/// An error that carries its exit code; `Display` is the one line printed after `conch: `.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub(crate) struct Exit {
    pub code: u8,
    pub message: String,
}

/// A usage error (exit 64).
pub(crate) fn usage(message: impl Into<String>) -> anyhow::Error {
    Exit {
        code: USAGE,
        message: message.into(),
    }
    .into()
}

/// A configuration mistake in the TLS settings (exit 78).
pub(crate) fn config(message: impl Into<String>) -> anyhow::Error {
    Exit {
        code: CONFIG,
        message: message.into(),
    }
    .into()
}

/// The exit code for an error that ended `run`.
pub(crate) fn code_for(err: &anyhow::Error) -> u8 {
    for cause in err.chain() {
        if let Some(e) = cause.downcast_ref::<Exit>() {
            return e.code;
        }
        if let Some(e) = cause.downcast_ref::<conch_client::Error>() {
            return code_for_client_error(e);
        }
    }
    SOFTWARE
}

fn code_for_client_error(e: &conch_client::Error) -> u8 {
    use conch_client::Error as E;
    match e {
        // Problems with what this side was given, before any node was asked.
        E::InvalidEndpoint { .. } | E::InvalidToken { .. } => USAGE,
        // TLS settings, unusable or refused: a configuration mistake, not an outage.
        e if e.is_tls_configuration() => CONFIG,
        E::LeaseLost { .. } => NO_SLOT,
        E::Protocol { .. } => SOFTWARE,
        // Everything a node answered (or stands for an answer) goes through the one table.
        _ => e.code().map_or(SOFTWARE, code_for_grpc),
    }
}

/// The exit code for a call the cluster answered with `code`: the table "gRPC status
/// and exit status" (a test checks the two agree, row by row).
pub(crate) fn code_for_grpc(code: Code) -> u8 {
    match code {
        Code::Ok => 0,
        // The request cannot be done as asked, or not in the cluster's present state.
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => USAGE,
        Code::NotFound | Code::AlreadyExists => REFUSED,
        Code::Unavailable | Code::DeadlineExceeded => UNAVAILABLE,
        // A quota or limit: waiting does not help, freeing something or a higher quota does.
        Code::ResourceExhausted => QUOTA,
        Code::Unauthenticated | Code::PermissionDenied => NO_PERMISSION,
        Code::Cancelled
        | Code::Unknown
        | Code::Aborted
        | Code::Unimplemented
        | Code::Internal
        | Code::DataLoss => SOFTWARE,
    }
}

/// A hint appended to the error line: how to send a token, when the cluster wanted one.
pub(crate) fn hint(err: &anyhow::Error) -> &'static str {
    let unauthenticated = err
        .chain()
        .filter_map(|e| e.downcast_ref::<conch_client::Error>())
        .any(|e| e.code() == Some(Code::Unauthenticated));
    if unauthenticated {
        " (pass a token with --token-file, CONCH_TOKEN_FILE or CONCH_TOKEN)"
    } else {
        ""
    }
}

/// The exit code that passes a child's status through: its exit code, or 128+signal.
pub(crate) fn code_for_status(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return (code & 0xff) as u8;
    }
    if let Some(sig) = status.signal() {
        return 128u8.saturating_add((sig & 0x7f) as u8);
    }
    SOFTWARE
}

/// The exit code after being interrupted by signal `sig` before the command ran: 128+sig.
pub(crate) fn signal_exit(sig: nix::sys::signal::Signal) -> std::process::ExitCode {
    std::process::ExitCode::from(128u8.saturating_add((sig as i32 & 0x7f) as u8))
}

/// Renders a clap error as one line: `the following required arguments were not provided:
/// --max <N> (try --help)`.
pub(crate) fn clap_error_line(rendered: &str) -> String {
    let mut out = String::new();
    let mut in_usage = false;
    for line in rendered.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            in_usage = false;
            continue;
        }
        if trimmed.starts_with("Usage:") {
            in_usage = true;
            continue;
        }
        if in_usage || trimmed.starts_with("For more information") {
            continue;
        }
        let part = trimmed.strip_prefix("error: ").unwrap_or(trimmed);
        if !out.is_empty() {
            out.push_str(if out.ends_with(':') { " " } else { "; " });
        }
        out.push_str(part);
    }
    if out.is_empty() {
        out.push_str("invalid usage");
    }
    out.push_str(" (try --help)");
    out
}

/// For an unexpected argument: says that a command to run follows `--` (`conch sema x --max 1
/// echo hi` forgot it), unless clap already gave a tip about `--`.
pub(crate) fn with_dash_dash_hint(rendered: &str, line: String) -> String {
    if !rendered.contains("unexpected argument") || rendered.contains("tip:") {
        return line;
    }
    let hint = "; the command to run goes after `--`, e.g. conch sema NAME --max N -- CMD ARGS...";
    match line.strip_suffix(" (try --help)") {
        Some(head) => format!("{head}{hint} (try --help)"),
        None => format!("{line}{hint}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::time::Duration;

    #[test]
    fn client_errors_map_to_sysexits() {
        let unavailable = conch_client::Error::Unavailable {
            op: "get semaphore",
            endpoints: vec!["127.0.0.1:7001".into()],
            last: "connection refused".into(),
        };
        assert_eq!(code_for(&anyhow::Error::new(unavailable)), UNAVAILABLE);
        let timeout = conch_client::Error::Timeout {
            op: "x",
            timeout: Duration::from_secs(5),
        };
        assert_eq!(
            code_for(&anyhow::Error::new(timeout).context("ensure semaphore")),
            UNAVAILABLE
        );
        let bad = conch_client::Error::from_status("acquire", tonic::Status::invalid_argument("x"));
        assert_eq!(code_for(&anyhow::Error::new(bad)), USAGE);
        let full =
            conch_client::Error::from_status("acquire", tonic::Status::resource_exhausted("x"));
        assert_eq!(code_for(&anyhow::Error::new(full)), QUOTA);
        let tls = conch_client::Error::InvalidTls {
            what: "--cacert x: holds no PEM CERTIFICATE block".into(),
        };
        assert_eq!(code_for(&anyhow::Error::new(tls)), CONFIG);
        let internal = conch_client::Error::from_status("acquire", tonic::Status::internal("x"));
        assert_eq!(code_for(&anyhow::Error::new(internal)), SOFTWARE);
        // Refusals of what was asked, one code for all three.
        for status in [
            tonic::Status::not_found("role nosuch not found"),
            tonic::Status::already_exists("x"),
        ] {
            let refused = conch_client::Error::from_status("role grant", status);
            assert_eq!(code_for(&anyhow::Error::new(refused)), REFUSED);
        }
        let denied = conch_client::Error::from_status("get", tonic::Status::permission_denied("x"));
        assert_eq!(code_for(&anyhow::Error::new(denied)), NO_PERMISSION);
        assert_eq!(code_for(&usage("bad name")), USAGE);
        assert_eq!(code_for(&anyhow::anyhow!("something else")), SOFTWARE);
    }

    /// The book's "gRPC status | exit status" table (The conch CLI), as (status name, exit
    /// status) rows.
    fn book_status_table() -> Vec<(String, u8)> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/src/cli.md");
        let chapter = std::fs::read_to_string(path).expect("docs/src/cli.md");
        let mut rows = Vec::new();
        let mut lines = chapter
            .lines()
            .skip_while(|l| !l.starts_with("| gRPC status | exit status |"))
            .skip(2);
        for line in lines.by_ref().take_while(|l| l.starts_with('|')) {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            let [names, exit] = cells[..] else {
                panic!("a row of two cells: {line}");
            };
            let exit: u8 = exit
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("an exit status: {line}"));
            for name in names.split(',') {
                rows.push((name.trim().trim_matches('`').to_string(), exit));
            }
        }
        rows
    }

    /// `InvalidArgument` → `INVALID_ARGUMENT`, as the book and gRPC spell codes.
    fn grpc_name(code: Code) -> String {
        let mut name = String::new();
        for (i, c) in format!("{code:?}").chars().enumerate() {
            if c.is_ascii_uppercase() && i > 0 {
                name.push('_');
            }
            name.push(c.to_ascii_uppercase());
        }
        name
    }

    #[test]
    fn every_grpc_status_has_the_exit_status_the_book_table_gives() {
        let table = book_status_table();
        let codes: Vec<Code> = (0..=16).map(Code::from_i32).collect();
        assert_eq!(
            table.len(),
            codes.len(),
            "one row per gRPC status: {table:?}"
        );
        for code in codes {
            let name = grpc_name(code);
            let rows: Vec<u8> = table
                .iter()
                .filter(|(n, _)| *n == name)
                .map(|(_, exit)| *exit)
                .collect();
            assert_eq!(rows.len(), 1, "{name} once in the book's table");
            assert_eq!(code_for_grpc(code), rows[0], "{name}");
            if code != Code::Ok {
                // The whole path: a status as the client library returns it, then the CLI.
                let err = conch_client::Error::from_status("call", tonic::Status::new(code, "x"));
                assert_eq!(code_for(&anyhow::Error::new(err)), rows[0], "{name}");
            }
        }
    }

    #[test]
    fn child_status_passes_through() {
        // Raw wait statuses: exit code in the high byte, signal in the low bits.
        assert_eq!(code_for_status(ExitStatus::from_raw(0)), 0);
        assert_eq!(code_for_status(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(code_for_status(ExitStatus::from_raw(255 << 8)), 255);
        assert_eq!(
            code_for_status(ExitStatus::from_raw(
                nix::sys::signal::Signal::SIGTERM as i32
            )),
            143
        );
        assert_eq!(
            code_for_status(ExitStatus::from_raw(
                nix::sys::signal::Signal::SIGKILL as i32
            )),
            137
        );
        assert_eq!(
            code_for_status(ExitStatus::from_raw(
                nix::sys::signal::Signal::SIGINT as i32
            )),
            130
        );
    }

    #[test]
    fn an_unexpected_argument_suggests_dash_dash() {
        let rendered = "error: unexpected argument 'echo' found\n\nUsage: conch sema --max <N> <NAME> [-- <CMD>...]\n\nFor more information, try '--help'.\n";
        let line = with_dash_dash_hint(rendered, clap_error_line(rendered));
        assert_eq!(
            line,
            "unexpected argument 'echo' found; the command to run goes after `--`, e.g. conch sema NAME --max N -- CMD ARGS... (try --help)"
        );
        // clap's own tip about `--` is enough.
        let rendered = "error: unexpected argument '--foo' found\n\n  tip: to pass '--foo' as a value, use '-- --foo'\n";
        let line = with_dash_dash_hint(rendered, clap_error_line(rendered));
        assert!(!line.contains("goes after"), "{line}");
    }

    #[test]
    fn clap_errors_become_one_line() {
        let rendered = "error: the following required arguments were not provided:\n  --max <N>\n\nUsage: conch sema --max <N> <NAME> [CMD]...\n\nFor more information, try '--help'.\n";
        assert_eq!(
            clap_error_line(rendered),
            "the following required arguments were not provided: --max <N> (try --help)"
        );
        let rendered = "error: unexpected argument '--foo' found\n\n  tip: to pass '--foo' as a value, use '-- --foo'\n\nUsage: conch sema <NAME>\n       conch sema --who\n\nFor more information, try '--help'.\n";
        assert_eq!(
            clap_error_line(rendered),
            "unexpected argument '--foo' found; tip: to pass '--foo' as a value, use '-- --foo' (try --help)"
        );
    }
}
