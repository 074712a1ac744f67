//! Tests of the segment log: appends, reopening, torn tails, truncation and purges.

use openraft::{CommittedLeaderId, EntryPayload, LogId};

use super::*;

fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
        payload: EntryPayload::Blank,
    }
}

fn ids(entries: &[Entry<TypeConfig>]) -> Vec<(u64, u64)> {
    entries
        .iter()
        .map(|e| (e.log_id.leader_id.term, e.log_id.index))
        .collect()
}

fn open(dir: &Path, purged: Option<u64>, segment_bytes: u64) -> (Wal, Recovered) {
    match Wal::open(dir, purged, segment_bytes, true) {
        Ok(opened) => opened,
        Err(e) => panic!("open {}: {e}", dir.display()),
    }
}

fn segment_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("list")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

#[test]
fn entries_survive_a_reopen_across_segments() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let wal_dir = dir.path().join("wal");
    {
        // One-byte segments: every append starts a new one.
        let (mut wal, recovered) = open(&wal_dir, None, 1);
        assert!(recovered.entries.is_empty());
        wal.append(&[entry(1, 1), entry(1, 2)])?;
        wal.append(&[entry(1, 3)])?;
        wal.append(&[entry(2, 4), entry(2, 5)])?;
    }
    assert_eq!(segment_files(&wal_dir).len(), 3);
    let (wal, recovered) = open(&wal_dir, None, 1);
    assert_eq!(
        ids(&recovered.entries),
        vec![(1, 1), (1, 2), (1, 3), (2, 4), (2, 5)]
    );
    assert_eq!(recovered.last_index, Some(5));
    assert!(recovered.torn_tail.is_none());
    assert_eq!(wal.next_index(), Some(6));
    // Entries up to the purge point are read and checked, not returned.
    let (_, recovered) = open(&wal_dir, Some(3), 1);
    assert_eq!(ids(&recovered.entries), vec![(2, 4), (2, 5)]);
    Ok(())
}

#[test]
fn an_append_must_follow_the_last_entry() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut wal, _) = open(dir.path(), None, SEGMENT_BYTES);
    wal.append(&[entry(1, 1)])?;
    let gap = wal.append(&[entry(1, 3)]).expect_err("a gap");
    assert!(gap.to_string().contains("does not follow"), "{gap}");
    let unordered = wal
        .append(&[entry(1, 2), entry(1, 4)])
        .expect_err("not consecutive");
    assert!(unordered.to_string().contains("consecutive"), "{unordered}");
    // Nothing was written by the refused appends.
    wal.append(&[entry(1, 2)])?;
    drop(wal);
    let (_, recovered) = open(dir.path(), None, SEGMENT_BYTES);
    assert_eq!(ids(&recovered.entries), vec![(1, 1), (1, 2)]);
    Ok(())
}

#[test]
fn a_truncated_log_never_brings_back_its_old_tail() -> anyhow::Result<()> {
    // 1..=5 in term 1; truncate from 3; 3 again in term 2 (a record of the same size).
    // Without clearing, old record 4 would follow the new 3 and read as valid.
    let dir = tempfile::tempdir()?;
    {
        let (mut wal, _) = open(dir.path(), None, SEGMENT_BYTES);
        wal.append(&[
            entry(1, 1),
            entry(1, 2),
            entry(1, 3),
            entry(1, 4),
            entry(1, 5),
        ])?;
        wal.truncate(3)?;
        wal.append(&[entry(2, 3)])?;
    }
    let (_, recovered) = open(dir.path(), None, SEGMENT_BYTES);
    assert_eq!(ids(&recovered.entries), vec![(1, 1), (1, 2), (2, 3)]);
    Ok(())
}

#[test]
fn truncation_removes_whole_segments_and_the_tail_of_one() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let (mut wal, _) = open(dir.path(), None, 64);
        for i in 1..=6 {
            wal.append(&[entry(1, i)])?;
        }
        assert_eq!(segment_files(dir.path()).len(), 3);
        wal.truncate(4)?;
        assert_eq!(wal.next_index(), Some(4));
        wal.append(&[entry(2, 4)])?;
        // A truncation at a segment's first entry removes the segment.
        wal.truncate(1)?;
        assert_eq!(wal.next_index(), None);
        assert!(segment_files(dir.path()).is_empty());
        wal.append(&[entry(3, 1)])?;
    }
    let (_, recovered) = open(dir.path(), None, 64);
    assert_eq!(ids(&recovered.entries), vec![(3, 1)]);
    Ok(())
}

#[test]
fn purge_deletes_only_segments_wholly_covered() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut wal, _) = open(dir.path(), None, 64);
    for i in 1..=6 {
        wal.append(&[entry(1, i)])?;
    }
    // Segments: [1,2] [3,4] [5,6].
    assert_eq!(wal.purgeable(3), 1);
    wal.purge(3)?;
    assert_eq!(
        segment_files(dir.path()),
        vec![segment_name(3), segment_name(5)]
    );
    drop(wal);
    let (mut wal, recovered) = open(dir.path(), Some(3), 64);
    assert_eq!(ids(&recovered.entries), vec![(1, 4), (1, 5), (1, 6)]);
    // A purge beyond the end (a snapshot installed past the log) empties it.
    wal.purge(9)?;
    assert!(segment_files(dir.path()).is_empty());
    wal.append(&[entry(2, 10)])?;
    drop(wal);
    let (_, recovered) = open(dir.path(), Some(9), 64);
    assert_eq!(ids(&recovered.entries), vec![(2, 10)]);
    Ok(())
}

/// Bytes of the file holding entry `index`, and the record's offset.
fn record_of(dir: &Path, index: u64) -> (PathBuf, u64) {
    let (wal, _) = open(dir, None, SEGMENT_BYTES);
    for segment in &wal.segments {
        if let Some(i) = index.checked_sub(segment.first)
            && let Some(at) = segment.offsets.get(i as usize)
        {
            return (segment.path.clone(), *at);
        }
    }
    panic!("no entry {index}");
}

fn poke(path: &Path, at: u64, bytes: &[u8]) {
    let file = OpenOptions::new().write(true).open(path).expect("open");
    file.write_all_at(bytes, at).expect("write");
}

#[test]
fn a_torn_last_record_is_reported_then_cleared() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let (mut wal, _) = open(dir.path(), None, SEGMENT_BYTES);
        wal.append(&[entry(1, 1), entry(1, 2), entry(1, 3)])?;
    }
    let (path, at) = record_of(dir.path(), 3);
    poke(&path, at + 6, &[0xff]);
    let (mut wal, recovered) = open(dir.path(), None, SEGMENT_BYTES);
    assert_eq!(ids(&recovered.entries), vec![(1, 1), (1, 2)]);
    let torn = recovered.torn_tail.expect("a torn tail");
    assert!(torn.contains("entry 3"), "{torn}");
    wal.repair()?;
    wal.append(&[entry(2, 3)])?;
    drop(wal);
    let (_, recovered) = open(dir.path(), None, SEGMENT_BYTES);
    assert_eq!(ids(&recovered.entries), vec![(1, 1), (1, 2), (2, 3)]);
    assert!(recovered.torn_tail.is_none());
    Ok(())
}

#[test]
fn damage_before_the_last_segment_refuses_open() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let (mut wal, _) = open(dir.path(), None, 64);
        for i in 1..=4 {
            wal.append(&[entry(1, i)])?;
        }
    }
    let (path, at) = record_of(dir.path(), 2);
    poke(&path, at + 6, &[0xff]);
    let err = Wal::open(dir.path(), None, 64, true)
        .err()
        .expect("refused");
    assert!(err.contains("entry 2") && err.contains(".seg"), "{err}");
    Ok(())
}

#[test]
fn a_missing_segment_is_a_hole() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    {
        // One-byte segments: every append starts a new one.
        let (mut wal, _) = open(dir.path(), None, 1);
        for i in 1..=3 {
            wal.append(&[entry(1, i)])?;
        }
    }
    assert_eq!(
        segment_files(dir.path()),
        vec![segment_name(1), segment_name(2), segment_name(3)]
    );
    // The first segment gone: a hole after the purge point (none purged, or up to 0).
    let first = dir.path().join(segment_name(1));
    let saved = fs::read(&first)?;
    fs::remove_file(&first)?;
    for purged in [None, Some(0)] {
        let err = Wal::open(dir.path(), purged, 1, true)
            .err()
            .expect("refused");
        assert!(err.contains("hole"), "{err}");
    }
    // Purged up to 1, the segment is no longer needed.
    assert!(Wal::open(dir.path(), Some(1), 1, true).is_ok());
    // A segment in the middle gone.
    fs::write(&first, saved)?;
    fs::remove_file(dir.path().join(segment_name(2)))?;
    let err = Wal::open(dir.path(), None, 1, true).err().expect("refused");
    assert!(err.contains("hole"), "{err}");
    Ok(())
}

#[test]
fn a_record_under_the_wrong_index_refuses_open() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let (mut wal, _) = open(dir.path(), None, SEGMENT_BYTES);
        wal.append(&[entry(1, 1), entry(1, 2)])?;
    }
    // Overwrite record 2 with a record of the same size that says it is entry 7.
    let (path, at) = record_of(dir.path(), 2);
    let value = encode_value(&entry(1, 7))?;
    let mut record = (value.len() as u32).to_le_bytes().to_vec();
    record.extend_from_slice(&value);
    poke(&path, at, &record);
    let err = Wal::open(dir.path(), None, SEGMENT_BYTES, true)
        .err()
        .expect("refused");
    assert!(err.contains("holds entry 7"), "{err}");
    Ok(())
}

#[test]
fn a_segment_torn_at_creation_is_removed() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let (mut wal, _) = open(dir.path(), None, 64);
        wal.append(&[entry(1, 1)])?;
    }
    // A crash after the file was created, before its header was durable.
    let torn = dir.path().join(segment_name(2));
    fs::write(&torn, vec![0u8; 64])?;
    let (mut wal, recovered) = open(dir.path(), None, 64);
    assert_eq!(ids(&recovered.entries), vec![(1, 1)]);
    assert!(torn.exists(), "kept until repair");
    wal.repair()?;
    assert!(!torn.exists());
    wal.append(&[entry(1, 2)])?;
    // The same before any other segment: a segment that is not last is refused instead.
    drop(wal);
    fs::write(dir.path().join(segment_name(0)), vec![0u8; 64])?;
    assert!(Wal::open(dir.path(), None, 64, true).is_err());
    Ok(())
}
