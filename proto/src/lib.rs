//! Generated code for conch's wire contract.
//!
//! - [`grackle`]: the Grackle semaphore API (`com.evrblk.grackle.v1beta.GrackleApi`), with
//!   conch's extension fields numbered from 100.
//! - [`conch`]: conch's own services: `ConchApi` (waiter listing), `ConchAdmin` (cluster
//!   status and membership), `ConchPeer` (node-to-node Raft traffic), `ConchAuth` (access
//!   control: roles and tokens) and `ConchQuota` (namespace quotas and the state's budget).
//! - [`backup`]: the backup file that `ConchAdmin.Backup` streams and `conchd restore` reads.
//! - [`wire`]: the metadata keys and request limits that conchd and its clients share.

#![allow(clippy::all, missing_docs)]

pub mod backup;
pub mod wire;

/// Modules laid out like the protobuf packages, so cross-package references resolve.
pub mod packages {
    pub mod com {
        pub mod evrblk {
            pub mod grackle {
                pub mod v1beta {
                    tonic::include_proto!("com.evrblk.grackle.v1beta");
                }
            }
        }
    }
    pub mod conch {
        pub mod v1 {
            tonic::include_proto!("conch.v1");
        }
    }
}

pub use packages::com::evrblk::grackle::v1beta as grackle;
pub use packages::conch::v1 as conch;

/// Encoded file descriptor set of every service, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("conch_descriptor");

/// The commit conch was built from (12 hex digits), or `unknown` outside a git checkout.
pub const BUILD_COMMIT: &str = env!("CONCH_BUILD_COMMIT");

/// `<version> (commit <commit>)`, what `conchd --version` and `conch --version` print.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("CONCH_BUILD_COMMIT"),
    ")"
);
