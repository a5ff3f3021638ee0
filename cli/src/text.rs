//! Numbers, counts and durations as a person reads them.

/// `noun` for `n` of it: `file`, `files`; `batch`, `batches`.
pub fn noun(n: u64, noun: &str) -> String {
    if n == 1 {
        noun.to_string()
    } else if noun.ends_with("ch") || noun.ends_with('s') {
        format!("{noun}es")
    } else {
        format!("{noun}s")
    }
}

/// `1 file`, `2 files`.
pub fn count(n: u64, what: &str) -> String {
    format!("{n} {}", noun(n, what))
}

/// A duration for a person: `67 ms`, `4.2 s`, `34m 20s`, `2h 5m`.
pub fn duration_ms(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        _ => duration_s(ms / 1000),
    }
}

/// Whole seconds for a person: `45s`, `34m 20s`, `2h 5m`, `3d 4h`.
pub fn duration_s(s: u64) -> String {
    match s {
        0..60 => format!("{s}s"),
        60..3_600 => format!("{}m {}s", s / 60, s % 60),
        3_600..86_400 => format!("{}h {}m", s / 3_600, s % 3_600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3_600),
    }
}
