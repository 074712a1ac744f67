//! Lease ids.
//!
//! A lease id is `ls_` + 16 hex digits of a sequence number + 8 hex digits of a mix of it.
//! What always holds: `lease_seq(&lease_id(n)) == Some(n)` for every `n`, and `lease_seq`
//! accepts no other string; so the state keys leases by the number, ids sort in creation order,
//! and a number is never reused (the counter survives namespace deletes).

const LEASE_ID_PREFIX: &str = "ls_";

/// A deterministic 32-bit scramble of the sequence number (splitmix64's finalizer), so ids look
/// opaque without any randomness.
fn lease_mix(seq: u64) -> u32 {
    let mut z = seq.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 32) as u32
}

pub(super) fn lease_id(seq: u64) -> String {
    format!("{LEASE_ID_PREFIX}{seq:016x}{:08x}", lease_mix(seq))
}

/// The sequence number behind a lease id, if the id is one this state could have made.
pub(super) fn lease_seq(id: &str) -> Option<u64> {
    let digits = id.strip_prefix(LEASE_ID_PREFIX)?;
    if digits.len() != 24
        || !digits
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    let seq = u64::from_str_radix(digits.get(..16)?, 16).ok()?;
    let mix = u32::from_str_radix(digits.get(16..)?, 16).ok()?;
    (mix == lease_mix(seq)).then_some(seq)
}
