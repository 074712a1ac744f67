//! The pause between two tries of a call that found no leader where it looked
//! (`Node::commit_anywhere`, `Node::read_index`).
//!
//! Invariants:
//! - a pause ends when the metrics name another leader or term than the one tried, or when its
//!   back-off has passed, whichever comes first, and never later than the caller's deadline;
//! - news already there when the pause begins ends it at once; a change of the metrics that
//!   names the same leader and term (a vote being committed, a membership change) does not;
//! - back-off number `n` (from 0) lies in `[c/2, c]` where `c = min(BACKOFF_MAX,
//!   BACKOFF_FIRST * 2^n)`: followers that lost the same leader do not retry in lockstep, and
//!   none waits less than half its ceiling.
//!
//! The receiver is made once per call and marked seen, so `changed()` reports only what
//! changed after that. (A freshly cloned receiver reports a change at once: a retry loop that
//! waited on one never waited at all.) It watches Raft's server metrics, which change only with
//! the vote, the leader, the role or the membership, not with every appended entry.

use std::time::Duration;

use openraft::BasicNode;
use openraft::metrics::RaftServerMetrics;
use tokio::sync::watch;
use tokio::time::Instant;

use super::LeaderInfo;
use crate::raft::NodeId;

/// The ceiling of the first back-off.
const BACKOFF_FIRST: Duration = Duration::from_millis(5);
/// The highest ceiling: about a heartbeat, so a new leader is found within one.
const BACKOFF_MAX: Duration = Duration::from_millis(100);

pub(super) type ServerMetrics = RaftServerMetrics<NodeId, BasicNode>;

/// Why a pause ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Woken {
    /// The metrics name another leader or term than the one tried.
    News,
    /// The back-off, or the caller's deadline, passed without news.
    BackedOff,
    /// Raft has stopped.
    Closed,
}

/// The pauses of one call, from its first retry to its last.
pub(super) struct LeaderWait {
    metrics: watch::Receiver<ServerMetrics>,
    retries: u32,
}

impl LeaderWait {
    /// Starts watching `metrics` from their current value.
    pub(super) fn new(mut metrics: watch::Receiver<ServerMetrics>) -> LeaderWait {
        metrics.borrow_and_update();
        LeaderWait {
            metrics,
            retries: 0,
        }
    }

    /// The ceiling of back-off number `retry` (from 0), before jitter.
    fn ceiling(retry: u32) -> Duration {
        let factor = 1u32.checked_shl(retry.min(16)).unwrap_or(u32::MAX);
        BACKOFF_FIRST.saturating_mul(factor).min(BACKOFF_MAX)
    }

    /// The next back-off, and advances.
    fn next_backoff(&mut self) -> Duration {
        let ceiling = Self::ceiling(self.retries);
        self.retries = self.retries.saturating_add(1);
        let half = ceiling / 2;
        // Jitter from `entropy.rs` (seeded under simulation); without randomness, none.
        let draw = crate::sim_hooks::entropy::random_u64().unwrap_or(0);
        let frac = (draw % 1_000_001) as f64 / 1_000_000.0;
        half + half.mul_f64(frac)
    }

    /// Pauses after `tried` did not take the call (it no longer leads, or cannot be reached),
    /// until there is news of the leader, the next back-off has passed, or `deadline`.
    pub(super) async fn after_refusal(&mut self, tried: &LeaderInfo, deadline: Instant) -> Woken {
        let until = deadline.min(Instant::now() + self.next_backoff());
        loop {
            if names_other_than(&self.metrics.borrow_and_update(), tried) {
                return Woken::News;
            }
            match tokio::time::timeout_at(until, self.metrics.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) => return Woken::Closed,
                Err(_) => return Woken::BackedOff,
            }
        }
    }
}

/// True when `metrics` name another leader or term than `tried`.
fn names_other_than(metrics: &ServerMetrics, tried: &LeaderInfo) -> bool {
    let term = metrics.vote.leader_id.get_term();
    (metrics.current_leader, term) != (Some(tried.id), tried.term)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use openraft::{ServerState, StoredMembership, Vote};

    use super::*;

    /// Server metrics of node 1 that name `leader` in `term`.
    fn seen(leader: Option<NodeId>, term: u64) -> ServerMetrics {
        RaftServerMetrics {
            id: 1,
            vote: Vote::new_committed(term, leader.unwrap_or(1)),
            state: ServerState::Follower,
            current_leader: leader,
            membership_config: Arc::new(StoredMembership::default()),
        }
    }

    fn leader(id: NodeId, term: u64) -> LeaderInfo {
        LeaderInfo {
            id,
            addr: format!("127.0.0.1:{}", 7000 + id),
            term,
        }
    }

    const FAR: Duration = Duration::from_secs(3600);

    #[test]
    fn ceilings_double_from_5_ms_up_to_100_ms() {
        let ceilings: Vec<u128> = (0..8).map(|n| LeaderWait::ceiling(n).as_millis()).collect();
        assert_eq!(ceilings, [5, 10, 20, 40, 80, 100, 100, 100]);
        assert_eq!(LeaderWait::ceiling(u32::MAX), BACKOFF_MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn without_news_each_pause_lasts_its_backoff() {
        // t=0   node 2 leads term 3, and is refused
        // each pause ends by its back-off, within [ceiling/2, ceiling]
        let (_tx, rx) = watch::channel(seen(Some(2), 3));
        let mut wait = LeaderWait::new(rx);
        let tried = leader(2, 3);
        for n in 0..8 {
            let began = Instant::now();
            let woken = wait.after_refusal(&tried, began + FAR).await;
            let paused = began.elapsed();
            let ceiling = LeaderWait::ceiling(n);
            assert_eq!(woken, Woken::BackedOff, "pause {n}");
            assert!(
                paused >= ceiling / 2 && paused <= ceiling + Duration::from_millis(1),
                "pause {n}: {paused:?} outside [{:?}, {ceiling:?}]",
                ceiling / 2
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_that_names_the_same_leader_does_not_end_the_pause() {
        // t=0    node 2 leads term 3, and is refused; the pause may last 5 ms at most
        // t=1ms  the metrics change (a vote uncommitted, then committed): same leader and term
        // the pause still lasts its back-off
        let (tx, rx) = watch::channel(seen(Some(2), 3));
        let mut wait = LeaderWait::new(rx);
        let stirring = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            tx.send_modify(|m| m.vote = Vote::new(3, 2));
            tx.send_modify(|m| m.vote = Vote::new_committed(3, 2));
            tx
        });
        let began = Instant::now();
        let woken = wait.after_refusal(&leader(2, 3), began + FAR).await;
        assert_eq!(woken, Woken::BackedOff);
        assert!(began.elapsed() >= LeaderWait::ceiling(0) / 2);
        drop(stirring.await);
    }

    #[tokio::test(start_paused = true)]
    async fn news_of_a_new_term_ends_the_pause_before_its_backoff() {
        // t=0      five pauses without news: the next back-off is at least 50 ms
        // +1ms     node 3 is elected in term 4
        // the pause ends then, well before its back-off
        let (tx, rx) = watch::channel(seen(Some(2), 3));
        let mut wait = LeaderWait::new(rx);
        let tried = leader(2, 3);
        for _ in 0..5 {
            let now = Instant::now();
            assert_eq!(
                wait.after_refusal(&tried, now + FAR).await,
                Woken::BackedOff
            );
        }
        let election = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            tx.send_replace(seen(Some(3), 4));
            tx
        });
        let began = Instant::now();
        let woken = wait.after_refusal(&tried, began + FAR).await;
        assert_eq!(woken, Woken::News);
        assert!(
            began.elapsed() < LeaderWait::ceiling(5) / 2,
            "{:?}",
            began.elapsed()
        );
        drop(election.await);
    }

    #[tokio::test(start_paused = true)]
    async fn news_from_before_the_pause_ends_it_at_once() {
        // t=0   the caller read "node 2 leads term 3"; meanwhile node 2 stepped down (no leader,
        //       term 4); the caller is refused by node 2 and pauses
        // the pause ends at once: there is news
        let (tx, rx) = watch::channel(seen(Some(2), 3));
        let mut wait = LeaderWait::new(rx);
        tx.send_replace(seen(None, 4));
        let began = Instant::now();
        assert_eq!(
            wait.after_refusal(&leader(2, 3), began + FAR).await,
            Woken::News
        );
        assert_eq!(began.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_cuts_a_pause_short() {
        let (_tx, rx) = watch::channel(seen(Some(2), 3));
        let mut wait = LeaderWait::new(rx);
        for _ in 0..6 {
            let now = Instant::now();
            wait.after_refusal(&leader(2, 3), now + FAR).await;
        }
        let began = Instant::now();
        let deadline = began + Duration::from_millis(2);
        assert_eq!(
            wait.after_refusal(&leader(2, 3), deadline).await,
            Woken::BackedOff
        );
        assert!(Instant::now() <= deadline + Duration::from_millis(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopped_raft_ends_the_pause() {
        let (tx, rx) = watch::channel(seen(Some(2), 3));
        let mut wait = LeaderWait::new(rx);
        drop(tx);
        let now = Instant::now();
        assert_eq!(
            wait.after_refusal(&leader(2, 3), now + FAR).await,
            Woken::Closed
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_that_keeps_refusing_is_retried_a_few_times_a_second_not_in_a_spin() {
        // t=0..3s  node 2 (term 3) refuses every call, and the metrics change every 1 ms
        //          without news, as a busy follower's would
        // the caller retries at most ~1 / (BACKOFF_MAX / 2) per second once backed off
        let (tx, rx) = watch::channel(seen(Some(2), 3));
        let stirring = tokio::spawn(async move {
            for i in 0..3000u64 {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let committed = i % 2 == 0;
                tx.send_modify(|m| {
                    m.vote = if committed {
                        Vote::new_committed(3, 2)
                    } else {
                        Vote::new(3, 2)
                    }
                });
            }
            tx
        });
        let mut wait = LeaderWait::new(rx);
        let tried = leader(2, 3);
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut retries = 0u32;
        while Instant::now() < deadline {
            // (the call to the leader, refused)
            retries += 1;
            assert_eq!(wait.after_refusal(&tried, deadline).await, Woken::BackedOff);
        }
        // Ceilings 5+10+20+40+80 ms, then 100 ms: at least 2.5+5+10+20+40 ms and 50 ms after.
        assert!((30..=65).contains(&retries), "{retries} retries in 3 s");
        drop(stirring.await);
    }
}
