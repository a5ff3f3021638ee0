//! Which process this is, in a form another process on the same machine
//! can check: the boot and pid namespace it runs in (hashed), and its start
//! time. Lease owners and local temporary files carry them, so a process in
//! another container, or a later one that reuses a pid, is never taken for
//! the one that wrote them.

/// This process's boot and pid namespace, hashed: processes of another
/// container (its own pid namespace) or of an earlier boot differ.
pub(crate) fn namespace() -> String {
    static NS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NS.get_or_init(read_namespace).clone()
}

fn read_namespace() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let pidns = std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let mut h = crate::hash::Fnv::new();
    h.write(boot.trim().as_bytes());
    h.write(b"/");
    h.write(pidns.as_bytes());
    format!("{:016x}", h.finish())
}

/// When process `pid` (in this pid namespace) started, in clock ticks
/// since boot (`/proc/PID/stat`, field 22); `None` if there is no such
/// live process: none has the pid, or it has exited and waits to be
/// reaped (a zombie, state `Z`, or `X`), which an init slow to reap keeps
/// for a while after a kill.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    if matches!(fields.next()?, "Z" | "X" | "x") {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

#[cfg(test)]
mod tests {
    /// A child that exited and was not waited for is a zombie: no live
    /// process, though `/proc/PID` is still there (a killed lease holder
    /// under an init slow to reap it looked alive before).
    #[test]
    fn a_zombie_is_not_a_live_process() {
        assert!(super::start_time(std::process::id()).is_some());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let stat = format!("/proc/{pid}/stat");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !std::fs::read_to_string(&stat).is_ok_and(|s| s.contains(") Z ")) {
            assert!(
                std::time::Instant::now() < deadline,
                "the child never exited"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(super::start_time(pid), None);
        child.wait().unwrap();
    }
}
