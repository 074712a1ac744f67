//! Tests of the log store: opening and its refusals, appends, reads, truncation, purges, the
//! vote and the data format.

#[tokio::test]
async fn a_log_that_lost_its_vote_refuses_to_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut store = LogStore::open(dir.path()).expect("open");
        store.save_vote(&Vote::new(3, 1)).await.expect("save vote");
    }
    // Reopening an intact directory works and keeps the vote.
    let mut store = LogStore::open(dir.path()).expect("reopen");
    assert_eq!(
        store.read_vote().await.expect("read vote"),
        Some(Vote::new(3, 1))
    );
    drop(store);
    // sled's directory gone (or emptied by its recovery): refuse.
    std::fs::remove_dir_all(dir.path().join("raft")).expect("remove sled dir");
    let Err(err) = LogStore::open(dir.path()) else {
        panic!("a log that lost its vote must not open")
    };
    assert!(err.to_string().contains("lost data"), "{err}");
}

#[test]
fn a_log_open_elsewhere_is_recognised_as_locked() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let first = LogStore::open(dir.path())?;
    let Err(second) = LogStore::open(dir.path()) else {
        anyhow::bail!("sled opened twice");
    };
    assert!(second.is_locked(), "{second}");
    drop(first);
    drop(LogStore::open(dir.path())?);
    Ok(())
}

#[test]
fn every_kept_format_opens_and_any_other_is_refused_in_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = LogStore::open(dir.path()).expect("open");
        // A new store records 0.1.0's format, which that release reads.
        assert_eq!(store.read_meta::<u32>(KEY_FORMAT), Ok(Some(7)));
        assert_eq!(store.data_format(), 7);
    }
    drop(LogStore::open(dir.path()).expect("reopen"));
    let raft = dir.path().join("raft");
    let rewrite = |format: Option<u32>, release: Option<&str>| {
        let db = sled::open(&raft).expect("open sled");
        match format {
            Some(format) => db.insert(KEY_FORMAT, encode_value(&format).expect("encode")),
            None => db.remove(KEY_FORMAT),
        }
        .expect("write");
        match release {
            Some(r) => db.insert(KEY_RELEASE, encode_value(&r.to_string()).expect("encode")),
            None => db.remove(KEY_RELEASE),
        }
        .expect("write");
        db.insert(KEY_VOTE, b"old vote".to_vec()).expect("write");
        db.flush().expect("flush");
    };
    for format in READ_FORMATS {
        rewrite(Some(format), None);
        let store = LogStore::open(dir.path());
        // The vote is garbage on purpose: getting past the format check is what counts.
        let message = store.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            !message.contains("data format"),
            "format {format}: {message}"
        );
    }
    let this = crate::support::release::RELEASE;
    for (format, release, start) in [
        (
            None,
            None,
            format!(
                "{}: written by a development build of conch older than release 0.1.0 \
                 (data format 1); this build, conch {this}, reads data formats 7 to 8: ",
                raft.display()
            ),
        ),
        (
            Some(6),
            None,
            format!(
                "{}: written by a development build of conch older than release 0.1.0 \
                 (data format 6)",
                raft.display()
            ),
        ),
        (
            Some(9),
            Some("0.9.0"),
            format!(
                "{}: written by conch 0.9.0 (data format 9); this build, conch {this}, reads \
                 data formats 7 to 8: run conch 0.9.0 or a later release on this directory",
                raft.display()
            ),
        ),
    ] {
        rewrite(format, release);
        let Err(err) = LogStore::open(dir.path()) else {
            panic!("a store of format {format:?} must not open")
        };
        let message = err.to_string();
        assert!(message.starts_with(&start), "{message}");
        assert!(!message.contains('\n'), "one line: {message}");
    }
}

#[test]
fn an_entry_that_raises_the_cluster_version_records_its_format_before_it_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = LogStore::open(dir.path()).expect("open");
    let raise = |index: u64, version: u32| Entry::<TypeConfig> {
        log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(crate::state::Batch {
            cmds: vec![Cmd::SetClusterVersion { version }],
            ..Default::default()
        }),
    };
    store.record_format_of(&[raise(1, 1)]).expect("record");
    assert_eq!(store.data_format(), 7, "version 1 needs nothing new");
    store.record_format_of(&[raise(2, 2)]).expect("record");
    assert_eq!(store.data_format(), 8);
    assert_eq!(store.read_meta::<u32>(KEY_FORMAT), Ok(Some(8)));
    assert_eq!(
        store.read_meta::<String>(KEY_RELEASE),
        Ok(Some(crate::support::release::RELEASE.to_string()))
    );
    drop(store);
    assert_eq!(LogStore::open(dir.path()).expect("reopen").data_format(), 8);
}

#[test]
fn a_node_that_speaks_less_refuses_a_raise_past_it_and_a_log_in_a_newer_format() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = LogStore::open(dir.path()).expect("open");
    store
        .speak_at_most(1)
        .expect("a new log is in 0.1.0's format");
    let raise = |index: u64, version: u32| Entry::<TypeConfig> {
        log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(crate::state::Batch {
            cmds: vec![Cmd::SetClusterVersion { version }],
            ..Default::default()
        }),
    };
    store.record_format_of(&[raise(1, 1)]).expect("version 1");
    let refused = store
        .record_format_of(&[raise(2, 1), raise(3, 2)])
        .expect_err("a raise past what the node speaks");
    assert!(
        refused.contains("log entry 3 raises the cluster version to 2")
            && refused.contains("speaks cluster version 1 at most"),
        "{refused}"
    );
    assert_eq!(store.data_format(), 7, "nothing recorded");
    assert_eq!(store.read_meta::<u32>(KEY_FORMAT), Ok(Some(7)));

    // A log a node of the newest version raised: refused as the previous release refuses it.
    store.speak_at_most(version::NEWEST).expect("the newest");
    store.record_format_of(&[raise(3, 2)]).expect("raise");
    drop(store);
    let store = LogStore::open(dir.path()).expect("reopen");
    let Err(err) = store.speak_at_most(1) else {
        panic!("a log in data format 8 must be refused by a node that speaks version 1")
    };
    let message = err.to_string();
    assert!(
        message.contains(
            "in data format 8; this node speaks cluster version 1 at most and \
             reads data formats 7 to 7"
        ),
        "{message}"
    );
}

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{CommittedLeaderId, EntryPayload, Membership, RaftLogReader};
use tempfile::TempDir;

use super::log_end::{LOG_END_SLOT_BYTES, decode_log_end_slot};
use super::mem_log::MEM_LOG_BYTES;
use super::meta::{KEY_FORMAT, KEY_RELEASE};
use super::sled_entries::entry_key;
use super::*;
use crate::raft::applied::AppliedState;
use crate::raft::codec::{CodecError, decode_value};
use crate::raft::state_machine::StateMachine;
use crate::state::fnv1a64;
use crate::state::{Batch, Cmd, State};

/// A fresh log store and state machine in their own temp dir (the guard keeps it alive).
struct SledBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for SledBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError> {
        let dir = tempfile::tempdir().map_err(|e| StorageIOError::write(&e))?;
        let log = LogStore::open(dir.path()).map_err(|e| StorageIOError::write(&e))?;
        let applied = AppliedState::new(State::new(), 0);
        let sm = StateMachine::open(dir.path(), applied).map_err(|e| StorageIOError::write(&e))?;
        Ok((dir, log, sm))
    }
}

#[test]
#[allow(clippy::result_large_err)] // openraft's StorageError
fn openraft_suite_passes_on_sled() -> Result<(), StorageError> {
    Suite::test_all(SledBuilder)
}

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn blank(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Blank,
    }
}

fn batch(term: u64, index: u64) -> Entry<TypeConfig> {
    let batch = Batch {
        now_ns: 1_000 + index as i64,
        cmds: vec![Cmd::RefreshLease {
            ns: "conch".to_string(),
            kind: crate::state::LeaseKind::Semaphore,
            lease: format!("lease-{index}"),
            ttl_s: 10,
        }],
        wall_ns: 1_000 + index as i64,
    };
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(batch),
    }
}

fn membership(term: u64, index: u64, voters: &[u64]) -> Entry<TypeConfig> {
    let voters: BTreeSet<u64> = voters.iter().copied().collect();
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Membership(Membership::new(vec![voters], None)),
    }
}

fn ids(entries: &[Entry<TypeConfig>]) -> Vec<LogId> {
    entries.iter().map(|e| e.log_id).collect()
}

#[tokio::test]
async fn reopened_store_has_the_same_log_vote_and_committed() -> anyhow::Result<()> {
    // open           empty dir
    // append         [blank 1, membership 2, batch 3, batch 4, batch 5] in one call
    // vote           term 2, node 1, committed
    // committed      (1, 4)
    // purge          up to 1
    // drop, reopen   -> same log state, entries 2..=5, vote and committed
    let dir = tempfile::tempdir()?;
    let written = vec![
        blank(1, 1),
        membership(1, 2, &[1, 2, 3]),
        batch(1, 3),
        batch(1, 4),
        batch(2, 5),
    ];
    let vote = Vote::new_committed(2, 1);
    {
        let mut store = LogStore::open(dir.path())?;
        store.blocking_append(written.clone()).await?;
        store.save_vote(&vote).await?;
        store.save_committed(Some(log_id(1, 4))).await?;
        store.purge(log_id(1, 1)).await?;
    }

    let mut store = LogStore::open(dir.path())?;
    let state = store.get_log_state().await?;
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1)));
    assert_eq!(state.last_log_id, Some(log_id(2, 5)));
    assert_eq!(store.read_vote().await?, Some(vote));
    assert_eq!(store.read_committed().await?, Some(log_id(1, 4)));
    let entries = store.try_get_log_entries(..).await?;
    assert_eq!(entries, written[1..].to_vec());

    // The log keeps working after the reopen: truncate the tail, append a new term.
    store.truncate(log_id(2, 5)).await?;
    store.blocking_append([blank(3, 5)]).await?;
    let mut reader = store.get_log_reader().await;
    assert_eq!(
        ids(&reader.try_get_log_entries(4..).await?),
        vec![log_id(1, 4), log_id(3, 5)]
    );
    Ok(())
}

#[tokio::test]
async fn empty_log_reports_the_purge_point_as_last() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let mut store = LogStore::open(dir.path())?;
        store.blocking_append([blank(1, 1), blank(1, 2)]).await?;
        store.purge(log_id(1, 7)).await?;
        store.blocking_append([blank(2, 8)]).await?;
        store.purge(log_id(2, 8)).await?;
        // Purges are not flushed by themselves; dropping sled flushes.
    }
    let mut store = LogStore::open(dir.path())?;
    let state = store.get_log_state().await?;
    assert_eq!(state.last_purged_log_id, Some(log_id(2, 8)));
    assert_eq!(state.last_log_id, Some(log_id(2, 8)));
    assert!(store.try_get_log_entries(..).await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn a_purge_past_the_end_of_the_log_survives_a_crash_that_loses_unflushed_values()
-> anyhow::Result<()> {
    // A snapshot installed on an empty log (a node added empty): purge to 7, then appends
    // from 8. A crash that loses every unflushed sled value must not leave the entries
    // from 8 after a hole.
    let dir = tempfile::tempdir()?;
    // The journal is this thread's: the store's blocking work must run on it too.
    crate::sim_hooks::blocking::run_inline_on_this_thread(true);
    crate::sim_hooks::disk_faults::track_unsynced_under(dir.path());
    {
        let mut store = LogStore::open(dir.path())?;
        store.purge(log_id(1, 7)).await?;
        store.blocking_append([blank(2, 8), blank(2, 9)]).await?;
        // Within the log: losing this purge point only brings entry 8 back.
        store.purge(log_id(2, 8)).await?;
    }
    let lost = crate::sim_hooks::disk_faults::lose_on_crash(dir.path(), &mut |_| 0);
    assert_eq!(lost.values, 1, "the purge point 8 was never flushed");
    let opened = LogStore::open(dir.path());
    crate::sim_hooks::disk_faults::stop_tracking();
    crate::sim_hooks::blocking::run_inline_on_this_thread(false);
    let mut store = opened?;
    let state = store.get_log_state().await?;
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 7)));
    assert_eq!(
        ids(&store.try_get_log_entries(..).await?),
        [log_id(2, 8), log_id(2, 9)]
    );
    Ok(())
}

/// Writes `value` under `key`, bypassing the store (simulates damage on disk).
fn poke(dir: &Path, key: &[u8], value: &[u8]) -> anyhow::Result<()> {
    let store = LogStore::open_with_durability(dir, Durability::Flush)?;
    store.inner.db.insert(key, value)?;
    store.inner.db.flush()?;
    Ok(())
}

async fn store_with_five_entries(dir: &Path) -> anyhow::Result<()> {
    let mut store = LogStore::open(dir)?;
    store
        .blocking_append([
            blank(1, 1),
            batch(1, 2),
            batch(1, 3),
            batch(1, 4),
            batch(1, 5),
        ])
        .await?;
    store.save_vote(&Vote::new(1, 1)).await?;
    Ok(())
}

fn assert_corrupt(result: Result<LogStore, OpenError>, needle: &str) {
    match result {
        Err(e @ OpenError::Corrupt { .. }) => {
            let message = e.to_string();
            assert!(
                message.contains(needle),
                "{message:?} should mention {needle:?}"
            );
            assert!(
                message.contains("raft") || message.contains("wal"),
                "{message:?} should name the path"
            );
        }
        Err(other) => panic!("expected Corrupt, got {other}"),
        Ok(_) => panic!("expected Corrupt, the store opened"),
    }
}

/// The segment file holding entry `index`, and the offset of its record.
fn record_of(dir: &Path, index: u64) -> anyhow::Result<(PathBuf, u64)> {
    let wal = dir.join("wal");
    let mut firsts: Vec<u64> = std::fs::read_dir(&wal)?
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_suffix(".seg")?
                .parse()
                .ok()
        })
        .collect();
    firsts.sort_unstable();
    let first = firsts
        .into_iter()
        .rev()
        .find(|f| *f <= index)
        .ok_or_else(|| anyhow::anyhow!("no segment holds {index}"))?;
    let path = wal.join(format!("{first:020}.seg"));
    let bytes = std::fs::read(&path)?;
    let mut at = 16usize;
    for _ in first..index {
        let mut len = [0u8; 4];
        len.copy_from_slice(&bytes[at..at + 4]);
        at += 4 + u32::from_le_bytes(len) as usize;
    }
    Ok((path, at as u64))
}

fn write_at(path: &Path, at: u64, bytes: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::FileExt;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all_at(bytes, at)?;
    Ok(())
}

/// Flips a byte inside the record of entry `index`.
fn damage_entry(dir: &Path, index: u64) -> anyhow::Result<()> {
    let (path, at) = record_of(dir, index)?;
    let mut byte = [0u8; 1];
    std::os::unix::fs::FileExt::read_exact_at(&File::open(&path)?, &mut byte, at + 9)?;
    write_at(&path, at + 9, &[byte[0] ^ 0x5a])
}

/// Cuts the log's files before the record of entry `index`, as a lost tail would.
fn cut_log(dir: &Path, index: u64) -> anyhow::Result<()> {
    let (path, at) = record_of(dir, index)?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)?
        .set_len(at)?;
    Ok(())
}

/// Entries 1..=`count`, one append each, in segments of `segment_bytes`.
async fn store_with_entries(dir: &Path, count: u64, segment_bytes: u64) -> anyhow::Result<()> {
    let mut store = LogStore::open_with(dir, Durability::Fsync, segment_bytes)?;
    store.save_vote(&Vote::new(1, 1)).await?;
    for index in 1..=count {
        store.blocking_append([batch(1, index)]).await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_damaged_entry_before_the_last_refuses_open() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // Segments of about two records each: entry 3 is not in the last one.
    store_with_entries(dir.path(), 8, 256).await?;
    damage_entry(dir.path(), 3)?;
    assert_corrupt(LogStore::open(dir.path()), "entry 3");
    Ok(())
}

#[tokio::test]
async fn a_damaged_last_entry_that_was_acknowledged_refuses_open() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    store_with_five_entries(dir.path()).await?;
    damage_entry(dir.path(), 5)?;
    let Err(err) = LogStore::open(dir.path()) else {
        panic!("a log whose acknowledged last entry is damaged must not open")
    };
    let message = err.to_string();
    assert!(message.contains("ends at index 4"), "{message}");
    assert!(message.contains("entry 5"), "{message}");
    assert!(message.contains("lost data"), "{message}");
    Ok(())
}

#[tokio::test]
async fn a_torn_write_that_was_never_acknowledged_is_cleared() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    store_with_five_entries(dir.path()).await?;
    // A crash mid-append: entry 6's record is on disk, damaged, and the end record still
    // says 5 (it is written after the sync).
    let (path, at) = record_of(dir.path(), 5)?;
    let good = encode_value(&batch(1, 5))?;
    let torn = encode_value(&batch(1, 6))?;
    let mut record = (torn.len() as u32).to_le_bytes().to_vec();
    record.extend_from_slice(&torn[..torn.len() / 2]);
    write_at(&path, at + 4 + good.len() as u64, &record)?;
    {
        let mut store = LogStore::open(dir.path())?;
        assert_eq!(store.get_log_state().await?.last_log_id, Some(log_id(1, 5)));
        store.blocking_append([blank(2, 6)]).await?;
    }
    let mut store = LogStore::open(dir.path())?;
    assert_eq!(store.get_log_state().await?.last_log_id, Some(log_id(2, 6)));
    Ok(())
}

#[tokio::test]
async fn entry_under_the_wrong_index_is_rejected() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    store_with_five_entries(dir.path()).await?;
    // Entry 3's record (the same size) written where entry 4's belongs.
    let (path, at) = record_of(dir.path(), 4)?;
    let value = encode_value(&batch(1, 3))?;
    let mut record = (value.len() as u32).to_le_bytes().to_vec();
    record.extend_from_slice(&value);
    write_at(&path, at, &record)?;
    assert_corrupt(
        LogStore::open(dir.path()),
        "holds entry 3, expected entry 4",
    );
    Ok(())
}

#[tokio::test]
async fn a_log_that_lost_its_tail_refuses_to_open() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    store_with_five_entries(dir.path()).await?;
    // The vote is intact; only the last two acknowledged entries are gone.
    cut_log(dir.path(), 4)?;
    let Err(err) = LogStore::open(dir.path()) else {
        panic!("a log that lost its tail must not open")
    };
    let message = err.to_string();
    assert!(message.contains("ends at index 3"), "{message}");
    assert!(message.contains("up to 5"), "{message}");
    assert!(message.contains("log-end"), "{message}");
    assert!(message.contains("lost data"), "{message}");
    Ok(())
}

/// The log's files cut short at any point: the store either opens with every entry and the
/// vote, or refuses to open. It never opens having forgotten an acknowledged entry.
#[tokio::test]
async fn a_log_cut_short_never_opens_short() -> anyhow::Result<()> {
    let template = tempfile::tempdir()?;
    store_with_entries(template.path(), 40, 1024).await?;
    let (last_segment, end) = record_of(template.path(), 40)?;
    let relative = |path: &Path| path.strip_prefix(template.path()).map(Path::to_path_buf);
    let files = [
        (relative(&last_segment)?, end + 1),
        (relative(&record_of(template.path(), 1)?.0)?, 1024),
        (
            PathBuf::from("raft/db"),
            std::fs::metadata(template.path().join("raft/db"))?.len(),
        ),
    ];
    let mut refused = 0;
    for (file, len) in files {
        for cut in (0..len).step_by(usize::try_from(len / 16).unwrap_or(1).max(1)) {
            let dir = tempfile::tempdir()?;
            copy_dir(template.path(), dir.path())?;
            std::fs::OpenOptions::new()
                .write(true)
                .open(dir.path().join(&file))?
                .set_len(cut)?;
            match LogStore::open(dir.path()) {
                Ok(mut store) => {
                    let state = store.get_log_state().await?;
                    let what = format!("{} cut at {cut}", file.display());
                    assert_eq!(state.last_log_id, Some(log_id(1, 40)), "{what}");
                    assert_eq!(store.read_vote().await?, Some(Vote::new(1, 1)), "{what}");
                }
                Err(_) => refused += 1,
            }
        }
    }
    assert!(refused > 0, "no cut of the log's files was detected");
    Ok(())
}

/// An entry whose record is about `bytes` long.
fn large(term: u64, index: u64, bytes: usize) -> Entry<TypeConfig> {
    let mut entry = batch(term, index);
    if let EntryPayload::Normal(batch) = &mut entry.payload
        && let Some(Cmd::RefreshLease { lease, .. }) = batch.cmds.first_mut()
    {
        // Padded by hand: a formatting width stops at 65 535.
        let digits = index.to_string();
        *lease = "0".repeat(bytes.saturating_sub(digits.len())) + &digits;
    }
    entry
}

fn wal_bytes(dir: &Path) -> anyhow::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for item in std::fs::read_dir(dir.join("wal"))? {
        total += item?.metadata()?.blocks() * 512;
    }
    Ok(total)
}

/// Entries of many small commands: what they hold decoded, not their records, is what the
/// memory budget counts, so the entries kept stay within it.
#[tokio::test]
async fn entries_kept_in_memory_are_counted_as_decoded() -> anyhow::Result<()> {
    const COMMANDS: usize = 100;
    let dir = tempfile::tempdir()?;
    let mut store = LogStore::open_with(dir.path(), Durability::Flush, 4 * 1024 * 1024)?;
    for index in 1..=400 {
        let mut entry = batch(1, index);
        if let EntryPayload::Normal(batch) = &mut entry.payload {
            let cmd = batch.cmds[0].clone();
            batch.cmds = vec![cmd; COMMANDS];
        }
        store.blocking_append([entry]).await?;
    }
    {
        let log = store.read_log();
        let decoded = log.entries.len() * COMMANDS * std::mem::size_of::<Cmd>();
        assert!(
            decoded as u64 <= MEM_LOG_BYTES,
            "{} entries of {COMMANDS} commands kept: {decoded} bytes decoded",
            log.entries.len()
        );
        let records: u64 = log.sizes.iter().map(|(record, _)| record).sum();
        assert!(
            log.bytes > records,
            "{} held, {records} of records",
            log.bytes
        );
        assert!(log.entries.len() > 1, "the newest entries are kept");
    }
    // The entries that left memory are read back from the segments.
    assert_eq!(store.try_get_log_entries(..).await?.len(), 400);
    Ok(())
}

#[tokio::test]
async fn replication_reads_stop_at_the_batch_byte_budget() -> anyhow::Result<()> {
    // 120 entries of ~100 kB: memory keeps about 10 of the newest, the rest are read back
    // from the segments. A budget of 1 MiB takes about 10 of them per call.
    const RECORD: usize = 100_000;
    let dir = tempfile::tempdir()?;
    let written: Vec<_> = (1..=120).map(|i| large(1, i, RECORD)).collect();
    let mut store = LogStore::open_with(dir.path(), Durability::Flush, 4 * 1024 * 1024)?;
    for entry in &written {
        store.blocking_append([entry.clone()]).await?;
    }
    let per_call =
        (REPLICATION_BATCH_BYTES as usize / RECORD) - 1..=REPLICATION_BATCH_BYTES as usize / RECORD;
    // From the segments, then across into memory, then from memory only.
    for start in [1, 105, 112] {
        let got = store.limited_get_log_entries(start, 121).await?;
        let expected_len = got.len();
        assert!(
            per_call.contains(&expected_len) || start + expected_len as u64 == 121,
            "{expected_len} entries from {start}"
        );
        let from = usize::try_from(start - 1)?;
        assert_eq!(got, written[from..from + expected_len], "from {start}");
    }
    // Reading to the end in calls covers every entry once, in order.
    let mut next = 1;
    let mut read = Vec::new();
    while next <= 120 {
        let got = store.limited_get_log_entries(next, 121).await?;
        assert!(!got.is_empty(), "nothing from {next}");
        next += got.len() as u64;
        read.extend(got);
    }
    assert_eq!(read, written);
    // One entry larger than the budget is still sent alone; small entries all at once.
    store
        .blocking_append([large(1, 121, 2 * 1024 * 1024)])
        .await?;
    assert_eq!(store.limited_get_log_entries(121, 122).await?.len(), 1);
    assert_eq!(store.limited_get_log_entries(120, 122).await?.len(), 1);
    for i in 122..=400 {
        store.blocking_append([batch(1, i)]).await?;
    }
    assert_eq!(store.limited_get_log_entries(122, 401).await?.len(), 279);
    // A start the purge point covers is read from after it.
    store.purge(log_id(1, 130)).await?;
    let got = store.limited_get_log_entries(125, 401).await?;
    assert_eq!(got.first().map(|e| e.log_id.index), Some(131));
    assert_eq!(got.len(), 270);
    Ok(())
}

#[tokio::test]
async fn entries_past_memory_are_read_back_and_purged_entries_leave_the_disk() -> anyhow::Result<()>
{
    // 200 entries of ~20 kB (4 MB): memory keeps about 1 MB of the newest; segments of
    // 256 kB hold about 12 entries each.
    const RECORD: usize = 20_000;
    let dir = tempfile::tempdir()?;
    let written: Vec<_> = (1..=200).map(|i| large(1, i, RECORD)).collect();
    {
        let mut store = LogStore::open_with(dir.path(), Durability::Flush, 256 * 1024)?;
        for entry in &written {
            store.blocking_append([entry.clone()]).await?;
        }
        let in_memory = store.read_log().entries.len();
        assert!(in_memory < 60, "{in_memory} entries kept in memory");
        assert_eq!(store.try_get_log_entries(..).await?, written);
        assert_eq!(store.try_get_log_entries(10..=12).await?, written[9..12]);
        let full = wal_bytes(dir.path())?;
        assert!(full >= 200 * RECORD as u64, "{full} bytes on disk");

        // A truncate below the entries in memory finds the new last entry on disk.
        store.truncate(log_id(1, 120)).await?;
        assert_eq!(
            store.get_log_state().await?.last_log_id,
            Some(log_id(1, 119))
        );
        assert_eq!(store.try_get_log_entries(..).await?, written[..119]);
        store.blocking_append([blank(2, 120)]).await?;

        // A purge removes the segments it covers from the disk: what stays is the entries
        // after the purge point plus at most one segment and the last one's free space.
        store.purge(log_id(1, 100)).await?;
        let kept = wal_bytes(dir.path())?;
        assert!(
            kept <= 20 * RECORD as u64 + 2 * 256 * 1024,
            "{kept} bytes on disk after purging 100 of 120 entries"
        );
        assert!(store.try_get_log_entries(..=100).await?.is_empty());
    }
    let mut store = LogStore::open_with(dir.path(), Durability::Flush, 256 * 1024)?;
    let mut expected = written[100..119].to_vec();
    expected.push(blank(2, 120));
    assert_eq!(store.try_get_log_entries(..).await?, expected);
    let state = store.get_log_state().await?;
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 100)));
    assert_eq!(state.last_log_id, Some(log_id(2, 120)));
    Ok(())
}

#[tokio::test]
async fn purges_delete_whole_segments_and_the_log_reopens() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    store_with_entries(dir.path(), 12, 256).await?;
    let segments =
        || -> anyhow::Result<usize> { Ok(std::fs::read_dir(dir.path().join("wal"))?.count()) };
    let before = segments()?;
    {
        let mut store = LogStore::open_with(dir.path(), Durability::Fsync, 256)?;
        store.purge(log_id(1, 9)).await?;
        assert!(segments()? < before, "no segment deleted");
        assert_eq!(
            ids(&store.try_get_log_entries(..).await?),
            (10..=12).map(|i| log_id(1, i)).collect::<Vec<_>>()
        );
    }
    let mut store = LogStore::open_with(dir.path(), Durability::Fsync, 256)?;
    let state = store.get_log_state().await?;
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 9)));
    assert_eq!(
        ids(&store.try_get_log_entries(..).await?),
        (10..=12).map(|i| log_id(1, i)).collect::<Vec<_>>()
    );
    Ok(())
}

#[tokio::test]
async fn entries_kept_in_sled_by_an_earlier_build_move_into_segments() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let written = vec![blank(1, 3), batch(1, 4), membership(2, 5, &[1, 2, 3])];
    {
        // A store as earlier builds wrote it: entries in sled under `e` + index.
        let db = sled::open(dir.path().join("raft"))?;
        db.insert(KEY_FORMAT, encode_value(&version::OLDEST_DATA_FORMAT)?)?;
        db.insert(KEY_PURGED, encode_value(&log_id(1, 2))?)?;
        db.insert(KEY_VOTE, encode_value(&Vote::<NodeId>::new(2, 1))?)?;
        for entry in &written {
            db.insert(entry_key(entry.log_id.index), encode_value(entry)?)?;
        }
        db.flush()?;
    }
    for _ in 0..2 {
        let mut store = LogStore::open(dir.path())?;
        assert_eq!(store.try_get_log_entries(..).await?, written);
        assert_eq!(store.read_vote().await?, Some(Vote::new(2, 1)));
        assert_eq!(
            store.get_log_state().await?.last_purged_log_id,
            Some(log_id(1, 2))
        );
        let in_sled = store
            .inner
            .db
            .range(entry_key(0)..=entry_key(u64::MAX))
            .count();
        assert_eq!(in_sled, 0, "entries left in sled");
    }
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    for item in std::fs::read_dir(from)? {
        let item = item?;
        let target = to.join(item.file_name());
        if item.file_type()?.is_dir() {
            std::fs::create_dir_all(&target)?;
            copy_dir(&item.path(), &target)?;
        } else {
            std::fs::copy(item.path(), &target)?;
        }
    }
    Ok(())
}

#[tokio::test]
async fn truncation_lowers_the_recorded_end() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    store_with_five_entries(dir.path()).await?;
    {
        let mut store = LogStore::open(dir.path())?;
        store.truncate(log_id(1, 4)).await?;
    }
    // Entries 4 and 5 were removed by Raft, not lost: the log opens and ends at 3.
    let mut store = LogStore::open(dir.path())?;
    assert_eq!(store.get_log_state().await?.last_log_id, Some(log_id(1, 3)));
    store.blocking_append([blank(2, 4)]).await?;
    drop(store);
    LogStore::open(dir.path())?;
    // Losing the re-appended entry is detected again.
    cut_log(dir.path(), 4)?;
    assert_corrupt(LogStore::open(dir.path()), "lost data");
    Ok(())
}

#[tokio::test]
async fn a_purge_past_the_last_entry_counts_as_the_end() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    store_with_five_entries(dir.path()).await?;
    {
        // A snapshot installed beyond the log purges everything up to its end.
        let mut store = LogStore::open(dir.path())?;
        store.purge(log_id(1, 9)).await?;
        store.inner.db.flush()?;
    }
    let mut store = LogStore::open(dir.path())?;
    assert_eq!(store.get_log_state().await?.last_log_id, Some(log_id(1, 9)));
    Ok(())
}

#[tokio::test]
async fn the_log_end_record_survives_a_torn_slot_but_not_total_damage() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    store_with_five_entries(dir.path()).await?;
    let path = dir.path().join("log-end");
    let mut bytes = std::fs::read(&path)?;
    assert_eq!(bytes.len(), 2 * LOG_END_SLOT_BYTES);
    let newest = bytes
        .chunks(LOG_END_SLOT_BYTES)
        .enumerate()
        .filter_map(|(slot, b)| decode_log_end_slot(b).map(|(seq, _)| (seq, slot)))
        .max()
        .map(|(_, slot)| slot)
        .ok_or_else(|| anyhow::anyhow!("no valid slot"))?;
    // A write torn in the newest slot: the other slot (an older, lower end) is used.
    bytes[newest * LOG_END_SLOT_BYTES] ^= 0xff;
    std::fs::write(&path, &bytes)?;
    LogStore::open(dir.path())?;
    // Both slots damaged: refused, naming the file.
    std::fs::write(&path, vec![0x5a; 2 * LOG_END_SLOT_BYTES])?;
    assert_corrupt(LogStore::open(dir.path()), "log-end");
    Ok(())
}

#[tokio::test]
async fn a_data_directory_without_the_record_gets_one() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    store_with_five_entries(dir.path()).await?;
    std::fs::remove_file(dir.path().join("log-end"))?;
    LogStore::open(dir.path())?;
    cut_log(dir.path(), 5)?;
    assert_corrupt(LogStore::open(dir.path()), "lost data");
    Ok(())
}

#[tokio::test]
async fn hole_in_the_log_refuses_open() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    store_with_entries(dir.path(), 8, 256).await?;
    let (middle, _) = record_of(dir.path(), 4)?;
    let (last, _) = record_of(dir.path(), 8)?;
    assert_ne!(middle, last);
    std::fs::remove_file(middle)?;
    assert_corrupt(LogStore::open(dir.path()), "hole");
    Ok(())
}

#[tokio::test]
async fn corrupt_vote_is_a_storage_error_and_refuses_open() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    store_with_five_entries(dir.path()).await?;
    let mut good = encode_value(&Vote::<NodeId>::new(7, 1))?;
    good[0] ^= 0x40;
    poke(dir.path(), KEY_VOTE, &good)?;
    assert_corrupt(LogStore::open(dir.path()), "vote");
    Ok(())
}

#[test]
fn garbage_with_a_valid_checksum_still_fails_to_decode() {
    for garbage in [
        &b""[..],
        b"\x01",
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
    ] {
        let mut bytes = garbage.to_vec();
        bytes.extend_from_slice(&fnv1a64(garbage).to_le_bytes());
        assert!(
            decode_value::<Entry<TypeConfig>>(&bytes).is_err(),
            "{garbage:?}"
        );
        assert!(decode_value::<Vote<NodeId>>(&bytes).is_err(), "{garbage:?}");
    }
    for short in [&b""[..], b"1234567"] {
        assert!(matches!(
            decode_value::<Vote<NodeId>>(short),
            Err(CodecError::TooShort { .. })
        ));
    }
}

#[tokio::test]
async fn purged_log_without_its_snapshot_is_refused() -> anyhow::Result<()> {
    // t0: entries 1..=5, purge up to 3 (as after a snapshot at 3)
    // the snapshot dir is lost -> refused; a snapshot at 3 or later -> accepted
    let dir = tempfile::tempdir()?;
    store_with_five_entries(dir.path()).await?;
    let mut store = LogStore::open(dir.path())?;
    assert!(
        store.check_snapshot_covers_purged(None).is_ok(),
        "nothing purged yet"
    );
    store.purge(log_id(1, 3)).await?;

    match store.check_snapshot_covers_purged(None) {
        Err(e @ OpenError::Corrupt { .. }) => {
            assert!(e.to_string().contains("snapshot directory"), "{e}")
        }
        other => anyhow::bail!("expected Corrupt, got {other:?}"),
    }
    assert!(
        store
            .check_snapshot_covers_purged(Some(log_id(1, 2)))
            .is_err()
    );
    store.check_snapshot_covers_purged(Some(log_id(1, 3)))?;
    store.check_snapshot_covers_purged(Some(log_id(1, 5)))?;
    Ok(())
}

#[test]
fn unreadable_data_dir_names_the_path() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x")?;
    let message = match LogStore::open(&file) {
        Err(e) => e.to_string(),
        Ok(_) => anyhow::bail!("opened a log under a regular file"),
    };
    assert!(message.contains("not-a-dir"), "{message}");
    Ok(())
}

/// Prints the cost of one append (1 and 100 entries) with and without the fdatasync step.
/// Not a benchmark harness; run by hand:
/// `cargo test -p conchd --lib append_cost -- --ignored --nocapture`
/// (`CONCH_BENCH_DIR` chooses the file system; default: the temp dir).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn append_cost() -> anyhow::Result<()> {
    let base = std::env::var_os("CONCH_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    println!("dir: {}", base.display());
    println!(
        "{:<8} {:>8} {:>7} {:>10} {:>10} {:>10} {:>12}",
        "mode", "entries", "rounds", "mean_us", "p50_us", "p99_us", "us/entry"
    );
    for durability in [Durability::Flush, Durability::Fsync] {
        for per_append in [1u64, 100] {
            let dir = tempfile::tempdir_in(&base)?;
            let mut store = LogStore::open_with_durability(dir.path(), durability)?;
            let rounds: u64 = if per_append == 1 { 500 } else { 100 };
            let mut next = 1u64;
            // Warm up: file growth and sled's first segments.
            for _ in 0..20 {
                store
                    .blocking_append((next..next + per_append).map(|i| batch(1, i)))
                    .await?;
                next += per_append;
            }
            let mut samples = Vec::with_capacity(rounds as usize);
            for _ in 0..rounds {
                let entries: Vec<_> = (next..next + per_append).map(|i| batch(1, i)).collect();
                next += per_append;
                let t = Instant::now();
                store.blocking_append(entries).await?;
                samples.push(t.elapsed());
            }
            samples.sort();
            let mean = samples.iter().sum::<Duration>() / rounds as u32;
            let p = |q: f64| samples[((samples.len() as f64 - 1.0) * q) as usize];
            println!(
                "{:<8} {:>8} {:>7} {:>10.1} {:>10.1} {:>10.1} {:>12.2}",
                format!("{durability:?}"),
                per_append,
                rounds,
                mean.as_secs_f64() * 1e6,
                p(0.5).as_secs_f64() * 1e6,
                p(0.99).as_secs_f64() * 1e6,
                mean.as_secs_f64() * 1e6 / per_append as f64,
            );
        }
    }
    Ok(())
}
