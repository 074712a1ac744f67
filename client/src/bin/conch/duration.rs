//! Human durations for `--ttl`, `--wait` and `--kill-after`: `30s`, `1.5s`, `500ms`, `2m`,
//! `1h30m`, and a bare number meaning seconds.

use std::time::Duration;

/// Parses a duration such as `10s`, `1.5s`, `250ms`, `2m`, `1h30m` or `90` (seconds).
///
/// Units: `ms`, `s`, `m`, `h`, `d`. Components may be repeated (`1m30s`) and each may have a
/// fraction (`0.5s`). Negative values, empty strings and unknown units are errors.
///
/// Hand-written rather than a general duration crate's parser because `--ttl 1.5s` (a fraction
/// with a unit) and a bare number of seconds are both part of the CLI's documented syntax.
pub(crate) fn parse_duration(input: &str) -> Result<Duration, String> {
    let s = input.trim();
    if s.is_empty() {
        return Err("empty duration".to_string());
    }
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!(
                "invalid duration {input:?}: expected a number, e.g. 30s"
            ));
        }
        let (num, after) = rest.split_at(num_len);
        let value: f64 = num
            .parse()
            .map_err(|_| format!("invalid duration {input:?}: bad number {num:?}"))?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let scale = match unit {
            "ms" => 0.001,
            "s" | "sec" | "secs" => 1.0,
            "m" | "min" | "mins" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            "" => {
                return Err(format!(
                    "invalid duration {input:?}: missing unit after {num} (use ms, s, m, h or d)"
                ));
            }
            other => {
                return Err(format!(
                    "invalid duration {input:?}: unknown unit {other:?} (use ms, s, m, h or d)"
                ));
            }
        };
        total += value * scale;
        rest = next;
    }
    if !total.is_finite() || total > 100.0 * 365.0 * 86400.0 {
        return Err(format!("invalid duration {input:?}: too long"));
    }
    Ok(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use conch_client::format_duration;

    #[test]
    fn parses_units_fractions_and_compounds() {
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration(" 5s "), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86400)));
        assert_eq!(parse_duration("300"), Ok(Duration::from_secs(300)));
    }

    #[test]
    fn rejects_garbage_with_a_reason() {
        for bad in ["", "s", "-1s", "5x", "1.2.3s", "abc", "5 s", "1e9s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
        assert!(parse_duration("5").is_ok());
        assert!(parse_duration("1.5").unwrap_err().contains("missing unit"));
        assert!(parse_duration("5y").unwrap_err().contains("unknown unit"));
        assert!(
            parse_duration("999999999999h")
                .unwrap_err()
                .contains("too long")
        );
    }

    #[test]
    fn format_then_parse_round_trips_whole_seconds() {
        for s in [1u64, 59, 60, 61, 3599, 3600, 3661, 86399] {
            let d = Duration::from_secs(s);
            assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{s}s");
        }
    }
}
