//! Where the node's random choices come from: the operating system, unless the program running
//! the node has seeded this thread ([`seed_thread`]), as the simulator does so that one seed
//! replays one execution.
//!
//! Three things draw from it: the secret part of a new lease id, the jitter of a forwarded
//! call's back-off, and Raft's randomized election timeout (through the openraft runtime in `raft/runtime.rs`).
//! Nothing here is for keys or tokens: those always come from the operating system.
//!
//! Without `--cfg tokio_unstable` (the release; `SIM_HOOKS` in lib.rs) every draw is the operating system's.

use std::cell::Cell;

thread_local! {
    /// The state of this thread's seeded generator, if seeded.
    static SEEDED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Makes every later draw on this thread follow `seed`, until [`unseed_thread`].
pub fn seed_thread(seed: u64) {
    SEEDED.with(|s| s.set(Some(seed)));
}

/// Returns this thread to the operating system's randomness.
pub fn unseed_thread() {
    SEEDED.with(|s| s.set(None));
}

/// Whether this thread draws from a seed.
pub(crate) fn is_seeded() -> bool {
    crate::SIM_HOOKS && SEEDED.with(|s| s.get().is_some())
}

/// 64 random bits: from this thread's seed if it has one, else from the operating system.
pub fn random_u64() -> Result<u64, getrandom::Error> {
    if !crate::SIM_HOOKS {
        return os_u64();
    }
    if let Some((next, out)) = SEEDED.with(|s| s.get().map(splitmix64)) {
        SEEDED.with(|s| s.set(Some(next)));
        return Ok(out);
    }
    os_u64()
}

/// 64 random bits from the operating system.
fn os_u64() -> Result<u64, getrandom::Error> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

/// One step of SplitMix64: the next state and the output drawn from it.
fn splitmix64(state: u64) -> (u64, u64) {
    let next = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = next;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (next, z ^ (z >> 31))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draw() -> anyhow::Result<u64> {
        random_u64().map_err(|e| anyhow::anyhow!("{e}"))
    }

    #[test]
    fn a_seeded_thread_repeats_its_draws_and_an_unseeded_one_does_not() -> anyhow::Result<()> {
        seed_thread(42);
        let first: Vec<u64> = (0..4).map(|_| draw()).collect::<Result<_, _>>()?;
        seed_thread(42);
        let again: Vec<u64> = (0..4).map(|_| draw()).collect::<Result<_, _>>()?;
        assert_eq!(first, again);
        assert!(
            first.windows(2).all(|w| w[0] != w[1]),
            "draws differ: {first:?}"
        );
        seed_thread(43);
        assert_ne!(draw()?, first[0], "another seed, another stream");
        unseed_thread();
        assert!(!is_seeded());
        let os: Vec<u64> = (0..4).map(|_| draw()).collect::<Result<_, _>>()?;
        assert_ne!(os, first);
        Ok(())
    }
}
