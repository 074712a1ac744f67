//! Small helpers over the Grackle API for tests.

use crate::net::NodeChannel as Channel;
use conch_proto::grackle as pb;
use conch_proto::grackle::grackle_api_client::GrackleApiClient;

pub type Grackle = GrackleApiClient<Channel>;

pub async fn namespace(c: &mut Grackle, name: &str) -> Result<pb::Namespace, tonic::Status> {
    let r = c
        .create_namespace(pb::CreateNamespaceRequest {
            name: name.into(),
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner().namespace.unwrap_or_default())
}

pub async fn semaphore(
    c: &mut Grackle,
    ns: &str,
    name: &str,
    permits: u64,
) -> Result<pb::Semaphore, tonic::Status> {
    let r = c
        .create_semaphore(pb::CreateSemaphoreRequest {
            namespace_name: ns.into(),
            semaphore_name: name.into(),
            permits,
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner().semaphore.unwrap_or_default())
}

pub async fn lease(c: &mut Grackle, ns: &str, ttl_seconds: u64) -> Result<String, tonic::Status> {
    let r = c
        .create_semaphore_lease(pb::CreateSemaphoreLeaseRequest {
            namespace_name: ns.into(),
            process_id: "test".into(),
            ttl_seconds,
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner().lease.unwrap_or_default().lease_id)
}

pub async fn acquire(
    c: &mut Grackle,
    ns: &str,
    sem: &str,
    lease: &str,
    weight: u64,
    timeout_seconds: i32,
) -> Result<pb::AcquireSemaphoreResponse, tonic::Status> {
    let r = c
        .acquire_semaphore(pb::AcquireSemaphoreRequest {
            namespace_name: ns.into(),
            semaphore_name: sem.into(),
            lease_id: lease.into(),
            weight,
            timeout_seconds,
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner())
}

pub async fn release(
    c: &mut Grackle,
    ns: &str,
    sem: &str,
    lease: &str,
) -> Result<pb::Semaphore, tonic::Status> {
    let r = c
        .release_semaphore(pb::ReleaseSemaphoreRequest {
            namespace_name: ns.into(),
            semaphore_name: sem.into(),
            lease_id: lease.into(),
        })
        .await?;
    Ok(r.into_inner().semaphore.unwrap_or_default())
}

pub async fn holders(
    c: &mut Grackle,
    ns: &str,
    sem: &str,
) -> Result<Vec<pb::SemaphoreHolder>, tonic::Status> {
    let r = c
        .list_semaphore_holders(pb::ListSemaphoreHoldersRequest {
            namespace_name: ns.into(),
            semaphore_name: sem.into(),
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner().holders)
}

pub fn acquired(r: &pb::AcquireSemaphoreResponse) -> bool {
    r.outcome == pb::AcquireOutcome::Acquired as i32
}

/// A one-permit semaphore, held: see [`held_by_one`].
pub struct Held {
    /// The lease that holds the permit.
    pub holder: String,
    /// A second lease, ready to wait for the permit.
    pub waiter: String,
    /// The holder's fencing token.
    pub fencing_token: u64,
}

/// Creates namespace `ns` and semaphore `sem` (1 permit), a lease (TTL `holder_ttl`) that takes
/// the permit and a second lease (TTL `waiter_ttl`) ready to wait for it.
pub async fn held_by_one(
    c: &mut Grackle,
    ns: &str,
    sem: &str,
    holder_ttl: u64,
    waiter_ttl: u64,
) -> anyhow::Result<Held> {
    namespace(c, ns).await?;
    semaphore(c, ns, sem, 1).await?;
    let holder = lease(c, ns, holder_ttl).await?;
    let waiter = lease(c, ns, waiter_ttl).await?;
    let r = acquire(c, ns, sem, &holder, 1, 0).await?;
    anyhow::ensure!(acquired(&r), "the first lease was not granted: {r:?}");
    Ok(Held {
        holder,
        waiter,
        fencing_token: r.fencing_token,
    })
}
