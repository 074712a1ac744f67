//! Faked wall clocks for `conchd` processes: libfaketime preloaded into a node, its wall clock
//! offset read from a file the harness rewrites at run time (`+3600` = one hour ahead), the
//! monotonic clock left real.
//!
//! Debian's libfaketime (package `faketime`) is installed by `scripts/install-test-deps.sh`.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// The multi-threaded build of libfaketime.
pub const LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// Whether libfaketime is installed.
pub fn available() -> bool {
    Path::new(LIB).exists()
}

/// Node `id`'s offset file in the cluster directory `dir`.
pub fn offset_file(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("faketime-node{id}"))
}

/// The environment of node `id` whose wall clock follows its offset file (created at `+0`).
/// The file is read again at most once a second, so a step takes effect within a second.
pub fn node_env(id: u64, dir: &Path) -> Vec<(String, String)> {
    let file = offset_file(dir, id);
    // The file must exist before the node starts; a failure shows as an unfaked clock.
    let _ = std::fs::write(&file, "+0\n");
    vec![
        ("LD_PRELOAD".to_string(), LIB.to_string()),
        (
            "FAKETIME_TIMESTAMP_FILE".to_string(),
            file.display().to_string(),
        ),
        ("FAKETIME_CACHE_DURATION".to_string(), "1".to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".to_string(), "1".to_string()),
    ]
}

/// Steps node `id`'s wall clock to `offset_s` seconds from the real one.
pub fn step(dir: &Path, id: u64, offset_s: i64) -> anyhow::Result<()> {
    let file = offset_file(dir, id);
    std::fs::write(&file, format!("{offset_s:+}\n")).with_context(|| file.display().to_string())
}
