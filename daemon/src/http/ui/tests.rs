//! The status page's views and their HTML and JSON, on a known state: what each view lists,
//! what a token hides, and that whatever a user wrote is escaped.

use super::html;
use super::view::{self, Cluster, Overview};
use super::{Form, Route, View, route};
use crate::api::auth::Caller;
use crate::state::auth::Permission;
use crate::state::{
    BarrierCmd, Batch, Cmd, LeaseKind, Metadata, Nanos, Outcome, State, WaitGroupCmd,
};
use crate::support::secret::hash_token;

const S: Nanos = 1_000_000_000;
/// The wall clock at lease-clock 0: 2024-02-29 12:00:00 UTC.
const WALL: Nanos = 1_709_208_000 * S;
const EVIL: &str = "<script>alert('x')</script>";
const ADMIN: &str = "conch_admin";
const READER: &str = "conch_reader";

fn meta(pairs: &[(&str, &str)]) -> Metadata {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A state driven one command per batch, at lease-clock second `at`.
struct Known {
    state: State,
}

impl Known {
    fn run(&mut self, at: i64, cmd: Cmd, token: Option<&str>) -> Outcome {
        let batch = Batch {
            now_ns: at * S,
            wall_ns: WALL + at * S,
            cmds: vec![cmd.with_token(token.map(hash_token))],
        };
        let mut replies = self.state.apply_batch(&batch, &mut Vec::new());
        match replies.pop() {
            Some(Ok(outcome)) => outcome,
            other => panic!("command refused: {other:?}"),
        }
    }

    fn lease(&mut self, at: i64, ns: &str, kind: LeaseKind, process: &str, token: &str) -> String {
        let cmd = Cmd::CreateLease {
            ns: ns.into(),
            kind,
            process_id: process.into(),
            ttl_s: 60,
            metadata: meta(&[("host", "lease-host")]),
            secret: 7,
        };
        match self.run(at, cmd, Some(token)) {
            Outcome::Lease(l) => l.lease_id,
            other => panic!("unexpected {other:?}"),
        }
    }

    /// Namespaces `web` (a semaphore of 2 permits: one holder of weight 1, one waiter of
    /// weight 2; a lock held exclusive; a wait group; a barrier) and `ops` (empty), every
    /// lease created by the admin token; then access control on, with a reader token that may
    /// read `web` only.
    fn new() -> Known {
        let mut k = Known {
            state: State::new(),
        };
        k.run(
            1,
            Cmd::RoleCreate {
                name: "root".into(),
                cluster_admin: true,
            },
            None,
        );
        k.run(
            1,
            Cmd::RoleCreate {
                name: "viewer".into(),
                cluster_admin: false,
            },
            None,
        );
        k.run(
            1,
            Cmd::RoleGrant {
                role: "viewer".into(),
                ns: "web".into(),
                perm: Permission::Read,
            },
            None,
        );
        for (name, role, token) in [("admin", "root", ADMIN), ("reader", "viewer", READER)] {
            k.run(
                1,
                Cmd::TokenCreate {
                    name: name.into(),
                    role: role.into(),
                    hash: hash_token(token),
                },
                None,
            );
        }
        for ns in ["web", "ops"] {
            let cmd = Cmd::CreateNamespace {
                name: ns.into(),
                description: format!("{ns} {EVIL}"),
                metadata: meta(&[("team", "a&b")]),
            };
            k.run(2, cmd, Some(ADMIN));
        }
        let sem = Cmd::CreateSemaphore {
            ns: "web".into(),
            name: "db".into(),
            description: String::new(),
            permits: 2,
            metadata: Metadata::new(),
            max_hold_ns: 0,
        };
        k.run(3, sem, Some(ADMIN));
        let first = k.lease(4, "web", LeaseKind::Semaphore, "worker-1", ADMIN);
        let second = k.lease(4, "web", LeaseKind::Semaphore, "worker-2", ADMIN);
        let acquire = |lease: &str, weight, wait_ns, metadata| Cmd::Acquire {
            ns: "web".into(),
            sem: "db".into(),
            lease: lease.into(),
            weight,
            wait_ns,
            metadata,
            max_hold_ns: 3_600 * S,
        };
        let holder_meta = meta(&[("host", "h1"), ("pid", "101"), ("note", EVIL)]);
        k.run(10, acquire(&first, 1, 0, holder_meta), Some(ADMIN));
        let waiter_meta = meta(&[("host", "h2"), ("pid", "202")]);
        k.run(20, acquire(&second, 2, 30 * S, waiter_meta), Some(ADMIN));
        let locker = k.lease(21, "web", LeaseKind::Lock, "cron", ADMIN);
        let lock = Cmd::AcquireLock {
            ns: "web".into(),
            path: "jobs/nightly".into(),
            lease: locker,
            exclusive: true,
            wait_ns: 0,
            metadata: meta(&[("host", "h3"), ("pid", "303")]),
        };
        k.run(22, lock, Some(ADMIN));
        let group = Cmd::WaitGroup(WaitGroupCmd::Create {
            ns: "web".into(),
            name: "deploy".into(),
            description: String::new(),
            counter: 3,
            expires_at: WALL + 3_600 * S,
            delete_after_finished_s: 3_600,
            metadata: Metadata::new(),
        });
        k.run(23, group, Some(ADMIN));
        let barrier = Cmd::Barrier(BarrierCmd::Create {
            ns: "web".into(),
            name: "start".into(),
            description: String::new(),
            expected: 2,
            delete_inactive_after_s: 3_600,
            metadata: Metadata::new(),
        });
        k.run(24, barrier, Some(ADMIN));
        k
    }

    fn enable_access_control(&mut self) {
        self.run(25, Cmd::AuthEnable, Some(ADMIN));
    }
}

/// The time the views are read at: lease-clock second 25 on the wall clock.
const NOW: Nanos = WALL + 25 * S;

fn cluster() -> Cluster {
    Cluster {
        node_id: 2,
        node_addr: "127.0.0.1:7002".into(),
        role: "Follower".into(),
        term: 3,
        leader_id: Some(1),
        leader_addr: Some("127.0.0.1:7001".into()),
        last_log_index: 40,
        applied_index: 40,
        snapshot_index: 0,
        leader_changes: 1,
        members: view::member_rows(
            &[
                (1, "127.0.0.1:7001".into(), true),
                (2, "127.0.0.1:7002".into(), true),
                (3, "127.0.0.1:7003".into(), true),
            ],
            2,
            Some(1),
            None,
            40,
        ),
        lag_known: false,
        tls: false,
        certificate_expires_at: None,
        certificate_expires_in_ms: None,
        problems: Vec::new(),
        release: "0.2.0".into(),
        cluster_version: 2,
        cluster_version_max: 2,
    }
}

fn overview(state: &State, caller: &Caller) -> Overview {
    let (namespaces, expiring_leases) =
        view::overview_of(state, caller, NOW).expect("overview reads");
    Overview {
        cluster: cluster(),
        access_control: state.auth().enabled(),
        namespaces,
        expiring_leases,
        read_at: view::utc(NOW),
    }
}

#[test]
fn the_namespace_view_lists_holders_and_the_queue_in_order() {
    let k = Known::new();
    let page = view::namespace_of(&k.state, &Caller::bearing(None), "web", NOW).expect("reads");
    let [sem] = page.semaphores.items.as_slice() else {
        panic!("one semaphore: {:?}", page.semaphores);
    };
    assert_eq!((sem.name.as_str(), sem.permits, sem.holds), ("db", 2, 1));
    let [holder] = sem.holders.items.as_slice() else {
        panic!("one holder: {:?}", sem.holders);
    };
    assert_eq!(
        (
            holder.weight,
            holder.process_id.as_str(),
            holder.host.as_str(),
            holder.pid.as_str(),
            holder.held_for_ms
        ),
        (1, "worker-1", "h1", "101", 15_000),
        "held since second 10, read at 25"
    );
    assert_eq!(
        holder.hold_ends_in_ms,
        Some(3_585_000),
        "a one-hour hold limit from second 10"
    );
    assert!(holder.fencing_token > 0 && !holder.lease_id.is_empty());
    let [waiter] = sem.queue.items.as_slice() else {
        panic!("one waiter: {:?}", sem.queue);
    };
    assert_eq!(
        (
            waiter.position,
            waiter.weight,
            waiter.process_id.as_str(),
            waiter.pid.as_str(),
            waiter.waited_for_ms,
            waiter.timeout_in_ms
        ),
        (0, 2, "worker-2", "202", 5_000, Some(25_000)),
        "queued at 20 for 30 s, read at 25"
    );
    let [lock] = page.locks.items.as_slice() else {
        panic!("one lock: {:?}", page.locks);
    };
    assert_eq!(
        (lock.path.as_str(), lock.mode),
        ("jobs/nightly", "exclusive")
    );
    assert_eq!(lock.holders[0].process_id, "cron");
    assert_eq!(lock.holders[0].pid, "303");
    assert_eq!(page.wait_groups.items[0].name, "deploy");
    assert_eq!(page.wait_groups.items[0].counter, 3);
    assert_eq!(
        page.wait_groups.items[0].expires_at.as_deref(),
        Some("2024-02-29 13:00:00Z")
    );
    assert_eq!(
        (
            page.barriers.items[0].arrived,
            page.barriers.items[0].expected
        ),
        (0, 2)
    );
    assert_eq!(
        page.leases.items.len(),
        3,
        "two semaphore leases, one lock lease"
    );
}

#[test]
fn the_namespace_html_shows_the_rows_with_user_text_escaped() {
    let k = Known::new();
    let page = view::namespace_of(&k.state, &Caller::bearing(None), "web", NOW).expect("reads");
    let html = html::namespace(&page);
    assert!(!html.contains("<script>"), "user text is escaped: {html}");
    assert!(html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"));
    assert!(html.contains("<code>team=a&amp;b</code>"));
    assert_eq!(
        html.matches("<tr class=\"holder\">").count(),
        2,
        "db's holder and the lock's"
    );
    assert_eq!(html.matches("<tr class=\"waiter\">").count(), 1);
    assert!(html.contains("<td class=\"pid\">101</td>"));
    assert!(html.contains("<td class=\"host\">h2</td>"));
    assert!(html.contains("1/2 permits held"));
    assert!(
        html.contains(">15s <span class=\"dim\">(hold limit: ends in "),
        "held for, and the hold limit: {html}"
    );
    assert!(html.contains(">25s</td>"), "the waiter times out in 25 s");
    assert!(html.contains("<code>jobs/nightly</code>"));
}

#[test]
fn the_json_carries_the_same_view() {
    let k = Known::new();
    let page = view::namespace_of(&k.state, &Caller::bearing(None), "web", NOW).expect("reads");
    let json: serde_json::Value =
        serde_json::from_str(&serde_json::to_string(&page).expect("serializes")).expect("json");
    let holder = &json["semaphores"]["items"][0]["holders"]["items"][0];
    assert_eq!(
        holder["pid"], 101,
        "a number, as `conch sema --who --json` has it"
    );
    assert_eq!(
        holder["metadata"]["note"], EVIL,
        "JSON keeps the text as written"
    );
    assert_eq!(holder["held_for_ms"], 15_000);
    assert_eq!(holder["hold_ends_in_ms"], 3_585_000);
    let waiter = &json["semaphores"]["items"][0]["queue"]["items"][0];
    assert_eq!(waiter["position"], 0);
    assert_eq!(waiter["timeout_in_ms"], 25_000);
    assert_eq!(json["locks"]["items"][0]["holders"][0]["exclusive"], true);
    assert_eq!(json["read_at"], "2024-02-29 12:00:25Z");
}

#[test]
fn the_overview_counts_each_namespace_and_lists_leases_soonest_first() {
    let k = Known::new();
    let o = overview(&k.state, &Caller::bearing(None));
    let names: Vec<_> = o.namespaces.items.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["ops", "web"]);
    let web = &o.namespaces.items[1];
    assert_eq!(
        (web.semaphores, web.holders, web.waiters, web.locks_held),
        (1, 1, 1, 1)
    );
    assert_eq!((web.wait_groups, web.barriers, web.leases), (1, 1, 3));
    let expiring: Vec<_> = o
        .expiring_leases
        .iter()
        .map(|l| (l.process_id.as_str(), l.expires_in_ms))
        .collect();
    // Created at 4, 4 and 21 with 60 s: 39, 39 and 56 s left at 25.
    assert_eq!(expiring.len(), 3);
    assert_eq!(expiring[2], ("cron", 56_000));
    assert!(expiring[..2].iter().all(|(_, ms)| *ms == 39_000));

    let html = html::overview(&o);
    assert!(html.contains("<a href=\"/ui/ns/web\">web</a>"));
    assert!(
        html.contains("web &lt;script&gt;"),
        "descriptions are escaped"
    );
    assert!(!html.contains("<script>"));
    assert!(html.contains("Access control is off"));
    assert_eq!(html.matches("<tr class=\"member ").count(), 3);
    assert!(html.contains("<tr class=\"member leader\"><td>1</td>"));
    assert!(
        html.contains("open this page on the leader"),
        "a follower knows no lag"
    );
    let json = serde_json::to_value(&o).expect("serializes");
    assert_eq!(json["cluster"]["members"][0]["role"], "leader");
    assert_eq!(json["namespaces"]["items"][1]["holders"], 1);
    assert_eq!(json["expiring_leases"][2]["process_id"], "cron");
}

#[test]
fn with_access_control_a_token_sees_only_what_it_may_read() {
    let mut k = Known::new();
    k.enable_access_control();
    let reader = Caller::bearing(Some(READER));
    let o = overview(&k.state, &reader);
    let names: Vec<_> = o.namespaces.items.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["web"], "ops is not the reader's");
    assert!(
        o.expiring_leases.is_empty(),
        "another token's leases are not listed: {:?}",
        o.expiring_leases
    );
    assert!(html::overview(&o).contains("only the namespaces this token may read"));

    let page = view::namespace_of(&k.state, &reader, "web", NOW).expect("reads");
    let holder = &page.semaphores.items[0].holders.items[0];
    assert_eq!(holder.lease_id, "", "another token's lease id is hidden");
    assert_eq!(holder.process_id, "", "and so is the process that took it");
    assert_eq!(
        holder.pid, "101",
        "the holder's own metadata is the semaphore's to show"
    );
    assert!(html::namespace(&page).contains(">hidden</span>"));

    let admin = Caller::bearing(Some(ADMIN));
    let all = overview(&k.state, &admin);
    assert_eq!(all.namespaces.items.len(), 2);
    assert_eq!(all.expiring_leases.len(), 3);
    let page = view::namespace_of(&k.state, &admin, "web", NOW).expect("reads");
    assert_eq!(
        page.semaphores.items[0].holders.items[0].process_id,
        "worker-1"
    );
}

#[test]
fn the_token_form_escapes_its_message_and_asks_for_no_url_parameter() {
    let form = html::token_form("token <unknown>");
    assert!(form.contains("token &lt;unknown&gt;"));
    assert!(form.contains("id=\"token-form\""));
    assert!(
        !form.contains("action="),
        "the script sends the token, no form submission"
    );
    assert!(form.contains("type=\"password\""));
}

#[test]
fn paths_name_their_views() {
    assert_eq!(route("/"), Route::Home);
    assert_eq!(route("/ui"), Route::Home);
    assert_eq!(route("/ui/"), Route::View(Form::Page, View::Overview));
    assert_eq!(route("/ui/part/"), Route::View(Form::Part, View::Overview));
    assert_eq!(route("/ui/api/"), Route::View(Form::Json, View::Overview));
    assert_eq!(
        route("/ui/ns/web"),
        Route::View(Form::Page, View::Namespace("web"))
    );
    assert_eq!(
        route("/ui/api/ns/web"),
        Route::View(Form::Json, View::Namespace("web"))
    );
    assert_eq!(route("/ui/ns/"), Route::NotFound);
    assert_eq!(route("/ui/ns/a/b"), Route::NotFound);
    assert_eq!(route("/metrics"), Route::NotFound);
    assert!(matches!(route("/ui/assets/page.js"), Route::Asset(..)));
}
