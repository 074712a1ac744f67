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
//!
//! The lock rows (L1 uncontended, L2 contended hand-off, L3 readers and a writer; see
//! `locks.rs` and, for etcd's `concurrency.Mutex` and `recipes.RWMutex`, `etcd_locks.rs`) run
//! when selected (`--only`), after W2 and before W3, in both placements too.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::etcd::{self, EtcdCluster};
use super::stats::{Latencies, Row, round1};
use super::{Opts, Placement, Target};

/// The rows compared: (workload, lease per cycle, client counts).
const ROWS: [(&str, bool, &[usize]); 2] = [("W1", false, &[1, 8, 64]), ("W1b", true, &[1, 64])];

/// Every workload the comparison knows, in the order it runs them.
pub const WORKLOADS: [&str; 7] = ["W1", "W1b", "W2", "L1", "L2", "L3", "W3"];
/// The workloads of a comparison without `--only`.
pub const DEFAULT_WORKLOADS: [&str; 4] = ["W1", "W1b", "W2", "W3"];

/// The largest L2 hand-off p99 of conch, as a fraction of etcd's, that meets the lock target (BENCHMARKS.md, "Locks").
pub const L2_P99_TARGET: f64 = 0.2;

/// Runs the `only` rows (of [`WORKLOADS`]) on both systems; returns the disk row, then
/// (etcd, conch, ratio) rows.
pub async fn run(opts: &Opts, only: &[&str]) -> anyhow::Result<Vec<Row>> {
    let selected = |w: &str| only.contains(&w);
    let mut rows = vec![disk(Duration::from_secs(2))?];
    let etcd = EtcdCluster::start(3).await.context("start etcd")?;
    let conch = Target::new(&None, "compare", opts.tls, opts.auth).await?;
    for (workload, per_cycle_lease, counts) in ROWS {
        if !selected(workload) {
            continue;
        }
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
        if !selected("W2") {
            break;
        }
        eprintln!("conch-bench: W2, {}: etcd then conch", placement.name());
        let e = etcd::w2(&etcd, opts, 0, placement).await;
        let c = super::w2::run(&conch, opts, 0, placement).await;
        rows.extend(pair("W2", super::w2::CLIENTS, placement, e, c));
    }
    rows.extend(lock_rows(&etcd, &conch, opts, &selected).await);
    if !selected("W3") {
        return Ok(rows);
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

/// L1, L2 and L3 (those `selected`), each row on etcd then on conch, in both placements.
async fn lock_rows(
    etcd: &EtcdCluster,
    conch: &Target,
    opts: &Opts,
    selected: &impl Fn(&str) -> bool,
) -> Vec<Row> {
    use super::{etcd_locks, locks};
    let mut rows = Vec::new();
    for placement in [Placement::Leader, Placement::Spread] {
        if !selected("L1") {
            break;
        }
        for clients in locks::L1_CLIENTS {
            eprintln!(
                "conch-bench: L1, {clients} clients, {}: etcd then conch",
                placement.name()
            );
            let e = etcd_locks::l1(etcd, opts, clients, placement).await;
            let c = locks::l1(conch, opts, clients, placement).await;
            rows.extend(pair("L1", clients, placement, e, c));
        }
    }
    for placement in [Placement::Leader, Placement::Spread] {
        if !selected("L2") {
            break;
        }
        eprintln!("conch-bench: L2, {}: etcd then conch", placement.name());
        let e = etcd_locks::l2(etcd, opts, placement).await;
        let c = locks::l2(conch, opts, placement).await;
        rows.extend(pair("L2", locks::L2_CLIENTS, placement, e, c));
    }
    for placement in [Placement::Leader, Placement::Spread] {
        if !selected("L3") {
            break;
        }
        eprintln!("conch-bench: L3, {}: etcd then conch", placement.name());
        let e = etcd_locks::l3(etcd, opts, placement).await;
        let c = locks::l3(conch, opts, placement).await;
        rows.extend(pair("L3", locks::L3_READERS + 1, placement, e, c));
    }
    rows
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
/// cycle, or of a handoff; L3: of the writer's wait); the lock rows also compare the p99, and
/// L2 says whether its hand-off p99 is at most [`L2_P99_TARGET`] of etcd's.
fn ratio_row(workload: &str, clients: usize, placement: Placement, e: &Row, c: &Row) -> Row {
    let mut row = Row::new(workload, clients as u64);
    row.set("system", "conch/etcd");
    row.set("placement", placement.name());
    let ratio = |key: &str| match (number(c, key), number(e, key)) {
        (Some(c), Some(e)) if e > 0.0 => Some((c / e * 100.0).round() / 100.0),
        _ => None,
    };
    let (rate, latency, tail) = match workload {
        "W2" => ("grants_per_s", "handoff_p50_ms", None),
        "L1" => ("cycles_per_s", "p50_ms", Some("p99_ms")),
        "L2" => ("grants_per_s", "handoff_p50_ms", Some("handoff_p99_ms")),
        "L3" => (
            "reader_cycles_per_s",
            "writer_wait_p50_ms",
            Some("writer_wait_p99_ms"),
        ),
        _ => ("cycles_per_s", "p50_ms", None),
    };
    row.opt("ratio", ratio(rate));
    row.opt("latency_ratio", ratio(latency));
    if let Some(tail) = tail {
        row.opt("p99_ratio", ratio(tail));
    }
    for (system, source) in [("etcd", e), ("conch", c)] {
        row.opt(&format!("{system}_{rate}"), number(source, rate));
        row.opt(&format!("{system}_{latency}"), number(source, latency));
        if let Some(tail) = tail {
            row.opt(&format!("{system}_{tail}"), number(source, tail));
        }
    }
    if workload == "L2"
        && let (Some(c), Some(e)) = (number(c, "handoff_p99_ms"), number(e, "handoff_p99_ms"))
    {
        row.set("p99_target_met", c <= L2_P99_TARGET * e);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(fields: &[(&str, f64)]) -> Row {
        let mut row = Row::new("L2", 16);
        for (k, v) in fields {
            row.set(k, *v);
        }
        row
    }

    #[test]
    fn the_l2_ratio_compares_the_p99_with_a_fifth_of_etcds() {
        let e = row(&[
            ("grants_per_s", 100.0),
            ("handoff_p50_ms", 10.0),
            ("handoff_p99_ms", 40.0),
        ]);
        let c = row(&[
            ("grants_per_s", 300.0),
            ("handoff_p50_ms", 2.0),
            ("handoff_p99_ms", 8.0),
        ]);
        let r = ratio_row("L2", 16, Placement::Spread, &e, &c);
        assert_eq!(number(&r, "ratio"), Some(3.0));
        assert_eq!(number(&r, "p99_ratio"), Some(0.2));
        assert_eq!(number(&r, "conch_handoff_p99_ms"), Some(8.0));
        assert_eq!(r.fields.get("p99_target_met"), Some(&true.into()));
        let slow = row(&[
            ("grants_per_s", 300.0),
            ("handoff_p50_ms", 2.0),
            ("handoff_p99_ms", 8.1),
        ]);
        let r = ratio_row("L2", 16, Placement::Spread, &e, &slow);
        assert_eq!(r.fields.get("p99_target_met"), Some(&false.into()));
    }

    #[test]
    fn the_w_rows_keep_their_ratio_fields() {
        let e = row(&[("cycles_per_s", 100.0), ("p50_ms", 4.0), ("p99_ms", 9.0)]);
        let c = row(&[("cycles_per_s", 150.0), ("p50_ms", 2.0), ("p99_ms", 3.0)]);
        let r = ratio_row("W1", 1, Placement::Leader, &e, &c);
        assert_eq!(number(&r, "ratio"), Some(1.5));
        assert_eq!(number(&r, "latency_ratio"), Some(0.5));
        assert!(!r.fields.contains_key("p99_ratio"));
        let r = ratio_row("L1", 1, Placement::Leader, &e, &c);
        assert_eq!(number(&r, "p99_ratio"), Some(0.33));
    }
}
