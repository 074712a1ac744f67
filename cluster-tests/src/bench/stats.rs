//! Latency percentiles, error tallies and the report rows (JSON and table).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value};

/// Latencies in microseconds.
#[derive(Default, Clone)]
pub struct Latencies(Vec<u64>);

impl Latencies {
    pub fn push(&mut self, d: Duration) {
        self.0
            .push(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Adds every latency of `other`.
    pub fn merge(&mut self, other: Latencies) {
        self.0.extend(other.0);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Nearest-rank percentile in milliseconds (`None` when empty).
    pub fn pct_ms(&mut self, p: f64) -> Option<f64> {
        if self.0.is_empty() {
            return None;
        }
        self.0.sort_unstable();
        let rank = ((p / 100.0) * self.0.len() as f64).ceil() as usize;
        let i = rank.clamp(1, self.0.len()) - 1;
        Some(round3(self.0[i] as f64 / 1000.0))
    }
}

pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

pub fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Error counts by gRPC code (or a bench-side label).
#[derive(Default, Clone, Debug)]
pub struct Errors(pub BTreeMap<String, u64>);

impl Errors {
    pub fn add(&mut self, what: impl Into<String>) {
        *self.0.entry(what.into()).or_default() += 1;
    }

    pub fn status(&mut self, status: &tonic::Status) {
        self.add(format!("{:?}", status.code()));
    }

    pub fn merge(&mut self, other: Errors) {
        for (k, v) in other.0 {
            *self.0.entry(k).or_default() += v;
        }
    }

    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    pub fn to_value(&self) -> Value {
        Value::Object(
            self.0
                .iter()
                .map(|(k, v)| (k.clone(), Value::from(*v)))
                .collect(),
        )
    }
}

/// One workload run: an ordered set of named fields.
pub struct Row {
    pub fields: Map<String, Value>,
}

impl Row {
    pub fn new(workload: &str, clients: u64) -> Row {
        let mut fields = Map::new();
        fields.insert("workload".into(), Value::from(workload));
        fields.insert("clients".into(), Value::from(clients));
        Row { fields }
    }

    pub fn set(&mut self, key: &str, value: impl Into<Value>) -> &mut Row {
        self.fields.insert(key.into(), value.into());
        self
    }

    /// Sets `key` to the number, or null when absent.
    pub fn opt(&mut self, key: &str, value: Option<f64>) -> &mut Row {
        self.fields
            .insert(key.into(), value.map(Value::from).unwrap_or(Value::Null));
        self
    }

    pub fn json(&self) -> String {
        Value::Object(self.fields.clone()).to_string()
    }
}

fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "-".into(),
        Some(Value::Number(n)) if n.is_f64() => match n.as_f64().unwrap_or(0.0) {
            f if f.abs() >= 100.0 => format!("{f:.0}"),
            f if f.abs() >= 10.0 => format!("{f:.1}"),
            f => format!("{f:.2}"),
        },
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// The main figure of a row: (label, value).
fn headline(row: &Row) -> (String, String) {
    for key in [
        "cycles_per_s",
        "ratio",
        "syncs_per_s",
        "grants_per_s",
        "reader_cycles_per_s",
        "refreshes_per_s",
        "rss_mb",
        "leader_bytes",
        "value",
    ] {
        if let Some(v) = row.fields.get(key) {
            return (key.to_string(), cell(Some(v)));
        }
    }
    if let Some(v) = row.fields.get("first_success_ms") {
        return ("first_success_ms".into(), cell(Some(v)));
    }
    ("-".into(), "-".into())
}

/// Prints the rows as an aligned table; fields other than the headline and p50/p99 go into
/// the last column as key=value.
pub fn print_table(rows: &[Row]) {
    let mut lines = vec![[
        "workload".to_string(),
        "clients".into(),
        "metric".into(),
        "value".into(),
        "p50_ms".into(),
        "p99_ms".into(),
        "details".into(),
    ]];
    for row in rows {
        let (metric, value) = headline(row);
        let skip = [
            "workload",
            "clients",
            "p50_ms",
            "p99_ms",
            "hold_ms",
            "system",
            "placement",
            "breakdown",
            metric.as_str(),
        ];
        let mut workload = cell(row.fields.get("workload"));
        for label in ["system", "placement"] {
            if let Some(v) = row.fields.get(label) {
                workload = format!("{workload} {}", cell(Some(v)));
            }
        }
        if let Some(hold) = row.fields.get("hold_ms") {
            workload = format!("{workload} hold {}ms", cell(Some(hold)));
        }
        let details: Vec<String> = row
            .fields
            .iter()
            .filter(|(k, _)| !skip.contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={}", cell(Some(v))))
            .collect();
        lines.push([
            workload,
            cell(row.fields.get("clients")),
            metric,
            value,
            cell(row.fields.get("p50_ms")),
            cell(row.fields.get("p99_ms")),
            details.join(" "),
        ]);
    }
    let mut widths = [0usize; 6];
    for line in &lines {
        for (w, c) in widths.iter_mut().zip(line.iter()) {
            *w = (*w).max(c.len());
        }
    }
    for line in &lines {
        let mut out = String::new();
        for (i, c) in line.iter().enumerate().take(6) {
            out.push_str(&format!("{c:<w$}  ", w = widths[i]));
        }
        out.push_str(&line[6]);
        println!("{}", out.trim_end());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let mut l = Latencies::default();
        for ms in 1..=100 {
            l.push(Duration::from_millis(ms));
        }
        assert_eq!(l.pct_ms(50.0), Some(50.0));
        assert_eq!(l.pct_ms(99.0), Some(99.0));
        assert_eq!(l.pct_ms(100.0), Some(100.0));
        assert_eq!(Latencies::default().pct_ms(50.0), None);
    }
}
