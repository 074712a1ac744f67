//! The semaphore a slot was taken in, watched while the command runs.
//!
//! A holder's slot is only as good as its semaphore: deleted (or deleted and made again), the
//! hold is gone, though the lease lives on; given more permits, others are let in beside the
//! holder. So while the command runs, conch reads the semaphore about every TTL/3 (the lease's
//! refresh interval: one cheap read beside each refresh write) and compares it with the one it
//! queued in:
//!
//! - not found (the semaphore, or its namespace): deleted;
//! - another creation time: deleted, and made again by someone (holding nothing of ours);
//! - other permits than the run asked for: resized.
//!
//! A read that fails (no node answers, a timeout) says nothing: the lease's own keep-alive
//! decides when an unreachable cluster means the slot is lost. A change is therefore seen
//! within one interval plus one read after it is applied, while the cluster answers.

use std::time::Duration;

use conch_client::Client;
use conch_client::proto::grackle::Semaphore;
use tracing::debug;

/// The semaphore as the slot was taken in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    pub namespace: String,
    pub semaphore: String,
    /// The permits the run asked for (`--max`; 1 for an election).
    pub permits: u64,
    /// When it was created (ns since the Unix epoch), as read when conch queued.
    pub created_at: i64,
}

/// How the semaphore differs from the one the slot was taken in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// Gone, or gone and made again.
    Deleted,
    /// It has `now` permits instead of the run's.
    Permits { now: u64 },
}

impl Held {
    /// The semaphore as read when conch queued, for a run that asked for `permits`.
    pub(crate) fn new(namespace: &str, semaphore: &Semaphore, permits: u64) -> Held {
        Held {
            namespace: namespace.to_string(),
            semaphore: semaphore.name.clone(),
            permits,
            created_at: semaphore.created_at,
        }
    }

    /// How `now` (`None`: not found) differs from the semaphore the slot was taken in.
    pub(crate) fn compare(&self, now: Option<&Semaphore>) -> Option<Change> {
        match now {
            None => Some(Change::Deleted),
            Some(s) if s.created_at != self.created_at => Some(Change::Deleted),
            Some(s) if s.permits != self.permits => Some(Change::Permits { now: s.permits }),
            Some(_) => None,
        }
    }

    /// What happened, for a line after `conch: ` that goes on with when it happened:
    /// `semaphore conch/x.1 was deleted` or `semaphore conch/x.1 permits changed from 1 to 5`.
    pub(crate) fn describe(&self, change: &Change) -> String {
        let what = match change {
            Change::Deleted => "was deleted".to_string(),
            Change::Permits { now } => format!("permits changed from {} to {now}", self.permits),
        };
        format!("semaphore {}/{} {what}", self.namespace, self.semaphore)
    }

    /// Reads the semaphore once: `Ok(Some(change))` if it is no longer the one held.
    pub(crate) async fn check(&self, client: &Client) -> conch_client::Result<Option<Change>> {
        match client.get_semaphore(&self.namespace, &self.semaphore).await {
            Ok(now) => Ok(self.compare(Some(&now))),
            Err(e) if e.is_not_found() => Ok(self.compare(None)),
            Err(e) => Err(e),
        }
    }

    /// Reads the semaphore every `every` until it is no longer the one held, and says how.
    /// Never resolves while it stays the same (or cannot be read).
    pub(crate) async fn changed(&self, client: &Client, every: Duration) -> Change {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.check(client).await {
                Ok(Some(change)) => return change,
                Ok(None) => {}
                Err(e) => debug!(error = %e, semaphore = %self.semaphore, "semaphore check failed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn semaphore(permits: u64, created_at: i64) -> Semaphore {
        Semaphore {
            name: "jobs.1".into(),
            permits,
            created_at,
            ..Default::default()
        }
    }

    #[test]
    fn deletion_recreation_and_resizing_are_told_apart_from_other_changes() {
        // t=0  slot taken in conch/jobs.1, created at 100, 1 permit
        let held = Held::new("conch", &semaphore(1, 100), 1);
        // unchanged, or changed in ways that leave the slot alone (holds, version)
        let mut same = semaphore(1, 100);
        same.active_holds = 1;
        same.version = 7;
        assert_eq!(held.compare(Some(&same)), None);
        // deleted; deleted and made again (even with the same permits)
        assert_eq!(held.compare(None), Some(Change::Deleted));
        assert_eq!(
            held.compare(Some(&semaphore(1, 200))),
            Some(Change::Deleted)
        );
        assert_eq!(
            held.compare(Some(&semaphore(5, 200))),
            Some(Change::Deleted)
        );
        // resized up or down
        assert_eq!(
            held.compare(Some(&semaphore(5, 100))),
            Some(Change::Permits { now: 5 })
        );
        let two = Held::new("team-a", &semaphore(2, 100), 2);
        assert_eq!(
            two.compare(Some(&semaphore(1, 100))),
            Some(Change::Permits { now: 1 })
        );
    }

    #[test]
    fn the_line_names_the_semaphore_and_the_change() {
        let held = Held::new("conch", &semaphore(1, 100), 1);
        assert_eq!(
            held.describe(&Change::Deleted),
            "semaphore conch/jobs.1 was deleted"
        );
        assert_eq!(
            held.describe(&Change::Permits { now: 5 }),
            "semaphore conch/jobs.1 permits changed from 1 to 5"
        );
    }
}
