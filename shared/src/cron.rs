//! Cron expressions (5 fields, or 6 with seconds first) and their fire times.
//!
//! Fire times are computed in the schedule's time zone and returned in UTC.
//! Daylight-saving transitions never make a schedule fire twice: when the
//! clock falls back and a wall time repeats, only its first occurrence fires.
//! When the clock springs forward over a wall time, the fire happens at the
//! first instant after the gap, once. Callers log both (see [`Fire::note`]).

use chrono::{DateTime, TimeZone, Utc};
use croner::Cron;

/// Parses a cron expression, with a message that says what is valid.
pub fn parse(expr: &str) -> Result<Cron, String> {
    let fields = expr.split_whitespace().count();
    if !(5..=6).contains(&fields) {
        return Err(format!(
            "{expr:?} has {fields} fields (expected 5: minute hour day-of-month month day-of-week, or 6 with seconds first)"
        ));
    }
    check_fields(expr)?;
    Cron::new(expr)
        .with_seconds_optional()
        .parse()
        .map_err(|e| format!("{expr:?} is not a valid cron expression: {e} (e.g. \"0 6 * * *\" for 06:00 daily)"))
}

/// The fields of a 5-field expression (a 6th, seconds, comes first), with
/// their ranges and the names they accept.
const FIELDS: [(&str, u32, u32, &[&str]); 5] = [
    ("minute", 0, 59, &[]),
    ("hour", 0, 23, &[]),
    ("day of month", 1, 31, &[]),
    ("month", 1, 12, &["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]),
    ("day of week", 0, 7, &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]),
];

/// Names the field that is wrong and what it takes, before the library's
/// own words (`Component error: Invalid number.`) could.
fn check_fields(expr: &str) -> Result<(), String> {
    let words: Vec<&str> = expr.split_whitespace().collect();
    let mut fields: Vec<(&str, u32, u32, &[&str])> = FIELDS.to_vec();
    if words.len() == 6 {
        fields.insert(0, ("second", 0, 59, &[]));
    }
    for (word, (name, lo, hi, names)) in words.iter().zip(fields) {
        let bad = |why: String| {
            let named =
                if names.is_empty() { String::new() } else { format!(", or {}-{}", names[0], names[names.len() - 1]) };
            Err(format!(
                "{expr:?}: the {name} field {word:?} {why} (expected *, a value from {lo} to {hi}{named}, a range a-b, \
                 a list a,b, or a step */n)"
            ))
        };
        for part in word.split(',') {
            let (base, step) = part.split_once('/').map_or((part, None), |(b, s)| (b, Some(s)));
            if let Some(s) = step {
                if !s.parse::<u32>().is_ok_and(|n| n > 0) {
                    return bad(format!("has a step {s:?} that is not a whole number above 0"));
                }
            }
            // croner's own extensions (L, W, #, ?) are left to it.
            if base == "*" || base == "?" || base.contains(['L', 'W', '#']) {
                continue;
            }
            let value = |v: &str| -> Option<u32> {
                v.parse().ok().or_else(|| names.iter().position(|n| n.eq_ignore_ascii_case(v)).map(|i| i as u32 + lo))
            };
            for v in base.split('-') {
                match value(v) {
                    Some(n) if (lo..=hi).contains(&n) => {}
                    Some(n) => return bad(format!("holds {n}, out of range")),
                    None => return bad(format!("holds {v:?}, which is not a value")),
                }
            }
        }
    }
    Ok(())
}

/// One fire of a schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fire {
    pub at: DateTime<Utc>,
    /// Something worth logging about this fire (a DST shift).
    pub note: Option<String>,
}

/// The first fire strictly after `after`.
pub fn next_after<Tz: TimeZone>(cron: &Cron, tz: &Tz, after: DateTime<Utc>) -> Option<Fire> {
    // croner skips the second occurrence of a repeated wall time, and moves a
    // wall time that does not exist to the first instant after the gap.
    let next = cron.find_next_occurrence(&after.with_timezone(tz), false).ok()?;
    let at = next.with_timezone(&Utc);
    let note = (!cron.is_time_matching(&next).unwrap_or(true)).then(|| {
        format!(
            "the scheduled wall time does not exist on {} (the clock sprang forward); firing at {at}",
            next.date_naive()
        )
    });
    Some(Fire { at, note })
}

/// Every fire in `(after, until]`, at most `max` (the latest ones are kept).
pub fn fires_between<Tz: TimeZone>(
    cron: &Cron,
    tz: &Tz,
    after: DateTime<Utc>,
    until: DateTime<Utc>,
    max: usize,
) -> Vec<Fire> {
    let mut out: std::collections::VecDeque<Fire> = std::collections::VecDeque::new();
    let mut t = after;
    while let Some(f) = next_after(cron, tz, t) {
        if f.at > until {
            break;
        }
        t = f.at;
        out.push_back(f);
        if out.len() > max {
            out.pop_front();
        }
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_field_is_named_with_its_range() {
        let e = parse("61 * * * *").unwrap_err();
        assert!(e.contains("the minute field \"61\" holds 61, out of range (expected *, a value from 0 to 59"), "{e}");
        let e = parse("0 6 * FOO *").unwrap_err();
        assert!(
            e.contains("the month field \"FOO\" holds \"FOO\", which is not a value") && e.contains("or JAN-DEC"),
            "{e}"
        );
        let e = parse("*/0 * * * *").unwrap_err();
        assert!(e.contains("has a step \"0\""), "{e}");
        let e = parse("0 0 25 * * *").unwrap_err();
        assert!(e.contains("the hour field \"25\""), "six fields: seconds first: {e}");
        for ok in ["0 6 * * *", "*/5 * * * *", "0 9-17 * * MON-FRI", "0 0 1,15 * *", "30 0 6 * * *", "0 0 L * *"] {
            assert!(parse(ok).is_ok(), "{ok}");
        }
    }
    use chrono_tz::Europe::Berlin;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn accepts_five_and_six_fields_and_refuses_garbage() {
        assert!(parse("0 6 * * *").is_ok());
        assert!(parse("*/10 0 6 * * MON-FRI").is_ok());
        assert!(parse("61 * * * *").is_err());
        assert!(parse("every day").unwrap_err().contains("expected 5"));
    }

    #[test]
    fn fires_on_time_in_its_zone() {
        let c = parse("0 6 * * *").unwrap();
        let f = next_after(&c, &Berlin, utc("2026-06-01T00:00:00Z")).unwrap();
        assert_eq!(f.at, utc("2026-06-01T04:00:00Z"), "06:00 CEST");
        let f = next_after(&c, &Berlin, utc("2026-12-01T00:00:00Z")).unwrap();
        assert_eq!(f.at, utc("2026-12-01T05:00:00Z"), "06:00 CET");
        let all = fires_between(&c, &Utc, utc("2026-06-01T00:00:00Z"), utc("2026-06-05T23:00:00Z"), 100);
        assert_eq!(all.len(), 5);
        assert_eq!(fires_between(&c, &Utc, utc("2026-06-01T00:00:00Z"), utc("2026-06-05T23:00:00Z"), 2).len(), 2);
    }

    #[test]
    fn spring_forward_fires_once_after_the_gap() {
        // 2026-03-29: Berlin clocks go from 02:00 to 03:00; 02:30 does not exist.
        let c = parse("30 2 * * *").unwrap();
        let fires = fires_between(&c, &Berlin, utc("2026-03-28T12:00:00Z"), utc("2026-03-30T12:00:00Z"), 100);
        let at: Vec<_> = fires.iter().map(|f| f.at).collect();
        assert_eq!(at, [utc("2026-03-29T01:00:00Z"), utc("2026-03-30T00:30:00Z")], "03:00 CEST, then 02:30 CEST");
        assert!(fires[0].note.as_deref().unwrap().contains("sprang forward"), "{fires:?}");
        assert!(fires[1].note.is_none());
    }

    #[test]
    fn fall_back_does_not_fire_twice() {
        // 2026-10-25: Berlin clocks go from 03:00 back to 02:00; 02:30 happens twice.
        let c = parse("30 2 * * *").unwrap();
        let fires = fires_between(&c, &Berlin, utc("2026-10-24T12:00:00Z"), utc("2026-10-26T12:00:00Z"), 100);
        assert_eq!(
            fires.iter().map(|f| f.at).collect::<Vec<_>>(),
            [utc("2026-10-25T00:30:00Z"), utc("2026-10-26T01:30:00Z")]
        );
        // Every 15 minutes across the repeated hour: 02:00–02:45 fire once
        // (in summer time), not again when the hour repeats.
        let c = parse("*/15 * * * *").unwrap();
        let fires = fires_between(&c, &Berlin, utc("2026-10-24T23:50:00Z"), utc("2026-10-25T02:20:00Z"), 100);
        let at: Vec<String> = fires.iter().map(|f| f.at.format("%H:%M").to_string()).collect();
        assert_eq!(at, ["00:00", "00:15", "00:30", "00:45", "02:00", "02:15"], "UTC fire times");
    }
}
