//! Wait groups and barriers: typed wrappers of their Grackle calls on [`Client`].
//!
//! Writes carry one request id for all their attempts (as every write of [`Client`]), so a
//! completion or an arrival retried after a lost reply is answered with the first attempt's
//! reply: a retried arrival never counts twice, even across the trip it caused. Waits are
//! reads and safe to repeat; one wait RPC lasts at most 300 s (the server's limit), so longer
//! waits are a loop of them (as `conch wait-group wait` does).

use std::collections::HashMap;
use std::time::Duration;

use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use conch_proto::grackle::{
    ArriveAtBarrierRequest, Barrier, BarrierParticipant, BarrierWaitOutcome, CompleteJobRequest,
    CompleteJobsFromWaitGroupRequest, CreateBarrierRequest, CreateWaitGroupRequest,
    DeleteBarrierRequest, DeleteWaitGroupRequest, GetBarrierRequest, GetWaitGroupRequest,
    ListBarrierParticipantsRequest, ListBarriersRequest, ListWaitGroupCompletedJobsRequest,
    ListWaitGroupsRequest, UpdateBarrierRequest, UpdateWaitGroupRequest, WaitAtBarrierRequest,
    WaitForWaitGroupRequest, WaitGroup, WaitGroupJob, WaitGroupWaitOutcome,
};

use crate::client::{CallOptions, Client, all_pages, missing};
use crate::error::Result;

/// Page size of the listings.
const PAGE_LIMIT: i32 = 250;
/// The longest one wait RPC may wait (the server's `timeout_seconds` limit).
pub const WAIT_RPC_MAX: Duration = Duration::from_secs(300);
/// How long past its server-side wait a wait RPC may take (forwarding, a read-index).
const WAIT_SLACK: Duration = Duration::from_secs(10);

fn secs_i64(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

impl Client {
    /// Options of a wait RPC that waits up to `wait` on the server.
    fn wait_options(&self, wait: Duration) -> CallOptions {
        let base = self.default_options();
        CallOptions {
            timeout: base.timeout + wait + WAIT_SLACK,
            retry_for: base.retry_for,
        }
    }

    // ----- wait groups ------------------------------------------------------------------------

    /// Creates a wait group of `counter` jobs that expires at `expires_at` (nanoseconds since
    /// the Unix epoch) if not completed by then, and is deleted `delete_after_finished` after
    /// it finishes.
    pub async fn create_wait_group(
        &self,
        namespace: &str,
        name: &str,
        counter: u64,
        expires_at: i64,
        delete_after_finished: Duration,
        description: &str,
    ) -> Result<WaitGroup> {
        const OP: &str = "create wait group";
        let req = CreateWaitGroupRequest {
            namespace_name: namespace.to_string(),
            wait_group_name: name.to_string(),
            description: description.to_string(),
            counter: i64::try_from(counter).unwrap_or(i64::MAX),
            expires_at,
            metadata: HashMap::new(),
            delete_after_finished_seconds: secs_i64(delete_after_finished),
        };
        let resp = self
            .unary_once(OP, self.default_options(), req, |ch, r| async move {
                GrackleApiClient::new(ch).create_wait_group(r).await
            })
            .await?;
        resp.wait_group.ok_or_else(|| missing(OP, "wait_group"))
    }

    /// Replaces a wait group's mutable attributes (every field of `req`; see Grackle's
    /// `UpdateWaitGroup`).
    pub async fn update_wait_group(&self, req: UpdateWaitGroupRequest) -> Result<WaitGroup> {
        const OP: &str = "update wait group";
        let resp = self
            .unary_once(OP, self.default_options(), req, |ch, r| async move {
                GrackleApiClient::new(ch).update_wait_group(r).await
            })
            .await?;
        resp.wait_group.ok_or_else(|| missing(OP, "wait_group"))
    }

    /// Reads a wait group.
    pub async fn get_wait_group(&self, namespace: &str, name: &str) -> Result<WaitGroup> {
        const OP: &str = "get wait group";
        let req = GetWaitGroupRequest {
            namespace_name: namespace.to_string(),
            wait_group_name: name.to_string(),
        };
        let resp = self
            .unary(OP, self.default_options(), req, |ch, r| async move {
                GrackleApiClient::new(ch).get_wait_group(r).await
            })
            .await?;
        resp.wait_group.ok_or_else(|| missing(OP, "wait_group"))
    }

    /// Every wait group of a namespace, by name (all pages).
    pub async fn list_wait_groups(&self, namespace: &str) -> Result<Vec<WaitGroup>> {
        const OP: &str = "list wait groups";
        all_pages(async |pagination_token| {
            let req = ListWaitGroupsRequest {
                namespace_name: namespace.to_string(),
                pagination_token,
                limit: PAGE_LIMIT,
            };
            let resp = self
                .unary(OP, self.default_options(), req, |ch, r| async move {
                    GrackleApiClient::new(ch).list_wait_groups(r).await
                })
                .await?;
            Ok((resp.wait_groups, resp.next_pagination_token))
        })
        .await
    }

    /// Deletes a wait group (absent: nothing happens).
    pub async fn delete_wait_group(&self, namespace: &str, name: &str) -> Result<()> {
        const OP: &str = "delete wait group";
        let req = DeleteWaitGroupRequest {
            namespace_name: namespace.to_string(),
            wait_group_name: name.to_string(),
        };
        self.unary_once(OP, self.default_options(), req, |ch, r| async move {
            GrackleApiClient::new(ch).delete_wait_group(r).await
        })
        .await?;
        Ok(())
    }

    /// Reports jobs done (at most 50 per call): `(job id, metadata)`. A job id already
    /// reported counts once and keeps its first record.
    pub async fn complete_jobs(
        &self,
        namespace: &str,
        name: &str,
        jobs: Vec<(String, HashMap<String, String>)>,
    ) -> Result<WaitGroup> {
        const OP: &str = "complete jobs";
        let req = CompleteJobsFromWaitGroupRequest {
            namespace_name: namespace.to_string(),
            wait_group_name: name.to_string(),
            jobs: jobs
                .into_iter()
                .map(|(job_id, metadata)| CompleteJobRequest { job_id, metadata })
                .collect(),
        };
        let resp = self
            .unary_once(OP, self.default_options(), req, |ch, r| async move {
                GrackleApiClient::new(ch)
                    .complete_jobs_from_wait_group(r)
                    .await
            })
            .await?;
        resp.wait_group.ok_or_else(|| missing(OP, "wait_group"))
    }

    /// Every completed job of a wait group, by job id (all pages).
    pub async fn list_completed_jobs(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Vec<WaitGroupJob>> {
        const OP: &str = "list completed jobs";
        all_pages(async |pagination_token| {
            let req = ListWaitGroupCompletedJobsRequest {
                namespace_name: namespace.to_string(),
                wait_group_name: name.to_string(),
                pagination_token,
                limit: PAGE_LIMIT,
            };
            let resp = self
                .unary(OP, self.default_options(), req, |ch, r| async move {
                    GrackleApiClient::new(ch)
                        .list_wait_group_completed_jobs(r)
                        .await
                })
                .await?;
            Ok((resp.jobs, resp.next_pagination_token))
        })
        .await
    }

    /// Waits up to `wait` (at most [`WAIT_RPC_MAX`]; 0 answers at once) for the group to
    /// finish: the group then and why the wait ended.
    pub async fn wait_for_wait_group(
        &self,
        namespace: &str,
        name: &str,
        wait: Duration,
    ) -> Result<(WaitGroup, WaitGroupWaitOutcome)> {
        const OP: &str = "wait for wait group";
        let wait = wait.min(WAIT_RPC_MAX);
        let req = WaitForWaitGroupRequest {
            namespace_name: namespace.to_string(),
            wait_group_name: name.to_string(),
            timeout_seconds: i32::try_from(wait.as_secs()).unwrap_or(300),
        };
        let resp = self
            .unary(OP, self.wait_options(wait), req, |ch, r| async move {
                GrackleApiClient::new(ch).wait_for_wait_group(r).await
            })
            .await?;
        let outcome =
            WaitGroupWaitOutcome::try_from(resp.outcome).unwrap_or(WaitGroupWaitOutcome::Invalid);
        Ok((
            resp.wait_group.ok_or_else(|| missing(OP, "wait_group"))?,
            outcome,
        ))
    }

    // ----- barriers ---------------------------------------------------------------------------

    /// Creates a barrier of `expected` processes, deleted after `delete_inactive_after`
    /// without an arrival.
    pub async fn create_barrier(
        &self,
        namespace: &str,
        name: &str,
        expected: u64,
        delete_inactive_after: Duration,
        description: &str,
    ) -> Result<Barrier> {
        const OP: &str = "create barrier";
        let req = CreateBarrierRequest {
            namespace_name: namespace.to_string(),
            barrier_name: name.to_string(),
            description: description.to_string(),
            expected_processes: i64::try_from(expected).unwrap_or(i64::MAX),
            delete_inactive_after_seconds: secs_i64(delete_inactive_after),
            metadata: HashMap::new(),
        };
        let resp = self
            .unary_once(OP, self.default_options(), req, |ch, r| async move {
                GrackleApiClient::new(ch).create_barrier(r).await
            })
            .await?;
        resp.barrier.ok_or_else(|| missing(OP, "barrier"))
    }

    /// Replaces a barrier's mutable attributes (every field of `req`).
    pub async fn update_barrier(&self, req: UpdateBarrierRequest) -> Result<Barrier> {
        const OP: &str = "update barrier";
        let resp = self
            .unary_once(OP, self.default_options(), req, |ch, r| async move {
                GrackleApiClient::new(ch).update_barrier(r).await
            })
            .await?;
        resp.barrier.ok_or_else(|| missing(OP, "barrier"))
    }

    /// Reads a barrier.
    pub async fn get_barrier(&self, namespace: &str, name: &str) -> Result<Barrier> {
        const OP: &str = "get barrier";
        let req = GetBarrierRequest {
            namespace_name: namespace.to_string(),
            barrier_name: name.to_string(),
        };
        let resp = self
            .unary(OP, self.default_options(), req, |ch, r| async move {
                GrackleApiClient::new(ch).get_barrier(r).await
            })
            .await?;
        resp.barrier.ok_or_else(|| missing(OP, "barrier"))
    }

    /// Every barrier of a namespace, by name (all pages).
    pub async fn list_barriers(&self, namespace: &str) -> Result<Vec<Barrier>> {
        const OP: &str = "list barriers";
        all_pages(async |pagination_token| {
            let req = ListBarriersRequest {
                namespace_name: namespace.to_string(),
                pagination_token,
                limit: PAGE_LIMIT,
            };
            let resp = self
                .unary(OP, self.default_options(), req, |ch, r| async move {
                    GrackleApiClient::new(ch).list_barriers(r).await
                })
                .await?;
            Ok((resp.barriers, resp.next_pagination_token))
        })
        .await
    }

    /// Deletes a barrier (absent: nothing happens).
    pub async fn delete_barrier(&self, namespace: &str, name: &str) -> Result<()> {
        const OP: &str = "delete barrier";
        let req = DeleteBarrierRequest {
            namespace_name: namespace.to_string(),
            barrier_name: name.to_string(),
        };
        self.unary_once(OP, self.default_options(), req, |ch, r| async move {
            GrackleApiClient::new(ch).delete_barrier(r).await
        })
        .await?;
        Ok(())
    }

    /// Arrives at generation `generation` as `process_id`: the barrier after it, and whether
    /// this arrival tripped it.
    pub async fn arrive_at_barrier(
        &self,
        namespace: &str,
        name: &str,
        process_id: &str,
        generation: u64,
        metadata: HashMap<String, String>,
    ) -> Result<(Barrier, bool)> {
        const OP: &str = "arrive at barrier";
        let req = ArriveAtBarrierRequest {
            namespace_name: namespace.to_string(),
            barrier_name: name.to_string(),
            process_id: process_id.to_string(),
            expected_generation: i64::try_from(generation).unwrap_or(i64::MAX),
            metadata,
        };
        let resp = self
            .unary_once(OP, self.default_options(), req, |ch, r| async move {
                GrackleApiClient::new(ch).arrive_at_barrier(r).await
            })
            .await?;
        Ok((
            resp.barrier.ok_or_else(|| missing(OP, "barrier"))?,
            resp.all_arrived,
        ))
    }

    /// Waits up to `wait` (at most [`WAIT_RPC_MAX`]) for the barrier to trip past
    /// `generation`.
    pub async fn wait_at_barrier(
        &self,
        namespace: &str,
        name: &str,
        generation: u64,
        wait: Duration,
    ) -> Result<(Barrier, BarrierWaitOutcome)> {
        const OP: &str = "wait at barrier";
        let wait = wait.min(WAIT_RPC_MAX);
        let req = WaitAtBarrierRequest {
            namespace_name: namespace.to_string(),
            barrier_name: name.to_string(),
            expected_generation: i64::try_from(generation).unwrap_or(i64::MAX),
            timeout_seconds: i32::try_from(wait.as_secs()).unwrap_or(300),
        };
        let resp = self
            .unary(OP, self.wait_options(wait), req, |ch, r| async move {
                GrackleApiClient::new(ch).wait_at_barrier(r).await
            })
            .await?;
        let outcome =
            BarrierWaitOutcome::try_from(resp.outcome).unwrap_or(BarrierWaitOutcome::Invalid);
        Ok((resp.barrier.ok_or_else(|| missing(OP, "barrier"))?, outcome))
    }

    /// Who arrived in `generation` (all pages; only the current and the last tripped
    /// generation are kept).
    pub async fn list_barrier_participants(
        &self,
        namespace: &str,
        name: &str,
        generation: u64,
    ) -> Result<Vec<BarrierParticipant>> {
        const OP: &str = "list barrier participants";
        all_pages(async |pagination_token| {
            let req = ListBarrierParticipantsRequest {
                namespace_name: namespace.to_string(),
                barrier_name: name.to_string(),
                generation: i64::try_from(generation).unwrap_or(i64::MAX),
                pagination_token,
                limit: PAGE_LIMIT,
            };
            let resp = self
                .unary(OP, self.default_options(), req, |ch, r| async move {
                    GrackleApiClient::new(ch).list_barrier_participants(r).await
                })
                .await?;
            Ok((resp.participants, resp.next_pagination_token))
        })
        .await
    }
}
