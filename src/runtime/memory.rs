//! How much memory a workload may still take: checked before its buffers are allocated, so a
//! workload too large for the machine is a clear error rather than an abort or a visit from
//! the kernel's out-of-memory killer.
//!
//! Allocation itself is fallible everywhere (a null from the allocator is an error), but on
//! Linux with overcommit a huge allocation can succeed and the process dies later, touching
//! the pages. So where the size is known up front (a workload's inputs, outputs and
//! reference), it is compared with what the machine has free (`MemAvailable`) and with what
//! this process may still map (`RLIMIT_AS` less the current address space).

use super::BufferError;

/// Bytes this process can still expect to allocate and touch, `None` where unknown.
pub fn available_bytes() -> Option<u64> {
    let free = mem_available();
    let room = address_space_room();
    match (free, room) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// An error when `bytes` (for `what`) exceed [`available_bytes`]; fine where it is unknown.
pub fn check_fits(bytes: u64, what: &str) -> Result<(), BufferError> {
    match available_bytes() {
        Some(have) if bytes > have => Err(BufferError::TooLarge {
            what: what.to_string(),
            need: bytes,
            have,
        }),
        _ => Ok(()),
    }
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// The soft `RLIMIT_AS` less the address space already mapped, in bytes; `None` without a
/// limit.
#[cfg(target_os = "linux")]
fn address_space_room() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } != 0
        || lim.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    Some(lim.rlim_cur.saturating_sub(mapped_bytes()?))
}

/// The address space this process has mapped, in bytes (Linux; `None` elsewhere).
#[cfg(target_os = "linux")]
pub fn mapped_bytes() -> Option<u64> {
    // The first field of statm is the mapped size in pages.
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
    Some(pages.saturating_mul(page))
}

/// The address space this process has mapped (Linux; `None` elsewhere).
#[cfg(not(target_os = "linux"))]
pub fn mapped_bytes() -> Option<u64> {
    None
}

#[cfg(not(target_os = "linux"))]
fn address_space_room() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_petabyte_does_not_fit_and_a_kilobyte_does() {
        // Every machine that runs the tests reports its memory (Linux) and has less than 1 PB.
        assert!(available_bytes().is_some());
        let err = check_fits(1 << 50, "the test").expect_err("1 PiB");
        assert!(err.to_string().contains("the test"), "{err}");
        check_fits(1024, "a kilobyte").expect("fits");
    }
}
