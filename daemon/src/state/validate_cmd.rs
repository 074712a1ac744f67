//! [`Cmd::validate`]: the static check of a whole command, made of the checks of its fields
//! (`validate`) and those of the access control commands (`auth`). See `validate` for who calls
//! it and when.

use super::auth;
use super::types::{Cmd, Error, LeaseKind};
use super::validate::*;

const NAMESPACE_NAME: &str = "namespace_name";
const SEMAPHORE_NAME: &str = "semaphore_name";

impl Cmd {
    /// Checks everything about the command that does not depend on the state.
    pub fn validate(&self) -> Result<(), Error> {
        match self {
            // CreateNamespaceRequest calls it `name`; every later request `namespace_name`.
            Cmd::CreateNamespace {
                name: n,
                description: d,
                metadata: m,
            } => {
                name("name", n)?;
                description(d)?;
                metadata(m)
            }
            Cmd::UpdateNamespace {
                name: n,
                description: d,
                metadata: m,
                ..
            } => {
                name(NAMESPACE_NAME, n)?;
                description(d)?;
                metadata(m)
            }
            Cmd::DeleteNamespace { name: n } => name(NAMESPACE_NAME, n),
            Cmd::CreateSemaphore {
                ns,
                name: n,
                description: d,
                permits: p,
                metadata: m,
                max_hold_ns: hold,
            }
            | Cmd::UpdateSemaphore {
                ns,
                name: n,
                description: d,
                permits: p,
                metadata: m,
                max_hold_ns: Some(hold),
                ..
            } => {
                name(NAMESPACE_NAME, ns)?;
                name(SEMAPHORE_NAME, n)?;
                description(d)?;
                permits(*p)?;
                max_hold_ns(*hold)?;
                metadata(m)
            }
            Cmd::UpdateSemaphore {
                ns,
                name: n,
                description: d,
                permits: p,
                metadata: m,
                max_hold_ns: None,
                ..
            } => {
                name(NAMESPACE_NAME, ns)?;
                name(SEMAPHORE_NAME, n)?;
                description(d)?;
                permits(*p)?;
                metadata(m)
            }
            Cmd::DeleteSemaphore { ns, name: n } => {
                name(NAMESPACE_NAME, ns)?;
                name(SEMAPHORE_NAME, n)
            }
            Cmd::CreateLease {
                ns,
                process_id: p,
                ttl_s: t,
                metadata: m,
                secret: _,
                kind: _,
            } => {
                name(NAMESPACE_NAME, ns)?;
                process_id(p)?;
                ttl_s(*t)?;
                metadata(m)
            }
            Cmd::RefreshLease {
                ns,
                lease,
                ttl_s: t,
                kind: _,
            } => {
                name(NAMESPACE_NAME, ns)?;
                lease_id(lease)?;
                refresh_ttl_s(*t)
            }
            Cmd::RevokeLease { ns, lease, .. } => {
                name(NAMESPACE_NAME, ns)?;
                lease_id(lease)
            }
            Cmd::Acquire {
                ns,
                sem,
                lease,
                weight: w,
                wait_ns: wait,
                metadata: m,
                max_hold_ns: hold,
            } => {
                name(NAMESPACE_NAME, ns)?;
                name(SEMAPHORE_NAME, sem)?;
                lease_id(lease)?;
                weight(*w)?;
                wait_ns(*wait)?;
                max_hold_ns(*hold)?;
                metadata(m)
            }
            Cmd::AcquireSet {
                ns,
                lease,
                members,
                wait_ns: wait,
                metadata: m,
                max_hold_ns: hold,
            } => {
                name(NAMESPACE_NAME, ns)?;
                lease_id(lease)?;
                set_members(members)?;
                wait_ns(*wait)?;
                max_hold_ns(*hold)?;
                metadata(m)
            }
            Cmd::Release { ns, sem, lease } => {
                name(NAMESPACE_NAME, ns)?;
                name(SEMAPHORE_NAME, sem)?;
                lease_id(lease)
            }
            Cmd::GiveUp {
                ns,
                sem,
                lease,
                linger_ns,
                ..
            } => {
                name(NAMESPACE_NAME, ns)?;
                wait_object(sem)?;
                lease_id(lease)?;
                wait_ns(*linger_ns)
            }
            Cmd::AcquireLock {
                ns,
                path,
                lease,
                wait_ns: wait,
                metadata: m,
                exclusive: _,
            } => {
                name(NAMESPACE_NAME, ns)?;
                lock_name(path)?;
                lease_id(lease)?;
                wait_ns(*wait)?;
                metadata(m)
            }
            Cmd::ReleaseLock { ns, path, lease } => {
                name(NAMESPACE_NAME, ns)?;
                lock_name(path)?;
                lease_id(lease)
            }
            Cmd::DeleteLock { ns, path } => {
                name(NAMESPACE_NAME, ns)?;
                lock_name(path)
            }
            Cmd::RevokeHolder {
                ns,
                kind,
                object,
                lease,
                reason,
            } => {
                name(NAMESPACE_NAME, ns)?;
                match kind {
                    LeaseKind::Semaphore => name(SEMAPHORE_NAME, object)?,
                    LeaseKind::Lock => lock_name(object)?,
                }
                lease_id(lease)?;
                if reason.trim().is_empty() {
                    return Err(Error::invalid(
                        "reason must not be empty: say why the holder is revoked",
                    ));
                }
                super::audit::reason(reason)
            }
            Cmd::WaitGroup(cmd) => super::validate_sync::wait_group(cmd),
            Cmd::Barrier(cmd) => super::validate_sync::barrier(cmd),
            Cmd::Expire | Cmd::ExtendLeases => Ok(()),
            Cmd::SetClusterVersion { version } => match *version {
                0 => Err(Error::invalid("cluster version must be at least 1")),
                _ => Ok(()),
            },
            Cmd::Once {
                request_id: id,
                cmd,
            } => {
                request_id(id)?;
                match *cmd.unwrapped() {
                    Cmd::Once { .. }
                    | Cmd::GiveUp { .. }
                    | Cmd::Expire
                    | Cmd::ExtendLeases
                    | Cmd::SetClusterVersion { .. } => Err(Error::invalid(
                        "conch-request-id applies to client writes only",
                    )),
                    _ => cmd.validate(),
                }
            }
            Cmd::As { cmd, .. } => match **cmd {
                Cmd::As { .. } | Cmd::Once { .. } => {
                    Err(Error::invalid("a token wraps one client command"))
                }
                _ if auth::access_of(cmd).is_none() => {
                    Err(Error::invalid("a token wraps client commands only"))
                }
                _ => cmd.validate(),
            },
            Cmd::AuthEnable
            | Cmd::AuthDisable
            | Cmd::RoleCreate { .. }
            | Cmd::RoleGrant { .. }
            | Cmd::RoleRevoke { .. }
            | Cmd::RoleDelete { .. }
            | Cmd::TokenCreate { .. }
            | Cmd::TokenRevoke { .. }
            | Cmd::AuthBootstrap { .. } => auth::validate(self).unwrap_or(Ok(())),
            Cmd::SetQuotas { ns, quotas } => {
                name(NAMESPACE_NAME, ns)?;
                quotas.validate()
            }
            Cmd::SetBudget { bytes } => {
                if *bytes > super::quota::BYTES_MAX {
                    return Err(Error::invalid(format!(
                        "budget_bytes must be at most {}, got {bytes}",
                        super::quota::BYTES_MAX
                    )));
                }
                Ok(())
            }
        }
    }
}
