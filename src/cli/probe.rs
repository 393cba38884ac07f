//! `tensortune probe`: this machine's f32 FMA peak, memory bandwidth and parallel-loop
//! overhead, on one thread and on all of them (see [`crate::probe`]).

use super::{check_count, resolve_threads, CliError};
use crate::probe::{probe as run_probe, ProbeOptions, MAX_BUFFER_BYTES};
use std::io::Write;

/// Arguments of `tensortune probe`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tensortune probe\n  taskset -c 1 tensortune probe --threads 1 --json"
)]
pub struct ProbeArgs {
    /// Threads of the all-cores figures (0: every core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// MiB of each of the three bandwidth arrays (default: four times the last-level cache,
    /// at least 64).
    #[arg(long, value_name = "MIB")]
    pub buffer_mib: Option<usize>,
    /// Timings of each figure (the best is reported).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Runs `tensortune probe`.
pub fn probe(args: &ProbeArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let threads = resolve_threads("--threads", args.threads)?;
    check_count("--repeats", args.repeats, 1, 1000)?;
    let buffer_bytes = match args.buffer_mib {
        Some(m) => Some(check_count("--buffer-mib", m, 1, MAX_BUFFER_BYTES >> 20)? << 20),
        None => None,
    };
    let r = run_probe(&ProbeOptions {
        threads,
        buffer_bytes,
        repeats: args.repeats,
        ..ProbeOptions::default()
    })
    .map_err(|e| CliError::Usage(e.to_string()))?;
    let io = |e: std::io::Error| CliError::Internal(e.to_string());
    if args.json {
        let v = serde_json::to_string(&r).map_err(|e| CliError::Internal(e.to_string()))?;
        writeln!(out, "{v}").map_err(io)?;
        return Ok(());
    }
    let llc = r
        .last_level_cache_bytes
        .map(|b| format!(", last-level cache {} MiB", b >> 20))
        .unwrap_or_default();
    let t = r.threads;
    writeln!(out, "cpu            {}{llc}", r.cpu).map_err(io)?;
    writeln!(
        out,
        "f32 FMA peak   {:.1} GFLOP/s on 1 thread, {:.1} on {t} ({}, {} lanes)",
        r.fma_gflops_1t, r.fma_gflops_all, r.isa, r.lanes
    )
    .map_err(io)?;
    if let Some(dot) = r.bf16_dot_gflops_1t {
        writeln!(
            out,
            "bf16 dot peak  {dot:.1} GFLOP/s on 1 thread ({:.2}x the f32 FMA peak; vdpbf16ps, bf16 pairs into f32)",
            dot / r.fma_gflops_1t.max(1e-9)
        )
        .map_err(io)?;
    }
    writeln!(
        out,
        "copy           {:.1} GB/s on 1 thread, {:.1} on {t} (arrays of {} MiB)",
        r.copy_gbs_1t,
        r.copy_gbs_all,
        r.buffer_bytes >> 20
    )
    .map_err(io)?;
    writeln!(
        out,
        "triad          {:.1} GB/s on 1 thread, {:.1} on {t}",
        r.triad_gbs_1t, r.triad_gbs_all
    )
    .map_err(io)?;
    writeln!(
        out,
        "read           {:.1} GB/s on 1 thread, {:.1} on {t} (a sum: bytes read only)",
        r.read_gbs_1t, r.read_gbs_all
    )
    .map_err(io)?;
    writeln!(
        out,
        "parallel loop  {:.2} µs of overhead per parallel loop on {t} threads",
        r.parallel_loop_us
    )
    .map_err(io)?;
    Ok(())
}
