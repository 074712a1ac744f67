//! Scraping a node's Prometheus metrics: a plain HTTP/1.1 GET of `/metrics` and a parse of the
//! text format into series and values.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One scrape: series (name with its labels, exactly as exposed) to value.
#[derive(Debug, Default)]
pub struct Scrape {
    pub series: BTreeMap<String, f64>,
}

impl Scrape {
    /// The value of `series` (e.g. `conch_raft_term` or `conch_forwarded_total{kind="write"}`).
    pub fn get(&self, series: &str) -> Option<f64> {
        self.series.get(series).copied()
    }

    /// The value of `series`, 0 when absent (a labelled counter not yet incremented).
    pub fn value(&self, series: &str) -> f64 {
        self.get(series).unwrap_or(0.0)
    }

    /// Whether any series of metric `name` is exposed (`name` or `name{...}`).
    pub fn has_metric(&self, name: &str) -> bool {
        self.series
            .keys()
            .any(|s| s == name || s.strip_prefix(name).is_some_and(|r| r.starts_with('{')))
    }
}

/// One histogram as scraped: cumulative counts by upper bound (ascending, the last `+Inf`),
/// the sum of the observed values and their count.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    pub buckets: Vec<(f64, f64)>,
    pub sum: f64,
    pub count: f64,
}

impl Scrape {
    /// Histogram `name` restricted to the series whose labels include every `(label, value)` of
    /// `labels`; `None` when no bucket matches. Series matching with different other labels
    /// are added together.
    pub fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Option<Histogram> {
        let bucket_name = format!("{name}_bucket");
        let sum_name = format!("{name}_sum");
        let count_name = format!("{name}_count");
        let matches = |found: &BTreeMap<String, String>| {
            labels
                .iter()
                .all(|(k, v)| found.get(*k).is_some_and(|f| f == v))
        };
        let mut buckets: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        let mut sum = 0.0;
        let mut count = 0.0;
        for (series, value) in &self.series {
            let Some((metric, found)) = split_series(series) else {
                continue;
            };
            if !matches(&found) {
                continue;
            }
            if metric == bucket_name {
                let Some(le) = found.get("le").and_then(|le| parse_value(le)) else {
                    continue;
                };
                // Ordered by bound: non-negative floats order like their bits.
                let entry = buckets.entry(le.to_bits()).or_insert((le, 0.0));
                entry.1 += value;
            } else if metric == sum_name {
                sum += value;
            } else if metric == count_name {
                count += value;
            }
        }
        if buckets.is_empty() {
            return None;
        }
        Some(Histogram {
            buckets: buckets.into_values().collect(),
            sum,
            count,
        })
    }
}

impl Histogram {
    /// The cumulative count of bucket `le` (0 when this series has no such bucket).
    fn bucket(&self, le: f64) -> f64 {
        self.buckets
            .iter()
            .find(|(b, _)| *b == le)
            .map_or(0.0, |(_, n)| *n)
    }

    /// What was observed between `earlier` and this scrape of the same series.
    pub fn since(&self, earlier: &Histogram) -> Histogram {
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|(le, n)| (*le, (n - earlier.bucket(*le)).max(0.0)))
                .collect(),
            sum: self.sum - earlier.sum,
            count: self.count - earlier.count,
        }
    }

    /// This plus `other` (same buckets), e.g. two nodes' series.
    pub fn plus(&self, other: &Histogram) -> Histogram {
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|(le, n)| (*le, n + other.bucket(*le)))
                .collect(),
            sum: self.sum + other.sum,
            count: self.count + other.count,
        }
    }

    /// The mean observed value; `None` when nothing was observed.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count)
    }

    /// The `q` quantile (0-1), interpolated linearly inside its bucket as Prometheus's
    /// `histogram_quantile` does (from 0 in the first bucket; the highest finite bound if it
    /// falls in `+Inf`). `None` when nothing was observed.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.buckets.last().map(|(_, n)| *n)?;
        if total <= 0.0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total;
        let mut lower = 0.0;
        let mut below = 0.0;
        for (le, n) in &self.buckets {
            if *n >= rank && *n > below {
                if le.is_infinite() {
                    return Some(lower);
                }
                return Some(lower + (le - lower) * (rank - below) / (n - below));
            }
            if le.is_finite() {
                lower = *le;
            }
            below = *n;
        }
        Some(lower)
    }
}

/// `name{a="b",c="d"}` into the name and its labels (escapes in values undone); `None` for a
/// malformed series.
fn split_series(series: &str) -> Option<(&str, BTreeMap<String, String>)> {
    let Some((name, rest)) = series.split_once('{') else {
        return Some((series, BTreeMap::new()));
    };
    let body = rest.strip_suffix('}')?;
    let mut labels = BTreeMap::new();
    let mut chars = body.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        if chars.next() != Some('"') {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break,
                c => value.push(c),
            }
        }
        labels.insert(key.trim().to_string(), value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    Some((name, labels))
}

fn parse_value(v: &str) -> Option<f64> {
    match v {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        v => v.parse().ok(),
    }
}

/// GETs `http://{addr}/metrics` and parses it.
pub async fn scrape(addr: &str) -> anyhow::Result<Scrape> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        anyhow::Ok(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .context("scrape timed out")?
        .with_context(|| format!("scrape {addr}"))?;
    let text = String::from_utf8(response).context("metrics are not UTF-8")?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("no end of HTTP headers")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("scrape {addr}: {}", head.lines().next().unwrap_or(head));
    }
    if !head
        .to_ascii_lowercase()
        .contains("content-type: text/plain; version=0.0.4")
    {
        bail!("scrape {addr}: not the Prometheus text format: {head}");
    }
    parse(body)
}

/// Parses the text exposition format (chunked transfer is not used by the server: it sends
/// one body of known length).
pub fn parse(body: &str) -> anyhow::Result<Scrape> {
    let mut series = BTreeMap::new();
    for line in body.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, value) = line
            .rsplit_once(' ')
            .with_context(|| format!("bad metrics line {line:?}"))?;
        let value =
            parse_value(value).with_context(|| format!("bad value in metrics line {line:?}"))?;
        series.insert(name.to_string(), value);
    }
    Ok(Scrape { series })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_and_values_parse() -> anyhow::Result<()> {
        let s = parse(
            "# HELP x y\n# TYPE x counter\nx 3\ny{a=\"b c\"} 0.5\nz_bucket{le=\"+Inf\"} 2\n",
        )?;
        assert_eq!(s.get("x"), Some(3.0));
        assert_eq!(s.get("y{a=\"b c\"}"), Some(0.5));
        assert!(s.has_metric("y") && s.has_metric("z_bucket") && !s.has_metric("z"));
        assert!(parse("x\n").is_err());
        Ok(())
    }

    const STAGES: &str = "\
h_bucket{stage=\"a\",le=\"0.001\"} 2
h_bucket{stage=\"a\",le=\"0.002\"} 6
h_bucket{stage=\"a\",le=\"0.004\"} 10
h_bucket{stage=\"a\",le=\"+Inf\"} 10
h_sum{stage=\"a\"} 0.02
h_count{stage=\"a\"} 10
h_bucket{stage=\"b \\\"q\\\"\",le=\"0.001\"} 1
h_bucket{stage=\"b \\\"q\\\"\",le=\"+Inf\"} 1
";

    #[test]
    fn a_histogram_is_read_by_its_labels_and_its_quantiles_interpolate() -> anyhow::Result<()> {
        let s = parse(STAGES)?;
        let a = s.histogram("h", &[("stage", "a")]).context("a")?;
        assert_eq!(a.count, 10.0);
        assert_eq!(a.mean(), Some(0.002));
        assert_eq!(a.buckets.len(), 4);
        // Rank 5 of 10 lies 3/4 of the way through the second bucket (ranks 3..6).
        let p50 = a.quantile(0.5).context("p50")?;
        assert!((p50 - 0.00175).abs() < 1e-12, "{p50}");
        // Rank 1 in the first bucket, interpolated from 0.
        let p10 = a.quantile(0.1).context("p10")?;
        assert!((p10 - 0.0005).abs() < 1e-12, "{p10}");
        assert!(s.histogram("h", &[("stage", "b \"q\"")]).is_some());
        assert!(s.histogram("h", &[("stage", "c")]).is_none());
        Ok(())
    }

    #[test]
    fn a_histogram_since_an_earlier_scrape_holds_only_the_new_values() -> anyhow::Result<()> {
        let before = parse(STAGES)?
            .histogram("h", &[("stage", "a")])
            .context("a")?;
        let later = parse(&STAGES.replace("} 10\n", "} 14\n"))?
            .histogram("h", &[("stage", "a")])
            .context("a")?;
        let new = later.since(&before);
        assert_eq!(new.count, 4.0);
        assert_eq!(new.buckets.last().map(|b| b.1), Some(4.0));
        // All four new values in (2 ms, 4 ms]: rank 2 of 4 is halfway through it.
        assert_eq!(new.quantile(0.5).map(|q| (q * 1e6).round()), Some(3000.0));
        let both = new.plus(&new);
        assert_eq!(both.count, 8.0);
        assert_eq!(Histogram::default().quantile(0.5), None);
        Ok(())
    }
}
