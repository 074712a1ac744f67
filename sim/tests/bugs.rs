//! The simulator finds bugs conch really had: each is put back (`--bug`) and the seeds of the
//! test budget are run until one fails. The seed that found each is in the README's table.
//!
//! A seed's faults are drawn from the seed alone, but which of them a bug needs to meet depends
//! on the schedule of conch's own tasks: any change to those moves the seed that finds a rare
//! bug, and a budget that found it before may not. Two bugs are rare per seed under the full
//! fault mix (about one seed in three hundred), so their tests start at the seed known to find
//! them on this build, a few seeds early, or use the first mix, where the misroute fault finds
//! its bug sooner. When a change moves them, search again in release (`conch-sim --bug NAME
//! --seeds 600 --first-seed 1 --until-failure`) and move the window.

use std::process::Command;

/// At most this many seeds per bug found from seed 1: more than either needs, few enough for
/// `make test`.
const MAX_SEEDS: &str = "40";

fn first_failure(bug: &str, seeds: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(env!("CARGO_BIN_EXE_conch-sim"))
        .args(["--bug", bug])
        .args(seeds)
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
    assert_found_within(bug, what, &["--seeds", MAX_SEEDS, "--first-seed", "1"])
}

fn assert_found_within(bug: &str, what: &str, seeds: &[&str]) -> anyhow::Result<()> {
    let out = first_failure(bug, seeds)?;
    assert!(out.contains("FAILED"), "{bug} found with {seeds:?}: {out}");
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
    // Seed 43 with the first mix (seed 269 with the full one).
    let seeds = ["--fault-mix", "1", "--seeds", "60", "--first-seed", "1"];
    assert_found_within("misrouted-replies", "panicked", &seeds)
}

#[test]
fn a_phantom_hold_is_found() -> anyhow::Result<()> {
    assert_found("phantom-hold", "VIOLATION [phantom-hold]")
}

#[test]
fn stale_reads_after_every_node_lost_power_are_found() -> anyhow::Result<()> {
    // It needs a lost commit index and a read right after the restart: seed 210.
    let seeds = ["--seeds", "20", "--first-seed", "201"];
    assert_found_within("stale-read-after-restart", "VIOLATION", &seeds)
}
