//! Jepsen-style fault injection and safety checking against real `conchd` processes
//! (issue 5 §1–§4, SPEC §6).
//!
//! - [`cluster`]: 3 or 5 nodes whose peer links all pass through [`proxy`]s;
//! - [`nemesis`]: a seeded sequence of faults (kill -9, SIGSTOP, partitions, slow links);
//! - [`workload`]: ≥16 clients with kept-alive leases acquiring and releasing small weights;
//! - [`history`]: every operation as invoke / ok / fail / unknown;
//! - [`checker`]: the safety checks on the history;
//! - [`run`]: one run end to end, with the final drain, agreement and liveness checks.
//!
//! Included with `#[path]` by `src/bin/conch-jepsen.rs` and `tests/jepsen.rs` (the library of
//! this crate is someone else's).

pub mod checker;
pub mod cluster;
pub mod history;
pub mod nemesis;
pub mod proxy;
pub mod rng;
pub mod run;
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
        _ => Ok(rng::Rng::fresh_seed()),
    }
}
