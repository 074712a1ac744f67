//! How `conch sema` lays its semaphores out in the Grackle data model, shared by the CLI and
//! anything that wants to interoperate with it.
//!
//! - Everything lives in one namespace: [`NAMESPACE`] (`conch`) unless `--namespace` names
//!   another (one per team keeps teams' tokens away from each other's semaphores).
//! - The identity of a semaphore is (name, max): `conch sema video-encode --max 2` uses the
//!   semaphore `video-encode.2` with 2 permits, so callers with different `--max` never share a
//!   semaphore (and `--who` shows both).
//! - `--spread` also takes, with the same lease, one permit of `video-encode.2.host-<host>`
//!   (1 permit), so a host holds at most one slot. Host names are reduced to `[-_0-9a-zA-Z]`, so
//!   a host semaphore never ends in `.<digits>` and cannot collide with a main one.
//! - Holders and waiters carry metadata [`META_HOST`], [`META_PID`], [`META_SINCE`] (RFC 3339)
//!   and [`META_CMD`], so `--who` works across machines.

/// The namespace `conch sema` and `conch elect` use unless told `--namespace`.
pub const NAMESPACE: &str = "conch";
/// Holder/waiter metadata key: the host name of the process.
pub const META_HOST: &str = "host";
/// Holder/waiter metadata key: the process id of `conch`.
pub const META_PID: &str = "pid";
/// Holder/waiter metadata key: when `conch` started, RFC 3339.
pub const META_SINCE: &str = "since";
/// Holder/waiter metadata key: the command line (truncated to fit).
pub const META_CMD: &str = "cmd";

/// Longest namespace or semaphore name the server accepts.
pub const MAX_NAME_LEN: usize = conch_proto::wire::NAME_MAX_CHARS;
/// The largest `--max`: the server's limit on a semaphore's permits.
pub const MAX_PERMITS: u64 = conch_proto::wire::PERMITS_MAX;
/// Longest metadata value the server accepts, in bytes.
pub const MAX_META_VALUE_LEN: usize = conch_proto::wire::METADATA_VALUE_MAX_BYTES;
/// Longest lease `process_id` the server accepts, in bytes.
pub const MAX_PROCESS_ID_LEN: usize = conch_proto::wire::PROCESS_ID_MAX_BYTES;

fn legal_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// Checks a Grackle name: 1–128 characters of `[-_.0-9a-zA-Z]`.
pub fn validate_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("{what} must not be empty"));
    }
    if let Some(c) = name.chars().find(|c| !legal_char(*c)) {
        return Err(format!(
            "{what} {name:?} contains {c:?}; use only letters, digits, '-', '_' and '.'"
        ));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "{what} {name:?} is {} characters long; at most {MAX_NAME_LEN} are allowed",
            name.len()
        ));
    }
    Ok(())
}

/// The semaphore for (`name`, `max`): `<name>.<max>`.
///
/// ```
/// use conch_client::sema::semaphore_name;
///
/// assert_eq!(semaphore_name("video-encode", 2).unwrap(), "video-encode.2");
/// assert!(semaphore_name("bad name", 2).is_err());
/// assert!(semaphore_name("x", 0).is_err());
/// ```
pub fn semaphore_name(name: &str, max: u64) -> Result<String, String> {
    if !(1..=MAX_PERMITS).contains(&max) {
        return Err(format!("--max must be 1 to {MAX_PERMITS}, not {max}"));
    }
    validate_name("name", name)?;
    let full = format!("{name}.{max}");
    if full.len() > MAX_NAME_LEN {
        return Err(format!(
            "name {name:?} is too long: the semaphore name {full:?} must fit in {MAX_NAME_LEN} characters"
        ));
    }
    Ok(full)
}

/// What a semaphore of the `conch` namespace is, by its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SemaphoreKind {
    /// `<name>.<max>`: the slots of (name, max).
    Main {
        /// The name given to `conch sema`.
        name: String,
        /// Its `--max`.
        max: u64,
    },
    /// `<name>.<max>.host-<host>`: the per-host lock of `--spread`.
    HostLock {
        /// The name given to `conch sema`.
        name: String,
        /// Its `--max`.
        max: u64,
    },
}

/// The suffix that makes an election's semaphore name (`conch elect`, see `elect`).
pub const ELECTION_SUFFIX: &str = ".elect";

/// The election a semaphore name of the `conch` namespace belongs to, if it is one.
pub fn election_name(semaphore: &str) -> Option<&str> {
    semaphore
        .strip_suffix(ELECTION_SUFFIX)
        .filter(|n| !n.is_empty())
}

/// Reads a semaphore name of the `conch` namespace; `None` for a name `conch sema` does not make
/// (an election's `<name>.elect` included).
///
/// ```
/// use conch_client::sema::{SemaphoreKind, semaphore_kind};
/// assert_eq!(
///     semaphore_kind("video-encode.2"),
///     Some(SemaphoreKind::Main { name: "video-encode".into(), max: 2 })
/// );
/// assert_eq!(
///     semaphore_kind("video-encode.2.host-node1"),
///     Some(SemaphoreKind::HostLock { name: "video-encode".into(), max: 2 })
/// );
/// assert_eq!(semaphore_kind("video-encode"), None);
/// ```
pub fn semaphore_kind(semaphore: &str) -> Option<SemaphoreKind> {
    let main = |full: &str| {
        let (name, max) = full.rsplit_once('.')?;
        if name.is_empty() || max.is_empty() || !max.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some((name.to_string(), max.parse::<u64>().ok()?))
    };
    if election_name(semaphore).is_some() {
        return None;
    }
    if let Some((prefix, _host)) = semaphore.rsplit_once(".host-")
        && let Some((name, max)) = main(prefix)
    {
        return Some(SemaphoreKind::HostLock { name, max });
    }
    main(semaphore).map(|(name, max)| SemaphoreKind::Main { name, max })
}

/// Reduces a host name to `[-_0-9a-zA-Z]` (anything else, dots included, becomes `-`).
pub fn sanitize_host(host: &str) -> String {
    let s: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if s.is_empty() {
        "unknown".to_string()
    } else {
        s
    }
}

/// The per-host semaphore of `--spread`: `<name>.<max>.host-<sanitized host>`.
///
/// A host name too long to fit is cut and suffixed with a hash of the whole name, so different
/// long host names still get different semaphores.
///
/// ```
/// use conch_client::sema::spread_semaphore_name;
///
/// assert_eq!(
///     spread_semaphore_name("video-encode", 2, "node1.example.com").unwrap(),
///     "video-encode.2.host-node1-example-com"
/// );
/// ```
pub fn spread_semaphore_name(name: &str, max: u64, host: &str) -> Result<String, String> {
    let main = semaphore_name(name, max)?;
    let prefix = format!("{main}.host-");
    let host = sanitize_host(host);
    let room = MAX_NAME_LEN.saturating_sub(prefix.len());
    if host.len() <= room {
        return Ok(format!("{prefix}{host}"));
    }
    // "-" + 8 hex digits of the hash, plus at least 1 character of the host.
    if room < 10 {
        return Err(format!(
            "name {name:?} is too long for --spread: {prefix:?} leaves no room for the host name"
        ));
    }
    let hash = format!("{:08x}", fnv1a32(host.as_bytes()));
    let keep = room - 9;
    Ok(format!("{prefix}{}-{hash}", &host[..keep]))
}

/// The lease `process_id` conch uses: `<host>/pid-<pid>`.
pub fn process_id(host: &str, pid: u32) -> String {
    let suffix = format!("/pid-{pid}");
    let host = truncate_utf8(host, MAX_PROCESS_ID_LEN.saturating_sub(suffix.len()));
    format!("{host}{suffix}")
}

/// `s` cut to at most `max_bytes` bytes, at a character boundary.
pub fn truncate_utf8(s: &str, max_bytes: usize) -> &str {
    if s.len() <= max_bytes {
        return s;
    }
    let mut end = max_bytes;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// 32-bit FNV-1a: small, stable across machines and releases (unlike std's hasher).
fn fnv1a32(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_and_max_make_the_semaphore() {
        assert_eq!(semaphore_name("certs-renew", 1).unwrap(), "certs-renew.1");
        assert_eq!(semaphore_name("a_b.c-D9", 16).unwrap(), "a_b.c-D9.16");
    }

    #[test]
    fn bad_names_are_refused_with_a_reason() {
        assert!(semaphore_name("", 1).unwrap_err().contains("empty"));
        assert!(semaphore_name("a/b", 1).unwrap_err().contains("'/'"));
        assert!(semaphore_name("héllo", 1).unwrap_err().contains("'é'"));
        assert!(semaphore_name("x", 0).unwrap_err().contains("--max"));
        let long = "x".repeat(126);
        assert_eq!(semaphore_name(&long, 9).unwrap().len(), 128);
        assert!(semaphore_name(&long, 10).unwrap_err().contains("too long"));
        assert!(
            semaphore_name(&"x".repeat(129), 1)
                .unwrap_err()
                .contains("at most 128")
        );
    }

    #[test]
    fn hosts_are_sanitized_so_host_semaphores_never_look_like_main_ones() {
        assert_eq!(sanitize_host("10.0.0.5"), "10-0-0-5");
        assert_eq!(sanitize_host("node_1.local"), "node_1-local");
        assert_eq!(sanitize_host(""), "unknown");
        let s = spread_semaphore_name("jobs", 2, "10.0.0.5").unwrap();
        assert_eq!(s, "jobs.2.host-10-0-0-5");
        assert!(
            !s.rsplit('.')
                .next()
                .unwrap()
                .chars()
                .all(|c| c.is_ascii_digit())
        );
    }

    #[test]
    fn long_host_names_are_cut_and_hashed_to_fit() {
        let a = spread_semaphore_name("jobs", 2, &format!("{}a", "h".repeat(200))).unwrap();
        let b = spread_semaphore_name("jobs", 2, &format!("{}b", "h".repeat(200))).unwrap();
        assert_eq!(a.len(), 128);
        assert_eq!(b.len(), 128);
        assert_ne!(a, b);
        assert!(validate_name("semaphore", &a).is_ok());
        assert!(spread_semaphore_name(&"n".repeat(120), 2, "host").is_err());
    }

    #[test]
    fn process_id_and_truncation_respect_limits() {
        assert_eq!(process_id("node2", 4242), "node2/pid-4242");
        let pid = process_id(&"h".repeat(300), 4242);
        assert_eq!(pid.len(), MAX_PROCESS_ID_LEN);
        assert!(pid.ends_with("/pid-4242"));
        assert_eq!(truncate_utf8("héllo", 2), "h");
        assert_eq!(truncate_utf8("héllo", 3), "hé");
        assert_eq!(truncate_utf8("abc", 10), "abc");
    }
}
