//! Version skew: a node of the previous release's cluster version in a cluster not finalized,
//! upgraded mid-run, then finalized, under the full fault mix.

use std::time::Duration;

use conch_sim::{SKEW_ONE_IN, SimOptions, run_seed};

#[test]
fn a_node_speaking_the_previous_version_blocks_finalize_until_upgraded_and_the_seed_replays()
-> anyhow::Result<()> {
    let opts = SimOptions {
        duration: Duration::from_secs(12),
        skew: Some(true),
        ..SimOptions::new(20261204)
    };
    let skew = opts.version_skew().expect("skew on");
    let report = run_seed(&opts)?;
    assert!(
        report.passed(),
        "seed {}: {:#?}\nupgrade: {:#?}\nreplay: {}",
        opts.seed,
        report.violations,
        report.upgrade,
        opts.replay_command()
    );
    // The printed seed replays the same execution, skew included.
    let again = run_seed(&opts)?;
    assert_eq!(
        report.history_hash, again.history_hash,
        "same seed, same execution"
    );
    assert_eq!(report.upgrade, again.upgrade);
    let steps = report.upgrade.join("\n");
    let node = skew.node;
    for step in [
        format!("n{node} starts speaking cluster version 1 at most"),
        "finalize refused: cannot finalize the upgrade".to_string(),
        format!("n{node} upgraded: restarted on its data"),
        "finalized: cluster version 1 -> 2".to_string(),
    ] {
        assert!(steps.contains(&step), "no {step:?} in:\n{steps}");
    }
    Ok(())
}

#[test]
fn the_seed_decides_the_skew_unless_told() {
    let seeded: Vec<u64> = (1..=200)
        .filter(|seed| SimOptions::new(*seed).version_skew().is_some())
        .collect();
    println!("seeds with version skew: {seeded:?}");
    // About one seed in SKEW_ONE_IN, the same ones every time.
    let expected = 200 / SKEW_ONE_IN as usize;
    assert!(
        seeded.len() > expected / 2 && seeded.len() < expected * 2,
        "{} of 200 seeds: {seeded:?}",
        seeded.len()
    );
    let again: Vec<u64> = (1..=200)
        .filter(|seed| SimOptions::new(*seed).version_skew().is_some())
        .collect();
    assert_eq!(seeded, again);
    let seed = seeded[0];
    let skew = SimOptions::new(seed).version_skew().expect("seeded");
    assert!(
        skew.upgrade_at >= Duration::from_secs(9) && skew.upgrade_at <= Duration::from_secs(18)
    );
    let off = SimOptions {
        skew: Some(false),
        ..SimOptions::new(seed)
    };
    assert_eq!(off.version_skew(), None);
    assert!(
        off.replay_command().ends_with("--skew off"),
        "{}",
        off.replay_command()
    );
    // The first fault mix keeps its executions: no skew unless told.
    let first = SimOptions {
        mix: conch_sim::Mix::First,
        ..SimOptions::new(seed)
    };
    assert_eq!(first.version_skew(), None);
    assert!(!SimOptions::new(seed).replay_command().contains("--skew"));
}
