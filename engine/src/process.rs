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
/// process.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}
