//! English number words as num2words writes them (cardinal, ordinal, year, decimal), the subset misaki uses.

use super::pystr::decimal_value;

const ONES: [&str; 20] = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
];
const TENS: [&str; 10] = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"];
const SCALES: [&str; 13] = [
    "",
    "thousand",
    "million",
    "billion",
    "trillion",
    "quadrillion",
    "quintillion",
    "sextillion",
    "septillion",
    "octillion",
    "nonillion",
    "decillion",
    "undecillion",
];

fn below_1000(mut n: u128, words: &mut Vec<String>) {
    let start = words.len();
    if n >= 100 {
        words.push(ONES[(n / 100) as usize].to_string());
        words.push("hundred".to_string());
        n %= 100;
        if n > 0 {
            words.push("and".to_string());
        }
    }
    if n >= 20 {
        let tens = TENS[(n / 10) as usize];
        words.push(if !n.is_multiple_of(10) {
            format!("{tens}-{}", ONES[(n % 10) as usize])
        } else {
            tens.to_string()
        });
    } else if n > 0 || words.len() == start {
        words.push(ONES[n as usize].to_string());
    }
}

fn below_1000_text(n: u128) -> String {
    let mut words = Vec::new();
    below_1000(n, &mut words);
    words.join(" ")
}

/// num2words(n): "one thousand, two hundred and thirty-four".
pub fn cardinal(n: i128) -> String {
    if n < 0 {
        return format!("minus {}", cardinal_unsigned(n.unsigned_abs()));
    }
    cardinal_unsigned(n as u128)
}

fn cardinal_unsigned(mut n: u128) -> String {
    if n < 1000 {
        return below_1000_text(n);
    }
    let mut groups = Vec::new();
    let mut scale = 0;
    while n > 0 {
        let g = n % 1000;
        n /= 1000;
        if g > 0 {
            let scale_word = SCALES[scale.min(SCALES.len() - 1)];
            let text = below_1000_text(g);
            groups.push(if scale > 0 { format!("{text} {scale_word}") } else { text });
        }
        scale += 1;
    }
    groups.reverse();
    let last = &groups[groups.len() - 1];
    let after_and = last.rsplit(" and ").next().unwrap_or(last);
    if groups.len() > 1 && !after_and.contains(' ') && !last.contains("hundred") {
        // 'one thousand and one'
        return format!("{} and {last}", groups[..groups.len() - 1].join(", "));
    }
    groups.join(", ")
}

fn ordinal_word(w: &str) -> String {
    let irregular = match w {
        "one" => "first",
        "two" => "second",
        "three" => "third",
        "five" => "fifth",
        "eight" => "eighth",
        "nine" => "ninth",
        "twelve" => "twelfth",
        _ => "",
    };
    if !irregular.is_empty() {
        irregular.to_string()
    } else if let Some(stem) = w.strip_suffix('y') {
        format!("{stem}ieth")
    } else {
        format!("{w}th")
    }
}

/// num2words(n, to='ordinal'): "twenty-third", "one hundred and first".
pub fn ordinal(n: i128) -> String {
    let c = cardinal(n);
    let (head, last) = match c.rfind(' ') {
        Some(i) => (&c[..=i], &c[i + 1..]),
        None => ("", c.as_str()),
    };
    let last = match last.rfind('-') {
        Some(i) => format!("{}-{}", &last[..i], ordinal_word(&last[i + 1..])),
        None => ordinal_word(last),
    };
    format!("{head}{last}")
}

/// num2words(n, to='year'): "nineteen oh-five", "two thousand and five", "twenty ten".
pub fn year(n: i128) -> String {
    let (high, low) = (n.div_euclid(100), n.rem_euclid(100));
    if high == 0 || (high % 10 == 0 && low < 10) || high >= 100 {
        return cardinal(n);
    }
    let low_text = match low {
        0 => "hundred".to_string(),
        1..=9 => format!("oh-{}", cardinal(low)),
        _ => cardinal(low),
    };
    format!("{} {low_text}", cardinal(high))
}

/// num2words(float(s)): "3.14" reads "three point one four"; trailing zeros go as float() drops them.
pub fn decimal(s: &str) -> String {
    let (ip, fp) = s.split_once('.').unwrap_or((s, ""));
    let fp = fp.trim_end_matches('0');
    let mut words = cardinal(parse_int(ip).unwrap_or(0));
    if !fp.is_empty() {
        words.push_str(" point");
        for c in fp.chars() {
            words.push(' ');
            words.push_str(ONES[decimal_value(c).unwrap_or(0) as usize]);
        }
    }
    words
}

/// Python's int() of decimal digits (any script's) with an optional sign; None where it overflows or is no number.
pub fn parse_int(s: &str) -> Option<i128> {
    let (negative, digits) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if digits.is_empty() {
        return None;
    }
    let mut n: i128 = 0;
    for c in digits.chars() {
        n = n.checked_mul(10)?.checked_add(decimal_value(c)? as i128)?;
    }
    Some(if negative { -n } else { n })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_cardinal_matches_num2words() {
        assert_eq!(cardinal(0), "zero");
        assert_eq!(cardinal(42), "forty-two");
        assert_eq!(cardinal(1001), "one thousand and one");
        assert_eq!(cardinal(1250), "one thousand, two hundred and fifty");
        assert_eq!(cardinal(7_900_000_000), "seven billion, nine hundred million");
        assert_eq!(cardinal(-5), "minus five");
        assert_eq!(cardinal(100_020), "one hundred thousand and twenty");
    }

    #[test]
    fn test_ordinal_and_year() {
        assert_eq!(ordinal(21), "twenty-first");
        assert_eq!(ordinal(100), "one hundredth");
        assert_eq!(ordinal(12), "twelfth");
        assert_eq!(year(1905), "nineteen oh-five");
        assert_eq!(year(2005), "two thousand and five");
        assert_eq!(year(2010), "twenty ten");
        assert_eq!(year(1800), "eighteen hundred");
    }

    #[test]
    fn test_decimal_drops_trailing_zeros() {
        assert_eq!(decimal("2.50"), "two point five");
        assert_eq!(decimal("3.14"), "three point one four");
        assert_eq!(decimal("5."), "five");
        assert_eq!(parse_int("١٢"), Some(12));
        assert_eq!(parse_int("-07"), Some(-7));
        assert_eq!(parse_int("1,2"), None);
    }
}
