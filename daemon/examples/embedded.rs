//! A program that embeds a conch node and takes a semaphore through the in-process client.
//!
//! Run with `cargo run -p conchd --example embedded`.

use conchd::proto::grackle::{
    AcquireOutcome, AcquireSemaphoreRequest, CreateNamespaceRequest, CreateSemaphoreLeaseRequest,
    CreateSemaphoreRequest, ReleaseSemaphoreRequest,
};
use conchd::{ConchNode, NodeConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A real program keeps its node's data in a directory of its own, across restarts.
    let data = tempfile::tempdir()?;
    let node = ConchNode::start(NodeConfig::single("127.0.0.1:0", data.path())).await?;
    println!(
        "node {} serving on {} (also reachable by conch and other nodes)",
        node.id(),
        node.local_addr()
    );

    // The Grackle API, called in this process: same checks and errors as over the network.
    let mut grackle = node.client().grackle();
    grackle
        .create_namespace(CreateNamespaceRequest {
            name: "jobs".into(),
            ..Default::default()
        })
        .await?;
    println!("created namespace jobs");
    grackle
        .create_semaphore(CreateSemaphoreRequest {
            namespace_name: "jobs".into(),
            semaphore_name: "db-migrations".into(),
            permits: 1,
            ..Default::default()
        })
        .await?;
    println!("created semaphore jobs/db-migrations with 1 permit");
    let lease = grackle
        .create_semaphore_lease(CreateSemaphoreLeaseRequest {
            namespace_name: "jobs".into(),
            process_id: "embedded-example".into(),
            ttl_seconds: 30,
            ..Default::default()
        })
        .await?
        .into_inner()
        .lease
        .ok_or("the lease reply has no lease")?;
    println!("created lease {} (ttl 30 s)", lease.lease_id);

    let acquired = grackle
        .acquire_semaphore(AcquireSemaphoreRequest {
            namespace_name: "jobs".into(),
            semaphore_name: "db-migrations".into(),
            lease_id: lease.lease_id.clone(),
            weight: 1,
            timeout_seconds: 5,
            ..Default::default()
        })
        .await?
        .into_inner();
    if acquired.outcome() != AcquireOutcome::Acquired {
        return Err("the semaphore was not acquired".into());
    }
    println!(
        "acquired jobs/db-migrations, fencing token {}",
        acquired.fencing_token
    );

    // ... the work the semaphore guards ...

    grackle
        .release_semaphore(ReleaseSemaphoreRequest {
            namespace_name: "jobs".into(),
            semaphore_name: "db-migrations".into(),
            lease_id: lease.lease_id,
        })
        .await?;
    println!("released jobs/db-migrations");

    // Stop serving, stop Raft, close the storage.
    node.shutdown().await?;
    println!("node stopped");
    Ok(())
}
