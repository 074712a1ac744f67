//! This build's release, and the record of every kept release (`RELEASES.toml` at the top of the
//! repository): what `conchd --version` prints, what the status and metrics show of each node,
//! and the names refusals of newer data give.
//!
//! What always holds (checked by the tests below): the last release in the record is this build
//! (its version, data format and cluster version), and the record lists the data format and
//! cluster version of each release in increasing order, so that a build reads the data of every
//! release listed before it.

use std::sync::OnceLock;

use serde::Deserialize;

use crate::state::version::{NEWEST, NEWEST_DATA_FORMAT, OLDEST_DATA_FORMAT};

/// This build's release.
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");

/// The record of kept releases, oldest first.
const RECORD: &str = include_str!("../../../RELEASES.toml");

/// One kept release.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Release {
    pub version: String,
    /// The commit it was built from ("" for the release in development).
    pub commit: String,
    pub data_format: u32,
    pub cluster_version: u32,
}

#[derive(Deserialize)]
struct Record {
    release: Vec<Release>,
}

/// The kept releases, oldest first (empty only if the record did not parse, which a test
/// rules out).
pub fn releases() -> &'static [Release] {
    static RELEASES: OnceLock<Vec<Release>> = OnceLock::new();
    RELEASES.get_or_init(|| {
        toml::from_str::<Record>(RECORD)
            .map(|r| r.release)
            .unwrap_or_default()
    })
}

/// The oldest kept release that speaks `cluster_version`, for messages ("release 0.2.0").
pub(crate) fn first_speaking(cluster_version: u32) -> Option<&'static str> {
    releases()
        .iter()
        .find(|r| r.cluster_version >= cluster_version)
        .map(|r| r.version.as_str())
}

/// What `conchd --version` prints after the program name: the release and commit, then the
/// data format and cluster versions, then, for a build with test machinery in it, [`TEST_BUILD`].
pub fn version_line() -> &'static str {
    static LINE: OnceLock<String> = OnceLock::new();
    LINE.get_or_init(|| {
        let mut line = format!(
            "{}\ndata format {NEWEST_DATA_FORMAT} (reads {OLDEST_DATA_FORMAT} to \
             {NEWEST_DATA_FORMAT}); cluster version {NEWEST} (speaks {} to {NEWEST})",
            conch_proto::VERSION,
            crate::state::version::BASE,
        );
        if let Some(test_build) = test_build() {
            line.push('\n');
            line.push_str(&test_build);
        }
        line
    })
}

/// How the last line of `conchd --version` starts in a build with test machinery in it (the
/// release check in packaging/dist-test.sh looks for it).
pub(crate) const TEST_BUILD: &str = "test build:";

/// What test machinery this build carries, if any: tokio built with `--cfg tokio_unstable` (the
/// simulator's seeded runtime) and, with it, the simulator's hooks (`SIM_HOOKS` in lib.rs).
/// .cargo/config.toml sets the flag for workspace builds, and rustflags apply to every crate of
/// a build alike, so what this crate sees is what tokio was built with. A release has none.
fn test_build() -> Option<String> {
    cfg!(tokio_unstable).then(|| format!("{TEST_BUILD} tokio_unstable, with the simulator's hooks"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_ends_with_this_build() {
        let last = releases().last().expect("the record lists releases");
        assert_eq!(
            last.version, RELEASE,
            "RELEASES.toml's last entry is this build"
        );
        assert_eq!(last.data_format, NEWEST_DATA_FORMAT);
        assert_eq!(last.cluster_version, NEWEST);
    }

    #[test]
    fn the_record_starts_at_the_first_kept_release_and_only_moves_forward() {
        let all = releases();
        assert_eq!(all[0].version, "0.1.0");
        assert_eq!(all[0].commit, "a960a47");
        assert_eq!(all[0].data_format, OLDEST_DATA_FORMAT);
        assert_eq!(all[0].cluster_version, crate::state::version::BASE);
        for pair in all.windows(2) {
            assert!(pair[0].data_format <= pair[1].data_format, "{pair:?}");
            assert!(
                pair[0].cluster_version <= pair[1].cluster_version,
                "{pair:?}"
            );
            assert_eq!(
                crate::state::version::data_format(pair[1].cluster_version),
                pair[1].data_format,
                "{pair:?}"
            );
        }
        // Every release but the one in development names its commit.
        assert!(all[..all.len() - 1].iter().all(|r| !r.commit.is_empty()));
    }

    #[test]
    fn messages_name_the_first_release_that_speaks_a_version() {
        assert_eq!(first_speaking(1), Some("0.1.0"));
        assert_eq!(first_speaking(NEWEST), Some(RELEASE));
        assert_eq!(first_speaking(NEWEST + 1), None);
    }

    #[test]
    fn the_version_line_names_the_release_the_format_and_the_cluster_version() {
        let line = version_line();
        assert!(line.starts_with(RELEASE), "{line}");
        assert!(
            line.contains(&format!("data format {NEWEST_DATA_FORMAT}")),
            "{line}"
        );
        assert!(
            line.contains(&format!("cluster version {NEWEST}")),
            "{line}"
        );
    }
}
