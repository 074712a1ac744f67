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
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .with_context(|| format!("bad value in metrics line {line:?}"))?,
        };
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
}
