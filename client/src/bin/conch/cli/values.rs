//! The parsers of flag values the subcommands share, and the values they make.

use std::time::Duration;

use crate::duration::parse_duration;

/// `--wait`: a bound, or forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wait(pub Option<Duration>);
pub(super) fn duration_arg(s: &str) -> Result<Duration, String> {
    parse_duration(s)
}

pub(super) fn wait_arg(s: &str) -> Result<Wait, String> {
    match s.trim() {
        "forever" | "inf" | "infinite" => Ok(Wait(None)),
        other => parse_duration(other).map(|d| Wait(Some(d))),
    }
}

/// A size in bytes: a number with an optional unit (`B`, `KiB`, `MiB`, `GiB`, or `KB`, `MB`,
/// `GB` for powers of 1000).
pub(super) fn size_arg(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let number: u64 = number.parse().map_err(|_| {
        format!("{s:?} is not a size: expected a number with an optional unit, e.g. 64MiB")
    })?;
    let factor: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown size unit {other:?}: use B, KiB, MiB, GiB, KB, MB or GB"
            ));
        }
    };
    number
        .checked_mul(factor)
        .ok_or_else(|| format!("{s:?} is too large"))
}

pub(super) fn namespace_arg(s: &str) -> Result<String, String> {
    conch_client::sema::validate_name("namespace", s)?;
    Ok(s.to_string())
}

pub(super) fn lock_path_arg(s: &str) -> Result<String, String> {
    conch_client::lock::validate_path(s)?;
    Ok(s.to_string())
}

/// A hold limit: 1 s to 30 days (the server's range), in whole milliseconds.
pub(super) fn max_hold_arg(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    let range = Duration::from_secs(1)..=Duration::from_secs(30 * 24 * 3600);
    if !range.contains(&d) {
        return Err(format!("{s}: a hold limit must be between 1s and 30d"));
    }
    Ok(d)
}

pub(super) fn priority_arg(s: &str) -> Result<u32, String> {
    let max = conch_client::elect::MAX_PRIORITY;
    match s.trim().parse::<u32>() {
        Ok(p) if p <= max => Ok(p),
        _ => Err(format!(
            "{s:?} is not a priority: expected a whole number from 0 to {max}"
        )),
    }
}

pub(super) fn ttl_arg(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    conch_client::lease::validate_ttl(d)?;
    Ok(d)
}
