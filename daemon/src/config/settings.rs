//! Every serving setting of a node, declared once: [`Settings`] is `conchd`'s flags (each with
//! its `CONCH_*` environment variable; the doc comments are the `--help` text), the keys of
//! the TOML file `--config` names (the long flags with underscores), and what an embedding
//! program sets through [`crate::NodeConfig`]. [`super::Config::from_settings`] validates them.
//!
//! Precedence: flag > environment variable > config file > default.

use std::path::PathBuf;

use serde::Deserialize;

/// What a node is told. `None` (or `false`) takes the default, or the config file's value when
/// `config` names one.
#[derive(clap::Args, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// This node's id (a positive integer, unique in the cluster).
    #[arg(long, env = "CONCH_ID")]
    pub id: Option<u64>,

    /// Address to serve clients on (host:port); also peers, unless --peer-listen is given.
    #[arg(long, env = "CONCH_LISTEN")]
    pub listen: Option<String>,

    /// Address clients reach this node at (default: --listen); also peers, unless
    /// --peer-listen is given.
    #[arg(long, env = "CONCH_ADVERTISE")]
    pub advertise: Option<String>,

    /// Serve the node-to-node (peer) service on its own address (host:port) instead of the
    /// client port, so it can be firewalled apart. --initial-cluster and `conch cluster
    /// add-learner` then name peer addresses.
    #[arg(long, env = "CONCH_PEER_LISTEN")]
    pub peer_listen: Option<String>,

    /// Address other nodes reach this node's peer service at (default: --peer-listen).
    #[arg(long, env = "CONCH_PEER_ADVERTISE")]
    pub peer_advertise: Option<String>,

    /// File holding a secret shared by every node (at least 32 characters, e.g. the output of
    /// `openssl rand -hex 32`): a peer call must carry it. One way for peers to prove they are
    /// members; mutual TLS (--peer-ca) is the other. Access control needs one of them.
    #[arg(long, env = "CONCH_PEER_SECRET_FILE")]
    pub peer_secret_file: Option<PathBuf>,

    /// Directory holding the Raft log, vote and snapshots.
    #[arg(long, env = "CONCH_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Initial members, as id=host:port pairs: 1=10.0.0.1:7001,2=10.0.0.2:7001,3=10.0.0.3:7001.
    /// Used only to bootstrap an empty data directory; a restarted node ignores it.
    #[arg(long, env = "CONCH_INITIAL_CLUSTER")]
    pub initial_cluster: Option<String>,

    /// Reach these peers at other addresses than their advertised ones, as id=host:port pairs
    /// (e.g. through a relay, a tunnel or a fault-injecting proxy).
    #[arg(long, env = "CONCH_PEER_ROUTES")]
    pub peer_routes: Option<String>,

    /// TOML file with any of these settings (keys as the long flags, with underscores).
    #[arg(long, env = "CONCH_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// Raft heartbeat interval in milliseconds.
    #[arg(long, env = "CONCH_HEARTBEAT_MS")]
    pub heartbeat_ms: Option<u64>,

    /// Minimum election timeout in milliseconds (the maximum is twice this).
    #[arg(long, env = "CONCH_ELECTION_TIMEOUT_MS")]
    pub election_timeout_ms: Option<u64>,

    /// Take a snapshot (and compact the log) every this many log entries.
    #[arg(long, env = "CONCH_SNAPSHOT_EVERY")]
    pub snapshot_every: Option<u64>,

    /// How long a call waits for a leader during an election before answering Unavailable, in
    /// milliseconds.
    #[arg(long, env = "CONCH_LEADER_WAIT_MS")]
    pub leader_wait_ms: Option<u64>,

    /// Do not send the leader's new entries to the followers before its own disk sync has
    /// finished. By default the leader sends them at once, so the followers sync while it
    /// does (a write still needs a majority's syncs); this turns that off, costing a write
    /// about one sync's time.
    #[arg(long, env = "CONCH_NO_EARLY_REPLICATION")]
    pub no_early_replication: bool,

    /// Log filter, e.g. debug, or conchd=debug,openraft=info [default: info,openraft=warn, and
    /// openraft's line per retry to an unreachable peer off (conchd says it every 30 s), and its
    /// notes that a stale vote or replication answer was ignored (every election has them)].
    #[arg(long, env = "CONCH_LOG")]
    pub log: Option<String>,

    /// Serve TLS with this certificate chain (PEM); needs --tls-key. Re-read when the file
    /// changes or on SIGHUP.
    #[arg(long, env = "CONCH_TLS_CERT", help_heading = "TLS")]
    pub tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "CONCH_TLS_KEY", help_heading = "TLS")]
    pub tls_key: Option<PathBuf>,

    /// Require a client certificate signed by this CA (PEM) on every connection.
    #[arg(long, env = "CONCH_CLIENT_CA", help_heading = "TLS")]
    pub client_ca: Option<PathBuf>,

    /// Mutual TLS between nodes: peers must present a node certificate signed by this CA (PEM),
    /// and this node presents --tls-cert when it dials them. May be the same CA as --client-ca.
    #[arg(long, env = "CONCH_PEER_CA", help_heading = "TLS")]
    pub peer_ca: Option<PathBuf>,

    /// Certificate revocation lists of the peer CA (PEM, one or more; needs --peer-ca): a
    /// revoked certificate is refused as a peer (and as a client). Re-read when the file changes
    /// or on SIGHUP; `conch certs revoke` writes one.
    #[arg(long, env = "CONCH_PEER_CRL", help_heading = "TLS")]
    pub peer_crl: Option<PathBuf>,

    /// File holding the first cluster-admin token (at least 32 characters). Give it to every
    /// node of a new cluster: the token's hash is installed with a cluster-admin role and access
    /// control turned on, exactly once, and until that is committed the node answers no client
    /// call. Needs peer authentication (--peer-secret-file or --peer-ca).
    #[arg(long, env = "CONCH_BOOTSTRAP_ADMIN_TOKEN_FILE")]
    pub bootstrap_admin_token_file: Option<PathBuf>,

    /// This node joins a running cluster: with an empty data directory it never bootstraps one
    /// (whatever --initial-cluster says) and waits to be added with `conch cluster add-learner`.
    #[arg(long, env = "CONCH_JOIN")]
    pub join: bool,

    /// The cluster's name (1-64 characters of letters, digits, '-', '_', '.'), recorded in the
    /// data directory when the node bootstraps or first joins. A later start with another
    /// name is refused, and peers of another name are not listened to.
    #[arg(long, env = "CONCH_CLUSTER_NAME")]
    pub cluster_name: Option<String>,

    /// Serve Prometheus metrics over HTTP on host:port at /metrics [default: 127.0.0.1 at the
    /// --listen port + 100, e.g. 7101 for 7001];
    /// `off` serves none. /metrics has no access control: keep it on loopback or a
    /// monitoring network.
    #[arg(long, env = "CONCH_METRICS_LISTEN", help_heading = "Operations")]
    pub metrics_listen: Option<String>,

    /// Serve the read-only status page (who holds what, who waits, the cluster's health) over
    /// HTTP on host:port at /ui/ [default: off]; HTTPS with this node's certificate when
    /// --tls-cert is set. With access control on, the page asks for a token and shows only
    /// what it may read; with it off, anyone who reaches the port sees every namespace.
    #[arg(long, env = "CONCH_UI_LISTEN", help_heading = "Operations")]
    pub ui_listen: Option<String>,

    /// Log line format on stderr: `text` (default) or `json` (one object per line, for log
    /// shippers).
    #[arg(long, env = "CONCH_LOG_FORMAT", help_heading = "Operations")]
    pub log_format: Option<String>,

    /// Threads that serve this node's calls and run Raft [default: one per CPU]. On a small
    /// machine, 1 answers a lone client sooner (no thread switches within a write) while more
    /// serve many clients faster; see the book's Operations chapter for measurements.
    #[arg(long, env = "CONCH_WORKER_THREADS", help_heading = "Operations")]
    pub worker_threads: Option<usize>,

    /// Answer cluster status (`conch cluster status`, `conch cluster health`) without a token,
    /// as a health check needs no credentials. With access control on, status otherwise needs a
    /// known token (any role). Status shows members, roles, terms and log indexes, nothing of
    /// the namespaces.
    #[arg(long, env = "CONCH_STATUS_WITHOUT_TOKEN", help_heading = "Operations")]
    pub status_without_token: bool,

    /// Most connections one IP address may hold open on each of the node's listeners (client,
    /// peer, metrics, status page); one more is closed at once and counted in
    /// conch_connections_refused_total. Many clients on one host share its address [default:
    /// 1000].
    #[arg(
        long,
        env = "CONCH_MAX_CONNECTIONS_PER_ADDRESS",
        help_heading = "Operations"
    )]
    pub max_connections_per_address: Option<usize>,

    /// Take a data directory that holds a node's state but no node-id file as this node's
    /// (--id), recording the id. Without it such a directory is refused: every release records
    /// the id, so a directory without it is a copy or a damaged one, and a copy of another
    /// node's directory must not join as this node with that node's log and vote. Also starts
    /// the node, with a warning, on a directory it did not create whose Raft membership leaves
    /// it out (refused otherwise: a copy whose node-id file was edited).
    #[arg(long, env = "CONCH_ADOPT_DATA_DIR", help_heading = "Operations")]
    pub adopt_data_dir: bool,
}

impl Settings {
    /// These settings over `file`'s: each one given here wins, the file's fills the rest (a
    /// switch is on when either turns it on). `config` stays this one's.
    pub fn over(self, file: Settings) -> Settings {
        Settings {
            id: self.id.or(file.id),
            listen: self.listen.or(file.listen),
            advertise: self.advertise.or(file.advertise),
            peer_listen: self.peer_listen.or(file.peer_listen),
            peer_advertise: self.peer_advertise.or(file.peer_advertise),
            peer_secret_file: self.peer_secret_file.or(file.peer_secret_file),
            data_dir: self.data_dir.or(file.data_dir),
            initial_cluster: self.initial_cluster.or(file.initial_cluster),
            peer_routes: self.peer_routes.or(file.peer_routes),
            config: self.config,
            heartbeat_ms: self.heartbeat_ms.or(file.heartbeat_ms),
            election_timeout_ms: self.election_timeout_ms.or(file.election_timeout_ms),
            snapshot_every: self.snapshot_every.or(file.snapshot_every),
            leader_wait_ms: self.leader_wait_ms.or(file.leader_wait_ms),
            no_early_replication: self.no_early_replication || file.no_early_replication,
            log: self.log.or(file.log),
            tls_cert: self.tls_cert.or(file.tls_cert),
            tls_key: self.tls_key.or(file.tls_key),
            client_ca: self.client_ca.or(file.client_ca),
            peer_ca: self.peer_ca.or(file.peer_ca),
            peer_crl: self.peer_crl.or(file.peer_crl),
            bootstrap_admin_token_file: self
                .bootstrap_admin_token_file
                .or(file.bootstrap_admin_token_file),
            join: self.join || file.join,
            cluster_name: self.cluster_name.or(file.cluster_name),
            metrics_listen: self.metrics_listen.or(file.metrics_listen),
            ui_listen: self.ui_listen.or(file.ui_listen),
            log_format: self.log_format.or(file.log_format),
            worker_threads: self.worker_threads.or(file.worker_threads),
            status_without_token: self.status_without_token || file.status_without_token,
            max_connections_per_address: self
                .max_connections_per_address
                .or(file.max_connections_per_address),
            adopt_data_dir: self.adopt_data_dir || file.adopt_data_dir,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{Args, Command};

    use super::*;

    /// What parsing a config file holding only `key = value` says (`None`: it parsed).
    fn parse_error(key: &str, value: &str) -> Option<String> {
        toml::from_str::<Settings>(&format!("{key} = {value}\n"))
            .err()
            .map(|e| e.to_string())
    }

    /// The one declaration gives each flag its environment variable and its config file key
    /// (the long flag with underscores), all but `--config` itself.
    #[test]
    fn every_flag_has_its_variable_and_its_file_key() {
        let command = Settings::augment_args(Command::new("conchd"));
        let mut keys = 0;
        for arg in command.get_arguments() {
            let long = arg.get_long().unwrap_or_default();
            let env = arg.get_env().and_then(|e| e.to_str()).unwrap_or_default();
            let upper = long.to_uppercase().replace('-', "_");
            assert_eq!(env, format!("CONCH_{upper}"), "--{long}");
            let key = long.replace('-', "_");
            // A value of the wrong type is refused for what it is; an unknown key names itself
            // as unknown.
            let said = parse_error(&key, "[]").unwrap_or_default();
            if long == "config" {
                assert!(said.contains("unknown field"), "--config in a file: {said}");
            } else {
                assert!(!said.contains("unknown field"), "--{long} as {key}: {said}");
                keys += 1;
            }
        }
        assert!(keys >= 30, "{keys} file keys");
        assert!(
            parse_error("bogus_key", "1").is_some_and(|e| e.contains("unknown field")),
            "an unknown key is refused"
        );
    }

    #[test]
    fn given_settings_win_over_the_files_and_switches_add_up() {
        let file = Settings {
            id: Some(2),
            listen: Some("127.0.0.1:7002".into()),
            join: true,
            ..Settings::default()
        };
        let given = Settings {
            id: Some(3),
            config: Some(PathBuf::from("conchd.toml")),
            adopt_data_dir: true,
            ..Settings::default()
        };
        let merged = given.over(file);
        assert_eq!(merged.id, Some(3));
        assert_eq!(merged.listen.as_deref(), Some("127.0.0.1:7002"));
        assert!(merged.join && merged.adopt_data_dir);
        assert_eq!(merged.config, Some(PathBuf::from("conchd.toml")));
        assert_eq!(merged.heartbeat_ms, None);
    }
}
