// The one parallel runtime of tensortune: the thread pool that runs the parallel loops of
// kernels, and the aligned allocation of their large temporaries. The JIT's `Runtime`
// (src/runtime/pool.rs) and every module `tensortune::build` generates (after src/build/rt.rs)
// carry this same text, so what tuning times is what a build ships.
//
// It is pulled in by `include!` and pasted verbatim into generated modules, next to code with
// imports of its own, so it needs nothing but `std`, names every path in full (no `use`), and
// has plain `//` comments only. The including scope provides `TtRuntime` (the ABI table of
// `tensortune::runtime::abi`: parallel_for, alloc, free, ctx) and `ParallelBody`.
//
// `Pool::parallel_for` splits `[0, n)` into `min(n, threads)` contiguous chunks whose sizes
// differ by at most one (a static schedule, like TVM's default CPU launch). The calling thread
// runs the first chunk, then any queued chunk, then waits for the rest; so `threads - 1`
// workers serve a pool of `threads`, and a call never waits on workers busy elsewhere. Idle
// workers poll for a while before they sleep, so back-to-back kernel calls (a timing loop, a
// model's layers) need no wake-up.

/// Stack size of the worker threads: kernels keep register tiles on the stack (the codegen
/// caps one function's temporaries at 512 KiB), so 8 MiB leaves a wide margin.
const WORKER_STACK_BYTES: usize = 8 << 20;

/// Rounds an idle thread polls before it sleeps; each round is `SPINS_PER_ROUND` pause hints
/// and a yield, about as long as rayon's workers poll (tens of microseconds).
const IDLE_ROUNDS: u32 = 32;
/// Pause hints per polling round.
const SPINS_PER_ROUND: u32 = 64;

/// Alignment of every buffer a kernel sees: one cache line, one AVX-512 vector.
const ALIGN: usize = 64;

/// One chunk of a parallel loop, waiting for a thread.
struct Job {
    body: ParallelBody,
    closure: *mut std::ffi::c_void,
    begin: i64,
    end: i64,
    latch: *const Latch,
}

// SAFETY: the closure is built by the kernel for exactly this use (read-only while its
// parallel-for runs) and the latch outlives every job that points at it: `parallel_for`
// returns only when all its jobs have counted down.
unsafe impl Send for Job {}

impl Job {
    fn run(self) {
        // SAFETY: see `Job`: the body runs its own disjoint range, as the ABI allows.
        let code = unsafe { (self.body)(self.closure, self.begin, self.end) };
        Latch::count_down(self.latch, code);
    }
}

/// Counts the unfinished chunks of one parallel-for, keeps the first failure code, and wakes
/// the calling thread when the count reaches zero.
struct Latch {
    left: std::sync::atomic::AtomicUsize,
    status: std::sync::atomic::AtomicI32,
    owner: std::thread::Thread,
}

impl Latch {
    /// Counts one chunk done. Takes a pointer: once the count is zero the owner may return and
    /// free the latch, so nothing of it is touched after the decrement.
    fn count_down(latch: *const Latch, code: i32) {
        use std::sync::atomic::Ordering;
        // SAFETY: the latch lives until its count reaches zero, which happens below at the
        // earliest.
        let owner = unsafe {
            if code != 0 {
                let _ =
                    (*latch)
                        .status
                        .compare_exchange(0, code, Ordering::AcqRel, Ordering::Relaxed);
            }
            let owner = (*latch).owner.clone();
            ((*latch).left.fetch_sub(1, Ordering::AcqRel) == 1).then_some(owner)
        };
        if let Some(t) = owner {
            t.unpark();
        }
    }

    /// Waits, polling then parked, until every chunk is done; the first failure code or 0.
    fn wait(&self) -> i32 {
        use std::sync::atomic::Ordering;
        let done = || self.left.load(Ordering::Acquire) == 0;
        if !poll(done) {
            while !done() {
                // A stray unpark only means one more look at the count.
                std::thread::park();
            }
        }
        self.status.load(Ordering::Acquire)
    }
}

/// Polls `ready` for `IDLE_ROUNDS` rounds; whether it became true.
fn poll(ready: impl Fn() -> bool) -> bool {
    for _ in 0..IDLE_ROUNDS {
        for _ in 0..SPINS_PER_ROUND {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        std::thread::yield_now();
    }
    ready()
}

/// The queue of chunks and the count of workers asleep on it.
struct Queue {
    jobs: std::collections::VecDeque<Job>,
    sleepers: usize,
}

/// What the workers of one pool share.
struct PoolShared {
    queue: std::sync::Mutex<Queue>,
    /// Jobs in the queue, read without the lock by polling threads.
    queued: std::sync::atomic::AtomicUsize,
    ready: std::sync::Condvar,
    stop: std::sync::atomic::AtomicBool,
}

impl PoolShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // Jobs never panic while the lock is held (they run outside it), so a poisoned lock
        // still holds a consistent queue.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, jobs: impl Iterator<Item = Job>) {
        use std::sync::atomic::Ordering;
        let (pushed, sleepers) = {
            let mut q = self.lock();
            let before = q.jobs.len();
            q.jobs.extend(jobs);
            let pushed = q.jobs.len() - before;
            self.queued.fetch_add(pushed, Ordering::Release);
            (pushed, q.sleepers)
        };
        // Sleepers checked the queue under the lock before waiting, so none misses these.
        for _ in 0..pushed.min(sleepers) {
            self.ready.notify_one();
        }
    }

    fn try_pop(&self) -> Option<Job> {
        use std::sync::atomic::Ordering;
        if self.queued.load(Ordering::Acquire) == 0 {
            return None;
        }
        let job = self.lock().jobs.pop_front();
        if job.is_some() {
            self.queued.fetch_sub(1, Ordering::Release);
        }
        job
    }

    fn work(&self) {
        use std::sync::atomic::Ordering;
        loop {
            if let Some(job) = self.try_pop() {
                job.run();
                continue;
            }
            let stopped = || self.stop.load(Ordering::Acquire);
            if poll(|| self.queued.load(Ordering::Acquire) > 0 || stopped()) && !stopped() {
                continue;
            }
            let mut q = self.lock();
            let job = loop {
                if stopped() {
                    return;
                }
                if let Some(job) = q.jobs.pop_front() {
                    self.queued.fetch_sub(1, Ordering::Release);
                    break job;
                }
                q.sleepers += 1;
                q = self.ready.wait(q).unwrap_or_else(|e| e.into_inner());
                q.sleepers -= 1;
            };
            drop(q);
            job.run();
        }
    }
}

/// A pool of `threads` threads: the caller of `parallel_for` and `threads - 1` workers, which
/// stop when the pool is dropped.
struct Pool {
    threads: usize,
    shared: std::sync::Arc<PoolShared>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl Pool {
    /// A pool of `threads` (0 is taken as 1; 1 starts no worker). Where a worker cannot be
    /// started, the pool has the ones that did start (the calling thread runs the chunks
    /// nobody else takes) and the error comes back beside it.
    fn start(threads: usize) -> (Pool, Option<std::io::Error>) {
        let threads = threads.max(1);
        let shared = std::sync::Arc::new(PoolShared {
            queue: std::sync::Mutex::new(Queue {
                jobs: std::collections::VecDeque::new(),
                sleepers: 0,
            }),
            queued: std::sync::atomic::AtomicUsize::new(0),
            ready: std::sync::Condvar::new(),
            stop: std::sync::atomic::AtomicBool::new(false),
        });
        let mut pool = Pool {
            threads,
            shared,
            workers: Vec::new(),
        };
        for i in 1..threads {
            let shared = std::sync::Arc::clone(&pool.shared);
            let started = std::thread::Builder::new()
                .name(format!("tt-worker-{i}"))
                .stack_size(WORKER_STACK_BYTES)
                .spawn(move || shared.work());
            match started {
                Ok(handle) => pool.workers.push(handle),
                Err(e) => return (pool, Some(e)),
            }
        }
        (pool, None)
    }

    /// Runs `body` over `[0, n)` in chunks on the pool (see the top of this file); the first
    /// non-zero code a chunk returned, or 0.
    fn parallel_for(&self, n: i64, body: ParallelBody, closure: *mut std::ffi::c_void) -> i32 {
        if n <= 0 {
            return 0;
        }
        let chunks = (self.threads as i64).min(n);
        if chunks <= 1 {
            // SAFETY: the kernel's own body over the whole range.
            return unsafe { body(closure, 0, n) };
        }
        let latch = Latch {
            left: std::sync::atomic::AtomicUsize::new(chunks as usize),
            status: std::sync::atomic::AtomicI32::new(0),
            owner: std::thread::current(),
        };
        // In i128: `n * c` may not fit in i64 where `n` is near its end.
        let bound = |c: i64| (n as i128 * c as i128 / chunks as i128) as i64;
        let chunk = |c: i64| Job {
            body,
            closure,
            begin: bound(c),
            end: bound(c + 1),
            latch: &latch,
        };
        self.shared.push((1..chunks).map(chunk));
        chunk(0).run();
        while let Some(job) = self.shared.try_pop() {
            job.run();
        }
        latch.wait()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared
            .stop
            .store(true, std::sync::atomic::Ordering::Release);
        // Under the lock: a worker about to sleep has either seen `stop` or is waiting.
        drop(self.shared.lock());
        self.shared.ready.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Largest block (with its header) that a thread keeps for reuse after `tt_free`.
const SPARE_MAX_BYTES: usize = 256 << 10;
/// Most blocks a thread keeps for reuse.
const SPARE_MAX_BLOCKS: usize = 16;

/// Blocks freed on one thread, kept for the next `tt_alloc` of the same size there; given
/// back to the allocator when the thread ends.
struct Spare(Vec<(usize, *mut u8)>);

impl Drop for Spare {
    fn drop(&mut self) {
        for &(total, base) in &self.0 {
            // SAFETY: each block came from `tt_alloc` with this size and alignment.
            unsafe {
                std::alloc::dealloc(
                    base,
                    std::alloc::Layout::from_size_align_unchecked(total, ALIGN),
                )
            };
        }
    }
}

std::thread_local! {
    // A kernel allocates a temporary in main memory inside its loops (an accumulator tile
    // that is not a register tile, say), so one call may allocate and free the same small
    // block hundreds of times. The allocator of the process that tuned the kernel (the
    // `tensortune` binary's mimalloc) does that in a few nanoseconds; glibc's aligned
    // allocation takes far longer, and a network of such kernels ran markedly slower in a
    // program than tuning measured (docs/measurements.md). Reusing this thread's last blocks makes the cost the same
    // under any allocator.
    static SPARE: std::cell::RefCell<Spare> = const { std::cell::RefCell::new(Spare(Vec::new())) };
}

/// `rt->alloc`: `bytes` bytes aligned to `ALIGN`, or null. One alignment unit before the
/// block remembers its size for `tt_free`. A small block freed earlier on this thread is
/// reused.
unsafe extern "C" fn tt_alloc(_rt: *const TtRuntime, bytes: i64) -> *mut std::ffi::c_void {
    let Some(total) = usize::try_from(bytes)
        .ok()
        .and_then(|b| b.checked_add(ALIGN))
    else {
        return std::ptr::null_mut();
    };
    let spare = SPARE
        .try_with(|s| {
            let mut s = s.try_borrow_mut().ok()?;
            let i = s.0.iter().rposition(|&(t, _)| t == total)?;
            Some(s.0.swap_remove(i).1)
        })
        .ok()
        .flatten();
    let base = match spare {
        Some(b) => b,
        None => {
            let Ok(layout) = std::alloc::Layout::from_size_align(total, ALIGN) else {
                return std::ptr::null_mut();
            };
            // SAFETY: the layout's size is at least ALIGN, not zero.
            let b = unsafe { std::alloc::alloc(layout) };
            if b.is_null() {
                return std::ptr::null_mut();
            }
            b
        }
    };
    // SAFETY: the header lies inside the block and is aligned for usize.
    unsafe {
        (base as *mut usize).write(total);
        base.add(ALIGN) as *mut std::ffi::c_void
    }
}

/// `rt->free`: releases a block from `tt_alloc` (keeping a small one for this thread's next
/// `tt_alloc`); null is ignored.
unsafe extern "C" fn tt_free(_rt: *const TtRuntime, ptr: *mut std::ffi::c_void) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: `ptr` came from `tt_alloc`, whose header holds the size of the block, which
    // was allocated with the same alignment.
    unsafe {
        let base = (ptr as *mut u8).sub(ALIGN);
        let total = (base as *const usize).read();
        let kept = total <= SPARE_MAX_BYTES
            && SPARE
                .try_with(|s| match s.try_borrow_mut() {
                    Ok(mut s) if s.0.len() < SPARE_MAX_BLOCKS => {
                        s.0.push((total, base));
                        true
                    }
                    _ => false,
                })
                .unwrap_or(false);
        if !kept {
            std::alloc::dealloc(
                base,
                std::alloc::Layout::from_size_align_unchecked(total, ALIGN),
            );
        }
    }
}
