//! The typed wrappers of the namespace, semaphore, lease and cluster calls, and the paging of
//! listings.

use std::collections::HashMap;

// Tokio's clock (the system's unless a test pauses it), so tests of routing, hedging and
// retries run in virtual time.

use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::conch::conch_quota_client::ConchQuotaClient;
use conch_proto::conch::{
    ClusterStatusRequest, ClusterStatusResponse, GetNamespaceQuotasRequest,
    ListSemaphoreWaitersRequest, NamespaceQuotas, NamespaceQuotasResponse,
    SetNamespaceQuotasRequest, SetStateBudgetRequest, StateBudgetResponse,
};
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use conch_proto::grackle::{
    CreateNamespaceRequest, CreateSemaphoreRequest, DeleteNamespaceRequest, DeleteSemaphoreRequest,
    GetLockLeaseRequest, GetNamespaceRequest, GetSemaphoreLeaseRequest, GetSemaphoreRequest,
    ListLockLeasesRequest, ListNamespacesRequest, ListSemaphoreHoldersRequest,
    ListSemaphoreLeasesRequest, ListSemaphoresRequest, Namespace, RefreshLockLeaseRequest,
    RefreshSemaphoreLeaseRequest, ReleaseSemaphoreRequest, RevokeLockLeaseRequest,
    RevokeSemaphoreLeaseRequest, Semaphore, SemaphoreHolder,
};

use crate::endpoint::parse_endpoint;
use crate::error::{Class, Error, Result, classify};
use crate::lease_kind::LeaseKind;
pub(super) use crate::request_id::request;

use super::{CallOptions, Client, PAGE_LIMIT, transport_error};

impl Client {
    // ----- namespaces -------------------------------------------------------------------------

    /// Creates a namespace. Its retries carry one request id, so a retry after a lost reply
    /// answers the namespace created; a namespace created by someone else is
    /// [`Error::AlreadyExists`] ([`Client::ensure_namespace`] accepts that).
    pub async fn create_namespace(&self, name: &str, description: &str) -> Result<Namespace> {
        const OP: &str = "create namespace";
        let req = CreateNamespaceRequest {
            name: name.to_string(),
            description: description.to_string(),
            metadata: HashMap::new(),
        };
        let resp = self
            .unary_once(OP, self.default_options(), req, |ch, r| async move {
                GrackleApiClient::new(ch).create_namespace(r).await
            })
            .await?;
        resp.namespace.ok_or_else(|| missing(OP, "namespace"))
    }

    /// Reads a namespace.
    pub async fn get_namespace(&self, name: &str) -> Result<Namespace> {
        const OP: &str = "get namespace";
        let req = GetNamespaceRequest {
            namespace_name: name.to_string(),
        };
        let resp = self
            .unary(OP, self.default_options(), req, |ch, r| async move {
                GrackleApiClient::new(ch).get_namespace(r).await
            })
            .await?;
        resp.namespace.ok_or_else(|| missing(OP, "namespace"))
    }

    /// A namespace's quotas and what it uses of them, with the state's budget.
    pub async fn namespace_quotas(&self, name: &str) -> Result<NamespaceQuotasResponse> {
        const OP: &str = "get namespace quotas";
        let req = GetNamespaceQuotasRequest {
            namespace_name: name.to_string(),
        };
        self.unary(OP, self.default_options(), req, |ch, r| async move {
            ConchQuotaClient::new(ch).get_namespace_quotas(r).await
        })
        .await
    }

    /// Sets all four quotas of a namespace (cluster-admin).
    pub async fn set_namespace_quotas(
        &self,
        name: &str,
        quotas: NamespaceQuotas,
    ) -> Result<NamespaceQuotasResponse> {
        const OP: &str = "set namespace quotas";
        let req = SetNamespaceQuotasRequest {
            namespace_name: name.to_string(),
            quotas: Some(quotas),
        };
        self.unary(OP, self.default_options(), req, |ch, r| async move {
            ConchQuotaClient::new(ch).set_namespace_quotas(r).await
        })
        .await
    }

    /// Sets the budget on the stored bytes of every namespace together (cluster-admin).
    pub async fn set_state_budget(&self, budget_bytes: u64) -> Result<StateBudgetResponse> {
        const OP: &str = "set state budget";
        let req = SetStateBudgetRequest { budget_bytes };
        self.unary(OP, self.default_options(), req, |ch, r| async move {
            ConchQuotaClient::new(ch).set_state_budget(r).await
        })
        .await
    }

    /// Every namespace the caller may read, in name order (all pages).
    pub async fn list_namespaces(&self) -> Result<Vec<Namespace>> {
        const OP: &str = "list namespaces";
        all_pages(async |pagination_token| {
            let req = ListNamespacesRequest {
                pagination_token,
                limit: PAGE_LIMIT,
            };
            let resp = self
                .unary(OP, self.default_options(), req, |ch, r| async move {
                    GrackleApiClient::new(ch).list_namespaces(r).await
                })
                .await?;
            Ok((resp.namespaces, resp.next_pagination_token))
        })
        .await
    }

    /// Makes sure a namespace exists (reads first; creates it if absent; a concurrent create
    /// by someone else is fine).
    pub async fn ensure_namespace(&self, name: &str) -> Result<()> {
        match self.get_namespace(name).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => match self.create_namespace(name, "").await {
                Ok(_) => Ok(()),
                Err(e) if e.is_already_exists() => Ok(()),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    // ----- semaphores -------------------------------------------------------------------------

    /// Creates a semaphore with `permits`.
    pub async fn create_semaphore(
        &self,
        namespace: &str,
        name: &str,
        permits: u64,
        description: &str,
    ) -> Result<Semaphore> {
        const OP: &str = "create semaphore";
        let req = CreateSemaphoreRequest {
            namespace_name: namespace.to_string(),
            semaphore_name: name.to_string(),
            description: description.to_string(),
            permits,
            metadata: HashMap::new(),
            max_hold_ms: 0,
        };
        let resp = self
            .unary_once(OP, self.default_options(), req, |ch, r| async move {
                GrackleApiClient::new(ch).create_semaphore(r).await
            })
            .await?;
        resp.semaphore.ok_or_else(|| missing(OP, "semaphore"))
    }

    /// Reads a semaphore (permits, active holds, waiter count).
    pub async fn get_semaphore(&self, namespace: &str, name: &str) -> Result<Semaphore> {
        const OP: &str = "get semaphore";
        let req = GetSemaphoreRequest {
            namespace_name: namespace.to_string(),
            semaphore_name: name.to_string(),
        };
        let resp = self
            .unary(OP, self.default_options(), req, |ch, r| async move {
                GrackleApiClient::new(ch).get_semaphore(r).await
            })
            .await?;
        resp.semaphore.ok_or_else(|| missing(OP, "semaphore"))
    }

    /// Returns the semaphore, creating it (and its namespace) with `permits` if it does not
    /// exist. An existing semaphore is returned as it is, whatever its permits; concurrent
    /// creators are fine. The common path is one read.
    pub async fn ensure_semaphore(
        &self,
        namespace: &str,
        name: &str,
        permits: u64,
    ) -> Result<Semaphore> {
        match self.get_semaphore(namespace, name).await {
            Ok(s) => return Ok(s),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
        self.ensure_namespace(namespace).await?;
        match self.create_semaphore(namespace, name, permits, "").await {
            Ok(s) => Ok(s),
            Err(e) if e.is_already_exists() => self.get_semaphore(namespace, name).await,
            Err(e) => Err(e),
        }
    }

    /// Deletes a namespace and everything in it: its semaphores, locks, leases, wait groups
    /// and barriers (their holders learn it as a loss).
    pub async fn delete_namespace(&self, name: &str) -> Result<()> {
        const OP: &str = "delete namespace";
        let req = DeleteNamespaceRequest {
            namespace_name: name.to_string(),
        };
        self.unary_once(OP, self.default_options(), req, |ch, r| async move {
            GrackleApiClient::new(ch).delete_namespace(r).await
        })
        .await?;
        Ok(())
    }

    /// Deletes a semaphore (absent: nothing happens); its holders and waiters lose it.
    pub async fn delete_semaphore(&self, namespace: &str, name: &str) -> Result<()> {
        const OP: &str = "delete semaphore";
        let req = DeleteSemaphoreRequest {
            namespace_name: namespace.to_string(),
            semaphore_name: name.to_string(),
        };
        self.unary_once(OP, self.default_options(), req, |ch, r| async move {
            GrackleApiClient::new(ch).delete_semaphore(r).await
        })
        .await?;
        Ok(())
    }

    /// Every semaphore of a namespace, in name order (all pages).
    pub async fn list_semaphores(&self, namespace: &str) -> Result<Vec<Semaphore>> {
        const OP: &str = "list semaphores";
        all_pages(async |pagination_token| {
            let req = ListSemaphoresRequest {
                namespace_name: namespace.to_string(),
                pagination_token,
                limit: PAGE_LIMIT,
            };
            let resp = self
                .unary(OP, self.default_options(), req, |ch, r| async move {
                    GrackleApiClient::new(ch).list_semaphores(r).await
                })
                .await?;
            Ok((resp.semaphores, resp.next_pagination_token))
        })
        .await
    }

    /// The holders of a semaphore in grant order (all pages).
    pub async fn list_holders(&self, namespace: &str, name: &str) -> Result<Vec<SemaphoreHolder>> {
        const OP: &str = "list semaphore holders";
        all_pages(async |pagination_token| {
            let req = ListSemaphoreHoldersRequest {
                namespace_name: namespace.to_string(),
                semaphore_name: name.to_string(),
                pagination_token,
                limit: PAGE_LIMIT,
            };
            let resp = self
                .unary(OP, self.default_options(), req, |ch, r| async move {
                    GrackleApiClient::new(ch).list_semaphore_holders(r).await
                })
                .await?;
            Ok((resp.holders, resp.next_pagination_token))
        })
        .await
    }

    /// The waiters of a semaphore in queue order (all pages), with the semaphore itself.
    pub async fn list_waiters(&self, namespace: &str, name: &str) -> Result<Waiters> {
        const OP: &str = "list semaphore waiters";
        let mut semaphore = None;
        let waiters = all_pages(async |pagination_token| {
            let req = ListSemaphoreWaitersRequest {
                namespace_name: namespace.to_string(),
                semaphore_name: name.to_string(),
                pagination_token,
                limit: PAGE_LIMIT,
            };
            let resp = self
                .unary(OP, self.default_options(), req, |ch, r| async move {
                    ConchApiClient::new(ch).list_semaphore_waiters(r).await
                })
                .await?;
            if semaphore.is_none() {
                semaphore = resp.semaphore;
            }
            Ok((resp.waiters, resp.next_pagination_token))
        })
        .await?;
        Ok(Waiters { semaphore, waiters })
    }

    /// Releases whatever `lease_id` holds of a semaphore (a no-op if it holds nothing).
    pub async fn release(&self, namespace: &str, name: &str, lease_id: &str) -> Result<()> {
        const OP: &str = "release semaphore";
        let req = ReleaseSemaphoreRequest {
            namespace_name: namespace.to_string(),
            semaphore_name: name.to_string(),
            lease_id: lease_id.to_string(),
        };
        self.unary_once(OP, self.default_options(), req, |ch, r| async move {
            GrackleApiClient::new(ch).release_semaphore(r).await
        })
        .await?;
        Ok(())
    }

    // ----- leases -----------------------------------------------------------------------------

    /// Refreshes a semaphore lease once (`ttl_seconds` 0 keeps the lease's TTL).
    /// [`Lease`](crate::Lease) does this by itself.
    pub async fn refresh_lease(
        &self,
        namespace: &str,
        lease_id: &str,
        ttl_seconds: u64,
        opts: CallOptions,
    ) -> Result<conch_proto::grackle::Lease> {
        self.refresh_lease_of(LeaseKind::Semaphore, namespace, lease_id, ttl_seconds, opts)
            .await
    }

    /// Refreshes a lease of `kind` once (`ttl_seconds` 0 keeps the lease's TTL).
    pub async fn refresh_lease_of(
        &self,
        kind: LeaseKind,
        namespace: &str,
        lease_id: &str,
        ttl_seconds: u64,
        opts: CallOptions,
    ) -> Result<conch_proto::grackle::Lease> {
        let (namespace_name, lease_id) = (namespace.to_string(), lease_id.to_string());
        match kind {
            LeaseKind::Semaphore => {
                const OP: &str = "refresh lease";
                let req = RefreshSemaphoreLeaseRequest {
                    namespace_name,
                    lease_id,
                    ttl_seconds,
                };
                self.unary(OP, opts, req, |ch, r| async move {
                    GrackleApiClient::new(ch).refresh_semaphore_lease(r).await
                })
                .await?
                .lease
                .ok_or_else(|| missing(OP, "lease"))
            }
            LeaseKind::Lock => {
                const OP: &str = "refresh lock lease";
                let req = RefreshLockLeaseRequest {
                    namespace_name,
                    lease_id,
                    ttl_seconds,
                };
                self.unary(OP, opts, req, |ch, r| async move {
                    GrackleApiClient::new(ch).refresh_lock_lease(r).await
                })
                .await?
                .lease
                .ok_or_else(|| missing(OP, "lease"))
            }
        }
    }

    /// Revokes a semaphore lease: everything it holds or waits for is released at once.
    pub async fn revoke_lease(&self, namespace: &str, lease_id: &str) -> Result<()> {
        self.revoke_lease_of(LeaseKind::Semaphore, namespace, lease_id)
            .await
    }

    /// Revokes a lease of `kind`: everything it holds or waits for is released at once.
    pub async fn revoke_lease_of(
        &self,
        kind: LeaseKind,
        namespace: &str,
        lease_id: &str,
    ) -> Result<()> {
        let (namespace_name, lease_id) = (namespace.to_string(), lease_id.to_string());
        match kind {
            LeaseKind::Semaphore => {
                let req = RevokeSemaphoreLeaseRequest {
                    namespace_name,
                    lease_id,
                };
                self.unary_once(
                    "revoke lease",
                    self.default_options(),
                    req,
                    |ch, r| async move { GrackleApiClient::new(ch).revoke_semaphore_lease(r).await },
                )
                .await?;
            }
            LeaseKind::Lock => {
                let req = RevokeLockLeaseRequest {
                    namespace_name,
                    lease_id,
                };
                self.unary_once(
                    "revoke lock lease",
                    self.default_options(),
                    req,
                    |ch, r| async move { GrackleApiClient::new(ch).revoke_lock_lease(r).await },
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Reads a semaphore lease.
    pub async fn get_lease(
        &self,
        namespace: &str,
        lease_id: &str,
    ) -> Result<conch_proto::grackle::Lease> {
        self.get_lease_of(LeaseKind::Semaphore, namespace, lease_id)
            .await
    }

    /// Reads a lease of `kind`.
    pub async fn get_lease_of(
        &self,
        kind: LeaseKind,
        namespace: &str,
        lease_id: &str,
    ) -> Result<conch_proto::grackle::Lease> {
        let (namespace_name, lease_id) = (namespace.to_string(), lease_id.to_string());
        match kind {
            LeaseKind::Semaphore => {
                const OP: &str = "get lease";
                let req = GetSemaphoreLeaseRequest {
                    namespace_name,
                    lease_id,
                };
                self.unary(OP, self.default_options(), req, |ch, r| async move {
                    GrackleApiClient::new(ch).get_semaphore_lease(r).await
                })
                .await?
                .lease
                .ok_or_else(|| missing(OP, "lease"))
            }
            LeaseKind::Lock => {
                const OP: &str = "get lock lease";
                let req = GetLockLeaseRequest {
                    namespace_name,
                    lease_id,
                };
                self.unary(OP, self.default_options(), req, |ch, r| async move {
                    GrackleApiClient::new(ch).get_lock_lease(r).await
                })
                .await?
                .lease
                .ok_or_else(|| missing(OP, "lease"))
            }
        }
    }

    /// The leases of `kind` in a namespace (all pages); with a non-empty `process_id`, only
    /// that owner's.
    pub async fn list_leases_of(
        &self,
        kind: LeaseKind,
        namespace: &str,
        process_id: &str,
    ) -> Result<Vec<conch_proto::grackle::Lease>> {
        all_pages(async |pagination_token| {
            let (namespace_name, process_id) = (namespace.to_string(), process_id.to_string());
            let (leases, next) = match kind {
                LeaseKind::Semaphore => {
                    let req = ListSemaphoreLeasesRequest {
                        namespace_name,
                        pagination_token,
                        limit: PAGE_LIMIT,
                        process_id,
                    };
                    let r = self
                        .unary(
                            "list leases",
                            self.default_options(),
                            req,
                            |ch, r| async move {
                                GrackleApiClient::new(ch).list_semaphore_leases(r).await
                            },
                        )
                        .await?;
                    (r.leases, r.next_pagination_token)
                }
                LeaseKind::Lock => {
                    let req = ListLockLeasesRequest {
                        namespace_name,
                        pagination_token,
                        limit: PAGE_LIMIT,
                        process_id,
                    };
                    let r = self
                        .unary(
                            "list lock leases",
                            self.default_options(),
                            req,
                            |ch, r| async move { GrackleApiClient::new(ch).list_lock_leases(r).await },
                        )
                        .await?;
                    (r.leases, r.next_pagination_token)
                }
            };
            Ok((leases, next))
        })
        .await
    }

    // ----- cluster ----------------------------------------------------------------------------

    /// Cluster status as seen by whichever node answers.
    pub async fn cluster_status(&self) -> Result<ClusterStatusResponse> {
        let req = ClusterStatusRequest {};
        self.unary(
            "cluster status",
            self.default_options(),
            req,
            |ch, r| async move { ConchAdminClient::new(ch).cluster_status(r).await },
        )
        .await
    }

    /// Cluster status as seen by the node at `endpoint` (no failover: this asks that node).
    pub async fn cluster_status_of(&self, endpoint: &str) -> Result<ClusterStatusResponse> {
        const OP: &str = "cluster status";
        let ep = parse_endpoint(endpoint)?;
        let existing = {
            let nodes = self.nodes();
            nodes
                .list
                .iter()
                .position(|n| n.addr == ep.addr)
                .map(|i| (i, nodes.list[i].channel.clone()))
        };
        let channel = match &existing {
            Some((_, ch)) => ch.clone(),
            None => (self.inner.dial)(&ep, &self.inner.config)?,
        };
        let timeout = self.inner.config.request_timeout;
        let mut admin = ConchAdminClient::new(self.intercepted(channel));
        let fut = admin.cluster_status(request(ClusterStatusRequest {}, timeout));
        match tokio::time::timeout(timeout, fut).await {
            Ok(Ok(resp)) => {
                if existing.is_some() {
                    self.observe_hint(resp.metadata());
                }
                Ok(resp.into_inner())
            }
            Ok(Err(status)) => match classify(&status) {
                Class::Transport | Class::NodeUnavailable => Err(Error::Unavailable {
                    op: OP,
                    endpoints: vec![ep.addr.clone()],
                    last: transport_error(&status, self.inner.config.tls.is_some()),
                }),
                Class::Final => Err(Error::from_status(OP, status)),
            },
            Err(_) => Err(Error::Timeout { op: OP, timeout }),
        }
    }
}

/// The waiters of a semaphore, as returned by [`Client::list_waiters`].
#[derive(Debug, Clone, Default)]
pub struct Waiters {
    /// The semaphore (permits, active holds), when the server sent it.
    pub semaphore: Option<Semaphore>,
    /// Waiters in queue order; the head is granted first.
    pub waiters: Vec<conch_proto::conch::SemaphoreWaiter>,
}

/// Reads every page of a listing: `page(token)` fetches the page at `token` (empty: the first)
/// and returns its items and the next page's token. Stops at an empty page, an empty or
/// repeated token, or after 10 000 pages.
pub(crate) async fn all_pages<T>(
    mut page: impl AsyncFnMut(String) -> Result<(Vec<T>, String)>,
) -> Result<Vec<T>> {
    let mut out = Vec::new();
    let mut token = String::new();
    for _ in 0..10_000 {
        let (items, next) = page(token.clone()).await?;
        let empty = items.is_empty();
        out.extend(items);
        if empty || next.is_empty() || next == token {
            break;
        }
        token = next;
    }
    Ok(out)
}

pub(crate) fn missing(op: &'static str, field: &str) -> Error {
    Error::Protocol {
        op,
        message: format!("the response has no {field}"),
    }
}
