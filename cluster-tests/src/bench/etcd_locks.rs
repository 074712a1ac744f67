//! L1, L2, L3 on etcd: the lock recipes of etcd's Go client, written here with the same KV,
//! Lease and Watch calls, so conch's locks are measured against them in the same run.
//!
//! `concurrency.Mutex` (etcd 3.4's `clientv3/concurrency/mutex.go`), on a prefix `pfx/`:
//! 1. one `Txn`: if our key `pfx/<lease hex>` has create revision 0, put it bound to the
//!    session lease, else get it; either way also get the prefix's first key by create
//!    revision (the owner). Our revision is the put's (the response header's), or the
//!    existing key's create revision;
//! 2. held when the owner is our key (the uncontended path is this one call);
//! 3. otherwise, until none is left: `Range` the prefix's last key by create revision at most
//!    ours − 1, watch it for its deletion;
//! 4. release: delete our key.
//!
//! `recipes.RWMutex` (etcd's `contrib/recipes/rwmutex.go`), on a prefix `pfx/`:
//! 1. put a new key `pfx/read/<lease hex>` (reader) or `pfx/write/<lease hex>` (writer) bound
//!    to the session lease, if absent (a `Txn` on its version being 0); our revision is the
//!    put's;
//! 2. a reader waits for the last *write* key (`pfx/write…`) with a lower mod revision than
//!    ours, a writer for the last key of any kind (`pfx/…`) below ours: `Range` of that
//!    prefix sorted by mod revision, descending, limit 1, max mod revision ours − 1; when there
//!    is one, watch it from our revision for its deletion and look again; when there is none,
//!    the lock is ours;
//! 3. release: delete our key.
//!
//! Every client has its own connection (placed as in W1) and its own session lease (TTL 60 s,
//! longer than a row), as a Go client's `concurrency.Session` would.

use std::time::{Duration, Instant};

use anyhow::Context;
use tonic::transport::Channel;

use super::etcd::pb;
use super::etcd::{EtcdCluster, connect, prefix_end, status_code, wait_deleted};
use super::locks::{L2_CLIENTS, L3_READERS, RwLog, cycles_row, handoff_row, rw_row};
use super::stats::Errors;
use super::w2::Event;
use super::{Opts, Placement};

use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use pb::watch_client::WatchClient;

/// One session: a connection to one member and a lease.
struct Session {
    kv: KvClient<Channel>,
    watch: WatchClient<Channel>,
    lease: i64,
}

impl Session {
    async fn open(addr: &str) -> anyhow::Result<Session> {
        let channel = connect(addr).await?;
        let r = LeaseClient::new(channel.clone())
            .lease_grant(pb::LeaseGrantRequest { ttl: 60, id: 0 })
            .await
            .context("etcd lease grant")?
            .into_inner();
        anyhow::ensure!(r.error.is_empty(), "etcd lease grant: {}", r.error);
        Ok(Session {
            kv: KvClient::new(channel.clone()),
            watch: WatchClient::new(channel),
            lease: r.id,
        })
    }

    async fn delete(&mut self, key: Vec<u8>) -> Result<(), String> {
        self.kv
            .delete_range(pb::DeleteRangeRequest {
                key,
                ..Default::default()
            })
            .await
            .map_err(|s| status_code(&s))?;
        Ok(())
    }

    /// The blocking key `range` finds, if any, and the revision of the answer.
    async fn last_below(
        &mut self,
        range: pb::RangeRequest,
    ) -> Result<(Option<Vec<u8>>, i64), String> {
        let r = self
            .kv
            .range(range)
            .await
            .map_err(|s| status_code(&s))?
            .into_inner();
        let revision = r.header.map_or(0, |h| h.revision);
        Ok((r.kvs.into_iter().next().map(|kv| kv.key), revision))
    }
}

fn range_op(range: pb::RangeRequest) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::RequestRange(range)),
    }
}

/// The first key under `prefix` by create revision (`WithFirstCreate`).
fn first_create(prefix: &str) -> pb::RangeRequest {
    pb::RangeRequest {
        key: prefix.as_bytes().to_vec(),
        range_end: prefix_end(prefix),
        limit: 1,
        sort_order: pb::range_request::SortOrder::Ascend as i32,
        sort_target: pb::range_request::SortTarget::Create as i32,
        ..Default::default()
    }
}

/// The Mutex's one `Txn`: put our key if absent, else get it; and get the owner.
pub fn mutex_txn(prefix: &str, key: &[u8], lease: i64) -> pb::TxnRequest {
    pb::TxnRequest {
        compare: vec![pb::Compare {
            result: pb::compare::CompareResult::Equal as i32,
            target: pb::compare::CompareTarget::Create as i32,
            key: key.to_vec(),
            target_union: Some(pb::compare::TargetUnion::CreateRevision(0)),
            range_end: Vec::new(),
        }],
        success: vec![
            pb::RequestOp {
                request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                    key: key.to_vec(),
                    lease,
                    ..Default::default()
                })),
            },
            range_op(first_create(prefix)),
        ],
        failure: vec![
            range_op(pb::RangeRequest {
                key: key.to_vec(),
                ..Default::default()
            }),
            range_op(first_create(prefix)),
        ],
    }
}

/// From the Mutex's `Txn` answer: our revision, and whether we hold the lock already.
pub fn mutex_decision(r: &pb::TxnResponse) -> Result<(i64, bool), String> {
    let range = |i: usize| match r.responses.get(i).and_then(|op| op.response.as_ref()) {
        Some(pb::response_op::Response::ResponseRange(range)) => Ok(range),
        _ => Err(format!("mutex txn: no range answer at {i}")),
    };
    let mine = if r.succeeded {
        r.header.as_ref().map_or(0, |h| h.revision)
    } else {
        range(0)?
            .kvs
            .first()
            .map(|kv| kv.create_revision)
            .ok_or("mutex txn: our key vanished")?
    };
    let held = match range(1)?.kvs.first() {
        None => true,
        Some(owner) => owner.create_revision == mine,
    };
    Ok((mine, held))
}

/// The last key under `prefix` created at or before `max_create_revision` (`waitDeletes`).
pub fn last_created_before(prefix: &str, max_create_revision: i64) -> pb::RangeRequest {
    pb::RangeRequest {
        key: prefix.as_bytes().to_vec(),
        range_end: prefix_end(prefix),
        limit: 1,
        sort_order: pb::range_request::SortOrder::Descend as i32,
        sort_target: pb::range_request::SortTarget::Create as i32,
        max_create_revision,
        ..Default::default()
    }
}

/// `concurrency.Mutex` on `prefix` (ends with `/`).
struct Mutex {
    s: Session,
    prefix: String,
}

impl Mutex {
    /// Waits until we hold the lock; returns our key.
    async fn lock(&mut self) -> Result<Vec<u8>, String> {
        let key = format!("{}{:x}", self.prefix, self.s.lease).into_bytes();
        let r = self
            .s
            .kv
            .txn(mutex_txn(&self.prefix, &key, self.s.lease))
            .await
            .map_err(|s| status_code(&s))?
            .into_inner();
        let (mine, held) = mutex_decision(&r)?;
        if held {
            return Ok(key);
        }
        let waited = async {
            loop {
                let range = last_created_before(&self.prefix, mine - 1);
                match self.s.last_below(range).await? {
                    (None, _) => return Ok(()),
                    (Some(ahead), revision) => {
                        wait_deleted(&mut self.s.watch, ahead, revision + 1).await?
                    }
                }
            }
        };
        match waited.await {
            Ok(()) => Ok(key),
            Err(e) => {
                // As the recipe does: a failed wait gives up our place.
                let _ = self.s.delete(key).await;
                Err(e)
            }
        }
    }
}

/// The RWMutex's key of a reader or a writer with `lease` under `prefix` (ends with `/`).
pub fn rw_key(prefix: &str, write: bool, lease: i64) -> Vec<u8> {
    let kind = if write { "write" } else { "read" };
    format!("{prefix}{kind}/{lease:x}").into_bytes()
}

/// What a reader (the last write key) or a writer (the last key of any kind) with revision
/// `mine` waits for: the last such key under `prefix` with a lower mod revision.
pub fn rw_blocker(prefix: &str, write: bool, mine: i64) -> pb::RangeRequest {
    let under = if write {
        prefix.to_string()
    } else {
        format!("{prefix}write")
    };
    pb::RangeRequest {
        key: under.as_bytes().to_vec(),
        range_end: prefix_end(&under),
        limit: 1,
        sort_order: pb::range_request::SortOrder::Descend as i32,
        sort_target: pb::range_request::SortTarget::Mod as i32,
        max_mod_revision: mine - 1,
        ..Default::default()
    }
}

/// `recipes.RWMutex` on `prefix` (ends with `/`).
struct RwMutex {
    s: Session,
    prefix: String,
}

impl RwMutex {
    /// Waits until we hold the lock (shared unless `write`); returns our key.
    async fn lock(&mut self, write: bool) -> Result<Vec<u8>, String> {
        let key = rw_key(&self.prefix, write, self.s.lease);
        let put = pb::TxnRequest {
            compare: vec![pb::Compare {
                result: pb::compare::CompareResult::Equal as i32,
                target: pb::compare::CompareTarget::Version as i32,
                key: key.clone(),
                target_union: Some(pb::compare::TargetUnion::Version(0)),
                range_end: Vec::new(),
            }],
            success: vec![pb::RequestOp {
                request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                    key: key.clone(),
                    lease: self.s.lease,
                    ..Default::default()
                })),
            }],
            failure: Vec::new(),
        };
        let r = self
            .s
            .kv
            .txn(put)
            .await
            .map_err(|s| status_code(&s))?
            .into_inner();
        if !r.succeeded {
            return Err("rwmutex: our key exists already".into());
        }
        let mine = r.header.map_or(0, |h| h.revision);
        let waited = async {
            loop {
                match self
                    .s
                    .last_below(rw_blocker(&self.prefix, write, mine))
                    .await?
                {
                    (None, _) => return Ok(()),
                    (Some(ahead), _) => wait_deleted(&mut self.s.watch, ahead, mine).await?,
                }
            }
        };
        match waited.await {
            Ok(()) => Ok(key),
            Err(e) => {
                let _ = self.s.delete(key).await;
                Err(e)
            }
        }
    }
}

/// `n` sessions, the `i`th on the member `placement` deals it.
async fn sessions(
    cluster: &EtcdCluster,
    n: usize,
    placement: Placement,
) -> anyhow::Result<Vec<Session>> {
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let member = placement.node(i, cluster.endpoints.len(), leader);
        out.push(Session::open(&cluster.endpoints[member]).await?);
    }
    Ok(out)
}

fn window(opts: &Opts) -> (Instant, Instant) {
    let start = Instant::now() + opts.warmup;
    (start, start + opts.duration)
}

/// L1 on etcd: `clients` clients, each with a Mutex on a prefix of its own.
pub async fn l1(
    cluster: &EtcdCluster,
    opts: &Opts,
    clients: usize,
    placement: Placement,
) -> anyhow::Result<super::stats::Row> {
    let sessions = sessions(cluster, clients, placement).await?;
    let (window_start, window_end) = window(opts);
    let mut tasks = Vec::new();
    for (i, s) in sessions.into_iter().enumerate() {
        let mut mutex = Mutex {
            s,
            prefix: format!("/conch-bench/lock/l1-{clients}-{}-{i}/", placement.name()),
        };
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            let mut errors = Errors::default();
            while Instant::now() < window_end {
                let start = Instant::now();
                let cycle = async {
                    let key = mutex.lock().await?;
                    mutex.s.delete(key).await
                };
                match cycle.await {
                    Ok(()) => done.push((Instant::now(), start.elapsed())),
                    Err(e) => {
                        errors.add(e);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
            (done, errors)
        }));
    }
    let mut done = Vec::new();
    let mut errors = Errors::default();
    for task in tasks {
        let (d, e) = task.await.context("client task")?;
        done.extend(d);
        errors.merge(e);
    }
    let mut row = cycles_row(done, opts, window_start, window_end, clients, errors);
    row.set("system", "etcd");
    row.set("placement", placement.name());
    Ok(row)
}

/// L2 on etcd: 16 clients with a Mutex on one prefix, no hold.
pub async fn l2(
    cluster: &EtcdCluster,
    opts: &Opts,
    placement: Placement,
) -> anyhow::Result<super::stats::Row> {
    let sessions = sessions(cluster, L2_CLIENTS, placement).await?;
    let prefix = format!("/conch-bench/lock/l2-{}/", placement.name());
    let (window_start, window_end) = window(opts);
    let mut tasks = Vec::new();
    for s in sessions {
        let mut mutex = Mutex {
            s,
            prefix: prefix.clone(),
        };
        tasks.push(tokio::spawn(async move {
            let mut events = Vec::new();
            let mut errors = Errors::default();
            while Instant::now() < window_end {
                match mutex.lock().await {
                    Ok(key) => {
                        events.push((Instant::now(), Event::Grant));
                        events.push((Instant::now(), Event::Release));
                        if let Err(e) = mutex.s.delete(key).await {
                            errors.add(e);
                        }
                    }
                    Err(e) => {
                        errors.add(e);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
            (events, errors)
        }));
    }
    let mut events = Vec::new();
    let mut errors = Errors::default();
    for task in tasks {
        let (e, errs) = task.await.context("client task")?;
        events.extend(e);
        errors.merge(errs);
    }
    let mut row = handoff_row(events, opts, window_start, window_end, errors);
    row.set("system", "etcd");
    row.set("placement", placement.name());
    Ok(row)
}

/// L3 on etcd: 8 readers and 1 writer with an RWMutex on one prefix, no hold.
pub async fn l3(
    cluster: &EtcdCluster,
    opts: &Opts,
    placement: Placement,
) -> anyhow::Result<super::stats::Row> {
    let sessions = sessions(cluster, L3_READERS + 1, placement).await?;
    let prefix = format!("/conch-bench/rwlock/l3-{}/", placement.name());
    let (window_start, window_end) = window(opts);
    let mut tasks = Vec::new();
    for (i, s) in sessions.into_iter().enumerate() {
        let writer = i == L3_READERS;
        let mut rw = RwMutex {
            s,
            prefix: prefix.clone(),
        };
        tasks.push(tokio::spawn(async move {
            let mut log = RwLog::default();
            while Instant::now() < window_end {
                let start = Instant::now();
                let key = match rw.lock(writer).await {
                    Ok(key) => key,
                    Err(e) => {
                        log.errors.add(e);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                };
                let waited = (Instant::now(), start.elapsed());
                if let Err(e) = rw.s.delete(key).await {
                    log.errors.add(e);
                    continue;
                }
                if writer {
                    log.writer_waits.push(waited);
                } else {
                    log.reader_cycles.push((Instant::now(), start.elapsed()));
                }
            }
            log
        }));
    }
    let mut log = RwLog::default();
    for task in tasks {
        log.merge(task.await.context("client task")?);
    }
    let mut row = rw_row(log, opts, window_start, window_end);
    row.set("system", "etcd");
    row.set("placement", placement.name());
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, create_revision: i64) -> pb::KeyValue {
        pb::KeyValue {
            key: key.as_bytes().to_vec(),
            create_revision,
            mod_revision: create_revision,
            ..Default::default()
        }
    }

    fn ranged(kvs: Vec<pb::KeyValue>) -> pb::ResponseOp {
        pb::ResponseOp {
            response: Some(pb::response_op::Response::ResponseRange(
                pb::RangeResponse {
                    kvs,
                    ..Default::default()
                },
            )),
        }
    }

    fn put() -> pb::ResponseOp {
        pb::ResponseOp {
            response: Some(pb::response_op::Response::ResponsePut(Default::default())),
        }
    }

    fn header(revision: i64) -> Option<pb::ResponseHeader> {
        Some(pb::ResponseHeader {
            revision,
            ..Default::default()
        })
    }

    #[test]
    fn the_mutex_txn_puts_if_absent_and_always_reads_the_owner() {
        let txn = mutex_txn("/l/", b"/l/7", 7);
        assert_eq!(txn.compare.len(), 1);
        assert_eq!(
            txn.compare[0].target_union,
            Some(pb::compare::TargetUnion::CreateRevision(0))
        );
        let owner = |op: &pb::RequestOp| match &op.request {
            Some(pb::request_op::Request::RequestRange(r)) => Some(r.clone()),
            _ => None,
        };
        for ops in [&txn.success, &txn.failure] {
            let r = owner(&ops[1]).expect("the owner's range");
            assert_eq!(
                (r.key.as_slice(), r.range_end.as_slice()),
                (&b"/l/"[..], &b"/l0"[..])
            );
            assert_eq!(r.limit, 1);
            assert_eq!(r.sort_order, pb::range_request::SortOrder::Ascend as i32);
            assert_eq!(r.sort_target, pb::range_request::SortTarget::Create as i32);
        }
        match &txn.success[0].request {
            Some(pb::request_op::Request::RequestPut(p)) => {
                assert_eq!((p.key.as_slice(), p.lease), (&b"/l/7"[..], 7))
            }
            other => panic!("expected the put first, got {other:?}"),
        }
    }

    #[test]
    fn the_mutex_is_held_when_its_key_is_the_first_created() {
        // Put at revision 12 and the owner is the key created at 12: held in one call.
        let r = pb::TxnResponse {
            header: header(12),
            succeeded: true,
            responses: vec![put(), ranged(vec![kv("/l/7", 12)])],
        };
        assert_eq!(mutex_decision(&r), Ok((12, true)));
        // Put at 12 behind an owner created at 9: wait for keys created up to 11.
        let r = pb::TxnResponse {
            header: header(12),
            succeeded: true,
            responses: vec![put(), ranged(vec![kv("/l/3", 9)])],
        };
        assert_eq!(mutex_decision(&r), Ok((12, false)));
        // Our key existed (created at 5): our revision is its creation, not the header's.
        let r = pb::TxnResponse {
            header: header(20),
            succeeded: false,
            responses: vec![ranged(vec![kv("/l/7", 5)]), ranged(vec![kv("/l/7", 5)])],
        };
        assert_eq!(mutex_decision(&r), Ok((5, true)));
        let waiting = last_created_before("/l/", 11);
        assert_eq!(waiting.max_create_revision, 11);
        assert_eq!(
            waiting.sort_order,
            pb::range_request::SortOrder::Descend as i32
        );
        assert_eq!(waiting.limit, 1);
    }

    #[test]
    fn a_reader_waits_for_writers_only_and_a_writer_for_everyone() {
        let prefix = "/rw/";
        assert_eq!(rw_key(prefix, false, 0xab), b"/rw/read/ab".to_vec());
        assert_eq!(rw_key(prefix, true, 0xab), b"/rw/write/ab".to_vec());
        let in_range = |r: &pb::RangeRequest, key: &[u8]| {
            key >= r.key.as_slice() && key < r.range_end.as_slice()
        };
        let reader = rw_blocker(prefix, false, 40);
        assert!(in_range(&reader, &rw_key(prefix, true, 1)));
        assert!(!in_range(&reader, &rw_key(prefix, false, 1)));
        let writer = rw_blocker(prefix, true, 40);
        assert!(in_range(&writer, &rw_key(prefix, true, 1)));
        assert!(in_range(&writer, &rw_key(prefix, false, 1)));
        assert!(!in_range(&writer, b"/rx/write/1"));
        for r in [&reader, &writer] {
            // Only keys before ours (a key is never modified, so its mod revision is its
            // creation), the last of them.
            assert_eq!(r.max_mod_revision, 39);
            assert_eq!(r.sort_target, pb::range_request::SortTarget::Mod as i32);
            assert_eq!(r.sort_order, pb::range_request::SortOrder::Descend as i32);
            assert_eq!(r.limit, 1);
        }
    }
}
