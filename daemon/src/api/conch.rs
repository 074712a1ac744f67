//! conch's own services: `ConchApi` (waiters in queue order, an administrator's revoke of a
//! holder, the audit trail) and `ConchAdmin` (cluster status,
//! membership, leadership, snapshots, backups). Admin calls need cluster-admin while access control is
//! on; a call forwarded to another node carries the caller's token, and that node checks it too.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use conch_proto::conch as cpb;
use conch_proto::conch::conch_admin_server::ConchAdmin;
use conch_proto::conch::conch_api_server::ConchApi;
use tonic::{Request, Response, Status};

use super::auth::{Caller, forward};
use super::convert;
use super::holder_watch::Ended;
use super::membership;
use super::status::ApiError;
use crate::base::error::NodeError;
use crate::node::{MembershipChange, Node};
use crate::state::audit::{AuditFilter, AuditRecord};
use crate::state::auth::{Access, Permission, token_id};
use crate::state::{Cmd, Error, ErrorKind, LeaseKind, Outcome};

pub(crate) struct ConchApiService {
    node: Arc<Node>,
    /// Holder watches per principal (see `admission.rs`).
    waiting: Arc<super::admission::Waiting>,
}

impl ConchApiService {
    pub(crate) fn new(node: Arc<Node>, waiting: Arc<super::admission::Waiting>) -> Self {
        ConchApiService { node, waiting }
    }
}

#[tonic::async_trait]
impl ConchApi for ConchApiService {
    async fn list_semaphore_waiters(
        &self,
        request: Request<cpb::ListSemaphoreWaitersRequest>,
    ) -> Result<Response<cpb::ListSemaphoreWaitersResponse>, Status> {
        let caller = Caller::of(&self.node, &request);
        let r = request.into_inner();
        caller.allow(
            &self.node,
            Access::Namespace(&r.namespace_name, Permission::Read),
        )?;
        self.node.linearizable().await.map_err(ApiError::from)?;
        let page = convert::page(r.pagination_token, r.limit);
        let ns = r.namespace_name.as_str();
        let (semaphore, page) = self
            .node
            .applied
            .read(|s| {
                let (semaphore, mut page) = s.list_waiters(ns, &r.semaphore_name, &page)?;
                for w in &mut page.items {
                    caller.hide_lease_id(s, ns, &mut w.lease_id, w.owner);
                }
                Ok::<_, crate::state::Error>((semaphore, page))
            })
            .map_err(ApiError::from)?;
        Ok(Response::new(cpb::ListSemaphoreWaitersResponse {
            waiters: page.items.into_iter().map(convert::waiter).collect(),
            next_pagination_token: page.next_token,
            previous_pagination_token: page.previous_token,
            semaphore: Some(convert::semaphore(semaphore)),
        }))
    }

    async fn list_lock_waiters(
        &self,
        request: Request<cpb::ListLockWaitersRequest>,
    ) -> Result<Response<cpb::ListLockWaitersResponse>, Status> {
        let caller = Caller::of(&self.node, &request);
        let r = request.into_inner();
        caller.allow(
            &self.node,
            Access::Namespace(&r.namespace_name, Permission::Read),
        )?;
        self.node.linearizable().await.map_err(ApiError::from)?;
        let page = convert::page(r.pagination_token, r.limit);
        let ns = r.namespace_name.as_str();
        let page = self
            .node
            .applied
            .read(|s| {
                let mut page = s.list_lock_waiters(ns, &r.lock_name, &page)?;
                for w in &mut page.items {
                    caller.hide_lease_id(s, ns, &mut w.lease_id, w.owner);
                }
                Ok::<_, crate::state::Error>(page)
            })
            .map_err(ApiError::from)?;
        Ok(Response::new(cpb::ListLockWaitersResponse {
            waiters: page.items.into_iter().map(convert::lock_waiter).collect(),
            next_pagination_token: page.next_token,
            previous_pagination_token: page.previous_token,
        }))
    }

    async fn acquire_semaphores(
        &self,
        request: Request<cpb::AcquireSemaphoresRequest>,
    ) -> Result<Response<cpb::AcquireSemaphoresResponse>, Status> {
        super::acquire_set::acquire_semaphores(&self.node, &self.waiting, request).await
    }

    async fn wait_holder_change(
        &self,
        request: Request<cpb::WaitHolderChangeRequest>,
    ) -> Result<Response<cpb::WaitHolderChangeResponse>, Status> {
        let caller = Caller::of(&self.node, &request);
        let principal = super::admission::Principal::of(&caller, &request);
        let r = request.into_inner();
        caller.allow(
            &self.node,
            Access::Namespace(&r.namespace_name, Permission::Read),
        )?;
        let timeout = std::time::Duration::from_millis(r.timeout_ms);
        let _waiting = match timeout.is_zero() {
            true => None,
            false => Some(self.waiting.enter(principal)?),
        };
        let mut now = super::holder_watch::wait(
            &self.node,
            &r.namespace_name,
            &r.semaphore_name,
            r.known_token,
            timeout,
        )
        .await?;
        self.node.applied.read(|s| {
            for h in &mut now.holders {
                caller.hide_lease_id(s, &r.namespace_name, &mut h.lease_id, h.owner);
            }
        });
        let (end, reason) = match now.known_ended {
            Ended::Unknown => (cpb::HolderEnd::Unknown, String::new()),
            Ended::Released => (cpb::HolderEnd::Released, String::new()),
            Ended::Expired => (cpb::HolderEnd::Expired, String::new()),
            Ended::LeaseRevoked => (cpb::HolderEnd::LeaseRevoked, String::new()),
            Ended::HoldLimit => (cpb::HolderEnd::HoldLimit, String::new()),
            Ended::Deleted => (cpb::HolderEnd::Deleted, String::new()),
            Ended::RevokedByAdmin { reason } => (cpb::HolderEnd::RevokedByAdmin, reason),
        };
        Ok(Response::new(cpb::WaitHolderChangeResponse {
            holders: now.holders.into_iter().map(convert::holder).collect(),
            exists: now.exists,
            known_holder_end: end as i32,
            known_holder_end_reason: reason,
        }))
    }

    type WatchLossStream = super::watch_loss::WatchLossStream;

    async fn watch_loss(
        &self,
        request: Request<cpb::WatchLossRequest>,
    ) -> Result<Response<Self::WatchLossStream>, Status> {
        let caller = Caller::of(&self.node, &request);
        let principal = super::admission::Principal::of(&caller, &request);
        let r = request.into_inner();
        let kind = super::watch_loss::kind(r.kind)?;
        crate::state::validate::name("namespace_name", &r.namespace_name)
            .map_err(ApiError::from)?;
        crate::state::validate::lease_id(&r.lease_id).map_err(ApiError::from)?;
        // The permission refreshing this lease needs, checked the same way.
        caller.allow_write(
            &self.node,
            &crate::state::Cmd::RefreshLease {
                ns: r.namespace_name.clone(),
                kind,
                lease: r.lease_id.clone(),
                ttl_s: 0,
            },
        )?;
        let permit = self.waiting.enter(principal)?;
        let stream = super::watch_loss::start(
            Arc::clone(&self.node),
            r.namespace_name,
            kind,
            r.lease_id,
            permit,
        )
        .await?;
        Ok(Response::new(stream))
    }

    async fn revoke_holder(
        &self,
        request: Request<cpb::RevokeHolderRequest>,
    ) -> Result<Response<cpb::RevokeHolderResponse>, Status> {
        let caller = Caller::of(&self.node, &request);
        let (id, r) = super::request_id::split(request)?;
        let kind = match cpb::HolderKind::try_from(r.kind) {
            Ok(cpb::HolderKind::Semaphore) => LeaseKind::Semaphore,
            Ok(cpb::HolderKind::Lock) => LeaseKind::Lock,
            Err(_) => {
                let invalid =
                    Error::invalid("kind must be HOLDER_KIND_SEMAPHORE or HOLDER_KIND_LOCK");
                return Err(ApiError::from(invalid).into());
            }
        };
        let cmd = Cmd::RevokeHolder {
            ns: r.namespace_name,
            kind,
            object: r.object_name,
            lease: r.lease_id,
            reason: r.reason,
        };
        let record = self.revoke(&caller, id, cmd).await?;
        Ok(Response::new(cpb::RevokeHolderResponse {
            record: Some(audit_record(record)),
        }))
    }

    async fn list_audit(
        &self,
        request: Request<cpb::ListAuditRequest>,
    ) -> Result<Response<cpb::ListAuditResponse>, Status> {
        let caller = Caller::of(&self.node, &request);
        let r = request.into_inner();
        caller.authenticated(&self.node)?;
        self.node.linearizable().await.map_err(ApiError::from)?;
        let filter = AuditFilter {
            namespace: r.namespace_name,
            lease: r.lease_id,
        };
        let page = convert::page(r.pagination_token, r.limit);
        let page = self.read_audit(&caller, &filter, &page)?;
        Ok(Response::new(cpb::ListAuditResponse {
            records: page.items.into_iter().map(audit_record).collect(),
            next_pagination_token: page.next_token,
        }))
    }
}

/// A trail record as `ConchApi` shows it.
fn audit_record(r: AuditRecord) -> cpb::AuditRecord {
    cpb::AuditRecord {
        seq: r.seq,
        at: r.at,
        actor: r.actor.name,
        actor_role: r.actor.role,
        actor_token_id: r.actor.token.map(token_id).unwrap_or_default(),
        action: r.action.as_str().to_string(),
        namespace_name: r.namespace,
        object_kind: r.object_kind.as_str().to_string(),
        object_name: r.object,
        lease_id: r.lease,
        holder: r.holder,
        reason: r.reason,
        detail: r.detail,
    }
}

impl ConchApiService {
    /// Proposes an administrator's revoke for `caller`, once per request id.
    async fn revoke(
        &self,
        caller: &Caller,
        id: Option<String>,
        cmd: Cmd,
    ) -> Result<AuditRecord, ApiError> {
        caller.allow_write(&self.node, &cmd)?;
        let cmd = super::request_id::wrap(id, caller.sign(cmd));
        cmd.validate()?;
        match self.node.write_one(cmd).await?? {
            Outcome::Audit(record) => Ok(record),
            other => Err(ApiError::Internal(format!("unexpected outcome {other:?}"))),
        }
    }

    /// The trail's page `page` matching `filter`, as `caller` may read it: everything with
    /// cluster-admin, or with admin on the namespace named; else only the records of a lease
    /// the caller's own token created, when it names the namespace and the lease.
    fn read_audit(
        &self,
        caller: &Caller,
        filter: &AuditFilter,
        page: &crate::state::PageRequest,
    ) -> Result<crate::state::Page<AuditRecord>, ApiError> {
        let token = caller.token();
        self.node.applied.read(|s| {
            let auth = s.auth();
            let allowed = |access| auth.authorize(token.as_ref(), access).is_ok();
            let ns = filter.namespace.as_str();
            if allowed(Access::ClusterAdmin)
                || (!ns.is_empty() && allowed(Access::Namespace(ns, Permission::Admin)))
            {
                return Ok(s.list_audit(filter, page, |_| true)?);
            }
            let me = token.as_ref().and_then(|t| auth.token_id(t));
            if ns.is_empty() || filter.lease.is_empty() || me.is_none() {
                return Err(ApiError::from(Error {
                    kind: ErrorKind::PermissionDenied,
                    message: "reading the audit trail needs cluster-admin, or admin on the \
                              namespace named; a holder may read the records of its own lease \
                              (name both the namespace and the lease)"
                        .into(),
                }));
            }
            auth.authorize(token.as_ref(), Access::Namespace(ns, Permission::Read))?;
            Ok(s.list_audit(filter, page, |r| r.lease_owner == me)?)
        })
    }
}

pub(crate) struct AdminService {
    node: Arc<Node>,
}

impl AdminService {
    pub(crate) fn new(node: Arc<Node>) -> Self {
        AdminService { node }
    }

    fn members(&self) -> Vec<cpb::Member> {
        self.node
            .members()
            .into_iter()
            .map(|m| cpb::Member {
                id: m.id,
                addr: m.addr,
                voter: m.voter,
            })
            .collect()
    }

    fn membership_response(&self, log_index: u64) -> cpb::MembershipResponse {
        cpb::MembershipResponse {
            log_index,
            members: self.members(),
        }
    }

    /// Takes members out, voters and learners alike (on the leader), each change committed
    /// before the next, then tells each removed node so (see `removal.rs`). A removed voter
    /// first becomes a learner (it then never campaigns, even if it cannot be told); when this
    /// node itself leaves, the learners go first and its own voter removal comes last, while it
    /// still leads.
    async fn remove_members(
        &self,
        remove: &[u64],
    ) -> Result<Response<cpb::MembershipResponse>, Status> {
        let members = self.members();
        let (voters, learners): (BTreeSet<u64>, BTreeSet<u64>) = (
            members.iter().filter(|m| m.voter).map(|m| m.id).collect(),
            members.iter().filter(|m| !m.voter).map(|m| m.id).collect(),
        );
        let removal =
            membership::plan_removal(&voters, &learners, remove).map_err(ApiError::from)?;
        let mut changes: Vec<(&'static str, MembershipChange, bool)> = Vec::new();
        if removal.voters.contains(&self.node.id) {
            if !removal.learners.is_empty() {
                let learners = removal.learners.clone();
                changes.push((
                    "remove learners",
                    MembershipChange::RemoveNodes(learners),
                    false,
                ));
            }
            let voters = removal.voters.clone();
            changes.push((
                "remove voters",
                MembershipChange::RemoveVoters(voters),
                false,
            ));
        } else {
            if !removal.voters.is_empty() {
                let voters = removal.voters.clone();
                changes.push((
                    "demote voters",
                    MembershipChange::RemoveVoters(voters),
                    true,
                ));
            }
            let all = removal.voters.union(&removal.learners).copied().collect();
            changes.push(("remove members", MembershipChange::RemoveNodes(all), false));
        }
        let mut last = None;
        for (action, change, retain) in changes {
            let changed = self
                .node
                .change_membership(change, retain)
                .await
                .map_err(|e| ApiError::raft(action, e))?;
            last = Some(changed);
        }
        let Some(last) = last else {
            return Ok(Response::new(self.membership_response(0)));
        };
        if let Some(notice) = last.notice {
            for member in &members {
                let removed =
                    removal.voters.contains(&member.id) || removal.learners.contains(&member.id);
                if removed && member.id != self.node.id {
                    crate::jobs::retire::tell(
                        Arc::clone(&self.node),
                        member.id,
                        member.addr.clone(),
                        notice.clone(),
                    );
                }
            }
        }
        Ok(Response::new(self.membership_response(last.log_index)))
    }
}

/// What of the state a cluster status shows its caller.
#[derive(Clone, Copy)]
enum StatusView {
    /// Every namespace's counts: a cluster admin, or access control off.
    All,
    /// The counts of the namespaces the caller's token may read.
    Readable,
    /// No counts, no cluster id or state hash: a call without a known token.
    Nothing,
}

/// Answers a call forwarded to another node (the leader, or a leadership target) with that
/// node's own reply or status.
fn forwarded<T>(reply: Result<Response<T>, Status>) -> Result<Response<T>, Status> {
    reply.map_err(|status| ApiError::Forwarded(status).into())
}

#[tonic::async_trait]
impl ConchAdmin for AdminService {
    async fn cluster_status(
        &self,
        request: Request<cpb::ClusterStatusRequest>,
    ) -> Result<Response<cpb::ClusterStatusResponse>, Status> {
        // Any known token may read the cluster's status (as any client may check etcd's
        // endpoint health): roles, indexes and members, and the counts of the namespaces it
        // may read (all of them for a cluster admin, or with access control off). With
        // --status-without-token, so may a call with no token (a monitoring check), which
        // sees no counts, cluster id or state hash.
        let caller = Caller::of(&self.node, &request);
        if self.node.config.status_without_token {
            caller.setting_up(&self.node)?;
        } else {
            caller.authenticated(&self.node)?;
        }
        let sees = if caller.allow(&self.node, Access::ClusterAdmin).is_ok() {
            StatusView::All
        } else if caller.authenticated(&self.node).is_ok() {
            StatusView::Readable
        } else {
            StatusView::Nothing
        };
        let (term, state, last_log_index, applied_index, snapshot_index, leader_id) = {
            let m = self.node.raft_status();
            (
                m.term,
                m.state,
                m.last_log_index,
                m.applied_index,
                m.snapshot_index,
                m.known_leader.unwrap_or(0),
            )
        };
        let leader_addr = self
            .node
            .leader()
            .filter(|l| l.id == leader_id)
            .map(|l| l.addr)
            .unwrap_or_default();
        // Hashing reads the whole state: on a blocking thread, so a large state's hash never
        // holds up a runtime worker (and with it heartbeats and other calls).
        let applied = Arc::clone(&self.node.applied);
        let ((state_hash, hashed_index), (stats, cluster_version, data_format)) =
            tokio::task::spawn_blocking(move || {
                (
                    applied.state_hash(),
                    applied.read(|s| {
                        let stats = match sees {
                            StatusView::All => s.stats(),
                            StatusView::Readable => s.stats_where(|ns| caller.may_read_in(s, ns)),
                            StatusView::Nothing => crate::state::Stats::default(),
                        };
                        (stats, s.cluster_version().0, s.data_format())
                    }),
                )
            })
            .await
            .map_err(|e| ApiError::Internal(format!("state hash: {e}")))?;
        let (state_hash, cluster_id) = match sees {
            StatusView::Nothing => (0, String::new()),
            _ => (state_hash, self.node.cluster_id.get().unwrap_or_default()),
        };
        // openraft 0.9 does not export the commit index; everything applied is committed.
        let commit_index = self.node.applied.applied_index().max(applied_index);
        Ok(Response::new(cpb::ClusterStatusResponse {
            node_id: self.node.id,
            problems: super::auth::setup_problem(&self.node).into_iter().collect(),
            addr: self.node.config.advertise.clone(),
            leader_id,
            leader_addr,
            term,
            state,
            last_log_index,
            commit_index,
            // The index the hash belongs to: the pair is what nodes are compared by.
            applied_index: hashed_index,
            snapshot_index,
            members: self.members(),
            state_hash,
            namespaces: stats.namespaces,
            semaphores: stats.semaphores,
            leases: stats.leases,
            holders: stats.holders,
            waiters: stats.waiters,
            cluster_id,
            release: crate::support::release::RELEASE.to_string(),
            cluster_version_max: self.node.config.cluster_version_max,
            cluster_version,
            data_format,
        }))
    }

    async fn add_learner(
        &self,
        request: Request<cpb::AddLearnerRequest>,
    ) -> Result<Response<cpb::MembershipResponse>, Status> {
        Caller::of(&self.node, &request).allow(&self.node, Access::ClusterAdmin)?;
        let metadata = request.metadata().clone();
        let r = request.into_inner();
        if r.node_id == 0 || r.addr.is_empty() {
            let invalid = Error::invalid("node_id must be positive and addr non-empty");
            return Err(ApiError::from(invalid).into());
        }
        if let Some(mut leader) = self.node.leader_admin().await.map_err(ApiError::from)? {
            return forwarded(leader.add_learner(forward(&metadata, r)).await);
        }
        membership::probe_new_member(&self.node, r.node_id, &r.addr, &metadata).await?;
        let log_index = self
            .node
            .add_learner(r.node_id, r.addr)
            .await
            .map_err(|e| ApiError::raft("add learner", e))?;
        Ok(Response::new(self.membership_response(log_index)))
    }

    async fn change_membership(
        &self,
        request: Request<cpb::ChangeMembershipRequest>,
    ) -> Result<Response<cpb::MembershipResponse>, Status> {
        Caller::of(&self.node, &request).allow(&self.node, Access::ClusterAdmin)?;
        let metadata = request.metadata().clone();
        let r = request.into_inner();
        if r.voters.is_empty() == r.remove.is_empty() {
            let invalid = Error::invalid("name either the new voters or the nodes to remove");
            return Err(ApiError::from(invalid).into());
        }
        if let Some(mut leader) = self.node.leader_admin().await.map_err(ApiError::from)? {
            return forwarded(leader.change_membership(forward(&metadata, r)).await);
        }
        if !r.remove.is_empty() {
            return self.remove_members(&r.remove).await;
        }
        let voters: BTreeSet<u64> = r.voters.into_iter().collect();
        let changed = self
            .node
            .change_membership(MembershipChange::Voters(voters), false)
            .await
            .map_err(|e| ApiError::raft("change membership", e))?;
        Ok(Response::new(self.membership_response(changed.log_index)))
    }

    async fn transfer_leader(
        &self,
        request: Request<cpb::TransferLeaderRequest>,
    ) -> Result<Response<cpb::TransferLeaderResponse>, Status> {
        Caller::of(&self.node, &request).allow(&self.node, Access::ClusterAdmin)?;
        let metadata = request.metadata().clone();
        let to = request.into_inner().to_node_id;
        if to == self.node.id {
            // The target first applies everything committed, so its log is as long as any
            // voter's, then campaigns. A voter that heard from the current leader within its
            // lease (the longest election timeout) refuses the vote, as does a leader elected
            // less than a lease ago; a refused candidate makes the leader step down at its next
            // heartbeat, and voters grant the candidate with the highest term once their lease
            // ends. So the target campaigns again every (shortest) election timeout, long enough
            // for its vote requests to be answered, and stays a term ahead of any other
            // candidate until it leads. The answer waits (bounded) until it leads, or
            // says who does instead.
            let deadline = tokio::time::Instant::now() + self.node.config.leader_wait;
            tokio::time::timeout_at(deadline, self.node.linearizable())
                .await
                .map_err(|_| {
                    ApiError::raft(
                        "transfer leadership",
                        format!(
                            "node {} could not catch up with the leader within {} ms",
                            self.node.id,
                            self.node.config.leader_wait.as_millis()
                        ),
                    )
                })?
                .map_err(ApiError::from)?;
            let mut raft = self.node.watch_raft();
            raft.status();
            let mut next_campaign = tokio::time::Instant::now();
            loop {
                if tokio::time::Instant::now() >= next_campaign {
                    self.node
                        .campaign()
                        .await
                        .map_err(|e| ApiError::raft("start election", e))?;
                    next_campaign = tokio::time::Instant::now() + self.node.config.election_timeout;
                }
                // Leading, and confirmed by a quorum since (as `ClusterStatus` reports it).
                let led = {
                    let m = raft.status();
                    (m.known_leader == Some(self.node.id)).then_some(m.term)
                };
                if let Some(term) = led {
                    return Ok(Response::new(cpb::TransferLeaderResponse {
                        leader_id: self.node.id,
                        term,
                    }));
                }
                match tokio::time::timeout_at(deadline.min(next_campaign), raft.changed()).await {
                    Ok(Ok(())) => continue,
                    Ok(Err(_)) => {
                        return Err(ApiError::Node(NodeError::Unavailable(
                            "this node is shutting down".into(),
                        ))
                        .into());
                    }
                    Err(_) if tokio::time::Instant::now() < deadline => continue,
                    Err(_) => {
                        let now = self.node.leader();
                        return Err(ApiError::raft(
                            "transfer leadership",
                            format!(
                                "node {} did not take over within {} ms; {}",
                                self.node.id,
                                self.node.config.leader_wait.as_millis(),
                                match now {
                                    Some(l) => format!("node {} leads term {}", l.id, l.term),
                                    None => "no node leads now".into(),
                                }
                            ),
                        )
                        .into());
                    }
                }
            }
        }
        let members: BTreeMap<u64, String> =
            self.members().into_iter().map(|m| (m.id, m.addr)).collect();
        let addr = members
            .get(&to)
            .ok_or_else(|| ApiError::from(Error::invalid(format!("node {to} is not a member"))))?;
        // The target itself starts the election; it answers for it.
        let mut target = self.node.admin_of(to, addr).map_err(ApiError::from)?;
        let answer = forwarded(
            target
                .transfer_leader(forward(
                    &metadata,
                    cpb::TransferLeaderRequest { to_node_id: to },
                ))
                .await,
        )?;
        Ok(Response::new(answer.into_inner()))
    }

    async fn trigger_snapshot(
        &self,
        request: Request<cpb::TriggerSnapshotRequest>,
    ) -> Result<Response<cpb::TriggerSnapshotResponse>, Status> {
        Caller::of(&self.node, &request).allow(&self.node, Access::ClusterAdmin)?;
        let metadata = request.metadata().clone();
        let r = request.into_inner();
        if r.node_id != 0 && r.node_id != self.node.id {
            // Another member takes the snapshot; it answers for it.
            let to = r.node_id;
            let members: BTreeMap<u64, String> =
                self.members().into_iter().map(|m| (m.id, m.addr)).collect();
            let addr = members.get(&to).ok_or_else(|| {
                ApiError::from(Error::invalid(format!("node {to} is not a member")))
            })?;
            let mut target = self.node.admin_of(to, addr).map_err(ApiError::from)?;
            return forwarded(target.trigger_snapshot(forward(&metadata, r)).await);
        }
        let before = self.node.raft_status().snapshot_index;
        self.node
            .trigger_snapshot()
            .await
            .map_err(|e| ApiError::raft("trigger snapshot", e))?;
        let applied = self.node.applied.applied_index();
        let mut raft = self.node.watch_raft();
        let snapshot_index = loop {
            let current = raft.status().snapshot_index;
            if current >= applied || current > before {
                break current;
            }
            if tokio::time::timeout(std::time::Duration::from_secs(10), raft.changed())
                .await
                .is_err()
            {
                let slow = ApiError::Timeout("snapshot did not complete within 10 s".into());
                return Err(slow.into());
            }
        };
        Ok(Response::new(cpb::TriggerSnapshotResponse {
            snapshot_index,
            node_id: self.node.id,
        }))
    }
    type BackupStream = super::backup::BackupStream;

    async fn backup(
        &self,
        request: Request<cpb::BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        Caller::of(&self.node, &request).allow(&self.node, Access::ClusterAdmin)?;
        Ok(Response::new(super::backup::stream(&self.node).await?))
    }

    async fn finalize_upgrade(
        &self,
        request: Request<cpb::FinalizeUpgradeRequest>,
    ) -> Result<Response<cpb::FinalizeUpgradeResponse>, Status> {
        Caller::of(&self.node, &request).allow(&self.node, Access::ClusterAdmin)?;
        let done = crate::api::upgrade::finalize(&self.node).await?;
        Ok(Response::new(cpb::FinalizeUpgradeResponse {
            previous_cluster_version: done.previous,
            cluster_version: done.current,
            nodes: done
                .members
                .into_iter()
                .map(|m| {
                    let (release, cluster_version_max) = match m.info {
                        Ok(info) => (info.release, info.cluster_version_max),
                        Err(_) => (String::new(), 0),
                    };
                    cpb::NodeRelease {
                        node_id: m.id,
                        release,
                        cluster_version_max,
                    }
                })
                .collect(),
        }))
    }
}
