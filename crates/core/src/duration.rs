//! Go-style durations (`50ms`, `2s`, `1m30s`), as GIE configs write them.

use std::time::Duration;

/// Whole milliseconds, saturating: the unit of ticks, timeouts and the host clock.
pub fn duration_ms(value: Duration) -> u64 {
    u64::try_from(value.as_millis()).unwrap_or(u64::MAX)
}

/// Parses a Go duration string. Negative values and missing units are rejected.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err("empty duration".into());
    }
    let mut rest = text;
    let mut total_nanos: f64 = 0.0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| {
                format!("duration {text:?} has a number without a unit (e.g. 50ms, 2s)")
            })?;
        let (number, tail) = rest.split_at(number_len);
        let value: f64 = number
            .parse()
            .map_err(|_| format!("duration {text:?} has a bad number {number:?}"))?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let nanos_per_unit = match unit {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(format!("duration {text:?} has an unknown unit {unit:?}")),
        };
        total_nanos += value * nanos_per_unit;
        rest = next;
    }
    Ok(Duration::from_nanos(total_nanos as u64))
}

/// Serde adapter for `Duration` fields written as Go duration strings.
pub mod serde_go {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        super::parse_duration(&text).map_err(serde::de::Error::custom)
    }

    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&super::format_duration(*value))
    }

    /// The same for optional fields (use with `#[serde(default)]`).
    pub mod option {
        use serde::{Deserialize, Deserializer};
        use std::time::Duration;

        pub fn deserialize<'de, D: Deserializer<'de>>(
            deserializer: D,
        ) -> Result<Option<Duration>, D::Error> {
            let text = String::deserialize(deserializer)?;
            crate::duration::parse_duration(&text)
                .map(Some)
                .map_err(serde::de::Error::custom)
        }
    }
}

/// Formats a duration the way Go prints short ones (`50ms`, `2s`).
pub fn format_duration(value: Duration) -> String {
    let nanos = value.as_nanos();
    if nanos.is_multiple_of(1_000_000_000) {
        format!("{}s", nanos / 1_000_000_000)
    } else if nanos.is_multiple_of(1_000_000) {
        format!("{}ms", nanos / 1_000_000)
    } else if nanos.is_multiple_of(1_000) {
        format!("{}us", nanos / 1_000)
    } else {
        format!("{nanos}ns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse_duration("50ms"), Ok(Duration::from_millis(50)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_bad_durations() {
        assert!(parse_duration("").is_err());
        assert!(parse_duration("50").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("1..2s").is_err());
    }

    #[test]
    fn formats_round_trip() {
        for text in ["50ms", "2s", "250us", "7ns"] {
            let parsed = parse_duration(text).unwrap_or_default();
            assert_eq!(format_duration(parsed), text);
        }
    }
}
