//! Access control for harness runs (`conch-bench --auth`, `conch-jepsen --auth`): the cluster
//! starts with a bootstrap admin token, and every channel of this process sends that token.

use std::sync::OnceLock;
use std::time::Duration;

use anyhow::Context;
use conch_proto::conch::AuthStatusRequest;
use conch_proto::conch::conch_auth_client::ConchAuthClient;

use crate::net::{channel, use_token};
use crate::{Cluster, wait_for};

/// This process's admin token (one per process: every channel sends it).
fn token() -> anyhow::Result<&'static str> {
    static TOKEN: OnceLock<String> = OnceLock::new();
    if let Some(token) = TOKEN.get() {
        return Ok(token);
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let token = format!("harness-{:010}-{nanos:032}", std::process::id());
    use_token(&token)?;
    Ok(TOKEN.get_or_init(|| token))
}

/// The conchd flags that start a new cluster with access control on and this process's token as
/// its admin (every node gets them, with a peer secret so peers authenticate), and the directory
/// holding the token and secret files (keep it while the nodes run).
pub fn bootstrap_args() -> anyhow::Result<(tempfile::TempDir, Vec<String>)> {
    let dir = tempfile::Builder::new()
        .prefix("conch-token-")
        .tempdir()
        .context("tempdir")?;
    let path = dir.path().join("admin.token");
    write_secret(&path, token()?).context("write the token file")?;
    let mut args = vec![
        "--bootstrap-admin-token-file".to_string(),
        path.display().to_string(),
    ];
    args.extend(peer_secret_args(dir.path())?);
    Ok((dir, args))
}

/// The flags that make peers authenticate with a shared secret written into `dir`.
pub fn peer_secret_args(dir: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let path = dir.join("peer.secret");
    let secret = format!(
        "peer-secret-{:010}-{:032}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    );
    write_secret(&path, secret).context("write the peer secret file")?;
    Ok(vec![
        "--peer-secret-file".to_string(),
        path.display().to_string(),
    ])
}

/// Writes a file of secrets (a token, a peer secret) readable by its owner only, as conchd and
/// conch require of such files.
pub fn write_secret(path: &std::path::Path, contents: impl AsRef<[u8]>) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 600 {}", path.display()))?;
    file.write_all(contents.as_ref())
        .with_context(|| format!("write {}", path.display()))
}

/// Waits until the cluster reports access control on (the bootstrap is applied).
pub async fn wait_until_on(cluster: &Cluster, timeout: Duration) -> anyhow::Result<()> {
    let ids = cluster.ids();
    let first = ids.first().context("a cluster without nodes")?;
    let addr = cluster.addr(*first);
    wait_for("access control to be on", timeout, || {
        let addr = addr.clone();
        async move {
            let mut auth = ConchAuthClient::new(channel(&addr).await.ok()?);
            let status = auth.auth_status(AuthStatusRequest {}).await.ok()?;
            status.into_inner().enabled.then_some(())
        }
    })
    .await
}
