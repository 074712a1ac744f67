//! The book's links, checked without mdBook: every relative link in `docs/src`, the README and
//! BENCHMARKS.md names a file that exists, and every `#anchor` names a heading of the page it
//! points into (anchors as mdBook and GitHub make them). Every chapter is in `SUMMARY.md`, or mdBook would
//! leave it out.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use crate::cli_docs::anchor;

/// Checks the book under `root` (the workspace root). Returns the number of links checked, or
/// every broken one, one line each (`FILE:LINE: ...`).
pub fn check(root: &Path) -> Result<usize, Vec<String>> {
    let src = root.join("docs/src");
    let mut pages: Vec<PathBuf> = match std::fs::read_dir(&src) {
        Ok(dir) => dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect(),
        Err(e) => return Err(vec![format!("{}: {e}", src.display())]),
    };
    pages.sort();
    pages.extend(
        ["README.md", "BENCHMARKS.md"]
            .iter()
            .map(|f| root.join(f))
            .filter(|p| p.exists()),
    );
    let mut anchors = Anchors::default();
    let mut problems = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = match expand(page) {
            Ok(text) => text,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        for (line, target) in links(&text) {
            checked += 1;
            let at = format!("{}:{line}", relative(root, page));
            if let Err(e) = resolve(page, &target, &mut anchors) {
                problems.push(format!("{at}: broken link ({target}): {e}"));
            }
        }
    }
    problems.extend(unlisted_chapters(root, &src, &pages));
    if problems.is_empty() {
        Ok(checked)
    } else {
        Err(problems)
    }
}

/// Chapters that `SUMMARY.md` does not link to.
fn unlisted_chapters(root: &Path, src: &Path, pages: &[PathBuf]) -> Vec<String> {
    let summary = src.join("SUMMARY.md");
    let listed: BTreeSet<String> = match std::fs::read_to_string(&summary) {
        Ok(text) => links(&text)
            .into_iter()
            .map(|(_, t)| t.split('#').next().unwrap_or_default().to_string())
            .collect(),
        Err(e) => return vec![format!("{}: {e}", summary.display())],
    };
    pages
        .iter()
        .filter(|p| p.parent() == Some(src) && !p.ends_with("SUMMARY.md"))
        .filter_map(|p| {
            let name = p.file_name()?.to_string_lossy().to_string();
            (!listed.contains(&name)).then(|| {
                format!(
                    "{}: not in docs/src/SUMMARY.md, so the book leaves it out",
                    relative(root, p)
                )
            })
        })
        .collect()
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// A page's text with mdBook's `{{#include FILE}}` lines replaced by the file.
fn expand(page: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(page).map_err(|e| format!("{}: {e}", page.display()))?;
    let mut out = String::new();
    for line in text.lines() {
        let included = line
            .trim()
            .strip_prefix("{{#include ")
            .and_then(|rest| rest.strip_suffix("}}"));
        match included {
            Some(file) => {
                let path = page.parent().unwrap_or(Path::new(".")).join(file.trim());
                let body = std::fs::read_to_string(&path)
                    .map_err(|e| format!("{}: include {}: {e}", page.display(), path.display()))?;
                out.push_str(&body);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    Ok(out)
}

/// The lines outside fenced code blocks, with their line numbers (from 1).
fn prose(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut fenced = false;
    text.lines().enumerate().filter_map(move |(i, line)| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return None;
        }
        (!fenced).then_some((i + 1, line))
    })
}

/// `line` without its inline code spans.
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// The targets of the inline links and images outside code, with their line numbers. Links to
/// other sites (`scheme:`) are left out.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in prose(text) {
        let line = without_code(line);
        let mut rest = line.as_str();
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].trim();
            let target = target.split_whitespace().next().unwrap_or_default();
            if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
                found.push((number, target.to_string()));
            }
            rest = &after[end..];
        }
    }
    found
}

/// The anchors of each page's headings, read once.
#[derive(Default)]
struct Anchors(HashMap<PathBuf, Result<BTreeSet<String>, String>>);

impl Anchors {
    fn of(&mut self, page: &Path) -> &Result<BTreeSet<String>, String> {
        self.0
            .entry(page.to_path_buf())
            .or_insert_with(|| expand(page).map(|text| heading_anchors(&text)))
    }
}

/// The anchors of a page's headings; a repeated one gets `-1`, `-2`, … as in mdBook and GitHub.
fn heading_anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let id = anchor(&heading_text(line[hashes..].trim().trim_end_matches('#')));
        let n = seen.entry(id.clone()).or_insert(0);
        out.insert(if *n == 0 {
            id.clone()
        } else {
            format!("{id}-{n}")
        });
        *n += 1;
    }
    out
}

/// A heading as rendered: link texts without their targets, no code or emphasis marks.
fn heading_text(heading: &str) -> String {
    let mut out = String::new();
    let mut rest = heading;
    while let Some(start) = rest.find("](") {
        out.push_str(&rest[..start]);
        rest = rest[start + 2..]
            .split_once(')')
            .map(|(_, after)| after)
            .unwrap_or("");
    }
    out.push_str(rest);
    out.chars()
        .filter(|c| !matches!(c, '[' | '`' | '*'))
        .collect()
}

/// Checks one link target of `page`.
fn resolve(page: &Path, target: &str, anchors: &mut Anchors) -> Result<(), String> {
    let (file, fragment) = match target.split_once('#') {
        Some((file, fragment)) => (file, Some(fragment)),
        None => (target, None),
    };
    let path = if file.is_empty() {
        page.to_path_buf()
    } else {
        page.parent().unwrap_or(Path::new(".")).join(file)
    };
    if !path.exists() {
        return Err(format!("no file {}", path.display()));
    }
    let Some(fragment) = fragment else {
        return Ok(());
    };
    if path.extension().is_none_or(|e| e != "md") {
        return Err("an anchor into a file that is not Markdown".into());
    }
    match anchors.of(&path) {
        Ok(known) if known.contains(fragment) => Ok(()),
        Ok(_) => Err(format!("no heading with the anchor #{fragment} in it")),
        Err(e) => Err(e.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_are_made_as_mdbook_makes_them() {
        let text = "# The `conch` CLI\n```sh\n# not a heading\n```\n## Elections (E1)\n## Elections (E1)\n";
        let got: Vec<String> = heading_anchors(text).into_iter().collect();
        assert_eq!(got, ["elections-e1", "elections-e1-1", "the-conch-cli"]);
    }

    #[test]
    fn links_in_code_are_not_links() {
        let text = "see [a](a.md#x) and `[b](b.md)`\n```\n[c](c.md)\n```\n[d](https://e.org) ![i](i.png)\n";
        let got: Vec<(usize, String)> = links(text);
        assert_eq!(got, [(1, "a.md#x".to_string()), (5, "i.png".to_string())]);
    }
}
