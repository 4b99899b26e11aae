//! Durations as job files write them: a number and a unit, `500ms`, `10s`, `1.5m`, `2h`, `1d`.
//!
//! A bare number is rejected (is `10` ten seconds or ten milliseconds?), except `0`, which
//! means the same in every unit. Fractions are allowed as long as the result is a whole
//! number of milliseconds; the arithmetic is exact (no floating point).

/// Units and their length in milliseconds; longer suffixes first so `ms` is not read as `m`.
const UNITS: &[(&str, u64)] = &[
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

const UNIT_LIST: &str = "ms, s, m, h or d";

/// Parses a duration such as `10s`, `500ms`, `1m`, `2h`, `1d` or `1.5s` into milliseconds.
///
/// # Errors
/// A message (without position) saying what is wrong and what would be accepted.
pub fn parse_duration_ms(s: &str) -> Result<u64, String> {
    let text = s.trim();
    let number_len = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(number_len);
    let unit = unit.trim_start();
    if text.is_empty() {
        return Err(format!(
            "empty duration; expected a number and a unit ({UNIT_LIST}), e.g. `10s`"
        ));
    }
    if text.starts_with('-') {
        return Err(format!("duration `{text}` is negative"));
    }
    if number.is_empty() {
        return Err(format!(
            "duration `{text}` does not start with a number; expected e.g. `10s` or `500ms`"
        ));
    }
    if unit.is_empty() {
        return match number {
            "0" => Ok(0),
            _ => Err(format!(
                "duration `{text}` has no unit; add one ({UNIT_LIST}), e.g. `{number}s` or \
                 `{number}ms`"
            )),
        };
    }
    let Some(&(_, unit_ms)) = UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(format!(
            "unknown unit `{unit}` in duration `{text}`; expected {UNIT_LIST} (e.g. `10s`)"
        ));
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || fraction.contains('.') || number.ends_with('.') {
        return Err(format!(
            "`{number}` in duration `{text}` is not a number; expected e.g. `10s` or `1.5s`"
        ));
    }
    let too_large = || format!("duration `{text}` is too large");
    let whole: u64 = whole.parse().map_err(|_| too_large())?;
    let mut total = whole.checked_mul(unit_ms).ok_or_else(too_large)?;
    if !fraction.is_empty() {
        // fraction / 10^digits * unit_ms must be whole; trailing zeros do not matter.
        let digits = fraction.trim_end_matches('0');
        if !digits.is_empty() {
            let scale = u32::try_from(digits.len())
                .ok()
                .and_then(|n| 10u128.checked_pow(n));
            let numerator = digits
                .parse::<u128>()
                .ok()
                .and_then(|f| f.checked_mul(u128::from(unit_ms)));
            let (Some(scale), Some(numerator)) = (scale, numerator) else {
                return Err(format!(
                    "duration `{text}` is not a whole number of milliseconds"
                ));
            };
            if numerator % scale != 0 {
                return Err(format!(
                    "duration `{text}` is not a whole number of milliseconds"
                ));
            }
            let part = u64::try_from(numerator / scale).map_err(|_| too_large())?;
            total = total.checked_add(part).ok_or_else(too_large)?;
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::parse_duration_ms;

    #[test]
    fn accepts_every_unit_and_fractions() {
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("10s"), Ok(10_000));
        assert_eq!(parse_duration_ms("1m"), Ok(60_000));
        assert_eq!(parse_duration_ms("2h"), Ok(7_200_000));
        assert_eq!(parse_duration_ms("1d"), Ok(86_400_000));
        assert_eq!(parse_duration_ms("1.5s"), Ok(1_500));
        assert_eq!(parse_duration_ms("0.25m"), Ok(15_000));
        assert_eq!(parse_duration_ms("1.000s"), Ok(1_000));
        assert_eq!(parse_duration_ms(" 3 s "), Ok(3_000));
        assert_eq!(parse_duration_ms("0"), Ok(0));
        assert_eq!(parse_duration_ms("0s"), Ok(0));
    }

    #[test]
    fn rejects_bare_numbers_unknown_units_and_nonsense() {
        let err = parse_duration_ms("10").unwrap_err();
        assert!(
            err.contains("has no unit") && err.contains("`10s`"),
            "{err}"
        );
        let err = parse_duration_ms("10 parsecs").unwrap_err();
        assert!(err.contains("unknown unit `parsecs`"), "{err}");
        for bad in [
            "", "s", "-1s", "1.2.3s", ".5s", "5.s", "0.5ms", "1.0001s", "1e3s", "10sec",
        ] {
            assert!(parse_duration_ms(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(parse_duration_ms("99999999999999999999d").is_err());
        assert!(parse_duration_ms("999999999999999d").is_err());
        assert!(parse_duration_ms("1.99999999999999999999999999999999999999999s").is_err());
    }
}
