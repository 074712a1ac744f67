//! The shape of the source a newcomer reads (the book, Development, "The code's shape"):
//! - no source file of `daemon/src` or `client/src` is longer than [`MAX_LINES`] lines, so each
//!   holds one concept that can be read whole. Test code (a module declared under
//!   `#[cfg(test)]`, such as `state/tests.rs`) and generated code are exempt;
//! - a gRPC `Status` is built from its parts (`Status::new`, `Status::with_*`) only in
//!   `daemon/src/api/status.rs`, the one map from conch's errors to status codes; tests aside.
//!
//! Files and modules are read as the layer test reads them (`layers.rs`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::layers::{Crate, test_flags, tokens};

/// The longest a source file may be.
const MAX_LINES: usize = 800;

/// Files over [`MAX_LINES`] that are being split as this list is written, relative to the
/// workspace. Each entry is TEMPORARY: it goes when its file is split, and an entry whose file
/// is back under the limit (or gone) fails the test, so the list only shrinks.
const TEMPORARY_OVERSIZE: &[&str] = &[];

/// The crates whose trees tell test modules apart, by their root files.
const ROOTS: [&str; 4] = [
    "daemon/src/lib.rs",
    "daemon/src/main.rs",
    "client/src/lib.rs",
    "client/src/bin/conch/main.rs",
];

/// The folders whose files are held to the rules.
const SOURCE_DIRS: [&str; 2] = ["daemon/src", "client/src"];

/// The file that builds statuses.
const STATUS_MAP: &str = "daemon/src/api/status.rs";

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the daemon crate lies in the workspace")
}

/// Every `.rs` file under the source folders that is not test code, relative to the workspace.
/// A file no crate declares counts as code.
fn code_files() -> Vec<PathBuf> {
    let workspace = workspace();
    let mut test_files = BTreeSet::new();
    for root in ROOTS {
        let tree = Crate::read(workspace, &workspace.join(root));
        for module in &tree.tests {
            test_files.insert(tree.files[module].clone());
        }
    }
    let mut files = Vec::new();
    for dir in SOURCE_DIRS {
        rust_files(&workspace.join(dir), &mut files);
    }
    files.sort();
    files
        .into_iter()
        .filter(|f| !test_files.contains(f))
        .map(|f| f.strip_prefix(workspace).unwrap_or(&f).to_path_buf())
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn read(file: &Path) -> String {
    let path = workspace().join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Generated code says so in its first lines, as generators mark it.
fn generated(text: &str) -> bool {
    text.lines().take(5).any(|l| l.contains("@generated"))
}

#[test]
fn no_source_file_is_longer_than_the_limit() {
    let mut problems = Vec::new();
    let mut listed_and_long = BTreeSet::new();
    for file in code_files() {
        let text = read(&file);
        if generated(&text) {
            continue;
        }
        let lines = text.lines().count();
        let name = file.to_string_lossy().into_owned();
        let listed = TEMPORARY_OVERSIZE.contains(&name.as_str());
        if lines > MAX_LINES {
            if listed {
                listed_and_long.insert(name);
            } else {
                problems.push(format!(
                    "{name}: {lines} lines; split it along its concepts (at most {MAX_LINES})"
                ));
            }
        }
    }
    for listed in TEMPORARY_OVERSIZE {
        if !listed_and_long.contains(*listed) {
            problems.push(format!(
                "{listed} is no longer over {MAX_LINES} lines (or is gone): remove it from \
                 TEMPORARY_OVERSIZE"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// `Status::new(` or `Status::with_…(` outside test code: each as `line`.
fn status_constructors(text: &str) -> Vec<usize> {
    let tokens = tokens(text);
    let in_test = test_flags(&tokens);
    let mut found = Vec::new();
    for (i, window) in tokens.windows(3).enumerate() {
        let constructor = window[0].text == "Status"
            && window[1].text == "::"
            && (window[2].text == "new" || window[2].text.starts_with("with_"));
        if constructor && !in_test[i] {
            found.push(window[0].line);
        }
    }
    found
}

#[test]
fn statuses_are_built_only_in_the_status_map() {
    let mut found = Vec::new();
    for file in code_files() {
        let name = file.to_string_lossy().into_owned();
        if name == STATUS_MAP || !name.starts_with("daemon/src/") {
            continue;
        }
        let text = read(&file);
        if generated(&text) {
            continue;
        }
        for line in status_constructors(&text) {
            found.push(format!("{name}:{line}"));
        }
    }
    assert!(
        found.is_empty(),
        "a Status built outside {STATUS_MAP} (give the error an ApiError variant there):\n{}",
        found.join("\n")
    );
}

#[test]
fn status_constructors_are_found_outside_tests_only() {
    let source = "fn a() -> Status { tonic::Status::new(Code::Internal, \"x\") }\n\
                  fn b() { let s = Status::with_details(c, m, d); let t = Status::internal(m); }\n\
                  #[cfg(test)]\nmod tests { fn c() { Status::new(code, \"refused\"); } }\n";
    assert_eq!(status_constructors(source), [1, 2]);
}
