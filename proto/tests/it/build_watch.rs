//! What makes cargo run the wire contract's build script again: the `.proto` files and the
//! checkout's commit, never a whole directory, so an untracked file appearing under `proto/`
//! (an editor's backup, a scratch file) rebuilds nothing (`make cluster` builds in seconds).

use std::path::{Path, PathBuf};

/// The `cargo:rerun-if-changed=` paths of this build's run of the build script, from the
/// `output` file cargo keeps beside `OUT_DIR`.
fn watched() -> Vec<PathBuf> {
    let out_dir = Path::new(env!("OUT_DIR"));
    let output = out_dir
        .parent()
        .expect("OUT_DIR has a parent")
        .join("output");
    let text = std::fs::read_to_string(&output)
        .unwrap_or_else(|e| panic!("read the build script's output {}: {e}", output.display()));
    text.lines()
        .filter_map(|l| {
            l.strip_prefix("cargo:rerun-if-changed=")
                .or_else(|| l.strip_prefix("cargo::rerun-if-changed="))
        })
        .map(PathBuf::from)
        .collect()
}

#[test]
fn the_build_script_watches_the_proto_files_and_no_directory() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let watched = watched();
    assert!(
        !watched.is_empty(),
        "the build script names what it watches"
    );
    for path in &watched {
        let abs = manifest.join(path);
        assert!(
            !abs.is_dir(),
            "{} is a directory: any new file in it would rebuild everything",
            path.display()
        );
    }
    let mut protos: Vec<PathBuf> = std::fs::read_dir(manifest.join("proto"))
        .expect("proto/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "proto"))
        .collect();
    protos.sort();
    assert!(!protos.is_empty());
    for proto in protos {
        let rel = proto.strip_prefix(manifest).expect("under the manifest");
        assert!(
            watched
                .iter()
                .any(|w| w == rel || manifest.join(w) == proto),
            "{} is not watched: a change to it would not regenerate the code ({watched:?})",
            rel.display()
        );
    }
}
