//! Timestamps as stored: UTC, millisecond resolution, ISO 8601 text.
//!
//! The database stores times as `YYYY-MM-DDTHH:MM:SS.mmmZ` so that plain SQL can read,
//! compare and sort them (the text order is the time order) and SQLite's date functions accept
//! them. Milliseconds are the resolution: a timestamp read back from the database or from a
//! JSON-lines file is exactly the one written.

use std::fmt;
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

/// A point in time, in milliseconds since 1970-01-01T00:00:00Z.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    unix_ms: i64,
}

/// A string that is not a timestamp of the stored form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad timestamp {0:?} (expected YYYY-MM-DDTHH:MM:SS.mmmZ)")]
pub struct TimestampError(pub String);

impl Timestamp {
    /// The current time of the system clock; a clock before 1970 reads as 1970.
    pub fn now() -> Timestamp {
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        Timestamp { unix_ms }
    }

    /// The timestamp `unix_ms` milliseconds after the Unix epoch.
    pub fn from_unix_ms(unix_ms: i64) -> Timestamp {
        Timestamp { unix_ms }
    }

    /// Milliseconds since the Unix epoch.
    pub fn unix_ms(self) -> i64 {
        self.unix_ms
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let days = self.unix_ms.div_euclid(86_400_000);
        let ms_of_day = self.unix_ms.rem_euclid(86_400_000);
        let (year, month, day) = civil_from_days(days);
        let secs = ms_of_day / 1000;
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
            secs / 3600,
            secs / 60 % 60,
            secs % 60,
            ms_of_day % 1000
        )
    }
}

impl FromStr for Timestamp {
    type Err = TimestampError;

    /// Parses `YYYY-MM-DDTHH:MM:SS.mmmZ` or `YYYY-MM-DDTHH:MM:SSZ` (four-digit years only).
    fn from_str(text: &str) -> Result<Timestamp, TimestampError> {
        let bad = || TimestampError(text.to_string());
        let b = text.as_bytes();
        let millis = match b.len() {
            20 => 0,
            24 if b[19] == b'.' => digits(&b[20..23]).ok_or_else(bad)?,
            _ => return Err(bad()),
        };
        let shape_ok = b[4] == b'-'
            && b[7] == b'-'
            && b[10] == b'T'
            && b[13] == b':'
            && b[16] == b':'
            && b[b.len() - 1] == b'Z';
        if !shape_ok {
            return Err(bad());
        }
        let year = digits(&b[0..4]).ok_or_else(bad)?;
        let month = digits(&b[5..7]).ok_or_else(bad)?;
        let day = digits(&b[8..10]).ok_or_else(bad)?;
        let hour = digits(&b[11..13]).ok_or_else(bad)?;
        let minute = digits(&b[14..16]).ok_or_else(bad)?;
        let second = digits(&b[17..19]).ok_or_else(bad)?;
        let in_range = (1..=12).contains(&month)
            && (1..=days_in_month(year, month)).contains(&day)
            && hour < 24
            && minute < 60
            && second < 60;
        if !in_range {
            return Err(bad());
        }
        let days = days_from_civil(year, month, day);
        let unix_ms = ((days * 24 + hour) * 60 + minute) * 60_000 + second * 1000 + millis;
        Ok(Timestamp { unix_ms })
    }
}

/// The decimal value of a run of ASCII digits.
fn digits(bytes: &[u8]) -> Option<i64> {
    bytes.iter().try_fold(0i64, |acc, &c| {
        c.is_ascii_digit().then(|| acc * 10 + i64::from(c - b'0'))
    })
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

// The two conversions below count in 400-year eras of the proleptic Gregorian calendar
// (146 097 days each) with years starting on March 1, so that the leap day falls at the end
// of a year and the month lengths from March on follow the formula (153 * m + 2) / 5.

/// Days since 1970-01-01 of a civil date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    // 719 468 days lie between 0000-03-01 and 1970-01-01.
    era * 146_097 + day_of_era - 719_468
}

/// The civil date (year, month, day) of a count of days since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(
            Timestamp::from_unix_ms(0).to_string(),
            "1970-01-01T00:00:00.000Z"
        );
        // 2024-02-29T12:34:56.789Z, a leap day.
        let t = Timestamp::from_unix_ms(1_709_210_096_789);
        assert_eq!(t.to_string(), "2024-02-29T12:34:56.789Z");
        assert_eq!("2024-02-29T12:34:56.789Z".parse::<Timestamp>(), Ok(t));
        assert_eq!(
            "2024-02-29T12:34:56Z".parse::<Timestamp>(),
            Ok(Timestamp::from_unix_ms(1_709_210_096_000))
        );
    }

    #[test]
    fn round_trips_across_centuries() {
        // Every 7919 hours (a prime, so every hour of the day and many days are hit) over
        // 1900..2200, plus some odd milliseconds.
        let mut ms = -2_208_988_800_000i64;
        while ms < 7_258_118_400_000 {
            let t = Timestamp::from_unix_ms(ms);
            assert_eq!(t.to_string().parse::<Timestamp>(), Ok(t), "{t}");
            ms += 7919 * 3_600_000 + 123;
        }
    }

    #[test]
    fn rejects_bad_text() {
        for bad in [
            "",
            "2024-02-30T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-01-01 00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-01-01T00:00:00.12Z",
            "2024-01-01T00:00:00+01:00",
            "yesterday",
        ] {
            assert!(bad.parse::<Timestamp>().is_err(), "{bad}");
        }
    }
}
