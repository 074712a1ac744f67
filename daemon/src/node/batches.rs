//! Proposals gathered into batches (one Raft entry each, up to [`BATCH_MAX_CMDS`] commands), a
//! bounded number in flight at once, and each proposal answered with its own replies.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use super::{BATCH_MAX_CMDS, Proposal};
use crate::base::error::NodeError;
use crate::base::tasks::Tasks;
use crate::state::{Cmd, Reply};

/// Gathers the proposals from `rx` into batches and runs `handle` on each, on a task of its
/// own, with at most `limit` batches holding a permit at once. Returns when `rx` closes.
pub(super) async fn run_batches<F, Fut>(
    tasks: Tasks,
    mut rx: mpsc::Receiver<Proposal>,
    limit: usize,
    handle: F,
) where
    F: Fn(Vec<Proposal>, OwnedSemaphorePermit) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let in_flight = Arc::new(Semaphore::new(limit));
    loop {
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            return;
        };
        let Some(batch) = gather(&mut rx).await else {
            return;
        };
        tasks.spawn(handle(batch, permit));
    }
}

/// The commands of a batch of proposals, in order.
pub(super) fn all_cmds(proposals: &[Proposal]) -> Vec<Cmd> {
    proposals
        .iter()
        .flat_map(|p| p.cmds.iter().cloned())
        .collect()
}

/// Waits for a proposal, then takes those already queued behind it, up to [`BATCH_MAX_CMDS`]
/// commands. Proposals whose caller has gone (its deadline passed) are dropped unproposed: the
/// caller was answered with an error, and nothing of it is applied. `None` once the queue is
/// closed.
async fn gather(rx: &mut mpsc::Receiver<Proposal>) -> Option<Vec<Proposal>> {
    let mut batch = Vec::new();
    let mut cmd_count = 0;
    while batch.is_empty() {
        let first = rx.recv().await?;
        if !first.reply.is_closed() {
            cmd_count += first.cmds.len();
            batch.push(first);
        }
    }
    while cmd_count < BATCH_MAX_CMDS {
        match rx.try_recv() {
            Ok(p) if p.reply.is_closed() => {}
            Ok(p) => {
                cmd_count += p.cmds.len();
                batch.push(p);
            }
            Err(_) => break,
        }
    }
    Some(batch)
}

pub(super) fn answer(proposals: Vec<Proposal>, result: Result<(Vec<Reply>, u64), NodeError>) {
    let at = Instant::now();
    match result {
        Ok((replies, index)) => {
            let mut replies = replies.into_iter();
            for proposal in proposals {
                let mine: Vec<Reply> = replies.by_ref().take(proposal.cmds.len()).collect();
                let outcome = if mine.len() == proposal.cmds.len() {
                    Ok((mine, index))
                } else {
                    Err(NodeError::Internal(
                        "state machine returned too few replies".into(),
                    ))
                };
                let _ = proposal.reply.send((outcome, at));
            }
        }
        Err(e) => {
            for proposal in proposals {
                let _ = proposal.reply.send((Err(e.clone()), at));
            }
        }
    }
}
