//! `ConchQuota`: a namespace's quotas and usage, and the state's byte budget. Reading needs
//! read on the namespace; setting needs cluster-admin (checked here and again where the command
//! applies, like every write). The rules themselves live in the state (`state/quota.rs`).

use std::sync::Arc;

use conch_proto::conch as cpb;
use conch_proto::conch::conch_quota_server::ConchQuota;
use tonic::{Request, Response, Status};

use super::auth::Caller;
use super::status::ApiError;
use crate::node::Node;
use crate::state::auth::{Access, Permission};
use crate::state::quota::Quotas;
use crate::state::{Cmd, Outcome, QuotaView};

pub(crate) struct QuotaService {
    node: Arc<Node>,
}

impl QuotaService {
    pub(crate) fn new(node: Arc<Node>) -> Self {
        QuotaService { node }
    }

    async fn write(&self, caller: &Caller, cmd: Cmd) -> Result<Outcome, ApiError> {
        caller.allow(&self.node, Access::ClusterAdmin)?;
        let cmd = caller.sign(cmd);
        cmd.validate()?;
        Ok(self.node.write_one(cmd).await??)
    }
}

impl QuotaService {
    /// `response` as `caller` may see it: the bytes stored over the whole state (every
    /// namespace's) only for a cluster admin (or with access control off).
    fn for_caller(
        &self,
        caller: &Caller,
        mut response: cpb::NamespaceQuotasResponse,
    ) -> cpb::NamespaceQuotasResponse {
        if caller.allow(&self.node, Access::ClusterAdmin).is_err() {
            response.state_bytes = 0;
        }
        response
    }
}

fn quotas_message(q: &Quotas) -> cpb::NamespaceQuotas {
    cpb::NamespaceQuotas {
        semaphores: q.semaphores,
        leases: q.leases,
        entries: q.entries,
        bytes: q.bytes,
        request_ids: q.request_ids,
    }
}

fn quotas_response(v: QuotaView) -> cpb::NamespaceQuotasResponse {
    cpb::NamespaceQuotasResponse {
        namespace_name: v.namespace,
        quotas: Some(quotas_message(&v.quotas)),
        usage: Some(cpb::NamespaceQuotas {
            semaphores: v.semaphores,
            leases: v.leases,
            entries: v.entries,
            bytes: v.bytes,
            request_ids: v.request_ids,
        }),
        state_budget_bytes: v.budget_bytes,
        state_bytes: v.state_bytes,
    }
}

fn unexpected(outcome: Outcome) -> Status {
    ApiError::Internal(format!("unexpected outcome {outcome:?}")).into()
}

#[tonic::async_trait]
impl ConchQuota for QuotaService {
    async fn get_namespace_quotas(
        &self,
        request: Request<cpb::GetNamespaceQuotasRequest>,
    ) -> Result<Response<cpb::NamespaceQuotasResponse>, Status> {
        let caller = Caller::of(&self.node, &request);
        let r = request.into_inner();
        caller.allow(
            &self.node,
            Access::Namespace(&r.namespace_name, Permission::Read),
        )?;
        self.node.linearizable().await.map_err(ApiError::from)?;
        let view = self
            .node
            .applied
            .read(|s| s.quotas(&r.namespace_name))
            .map_err(ApiError::from)?;
        Ok(Response::new(
            self.for_caller(&caller, quotas_response(view)),
        ))
    }

    async fn set_namespace_quotas(
        &self,
        request: Request<cpb::SetNamespaceQuotasRequest>,
    ) -> Result<Response<cpb::NamespaceQuotasResponse>, Status> {
        let caller = Caller::of(&self.node, &request);
        let r = request.into_inner();
        let q = r.quotas.ok_or_else(|| {
            ApiError::from(crate::state::Error::invalid(
                "quotas must be given (all five: semaphores, leases, entries, bytes, request_ids)",
            ))
        })?;
        let cmd = Cmd::SetQuotas {
            ns: r.namespace_name,
            quotas: Quotas {
                semaphores: q.semaphores,
                leases: q.leases,
                entries: q.entries,
                bytes: q.bytes,
                request_ids: q.request_ids,
            },
        };
        match self.write(&caller, cmd).await? {
            Outcome::Quotas(view) => Ok(Response::new(
                self.for_caller(&caller, quotas_response(view)),
            )),
            other => Err(unexpected(other)),
        }
    }

    async fn set_state_budget(
        &self,
        request: Request<cpb::SetStateBudgetRequest>,
    ) -> Result<Response<cpb::StateBudgetResponse>, Status> {
        let caller = Caller::of(&self.node, &request);
        let bytes = request.into_inner().budget_bytes;
        match self.write(&caller, Cmd::SetBudget { bytes }).await? {
            Outcome::Budget {
                budget_bytes,
                state_bytes,
            } => Ok(Response::new(cpb::StateBudgetResponse {
                budget_bytes,
                state_bytes,
            })),
            other => Err(unexpected(other)),
        }
    }
}
