//! Byte sizes on the command line: `512MiB`, `4GiB`, `1.5GB`, `65536`.

/// Parses a size with an optional unit (B, KB, MB, GB, KiB, MiB, GiB; case-insensitive).
pub fn parse(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a size; write e.g. 512MiB or 4GiB"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "ki" | "kib" => 1 << 10,
        "mi" | "mib" => 1 << 20,
        "gi" | "gib" => 1 << 30,
        other => {
            return Err(format!(
                "`{text}`: unknown unit `{other}`; use B, KB, MB, GB, KiB, MiB or GiB"
            ));
        }
    };
    Ok((value * scale as f64) as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_with_and_without_units() {
        assert_eq!(super::parse("65536"), Ok(65536));
        assert_eq!(super::parse("512MiB"), Ok(512 << 20));
        assert_eq!(super::parse("1.5GB"), Ok(1_500_000_000));
        assert_eq!(super::parse("4 gib"), Ok(4 << 30));
        assert!(super::parse("lots").is_err());
        assert!(
            super::parse("3 parsecs")
                .unwrap_err()
                .contains("unknown unit")
        );
    }
}
