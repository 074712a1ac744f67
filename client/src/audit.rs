//! An administrator's revoke of a holder, and the audit trail that records it (`ConchApi`
//! `RevokeHolder` and `ListAudit`).

use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::conch::{AuditRecord, HolderKind, ListAuditRequest, RevokeHolderRequest};

use crate::client::{Client, PAGE_LIMIT};
use crate::error::Result;
use crate::lease_kind::LeaseKind;

/// The action of a record made by an administrator's revoke.
pub const REVOKE_HOLDER: &str = "revoke-holder";

impl Client {
    /// Revokes the lease `lease_id` (of `kind`), which holds or waits for `object` (a
    /// semaphore's name or a lock's path) in `namespace`, recording `reason` in the audit
    /// trail; answers the record. Needs admin on the namespace. Runs once however often the
    /// call is retried.
    pub async fn revoke_holder(
        &self,
        kind: LeaseKind,
        namespace: &str,
        object: &str,
        lease_id: &str,
        reason: &str,
    ) -> Result<AuditRecord> {
        const OP: &str = "revoke holder";
        let req = RevokeHolderRequest {
            namespace_name: namespace.to_string(),
            kind: match kind {
                LeaseKind::Semaphore => HolderKind::Semaphore,
                LeaseKind::Lock => HolderKind::Lock,
            } as i32,
            object_name: object.to_string(),
            lease_id: lease_id.to_string(),
            reason: reason.to_string(),
        };
        self.unary_once(OP, self.default_options(), req, |ch, r| async move {
            ConchApiClient::new(ch).revoke_holder(r).await
        })
        .await?
        .record
        .ok_or_else(|| crate::client::missing(OP, "record"))
    }

    /// The newest `limit` records of the audit trail (newest first), of `namespace` and
    /// `lease_id` when not empty.
    pub async fn list_audit(
        &self,
        namespace: &str,
        lease_id: &str,
        limit: usize,
    ) -> Result<Vec<AuditRecord>> {
        const OP: &str = "list audit records";
        let mut out = Vec::new();
        let mut token = String::new();
        while out.len() < limit {
            let want = (limit - out.len()).min(PAGE_LIMIT as usize);
            let req = ListAuditRequest {
                namespace_name: namespace.to_string(),
                lease_id: lease_id.to_string(),
                pagination_token: token.clone(),
                limit: want as i32,
            };
            let resp = self
                .unary(OP, self.default_options(), req, |ch, r| async move {
                    ConchApiClient::new(ch).list_audit(r).await
                })
                .await?;
            let done = resp.records.is_empty() || resp.next_pagination_token.is_empty();
            out.extend(resp.records);
            if done || resp.next_pagination_token == token {
                break;
            }
            token = resp.next_pagination_token;
        }
        out.truncate(limit);
        Ok(out)
    }

    /// The administrator's revoke that ended lease `lease_id` of `namespace`, if the audit trail
    /// has one: what a holder that finds its hold gone asks to learn who took it and why. A
    /// holder may read the records of its own lease.
    pub async fn revocation(&self, namespace: &str, lease_id: &str) -> Result<Option<AuditRecord>> {
        let records = self.list_audit(namespace, lease_id, 10).await?;
        Ok(records.into_iter().find(|r| r.action == REVOKE_HOLDER))
    }
}
