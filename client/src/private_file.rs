//! Files that hold a secret (a bearer token, a private key) must be private to their owner: a
//! file that group or others may read or change is refused, the way ssh refuses such a key.
//!
//! Only the mode is checked (`mode & 0o077 == 0`); the file is still read by whoever uses it,
//! which reports a missing or unreadable file in its own words.

use std::path::Path;

/// The permission bits a private file must not have: any access for group or others.
pub const SHARED_BITS: u32 = 0o077;

/// `Err` naming the file, its mode and the fix when `mode` gives group or others any access.
///
/// ```
/// use std::path::Path;
/// use conch_client::private_file::check_mode;
///
/// assert!(check_mode(Path::new("ci.token"), 0o100600).is_ok());
/// assert!(check_mode(Path::new("ci.token"), 0o100400).is_ok());
/// let problem = check_mode(Path::new("ci.token"), 0o100644).unwrap_err();
/// assert_eq!(
///     problem,
///     "ci.token is open to group or others (mode 0644); run: chmod 600 ci.token"
/// );
/// ```
pub fn check_mode(path: &Path, mode: u32) -> Result<(), String> {
    if mode & SHARED_BITS == 0 {
        return Ok(());
    }
    Err(format!(
        "{} is open to group or others (mode {:04o}); run: chmod 600 {}",
        path.display(),
        mode & 0o7777,
        path.display()
    ))
}

/// Checks the mode of the file at `path` (following symbolic links) with [`check_mode`]. A file
/// whose mode cannot be read passes: reading it fails, with its own message.
pub fn check(path: &Path) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path) {
            return check_mode(path, meta.permissions().mode());
        }
    }
    let _ = path;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_access_for_group_or_others_is_refused() {
        let p = Path::new("/etc/conch/ci.token");
        for ok in [0o600, 0o400, 0o700, 0o100600] {
            assert!(check_mode(p, ok).is_ok(), "{ok:o}");
        }
        for shared in [0o644, 0o640, 0o604, 0o620, 0o602, 0o610, 0o601, 0o666] {
            let problem = check_mode(p, shared).unwrap_err();
            assert!(problem.contains(&format!("mode {shared:04o}")), "{problem}");
            assert!(
                problem.ends_with("chmod 600 /etc/conch/ci.token"),
                "{problem}"
            );
        }
    }

    #[cfg(unix)]
    #[test]
    fn files_are_judged_by_their_mode_and_missing_ones_left_to_the_reader() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "x").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(check(&file).is_err());
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(check(&file).is_ok());
        assert!(check(&dir.path().join("missing")).is_ok());
    }
}
