//! Files that hold a secret (`--tls-key`, `--peer-secret-file`, `--bootstrap-admin-token-file`)
//! must be private to the user conchd runs as: one that group or others may read or change is
//! refused (exit 64 at start; a rotated key with such a mode is refused like any bad file, and
//! the old one stays in use).
//!
//! Only the mode is checked (`mode & 0o077 == 0`); reading the file reports a missing or
//! unreadable one in its own words. The `conch` CLI applies the same rule to its token and key
//! files.

use std::path::Path;

/// The permission bits a private file must not have: any access for group or others.
pub const SHARED_BITS: u32 = 0o077;

/// Why a file with `mode` is not private, with the fix; `None` if it is.
pub(crate) fn mode_problem(path: &Path, mode: u32) -> Option<String> {
    (mode & SHARED_BITS != 0).then(|| {
        format!(
            "is open to group or others (mode {:04o}); run: chmod 600 {}",
            mode & 0o7777,
            path.display()
        )
    })
}

/// [`mode_problem`] for the file at `path` (following symbolic links); `None` also when its
/// mode cannot be read.
pub fn problem(path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    mode_problem(path, mode)
}

/// Writes `contents` to the file at `path`, readable and writable by its owner only (for
/// tests and tools that make secret files).
pub fn write(path: &Path, contents: impl AsRef<[u8]>) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // A file that existed keeps its mode through `open`.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(contents.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_owner_access_passes() {
        let p = Path::new("/etc/conch/peer.secret");
        assert_eq!(mode_problem(p, 0o100600), None);
        assert_eq!(mode_problem(p, 0o400), None);
        assert_eq!(
            mode_problem(p, 0o100640).as_deref(),
            Some("is open to group or others (mode 0640); run: chmod 600 /etc/conch/peer.secret")
        );
        for shared in [0o604, 0o620, 0o602, 0o610, 0o601, 0o666] {
            assert!(mode_problem(p, shared).is_some(), "{shared:o}");
        }
    }

    #[test]
    fn files_are_judged_by_their_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("secret");
        write(&file, "x").expect("write");
        assert_eq!(problem(&file), None);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(problem(&file).is_some());
        assert_eq!(problem(&dir.path().join("missing")), None);
    }
}
