//! Cluster versions: which commands, fields and behaviours the replicated state may use.
//!
//! Nodes of two adjacent releases run side by side during a rolling upgrade. A node decodes only
//! the commands and the state layout of the cluster versions its release speaks, so nothing that
//! an older node could not decode, or would apply differently, may reach the log before every
//! member speaks it. The cluster version is part of the replicated state: it starts at
//! [`BASE`] (the version of 0.1.0, which recorded none), and only [`Cmd::SetClusterVersion`]
//! raises it, through the log, once every voter and learner runs a release that speaks the new
//! version (the proposer checks; see `upgrade.rs` in the daemon). It never goes down.
//!
//! What always holds here:
//! - every gated command or behaviour names its [`Gate`], and a command whose gate is closed is
//!   refused with `FailedPrecondition` naming the version it waits for, changing nothing
//! - the state's encoding at cluster version `v` is [`data_format`]`(v)`: at [`BASE`] it is
//!   byte for byte what 0.1.0 writes, so the previous release can still read every snapshot and
//!   backup until the cluster version moves past it
//!
//! [`Cmd::SetClusterVersion`]: super::Cmd::SetClusterVersion

use serde::{Deserialize, Serialize};

use super::types::Error;

/// The cluster version of a state that records none: what release 0.1.0 speaks.
pub(crate) const BASE: u32 = 1;

/// The newest cluster version this build speaks (it speaks every version from [`BASE`] on).
pub(crate) const NEWEST: u32 = 2;

/// The data format of the first release kept (0.1.0): the layout of its log entries and state.
pub(crate) const OLDEST_DATA_FORMAT: u32 = 7;

/// The data format this build writes at cluster version [`NEWEST`].
pub(crate) const NEWEST_DATA_FORMAT: u32 = data_format(NEWEST);

/// The layout of the log entries and of the state's encoding at cluster version `version`.
pub(crate) const fn data_format(version: u32) -> u32 {
    match version {
        0 | 1 => OLDEST_DATA_FORMAT,
        // 8: the state records its cluster version; `SetClusterVersion`; request ids scoped
        // to the token that sent them.
        _ => 8,
    }
}

/// The replicated cluster version. Serialized only from data format 8 on (see `snapshot.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClusterVersion(pub u32);

impl Default for ClusterVersion {
    fn default() -> Self {
        ClusterVersion(BASE)
    }
}

/// A command or behaviour that needs a cluster version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// A request id belongs to the token (and namespace) that sent it: another token's write
    /// with the same id neither receives its reply nor is refused because of it.
    ScopedRequestIds,
}

impl Gate {
    /// The cluster version from which it is open.
    pub(crate) const fn needs(self) -> u32 {
        match self {
            Gate::ScopedRequestIds => 2,
        }
    }

    #[allow(dead_code)]
    fn what(self) -> &'static str {
        match self {
            Gate::ScopedRequestIds => "request ids scoped to their token",
        }
    }

    /// Whether the gate is open at `version`.
    pub(crate) const fn open_at(self, version: ClusterVersion) -> bool {
        version.0 >= self.needs()
    }

    /// `Ok` when open at `version`; otherwise the refusal a caller gets, naming the version
    /// it waits for. The API layer checks this before proposing a command a gate guards, so
    /// that the caller hears why; this release's only gate changes how existing commands run,
    /// and the state itself asks [`Gate::open_at`].
    #[allow(dead_code)]
    pub(crate) fn check(self, version: ClusterVersion) -> Result<(), Error> {
        if self.open_at(version) {
            return Ok(());
        }
        Err(Error::failed_precondition(format!(
            "{} needs cluster version {}; the cluster runs at version {}: once every node runs \
             a release that speaks version {}, finish the upgrade with `conch cluster finalize`",
            self.what(),
            self.needs(),
            version.0,
            self.needs()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_version_writes_the_first_kept_format_and_the_newest_its_own() {
        assert_eq!(data_format(BASE), 7);
        assert_eq!(data_format(NEWEST), NEWEST_DATA_FORMAT);
        const { assert!(NEWEST_DATA_FORMAT > OLDEST_DATA_FORMAT) };
        assert_eq!(ClusterVersion::default(), ClusterVersion(BASE));
    }

    #[test]
    fn a_closed_gate_names_the_version_it_waits_for() {
        let refusal = Gate::ScopedRequestIds.check(ClusterVersion(1)).unwrap_err();
        assert_eq!(
            refusal.kind,
            super::super::types::ErrorKind::FailedPrecondition
        );
        assert!(
            refusal.message.contains("needs cluster version 2"),
            "{}",
            refusal.message
        );
        assert!(
            refusal.message.contains("conch cluster finalize"),
            "{}",
            refusal.message
        );
        assert_eq!(Gate::ScopedRequestIds.check(ClusterVersion(2)), Ok(()));
    }
}
