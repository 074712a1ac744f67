//! The book stays true to the programs and to itself: its CLI reference is what `conch` and
//! `conchd` print for `--help`, and every link in it (and in the README) resolves. Both run the
//! `xtask` program as a developer would.

use std::path::Path;
use std::process::{Command, Output};

fn xtask(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .output()
        .expect("run xtask")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_cli_reference_is_what_the_programs_print() {
    let out = xtask(&["cli-docs", "--check"]);
    assert!(
        out.status.success(),
        "docs/src/cli-reference.md is stale: {}",
        stderr(&out)
    );
}

#[test]
fn a_stale_cli_reference_fails_naming_the_command_that_regenerates_it() {
    let root = tempfile::tempdir().expect("tempdir");
    let file = root.path().join("docs/src/cli-reference.md");
    std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
    let root_arg = root.path().to_str().expect("utf-8 path");
    let written = xtask(&["cli-docs", "--root", root_arg]);
    assert!(written.status.success(), "{}", stderr(&written));
    let text = std::fs::read_to_string(&file).expect("written");
    for needle in [
        "## `conch`",
        "### `conch sema`",
        "### `conch cluster status`",
        "## `conchd`",
        "--endpoints",
        "--data-dir",
    ] {
        assert!(text.contains(needle), "{needle} missing from the reference");
    }
    assert!(
        xtask(&["cli-docs", "--check", "--root", root_arg])
            .status
            .success()
    );

    std::fs::write(&file, text.replacen("--endpoints", "--endpoint", 1)).expect("edit");
    let checked = xtask(&["cli-docs", "--check", "--root", root_arg]);
    assert!(!checked.status.success());
    assert!(
        stderr(&checked).contains("cargo run -p xtask -- cli-docs"),
        "{}",
        stderr(&checked)
    );
}

#[test]
fn every_link_of_the_book_and_the_readme_resolves() {
    let out = xtask(&["doc-links"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_broken_link_or_anchor_fails_naming_where_it_is() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = root.path().join("docs/src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let write = |path: &Path, text: &str| std::fs::write(path, text).expect("write");
    write(
        &src.join("SUMMARY.md"),
        "# Summary\n\n- [A](a.md)\n- [B](b.md)\n",
    );
    write(
        &src.join("a.md"),
        "# A\n\n## Going on\n\nSee [b](b.md#the-end) and [here](#going-on).\n",
    );
    write(&src.join("b.md"), "# B\n\n## The end\n");
    write(
        &root.path().join("README.md"),
        "Read [the book](docs/src/a.md#going-on).\n",
    );
    let root_arg = root.path().to_str().expect("utf-8 path");
    let good = xtask(&["doc-links", "--root", root_arg]);
    assert!(good.status.success(), "{}", stderr(&good));

    write(
        &src.join("a.md"),
        "# A\n\nSee [b](b.md#no-such) and [c](c.md).\n",
    );
    write(&src.join("orphan.md"), "# Orphan\n");
    let bad = xtask(&["doc-links", "--root", root_arg]);
    assert!(!bad.status.success());
    let err = stderr(&bad);
    for needle in [
        "docs/src/a.md:3: broken link (b.md#no-such)",
        "docs/src/a.md:3: broken link (c.md)",
        "README.md:1: broken link (docs/src/a.md#going-on)",
        "docs/src/orphan.md: not in docs/src/SUMMARY.md",
    ] {
        assert!(err.contains(needle), "{needle} not in: {err}");
    }
}
