//! `Client::wait_holder_change` against real conchd nodes run in-process (tests/it/common): the
//! server answers when the holder changes, not before, and a missing semaphore counts as nobody.
//!
//! The test sees a wait parked on the server (conchd's `parked` debug event) before it changes
//! the holder, so an answer carrying the new holder is the wake-up, never a wait that started
//! late and found the change already made.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::{Cluster, eventually};
use conch_client::{Client, ClientConfig};
use tracing::subscriber::Interest;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Counts the holder-change waits conchd parks (each time one finds nothing changed and waits).
#[derive(Clone, Default)]
struct Parked(Arc<AtomicUsize>);

const WAIT_TARGET: &str = "conchd::api::holder_watch";

impl<S: tracing::Subscriber> Layer<S> for Parked {
    fn register_callsite(&self, meta: &'static tracing::Metadata<'static>) -> Interest {
        match meta.target() == WAIT_TARGET {
            true => Interest::always(),
            false => Interest::never(),
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().fields().field("parked").is_some() {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Parked {
    /// Installs the counter for the whole process (the nodes run on the runtime's threads).
    fn install() -> Parked {
        let parked = Parked::default();
        let subscriber = tracing_subscriber::registry().with(parked.clone());
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber per process");
        parked
    }

    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// Waits until a wait was parked after `before` parkings were counted.
    async fn after(&self, before: usize) {
        let parked = eventually(Duration::from_secs(30), async || self.count() > before).await;
        assert!(parked, "no holder-change wait parked on the server");
    }
}

const NS: &str = "t";

async fn client(cluster: &Cluster) -> Client {
    let config = ClientConfig {
        request_timeout: Duration::from_secs(2),
        retry_for: Duration::from_secs(5),
        ..ClientConfig::default()
    };
    Client::connect_with(cluster.endpoints(), config)
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_ends_when_the_holder_changes_and_not_before() {
    let parked = Parked::install();
    let cluster = Cluster::start(3).await;
    let c = client(&cluster).await;

    // No namespace, no semaphore: nobody holds, answered at once.
    let now = c
        .wait_holder_change(NS, "s", 0, Duration::ZERO)
        .await
        .expect("wait");
    assert!(!now.exists && now.holders.is_empty() && now.token() == 0);

    c.ensure_namespace(NS).await.expect("namespace");
    c.ensure_semaphore(NS, "s", 1).await.expect("semaphore");

    // Nothing changes: the wait runs to its timeout and says so.
    let t0 = Instant::now();
    let same = c
        .wait_holder_change(NS, "s", 0, Duration::from_millis(400))
        .await
        .expect("wait");
    assert!(same.exists && same.token() == 0);
    assert!(
        t0.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t0.elapsed()
    );

    // A grant wakes a parked wait, which answers with the new holder (a wait that ran to its
    // timeout would answer with the holders it last read: nobody).
    let lease = c
        .create_lease(NS, "test", Duration::from_secs(10), HashMap::new())
        .await
        .expect("lease");
    let before = parked.count();
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move {
            c.wait_holder_change(NS, "s", 0, Duration::from_secs(60))
                .await
        })
    };
    parked.after(before).await;
    assert!(!waiter.is_finished(), "answered before anything changed");
    let guard = c
        .acquire(&lease, NS, "s", 1, None, HashMap::new())
        .await
        .expect("acquire")
        .expect("granted");
    let changed = waiter.await.expect("join").expect("wait");
    assert_eq!(changed.token(), guard.fencing_token());
    assert_eq!(changed.holders[0].lease_id, lease.id());

    // Asking with the current holder waits for its release.
    let before = parked.count();
    let waiter = {
        let c = c.clone();
        let known = guard.fencing_token();
        tokio::spawn(async move {
            c.wait_holder_change(NS, "s", known, Duration::from_secs(30))
                .await
        })
    };
    parked.after(before).await;
    assert!(!waiter.is_finished(), "answered before anything changed");
    guard.release().await.expect("release");
    let after = waiter.await.expect("join").expect("wait");
    assert_eq!(after.token(), 0);
    assert!(after.exists);
    lease.revoke().await.expect("revoke");
}
