//! The simulator finds bugs conch really had: each is put back (`--bug`) and the seeds of the
//! test budget are run until one fails. The seed that found each is in BENCHMARKS.md.

use std::process::Command;

/// At most this many seeds per bug: more than any of them has needed, few enough for `make
/// test`.
const MAX_SEEDS: &str = "40";
/// A stale read after every node lost power needs a lost commit index and a read right after
/// the restart: since followers forward on a stream it first shows at seed 71.
const STALE_READ_SEEDS: &str = "90";

fn first_failure(bug: &str, seeds: &str) -> anyhow::Result<String> {
    let output = Command::new(env!("CARGO_BIN_EXE_conch-sim"))
        .args(["--bug", bug, "--seeds", seeds, "--first-seed", "1"])
        .args(["--until-failure", "--jobs", "2"])
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(
        output.status.code(),
        Some(1),
        "a failing seed makes the run fail: {stdout}"
    );
    Ok(stdout)
}

fn assert_found(bug: &str, what: &str) -> anyhow::Result<()> {
    assert_found_within(bug, what, MAX_SEEDS)
}

fn assert_found_within(bug: &str, what: &str, seeds: &str) -> anyhow::Result<()> {
    let out = first_failure(bug, seeds)?;
    assert!(
        out.contains("FAILED"),
        "{bug} found within {seeds} seeds: {out}"
    );
    assert!(out.contains(what), "{bug} shows as {what:?}: {out}");
    assert!(
        out.contains(&format!("--bug {bug}")),
        "the replay command puts the bug back: {out}"
    );
    Ok(())
}

#[test]
fn leases_on_the_wall_clock_are_found() -> anyhow::Result<()> {
    assert_found("wall-clock-leases", "VIOLATION")
}

#[test]
fn replies_from_a_misrouted_address_are_found() -> anyhow::Result<()> {
    assert_found("misrouted-replies", "panicked")
}

#[test]
fn a_phantom_hold_is_found() -> anyhow::Result<()> {
    assert_found("phantom-hold", "VIOLATION [phantom-hold]")
}

#[test]
fn stale_reads_after_every_node_lost_power_are_found() -> anyhow::Result<()> {
    assert_found_within("stale-read-after-restart", "VIOLATION", STALE_READ_SEEDS)
}
