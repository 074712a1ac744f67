//! Printing durations compactly (`250ms`, `1.5s`, `1m30s`), as error messages show them.

use std::time::Duration;

/// Formats a duration compactly: `250ms`, `8s`, `1.5s`, `2m`, `1m30s`, `1h`, `1h0m5s`.
///
/// ```
/// use std::time::Duration;
/// use conch_client::format_duration;
///
/// assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
/// assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
/// ```
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs();
    if secs < 60 {
        let tenths = d.subsec_millis() / 100;
        return if tenths == 0 {
            format!("{secs}s")
        } else {
            format!("{secs}.{tenths}s")
        };
    }
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 || (h > 0 && s > 0) {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_compactly() {
        assert_eq!(format_duration(Duration::from_millis(0)), "0ms");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::from_secs(8)), "8s");
        assert_eq!(format_duration(Duration::from_millis(8_250)), "8.2s");
        assert_eq!(format_duration(Duration::from_secs(60)), "1m");
        assert_eq!(format_duration(Duration::from_secs(3600)), "1h");
        assert_eq!(format_duration(Duration::from_secs(3605)), "1h0m5s");
        assert_eq!(format_duration(Duration::from_secs(3660)), "1h1m");
    }
}
