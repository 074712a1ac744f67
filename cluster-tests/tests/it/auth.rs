//! Access control end to end: tokens, roles and namespace permissions on a real cluster, the
//! bootstrap token file, and the `conch` CLI with and without a token.
//!
//! Every refusal is checked for its code and message, and for leaving the state alone: the
//! applied index and state hash of every node are the same before and after.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use cluster_tests::net::NodeChannel as Channel;
use cluster_tests::{Cluster, Daemon, Port, wait_for};
use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::conch::conch_auth_client::ConchAuthClient;
use conch_proto::conch::{
    AuthEnableRequest, AuthStatusRequest, ChangeMembershipRequest, RoleCreateRequest,
    RoleGrantRequest, TokenCreateRequest, TokenRevokeRequest,
};
use conch_proto::grackle as pb;
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use tonic::{Code, Request, Status};

const SHOW_UP: Duration = Duration::from_secs(20);
const EX_USAGE: i32 = 64;
const EX_NO_PERMISSION: i32 = 77;

/// `message` with `authorization: Bearer <token>` when a token is given.
fn with_token<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().expect("ascii token");
        request.metadata_mut().insert("authorization", value);
    }
    request
}

fn channel(cluster: &Cluster, id: u64) -> anyhow::Result<Channel> {
    cluster.channel(id).context("no such node")
}

async fn create_role(
    auth: &mut ConchAuthClient<Channel>,
    token: Option<&str>,
    name: &str,
    cluster_admin: bool,
    grants: &[(&str, &str)],
) -> anyhow::Result<()> {
    let create = RoleCreateRequest {
        name: name.into(),
        cluster_admin,
    };
    auth.role_create(with_token(create, token)).await?;
    for (namespace, permission) in grants {
        let grant = RoleGrantRequest {
            role: name.into(),
            namespace: namespace.to_string(),
            permission: permission.to_string(),
        };
        auth.role_grant(with_token(grant, token)).await?;
    }
    Ok(())
}

/// Creates a token for `role`; returns (id, token).
async fn create_token(
    auth: &mut ConchAuthClient<Channel>,
    admin: Option<&str>,
    name: &str,
    role: &str,
) -> anyhow::Result<(String, String)> {
    let request = TokenCreateRequest {
        name: name.into(),
        role: role.into(),
    };
    let reply = auth
        .token_create(with_token(request, admin))
        .await?
        .into_inner();
    let id = reply.token.context("token in the reply")?.id;
    Ok((id, reply.secret))
}

async fn create_lease(
    channel: Channel,
    token: Option<&str>,
    ns: &str,
) -> Result<pb::CreateSemaphoreLeaseResponse, Status> {
    let request = pb::CreateSemaphoreLeaseRequest {
        namespace_name: ns.into(),
        process_id: "auth-test".into(),
        ttl_seconds: 30,
        ..Default::default()
    };
    GrackleApiClient::new(channel)
        .create_semaphore_lease(with_token(request, token))
        .await
        .map(tonic::Response::into_inner)
}

async fn get_namespace(channel: Channel, token: Option<&str>, ns: &str) -> Result<(), Status> {
    let request = pb::GetNamespaceRequest {
        namespace_name: ns.into(),
    };
    GrackleApiClient::new(channel)
        .get_namespace(with_token(request, token))
        .await
        .map(|_| ())
}

fn expect_code<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, Status>,
    code: Code,
    says: &[&str],
) -> anyhow::Result<()> {
    match result {
        Ok(value) => bail!("{what}: expected {code:?}, got {value:?}"),
        Err(status) => {
            ensure!(
                status.code() == code,
                "{what}: expected {code:?}, got {status:?}"
            );
            for part in says {
                ensure!(
                    status.message().contains(part),
                    "{what}: message {:?} does not say {part:?}",
                    status.message()
                );
            }
            Ok(())
        }
    }
}

/// `n` nodes whose peers share a secret, set up while access control is off with a
/// cluster-admin token, then with access control on; returns the directory of the secret (keep
/// it while the cluster runs), the cluster and the admin token.
async fn cluster_with_admin(n: u64) -> anyhow::Result<(tempfile::TempDir, Cluster, String)> {
    cluster_with_admin_and(n, &[]).await
}

/// Like [`cluster_with_admin`], with `extra` flags for every node.
async fn cluster_with_admin_and(
    n: u64,
    extra: &[&str],
) -> anyhow::Result<(tempfile::TempDir, Cluster, String)> {
    let work = tempfile::tempdir()?;
    let secret = cluster_tests::auth::peer_secret_args(work.path())?;
    let mut args: Vec<&str> = secret.iter().map(String::as_str).collect();
    args.extend_from_slice(extra);
    let mut cluster = Cluster::start_with(n, &args).await?;
    let mut auth = ConchAuthClient::new(channel(&cluster, 1)?);
    create_role(&mut auth, None, "root", true, &[]).await?;
    let (_, admin) = create_token(&mut auth, None, "admin", "root").await?;
    auth.auth_enable(with_token(AuthEnableRequest {}, Some(&admin)))
        .await?;
    cluster.set_admin_token(&admin);
    Ok((work, cluster, admin))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_namespace_permissions_are_enforced_on_every_node() -> anyhow::Result<()> {
    let (_work, cluster, admin) = cluster_with_admin(3).await?;
    let admin = admin.as_str();
    let mut auth = ConchAuthClient::new(channel(&cluster, 1)?);
    let mut grackle = GrackleApiClient::new(channel(&cluster, 1)?);
    for ns in ["a", "b"] {
        let request = pb::CreateNamespaceRequest {
            name: ns.into(),
            ..Default::default()
        };
        grackle
            .create_namespace(with_token(request, Some(admin)))
            .await?;
    }
    create_role(&mut auth, Some(admin), "app", false, &[("a", "write")]).await?;
    create_role(&mut auth, Some(admin), "viewer", false, &[("a", "read")]).await?;
    let (_, app) = create_token(&mut auth, Some(admin), "app", "app").await?;
    let (_, viewer) = create_token(&mut auth, Some(admin), "viewer", "viewer").await?;
    let (app, viewer) = (app.as_str(), viewer.as_str());

    let before = cluster.wait_for_agreement(SHOW_UP).await?;
    for id in cluster.ids() {
        let ch = channel(&cluster, id)?;
        let at = |what: &str| format!("node {id}: {what}");
        expect_code(
            &at("no token"),
            create_lease(ch.clone(), None, "a").await,
            Code::Unauthenticated,
            &["authorization"],
        )?;
        expect_code(
            &at("unknown token"),
            create_lease(ch.clone(), Some("conch_not-a-token-anyone-was-given"), "a").await,
            Code::Unauthenticated,
            &["unknown or revoked"],
        )?;
        expect_code(
            &at("read-only token acquiring"),
            create_lease(ch.clone(), Some(viewer), "a").await,
            Code::PermissionDenied,
            &["acquire permission on namespace a"],
        )?;
        expect_code(
            &at("token for a used on b"),
            create_lease(ch.clone(), Some(app), "b").await,
            Code::PermissionDenied,
            &["acquire permission on namespace b"],
        )?;
        let change = ChangeMembershipRequest {
            voters: vec![1],
            ..Default::default()
        };
        expect_code(
            &at("non-admin changing membership"),
            ConchAdminClient::new(ch.clone())
                .change_membership(with_token(change, Some(app)))
                .await,
            Code::PermissionDenied,
            &["cluster-admin"],
        )?;
        expect_code(
            &at("non-admin managing tokens"),
            ConchAuthClient::new(ch.clone())
                .auth_status(with_token(AuthStatusRequest {}, Some(viewer)))
                .await,
            Code::PermissionDenied,
            &["cluster-admin"],
        )?;
    }
    let after = cluster.wait_for_agreement(SHOW_UP).await?;
    ensure!(
        before == after,
        "refused calls changed the state: {before:?} -> {after:?}"
    );

    // An admin call on a follower is forwarded to the leader with the caller's token, which the
    // leader checks again: the admin's goes through, none is refused there too.
    let leader = cluster.leader().await.context("a leader")?;
    let follower = *cluster
        .ids()
        .iter()
        .find(|id| **id != leader)
        .context("a follower")?;
    let mut admin_client = ConchAdminClient::new(channel(&cluster, follower)?);
    let same = ChangeMembershipRequest {
        voters: cluster.ids(),
        ..Default::default()
    };
    admin_client
        .change_membership(with_token(same.clone(), Some(admin)))
        .await
        .context("membership change by the admin through a follower")?;
    expect_code(
        "membership change without a token through a follower",
        admin_client.change_membership(with_token(same, None)).await,
        Code::Unauthenticated,
        &[],
    )?;

    // What the tokens allow works through any node; listings show only what a token can read.
    let lease = create_lease(channel(&cluster, 2)?, Some(app), "a").await?;
    ensure!(lease.lease.is_some(), "a lease");
    get_namespace(channel(&cluster, 3)?, Some(viewer), "a").await?;
    let listed = GrackleApiClient::new(channel(&cluster, 3)?)
        .list_namespaces(with_token(
            pb::ListNamespacesRequest::default(),
            Some(viewer),
        ))
        .await?
        .into_inner();
    let names: Vec<String> = listed.namespaces.into_iter().map(|n| n.name).collect();
    ensure!(names == ["a"], "the viewer lists only a, got {names:?}");
    expect_code(
        "listing namespaces without a token",
        GrackleApiClient::new(channel(&cluster, 3)?)
            .list_namespaces(with_token(pb::ListNamespacesRequest::default(), None))
            .await,
        Code::Unauthenticated,
        &[],
    )?;

    // A new token works on every node soon after it is created, and stops working everywhere
    // once revoked.
    let (id, fresh) = create_token(&mut auth, Some(admin), "fresh", "viewer").await?;
    let fresh = fresh.as_str();
    for id in cluster.ids() {
        let ch = channel(&cluster, id)?;
        wait_for(
            &format!("node {id} to accept the new token"),
            SHOW_UP,
            || {
                let ch = ch.clone();
                async move { get_namespace(ch, Some(fresh), "a").await.ok() }
            },
        )
        .await?;
    }
    let mut auth3 = ConchAuthClient::new(channel(&cluster, 3)?);
    auth3
        .token_revoke(with_token(TokenRevokeRequest { id }, Some(admin)))
        .await?;
    for id in cluster.ids() {
        let ch = channel(&cluster, id)?;
        wait_for(
            &format!("node {id} to refuse the revoked token"),
            SHOW_UP,
            || {
                let ch = ch.clone();
                async move {
                    match get_namespace(ch, Some(fresh), "a").await {
                        Err(status) if status.code() == Code::Unauthenticated => Some(()),
                        _ => None,
                    }
                }
            },
        )
        .await?;
    }
    Ok(())
}

/// Runs `conch` with `args` and `env` (no token inherited); returns (code, stdout, stderr).
async fn conch(
    endpoint: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<(i32, String, String)> {
    cluster_tests::run_conch(endpoint, args, env).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_token_file_turns_access_control_on_and_the_cli_uses_tokens()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let token_file = dir.path().join("admin.token");
    cluster_tests::auth::write_secret(
        &token_file,
        "bootstrap-token-0123456789-abcdefghijklmnop\n",
    )?;
    let token_path = token_file.display().to_string();
    let mut args = vec![
        "--bootstrap-admin-token-file".to_string(),
        token_path.clone(),
    ];
    args.extend(cluster_tests::auth::peer_secret_args(dir.path())?);
    let mut cluster = Cluster::launch(1, &args, false).await?;
    cluster.set_admin_token("bootstrap-token-0123456789-abcdefghijklmnop");
    cluster.wait_for_leader(SHOW_UP).await?;
    let endpoint = cluster.addr(1);

    // Access control comes on by itself, and the file's token is a cluster admin.
    let ch = channel(&cluster, 1)?;
    wait_for("access control to be on", SHOW_UP, || {
        let ch = ch.clone();
        async move {
            match get_namespace(ch, None, "conch").await {
                Err(status) if status.code() == Code::Unauthenticated => Some(()),
                _ => None,
            }
        }
    })
    .await?;
    let admin_env = [("CONCH_TOKEN_FILE", token_path.as_str())];
    let (code, out, err) = conch(&endpoint, &["auth", "status"], &admin_env).await?;
    ensure!(
        code == 0 && out.contains("access control is on"),
        "auth status: {code} {out} {err}"
    );

    // Granting to a role that does not exist is refused as such (65), not as an internal error.
    let (code, _, err) = conch(
        &endpoint,
        &["auth", "role", "grant", "nosuch", "conch", "acquire"],
        &admin_env,
    )
    .await?;
    ensure!(
        code == 65 && err.contains("not found"),
        "grant to a missing role: {code} {err}"
    );

    // A role with write on the CLI's namespace, and a token for it, through the CLI.
    for args in [
        &["auth", "role", "create", "ci"][..],
        &["auth", "role", "grant", "ci", "conch", "write"][..],
    ] {
        let (code, out, err) = conch(&endpoint, args, &admin_env).await?;
        ensure!(code == 0, "{args:?}: {code} {out} {err}");
    }
    let (code, ci_token, err) = conch(
        &endpoint,
        &["auth", "token", "create", "runner", "--role", "ci"],
        &admin_env,
    )
    .await?;
    ensure!(code == 0, "token create: {code} {err}");
    let ci_token = ci_token.trim().to_string();
    ensure!(
        ci_token.starts_with("conch_"),
        "a token on stdout: {ci_token:?}"
    );
    let (code, out, _) = conch(&endpoint, &["auth", "token", "list"], &admin_env).await?;
    ensure!(code == 0 && out.contains("runner") && !out.contains(&ci_token));

    // `conch sema` with the token runs the command; without one it fails with 77 and says why.
    let sema = ["sema", "deploy", "--max", "1", "--nonblock", "--", "true"];
    let (code, out, err) = conch(&endpoint, &sema, &[("CONCH_TOKEN", &ci_token)]).await?;
    ensure!(code == 0, "sema with a token: {code} {out} {err}");
    let (code, _, err) = conch(&endpoint, &sema, &[]).await?;
    ensure!(
        code == EX_NO_PERMISSION && err.contains("--token-file"),
        "sema without a token: {code} {err}"
    );
    // The ci token may not manage access control.
    let (code, _, err) = conch(
        &endpoint,
        &["auth", "token", "list"],
        &[("CONCH_TOKEN", &ci_token)],
    )
    .await?;
    ensure!(
        code == EX_NO_PERMISSION && err.contains("cluster-admin"),
        "token list as ci: {code} {err}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_short_or_shared_bootstrap_token_file_is_a_usage_error() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let short = dir.path().join("short.token");
    cluster_tests::auth::write_secret(&short, "too-short\n")?;
    let missing = dir.path().join("missing.token");
    // Readable by everybody on the machine: refused with the fix, however good the token.
    let shared = dir.path().join("shared.token");
    std::fs::write(&shared, "bootstrap-token-0123456789-abcdefghijklmnop\n")?;
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o644))?;
    for (file, says) in [
        (&missing, "missing.token"),
        (&short, "at least 32"),
        (&shared, "chmod 600"),
    ] {
        let path = file.display().to_string();
        let mut daemon = Daemon::spawn_on(
            Port::bind()?,
            &["--data-dir", "data", "--bootstrap-admin-token-file", &path],
            dir.path(),
        )?;
        let code = daemon.wait_exit(SHOW_UP).await?;
        ensure!(code == Some(EX_USAGE), "exit {code:?}: {}", daemon.stderr());
        ensure!(
            daemon.stderr().contains(says),
            "stderr names the problem: {}",
            daemon.stderr()
        );
    }
    Ok(())
}

/// One namespace per team, as the book (Access control) sets it up: the admin creates it and grants the
/// team's role write on it. Each team's token works in its own namespace only; a namespace
/// that does not exist is said so in one line; tokens stay secret (a private `--out` file, the
/// command does not see them, a shared token file and `--token` are refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teams_keep_to_their_namespaces_and_tokens_stay_secret() -> anyhow::Result<()> {
    const ADMIN: &str = "bootstrap-token-0123456789-abcdefghijklmnop";
    let dir = tempfile::tempdir()?;
    let admin_file = dir.path().join("admin.token");
    cluster_tests::auth::write_secret(&admin_file, format!("{ADMIN}\n"))?;
    let admin_path = admin_file.display().to_string();
    let mut args = vec![
        "--bootstrap-admin-token-file".to_string(),
        admin_path.clone(),
    ];
    args.extend(cluster_tests::auth::peer_secret_args(dir.path())?);
    let mut cluster = Cluster::launch(1, &args, false).await?;
    cluster.set_admin_token(ADMIN);
    cluster.wait_for_leader(SHOW_UP).await?;
    let endpoint = cluster.addr(1);
    let admin = [("CONCH_TOKEN_FILE", admin_path.as_str())];
    let ok = async |args: &[&str], env: &[(&str, &str)]| -> anyhow::Result<String> {
        let (code, out, err) = conch(&endpoint, args, env).await?;
        ensure!(code == 0, "{args:?}: exit {code}: {out} {err}");
        Ok(out)
    };
    wait_for("access control to be on", SHOW_UP, || async {
        let (code, out, _) = conch(&endpoint, &["auth", "status"], &admin).await.ok()?;
        (code == 0 && out.contains("access control is on")).then_some(())
    })
    .await?;

    // The admin's setup: team A gets a namespace and a role that may write there; team B's
    // role may write in team-b, which nobody created.
    ok(&["namespace", "create", "team-a"], &admin).await?;
    for (role, ns) in [("jobs-a", "team-a"), ("jobs-b", "team-b")] {
        ok(&["auth", "role", "create", role], &admin).await?;
        ok(&["auth", "role", "grant", role, ns, "write"], &admin).await?;
    }
    let list = ok(&["namespace", "list"], &admin).await?;
    ensure!(
        list.contains("team-a") && !list.contains("team-b"),
        "{list}"
    );

    // --out: the token goes to a new file only its owner may read, nothing to stdout.
    let a_file = dir.path().join("a.token");
    let a_path = a_file.display().to_string();
    let create_a = [
        "auth", "token", "create", "a", "--role", "jobs-a", "--out", &a_path,
    ];
    let out = ok(&create_a, &admin).await?;
    ensure!(out.is_empty(), "the token went to stdout too: {out:?}");
    let mode = std::fs::metadata(&a_file)?.permissions().mode() & 0o777;
    ensure!(mode == 0o600, "--out file mode {mode:o}");
    let a_token = std::fs::read_to_string(&a_file)?.trim().to_string();
    ensure!(a_token.starts_with("conch_"), "{a_token:?}");
    // An existing file is not replaced unasked, and no token is made for nothing.
    let (code, _, err) = conch(&endpoint, &create_a, &admin).await?;
    ensure!(
        code == EX_USAGE && err.contains("--force") && err.lines().count() == 1,
        "second --out: {code} {err}"
    );
    let tokens = ok(&["auth", "token", "list"], &admin).await?;
    ensure!(tokens.matches("role=jobs-a").count() == 1, "{tokens}");
    let b_token = ok(
        &["auth", "token", "create", "b", "--role", "jobs-b"],
        &admin,
    )
    .await?;
    let b_token = b_token.trim().to_string();
    let a_env = [("CONCH_TOKEN_FILE", a_path.as_str())];
    let b_env = [("CONCH_TOKEN", b_token.as_str())];

    // Team A runs in its namespace. The command sees its own variables, none of the token's.
    let env_out = dir.path().join("env.out");
    let env_path = env_out.display().to_string();
    let run_a = [
        "sema",
        "nightly",
        "--namespace",
        "team-a",
        "--max",
        "1",
        "--",
        "sh",
        "-c",
        r#"env > "$1" && tr '\0' '\n' < /proc/$PPID/environ > "$1.conch""#,
        "sh",
        &env_path,
    ];
    let both = [
        ("CONCH_TOKEN", a_token.as_str()),
        ("CONCH_TOKEN_FILE", a_path.as_str()),
    ];
    ok(&run_a, &both).await?;
    let seen = std::fs::read_to_string(&env_out)?;
    ensure!(
        seen.lines().any(|l| l.starts_with("CONCH_REV="))
            && seen.lines().any(|l| l.starts_with("CONCH_LEASE=")),
        "{seen}"
    );
    ensure!(
        !seen.contains("CONCH_TOKEN") && !seen.contains(&a_token),
        "the command saw the token: {seen}"
    );
    // Nor can it read the token in conch's own environment (/proc/$PPID/environ).
    let conch_env = std::fs::read_to_string(dir.path().join("env.out.conch"))?;
    ensure!(
        conch_env.contains("CONCH_TOKEN_FILE=") && !conch_env.contains(&a_token),
        "conch's environment shows the token: {conch_env}"
    );
    let (code, out, err) = conch(
        &endpoint,
        &[
            "sema",
            "nightly",
            "--namespace",
            "team-a",
            "--max",
            "1",
            "--who",
        ],
        &a_env,
    )
    .await?;
    ensure!(
        code == 1 && out.contains("no holder"),
        "--who in team-a after the run: {code} {out} {err}"
    );

    // Team B's token may not touch team-a (so not delete or resize A's semaphores).
    let (code, _, err) = conch(&endpoint, &run_a, &b_env).await?;
    ensure!(
        code == EX_NO_PERMISSION && err.contains("team-a"),
        "B in team-a: {code} {err}"
    );
    // Team B's own namespace does not exist, and B may not create it: one line, 77.
    let run_b = [
        "sema",
        "nightly",
        "--namespace",
        "team-b",
        "--max",
        "1",
        "--",
        "true",
    ];
    let (code, _, err) = conch(&endpoint, &run_b, &b_env).await?;
    ensure!(code == EX_NO_PERMISSION, "B in team-b: {code} {err}");
    ensure!(
        err == "conch: namespace team-b does not exist; an admin creates it with: conch namespace create team-b\n",
        "B in team-b: {err:?}"
    );
    ok(&["namespace", "create", "team-b"], &admin).await?;
    ok(&run_b, &b_env).await?;

    // A token file others may read is refused with the fix; so is --token on the command line.
    let shared = dir.path().join("shared.token");
    std::fs::copy(&a_file, &shared)?;
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o644))?;
    let shared_path = shared.display().to_string();
    let (code, _, err) = conch(&endpoint, &run_a, &[("CONCH_TOKEN_FILE", &shared_path)]).await?;
    ensure!(
        code == EX_USAGE
            && err.lines().count() == 1
            && err.contains(&format!("chmod 600 {shared_path}")),
        "shared token file: {code} {err}"
    );
    let mut with_flag = vec!["--token", a_token.as_str()];
    with_flag.extend(run_a);
    let (code, _, err) = conch(&endpoint, &with_flag, &[]).await?;
    ensure!(
        code == EX_USAGE
            && err.lines().count() == 1
            && err.contains("--token-file")
            && !err.contains(&a_token),
        "--token: {code} {err}"
    );
    Ok(())
}

/// Two jobs' tokens in one namespace, each with `acquire` (what `conch sema` needs): neither
/// can resize, delete, revoke, refresh or use the other's, nor see the other's lease; every
/// refusal changes nothing. The namespace's admin can clear a stuck job's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_sharing_a_namespace_cannot_touch_each_others_slots() -> anyhow::Result<()> {
    let (_work, cluster, admin) = cluster_with_admin(3).await?;
    let admin = admin.as_str();
    let mut auth = ConchAuthClient::new(channel(&cluster, 1)?);
    create_role(
        &mut auth,
        Some(admin),
        "jobs",
        false,
        &[("conch", "acquire")],
    )
    .await?;
    let (_, a) = create_token(&mut auth, Some(admin), "job-a", "jobs").await?;
    let (_, b) = create_token(&mut auth, Some(admin), "job-b", "jobs").await?;
    let (a, b) = (a.as_str(), b.as_str());
    // Every node knows both tokens before they are used through another node.
    cluster.wait_for_agreement(SHOW_UP).await?;

    // A creates the namespace and its semaphore on first use, a lease, and holds the slot.
    let mut grackle = GrackleApiClient::new(channel(&cluster, 2)?);
    grackle
        .create_namespace(with_token(
            pb::CreateNamespaceRequest {
                name: "conch".into(),
                ..Default::default()
            },
            Some(a),
        ))
        .await?;
    grackle
        .create_semaphore(with_token(
            pb::CreateSemaphoreRequest {
                namespace_name: "conch".into(),
                semaphore_name: "job-a.1".into(),
                permits: 1,
                ..Default::default()
            },
            Some(a),
        ))
        .await?;
    let lease = create_lease(channel(&cluster, 2)?, Some(a), "conch")
        .await?
        .lease
        .context("a lease")?
        .lease_id;
    let acquire = |token: &str| {
        with_token(
            pb::AcquireSemaphoreRequest {
                namespace_name: "conch".into(),
                semaphore_name: "job-a.1".into(),
                lease_id: lease.clone(),
                weight: 1,
                ..Default::default()
            },
            Some(token),
        )
    };
    grackle.acquire_semaphore(acquire(a)).await?;

    // What B is answered for a lease that does not exist (these go through the log).
    let missing = format!("{}0", &lease[..lease.len() - 1]);
    let missing = if missing == lease {
        format!("{}1", &lease[..lease.len() - 1])
    } else {
        missing
    };
    let revoke = |id: &str| {
        with_token(
            pb::RevokeSemaphoreLeaseRequest {
                namespace_name: "conch".into(),
                lease_id: id.to_string(),
            },
            Some(b),
        )
    };
    let refresh = |id: &str| {
        with_token(
            pb::RefreshSemaphoreLeaseRequest {
                namespace_name: "conch".into(),
                lease_id: id.to_string(),
                ..Default::default()
            },
            Some(b),
        )
    };
    let answers = |r: Result<(), Status>| {
        r.map_err(|s| {
            let message = s.message().replace(&lease, "L").replace(&missing, "L");
            (s.code(), message)
        })
    };
    let absent_revoke = answers(
        grackle
            .revoke_semaphore_lease(revoke(&missing))
            .await
            .map(|_| ()),
    );
    let absent_refresh = answers(
        grackle
            .refresh_semaphore_lease(refresh(&missing))
            .await
            .map(|_| ()),
    );

    let before = cluster.wait_for_agreement(SHOW_UP).await?;
    for id in cluster.ids() {
        let mut g = GrackleApiClient::new(channel(&cluster, id)?);
        let at = |what: &str| format!("node {id}: B {what}");
        expect_code(
            &at("resizing A's semaphore"),
            g.update_semaphore(with_token(
                pb::UpdateSemaphoreRequest {
                    namespace_name: "conch".into(),
                    semaphore_name: "job-a.1".into(),
                    permits: 5,
                    expected_version: 1,
                    ..Default::default()
                },
                Some(b),
            ))
            .await,
            Code::PermissionDenied,
            &["write permission on namespace conch"],
        )?;
        expect_code(
            &at("deleting A's semaphore"),
            g.delete_semaphore(with_token(
                pb::DeleteSemaphoreRequest {
                    namespace_name: "conch".into(),
                    semaphore_name: "job-a.1".into(),
                },
                Some(b),
            ))
            .await,
            Code::PermissionDenied,
            &["write permission"],
        )?;
        // Revoking or refreshing A's lease answers B exactly as a lease that does not exist.
        let foreign = answers(g.revoke_semaphore_lease(revoke(&lease)).await.map(|_| ()));
        ensure!(
            foreign == absent_revoke && matches!(&foreign, Err((Code::NotFound, _))),
            "{}: {foreign:?} / missing: {absent_revoke:?}",
            at("revoking A's lease")
        );
        let foreign = answers(g.refresh_semaphore_lease(refresh(&lease)).await.map(|_| ()));
        ensure!(
            foreign == absent_refresh && matches!(&foreign, Err((Code::NotFound, _))),
            "{}: {foreign:?} / missing: {absent_refresh:?}",
            at("refreshing A's lease")
        );
        expect_code(
            &at("acquiring with A's lease"),
            g.acquire_semaphore(acquire(b)).await,
            Code::PermissionDenied,
            &["belongs to another token"],
        )?;
        expect_code(
            &at("reading A's lease"),
            g.get_semaphore_lease(with_token(
                pb::GetSemaphoreLeaseRequest {
                    namespace_name: "conch".into(),
                    lease_id: lease.clone(),
                },
                Some(b),
            ))
            .await,
            Code::NotFound,
            &[],
        )?;
        let seen = g
            .list_semaphore_leases(with_token(
                pb::ListSemaphoreLeasesRequest {
                    namespace_name: "conch".into(),
                    ..Default::default()
                },
                Some(b),
            ))
            .await?
            .into_inner()
            .leases;
        ensure!(seen.is_empty(), "node {id}: B lists A's lease: {seen:?}");
        // B sees that the slot is held, not the lease id that is a handle on it; A and the
        // admin see it.
        for (who, token, shown) in [
            ("B", b, ""),
            ("A", a, lease.as_str()),
            ("admin", admin, lease.as_str()),
        ] {
            let holders = g
                .list_semaphore_holders(with_token(
                    pb::ListSemaphoreHoldersRequest {
                        namespace_name: "conch".into(),
                        semaphore_name: "job-a.1".into(),
                        ..Default::default()
                    },
                    Some(token),
                ))
                .await?
                .into_inner()
                .holders;
            let ids: Vec<&str> = holders.iter().map(|h| h.lease_id.as_str()).collect();
            ensure!(
                ids == [shown],
                "node {id}: {who} lists the holders as {ids:?}"
            );
        }
    }
    let after = cluster.wait_for_agreement(SHOW_UP).await?;
    ensure!(
        before == after,
        "a refusal changed the state: {before:?} -> {after:?}"
    );
    // The admin may clear it.
    grackle
        .revoke_semaphore_lease(with_token(
            pb::RevokeSemaphoreLeaseRequest {
                namespace_name: "conch".into(),
                lease_id: lease.clone(),
            },
            Some(admin),
        ))
        .await?;
    Ok(())
}

/// Health and status answer any known token (as etcd's endpoint health needs no rights); with
/// no token, or an unknown one, they say the call was refused and exit 77, not "no node
/// answered".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_needs_a_token_not_the_most_powerful_one() -> anyhow::Result<()> {
    let (_work, cluster, admin) = cluster_with_admin(3).await?;
    let mut auth = ConchAuthClient::new(channel(&cluster, 1)?);
    create_role(
        &mut auth,
        Some(&admin),
        "jobs",
        false,
        &[("conch", "acquire")],
    )
    .await?;
    let (_, jobs) = create_token(&mut auth, Some(&admin), "job", "jobs").await?;
    let endpoints = cluster.endpoints().join(",");
    for command in [&["cluster", "health"][..], &["cluster", "status"][..]] {
        // Healthy (0) once every node has caught up with the token's creation; until then a
        // node may still refuse it, or lag (1).
        let jobs_env = [("CONCH_TOKEN", jobs.as_str())];
        wait_for(
            &format!("{command:?} with a jobs token to exit 0"),
            SHOW_UP,
            || async {
                let (code, _, _) = conch(&endpoints, command, &jobs_env).await.ok()?;
                (code == 0).then_some(())
            },
        )
        .await?;
        for (what, env) in [
            ("no token", &[][..]),
            (
                "an unknown token",
                &[("CONCH_TOKEN", "conch_0123456789abcdef0123456789abcdef")][..],
            ),
        ] {
            let (code, out, err) = conch(&endpoints, command, env).await?;
            ensure!(
                code == EX_NO_PERMISSION && err.contains("refused by"),
                "{command:?} with {what}: {code} {out} {err}"
            );
        }
    }
    Ok(())
}

/// `VmRSS` of a process, in bytes.
fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("VmRSS in /proc/PID/status")?;
    Ok(kib * 1024)
}

/// A token with write on one namespace floods it with the largest semaphores it may create,
/// from 32 callers at once: the namespace's byte quota stops it with RESOURCE_EXHAUSTED naming
/// the quota, the token cannot raise its own quota, and every node's memory stays within what
/// the book documents for a full namespace. The admin can still raise the quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_token_flood_stops_at_the_namespace_quota() -> anyhow::Result<()> {
    use conch_proto::conch::NamespaceQuotas;
    use conch_proto::conch::conch_quota_client::ConchQuotaClient;
    let (_work, cluster, admin) = cluster_with_admin(3).await?;
    let admin = admin.as_str();
    let mut auth = ConchAuthClient::new(channel(&cluster, 1)?);
    let mut grackle = GrackleApiClient::new(channel(&cluster, 1)?);
    let create = pb::CreateNamespaceRequest {
        name: "flood".into(),
        ..Default::default()
    };
    grackle
        .create_namespace(with_token(create, Some(admin)))
        .await?;
    create_role(
        &mut auth,
        Some(admin),
        "tenant",
        false,
        &[("flood", "write")],
    )
    .await?;
    let (_, tenant) = create_token(&mut auth, Some(admin), "tenant", "tenant").await?;
    cluster.wait_for_agreement(SHOW_UP).await?;
    let rss_before: Vec<u64> = cluster
        .nodes
        .values()
        .map(|n| rss_bytes(n.pid().context("running")?))
        .collect::<anyhow::Result<_>>()?;

    let metadata: std::collections::HashMap<String, String> = (0..32)
        .map(|i| (format!("{i:0>128}"), "v".repeat(256)))
        .collect();
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..32u64 {
        let mut g = GrackleApiClient::new(channel(&cluster, 1 + caller % 3)?);
        let (tenant, metadata) = (tenant.clone(), metadata.clone());
        callers.spawn(async move {
            let mut i = 0;
            loop {
                let request = pb::CreateSemaphoreRequest {
                    namespace_name: "flood".into(),
                    semaphore_name: format!("s{caller}-{i}"),
                    description: "d".repeat(1024),
                    permits: 1,
                    metadata: metadata.clone(),
                    ..Default::default()
                };
                match g.create_semaphore(with_token(request, Some(&tenant))).await {
                    Ok(_) => i += 1,
                    // A retry of a create that had committed.
                    Err(status) if status.code() == tonic::Code::AlreadyExists => i += 1,
                    // A loaded machine can lose its leader for a moment: retry as a client
                    // would; only a refusal ends the flood.
                    Err(status)
                        if matches!(
                            status.code(),
                            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
                        ) =>
                    {
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                    Err(status) => return (i, status),
                }
            }
        });
    }
    let mut created = 0;
    while let Some(joined) = callers.join_next().await {
        let (count, status) = joined?;
        created += count;
        expect_code(
            "a create past the quota",
            Err::<(), _>(status),
            Code::ResourceExhausted,
            &["byte quota of namespace flood reached"],
        )?;
    }
    // 64 MiB by default, each semaphore about 13.7 KB of stored bytes.
    ensure!((4_000..5_000).contains(&created), "created {created}");

    let mut quota = ConchQuotaClient::new(channel(&cluster, 2)?);
    let own = NamespaceQuotas {
        semaphores: 10_000,
        leases: 10_000,
        entries: 100_000,
        bytes: 1 << 30,
        request_ids: 10_000,
    };
    expect_code(
        "the tenant raising its own quota",
        quota
            .set_namespace_quotas(with_token(
                conch_proto::conch::SetNamespaceQuotasRequest {
                    namespace_name: "flood".into(),
                    quotas: Some(own),
                },
                Some(&tenant),
            ))
            .await,
        Code::PermissionDenied,
        &[],
    )?;
    cluster.wait_for_agreement(SHOW_UP).await?;
    // The book (Quotas): a node's memory grows by about three times the stored bytes (the state, its
    // log entries until the next snapshot, the snapshot being written).
    const FULL_NAMESPACE: u64 = 3 * (64 << 20);
    for ((id, node), before) in cluster.nodes.iter().zip(&rss_before) {
        let rss = rss_bytes(node.pid().context("running")?)?;
        ensure!(
            rss <= before + FULL_NAMESPACE + 100_000_000,
            "node {id}: RSS {} MiB after the flood, {} MiB before",
            rss >> 20,
            before >> 20
        );
    }
    // The admin may raise it; the tenant's next create then succeeds.
    let view = quota
        .get_namespace_quotas(with_token(
            conch_proto::conch::GetNamespaceQuotasRequest {
                namespace_name: "flood".into(),
            },
            Some(&tenant),
        ))
        .await?
        .into_inner();
    let usage = view.usage.context("usage")?;
    ensure!(usage.semaphores == created, "{view:?}");
    let raised = NamespaceQuotas {
        bytes: usage.bytes + (1 << 20),
        ..view.quotas.context("quotas")?
    };
    quota
        .set_namespace_quotas(with_token(
            conch_proto::conch::SetNamespaceQuotasRequest {
                namespace_name: "flood".into(),
                quotas: Some(raised),
            },
            Some(admin),
        ))
        .await?;
    let request = pb::CreateSemaphoreRequest {
        namespace_name: "flood".into(),
        semaphore_name: "after-the-raise".into(),
        permits: 1,
        ..Default::default()
    };
    grackle
        .create_semaphore(with_token(request, Some(&tenant)))
        .await?;
    Ok(())
}

/// `conch namespace quota` shows a namespace's use against its quotas to a reader and sets
/// them for a cluster admin, keeping the quotas not named; `conch cluster budget` sets the
/// state's budget; a token without cluster-admin is refused (exit 77) and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_and_the_budget_from_the_cli() -> anyhow::Result<()> {
    let (_work, cluster, admin) = cluster_with_admin(3).await?;
    let mut auth = ConchAuthClient::new(channel(&cluster, 1)?);
    let mut grackle = GrackleApiClient::new(channel(&cluster, 1)?);
    let create = pb::CreateNamespaceRequest {
        name: "team-a".into(),
        ..Default::default()
    };
    grackle
        .create_namespace(with_token(create, Some(&admin)))
        .await?;
    create_role(
        &mut auth,
        Some(&admin),
        "jobs",
        false,
        &[("team-a", "write")],
    )
    .await?;
    let (_, jobs) = create_token(&mut auth, Some(&admin), "jobs", "jobs").await?;
    cluster.wait_for_agreement(SHOW_UP).await?;
    let endpoints = cluster.endpoints().join(",");
    let as_admin = [("CONCH_TOKEN", admin.as_str())];
    let as_jobs = [("CONCH_TOKEN", jobs.as_str())];

    let (code, out, err) = conch(
        &endpoints,
        &[
            "namespace",
            "quota",
            "team-a",
            "--semaphores",
            "5",
            "--bytes",
            "1MiB",
        ],
        &as_admin,
    )
    .await?;
    ensure!(code == 0, "set: {code} {out} {err}");
    ensure!(
        out.contains("semaphores   0 of 5  (0%)") && out.contains(&format!("of {}", 1 << 20)),
        "{out}"
    );
    // The jobs token reads them (read on the namespace); the other quotas kept their defaults.
    let (code, out, err) = conch(
        &endpoints,
        &["namespace", "quota", "team-a", "--json"],
        &as_jobs,
    )
    .await?;
    ensure!(code == 0, "read: {code} {out} {err}");
    let json: serde_json::Value = serde_json::from_str(&out)?;
    ensure!(
        json["semaphores"]["quota"] == 5
            && json["bytes"]["quota"] == 1 << 20
            && json["leases"]["quota"] == 10_000
            && json["request_ids"]["quota"] == 10_000,
        "{json}"
    );
    let (code, _, err) = conch(
        &endpoints,
        &["namespace", "quota", "team-a", "--semaphores", "500"],
        &as_jobs,
    )
    .await?;
    ensure!(
        code == EX_NO_PERMISSION && err.contains("cluster-admin"),
        "{code} {err}"
    );
    let (code, out, err) = conch(&endpoints, &["cluster", "budget", "1GiB"], &as_admin).await?;
    ensure!(
        code == 0 && out.starts_with(&format!("state budget {} bytes, ", 1u64 << 30)),
        "{code} {out} {err}"
    );
    let (code, _, err) = conch(&endpoints, &["cluster", "budget", "12 parsecs"], &as_admin).await?;
    ensure!(
        code == EX_USAGE && err.contains("unknown size unit"),
        "{code} {err}"
    );
    Ok(())
}

/// Wait groups and barriers: gets, lists and waits need `read` on the namespace, every other
/// call `write`; no token is `UNAUTHENTICATED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_groups_and_barriers_need_read_to_look_and_write_to_change() -> anyhow::Result<()> {
    let (_work, cluster, admin) = cluster_with_admin(1).await?;
    let ch = channel(&cluster, 1)?;
    let mut auth = ConchAuthClient::new(ch.clone());
    let mut grackle = GrackleApiClient::new(ch.clone());
    let create_ns = pb::CreateNamespaceRequest {
        name: "sync".into(),
        ..Default::default()
    };
    grackle
        .create_namespace(with_token(create_ns, Some(&admin)))
        .await?;
    create_role(
        &mut auth,
        Some(&admin),
        "viewer",
        false,
        &[("sync", "read")],
    )
    .await?;
    create_role(
        &mut auth,
        Some(&admin),
        "editor",
        false,
        &[("sync", "write")],
    )
    .await?;
    let (_, viewer) = create_token(&mut auth, Some(&admin), "v", "viewer").await?;
    let (_, editor) = create_token(&mut auth, Some(&admin), "e", "editor").await?;

    let group = pb::CreateWaitGroupRequest {
        namespace_name: "sync".into(),
        wait_group_name: "g".into(),
        counter: 2,
        expires_at: i64::MAX,
        delete_after_finished_seconds: 60,
        ..Default::default()
    };
    let barrier = pb::CreateBarrierRequest {
        namespace_name: "sync".into(),
        barrier_name: "b".into(),
        expected_processes: 2,
        delete_inactive_after_seconds: 60,
        ..Default::default()
    };
    expect_code(
        "a viewer creates a wait group",
        grackle
            .create_wait_group(with_token(group.clone(), Some(&viewer)))
            .await,
        Code::PermissionDenied,
        &["sync"],
    )?;
    expect_code(
        "no token creates a barrier",
        grackle
            .create_barrier(with_token(barrier.clone(), None))
            .await,
        Code::Unauthenticated,
        &[],
    )?;
    grackle
        .create_wait_group(with_token(group, Some(&editor)))
        .await?;
    grackle
        .create_barrier(with_token(barrier, Some(&editor)))
        .await?;

    let complete = pb::CompleteJobsFromWaitGroupRequest {
        namespace_name: "sync".into(),
        wait_group_name: "g".into(),
        jobs: vec![pb::CompleteJobRequest {
            job_id: "j".into(),
            metadata: Default::default(),
        }],
    };
    expect_code(
        "a viewer completes a job",
        grackle
            .complete_jobs_from_wait_group(with_token(complete.clone(), Some(&viewer)))
            .await,
        Code::PermissionDenied,
        &[],
    )?;
    grackle
        .complete_jobs_from_wait_group(with_token(complete, Some(&editor)))
        .await?;
    let arrive = pb::ArriveAtBarrierRequest {
        namespace_name: "sync".into(),
        barrier_name: "b".into(),
        process_id: "p".into(),
        expected_generation: 1,
        metadata: Default::default(),
    };
    expect_code(
        "a viewer arrives",
        grackle
            .arrive_at_barrier(with_token(arrive.clone(), Some(&viewer)))
            .await,
        Code::PermissionDenied,
        &[],
    )?;
    grackle
        .arrive_at_barrier(with_token(arrive, Some(&editor)))
        .await?;

    // The viewer reads and waits.
    let wg = grackle
        .get_wait_group(with_token(
            pb::GetWaitGroupRequest {
                namespace_name: "sync".into(),
                wait_group_name: "g".into(),
            },
            Some(&viewer),
        ))
        .await?
        .into_inner()
        .wait_group;
    ensure!(
        wg.is_some_and(|w| w.completed_jobs == 1),
        "the viewer reads the group"
    );
    let waited = grackle
        .wait_for_wait_group(with_token(
            pb::WaitForWaitGroupRequest {
                namespace_name: "sync".into(),
                wait_group_name: "g".into(),
                timeout_seconds: 0,
            },
            Some(&viewer),
        ))
        .await?
        .into_inner();
    ensure!(waited.outcome == pb::WaitGroupWaitOutcome::TimedOut as i32);
    let who = grackle
        .list_barrier_participants(with_token(
            pb::ListBarrierParticipantsRequest {
                namespace_name: "sync".into(),
                barrier_name: "b".into(),
                generation: 1,
                ..Default::default()
            },
            Some(&viewer),
        ))
        .await?
        .into_inner()
        .participants;
    ensure!(who.len() == 1, "the viewer lists the participants");
    expect_code(
        "no token waits",
        grackle
            .wait_at_barrier(with_token(
                pb::WaitAtBarrierRequest {
                    namespace_name: "sync".into(),
                    barrier_name: "b".into(),
                    expected_generation: 1,
                    timeout_seconds: 0,
                },
                None,
            ))
            .await,
        Code::Unauthenticated,
        &[],
    )?;
    Ok(())
}

/// With --status-without-token the operator lets monitoring checks without credentials ask for
/// health and status: no token answers; anything else still needs its permission (a backup, a
/// namespace read), and the refusal there is a refusal (77), not an outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_without_a_token_where_the_operator_allows_it() -> anyhow::Result<()> {
    let (_work, cluster, _admin) = cluster_with_admin_and(3, &["--status-without-token"]).await?;
    let endpoints = cluster.endpoints().join(",");
    for command in [&["cluster", "health"][..], &["cluster", "status"][..]] {
        let (code, out, err) = conch(&endpoints, command, &[]).await?;
        ensure!(
            code == 0 && out.contains("healthy"),
            "{command:?} with no token: {code} {out} {err}"
        );
    }
    let (code, out, err) = conch(&endpoints, &["auth", "role", "list"], &[]).await?;
    ensure!(
        code == EX_NO_PERMISSION && !err.contains("no conch node answered"),
        "listing roles with no token: {code} {out} {err}"
    );
    Ok(())
}

/// Cluster status counts what the caller's token may read: every namespace for a cluster admin,
/// its own for a limited token, nothing (and no cluster id or state hash) for a call without a
/// token under --status-without-token; the whole state's bytes go to cluster admins only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_counts_only_what_it_may_read() -> anyhow::Result<()> {
    use conch_proto::conch::conch_quota_client::ConchQuotaClient;
    use conch_proto::conch::{ClusterStatusRequest, GetNamespaceQuotasRequest};
    let (_work, cluster, admin) = cluster_with_admin_and(1, &["--status-without-token"]).await?;
    let admin = admin.as_str();
    let ch = channel(&cluster, 1)?;
    let mut grackle = GrackleApiClient::new(ch.clone());
    for ns in ["x", "y"] {
        let create = pb::CreateNamespaceRequest {
            name: ns.into(),
            ..Default::default()
        };
        grackle
            .create_namespace(with_token(create, Some(admin)))
            .await?;
    }
    let semaphore = pb::CreateSemaphoreRequest {
        namespace_name: "x".into(),
        semaphore_name: "s".into(),
        permits: 1,
        ..Default::default()
    };
    grackle
        .create_semaphore(with_token(semaphore, Some(admin)))
        .await?;
    let mut auth = ConchAuthClient::new(ch.clone());
    create_role(&mut auth, Some(admin), "y-readers", false, &[("y", "read")]).await?;
    let (_, y) = create_token(&mut auth, Some(admin), "y", "y-readers").await?;
    let status = |token: Option<&str>| {
        let (ch, request) = (ch.clone(), with_token(ClusterStatusRequest {}, token));
        async move {
            ConchAdminClient::new(ch)
                .cluster_status(request)
                .await
                .map(tonic::Response::into_inner)
        }
    };
    let all = status(Some(admin)).await?;
    ensure!(
        all.namespaces >= 2 && all.semaphores >= 1 && all.state_hash != 0,
        "admin: {all:?}"
    );
    ensure!(!all.cluster_id.is_empty(), "admin: {all:?}");
    let limited = status(Some(&y)).await?;
    ensure!(
        (limited.namespaces, limited.semaphores) == (1, 0) && limited.state_hash != 0,
        "y: {limited:?}"
    );
    let anonymous = status(None).await?;
    ensure!(
        (
            anonymous.namespaces,
            anonymous.semaphores,
            anonymous.state_hash
        ) == (0, 0, 0)
            && anonymous.cluster_id.is_empty()
            && anonymous.leader_id == all.leader_id,
        "no token: {anonymous:?}"
    );
    let quotas = |token: &str| {
        let request = with_token(
            GetNamespaceQuotasRequest {
                namespace_name: "y".into(),
            },
            Some(token),
        );
        let ch = ch.clone();
        async move {
            ConchQuotaClient::new(ch)
                .get_namespace_quotas(request)
                .await
                .map(tonic::Response::into_inner)
        }
    };
    ensure!(quotas(admin).await?.state_bytes > 0);
    ensure!(quotas(&y).await?.state_bytes == 0);
    Ok(())
}
