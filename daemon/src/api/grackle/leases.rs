//! The lease calls, shared by both kinds of lease (a semaphore's and a lock's).

use conch_proto::grackle as pb;
use tonic::Status;

use super::{GrackleService, Write, unexpected};
use crate::api::auth::Caller;
use crate::api::convert;
use crate::state::{Cmd, Error, LeaseKind, Outcome};

/// The lease calls, shared by both kinds of lease.
impl GrackleService {
    pub(super) async fn create_lease(
        &self,
        write: Write,
        kind: LeaseKind,
        ns: String,
        process_id: String,
        ttl_s: u64,
        metadata: std::collections::HashMap<String, String>,
    ) -> Result<pb::Lease, Status> {
        let cmd = Cmd::CreateLease {
            ns,
            kind,
            process_id,
            ttl_s,
            metadata: convert::metadata(metadata),
            secret: crate::api::auth::random_u64()?,
        };
        match self.write(write, cmd).await? {
            Outcome::Lease(lease) => Ok(convert::lease(lease)),
            other => Err(unexpected(other)),
        }
    }

    pub(super) async fn refresh_lease(
        &self,
        write: Write,
        kind: LeaseKind,
        ns: String,
        lease: String,
        ttl_s: u64,
    ) -> Result<pb::Lease, Status> {
        let cmd = Cmd::RefreshLease {
            ns,
            kind,
            lease,
            ttl_s,
        };
        match self.write(write, cmd).await? {
            Outcome::Lease(lease) => Ok(convert::lease(lease)),
            other => Err(unexpected(other)),
        }
    }

    /// The leases of `kind` the caller may see (other tokens' only with admin on the
    /// namespace), optionally only those of one process.
    pub(super) async fn list_leases(
        &self,
        caller: &Caller,
        ns: &str,
        kind: LeaseKind,
        process_id: &str,
        page: &crate::state::PageRequest,
    ) -> Result<crate::state::Page<crate::state::LeaseView>, Status> {
        let process_id = (!process_id.is_empty()).then_some(process_id);
        Ok(self
            .read(|s| {
                s.list_leases_visible(ns, kind, process_id, page, |owner| {
                    caller.may_see_lease(s, ns, owner)
                })
            })
            .await?)
    }

    /// Lease `id` of `kind`; another token's lease is not there for this caller, unless it has
    /// admin.
    pub(super) async fn get_lease(
        &self,
        caller: &Caller,
        ns: &str,
        kind: LeaseKind,
        id: &str,
    ) -> Result<pb::Lease, Status> {
        let lease = self
            .read(|s| {
                s.get_lease(ns, kind, id).and_then(|lease| {
                    if caller.may_see_lease(s, ns, lease.owner) {
                        Ok(lease)
                    } else {
                        Err(Error::not_found(format!("{} {id} not found", kind.noun())))
                    }
                })
            })
            .await?;
        Ok(convert::lease(lease))
    }
}
