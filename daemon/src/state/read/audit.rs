//! The read of the audit trail, newest first, a page at a time.

use super::super::data::State;
use super::super::types::*;
use super::super::validate;

/// A page cursor: continue below record `seq`.
fn audit_cursor(seq: u64) -> String {
    format!("audit-{seq}")
}

fn parse_audit_cursor(token: &str) -> Result<u64, Error> {
    token
        .strip_prefix("audit-")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| Error::invalid("pagination_token is not one this call returned"))
}

impl State {
    /// The trail's records matching `filter` that `visible` lets through, newest first, one
    /// page (`page.token`: empty, or the `next_token` of the page before; no previous token).
    pub fn list_audit(
        &self,
        filter: &super::super::audit::AuditFilter,
        page: &PageRequest,
        visible: impl Fn(&super::super::audit::AuditRecord) -> bool,
    ) -> Result<Page<super::super::audit::AuditRecord>, Error> {
        if !filter.namespace.is_empty() {
            validate::name("namespace_name", &filter.namespace)?;
        }
        if !filter.lease.is_empty() {
            validate::lease_id(&filter.lease)?;
        }
        let limit = validate::page_limit(page.limit)?;
        let before = match page.token.as_str() {
            "" => None,
            token => Some(parse_audit_cursor(token)?),
        };
        let (items, next) = self.data.audit.newest_first(filter, before, limit, visible);
        Ok(Page {
            items,
            next_token: next.map(audit_cursor).unwrap_or_default(),
            previous_token: String::new(),
        })
    }

    /// How many records the trail holds.
    pub fn audit_len(&self) -> usize {
        self.data.audit.len()
    }
}
