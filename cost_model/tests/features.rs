//! Feature extraction: deterministic, finite, and sensitive to the schedule in the expected
//! direction.

use tensortune_cost_model::{CoreModel, ProgramFeatures, FEATURE_NAMES, N_FEATURES};
use tensortune_schedules::{
    lower::lower, ops::WorkloadSpec, random::random_state, schedule::State, trace::Trace,
};

fn slog(x: f64) -> f32 {
    (1.0 + x).log2() as f32
}

fn features(state: &State) -> ProgramFeatures {
    ProgramFeatures::extract(&lower(state).expect("lowers"))
}

/// The row of the reduction update (the last store of a plain matmul).
fn update_row(f: &ProgramFeatures) -> usize {
    f.num_rows() - 1
}

/// The value of a per-buffer feature for each of the five buffer slots.
fn per_buffer(f: &ProgramFeatures, row: usize, field: &str) -> Vec<f32> {
    (0..5)
        .map(|b| {
            f.get(row, &format!("buf{b}.{field}"))
                .expect("feature exists")
        })
        .collect()
}

#[test]
fn names_are_unique_and_complete() {
    assert_eq!(FEATURE_NAMES.len(), N_FEATURES);
    let mut sorted: Vec<&str> = FEATURE_NAMES.to_vec();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), N_FEATURES);
}

#[test]
fn deterministic_finite_and_one_row_per_store() {
    for spec in [
        "matmul:M=64,N=48,K=32",
        "conv2d:N=1,C=8,H=14,W=14,K=16,R=3,S=3,stride=1,pad=1",
        "softmax:M=16,N=64",
        "dense_bias_relu:M=16,N=32,K=24",
    ] {
        let dag = WorkloadSpec::parse(spec).unwrap().build().unwrap();
        for seed in 0..20 {
            let state = random_state(&dag, seed, 16, false);
            let func = lower(&state).unwrap();
            let a = ProgramFeatures::extract(&func);
            let b = ProgramFeatures::extract(&func);
            assert_eq!(a, b, "{spec} seed {seed}");
            // Replaying the trace gives the same program, hence the same features.
            let again = Trace::from_json(&state.trace().to_json())
                .unwrap()
                .replay(&dag)
                .unwrap();
            assert_eq!(features(&again), a, "{spec} seed {seed} replayed");
            let mut stores = 0;
            func.body.visit(&mut |s| {
                if matches!(s, tensortune_schedules::ir::Stmt::Store { .. }) {
                    stores += 1;
                }
            });
            assert_eq!(a.num_rows(), stores, "{spec} seed {seed}");
            assert!(a.as_flat().iter().all(|v| v.is_finite()));
        }
    }
}

#[test]
fn plain_matmul_counts() {
    let dag = WorkloadSpec::parse("matmul:M=64,N=32,K=16")
        .unwrap()
        .build()
        .unwrap();
    let f = features(&State::new(&dag));
    assert_eq!(f.num_rows(), 2);
    let r = update_row(&f);
    let execs = 64.0 * 32.0 * 16.0;
    assert_eq!(f.get(r, "outer_prod"), Some(slog(execs)));
    assert_eq!(f.get(r, "num_loops"), Some(slog(3.0)));
    // C[i, j] += A[i, k] * B[k, j]: one multiply-add per iteration.
    assert_eq!(f.get(r, "float_mad"), Some(slog(execs)));
    assert_eq!(f.get(r, "float_mul"), Some(0.0));
    assert_eq!(f.get(r, "vec_num"), Some(0.0));
    assert_eq!(f.get(r, "vec_pos_none"), Some(1.0));
    assert_eq!(f.get(r, "writes_output"), Some(1.0));
    // Loop order i j k: A moves by 1 with k, B by N = 32, C not at all (a reduction).
    let mut strides = per_buffer(&f, r, "inner_stride");
    strides.sort_by(f32::total_cmp);
    assert_eq!(&strides[2..], &[0.0, slog(1.0), slog(32.0)]);
    // C is read and written, A and B read.
    assert_eq!(per_buffer(&f, r, "acc_readwrite").iter().sum::<f32>(), 1.0);
    assert_eq!(per_buffer(&f, r, "acc_read").iter().sum::<f32>(), 2.0);
    // Every buffer's footprint is its whole size.
    let mut unique = per_buffer(&f, r, "unique_bytes");
    unique.sort_by(f32::total_cmp);
    assert_eq!(
        &unique[2..],
        &[
            slog(16.0 * 32.0 * 4.0),
            slog(64.0 * 16.0 * 4.0),
            slog(64.0 * 32.0 * 4.0)
        ]
    );
}

/// Tiles matmul as `i.0 j.0 k i.1 j.1` with `t x t` tiles, optionally vectorizing `j.1`.
fn tiled(t: i64, vectorize: bool) -> ProgramFeatures {
    let dag = WorkloadSpec::parse("matmul:M=64,N=64,K=64")
        .unwrap()
        .build()
        .unwrap();
    let mut s = State::new(&dag);
    s.tile(2, 0, 1, t, t).unwrap(); // i.0 j.0 i.1 j.1 k
    s.reorder(2, &[0, 1, 4, 2, 3]).unwrap(); // i.0 j.0 k i.1 j.1
    if vectorize {
        s.vectorize(2, 4).unwrap();
    }
    features(&s)
}

#[test]
fn vectorization_features_differ() {
    let plain = tiled(8, false);
    let vec = tiled(8, true);
    let (rp, rv) = (update_row(&plain), update_row(&vec));
    assert_eq!(plain.get(rp, "vec_num"), Some(0.0));
    assert_eq!(plain.get(rp, "vec_pos_none"), Some(1.0));
    assert_eq!(vec.get(rv, "vec_num"), Some(1.0));
    assert_eq!(vec.get(rv, "vec_len"), Some(slog(8.0)));
    assert_eq!(vec.get(rv, "vec_prod"), Some(slog(8.0)));
    // j.1 is innermost and the written index moves with it: an inner spatial loop.
    assert_eq!(vec.get(rv, "vec_pos_inner_spatial"), Some(1.0));
    assert_eq!(vec.get(rv, "vec_pos_none"), Some(0.0));
    // Nothing else about the program changed.
    let differs: Vec<&str> = FEATURE_NAMES
        .iter()
        .enumerate()
        .filter(|(c, _)| plain.row(rp).unwrap()[*c] != vec.row(rv).unwrap()[*c])
        .map(|(_, n)| *n)
        .collect();
    // Besides the annotation, only what the micro-kernel model makes of it: the body now
    // holds the lanes, so it costs and loads differently.
    let kernel = |n: &str| {
        n.starts_with("body_") || n == "row_cycles_per_flop" || n == "program_cycles_per_flop"
    };
    assert!(
        differs.iter().all(|n| n.starts_with("vec_") || kernel(n)),
        "{differs:?}"
    );
    let fpc = |f: &ProgramFeatures, r| f.get(r, "body_flops_per_cycle").unwrap();
    assert!(fpc(&vec, rv) > fpc(&plain, rp));
}

/// `spec` (a matmul) as `i.0 j.0 k i.1 j.1` with a `ti x tj` register tile: `i.1` unrolled,
/// `j.1` vectorized; costed on `core`.
fn tile_inside_k(spec: &str, ti: i64, tj: i64, core: &CoreModel) -> ProgramFeatures {
    let dag = WorkloadSpec::parse(spec).unwrap().build().unwrap();
    let mut s = State::new(&dag);
    s.tile(2, 0, 1, ti, tj).unwrap();
    s.reorder(2, &[0, 1, 4, 2, 3]).unwrap();
    s.unroll(2, 3).unwrap();
    s.vectorize(2, 4).unwrap();
    ProgramFeatures::extract_for(&lower(&s).expect("lowers"), core)
}

/// Matmul 64³ with a `ti x tj` register tile inside the k loop, on the default core.
fn register_tile(ti: i64, tj: i64) -> ProgramFeatures {
    tile_inside_k("matmul:M=64,N=64,K=64", ti, tj, &CoreModel::default())
}

#[test]
fn register_tiles_show_in_the_micro_kernel_features() {
    // 8 rows x 16 lanes: eight 64-byte accumulators that stay in registers across k.
    let f = register_tile(8, 16);
    let r = update_row(&f);
    let get = |f: &ProgramFeatures, n: &str| f.get(r, n).unwrap();
    assert_eq!(get(&f, "body_loops"), slog(2.0));
    assert_eq!(get(&f, "body_acc_regs"), slog(8.0));
    assert_eq!(get(&f, "body_acc_in_regs"), 1.0);
    // 8 FMAs of two 32-byte halves each.
    assert_eq!(get(&f, "body_vec_ops"), slog(16.0));
    // Loads and stores count 32-byte halves too: 8 broadcasts of A, one 64-byte row of B,
    // and the accumulators once per k loop.
    assert_eq!(get(&f, "body_loads"), slog(8.0 + 2.0 + 16.0 / 64.0));
    assert_eq!(get(&f, "body_stores"), slog(16.0 / 64.0));

    // 32 x 16: more accumulators than registers, so every update loads and stores its own.
    let spill = register_tile(32, 16);
    assert_eq!(get(&spill, "body_acc_regs"), slog(32.0));
    assert_eq!(get(&spill, "body_acc_in_regs"), 0.0);
    assert_eq!(get(&spill, "body_stores"), slog(64.0));
    assert!(get(&spill, "body_flops_per_cycle") < get(&f, "body_flops_per_cycle"));

    // 1 x 16: one accumulator chain, bound by the FMA latency.
    let thin = register_tile(1, 16);
    assert_eq!(get(&thin, "body_acc_regs"), slog(1.0));
    assert!(get(&thin, "body_flops_per_cycle") < get(&f, "body_flops_per_cycle"));
    // The whole program's estimate follows.
    let per_flop = |f: &ProgramFeatures| f.get(0, "program_cycles_per_flop").unwrap();
    assert!(per_flop(&f) < per_flop(&thin) && per_flop(&f) < per_flop(&spill));
    for row in 0..f.num_rows() {
        assert_eq!(f.get(row, "program_cycles_per_flop"), Some(per_flop(&f)));
    }
}

/// A 4-row register tile `lanes` wide of matmul M=64, N=`lanes`, K=64, costed on `core`.
fn wide_tile(lanes: i64, core: &CoreModel) -> ProgramFeatures {
    tile_inside_k(&format!("matmul:M=64,N={lanes},K=64"), 4, lanes, core)
}

#[test]
fn the_micro_kernel_is_costed_in_the_targets_pipe_units() {
    let key = |k: &str| CoreModel::for_key(k);
    let avx512 = "-mattr=+avx2,+avx512f,+fma -threads=1";
    let zen4 = key(&format!("llvm -mcpu=znver4 {avx512}"));
    let intel = key(&format!("llvm -mcpu=sapphirerapids {avx512}"));
    assert_eq!(zen4, CoreModel::default());
    assert_eq!((zen4.vector_bytes, zen4.unit_bytes), (64.0, 32.0));
    assert_eq!((intel.vector_bytes, intel.unit_bytes), (64.0, 64.0));
    let avx2 = key("llvm -mcpu=znver3 -mattr=+avx2,+fma -threads=1");
    assert_eq!((avx2.vector_bytes, avx2.unit_bytes), (32.0, 32.0));
    assert_eq!(key("cuda -arch=sm_90"), CoreModel::default());
    assert_eq!(key("not a key"), CoreModel::default());

    // A row of 56 lanes is 3.5 registers. On 256-bit pipes it is 7 whole pipe operations, an
    // eighth fewer than a row of 64; on 512-bit pipes the half register takes a whole one,
    // so 56 lanes cost as much as 64 and do less work.
    let ops = |lanes, core: &CoreModel| {
        let f = wide_tile(lanes, core);
        let r = update_row(&f);
        (
            f.get(r, "body_vec_ops").unwrap(),
            f.get(r, "body_flops_per_cycle").unwrap(),
        )
    };
    assert_eq!(ops(56, &zen4).0, slog(4.0 * 7.0));
    assert_eq!(ops(64, &zen4).0, slog(4.0 * 8.0));
    assert_eq!(ops(56, &intel).0, slog(4.0 * 4.0));
    assert_eq!(ops(64, &intel).0, slog(4.0 * 4.0));
    assert!(ops(56, &intel).1 < ops(64, &intel).1);
    // Whole pipes do twice the work a cycle.
    assert!(ops(64, &intel).1 > ops(64, &zen4).1);
    // `extract` is the default core's.
    let dag = WorkloadSpec::parse("matmul:M=64,N=56,K=64")
        .unwrap()
        .build()
        .unwrap();
    let func = lower(&State::new(&dag)).unwrap();
    assert_eq!(
        ProgramFeatures::extract(&func),
        ProgramFeatures::extract_for(&func, &CoreModel::default())
    );
}

#[test]
fn vectors_that_cross_a_cache_line_cost_two_passes() {
    // A 4-row tile of 12 lanes over N = 48: B's rows and the tiles along a row start 48
    // bytes apart, at 0, 48, 32 and 16 bytes into a line, and some of their 32-byte units
    // cross into the next line. Tiles of 16 lanes (N = 64) start on a line. Both read two
    // units of B per k; the 12-lane tile's count more.
    let zen4 = CoreModel::default();
    let loads = |lanes: i64| {
        let f = tile_inside_k(
            &format!("matmul:M=64,N={},K=64", 4 * lanes),
            4,
            lanes,
            &zen4,
        );
        f64::from(f.get(update_row(&f), "body_loads").unwrap()).exp2() - 1.0
    };
    let (aligned, shifted) = (loads(16), loads(12));
    // Four broadcasts of A, two units of B, the accumulators' share of k.
    assert!(
        (aligned - (4.0 + 2.0 + 8.0 / 64.0)).abs() < 1e-3,
        "{aligned}"
    );
    // Units start at the multiples of 16 bytes in a line: those at 48 cross (16 of 64).
    assert!(
        (shifted - (4.0 + 2.0 * 1.25 + 8.0 * 1.25 / 64.0)).abs() < 1e-3,
        "{shifted}"
    );
}

/// Matmul M=64, N=K=`n` with a 16-row by 16-lane register tile inside the k loop.
fn sixteen_rows(n: i64, core: &CoreModel) -> ProgramFeatures {
    tile_inside_k(&format!("matmul:M=64,N={n},K={n}"), 16, 16, core)
}

#[test]
fn rows_a_multiple_of_4_kib_apart_crowd_one_l1_set() {
    // With K = 1024 floats, the 16 rows of A that the tile reads at one k are 4 KiB apart,
    // 16 lines in one L1 set of 8 ways (12 on Intel's recent cores): evicted before the next
    // 15 k use the rest of each line, so every k takes in 16 lines of A. With K = 1008 the
    // rows fall in 16 sets and a line's 16 floats serve 16 k. Everything else about the two
    // programs is alike.
    let intel = CoreModel::for_key("llvm -mcpu=rocketlake -mattr=+avx2,+avx512f,+fma -threads=1");
    assert_eq!((CoreModel::default().l1_ways, intel.l1_ways), (8, 12));
    for core in [CoreModel::default(), intel] {
        let crowded = sixteen_rows(1024, &core);
        let spread = sixteen_rows(1008, &core);
        let get = |f: &ProgramFeatures, n: &str| {
            let v = f64::from(f.get(update_row(f), n).unwrap());
            v.exp2() - 1.0
        };
        let (c, s) = (
            get(&crowded, "l1_miss_bytes_per_flop"),
            get(&spread, "l1_miss_bytes_per_flop"),
        );
        // Per k and 512 flops: 16 lines of A and one of B against 64 + 64 bytes.
        assert!(c > 5.0 * s, "crowded {c} against spread {s}");
        assert!(
            get(&crowded, "program_cycles_per_flop")
                > 2.0 * get(&spread, "program_cycles_per_flop")
        );
        // The body itself costs the same (within the loop overhead's share of k).
        let (bc, bs) = (
            get(&crowded, "body_flops_per_cycle"),
            get(&spread, "body_flops_per_cycle"),
        );
        assert!((bc - bs).abs() < 1e-3 * bs, "{bc} against {bs}");
    }
    // Rows of A 4 KiB apart, read again at every k: twelve crowd 8 ways, not 12. Eight fill
    // 8 ways exactly; B's line at each k is a row of B further on (4 KiB), read by that k
    // alone, so it passes through the set without crowding it.
    let miss = |rows: i64, core: &CoreModel| {
        let f = tile_inside_k("matmul:M=48,N=1024,K=1024", rows, 16, core);
        f64::from(f.get(update_row(&f), "l1_miss_bytes_per_flop").unwrap()).exp2() - 1.0
    };
    let zen4 = CoreModel::default();
    assert!(miss(12, &zen4) > 3.0 * miss(12, &intel));
    assert_eq!(miss(8, &zen4), miss(8, &intel));
    assert!(miss(12, &zen4) > 3.0 * miss(8, &zen4));
}

/// Matmul M=64, N=K=`n` as `i.0 j.0 k.0 i.1 j.1 k.1 i.2 j.2`: a block of 256 rows of B
/// (k.1) by 128 columns (j.1 × j.2) reused across the rows of A, a 4-row by 32-lane register
/// tile in the body.
fn b_block_of_256_rows(n: i64) -> ProgramFeatures {
    let dag = WorkloadSpec::parse(&format!("matmul:M=64,N={n},K={n}"))
        .unwrap()
        .build()
        .unwrap();
    let mut s = State::new(&dag);
    // i → i.0 (2) i.1 (8) i.2 (4); j → j.0 j.1 (4) j.2 (32); k → k.0 k.1 (256).
    s.split(2, 0, &[8, 4]).unwrap();
    s.split(2, 3, &[4, 32]).unwrap();
    s.split(2, 6, &[256]).unwrap();
    s.reorder(2, &[0, 3, 6, 1, 4, 7, 2, 5]).unwrap();
    s.unroll(2, 6).unwrap();
    s.vectorize(2, 7).unwrap();
    features(&s)
}

#[test]
fn rows_a_multiple_of_128_kib_apart_crowd_one_l2_set() {
    // 256 rows of B 8 KiB apart (N = 2048) fall on 16 of the L2's set positions, 16 rows
    // each: with A's rows beside them, more than a set's 16 ways, so the block does not stay
    // in the L2 while the rows of A pass. 7 KiB apart (N = 1792) they spread over 128
    // positions, 2 rows each, and the block stays.
    let get =
        |f: &ProgramFeatures, n: &str| f64::from(f.get(update_row(f), n).unwrap()).exp2() - 1.0;
    let (crowded, spread) = (b_block_of_256_rows(2048), b_block_of_256_rows(1792));
    let (c, s) = (
        get(&crowded, "l2_miss_bytes_per_flop"),
        get(&spread, "l2_miss_bytes_per_flop"),
    );
    assert!(c > 4.0 * s, "crowded {c} against spread {s}");
}

#[test]
fn larger_tiles_reuse_more_and_raise_intensity() {
    let small = tiled(4, false);
    let large = tiled(16, false);
    let (rs, rl) = (update_row(&small), update_row(&large));
    // A is reused across j.1 and B across i.1: t times each; C across k (64) in both.
    let sum = |f: &ProgramFeatures, r| per_buffer(f, r, "reuse_ct").iter().sum::<f32>();
    assert_eq!(sum(&small, rs), slog(64.0) + 2.0 * slog(4.0));
    assert_eq!(sum(&large, rl), slog(64.0) + 2.0 * slog(16.0));
    // Same work and same whole-nest traffic...
    assert_eq!(small.get(rs, "float_mad"), large.get(rl, "float_mad"));
    assert_eq!(
        per_buffer(&small, rs, "unique_bytes"),
        per_buffer(&large, rl, "unique_bytes")
    );
    // ...but more arithmetic per byte inside a tile.
    let curve = |f: &ProgramFeatures, r| -> Vec<f32> {
        (0..10)
            .map(|i| f.get(r, &format!("arith_intensity_{i}")).unwrap())
            .collect()
    };
    let (cs, cl) = (curve(&small, rs), curve(&large, rl));
    assert!(cs.iter().zip(&cl).all(|(a, b)| a <= b), "{cs:?} vs {cl:?}");
    assert!(cs.iter().zip(&cl).any(|(a, b)| a < b), "{cs:?} vs {cl:?}");
}

#[test]
fn loop_order_moves_the_inner_stride() {
    // i k j: the innermost loop j moves B and C by 1 and leaves A fixed.
    let dag = WorkloadSpec::parse("matmul:M=64,N=32,K=16")
        .unwrap()
        .build()
        .unwrap();
    let mut s = State::new(&dag);
    s.reorder(2, &[0, 2, 1]).unwrap();
    let f = features(&s);
    let r = update_row(&f);
    let mut strides = per_buffer(&f, r, "inner_stride");
    strides.sort_by(f32::total_cmp);
    assert_eq!(&strides[2..], &[0.0, slog(1.0), slog(1.0)]);
}

#[test]
fn parallel_and_cache_write_show_up() {
    let dag = WorkloadSpec::parse("matmul:M=64,N=64,K=64")
        .unwrap()
        .build()
        .unwrap();
    let mut s = State::new(&dag);
    let local = s
        .cache_write(2, tensortune_schedules::ir::Scope::Local)
        .unwrap(); // 2 C.local, 3 C
    s.split(3, 0, &[8]).unwrap();
    s.parallel(3, 0).unwrap();
    s.compute_at(local, 3, 1).unwrap();
    let f = features(&s);
    // Rows: C.local init, C.local update, copy into C.
    assert_eq!(f.num_rows(), 3);
    let update = 1;
    assert_eq!(f.get(update, "parallel_num"), Some(1.0));
    assert_eq!(f.get(update, "parallel_len"), Some(slog(8.0)));
    assert_eq!(f.get(update, "parallel_pos_outer_spatial"), Some(1.0));
    assert_eq!(f.get(update, "alloc_is_local"), Some(1.0));
    assert!(f.get(update, "alloc_bytes").unwrap() > 0.0);
    assert_eq!(f.get(update, "writes_output"), Some(0.0));
    assert_eq!(f.get(2, "writes_output"), Some(1.0));
    assert_eq!(per_buffer(&f, update, "is_temp").iter().sum::<f32>(), 1.0);
}

/// A program's row for the ranking model: its costliest store's row, the sums of its rows
/// as the counts they stand for, and its row count, worked by hand here.
#[test]
fn a_programs_row_is_its_main_store_its_totals_and_its_size() {
    use tensortune_cost_model::N_PROGRAM_FEATURES;
    assert_eq!(N_PROGRAM_FEATURES, 2 * N_FEATURES + 1);
    let cost = FEATURE_NAMES
        .iter()
        .position(|n| *n == "row_cycles_per_flop")
        .expect("the column exists");
    let outer = FEATURE_NAMES
        .iter()
        .position(|n| *n == "outer_prod")
        .expect("the column exists");
    // Three stores; the second is the costliest. Column 0 holds counts 3, 0 and 12 as slog.
    let mut flat = vec![0f32; 3 * N_FEATURES];
    for (r, (c, n, o)) in [(0.5f32, 3.0, 10.0), (4.0, 0.0, 20.0), (1.0, 12.0, 5.0)]
        .into_iter()
        .enumerate()
    {
        let row = &mut flat[r * N_FEATURES..(r + 1) * N_FEATURES];
        row[cost] = c;
        row[0] = slog(n);
        row[outer] = o;
    }
    let f = ProgramFeatures::from_flat(flat.clone()).expect("finite rows");
    let p = f.program_row();
    assert_eq!(p.len(), N_PROGRAM_FEATURES);
    assert_eq!(
        &p[..N_FEATURES],
        &flat[N_FEATURES..2 * N_FEATURES],
        "the main row"
    );
    let close = |a: f32, b: f32| (a - b).abs() <= 1e-4 * b.abs().max(1.0);
    assert!(
        close(p[N_FEATURES], slog(15.0)),
        "3 + 0 + 12 counts: {}",
        p[N_FEATURES]
    );
    // outer_prod values 10, 20, 5 stand for 2^10 - 1, 2^20 - 1 and 2^5 - 1 executions.
    let total = (1024.0 - 1.0) + (1048576.0 - 1.0) + (32.0 - 1.0);
    assert!(
        close(p[N_FEATURES + outer], slog(total)),
        "{}",
        p[N_FEATURES + outer]
    );
    assert!(
        close(p[2 * N_FEATURES], slog(3.0)),
        "three rows: {}",
        p[2 * N_FEATURES]
    );
    // Columns that are 0 in every row stay 0 in the totals.
    assert_eq!(p[N_FEATURES + 1], 0.0);
    // A program without stores is all zeros.
    let empty = ProgramFeatures::from_flat(Vec::new()).expect("no rows");
    assert!(empty.program_row().iter().all(|&v| v == 0.0));
    // A matmul's costliest store is its update, not the initialization.
    let dag = WorkloadSpec::parse("matmul:M=64,N=64,K=64")
        .expect("spec")
        .build()
        .expect("dag");
    let f = features(&State::new(&dag));
    let p = f.program_row();
    assert_eq!(&p[..N_FEATURES], f.row(update_row(&f)).expect("row"));
    assert!(close(p[2 * N_FEATURES], slog(2.0)));
}

/// Rows read from a file may hold values far past any real count; the program's row stays
/// finite (a NaN or an infinity would reach XGBoost as a feature).
#[test]
fn a_programs_row_is_finite_for_any_finite_rows() {
    let mut flat = vec![0f32; 2 * N_FEATURES];
    flat[0] = f32::MAX;
    flat[N_FEATURES] = -f32::MAX;
    flat[1] = 2000.0;
    flat[N_FEATURES + 1] = 2000.0;
    let f = ProgramFeatures::from_flat(flat).expect("finite rows");
    let p = f.program_row();
    assert!(
        p.iter().all(|v| v.is_finite()),
        "{:?}",
        &p[N_FEATURES..N_FEATURES + 2]
    );
}
