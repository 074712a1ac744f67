//! The subcommands that administer the cluster: `certs`, `cluster` and `auth` (roles and
//! tokens).

use std::path::PathBuf;

use clap::Subcommand;

use super::values::size_arg;

pub(super) const CERTS_EXAMPLES: &str = "\
Examples:
  conch certs init certs                    # CA valid 10 years: ca.crt, ca.key, ca.crl
  conch certs node certs --id 1 --host node1.example.com --host 10.0.0.1
  conch certs node certs --id 2 --host 10.0.0.2 --days 90
  conch certs client certs --name ops
  conch certs revoke node 2 --dir certs     # then copy certs/ca.crl to every node

Files: certs/ca.crt, ca.key (keep it offline), ca.crl (conchd's --peer-crl),
node<ID>.crt/.key, client-<NAME>.crt/.key.

A node certificate lists serverAuth and clientAuth and names its node with the
subjectAltName URI urn:conch:node:<ID>; peers accept it only as that node. Node certificates
made by releases before the URI existed are refused as peers: issue them again.";

#[derive(Debug, Subcommand)]
pub(crate) enum CertsCommand {
    /// Create DIR (if needed) and a new CA in it: ca.crt, ca.key and an empty revocation list
    /// ca.crl.
    Init {
        /// Directory for the CA and the certificates it issues.
        dir: PathBuf,
        /// How long the CA is valid, in days (10 years by default).
        #[arg(long, default_value_t = conch_client::certs::CA_DAYS)]
        days: u32,
    },
    /// Issue DIR/node<ID>.crt and .key: a node certificate (server and client authentication,
    /// naming node ID as urn:conch:node:<ID>) for the hosts and IP addresses that clients and
    /// peers dial. Replaces an existing one.
    Node {
        /// Directory holding the CA (see `conch certs init`).
        dir: PathBuf,
        /// The node's id.
        #[arg(long)]
        id: u64,
        /// A DNS name or IP address the node is reached at (repeat for several).
        #[arg(long = "host", value_name = "HOST", required = true)]
        hosts: Vec<String>,
        /// How long the certificate is valid, in days (2 years by default; never past the CA).
        #[arg(long, default_value_t = conch_client::certs::LEAF_DAYS)]
        days: u32,
    },
    /// Issue DIR/client-<NAME>.crt and .key: a client certificate (client authentication only).
    Client {
        /// Directory holding the CA (see `conch certs init`).
        dir: PathBuf,
        /// The client's name (letters, digits, '-', '_', '.').
        #[arg(long)]
        name: String,
        /// How long the certificate is valid, in days (2 years by default; never past the CA).
        #[arg(long, default_value_t = conch_client::certs::LEAF_DAYS)]
        days: u32,
    },
    /// Revoke the certificate in DIR/node<ID>.crt or DIR/client-<NAME>.crt: add its serial
    /// number to DIR/ca.crl, signed again by the CA (earlier revocations stay). Copy ca.crl to
    /// every node (--peer-crl); nodes re-read it without a restart.
    #[command(after_help = REVOKE_EXAMPLES)]
    Revoke {
        #[command(subcommand)]
        holder: RevokeHolder,
    },
}

pub(super) const REVOKE_EXAMPLES: &str = "\
Examples:
  conch certs revoke node 2 --dir certs           # node 2's key leaked
  conch certs node certs --id 2 --host 10.0.0.2   # then issue node 2 a new certificate
  conch certs revoke client ops --dir certs
  scp certs/ca.crl node1:/etc/conch/ca.crl        # and to every other node (--peer-crl)";

#[derive(Debug, Subcommand)]
pub(crate) enum RevokeHolder {
    /// Revoke DIR/node<ID>.crt (issue the node a new one with `conch certs node`).
    Node {
        /// The node's id.
        id: u64,
        /// Directory holding the CA and the certificate.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Revoke DIR/client-<NAME>.crt.
    Client {
        /// The client's name.
        name: String,
        /// Directory holding the CA and the certificate.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ClusterCommand {
    /// Ask every node (the endpoints, then the members they report) for its Raft status.
    ///
    /// Exit status, as a health check uses it: 0 if every node answered and one of them is the
    /// leader; 1 if some node did not answer but the leader did (degraded); 2 if no node
    /// answered or none that did is the leader.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One line on the cluster's health, judged from the leader's view, and an exit status for
    /// scripts and monitoring checks.
    ///
    /// 0 healthy: a leader, and every voter up and following it; 1 degraded: a leader followed
    /// by a majority, but some voter is down, follows no leader or is catching up; 2 unhealthy:
    /// no node answered, no leader, or no majority follows the leader.
    Health {
        /// Print one JSON object instead of the line.
        #[arg(long)]
        json: bool,
    },
    /// Add a node as a non-voting learner; it starts receiving the log (start it first, with
    /// --initial-cluster naming the members and itself).
    AddLearner {
        /// The new node's id (unused in the cluster).
        id: u64,
        /// The address it serves on (host:port).
        addr: String,
    },
    /// Make learners voters (a joint-consensus membership change).
    Promote {
        /// Ids of learners to promote.
        #[arg(required = true)]
        ids: Vec<u64>,
    },
    /// Remove nodes from the cluster (voters or learners); stop them afterwards.
    Remove {
        /// Ids of nodes to remove.
        #[arg(required = true)]
        ids: Vec<u64>,
    },
    /// Ask a node to take over leadership: it campaigns (with an up-to-date log it wins), and
    /// this returns once it leads; if it did not take over in time, exits non-zero saying who
    /// leads instead.
    TransferLeader {
        /// Id of the node that should lead.
        id: u64,
    },
    /// Take a snapshot and compact the log: on the leader, on node N (--node; any endpoint
    /// forwards the call), or on every member (--all, one line each). The output names the node.
    Snapshot {
        /// The node to snapshot (default: the leader).
        #[arg(long, value_name = "N", conflicts_with = "all")]
        node: Option<u64>,
        /// Snapshot every member, one after the other.
        #[arg(long)]
        all: bool,
    },
    /// Write a consistent backup of the replicated state to FILE (`-`: stdout). Any node
    /// answers, and the backup holds every write acknowledged before the call; it is checked on
    /// receipt (SHA-256) and written atomically. Needs cluster-admin when access control is on.
    /// Restore it into new data directories with `conchd restore`.
    Backup {
        /// Where to write the backup (`-`: stdout, the summary line then goes to stderr).
        file: String,
    },
    /// End a rolling upgrade: raise the cluster version to the newest one every voter and
    /// learner speaks, switching on what the new release adds.
    ///
    /// Until this runs, every node writes only what the previous release reads, so any node can
    /// be put back on it; afterwards none can (go back by restoring a backup taken before).
    /// Refused, changing nothing, while a member does not answer or runs a release that does not
    /// speak the new version: the message names it. Prints every member's release and the
    /// cluster version before and after. Needs cluster-admin when access control is on.
    Finalize,
    /// Set the budget on the stored bytes of every namespace together (cluster-admin): growth
    /// past it is refused with RESOURCE_EXHAUSTED. Prints the budget and what is stored.
    Budget {
        /// The budget (e.g. 512MiB, 2GiB, 1000000).
        #[arg(value_parser = size_arg)]
        size: u64,
    },
}

pub(super) const AUTH_EXAMPLES: &str = "\
Examples:
  # a role that may run `conch sema` (acquire on the namespace conch), and a token for it
  conch auth role create ci
  conch auth role grant ci conch acquire
  conch auth token create ci-runner --role ci --out ci.token
  CONCH_TOKEN_FILE=ci.token conch sema deploy --max 1 -- ./deploy.sh

  # one namespace per team: team A's role may acquire in team-a only
  conch namespace create team-a
  conch auth role create jobs-a
  conch auth role grant jobs-a team-a acquire
  conch auth token create job-a --role jobs-a --out a.token
  CONCH_TOKEN_FILE=a.token conch sema nightly --namespace team-a --max 1 -- ./backup.sh

  # an administrator, then turn access control on
  conch auth role create root --cluster-admin
  conch auth token create admin --role root --out admin.token
  conch --token-file admin.token auth enable

  conch --token-file admin.token auth token list
  conch --token-file admin.token auth token revoke tk_2

Permissions, per namespace (or * for every namespace): read (get, list), write (acquire,
release, leases, semaphores; includes read), admin (create, update, delete the namespace;
includes write). A cluster-admin role may do everything, including membership changes and
these commands. While access control is on, every command needs a token that allows it.

Tokens: --out writes one to a file only its owner may read; conch refuses a --token-file (or
--key) that group or others may read, and `--token` on the command line (use --token-file or
CONCH_TOKEN). The command run by `conch sema`, `conch lock` and `conch elect` does not see
CONCH_TOKEN, CONCH_TOKEN_FILE, CONCH_CERT or CONCH_KEY.

Exit status: 0 done, 64 refused request (e.g. enable without a cluster-admin token), 65 a role
or token that does not exist (or already does), 69 no conch node answered, 77 no token, an
unknown or revoked one, or one without the permission.";

#[derive(Debug, Subcommand)]
pub(crate) enum AuthCommand {
    /// Turn access control on (refused unless a token with a cluster-admin role exists).
    Enable,
    /// Turn access control off: every call is allowed again.
    Disable,
    /// Whether access control is on, with the number of roles and tokens.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Roles: what a token may do.
    Role {
        #[command(subcommand)]
        command: RoleCommand,
    },
    /// Tokens: who may call.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum RoleCommand {
    /// Create a role (with no permissions, unless --cluster-admin).
    Create {
        /// Role name: letters, digits, '-', '_' and '.'.
        name: String,
        /// May do everything: membership, snapshots, access control, every namespace.
        #[arg(long)]
        cluster_admin: bool,
    },
    /// Give a role a permission on a namespace (replacing the one it had there).
    Grant {
        role: String,
        /// A namespace name, or * for every namespace (`conch sema`, `conch lock` and `conch
        /// elect` use the namespace conch unless told --namespace).
        namespace: String,
        /// read < acquire < write < admin: acquire runs `conch sema`/`conch lock`/`conch
        /// elect` (leases, acquire, release, creating a missing semaphore); write also changes
        /// and deletes semaphores and deletes locks; admin also the namespace itself.
        #[arg(value_parser = ["read", "acquire", "write", "admin"])]
        permission: String,
    },
    /// Take away a role's permission on a namespace.
    Revoke { role: String, namespace: String },
    /// List roles with their permissions.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a role (refused while a token uses it).
    Delete { name: String },
}

#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Create a token for a role; writes it, once, to --out FILE (created with mode 0600) or
    /// else to stdout.
    Create {
        /// A name to recognize the token by (letters, digits, '-', '_' and '.').
        name: String,
        /// The role it gets.
        #[arg(long)]
        role: String,
        /// Write the token to FILE, created readable by its owner only (0600); an existing
        /// FILE is refused unless --force.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// With --out: replace an existing FILE.
        #[arg(long, requires = "out")]
        force: bool,
    },
    /// Revoke a token by id (tk_…): calls with it are refused from then on, on every node.
    Revoke { id: String },
    /// List tokens (ids, names, roles; never the tokens themselves).
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}
