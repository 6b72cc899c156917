//! Cron expressions: 5 fields, or 6 with seconds first.

use croner::Cron;

/// Parses a cron expression, with a message that says what is valid.
pub fn parse(expr: &str) -> Result<Cron, String> {
    let fields = expr.split_whitespace().count();
    if !(5..=6).contains(&fields) {
        return Err(format!(
            "{expr:?} has {fields} fields (expected 5: minute hour day-of-month month day-of-week, or 6 with seconds first)"
        ));
    }
    Cron::new(expr)
        .with_seconds_optional()
        .parse()
        .map_err(|e| format!("{expr:?} is not a valid cron expression: {e} (e.g. \"0 6 * * *\" for 06:00 daily)"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn accepts_five_and_six_fields_and_refuses_garbage() {
        assert!(super::parse("0 6 * * *").is_ok());
        assert!(super::parse("*/10 0 6 * * MON-FRI").is_ok());
        assert!(super::parse("61 * * * *").is_err());
        assert!(super::parse("every day").unwrap_err().contains("expected 5"));
    }
}
