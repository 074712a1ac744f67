//! Who this conch is, as the holders and waiters of `conch sema`, `conch elect` and
//! `conch lock` show it: host, pid, start time and command, carried as metadata.

use std::collections::HashMap;

use conch_client::sema::{self, META_CMD, META_HOST, META_PID, META_SINCE};

use crate::timefmt::now_rfc3339;

/// Who this conch is, as holders and waiters show it.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub host: String,
    pub pid: u32,
    pub since: String,
    pub cmd: String,
}

/// This machine's host name, as `gethostname(2)` reports it (`unknown` if it is empty).
pub(crate) fn hostname() -> String {
    let name = gethostname::gethostname();
    let name = name.to_string_lossy();
    let name = name.trim();
    if name.is_empty() {
        "unknown".to_string()
    } else {
        name.to_string()
    }
}

impl Identity {
    pub(crate) fn current(command: &[String]) -> Identity {
        Identity {
            host: hostname(),
            pid: std::process::id(),
            since: now_rfc3339(),
            cmd: command.join(" "),
        }
    }

    /// Metadata for the lease and for the waiter/holder (values cut to the server's limit).
    pub(crate) fn metadata(&self) -> HashMap<String, String> {
        let cut = |s: &str| sema::truncate_utf8(s, sema::MAX_META_VALUE_LEN).to_string();
        HashMap::from([
            (META_HOST.to_string(), cut(&self.host)),
            (META_PID.to_string(), self.pid.to_string()),
            (META_SINCE.to_string(), self.since.clone()),
            (META_CMD.to_string(), cut(&self.cmd)),
        ])
    }

    pub(crate) fn process_id(&self) -> String {
        sema::process_id(&self.host, self.pid)
    }
}
