//! Jepsen-style fault injection and safety checking against real `conchd` processes.
//!
//! - the cluster: 3 or 5 nodes whose peer links all pass through fault proxies
//!   ([`crate::cluster`], [`conch_testkit::proxy`]);
//! - [`nemesis`]: a seeded sequence of faults (kill -9, SIGSTOP, partitions either way, slow
//!   links, wall-clock steps, a full data disk);
//! - [`workload`]: ≥16 clients with kept-alive leases acquiring and releasing small weights;
//! - [`locks`]: lock clients beside them, shared and exclusive locks on a small tree of paths,
//!   and the lock checks;
//! - [`history`]: every operation as invoke / ok / fail / unknown;
//! - [`checker`]: the safety checks on the history;
//! - [`run`]: one run end to end, with the final drain, agreement and liveness checks;
//! - [`cli_holders`]: `conch sema` holders beside the workload, and the `pause-client` fault;
//! - [`adversary`]: a caller that is not a member, forging peer messages throughout.
//!
//! Used by `conch-jepsen` and by `tests/it/jepsen.rs`.

pub mod adversary;
pub mod checker;
pub mod cli_holders;
pub mod history;
pub mod locks;
pub mod nemesis;
pub mod run;
pub mod sync_workload;
pub mod workload;

/// The seed to use: `--seed`, else `CONCH_SEED`, else a fresh one.
pub fn seed_from(flag: Option<u64>) -> anyhow::Result<u64> {
    if let Some(seed) = flag {
        return Ok(seed);
    }
    match std::env::var("CONCH_SEED") {
        Ok(text) if !text.trim().is_empty() => text
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("CONCH_SEED must be an unsigned integer, got {text:?}")),
        _ => Ok(crate::rng::Rng::fresh_seed()),
    }
}
