//! The reads of hierarchical locks: one lock, a namespace's locks, a lock's queue.

use super::super::data::State;
use super::super::paging::paginate;
use super::super::types::*;
use super::super::validate;

impl State {
    /// Lock `path` of `ns` as a read shows it (unlocked when nobody alive holds it).
    pub fn get_lock(&self, ns: &str, path: &str) -> Result<LockView, Error> {
        validate::name("namespace_name", ns)?;
        validate::lock_name(path)?;
        let namespace = self.namespace(ns)?;
        let vis = self.visibility();
        Ok(namespace.lock_view_where(path, |seq| namespace.lease_visible(seq, vis)))
    }

    /// The held locks of `ns`, by path.
    pub fn list_locks(&self, ns: &str, page: &PageRequest) -> Result<Page<LockView>, Error> {
        validate::name("namespace_name", ns)?;
        let namespace = self.namespace(ns)?;
        let vis = self.visibility();
        paginate(page, |lo, hi| {
            namespace
                .locks()
                .held()
                .range((lo, hi))
                .map(move |(path, _)| {
                    let view =
                        namespace.lock_view_where(path, |seq| namespace.lease_visible(seq, vis));
                    (path.clone(), view)
                })
                .filter(|(_, view)| !view.holders.is_empty())
        })
    }

    /// The queued lock acquires of `ns` in queue order: all of them (`path` empty), or those
    /// for `path`, its ancestors and its descendants.
    pub fn list_lock_waiters(
        &self,
        ns: &str,
        path: &str,
        page: &PageRequest,
    ) -> Result<Page<LockWaiterView>, Error> {
        validate::name("namespace_name", ns)?;
        if !path.is_empty() {
            validate::lock_name(path)?;
        }
        let namespace = self.namespace(ns)?;
        let vis = self.visibility();
        let related = move |p: &str| {
            path.is_empty()
                || p == path
                || p.strip_prefix(path)
                    .is_some_and(|rest| rest.starts_with('/'))
                || path
                    .strip_prefix(p)
                    .is_some_and(|rest| rest.starts_with('/'))
        };
        let queue = namespace.locks().queue();
        let shown = move |w: &super::super::lock_data::LockWaiter| {
            related(&w.path)
                && (vis.everything
                    || (w.deadline_ns > vis.now_ns && namespace.lease_visible(w.seq, vis)))
        };
        let mut page = paginate(page, |lo, hi| {
            queue
                .range((lo, hi))
                .filter(move |(_, w)| shown(w))
                .map(|(ticket, w)| (*ticket, (*ticket, w)))
        })?;
        // Positions count every visible queued acquire ahead in the namespace's queue.
        let items = page
            .items
            .drain(..)
            .map(|(ticket, w)| {
                let position = queue
                    .range(..ticket)
                    .filter(|(_, other)| {
                        vis.everything
                            || (other.deadline_ns > vis.now_ns
                                && namespace.lease_visible(other.seq, vis))
                    })
                    .count() as u64;
                LockWaiterView {
                    lease_id: namespace.lease_id(w.seq),
                    path: w.path.clone(),
                    exclusive: w.exclusive,
                    queued_at: w.queued_at,
                    deadline_ns: w.deadline_ns,
                    metadata: w.metadata.clone(),
                    position,
                    owner: namespace.leases().get(&w.seq).and_then(|l| l.owner),
                }
            })
            .collect();
        Ok(Page {
            items,
            next_token: page.next_token,
            previous_token: page.previous_token,
        })
    }
}
