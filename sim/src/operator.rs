//! The operator: membership changes made through the admin API while the workload runs, the way
//! a person replaces a node: take it out of the cluster, then wipe its data directory, start it
//! empty, add it as a learner and make it a voter again. With version skew (see
//! [`crate::Skew`]) it also finishes a rolling upgrade: one node starts speaking cluster
//! version 1 only, as a node of the previous release; mid-run the operator checks that
//! finalizing is refused, "upgrades" the node (restarts it on the same data speaking this
//! build's newest version) and finalizes.
//!
//! The operator is a client host of its own. The fault plan gives it work
//! ([`Fault::Replace`](crate::Fault::Replace)), and so does the run's skew ([`upgrade`]); what
//! only the simulation can do (stop a node, wipe its directory, start it again) it asks of the
//! run's loop ([`take_wipe`], [`take_restart`]). Its work is done in order, one change at a
//! time, each retried until the cluster takes it.

use std::cell::RefCell;
use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::conch::{AddLearnerRequest, ChangeMembershipRequest, FinalizeUpgradeRequest};
use tonic::Code;

/// The cluster version a node of the previous release speaks, and the newest this build does.
const PREVIOUS_VERSION: u32 = 1;
const NEWEST_VERSION: u32 = 2;

/// Work the plan gives the operator.
#[derive(Clone, Copy, Debug)]
enum Task {
    Remove(u64),
    AddBack(u64),
    /// Finish the rolling upgrade: finalize refused, the node that speaks less upgraded (if it
    /// is still a member), then finalized.
    Upgrade(u64),
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
    /// The node that speaks the previous release's cluster version only, until upgraded (or
    /// removed: it comes back empty on this build).
    capped: Option<u64>,
    /// A node the operator asked the run to restart on its data (an upgrade).
    restart: Option<u64>,
    /// What the operator did for the upgrade, said, with the simulated time of each step.
    upgrade_steps: Vec<String>,
    /// What went wrong in the upgrade, said in full.
    violations: Vec<String>,
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
        o.todo.is_empty() && !o.busy && o.wipe.is_none() && o.restart.is_none()
    })
}

/// Starts node `node` speaking the previous release's cluster version only, until upgraded.
/// No node of the thread may apply a newer cluster version meanwhile (checked by
/// `conchd::support::self_check`).
pub(crate) fn cap(node: u64) {
    OPERATOR.with(|o| o.borrow_mut().capped = Some(node));
    conchd::support::self_check::limit_cluster_version(Some((
        PREVIOUS_VERSION,
        format!("n{node} speaks cluster version {PREVIOUS_VERSION} at most and is a member"),
    )));
    step(format!(
        "n{node} starts speaking cluster version {PREVIOUS_VERSION} at most (the previous \
         release)"
    ));
}

/// Node `node` speaks this build's newest cluster version from its next start on.
fn uncap(node: u64, why: &str) {
    OPERATOR.with(|o| o.borrow_mut().capped = None);
    conchd::support::self_check::limit_cluster_version(None);
    step(format!("n{node} {why}"));
}

/// The newest cluster version node `node` speaks when it starts now, if less than this build's.
pub(crate) fn cluster_version_max(node: u64) -> Option<u32> {
    OPERATOR.with(|o| (o.borrow().capped == Some(node)).then_some(PREVIOUS_VERSION))
}

/// Asks the operator to finish the upgrade of node `node`.
pub(crate) fn upgrade(node: u64) {
    OPERATOR.with(|o| o.borrow_mut().todo.push_back(Task::Upgrade(node)));
}

/// The node the operator wants restarted on its data, if any (each once).
pub(crate) fn take_restart() -> Option<u64> {
    OPERATOR.with(|o| o.borrow_mut().restart.take())
}

/// The upgrade's steps, and what went wrong in it.
pub(crate) fn take_upgrade_report() -> (Vec<String>, Vec<String>) {
    OPERATOR.with(|o| {
        let mut o = o.borrow_mut();
        (
            std::mem::take(&mut o.upgrade_steps),
            std::mem::take(&mut o.violations),
        )
    })
}

fn step(said: String) {
    let at = turmoil::sim_elapsed().unwrap_or_default().as_secs_f64();
    OPERATOR.with(|o| {
        o.borrow_mut()
            .upgrade_steps
            .push(format!("{at:>9.3}s {said}"))
    });
}

fn violation(said: String) {
    OPERATOR.with(|o| {
        o.borrow_mut()
            .violations
            .push(format!("VIOLATION [upgrade] {said}"))
    });
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
                if cluster_version_max(node).is_some() {
                    // Replaced by a node of the new release: it is wiped and starts again.
                    uncap(
                        node,
                        "was removed: it comes back empty, speaking the newest version",
                    );
                }
            }
            (Some(Task::Upgrade(node)), _) => upgrade_node(nodes, node).await,
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

/// Finishes the rolling upgrade of node `node`: while it still speaks the previous version and
/// is a member, finalizing is refused; it is restarted on its data speaking this build's
/// newest version; then finalizing succeeds (retried until it does, as faults may hold a
/// member).
async fn upgrade_node(nodes: u64, node: u64) {
    let all: Vec<u64> = (1..=nodes).collect();
    if cluster_version_max(node).is_some() {
        // A finalize answered either way settles it; calls that did not reach a leader or
        // timed out are retried a few times, then the upgrade goes on.
        for turn in 0..10usize {
            match finalize_through(all[turn % all.len()]).await {
                Some(Ok(done)) => {
                    violation(format!(
                        "finalize succeeded (cluster version {} -> {}) while n{node} speaks \
                         cluster version {PREVIOUS_VERSION} at most",
                        done.previous_cluster_version, done.cluster_version
                    ));
                    break;
                }
                Some(Err(status)) if status.code() == Code::FailedPrecondition => {
                    step(format!("finalize refused: {}", status.message()));
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        uncap(
            node,
            "upgraded: restarted on its data, speaking the newest version",
        );
        OPERATOR.with(|o| o.borrow_mut().restart = Some(node));
        while OPERATOR.with(|o| o.borrow().restart.is_some()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let mut turn = 0usize;
    loop {
        let through = all[turn % all.len()];
        turn += 1;
        match finalize_through(through).await {
            Some(Ok(done)) if done.cluster_version == NEWEST_VERSION => {
                step(format!(
                    "finalized: cluster version {} -> {}",
                    done.previous_cluster_version, done.cluster_version
                ));
                return;
            }
            Some(Ok(done)) => {
                violation(format!(
                    "finalize with every node upgraded answered cluster version {}, not \
                     {NEWEST_VERSION}",
                    done.cluster_version
                ));
                return;
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// `ConchAdmin.FinalizeUpgrade` through node `through`: its answer, or `None` without one.
async fn finalize_through(
    through: u64,
) -> Option<Result<conch_proto::conch::FinalizeUpgradeResponse, tonic::Status>> {
    let channel = crate::channel_to(through).ok()?;
    let mut admin = ConchAdminClient::new(channel);
    tokio::time::timeout(
        Duration::from_secs(10),
        admin.finalize_upgrade(FinalizeUpgradeRequest {}),
    )
    .await
    .ok()
    .map(|answer| answer.map(tonic::Response::into_inner))
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
