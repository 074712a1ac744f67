//! `conchd`: flags -> Config -> run, through the same [`ConchNode`] an embedding program uses.
//!
//! Exit status: 0 after a clean stop; 64 (usage) for a bad flag, environment variable or config
//! file value, before anything is bound or opened, and for a data directory that belongs to
//! another node or cluster or that another process has open; 1 for any other startup or
//! serving failure (port taken, damaged data directory); 74 when the node's storage fails while
//! serving (the disk is full, an I/O error: restart it once the disk is fine) or its Raft core
//! stops on an internal error; 78 once the node was removed from its cluster, and for a start
//! on a removed node's data directory. Every failure is one line on stderr.
//!
//! A service manager may pass the listening sockets (systemd socket activation: `LISTEN_FDS`,
//! names `client`, `peer`, `metrics`; see `conchd::net::listen_fds`): each replaces its flag's
//! address. Sockets that cannot be used (meant for another pid, names or counts that do not
//! match) exit 64 too.
//!
//! `conchd restore …` seeds a data directory from a backup instead of serving (see `restore`).

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use conchd::ConchNode;
use conchd::base::notify;
use conchd::config::{Config, LogFormat};
use conchd::net::listen_fds::{self, Inherited, ListenFdsError};
use conchd::raft::removal::{EXIT_REMOVED, Removed};
use conchd::raft::storage_fault::{self, EXIT_STORAGE, StorageFailed};
use conchd::server::StartError;
use flags::{Command, Flags};

// The command line (also compiled into `xtask` for the man page and completions).
#[path = "cli/flags.rs"]
mod flags;

/// Exit status of a usage error: a bad flag or configuration value.
const EXIT_USAGE: u8 = 64;

fn main() -> ExitCode {
    one_malloc_arena();
    let parsed = Flags::command()
        .try_get_matches()
        .and_then(|matches| Flags::from_arg_matches(&matches).map(|flags| (flags, matches)));
    let (mut flags, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(e) if e.use_stderr() => {
            eprintln!("conchd: {}", usage_line(&e));
            return ExitCode::from(EXIT_USAGE);
        }
        Err(e) => {
            // --help, --version: clap's own output on stdout.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    if let Some(command) = &flags.command {
        // `conchd --id 2 restore …` would otherwise restore with the subcommand's own --id
        // (or none) and silently drop the 2.
        let before = flags_given_on_the_command_line(&matches);
        if !before.is_empty() {
            eprintln!(
                "conchd: {} given before `restore` would not be used by it; put them after it \
                 (see conchd restore --help)",
                before.join(", ")
            );
            return ExitCode::from(EXIT_USAGE);
        }
        return run_command(command);
    }
    let inherited = match inherited_listeners(&mut flags) {
        Ok(inherited) => inherited,
        Err(e) => {
            eprintln!("conchd: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let config = match configure(flags) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("conchd: {}", blame_environment(&one_line(&e), &matches));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    raise_open_file_limit();
    match run(config, inherited) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("conchd: {}", one_line(&e));
            if e.downcast_ref::<StorageFailed>().is_some() {
                ExitCode::from(EXIT_STORAGE)
            } else if e.downcast_ref::<Removed>().is_some()
                || e.downcast_ref::<StartError>()
                    .is_some_and(StartError::is_removed)
            {
                ExitCode::from(EXIT_REMOVED)
            } else if e
                .downcast_ref::<StartError>()
                .is_some_and(StartError::is_usage)
            {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Has glibc's malloc keep one arena for every thread, unless `MALLOC_ARENA_MAX` or
/// `GLIBC_TUNABLES` say otherwise. With an arena per thread (glibc's default, up to eight per
/// core), memory one thread freed is reused only by the threads of its arena: the buffers a
/// burst of calls left on one runtime thread stayed with the node while the next burst grew
/// another arena. With one, a node holding 10 000 waiting calls after 10 000 finished ones
/// measured 113-118 MB instead of 124-132 MB (W5, the book's Memory and disk), with no
/// throughput lost at 64 clients: each thread's cache of small blocks still serves most
/// allocations without the arena's lock.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none()
        && !std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("arena_max"))
    {
        // SAFETY: called first thing in `main`, before any other thread exists and before
        // this program allocates anything that depends on the setting. A refusal (0) leaves
        // glibc's default, which is still correct.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    }
}

/// Raises the soft limit on open files to the hard one: every client connection is a file, and
/// a soft limit of 1 024 (a common default) would refuse connections long before the node's own
/// limit (see the book, Operations, "One client cannot take a node"). A failure is logged and changes
/// nothing.
fn raise_open_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!(soft, hard, error = %e, "could not raise the open-file limit");
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "could not read the open-file limit"),
    }
}

/// Takes the listening sockets a service manager passed, and removes its variables so no child
/// inherits them; each socket's address replaces its flag (`--listen`, `--peer-listen`,
/// `--metrics-listen`).
fn inherited_listeners(flags: &mut Flags) -> Result<Inherited, ListenFdsError> {
    // SAFETY: no thread has been started yet.
    let vars = unsafe { listen_fds::Vars::take_from_env() };
    let roles = listen_fds::roles(&vars, std::process::id())?;
    // SAFETY: `roles` checked that the descriptors were passed to this process, and nothing in
    // it has touched them yet.
    let inherited = unsafe { listen_fds::take(&roles)? };
    let addr = |listener| Inherited::addr(listener).map(|a| a.to_string());
    if let Some(a) = addr(&inherited.client) {
        flags.settings.listen = Some(a);
    }
    if let Some(a) = addr(&inherited.peer) {
        flags.settings.peer_listen = Some(a);
    }
    if let Some(a) = addr(&inherited.metrics) {
        flags.settings.metrics_listen = Some(a);
    }
    Ok(inherited)
}

/// Runs a subcommand: one line on stdout when done, one line on stderr when not (exit 64 when
/// it was refused before anything was written, 1 when writing failed).
fn run_command(command: &Command) -> ExitCode {
    let Command::Restore(flags) = command;
    let args = flags.to_args();
    match conchd::raft::restore::run(&args) {
        Ok(r) => {
            let name = args
                .cluster_name
                .as_ref()
                .map(|name| format!(" ({name:?})"))
                .unwrap_or_default();
            println!(
                "conchd: restored log index {} (term {}), state hash {:016x}, into {} as node {} of cluster {}{name}",
                r.applied_index,
                r.applied_term,
                r.state_hash,
                args.data_dir.display(),
                args.id,
                r.cluster_id
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("conchd: restore: {}", e.to_string().replace('\n', " "));
            match e {
                conchd::raft::restore::RestoreError::Refused(_) => ExitCode::from(EXIT_USAGE),
                conchd::raft::restore::RestoreError::Failed(_) => ExitCode::FAILURE,
            }
        }
    }
}

/// clap's error as one line: its first line without the `error: ` prefix, and where to look.
/// The serving flags written on the command line (not taken from the environment), as `--name`.
fn flags_given_on_the_command_line(matches: &clap::ArgMatches) -> Vec<String> {
    let command = Flags::command();
    matches
        .ids()
        // `ids` also names the struct's argument group; only real flags count.
        .filter(|id| command.get_arguments().any(|arg| arg.get_id() == *id))
        .filter(|id| matches.value_source(id.as_str()) == Some(ValueSource::CommandLine))
        .map(|id| format!("--{}", id.as_str().replace('_', "-")))
        .collect()
}

fn usage_line(e: &clap::Error) -> String {
    // clap's message is its first paragraph; the lines under it (e.g. the missing arguments,
    // indented) belong to it. The usage and tips that follow are left to --help.
    let rendered = e.render().to_string();
    let paragraph: Vec<&str> = rendered
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .map(str::trim)
        .collect();
    let message = paragraph.join(" ");
    let message = message.strip_prefix("error: ").unwrap_or(&message);
    let message = if message.is_empty() {
        "invalid arguments"
    } else {
        message
    };
    match from_environment(e) {
        Some(variable) => format!("{message}, set by the environment variable {variable}"),
        None => format!("{message} (see conchd --help)"),
    }
}

/// The environment variable a refused value came from, when it came from one: the flag clap
/// names is not on the command line and its variable is set.
fn from_environment(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    let Some(ContextValue::String(invalid)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let long = invalid.split_whitespace().next()?.strip_prefix("--")?;
    let command = Flags::command();
    let arg = command
        .get_arguments()
        .find(|a| a.get_long() == Some(long))?;
    let variable = arg.get_env()?.to_string_lossy().into_owned();
    let on_command_line =
        std::env::args().any(|a| a == format!("--{long}") || a.starts_with(&format!("--{long}=")));
    (!on_command_line && std::env::var_os(&variable).is_some()).then_some(variable)
}

/// A refused setting's message (which starts with the flag it is about, e.g. `--listen nowhere:
/// …`), naming the environment variable the value came from when it came from one: the
/// operator who set `CONCH_LISTEN` looks for that, not for a flag they never typed.
fn blame_environment(message: &str, matches: &clap::ArgMatches) -> String {
    let flag: String = message
        .strip_prefix("--")
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect()
        })
        .unwrap_or_default();
    let command = Flags::command();
    let variable = command
        .get_arguments()
        .find(|a| !flag.is_empty() && a.get_long() == Some(flag.as_str()))
        .filter(|a| matches.value_source(a.get_id().as_str()) == Some(ValueSource::EnvVariable))
        .and_then(|a| a.get_env())
        .map(|v| v.to_string_lossy().into_owned());
    match variable {
        Some(variable) => format!("{message} (set by the environment variable {variable})"),
        None => message.to_string(),
    }
}

/// The error and its causes on one line, each cause said once (a message that already quotes
/// its cause does not repeat it).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line.replace('\n', " ")
}

/// Everything that can only fail because of what the operator wrote: the configuration and the
/// log filter.
fn configure(flags: Flags) -> anyhow::Result<Arc<Config>> {
    let config = Config::from_settings(flags.settings)?;
    init_logging(&config.log, config.log_format)?;
    Ok(Arc::new(config))
}

fn run(config: Arc<Config>, inherited: Inherited) -> anyhow::Result<()> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = config.worker_threads {
        builder.worker_threads(threads);
    }
    let runtime = builder
        .enable_all()
        .build()
        .context("start the async runtime")?;
    runtime.block_on(async move {
        // Install the handlers first: a signal during startup must stop, not kill, the node.
        let shutdown = shutdown_signal()?;
        let node = ConchNode::start_inherited(Arc::clone(&config), inherited).await?;
        // SIGHUP re-reads the TLS files at once (the node also polls them).
        let hangup = reload_tls_on_hangup(&node)?;
        let data_dir =
            std::fs::canonicalize(&config.data_dir).unwrap_or_else(|_| config.data_dir.clone());
        let listening = node.local_addr().to_string();
        let metrics = node
            .metrics_addr()
            .map(|a| format!(", metrics on http://{a}/metrics"))
            .unwrap_or_default();
        let who = match config.peer_listen {
            Some(peers) => format!("clients; peers on {peers}"),
            None => "clients and peers".to_string(),
        };
        println!(
            "conchd: node {} listening on {listening} ({who}), data in {}{metrics}",
            config.id,
            data_dir.display()
        );
        if let Some(ui) = node.ui_addr() {
            let scheme = if config.tls.is_some() {
                "https"
            } else {
                "http"
            };
            println!("conchd: status page on {scheme}://{ui}/ui/");
        }
        notify::ready(&format!("node {} serving on {listening}", config.id));
        // Removed from the cluster, the node stops as on SIGTERM, then exits with its own code.
        let removed = conchd::jobs::retire::removed(Arc::clone(node.node()));
        let mut removal = None;
        let shutdown = async {
            tokio::select! {
                () = shutdown => {}
                removed = removed => removal = Some(removed),
            }
            notify::stopping();
        };
        // A storage failure stops the node at once: its Raft core is gone for good.
        let failed = storage_fault::failed(config.id, node.node().raft.clone());
        let served = tokio::select! {
            served = node.run_until(shutdown) => served,
            failure = failed => return Err(failure.into()),
        };
        hangup.abort();
        served?;
        if let Some(removed) = removal {
            return Err(removed.into());
        }
        tracing::info!("stopped");
        Ok(())
    })
}

fn init_logging(filter: &str, format: LogFormat) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .with_context(|| format!("--log {filter:?}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(colour_on_stderr()).init(),
        // One JSON object per line: timestamp, level, target, message and fields at the top.
        LogFormat::Json => builder.json().flatten_event(true).with_ansi(false).init(),
    }
    Ok(())
}

/// Colour in log lines only on a terminal, and never with `NO_COLOR` set (no-color.org).
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    )
}

/// Colour on a `terminal` unless `NO_COLOR` is set to anything but the empty string.
fn colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Re-reads the node's TLS files on every SIGHUP, until aborted.
fn reload_tls_on_hangup(node: &ConchNode) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = signal(SignalKind::hangup()).context("install the SIGHUP handler")?;
    let tls = node.node().config.tls.clone();
    Ok(tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            match &tls {
                // The outcome is logged by the reload itself.
                Some(tls) => {
                    let _ = tls.reload_now();
                }
                None => tracing::info!("SIGHUP: this node serves no TLS; nothing to reload"),
            }
        }
    }))
}

/// Resolves on the first SIGTERM or SIGINT.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("install the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("install the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every environment variable conchd reads is in the book's list of them (Running a cluster).
    #[test]
    fn the_book_lists_every_environment_variable() {
        let chapter = include_str!("../../docs/src/running.md");
        let list = chapter
            .split("Every flag has an environment variable")
            .nth(1)
            .and_then(|rest| rest.split("Precedence:").next())
            .expect("the list of environment variables in docs/src/running.md");
        let command = Flags::command();
        let mut checked = 0;
        for arg in command.get_arguments() {
            if let Some(variable) = arg.get_env() {
                let variable = variable.to_string_lossy();
                assert!(
                    list.contains(&format!("`{variable}`")),
                    "{variable} is not in the list of docs/src/running.md"
                );
                checked += 1;
            }
        }
        assert!(checked >= 25, "{checked} variables");
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))));
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
    }

    #[test]
    fn a_refused_value_from_the_environment_names_the_variable() {
        let matches = Flags::command()
            .try_get_matches_from(["conchd", "--data-dir", "/x"])
            .expect("parses");
        assert_eq!(
            blame_environment("--data-dir /x: is a file", &matches),
            "--data-dir /x: is a file"
        );
        // SAFETY: no other test of this binary reads the environment or starts threads that do.
        unsafe { std::env::set_var("CONCH_LISTEN", "nowhere") };
        let matches = Flags::command().try_get_matches_from(["conchd"]);
        unsafe { std::env::remove_var("CONCH_LISTEN") };
        let matches = matches.expect("parses");
        assert_eq!(
            blame_environment("--listen nowhere: no such host", &matches),
            "--listen nowhere: no such host (set by the environment variable CONCH_LISTEN)"
        );
        // A message about another flag blames nothing.
        assert_eq!(
            blame_environment("--advertise x: bad", &matches),
            "--advertise x: bad"
        );
    }
}
