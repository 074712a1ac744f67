//! Generates the Rust code for the wire contract with a vendored `protoc`, so no system
//! protobuf compiler is needed.

use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment here.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("conch_descriptor.bin"))
        .compile_protos(
            &[
                "proto/grackle.proto",
                "proto/conch.proto",
                "proto/auth.proto",
                "proto/quota.proto",
            ],
            &["proto"],
        )?;
    watch_protos(Path::new("proto"))?;
    build_commit();
    Ok(())
}

/// Builds again when a `.proto` file in `dir` changes, appears or goes, and for nothing else
/// there: watching the directory itself would rebuild everything when any other file appears in
/// it (an editor's backup, a generated file), as cargo watches a directory's newest file.
fn watch_protos(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let mut protos = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "proto") && path.is_file() {
            protos.push(path);
        }
    }
    protos.sort();
    for proto in protos {
        println!("cargo:rerun-if-changed={}", proto.display());
    }
    Ok(())
}

/// Sets `CONCH_BUILD_COMMIT` for `conch_proto::BUILD_COMMIT`: `$CONCH_BUILD_COMMIT` if set (a
/// build from a source tarball), else the checkout's commit, else `unknown`.
fn build_commit() {
    println!("cargo:rerun-if-env-changed=CONCH_BUILD_COMMIT");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let commit = std::env::var("CONCH_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=CONCH_BUILD_COMMIT={commit}");
    // Build again when the checkout moves to another commit. Cargo treats a watched path that
    // does not exist as always changed (so everything above would rebuild on every build): name
    // only paths that exist. `--git-path` resolves each one for a linked worktree too (HEAD is
    // the worktree's own, refs and packed-refs are the main repository's).
    let watch = |path: &Path| println!("cargo:rerun-if-changed={}", path.display());
    let git_path = |name: &str| git(&["rev-parse", "--git-path", name]).map(PathBuf::from);
    // HEAD names the branch, or the commit itself when detached.
    let Some(head) = git_path("HEAD").filter(|p| p.is_file()) else {
        return;
    };
    watch(&head);
    // Refs stored as files and packed-refs, or in a reftable.
    for store in ["packed-refs", "reftable/tables.list"] {
        if let Some(p) = git_path(store).filter(|p| p.is_file()) {
            watch(&p);
        }
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(loose) = git_path(&branch)
        && let Some(refs) = git_path("refs")
    {
        // The branch's own file, or while it has none (its ref is packed, or it has no commit
        // yet) the nearest directory under refs/ that exists, where that file will appear.
        if let Some(existing) = loose
            .ancestors()
            .take_while(|p| p.starts_with(&refs))
            .find(|p| p.exists())
        {
            watch(existing);
        }
    }
}
