//! Release helpers for `make dist`: man pages and shell completions generated from the clap
//! definitions of `conch` and `conchd`, so that they always match the programs' `--help`.
//!
//! ```text
//! xtask man DIR [--date YYYY-MM-DD]   DIR/man1/conch.1, conch-<subcommand>….1, conchd.1
//! xtask completions DIR               DIR/{bash,zsh,fish}/… for conch and conchd
//! xtask cli-docs [--check]            docs/src/cli-reference.md: every command's --help
//! xtask doc-links                     every relative link and #anchor of the book and README
//! ```
//!
//! `cli-docs` and `doc-links` work on the workspace this crate is in, or with `--root DIR` on
//! another tree laid out the same way.
//!
//! A crate of its own (not a hidden subcommand of the programs) so that the man page generator
//! never enters the shipped binaries' dependency trees. The `conch` and `conchd` definitions are
//! the programs' own source files, compiled in here as modules.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;

// The CLI definition of `conch` and the one module it uses. Only the clap types are used here.
// Its re-exports name every subcommand type for the conch binary; only some are used here.
#[allow(dead_code, unused_imports)]
#[path = "../../client/src/bin/conch/cli/mod.rs"]
mod cli;
#[allow(dead_code)]
#[path = "../../client/src/bin/conch/duration.rs"]
mod duration;
#[path = "../../client/src/bin/conch/sync_args.rs"]
mod sync_args;
// The command line of `conchd`, likewise.
#[allow(dead_code)]
#[path = "../../daemon/src/cli/flags.rs"]
mod conchd_flags;

const USAGE: &str = "usage: xtask man DIR [--date YYYY-MM-DD] | xtask completions DIR | \
                     xtask cli-docs [--check] [--root DIR] | xtask doc-links [--root DIR]";

/// The shells completions are shipped for, with the file name each one's loader looks for.
const SHELLS: [(Shell, &str, &str); 3] = [
    (Shell::Bash, "bash", ""),
    (Shell::Zsh, "zsh", "_"),
    (Shell::Fish, "fish", ""),
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    let root = match args.iter().position(|&a| a == "--root") {
        Some(i) if i + 1 < args.len() => {
            let dir = PathBuf::from(args[i + 1]);
            args.drain(i..=i + 1);
            dir
        }
        Some(_) => {
            eprintln!("xtask: --root needs a directory; {USAGE}");
            return ExitCode::from(64);
        }
        None => workspace_root(),
    };
    let result = match args.as_slice() {
        ["cli-docs"] => cli_docs(&root, false),
        ["cli-docs", "--check"] => cli_docs(&root, true),
        ["doc-links"] => doc_links(&root),
        ["man", dir] => man(Path::new(dir), ""),
        ["man", dir, "--date", date] => man(Path::new(dir), date),
        ["completions", dir] => completions(Path::new(dir)),
        _ => {
            eprintln!("xtask: {USAGE}");
            return ExitCode::from(64);
        }
    };
    match result {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace this crate belongs to.
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Writes (or checks) the book's CLI reference; returns the file.
fn cli_docs(root: &Path, check: bool) -> std::io::Result<Vec<PathBuf>> {
    xtask::cli_docs::run(root, &[conch(), conchd()], check)
        .map(|path| vec![path])
        .map_err(std::io::Error::other)
}

/// Checks every link of the book and the README; prints how many, or fails listing the broken.
fn doc_links(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    match xtask::doc_links::check(root) {
        Ok(n) => {
            eprintln!("xtask: {n} links of the book and the README resolve");
            Ok(Vec::new())
        }
        Err(problems) => Err(std::io::Error::other(format!(
            "{} broken in the book or the README:\n{}",
            problems.len(),
            problems.join("\n")
        ))),
    }
}

fn conch() -> clap::Command {
    cli::Cli::command()
}

fn conchd() -> clap::Command {
    conchd_flags::Flags::command()
}

/// Writes the man pages, all in section 1 (the systemd unit's documentation link is
/// `man:conchd(1)`): `conch`, each of its subcommands, and `conchd`. Returns the files written.
fn man(dir: &Path, date: &str) -> std::io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let mut conch = conch().disable_help_subcommand(true);
    conch.build();
    man_tree(&conch, &dir.join("man1"), "1", date, &mut written)?;
    let mut conchd = conchd().disable_help_subcommand(true);
    conchd.build();
    man_tree(&conchd, &dir.join("man1"), "1", date, &mut written)?;
    Ok(written)
}

/// One page for `cmd` and one for each visible subcommand, recursively (`conch-cluster-status`).
fn man_tree(
    cmd: &clap::Command,
    dir: &Path,
    section: &str,
    date: &str,
    written: &mut Vec<PathBuf>,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let page = clap_mangen::Man::new(cmd.clone())
        .section(section)
        .date(date)
        .source(format!("conch {}", conch_client::proto::VERSION))
        .manual("conch manual");
    let mut text = Vec::new();
    page.render(&mut text)?;
    let path = dir.join(page.get_filename());
    write_file(&path, &text)?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        man_tree(sub, dir, section, date, written)?;
    }
    Ok(())
}

/// Writes the completion scripts of both programs for bash, zsh and fish: `DIR/bash/conch`,
/// `DIR/zsh/_conch`, `DIR/fish/conch.fish`, and the same for conchd.
fn completions(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for (name, make) in [("conch", conch as fn() -> _), ("conchd", conchd)] {
        for (shell, sub, prefix) in SHELLS {
            let mut text = Vec::new();
            clap_complete::generate(shell, &mut make(), name, &mut text);
            let file = match shell {
                Shell::Fish => format!("{prefix}{name}.fish"),
                _ => format!("{prefix}{name}"),
            };
            let path = dir.join(sub).join(file);
            std::fs::create_dir_all(dir.join(sub))?;
            write_file(&path, &text)?;
            written.push(path);
        }
    }
    Ok(written)
}

fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    f.write_all(bytes)?;
    f.flush()
}
