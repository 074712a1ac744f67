//! The Grackle lock calls on the wire, checked against Grackle's own field numbers.
//!
//! `upstream` is an independent copy of the lock messages of Grackle's current v1beta proto
//! (`com.evrblk.grackle.v1beta`), written by hand from Grackle's definitions. As in
//! `grackle_wire.rs`: every response conchd sends decodes field by field into Grackle's message,
//! every request a Grackle client sends decodes field by field into conch's with conch's
//! extensions (field numbers >= 100) at their defaults, and the enums carry Grackle's values.
//! Every fixture value is non-default and differs from its neighbours of the same type.

use std::collections::HashMap;

use conch_proto::grackle as pb;
use prost::Message;

mod upstream {
    use std::collections::HashMap;

    #[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
    #[repr(i32)]
    pub enum AcquireOutcome {
        Invalid = 0,
        Acquired = 1,
        Unavailable = 2,
        TimedOut = 3,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
    #[repr(i32)]
    pub enum ContentionReason {
        Unspecified = 0,
        Peer = 1,
        Ancestor = 2,
        Descendant = 3,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
    #[repr(i32)]
    pub enum LockState {
        Invalid = 0,
        Unlocked = 1,
        SharedLocked = 2,
        ExclusiveLocked = 3,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LockHolder {
        #[prost(string, tag = "1")]
        pub lease_id: String,
        #[prost(int64, tag = "2")]
        pub locked_at: i64,
        #[prost(map = "string, string", tag = "3")]
        pub metadata: HashMap<String, String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Lock {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(enumeration = "LockState", tag = "2")]
        pub state: i32,
        #[prost(int64, tag = "3")]
        pub locked_at: i64,
        #[prost(message, repeated, tag = "4")]
        pub lock_holders: Vec<LockHolder>,
        #[prost(int64, tag = "5")]
        pub last_activity_at: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Lease {
        #[prost(string, tag = "1")]
        pub lease_id: String,
        #[prost(string, tag = "2")]
        pub process_id: String,
        #[prost(int64, tag = "3")]
        pub created_at: i64,
        #[prost(int64, tag = "4")]
        pub expires_at: i64,
        #[prost(map = "string, string", tag = "5")]
        pub metadata: HashMap<String, String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AcquireLockRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub lock_name: String,
        #[prost(bool, tag = "3")]
        pub exclusive: bool,
        #[prost(string, tag = "4")]
        pub lease_id: String,
        #[prost(int32, tag = "5")]
        pub timeout_seconds: i32,
        #[prost(map = "string, string", tag = "6")]
        pub metadata: HashMap<String, String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AcquireLockResponse {
        #[prost(message, optional, tag = "1")]
        pub lock: Option<Lock>,
        #[prost(enumeration = "AcquireOutcome", tag = "2")]
        pub outcome: i32,
        #[prost(enumeration = "ContentionReason", tag = "3")]
        pub reason: i32,
        #[prost(message, repeated, tag = "4")]
        pub blocking_locks: Vec<Lock>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ReleaseLockRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub lock_name: String,
        #[prost(string, tag = "3")]
        pub lease_id: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LockResponse {
        #[prost(message, optional, tag = "1")]
        pub lock: Option<Lock>,
    }

    /// GetLockRequest and DeleteLockRequest.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LockNameRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub lock_name: String,
    }

    /// ListLocksRequest and ListLockLeasesRequest.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub pagination_token: String,
        #[prost(int32, tag = "3")]
        pub limit: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListLocksResponse {
        #[prost(message, repeated, tag = "1")]
        pub locks: Vec<Lock>,
        #[prost(string, tag = "2")]
        pub next_pagination_token: String,
        #[prost(string, tag = "3")]
        pub previous_pagination_token: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CreateLockLeaseRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub process_id: String,
        #[prost(int64, tag = "3")]
        pub ttl_seconds: i64,
        #[prost(map = "string, string", tag = "4")]
        pub metadata: HashMap<String, String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RefreshLockLeaseRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub lease_id: String,
        #[prost(int64, tag = "3")]
        pub ttl_seconds: i64,
    }
    /// RevokeLockLeaseRequest and GetLockLeaseRequest.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeaseIdRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub lease_id: String,
    }
    /// Create-, Refresh- and GetLockLeaseResponse.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeaseResponse {
        #[prost(message, optional, tag = "1")]
        pub lease: Option<Lease>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListLockLeasesResponse {
        #[prost(message, repeated, tag = "1")]
        pub leases: Vec<Lease>,
        #[prost(string, tag = "2")]
        pub next_pagination_token: String,
        #[prost(string, tag = "3")]
        pub previous_pagination_token: String,
    }
}

fn decode_as<T: Message + Default>(message: &impl Message) -> T {
    T::decode(message.encode_to_vec().as_slice())
        .unwrap_or_else(|e| panic!("decode as {}: {e}", std::any::type_name::<T>()))
}

fn meta(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn holder(lease_id: &str, exclusive: bool) -> pb::LockHolder {
    pb::LockHolder {
        lease_id: lease_id.into(),
        locked_at: 1_764_600_007_000_000_021,
        metadata: meta(&[("host", "worker-3")]),
        fencing_token: 8812,
        exclusive,
    }
}

fn lock(name: &str, state: pb::LockState, holders: Vec<pb::LockHolder>) -> pb::Lock {
    pb::Lock {
        name: name.into(),
        state: state as i32,
        locked_at: 1_764_600_001_000_000_011,
        lock_holders: holders,
        last_activity_at: 1_764_600_009_000_000_012,
        waiters_count: 4,
    }
}

fn lease(lease_id: &str) -> pb::Lease {
    pb::Lease {
        lease_id: lease_id.into(),
        process_id: "worker-3/pid-4567".into(),
        created_at: 1_764_600_000_000_000_031,
        expires_at: 1_764_600_030_000_000_032,
        metadata: meta(&[("job", "nightly")]),
        ttl_seconds: 30,
    }
}

// What a Grackle client must read, field by field (every field of conch's message is named).

fn up_lock(l: &pb::Lock) -> upstream::Lock {
    let pb::Lock {
        name,
        state,
        locked_at,
        lock_holders,
        last_activity_at,
        waiters_count: _, // conch's field 100
    } = l.clone();
    upstream::Lock {
        name,
        state,
        locked_at,
        lock_holders: lock_holders
            .into_iter()
            .map(|h| {
                let pb::LockHolder {
                    lease_id,
                    locked_at,
                    metadata,
                    fencing_token: _, // conch's field 100
                    exclusive: _,     // conch's field 101
                } = h;
                upstream::LockHolder {
                    lease_id,
                    locked_at,
                    metadata,
                }
            })
            .collect(),
        last_activity_at,
    }
}

fn up_lease(l: &pb::Lease) -> upstream::Lease {
    let pb::Lease {
        lease_id,
        process_id,
        created_at,
        expires_at,
        metadata,
        ttl_seconds: _, // conch's field 100
    } = l.clone();
    upstream::Lease {
        lease_id,
        process_id,
        created_at,
        expires_at,
        metadata,
    }
}

#[test]
fn every_acquire_lock_answer_reaches_a_grackle_client_as_itself() {
    let held = lock(
        "users/1",
        pb::LockState::ExclusiveLocked,
        vec![holder("ls_a", true)],
    );
    let shared = lock(
        "users/1/profile",
        pb::LockState::SharedLocked,
        vec![holder("ls_b", false), holder("ls_c", false)],
    );
    let cases = [
        (
            pb::AcquireOutcome::Acquired,
            pb::ContentionReason::Unspecified,
            vec![],
            upstream::AcquireOutcome::Acquired,
            upstream::ContentionReason::Unspecified,
        ),
        (
            pb::AcquireOutcome::Unavailable,
            pb::ContentionReason::Peer,
            vec![],
            upstream::AcquireOutcome::Unavailable,
            upstream::ContentionReason::Peer,
        ),
        (
            pb::AcquireOutcome::TimedOut,
            pb::ContentionReason::Descendant,
            vec![shared.clone()],
            upstream::AcquireOutcome::TimedOut,
            upstream::ContentionReason::Descendant,
        ),
        (
            pb::AcquireOutcome::Unavailable,
            pb::ContentionReason::Ancestor,
            vec![held.clone(), shared.clone()],
            upstream::AcquireOutcome::Unavailable,
            upstream::ContentionReason::Ancestor,
        ),
    ];
    for (outcome, reason, blocking, up_outcome, up_reason) in cases {
        let reply = pb::AcquireLockResponse {
            lock: Some(held.clone()),
            outcome: outcome as i32,
            reason: reason as i32,
            blocking_locks: blocking.clone(),
            fencing_token: 99,
        };
        let got: upstream::AcquireLockResponse = decode_as(&reply);
        assert_eq!(got.outcome(), up_outcome, "{outcome:?}");
        assert_eq!(got.reason(), up_reason, "{reason:?}");
        assert_eq!(
            got,
            upstream::AcquireLockResponse {
                lock: Some(up_lock(&held)),
                outcome: up_outcome as i32,
                reason: up_reason as i32,
                blocking_locks: blocking.iter().map(up_lock).collect(),
            }
        );
    }
}

#[test]
fn conchs_lock_enums_are_grackles() {
    for (conch, grackle) in [
        (pb::LockState::Invalid, upstream::LockState::Invalid),
        (pb::LockState::Unlocked, upstream::LockState::Unlocked),
        (
            pb::LockState::SharedLocked,
            upstream::LockState::SharedLocked,
        ),
        (
            pb::LockState::ExclusiveLocked,
            upstream::LockState::ExclusiveLocked,
        ),
    ] {
        assert_eq!(conch as i32, grackle as i32, "{conch:?}");
    }
    assert_eq!(
        pb::LockState::SharedLocked.as_str_name(),
        "LOCK_STATE_SHARED_LOCKED"
    );
    for (conch, grackle) in [
        (
            pb::ContentionReason::Unspecified,
            upstream::ContentionReason::Unspecified,
        ),
        (pb::ContentionReason::Peer, upstream::ContentionReason::Peer),
        (
            pb::ContentionReason::Ancestor,
            upstream::ContentionReason::Ancestor,
        ),
        (
            pb::ContentionReason::Descendant,
            upstream::ContentionReason::Descendant,
        ),
    ] {
        assert_eq!(conch as i32, grackle as i32, "{conch:?}");
    }
    assert_eq!(
        pb::ContentionReason::Descendant.as_str_name(),
        "CONTENTION_REASON_DESCENDANT"
    );
}

#[test]
fn lock_and_lock_lease_responses_reach_a_grackle_client_field_by_field() {
    let l = lock(
        "a/b",
        pb::LockState::SharedLocked,
        vec![holder("ls_x", false), holder("ls_y", false)],
    );
    let got: upstream::LockResponse = decode_as(&pb::ReleaseLockResponse {
        lock: Some(l.clone()),
    });
    assert_eq!(got.lock, Some(up_lock(&l)));
    let got: upstream::LockResponse = decode_as(&pb::GetLockResponse {
        lock: Some(l.clone()),
    });
    assert_eq!(got.lock, Some(up_lock(&l)));
    let list = pb::ListLocksResponse {
        locks: vec![l.clone()],
        next_pagination_token: "f.61".into(),
        previous_pagination_token: "b.61".into(),
    };
    assert_eq!(
        decode_as::<upstream::ListLocksResponse>(&list),
        upstream::ListLocksResponse {
            locks: vec![up_lock(&l)],
            next_pagination_token: "f.61".into(),
            previous_pagination_token: "b.61".into(),
        }
    );
    assert!(pb::DeleteLockResponse {}.encode_to_vec().is_empty());
    assert!(pb::RevokeLockLeaseResponse {}.encode_to_vec().is_empty());

    let x = lease("ls_00000000000000070000000000000abc");
    for got in [
        decode_as::<upstream::LeaseResponse>(&pb::CreateLockLeaseResponse {
            lease: Some(x.clone()),
        }),
        decode_as::<upstream::LeaseResponse>(&pb::RefreshLockLeaseResponse {
            lease: Some(x.clone()),
        }),
        decode_as::<upstream::LeaseResponse>(&pb::GetLockLeaseResponse {
            lease: Some(x.clone()),
        }),
    ] {
        assert_eq!(got.lease, Some(up_lease(&x)));
    }
    let leases = pb::ListLockLeasesResponse {
        leases: vec![x.clone()],
        next_pagination_token: "f.07".into(),
        previous_pagination_token: "b.07".into(),
    };
    assert_eq!(
        decode_as::<upstream::ListLockLeasesResponse>(&leases),
        upstream::ListLockLeasesResponse {
            leases: vec![up_lease(&x)],
            next_pagination_token: "f.07".into(),
            previous_pagination_token: "b.07".into(),
        }
    );
}

#[test]
fn lock_requests_from_a_grackle_client_reach_conchd_field_by_field() {
    let acquire = upstream::AcquireLockRequest {
        namespace_name: "jobs".into(),
        lock_name: "users/123/profile".into(),
        exclusive: true,
        lease_id: "ls_1".into(),
        timeout_seconds: 17,
        metadata: meta(&[("who", "api-7")]),
    };
    assert_eq!(
        decode_as::<pb::AcquireLockRequest>(&acquire),
        pb::AcquireLockRequest {
            namespace_name: "jobs".into(),
            lock_name: "users/123/profile".into(),
            exclusive: true,
            lease_id: "ls_1".into(),
            timeout_seconds: 17,
            metadata: meta(&[("who", "api-7")]),
            timeout_ms: 0,
        }
    );
    let release = upstream::ReleaseLockRequest {
        namespace_name: "jobs".into(),
        lock_name: "users/123".into(),
        lease_id: "ls_2".into(),
    };
    assert_eq!(
        decode_as::<pb::ReleaseLockRequest>(&release),
        pb::ReleaseLockRequest {
            namespace_name: "jobs".into(),
            lock_name: "users/123".into(),
            lease_id: "ls_2".into(),
        }
    );
    let by_name = upstream::LockNameRequest {
        namespace_name: "jobs".into(),
        lock_name: "users".into(),
    };
    assert_eq!(
        decode_as::<pb::GetLockRequest>(&by_name),
        pb::GetLockRequest {
            namespace_name: "jobs".into(),
            lock_name: "users".into(),
        }
    );
    assert_eq!(
        decode_as::<pb::DeleteLockRequest>(&by_name),
        pb::DeleteLockRequest {
            namespace_name: "jobs".into(),
            lock_name: "users".into(),
        }
    );
    let list = upstream::ListRequest {
        namespace_name: "jobs".into(),
        pagination_token: "f.75".into(),
        limit: 40,
    };
    assert_eq!(
        decode_as::<pb::ListLocksRequest>(&list),
        pb::ListLocksRequest {
            namespace_name: "jobs".into(),
            pagination_token: "f.75".into(),
            limit: 40,
        }
    );
    assert_eq!(
        decode_as::<pb::ListLockLeasesRequest>(&list),
        pb::ListLockLeasesRequest {
            namespace_name: "jobs".into(),
            pagination_token: "f.75".into(),
            limit: 40,
            process_id: String::new(),
        }
    );
}

#[test]
fn lock_lease_requests_from_a_grackle_client_reach_conchd_field_by_field() {
    let create = upstream::CreateLockLeaseRequest {
        namespace_name: "jobs".into(),
        process_id: "host-1/pid-2".into(),
        ttl_seconds: 45,
        metadata: meta(&[("job", "etl")]),
    };
    assert_eq!(
        decode_as::<pb::CreateLockLeaseRequest>(&create),
        pb::CreateLockLeaseRequest {
            namespace_name: "jobs".into(),
            process_id: "host-1/pid-2".into(),
            ttl_seconds: 45,
            metadata: meta(&[("job", "etl")]),
        }
    );
    let refresh = upstream::RefreshLockLeaseRequest {
        namespace_name: "jobs".into(),
        lease_id: "ls_3".into(),
        ttl_seconds: 12,
    };
    assert_eq!(
        decode_as::<pb::RefreshLockLeaseRequest>(&refresh),
        pb::RefreshLockLeaseRequest {
            namespace_name: "jobs".into(),
            lease_id: "ls_3".into(),
            ttl_seconds: 12,
        }
    );
    let by_id = upstream::LeaseIdRequest {
        namespace_name: "jobs".into(),
        lease_id: "ls_4".into(),
    };
    assert_eq!(
        decode_as::<pb::RevokeLockLeaseRequest>(&by_id),
        pb::RevokeLockLeaseRequest {
            namespace_name: "jobs".into(),
            lease_id: "ls_4".into(),
        }
    );
    assert_eq!(
        decode_as::<pb::GetLockLeaseRequest>(&by_id),
        pb::GetLockLeaseRequest {
            namespace_name: "jobs".into(),
            lease_id: "ls_4".into(),
        }
    );
}
