//! Wait groups and barriers within the state machine: command dispatch, their reaping, and
//! the events that release their waiting callers.
//!
//! What always holds: every change that can end a wait (a group completing, expiring or
//! being deleted, a barrier tripping or being deleted, their namespace being deleted) emits one
//! [`Event::Synced`] naming the object, in the entry that made it. A waiting caller needs
//! nothing else: it reads the object again when woken (see `api/sync_wait.rs`).

use super::data::{Ctx, Namespace, Namespaces};
use super::read::namespace_not_found;
use super::sync_types::*;
use super::types::*;

/// Runs a wait group command.
pub(super) fn apply_wait_group(
    namespaces: &mut Namespaces,
    cmd: &WaitGroupCmd,
    ctx: &mut Ctx,
) -> Reply {
    let ns = cmd.ns();
    match (namespaces.get_mut(ns), cmd) {
        (Some(namespace), cmd) => namespace.apply_wait_group(cmd, ctx),
        (None, _) => Err(namespace_not_found(ns)),
    }
}

/// Runs a barrier command.
pub(super) fn apply_barrier(namespaces: &mut Namespaces, cmd: &BarrierCmd, ctx: &mut Ctx) -> Reply {
    let ns = cmd.ns();
    match namespaces.get_mut(ns) {
        Some(namespace) => namespace.apply_barrier(cmd, ctx),
        None => Err(namespace_not_found(ns)),
    }
}

/// Expires the wait groups whose deadline passed and deletes the finished groups and idle
/// barriers that are due, earliest first, through the time-ordered index (never a scan).
pub(super) fn reap(namespaces: &mut Namespaces, ctx: &mut Ctx) {
    while let Some((ns_id, kind, name)) = ctx.pop_sync_due() {
        let Some(ns_name) = ctx.namespace_name(ns_id).cloned() else {
            continue;
        };
        let Some(ns) = namespaces.get_mut(&ns_name) else {
            continue;
        };
        match kind {
            SyncKind::WaitGroup => super::waitgroup::reap(ns, &name, ctx),
            SyncKind::Barrier => super::barrier::reap(ns, &name, ctx),
        }
    }
}

/// Tells the callers waiting on the wait groups and barriers of a deleted namespace.
pub(super) fn namespace_gone(ns: &Namespace, ctx: &mut Ctx) {
    let kinds = [
        (
            SyncKind::WaitGroup,
            ns.wait_groups().keys().collect::<Vec<_>>(),
        ),
        (SyncKind::Barrier, ns.barriers().keys().collect()),
    ];
    for (kind, names) in kinds {
        for name in names {
            ctx.events.push(Event::Synced {
                ns: ns.name().to_string(),
                kind,
                name: name.clone(),
            });
        }
    }
}

/// The rules every wait group and barrier of `ns` keeps (part of `check_invariants`):
/// - a wait group: version >= 1, counter >= 1, its distinct completed jobs at most the counter;
///   ACTIVE below it and with no finish time, COMPLETED exactly at it, EXPIRED below it; its
///   retention at least the minimum
/// - a barrier: version >= 1, generation >= 1, expected >= 1, arrivals in the current
///   generation below `expected` (reaching it trips); its window at least the minimum
pub(super) fn check(ns: &Namespace) -> Result<(), String> {
    use super::limits::SYNC_RETENTION_MIN_S;
    for (name, wg) in ns.wait_groups() {
        let at = |what: &str| format!("wait group {}/{name}: {what}", ns.name());
        let (done, counter) = (wg.completed(), wg.counter);
        if wg.version == 0 || counter == 0 {
            return Err(at("version or counter 0"));
        }
        if done > counter {
            return Err(at(&format!("{done} completed jobs over counter {counter}")));
        }
        let status_ok = match wg.status {
            WaitGroupStatus::Active => done < counter && wg.finished_ns == 0 && wg.finished_at == 0,
            WaitGroupStatus::Completed => done == counter,
            WaitGroupStatus::Expired => done < counter,
        };
        if !status_ok {
            return Err(at(&format!(
                "status {:?} does not match {done} of {counter} jobs",
                wg.status
            )));
        }
        if wg.delete_after_finished_s < SYNC_RETENTION_MIN_S {
            return Err(at("retention below the minimum"));
        }
    }
    for (name, b) in ns.barriers() {
        let at = |what: &str| format!("barrier {}/{name}: {what}", ns.name());
        if b.version == 0 || b.generation == 0 || b.expected == 0 {
            return Err(at("version, generation or expected processes 0"));
        }
        if b.arrived() >= b.expected {
            return Err(at(&format!(
                "{} arrivals reached {} expected without a trip",
                b.arrived(),
                b.expected
            )));
        }
        if b.delete_inactive_after_s < SYNC_RETENTION_MIN_S {
            return Err(at("inactivity window below the minimum"));
        }
    }
    Ok(())
}
