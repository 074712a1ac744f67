//! `conch namespace create | list`: the namespaces teams keep their semaphores in.
//!
//! One namespace per team, with the team's role allowed to write there and nowhere else, keeps
//! one team's tokens from deleting or resizing another team's semaphores. Creating a namespace
//! needs `admin` on it (or cluster-admin); the CLI's default namespace `conch` is the exception,
//! created on first use by any token that may write in it.

use std::process::ExitCode;

use conch_client::Client;
use conch_client::proto::grackle::Namespace;
use serde::Serialize;

use crate::cli::NamespaceCommand;
use crate::timefmt;

/// What `list --json` prints per namespace.
#[derive(Debug, Serialize, PartialEq)]
pub struct NamespaceJson {
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
pub fn line(n: &NamespaceJson) -> String {
    let mut line = format!("{}  created={}", n.name, n.created_at);
    if !n.description.is_empty() {
        line.push_str("  ");
        line.push_str(&n.description);
    }
    line
}

pub async fn run(client: &Client, command: NamespaceCommand) -> anyhow::Result<ExitCode> {
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
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

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
