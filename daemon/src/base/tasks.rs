//! A node's tasks and how they stop.
//!
//! Every task a node starts (the proposer, forwarder and read-index loops, expiry, the leader
//! log, health, the metrics server and its connections, TLS file polling, the access control
//! bootstrap, the batches in flight) is spawned through the node's [`Tasks`]. [`Tasks::stop`]
//! tells them all to stop and returns once every one has ended, so nothing a node started
//! outlives it: no task keeps the node (and its state) alive, holds a port, or a file.
//!
//! What always holds: a task spawned here ends at the latest when [`Tasks::stop`] is called
//! (its future is dropped at its next await point); a task spawned after `stop` began is
//! dropped at once.

use std::future::Future;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The tasks of one node.
#[derive(Clone, Debug, Default)]
pub struct Tasks {
    /// Cancelled when the node begins to stop: calls that wait (blocking acquires, holder
    /// watches) end now, so the server's drain of in-flight calls is short.
    drain: CancellationToken,
    stop: CancellationToken,
    tracker: TaskTracker,
}

impl Tasks {
    pub fn new() -> Tasks {
        Tasks::default()
    }

    /// Runs `task` until it ends or the node stops, whichever comes first.
    pub fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let stop = self.stop.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = task => {}
            }
        });
    }

    /// Resolves once the node begins to stop ([`Tasks::drain`] or [`Tasks::stop`]).
    pub async fn stopping(&self) {
        self.drain.cancelled().await;
    }

    /// Whether the node has begun to stop. (the tests read it)
    #[cfg(test)]
    pub(crate) fn is_stopping(&self) -> bool {
        self.drain.is_cancelled()
    }

    /// The node begins to stop: whatever waits in [`Tasks::stopping`] ends; the tasks run on.
    pub fn drain(&self) {
        self.drain.cancel();
    }

    /// Tells every task to stop and waits until all have ended.
    pub async fn stop(&self) {
        self.drain.cancel();
        self.stop.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// How many tasks are running.
    pub fn running(&self) -> usize {
        self.tracker.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test(start_paused = true)]
    async fn stop_ends_every_task_and_waits_for_them() {
        let tasks = Tasks::new();
        let held = Arc::new(());
        let finished = Arc::new(AtomicBool::new(false));
        // A task that would run forever, holding a reference.
        let forever = Arc::clone(&held);
        tasks.spawn(async move {
            let _held = forever;
            std::future::pending::<()>().await;
        });
        // A task that ends by itself.
        let done = Arc::clone(&finished);
        tasks.spawn(async move { done.store(true, Ordering::SeqCst) });
        tokio::task::yield_now().await;
        assert!(finished.load(Ordering::SeqCst));
        assert_eq!(tasks.running(), 1);
        // Draining ends what waits for the stop, and nothing else.
        assert!(!tasks.is_stopping());
        tasks.drain();
        tasks.stopping().await;
        assert_eq!(tasks.running(), 1);
        assert_eq!(Arc::strong_count(&held), 2);
        tasks.stop().await;
        assert_eq!(tasks.running(), 0);
        assert_eq!(
            Arc::strong_count(&held),
            1,
            "the stopped task let go of what it held"
        );
        assert!(tasks.is_stopping());
        // Spawned after the stop: dropped at once.
        let late = Arc::clone(&held);
        tasks.spawn(async move {
            let _late = late;
            std::future::pending::<()>().await;
        });
        tokio::task::yield_now().await;
        assert_eq!(Arc::strong_count(&held), 1);
    }
}
