//! `conch list KIND` and `conch delete KIND NAME`: what a namespace holds (semaphores, locks,
//! wait groups, barriers) or the namespaces, and deleting one, through the Grackle calls that
//! exist for it (`List*`, `Delete*`), so no grpcurl is needed to clear a `--max` clash.
//!
//! `list` prints one aligned line per object (a header first), or with `--json` one JSON array;
//! exit 0. `delete` reads the object first: absent is exit 65 (`NOT_FOUND`), so a typo is loud;
//! present, it is deleted and one line says so, exit 0. Deleting a semaphore or lock that is
//! held stops its holders' `conch` (exit 79); deleting a namespace deletes everything in it.

use std::process::ExitCode;

use conch_client::Client;
use conch_client::proto::grackle::LockState;
use serde::Serialize;

use crate::cli::{DeleteCommand, ListCommand};
use crate::exit::{self, Exit};
use crate::timefmt::format_unix_nanos;
use crate::waitgroup::WaitGroupJson;

/// One semaphore, as `list semaphores --json` prints it.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct SemaphoreJson {
    pub name: String,
    pub permits: u64,
    /// Permits held now (holders' weights summed).
    pub held: u64,
    pub holders: u64,
    pub waiters: u64,
    /// The hold limit set on the semaphore, in milliseconds (0: none).
    pub max_hold_ms: u64,
}

/// One lock path, as `list locks --json` prints it.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct LockJson {
    pub path: String,
    /// `unlocked`, `shared` or `exclusive`.
    pub state: &'static str,
    pub holders: usize,
    pub waiters: u64,
}

/// One barrier, as `list barriers --json` prints it.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct BarrierJson {
    pub name: String,
    pub generation: i64,
    pub arrived: i64,
    pub expected: i64,
    /// RFC 3339.
    pub last_activity_at: String,
}

/// One namespace, as `list namespaces --json` prints it.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct NamespaceJson {
    pub name: String,
    pub description: String,
}

fn lock_state(state: i32) -> &'static str {
    match LockState::try_from(state) {
        Ok(LockState::ExclusiveLocked) => "exclusive",
        Ok(LockState::SharedLocked) => "shared",
        _ => "unlocked",
    }
}

/// Rows as aligned columns under `header`.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> Vec<String> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: Vec<String>| {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        out
    };
    std::iter::once(line(header.iter().map(|h| h.to_string()).collect()))
        .chain(rows.iter().map(|r| line(r.clone())))
        .collect()
}

fn print<T: Serialize>(
    json: bool,
    items: &[T],
    text: impl FnOnce() -> Vec<String>,
) -> anyhow::Result<()> {
    if json {
        crate::print_lines([serde_json::to_string_pretty(items)?])?;
    } else {
        crate::print_lines(text())?;
    }
    Ok(())
}

pub(crate) async fn list(client: &Client, what: ListCommand) -> anyhow::Result<ExitCode> {
    match what {
        ListCommand::Semaphores { json, ns } => {
            let items: Vec<SemaphoreJson> = client
                .list_semaphores(&ns.namespace)
                .await?
                .into_iter()
                .map(|s| SemaphoreJson {
                    name: s.name,
                    permits: s.permits,
                    held: s.active_holds,
                    holders: s.active_holders_count,
                    waiters: s.waiters_count,
                    max_hold_ms: s.max_hold_ms,
                })
                .collect();
            print(json, &items, || {
                let rows: Vec<Vec<String>> = items
                    .iter()
                    .map(|s| {
                        vec![
                            s.name.clone(),
                            s.permits.to_string(),
                            s.held.to_string(),
                            s.holders.to_string(),
                            s.waiters.to_string(),
                        ]
                    })
                    .collect();
                table(
                    &["SEMAPHORE", "PERMITS", "HELD", "HOLDERS", "WAITERS"],
                    &rows,
                )
            })?;
        }
        ListCommand::Locks { json, ns } => {
            let items: Vec<LockJson> = client
                .list_locks(&ns.namespace)
                .await?
                .into_iter()
                .map(|l| LockJson {
                    state: lock_state(l.state),
                    holders: l.lock_holders.len(),
                    waiters: l.waiters_count,
                    path: l.name,
                })
                .collect();
            print(json, &items, || {
                let rows: Vec<Vec<String>> = items
                    .iter()
                    .map(|l| {
                        vec![
                            l.path.clone(),
                            l.state.to_string(),
                            l.holders.to_string(),
                            l.waiters.to_string(),
                        ]
                    })
                    .collect();
                table(&["LOCK", "STATE", "HOLDERS", "WAITERS"], &rows)
            })?;
        }
        ListCommand::WaitGroups { json, ns } => {
            let items: Vec<WaitGroupJson> = client
                .list_wait_groups(&ns.namespace)
                .await?
                .iter()
                .map(WaitGroupJson::from)
                .collect();
            print(json, &items, || {
                let rows: Vec<Vec<String>> = items
                    .iter()
                    .map(|w| {
                        vec![
                            w.name.clone(),
                            w.status.to_string(),
                            format!("{}/{}", w.completed_jobs, w.counter),
                            w.expires_at.clone(),
                        ]
                    })
                    .collect();
                table(&["WAIT-GROUP", "STATUS", "JOBS", "EXPIRES"], &rows)
            })?;
        }
        ListCommand::Barriers { json, ns } => {
            let items: Vec<BarrierJson> = client
                .list_barriers(&ns.namespace)
                .await?
                .into_iter()
                .map(|b| BarrierJson {
                    generation: b.generation,
                    arrived: b.arrived_processes,
                    expected: b.expected_processes,
                    last_activity_at: format_unix_nanos(b.last_activity_at).unwrap_or_default(),
                    name: b.name,
                })
                .collect();
            print(json, &items, || {
                let rows: Vec<Vec<String>> = items
                    .iter()
                    .map(|b| {
                        vec![
                            b.name.clone(),
                            b.generation.to_string(),
                            format!("{}/{}", b.arrived, b.expected),
                            b.last_activity_at.clone(),
                        ]
                    })
                    .collect();
                table(
                    &["BARRIER", "GENERATION", "ARRIVED", "LAST-ACTIVITY"],
                    &rows,
                )
            })?;
        }
        ListCommand::Namespaces { json } => {
            let items: Vec<NamespaceJson> = client
                .list_namespaces()
                .await?
                .into_iter()
                .map(|n| NamespaceJson {
                    name: n.name,
                    description: n.description,
                })
                .collect();
            print(json, &items, || {
                let rows: Vec<Vec<String>> = items
                    .iter()
                    .map(|n| vec![n.name.clone(), n.description.clone()])
                    .collect();
                table(&["NAMESPACE", "DESCRIPTION"], &rows)
            })?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn absent(what: String) -> anyhow::Error {
    Exit {
        code: exit::REFUSED,
        message: format!("{what} does not exist; nothing deleted"),
    }
    .into()
}

/// Reads the object (`Ok(false)`: absent), so that deleting a misspelt name is an error.
async fn exists<T>(read: impl Future<Output = conch_client::Result<T>>) -> anyhow::Result<bool> {
    match read.await {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

pub(crate) async fn delete(client: &Client, what: DeleteCommand) -> anyhow::Result<ExitCode> {
    let said = match what {
        DeleteCommand::Semaphore { name, max, ns } => {
            let semaphore = match max {
                Some(max) => conch_client::sema::semaphore_name(&name, max).map_err(exit::usage)?,
                None => name,
            };
            let full = format!("semaphore {}/{semaphore}", ns.namespace);
            if !exists(client.get_semaphore(&ns.namespace, &semaphore)).await? {
                return Err(absent(full));
            }
            client.delete_semaphore(&ns.namespace, &semaphore).await?;
            full
        }
        DeleteCommand::Lock { path, ns } => {
            let full = format!("lock {}/{path}", ns.namespace);
            if !exists(client.get_lock(&ns.namespace, &path)).await? {
                return Err(absent(full));
            }
            client.delete_lock(&ns.namespace, &path).await?;
            full
        }
        DeleteCommand::WaitGroup { name, ns } => {
            let full = format!("wait group {}/{name}", ns.namespace);
            if !exists(client.get_wait_group(&ns.namespace, &name)).await? {
                return Err(absent(full));
            }
            client.delete_wait_group(&ns.namespace, &name).await?;
            full
        }
        DeleteCommand::Barrier { name, ns } => {
            let full = format!("barrier {}/{name}", ns.namespace);
            if !exists(client.get_barrier(&ns.namespace, &name)).await? {
                return Err(absent(full));
            }
            client.delete_barrier(&ns.namespace, &name).await?;
            full
        }
        DeleteCommand::Namespace { name } => {
            let full = format!("namespace {name}");
            if !exists(client.get_namespace(&name)).await? {
                return Err(absent(full));
            }
            client.delete_namespace(&name).await?;
            format!("{full} and everything in it")
        }
    };
    crate::print_lines([format!("deleted {said}")])?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_their_columns() {
        let rows = vec![
            vec!["x.2".to_string(), "2".into(), "1".into()],
            vec!["heavy-jobs.10".to_string(), "10".into(), "0".into()],
        ];
        assert_eq!(
            table(&["SEMAPHORE", "PERMITS", "HELD"], &rows),
            [
                "SEMAPHORE      PERMITS  HELD",
                "x.2            2        1",
                "heavy-jobs.10  10       0",
            ]
        );
        assert_eq!(table(&["LOCK", "STATE"], &[]), ["LOCK  STATE"]);
    }
}
