//! Exact value conversions every adapter and writer shares: decimal text to scaled integers,
//! and the proleptic Gregorian calendar (days since 1970-01-01 to and from year, month, day).
//!
//! Why here: a decimal parser or a calendar written twice is two chances to round or shift a
//! value. These are exact (no floating point) and refuse rather than round: a decimal with more
//! fraction digits than the column's scale (other than trailing zeros) is an error, not a
//! rounding.

use arrow_buffer::i256;

/// An integer type an exact decimal can be scaled into (Arrow's `Decimal128` and `Decimal256`
/// storage).
pub trait DecimalInt: Copy {
    /// Zero.
    const ZERO: Self;
    /// `self * 10 + digit`, or `None` on overflow.
    fn push_digit(self, digit: u8) -> Option<Self>;
    /// `-self`, or `None` on overflow.
    fn negate(self) -> Option<Self>;
}

impl DecimalInt for i128 {
    const ZERO: Self = 0;
    fn push_digit(self, digit: u8) -> Option<Self> {
        self.checked_mul(10)?.checked_add(i128::from(digit))
    }
    fn negate(self) -> Option<Self> {
        self.checked_neg()
    }
}

impl DecimalInt for i256 {
    const ZERO: Self = i256::ZERO;
    fn push_digit(self, digit: u8) -> Option<Self> {
        self.checked_mul(i256::from_i128(10))?
            .checked_add(i256::from_i128(i128::from(digit)))
    }
    fn negate(self) -> Option<Self> {
        self.checked_neg()
    }
}

/// Exact decimal text (`-123.4500`, `+7`, `.5`; no exponent) as an integer scaled by
/// 10^`scale`. Surrounding spaces are ignored. Fails, saying why, on anything else, on more
/// fraction digits than `scale` unless the extra ones are zeros (nothing is rounded), and on
/// overflow of `T`.
pub fn parse_decimal<T: DecimalInt>(text: &[u8], scale: i8) -> Result<T, String> {
    let shown = || String::from_utf8_lossy(text).into_owned();
    let t = text.trim_ascii();
    let (neg, rest) = match t.first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let (int, frac) = match rest.iter().position(|c| *c == b'.') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &rest[rest.len()..]),
    };
    if (int.is_empty() && frac.is_empty()) || !int.iter().chain(frac).all(u8::is_ascii_digit) {
        return Err(format!("{:?} is not a decimal", shown()));
    }
    let scale = scale.max(0) as usize;
    let kept = frac.len().min(scale);
    if frac[kept..].iter().any(|c| *c != b'0') {
        return Err(format!(
            "{:?} has more fraction digits than the column's scale {scale}",
            shown()
        ));
    }
    let overflow = || format!("{:?} does not fit the column's precision", shown());
    let mut acc = T::ZERO;
    let digits = int
        .iter()
        .chain(&frac[..kept])
        .map(|c| c - b'0')
        .chain(std::iter::repeat_n(0, scale - kept));
    for d in digits {
        acc = acc.push_digit(d).ok_or_else(overflow)?;
    }
    if neg {
        acc = acc.negate().ok_or_else(overflow)?;
    }
    Ok(acc)
}

/// True when `unscaled` has at most `precision` decimal digits (what an Arrow decimal of that
/// precision may hold).
pub fn fits_precision(unscaled: i128, precision: u8) -> bool {
    match 10u128.checked_pow(u32::from(precision)) {
        Some(limit) => unscaled.unsigned_abs() < limit,
        None => true,
    }
}

/// Days from 1970-01-01 to `y-m-d` in the proleptic Gregorian calendar (the days-from-civil
/// algorithm: 400-year eras of 146,097 days). `m` and `d` are not checked: see
/// [`valid_date`].
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Year, month and day of a day count since 1970-01-01 (the inverse of [`days_from_civil`]).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Days in month `m` of year `y`.
pub fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        _ => 28,
    }
}

/// Days since 1970-01-01 of `y-m-d`, or `None` when it is no date (month or day zero or out
/// of range, as MySQL's zero dates are).
pub fn valid_date(y: i64, m: u32, d: u32) -> Option<i64> {
    ((1..=12).contains(&m) && d >= 1 && d <= days_in_month(y, m)).then(|| days_from_civil(y, m, d))
}

/// Microseconds of a time of day.
pub fn micros_of_day(h: u32, m: u32, s: u32, micros: u32) -> i64 {
    (i64::from(h) * 3600 + i64::from(m) * 60 + i64::from(s)) * 1_000_000 + i64::from(micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_exact() {
        let p = |s: &str, scale| parse_decimal::<i128>(s.as_bytes(), scale);
        assert_eq!(p("123.45", 2), Ok(12345));
        assert_eq!(p("-0.005", 3), Ok(-5));
        assert_eq!(p("7", 2), Ok(700));
        assert_eq!(p(" +7 ", 3), Ok(7000));
        assert_eq!(p("1.50", 1), Ok(15));
        assert_eq!(p("-327.68", 2), Ok(-32768));
        assert_eq!(p(".5", 1), Ok(5));
        assert!(p("1.55", 1).is_err());
        assert!(p("1.234", 2).is_err());
        for bad in ["abc", "", "-", "1e5", "1.2.3", "--1"] {
            assert!(p(bad, 1).is_err(), "{bad}");
        }
        let big = format!("-{}", "9".repeat(65));
        assert!(parse_decimal::<i256>(big.as_bytes(), 0).is_ok());
        assert!(p(&big, 0).is_err());
        assert!(p(&"9".repeat(40), 0).is_err());
        assert_eq!(parse_decimal::<i256>(b"-1.5", 2), Ok(i256::from_i128(-150)));
    }

    #[test]
    fn precision_limits() {
        let ten_38 = 10i128.pow(38);
        assert!(fits_precision(ten_38 - 1, 38));
        assert!(!fits_precision(ten_38, 38));
        assert!(!fits_precision(100_000, 5));
        assert!(fits_precision(-99_999, 5));
    }

    #[test]
    fn calendar_round_trips() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(0, 1, 1), -719_528);
        assert_eq!(days_from_civil(2024, 2, 29), 19_782);
        for d in (-800_000..800_000).step_by(997) {
            let (y, m, dd) = civil_from_days(d);
            assert_eq!(days_from_civil(y, m, dd), d);
            assert_eq!(valid_date(y, m, dd), Some(d));
        }
        for (y, m, d) in [(0, 0, 0), (2024, 0, 15), (2023, 2, 29), (2024, 13, 1)] {
            assert_eq!(valid_date(y, m, d), None, "{y}-{m}-{d}");
        }
        assert_eq!(micros_of_day(23, 59, 59, 5), 86_399_000_005);
    }
}
