//! Static validation of requests: everything that can be checked without looking at the state.
//!
//! The API layer calls these before proposing (so a bad request never reaches the log), and
//! `apply` calls [`Cmd::validate`] again, so a command that slipped through (an old client, a
//! replayed log, a fuzzer) is refused with the same error and changes nothing.
//!
//! Messages are lowercase and name the offending field in Grackle's words (`namespace_name`,
//! `semaphore_name`, `lease_id`, `ttl_seconds`, `timeout_seconds`, ...).

use super::limits::*;
use super::types::{Error, Metadata, NANOS_PER_SEC, Nanos, SetMember};

/// A namespace or semaphore name: 1–128 characters of `[-_.0-9a-zA-Z]`. `field` is the request
/// field that carried it (`name`, `namespace_name`, `semaphore_name`).
pub(crate) fn name(field: &str, value: &str) -> Result<(), Error> {
    let ok = !value.is_empty()
        && value.len() <= NAME_MAX_CHARS
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{field} must be 1-{NAME_MAX_CHARS} characters of [-_.0-9a-zA-Z]"
        )))
    }
}

/// A lock name: 1-256 characters of `[-_.0-9a-zA-Z/]`, a `/`-separated path.
pub(crate) fn lock_name(value: &str) -> Result<(), Error> {
    let ok = !value.is_empty()
        && value.len() <= LOCK_NAME_MAX_CHARS
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "lock_name must be 1-{LOCK_NAME_MAX_CHARS} characters of [-_.0-9a-zA-Z/]"
        )))
    }
}

/// What a queued acquire waits for ([`Cmd::GiveUp`](super::Cmd::GiveUp)'s `sem`): a
/// semaphore name, or a lock's wait object.
pub(crate) fn wait_object(value: &str) -> Result<(), Error> {
    match super::types::lock_path(value) {
        Some(path) => lock_name(path),
        None => name("semaphore_name", value),
    }
}

/// A description: at most 1024 bytes.
pub(crate) fn description(value: &str) -> Result<(), Error> {
    if value.len() <= DESCRIPTION_MAX_BYTES {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "description must be at most {DESCRIPTION_MAX_BYTES} bytes"
        )))
    }
}

/// Metadata: at most 32 entries, keys at most 128 bytes, values at most 256 bytes.
pub(crate) fn metadata(value: &Metadata) -> Result<(), Error> {
    if value.len() > METADATA_MAX_ENTRIES {
        return Err(Error::invalid(format!(
            "metadata must have at most {METADATA_MAX_ENTRIES} entries"
        )));
    }
    for (key, val) in value {
        if key.len() > METADATA_KEY_MAX_BYTES {
            return Err(Error::invalid(format!(
                "metadata keys must be at most {METADATA_KEY_MAX_BYTES} bytes"
            )));
        }
        if val.len() > METADATA_VALUE_MAX_BYTES {
            return Err(Error::invalid(format!(
                "metadata values must be at most {METADATA_VALUE_MAX_BYTES} bytes"
            )));
        }
    }
    Ok(())
}

/// A lease's `process_id`: free-form, at most 128 bytes (empty is allowed).
pub(crate) fn process_id(value: &str) -> Result<(), Error> {
    if value.len() <= PROCESS_ID_MAX_BYTES {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "process_id must be at most {PROCESS_ID_MAX_BYTES} bytes"
        )))
    }
}

/// A lease's `ttl_seconds` on create: 1–300.
pub(crate) fn ttl_s(value: u64) -> Result<(), Error> {
    if (TTL_MIN_S..=TTL_MAX_S).contains(&value) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "ttl_seconds must be between {TTL_MIN_S} and {TTL_MAX_S}"
        )))
    }
}

/// A lease's `ttl_seconds` on refresh: 0 (keep the lease's own TTL) or 1–300.
pub(crate) fn refresh_ttl_s(value: u64) -> Result<(), Error> {
    if value == 0 { Ok(()) } else { ttl_s(value) }
}

/// An acquire's `timeout_seconds` as the API receives it: 0–300.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn timeout_s(value: i64) -> Result<(), Error> {
    if (0..=TIMEOUT_MAX_S).contains(&value) {
        Ok(())
    } else {
        Err(timeout_error())
    }
}

/// An acquire's wait in nanoseconds, as carried by [`Cmd::Acquire`]: 0–300 s.
pub(crate) fn wait_ns(value: Nanos) -> Result<(), Error> {
    if (0..=TIMEOUT_MAX_S * NANOS_PER_SEC).contains(&value) {
        Ok(())
    } else {
        Err(timeout_error())
    }
}

/// A hold limit in nanoseconds, as commands carry it: 0 (none) or 1 s to 30 days.
pub(crate) fn max_hold_ns(value: Nanos) -> Result<(), Error> {
    const NANOS_PER_MS: Nanos = 1_000_000;
    let min = MAX_HOLD_MIN_MS as Nanos * NANOS_PER_MS;
    let max = MAX_HOLD_MAX_MS as Nanos * NANOS_PER_MS;
    if value == 0 || (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "max_hold_ms must be 0 (no hold limit) or between {MAX_HOLD_MIN_MS} and {MAX_HOLD_MAX_MS}"
        )))
    }
}

fn timeout_error() -> Error {
    Error::invalid(format!(
        "timeout_seconds must be between 0 and {TIMEOUT_MAX_S}"
    ))
}

/// A `lease_id`: 1–128 bytes. Whether it names a lease is for the state to say (`NotFound`).
pub(crate) fn lease_id(value: &str) -> Result<(), Error> {
    if !value.is_empty() && value.len() <= LEASE_ID_MAX_BYTES {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "lease_id must be 1-{LEASE_ID_MAX_BYTES} bytes"
        )))
    }
}

/// A semaphore's `permits`: 1–4294967295.
pub(crate) fn permits(value: u64) -> Result<(), Error> {
    if (1..=PERMITS_MAX).contains(&value) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "permits must be between 1 and {PERMITS_MAX}"
        )))
    }
}

/// An acquire's `weight`: 0 (meaning 1) up to [`PERMITS_MAX`]; anything larger exceeds every
/// semaphore's permits.
pub(crate) fn weight(value: u64) -> Result<(), Error> {
    if value <= PERMITS_MAX {
        Ok(())
    } else {
        Err(weight_exceeds_permits())
    }
}

/// The members of an all-or-none acquire: 2 to 16 distinct semaphore names, each weight at
/// most the permits cap.
pub(crate) fn set_members(members: &[SetMember]) -> Result<(), Error> {
    if !(SET_MEMBERS_MIN..=SET_MEMBERS_MAX).contains(&members.len()) {
        return Err(Error::invalid(format!(
            "semaphores must name {SET_MEMBERS_MIN} to {SET_MEMBERS_MAX} members, got {}",
            members.len()
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    for member in members {
        name("semaphore_name", &member.sem)?;
        weight(member.weight)?;
        if !seen.insert(member.sem.as_str()) {
            return Err(Error::invalid(format!(
                "semaphore {} is named twice in one set: each member must be distinct",
                member.sem
            )));
        }
    }
    Ok(())
}

/// The error for an acquire that could never be granted.
pub(crate) fn weight_exceeds_permits() -> Error {
    Error::invalid("weight exceeds semaphore permits")
}

/// A page `limit`: 0 means 100, otherwise 1–250. Returns the effective limit.
pub(crate) fn page_limit(value: i32) -> Result<usize, Error> {
    match value {
        0 => Ok(PAGE_LIMIT_DEFAULT),
        1..=PAGE_LIMIT_MAX => Ok(value as usize),
        _ => Err(Error::invalid(format!(
            "limit must be between 0 and {PAGE_LIMIT_MAX}"
        ))),
    }
}

/// A request id: 1 to 64 ASCII letters, digits, `-` or `_`.
pub(crate) fn request_id(value: &str) -> Result<(), Error> {
    let ok = !value.is_empty()
        && value.len() <= REQUEST_ID_MAX_BYTES
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "conch-request-id must be 1-{REQUEST_ID_MAX_BYTES} characters of A-Z, a-z, 0-9, - and _"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Cmd, ErrorKind};

    fn message(r: Result<(), Error>) -> String {
        let e = r.expect_err("must be refused");
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        e.message
    }

    #[test]
    fn names_are_1_to_128_chars_of_the_allowed_set() {
        assert!(name("semaphore_name", "a").is_ok());
        assert!(name("semaphore_name", "Az09-_.x").is_ok());
        assert!(name("semaphore_name", &"a".repeat(128)).is_ok());
        assert_eq!(
            message(name("semaphore_name", "")),
            "semaphore_name must be 1-128 characters of [-_.0-9a-zA-Z]"
        );
        assert!(name("name", &"a".repeat(129)).is_err());
        for bad in ["a b", "a/b", "é", "a\0", "a:b", "ä"] {
            assert!(name("namespace_name", bad).is_err(), "{bad:?}");
        }
        assert!(message(name("namespace_name", "?")).starts_with("namespace_name "));
    }

    #[test]
    fn description_and_metadata_limits() {
        assert!(description(&"x".repeat(1024)).is_ok());
        assert_eq!(
            message(description(&"x".repeat(1025))),
            "description must be at most 1024 bytes"
        );
        let mut m = Metadata::new();
        for i in 0..32 {
            m.insert(format!("k{i}"), "v".into());
        }
        assert!(metadata(&m).is_ok());
        m.insert("one-too-many".into(), String::new());
        assert!(message(metadata(&m)).starts_with("metadata "));
        let m: Metadata = [("k".repeat(129), String::new())].into();
        assert!(message(metadata(&m)).contains("keys"));
        let m: Metadata = [("k".repeat(128), "v".repeat(256))].into();
        assert!(metadata(&m).is_ok());
        let m: Metadata = [("k".into(), "v".repeat(257))].into();
        assert!(message(metadata(&m)).contains("values"));
    }

    #[test]
    fn lease_fields() {
        assert!(process_id("").is_ok());
        assert!(process_id(&"p".repeat(128)).is_ok());
        assert!(message(process_id(&"p".repeat(129))).starts_with("process_id "));
        assert!(lease_id("x").is_ok());
        assert!(message(lease_id("")).starts_with("lease_id "));
        assert!(lease_id(&"l".repeat(129)).is_err());
        assert!(ttl_s(1).is_ok() && ttl_s(300).is_ok());
        assert_eq!(message(ttl_s(0)), "ttl_seconds must be between 1 and 300");
        assert!(ttl_s(301).is_err());
        assert!(refresh_ttl_s(0).is_ok() && refresh_ttl_s(300).is_ok());
        assert!(refresh_ttl_s(301).is_err());
    }

    #[test]
    fn timeouts_weights_permits_and_limits() {
        assert!(timeout_s(0).is_ok() && timeout_s(300).is_ok());
        assert!(message(timeout_s(-1)).starts_with("timeout_seconds "));
        assert!(timeout_s(301).is_err());
        assert!(wait_ns(0).is_ok() && wait_ns(300 * NANOS_PER_SEC).is_ok());
        assert!(wait_ns(300 * NANOS_PER_SEC + 1).is_err());
        assert!(wait_ns(i64::MIN).is_err() && wait_ns(i64::MAX).is_err());
        assert!(permits(1).is_ok() && permits(PERMITS_MAX).is_ok());
        assert!(message(permits(0)).starts_with("permits "));
        assert!(permits(PERMITS_MAX + 1).is_err());
        assert!(weight(0).is_ok() && weight(PERMITS_MAX).is_ok());
        assert_eq!(
            message(weight(u64::MAX)),
            "weight exceeds semaphore permits"
        );
        assert_eq!(page_limit(0), Ok(100));
        assert_eq!(page_limit(1), Ok(1));
        assert_eq!(page_limit(250), Ok(250));
        let e = page_limit(251).expect_err("over the maximum");
        assert_eq!(e.message, "limit must be between 0 and 250");
        assert!(page_limit(-1).is_err() && page_limit(i32::MIN).is_err());
    }

    #[test]
    fn commands_name_the_field_at_fault() {
        let acquire =
            |ns: &str, sem: &str, lease: &str, weight: u64, wait_ns: Nanos| Cmd::Acquire {
                ns: ns.into(),
                sem: sem.into(),
                lease: lease.into(),
                weight,
                wait_ns,
                metadata: Metadata::new(),
                max_hold_ns: 0,
            };
        assert!(acquire("n", "s", "l", 0, 0).validate().is_ok());
        let m = |c: Cmd| message(c.validate());
        assert!(m(acquire("", "s", "l", 1, 0)).starts_with("namespace_name "));
        assert!(m(acquire("n", "", "l", 1, 0)).starts_with("semaphore_name "));
        assert!(m(acquire("n", "s", "", 1, 0)).starts_with("lease_id "));
        assert!(m(acquire("n", "s", "l", u64::MAX, 0)).starts_with("weight "));
        assert!(m(acquire("n", "s", "l", 1, -1)).starts_with("timeout_seconds "));
        let create = Cmd::CreateNamespace {
            name: "bad name".into(),
            description: String::new(),
            metadata: Metadata::new(),
        };
        assert!(m(create).starts_with("name "));
        let sem = Cmd::CreateSemaphore {
            ns: "n".into(),
            name: "s".into(),
            description: String::new(),
            permits: 0,
            metadata: Metadata::new(),
            max_hold_ns: 0,
        };
        assert!(m(sem).starts_with("permits "));
        let lease = Cmd::CreateLease {
            ns: "n".into(),
            kind: crate::state::LeaseKind::Semaphore,
            process_id: String::new(),
            ttl_s: 0,
            metadata: Metadata::new(),
            secret: 7,
        };
        assert!(m(lease).starts_with("ttl_seconds "));
        let refresh = Cmd::RefreshLease {
            ns: "n".into(),
            kind: crate::state::LeaseKind::Semaphore,
            lease: "l".into(),
            ttl_s: 0,
        };
        assert!(refresh.validate().is_ok());
        assert!(Cmd::Expire.validate().is_ok() && Cmd::ExtendLeases.validate().is_ok());
        let give_up = Cmd::GiveUp {
            ns: "n".into(),
            sem: "s".into(),
            lease: "l".into(),
            deadline_ns: i64::MIN,
            linger_ns: 0,
        };
        assert!(give_up.validate().is_ok());
    }
}
