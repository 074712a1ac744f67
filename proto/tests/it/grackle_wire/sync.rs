//! Wait groups and barriers on the Grackle wire: Grackle's messages for the 16 calls, written by
//! hand from Grackle's current v1beta proto (not generated from conch's), and the same checks
//! as for semaphores: every response decodes field by field into Grackle's message, every
//! request a Grackle client sends decodes field by field into conch's, and the wait outcomes
//! and statuses travel as Grackle's enum values. `CreateBarrierRequest` numbers its last two
//! fields 8 and 9, as Grackle does.

use std::collections::HashMap;

use conch_proto::grackle as pb;

use super::{decode_as, meta};

mod upstream {
    use std::collections::HashMap;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WaitGroup {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub description: String,
        #[prost(int64, tag = "3")]
        pub created_at: i64,
        #[prost(int64, tag = "4")]
        pub updated_at: i64,
        #[prost(int64, tag = "5")]
        pub version: i64,
        #[prost(int64, tag = "6")]
        pub expires_at: i64,
        #[prost(int64, tag = "7")]
        pub counter: i64,
        #[prost(int64, tag = "8")]
        pub completed_jobs: i64,
        #[prost(map = "string, string", tag = "9")]
        pub metadata: HashMap<String, String>,
        #[prost(enumeration = "WaitGroupStatus", tag = "10")]
        pub status: i32,
        #[prost(int64, tag = "11")]
        pub delete_after_finished_seconds: i64,
        #[prost(int64, tag = "12")]
        pub finished_at: i64,
        #[prost(int64, tag = "13")]
        pub last_activity_at: i64,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum WaitGroupStatus {
        Invalid = 0,
        Active = 1,
        Expired = 2,
        Completed = 3,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum WaitGroupWaitOutcome {
        Invalid = 0,
        Completed = 1,
        Expired = 2,
        TimedOut = 3,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WaitGroupJob {
        #[prost(string, tag = "1")]
        pub job_id: String,
        #[prost(int64, tag = "2")]
        pub completed_at: i64,
        #[prost(map = "string, string", tag = "3")]
        pub metadata: HashMap<String, String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CreateWaitGroupRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub wait_group_name: String,
        #[prost(string, tag = "3")]
        pub description: String,
        #[prost(int64, tag = "4")]
        pub counter: i64,
        #[prost(int64, tag = "5")]
        pub expires_at: i64,
        #[prost(map = "string, string", tag = "6")]
        pub metadata: HashMap<String, String>,
        #[prost(int64, tag = "7")]
        pub delete_after_finished_seconds: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CreateWaitGroupResponse {
        #[prost(message, optional, tag = "1")]
        pub wait_group: Option<WaitGroup>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct UpdateWaitGroupRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub wait_group_name: String,
        #[prost(string, tag = "3")]
        pub description: String,
        #[prost(int64, tag = "4")]
        pub counter: i64,
        #[prost(int64, tag = "5")]
        pub expires_at: i64,
        #[prost(map = "string, string", tag = "6")]
        pub metadata: HashMap<String, String>,
        #[prost(int64, tag = "7")]
        pub expected_version: i64,
        #[prost(int64, tag = "8")]
        pub delete_after_finished_seconds: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct UpdateWaitGroupResponse {
        #[prost(message, optional, tag = "1")]
        pub wait_group: Option<WaitGroup>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListWaitGroupsRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub pagination_token: String,
        #[prost(int32, tag = "3")]
        pub limit: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListWaitGroupsResponse {
        #[prost(message, repeated, tag = "1")]
        pub wait_groups: Vec<WaitGroup>,
        #[prost(string, tag = "2")]
        pub next_pagination_token: String,
        #[prost(string, tag = "3")]
        pub previous_pagination_token: String,
    }

    /// Get, Delete: the same two fields.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WaitGroupRef {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub wait_group_name: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GetWaitGroupResponse {
        #[prost(message, optional, tag = "1")]
        pub wait_group: Option<WaitGroup>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CompleteJobRequest {
        #[prost(string, tag = "1")]
        pub job_id: String,
        #[prost(map = "string, string", tag = "2")]
        pub metadata: HashMap<String, String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CompleteJobsFromWaitGroupRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub wait_group_name: String,
        #[prost(message, repeated, tag = "3")]
        pub jobs: Vec<CompleteJobRequest>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CompleteJobsFromWaitGroupResponse {
        #[prost(message, optional, tag = "1")]
        pub wait_group: Option<WaitGroup>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListWaitGroupCompletedJobsRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub wait_group_name: String,
        #[prost(string, tag = "3")]
        pub pagination_token: String,
        #[prost(int32, tag = "4")]
        pub limit: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListWaitGroupCompletedJobsResponse {
        #[prost(message, repeated, tag = "1")]
        pub jobs: Vec<WaitGroupJob>,
        #[prost(string, tag = "2")]
        pub next_pagination_token: String,
        #[prost(string, tag = "3")]
        pub previous_pagination_token: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WaitForWaitGroupRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub wait_group_name: String,
        #[prost(int32, tag = "3")]
        pub timeout_seconds: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WaitForWaitGroupResponse {
        #[prost(message, optional, tag = "1")]
        pub wait_group: Option<WaitGroup>,
        #[prost(enumeration = "WaitGroupWaitOutcome", tag = "2")]
        pub outcome: i32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Barrier {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub description: String,
        #[prost(int64, tag = "3")]
        pub expected_processes: i64,
        #[prost(int64, tag = "4")]
        pub arrived_processes: i64,
        #[prost(int64, tag = "5")]
        pub generation: i64,
        #[prost(int64, tag = "6")]
        pub created_at: i64,
        #[prost(int64, tag = "7")]
        pub updated_at: i64,
        #[prost(int64, tag = "8")]
        pub version: i64,
        #[prost(map = "string, string", tag = "9")]
        pub metadata: HashMap<String, String>,
        #[prost(int64, tag = "10")]
        pub last_activity_at: i64,
        #[prost(int64, tag = "11")]
        pub delete_inactive_after_seconds: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct BarrierParticipant {
        #[prost(string, tag = "1")]
        pub process_id: String,
        #[prost(int64, tag = "2")]
        pub arrived_at: i64,
        #[prost(map = "string, string", tag = "3")]
        pub metadata: HashMap<String, String>,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum BarrierWaitOutcome {
        Invalid = 0,
        Tripped = 1,
        TimedOut = 2,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CreateBarrierRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub barrier_name: String,
        #[prost(string, tag = "3")]
        pub description: String,
        #[prost(int64, tag = "4")]
        pub expected_processes: i64,
        #[prost(int64, tag = "8")]
        pub delete_inactive_after_seconds: i64,
        #[prost(map = "string, string", tag = "9")]
        pub metadata: HashMap<String, String>,
    }

    /// Create, Get, Update responses: the barrier at field 1.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct BarrierResponse {
        #[prost(message, optional, tag = "1")]
        pub barrier: Option<Barrier>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListBarriersRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub pagination_token: String,
        #[prost(int32, tag = "3")]
        pub limit: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListBarriersResponse {
        #[prost(message, repeated, tag = "1")]
        pub barriers: Vec<Barrier>,
        #[prost(string, tag = "2")]
        pub next_pagination_token: String,
        #[prost(string, tag = "3")]
        pub previous_pagination_token: String,
    }

    /// Get, Delete: the same two fields.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct BarrierRef {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub barrier_name: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct UpdateBarrierRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub barrier_name: String,
        #[prost(string, tag = "3")]
        pub description: String,
        #[prost(int64, tag = "4")]
        pub expected_processes: i64,
        #[prost(map = "string, string", tag = "5")]
        pub metadata: HashMap<String, String>,
        #[prost(int64, tag = "6")]
        pub expected_version: i64,
        #[prost(int64, tag = "7")]
        pub delete_inactive_after_seconds: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ArriveAtBarrierRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub barrier_name: String,
        #[prost(string, tag = "3")]
        pub process_id: String,
        #[prost(int64, tag = "4")]
        pub expected_generation: i64,
        #[prost(map = "string, string", tag = "5")]
        pub metadata: HashMap<String, String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ArriveAtBarrierResponse {
        #[prost(message, optional, tag = "1")]
        pub barrier: Option<Barrier>,
        #[prost(bool, tag = "2")]
        pub all_arrived: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WaitAtBarrierRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub barrier_name: String,
        #[prost(int64, tag = "3")]
        pub expected_generation: i64,
        #[prost(int32, tag = "4")]
        pub timeout_seconds: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WaitAtBarrierResponse {
        #[prost(message, optional, tag = "1")]
        pub barrier: Option<Barrier>,
        #[prost(enumeration = "BarrierWaitOutcome", tag = "2")]
        pub outcome: i32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListBarrierParticipantsRequest {
        #[prost(string, tag = "1")]
        pub namespace_name: String,
        #[prost(string, tag = "2")]
        pub barrier_name: String,
        #[prost(int64, tag = "3")]
        pub generation: i64,
        #[prost(string, tag = "4")]
        pub pagination_token: String,
        #[prost(int32, tag = "5")]
        pub limit: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListBarrierParticipantsResponse {
        #[prost(message, repeated, tag = "1")]
        pub participants: Vec<BarrierParticipant>,
        #[prost(string, tag = "2")]
        pub next_pagination_token: String,
        #[prost(string, tag = "3")]
        pub previous_pagination_token: String,
    }

    /// DeleteWaitGroupResponse and DeleteBarrierResponse: no fields.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Empty {}
}

fn wait_group(name: &str, status: pb::WaitGroupStatus) -> pb::WaitGroup {
    pb::WaitGroup {
        name: name.into(),
        description: "nightly shards".into(),
        created_at: 1_764_600_000_000_000_041,
        updated_at: 1_764_600_005_000_000_042,
        version: 6,
        expires_at: 1_764_686_400_000_000_043,
        counter: 110,
        completed_jobs: 73,
        metadata: meta(&[("team", "data")]),
        status: status as i32,
        delete_after_finished_seconds: 3600,
        finished_at: 1_764_600_009_000_000_044,
        last_activity_at: 1_764_600_008_000_000_045,
    }
}

fn up_wait_group(w: &pb::WaitGroup) -> upstream::WaitGroup {
    let pb::WaitGroup {
        name,
        description,
        created_at,
        updated_at,
        version,
        expires_at,
        counter,
        completed_jobs,
        metadata,
        status,
        delete_after_finished_seconds,
        finished_at,
        last_activity_at,
    } = w.clone();
    upstream::WaitGroup {
        name,
        description,
        created_at,
        updated_at,
        version,
        expires_at,
        counter,
        completed_jobs,
        metadata,
        status,
        delete_after_finished_seconds,
        finished_at,
        last_activity_at,
    }
}

fn barrier(name: &str) -> pb::Barrier {
    pb::Barrier {
        name: name.into(),
        description: "end of map phase".into(),
        expected_processes: 64,
        arrived_processes: 17,
        generation: 12,
        created_at: 1_764_600_000_000_000_051,
        updated_at: 1_764_600_005_000_000_052,
        version: 5,
        metadata: meta(&[("phase", "map")]),
        last_activity_at: 1_764_600_008_000_000_053,
        delete_inactive_after_seconds: 900,
    }
}

fn up_barrier(b: &pb::Barrier) -> upstream::Barrier {
    let pb::Barrier {
        name,
        description,
        expected_processes,
        arrived_processes,
        generation,
        created_at,
        updated_at,
        version,
        metadata,
        last_activity_at,
        delete_inactive_after_seconds,
    } = b.clone();
    upstream::Barrier {
        name,
        description,
        expected_processes,
        arrived_processes,
        generation,
        created_at,
        updated_at,
        version,
        metadata,
        last_activity_at,
        delete_inactive_after_seconds,
    }
}

#[test]
fn wait_group_responses_reach_a_grackle_client_field_by_field() {
    for (status, grackle) in [
        (
            pb::WaitGroupStatus::Active,
            upstream::WaitGroupStatus::Active,
        ),
        (
            pb::WaitGroupStatus::Expired,
            upstream::WaitGroupStatus::Expired,
        ),
        (
            pb::WaitGroupStatus::Completed,
            upstream::WaitGroupStatus::Completed,
        ),
    ] {
        let wg = wait_group("batch", status);
        let expected = Some(up_wait_group(&wg));
        assert_eq!(expected.as_ref().map(|w| w.status), Some(grackle as i32));
        let got: upstream::CreateWaitGroupResponse = decode_as(&pb::CreateWaitGroupResponse {
            wait_group: Some(wg.clone()),
        });
        assert_eq!(got.wait_group, expected);
        let got: upstream::UpdateWaitGroupResponse = decode_as(&pb::UpdateWaitGroupResponse {
            wait_group: Some(wg.clone()),
        });
        assert_eq!(got.wait_group, expected);
        let got: upstream::GetWaitGroupResponse = decode_as(&pb::GetWaitGroupResponse {
            wait_group: Some(wg.clone()),
        });
        assert_eq!(got.wait_group, expected);
        let got: upstream::CompleteJobsFromWaitGroupResponse =
            decode_as(&pb::CompleteJobsFromWaitGroupResponse {
                wait_group: Some(wg.clone()),
            });
        assert_eq!(got.wait_group, expected);
    }
    let list = pb::ListWaitGroupsResponse {
        wait_groups: vec![
            wait_group("a", pb::WaitGroupStatus::Active),
            wait_group("b", pb::WaitGroupStatus::Completed),
        ],
        next_pagination_token: "next-w1".into(),
        previous_pagination_token: "prev-w0".into(),
    };
    let got: upstream::ListWaitGroupsResponse = decode_as(&list);
    assert_eq!(
        got,
        upstream::ListWaitGroupsResponse {
            wait_groups: list.wait_groups.iter().map(up_wait_group).collect(),
            next_pagination_token: "next-w1".into(),
            previous_pagination_token: "prev-w0".into(),
        }
    );
    let jobs = pb::ListWaitGroupCompletedJobsResponse {
        jobs: vec![pb::WaitGroupJob {
            job_id: "shard-0".into(),
            completed_at: 1_764_600_007_000_000_046,
            metadata: meta(&[("worker", "worker-7")]),
        }],
        next_pagination_token: "next-j1".into(),
        previous_pagination_token: "prev-j0".into(),
    };
    let got: upstream::ListWaitGroupCompletedJobsResponse = decode_as(&jobs);
    assert_eq!(
        got,
        upstream::ListWaitGroupCompletedJobsResponse {
            jobs: vec![upstream::WaitGroupJob {
                job_id: "shard-0".into(),
                completed_at: 1_764_600_007_000_000_046,
                metadata: meta(&[("worker", "worker-7")]),
            }],
            next_pagination_token: "next-j1".into(),
            previous_pagination_token: "prev-j0".into(),
        }
    );
    let _: upstream::Empty = decode_as(&pb::DeleteWaitGroupResponse {});
    assert!(prost::Message::encode_to_vec(&pb::DeleteWaitGroupResponse {}).is_empty());
}

#[test]
fn every_wait_group_outcome_reaches_a_grackle_client_as_itself() {
    for (outcome, grackle) in [
        (
            pb::WaitGroupWaitOutcome::Completed,
            upstream::WaitGroupWaitOutcome::Completed,
        ),
        (
            pb::WaitGroupWaitOutcome::Expired,
            upstream::WaitGroupWaitOutcome::Expired,
        ),
        (
            pb::WaitGroupWaitOutcome::TimedOut,
            upstream::WaitGroupWaitOutcome::TimedOut,
        ),
    ] {
        let wg = wait_group("batch", pb::WaitGroupStatus::Active);
        let got: upstream::WaitForWaitGroupResponse = decode_as(&pb::WaitForWaitGroupResponse {
            wait_group: Some(wg.clone()),
            outcome: outcome as i32,
        });
        assert_eq!(got.outcome, grackle as i32, "{outcome:?}");
        assert_eq!(got.wait_group, Some(up_wait_group(&wg)));
    }
}

#[test]
fn wait_group_requests_from_a_grackle_client_reach_conchd_field_by_field() {
    let create = upstream::CreateWaitGroupRequest {
        namespace_name: "pipelines".into(),
        wait_group_name: "batch".into(),
        description: "daily".into(),
        counter: 100,
        expires_at: 1_718_236_800_000_000_000,
        metadata: meta(&[("team", "data")]),
        delete_after_finished_seconds: 3600,
    };
    assert_eq!(
        decode_as::<pb::CreateWaitGroupRequest>(&create),
        pb::CreateWaitGroupRequest {
            namespace_name: "pipelines".into(),
            wait_group_name: "batch".into(),
            description: "daily".into(),
            counter: 100,
            expires_at: 1_718_236_800_000_000_000,
            metadata: meta(&[("team", "data")]),
            delete_after_finished_seconds: 3600,
        }
    );
    let update = upstream::UpdateWaitGroupRequest {
        namespace_name: "pipelines".into(),
        wait_group_name: "batch".into(),
        description: "extended".into(),
        counter: 110,
        expires_at: 1_718_323_200_000_000_000,
        metadata: meta(&[("priority", "high")]),
        expected_version: 2,
        delete_after_finished_seconds: 7200,
    };
    assert_eq!(
        decode_as::<pb::UpdateWaitGroupRequest>(&update),
        pb::UpdateWaitGroupRequest {
            namespace_name: "pipelines".into(),
            wait_group_name: "batch".into(),
            description: "extended".into(),
            counter: 110,
            expires_at: 1_718_323_200_000_000_000,
            metadata: meta(&[("priority", "high")]),
            expected_version: 2,
            delete_after_finished_seconds: 7200,
        }
    );
    let list = upstream::ListWaitGroupsRequest {
        namespace_name: "pipelines".into(),
        pagination_token: "next-w1".into(),
        limit: 40,
    };
    assert_eq!(
        decode_as::<pb::ListWaitGroupsRequest>(&list),
        pb::ListWaitGroupsRequest {
            namespace_name: "pipelines".into(),
            pagination_token: "next-w1".into(),
            limit: 40,
        }
    );
    let by_name = upstream::WaitGroupRef {
        namespace_name: "pipelines".into(),
        wait_group_name: "batch".into(),
    };
    assert_eq!(
        decode_as::<pb::GetWaitGroupRequest>(&by_name),
        pb::GetWaitGroupRequest {
            namespace_name: "pipelines".into(),
            wait_group_name: "batch".into(),
        }
    );
    assert_eq!(
        decode_as::<pb::DeleteWaitGroupRequest>(&by_name),
        pb::DeleteWaitGroupRequest {
            namespace_name: "pipelines".into(),
            wait_group_name: "batch".into(),
        }
    );
    let complete = upstream::CompleteJobsFromWaitGroupRequest {
        namespace_name: "pipelines".into(),
        wait_group_name: "batch".into(),
        jobs: vec![
            upstream::CompleteJobRequest {
                job_id: "shard-0".into(),
                metadata: meta(&[("worker", "worker-7")]),
            },
            upstream::CompleteJobRequest {
                job_id: "shard-1".into(),
                metadata: HashMap::new(),
            },
        ],
    };
    assert_eq!(
        decode_as::<pb::CompleteJobsFromWaitGroupRequest>(&complete),
        pb::CompleteJobsFromWaitGroupRequest {
            namespace_name: "pipelines".into(),
            wait_group_name: "batch".into(),
            jobs: vec![
                pb::CompleteJobRequest {
                    job_id: "shard-0".into(),
                    metadata: meta(&[("worker", "worker-7")]),
                },
                pb::CompleteJobRequest {
                    job_id: "shard-1".into(),
                    metadata: HashMap::new(),
                },
            ],
        }
    );
    let jobs = upstream::ListWaitGroupCompletedJobsRequest {
        namespace_name: "pipelines".into(),
        wait_group_name: "batch".into(),
        pagination_token: "next-j1".into(),
        limit: 30,
    };
    assert_eq!(
        decode_as::<pb::ListWaitGroupCompletedJobsRequest>(&jobs),
        pb::ListWaitGroupCompletedJobsRequest {
            namespace_name: "pipelines".into(),
            wait_group_name: "batch".into(),
            pagination_token: "next-j1".into(),
            limit: 30,
        }
    );
    let wait = upstream::WaitForWaitGroupRequest {
        namespace_name: "pipelines".into(),
        wait_group_name: "batch".into(),
        timeout_seconds: 300,
    };
    assert_eq!(
        decode_as::<pb::WaitForWaitGroupRequest>(&wait),
        pb::WaitForWaitGroupRequest {
            namespace_name: "pipelines".into(),
            wait_group_name: "batch".into(),
            timeout_seconds: 300,
        }
    );
}

#[test]
fn barrier_responses_reach_a_grackle_client_field_by_field() {
    let b = barrier("phase-1");
    let expected = Some(up_barrier(&b));
    let got: upstream::BarrierResponse = decode_as(&pb::CreateBarrierResponse {
        barrier: Some(b.clone()),
    });
    assert_eq!(got.barrier, expected);
    let got: upstream::BarrierResponse = decode_as(&pb::GetBarrierResponse {
        barrier: Some(b.clone()),
    });
    assert_eq!(got.barrier, expected);
    let got: upstream::BarrierResponse = decode_as(&pb::UpdateBarrierResponse {
        barrier: Some(b.clone()),
    });
    assert_eq!(got.barrier, expected);
    let got: upstream::ArriveAtBarrierResponse = decode_as(&pb::ArriveAtBarrierResponse {
        barrier: Some(b.clone()),
        all_arrived: true,
    });
    assert_eq!((got.barrier, got.all_arrived), (expected.clone(), true));
    for (outcome, grackle) in [
        (
            pb::BarrierWaitOutcome::Tripped,
            upstream::BarrierWaitOutcome::Tripped,
        ),
        (
            pb::BarrierWaitOutcome::TimedOut,
            upstream::BarrierWaitOutcome::TimedOut,
        ),
    ] {
        let got: upstream::WaitAtBarrierResponse = decode_as(&pb::WaitAtBarrierResponse {
            barrier: Some(b.clone()),
            outcome: outcome as i32,
        });
        assert_eq!(got.outcome, grackle as i32, "{outcome:?}");
        assert_eq!(got.barrier, expected);
    }
    let list = pb::ListBarriersResponse {
        barriers: vec![b.clone(), barrier("phase-2")],
        next_pagination_token: "next-b1".into(),
        previous_pagination_token: "prev-b0".into(),
    };
    let got: upstream::ListBarriersResponse = decode_as(&list);
    assert_eq!(
        got,
        upstream::ListBarriersResponse {
            barriers: list.barriers.iter().map(up_barrier).collect(),
            next_pagination_token: "next-b1".into(),
            previous_pagination_token: "prev-b0".into(),
        }
    );
    let who = pb::ListBarrierParticipantsResponse {
        participants: vec![pb::BarrierParticipant {
            process_id: "shard-0".into(),
            arrived_at: 1_764_600_008_000_000_054,
            metadata: meta(&[("host", "w3")]),
        }],
        next_pagination_token: "next-p1".into(),
        previous_pagination_token: "prev-p0".into(),
    };
    let got: upstream::ListBarrierParticipantsResponse = decode_as(&who);
    assert_eq!(
        got,
        upstream::ListBarrierParticipantsResponse {
            participants: vec![upstream::BarrierParticipant {
                process_id: "shard-0".into(),
                arrived_at: 1_764_600_008_000_000_054,
                metadata: meta(&[("host", "w3")]),
            }],
            next_pagination_token: "next-p1".into(),
            previous_pagination_token: "prev-p0".into(),
        }
    );
    let _: upstream::Empty = decode_as(&pb::DeleteBarrierResponse {});
}

#[test]
fn barrier_requests_from_a_grackle_client_reach_conchd_field_by_field() {
    let create = upstream::CreateBarrierRequest {
        namespace_name: "pipelines".into(),
        barrier_name: "phase-1".into(),
        description: "end of map".into(),
        expected_processes: 4,
        delete_inactive_after_seconds: 3600,
        metadata: meta(&[("phase", "map")]),
    };
    assert_eq!(
        decode_as::<pb::CreateBarrierRequest>(&create),
        pb::CreateBarrierRequest {
            namespace_name: "pipelines".into(),
            barrier_name: "phase-1".into(),
            description: "end of map".into(),
            expected_processes: 4,
            delete_inactive_after_seconds: 3600,
            metadata: meta(&[("phase", "map")]),
        }
    );
    let list = upstream::ListBarriersRequest {
        namespace_name: "pipelines".into(),
        pagination_token: "next-b1".into(),
        limit: 20,
    };
    assert_eq!(
        decode_as::<pb::ListBarriersRequest>(&list),
        pb::ListBarriersRequest {
            namespace_name: "pipelines".into(),
            pagination_token: "next-b1".into(),
            limit: 20,
        }
    );
    let by_name = upstream::BarrierRef {
        namespace_name: "pipelines".into(),
        barrier_name: "phase-1".into(),
    };
    assert_eq!(
        decode_as::<pb::GetBarrierRequest>(&by_name),
        pb::GetBarrierRequest {
            namespace_name: "pipelines".into(),
            barrier_name: "phase-1".into(),
        }
    );
    assert_eq!(
        decode_as::<pb::DeleteBarrierRequest>(&by_name),
        pb::DeleteBarrierRequest {
            namespace_name: "pipelines".into(),
            barrier_name: "phase-1".into(),
        }
    );
    let update = upstream::UpdateBarrierRequest {
        namespace_name: "pipelines".into(),
        barrier_name: "phase-1".into(),
        description: "smaller".into(),
        expected_processes: 3,
        metadata: meta(&[("phase", "reduce")]),
        expected_version: 2,
        delete_inactive_after_seconds: 1800,
    };
    assert_eq!(
        decode_as::<pb::UpdateBarrierRequest>(&update),
        pb::UpdateBarrierRequest {
            namespace_name: "pipelines".into(),
            barrier_name: "phase-1".into(),
            description: "smaller".into(),
            expected_processes: 3,
            metadata: meta(&[("phase", "reduce")]),
            expected_version: 2,
            delete_inactive_after_seconds: 1800,
        }
    );
    let arrive = upstream::ArriveAtBarrierRequest {
        namespace_name: "pipelines".into(),
        barrier_name: "phase-1".into(),
        process_id: "shard-0".into(),
        expected_generation: 7,
        metadata: meta(&[("host", "w3")]),
    };
    assert_eq!(
        decode_as::<pb::ArriveAtBarrierRequest>(&arrive),
        pb::ArriveAtBarrierRequest {
            namespace_name: "pipelines".into(),
            barrier_name: "phase-1".into(),
            process_id: "shard-0".into(),
            expected_generation: 7,
            metadata: meta(&[("host", "w3")]),
        }
    );
    let wait = upstream::WaitAtBarrierRequest {
        namespace_name: "pipelines".into(),
        barrier_name: "phase-1".into(),
        expected_generation: 8,
        timeout_seconds: 120,
    };
    assert_eq!(
        decode_as::<pb::WaitAtBarrierRequest>(&wait),
        pb::WaitAtBarrierRequest {
            namespace_name: "pipelines".into(),
            barrier_name: "phase-1".into(),
            expected_generation: 8,
            timeout_seconds: 120,
        }
    );
    let who = upstream::ListBarrierParticipantsRequest {
        namespace_name: "pipelines".into(),
        barrier_name: "phase-1".into(),
        generation: 6,
        pagination_token: "next-p1".into(),
        limit: 10,
    };
    assert_eq!(
        decode_as::<pb::ListBarrierParticipantsRequest>(&who),
        pb::ListBarrierParticipantsRequest {
            namespace_name: "pipelines".into(),
            barrier_name: "phase-1".into(),
            generation: 6,
            pagination_token: "next-p1".into(),
            limit: 10,
        }
    );
}
