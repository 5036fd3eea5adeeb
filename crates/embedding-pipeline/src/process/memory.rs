//! The process's memory, from Linux's `/proc`: what `pipeline probe` measures each step by, and what a
//! run records as its peak. Elsewhere every figure is `None`.

/// A field of `/proc/self/status` or `/proc/meminfo`, in bytes (they are given in kB).
fn field(file: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line[key.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// Resident memory now.
pub fn resident() -> Option<u64> {
    field("/proc/self/status", "VmRSS:")
}

/// The resident memory when [`mark_before_load`] was first called (a command's start, before it loads a
/// model): what the command's model and session add is measured from it.
static BEFORE_LOAD: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();

/// Note the resident memory now, if not noted yet.
pub fn mark_before_load() {
    BEFORE_LOAD.get_or_init(resident);
}

/// The resident memory [`mark_before_load`] noted, or now when it was never called.
pub fn before_load() -> Option<u64> {
    BEFORE_LOAD.get().copied().flatten().or_else(resident)
}

/// Peak resident memory since the last [`reset_peak`], or since the process started.
pub fn peak() -> Option<u64> {
    field("/proc/self/status", "VmHWM:")
}

/// Start a new peak from the resident memory now (Linux 4.0 and later; elsewhere the peak stays the
/// process's, which can only make a later measurement look larger).
pub fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Hand the heap's free memory back to the system (glibc keeps freed blocks for reuse, so the resident set
/// would go on counting a freed model and its calls): after a step whose memory must not be counted in the
/// next. Elsewhere nothing.
pub fn give_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap memory; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Memory the system can give without swapping.
pub fn available() -> Option<u64> {
    field("/proc/meminfo", "MemAvailable:")
}

/// A size as people write it (`900MB`, `8GiB`, `1.5 GB`, `123456`), in bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let size: bytesize::ByteSize =
        s.trim().parse().map_err(|_| format!("{:?} is not a size; write one such as 900MB or 8GiB", s.trim()))?;
    match size.as_u64() {
        0 => Err("a size of 0 bytes holds nothing".into()),
        n => Ok(n),
    }
}

/// Bytes in MiB, for people.
pub fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_read_from_proc() {
        let rss = resident().unwrap();
        reset_peak();
        let peak = peak().unwrap();
        assert!(rss > 0 && peak >= rss / 2, "{rss} {peak}");
        assert!(available().unwrap() > 0);
    }

    #[test]
    fn sizes_parse_as_people_write_them() {
        assert_eq!(parse_size("900MB"), Ok(900_000_000));
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));
        assert_eq!(parse_size(" 1.5 GiB "), Ok(3 << 29));
        assert_eq!(parse_size("123456"), Ok(123_456));
        assert!(parse_size("lots").unwrap_err().contains("such as 900MB"));
        assert!(parse_size("0").is_err());
    }
}
