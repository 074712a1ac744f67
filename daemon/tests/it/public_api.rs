//! The public API is what the book lists (docs/src/clients.md, "The public API, item by item"):
//! each crate's root exports exactly the items of its table. An item added, renamed or dropped
//! at a root fails this test until the table says so; modules marked `#[doc(hidden)]` (reached
//! by the binary, the simulator and the tests, not part of the API) and `#[cfg(test)]` ones are
//! not exported.

use std::collections::BTreeSet;
use std::path::Path;

/// The book's chapter holding the tables.
const CHAPTER: &str = "docs/src/clients.md";

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the daemon crate lies in the workspace")
}

fn read(relative: &str) -> String {
    let path = workspace().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The names a crate root exports: its `pub mod` and `pub use` items, but for those under
/// `#[doc(hidden)]` or `#[cfg(test)]`.
fn exported(lib_rs: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut hidden = false;
    let mut statement = String::new();
    for line in lib_rs.lines().map(str::trim) {
        if line.starts_with("#[doc(hidden)]") || line.starts_with("#[cfg(test)]") {
            hidden = true;
            continue;
        }
        if line.starts_with("#[") || line.starts_with("//") {
            continue;
        }
        if statement.is_empty() && !line.starts_with("pub ") {
            hidden = false;
            continue;
        }
        statement.push_str(line);
        statement.push(' ');
        if !line.ends_with(';') {
            continue;
        }
        let item = std::mem::take(&mut statement);
        if std::mem::take(&mut hidden) {
            continue;
        }
        names.extend(names_of(item.trim()));
    }
    names
}

/// The names one `pub mod …;` or `pub use …;` statement exports.
fn names_of(item: &str) -> Vec<String> {
    if let Some(module) = item.strip_prefix("pub mod ") {
        return vec![module.trim_end_matches(';').trim().to_string()];
    }
    let Some(path) = item.strip_prefix("pub use ") else {
        return Vec::new();
    };
    let path = path.trim_end_matches(';').trim();
    let listed = match (path.find('{'), path.rfind('}')) {
        (Some(open), Some(close)) => path[open + 1..close].split(',').collect(),
        _ => vec![path],
    };
    listed
        .into_iter()
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(|name| match name.split_once(" as ") {
            Some((_, alias)) => alias.trim().to_string(),
            None => name.rsplit("::").next().unwrap_or(name).to_string(),
        })
        .collect()
}

/// The items of the chapter's table for `krate`: the first cell of each row between
/// `<!-- public-api:krate -->` and `<!-- /public-api -->`.
fn listed(chapter: &str, krate: &str) -> BTreeSet<String> {
    let start = format!("<!-- public-api:{krate} -->");
    let table = chapter
        .split_once(&start)
        .and_then(|(_, rest)| rest.split_once("<!-- /public-api -->"))
        .map(|(table, _)| table)
        .unwrap_or_else(|| panic!("{CHAPTER} has no {start} table"));
    table
        .lines()
        .filter_map(|row| row.strip_prefix("| `"))
        .filter_map(|row| row.split_once('`'))
        .map(|(name, _)| name.to_string())
        .collect()
}

fn same(krate: &str, lib_rs: &str) {
    let chapter = read(CHAPTER);
    let exported = exported(&read(lib_rs));
    let listed = listed(&chapter, krate);
    let unlisted: Vec<_> = exported.difference(&listed).collect();
    let gone: Vec<_> = listed.difference(&exported).collect();
    assert!(
        unlisted.is_empty() && gone.is_empty(),
        "{lib_rs} exports {unlisted:?} which {CHAPTER} does not list, and {CHAPTER} lists \
         {gone:?} which {lib_rs} does not export: say in the table what an item is, or make it \
         private to its crate"
    );
}

#[test]
fn the_daemon_crate_exports_what_the_book_lists() {
    same("conchd", "daemon/src/lib.rs");
}

#[test]
fn the_client_crate_exports_what_the_book_lists() {
    same("conch-client", "client/src/lib.rs");
}

#[test]
fn hidden_and_test_modules_are_not_exported() {
    let names = exported(
        "pub mod a;\n#[doc(hidden)]\npub mod b;\n#[cfg(test)]\nmod c;\nmod d;\n\
         pub use x::{E, F as G};\npub use y::h;\npub use z as w;\n#[cfg(feature = \"f\")]\npub mod i;\n",
    );
    let expected: BTreeSet<String> = ["a", "E", "G", "h", "w", "i"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(names, expected);
}
