//! The layout of one feature row: [`FEATURE_NAMES`] and the offset of each group.
//!
//! A row describes one innermost `Store` of a lowered program together with the loops, guards
//! and allocations around it. Every value is a count, a size or a one-hot flag, stored as
//! `slog(x) = sign(x) * log2(1 + |x|)` (so one-hot flags stay 0 or 1 and sizes of 2^20 become
//! ~20: trees split as well on either, and the values stay in a small range). The groups,
//! in order (after Ansor's 164 features, `src/auto_scheduler/feature.cc` in TVM):
//!
//! | group | count | what |
//! | --- | --- | --- |
//! | computation | 17 | arithmetic executed by the store over its whole loop nest: per execution counts of the value and index expressions (and enclosing guards) times the number of executions. `*_mad` is an add/sub with a multiply operand (counted once, not also as add and mul); `float_math_func` are `exp`/`log`/`sqrt`/`tanh`/`abs`; `cast_op` counts conversions |
//! | annotation | 3 × 11 | for vectorized, unrolled and parallel loops around the store: how many (`_num`), the product of their extents (`_prod`), the extent of the innermost one (`_len`), and a one-hot position of the annotated loops: `none`, inner/middle/outer (innermost loop of the nest, neither, outermost) × spatial/reduce (a *reduce* loop is one the written index does not depend on), or `mixed` when several annotated loops differ |
//! | gpu | 8 | `is_gpu` (the nest has a thread-bound loop) and the extent bound to each of `blockIdx.{x,y,z}`, `threadIdx.{x,y,z}` and `vthread` (0 when unbound) |
//! | buffers | 5 × 19 | per buffer the store touches, the five with the most bytes first (zero rows pad): access type one-hot (`acc_read`, `acc_write`, `acc_readwrite`); `bytes` accessed over the nest; `unique_bytes` (its footprint); `lines` (64-byte cache lines fetched, counting consecutive accesses to one line once) and `unique_lines`; reuse type one-hot: `reuse_loop` (a loop around the store does not move the index, so its iterations re-read the same data), `reuse_serial` (another store of the program touches the buffer too), `reuse_none`; `reuse_dis_iter` and `reuse_dis_bytes` (iterations and bytes touched between two uses: the loops inside the reusing loop), `reuse_ct` (uses per element: the reusing loop's extent); `bytes`, `unique_bytes` and `lines` divided by `reuse_ct`; `stride` (elements between two iterations of the innermost loop that moves the index) and `inner_stride` (the same for the innermost loop itself, 0 for a broadcast); `is_temp` (a local or shared temporary) |
//! | intensity | 10 | the arithmetic-intensity curve: float operations divided by unique bytes when the loops from the innermost up to level *l* run, sampled at 10 evenly spaced levels from the innermost loop (sample 0) to the outermost (sample 9), linearly interpolated |
//! | allocation | 5 | for a store into a temporary: its size in bytes, how many times its `Allocate` runs (the product of the loops around it), the iterations of the nest inside one allocation, and its scope one-hot (local, shared); zero for parameters |
//! | outer | 5 | `outer_prod` (executions of the store: the product of its loop extents), `num_loops`, `num_guards` (enclosing `if`s: tails of non-divisible splits), `writes_output`, `prefetches` (prefetch statements run beside the store, per execution of it: a row-wise stage fetching the input's next row while it computes this one) |
//! | kernel | 14 | the micro-kernel on a model core (see below): `body_loops` (loops in the straight-line body), per execution of the body `body_vec_ops`, `body_loads` and `body_stores` (in pipe units, 32 bytes on Zen 4; a broadcast is one load), `body_acc_regs` (registers of an update's accumulators), `body_acc_in_regs` (they stay in registers across the reduce loops around the body), `body_cycles`, `body_flops_per_cycle`, `body_gathers`; `l1_miss_bytes_per_flop`, `l2_miss_bytes_per_flop`, `l3_miss_bytes_per_flop` (bytes each cache takes in from the level below, per float operation of the store); `row_cycles_per_flop` (the store's estimated cycles over the program's float operations) and `program_cycles_per_flop` (the sum over all stores, the same in every row) |
//!
//! **The kernel group** carries across shapes where the others do not: it is made of ratios
//! (per flop, per body execution) instead of totals. The *body* is the innermost loops the
//! code generator makes straight-line code of: unrolled and vectorized loops, and for an
//! update also rolled loops LLVM may unroll (16 copies at most, as the code generator lets
//! it). Vector work is counted in units of what one FMA pipe takes a cycle (`CoreModel`,
//! from the target): 32-byte halves on AMD Zen 4, which runs a 64-byte FMA as two, whole
//! 64-byte vectors on Intel's AVX-512 cores; a body costs the most of its FMAs over two
//! pipes, its loads over two ports and its stores over one, or, where an update's
//! accumulators stay in registers, four cycles per dependent FMA of one chain; accumulators
//! beyond 28 registers spill, so every update then loads and stores. A cache takes in, per
//! iteration of the loops outside the outermost level whose footprint fits it (32 KiB,
//! 1 MiB, 32 MiB), that level's footprint of each buffer, except over the loops right
//! outside that do not move the buffer. A level fits the L1 or the L2 only if its lines also
//! fit the cache's sets (the L1: 64 sets of `CoreModel::l1_ways` ways, lines 4 KiB apart
//! sharing one; the L2: 2048 sets of 16 ways, 128 KiB apart; buffers taken to start on the
//! same set, accumulators kept in registers left out): where lines crowd a set, the cache
//! takes in whole lines at the first level inward whose lines do fit, at most the body's (a
//! 16-row tile of a matrix 1024 floats wide fetches 16 lines of it per reduction step, not
//! 64 bytes). Cycles of a store: the most of
//! its bodies' cycles and its misses at 16, 8 and 8 bytes a cycle. These constants are one
//! core's; the model is trained per target, so on another the trees move their thresholds.
//!
//! Access analysis works on the flat index as a function of the loop variables: the stride of
//! a loop is `index(v = 1) - index(v = 0)` with the other variables at 0, its span
//! `|index(v = extent - 1) - index(v = 0)|`; the footprint of the loops from level *l* inward
//! is the smaller of the product of the extents of the loops that move the index and
//! `1 + sum of their spans`. This is exact for affine indices and a close bound for the
//! floor-div/mod indices of fused loops.

/// Number of values in one feature row.
pub const N_FEATURES: usize = 187;

/// Number of values in a program's row for the ranking model
/// ([`ProgramFeatures::program_row`](super::ProgramFeatures::program_row)): its main store's
/// row, the sum of its rows, and its row count.
pub const N_PROGRAM_FEATURES: usize = 2 * N_FEATURES + 1;

/// Offset of the computation group.
pub(crate) const COMPUTATION: usize = 0;
/// Offset of the annotation group (vectorize, unroll, parallel; 11 each).
pub(crate) const ANNOTATION: usize = 17;
/// Values per annotation kind.
pub(crate) const ANNOTATION_STRIDE: usize = 11;
/// Offset of the GPU group.
pub(crate) const GPU: usize = 50;
/// Offset of the first buffer block.
pub(crate) const BUFFERS: usize = 58;
/// Values per buffer block.
pub(crate) const BUFFER_STRIDE: usize = 19;
/// Number of buffer blocks.
pub const MAX_BUFFERS: usize = 5;
/// Offset of the arithmetic-intensity curve.
pub(crate) const INTENSITY: usize = 153;
/// Number of samples of the arithmetic-intensity curve.
pub(crate) const INTENSITY_SAMPLES: usize = 10;
/// Offset of the allocation group.
pub(crate) const ALLOCATION: usize = 163;
/// Offset of the outer-scope group.
pub(crate) const OUTER: usize = 168;
/// Offset of the micro-kernel group.
pub(crate) const KERNEL: usize = 173;
/// Column of `row_cycles_per_flop`, the store's estimated cycles over the program's flops.
pub(crate) const ROW_CYCLES_PER_FLOP: usize = KERNEL + 12;
/// Column of `program_cycles_per_flop`, the last of the micro-kernel group.
pub(crate) const PROGRAM_CYCLES_PER_FLOP: usize = KERNEL + 13;

/// The name of every feature, in row order; see the module documentation for their meaning.
pub const FEATURE_NAMES: &[&str] = &[
    // COMPUTATION
    "float_mad",
    "float_addsub",
    "float_mul",
    "float_divmod",
    "float_cmp",
    "float_math_func",
    "float_minmax",
    "int_mad",
    "int_addsub",
    "int_mul",
    "int_divmod",
    "int_cmp",
    "int_minmax",
    "int_math_func",
    "bool_op",
    "select_op",
    "cast_op",
    // ANNOTATION
    "vec_num",
    "vec_prod",
    "vec_len",
    "vec_pos_none",
    "vec_pos_inner_spatial",
    "vec_pos_middle_spatial",
    "vec_pos_outer_spatial",
    "vec_pos_inner_reduce",
    "vec_pos_middle_reduce",
    "vec_pos_outer_reduce",
    "vec_pos_mixed",
    "unroll_num",
    "unroll_prod",
    "unroll_len",
    "unroll_pos_none",
    "unroll_pos_inner_spatial",
    "unroll_pos_middle_spatial",
    "unroll_pos_outer_spatial",
    "unroll_pos_inner_reduce",
    "unroll_pos_middle_reduce",
    "unroll_pos_outer_reduce",
    "unroll_pos_mixed",
    "parallel_num",
    "parallel_prod",
    "parallel_len",
    "parallel_pos_none",
    "parallel_pos_inner_spatial",
    "parallel_pos_middle_spatial",
    "parallel_pos_outer_spatial",
    "parallel_pos_inner_reduce",
    "parallel_pos_middle_reduce",
    "parallel_pos_outer_reduce",
    "parallel_pos_mixed",
    // GPU
    "is_gpu",
    "blockIdx_x_len",
    "blockIdx_y_len",
    "blockIdx_z_len",
    "threadIdx_x_len",
    "threadIdx_y_len",
    "threadIdx_z_len",
    "vthread_len",
    // BUFFERS
    "buf0.acc_read",
    "buf0.acc_write",
    "buf0.acc_readwrite",
    "buf0.bytes",
    "buf0.unique_bytes",
    "buf0.lines",
    "buf0.unique_lines",
    "buf0.reuse_loop",
    "buf0.reuse_serial",
    "buf0.reuse_none",
    "buf0.reuse_dis_iter",
    "buf0.reuse_dis_bytes",
    "buf0.reuse_ct",
    "buf0.bytes_d_reuse_ct",
    "buf0.unique_bytes_d_reuse_ct",
    "buf0.lines_d_reuse_ct",
    "buf0.stride",
    "buf0.inner_stride",
    "buf0.is_temp",
    "buf1.acc_read",
    "buf1.acc_write",
    "buf1.acc_readwrite",
    "buf1.bytes",
    "buf1.unique_bytes",
    "buf1.lines",
    "buf1.unique_lines",
    "buf1.reuse_loop",
    "buf1.reuse_serial",
    "buf1.reuse_none",
    "buf1.reuse_dis_iter",
    "buf1.reuse_dis_bytes",
    "buf1.reuse_ct",
    "buf1.bytes_d_reuse_ct",
    "buf1.unique_bytes_d_reuse_ct",
    "buf1.lines_d_reuse_ct",
    "buf1.stride",
    "buf1.inner_stride",
    "buf1.is_temp",
    "buf2.acc_read",
    "buf2.acc_write",
    "buf2.acc_readwrite",
    "buf2.bytes",
    "buf2.unique_bytes",
    "buf2.lines",
    "buf2.unique_lines",
    "buf2.reuse_loop",
    "buf2.reuse_serial",
    "buf2.reuse_none",
    "buf2.reuse_dis_iter",
    "buf2.reuse_dis_bytes",
    "buf2.reuse_ct",
    "buf2.bytes_d_reuse_ct",
    "buf2.unique_bytes_d_reuse_ct",
    "buf2.lines_d_reuse_ct",
    "buf2.stride",
    "buf2.inner_stride",
    "buf2.is_temp",
    "buf3.acc_read",
    "buf3.acc_write",
    "buf3.acc_readwrite",
    "buf3.bytes",
    "buf3.unique_bytes",
    "buf3.lines",
    "buf3.unique_lines",
    "buf3.reuse_loop",
    "buf3.reuse_serial",
    "buf3.reuse_none",
    "buf3.reuse_dis_iter",
    "buf3.reuse_dis_bytes",
    "buf3.reuse_ct",
    "buf3.bytes_d_reuse_ct",
    "buf3.unique_bytes_d_reuse_ct",
    "buf3.lines_d_reuse_ct",
    "buf3.stride",
    "buf3.inner_stride",
    "buf3.is_temp",
    "buf4.acc_read",
    "buf4.acc_write",
    "buf4.acc_readwrite",
    "buf4.bytes",
    "buf4.unique_bytes",
    "buf4.lines",
    "buf4.unique_lines",
    "buf4.reuse_loop",
    "buf4.reuse_serial",
    "buf4.reuse_none",
    "buf4.reuse_dis_iter",
    "buf4.reuse_dis_bytes",
    "buf4.reuse_ct",
    "buf4.bytes_d_reuse_ct",
    "buf4.unique_bytes_d_reuse_ct",
    "buf4.lines_d_reuse_ct",
    "buf4.stride",
    "buf4.inner_stride",
    "buf4.is_temp",
    // INTENSITY
    "arith_intensity_0",
    "arith_intensity_1",
    "arith_intensity_2",
    "arith_intensity_3",
    "arith_intensity_4",
    "arith_intensity_5",
    "arith_intensity_6",
    "arith_intensity_7",
    "arith_intensity_8",
    "arith_intensity_9",
    // ALLOCATION
    "alloc_bytes",
    "alloc_count",
    "alloc_inner_prod",
    "alloc_is_local",
    "alloc_is_shared",
    // OUTER
    "outer_prod",
    "num_loops",
    "num_guards",
    "writes_output",
    "prefetches",
    // KERNEL
    "body_loops",
    "body_vec_ops",
    "body_loads",
    "body_stores",
    "body_acc_regs",
    "body_acc_in_regs",
    "body_cycles",
    "body_flops_per_cycle",
    "body_gathers",
    "l1_miss_bytes_per_flop",
    "l2_miss_bytes_per_flop",
    "l3_miss_bytes_per_flop",
    "row_cycles_per_flop",
    "program_cycles_per_flop",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_offsets_name_their_columns() {
        let at = |name: &str| FEATURE_NAMES.iter().position(|n| *n == name);
        assert_eq!(FEATURE_NAMES.len(), N_FEATURES);
        assert_eq!(at("vec_num"), Some(ANNOTATION));
        assert_eq!(at("is_gpu"), Some(GPU));
        assert_eq!(at("buf0.acc_read"), Some(BUFFERS));
        assert_eq!(at("arith_intensity_0"), Some(INTENSITY));
        assert_eq!(at("alloc_bytes"), Some(ALLOCATION));
        assert_eq!(at("outer_prod"), Some(OUTER));
        assert_eq!(at("body_loops"), Some(KERNEL));
        assert_eq!(at("program_cycles_per_flop"), Some(PROGRAM_CYCLES_PER_FLOP));
        assert_eq!(PROGRAM_CYCLES_PER_FLOP + 1, N_FEATURES);
    }
}
