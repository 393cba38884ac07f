//! Running one candidate in a forked child with a watchdog (see the parent module's doc).

use super::{internal, measure_one, CpuReference, MeasureOptions};
use crate::kernel::Kernel;
use tensortune_tuner::measure::{MeasureError, MeasureErrorKind, MeasureResult};

#[cfg(unix)]
pub(super) fn run_forked(
    k: &Kernel,
    reference: &CpuReference,
    opts: &MeasureOptions,
) -> MeasureResult {
    use std::time::Instant;

    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for the two descriptors pipe() writes.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(internal(format!(
            "pipe: {}",
            std::io::Error::last_os_error()
        )));
    }
    let (rd, wr) = (fds[0], fds[1]);
    // SAFETY: getpid cannot fail.
    let parent = unsafe { libc::getpid() };
    let fault = super::inject::next_forked();
    // SAFETY: the child only runs `child_main`, which touches no lock another thread of the
    // parent could hold except the allocator's: glibc's malloc resets its locks in the child,
    // and mimalloc (the `tensortune` binary's) gives each thread its own heap, which here is
    // the forking thread's (the rayon workers are idle while candidates run). The child then
    // leaves with `_exit`, running no destructors or atexit handlers of the parent.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: closing descriptors we own.
        unsafe {
            libc::close(rd);
            libc::close(wr);
        }
        return Err(internal(format!("fork: {e}")));
    }
    if pid == 0 {
        // SAFETY: in the child; `rd` is the parent's end.
        unsafe { libc::close(rd) };
        die_with_parent(parent);
        limit_memory();
        child_main(k, reference, opts, wr, fault);
    }
    // SAFETY: the parent's copy of the write end; closing it lets EOF arrive when the child
    // exits.
    unsafe { libc::close(wr) };
    let started = Instant::now();
    // A hopeless candidate (see `MeasureOptions::cutoff_s`) is stopped once it has had the
    // time of its checked run and one timed run at the cutoff on top of what a full
    // measurement of a fast candidate takes (warm-up and `repeat + 1` timings of at least
    // `min_repeat_ms`, plus the fork), and recorded as cut short with the time it ran: a
    // lower bound, so it ranks as badly as it deserves.
    let full = (opts.repeat as f64 + 2.0) * opts.min_repeat_ms / 1e3 + 0.05;
    // `try_from`: a cutoff from a damaged record (negative, NaN, huge) means no cutoff, not
    // a panic.
    let hopeless_after = opts
        .cutoff_s
        .and_then(|c| std::time::Duration::try_from_secs_f64(2.0 * c + 1.5 * full).ok())
        .filter(|d| *d < opts.timeout);
    let deadline = started + hopeless_after.unwrap_or(opts.timeout);
    let mut msg = Vec::new();
    let mut timed_out = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            timed_out = true;
            break;
        }
        let mut pfd = libc::pollfd {
            fd: rd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if r == 0 {
            continue;
        }
        let mut buf = [0u8; 4096];
        // SAFETY: reading into a local buffer of the given size.
        let n = unsafe { libc::read(rd, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
        if n <= 0 {
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        msg.extend_from_slice(&buf[..n as usize]);
    }
    // SAFETY: our read end.
    unsafe { libc::close(rd) };
    if timed_out {
        // SAFETY: `pid` is our child, not yet reaped.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let mut status = 0i32;
    // SAFETY: reaping our own child.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return Err(internal("waitpid failed".into()));
        }
    }
    // The child writes CHECKED once its first run passed the check; the result follows.
    let checked = msg.first() == Some(&CHECKED);
    if checked {
        msg.remove(0);
    }
    // A hopeless candidate is cut short only once it proved correct: one stopped before its
    // checked run finished (hung, or slower than the whole allowance) is a timeout.
    if timed_out && hopeless_after.is_some() && checked {
        let ran = started.elapsed().as_secs_f64();
        let mut t = tensortune_tuner::measure::Timing::from_repeats(vec![ran], 1)
            .ok_or_else(|| internal("no timing".into()))?;
        t.cut_short = true;
        return Ok(t);
    }
    if timed_out {
        let ran = started.elapsed().as_secs_f64();
        let stage = if checked {
            "while being timed"
        } else {
            "before its checked first run finished"
        };
        return Err(MeasureError::new(
            MeasureErrorKind::Timeout,
            format!("still running after {ran:.1} s, {stage}; killed"),
        ));
    }
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        return Err(MeasureError::new(
            MeasureErrorKind::Runtime,
            format!("crashed with signal {sig} ({})", signal_name(sig)),
        ));
    }
    serde_json::from_slice::<MeasureResult>(&msg).map_err(|e| {
        internal(format!(
            "child exited with status {status} and no result ({e})"
        ))
    })?
}

#[cfg(unix)]
fn child_main(
    k: &Kernel,
    reference: &CpuReference,
    opts: &MeasureOptions,
    wr: i32,
    fault: Option<super::inject::Fault>,
) -> ! {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let rt = crate::runtime::Runtime::new(opts.threads).map_err(|e| internal(e.to_string()))?;
        let checked = &mut || write_all(wr, &[CHECKED]);
        measure_one(k, reference, opts, &rt, checked, fault)
    }))
    .unwrap_or_else(|_| Err(internal("the measuring child panicked".into())));
    write_all(wr, &serde_json::to_vec(&result).unwrap_or_default());
    // SAFETY: leave at once, without running the parent's exit handlers in the child.
    unsafe { libc::_exit(0) }
}

/// Makes the kernel kill this child when the tuner dies (SIGKILL, a crash), so no candidate
/// lives on under init; and leaves at once if the parent already died between the fork and
/// the request, which the request alone would miss.
#[cfg(unix)]
fn die_with_parent(parent: libc::pid_t) {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number and no pointers.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
    }
    // SAFETY: getppid cannot fail; _exit leaves without running the parent's handlers.
    unsafe {
        if libc::getppid() != parent {
            libc::_exit(1);
        }
    }
}

/// Caps the child's address space at what it has mapped plus three quarters of the memory
/// the machine (or the tuner's own limit) still has, so a candidate that allocates without
/// bound fails its allocation instead of waking the out-of-memory killer, which might pick
/// the tuner.
#[cfg(target_os = "linux")]
fn limit_memory() {
    let (Some(room), Some(mapped)) = (
        crate::runtime::memory::available_bytes(),
        crate::runtime::memory::mapped_bytes(),
    ) else {
        return;
    };
    let cap = mapped.saturating_add(room / 4 * 3);
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write one rlimit we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_AS, &mut lim) == 0 && cap < lim.rlim_cur {
            lim.rlim_cur = cap;
            libc::setrlimit(libc::RLIMIT_AS, &lim);
        }
    }
}

#[cfg(all(unix, not(target_os = "linux")))]
fn limit_memory() {}

/// The byte a child writes when its first run passed the check (JSON never starts with it).
#[cfg(unix)]
const CHECKED: u8 = b'C';

/// Writes `bytes` to the pipe `wr`, giving up quietly if the parent went away.
#[cfg(unix)]
fn write_all(wr: i32, bytes: &[u8]) {
    let mut off = 0;
    while off < bytes.len() {
        // SAFETY: writing from a live buffer to our pipe end.
        let n = unsafe {
            libc::write(
                wr,
                bytes[off..].as_ptr() as *const libc::c_void,
                bytes.len() - off,
            )
        };
        if n <= 0 {
            break;
        }
        off += n as usize;
    }
}

#[cfg(unix)]
fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGSEGV => "segmentation fault",
        libc::SIGBUS => "bus error",
        libc::SIGILL => "illegal instruction",
        libc::SIGFPE => "arithmetic exception",
        libc::SIGABRT => "abort",
        libc::SIGKILL => "killed",
        _ => "signal",
    }
}

#[cfg(not(unix))]
pub(super) fn run_forked(
    k: &Kernel,
    reference: &CpuReference,
    opts: &MeasureOptions,
) -> MeasureResult {
    let rt = crate::runtime::Runtime::new(opts.threads).map_err(|e| internal(e.to_string()))?;
    measure_one(k, reference, opts, &rt, &mut || {}, None)
}
