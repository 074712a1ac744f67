//! State of every kind, written into a cluster of one release and checked in a cluster of
//! another: the upgrade fixtures (`conch-upgrade-fixtures`), the test that opens them, and the
//! rolling upgrade test.
//!
//! [`populate`] writes, with access control on: a namespace with metadata; a semaphore with a
//! hold limit, two holders and a queued waiter (whose call stays open); a role with a grant and
//! a token of it; a lock held by a lock lease; a wait group with a completed job; a barrier with
//! an arrival; an audit record (a revoked holder); a write remembered under a request id.
//! [`verify`] checks each of them, then that the token still works, that the remembered request
//! id still answers its retry, and that a new grant's fencing token is above every old one.

use std::collections::BTreeMap;

use anyhow::{Context, ensure};
use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::conch::conch_auth_client::ConchAuthClient;
use conch_proto::conch::{
    HolderKind, ListAuditRequest, ListSemaphoreWaitersRequest, RevokeHolderRequest,
    RoleCreateRequest, RoleGrantRequest, TokenCreateRequest, TokenListRequest,
};
use conch_proto::grackle as pb;
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use serde::{Deserialize, Serialize};

use crate::net::{NodeChannel, channel};

/// The namespace everything lives in.
pub const NS: &str = "fixture";
/// The request id of the remembered write.
pub const REQUEST_ID: &str = "fixture-namespace-1";
/// The admin token of the fixture clusters (a test secret, committed with the fixtures).
pub const ADMIN_TOKEN: &str = "fixture-admin-token-0123456789abcdef";

/// What [`populate`] made, for [`verify`].
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Expected {
    /// The holders of `pool`, in grant order, with their fencing tokens.
    pub holders: Vec<(String, u64)>,
    /// The lease queued on `pool`.
    pub waiter: String,
    /// The lock lease holding `lock`.
    pub lock_holder: String,
    /// The plaintext of the `ci` role's token.
    pub ci_token: String,
    /// The id of the audit record of the revoked holder.
    pub audit_seq: u64,
}

/// The peer secret of the fixture clusters.
pub const PEER_SECRET: &str = "fixture-peer-secret-0123456789abcdef";

/// What `conch-upgrade-fixtures` records beside the data directories (`fixture.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Fixture {
    /// The release that wrote them.
    pub release: String,
    /// The members as the data directories know them: id -> address.
    pub members: BTreeMap<u64, String>,
    pub peer_secret: String,
    pub expected: Expected,
}

impl Fixture {
    /// The flags that turn access control on with [`ADMIN_TOKEN`] and make peers authenticate
    /// with [`PEER_SECRET`], their files written into `dir`; and the peer secret.
    pub fn secret_args(dir: &std::path::Path) -> anyhow::Result<(Vec<String>, String)> {
        let token = dir.join("admin.token");
        crate::auth::write_secret(&token, ADMIN_TOKEN)?;
        let (secret_args, secret) = Self::peer_secret_args(dir, PEER_SECRET)?;
        let mut args = vec![
            "--bootstrap-admin-token-file".to_string(),
            token.display().to_string(),
        ];
        args.extend(secret_args);
        Ok((args, secret))
    }

    /// The flags for the peer secret `secret`, its file written into `dir`.
    pub fn peer_secret_args(
        dir: &std::path::Path,
        secret: &str,
    ) -> anyhow::Result<(Vec<String>, String)> {
        let path = dir.join("peer.secret");
        crate::auth::write_secret(&path, secret)?;
        Ok((
            vec!["--peer-secret-file".to_string(), path.display().to_string()],
            secret.to_string(),
        ))
    }

    /// Reads `fixture.json` of the fixtures in `dir`.
    pub fn load(dir: &std::path::Path) -> anyhow::Result<Fixture> {
        let path = dir.join("fixture.json");
        let text =
            std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))
    }

    /// Unpacks the data directories of the fixtures in `dir` into `into` (`node1`…).
    pub fn unpack(dir: &std::path::Path, into: &std::path::Path) -> anyhow::Result<()> {
        let status = std::process::Command::new("tar")
            .arg("-xzf")
            .arg(dir.join("data.tar.gz"))
            .arg("-C")
            .arg(into)
            .status()
            .context("run tar")?;
        ensure!(status.success(), "tar: {status}");
        Ok(())
    }

    /// `--initial-cluster` as the directories were started with.
    pub fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|(id, addr)| format!("{id}={addr}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// How long the committed fixtures' wait group stays open (about 50 years).
const FIXTURE_LIFETIME: std::time::Duration = std::time::Duration::from_secs(50 * 365 * 86_400);

fn request_with_id<T>(message: T, id: &str) -> anyhow::Result<tonic::Request<T>> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("conch-request-id", id.parse().context("request id header")?);
    Ok(request)
}

fn create_namespace_request() -> pb::CreateNamespaceRequest {
    pb::CreateNamespaceRequest {
        name: "fixture-once".into(),
        description: "made once".into(),
        metadata: BTreeMap::new().into_iter().collect(),
    }
}

async fn lease(c: &mut GrackleApiClient<NodeChannel>, process: &str) -> anyhow::Result<String> {
    let r = c
        .create_semaphore_lease(pb::CreateSemaphoreLeaseRequest {
            namespace_name: NS.into(),
            process_id: process.into(),
            ttl_seconds: 300,
            metadata: Default::default(),
        })
        .await?
        .into_inner();
    r.lease.map(|l| l.lease_id).context("lease in reply")
}

async fn acquire(
    c: &mut GrackleApiClient<NodeChannel>,
    sem: &str,
    lease: &str,
    timeout_seconds: i32,
) -> anyhow::Result<pb::AcquireSemaphoreResponse> {
    Ok(c.acquire_semaphore(pb::AcquireSemaphoreRequest {
        namespace_name: NS.into(),
        semaphore_name: sem.into(),
        lease_id: lease.into(),
        weight: 1,
        timeout_seconds,
        ..Default::default()
    })
    .await?
    .into_inner())
}

/// Holders of `sem` as (lease, fencing token), in grant order.
pub async fn holders(
    c: &mut GrackleApiClient<NodeChannel>,
    sem: &str,
) -> anyhow::Result<Vec<(String, u64)>> {
    let r = c
        .list_semaphore_holders(pb::ListSemaphoreHoldersRequest {
            namespace_name: NS.into(),
            semaphore_name: sem.into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut holders: Vec<(String, u64)> = r
        .holders
        .into_iter()
        .map(|h| (h.lease_id, h.fencing_token))
        .collect();
    holders.sort_by_key(|(_, token)| *token);
    Ok(holders)
}

/// Writes state of every kind through the node at `addr` (the process's token must be
/// [`ADMIN_TOKEN`], a cluster admin). Leaves one blocking acquire running: the returned task,
/// which the caller keeps until the nodes stop.
pub async fn populate(addr: &str) -> anyhow::Result<(Expected, tokio::task::JoinHandle<()>)> {
    let ch = channel(addr).await?;
    let mut g = GrackleApiClient::new(ch.clone());
    let mut api = ConchApiClient::new(ch.clone());
    let mut auth = ConchAuthClient::new(ch.clone());
    g.create_namespace(pb::CreateNamespaceRequest {
        name: NS.into(),
        description: "kept across upgrades".into(),
        metadata: [("team".to_string(), "core".to_string())]
            .into_iter()
            .collect(),
    })
    .await
    .context("create the namespace")?;
    for (name, max_hold_ms) in [("pool", 0), ("limited", 600_000)] {
        g.create_semaphore(pb::CreateSemaphoreRequest {
            namespace_name: NS.into(),
            semaphore_name: name.into(),
            description: format!("semaphore {name}"),
            permits: 2,
            metadata: [("kind".to_string(), name.to_string())]
                .into_iter()
                .collect(),
            max_hold_ms,
        })
        .await
        .with_context(|| format!("create semaphore {name}"))?;
    }
    let mut holders_made = Vec::new();
    for process in ["holder-1", "holder-2"] {
        let lease = lease(&mut g, process).await?;
        let r = acquire(&mut g, "pool", &lease, 0).await?;
        ensure!(
            r.outcome == pb::AcquireOutcome::Acquired as i32,
            "{process}: {r:?}"
        );
        holders_made.push(lease);
    }
    let waiter = lease(&mut g, "waiter").await?;
    // No call deadline on this one: it waits until the nodes stop.
    let mut waiting = GrackleApiClient::new(crate::net::lazy_channel(addr)?);
    let waiter_lease = waiter.clone();
    let waiting = tokio::spawn(async move {
        let _ = acquire(&mut waiting, "pool", &waiter_lease, 300).await;
    });
    crate::wait_for(
        "the waiter to be queued",
        std::time::Duration::from_secs(30),
        || {
            let mut api = api.clone();
            async move {
                let r = api
                    .list_semaphore_waiters(ListSemaphoreWaitersRequest {
                        namespace_name: NS.into(),
                        semaphore_name: "pool".into(),
                        ..Default::default()
                    })
                    .await
                    .ok()?
                    .into_inner();
                (r.waiters.len() == 1).then_some(())
            }
        },
    )
    .await?;
    // A hold under the limit, then revoked by an administrator: an audit record.
    let revoked = lease(&mut g, "revoked").await?;
    acquire(&mut g, "limited", &revoked, 0).await?;
    let record = api
        .revoke_holder(RevokeHolderRequest {
            namespace_name: NS.into(),
            kind: HolderKind::Semaphore as i32,
            object_name: "limited".into(),
            lease_id: revoked,
            reason: "stuck since the fixture began".into(),
        })
        .await
        .context("revoke a holder")?
        .into_inner()
        .record
        .context("audit record in reply")?;
    let lock_lease = g
        .create_lock_lease(pb::CreateLockLeaseRequest {
            namespace_name: NS.into(),
            process_id: "locker".into(),
            ttl_seconds: 300,
            metadata: Default::default(),
        })
        .await?
        .into_inner()
        .lease
        .context("lock lease")?
        .lease_id;
    g.acquire_lock(pb::AcquireLockRequest {
        namespace_name: NS.into(),
        lock_name: "/fixture/lock".into(),
        exclusive: true,
        lease_id: lock_lease.clone(),
        ..Default::default()
    })
    .await
    .context("take the lock")?;
    g.create_wait_group(pb::CreateWaitGroupRequest {
        namespace_name: NS.into(),
        wait_group_name: "nightly".into(),
        description: "three jobs".into(),
        counter: 3,
        // The fixtures are committed and opened for years: expire long after that.
        expires_at: (std::time::SystemTime::now() + FIXTURE_LIFETIME)
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos() as i64,
        delete_after_finished_seconds: 3_600,
        ..Default::default()
    })
    .await
    .context("create the wait group")?;
    g.complete_jobs_from_wait_group(pb::CompleteJobsFromWaitGroupRequest {
        namespace_name: NS.into(),
        wait_group_name: "nightly".into(),
        jobs: vec![pb::CompleteJobRequest {
            job_id: "job-1".into(),
            metadata: Default::default(),
        }],
    })
    .await
    .context("complete a job")?;
    let generation = g
        .create_barrier(pb::CreateBarrierRequest {
            namespace_name: NS.into(),
            barrier_name: "shards".into(),
            description: "two shards".into(),
            expected_processes: 2,
            delete_inactive_after_seconds: FIXTURE_LIFETIME.as_secs() as i64,
            ..Default::default()
        })
        .await
        .context("create the barrier")?
        .into_inner()
        .barrier
        .context("barrier in reply")?
        .generation;
    g.arrive_at_barrier(pb::ArriveAtBarrierRequest {
        namespace_name: NS.into(),
        barrier_name: "shards".into(),
        process_id: "shard-0".into(),
        expected_generation: generation,
        ..Default::default()
    })
    .await
    .context("arrive at the barrier")?;
    auth.role_create(RoleCreateRequest {
        name: "ci".into(),
        cluster_admin: false,
    })
    .await?;
    auth.role_grant(RoleGrantRequest {
        role: "ci".into(),
        namespace: NS.into(),
        permission: "acquire".into(),
    })
    .await?;
    let ci_token = auth
        .token_create(TokenCreateRequest {
            name: "ci-runner".into(),
            role: "ci".into(),
        })
        .await?
        .into_inner()
        .secret;
    g.create_namespace(request_with_id(create_namespace_request(), REQUEST_ID)?)
        .await
        .context("the write with a request id")?;
    let holders = holders(&mut g, "pool").await?;
    ensure!(holders.len() == 2, "{holders:?}");
    Ok((
        Expected {
            holders,
            waiter,
            lock_holder: lock_lease,
            ci_token,
            audit_seq: record.seq,
        },
        waiting,
    ))
}

/// Checks everything [`populate`] made, through the node at `addr`, then that it is still
/// usable (see the module's docs).
pub async fn verify(addr: &str, expected: &Expected) -> anyhow::Result<()> {
    let ch = channel(addr).await?;
    let mut g = GrackleApiClient::new(ch.clone());
    let mut api = ConchApiClient::new(ch.clone());
    let mut auth = ConchAuthClient::new(ch.clone());
    let ns = g
        .get_namespace(pb::GetNamespaceRequest {
            namespace_name: NS.into(),
        })
        .await
        .context("the namespace")?
        .into_inner()
        .namespace
        .context("namespace in reply")?;
    ensure!(
        ns.metadata.get("team").map(String::as_str) == Some("core")
            && ns.description == "kept across upgrades",
        "{ns:?}"
    );
    let limited = g
        .get_semaphore(pb::GetSemaphoreRequest {
            namespace_name: NS.into(),
            semaphore_name: "limited".into(),
        })
        .await?
        .into_inner()
        .semaphore
        .context("semaphore in reply")?;
    ensure!(limited.max_hold_ms == 600_000, "hold limit: {limited:?}");
    let holders_now = holders(&mut g, "pool").await?;
    ensure!(
        holders_now == expected.holders,
        "holders {holders_now:?}, expected {:?}",
        expected.holders
    );
    let waiters = api
        .list_semaphore_waiters(ListSemaphoreWaitersRequest {
            namespace_name: NS.into(),
            semaphore_name: "pool".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .waiters;
    ensure!(
        waiters
            .iter()
            .map(|w| w.lease_id.as_str())
            .collect::<Vec<_>>()
            == [expected.waiter.as_str()],
        "waiters {waiters:?}, expected {}",
        expected.waiter
    );
    let lock = g
        .get_lock(pb::GetLockRequest {
            namespace_name: NS.into(),
            lock_name: "/fixture/lock".into(),
        })
        .await?
        .into_inner()
        .lock
        .context("lock in reply")?;
    ensure!(
        lock.lock_holders
            .iter()
            .map(|h| h.lease_id.as_str())
            .collect::<Vec<_>>()
            == [expected.lock_holder.as_str()],
        "lock {lock:?}"
    );
    let wg = g
        .get_wait_group(pb::GetWaitGroupRequest {
            namespace_name: NS.into(),
            wait_group_name: "nightly".into(),
        })
        .await?
        .into_inner()
        .wait_group
        .context("wait group in reply")?;
    ensure!(wg.counter == 3 && wg.completed_jobs == 1, "{wg:?}");
    let barrier = g
        .get_barrier(pb::GetBarrierRequest {
            namespace_name: NS.into(),
            barrier_name: "shards".into(),
        })
        .await?
        .into_inner()
        .barrier
        .context("barrier in reply")?;
    ensure!(
        barrier.expected_processes == 2 && barrier.arrived_processes == 1,
        "{barrier:?}"
    );
    let audit = api
        .list_audit(ListAuditRequest {
            namespace_name: NS.into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .records;
    ensure!(
        audit.iter().any(|r| r.seq == expected.audit_seq),
        "audit record {} missing: {audit:?}",
        expected.audit_seq
    );
    let tokens = auth
        .token_list(TokenListRequest {})
        .await?
        .into_inner()
        .tokens;
    ensure!(
        tokens
            .iter()
            .any(|t| t.name == "ci-runner" && t.role == "ci"),
        "{tokens:?}"
    );
    // The remembered request id answers its retry with the first reply, not "exists".
    g.create_namespace(request_with_id(create_namespace_request(), REQUEST_ID)?)
        .await
        .context("the retry of the write with a request id")?;
    // The ci token still takes a slot, and its grant's fencing token is above every old one.
    let mut as_ci = GrackleApiClient::with_interceptor(
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect()
            .await?,
        {
            let bearer: tonic::metadata::MetadataValue<_> =
                format!("Bearer {}", expected.ci_token).parse()?;
            move |mut r: tonic::Request<()>| {
                r.metadata_mut().insert("authorization", bearer.clone());
                Ok(r)
            }
        },
    );
    let lease = as_ci
        .create_semaphore_lease(pb::CreateSemaphoreLeaseRequest {
            namespace_name: NS.into(),
            process_id: "after".into(),
            ttl_seconds: 30,
            metadata: Default::default(),
        })
        .await
        .context("the ci token makes a lease")?
        .into_inner()
        .lease
        .context("lease")?
        .lease_id;
    let r = as_ci
        .acquire_semaphore(pb::AcquireSemaphoreRequest {
            namespace_name: NS.into(),
            semaphore_name: "limited".into(),
            lease_id: lease,
            weight: 1,
            ..Default::default()
        })
        .await
        .context("the ci token acquires")?
        .into_inner();
    let oldest_max = expected.holders.iter().map(|(_, t)| *t).max().unwrap_or(0);
    ensure!(
        r.outcome == pb::AcquireOutcome::Acquired as i32 && r.fencing_token > oldest_max,
        "new grant {r:?}, old tokens up to {oldest_max}"
    );
    Ok(())
}
