//! Imports point one way: no module of the daemon or the client imports, directly or through
//! others, a module that imports it back. docs/design.md ("Module graph") draws the layers.
//!
//! A module is a source file (`foo.rs` and `foo/mod.rs` alike; a module declared inline, such as
//! `mod tests { … }`, belongs to its file). Each crate's tree is read from its root through its
//! `mod name;` declarations (`#[path]` honoured). File A imports file B when A names a path
//! starting `crate::`, `super::` or `self::` (in `use` trees too) whose longest module prefix is
//! B. A path that ends in an ancestor of A is followed through the ancestor's explicit
//! `pub use child::Name` re-exports to the child that defines the name; other paths into an
//! ancestor (its own items, or a glob re-export) are not counted, as a parent's `mod`
//! declarations and re-exports are not. Test modules count like any other code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates checked: a name for messages and the root file, relative to the workspace.
const CRATES: [(&str, &str); 4] = [
    ("conchd (library)", "daemon/src/lib.rs"),
    ("conchd (binary)", "daemon/src/main.rs"),
    ("conch-client (library)", "client/src/lib.rs"),
    ("conch (binary)", "client/src/bin/conch/main.rs"),
];

#[test]
fn no_module_imports_itself_through_others() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the daemon crate lies in the workspace");
    let mut circles = Vec::new();
    for (name, root) in CRATES {
        let tree = Crate::read(workspace, &workspace.join(root));
        for circle in tree.circles() {
            circles.push(format!("{name}: {circle}"));
        }
    }
    assert!(
        circles.is_empty(),
        "import circles (each edge with one place that makes it):\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_scanner_sees_paths_in_use_trees_and_code() {
    let source = "use crate::{a::b::{C, d::E}, f};\n// crate::g in a comment\n\
                  let s = \"crate::h\"; let c = '\\''; fn x<'a>() { super::super::i::J(); }\n\
                  mod tests { use super::*; use super::super::k; }";
    let tokens = tokens(source);
    let paths: Vec<String> = paths(&tokens)
        .into_iter()
        .map(|p| match p.up {
            None => format!("crate::{}", p.segments.join("::")),
            Some(up) => format!("{}{}", "^".repeat(up), p.segments.join("::")),
        })
        .collect();
    assert_eq!(
        paths,
        [
            "crate::a::b::C",
            "crate::a::b::d::E",
            "crate::f",
            "^^i::J",
            "^k"
        ],
        "paths as seen (^ = one level up from the file's module)"
    );
}

/// One crate's modules, by path (`api/status`; the root is ""), and their imports.
struct Crate {
    files: BTreeMap<String, PathBuf>,
    /// module -> module it imports -> one `file:line` where it does.
    edges: BTreeMap<String, BTreeMap<String, String>>,
}

impl Crate {
    fn read(workspace: &Path, root: &Path) -> Crate {
        let mut files = BTreeMap::new();
        collect(root, String::new(), true, &mut files);
        let sources: BTreeMap<String, (Vec<Token>, &PathBuf)> = files
            .iter()
            .map(|(module, path)| {
                let text = std::fs::read_to_string(path)
                    .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
                (module.clone(), (tokens(&text), path))
            })
            .collect();
        let reexports: BTreeMap<&str, BTreeMap<String, String>> = sources
            .iter()
            .map(|(module, (tokens, _))| (module.as_str(), reexports(module, tokens, &files)))
            .collect();
        let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for (module, (tokens, path)) in &sources {
            for found in paths(tokens) {
                let mut absolute = split(module);
                match found.up {
                    None => absolute.clear(),
                    Some(up) if up > absolute.len() => continue,
                    Some(up) => absolute.truncate(absolute.len() - up),
                }
                absolute.extend(found.segments.iter().cloned());
                let Some(target) = longest_module(&absolute, &files) else {
                    continue;
                };
                let target = if is_ancestor_or_self(&target, module) {
                    // Through an ancestor: only a named re-export of a child counts.
                    let rest = &absolute[split(&target).len()..];
                    match rest
                        .first()
                        .and_then(|name| reexports[target.as_str()].get(name))
                    {
                        Some(child) if !is_ancestor_or_self(child, module) => child.clone(),
                        _ => continue,
                    }
                } else {
                    target
                };
                edges
                    .entry(module.clone())
                    .or_default()
                    .entry(target)
                    .or_insert_with(|| {
                        let path = path.strip_prefix(workspace).unwrap_or(path);
                        format!("{}:{}", path.display(), found.line)
                    });
            }
        }
        Crate { files, edges }
    }

    /// Every circle, as `a -> b -> … -> a` with where each import is.
    fn circles(&self) -> Vec<String> {
        let mut out = Vec::new();
        for component in self.strongly_connected() {
            if component.len() < 2 {
                continue;
            }
            out.push(format!(
                "{} modules {{{}}}; one circle: {}",
                component.len(),
                component.iter().cloned().collect::<Vec<_>>().join(", "),
                self.one_circle(&component)
            ));
        }
        out
    }

    /// A shortest circle through the component's first module, with its evidence.
    fn one_circle(&self, component: &BTreeSet<String>) -> String {
        let start = component.first().expect("non-empty").clone();
        let mut previous: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start.clone()]);
        while let Some(at) = queue.pop_front() {
            for next in self.edges.get(&at).into_iter().flat_map(|e| e.keys()) {
                if !component.contains(next) || previous.contains_key(next) {
                    continue;
                }
                previous.insert(next.clone(), at.clone());
                if *next == start {
                    queue.clear();
                    break;
                }
                queue.push_back(next.clone());
            }
        }
        let mut chain = vec![start.clone()];
        let mut at = previous[&start].clone();
        while at != start {
            chain.push(at.clone());
            at = previous[&at].clone();
        }
        chain.push(start);
        chain.reverse();
        chain
            .windows(2)
            .map(|pair| {
                format!(
                    "{} -> {} ({})",
                    name(&pair[0]),
                    name(&pair[1]),
                    self.edges[&pair[0]][&pair[1]]
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Tarjan's algorithm, iteratively.
    fn strongly_connected(&self) -> Vec<BTreeSet<String>> {
        let nodes: Vec<&String> = self.files.keys().collect();
        let index_of: BTreeMap<&String, usize> =
            nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let successors: Vec<Vec<usize>> = nodes
            .iter()
            .map(|n| {
                self.edges
                    .get(*n)
                    .into_iter()
                    .flat_map(|e| e.keys())
                    .filter_map(|t| index_of.get(t).copied())
                    .collect()
            })
            .collect();
        let mut index = vec![usize::MAX; nodes.len()];
        let mut low = vec![0; nodes.len()];
        let mut on_stack = vec![false; nodes.len()];
        let mut stack = Vec::new();
        let mut next_index = 0;
        let mut components = Vec::new();
        for start in 0..nodes.len() {
            if index[start] != usize::MAX {
                continue;
            }
            let mut work = vec![(start, 0usize)];
            while let Some((v, child)) = work.pop() {
                if child == 0 {
                    index[v] = next_index;
                    low[v] = next_index;
                    next_index += 1;
                    stack.push(v);
                    on_stack[v] = true;
                }
                if let Some(&w) = successors[v].get(child) {
                    work.push((v, child + 1));
                    if index[w] == usize::MAX {
                        work.push((w, 0));
                    } else if on_stack[w] {
                        low[v] = low[v].min(index[w]);
                    }
                    continue;
                }
                if low[v] == index[v] {
                    let mut component = BTreeSet::new();
                    while let Some(w) = stack.pop() {
                        on_stack[w] = false;
                        component.insert(nodes[w].clone());
                        if w == v {
                            break;
                        }
                    }
                    components.push(component);
                }
                if let Some(&(parent, _)) = work.last() {
                    low[parent] = low[parent].min(low[v]);
                }
            }
        }
        components
    }
}

fn name(module: &str) -> &str {
    if module.is_empty() { "(root)" } else { module }
}

fn split(module: &str) -> Vec<String> {
    module
        .split('/')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

fn is_ancestor_or_self(candidate: &str, module: &str) -> bool {
    candidate.is_empty() || module == candidate || module.starts_with(&format!("{candidate}/"))
}

fn longest_module(path: &[String], files: &BTreeMap<String, PathBuf>) -> Option<String> {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].join("/"))
        .find(|m| files.contains_key(m))
}

/// Reads `file` as module `module` and, through its `mod name;` declarations, its children.
/// `owns_dir`: its children live in its own directory (a crate root or a `mod.rs`) rather than
/// in a directory named after it.
fn collect(file: &Path, module: String, owns_dir: bool, files: &mut BTreeMap<String, PathBuf>) {
    let text =
        std::fs::read_to_string(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
    let here = file.parent().expect("a file has a directory");
    let dir = if owns_dir {
        here.to_path_buf()
    } else {
        here.join(file.file_stem().expect("a file has a name"))
    };
    files.insert(module.clone(), file.to_path_buf());
    let tokens = tokens(&text);
    let mut depth = 0usize;
    let mut path_attr: Option<String> = None;
    for (i, token) in tokens.iter().enumerate() {
        match token.text.as_str() {
            "{" => depth += 1,
            "}" => depth = depth.saturating_sub(1),
            _ => {}
        }
        if depth == 0
            && token.text == "path"
            && i >= 2
            && tokens[i - 1].text == "["
            && tokens[i - 2].text == "#"
        {
            path_attr = tokens
                .get(i + 2)
                .filter(|t| t.text.starts_with('"'))
                .map(|t| t.text.trim_matches('"').to_string());
        }
        let declares =
            depth == 0 && token.text == "mod" && tokens.get(i + 2).is_some_and(|t| t.text == ";");
        if !declares {
            continue;
        }
        let child = tokens[i + 1].text.clone();
        let child_module = if module.is_empty() {
            child.clone()
        } else {
            format!("{module}/{child}")
        };
        let (child_file, child_owns_dir) = match path_attr.take() {
            Some(path) => {
                let path = here.join(path);
                let owns = path.file_name().is_some_and(|n| n == "mod.rs");
                (path, owns)
            }
            None if dir.join(format!("{child}.rs")).exists() => {
                (dir.join(format!("{child}.rs")), false)
            }
            None => (dir.join(&child).join("mod.rs"), true),
        };
        collect(&child_file, child_module, child_owns_dir, files);
    }
}

/// `pub use child::…::Name` (and `pub(crate) use`, in `use` trees) of `module`: each re-exported
/// name and the module it comes from. Glob re-exports name nothing.
fn reexports(
    module: &str,
    tokens: &[Token],
    files: &BTreeMap<String, PathBuf>,
) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for (i, token) in tokens.iter().enumerate() {
        if token.text != "use" || i == 0 {
            continue;
        }
        let public = tokens[i - 1].text == "pub"
            || (tokens[i - 1].text == ")" && i >= 4 && tokens[i - 4].text == "pub");
        if !public {
            continue;
        }
        let mut leaves = Vec::new();
        use_tree(tokens, i + 1, Vec::new(), &mut leaves);
        for leaf in leaves {
            let Some(last) = leaf.last() else { continue };
            if last == "*" || leaf.len() < 2 {
                continue;
            }
            let mut absolute = split(module);
            let relative = match leaf[0].as_str() {
                "crate" => {
                    absolute.clear();
                    &leaf[1..]
                }
                "self" => &leaf[1..],
                _ => &leaf[..],
            };
            absolute.extend(relative.iter().cloned());
            if let Some(source) = longest_module(&absolute[..absolute.len() - 1], files)
                && source != module
            {
                names.insert(last.clone(), source);
            }
        }
    }
    names
}

/// A path found in a file: from the crate root (`up` is `None`) or from the module `up` levels
/// above the file's module (`super::`, and `self::` at file level with `up` 0), then `segments`.
struct FoundPath {
    up: Option<usize>,
    segments: Vec<String>,
    line: usize,
}

/// Every `crate::`, `super::` and `self::` path in the tokens that leaves the file, use trees
/// expanded.
fn paths(tokens: &[Token]) -> Vec<FoundPath> {
    // Whether each open brace opened an inline module, and how many of those are open.
    let mut braces: Vec<bool> = Vec::new();
    let mut inline = 0usize;
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let token = &tokens[i];
        match token.text.as_str() {
            "{" => {
                let opens_mod = i >= 2 && tokens[i - 2].text == "mod";
                braces.push(opens_mod);
                inline += usize::from(opens_mod);
            }
            "}" if braces.pop() == Some(true) => inline -= 1,
            _ => {}
        }
        let starts = matches!(token.text.as_str(), "crate" | "super" | "self")
            && tokens.get(i + 1).is_some_and(|t| t.text == "::")
            && !(i > 0 && matches!(tokens[i - 1].text.as_str(), "::" | "$"));
        if !starts {
            i += 1;
            continue;
        }
        let mut leaves = Vec::new();
        i = if i > 0 && tokens[i - 1].text == "use" {
            use_tree(tokens, i, Vec::new(), &mut leaves)
        } else {
            let (end, path) = simple_path(tokens, i);
            leaves.push(path);
            end
        };
        for leaf in leaves {
            let supers = leaf.iter().take_while(|s| *s == "super").count();
            let (up, skip) = match leaf[0].as_str() {
                "crate" => (None, 1),
                // `self::` inside an inline module stays in the file.
                "self" if inline > 0 => continue,
                "self" => (Some(0), 1),
                // Up to an inline module's parent in the same file.
                _ if supers <= inline => continue,
                _ => (Some(supers - inline), supers),
            };
            out.push(FoundPath {
                up,
                segments: leaf[skip..].to_vec(),
                line: token.line,
            });
        }
    }
    out
}

/// A plain path from `start`: identifiers joined by `::`, ending before anything else (a
/// generic, a call). Returns the index after it and its segments.
fn simple_path(tokens: &[Token], start: usize) -> (usize, Vec<String>) {
    let mut segments = vec![tokens[start].text.clone()];
    let mut i = start + 1;
    while i + 1 < tokens.len() && tokens[i].text == "::" && is_ident(&tokens[i + 1].text) {
        segments.push(tokens[i + 1].text.clone());
        i += 2;
    }
    (i, segments)
}

/// A use tree from `start` (`a::b::{c, d::{e, f}}`), its leaves appended to `out` with
/// `prefix`. Returns the index after it.
fn use_tree(
    tokens: &[Token],
    start: usize,
    prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    let mut path = prefix;
    let mut i = start;
    loop {
        let Some(token) = tokens.get(i) else {
            out.push(path);
            return i;
        };
        match token.text.as_str() {
            "{" => {
                i += 1;
                while tokens.get(i).is_some_and(|t| t.text != "}") {
                    if tokens[i].text == "," {
                        i += 1;
                        continue;
                    }
                    i = use_tree(tokens, i, path.clone(), out);
                }
                return i + 1;
            }
            "*" => {
                path.push("*".into());
                out.push(path);
                return i + 1;
            }
            text if is_ident(text) => {
                path.push(text.to_string());
                i += 1;
                if tokens.get(i).is_some_and(|t| t.text == "as") {
                    i += 2;
                }
                if tokens.get(i).is_some_and(|t| t.text == "::") {
                    i += 1;
                    continue;
                }
                out.push(path);
                return i;
            }
            _ => {
                out.push(path);
                return i;
            }
        }
    }
}

fn is_ident(text: &str) -> bool {
    text.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

struct Token {
    text: String,
    line: usize,
}

/// Identifiers, `::`, string literals (as `"…"`) and single punctuation characters, with
/// comments, character literals and lifetimes left out.
fn tokens(source: &str) -> Vec<Token> {
    let chars: Vec<char> = source.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(chars[i] == '\n');
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && {
            let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
            chars.get(i + 1 + hashes) == Some(&'"')
        } {
            // Raw string: r#"…"#.
            let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
            let closing: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let body_start = i + 2 + hashes;
            let rest: String = chars[body_start..].iter().collect();
            let len = rest.find(&closing).map_or(rest.len(), |n| n);
            let body: String = rest.chars().take(len).collect();
            line += body.matches('\n').count();
            out.push(Token {
                text: "\"\"".into(),
                line,
            });
            i = body_start + body.chars().count() + closing.chars().count();
        } else if c == '"' || (c == 'b' && next == Some('"')) {
            let start_line = line;
            let mut text = String::from('"');
            i += if c == 'b' { 2 } else { 1 };
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                if let Some(&ch) = chars.get(i) {
                    line += usize::from(ch == '\n');
                    text.push(ch);
                }
                i += 1;
            }
            text.push('"');
            out.push(Token {
                text,
                line: start_line,
            });
            i += 1;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{…}') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Token {
                text: chars[start..i].iter().collect(),
                line,
            });
        } else if c == ':' && next == Some(':') {
            out.push(Token {
                text: "::".into(),
                line,
            });
            i += 2;
        } else {
            out.push(Token {
                text: c.to_string(),
                line,
            });
            i += 1;
        }
    }
    out
}
