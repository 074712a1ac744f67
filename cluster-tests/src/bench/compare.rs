//! conch against etcd in the same run (`conch-bench --baseline etcd`).
//!
//! A 3-node etcd cluster and a 3-node conch cluster run side by side on this machine. Each row
//! (W1, W1b, and W2, the contended handoff) runs on etcd, then on conch, right after each
//! other, so both see the same machine. Every row runs in both client placements: on the
//! leader, and spread over all nodes without following the leader hint (what a plain Grackle
//! or etcd client does). The run starts with a measure of the disk: synchronous 4 KiB writes
//! per second in the data directories' file system, since absolute numbers move with it and
//! ratios do not. W3 (kill -9 of the leader under load) runs last, on both, with clients
//! starting on the leader and failing over; its ratio is of the time to the first success.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::etcd::{self, EtcdCluster};
use super::stats::{Latencies, Row, round1};
use super::{Opts, Placement, Target};

/// The rows compared: (workload, lease per cycle, client counts).
const ROWS: [(&str, bool, &[usize]); 2] = [("W1", false, &[1, 8, 64]), ("W1b", true, &[1, 64])];

/// Runs every row on both systems; returns the disk row, then (etcd, conch, ratio) rows.
pub async fn run(opts: &Opts) -> anyhow::Result<Vec<Row>> {
    let mut rows = vec![disk(Duration::from_secs(2))?];
    let etcd = EtcdCluster::start(3).await.context("start etcd")?;
    let conch = Target::new(&None, "compare", opts.tls, opts.auth).await?;
    for (workload, per_cycle_lease, counts) in ROWS {
        for placement in [Placement::Leader, Placement::Spread] {
            for &clients in counts {
                eprintln!(
                    "conch-bench: {workload}, {clients} clients, {}: etcd then conch",
                    placement.name()
                );
                let e = etcd::w1(&etcd, opts, clients, per_cycle_lease, placement).await;
                let c = super::w1::run(&conch, opts, clients, per_cycle_lease, placement).await;
                rows.extend(pair(workload, clients, placement, e, c));
            }
        }
    }
    for placement in [Placement::Leader, Placement::Spread] {
        eprintln!("conch-bench: W2, {}: etcd then conch", placement.name());
        let e = etcd::w2(&etcd, opts, 0, placement).await;
        let c = super::w2::run(&conch, opts, 0, placement).await;
        rows.extend(pair("W2", super::w2::CLIENTS, placement, e, c));
    }
    // W3 last: it kills a leader of each cluster.
    eprintln!("conch-bench: W3: etcd then conch");
    let mut etcd = etcd;
    let e = etcd::w3(&mut etcd, opts).await?;
    let mut conch = conch;
    let mut c = super::w1::failover(&mut conch, opts).await?;
    c.set("system", "conch");
    let mut ratio = Row::new("W3", super::w1::FAILOVER_CLIENTS as u64);
    ratio.set("system", "conch/etcd");
    let key = "first_success_ms";
    ratio.opt(
        "ratio",
        match (number(&c, key), number(&e, key)) {
            (Some(c), Some(e)) if e > 0.0 => Some((c / e * 100.0).round() / 100.0),
            _ => None,
        },
    );
    ratio.opt("etcd_first_success_ms", number(&e, key));
    ratio.opt("conch_first_success_ms", number(&c, key));
    rows.extend([e, c, ratio]);
    Ok(rows)
}

/// The etcd row, the conch row and their ratio; a run that failed becomes a row naming the
/// error, so one failure does not lose the rest of the comparison.
fn pair(
    workload: &str,
    clients: usize,
    placement: Placement,
    e: anyhow::Result<Row>,
    c: anyhow::Result<Row>,
) -> Vec<Row> {
    let failed = |system: &str, e: anyhow::Error| {
        eprintln!("conch-bench: {workload} on {system} failed: {e:#}");
        let mut row = Row::new(workload, clients as u64);
        row.set("system", system);
        row.set("placement", placement.name());
        row.set("error", format!("{e:#}"));
        row
    };
    match (e, c) {
        (Ok(e), Ok(c)) => {
            let ratio = ratio_row(workload, clients, placement, &e, &c);
            vec![e, c, ratio]
        }
        (e, c) => vec![
            e.unwrap_or_else(|err| failed("etcd", err)),
            c.unwrap_or_else(|err| failed("conch", err)),
        ],
    }
}

fn number(row: &Row, key: &str) -> Option<f64> {
    row.fields.get(key).and_then(serde_json::Value::as_f64)
}

/// conch / etcd for one row: throughput (cycles or grants per second) and latency (p50 of a
/// cycle, or of a handoff).
fn ratio_row(workload: &str, clients: usize, placement: Placement, e: &Row, c: &Row) -> Row {
    let mut row = Row::new(workload, clients as u64);
    row.set("system", "conch/etcd");
    row.set("placement", placement.name());
    let ratio = |key: &str| match (number(c, key), number(e, key)) {
        (Some(c), Some(e)) if e > 0.0 => Some((c / e * 100.0).round() / 100.0),
        _ => None,
    };
    let (rate, latency) = if workload == "W2" {
        ("grants_per_s", "handoff_p50_ms")
    } else {
        ("cycles_per_s", "p50_ms")
    };
    row.opt("ratio", ratio(rate));
    row.opt("latency_ratio", ratio(latency));
    for (system, source) in [("etcd", e), ("conch", c)] {
        row.opt(&format!("{system}_{rate}"), number(source, rate));
        row.opt(&format!("{system}_{latency}"), number(source, latency));
    }
    row
}

/// Synchronous 4 KiB writes (write + fdatasync) per second for `duration`, in a file under
/// the temporary directory (where both clusters keep their data), with the p50 of one.
pub fn disk(duration: Duration) -> anyhow::Result<Row> {
    let dir = tempfile::Builder::new()
        .prefix("conch-bench-disk-")
        .tempdir()?;
    let mut file = std::fs::File::create(dir.path().join("probe"))?;
    let block = [0x5au8; 4096];
    let mut latencies = Latencies::default();
    let end = Instant::now() + duration;
    while Instant::now() < end {
        let start = Instant::now();
        file.write_all(&block)?;
        file.sync_data()?;
        latencies.push(start.elapsed());
    }
    let mut row = Row::new("disk", 1);
    row.set("system", "disk");
    row.set(
        "syncs_per_s",
        round1(latencies.len() as f64 / duration.as_secs_f64()),
    );
    row.opt("p50_ms", latencies.pct_ms(50.0));
    row.opt("p99_ms", latencies.pct_ms(99.0));
    Ok(row)
}
