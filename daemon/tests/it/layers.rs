//! Imports point one way, down the documented layers:
//! - no module of the daemon or the client imports, directly or through others, a module that
//!   imports it back;
//! - a module of the daemon's library imports only modules of its own layer or of the layers
//!   below it, as docs/design.md ("Module graph") lists them. The list there is the one this
//!   test reads: every top-level module of the library must be in exactly one layer;
//! - each of those top-level modules is a folder, so no file lies loose in `daemon/src` but
//!   `lib.rs`, `main.rs` and the folders' root files.
//!
//! A module is a source file (`foo.rs` and `foo/mod.rs` alike; a module declared inline, such as
//! `mod tests { … }`, belongs to its file). Each crate's tree is read from its root through its
//! `mod name;` declarations (`#[path]` honoured). File A imports file B when A names a path
//! starting `crate::`, `super::` or `self::` (in `use` trees too) whose longest module prefix is
//! B. A path that ends in an ancestor of A is followed through the ancestor's explicit
//! `pub use child::Name` re-exports to the child that defines the name; other paths into an
//! ancestor (its own items, or a glob re-export) are not counted, as a parent's `mod`
//! declarations and re-exports are not. Test modules count like any other code for circles; the
//! layer order leaves them out (a module's tests may start a whole node to test it), where test
//! code is an item under `#[cfg(test)]` and every module declared under one.

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

/// Imports against the documented order that wait on files being reworked elsewhere: each entry
/// is `(importing module, imported module, why)`, and each is TEMPORARY: remove it with the
/// import. An entry that no longer matches an import fails the test, so the list only shrinks.
const TEMPORARY_ORDER_EXCEPTIONS: &[(&str, &str, &str)] = &[];

#[test]
fn modules_import_only_their_own_and_lower_layers() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the daemon crate lies in the workspace");
    let design =
        std::fs::read_to_string(workspace.join("docs/design.md")).expect("read docs/design.md");
    let layers = documented_layers(&design);
    assert!(
        layers.len() >= 5,
        "docs/design.md (\"Module graph\") lists the layers as a numbered list, bottom first: \
         found {layers:?}"
    );
    let tree = Crate::read(workspace, &workspace.join("daemon/src/lib.rs"));
    let mut layer_of: BTreeMap<&str, usize> = BTreeMap::new();
    let mut problems = Vec::new();
    for (index, modules) in layers.iter().enumerate() {
        for module in modules {
            if layer_of.insert(module.as_str(), index).is_some() {
                problems.push(format!("{module} is listed in two layers"));
            }
        }
    }
    let top_level: BTreeSet<&str> = tree
        .files
        .keys()
        .map(String::as_str)
        .filter(|m| !m.is_empty() && !m.contains('/'))
        .collect();
    for module in &top_level {
        if !layer_of.contains_key(module) {
            problems.push(format!(
                "module {module} is in no layer: add it to docs/design.md (\"Module graph\")"
            ));
        }
    }
    for module in layer_of.keys() {
        if !top_level.contains(module) {
            problems.push(format!(
                "docs/design.md lists {module}, which is not a module of daemon/src/lib.rs"
            ));
        }
    }
    let mut excepted_seen = BTreeSet::new();
    for (from, targets) in &tree.code_edges {
        let Some(&from_layer) = top(from).and_then(|t| layer_of.get(t)) else {
            continue;
        };
        for (to, at) in targets {
            let Some(&to_layer) = top(to).and_then(|t| layer_of.get(t)) else {
                continue;
            };
            if to_layer <= from_layer {
                continue;
            }
            let excepted = TEMPORARY_ORDER_EXCEPTIONS
                .iter()
                .position(|(f, t, _)| *f == from.as_str() && *t == to.as_str());
            if let Some(index) = excepted {
                excepted_seen.insert(index);
                continue;
            }
            problems.push(format!(
                "{from} (layer {}) imports {to} (layer {}, above it) at {at}",
                from_layer + 1,
                to_layer + 1
            ));
        }
    }
    for (index, (from, to, _)) in TEMPORARY_ORDER_EXCEPTIONS.iter().enumerate() {
        if !excepted_seen.contains(&index) {
            problems.push(format!(
                "the exception {from} -> {to} matches no upward import any more: remove it"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "the layers of docs/design.md (\"Module graph\"), bottom first, are {layers:?}:\n{}",
        problems.join("\n")
    );
}

#[test]
fn no_file_lies_loose_beside_the_layer_folders() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the daemon crate lies in the workspace");
    let src = workspace.join("daemon/src");
    let entries = std::fs::read_dir(&src)
        .unwrap_or_else(|e| panic!("read {}: {e}", src.display()))
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_else(|e| panic!("read {}: {e}", src.display()));
    let mut loose: Vec<String> = entries
        .iter()
        .filter(|path| path.is_file() && path.extension().is_some_and(|e| e == "rs"))
        .filter_map(|path| {
            let stem = path.file_stem()?.to_str()?;
            let root_of_folder = src.join(stem).is_dir();
            let allowed = matches!(stem, "lib" | "main") || root_of_folder;
            (!allowed).then(|| format!("daemon/src/{stem}.rs"))
        })
        .collect();
    loose.sort();
    assert!(
        loose.is_empty(),
        "files lie loose in daemon/src: {}. Only lib.rs, main.rs and the root file of a folder \
         (`foo.rs` beside `foo/`) may: put each into its layer's folder (docs/design.md, \
         \"Module graph\")",
        loose.join(", ")
    );
}

/// The top-level module a module belongs to (`api` for `api/status`); none for the root.
fn top(module: &str) -> Option<&str> {
    module.split('/').next().filter(|m| !m.is_empty())
}

/// The layers of the "Module graph" section, bottom first: its numbered list, each item
/// starting with the layer's modules in backquotes, separated by commas (`` `a`, `b`: … ``).
fn documented_layers(design: &str) -> Vec<Vec<String>> {
    let section = design
        .split("\n## ")
        .find(|s| s.starts_with("Module graph"))
        .unwrap_or("");
    let mut layers = Vec::new();
    for line in section.lines() {
        let Some((number, rest)) = line.split_once(". ") else {
            continue;
        };
        if number.is_empty() || !number.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let mut modules = Vec::new();
        let mut rest = rest;
        while let Some(after) = rest.strip_prefix('`') {
            let Some((module, tail)) = after.split_once('`') else {
                break;
            };
            modules.push(module.to_string());
            match tail.strip_prefix(", ") {
                Some(tail) => rest = tail,
                None => break,
            }
        }
        layers.push(modules);
    }
    layers
}

#[test]
fn the_layer_list_is_read_from_its_numbered_items() {
    let design = "# x\n\n## Module graph\n\nText 1. `no`.\n\n1. `a`, `b/c`: the bottom, \
                  not `d`\n   more about it\n2. `e`: the top\n\n## Next\n\n3. `f`: elsewhere\n";
    assert_eq!(
        documented_layers(design),
        [
            vec!["a".to_string(), "b/c".to_string()],
            vec!["e".to_string()]
        ]
    );
}

#[test]
fn test_code_is_told_apart() {
    let source = "use crate::a::X;\n#[cfg(test)]\nuse crate::b::Y;\nfn f() { crate::c::z(); }\n\
                  #[cfg(test)]\nmod tests { use crate::d::W; fn g() { crate::e::v(); } }\n\
                  fn h() { crate::f::u(); }";
    let tokens = tokens(source);
    let seen: Vec<(String, bool)> = paths(&tokens)
        .into_iter()
        .map(|p| (p.segments[0].clone(), p.in_test))
        .collect();
    let expected = [
        ("a", false),
        ("b", true),
        ("c", false),
        ("d", true),
        ("e", true),
        ("f", false),
    ]
    .map(|(m, t)| (m.to_string(), t));
    assert_eq!(seen, expected);
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
pub(crate) struct Crate {
    pub(crate) files: BTreeMap<String, PathBuf>,
    /// The modules declared under `#[cfg(test)]`, and their children.
    pub(crate) tests: BTreeSet<String>,
    /// module -> module it imports -> one `file:line` where it does.
    edges: BTreeMap<String, BTreeMap<String, String>>,
    /// The same, from code that is not test code.
    code_edges: BTreeMap<String, BTreeMap<String, String>>,
}

impl Crate {
    pub(crate) fn read(workspace: &Path, root: &Path) -> Crate {
        let mut files = BTreeMap::new();
        let mut tests = BTreeSet::new();
        collect(root, String::new(), true, false, &mut files, &mut tests);
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
        let mut code_edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
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
                let at = {
                    let path = path.strip_prefix(workspace).unwrap_or(path);
                    format!("{}:{}", path.display(), found.line)
                };
                if !found.in_test && !tests.contains(module) {
                    code_edges
                        .entry(module.clone())
                        .or_default()
                        .entry(target.clone())
                        .or_insert_with(|| at.clone());
                }
                edges
                    .entry(module.clone())
                    .or_default()
                    .entry(target)
                    .or_insert(at);
            }
        }
        Crate {
            files,
            tests,
            edges,
            code_edges,
        }
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
/// in a directory named after it. `test`: the module is test code (declared under
/// `#[cfg(test)]`, or a child of such a module); test modules are added to `tests`.
fn collect(
    file: &Path,
    module: String,
    owns_dir: bool,
    test: bool,
    files: &mut BTreeMap<String, PathBuf>,
    tests: &mut BTreeSet<String>,
) {
    let text =
        std::fs::read_to_string(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
    let here = file.parent().expect("a file has a directory");
    let dir = if owns_dir {
        here.to_path_buf()
    } else {
        here.join(file.file_stem().expect("a file has a name"))
    };
    files.insert(module.clone(), file.to_path_buf());
    if test {
        tests.insert(module.clone());
    }
    let tokens = tokens(&text);
    let in_test = test_flags(&tokens);
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
        collect(
            &child_file,
            child_module,
            child_owns_dir,
            test || in_test[i],
            files,
            tests,
        );
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
    /// Inside an item under `#[cfg(test)]`.
    in_test: bool,
}

/// For each token, whether it lies in an item under `#[cfg(test)]`: from the attribute to the
/// end of the item (its closing brace, or the `;` of an item without a body).
pub(crate) fn test_flags(tokens: &[Token]) -> Vec<bool> {
    let texts: Vec<&str> = tokens.iter().map(|t| t.text.as_str()).collect();
    let mut flags = Vec::with_capacity(tokens.len());
    // Whether each open brace opened a test item; the depth of braces when an attribute was
    // seen whose item has not opened its body yet.
    let mut braces: Vec<bool> = Vec::new();
    let mut open_tests = 0usize;
    let mut pending: Option<usize> = None;
    for (i, text) in texts.iter().enumerate() {
        if texts[i..].starts_with(&["#", "[", "cfg", "(", "test", ")", "]"]) {
            pending = Some(braces.len());
        }
        flags.push(open_tests > 0 || pending.is_some());
        match *text {
            "{" => {
                let opens_test = pending == Some(braces.len());
                if opens_test {
                    pending = None;
                }
                braces.push(opens_test);
                open_tests += usize::from(opens_test);
            }
            "}" if braces.pop() == Some(true) => open_tests -= 1,
            ";" if pending == Some(braces.len()) => pending = None,
            _ => {}
        }
    }
    flags
}

/// Every `crate::`, `super::` and `self::` path in the tokens that leaves the file, use trees
/// expanded.
fn paths(tokens: &[Token]) -> Vec<FoundPath> {
    let in_test = test_flags(tokens);
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
        let test = in_test[i];
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
                in_test: test,
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

pub(crate) struct Token {
    pub(crate) text: String,
    pub(crate) line: usize,
}

/// Identifiers, `::`, string literals (as `"…"`) and single punctuation characters, with
/// comments, character literals and lifetimes left out.
pub(crate) fn tokens(source: &str) -> Vec<Token> {
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
