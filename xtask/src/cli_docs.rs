//! The book's CLI reference (`docs/src/cli-reference.md`), generated from the clap definitions of
//! `conch` and `conchd`: every command's and subcommand's `--help`, so it cannot drift from the
//! programs. `xtask cli-docs` writes it; `xtask cli-docs --check` fails while the committed file
//! differs from what would be written.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Where the reference lives, relative to the workspace root.
pub const FILE: &str = "docs/src/cli-reference.md";

/// The command that rewrites the reference, for the messages that ask for it.
pub const REGENERATE: &str = "cargo run -p xtask -- cli-docs";

/// The width help text is wrapped at, whatever the terminal of whoever generates it.
const WIDTH: usize = 100;

/// The reference for the two programs, in the order given.
pub fn render(programs: &[clap::Command]) -> String {
    let mut out = String::new();
    out.push_str(
        "# CLI reference\n\n\
         <!-- Generated from the programs' clap definitions by `cargo run -p xtask -- cli-docs`:\n\
         \x20    do not edit by hand (a test fails while this file differs from what it writes). -->\n\n\
         Every command's `--help`, as the programs print it. [The conch CLI](cli.md) explains the\n\
         commands with examples, exit statuses and what happens when a slot is lost; [Running a\n\
         cluster](running.md) explains `conchd`'s flags. The same text is in the man pages\n\
         (`man conch-sema`, `man conchd`) that the release artifacts ship.\n",
    );
    for program in programs {
        let mut cmd = prepare(program.clone());
        cmd.build();
        let mut toc = String::new();
        let mut body = String::new();
        section(&cmd, &[], &mut toc, &mut body);
        let toc = if toc.is_empty() { toc } else { toc + "\n" };
        let _ = write!(out, "\n## `{}`\n\n{toc}{body}", cmd.get_name());
    }
    out
}

/// Fixes what would make the text depend on who generates it: the terminal's width and the
/// values of the `CONCH_*` variables in the environment.
fn prepare(cmd: clap::Command) -> clap::Command {
    let cmd = cmd
        .term_width(WIDTH)
        .max_term_width(WIDTH)
        .disable_help_subcommand(true)
        .mut_args(|a| a.hide_env_values(true));
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    names
        .into_iter()
        .fold(cmd, |cmd, name| cmd.mut_subcommand(name, prepare))
}

/// One heading and help block for `cmd`, then one for each visible subcommand, depth first.
fn section(cmd: &clap::Command, parents: &[&str], toc: &mut String, body: &mut String) {
    let mut path: Vec<&str> = parents.to_vec();
    path.push(cmd.get_name());
    let title = path.join(" ");
    if parents.is_empty() {
        let _ = writeln!(body, "```text\n{}```", help(cmd));
    } else {
        let depth = "  ".repeat(parents.len() - 1);
        let _ = writeln!(toc, "{depth}- [`{title}`](#{})", anchor(&title));
        let _ = writeln!(body, "\n### `{title}`\n\n```text\n{}```", help(cmd));
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        section(sub, &path, toc, body);
    }
}

/// `cmd --help` as plain text, trailing spaces removed, ending in one newline.
fn help(cmd: &clap::Command) -> String {
    let text = cmd.clone().render_long_help().to_string();
    let mut out = String::new();
    for line in text.trim_end().lines() {
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The anchor mdBook and GitHub give a heading: lower case, spaces as `-`, other punctuation
/// dropped.
pub fn anchor(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

/// Writes the reference under `root`, or with `check` compares it with the file there. Returns
/// the file's path.
pub fn run(root: &Path, programs: &[clap::Command], check: bool) -> Result<PathBuf, String> {
    let path = root.join(FILE);
    let text = render(programs);
    if check {
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != text {
            return Err(format!(
                "{} differs from the programs' --help (a flag or its help changed); \
                 regenerate it with `{REGENERATE}` and commit it",
                path.display()
            ));
        }
        return Ok(path);
    }
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}
