//! `conch`: run commands under cluster-wide semaphores, locks and elections served by conchd.
//!
//! `Cli` parsed → `run() -> anyhow::Result<ExitCode>`. Every failure prints one line,
//! `conch: …`, and exits with the code [`exit`] documents (64 usage, 65 no such thing, 69 no
//! node answered, 75 no slot or lock, 77 no token or no permission, 78 TLS settings, 79 slot,
//! lock or leadership lost while running, 80 hold limit, 81 revoked, 82 quota; otherwise the
//! command's own status).
//!
//! Secrets stay out of sight: `--token` on the command line is refused (the process list shows
//! it to every user), a `--token-file` or `--key` that group or others may read is refused, and
//! the command conch runs does not inherit the variables that hold or name them.

mod auth;
mod backup;
mod barrier;
mod certs;
mod child;
mod cli;
mod cluster;
mod cluster_admin;
mod duration;
mod elect;
mod exit;
mod guard;
mod health;
mod identity;
mod lock;
mod namespace;
mod objects;
mod revoke;
mod runner;
mod sema;
mod status;
mod sync_args;
mod timefmt;
mod waitgroup;
mod watch;
mod who;

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::CommandFactory;
use clap::parser::ValueSource;
use conch_client::{Client, ClientConfig, ClientTls, parse_endpoints};

use crate::cli::{Cli, ClusterCommand, Command};

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_some_and(|a| a == guard::SUBCOMMAND) {
        return guard::main(&args[1..]);
    }
    let (cli, token_on_command_line) = match parse() {
        Ok(parsed) => parsed,
        Err(e) => return clap_exit(e),
    };
    // Before any thread starts and any command runs: the token has been read.
    blank_in_environment_block("CONCH_TOKEN");
    if token_on_command_line {
        eprintln!(
            "conch: --token puts the token where every user of this machine can read it (the \
             process list); use --token-file FILE (chmod 600) or CONCH_TOKEN"
        );
        return ExitCode::from(exit::USAGE);
    }
    init_logging(cli.verbose);
    status::init(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("conch: cannot start the async runtime: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("conch: {e:#}{}", exit::hint(&e));
            ExitCode::from(exit::code_for(&e))
        }
    }
}

/// Overwrites the value of `name` with zero bytes where the kernel keeps this process's
/// environment as it started, which `/proc/<pid>/environ` shows to every process of the same
/// user, the command conch runs among them. Removing the variable would not do: the C library
/// only drops its pointer to that memory. `getenv` then finds it empty. Best effort: where
/// `/proc` cannot be written, the block stays as it was.
#[cfg(target_os = "linux")]
fn blank_in_environment_block(name: &str) {
    if std::env::var_os(name).is_some() {
        let _ = blank_linux(name);
    }
}

#[cfg(not(target_os = "linux"))]
fn blank_in_environment_block(_name: &str) {}

#[cfg(target_os = "linux")]
fn blank_linux(name: &str) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let invalid = || std::io::Error::other("unexpected /proc/self/stat");
    // Field 50 of /proc/self/stat is where the environment block starts; fields from the 3rd
    // follow the command name's closing parenthesis.
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let (_, fields) = stat.rsplit_once(')').ok_or_else(invalid)?;
    let start: u64 = fields
        .split_whitespace()
        .nth(50 - 3)
        .and_then(|f| f.parse().ok())
        .ok_or_else(invalid)?;
    let block = std::fs::read("/proc/self/environ")?;
    let prefix = format!("{name}=");
    let mem = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/self/mem")?;
    let mut offset = 0u64;
    for entry in block.split(|b| *b == 0) {
        if let Some(value) = entry.strip_prefix(prefix.as_bytes())
            && !value.is_empty()
        {
            let at = start + offset + prefix.len() as u64;
            mem.write_all_at(&vec![0u8; value.len()], at)?;
        }
        offset += entry.len() as u64 + 1;
    }
    Ok(())
}

/// Parses the command line; also says whether the token came from it (`--token`) rather than
/// from `CONCH_TOKEN`.
fn parse() -> Result<(Cli, bool), clap::Error> {
    use clap::FromArgMatches;
    let matches = Cli::command().try_get_matches()?;
    let from_command_line = matches.value_source("token") == Some(ValueSource::CommandLine);
    let mut cli = Cli::from_arg_matches(&matches)?;
    if let (Command::Sema(args), Some(("sema", sub))) = (&mut cli.command, matches.subcommand()) {
        args.resolve_members(sub)
            .map_err(|e| Cli::command().error(clap::error::ErrorKind::ValueValidation, e))?;
    }
    Ok((cli, from_command_line))
}

fn clap_exit(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            ExitCode::SUCCESS
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            ExitCode::from(exit::USAGE)
        }
        kind => {
            let rendered = e.render().to_string();
            let mut line = exit::clap_error_line(&rendered);
            if kind == ErrorKind::UnknownArgument {
                line = exit::with_dash_dash_hint(&rendered, line);
            }
            eprintln!("conch: {line}");
            ExitCode::from(exit::USAGE)
        }
    }
}

fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var("CONCH_LOG") {
        Ok(f) if !f.trim().is_empty() => EnvFilter::try_new(f),
        _ => EnvFilter::try_new(match verbose {
            0 => "off",
            1 => "conch=info,conch_client=info",
            2 => "conch=debug,conch_client=debug",
            _ => "trace",
        }),
    };
    let filter = filter.unwrap_or_else(|_| EnvFilter::new("off"));
    use std::io::IsTerminal;
    let colour = colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .try_init();
}

/// Colour in log lines only on a terminal, and never with `NO_COLOR` set to anything but the
/// empty string (no-color.org).
fn colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Writes to stdout; a reader that went away (`conch … | head -1`) is not an error.
pub fn print_out(bytes: &[u8]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Writes lines to stdout (see [`print_out`]).
pub fn print_lines<I: IntoIterator<Item = String>>(lines: I) -> std::io::Result<()> {
    let mut text = String::new();
    for line in lines {
        text.push_str(&line);
        text.push('\n');
    }
    print_out(text.as_bytes())
}

/// Refuses a file of secrets that group or others may read or change (one line, exit 64).
fn private_file(what: &str, path: &std::path::Path) -> anyhow::Result<()> {
    conch_client::private_file::check(path)
        .map_err(|problem| exit::usage(format!("{what}: {problem}")))
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Command::Sema(args) = &cli.command {
        args.validate().map_err(exit::usage)?;
    }
    if let Command::Elect(args) = &cli.command {
        args.validate().map_err(exit::usage)?;
    }
    if let Command::Lock(args) = &cli.command {
        args.validate().map_err(exit::usage)?;
        lock::check_path(&args.path)?;
    }
    if let Command::Completions { shell } = cli.command {
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "conch", &mut script);
        print_out(&script).context("write completions")?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::Certs { command } = cli.command {
        return certs::run(command);
    }

    let endpoints: Vec<String> = parse_endpoints(&cli.endpoints)
        .map_err(|e| exit::usage(format!("--endpoints / CONCH_ENDPOINTS: {e}")))?
        .into_iter()
        .map(|e| e.addr)
        .collect();
    if let Some(key) = &cli.key {
        private_file("--key / CONCH_KEY", key)?;
    }
    if let Some(file) = cli.token_file().filter(|_| cli.token().is_none()) {
        private_file("--token-file / CONCH_TOKEN_FILE", file)?;
    }
    let tls = match &cli.cacert {
        Some(ca) => Some(
            ClientTls::from_files(ca, cli.cert.as_deref(), cli.key.as_deref())
                .map_err(|e| exit::config(e.to_string()))?,
        ),
        None if cli.cert.is_some() || cli.key.is_some() => {
            return Err(exit::config(
                "--cert/--key need --cacert (the CA that signed the nodes' certificates)",
            ));
        }
        None => None,
    };
    let token = match (cli.token(), cli.token_file()) {
        (Some(token), _) => Some(
            conch_client::BearerToken::new(token)
                .map_err(|e| exit::usage(format!("CONCH_TOKEN: {e}")))?,
        ),
        (None, Some(path)) => Some(
            conch_client::BearerToken::from_file(path)
                .map_err(|e| exit::usage(format!("--token-file / CONCH_TOKEN_FILE: {e}")))?,
        ),
        (None, None) => None,
    };
    let config = ClientConfig {
        request_timeout: cli.timeout,
        tls,
        token,
        ..ClientConfig::default()
    };
    let client = Client::connect_with(endpoints, config).await?;

    match cli.command {
        Command::Sema(args) if args.who => {
            who::run(
                &client,
                &args.namespace,
                &args.name,
                args.first_max(),
                args.json,
            )
            .await
        }
        Command::Sema(args) => {
            // Catch the forwarded signals from the start, so a Ctrl-C while waiting cancels
            // the wait cleanly instead of leaving a waiter behind until the TTL.
            let mut signals = child::Signals::install().context("install signal handlers")?;
            sema::run(&client, &args, &mut signals).await
        }
        Command::Lock(args) if args.who => lock::who(&client, &args).await,
        Command::Lock(args) => {
            let mut signals = child::Signals::install().context("install signal handlers")?;
            lock::run(&client, &args, &mut signals).await
        }
        Command::Cluster {
            command: ClusterCommand::Status { json },
        } => health::status(&client, json).await,
        Command::Cluster { command } => cluster_admin::change(&client, command).await,
        Command::Auth { command } => auth::run(&client, command).await,
        Command::Elect(args) if args.who => elect::who(&client, &args).await,
        Command::Elect(args) if args.observe => elect::observe(&client, &args).await,
        Command::Elect(args) => {
            let mut signals = child::Signals::install().context("install signal handlers")?;
            elect::run(&client, &args, &mut signals).await
        }
        Command::Namespace { command } => namespace::run(&client, command).await,
        Command::WaitGroup { command } => waitgroup::run(&client, command).await,
        Command::Barrier { command } => barrier::run(&client, command).await,
        Command::Revoke { command } => revoke::run(&client, command).await,
        Command::Audit(args) => revoke::audit(&client, &args).await,
        Command::List { what } => objects::list(&client, what).await,
        Command::Delete { what } => objects::delete(&client, what).await,
        Command::Completions { .. } | Command::Certs { .. } => Ok(ExitCode::SUCCESS),
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(super::colour(true, None));
        assert!(super::colour(true, Some(OsStr::new(""))));
        assert!(!super::colour(true, Some(OsStr::new("1"))));
        assert!(!super::colour(false, None));
        assert!(!super::colour(false, Some(OsStr::new("1"))));
    }
}
