//! The operator: membership changes made through the admin API while the workload runs, the way
//! a person replaces a node: take it out of the cluster, then wipe its data directory, start it
//! empty, add it as a learner and make it a voter again.
//!
//! The operator is a client host of its own. The fault plan gives it work
//! ([`Fault::Replace`](crate::Fault::Replace)); what only the simulation can do (stop a node,
//! wipe its directory, start it again) it asks of the run's loop ([`take_wipe`]). Its work is
//! done in order, one change at a time, each retried until the cluster takes it.

use std::cell::RefCell;
use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::conch::{AddLearnerRequest, ChangeMembershipRequest};
use tonic::Code;

/// Work the plan gives the operator.
#[derive(Clone, Copy, Debug)]
enum Task {
    Remove(u64),
    AddBack(u64),
}

#[derive(Default)]
struct Operator {
    todo: VecDeque<Task>,
    /// A task taken and not finished yet.
    busy: bool,
    /// A node the operator asked the run to stop, wipe and start empty.
    wipe: Option<u64>,
    /// Nodes that start empty and join a running cluster rather than bootstrap one.
    joining: BTreeSet<u64>,
    /// Set when the workload has finished: the operator's host ends once idle.
    done: bool,
}

thread_local! {
    static OPERATOR: RefCell<Operator> = RefCell::new(Operator::default());
}

/// Starts this thread's simulation with no membership work.
pub(crate) fn reset() {
    OPERATOR.with(|o| *o.borrow_mut() = Operator::default());
}

/// Asks the operator to take node `node` out of the cluster.
pub(crate) fn remove(node: u64) {
    OPERATOR.with(|o| o.borrow_mut().todo.push_back(Task::Remove(node)));
}

/// Asks the operator to bring node `node` back, empty, once its removal is done.
pub(crate) fn add_back(node: u64) {
    OPERATOR.with(|o| o.borrow_mut().todo.push_back(Task::AddBack(node)));
}

/// The node the operator wants stopped, wiped and started empty, if any (each once).
pub(crate) fn take_wipe() -> Option<u64> {
    OPERATOR.with(|o| o.borrow_mut().wipe.take())
}

/// Whether node `node` starts as a joining node (it was wiped and is being added back).
pub(crate) fn joins(node: u64) -> bool {
    OPERATOR.with(|o| o.borrow().joining.contains(&node))
}

pub(crate) fn mark_joining(node: u64) {
    OPERATOR.with(|o| o.borrow_mut().joining.insert(node));
}

/// Whether every change asked for is done.
pub(crate) fn idle() -> bool {
    OPERATOR.with(|o| {
        let o = o.borrow();
        o.todo.is_empty() && !o.busy && o.wipe.is_none()
    })
}

/// Tells the operator's host to end once idle.
pub(crate) fn finish() {
    OPERATOR.with(|o| o.borrow_mut().done = true);
}

/// The operator's host: takes the tasks in order until the workload has finished.
pub(crate) async fn run(nodes: u64) -> anyhow::Result<()> {
    loop {
        let next = OPERATOR.with(|o| {
            let mut o = o.borrow_mut();
            let next = o.todo.pop_front();
            o.busy = next.is_some();
            (next, o.done)
        });
        match next {
            (Some(Task::Remove(node)), _) => {
                let others = (1..=nodes).filter(|n| *n != node).collect::<Vec<_>>();
                change(&others, |mut admin| async move {
                    admin
                        .change_membership(ChangeMembershipRequest {
                            voters: vec![],
                            remove: vec![node],
                        })
                        .await
                        .map(drop)
                })
                .await;
            }
            (Some(Task::AddBack(node)), _) => {
                OPERATOR.with(|o| o.borrow_mut().wipe = Some(node));
                while OPERATOR.with(|o| o.borrow().wipe.is_some()) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let others = (1..=nodes).filter(|n| *n != node).collect::<Vec<_>>();
                let addr = crate::node_addr(node);
                change(&others, |mut admin| {
                    let addr = addr.clone();
                    async move {
                        admin
                            .add_learner(AddLearnerRequest {
                                node_id: node,
                                addr,
                            })
                            .await
                            .map(drop)
                    }
                })
                .await;
                change(&others, |mut admin| async move {
                    admin
                        .change_membership(ChangeMembershipRequest {
                            voters: (1..=nodes).collect(),
                            remove: vec![],
                        })
                        .await
                        .map(drop)
                })
                .await;
            }
            (None, true) => return Ok(()),
            (None, false) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
        OPERATOR.with(|o| o.borrow_mut().busy = false);
    }
}

/// Makes one membership change through the nodes `through`, in turn, until one answers that it
/// took it (or that there is nothing to do: the change was made by an earlier try whose answer
/// was lost).
async fn change<F, Fut>(through: &[u64], call: F)
where
    F: Fn(ConchAdminClient<cluster_tests::net::NodeChannel>) -> Fut,
    Fut: std::future::Future<Output = Result<(), tonic::Status>>,
{
    let mut turn = 0usize;
    loop {
        let node = through[turn % through.len()];
        turn += 1;
        let Ok(channel) = crate::channel_to(node) else {
            continue;
        };
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            call(ConchAdminClient::new(channel)),
        )
        .await;
        match answer {
            Ok(Ok(())) => return,
            Ok(Err(status)) if already_done(&status) => return,
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Whether a refusal says the change is in place already.
fn already_done(status: &tonic::Status) -> bool {
    status.code() == Code::InvalidArgument && status.message().contains("not a member")
}
