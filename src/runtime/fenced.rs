//! Fenced allocations for measuring candidates: the data sits between two inaccessible pages,
//! and the few bytes between the data and each fence hold a known pattern.
//!
//! A candidate that writes far outside a buffer faults on a fence (its child dies with
//! SIGSEGV); one that writes just past the end or before the start, within the alignment
//! slack, changes the pattern, which [`Fenced::intact`] sees after the run. Either way an
//! out-of-bounds write is an error record instead of a fast "correct" candidate whose build
//! would later corrupt a user's memory.

/// The byte the slack between data and fences holds.
const CANARY: u8 = 0xA5;

/// The size of a transparent huge page on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// One fenced mapping: `[fence page][slack][data: bytes][slack < align][fence page]`.
pub(super) struct Fenced {
    base: *mut u8,
    map_len: usize,
    page: usize,
    /// Offset of the data from `base`.
    data_off: usize,
    bytes: usize,
    /// Bytes from the data's start to the trailing fence (`bytes` rounded up to `align`).
    padded: usize,
}

impl Fenced {
    /// Maps `bytes` of zeroed data aligned to `align` (a power of two, at most a page), with
    /// its end as close to the trailing fence as the alignment allows. `None` when the system
    /// refuses the mapping or the size overflows.
    #[cfg(unix)]
    pub(super) fn new(bytes: usize, align: usize) -> Option<Fenced> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
        if !align.is_power_of_two() || align > page {
            return None;
        }
        let padded = bytes.max(align).checked_next_multiple_of(align)?;
        let data_pages = padded.div_ceil(page);
        let map_len = data_pages.checked_add(2)?.checked_mul(page)?;
        // Data of a huge page or more starts on a huge-page boundary: the kernel backs only
        // whole aligned ranges of a mapping with huge pages, so at the address mmap picks a
        // buffer of whole huge pages loses one of them to small pages (a different one each
        // run), while the allocator behind a user's arrays gives it all of them.
        let lead = if data_pages * page >= HUGE_PAGE {
            HUGE_PAGE
        } else {
            0
        };
        let raw_len = map_len.checked_add(lead)?;
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                raw_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        let raw = raw as *mut u8;
        // The fence page just before a huge-page boundary; what is left of the over-mapping
        // on either side is given back.
        let skip = if lead == 0 {
            0
        } else {
            (HUGE_PAGE - (raw as usize + page) % HUGE_PAGE) % HUGE_PAGE
        };
        // SAFETY: the two ranges unmapped lie inside the mapping just made, outside the
        // `map_len` bytes from `raw + skip` that are kept.
        unsafe {
            if skip > 0 {
                libc::munmap(raw as *mut libc::c_void, skip);
            }
            if lead > skip {
                libc::munmap(raw.add(skip + map_len) as *mut libc::c_void, lead - skip);
            }
        }
        // SAFETY: `skip` is below `lead`, inside the mapping.
        let base = unsafe { raw.add(skip) };
        let data_off = page + data_pages * page - padded;
        let f = Fenced {
            base,
            map_len,
            page,
            data_off,
            bytes,
            padded,
        };
        // SAFETY: both fence pages lie inside the mapping just made.
        let fenced = unsafe {
            libc::mprotect(base as *mut libc::c_void, page, libc::PROT_NONE) == 0
                && libc::mprotect(
                    base.add(page + data_pages * page) as *mut libc::c_void,
                    page,
                    libc::PROT_NONE,
                ) == 0
        };
        if !fenced {
            return None; // `f` unmaps on drop
        }
        // Transparent huge pages for the data, as the allocator behind an ordinary buffer
        // gets them (`AlignedBuffer` outside measurement, a user's arrays): with 4 KiB pages a
        // kernel streaming a 64 MiB input ran at 0.77 of its speed on huge pages (the TLB
        // misses), so tuning measured a different machine from the one its kernels ship to.
        // Advice only, before the first touch: where it is refused the data stays on small
        // pages.
        #[cfg(target_os = "linux")]
        // SAFETY: the range is the mapping's data pages; madvise changes no contents.
        unsafe {
            libc::madvise(
                base.add(page) as *mut libc::c_void,
                data_pages * page,
                libc::MADV_HUGEPAGE,
            );
        }
        for (start, len) in f.slack() {
            // SAFETY: the slack ranges lie inside the mapping's writable pages.
            unsafe { std::ptr::write_bytes(base.add(start), CANARY, len) };
        }
        Some(f)
    }

    /// Without fences where there is no `mmap`.
    #[cfg(not(unix))]
    pub(super) fn new(_bytes: usize, _align: usize) -> Option<Fenced> {
        None
    }

    /// Start of the data.
    pub(super) fn ptr(&self) -> *mut u8 {
        // SAFETY: `data_off` lies inside the mapping.
        unsafe { self.base.add(self.data_off) }
    }

    /// The slack ranges, as (offset from `base`, length): before the data and after it.
    fn slack(&self) -> [(usize, usize); 2] {
        let end = self.data_off + self.bytes;
        [
            (self.page, self.data_off - self.page),
            (end, self.data_off + self.padded - end),
        ]
    }

    /// True while every slack byte still holds the pattern: nothing wrote just outside the
    /// data.
    pub(super) fn intact(&self) -> bool {
        self.slack().iter().all(|&(start, len)| {
            // SAFETY: the slack ranges lie inside the mapping's readable pages.
            let s = unsafe { std::slice::from_raw_parts(self.base.add(start), len) };
            s.iter().all(|&b| b == CANARY)
        })
    }
}

impl Drop for Fenced {
    fn drop(&mut self) {
        #[cfg(unix)]
        // SAFETY: unmapping exactly the mapping `new` made, once.
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.map_len);
        }
    }
}
