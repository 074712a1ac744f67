//! The Grackle wire, checked against Grackle's own field numbers.
//!
//! `upstream` below is an independent copy of the messages of Grackle's current v1beta proto
//! (`com.evrblk.grackle.v1beta`) for every call conchd serves, written by hand from Grackle's
//! definitions and not generated from conch's `.proto`. So:
//!
//! Invariants:
//! - every response conchd sends decodes, field by field, into Grackle's message: a field at
//!   the wrong number or of the wrong type comes back different (or not at all);
//! - every request a Grackle client sends decodes, field by field, into conch's message, with
//!   conch's extension fields (numbers >= 100) left at their defaults;
//! - the acquire outcome travels at field 2 with Grackle's enum values, so `UNAVAILABLE` and
//!   `TIMED_OUT` reach a Grackle client as themselves.
//!
//! Every value in the fixtures is non-default and differs from its neighbours of the same type,
//! so two swapped fields cannot pass.

use std::collections::HashMap;

use conch_proto::grackle as pb;
use prost::Message;

/// Wait groups and barriers.
mod sync;

/// Grackle's v1beta messages for the calls conchd serves, as Grackle defines them.
mod upstream {
    use std::collections::HashMap;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Namespace {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub description: String,
        #[prost(int64, tag = "3")]
        pub created_at: i64,
        #[prost(int64, tag = "4")]
        pub updated_at: i64,
        #[prost(uint64, tag = "5")]
        pub version: u64,
        #[prost(map = "string, string", tag = "6")]
        pub metadata: HashMap<String, String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Semaphore {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub description: String,
        #[prost(int64, tag = "3")]
        pub created_at: i64,
        #[prost(int64, tag = "4")]
        pub updated_at: i64,
        #[prost(uint64, tag = "5")]
        pub version: u64,
        #[prost(uint64, tag = "6")]
        pub permits: u64,
        #[prost(uint64, tag = "7")]
        pub active_holds: u64,
        #[prost(uint64, tag = "8")]
        pub active_holders_count: u64,
        #[prost(map = "string, string", tag = "9")]
        pub metadata: HashMap<String, String>,
        #[prost(int64, tag = "10")]
        pub last_activity_at: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SemaphoreHolder {
        #[prost(string, tag = "1")]
        pub lease_id: String,
        #[prost(int64, tag = "2")]
        pub locked_at: i64,
        #[prost(uint64, tag = "3")]
        pub weight: u64,
        #[prost(map = "string, string", tag = "4")]
        pub metadata: HashMap<String, String>,
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

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum AcquireOutcome {
        Invalid = 0,
        Acquired = 1,
        Unavailable = 2,
        TimedOut = 3,
    }

    // Namespaces.

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CreateNamespaceRequest {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub description: String,
        #[prost(map = "string, string", tag = "3")]
        pub metadata: HashMap<String, String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CreateNamespaceResponse {
        #[prost(message, optional, tag = "1")]
        pub namespace: Option<Namespace>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListNamespacesRequest {
        #[prost(string, tag = "1")]
        pub pagination_token: String,
        #[prost(int32, tag = "2")]
        pub limit: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListNamespacesResponse {
        #[prost(message, repeated, tag = "1")]
        pub namespaces: Vec<Namespace>,
        #[prost(string, tag = "2")]
        pub next_pagination_token: String,
        #[prost(string, tag = "3")]
        pub previous_pagination_token: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GetNamespaceRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GetNamespaceResponse {
        #[prost(message, optional, tag = "1")]
        pub namespace: Option<Namespace>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct UpdateNamespaceRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub description: String,
        #[prost(map = "string, string", tag = "3")]
        pub metadata: HashMap<String, String>,
        #[prost(uint64, tag = "4")]
        pub expected_version: u64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct UpdateNamespaceResponse {
        #[prost(message, optional, tag = "1")]
        pub namespace: Option<Namespace>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DeleteNamespaceRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DeleteNamespaceResponse {}

    // Semaphores.

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CreateSemaphoreRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub semaphore_name: String,
        #[prost(string, tag = "3")]
        pub description: String,
        #[prost(uint64, tag = "4")]
        pub permits: u64,
        #[prost(map = "string, string", tag = "5")]
        pub metadata: HashMap<String, String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CreateSemaphoreResponse {
        #[prost(message, optional, tag = "1")]
        pub semaphore: Option<Semaphore>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListSemaphoresRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub pagination_token: String,
        #[prost(int32, tag = "3")]
        pub limit: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListSemaphoresResponse {
        #[prost(message, repeated, tag = "1")]
        pub semaphores: Vec<Semaphore>,
        #[prost(string, tag = "2")]
        pub next_pagination_token: String,
        #[prost(string, tag = "3")]
        pub previous_pagination_token: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GetSemaphoreRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub semaphore_name: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GetSemaphoreResponse {
        #[prost(message, optional, tag = "1")]
        pub semaphore: Option<Semaphore>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AcquireSemaphoreRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub semaphore_name: String,
        #[prost(string, tag = "3")]
        pub lease_id: String,
        #[prost(uint64, tag = "4")]
        pub weight: u64,
        #[prost(int32, tag = "5")]
        pub timeout_seconds: i32,
        #[prost(map = "string, string", tag = "6")]
        pub metadata: HashMap<String, String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AcquireSemaphoreResponse {
        #[prost(message, optional, tag = "1")]
        pub semaphore: Option<Semaphore>,
        #[prost(enumeration = "AcquireOutcome", tag = "2")]
        pub outcome: i32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ReleaseSemaphoreRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub semaphore_name: String,
        #[prost(string, tag = "3")]
        pub lease_id: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ReleaseSemaphoreResponse {
        #[prost(message, optional, tag = "1")]
        pub semaphore: Option<Semaphore>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct UpdateSemaphoreRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub semaphore_name: String,
        #[prost(string, tag = "3")]
        pub description: String,
        #[prost(uint64, tag = "4")]
        pub permits: u64,
        #[prost(map = "string, string", tag = "5")]
        pub metadata: HashMap<String, String>,
        #[prost(uint64, tag = "6")]
        pub expected_version: u64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct UpdateSemaphoreResponse {
        #[prost(message, optional, tag = "1")]
        pub semaphore: Option<Semaphore>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DeleteSemaphoreRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub semaphore_name: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DeleteSemaphoreResponse {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListSemaphoreHoldersRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub semaphore_name: String,
        #[prost(string, tag = "3")]
        pub pagination_token: String,
        #[prost(int32, tag = "4")]
        pub limit: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListSemaphoreHoldersResponse {
        #[prost(message, repeated, tag = "1")]
        pub holders: Vec<SemaphoreHolder>,
        #[prost(string, tag = "2")]
        pub next_pagination_token: String,
        #[prost(string, tag = "3")]
        pub previous_pagination_token: String,
    }

    // Leases.

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CreateSemaphoreLeaseRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub process_id: String,
        #[prost(uint64, tag = "3")]
        pub ttl_seconds: u64,
        #[prost(map = "string, string", tag = "4")]
        pub metadata: HashMap<String, String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CreateSemaphoreLeaseResponse {
        #[prost(message, optional, tag = "1")]
        pub lease: Option<Lease>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RevokeSemaphoreLeaseRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub lease_id: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RevokeSemaphoreLeaseResponse {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RefreshSemaphoreLeaseRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub lease_id: String,
        #[prost(uint64, tag = "3")]
        pub ttl_seconds: u64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RefreshSemaphoreLeaseResponse {
        #[prost(message, optional, tag = "1")]
        pub lease: Option<Lease>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListSemaphoreLeasesRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub pagination_token: String,
        #[prost(int32, tag = "3")]
        pub limit: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListSemaphoreLeasesResponse {
        #[prost(message, repeated, tag = "1")]
        pub leases: Vec<Lease>,
        #[prost(string, tag = "2")]
        pub next_pagination_token: String,
        #[prost(string, tag = "3")]
        pub previous_pagination_token: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GetSemaphoreLeaseRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub lease_id: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GetSemaphoreLeaseResponse {
        #[prost(message, optional, tag = "1")]
        pub lease: Option<Lease>,
    }
}

/// `message` on the wire, read back as `T`.
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

// Fixtures: conch's messages as conchd fills them.

fn namespace(name: &str) -> pb::Namespace {
    pb::Namespace {
        name: name.into(),
        description: "batch jobs".into(),
        created_at: 1_764_600_000_000_000_001,
        updated_at: 1_764_600_005_000_000_002,
        version: 3,
        metadata: meta(&[("team", "data"), ("tier", "prod")]),
    }
}

fn semaphore(name: &str) -> pb::Semaphore {
    pb::Semaphore {
        name: name.into(),
        description: "one migration at a time".into(),
        created_at: 1_764_600_000_000_000_011,
        updated_at: 1_764_600_005_000_000_012,
        version: 4,
        permits: 9,
        active_holds: 7,
        active_holders_count: 2,
        metadata: meta(&[("owner", "dba")]),
        last_activity_at: 1_764_600_009_000_000_013,
        waiters_count: 5,
        max_hold_ms: 7_200_000,
    }
}

fn holder(lease_id: &str, weight: u64) -> pb::SemaphoreHolder {
    pb::SemaphoreHolder {
        lease_id: lease_id.into(),
        locked_at: 1_764_600_007_000_000_021,
        weight,
        metadata: meta(&[("host", "worker-3")]),
        fencing_token: 8812,
        hold_ends_at: 1_764_607_207_000_000_021,
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

// What a Grackle client must read from them, field by field. Every field of conch's message is
// named, so a new one has to be placed here on purpose.

fn up_namespace(n: &pb::Namespace) -> upstream::Namespace {
    let pb::Namespace {
        name,
        description,
        created_at,
        updated_at,
        version,
        metadata,
    } = n.clone();
    upstream::Namespace {
        name,
        description,
        created_at,
        updated_at,
        version,
        metadata,
    }
}

fn up_semaphore(s: &pb::Semaphore) -> upstream::Semaphore {
    let pb::Semaphore {
        name,
        description,
        created_at,
        updated_at,
        version,
        permits,
        active_holds,
        active_holders_count,
        metadata,
        last_activity_at,
        waiters_count: _, // conch's field 100: not Grackle's
        max_hold_ms: _,   // conch's field 101
    } = s.clone();
    upstream::Semaphore {
        name,
        description,
        created_at,
        updated_at,
        version,
        permits,
        active_holds,
        active_holders_count,
        metadata,
        last_activity_at,
    }
}

fn up_holder(h: &pb::SemaphoreHolder) -> upstream::SemaphoreHolder {
    let pb::SemaphoreHolder {
        lease_id,
        locked_at,
        weight,
        metadata,
        fencing_token: _, // conch's field 100
        hold_ends_at: _,  // conch's field 101
    } = h.clone();
    upstream::SemaphoreHolder {
        lease_id,
        locked_at,
        weight,
        metadata,
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
fn namespace_responses_reach_a_grackle_client_field_by_field() {
    let ns = namespace("jobs");
    let expected = Some(up_namespace(&ns));

    let create = pb::CreateNamespaceResponse {
        namespace: Some(ns.clone()),
    };
    let got: upstream::CreateNamespaceResponse = decode_as(&create);
    assert_eq!(got.namespace, expected);

    let get = pb::GetNamespaceResponse {
        namespace: Some(ns.clone()),
    };
    let got: upstream::GetNamespaceResponse = decode_as(&get);
    assert_eq!(got.namespace, expected);

    let update = pb::UpdateNamespaceResponse {
        namespace: Some(ns.clone()),
    };
    let got: upstream::UpdateNamespaceResponse = decode_as(&update);
    assert_eq!(got.namespace, expected);

    let list = pb::ListNamespacesResponse {
        namespaces: vec![ns.clone(), namespace("ci")],
        next_pagination_token: "next-c2k".into(),
        previous_pagination_token: "prev-a1j".into(),
    };
    let got: upstream::ListNamespacesResponse = decode_as(&list);
    assert_eq!(
        got,
        upstream::ListNamespacesResponse {
            namespaces: list.namespaces.iter().map(up_namespace).collect(),
            next_pagination_token: "next-c2k".into(),
            previous_pagination_token: "prev-a1j".into(),
        }
    );

    assert!(pb::DeleteNamespaceResponse {}.encode_to_vec().is_empty());
    let _: upstream::DeleteNamespaceResponse = decode_as(&pb::DeleteNamespaceResponse {});
}

#[test]
fn semaphore_responses_reach_a_grackle_client_field_by_field() {
    let sem = semaphore("db-migrations");
    let expected = Some(up_semaphore(&sem));

    let create = pb::CreateSemaphoreResponse {
        semaphore: Some(sem.clone()),
    };
    let got: upstream::CreateSemaphoreResponse = decode_as(&create);
    assert_eq!(got.semaphore, expected);

    let get = pb::GetSemaphoreResponse {
        semaphore: Some(sem.clone()),
    };
    let got: upstream::GetSemaphoreResponse = decode_as(&get);
    assert_eq!(got.semaphore, expected);

    let release = pb::ReleaseSemaphoreResponse {
        semaphore: Some(sem.clone()),
    };
    let got: upstream::ReleaseSemaphoreResponse = decode_as(&release);
    assert_eq!(got.semaphore, expected);

    let update = pb::UpdateSemaphoreResponse {
        semaphore: Some(sem.clone()),
    };
    let got: upstream::UpdateSemaphoreResponse = decode_as(&update);
    assert_eq!(got.semaphore, expected);

    let list = pb::ListSemaphoresResponse {
        semaphores: vec![sem.clone(), semaphore("reports")],
        next_pagination_token: "next-s9".into(),
        previous_pagination_token: "prev-s7".into(),
    };
    let got: upstream::ListSemaphoresResponse = decode_as(&list);
    assert_eq!(
        got,
        upstream::ListSemaphoresResponse {
            semaphores: list.semaphores.iter().map(up_semaphore).collect(),
            next_pagination_token: "next-s9".into(),
            previous_pagination_token: "prev-s7".into(),
        }
    );

    let holders = pb::ListSemaphoreHoldersResponse {
        holders: vec![
            holder("ls_00000000000000011a2b3c4d", 3),
            holder("ls_00000000000000021a2b3c4d", 4),
        ],
        next_pagination_token: "next-h2".into(),
        previous_pagination_token: "prev-h1".into(),
    };
    let got: upstream::ListSemaphoreHoldersResponse = decode_as(&holders);
    assert_eq!(
        got,
        upstream::ListSemaphoreHoldersResponse {
            holders: holders.holders.iter().map(up_holder).collect(),
            next_pagination_token: "next-h2".into(),
            previous_pagination_token: "prev-h1".into(),
        }
    );

    assert!(pb::DeleteSemaphoreResponse {}.encode_to_vec().is_empty());
    let _: upstream::DeleteSemaphoreResponse = decode_as(&pb::DeleteSemaphoreResponse {});
}

#[test]
fn every_acquire_outcome_reaches_a_grackle_client_as_itself() {
    let cases = [
        (
            pb::AcquireOutcome::Acquired,
            8813,
            upstream::AcquireOutcome::Acquired,
        ),
        (
            pb::AcquireOutcome::Unavailable,
            0,
            upstream::AcquireOutcome::Unavailable,
        ),
        (
            pb::AcquireOutcome::TimedOut,
            0,
            upstream::AcquireOutcome::TimedOut,
        ),
    ];
    for (outcome, fencing_token, grackle) in cases {
        let sem = semaphore("db-migrations");
        let reply = pb::AcquireSemaphoreResponse {
            semaphore: Some(sem.clone()),
            outcome: outcome as i32,
            fencing_token,
            hold_ms: if fencing_token == 0 { 0 } else { 3_600_000 },
        };
        let got: upstream::AcquireSemaphoreResponse = decode_as(&reply);
        assert_eq!(got.outcome(), grackle, "{outcome:?}");
        assert_eq!(
            got,
            upstream::AcquireSemaphoreResponse {
                semaphore: Some(up_semaphore(&sem)),
                outcome: grackle as i32,
            },
            "{outcome:?}"
        );
    }
}

#[test]
fn conchs_acquire_outcomes_are_grackles() {
    for (conch, grackle) in [
        (
            pb::AcquireOutcome::Invalid,
            upstream::AcquireOutcome::Invalid,
        ),
        (
            pb::AcquireOutcome::Acquired,
            upstream::AcquireOutcome::Acquired,
        ),
        (
            pb::AcquireOutcome::Unavailable,
            upstream::AcquireOutcome::Unavailable,
        ),
        (
            pb::AcquireOutcome::TimedOut,
            upstream::AcquireOutcome::TimedOut,
        ),
    ] {
        assert_eq!(conch as i32, grackle as i32, "{conch:?}");
        assert_eq!(conch.as_str_name(), grackle_name(grackle));
    }
}

/// The names Grackle's proto gives its outcomes.
fn grackle_name(outcome: upstream::AcquireOutcome) -> &'static str {
    match outcome {
        upstream::AcquireOutcome::Invalid => "ACQUIRE_OUTCOME_INVALID",
        upstream::AcquireOutcome::Acquired => "ACQUIRE_OUTCOME_ACQUIRED",
        upstream::AcquireOutcome::Unavailable => "ACQUIRE_OUTCOME_UNAVAILABLE",
        upstream::AcquireOutcome::TimedOut => "ACQUIRE_OUTCOME_TIMED_OUT",
    }
}

#[test]
fn lease_responses_reach_a_grackle_client_field_by_field() {
    let l = lease("ls_00000000000000011a2b3c4d");
    let expected = Some(up_lease(&l));

    let create = pb::CreateSemaphoreLeaseResponse {
        lease: Some(l.clone()),
    };
    let got: upstream::CreateSemaphoreLeaseResponse = decode_as(&create);
    assert_eq!(got.lease, expected);

    let refresh = pb::RefreshSemaphoreLeaseResponse {
        lease: Some(l.clone()),
    };
    let got: upstream::RefreshSemaphoreLeaseResponse = decode_as(&refresh);
    assert_eq!(got.lease, expected);

    let get = pb::GetSemaphoreLeaseResponse {
        lease: Some(l.clone()),
    };
    let got: upstream::GetSemaphoreLeaseResponse = decode_as(&get);
    assert_eq!(got.lease, expected);

    let list = pb::ListSemaphoreLeasesResponse {
        leases: vec![l.clone(), lease("ls_00000000000000021a2b3c4d")],
        next_pagination_token: "next-l4".into(),
        previous_pagination_token: "prev-l3".into(),
    };
    let got: upstream::ListSemaphoreLeasesResponse = decode_as(&list);
    assert_eq!(
        got,
        upstream::ListSemaphoreLeasesResponse {
            leases: list.leases.iter().map(up_lease).collect(),
            next_pagination_token: "next-l4".into(),
            previous_pagination_token: "prev-l3".into(),
        }
    );

    assert!(
        pb::RevokeSemaphoreLeaseResponse {}
            .encode_to_vec()
            .is_empty()
    );
    let _: upstream::RevokeSemaphoreLeaseResponse = decode_as(&pb::RevokeSemaphoreLeaseResponse {});
}

// Requests: what a Grackle client sends, read by conchd. conch's extension fields stay at their
// defaults, which conchd reads as "not asked for".

#[test]
fn namespace_requests_from_a_grackle_client_reach_conchd_field_by_field() {
    let create = upstream::CreateNamespaceRequest {
        name: "jobs".into(),
        description: "batch jobs".into(),
        metadata: meta(&[("team", "data")]),
    };
    assert_eq!(
        decode_as::<pb::CreateNamespaceRequest>(&create),
        pb::CreateNamespaceRequest {
            name: "jobs".into(),
            description: "batch jobs".into(),
            metadata: meta(&[("team", "data")]),
        }
    );

    let list = upstream::ListNamespacesRequest {
        pagination_token: "next-c2k".into(),
        limit: 25,
    };
    assert_eq!(
        decode_as::<pb::ListNamespacesRequest>(&list),
        pb::ListNamespacesRequest {
            pagination_token: "next-c2k".into(),
            limit: 25,
        }
    );

    let get = upstream::GetNamespaceRequest {
        namespace_name: "jobs".into(),
    };
    assert_eq!(
        decode_as::<pb::GetNamespaceRequest>(&get),
        pb::GetNamespaceRequest {
            namespace_name: "jobs".into(),
        }
    );

    let update = upstream::UpdateNamespaceRequest {
        namespace_name: "jobs".into(),
        description: "nightly batch jobs".into(),
        metadata: meta(&[("team", "platform")]),
        expected_version: 3,
    };
    assert_eq!(
        decode_as::<pb::UpdateNamespaceRequest>(&update),
        pb::UpdateNamespaceRequest {
            namespace_name: "jobs".into(),
            description: "nightly batch jobs".into(),
            metadata: meta(&[("team", "platform")]),
            expected_version: 3,
        }
    );

    let delete = upstream::DeleteNamespaceRequest {
        namespace_name: "jobs".into(),
    };
    assert_eq!(
        decode_as::<pb::DeleteNamespaceRequest>(&delete),
        pb::DeleteNamespaceRequest {
            namespace_name: "jobs".into(),
        }
    );
}

#[test]
fn semaphore_requests_from_a_grackle_client_reach_conchd_field_by_field() {
    let create = upstream::CreateSemaphoreRequest {
        namespace_name: "jobs".into(),
        semaphore_name: "db-migrations".into(),
        description: "one migration at a time".into(),
        permits: 9,
        metadata: meta(&[("owner", "dba")]),
    };
    assert_eq!(
        decode_as::<pb::CreateSemaphoreRequest>(&create),
        pb::CreateSemaphoreRequest {
            namespace_name: "jobs".into(),
            semaphore_name: "db-migrations".into(),
            description: "one migration at a time".into(),
            permits: 9,
            metadata: meta(&[("owner", "dba")]),
            max_hold_ms: 0,
        }
    );

    let list = upstream::ListSemaphoresRequest {
        namespace_name: "jobs".into(),
        pagination_token: "next-s9".into(),
        limit: 50,
    };
    assert_eq!(
        decode_as::<pb::ListSemaphoresRequest>(&list),
        pb::ListSemaphoresRequest {
            namespace_name: "jobs".into(),
            pagination_token: "next-s9".into(),
            limit: 50,
        }
    );

    let get = upstream::GetSemaphoreRequest {
        namespace_name: "jobs".into(),
        semaphore_name: "db-migrations".into(),
    };
    assert_eq!(
        decode_as::<pb::GetSemaphoreRequest>(&get),
        pb::GetSemaphoreRequest {
            namespace_name: "jobs".into(),
            semaphore_name: "db-migrations".into(),
        }
    );

    let acquire = upstream::AcquireSemaphoreRequest {
        namespace_name: "jobs".into(),
        semaphore_name: "db-migrations".into(),
        lease_id: "ls_00000000000000011a2b3c4d".into(),
        weight: 3,
        timeout_seconds: 30,
        metadata: meta(&[("host", "worker-3")]),
    };
    assert_eq!(
        decode_as::<pb::AcquireSemaphoreRequest>(&acquire),
        pb::AcquireSemaphoreRequest {
            namespace_name: "jobs".into(),
            semaphore_name: "db-migrations".into(),
            lease_id: "ls_00000000000000011a2b3c4d".into(),
            weight: 3,
            timeout_seconds: 30,
            metadata: meta(&[("host", "worker-3")]),
            timeout_ms: 0,
            max_hold_ms: 0,
        }
    );

    let release = upstream::ReleaseSemaphoreRequest {
        namespace_name: "jobs".into(),
        semaphore_name: "db-migrations".into(),
        lease_id: "ls_00000000000000011a2b3c4d".into(),
    };
    assert_eq!(
        decode_as::<pb::ReleaseSemaphoreRequest>(&release),
        pb::ReleaseSemaphoreRequest {
            namespace_name: "jobs".into(),
            semaphore_name: "db-migrations".into(),
            lease_id: "ls_00000000000000011a2b3c4d".into(),
        }
    );

    let update = upstream::UpdateSemaphoreRequest {
        namespace_name: "jobs".into(),
        semaphore_name: "db-migrations".into(),
        description: "two migrations at a time".into(),
        permits: 12,
        metadata: meta(&[("owner", "platform")]),
        expected_version: 4,
    };
    assert_eq!(
        decode_as::<pb::UpdateSemaphoreRequest>(&update),
        pb::UpdateSemaphoreRequest {
            namespace_name: "jobs".into(),
            semaphore_name: "db-migrations".into(),
            description: "two migrations at a time".into(),
            permits: 12,
            metadata: meta(&[("owner", "platform")]),
            expected_version: 4,
            // A Grackle client's update leaves the hold limit as it is.
            max_hold_ms: None,
        }
    );

    let delete = upstream::DeleteSemaphoreRequest {
        namespace_name: "jobs".into(),
        semaphore_name: "db-migrations".into(),
    };
    assert_eq!(
        decode_as::<pb::DeleteSemaphoreRequest>(&delete),
        pb::DeleteSemaphoreRequest {
            namespace_name: "jobs".into(),
            semaphore_name: "db-migrations".into(),
        }
    );

    let holders = upstream::ListSemaphoreHoldersRequest {
        namespace_name: "jobs".into(),
        semaphore_name: "db-migrations".into(),
        pagination_token: "next-h2".into(),
        limit: 10,
    };
    assert_eq!(
        decode_as::<pb::ListSemaphoreHoldersRequest>(&holders),
        pb::ListSemaphoreHoldersRequest {
            namespace_name: "jobs".into(),
            semaphore_name: "db-migrations".into(),
            pagination_token: "next-h2".into(),
            limit: 10,
        }
    );
}

#[test]
fn lease_requests_from_a_grackle_client_reach_conchd_field_by_field() {
    let create = upstream::CreateSemaphoreLeaseRequest {
        namespace_name: "jobs".into(),
        process_id: "worker-3/pid-4567".into(),
        ttl_seconds: 30,
        metadata: meta(&[("job", "nightly")]),
    };
    assert_eq!(
        decode_as::<pb::CreateSemaphoreLeaseRequest>(&create),
        pb::CreateSemaphoreLeaseRequest {
            namespace_name: "jobs".into(),
            process_id: "worker-3/pid-4567".into(),
            ttl_seconds: 30,
            metadata: meta(&[("job", "nightly")]),
        }
    );

    let revoke = upstream::RevokeSemaphoreLeaseRequest {
        namespace_name: "jobs".into(),
        lease_id: "ls_00000000000000011a2b3c4d".into(),
    };
    assert_eq!(
        decode_as::<pb::RevokeSemaphoreLeaseRequest>(&revoke),
        pb::RevokeSemaphoreLeaseRequest {
            namespace_name: "jobs".into(),
            lease_id: "ls_00000000000000011a2b3c4d".into(),
        }
    );

    let refresh = upstream::RefreshSemaphoreLeaseRequest {
        namespace_name: "jobs".into(),
        lease_id: "ls_00000000000000011a2b3c4d".into(),
        ttl_seconds: 45,
    };
    assert_eq!(
        decode_as::<pb::RefreshSemaphoreLeaseRequest>(&refresh),
        pb::RefreshSemaphoreLeaseRequest {
            namespace_name: "jobs".into(),
            lease_id: "ls_00000000000000011a2b3c4d".into(),
            ttl_seconds: 45,
        }
    );

    let list = upstream::ListSemaphoreLeasesRequest {
        namespace_name: "jobs".into(),
        pagination_token: "next-l4".into(),
        limit: 100,
    };
    assert_eq!(
        decode_as::<pb::ListSemaphoreLeasesRequest>(&list),
        pb::ListSemaphoreLeasesRequest {
            namespace_name: "jobs".into(),
            pagination_token: "next-l4".into(),
            limit: 100,
            process_id: String::new(),
        }
    );

    let get = upstream::GetSemaphoreLeaseRequest {
        namespace_name: "jobs".into(),
        lease_id: "ls_00000000000000011a2b3c4d".into(),
    };
    assert_eq!(
        decode_as::<pb::GetSemaphoreLeaseRequest>(&get),
        pb::GetSemaphoreLeaseRequest {
            namespace_name: "jobs".into(),
            lease_id: "ls_00000000000000011a2b3c4d".into(),
        }
    );
}
