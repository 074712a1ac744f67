//! Timelines of access control through the state machine. Every step checks the invariants, and
//! every refusal leaves the state hash unchanged.

use super::State;
use super::auth::{Access, Denied, Permission};
use super::timeline::Timeline;
use super::types::*;

const S: Nanos = NANOS_PER_SEC;

impl Timeline {
    fn role(&mut self, name: &str, cluster_admin: bool) {
        self.ok(Cmd::RoleCreate {
            name: name.into(),
            cluster_admin,
        });
    }

    fn grant(&mut self, role: &str, ns: &str, perm: Permission) {
        self.ok(Cmd::RoleGrant {
            role: role.into(),
            ns: ns.into(),
            perm,
        });
    }

    fn token(&mut self, role: &str, byte: u8) -> String {
        match self.ok(Cmd::TokenCreate {
            name: format!("t{byte}"),
            role: role.into(),
            hash: [byte; 32],
        }) {
            Outcome::Token(view) => view.id,
            other => panic!("unexpected {other:?}"),
        }
    }

    /// A lease of namespace `ns`, created by the current caller.
    fn lease(&mut self, ns: &str, process_id: &str) -> LeaseView {
        match self.ok(Cmd::CreateLease {
            ns: ns.into(),
            kind: LeaseKind::Semaphore,
            process_id: process_id.into(),
            ttl_s: 60,
            metadata: Metadata::new(),
            secret: 7,
        }) {
            Outcome::Lease(lease) => lease,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn check(&self, byte: Option<u8>, access: Access) -> Result<(), Denied> {
        let hash = byte.map(|b| [b; 32]);
        self.state.auth().authorize(hash.as_ref(), access)
    }
}

/// Lease `lease` acquires one permit of semaphore `s` in namespace `a`, without waiting.
fn acquire_one(lease: &str) -> Cmd {
    Cmd::Acquire {
        ns: "a".into(),
        sem: "s".into(),
        lease: lease.into(),
        weight: 1,
        wait_ns: 0,
        metadata: Metadata::new(),
        max_hold_ns: 0,
    }
}

#[test]
fn off_by_default_allows_everything() {
    let t = Timeline::stepping(S);
    assert!(!t.state.auth().enabled());
    assert_eq!(t.check(None, Access::ClusterAdmin), Ok(()));
    assert_eq!(
        t.check(Some(9), Access::Namespace("a", Permission::Admin)),
        Ok(())
    );
}

#[test]
fn enable_needs_a_cluster_admin_token() {
    let mut t = Timeline::stepping(S);
    let e = t.err(Cmd::AuthEnable);
    assert_eq!(e.kind, ErrorKind::FailedPrecondition);
    assert!(e.message.contains("cluster-admin"), "{}", e.message);
    t.role("reader", false);
    t.token("reader", 1);
    assert_eq!(t.err(Cmd::AuthEnable).kind, ErrorKind::FailedPrecondition);
    t.role("root", true);
    t.token("root", 2);
    t.ok(Cmd::AuthEnable);
    assert!(t.state.auth().enabled());
    // Once on, turning it off takes a cluster-admin token.
    assert_eq!(t.err(Cmd::AuthDisable).kind, ErrorKind::Unauthenticated);
    t.caller = Some(1);
    assert_eq!(t.err(Cmd::AuthDisable).kind, ErrorKind::PermissionDenied);
    t.caller = Some(2);
    t.ok(Cmd::AuthDisable);
    assert!(!t.state.auth().enabled());
}

#[test]
fn permissions_by_namespace_and_level() {
    let mut t = Timeline::stepping(S);
    t.role("root", true);
    t.token("root", 1);
    t.role("app", false);
    t.grant("app", "a", Permission::Write);
    t.role("viewer", false);
    t.grant("viewer", "*", Permission::Read);
    t.token("app", 2);
    t.token("viewer", 3);
    t.ok(Cmd::AuthEnable);
    t.caller = Some(1);

    let ns = |n, p| Access::Namespace(n, p);
    // No token and unknown tokens are unauthenticated.
    assert!(matches!(
        t.check(None, ns("a", Permission::Read)),
        Err(Denied::Unauthenticated(_))
    ));
    assert!(matches!(
        t.check(Some(7), ns("a", Permission::Read)),
        Err(Denied::Unauthenticated(_))
    ));
    // The cluster admin may do anything.
    assert_eq!(t.check(Some(1), Access::ClusterAdmin), Ok(()));
    assert_eq!(t.check(Some(1), ns("z", Permission::Admin)), Ok(()));
    // write includes read, not admin; only on its namespace.
    assert_eq!(t.check(Some(2), ns("a", Permission::Read)), Ok(()));
    assert_eq!(t.check(Some(2), ns("a", Permission::Write)), Ok(()));
    let Err(Denied::PermissionDenied(message)) = t.check(Some(2), ns("a", Permission::Admin))
    else {
        panic!("admin on a is denied");
    };
    assert!(
        message.contains("admin permission on namespace a"),
        "{message}"
    );
    let Err(Denied::PermissionDenied(message)) = t.check(Some(2), ns("b", Permission::Read)) else {
        panic!("b is denied");
    };
    assert!(
        message.contains("read permission on namespace b"),
        "{message}"
    );
    assert!(matches!(
        t.check(Some(2), Access::ClusterAdmin),
        Err(Denied::PermissionDenied(_))
    ));
    // `*` covers every namespace; the higher of `*` and the namespace's own grant counts.
    assert_eq!(t.check(Some(3), ns("anything", Permission::Read)), Ok(()));
    assert!(t.check(Some(3), ns("a", Permission::Write)).is_err());
    t.grant("viewer", "a", Permission::Admin);
    assert_eq!(t.check(Some(3), ns("a", Permission::Write)), Ok(()));
    assert!(t.check(Some(3), ns("b", Permission::Write)).is_err());
    // Authentication alone: any known token.
    assert_eq!(t.state.auth().authenticate(Some(&[3; 32])), Ok(()));
    assert!(matches!(
        t.state.auth().authenticate(None),
        Err(Denied::Unauthenticated(_))
    ));
    // Revoking a grant takes effect at once.
    t.ok(Cmd::RoleRevoke {
        role: "app".into(),
        ns: "a".into(),
    });
    assert!(matches!(
        t.check(Some(2), ns("a", Permission::Read)),
        Err(Denied::PermissionDenied(_))
    ));
}

#[test]
fn revoked_tokens_are_unknown_and_the_last_admin_token_stays() {
    let mut t = Timeline::stepping(S);
    t.role("root", true);
    let root = t.token("root", 1);
    t.role("app", false);
    let app = t.token("app", 2);
    t.ok(Cmd::AuthEnable);
    t.caller = Some(1);
    t.ok(Cmd::TokenRevoke { id: app.clone() });
    assert!(matches!(
        t.check(Some(2), Access::Namespace("a", Permission::Read)),
        Err(Denied::Unauthenticated(_))
    ));
    assert_eq!(
        t.err(Cmd::TokenRevoke { id: app }).kind,
        ErrorKind::NotFound
    );
    assert_eq!(
        t.err(Cmd::TokenRevoke { id: "tk_x".into() }).kind,
        ErrorKind::NotFound
    );
    let e = t.err(Cmd::TokenRevoke { id: root.clone() });
    assert_eq!(e.kind, ErrorKind::FailedPrecondition);
    // With access control off, the last admin token may go.
    t.ok(Cmd::AuthDisable);
    t.ok(Cmd::TokenRevoke { id: root });
    assert!(t.state.auth().tokens().is_empty());
}

#[test]
fn roles_in_use_cannot_be_deleted_and_names_are_checked() {
    let mut t = Timeline::stepping(S);
    t.role("app", false);
    assert_eq!(
        t.err(Cmd::RoleCreate {
            name: "app".into(),
            cluster_admin: true
        })
        .kind,
        ErrorKind::AlreadyExists
    );
    let id = t.token("app", 1);
    let e = t.err(Cmd::RoleDelete { name: "app".into() });
    assert_eq!(e.kind, ErrorKind::FailedPrecondition);
    assert!(e.message.contains(&id), "{}", e.message);
    t.ok(Cmd::TokenRevoke { id });
    t.ok(Cmd::RoleDelete { name: "app".into() });
    assert_eq!(
        t.err(Cmd::RoleDelete { name: "app".into() }).kind,
        ErrorKind::NotFound
    );
    let bad = t.err(Cmd::RoleCreate {
        name: "no spaces".into(),
        cluster_admin: false,
    });
    assert_eq!(bad.kind, ErrorKind::InvalidArgument);
    t.role("app", false);
    let bad = t.err(Cmd::RoleGrant {
        role: "app".into(),
        ns: "a b".into(),
        perm: Permission::Read,
    });
    assert!(bad.message.contains("namespace_name"), "{}", bad.message);
    let missing = t.err(Cmd::TokenCreate {
        name: "t".into(),
        role: "nobody".into(),
        hash: [5; 32],
    });
    assert_eq!(missing.kind, ErrorKind::NotFound);
    t.token("app", 6);
    let dup = t.err(Cmd::TokenCreate {
        name: "again".into(),
        role: "app".into(),
        hash: [6; 32],
    });
    assert_eq!(dup.kind, ErrorKind::AlreadyExists);
}

#[test]
fn bootstrap_happens_once_and_turns_access_control_on() {
    let mut t = Timeline::stepping(S);
    t.ok(Cmd::AuthBootstrap { hash: [1; 32] });
    assert!(t.state.auth().enabled() && t.state.auth().bootstrapped());
    assert_eq!(t.check(Some(1), Access::ClusterAdmin), Ok(()));
    let roles = t.state.auth().roles();
    assert_eq!(roles.len(), 1);
    assert!(roles[0].cluster_admin && roles[0].name == "cluster-admin");
    // A second bootstrap (another hash) changes nothing.
    let before = t.state.hash();
    t.run_now(Cmd::AuthBootstrap { hash: [2; 32] })
        .expect("a no-op");
    assert_eq!(t.state.hash(), before);
    assert!(t.check(Some(2), Access::ClusterAdmin).is_err());
}

/// Found by the auth-heavy property test: a bootstrap whose hash is already a token of a role
/// without cluster-admin turned access control on with no cluster-admin token, locking out
/// everyone for good.
#[test]
fn a_bootstrap_with_a_non_admin_tokens_hash_is_refused() {
    let mut t = Timeline::stepping(S);
    t.role("jobs", false);
    t.token("jobs", 4);
    let e = t.err(Cmd::AuthBootstrap { hash: [4; 32] });
    assert_eq!(e.kind, ErrorKind::FailedPrecondition);
    assert!(e.message.contains("not cluster-admin"), "{}", e.message);
    assert!(!t.state.auth().enabled() && !t.state.auth().bootstrapped());
    // A token of a cluster-admin role may be the bootstrap token (a bootstrap that is retried).
    t.role("admins", true);
    t.token("admins", 5);
    t.ok(Cmd::AuthBootstrap { hash: [5; 32] });
    assert!(t.state.auth().enabled());
    assert_eq!(t.check(Some(5), Access::ClusterAdmin), Ok(()));
}

#[test]
fn the_store_survives_a_snapshot_and_changes_the_hash() {
    let mut t = Timeline::stepping(S);
    let empty = t.state.hash();
    t.role("app", false);
    t.grant("app", "a", Permission::Write);
    t.token("app", 2);
    t.ok(Cmd::AuthBootstrap { hash: [1; 32] });
    assert_ne!(t.state.hash(), empty);
    let bytes = t.state.encode_snapshot().expect("encodes");
    let restored = State::decode_snapshot(&bytes).expect("decodes");
    assert_eq!(restored.hash(), t.state.hash());
    assert_eq!(
        restored
            .auth()
            .authorize(Some(&[2; 32]), Access::Namespace("a", Permission::Write)),
        Ok(())
    );
    assert_eq!(restored.auth().tokens(), t.state.auth().tokens());
}

#[test]
fn the_store_survives_a_snapshot_round_trip_empty_or_used() {
    let mut t = Timeline::stepping(S);
    t.ok(Cmd::CreateNamespace {
        name: "a".into(),
        description: String::new(),
        metadata: Metadata::new(),
    });
    let empty = t.state.encode_snapshot().expect("encodes");
    let restored = State::decode_snapshot(&empty).expect("decodes");
    assert_eq!(restored.hash(), t.state.hash());
    assert!(restored.auth().is_empty());
    t.role("app", false);
    let used = t.state.encode_snapshot().expect("encodes");
    assert!(used.len() > empty.len());
    let restored = State::decode_snapshot(&used).expect("decodes");
    assert_eq!(restored.hash(), t.state.hash());
    assert_eq!(restored.auth().roles(), t.state.auth().roles());
    // Every truncation is an error, never a state without the store.
    assert!((0..used.len()).all(|len| State::decode_snapshot(&used[..len]).is_err()));
}

#[test]
fn a_write_is_authorized_by_the_store_where_it_applies() {
    // t=0   roles root (token 1) and app (token 2, write on namespace a); access control on
    let mut t = Timeline::stepping(S);
    t.role("root", true);
    let _root = t.token("root", 1);
    t.role("app", false);
    t.grant("app", "a", Permission::Write);
    let app = t.token("app", 2);
    t.ok(Cmd::CreateNamespace {
        name: "a".into(),
        description: String::new(),
        metadata: Metadata::new(),
    });
    t.ok(Cmd::AuthEnable);
    let sem = |name: &str| Cmd::CreateSemaphore {
        ns: "a".into(),
        name: name.into(),
        description: String::new(),
        permits: 1,
        metadata: Metadata::new(),
        max_hold_ns: 0,
    };
    // t=1s  app creates a semaphore in a                     -> ok
    t.caller = Some(2);
    t.ok(sem("s1"));
    // t=2s  the same without a token                         -> Unauthenticated, unchanged
    t.caller = None;
    assert_eq!(t.err(sem("s2")).kind, ErrorKind::Unauthenticated);
    // t=3s  app asks for admin on a (update the namespace)   -> PermissionDenied, unchanged
    t.caller = Some(2);
    let e = t.err(Cmd::UpdateNamespace {
        name: "a".into(),
        description: "mine".into(),
        metadata: Metadata::new(),
        expected_version: 1,
    });
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    assert!(
        e.message.contains("admin permission on namespace a"),
        "{}",
        e.message
    );
    // t=4s  app turns access control off                     -> PermissionDenied
    assert_eq!(t.err(Cmd::AuthDisable).kind, ErrorKind::PermissionDenied);
    // t=5s  root revokes app's token
    t.caller = Some(1);
    t.ok(Cmd::TokenRevoke { id: app });
    // t=6s  a write app's node let through before it applied the revocation -> refused here
    t.caller = Some(2);
    assert_eq!(t.err(sem("s3")).kind, ErrorKind::Unauthenticated);
    // ...and so is its retry under a request id, even of a request that ran before
    let once = |request_id: &str, cmd: Cmd| Cmd::Once {
        request_id: request_id.into(),
        cmd: Box::new(cmd.with_token(Some([2; 32]))),
    };
    t.caller = None;
    assert_eq!(
        t.err(once("r-1", sem("s4"))).kind,
        ErrorKind::Unauthenticated
    );
    // Commands nodes propose themselves need no token.
    t.ok(Cmd::Expire);
}

#[test]
fn a_retry_under_a_request_id_answers_only_a_caller_who_may_ask() {
    // t=0   root (1), app (2, write on a), other (3, write on b); access control on
    let mut t = Timeline::stepping(S);
    t.role("root", true);
    t.token("root", 1);
    t.role("app", false);
    t.grant("app", "a", Permission::Write);
    t.token("app", 2);
    t.role("other", false);
    t.grant("other", "b", Permission::Write);
    t.token("other", 3);
    t.ok(Cmd::AuthEnable);
    t.caller = Some(1);
    t.ok(Cmd::CreateNamespace {
        name: "a".into(),
        description: String::new(),
        metadata: Metadata::new(),
    });
    let lease = |token: u8| Cmd::Once {
        request_id: "req-1".into(),
        cmd: Box::new(
            Cmd::CreateLease {
                ns: "a".into(),
                kind: LeaseKind::Semaphore,
                process_id: "p".into(),
                ttl_s: 10,
                metadata: Metadata::new(),
                secret: 7,
            }
            .with_token(Some([token; 32])),
        ),
    };
    // t=1s  app creates a lease under request id req-1       -> ok
    t.caller = None;
    let first = t.ok(lease(2));
    // t=2s  app retries                                       -> the same reply
    assert_eq!(t.ok(lease(2)), first);
    // t=3s  other replays the id with its own token           -> refused, learns nothing
    assert_eq!(t.err(lease(3)).kind, ErrorKind::PermissionDenied);
}

#[test]
fn a_token_wraps_one_client_command() {
    let wrapped = |cmd: Cmd| cmd.with_token(Some([1; 32]));
    for cmd in [
        wrapped(wrapped(Cmd::AuthEnable)),
        wrapped(Cmd::Expire),
        wrapped(Cmd::ExtendLeases),
        wrapped(Cmd::AuthBootstrap { hash: [2; 32] }),
        wrapped(Cmd::Once {
            request_id: "r".into(),
            cmd: Box::new(Cmd::AuthEnable),
        }),
    ] {
        assert_eq!(
            cmd.validate().map_err(|e| e.kind),
            Err(ErrorKind::InvalidArgument),
            "{cmd:?}"
        );
    }
    assert_eq!(wrapped(Cmd::AuthEnable).validate(), Ok(()));
}

#[test]
fn acquire_runs_jobs_without_changing_what_others_hold() {
    // t=0   root (1); job (2) with acquire on a; access control on
    let mut t = Timeline::stepping(S);
    t.role("root", true);
    t.token("root", 1);
    t.role("job", false);
    t.grant("job", "a", Permission::Acquire);
    t.token("job", 2);
    t.ok(Cmd::AuthEnable);
    t.caller = Some(1);
    t.ok(Cmd::CreateNamespace {
        name: "a".into(),
        description: String::new(),
        metadata: Metadata::new(),
    });
    let semaphore = |permits| Cmd::CreateSemaphore {
        ns: "a".into(),
        name: "s".into(),
        description: String::new(),
        permits,
        metadata: Metadata::new(),
        max_hold_ns: 0,
    };
    // t=1s  the job creates its semaphore on first use, a lease, and acquires   -> ok
    t.caller = Some(2);
    t.ok(semaphore(1));
    let lease = t.lease("a", "job").lease_id;
    t.ok(acquire_one(&lease));
    // t=2s  it may not resize or delete a semaphore (others hold it)           -> refused
    let resize = Cmd::UpdateSemaphore {
        ns: "a".into(),
        name: "s".into(),
        description: String::new(),
        permits: 5,
        metadata: Metadata::new(),
        expected_version: 1,
        max_hold_ns: None,
    };
    let e = t.err(resize.clone());
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    assert!(
        e.message.contains("write permission on namespace a"),
        "{}",
        e.message
    );
    let delete = Cmd::DeleteSemaphore {
        ns: "a".into(),
        name: "s".into(),
    };
    assert_eq!(t.err(delete).kind, ErrorKind::PermissionDenied);
    // ...nor create one over an existing one                                   -> AlreadyExists
    assert_eq!(t.err(semaphore(5)).kind, ErrorKind::AlreadyExists);
    // t=3s  write may
    t.caller = Some(1);
    t.ok(resize);
    // The levels include each other in order, and read the new name.
    assert!(Permission::Read < Permission::Acquire);
    assert!(Permission::Acquire < Permission::Write);
    assert!(Permission::Write < Permission::Admin);
    assert_eq!(Permission::parse("acquire"), Ok(Permission::Acquire));
}

#[test]
fn a_lease_is_used_only_by_the_token_that_created_it_or_an_admin() {
    // t=0   root (1); jobs A (2) and B (3) with acquire on a; admin of a (4); access on
    let mut t = Timeline::stepping(S);
    t.role("root", true);
    t.token("root", 1);
    t.role("job", false);
    t.grant("job", "a", Permission::Acquire);
    t.token("job", 2);
    t.token("job", 3);
    t.role("ns-admin", false);
    t.grant("ns-admin", "a", Permission::Admin);
    t.token("ns-admin", 4);
    t.ok(Cmd::AuthEnable);
    t.caller = Some(1);
    t.ok(Cmd::CreateNamespace {
        name: "a".into(),
        description: String::new(),
        metadata: Metadata::new(),
    });
    t.ok(Cmd::CreateSemaphore {
        ns: "a".into(),
        name: "s".into(),
        description: String::new(),
        permits: 2,
        metadata: Metadata::new(),
        max_hold_ns: 0,
    });
    // t=1s  A creates a lease and acquires with it                              -> ok
    t.caller = Some(2);
    let lease = t.lease("a", "a");
    assert_eq!(lease.owner, Some(2));
    let id = lease.lease_id;
    t.ok(acquire_one(&id));
    // t=2s  B, with the same role, may not refresh, acquire with, release or revoke it
    t.caller = Some(3);
    for cmd in [
        Cmd::RefreshLease {
            ns: "a".into(),
            kind: LeaseKind::Semaphore,
            lease: id.clone(),
            ttl_s: 0,
        },
        acquire_one(&id),
        Cmd::Release {
            ns: "a".into(),
            sem: "s".into(),
            lease: id.clone(),
        },
        Cmd::RevokeLease {
            ns: "a".into(),
            kind: LeaseKind::Semaphore,
            lease: id.clone(),
        },
    ] {
        let hidden = matches!(cmd, Cmd::RefreshLease { .. } | Cmd::RevokeLease { .. });
        let e = t.err(cmd);
        if hidden {
            // Refresh and revoke answer exactly as for a lease that does not exist.
            assert_eq!(e.kind, ErrorKind::NotFound);
            assert_eq!(e.message, format!("lease {id} not found"));
        } else {
            assert_eq!(e.kind, ErrorKind::PermissionDenied);
            assert!(
                e.message.contains("belongs to another token"),
                "{}",
                e.message
            );
        }
    }
    // t=3s  the namespace's admin may (e.g. to clear a stuck job)               -> ok
    t.caller = Some(4);
    t.ok(Cmd::RevokeLease {
        ns: "a".into(),
        kind: LeaseKind::Semaphore,
        lease: id,
    });
    // A lease created without a token (access control off then) stays usable by any job.
    t.caller = Some(1);
    t.ok(Cmd::AuthDisable);
    t.caller = None;
    let open = t.lease("a", "old");
    assert_eq!(open.owner, None);
    t.caller = Some(1);
    t.ok(Cmd::AuthEnable);
    t.caller = Some(3);
    t.ok(acquire_one(&open.lease_id));
}

#[test]
fn changes_to_access_control_are_told_apart_inside_their_wrappers() {
    let token_create = Cmd::TokenCreate {
        name: "ci".into(),
        role: "r".into(),
        hash: [7; 32],
    };
    let wrapped = Cmd::Once {
        request_id: "req-1".into(),
        cmd: Box::new(Cmd::As {
            token: [1; 32],
            cmd: Box::new(token_create.clone()),
        }),
    };
    assert!(token_create.changes_access());
    assert!(wrapped.changes_access());
    assert!(Cmd::AuthDisable.changes_access());
    assert!(!acquire_one("ls_a").changes_access());
    assert!(!Cmd::Expire.changes_access());
    let acquire_as = Cmd::As {
        token: [1; 32],
        cmd: Box::new(acquire_one("ls_a")),
    };
    assert!(!acquire_as.changes_access());
}
