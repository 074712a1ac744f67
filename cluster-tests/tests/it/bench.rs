//! The benchmark's harness works end to end: the etcd baseline runs the `conch sema` recipe on a
//! real 3-node etcd (W1 and the contended W2 with watches), and conch's W1 and W2 run with
//! clients spread over the nodes without following the leader hint. Only correctness is checked here (every cycle succeeds, placement holds);
//! speed is what `conch-bench` measures. The lock workloads (L1-L3) run the same way: etcd's
//! `concurrency.Mutex` and `recipes.RWMutex` recipes, and conch's locks; the wait group and
//! barrier workloads (S1-S3), the election hand-over (E1), the pushed loss (P1) and the live
//! sessions (W6) at a small size.

use std::time::Duration;

use cluster_tests::bench::etcd::{self, EtcdCluster};
use cluster_tests::bench::{
    Opts, Placement, Target, elect, etcd_locks, locks, loss, sync, w1, w2, w6,
};

fn opts() -> Opts {
    Opts {
        duration: Duration::from_secs(1),
        warmup: Duration::ZERO,
        w4_leases: 1,
        w5_leases: 1,
        w5_semaphores: 1,
        w5_waiters: 1,
        tls: false,
        auth: false,
        w1_clients: vec![1],
        w1b_clients: vec![1],
        breakdown: false,
        w6: Default::default(),
    }
}

fn field(row: &cluster_tests::bench::stats::Row, key: &str) -> serde_json::Value {
    row.fields.get(key).cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_baseline_runs_the_recipe_in_both_placements() -> anyhow::Result<()> {
    anyhow::ensure!(
        etcd::binary().exists(),
        "{} is missing: make test installs it (scripts/install-bench-deps.sh)",
        etcd::binary().display()
    );
    let cluster = EtcdCluster::start(3).await?;
    for (per_cycle_lease, placement) in [(false, Placement::Leader), (true, Placement::Spread)] {
        let row = etcd::w1(&cluster, &opts(), 3, per_cycle_lease, placement).await?;
        assert_eq!(field(&row, "errors"), 0, "{}", row.json());
        assert!(
            field(&row, "cycles_per_s")
                .as_f64()
                .is_some_and(|c| c > 0.0),
            "{}",
            row.json()
        );
        assert_eq!(field(&row, "placement"), placement.name());
    }
    // Contended: 16 clients on 2 slots wait for each other through watches.
    let row = etcd::w2(&cluster, &opts(), 0, Placement::Spread).await?;
    assert_eq!(field(&row, "errors"), 0, "{}", row.json());
    assert!(
        field(&row, "handoffs").as_u64().is_some_and(|h| h > 0),
        "{}",
        row.json()
    );
    // The lock recipes: Mutex uncontended and contended, RWMutex with readers and a writer.
    let row = etcd_locks::l1(&cluster, &opts(), 3, Placement::Spread).await?;
    lock_rows_ok(&row, "cycles_per_s");
    let row = etcd_locks::l2(&cluster, &opts(), Placement::Leader).await?;
    lock_rows_ok(&row, "grants_per_s");
    let row = etcd_locks::l3(&cluster, &opts(), Placement::Spread).await?;
    lock_rows_ok(&row, "reader_cycles_per_s");
    Ok(())
}

/// A lock row without errors, with `rate` above zero, and (L2, L3) with waits measured.
fn lock_rows_ok(row: &cluster_tests::bench::stats::Row, rate: &str) {
    assert_eq!(field(row, "errors"), 0, "{}", row.json());
    assert!(
        field(row, rate).as_f64().is_some_and(|r| r > 0.0),
        "{}",
        row.json()
    );
    if rate == "grants_per_s" {
        assert!(
            field(row, "handoffs").as_u64().is_some_and(|h| h > 0),
            "{}",
            row.json()
        );
    }
    if rate == "reader_cycles_per_s" {
        assert!(
            field(row, "writer_wait_p99_ms").is_number(),
            "the writer got the lock: {}",
            row.json()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_conch_clients_stay_where_they_are_put() -> anyhow::Result<()> {
    let target = Target::new(&None, "spread", false, false).await?;
    let row = w1::run(&target, &opts(), 3, false, Placement::Spread).await?;
    assert_eq!(field(&row, "errors"), 0, "{}", row.json());
    assert_eq!(
        field(&row, "redirects"),
        0,
        "spread clients ignore the hint: {}",
        row.json()
    );
    assert!(
        field(&row, "cycles_per_s")
            .as_f64()
            .is_some_and(|c| c > 0.0),
        "{}",
        row.json()
    );
    let row = w1::run(&target, &opts(), 3, false, Placement::Leader).await?;
    assert_eq!(field(&row, "errors"), 0, "{}", row.json());
    let row = w2::run(&target, &opts(), 0, Placement::Spread).await?;
    assert_eq!(field(&row, "errors"), 0, "{}", row.json());
    assert!(
        field(&row, "handoffs").as_u64().is_some_and(|h| h > 0),
        "{}",
        row.json()
    );
    // The lock workloads: spread clients stay put too.
    let row = locks::l1(&target, &opts(), 3, Placement::Spread).await?;
    lock_rows_ok(&row, "cycles_per_s");
    assert_eq!(field(&row, "redirects"), 0, "{}", row.json());
    let row = locks::l2(&target, &opts(), Placement::Spread).await?;
    lock_rows_ok(&row, "grants_per_s");
    let row = locks::l3(&target, &opts(), Placement::Leader).await?;
    lock_rows_ok(&row, "reader_cycles_per_s");
    Ok(())
}

/// `--breakdown`: every stage of the write's path is observed on the node it belongs to, on
/// the leader and through a follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breakdown_sees_every_stage_of_a_write_on_its_node() -> anyhow::Result<()> {
    use cluster_tests::bench::breakdown::Breakdown;
    let target = Target::new(&None, "breakdown", false, false).await?;
    let opts = Opts {
        breakdown: true,
        ..opts()
    };
    for (placement, path, stages) in [
        (
            Placement::Leader,
            "leader",
            &[
                "call (server)",
                "handler_in",
                "queue",
                "batch",
                "raft (client_write)",
            ][..],
        ),
        (
            Placement::Spread,
            "follower",
            &[
                "call (server)",
                "to_forwarder",
                "forward",
                "peer_call (on the leader)",
            ][..],
        ),
    ] {
        let row = w1::run(&target, &opts, 1, false, placement).await?;
        assert_eq!(field(&row, "errors"), 0, "{}", row.json());
        let b: Breakdown = serde_json::from_value(field(&row, "breakdown"))?;
        assert_eq!(b.path, path);
        assert!(b.end_to_end.count > 0.0, "{b:#?}");
        let common = [
            "leader_append",
            "quorum",
            "apply",
            "apply_to_return",
            "follower_append (AppendEntries handler)",
            "wake",
            "handler_out",
        ];
        for stage in stages.iter().chain(&common) {
            let line = b.lines.iter().find(|l| l.stage == *stage);
            assert!(
                line.is_some_and(|l| l.count > 0.0),
                "{stage} not observed ({path}): {b:#?}"
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_group_and_barrier_workloads_measure_every_release() -> anyhow::Result<()> {
    let mut target = Target::new(&None, "sync", false, false).await?;
    let row = sync::s1(&target, 6, 3).await?;
    assert_eq!(field(&row, "rounds"), 3, "{}", row.json());
    assert!(field(&row, "p99_ms").is_number(), "{}", row.json());
    assert!(field(&row, "waiter_p99_ms").is_number(), "{}", row.json());
    let row = sync::s2(&target, 40, 2).await?;
    assert_eq!(field(&row, "clients"), 40, "{}", row.json());
    assert!(field(&row, "last_p99_ms").is_number(), "{}", row.json());
    let row = sync::s3(&mut target, 120).await?;
    assert_eq!(field(&row, "jobs"), 120, "{}", row.json());
    assert!(
        field(&row, "snapshot_mb").is_number() && field(&row, "data_dir_mb").is_array(),
        "{}",
        row.json()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_election_workload_measures_every_hand_over() -> anyhow::Result<()> {
    let target = Target::new(&None, "elect", false, false).await?;
    let row = elect::e1(&target, 3).await?;
    assert_eq!(field(&row, "rounds"), 3, "{}", row.json());
    assert!(field(&row, "max_ms").is_number(), "{}", row.json());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pushed_loss_workload_times_every_round() -> anyhow::Result<()> {
    let target = Target::new(&None, "p1", false, false).await?;
    let row = loss::p1(&target, &opts(), 3).await?;
    assert_eq!(field(&row, "rounds"), 3, "{}", row.json());
    for key in ["p50_ms", "p99_ms", "max_ms"] {
        assert!(field(&row, key).is_number(), "{key}: {}", row.json());
    }
    Ok(())
}

/// W6 at 30 sessions: each on its own connection from one of three source addresses, every
/// lease kept, every release handed to a parked waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sessions_workload_keeps_every_lease_and_hands_over() -> anyhow::Result<()> {
    let fd_limit = w6::raise_nofile()?;
    let target = Target::new(&None, "w6", false, false).await?;
    let opts = Opts {
        w6: w6::W6Opts {
            source_addresses: Some(3),
            hold_mean: Duration::from_secs(1),
            ..Default::default()
        },
        ..opts()
    };
    let row = w6::run(&target, &opts, 30, Duration::from_secs(5), fd_limit).await?;
    assert_eq!(field(&row, "leases_lost"), 0, "{}", row.json());
    assert_eq!(field(&row, "errors"), 0, "{}", row.json());
    assert_eq!(
        (field(&row, "holders"), field(&row, "waiters")),
        (27.into(), 3.into()),
        "{}",
        row.json()
    );
    assert_eq!(field(&row, "waiters_at_setup"), 3, "{}", row.json());
    assert!(
        field(&row, "handoffs").as_u64().is_some_and(|h| h > 0),
        "{}",
        row.json()
    );
    assert!(field(&row, "p99_ms").is_number(), "{}", row.json());
    // Every session's connection is its own: each node holds at least as many established
    // connections as it has sessions.
    let conns = field(&row, "conns_nodes");
    let sessions = field(&row, "sessions_nodes");
    for k in 0..3 {
        assert!(
            conns[k].as_u64() >= sessions[k].as_u64() && sessions[k].as_u64() == Some(10),
            "node {k}: {}",
            row.json()
        );
    }
    assert_eq!(
        field(&row, "refused_conns_nodes"),
        serde_json::json!([0, 0, 0])
    );
    for target_row in w6::target_rows(&row) {
        assert!(
            field(&target_row, "met").is_string(),
            "{}",
            target_row.json()
        );
    }
    Ok(())
}
