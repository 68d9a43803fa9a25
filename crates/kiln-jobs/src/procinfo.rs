//! Process identity (`/proc/<pid>/stat`) and signals.

/// The start time of process `pid` in clock ticks since boot (field 22 of
/// `/proc/<pid>/stat`), or `None` if it is gone, a zombie, or unreadable.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `comm` (field 2) may hold spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    // `rest` starts at field 3 (state); starttime is field 22.
    fields.nth(22 - 4)?.parse().ok()
}

/// Whether `pid` is alive and, if `expected_start` is given, is still the same process.
pub fn is_alive(pid: u32, expected_start: Option<u64>) -> bool {
    match (start_time(pid), expected_start) {
        (Some(now), Some(then)) => now == then,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// Sends `signal` to `pid`; false if it failed (e.g. the process is gone).
pub fn send_signal(pid: u32, signal: i32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill(2) has no memory-safety preconditions; pid > 0 targets one process.
    unsafe { libc::kill(pid, signal) == 0 }
}

/// Sends `signal` to the process group led by `pid` (a job child and anything it started).
pub fn signal_group(pid: u32, signal: i32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 1 {
        return false;
    }
    // SAFETY: as above; a negative pid targets the process group `pid`.
    unsafe { libc::kill(-pid, signal) == 0 }
}

/// SIGTERM.
pub const SIGTERM: i32 = libc::SIGTERM;
/// SIGKILL.
pub const SIGKILL: i32 = libc::SIGKILL;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_with_its_start_time() {
        let me = std::process::id();
        let start = start_time(me);
        assert!(start.is_some());
        assert!(is_alive(me, start));
        assert!(!is_alive(me, start.map(|s| s + 1)));
    }
}
