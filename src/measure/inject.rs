//! Faults injected into candidates on purpose, so the test suite can check end to end, through
//! the binary, that a candidate which crashes, hangs, allocates without bound or writes out of
//! bounds costs one error record and nothing else.
//!
//! The plan comes from the environment variable [`FAULTS_ENV`]: a comma-separated list of
//! `KIND@N`, where `N` counts the candidates this process has run in forked children (from 0)
//! and `KIND` is one of `segv`, `hang`, `alloc`, `oob`. Faults only ever happen inside a forked
//! child, where the real failure would; with the variable unset nothing changes.

use crate::runtime::abi::Status;
use crate::runtime::buffer::BUFFER_ALIGN;
use crate::runtime::{AlignedBuffer, Runtime};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The environment variable holding the fault plan.
pub const FAULTS_ENV: &str = "TENSORTUNE_INJECT_FAULTS";

/// What an injected candidate does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Writes far past its first output's end, into the fence page: SIGSEGV.
    Segv,
    /// Never finishes its first run.
    Hang,
    /// Takes memory from the runtime's allocator and touches it until the allocator fails.
    Alloc,
    /// Writes one element just past its first output's end.
    OutOfBounds,
}

/// Parses a fault plan (see the module doc).
fn parse(text: &str) -> Result<Vec<(usize, Fault)>, String> {
    let mut plan = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let bad = || {
            format!(
                "{FAULTS_ENV}: `{}` is not KIND@N with KIND one of segv, hang, alloc, oob",
                item.escape_debug()
            )
        };
        let (kind, n) = item.split_once('@').ok_or_else(bad)?;
        let fault = match kind {
            "segv" => Fault::Segv,
            "hang" => Fault::Hang,
            "alloc" => Fault::Alloc,
            "oob" => Fault::OutOfBounds,
            _ => return Err(bad()),
        };
        plan.push((n.parse::<usize>().map_err(|_| bad())?, fault));
    }
    Ok(plan)
}

/// The plan of this process, read once; an unset variable is an empty plan.
fn plan() -> &'static Result<Vec<(usize, Fault)>, String> {
    static PLAN: OnceLock<Result<Vec<(usize, Fault)>, String>> = OnceLock::new();
    PLAN.get_or_init(|| match std::env::var(FAULTS_ENV) {
        Ok(text) => parse(&text),
        Err(std::env::VarError::NotPresent) => Ok(Vec::new()),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{FAULTS_ENV} is not UTF-8")),
    })
}

/// An error naming what is wrong with the fault plan in the environment, if anything: the
/// binary refuses to start on one, rather than run without the faults a test asked for.
pub fn check_fault_plan() -> Result<(), String> {
    plan().as_ref().map(|_| ()).map_err(Clone::clone)
}

/// Counts the candidates run in forked children by this process.
static FORKED: AtomicUsize = AtomicUsize::new(0);

/// The fault planned for the next forked candidate, if any (counting it).
pub(crate) fn next_forked() -> Option<Fault> {
    let n = FORKED.fetch_add(1, Ordering::Relaxed);
    let plan = plan().as_ref().ok()?;
    plan.iter().find(|(at, _)| *at == n).map(|(_, f)| *f)
}

/// A first run that never finishes (until the watchdog kills the child).
pub(crate) fn hang() -> ! {
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// What a kernel does that allocates temporaries without bound: takes memory from the
/// runtime's allocator in 64 MiB blocks, touching each, until the allocator refuses; returns
/// the status such a kernel returns then.
pub(crate) fn exhaust_allocator(rt: &Runtime) -> i32 {
    const BLOCK: usize = 64 << 20;
    let table = rt.table();
    loop {
        // SAFETY: `table` is the live runtime's table; `alloc` takes a size and returns that
        // many bytes or NULL.
        let p = unsafe { ((*table).alloc)(table, BLOCK as i64) };
        if p.is_null() {
            return Status::AllocFailed as i32;
        }
        // SAFETY: `p` holds BLOCK writable bytes; writing them makes the memory resident. The
        // blocks are never freed, on purpose: the child exits after this candidate.
        unsafe { std::ptr::write_bytes(p as *mut u8, 1, BLOCK) };
    }
}

/// After the first run, the write outside `out` that `fault` stands for: `Segv` one past the
/// alignment slack, into the fence page; `OutOfBounds` the byte just past the data (in the
/// slack, or on the fence when the data ends at a page boundary). Other faults write nothing.
pub(crate) fn write_outside(fault: Fault, out: &mut AlignedBuffer) {
    let bytes = out.byte_len();
    let offset = match fault {
        Fault::Segv => bytes.max(BUFFER_ALIGN).next_multiple_of(BUFFER_ALIGN),
        Fault::OutOfBounds => bytes,
        Fault::Hang | Fault::Alloc => return,
    };
    // SAFETY: none: this is the out-of-bounds write a faulty kernel would make, done only in
    // a forked child whose buffers are fenced, so it either faults there or is seen by the
    // fence check; the child's result is then an error and the child exits.
    unsafe { std::ptr::write_volatile(out.as_mut_ptr().add(offset), 0x5A) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse("segv@0, hang@3,alloc@1,oob@7,"),
            Ok(vec![
                (0, Fault::Segv),
                (3, Fault::Hang),
                (1, Fault::Alloc),
                (7, Fault::OutOfBounds)
            ])
        );
        assert_eq!(parse(""), Ok(vec![]));
        for bad in ["segv", "boom@1", "hang@x", "oob@-1"] {
            let e = parse(bad).expect_err(bad);
            assert!(e.contains(FAULTS_ENV) && e.contains(bad), "{e}");
        }
    }
}
