//! What this machine can do at best, measured rather than read off a datasheet: the f32 FMA
//! peak (independent vector FMA chains at the widest vector width the CPU has), where the CPU
//! has AVX-512 BF16 the peak of its bf16 dot products (what `dtype=bf16` products run on),
//! the memory bandwidth of a copy, of a triad and of a read-only sum over buffers far larger than the
//! last-level cache, both on one thread and on all of them, and the overhead of an empty
//! parallel loop of the kernel runtime ([`crate::Runtime`]). Tuned kernels are quoted as fractions of these figures,
//! measured in the same run (`tensortune probe`, `cargo bench --bench cpu_goals`), because an
//! absolute time on a shared machine is not stable from one run to the next.

use crate::runtime::abi::TtRuntime;
use crate::Runtime;
use serde::Serialize;
use std::ffi::c_void;
use std::time::Instant;

/// What to probe.
#[derive(Clone, Debug)]
pub struct ProbeOptions {
    /// Threads of the all-cores figures (0: every core the process may use).
    pub threads: usize,
    /// Bytes of each of the bandwidth probe's arrays (`None`: four times the last-level cache,
    /// at least 64 MiB). Three arrays of this size are allocated.
    pub buffer_bytes: Option<usize>,
    /// Timings of each figure; the best is kept (the machine's capability, not its noise).
    pub repeats: usize,
    /// Seconds each timing of the FMA probe lasts, about.
    pub fma_seconds: f64,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        ProbeOptions {
            threads: 0,
            buffer_bytes: None,
            repeats: 5,
            fma_seconds: 0.2,
        }
    }
}

/// The figures of one probe run.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeReport {
    /// The CPU's model name (`/proc/cpuinfo`), or the architecture where none is known.
    pub cpu: String,
    /// The instruction set of the FMA probe: `avx512f`, `avx2+fma` or `scalar`.
    pub isa: String,
    /// f32 lanes of one FMA of that set.
    pub lanes: usize,
    /// Threads of the all-cores figures.
    pub threads: usize,
    /// f32 FMA peak of one thread, GFLOP/s (an FMA counts as two flops).
    pub fma_gflops_1t: f64,
    /// f32 FMA peak of `threads` threads together, GFLOP/s.
    pub fma_gflops_all: f64,
    /// Peak of AVX-512 BF16's dot product of bf16 pairs into f32 (`vdpbf16ps` on 16 lanes,
    /// independent chains) on one thread, GFLOP/s, each product and its sum two flops (64 an
    /// instruction); `None` where the CPU lacks AVX-512 BF16. Its ratio to
    /// [`ProbeReport::fma_gflops_1t`] is what bf16 inputs can gain on compute: 2 on a core
    /// that issues it as often as an FMA, 1 or less where it has fewer pipes for it.
    pub bf16_dot_gflops_1t: Option<f64>,
    /// Bytes of each bandwidth array.
    pub buffer_bytes: usize,
    /// The largest cache level's size in bytes, where the OS says (`None` otherwise).
    pub last_level_cache_bytes: Option<usize>,
    /// Copy `a = b` (memcpy, as numpy copies) on one thread, GB/s of bytes read and written.
    pub copy_gbs_1t: f64,
    /// Copy on `threads` threads, each its own slice.
    pub copy_gbs_all: f64,
    /// Triad `a = b + s·c` on one thread, GB/s of bytes read and written (three arrays).
    pub triad_gbs_1t: f64,
    /// Triad on `threads` threads.
    pub triad_gbs_all: f64,
    /// A read-only pass (a sum over four parts of one array read side by side) on one thread,
    /// GB/s of bytes read. One core's read stream can be well below its copy figure: a copy's
    /// stores stream out without reading their lines first, while every read waits on its
    /// line, so the yardstick of an op that only reads (a reduction, a GEMV) is this one.
    pub read_gbs_1t: f64,
    /// The read-only pass on `threads` threads.
    pub read_gbs_all: f64,
    /// Microseconds a parallel loop over `threads` threads on the kernel runtime costs beyond
    /// its work (the fixed cost a parallel kernel pays per parallel loop; see
    /// `parallel_loop_overhead_us`).
    pub parallel_loop_us: f64,
}

impl ProbeReport {
    /// The bandwidth memory-bound kernels are quoted against on one thread: the better of
    /// copy and triad (the stricter yardstick).
    pub fn bandwidth_gbs_1t(&self) -> f64 {
        self.copy_gbs_1t.max(self.triad_gbs_1t)
    }

    /// The same on `threads` threads.
    pub fn bandwidth_gbs_all(&self) -> f64 {
        self.copy_gbs_all.max(self.triad_gbs_all)
    }

    /// The yardstick of an op that reads `read_bytes` and writes `written_bytes` once, on one
    /// thread (`all`: false) or on `threads`: the bandwidth of a stream of that mix, its bytes
    /// moved at the copy/triad rate where it writes and at the read-only rate where it only
    /// reads (the time of each part added).
    pub fn bandwidth_gbs_for(&self, read_bytes: f64, written_bytes: f64, all: bool) -> f64 {
        let (mixed, read) = if all {
            (self.bandwidth_gbs_all(), self.read_gbs_all)
        } else {
            (self.bandwidth_gbs_1t(), self.read_gbs_1t)
        };
        // The written bytes come with as many read bytes in a copy; the reads beyond those
        // go at the read-only rate.
        let paired = written_bytes.min(read_bytes) + written_bytes;
        let alone = (read_bytes - written_bytes).max(0.0);
        let seconds = paired / mixed.max(1e-9) + alone / read.max(1e-9);
        if seconds > 0.0 {
            (read_bytes + written_bytes) / seconds
        } else {
            mixed
        }
    }
}

/// Why a probe could not run.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// An option out of range.
    #[error("{0}")]
    BadOption(String),
    /// The buffers could not be allocated.
    #[error("cannot allocate three arrays of {bytes} bytes for the bandwidth probe")]
    OutOfMemory {
        /// Bytes of each array.
        bytes: usize,
    },
    /// The probe's threads or the kernel runtime could not start.
    #[error("cannot start the probe's threads: {0}")]
    Threads(String),
}

/// The most bytes one bandwidth array may take (three are allocated).
pub const MAX_BUFFER_BYTES: usize = 4 << 30;

/// Runs every probe; takes a few seconds.
pub fn probe(opts: &ProbeOptions) -> Result<ProbeReport, ProbeError> {
    if opts.repeats == 0 || opts.repeats > 1000 {
        return Err(ProbeError::BadOption(
            "repeats must be between 1 and 1000".into(),
        ));
    }
    if !(opts.fma_seconds.is_finite() && opts.fma_seconds > 0.0 && opts.fma_seconds <= 60.0) {
        return Err(ProbeError::BadOption(
            "the FMA timing must last between 0 and 60 s".into(),
        ));
    }
    let threads = match opts.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n if n <= 4096 => n,
        _ => return Err(ProbeError::BadOption("at most 4096 threads".into())),
    };
    let llc = crate::runtime::cache::last_level_cache_bytes();
    let buffer_bytes = match opts.buffer_bytes {
        Some(b) if !((1 << 20)..=MAX_BUFFER_BYTES).contains(&b) => {
            return Err(ProbeError::BadOption(format!(
                "the bandwidth arrays must be between 1 MiB and {} MiB",
                MAX_BUFFER_BYTES >> 20
            )))
        }
        Some(b) => b,
        // Four times the cache: at most a quarter of a pass can hit in it.
        None => llc
            .map_or(256 << 20, |c| c.saturating_mul(4))
            .clamp(64 << 20, 1 << 30),
    };
    let fma = fma_kernel();
    let fma_gflops_1t = best_of(opts.repeats, || fma_rate(fma, 1, opts.fma_seconds))?;
    let fma_gflops_all = best_of(opts.repeats, || fma_rate(fma, threads, opts.fma_seconds))?;
    let bf16_dot_gflops_1t = match bf16_dot_kernel() {
        Some(k) => Some(best_of(opts.repeats, || fma_rate(k, 1, opts.fma_seconds))?),
        None => None,
    };
    let mut bufs = Buffers::new(buffer_bytes / 4)?;
    let copy_gbs_1t = best_of(opts.repeats, || bufs.rate(Stream::Copy, 1))?;
    let copy_gbs_all = best_of(opts.repeats, || bufs.rate(Stream::Copy, threads))?;
    let triad_gbs_1t = best_of(opts.repeats, || bufs.rate(Stream::Triad, 1))?;
    let triad_gbs_all = best_of(opts.repeats, || bufs.rate(Stream::Triad, threads))?;
    let read_gbs_1t = best_of(opts.repeats, || bufs.rate(Stream::Read, 1))?;
    let read_gbs_all = best_of(opts.repeats, || bufs.rate(Stream::Read, threads))?;
    drop(bufs);
    let parallel_loop_us = parallel_loop_overhead_us(threads)?;
    Ok(ProbeReport {
        cpu: cpu_model(),
        isa: fma.isa.to_string(),
        lanes: fma.lanes,
        threads,
        fma_gflops_1t,
        fma_gflops_all,
        bf16_dot_gflops_1t,
        buffer_bytes,
        last_level_cache_bytes: llc,
        copy_gbs_1t,
        copy_gbs_all,
        triad_gbs_1t,
        triad_gbs_all,
        read_gbs_1t,
        read_gbs_all,
        parallel_loop_us,
    })
}

/// The largest of `repeats` rates.
fn best_of(
    repeats: usize,
    mut f: impl FnMut() -> Result<f64, ProbeError>,
) -> Result<f64, ProbeError> {
    let mut best = 0.0f64;
    for _ in 0..repeats {
        best = best.max(f()?);
    }
    Ok(best)
}

/// The CPU's model name.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

// ---------------------------------------------------------------------------------------------
// The FMA peak.

/// Independent accumulators of the FMA loop: more than latency × ports of every core we know
/// (4 × 2 on Zen 4 and Skylake-X), so that the loop is bound by throughput, not latency.
const CHAINS: usize = 16;

/// One FMA probe kernel: runs `iters` iterations of `CHAINS` FMAs of `lanes` lanes and returns
/// a value depending on every result (so none can be left out).
#[derive(Clone, Copy)]
struct FmaKernel {
    isa: &'static str,
    lanes: usize,
    run: fn(u64) -> f32,
}

fn fma_kernel() -> FmaKernel {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return FmaKernel {
                isa: "avx512f",
                lanes: 16,
                run: x86::fma_avx512_checked,
            };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return FmaKernel {
                isa: "avx2+fma",
                lanes: 8,
                run: x86::fma_avx2_checked,
            };
        }
    }
    FmaKernel {
        isa: "scalar",
        lanes: 1,
        run: fma_scalar,
    }
}

/// The bf16 dot-product kernel, where the CPU has AVX-512 BF16 (as the code generator sees
/// it, so that the probe measures what `dtype=bf16` programs are compiled to). Its `lanes`
/// are the products of one instruction, so that [`fma_rate`]'s two flops a lane count a
/// product and its sum.
fn bf16_dot_kernel() -> Option<FmaKernel> {
    #[cfg(target_arch = "x86_64")]
    if crate::codegen::HostTarget::host().has_feature("avx512bf16") {
        return Some(FmaKernel {
            isa: "avx512bf16",
            lanes: 32,
            run: x86::bf16_dot_checked,
        });
    }
    None
}

/// Scalar chains: what a machine without the vector sets above can be held to.
fn fma_scalar(iters: u64) -> f32 {
    let (m, c) = std::hint::black_box((0.999_999f32, 1e-6f32));
    let mut acc = [c; CHAINS];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = a.mul_add(m, c);
        }
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::CHAINS;
    use std::arch::x86_64::*;

    /// The AVX-512 kernel; only handed out after `is_x86_feature_detected!("avx512f")`.
    pub(super) fn fma_avx512_checked(iters: u64) -> f32 {
        // SAFETY: `fma_kernel` returns this function only when the CPU has AVX-512F.
        unsafe { fma_avx512(iters) }
    }

    /// The bf16 dot-product kernel; only handed out where the host has AVX-512 BF16.
    pub(super) fn bf16_dot_checked(iters: u64) -> f32 {
        // SAFETY: `bf16_dot_kernel` returns this function only when the CPU has AVX-512 BF16
        // (which implies AVX-512F).
        unsafe { bf16_dot(iters) }
    }

    /// bf16 bits of 1.0 and 0.5, and of 2⁻¹⁰ twice: each step adds 1.5 · 2⁻¹⁰ to every
    /// lane, exact in f32 for the few thousand steps of the test.
    pub(super) const BF16_DOT_A: u32 = 0x3F00_3F80;
    /// See `BF16_DOT_A`.
    pub(super) const BF16_DOT_B: u32 = 0x3A80_3A80;

    /// `asm!` of 16 register-resident chains `zmmI ← OP(zmmI, zmm16, zmm17)` (I = 0..15)
    /// from `zmmI = INIT` for `n` (≥ 1) iterations, zmm16 and zmm17 broadcast from the 32-bit
    /// words at `a` and `b` (zmm18 is zero, an INIT), then the chains' sum stored to the 16
    /// floats at `out`. One loop for both probes, so that they differ only in the instruction.
    macro_rules! sixteen_zmm_chains {
        ($broadcast:literal, $init:literal, $op:literal, $a:expr, $b:expr, $out:expr, $n:expr) => {
            std::arch::asm!(
                concat!($broadcast, " zmm16, dword ptr [{a}]"),
                concat!($broadcast, " zmm17, dword ptr [{b}]"),
                "vpxord zmm18, zmm18, zmm18",
                concat!("vmovaps zmm0, ", $init),
                concat!("vmovaps zmm1, ", $init),
                concat!("vmovaps zmm2, ", $init),
                concat!("vmovaps zmm3, ", $init),
                concat!("vmovaps zmm4, ", $init),
                concat!("vmovaps zmm5, ", $init),
                concat!("vmovaps zmm6, ", $init),
                concat!("vmovaps zmm7, ", $init),
                concat!("vmovaps zmm8, ", $init),
                concat!("vmovaps zmm9, ", $init),
                concat!("vmovaps zmm10, ", $init),
                concat!("vmovaps zmm11, ", $init),
                concat!("vmovaps zmm12, ", $init),
                concat!("vmovaps zmm13, ", $init),
                concat!("vmovaps zmm14, ", $init),
                concat!("vmovaps zmm15, ", $init),
                "2:",
                concat!($op, " zmm0, zmm16, zmm17"),
                concat!($op, " zmm1, zmm16, zmm17"),
                concat!($op, " zmm2, zmm16, zmm17"),
                concat!($op, " zmm3, zmm16, zmm17"),
                concat!($op, " zmm4, zmm16, zmm17"),
                concat!($op, " zmm5, zmm16, zmm17"),
                concat!($op, " zmm6, zmm16, zmm17"),
                concat!($op, " zmm7, zmm16, zmm17"),
                concat!($op, " zmm8, zmm16, zmm17"),
                concat!($op, " zmm9, zmm16, zmm17"),
                concat!($op, " zmm10, zmm16, zmm17"),
                concat!($op, " zmm11, zmm16, zmm17"),
                concat!($op, " zmm12, zmm16, zmm17"),
                concat!($op, " zmm13, zmm16, zmm17"),
                concat!($op, " zmm14, zmm16, zmm17"),
                concat!($op, " zmm15, zmm16, zmm17"),
                "dec {n}",
                "jnz 2b",
                "vaddps zmm0, zmm0, zmm1",
                "vaddps zmm0, zmm0, zmm2",
                "vaddps zmm0, zmm0, zmm3",
                "vaddps zmm0, zmm0, zmm4",
                "vaddps zmm0, zmm0, zmm5",
                "vaddps zmm0, zmm0, zmm6",
                "vaddps zmm0, zmm0, zmm7",
                "vaddps zmm0, zmm0, zmm8",
                "vaddps zmm0, zmm0, zmm9",
                "vaddps zmm0, zmm0, zmm10",
                "vaddps zmm0, zmm0, zmm11",
                "vaddps zmm0, zmm0, zmm12",
                "vaddps zmm0, zmm0, zmm13",
                "vaddps zmm0, zmm0, zmm14",
                "vaddps zmm0, zmm0, zmm15",
                "vmovups zmmword ptr [{out}], zmm0",
                a = in(reg) $a,
                b = in(reg) $b,
                out = in(reg) $out,
                n = inout(reg) $n => _,
                out("zmm0") _,
                out("zmm1") _,
                out("zmm2") _,
                out("zmm3") _,
                out("zmm4") _,
                out("zmm5") _,
                out("zmm6") _,
                out("zmm7") _,
                out("zmm8") _,
                out("zmm9") _,
                out("zmm10") _,
                out("zmm11") _,
                out("zmm12") _,
                out("zmm13") _,
                out("zmm14") _,
                out("zmm15") _,
                out("zmm16") _,
                out("zmm17") _,
                out("zmm18") _,
                options(nostack),
            )
        };
    }

    /// 16 register-resident chains of `vdpbf16ps` (acc += a₀b₀ + a₁b₁ in each of 16 lanes,
    /// from 0); returns the sum of every lane.
    unsafe fn bf16_dot(iters: u64) -> f32 {
        let (a, b) = std::hint::black_box((BF16_DOT_A, BF16_DOT_B));
        let mut out = [0.0f32; 16];
        // SAFETY: the caller checked AVX-512 BF16; the block reads `a` and `b`, writes the 64
        // bytes of `out`, and declares every register it changes.
        unsafe {
            sixteen_zmm_chains!(
                "vpbroadcastd",
                "zmm18",
                "vdpbf16ps",
                &a,
                &b,
                out.as_mut_ptr(),
                iters.max(1)
            );
        }
        out.iter().sum()
    }

    /// The AVX2 kernel; only handed out after AVX2 and FMA were detected.
    pub(super) fn fma_avx2_checked(iters: u64) -> f32 {
        // SAFETY: `fma_kernel` returns this function only when the CPU has AVX2 and FMA.
        unsafe { fma_avx2(iters) }
    }

    // In assembly rather than `__m512` intrinsics (stable only from Rust 1.89, above our
    // minimum), which also pins the loop to exactly 16 register-resident chains of
    // `vfmadd213ps` (a = a·m + c, from c) and a counter: nothing for a compiler to spill or
    // reorder.
    #[target_feature(enable = "avx512f")]
    unsafe fn fma_avx512(iters: u64) -> f32 {
        let (m, c) = std::hint::black_box((0.999_999f32, 1e-6f32));
        let mut out = [0.0f32; 16];
        // SAFETY: the caller checked AVX-512F; the block reads `m` and `c`, writes the 64
        // bytes of `out`, and declares every register it changes.
        unsafe {
            sixteen_zmm_chains!(
                "vbroadcastss",
                "zmm17",
                "vfmadd213ps",
                &m,
                &c,
                out.as_mut_ptr(),
                iters.max(1)
            );
        }
        out.iter().sum()
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn fma_avx2(iters: u64) -> f32 {
        let (m, c) = std::hint::black_box((0.999_999f32, 1e-6f32));
        let (m, c) = (_mm256_set1_ps(m), _mm256_set1_ps(c));
        // 12 chains: the 16 ymm registers hold them with the two constants.
        let mut acc = [c; 12];
        // Keep the flop count per iteration that of `CHAINS` chains.
        let iters = iters * CHAINS as u64 / 12;
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm256_fmadd_ps(*a, m, c);
            }
        }
        let mut out = [0.0f32; 8];
        let mut sum = _mm256_setzero_ps();
        for a in acc {
            sum = _mm256_add_ps(sum, a);
        }
        // SAFETY: `out` holds the 8 f32 an unaligned 256-bit store writes.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), sum) };
        out.iter().sum()
    }
}

/// GFLOP/s of `threads` threads each running the FMA kernel for about `seconds`.
fn fma_rate(k: FmaKernel, threads: usize, seconds: f64) -> Result<f64, ProbeError> {
    // Calibrate on this thread: double until a run lasts 10 ms.
    let mut iters: u64 = 1 << 12;
    let per_iter = loop {
        let t = Instant::now();
        std::hint::black_box((k.run)(iters));
        let dt = t.elapsed().as_secs_f64();
        if dt > 0.01 || iters > 1 << 40 {
            break dt / iters as f64;
        }
        iters *= 2;
    };
    let iters = ((seconds / per_iter.max(1e-12)) as u64).max(1);
    let barrier = std::sync::Barrier::new(threads);
    let wall = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let barrier = &barrier;
                std::thread::Builder::new().spawn_scoped(s, move || {
                    barrier.wait();
                    let t = Instant::now();
                    std::hint::black_box((k.run)(iters));
                    t.elapsed().as_secs_f64()
                })
            })
            .collect();
        let mut wall = 0.0f64;
        for h in handles {
            let h = h.map_err(|e| ProbeError::Threads(e.to_string()))?;
            let dt = h
                .join()
                .map_err(|_| ProbeError::Threads("a probe thread panicked".into()))?;
            wall = wall.max(dt);
        }
        Ok::<f64, ProbeError>(wall)
    })?;
    let flops = threads as f64 * iters as f64 * (CHAINS * k.lanes * 2) as f64;
    Ok(flops / wall.max(1e-9) / 1e9)
}

// ---------------------------------------------------------------------------------------------
// Bandwidth.

#[derive(Clone, Copy)]
enum Stream {
    Copy,
    Triad,
    Read,
}

/// Parts of a slice the read-only pass reads side by side: one sequential stream leaves a
/// core's line-fill buffers partly idle, and more streams than the prefetchers track gain
/// nothing (docs/measurements.md, "A read-only bandwidth, softmax's phases...").
const READ_STREAMS: usize = 4;

/// f32 lanes each stream accumulates into: independent adds, so that the loop waits on
/// memory, not on the latency of one addition chain.
const READ_LANES: usize = 16;

/// The sum of `x`, read as [`READ_STREAMS`] parts side by side.
fn read_sum(x: &[f32]) -> f32 {
    let part = x.len() / READ_STREAMS / READ_LANES * READ_LANES;
    let mut acc = [[0.0f32; READ_LANES]; READ_STREAMS];
    for i in (0..part).step_by(READ_LANES) {
        for (s, a) in acc.iter_mut().enumerate() {
            let at = s * part + i;
            for (l, v) in a.iter_mut().zip(&x[at..at + READ_LANES]) {
                *l += v;
            }
        }
    }
    let tail = &x[part * READ_STREAMS..];
    acc.iter().flatten().sum::<f32>() + tail.iter().sum::<f32>()
}

struct Buffers {
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
}

impl Buffers {
    fn new(n: usize) -> Result<Buffers, ProbeError> {
        let alloc = |v: f32| -> Result<Vec<f32>, ProbeError> {
            let mut x = Vec::new();
            x.try_reserve_exact(n)
                .map_err(|_| ProbeError::OutOfMemory { bytes: n * 4 })?;
            // Written here, so that no timing pays for the first touch of a page.
            x.resize(n, v);
            Ok(x)
        };
        Ok(Buffers {
            a: alloc(0.0)?,
            b: alloc(1.0)?,
            c: alloc(2.0)?,
        })
    }

    /// GB/s of one pass of `kind` over the arrays, split into `threads` contiguous slices.
    fn rate(&mut self, kind: Stream, threads: usize) -> Result<f64, ProbeError> {
        let n = self.a.len();
        let chunk = n.div_ceil(threads.max(1)).max(1);
        let s = std::hint::black_box(3.0f32);
        let barrier = std::sync::Barrier::new(threads.max(1));
        let wall = std::thread::scope(|scope| {
            let mut handles = Vec::new();
            for ((a, b), c) in self
                .a
                .chunks_mut(chunk)
                .zip(self.b.chunks(chunk))
                .zip(self.c.chunks(chunk))
            {
                let barrier = &barrier;
                handles.push(std::thread::Builder::new().spawn_scoped(scope, move || {
                    barrier.wait();
                    let t = Instant::now();
                    match kind {
                        Stream::Copy => a.copy_from_slice(b),
                        Stream::Triad => {
                            for ((x, y), z) in a.iter_mut().zip(b).zip(c) {
                                *x = y + s * z;
                            }
                        }
                        Stream::Read => a[0] = read_sum(b),
                    }
                    std::hint::black_box(&a[a.len() / 2]);
                    t.elapsed().as_secs_f64()
                }));
            }
            // Fewer slices than threads (a tiny array): the rest never reach the barrier.
            let missing = threads.max(1) - handles.len();
            if missing > 0 {
                return Err(ProbeError::BadOption(
                    "the bandwidth arrays are too small for this many threads".into(),
                ));
            }
            let mut wall = 0.0f64;
            for h in handles {
                let h = h.map_err(|e| ProbeError::Threads(e.to_string()))?;
                let dt = h
                    .join()
                    .map_err(|_| ProbeError::Threads("a probe thread panicked".into()))?;
                wall = wall.max(dt);
            }
            Ok(wall)
        })?;
        let arrays = match kind {
            Stream::Read => 1.0,
            Stream::Copy => 2.0,
            Stream::Triad => 3.0,
        };
        Ok(arrays * (n * 4) as f64 / wall.max(1e-9) / 1e9)
    }
}

// ---------------------------------------------------------------------------------------------
// The parallel loop's overhead.

unsafe extern "C" fn spin_body(closure: *mut c_void, begin: i64, end: i64) -> i32 {
    // SAFETY: `parallel_loop_overhead_us` passes a pointer to a live u64, read only.
    let steps = unsafe { *(closure as *const u64) };
    for _ in begin..end {
        spin(steps);
    }
    0
}

/// About `steps` dependent integer steps, which no compiler may shorten.
fn spin(steps: u64) {
    let mut x = 1u64;
    for _ in 0..steps {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
    std::hint::black_box(x);
}

/// Microseconds a parallel loop of `threads` iterations on the kernel runtime costs beyond
/// its work: each iteration spins for about 5 µs, so a perfect runtime takes the time of one
/// iteration; the overhead is the median loop time less that (median of 21 timings of 400
/// loops each). An empty loop would measure less than a real one: the calling thread takes
/// every chunk before a worker wakes up.
fn parallel_loop_overhead_us(threads: usize) -> Result<f64, ProbeError> {
    let rt = Runtime::new(threads).map_err(|e| ProbeError::Threads(e.to_string()))?;
    let table: *const TtRuntime = rt.table();
    // Calibrate the steps of a 5 µs iteration.
    let mut steps: u64 = 1000;
    loop {
        let t = Instant::now();
        spin(steps);
        let dt = t.elapsed().as_secs_f64();
        if dt >= 5e-6 || steps > 1 << 30 {
            break;
        }
        steps *= 2;
    }
    let mut steps_cell = steps;
    let closure = &mut steps_cell as *mut u64 as *mut c_void;
    let run = |n: i64| {
        // SAFETY: `table` comes from the live runtime `rt`; `closure` points at a u64 that
        // outlives every call, and the body only reads it.
        unsafe { ((*table).parallel_for)(table, n, spin_body, closure) }
    };
    let median = |n: i64, loops: usize| -> Result<f64, ProbeError> {
        let mut times = Vec::with_capacity(21);
        for _ in 0..21 {
            let t = Instant::now();
            for _ in 0..loops {
                if run(n) != 0 {
                    return Err(ProbeError::Threads(
                        "the runtime failed a parallel loop".into(),
                    ));
                }
            }
            times.push(t.elapsed().as_secs_f64() / loops as f64 * 1e6);
        }
        times.sort_by(|a, b| a.total_cmp(b));
        Ok(times[times.len() / 2])
    };
    median(threads as i64, 50)?; // warm-up: workers awake, caches warm
    let one = median(1, 400)?;
    let all = median(threads as i64, 400)?;
    Ok((all - one).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fma_kernels_compute_the_chains_they_claim() {
        // Each chain is acc ← acc·m + c from acc₀ = c; an independent scalar recurrence
        // in f64 gives the same sum to f32 rounding (a kernel that skipped work would not).
        let iters = 1000u64;
        let k = fma_kernel();
        let got = (k.run)(iters) as f64;
        let (m, c) = (0.999_999f64, 1e-6f64);
        let chains = if k.isa == "avx2+fma" { 12 } else { CHAINS };
        let steps = if k.isa == "avx2+fma" {
            iters * CHAINS as u64 / 12
        } else {
            iters
        };
        let mut want = 0.0;
        for _ in 0..chains {
            let mut a = c;
            for _ in 0..steps {
                a = a * m + c;
            }
            want += a * k.lanes as f64;
        }
        assert!(
            (got - want).abs() <= 1e-4 * want.abs().max(1.0),
            "{} kernel: {got} against {want}",
            k.isa
        );
    }

    #[test]
    fn the_bf16_dot_kernel_computes_the_chains_it_claims() {
        // Every lane of every chain adds 1·2⁻¹⁰ + 0.5·2⁻¹⁰ a step from 0; the bf16 bits
        // decoded here independently of the kernel. Exact in f32 at this count.
        let Some(k) = bf16_dot_kernel() else {
            eprintln!("skipped: this CPU has no AVX-512 BF16");
            return;
        };
        let bf16 = |bits: u32| f32::from_bits(bits << 16) as f64;
        let (a, b) = (x86::BF16_DOT_A, x86::BF16_DOT_B);
        let per_step = bf16(a & 0xFFFF) * bf16(b & 0xFFFF) + bf16(a >> 16) * bf16(b >> 16);
        assert_eq!(per_step, 1.5 / 1024.0);
        let iters = 1000u64;
        let want = per_step * iters as f64 * (CHAINS * 16) as f64;
        assert_eq!((k.run)(iters) as f64, want);
        assert_eq!(k.lanes, 32);
    }

    #[test]
    fn the_read_pass_sums_every_element_once() {
        // Lengths around the parts' and lanes' multiples: a skipped or doubled element would
        // change the sum, which small integers keep exact in f32.
        for n in [0usize, 1, 63, 64, 65, 127, 1000, 4096 + 17] {
            let x: Vec<f32> = (0..n).map(|i| (i % 7) as f32 + 1.0).collect();
            let want: f64 = (0..n).map(|i| (i % 7) as f64 + 1.0).sum();
            assert_eq!(read_sum(&x) as f64, want, "length {n}");
        }
    }

    #[test]
    fn the_yardstick_of_a_mix_lies_between_read_and_copy() {
        let r = ProbeReport {
            cpu: String::new(),
            isa: String::new(),
            lanes: 16,
            threads: 1,
            fma_gflops_1t: 1.0,
            fma_gflops_all: 1.0,
            bf16_dot_gflops_1t: None,
            buffer_bytes: 0,
            last_level_cache_bytes: None,
            copy_gbs_1t: 24.0,
            copy_gbs_all: 48.0,
            triad_gbs_1t: 16.0,
            triad_gbs_all: 32.0,
            read_gbs_1t: 12.0,
            read_gbs_all: 30.0,
            parallel_loop_us: 0.0,
        };
        // Only reads: the read rate. A copy's mix: the copy rate.
        assert_eq!(r.bandwidth_gbs_for(64.0, 0.0, false), 12.0);
        assert_eq!(r.bandwidth_gbs_for(64.0, 64.0, false), 24.0);
        assert_eq!(r.bandwidth_gbs_for(64.0, 64.0, true), 48.0);
        // Three reads a write: 128 bytes at 24, 128 more at 12 → 256 / (128/24 + 128/12).
        let mixed = r.bandwidth_gbs_for(192.0, 64.0, false);
        assert!(
            (mixed - 256.0 / (128.0 / 24.0 + 128.0 / 12.0)).abs() < 1e-9,
            "{mixed}"
        );
        // A read rate above the copy rate (a machine whose stores are slow) raises it.
        let fast_reads = ProbeReport {
            read_gbs_1t: 40.0,
            ..r.clone()
        };
        assert!(fast_reads.bandwidth_gbs_for(64.0, 0.0, false) == 40.0);
    }

    #[test]
    fn a_small_probe_gives_positive_figures_and_refuses_bad_options() {
        let r = probe(&ProbeOptions {
            threads: 2,
            buffer_bytes: Some(4 << 20),
            repeats: 1,
            fma_seconds: 0.01,
        })
        .expect("probe");
        for (name, v) in [
            ("fma 1t", r.fma_gflops_1t),
            ("fma all", r.fma_gflops_all),
            ("copy", r.copy_gbs_1t),
            ("triad", r.triad_gbs_all),
            ("read", r.read_gbs_1t),
            ("read all", r.read_gbs_all),
        ] {
            assert!(v.is_finite() && v > 0.0, "{name}: {v}");
        }
        // Measured exactly where the code generator would emit the dot product.
        assert_eq!(
            r.bf16_dot_gflops_1t.is_some(),
            cfg!(target_arch = "x86_64")
                && crate::codegen::HostTarget::host().has_feature("avx512bf16")
        );
        if let Some(v) = r.bf16_dot_gflops_1t {
            assert!(v.is_finite() && v > 0.0, "bf16 dot: {v}");
        }
        // An overhead: what a loop costs beyond its work, never negative.
        assert!(r.parallel_loop_us.is_finite() && r.parallel_loop_us >= 0.0);
        assert_eq!(r.threads, 2);
        for bad in [
            ProbeOptions {
                repeats: 0,
                ..ProbeOptions::default()
            },
            ProbeOptions {
                buffer_bytes: Some(10),
                ..ProbeOptions::default()
            },
            ProbeOptions {
                fma_seconds: f64::NAN,
                ..ProbeOptions::default()
            },
        ] {
            assert!(matches!(probe(&bad), Err(ProbeError::BadOption(_))));
        }
    }
}
