//! Blocking file work (syncs, renames, snapshot files) off the async workers: on tokio's
//! blocking pool, or, on a thread that asked for it ([`run_inline_on_this_thread`]), right where
//! it is called. The simulator asks for that: work finishing on another thread would end at a
//! moment of real time, not of the simulation, and a seed would no longer replay one execution.
//!
//! Without `--cfg tokio_unstable` (the release; `SIM_HOOKS` in lib.rs) work always goes to the blocking pool.

use std::cell::Cell;

thread_local! {
    static INLINE: Cell<bool> = const { Cell::new(false) };
}

/// Makes [`unblock`] on this thread run its work inline (`true`) or on the blocking pool.
pub fn run_inline_on_this_thread(inline: bool) {
    INLINE.with(|i| i.set(inline));
}

/// Runs `work` on the blocking pool (or inline, see the module docs) and waits for it.
pub(crate) async fn unblock<T, F>(work: F) -> Result<T, tokio::task::JoinError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    if crate::SIM_HOOKS && INLINE.with(|i| i.get()) {
        return Ok(work());
    }
    tokio::task::spawn_blocking(work).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn inline_work_runs_on_the_calling_thread_and_pooled_work_does_not() -> anyhow::Result<()>
    {
        let here = std::thread::current().id();
        run_inline_on_this_thread(true);
        assert_eq!(unblock(|| std::thread::current().id()).await?, here);
        run_inline_on_this_thread(false);
        assert_ne!(unblock(|| std::thread::current().id()).await?, here);
        Ok(())
    }
}
