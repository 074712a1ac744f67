//! `conch namespace create | list | quota`: the namespaces teams keep their semaphores in, and
//! their quotas.
//!
//! One namespace per team, with the team's role allowed to write there and nowhere else, keeps
//! one team's tokens from deleting or resizing another team's semaphores. Creating a namespace
//! needs `admin` on it (or cluster-admin); the CLI's default namespace `conch` is the exception,
//! created on first use by any token that may write in it.

use std::process::ExitCode;

use conch_client::Client;
use conch_client::proto::conch::{NamespaceQuotas, NamespaceQuotasResponse};
use conch_client::proto::grackle::Namespace;
use serde::Serialize;

use crate::cli::NamespaceCommand;
use crate::timefmt;

/// What `list --json` prints per namespace.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct NamespaceJson {
    pub name: String,
    pub description: String,
    /// RFC 3339.
    pub created_at: String,
}

impl From<&Namespace> for NamespaceJson {
    fn from(n: &Namespace) -> Self {
        NamespaceJson {
            name: n.name.clone(),
            description: n.description.clone(),
            created_at: timefmt::format_unix_nanos(n.created_at).unwrap_or_default(),
        }
    }
}

/// One `list` line: `<name>  created=<time>  <description>`.
pub(crate) fn line(n: &NamespaceJson) -> String {
    let mut line = format!("{}  created={}", n.name, n.created_at);
    if !n.description.is_empty() {
        line.push_str("  ");
        line.push_str(&n.description);
    }
    line
}

pub(crate) async fn run(client: &Client, command: NamespaceCommand) -> anyhow::Result<ExitCode> {
    match command {
        NamespaceCommand::Create { name, description } => {
            let ns = client.create_namespace(&name, &description).await?;
            crate::print_lines([format!("namespace {} created", ns.name)])?;
        }
        NamespaceCommand::List { json } => {
            let all: Vec<NamespaceJson> = client
                .list_namespaces()
                .await?
                .iter()
                .map(NamespaceJson::from)
                .collect();
            if json {
                crate::print_lines([serde_json::to_string_pretty(&all)?])?;
            } else {
                crate::print_lines(all.iter().map(line))?;
            }
        }
        NamespaceCommand::Quota {
            name,
            semaphores,
            leases,
            entries,
            bytes,
            request_ids,
            json,
        } => {
            let mut view = client.namespace_quotas(&name).await?;
            let changes = [semaphores, leases, entries, bytes, request_ids];
            if changes.iter().any(Option::is_some) {
                let now = view.quotas.unwrap_or_default();
                let quotas = NamespaceQuotas {
                    semaphores: semaphores.unwrap_or(now.semaphores),
                    leases: leases.unwrap_or(now.leases),
                    entries: entries.unwrap_or(now.entries),
                    bytes: bytes.unwrap_or(now.bytes),
                    request_ids: request_ids.unwrap_or(now.request_ids),
                };
                view = client.set_namespace_quotas(&name, quotas).await?;
            }
            let quota = QuotaJson::from(&view);
            if json {
                crate::print_lines([serde_json::to_string_pretty(&quota)?])?;
            } else {
                crate::print_lines(quota_lines(&quota))?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One quota: what is used and the most allowed.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Used {
    pub used: u64,
    pub quota: u64,
}

/// What `quota --json` prints.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct QuotaJson {
    pub namespace: String,
    pub semaphores: Used,
    pub leases: Used,
    pub entries: Used,
    pub bytes: Used,
    pub request_ids: Used,
    pub state_bytes: Used,
}

impl From<&NamespaceQuotasResponse> for QuotaJson {
    fn from(v: &NamespaceQuotasResponse) -> Self {
        let (q, u) = (v.quotas.unwrap_or_default(), v.usage.unwrap_or_default());
        let used = |used, quota| Used { used, quota };
        QuotaJson {
            namespace: v.namespace_name.clone(),
            semaphores: used(u.semaphores, q.semaphores),
            leases: used(u.leases, q.leases),
            entries: used(u.entries, q.entries),
            bytes: used(u.bytes, q.bytes),
            request_ids: used(u.request_ids, q.request_ids),
            state_bytes: used(v.state_bytes, v.state_budget_bytes),
        }
    }
}

/// The text lines: `<quota>  <used> of <most>  (<percent>%)`, the state's budget last.
pub(crate) fn quota_lines(q: &QuotaJson) -> Vec<String> {
    let line = |what: &str, u: &Used| {
        let percent = (u.used as f64 * 100.0 / u.quota.max(1) as f64).round();
        format!("{what:<12} {} of {}  ({percent}%)", u.used, u.quota)
    };
    vec![
        format!("namespace {}", q.namespace),
        line("semaphores", &q.semaphores),
        line("leases", &q.leases),
        line("entries", &q.entries),
        line("bytes", &q.bytes),
        line("request ids", &q.request_ids),
        line("state bytes", &q.state_bytes),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_lines_show_use_against_each_quota() {
        let q = QuotaJson {
            namespace: "team-a".into(),
            semaphores: Used { used: 3, quota: 10 },
            leases: Used { used: 0, quota: 0 },
            entries: Used { used: 1, quota: 4 },
            bytes: Used {
                used: 512,
                quota: 1024,
            },
            request_ids: Used { used: 2, quota: 8 },
            state_bytes: Used {
                used: 900,
                quota: 9000,
            },
        };
        assert_eq!(
            quota_lines(&q),
            [
                "namespace team-a",
                "semaphores   3 of 10  (30%)",
                "leases       0 of 0  (0%)",
                "entries      1 of 4  (25%)",
                "bytes        512 of 1024  (50%)",
                "request ids  2 of 8  (25%)",
                "state bytes  900 of 9000  (10%)",
            ]
        );
    }

    #[test]
    fn lines_show_name_time_and_description() {
        let mut n = NamespaceJson {
            name: "team-a".into(),
            description: String::new(),
            created_at: "2026-06-12T10:15:00Z".into(),
        };
        assert_eq!(line(&n), "team-a  created=2026-06-12T10:15:00Z");
        n.description = "jobs of team A".into();
        assert_eq!(
            line(&n),
            "team-a  created=2026-06-12T10:15:00Z  jobs of team A"
        );
    }
}
