//! Disk failures a thread can ask for, for the data directories it names: the simulator makes a
//! node's log sync fail (an I/O error, or the disk full) to see the node stop and come back
//! without losing anything acknowledged. Nothing in `conchd` asks, so a node serving clients
//! never sees an injected failure; a real failing disk takes the same path.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// How an injected sync fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskFault {
    /// `EIO`: the device failed the write back.
    Io,
    /// `ENOSPC`: no space left on the device.
    Full,
}

thread_local! {
    static FAILING: RefCell<BTreeMap<PathBuf, DiskFault>> = const { RefCell::new(BTreeMap::new()) };
}

/// Makes every log sync under `dir` on this thread fail with `fault` (`None`: succeed again).
pub fn fail_syncs_under(dir: &Path, fault: Option<DiskFault>) {
    FAILING.with(|f| {
        let mut f = f.borrow_mut();
        match fault {
            Some(fault) => f.insert(dir.to_path_buf(), fault),
            None => f.remove(dir),
        }
    });
}

/// The error a sync of a file under `path` fails with, if one was asked for.
pub(crate) fn injected(path: &Path) -> Option<io::Error> {
    FAILING.with(|f| {
        f.borrow()
            .iter()
            .find(|(dir, _)| path.starts_with(dir))
            .map(|(_, fault)| match fault {
                DiskFault::Io => io::Error::from_raw_os_error(5),
                DiskFault::Full => io::Error::from_raw_os_error(28),
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_applies_under_its_directory_until_cleared() {
        let dir = Path::new("/data/n1");
        fail_syncs_under(dir, Some(DiskFault::Full));
        let e = injected(&dir.join("wal/0.seg")).map(|e| e.raw_os_error());
        assert_eq!(e, Some(Some(28)));
        assert!(injected(Path::new("/data/n2/wal")).is_none());
        fail_syncs_under(dir, Some(DiskFault::Io));
        assert_eq!(
            injected(&dir.join("wal")).and_then(|e| e.raw_os_error()),
            Some(5)
        );
        fail_syncs_under(dir, None);
        assert!(injected(&dir.join("wal")).is_none());
    }
}
