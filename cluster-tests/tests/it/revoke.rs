//! An administrator's revoke of a holder and the audit trail, end to end: real `conch`
//! processes against a real 3-node cluster.
//!
//! - `conch revoke` through a follower stops a running `conch sema` holder, which exits 81
//!   printing who revoked it and why; the queued waiter gets the slot; `conch audit` shows the
//!   record, also after the leader is killed.
//! - With access control on, a token without admin on the namespace is refused
//!   (PERMISSION_DENIED) and nothing changes; a namespace admin may; the holder's own token reads
//!   its lease's record, and nothing else of the trail.
//!
//! Every process a test starts runs in a process group of its own and is killed on drop. No
//! check depends on a fixed sleep: the held command writes files the test waits for.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use cluster_tests::net::NodeChannel;
use cluster_tests::proc::Proc;
use cluster_tests::{Cluster, binary, run_conch, wait_for};
use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::conch::conch_auth_client::ConchAuthClient;
use conch_proto::conch::{
    AuthEnableRequest, HolderKind, ListAuditRequest, ListSemaphoreWaitersRequest,
    RevokeHolderRequest, RoleCreateRequest, RoleGrantRequest, TokenCreateRequest,
};
use conch_proto::grackle as pb;
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use tonic::{Code, Request};

const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
const SHOW_UP: Duration = Duration::from_secs(20);
const EX_REVOKED: i32 = 81;

/// A command that writes its lease id, records SIGTERM and otherwise runs forever.
const HELD: &str = r#"trap 'echo term > "$T/marker.tmp"; mv "$T/marker.tmp" "$T/marker"; exit 3' TERM; echo "$CONCH_LEASE" > "$T/lease.tmp"; mv "$T/lease.tmp" "$T/lease"; while :; do sleep 0.05; done"#;
/// The waiter's command: says it got the slot.
const GOT: &str = r#"echo got > "$T/waiter.tmp"; mv "$T/waiter.tmp" "$T/waiter""#;

/// Starts `conch args…` in `dir` (as `$T`) in a group of its own, against `endpoints`.
fn conch(dir: &Path, endpoints: &str, n: usize, args: &[&str]) -> anyhow::Result<Proc> {
    let mut cmd = Command::new(binary("conch"));
    cmd.args(args)
        .current_dir(dir)
        .env("CONCH_ENDPOINTS", endpoints)
        .env("T", dir)
        .env_remove("CONCH_LOG")
        .env_remove("CONCH_TOKEN")
        .env_remove("CONCH_TOKEN_FILE");
    let out = dir.join(format!("proc{n}.out"));
    let err = dir.join(format!("proc{n}.err"));
    Proc::spawn(cmd, format!("conch {}", args.join(" ")), out, err)
}

async fn wait_file(dir: &Path, name: &str) -> anyhow::Result<String> {
    let path: PathBuf = dir.join(name);
    wait_for(&format!("{name} to be written"), SHOW_UP, || {
        let text = std::fs::read_to_string(&path).ok();
        async move { text }
    })
    .await
}

/// The waiters queued on `ns/sem`, as one node sees them.
async fn waiters(channel: NodeChannel, ns: &str, sem: &str) -> Option<usize> {
    let r = ConchApiClient::new(channel)
        .list_semaphore_waiters(ListSemaphoreWaitersRequest {
            namespace_name: ns.into(),
            semaphore_name: sem.into(),
            ..Default::default()
        })
        .await
        .ok()?;
    Some(r.into_inner().waiters.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_revokes_a_running_holder_who_learns_why() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let leader = cluster.wait_for_leader(SHOW_UP).await?;
    let follower = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader)
        .context("no follower")?;
    let dir = tempfile::Builder::new().prefix("conch-revoke-").tempdir()?;
    let all = cluster.endpoints().join(",");

    // A holds x (1 slot) and runs forever; B queues behind it.
    let mut holder = conch(
        dir.path(),
        &all,
        1,
        &[
            "sema",
            "x",
            "--max",
            "1",
            "--ttl",
            "3s",
            "--kill-after",
            "1s",
            "--",
            "sh",
            "-c",
            HELD,
        ],
    )?;
    let lease = wait_file(dir.path(), "lease").await?.trim().to_string();
    ensure!(!lease.is_empty(), "the holder's command saw no CONCH_LEASE");
    let mut waiter = conch(
        dir.path(),
        &all,
        2,
        &["sema", "x", "--max", "1", "--", "sh", "-c", GOT],
    )?;
    let channel = cluster.channel(leader).context("leader channel")?;
    wait_for("B to queue", SHOW_UP, || {
        let channel = channel.clone();
        async move { (waiters(channel, "conch", "x.1").await? == 1).then_some(()) }
    })
    .await?;

    // The revoke, through a follower only.
    let reason = "stuck since 09:00, INC-7";
    let (code, out, err) = run_conch(
        &cluster.addr(follower),
        &[
            "revoke", "sema", "x", "--max", "1", "--holder", &lease, "--reason", reason,
        ],
        &[],
    )
    .await?;
    ensure!(code == 0, "conch revoke exited {code}: {err}");
    ensure!(
        out.contains("revoke-holder") && out.contains(&lease) && out.contains(reason),
        "conch revoke printed {out:?}"
    );

    // The holder's command is stopped; conch says who and why and exits 81.
    holder.expect_code(EX_REVOKED, EXIT_TIMEOUT).await?;
    ensure!(
        std::fs::read_to_string(dir.path().join("marker"))?.starts_with("term"),
        "the command did not get SIGTERM; stderr: {:?}",
        holder.stderr()
    );
    let said: Vec<String> = holder
        .stderr()
        .lines()
        .filter(|l| l.starts_with("conch:"))
        .map(str::to_string)
        .collect();
    ensure!(said.len() == 1, "stderr: {:?}", holder.stderr());
    ensure!(
        said[0].starts_with("conch: slot revoked by anonymous at ") && said[0].contains(reason),
        "stderr: {:?}",
        holder.stderr()
    );
    // B gets the slot.
    waiter.expect_code(0, EXIT_TIMEOUT).await?;
    ensure!(std::fs::read_to_string(dir.path().join("waiter"))?.trim() == "got");

    // The trail, through the follower, as JSON.
    let (code, out, err) = run_conch(&cluster.addr(follower), &["audit", "--json"], &[]).await?;
    ensure!(code == 0, "conch audit exited {code}: {err}");
    let records: serde_json::Value = serde_json::from_str(&out).context(out.clone())?;
    let first = &records[0];
    ensure!(first["action"] == "revoke-holder", "{out}");
    ensure!(first["lease_id"] == lease.as_str(), "{out}");
    ensure!(first["reason"] == reason, "{out}");
    ensure!(first["actor"] == "anonymous", "{out}");
    ensure!(
        first["object"] == "x.1" && first["namespace"] == "conch",
        "{out}"
    );

    // The record survives the leader's death: the new leader and its follower show it.
    cluster.kill(leader);
    cluster.wait_for_leader(SHOW_UP).await?;
    let live: Vec<String> = cluster
        .live_ids()
        .into_iter()
        .map(|id| cluster.addr(id))
        .collect();
    for addr in live {
        let (code, out, err) = run_conch(
            &addr,
            &["audit", "--namespace", "conch", "--lease", &lease],
            &[],
        )
        .await?;
        ensure!(code == 0, "conch audit via {addr} exited {code}: {err}");
        ensure!(
            out.contains("revoke-holder") && out.contains(reason),
            "{addr}: {out}"
        );
    }
    Ok(())
}

/// `message` with `authorization: Bearer <token>`.
fn as_token<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    let value = format!("Bearer {token}").parse().expect("ascii token");
    request.metadata_mut().insert("authorization", value);
    request
}

/// A role with `grants` and a token for it; returns the token.
async fn token_with(
    auth: &mut ConchAuthClient<NodeChannel>,
    admin: Option<&str>,
    role: &str,
    cluster_admin: bool,
    grants: &[(&str, &str)],
) -> anyhow::Result<String> {
    let send = |m| match admin {
        Some(t) => as_token(m, t),
        None => Request::new(m),
    };
    auth.role_create(send(RoleCreateRequest {
        name: role.into(),
        cluster_admin,
    }))
    .await?;
    for (namespace, permission) in grants {
        let grant = RoleGrantRequest {
            role: role.into(),
            namespace: namespace.to_string(),
            permission: permission.to_string(),
        };
        let request = match admin {
            Some(t) => as_token(grant, t),
            None => Request::new(grant),
        };
        auth.role_grant(request).await?;
    }
    let create = TokenCreateRequest {
        name: format!("{role}-token"),
        role: role.into(),
    };
    let request = match admin {
        Some(t) => as_token(create, t),
        None => Request::new(create),
    };
    Ok(auth.token_create(request).await?.into_inner().secret)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_namespace_admin_revokes_and_a_holder_reads_its_own_record() -> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    let secret = cluster_tests::auth::peer_secret_args(work.path())?;
    let args: Vec<&str> = secret.iter().map(String::as_str).collect();
    let mut cluster = Cluster::start_with(3, &args).await?;
    let leader = cluster.wait_for_leader(SHOW_UP).await?;
    let channel = cluster.channel(leader).context("leader channel")?;
    let mut auth = ConchAuthClient::new(channel.clone());
    let admin = token_with(&mut auth, None, "root", true, &[]).await?;
    auth.auth_enable(as_token(AuthEnableRequest {}, &admin))
        .await?;
    cluster.set_admin_token(&admin);
    let job = token_with(
        &mut auth,
        Some(&admin),
        "job",
        false,
        &[("team", "acquire")],
    )
    .await?;
    let ops = token_with(&mut auth, Some(&admin), "ops", false, &[("team", "admin")]).await?;
    let writer = token_with(
        &mut auth,
        Some(&admin),
        "writer",
        false,
        &[("team", "write")],
    )
    .await?;

    // The job holds team/db.
    let mut grackle = GrackleApiClient::new(channel.clone());
    grackle
        .create_namespace(as_token(
            pb::CreateNamespaceRequest {
                name: "team".into(),
                ..Default::default()
            },
            &admin,
        ))
        .await?;
    grackle
        .create_semaphore(as_token(
            pb::CreateSemaphoreRequest {
                namespace_name: "team".into(),
                semaphore_name: "db".into(),
                permits: 1,
                ..Default::default()
            },
            &admin,
        ))
        .await?;
    let lease = grackle
        .create_semaphore_lease(as_token(
            pb::CreateSemaphoreLeaseRequest {
                namespace_name: "team".into(),
                process_id: "job-host/1".into(),
                ttl_seconds: 60,
                ..Default::default()
            },
            &job,
        ))
        .await?
        .into_inner()
        .lease
        .context("lease")?
        .lease_id;
    grackle
        .acquire_semaphore(as_token(
            pb::AcquireSemaphoreRequest {
                namespace_name: "team".into(),
                semaphore_name: "db".into(),
                lease_id: lease.clone(),
                weight: 1,
                ..Default::default()
            },
            &job,
        ))
        .await?;
    let revoke = RevokeHolderRequest {
        namespace_name: "team".into(),
        kind: HolderKind::Semaphore as i32,
        object_name: "db".into(),
        lease_id: lease.clone(),
        reason: "runaway job".into(),
    };

    // The job's own token and a write token are refused on every node, and nothing changes.
    let before = cluster.wait_for_agreement(SHOW_UP).await?;
    for id in cluster.ids() {
        let mut api = ConchApiClient::new(cluster.channel(id).context("channel")?);
        for (who, token) in [("job", &job), ("writer", &writer)] {
            let e = api
                .revoke_holder(as_token(revoke.clone(), token))
                .await
                .expect_err("refused");
            ensure!(
                e.code() == Code::PermissionDenied,
                "node {id}, {who}: {e:?}"
            );
            ensure!(
                e.message()
                    .contains("lacks admin permission on namespace team"),
                "node {id}, {who}: {}",
                e.message()
            );
        }
    }
    let after = cluster.wait_for_agreement(SHOW_UP).await?;
    ensure!(
        before == after,
        "a refused revoke changed the state: {before:?} -> {after:?}"
    );
    // The CLI says the same, exit 77.
    let token_file = work.path().join("job.token");
    cluster_tests::auth::write_secret(&token_file, &job)?;
    let token_file = token_file.display().to_string();
    let (code, _, err) = run_conch(
        &cluster.endpoints().join(","),
        &[
            "revoke",
            "sema",
            "db",
            "--max",
            "1",
            "--holder",
            &lease,
            "--reason",
            "mine",
            "--namespace",
            "team",
        ],
        &[("CONCH_TOKEN_FILE", token_file.as_str())],
    )
    .await?;
    ensure!(code == 77, "exit {code}: {err}");

    // The namespace admin may; the record names its token.
    let mut api = ConchApiClient::new(channel.clone());
    let record = api
        .revoke_holder(as_token(revoke.clone(), &ops))
        .await?
        .into_inner()
        .record
        .context("record")?;
    ensure!(
        record.actor == "ops-token" && record.actor_role == "ops",
        "{record:?}"
    );
    ensure!(record.holder == "job-host/1" && record.reason == "runaway job");

    // The job's token reads its own lease's record, and nothing else of the trail.
    let list = |ns: &str, lease: &str| ListAuditRequest {
        namespace_name: ns.into(),
        lease_id: lease.into(),
        ..Default::default()
    };
    let own = api
        .list_audit(as_token(list("team", &lease), &job))
        .await?
        .into_inner()
        .records;
    ensure!(own.len() == 1 && own[0].reason == "runaway job", "{own:?}");
    for (ns, l) in [("team", ""), ("", "")] {
        let e = api
            .list_audit(as_token(list(ns, l), &job))
            .await
            .expect_err("refused");
        ensure!(e.code() == Code::PermissionDenied, "{ns}/{l}: {e:?}");
    }
    // Another token's lease shows nothing to it.
    let none = api
        .list_audit(as_token(list("team", &lease), &writer))
        .await?
        .into_inner()
        .records;
    ensure!(none.is_empty(), "{none:?}");
    // The namespace admin reads the namespace; only cluster-admin reads everything.
    let ns_records = api
        .list_audit(as_token(list("team", ""), &ops))
        .await?
        .into_inner()
        .records;
    ensure!(ns_records.len() == 1, "{ns_records:?}");
    let e = api
        .list_audit(as_token(list("", ""), &ops))
        .await
        .expect_err("refused");
    ensure!(e.code() == Code::PermissionDenied, "{e:?}");
    let everything = api
        .list_audit(as_token(list("", ""), &admin))
        .await?
        .into_inner()
        .records;
    ensure!(everything.len() == 1, "{everything:?}");
    Ok(())
}

/// `conch revoke lock` and `conch revoke elect` stop a lock holder and a leader the same way:
/// exit 81 with who and why; the next candidate leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_holder_and_a_leader_are_revoked_with_81() -> anyhow::Result<()> {
    let cluster = Cluster::start(1).await?;
    cluster.wait_for_leader(SHOW_UP).await?;
    let endpoints = cluster.endpoints().join(",");
    let run = ["--ttl", "3s", "--kill-after", "1s", "--", "sh", "-c", HELD];

    // A lock holder.
    let lock_dir = tempfile::Builder::new().prefix("conch-revoke-").tempdir()?;
    let mut args = vec!["lock", "db/orders"];
    args.extend(run);
    let mut holder = conch(lock_dir.path(), &endpoints, 1, &args)?;
    let lease = wait_file(lock_dir.path(), "lease")
        .await?
        .trim()
        .to_string();
    let (code, out, err) = run_conch(
        &endpoints,
        &[
            "revoke",
            "lock",
            "db/orders",
            "--holder",
            &lease,
            "--reason",
            "migration hung",
        ],
        &[],
    )
    .await?;
    ensure!(code == 0, "conch revoke lock exited {code}: {err}");
    ensure!(out.contains("lock conch/db/orders"), "{out}");
    holder.expect_code(EX_REVOKED, EXIT_TIMEOUT).await?;
    let err = holder.stderr();
    ensure!(
        err.contains("conch: lock revoked by anonymous at ") && err.contains("migration hung"),
        "stderr: {err:?}"
    );

    // A leader, and a candidate waiting to take over.
    let elect_dir = tempfile::Builder::new().prefix("conch-revoke-").tempdir()?;
    let mut args = vec!["elect", "billing"];
    args.extend(run);
    let mut leader = conch(elect_dir.path(), &endpoints, 1, &args)?;
    wait_file(elect_dir.path(), "lease").await?;
    let mut next = conch(
        elect_dir.path(),
        &endpoints,
        2,
        &["elect", "billing", "--", "sh", "-c", GOT],
    )?;
    let channel = cluster.channel(cluster.ids()[0]).context("channel")?;
    wait_for("the candidate to queue", SHOW_UP, || {
        let channel = channel.clone();
        async move { (waiters(channel, "conch", "billing.elect").await? == 1).then_some(()) }
    })
    .await?;
    let (code, _, err) = run_conch(
        &endpoints,
        &["revoke", "elect", "billing", "--reason", "leader wedged"],
        &[],
    )
    .await?;
    ensure!(code == 0, "conch revoke elect exited {code}: {err}");
    leader.expect_code(EX_REVOKED, EXIT_TIMEOUT).await?;
    let err = leader.stderr();
    ensure!(
        err.contains("conch: leadership revoked by anonymous at ") && err.contains("leader wedged"),
        "stderr: {err:?}"
    );
    next.expect_code(0, EXIT_TIMEOUT).await?;
    // Nobody leads now: revoking again says so (exit 65).
    let (code, _, err) = run_conch(
        &endpoints,
        &["revoke", "elect", "billing", "--reason", "again"],
        &[],
    )
    .await?;
    ensure!(
        code == 65 && err.contains("no leader"),
        "exit {code}: {err}"
    );
    Ok(())
}

/// The trail is replicated state: a backup carries it and `conchd restore` brings it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trail_survives_a_backup_and_restore() -> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    let old = Cluster::start(1).await?;
    let id = old.wait_for_leader(SHOW_UP).await?;
    let addr = old.addr(id);
    let mut c = old.grackle(id).await?;
    cluster_tests::ops::namespace(&mut c, "team").await?;
    cluster_tests::ops::semaphore(&mut c, "team", "db", 1).await?;
    let lease = cluster_tests::ops::lease(&mut c, "team", 60).await?;
    let got = cluster_tests::ops::acquire(&mut c, "team", "db", &lease, 1, 0).await?;
    ensure!(cluster_tests::ops::acquired(&got), "{got:?}");
    let (code, _, err) = run_conch(
        &addr,
        &[
            "revoke",
            "sema",
            "db",
            "--max",
            "1",
            "--holder",
            &lease,
            "--reason",
            "before the backup",
            "--namespace",
            "team",
        ],
        &[],
    )
    .await?;
    // `conch revoke sema` names `db.1`; this semaphore was made through the API as `db`.
    ensure!(code == 65, "exit {code}: {err}");
    let record = ConchApiClient::new(old.channel(id).context("channel")?)
        .revoke_holder(RevokeHolderRequest {
            namespace_name: "team".into(),
            kind: HolderKind::Semaphore as i32,
            object_name: "db".into(),
            lease_id: lease.clone(),
            reason: "before the backup".into(),
        })
        .await?
        .into_inner()
        .record
        .context("record")?;
    let file = work.path().join("trail.backup").display().to_string();
    let (code, _, err) = run_conch(&addr, &["cluster", "backup", &file], &[]).await?;
    ensure!(code == 0, "backup exited {code}: {err}");
    drop(old);

    let port = cluster_tests::Port::bind()?;
    let new_addr = port.addr().to_string();
    let data_dir = work.path().join("restored").display().to_string();
    let members = format!("1={new_addr}");
    let restore = Command::new(binary("conchd"))
        .args([
            "restore",
            &file,
            "--data-dir",
            &data_dir,
            "--id",
            "1",
            "--initial-cluster",
            &members,
        ])
        .output()?;
    ensure!(restore.status.success(), "restore: {restore:?}");
    let node = cluster_tests::Daemon::spawn_on(
        port,
        &[
            "--id",
            "1",
            "--data-dir",
            &data_dir,
            "--initial-cluster",
            &members,
        ],
        work.path(),
    )?;
    let out = wait_for("the restored node to answer conch audit", SHOW_UP, || {
        let new_addr = new_addr.clone();
        async move {
            let (code, out, _) = run_conch(&new_addr, &["audit", "--json"], &[]).await.ok()?;
            (code == 0).then_some(out)
        }
    })
    .await
    .with_context(|| node.stderr())?;
    let records: serde_json::Value = serde_json::from_str(&out).context(out.clone())?;
    ensure!(records[0]["seq"] == record.seq, "{out}");
    ensure!(records[0]["reason"] == "before the backup", "{out}");
    ensure!(records[0]["lease_id"] == lease.as_str(), "{out}");
    Ok(())
}
