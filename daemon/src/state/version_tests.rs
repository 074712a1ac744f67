//! Timelines of the cluster version: raising it, the encoding it selects, and the behaviour it
//! gates (request ids scoped to their token). Every step checks the invariants.

use super::data::State;
use super::timeline::Timeline;
use super::types::*;
use super::version::{BASE, NEWEST};

const S: Nanos = NANOS_PER_SEC;

fn raise(version: u32) -> Cmd {
    Cmd::SetClusterVersion { version }
}

fn create_ns(name: &str) -> Cmd {
    Cmd::CreateNamespace {
        name: name.into(),
        description: String::new(),
        metadata: Metadata::new(),
    }
}

/// `cmd` with request id `id`, sent with the token whose hash is all `token` bytes.
fn once_as(token: u8, id: &str, cmd: Cmd) -> Cmd {
    Cmd::Once {
        request_id: id.to_string(),
        cmd: Box::new(Cmd::As {
            token: [token; 32],
            cmd: Box::new(cmd),
        }),
    }
}

fn create_lease(process_id: &str) -> Cmd {
    Cmd::CreateLease {
        ns: "n".into(),
        kind: LeaseKind::Semaphore,
        process_id: process_id.into(),
        ttl_s: 30,
        metadata: Metadata::new(),
        secret: 7,
    }
}

fn lease_id(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Lease(view) => view.lease_id.clone(),
        other => panic!("not a lease: {other:?}"),
    }
}

#[test]
fn the_cluster_version_only_moves_forward_and_never_past_this_release() {
    // t=1s  a new state is at the base version, in 0.1.0's data format
    // t=2s  raise to the newest           -> Done, data format 8
    // t=3s  "raise" back to the base      -> Done, nothing changes
    // t=4s  raise past this release       -> refused, nothing changes
    // t=5s  version 0                     -> refused by validation
    let mut t = Timeline::stepping(S);
    assert_eq!(t.state.cluster_version().0, BASE);
    assert_eq!(t.state.data_format(), 7);
    assert_eq!(t.ok(raise(NEWEST)), Outcome::Done);
    assert_eq!(t.state.cluster_version().0, NEWEST);
    assert_eq!(t.state.data_format(), 8);
    let before = t.state.hash();
    assert_eq!(t.run_now(raise(BASE)), Ok(Outcome::Done));
    assert_eq!(t.state.cluster_version().0, NEWEST);
    assert_eq!(t.state.hash(), before);
    let e = t.err(raise(NEWEST + 1));
    assert_eq!(e.kind, ErrorKind::FailedPrecondition);
    assert!(
        e.message.contains("newer than this release speaks"),
        "{}",
        e.message
    );
    assert_eq!(t.err(raise(0)).kind, ErrorKind::InvalidArgument);
}

#[test]
fn the_base_version_encodes_as_0_1_0_and_a_raised_one_appends_its_version() {
    // The clock stays at 0: the raise changes nothing but the version.
    let mut t = Timeline::new();
    t.ok(create_ns("kept"));
    let old = t.state.encode_snapshot().expect("encodes");
    t.ok(raise(NEWEST));
    let new = t.state.encode_snapshot().expect("encodes");
    // Format 8 is format 7's bytes, then the cluster version.
    assert_eq!(new[..old.len()], old[..], "format 7's bytes first");
    assert_eq!(new[old.len()..], [NEWEST as u8], "then the version");
    let decoded = State::decode_snapshot(&new).expect("decodes");
    assert_eq!(decoded.cluster_version().0, NEWEST);
    assert_eq!(decoded.hash(), t.state.hash());
    let decoded_old = State::decode_snapshot(&old).expect("decodes");
    assert_eq!(decoded_old.cluster_version().0, BASE);
}

#[test]
fn a_format_8_encoding_that_claims_the_base_version_is_refused() {
    let t = Timeline::stepping(S);
    let mut bytes = t.state.encode_snapshot().expect("encodes");
    bytes.push(1);
    let e = State::decode_snapshot(&bytes).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("cluster version 1"), "{e}");
    let mut trailing = t.state.encode_snapshot().expect("encodes");
    trailing.extend_from_slice(&[2, 0]);
    assert!(
        State::decode_snapshot(&trailing).is_err(),
        "bytes after the state"
    );
}

/// Token A makes a lease with request id `r`; then token B sends the same request with the same
/// id. Returns both replies.
fn same_id_from_two_tokens(t: &mut Timeline) -> (Reply, Reply) {
    let a = t.run(once_as(0xa, "r", create_lease("p")));
    let b = t.run(once_as(0xb, "r", create_lease("p")));
    (a, b)
}

#[test]
fn before_the_raise_a_request_id_answers_any_token_as_0_1_0_does() {
    let mut t = Timeline::stepping(S);
    t.ok(create_ns("n"));
    let (a, b) = same_id_from_two_tokens(&mut t);
    assert_eq!(
        a, b,
        "0.1.0's behaviour, kept until every node runs a release that scopes ids"
    );
}

#[test]
fn after_the_raise_a_request_id_belongs_to_the_token_that_sent_it() {
    // t=1s  raise; namespace n
    // t=3s  token A: lease with request id r        -> lease 1
    // t=4s  token B: the same request, the same id  -> a lease of its own
    // t=4s  token A repeats                         -> lease 1 again, nothing changes
    // t=5s  token B: another request, the same id   -> refused only as B's own reuse
    let mut t = Timeline::stepping(S);
    t.ok(raise(NEWEST));
    t.ok(create_ns("n"));
    let (a, b) = same_id_from_two_tokens(&mut t);
    let (a, b) = (a.expect("A's lease"), b.expect("B's lease"));
    assert_ne!(lease_id(&a), lease_id(&b), "B never receives A's reply");
    t.repeat(once_as(0xa, "r", create_lease("p")), &Ok(a));
    let e = t.err(once_as(0xb, "r", create_lease("another process")));
    assert!(
        e.message
            .contains("conch-request-id r was already used for a different request"),
        "{}",
        e.message
    );
    // A third token's different request with the same id is its own, never refused.
    t.ok(once_as(0xc, "r", create_lease("another process")));
}

#[test]
fn an_id_remembered_before_the_raise_still_answers_its_retry_after_it() {
    let mut t = Timeline::stepping(S);
    t.ok(create_ns("n"));
    let first = t.run(once_as(0xa, "r", create_lease("p")));
    assert!(first.is_ok(), "{first:?}");
    t.ok(raise(NEWEST));
    t.repeat(once_as(0xa, "r", create_lease("p")), &first);
}

#[test]
fn after_the_raise_each_token_has_the_namespace_s_request_id_quota_to_itself() {
    // t=1s  raise; namespace n with a request-id quota of 2
    // t=2s  token A: leases with ids a1; then token B: b1, b2, b3 (past its own 2)
    // t=..  token A repeats a1                      -> the same lease: B pushed none of A's out
    // t=..  token B repeats b1                      -> a new lease: B's own oldest went first
    let mut t = Timeline::stepping(S);
    t.ok(raise(NEWEST));
    t.ok(create_ns("n"));
    t.ok(Cmd::SetQuotas {
        ns: "n".into(),
        quotas: super::quota::Quotas {
            request_ids: 2,
            ..Default::default()
        },
    });
    let a1 = lease_id(&t.ok(once_as(0xa, "a1", create_lease("a"))));
    let b1 = lease_id(&t.ok(once_as(0xb, "b1", create_lease("b"))));
    t.ok(once_as(0xb, "b2", create_lease("b")));
    t.ok(once_as(0xb, "b3", create_lease("b")));
    assert_eq!(
        lease_id(&t.ok(once_as(0xa, "a1", create_lease("a")))),
        a1,
        "A's id is still remembered"
    );
    assert_ne!(
        lease_id(&t.ok(once_as(0xb, "b1", create_lease("b")))),
        b1,
        "B's oldest id was forgotten for B's newer ones"
    );
}
