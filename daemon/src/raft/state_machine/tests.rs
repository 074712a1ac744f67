//! Tests of the state machine adapter: the snapshot envelope and its versions, damaged snapshot
//! files, installing snapshots, applying entries and reopening.

use std::collections::BTreeSet;

use openraft::{CommittedLeaderId, Membership};

use super::*;
use crate::state::Batch;

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn voters(ids: &[u64]) -> Membership<NodeId, BasicNode> {
    let set: BTreeSet<u64> = ids.iter().copied().collect();
    Membership::new(vec![set], None)
}

fn meta(term: u64, index: u64) -> SnapshotMeta {
    SnapshotMeta {
        last_log_id: Some(log_id(term, index)),
        last_membership: StoredMembership::new(Some(log_id(1, 2)), voters(&[1, 2, 3])),
        snapshot_id: format!("{term}-{index}-1"),
    }
}

fn open(dir: &Path) -> Result<StateMachine, OpenError> {
    StateMachine::open(dir, AppliedState::new(State::new(), 0))
}

fn snapshot_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("snapshots"))
        .map(|listing| {
            listing
                .flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn envelope_round_trips_and_every_flipped_byte_is_caught() -> anyhow::Result<()> {
    let meta = meta(3, 40);
    let bytes = encode_envelope(&meta, b"opaque state bytes", 7)?;
    let (decoded, state) = decode_envelope(&bytes)?;
    assert_eq!(decoded, meta);
    assert_eq!(state, b"opaque state bytes");

    for i in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[i] ^= 0x01;
        assert!(
            decode_envelope(&damaged).is_err(),
            "flip at byte {i} went unnoticed"
        );
    }
    for len in 0..bytes.len() {
        assert!(
            decode_envelope(&bytes[..len]).is_err(),
            "truncation to {len} went unnoticed"
        );
    }
    Ok(())
}

/// An envelope laid out byte by byte, independent of [`encode_envelope`].
fn raw_envelope(version: u32, meta: &SnapshotMeta, state_section: &[u8]) -> Vec<u8> {
    let meta_bytes = bincode::serialize(meta).unwrap_or_default();
    let mut bytes = Vec::new();
    bytes.extend_from_slice(b"CONCHSNP");
    bytes.extend_from_slice(&version.to_le_bytes());
    bytes.extend_from_slice(&(meta_bytes.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&meta_bytes);
    bytes.extend_from_slice(&(state_section.len() as u64).to_le_bytes());
    bytes.extend_from_slice(state_section);
    let checksum = fnv1a64(&bytes);
    bytes.extend_from_slice(&checksum.to_le_bytes());
    bytes
}

/// A state with something in it, its snapshot encoding and its hash.
fn sample_state() -> anyhow::Result<(Vec<u8>, u64)> {
    let applied = AppliedState::new(State::new(), 0);
    let replies = applied.apply(
        1,
        &Batch {
            now_ns: 1_000,
            cmds: vec![crate::state::Cmd::CreateNamespace {
                name: "kept".into(),
                description: "from an older build".into(),
                metadata: Default::default(),
            }],
            wall_ns: 1_000,
        },
    );
    anyhow::ensure!(
        replies.iter().all(Result::is_ok),
        "sample command refused: {replies:?}"
    );
    Ok((applied.encode_snapshot()?.0, applied.read(State::hash)))
}

fn write_snapshot_file(dir: &Path, seq: u64, bytes: &[u8]) -> anyhow::Result<()> {
    let snapshots = dir.join("snapshots");
    std::fs::create_dir_all(&snapshots)?;
    std::fs::write(snapshots.join(format!("snap-{seq:020}.snap")), bytes)?;
    Ok(())
}

#[test]
fn the_version_written_follows_the_data_format_and_carries_the_bare_state_encoding()
-> anyhow::Result<()> {
    let (state, _) = sample_state()?;
    for (format, version) in [(7, 8), (8, 9)] {
        let bytes = encode_envelope(&meta(3, 40), &state, format)?;
        assert_eq!(bytes, raw_envelope(version, &meta(3, 40), &state));
        let (_, section) = decode_envelope(&bytes)?;
        assert_eq!(section, state.as_slice());
    }
    Ok(())
}

#[test]
fn a_snapshot_of_0_1_0_opens_and_every_version_not_kept_is_refused_in_one_line()
-> anyhow::Result<()> {
    let (state, hash) = sample_state()?;
    let dir = tempfile::tempdir()?;
    write_snapshot_file(dir.path(), 5, &raw_envelope(8, &meta(2, 1), &state))?;
    let opened = open(dir.path())?;
    assert_eq!(opened.applied.read(State::hash), hash);
    let this = crate::support::release::RELEASE;
    for (version, writer, advice) in [
        (
            6,
            "a development build of conch older than release 0.1.0",
            "start this node",
        ),
        (
            7,
            "a development build of conch older than release 0.1.0",
            "start this node",
        ),
        (
            10,
            "a newer release of conch",
            "run the release that wrote it, or a later one",
        ),
    ] {
        let dir = tempfile::tempdir()?;
        write_snapshot_file(dir.path(), 5, &raw_envelope(version, &meta(2, 1), &state))?;
        let Err(err) = open(dir.path()) else {
            anyhow::bail!("a version {version} snapshot was restored");
        };
        let message = err.to_string();
        anyhow::ensure!(
            message.starts_with(&format!(
                "{}: written by {writer} (snapshot version {version}); this build, conch \
                 {this}, reads snapshot versions 8 to 9: {advice}",
                dir.path()
                    .join("snapshots")
                    .join("snap-00000000000000000005.snap")
                    .display()
            )) && !message.contains('\n'),
            "{message}"
        );
    }
    Ok(())
}

#[test]
fn lengths_that_lie_are_rejected_even_with_a_valid_checksum() {
    // magic, version, meta_len = u64::MAX, then a correct checksum.
    let mut bytes = Vec::new();
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&8u32.to_le_bytes());
    bytes.extend_from_slice(&u64::MAX.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    let checksum = fnv1a64(&bytes);
    bytes.extend_from_slice(&checksum.to_le_bytes());
    assert!(matches!(
        decode_envelope(&bytes),
        Err(EnvelopeError::Length(_))
    ));
}

#[test]
fn garbage_snapshot_file_refuses_open_and_names_the_file() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("snapshots"))?;
    let file = dir
        .path()
        .join("snapshots")
        .join("snap-00000000000000000007.snap");
    std::fs::write(&file, b"this is not a snapshot at all, just some bytes")?;

    match open(dir.path()) {
        Err(e @ OpenError::Corrupt { .. }) => {
            assert!(
                e.to_string().contains("snap-00000000000000000007.snap"),
                "{e}"
            );
        }
        Err(other) => anyhow::bail!("expected Corrupt, got {other}"),
        Ok(_) => anyhow::bail!("a garbage snapshot was accepted"),
    }
    Ok(())
}

#[test]
fn truncated_snapshot_file_refuses_open() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("snapshots"))?;
    let bytes = encode_envelope(&meta(2, 9), &[7u8; 300], 7)?;
    let file = dir
        .path()
        .join("snapshots")
        .join("snap-00000000000000000003.snap");
    std::fs::write(&file, &bytes[..bytes.len() - 100])?;
    // A leftover partial write is dropped, not read.
    std::fs::write(
        dir.path()
            .join("snapshots")
            .join("snap-00000000000000000004.tmp"),
        b"x",
    )?;

    assert!(matches!(open(dir.path()), Err(OpenError::Corrupt { .. })));
    assert_eq!(
        snapshot_files(dir.path()),
        vec!["snap-00000000000000000003.snap"]
    );
    Ok(())
}

#[tokio::test]
async fn install_rejects_damaged_or_mismatched_snapshots_and_keeps_the_state() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let mut sm = open(dir.path())?;
    sm.apply([Entry::<TypeConfig> {
        log_id: log_id(1, 1),
        payload: EntryPayload::Membership(voters(&[1])),
    }])
    .await?;

    // Garbage.
    let garbage = Box::new(Cursor::new(b"garbage".to_vec()));
    assert!(sm.install_snapshot(&meta(2, 9), garbage).await.is_err());

    // A valid envelope announced under another meta.
    let bytes = encode_envelope(&meta(2, 9), b"state", 7)?;
    let other = meta(2, 10);
    assert!(
        sm.install_snapshot(&other, Box::new(Cursor::new(bytes)))
            .await
            .is_err()
    );

    assert_eq!(sm.applied_state().await?.0, Some(log_id(1, 1)));
    assert!(sm.get_current_snapshot().await?.is_none());
    assert!(snapshot_files(dir.path()).is_empty());
    Ok(())
}

#[tokio::test]
async fn blank_and_membership_entries_reply_empty_and_advance_applied() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let applied = AppliedState::new(State::new(), 0);
    let mut sm = StateMachine::open(dir.path(), Arc::clone(&applied))?;
    let replies = sm
        .apply([
            Entry::<TypeConfig> {
                log_id: log_id(1, 1),
                payload: EntryPayload::Blank,
            },
            Entry::<TypeConfig> {
                log_id: log_id(1, 2),
                payload: EntryPayload::Membership(voters(&[1, 2])),
            },
        ])
        .await?;
    assert_eq!(replies, vec![Vec::new(), Vec::new()]);
    assert_eq!(applied.applied_index(), 2);
    let (last, membership) = sm.applied_state().await?;
    assert_eq!(last, Some(log_id(1, 2)));
    assert_eq!(
        membership,
        StoredMembership::new(Some(log_id(1, 2)), voters(&[1, 2]))
    );
    Ok(())
}

// Needs the state machine's apply_batch and snapshot codec.
#[tokio::test]
async fn built_snapshot_is_restored_on_reopen() -> anyhow::Result<()> {
    // apply       membership {1,2,3} at (1,1), empty batch at (1,2), blank at (2,3)
    // build       -> one file; build again -> still one file (the newest)
    // reopen      -> applied index 3, last_applied (2,3), membership from (1,1)
    let dir = tempfile::tempdir()?;
    let built = {
        let mut sm = open(dir.path())?;
        sm.apply([
            Entry::<TypeConfig> {
                log_id: log_id(1, 1),
                payload: EntryPayload::Membership(voters(&[1, 2, 3])),
            },
            Entry::<TypeConfig> {
                log_id: log_id(1, 2),
                payload: EntryPayload::Normal(Batch {
                    now_ns: 5,
                    cmds: vec![],
                    wall_ns: 5,
                }),
            },
            Entry::<TypeConfig> {
                log_id: log_id(2, 3),
                payload: EntryPayload::Blank,
            },
        ])
        .await?;
        let first = sm.get_snapshot_builder().await.build_snapshot().await?;
        let second = sm.get_snapshot_builder().await.build_snapshot().await?;
        assert_ne!(first.meta.snapshot_id, second.meta.snapshot_id);
        assert_eq!(snapshot_files(dir.path()).len(), 1);
        let current = sm.get_current_snapshot().await?.map(|s| s.meta);
        assert_eq!(current.as_ref(), Some(&second.meta));
        second.meta
    };

    let applied = AppliedState::new(State::new(), 0);
    let mut sm = StateMachine::open(dir.path(), Arc::clone(&applied))?;
    assert_eq!(applied.applied_index(), 3);
    let (last, membership) = sm.applied_state().await?;
    assert_eq!(last, Some(log_id(2, 3)));
    assert_eq!(
        membership,
        StoredMembership::new(Some(log_id(1, 1)), voters(&[1, 2, 3]))
    );
    assert_eq!(
        sm.get_current_snapshot().await?.map(|s| s.meta),
        Some(built)
    );

    // A damaged state section (valid envelope) is refused too.
    let path = dir
        .path()
        .join("snapshots")
        .join(&snapshot_files(dir.path())[0]);
    let bytes = encode_envelope(&meta(2, 3), b"\xff\xff\xff not a state", 7)?;
    std::fs::write(&path, bytes)?;
    assert!(matches!(open(dir.path()), Err(OpenError::Corrupt { .. })));
    Ok(())
}
