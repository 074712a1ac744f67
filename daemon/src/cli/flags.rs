//! `conchd`'s command line: its flags (each with its `CONCH_*` environment variable, the doc
//! comments being the `--help` text, declared once in the library's [`Settings`]) and its
//! subcommand, turned into the library's [`RestoreArgs`]. The binary's alone; `xtask` compiles it in as well to
//! write the man page and completions.

use std::path::PathBuf;

use clap::Parser;
use conchd::config::Settings;
use conchd::raft::restore::RestoreArgs;

/// conchd: a replicated semaphore daemon answering the Grackle semaphore API.
///
/// With no arguments it runs a single-node cluster on 127.0.0.1:7001 with its data in
/// ./conch-data. To run three nodes, start each with its own --id, --listen and --data-dir and
/// the same --initial-cluster.
#[derive(Parser, Debug)]
#[command(name = "conchd", version = conchd::release::version_line(), about, long_about, after_help = EXAMPLES)]
pub(crate) struct Flags {
    /// Every serving setting (`config::Settings`: flags, environment and config file keys).
    #[command(flatten)]
    pub settings: Settings,

    /// A one-off task instead of serving (the flags above are then not used).
    #[command(subcommand)]
    pub command: Option<Command>,
}

const EXAMPLES: &str = "\
Examples:
  conchd                                   # single node on 127.0.0.1:7001, data in ./conch-data
  conchd --id 1 --listen 127.0.0.1:7001 --data-dir /var/lib/conch/1 \\
         --initial-cluster 1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003
  CONCH_CONFIG=/etc/conch/conchd.toml conchd
  conchd --bootstrap-admin-token-file /etc/conch/admin.token \\
         --peer-secret-file /etc/conch/peer.secret         # new cluster, access control on
  conchd restore backup.conch --data-dir /var/lib/conch/1 --id 1 \\
         --initial-cluster 1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003
";

/// conchd's subcommands (without one, conchd serves).
#[derive(clap::Subcommand, Debug)]
pub(crate) enum Command {
    /// Seed a new, empty data directory from a backup file (`conch cluster backup`).
    ///
    /// Restore every node of the new cluster with its own --id and the same --initial-cluster,
    /// then start each with the usual flags: the new cluster starts with the backed-up state and
    /// a new cluster id. Refused (exit 64, nothing written) for a damaged or foreign backup file
    /// or a data directory that is not empty.
    Restore(RestoreFlags),
}

#[derive(clap::Args, Debug)]
pub(crate) struct RestoreFlags {
    /// The backup file.
    pub file: PathBuf,
    /// The new node's data directory: absent or empty.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// The new node's id (a member of --initial-cluster).
    #[arg(long)]
    pub id: u64,
    /// The new cluster's members, as id=host:port pairs, the same on every restored node.
    #[arg(long)]
    pub initial_cluster: String,
    /// The new cluster's name, recorded in the data directory (start the nodes with the same
    /// --cluster-name, or none).
    #[arg(long)]
    pub cluster_name: Option<String>,
}

impl RestoreFlags {
    /// What the library's restore is given.
    pub(crate) fn to_args(&self) -> RestoreArgs {
        RestoreArgs {
            file: self.file.clone(),
            data_dir: self.data_dir.clone(),
            id: self.id,
            initial_cluster: self.initial_cluster.clone(),
            cluster_name: self.cluster_name.clone(),
        }
    }
}
