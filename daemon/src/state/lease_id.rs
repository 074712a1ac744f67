//! Lease ids.
//!
//! A lease id is `ls_` + 16 hex digits of a sequence number + 16 hex digits of the lease's
//! secret. The secret is 64 random bits drawn by the node that took the create request
//! (`Cmd::CreateLease::secret`), so the state itself stays deterministic while nobody can
//! derive one lease's id from another's. What always holds: `parse_lease_id(&lease_id(n, s)) ==
//! Some((n, s))`, and `parse_lease_id` accepts no other string; the state keys leases by the
//! number and finds a lease only when the secret matches, ids sort in creation order, and a
//! number is never reused (the counter survives namespace deletes).

const LEASE_ID_PREFIX: &str = "ls_";

pub(super) fn lease_id(seq: u64, secret: u64) -> String {
    format!("{LEASE_ID_PREFIX}{seq:016x}{secret:016x}")
}

/// The sequence number and secret of a lease id, if the string has a lease id's form.
pub(super) fn parse_lease_id(id: &str) -> Option<(u64, u64)> {
    let digits = id.strip_prefix(LEASE_ID_PREFIX)?;
    if digits.len() != 32
        || !digits
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    let seq = u64::from_str_radix(digits.get(..16)?, 16).ok()?;
    let secret = u64::from_str_radix(digits.get(16..)?, 16).ok()?;
    Some((seq, secret))
}
