//! What code generation settings cost and buy: compiles and times the measured programs of a
//! records database under several LLVM settings, side by side, and prints the compile time
//! and the speed (geometric mean relative to the first setting, and absolute).
//!
//! `taskset -c 1 cargo run --release --example compile_cost -- DB WORKLOAD [N]`
//! takes the first N records (default 64); with `BEST=1` the N fastest instead. Other modes:
//! `PER_CANDIDATE=1` lists each program's compile time, slowest first (`SHOW=I` then prints
//! program I's loop IR); `BREAKDOWN=1` splits the time per program into lowering, LLVM IR,
//! the O3 pipeline and machine code. Process-wide LLVM options (the unroll threshold, say)
//! are compared by running it twice with different `TENSORTUNE_LLVM_ARGS`.
//! `COMPILE_ONLY=1` only compiles (and times) the programs; `ONLY=I` keeps program I alone;
//! `EMIT=raw|llvm|asm` prints its unoptimized IR, optimized IR or assembly (for `opt`/`llc
//! -time-passes`); `LOWERED=1` prints every program's loop IR;
//! `NO_COPY_UNROLL=1` first sets the unroll limit of every stage that does not reduce to 0
//! (Ansor's rule: only stages with a reduction get one); on a conv2d run's first 64
//! candidates that cut compile work by 11% (cachegrind), but its best program lost a fifth
//! of its speed (68-78 against 52-65 GFLOP/s in three interleaved rounds): an unrolled
//! padding copy inside the tile is part of what makes the best conv2d programs fast.
//! `LOWER_COST=1` times what the search pays per program (replaying its trace, lowering it,
//! extracting its features), with the `tensortune` binary's allocator (mimalloc): on conv2d's
//! 256 tuning records 22, 208 and 36 us (matmul 1024³'s 7, 101 and 29 us) while lowering
//! rebuilt every expression it substituted into; copying only the changed subtrees and moving
//! a stage's body into its nest instead of cloning it cut lowering to 129-142 us (one core of
//! an AMD EPYC znver4; 33% fewer instructions, the same loop IR for 384 conv2d and matmul
//! programs). `VARIANT=NAME[,NAME...]` runs those settings; `PIPELINE`, `CODEGEN_LEVEL`,
//! `MAX_UNROLL` and
//! `LLVM_VECTORIZE=0` and `WIDEN=0` change the base setting.
//!
//! The settings: `O3` (what tuning uses), `O3-unroll` (LLVM's unroller off), `O3-novec`
//! (LLVM's loop and SLP vectorizers off: on 256 conv2d candidates the same compile time,
//! 8.31 against 8.24 s, and speed within noise), `O3-nest` (LLVM
//! may also unroll loops around long loops and loops that update nothing), `exact` (no padded masked vectors), `unwidened` (no widened loops), `O2`, and
//! `lean`, a short function pipeline (or the one in `LEAN`, in `opt -passes=` syntax).
//!
//! What it showed on conv2d's tuning candidates (one core, AMD EPYC znver5): LLVM's own
//! unrolling is most of the compile time (off: 3x faster compiles, 0.78x the speed), dominated
//! by a few poor programs (five of 64 took 3.6 of 8.8 s); `-unroll-threshold=100` halved the
//! compile time, and a search run with it found programs as fast. On the 48 best programs of a
//! conv2d run, O2 is as fast as O3 and compiles in the same time, the lean pipeline compiles in
//! 0.7x the time but runs at 0.57x the speed, and unrolling off at 0.46x: the fast programs
//! are big unrolled bodies, and most of their compile time is LLVM working through them.
//! A third of conv2d's candidates then still took 120-140 ms: LLVM fully unrolled a copy-out
//! loop around a 28-iteration loop, and loop strength reduction on the copies took 60 ms
//! (`llc -time-passes`). Marking loops around long loops `llvm.loop.unroll.disable`
//! (`CodegenOptions::llvm_unroll_max_inner`) compiled the 256 candidates in 0.70x the time
//! at the same speed of the best 48 conv2d and best 32 matmul programs. Lowering the
//! threshold instead (to 0-50) compiled as fast but lost 5-25% of the best programs' speed.

use std::time::Instant;
use tensortune::codegen::CodegenOptions;

/// The `tensortune` binary's allocator, so that the costs measured here are the ones tuning
/// pays (glibc's malloc costs the search about twice as much; see `src/bin/tensortune.rs`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use tensortune::measure::{CpuMeasurer, MeasureOptions};
use tensortune::tune::tuning_measure_options;
use tensortune_records::Database;
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::schedule::State;
use tensortune_schedules::trace::Trace;
use tensortune_tuner::measure::Measurer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(db), Some(spec)) = (args.next(), args.next()) else {
        return Err("usage: compile_cost DB WORKLOAD [N]".into());
    };
    let n: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(64);
    let w = WorkloadSpec::parse(&spec)?;
    let dag = w.build()?;
    let db = Database::open_read_only(&db)?;
    let target = db
        .targets_of(&w.canonical())?
        .into_iter()
        .next()
        .ok_or("no records for that workload")?;
    let mut states: Vec<State> = Vec::new();
    let mut sketch_refs = Vec::new();
    let records = if std::env::var_os("BEST").is_some() {
        db.best_k(&w.canonical(), &target, n)?
    } else {
        db.records(&w.canonical(), &target)?
    };
    for r in records {
        if r.gflops().is_none() {
            continue;
        }
        if let Ok(t) = Trace::from_json(&r.trace_json) {
            if let Ok(s) = t.replay(&dag) {
                states.push(s);
                sketch_refs.push(t.sketch);
            }
        }
        if states.len() >= n {
            break;
        }
    }
    if let Ok(k) = std::env::var("ONLY") {
        let i: usize = k.parse()?;
        states = states.get(i).cloned().into_iter().collect();
        sketch_refs = sketch_refs.get(i).cloned().into_iter().collect();
    }
    if std::env::var_os("NO_COPY_UNROLL").is_some() {
        // The same programs with no unroll limit on stages that do not reduce (padding,
        // copies): what unrolling those stages costs and buys.
        use tensortune_tuner::sketch::SketchStep;
        let space = tensortune_tuner::search::SearchSpace::new(dag.clone(), &Default::default());
        let mut changed = 0;
        for (s, r) in states.iter_mut().zip(&sketch_refs) {
            let Some(c) = r.as_ref().and_then(|r| {
                let k = space.sketches.iter().position(|k| k.name == r.name)?;
                space.candidate(k, r.decisions.clone())
            }) else {
                continue;
            };
            let mut d = c.decisions.clone();
            for step in &space.sketches[c.sketch].steps {
                if let SketchStep::AutoUnroll { tensor, hole } = step {
                    let reduces = c
                        .state
                        .position_of(*tensor)
                        .and_then(|p| c.state.stage(p))
                        .is_some_and(|st| !st.op.reduce_axes().is_empty());
                    if !reduces && d[*hole] != [0] {
                        d[*hole] = vec![0];
                    }
                }
            }
            if d != c.decisions {
                if let Some(n) = space.candidate(c.sketch, d) {
                    *s = n.state;
                    changed += 1;
                }
            }
        }
        println!("{changed} programs lost the unrolling of a stage that does not reduce");
    }
    println!("{} programs of {}", states.len(), w.canonical());
    let mut base = CodegenOptions::default();
    if let Ok(p) = std::env::var("PIPELINE") {
        base.pipeline = p;
    }
    if let Ok(l) = std::env::var("CODEGEN_LEVEL") {
        base.codegen_level = l.parse()?;
    }
    if let Ok(u) = std::env::var("MAX_UNROLL") {
        base.max_unroll = u.parse()?;
    }
    if let Ok(v) = std::env::var("LLVM_VECTORIZE") {
        base.llvm_vectorize = v != "0";
    }
    if let Ok(v) = std::env::var("WIDEN") {
        base.widen_lanes = v != "0";
    }
    let lean = std::env::var("LEAN").unwrap_or_else(|_| {
        "function(sroa,early-cse<memssa>,simplifycfg,instcombine,loop-mssa(licm),\
         loop(loop-rotate,indvars,loop-unroll-full),sroa,gvn,sccp,instcombine,simplifycfg,\
         loop-mssa(licm),dse,loop-unroll<O3>,sroa,instcombine,simplifycfg)"
            .into()
    });
    let variants: Vec<(&str, CodegenOptions)> = vec![
        ("O3", base.clone()),
        (
            "O3-unroll",
            CodegenOptions {
                llvm_unroll: false,
                ..base.clone()
            },
        ),
        (
            "O3-novec",
            CodegenOptions {
                llvm_vectorize: false,
                ..base.clone()
            },
        ),
        (
            "O3-nest",
            CodegenOptions {
                llvm_unroll_max_inner: i64::MAX,
                llvm_unroll_updates_only: false,
                ..base.clone()
            },
        ),
        (
            "exact",
            CodegenOptions {
                padded_vectors: false,
                ..base.clone()
            },
        ),
        (
            "unwidened",
            CodegenOptions {
                widen_lanes: false,
                ..base.clone()
            },
        ),
        (
            "O2",
            CodegenOptions {
                pipeline: "default<O2>".into(),
                ..base.clone()
            },
        ),
        (
            "lean",
            CodegenOptions {
                pipeline: lean,
                ..base.clone()
            },
        ),
    ];
    if let Ok(kind) = std::env::var("EMIT") {
        for s in &states {
            let f = tensortune_schedules::lower::lower(s)?;
            match kind.as_str() {
                "asm" => println!("{}", tensortune::codegen::llvm::emit_asm(&f, &base)?),
                "raw" => {
                    let raw = CodegenOptions {
                        optimize: false,
                        ..base.clone()
                    };
                    println!("{}", tensortune::codegen::llvm::emit_llvm_ir(&f, &raw)?)
                }
                _ => println!("{}", tensortune::codegen::llvm::emit_llvm_ir(&f, &base)?),
            }
        }
        return Ok(());
    }
    if std::env::var_os("COMPILE_ONLY").is_some() {
        let t = Instant::now();
        for s in &states {
            tensortune::Kernel::from_state(s, &base)?;
        }
        let e = t.elapsed().as_secs_f64();
        println!(
            "compile {e:.2} s ({:.1} ms each)",
            1e3 * e / states.len().max(1) as f64
        );
        return Ok(());
    }
    if std::env::var_os("LOWER_COST").is_some() {
        // What the search pays per program before any compile.
        let traces: Vec<Trace> = states.iter().map(|s| s.trace().clone()).collect();
        let reps = 10;
        let per = |t: Instant| 1e6 * t.elapsed().as_secs_f64() / (reps * states.len()) as f64;
        let t = Instant::now();
        for _ in 0..reps {
            for tr in &traces {
                tr.replay(&dag)?;
            }
        }
        let replay = per(t);
        let t = Instant::now();
        let mut funcs = Vec::new();
        for _ in 0..reps {
            funcs = states
                .iter()
                .map(tensortune_schedules::lower::lower)
                .collect::<Result<Vec<_>, _>>()?;
        }
        let lowering = per(t);
        let t = Instant::now();
        for _ in 0..reps {
            for f in &funcs {
                tensortune_cost_model::ProgramFeatures::extract(f);
            }
        }
        println!(
            "per program: replay {replay:.1} us, lowering {lowering:.1} us, features {:.1} us",
            per(t)
        );
        return Ok(());
    }
    if std::env::var_os("LOWERED").is_some() {
        for (i, s) in states.iter().enumerate() {
            println!("#{i}\n{}", tensortune_schedules::lower::lower(s)?);
        }
        return Ok(());
    }
    if std::env::var_os("DUPLICATES").is_some() {
        let mut seen = std::collections::HashSet::new();
        for s in &states {
            seen.insert(tensortune_schedules::lower::lower(s)?.to_string());
        }
        println!(
            "{} programs, {} distinct loop IRs",
            states.len(),
            seen.len()
        );
        return Ok(());
    }
    if std::env::var_os("BREAKDOWN").is_some() {
        use tensortune::codegen::llvm::emit_llvm_ir;
        let (mut tl, mut tg, mut to, mut tj, mut tobj) = (0.0, 0.0, 0.0, 0.0, 0.0);
        let noopt = CodegenOptions {
            optimize: false,
            ..CodegenOptions::default()
        };
        for s in &states {
            let t = Instant::now();
            let f = tensortune_schedules::lower::lower(s)?;
            tl += t.elapsed().as_secs_f64();
            let t = Instant::now();
            emit_llvm_ir(&f, &noopt)?;
            tg += t.elapsed().as_secs_f64();
            let t = Instant::now();
            emit_llvm_ir(&f, &CodegenOptions::default())?;
            to += t.elapsed().as_secs_f64();
            let t = Instant::now();
            tensortune::Kernel::compile(&f)?;
            tj += t.elapsed().as_secs_f64();
            let t = Instant::now();
            tensortune::codegen::llvm::emit_object(&f, &CodegenOptions::default())?;
            tobj += t.elapsed().as_secs_f64();
        }
        let k = states.len() as f64 / 1e3;
        println!(
            "per program: lower {:.2} ms, IR {:.2} ms, IR+O3 {:.2} ms, IR+O3+JIT {:.2} ms, IR+O3+object {:.2} ms",
            tl / k,
            tg / k,
            to / k,
            tj / k,
            tobj / k
        );
        return Ok(());
    }
    if std::env::var_os("PER_CANDIDATE").is_some() {
        let mut m = CpuMeasurer::new(tuning_measure_options());
        let mut rows = Vec::new();
        for (i, s) in states.iter().enumerate() {
            let before = m.stats().compile_s;
            let r = m.measure(&dag, std::slice::from_ref(s));
            let c = m.stats().compile_s - before;
            let g = r[0]
                .as_ref()
                .map(|t| w.flops() / t.median_s / 1e9)
                .unwrap_or(0.0);
            rows.push((c, g, i));
        }
        rows.sort_by(|a, b| b.0.total_cmp(&a.0));
        let total: f64 = rows.iter().map(|r| r.0).sum();
        for (c, g, i) in &rows {
            println!("#{i:<3} compile {:>7.1} ms  {g:>6.1} GFLOP/s", c * 1e3);
        }
        println!("total compile {total:.2} s");
        if let Ok(k) = std::env::var("SHOW") {
            let i: usize = k.parse()?;
            println!("{}", tensortune_schedules::lower::lower(&states[i])?);
        }
        return Ok(());
    }
    let mut reference: Option<Vec<f64>> = None;
    let only = std::env::var("VARIANT").ok();
    for (name, cg) in variants {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|o| o == name))
        {
            continue;
        }
        let mut m = CpuMeasurer::new(MeasureOptions {
            codegen: cg,
            ..tuning_measure_options()
        });
        let t0 = Instant::now();
        let res = m.measure(&dag, &states);
        let wall = t0.elapsed().as_secs_f64();
        let times: Vec<f64> = res
            .iter()
            .map(|r| r.as_ref().map(|t| t.median_s).unwrap_or(f64::NAN))
            .collect();
        let st = m.stats();
        let rel = match &reference {
            None => 1.0,
            Some(r) => {
                let (mut s, mut k) = (0.0, 0);
                for (a, b) in r.iter().zip(&times) {
                    if a.is_finite() && b.is_finite() {
                        s += (a / b).ln();
                        k += 1;
                    }
                }
                (s / k.max(1) as f64).exp()
            }
        };
        let finite: Vec<f64> = times.iter().copied().filter(|t| t.is_finite()).collect();
        let geo = (finite
            .iter()
            .map(|t| (w.flops() / t / 1e9).ln())
            .sum::<f64>()
            / finite.len().max(1) as f64)
            .exp();
        let best = times
            .iter()
            .cloned()
            .filter(|t| t.is_finite())
            .fold(f64::INFINITY, f64::min);
        println!(
            "{name:<8} compile {:>6.2} s ({:>5.1} ms each), run {:>6.2} s, wall {:>6.2} s, speed {:.3}x, geomean {:.1}, best {:.1} GFLOP/s",
            st.compile_s,
            1e3 * st.compile_s / states.len().max(1) as f64,
            st.run_s,
            wall,
            rel,
            geo,
            w.flops() / best / 1e9
        );
        if reference.is_none() {
            reference = Some(times);
        }
    }
    Ok(())
}
