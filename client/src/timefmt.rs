//! RFC 3339 timestamps in UTC with whole seconds (`2026-06-12T10:15:00Z`), as the CLI shows them
//! and stores them in holder metadata. conch's wire timestamps are int64 nanoseconds since the
//! Unix epoch.

use std::time::{SystemTime, UNIX_EPOCH};

/// Formats seconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (UTC).
///
/// ```
/// assert_eq!(conch_client::format_rfc3339(1_781_259_300), "2026-06-12T10:15:00Z");
/// ```
pub fn format_rfc3339(unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs_of_day = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs_of_day / 3600,
        (secs_of_day % 3600) / 60,
        secs_of_day % 60
    )
}

/// Formats a wire timestamp (ns since the Unix epoch) like [`format_rfc3339`]; `None` for 0.
pub fn format_unix_nanos(nanos: i64) -> Option<String> {
    (nanos != 0).then(|| format_rfc3339(nanos.div_euclid(1_000_000_000)))
}

/// The current time as RFC 3339.
pub fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    format_rfc3339(secs)
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_rfc3339(1_781_259_300), "2026-06-12T10:15:00Z");
        assert_eq!(format_rfc3339(4_102_444_799), "2099-12-31T23:59:59Z");
        assert_eq!(format_rfc3339(-1), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn nanos_are_truncated_to_seconds_and_zero_means_unknown() {
        assert_eq!(
            format_unix_nanos(1_781_259_300_999_999_999).as_deref(),
            Some("2026-06-12T10:15:00Z")
        );
        assert_eq!(format_unix_nanos(0), None);
    }

    #[test]
    fn now_looks_like_a_timestamp() {
        let now = now_rfc3339();
        assert_eq!(now.len(), 20);
        assert!(now.ends_with('Z') && now.as_bytes()[10] == b'T');
    }
}
