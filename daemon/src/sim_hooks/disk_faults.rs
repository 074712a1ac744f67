//! Disk failures a thread can ask for, for the data directories it names: the simulator makes a
//! node's log sync fail (an I/O error, or the disk full) to see the node stop and come back
//! without losing anything acknowledged, makes its syncs slow, and takes away what a crash or a
//! power loss takes away. Nothing in `conchd` asks, so a node serving clients never sees an
//! injected failure, and the journal below is never kept; a real failing disk takes the same
//! path.
//!
//! **What a crash takes away.** sled keeps a written value in its own memory until it flushes
//! (the log store flushes explicitly where it needs durability, and sled itself every second):
//! a process that dies loses the values written since, or some of them. A power loss also takes
//! what was written to a file but not synced: the page cache. For a directory it was asked to
//! track ([`track_unsynced_under`]), this thread keeps a journal of both, and
//! [`lose_on_crash`] and [`lose_power`] undo a seeded choice of them:
//!
//! - a file's writes since its last sync reach the disk in order, up to a point: the writes
//!   after it are lost, and the one at the point may be torn (only its first bytes reached the
//!   disk);
//! - each sled value written since the last flush is kept or lost on its own (sled's own flush
//!   may have taken it), and a lost one is put back to what the last flush saw when the store is
//!   next opened.
//!
//! Without `--cfg tokio_unstable` (the release; `SIM_HOOKS` in lib.rs) every hook here returns at once: a
//! released `conchd` carries none of it.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    static SLOW: RefCell<BTreeMap<PathBuf, Duration>> = const { RefCell::new(BTreeMap::new()) };
    static JOURNAL: RefCell<Journal> = const { RefCell::new(Journal::new()) };
}

/// A key and its value (`None`: no value).
type Value = (Vec<u8>, Option<Vec<u8>>);
/// Writes since a file's last sync, oldest first: where, and the bytes they replaced.
type Writes = Vec<(u64, Vec<u8>)>;

/// What this thread's tracked directories wrote and did not make durable yet.
struct Journal {
    tracked: BTreeSet<PathBuf>,
    /// Per file, its writes since its last sync, oldest first: where, and the bytes they
    /// replaced.
    unsynced: BTreeMap<PathBuf, Writes>,
    /// Per sled directory, the keys written since its last flush, each with the value the flush
    /// saw (`None`: no value).
    unflushed: BTreeMap<PathBuf, BTreeMap<Vec<u8>, Option<Vec<u8>>>>,
    /// Per sled directory, the values a crash took back, to put back when it opens.
    lost: BTreeMap<PathBuf, Vec<Value>>,
}

impl Journal {
    const fn new() -> Journal {
        Journal {
            tracked: BTreeSet::new(),
            unsynced: BTreeMap::new(),
            unflushed: BTreeMap::new(),
            lost: BTreeMap::new(),
        }
    }

    fn tracks(&self, path: &Path) -> bool {
        !self.tracked.is_empty() && self.tracked.iter().any(|dir| path.starts_with(dir))
    }
}

/// What a crash or a power loss took away under one directory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lost {
    /// Unsynced writes that never reached the disk.
    pub writes: usize,
    /// Unsynced writes of which only the first bytes reached the disk.
    pub torn: usize,
    /// Unsynced writes that reached the disk whole.
    pub kept: usize,
    /// sled values written since its last flush and lost.
    pub values: usize,
}

/// Keeps, from now on, the journal of unsynced writes and unflushed values under `dir` on this
/// thread (see the module docs).
pub fn track_unsynced_under(dir: &Path) {
    JOURNAL.with(|j| j.borrow_mut().tracked.insert(dir.to_path_buf()));
}

/// Forgets every tracked directory and its journal, on this thread.
pub fn stop_tracking() {
    JOURNAL.with(|j| *j.borrow_mut() = Journal::new());
}

/// Forgets the journal under `dir` (its files were removed: a wiped data directory).
pub fn forget_under(dir: &Path) {
    JOURNAL.with(|j| {
        let mut j = j.borrow_mut();
        j.unsynced.retain(|path, _| !path.starts_with(dir));
        j.unflushed.retain(|path, _| !path.starts_with(dir));
        j.lost.retain(|path, _| !path.starts_with(dir));
    });
}

/// Called before `len` bytes are written into `file` (at `path`) at `offset`: remembers what
/// they replace (zeros past the end of the file) until the file is synced.
pub(crate) fn before_write(file: &File, path: &Path, offset: u64, len: usize) {
    if !crate::SIM_HOOKS {
        return;
    }
    JOURNAL.with(|j| {
        let mut j = j.borrow_mut();
        if !j.tracks(path) {
            return;
        }
        let mut before = vec![0u8; len];
        let mut read = 0;
        while read < len {
            match file.read_at(&mut before[read..], offset + read as u64) {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
        j.unsynced
            .entry(path.to_path_buf())
            .or_default()
            .push((offset, before));
    });
}

/// Called once `path` was synced: its writes so far are on the disk.
pub(crate) fn synced(path: &Path) {
    if !crate::SIM_HOOKS {
        return;
    }
    JOURNAL.with(|j| {
        let mut j = j.borrow_mut();
        if j.tracks(path) {
            j.unsynced.remove(path);
        }
    });
}

/// Called after `key` was written into the sled store at `dir` without a flush; `before` is the
/// value it replaced.
pub(crate) fn value_written(dir: &Path, key: &[u8], before: Option<&[u8]>) {
    if !crate::SIM_HOOKS {
        return;
    }
    JOURNAL.with(|j| {
        let mut j = j.borrow_mut();
        if !j.tracks(dir) {
            return;
        }
        j.unflushed
            .entry(dir.to_path_buf())
            .or_default()
            .entry(key.to_vec())
            .or_insert_with(|| before.map(<[u8]>::to_vec));
    });
}

/// Called once the sled store at `dir` was flushed: every value written so far is durable.
pub(crate) fn flushed(dir: &Path) {
    if !crate::SIM_HOOKS {
        return;
    }
    JOURNAL.with(|j| {
        let mut j = j.borrow_mut();
        if j.tracks(dir) {
            j.unflushed.remove(dir);
        }
    });
}

/// The values a crash took back from the sled store at `dir`, to put back as it opens (each key
/// with the value the last flush saw; `None`: remove it).
pub(crate) fn take_lost_values(dir: &Path) -> Vec<Value> {
    if !crate::SIM_HOOKS {
        return Vec::new();
    }
    JOURNAL.with(|j| j.borrow_mut().lost.remove(dir).unwrap_or_default())
}

/// Takes out of `map` every entry whose path is under `dir`, in path order.
fn take_under<V>(map: &mut BTreeMap<PathBuf, V>, dir: &Path) -> Vec<(PathBuf, V)> {
    let (under, rest): (BTreeMap<PathBuf, V>, _) = std::mem::take(map)
        .into_iter()
        .partition(|(path, _)| path.starts_with(dir));
    *map = rest;
    under.into_iter().collect()
}

/// A process under `dir` died: each sled value it wrote since the last flush is lost or kept,
/// as `pick(2)` says (0: lost). `pick(n)` answers a number below `n`.
pub fn lose_on_crash(dir: &Path, pick: &mut dyn FnMut(u64) -> u64) -> Lost {
    JOURNAL.with(|j| {
        let mut j = j.borrow_mut();
        let mut lost = Lost::default();
        for (store, values) in take_under(&mut j.unflushed, dir) {
            for (key, before) in values {
                if pick(2) == 0 {
                    lost.values += 1;
                    j.lost.entry(store.clone()).or_default().push((key, before));
                }
            }
        }
        lost
    })
}

/// The machine of the process under `dir` lost power: as [`lose_on_crash`], and every file
/// under `dir` keeps its unsynced writes only up to a point `pick` chooses, the write at that
/// point possibly torn. Files are changed in place.
pub fn lose_power(dir: &Path, pick: &mut dyn FnMut(u64) -> u64) -> io::Result<Lost> {
    let mut lost = lose_on_crash(dir, pick);
    let files = JOURNAL.with(|j| take_under(&mut j.borrow_mut().unsynced, dir));
    for (path, writes) in files {
        let count = writes.len() as u64;
        let reached = pick(count + 1) as usize;
        let torn_at = (reached < writes.len() && pick(2) == 0)
            .then(|| pick(writes[reached].1.len() as u64 + 1) as usize);
        lost.kept += reached;
        let file = match std::fs::OpenOptions::new().write(true).open(&path) {
            Ok(file) => file,
            // A file removed since (a purged segment): nothing of it is left to undo.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        // Newest first, so each write's "before" is what the disk held under it.
        for (i, (offset, before)) in writes.iter().enumerate().skip(reached).rev() {
            match torn_at.filter(|_| i == reached) {
                Some(cut) => {
                    file.write_all_at(&before[cut..], offset + cut as u64)?;
                    lost.torn += 1;
                }
                None => {
                    file.write_all_at(before, *offset)?;
                    lost.writes += 1;
                }
            }
        }
        file.sync_all()?;
    }
    Ok(lost)
}

/// A setting per directory, kept by this thread.
type PerDir<V> = std::thread::LocalKey<RefCell<BTreeMap<PathBuf, V>>>;

/// Sets `dir`'s entry in `map` (`None`: clears it).
fn set_under<V: 'static>(map: &'static PerDir<V>, dir: &Path, value: Option<V>) {
    map.with(|m| {
        let mut m = m.borrow_mut();
        match value {
            Some(value) => m.insert(dir.to_path_buf(), value),
            None => m.remove(dir),
        }
    });
}

/// The entry in `map` of a directory `path` lies under, if any.
fn find_under<V: Copy + 'static>(map: &'static PerDir<V>, path: &Path) -> Option<V> {
    map.with(|m| {
        m.borrow()
            .iter()
            .find(|(dir, _)| path.starts_with(dir))
            .map(|(_, value)| *value)
    })
}

/// Makes every log sync under `dir` on this thread take `delay` of (simulated) time before it
/// runs (`None`: as fast as the disk).
pub fn slow_syncs_under(dir: &Path, delay: Option<Duration>) {
    set_under(&SLOW, dir, delay);
}

/// How long a sync of a file under `path` is to take, if it was made slow.
pub(crate) fn sync_delay(path: &Path) -> Option<Duration> {
    if !crate::SIM_HOOKS {
        return None;
    }
    find_under(&SLOW, path)
}

/// Makes every log sync under `dir` on this thread fail with `fault` (`None`: succeed again).
pub fn fail_syncs_under(dir: &Path, fault: Option<DiskFault>) {
    set_under(&FAILING, dir, fault);
}

/// The error a sync of a file under `path` fails with, if one was asked for.
pub(crate) fn injected(path: &Path) -> Option<io::Error> {
    if !crate::SIM_HOOKS {
        return None;
    }
    find_under(&FAILING, path).map(|fault| match fault {
        DiskFault::Io => io::Error::from_raw_os_error(5),
        DiskFault::Full => io::Error::from_raw_os_error(28),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers the given numbers in turn (each must be below what is asked).
    fn picks(answers: &[u64]) -> impl FnMut(u64) -> u64 + '_ {
        let mut next = answers.iter();
        move |below| {
            let n = *next.next().expect("a pick was planned for every choice");
            assert!(n < below, "{n} is not below {below}");
            n
        }
    }

    fn scratch_file(dir: &Path) -> io::Result<(PathBuf, File)> {
        let path = dir.join("f");
        let file = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)?;
        Ok((path, file))
    }

    fn write(file: &File, path: &Path, at: u64, bytes: &[u8]) {
        before_write(file, path, at, bytes.len());
        file.write_all_at(bytes, at).expect("write");
    }

    #[test]
    fn a_power_loss_keeps_synced_writes_and_an_ordered_prefix_of_the_rest() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let (path, file) = scratch_file(dir.path())?;
        file.set_len(12)?;
        track_unsynced_under(dir.path());
        write(&file, &path, 0, b"aaaa");
        file.sync_data()?;
        synced(&path);
        write(&file, &path, 4, b"bbbb");
        write(&file, &path, 8, b"cccc");
        write(&file, &path, 4, b"dddd");
        // One of three writes reached the disk, the next (cccc) only its first byte.
        let lost = lose_power(dir.path(), &mut picks(&[1, 0, 1]))?;
        assert_eq!(std::fs::read(&path)?, b"aaaabbbbc\0\0\0");
        assert_eq!(
            lost,
            Lost {
                writes: 1,
                torn: 1,
                kept: 1,
                values: 0
            }
        );
        // The journal is spent: another power loss changes nothing.
        assert_eq!(lose_power(dir.path(), &mut picks(&[]))?, Lost::default());
        stop_tracking();
        Ok(())
    }

    #[test]
    fn a_crash_takes_back_a_chosen_part_of_the_unflushed_values() {
        let dir = Path::new("/data/n1");
        let store = dir.join("raft");
        track_unsynced_under(dir);
        value_written(&store, b"k1", Some(b"old"));
        value_written(&store, b"k1", Some(b"newer"));
        value_written(&store, b"k2", None);
        flushed(&store);
        value_written(&store, b"k3", Some(b"v3"));
        value_written(&store, b"k4", None);
        let lost = lose_on_crash(dir, &mut picks(&[0, 1]));
        assert_eq!(lost.values, 1);
        assert_eq!(
            take_lost_values(&store),
            vec![(b"k3".to_vec(), Some(b"v3".to_vec()))],
            "k3 goes back to what the flush saw; k4 was kept; k1 and k2 were flushed"
        );
        assert!(take_lost_values(&store).is_empty());
        stop_tracking();
    }

    #[test]
    fn nothing_is_kept_for_a_directory_nobody_tracks() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let (path, file) = scratch_file(dir.path())?;
        write(&file, &path, 0, b"xy");
        value_written(dir.path(), b"k", None);
        assert_eq!(lose_power(dir.path(), &mut picks(&[]))?, Lost::default());
        assert_eq!(std::fs::read(&path)?, b"xy");
        Ok(())
    }

    #[test]
    fn a_slow_disk_applies_under_its_directory_until_cleared() {
        let dir = Path::new("/data/n2");
        slow_syncs_under(dir, Some(Duration::from_millis(30)));
        assert_eq!(
            sync_delay(&dir.join("wal/0.seg")),
            Some(Duration::from_millis(30))
        );
        assert_eq!(sync_delay(Path::new("/data/n3")), None);
        slow_syncs_under(dir, None);
        assert_eq!(sync_delay(&dir.join("wal/0.seg")), None);
    }

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
