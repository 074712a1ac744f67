//! Daemon configuration: [`Settings`] (`conchd`'s flags and `CONCH_*` environment variables,
//! or an embedding program's, over an optional TOML file of the same settings), validated once
//! into a read-only [`Config`].
//!
//! Precedence: flag > environment variable > config file > default.

mod settings;

pub use settings::Settings;

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::tls::{Tls, TlsFiles};

pub const DEFAULT_LISTEN: &str = "127.0.0.1:7001";
pub const DEFAULT_DATA_DIR: &str = "conch-data";
/// conchd's lifecycle at info; openraft's own election chatter only when something is wrong,
/// and not its line per retry to an unreachable peer (conchd says that once per 30 s itself).
/// `openraft::core::raft_core` warns only that it ignores a stale message (a vote answer or a
/// replication result of a term or membership that has passed), which every election with more
/// than one candidate produces, a clean start included: nothing is wrong, so errors only.
pub const DEFAULT_LOG: &str = concat!(
    "info,openraft=warn,openraft::replication=off,",
    "openraft::engine::handler::replication_handler=error,",
    "openraft::core::raft_core=error"
);
/// Prometheus metrics on loopback only, unless the operator says otherwise: the default node's
/// address (see [`default_metrics_listen`]).
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:7101";
/// The default metrics port is the client port plus this, so nodes on one host do not collide.
pub const METRICS_PORT_OFFSET: u16 = 100;

/// Where `/metrics` is served when `--metrics-listen` is not given: on loopback, at the client
/// port plus [`METRICS_PORT_OFFSET`] (7001 → 7101, 7004 → 7104); any free port when that is not
/// a port (the client port is 0, or too high).
pub fn default_metrics_listen(listen: SocketAddr) -> String {
    let port = match listen.port() {
        0 => 0,
        port => port.checked_add(METRICS_PORT_OFFSET).unwrap_or(0),
    };
    format!("127.0.0.1:{port}")
}

/// Most worker threads `--worker-threads` accepts.
pub const MAX_WORKER_THREADS: usize = 1024;

/// Validated configuration; read-only once built.
#[derive(Clone, Debug)]
pub struct Config {
    pub id: u64,
    pub listen: SocketAddr,
    /// The client address this node advertises.
    pub advertise: String,
    /// The peer service's own address (`--peer-listen`); `None`: peers share `listen`.
    pub peer_listen: Option<SocketAddr>,
    /// The address peers reach this node at: its address in the Raft membership.
    pub peer_advertise: String,
    /// SHA-256 of the shared peer secret (`--peer-secret-file`).
    pub peer_secret: Option<[u8; 32]>,
    pub data_dir: PathBuf,
    /// Members to bootstrap with when the data directory is empty.
    pub initial_cluster: BTreeMap<u64, String>,
    /// Addresses to dial peers at instead of their advertised ones.
    pub peer_routes: BTreeMap<u64, String>,
    pub heartbeat: Duration,
    pub election_timeout: Duration,
    pub snapshot_every: u64,
    pub leader_wait: Duration,
    pub log: String,
    /// TLS on the node's port and between nodes; `None` serves plaintext.
    pub tls: Option<Arc<Tls>>,
    /// SHA-256 of the bootstrap admin token (`--bootstrap-admin-token-file`).
    pub bootstrap_admin_token: Option<crate::state::auth::TokenHash>,
    /// Never bootstrap: an empty node waits to be added to a running cluster (`--join`).
    pub join: bool,
    /// The cluster's name (`--cluster-name`), checked against the data directory's.
    pub cluster_name: Option<String>,
    /// Where `/metrics` is served; `None` with `--metrics-listen off`.
    pub metrics_listen: Option<SocketAddr>,
    /// Where the status page is served (`--ui-listen`); `None`, the default, serves none.
    pub ui_listen: Option<SocketAddr>,
    pub log_format: LogFormat,
    /// Worker threads of the runtime `conchd` starts; `None`: one per CPU. (An embedding
    /// program runs the node on its own runtime.)
    pub worker_threads: Option<usize>,
    /// Cluster status answers calls without a token (`--status-without-token`).
    pub status_without_token: bool,
    /// The leader sends new entries to its followers before its own sync finished
    /// (`--no-early-replication` turns it off; see `raft/early.rs`).
    pub early_replication: bool,
    /// Most connections one IP address may hold open on each listener
    /// (`--max-connections-per-address`).
    pub max_connections_per_address: usize,
    /// Take a data directory holding state without `node-id` as this node's
    /// (`--adopt-data-dir`, see `data_dir.rs`).
    pub adopt_data_dir: bool,
    /// How calls to other nodes connect when not over the operating system's TCP (see
    /// `transport.rs`); `None`, always for `conchd`: TCP.
    pub dial: Option<crate::net::transport::Dial>,
    /// The newest cluster version this node speaks: this build's newest for `conchd`; lower
    /// only for a program that runs a node as a previous release would (the simulator's
    /// version skew, see `upgrade.rs`).
    pub cluster_version_max: u32,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("read config file {path}: {source}")]
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parse config file {path}: {message}")]
    ParseFile { path: PathBuf, message: String },
    #[error("{0}")]
    Invalid(String),
}

impl Config {
    pub fn from_settings(given: Settings) -> Result<Config, ConfigError> {
        let file = match &given.config {
            Some(path) => read_file(path)?,
            None => Settings::default(),
        };
        let flags = given.over(file);
        let id = flags.id.unwrap_or(1);
        if id == 0 {
            return Err(ConfigError::Invalid(
                "--id must be a positive integer".into(),
            ));
        }
        let listen_text = flags.listen.unwrap_or_else(|| DEFAULT_LISTEN.to_string());
        let listen = resolve(&listen_text)
            .map_err(|e| ConfigError::Invalid(format!("--listen {listen_text}: {e}")))?;
        let advertise = flags.advertise.unwrap_or_else(|| listen.to_string());
        let advertised = resolve(&advertise)
            .map_err(|e| ConfigError::Invalid(format!("--advertise {advertise}: {e}")))?;
        if advertised.ip().is_unspecified() {
            return Err(ConfigError::Invalid(format!(
                "--advertise {advertise} is not an address other nodes can reach; \
                 with --listen on all interfaces, set --advertise to this node's address"
            )));
        }
        let (peer_listen, peer_advertise) =
            peer_addresses(flags.peer_listen, flags.peer_advertise, listen, &advertise)?;
        let peer_secret = match flags.peer_secret_file {
            Some(path) => Some(read_secret_file("--peer-secret-file", &path)?),
            None => None,
        };
        let data_dir = flags
            .data_dir
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        let initial_cluster = match flags.initial_cluster {
            Some(text) => parse_initial_cluster(&text)?,
            None => BTreeMap::from([(id, peer_advertise.clone())]),
        };
        match initial_cluster.get(&id) {
            Some(addr) if *addr == peer_advertise => {}
            Some(addr) => {
                let which = if peer_listen.is_some() {
                    "its peer service listens/advertises"
                } else {
                    "this node listens/advertises"
                };
                return Err(ConfigError::Invalid(format!(
                    "--initial-cluster names node {id} at {addr}, but {which} {peer_advertise}"
                )));
            }
            None => {
                return Err(ConfigError::Invalid(format!(
                    "--initial-cluster does not include this node's --id {id}"
                )));
            }
        }
        let peer_routes = match flags.peer_routes {
            Some(text) => parse_members("--peer-routes", &text)?,
            None => BTreeMap::new(),
        };
        let heartbeat_ms = flags.heartbeat_ms.unwrap_or(100);
        let election_ms = flags.election_timeout_ms.unwrap_or(300);
        if heartbeat_ms == 0 || election_ms < heartbeat_ms * 3 {
            return Err(ConfigError::Invalid(format!(
                "--election-timeout-ms ({election_ms}) must be at least 3x --heartbeat-ms ({heartbeat_ms}), and both positive"
            )));
        }
        let snapshot_every = flags.snapshot_every.unwrap_or(10_000);
        if snapshot_every < 10 {
            return Err(ConfigError::Invalid(
                "--snapshot-every must be at least 10".into(),
            ));
        }
        let worker_threads = flags.worker_threads;
        if let Some(n) = worker_threads
            && !(1..=MAX_WORKER_THREADS).contains(&n)
        {
            return Err(ConfigError::Invalid(format!(
                "--worker-threads must be between 1 and {MAX_WORKER_THREADS}, not {n}"
            )));
        }
        let max_connections_per_address = flags
            .max_connections_per_address
            .unwrap_or(crate::net::connections::DEFAULT_PER_ADDRESS);
        if !(1..=crate::net::connections::MAX_CONNECTIONS).contains(&max_connections_per_address) {
            return Err(ConfigError::Invalid(format!(
                "--max-connections-per-address must be between 1 and {}, not \
                 {max_connections_per_address}",
                crate::net::connections::MAX_CONNECTIONS
            )));
        }
        let leader_wait_ms = flags.leader_wait_ms.unwrap_or(3_000);
        let tls = tls_settings(
            flags.tls_cert,
            flags.tls_key,
            flags.client_ca,
            flags.peer_ca,
            flags.peer_crl,
        )?;
        let join = flags.join;
        let status_without_token = flags.status_without_token;
        if tls.as_ref().is_some_and(|t| !t.peer_mtls()) && (initial_cluster.len() > 1 || join) {
            return Err(ConfigError::Invalid(
                "--tls-cert on a cluster of several nodes needs --peer-ca: nodes dial each other \
                 over TLS and check each other's certificates against it"
                    .into(),
            ));
        }
        let cluster_name = flags.cluster_name;
        if let Some(name) = &cluster_name {
            crate::data_dir::check_cluster_name(name).map_err(ConfigError::Invalid)?;
        }
        let bootstrap_admin_token = match flags.bootstrap_admin_token_file {
            Some(path) => Some(read_token_file(&path)?),
            None => None,
        };
        let peers_authenticate =
            peer_secret.is_some() || tls.as_ref().is_some_and(|t| t.peer_mtls());
        if bootstrap_admin_token.is_some() && !peers_authenticate {
            return Err(ConfigError::Invalid(
                "--bootstrap-admin-token-file needs peer authentication: without it anyone who \
                 reaches the peer service can change the state unchecked; add \
                 --peer-secret-file (the same file on every node) or --peer-ca with node \
                 certificates"
                    .into(),
            ));
        }
        let metrics_text = flags
            .metrics_listen
            .unwrap_or_else(|| default_metrics_listen(listen));
        let metrics_listen = match metrics_text.trim() {
            "off" => None,
            text => Some(resolve(text).map_err(|e| {
                ConfigError::Invalid(format!("--metrics-listen {text}: {e} (or `off`)"))
            })?),
        };
        if metrics_listen.is_some_and(|m| m.port() != 0 && (m == listen || Some(m) == peer_listen))
        {
            return Err(ConfigError::Invalid(format!(
                "--metrics-listen {metrics_text} is the --listen address; choose another port"
            )));
        }
        let ui_listen = match flags.ui_listen {
            None => None,
            Some(text) => match text.trim() {
                "off" => None,
                trimmed => {
                    let addr = resolve(trimmed).map_err(|e| {
                        ConfigError::Invalid(format!("--ui-listen {trimmed}: {e} (or `off`)"))
                    })?;
                    let taken = [
                        ("--listen", Some(listen)),
                        ("--peer-listen", peer_listen),
                        ("--metrics-listen", metrics_listen),
                    ]
                    .into_iter()
                    .find(|(_, other)| addr.port() != 0 && *other == Some(addr));
                    if let Some((flag, _)) = taken {
                        return Err(ConfigError::Invalid(format!(
                            "--ui-listen {trimmed} is the {flag} address; choose another port"
                        )));
                    }
                    Some(addr)
                }
            },
        };
        let log_format = match flags.log_format.as_deref() {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                return Err(ConfigError::Invalid(format!(
                    "--log-format {other:?}: expected text or json"
                )));
            }
        };
        Ok(Config {
            id,
            listen,
            advertise,
            peer_listen,
            peer_advertise,
            peer_secret,
            data_dir,
            initial_cluster,
            peer_routes,
            heartbeat: Duration::from_millis(heartbeat_ms),
            election_timeout: Duration::from_millis(election_ms),
            snapshot_every,
            leader_wait: Duration::from_millis(leader_wait_ms),
            log: flags.log.unwrap_or_else(|| DEFAULT_LOG.to_string()),
            tls,
            bootstrap_admin_token,
            join,
            cluster_name,
            metrics_listen,
            ui_listen,
            log_format,
            worker_threads,
            status_without_token,
            early_replication: !flags.no_early_replication,
            max_connections_per_address,
            adopt_data_dir: flags.adopt_data_dir,
            dial: None,
            cluster_version_max: crate::state::version::NEWEST,
        })
    }
}

impl Config {
    /// Whether peers prove they are members: a shared secret, or node certificates.
    pub fn peers_authenticate(&self) -> bool {
        self.peer_secret.is_some() || self.tls.as_ref().is_some_and(|t| t.peer_mtls())
    }
}

/// The peer service's own listen address, if any, and the address peers reach this node at.
fn peer_addresses(
    listen_text: Option<String>,
    advertise_text: Option<String>,
    listen: SocketAddr,
    advertise: &str,
) -> Result<(Option<SocketAddr>, String), ConfigError> {
    let Some(listen_text) = listen_text else {
        if advertise_text.is_some() {
            return Err(ConfigError::Invalid(
                "--peer-advertise needs --peer-listen (without it peers use --advertise)".into(),
            ));
        }
        return Ok((None, advertise.to_string()));
    };
    let peer_listen = resolve(&listen_text)
        .map_err(|e| ConfigError::Invalid(format!("--peer-listen {listen_text}: {e}")))?;
    if peer_listen == listen && peer_listen.port() != 0 {
        return Err(ConfigError::Invalid(format!(
            "--peer-listen {listen_text} is the --listen address; choose another port (or leave \
             --peer-listen out to serve peers on the client port)"
        )));
    }
    let peer_advertise = advertise_text.unwrap_or_else(|| peer_listen.to_string());
    let advertised = resolve(&peer_advertise)
        .map_err(|e| ConfigError::Invalid(format!("--peer-advertise {peer_advertise}: {e}")))?;
    if advertised.ip().is_unspecified() {
        return Err(ConfigError::Invalid(format!(
            "--peer-advertise {peer_advertise} is not an address other nodes can reach; with \
             --peer-listen on all interfaces, set --peer-advertise to this node's address"
        )));
    }
    Ok((Some(peer_listen), peer_advertise))
}

/// Reads a secret file for `flag` (surrounding whitespace ignored) and returns its SHA-256; one
/// that group or others may read or change is refused.
fn read_secret_file(flag: &str, path: &Path) -> Result<[u8; 32], ConfigError> {
    use crate::support::secret::{TOKEN_MIN_CHARS, hash_token};
    if let Some(problem) = crate::base::private_file::problem(path) {
        return Err(ConfigError::Invalid(format!(
            "{flag} {}: {problem}",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::Invalid(format!("{flag} {}: {e}", path.display())))?;
    let secret = text.trim();
    if secret.chars().count() < TOKEN_MIN_CHARS || secret.chars().any(char::is_whitespace) {
        return Err(ConfigError::Invalid(format!(
            "{flag} {}: the secret must be one word of at least {TOKEN_MIN_CHARS} characters \
             (e.g. the output of `openssl rand -hex 32`)",
            path.display()
        )));
    }
    Ok(hash_token(secret))
}

/// Checks the TLS flags fit together and loads the files (every problem is one line naming the
/// flag and the file).
fn tls_settings(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
    peer_ca: Option<PathBuf>,
    peer_crl: Option<PathBuf>,
) -> Result<Option<Arc<Tls>>, ConfigError> {
    if peer_crl.is_some() && peer_ca.is_none() {
        return Err(ConfigError::Invalid(
            "--peer-crl needs --peer-ca: it revokes certificates of the peer CA".into(),
        ));
    }
    let (cert, key) = match (cert, key) {
        (Some(cert), Some(key)) => (cert, key),
        (Some(_), None) => {
            return Err(ConfigError::Invalid(
                "--tls-cert needs --tls-key (the certificate's private key)".into(),
            ));
        }
        (None, Some(_)) => {
            return Err(ConfigError::Invalid(
                "--tls-key needs --tls-cert (the certificate it belongs to)".into(),
            ));
        }
        (None, None) => {
            for (flag, given) in [
                ("--client-ca", &client_ca),
                ("--peer-ca", &peer_ca),
                ("--peer-crl", &peer_crl),
            ] {
                if given.is_some() {
                    return Err(ConfigError::Invalid(format!(
                        "{flag} needs --tls-cert and --tls-key: certificates are checked only over TLS"
                    )));
                }
            }
            return Ok(None);
        }
    };
    let files = TlsFiles {
        cert,
        key,
        client_ca,
        peer_ca,
        peer_crl,
    };
    Tls::load(files)
        .map(|tls| Some(Arc::new(tls)))
        .map_err(|e| ConfigError::Invalid(e.to_string()))
}

/// Reads the bootstrap token file and returns the token's hash.
fn read_token_file(path: &Path) -> Result<crate::state::auth::TokenHash, ConfigError> {
    read_secret_file("--bootstrap-admin-token-file", path)
}

fn read_file(path: &Path) -> Result<Settings, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::ParseFile {
        path: path.to_path_buf(),
        message: one_line(&text, &e),
    })
}

/// A TOML error as one line: where it is, then what is wrong (the library's own rendering
/// quotes the file over several lines).
fn one_line(text: &str, error: &toml::de::Error) -> String {
    let message = error
        .message()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let Some(before) = error.span().and_then(|span| text.get(..span.start)) else {
        return message;
    };
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    format!("line {line}, column {column}: {message}")
}

fn resolve(addr: &str) -> Result<SocketAddr, String> {
    addr.to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or_else(|| "resolves to no address".to_string())
}

/// Parses `1=host:port,2=host:port`.
pub fn parse_initial_cluster(text: &str) -> Result<BTreeMap<u64, String>, ConfigError> {
    parse_members("--initial-cluster", text)
}

/// Parses `id=host:port` pairs for the flag `flag`.
fn parse_members(flag: &str, text: &str) -> Result<BTreeMap<u64, String>, ConfigError> {
    let mut members = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part.split_once('=').ok_or_else(|| {
            ConfigError::Invalid(format!("{flag} entry {part:?} is not id=host:port"))
        })?;
        let id: u64 = id.trim().parse().map_err(|_| {
            ConfigError::Invalid(format!(
                "{flag} entry {part:?}: node id must be a positive integer"
            ))
        })?;
        if id == 0 {
            return Err(ConfigError::Invalid(format!(
                "{flag} entry {part:?}: node id must be positive"
            )));
        }
        let addr = addr.trim().to_string();
        resolve(&addr).map_err(|e| ConfigError::Invalid(format!("{flag} entry {part:?}: {e}")))?;
        if members.insert(id, addr).is_some() {
            return Err(ConfigError::Invalid(format!(
                "{flag} names node {id} twice"
            )));
        }
    }
    if members.is_empty() {
        return Err(ConfigError::Invalid(format!("{flag} is empty")));
    }
    Ok(members)
}

#[cfg(test)]
mod tests;
