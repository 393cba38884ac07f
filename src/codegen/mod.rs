//! Code generation: from lowered loop IR ([`tensortune_schedules::ir::LoweredFunc`]) to
//! machine code.
//!
//! - [`target`]: what the host CPU is (LLVM's name for it, its features, the vector width the
//!   codegen uses) and the target key records are filed under.
//! - [`llvm`]: loop IR to LLVM IR with inkwell, the O3 pipeline, and the three outputs: a JIT
//!   function (see [`crate::Kernel`]), an object file, and textual IR or assembly.
//! - [`nvptx`]: loop IR to PTX for NVIDIA GPUs through LLVM's NVPTX back end.
//!
//! The CPU functions follow the C ABI of [`crate::runtime::abi`].

pub mod llvm;
pub mod nvptx;
pub mod target;

pub use target::HostTarget;

/// Why a loop IR function could not be compiled.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CodegenError {
    /// The IR breaks one of its invariants (an unbound variable, a buffer id out of range,
    /// a dtype mismatch, a loop inside a vectorized loop...).
    #[error("invalid loop IR: {0}")]
    InvalidIr(String),
    /// The IR is valid but uses something the backend (CPU or GPU) does not compile.
    #[error("not supported by the backend: {0}")]
    Unsupported(String),
    /// LLVM refused the module or failed to build, optimize or emit it.
    #[error("LLVM: {0}")]
    Llvm(String),
    /// The host target could not be set up.
    #[error("target: {0}")]
    Target(String),
    /// LLVM refused an option of `TENSORTUNE_LLVM_ARGS`.
    #[error("TENSORTUNE_LLVM_ARGS: {0}")]
    LlvmOptions(String),
}

impl From<inkwell::builder::BuilderError> for CodegenError {
    fn from(e: inkwell::builder::BuilderError) -> Self {
        CodegenError::Llvm(e.to_string())
    }
}

/// Knobs of the CPU code generator. The defaults are what tuning uses.
#[derive(Clone, Debug, PartialEq)]
pub struct CodegenOptions {
    /// Run LLVM's `default<O3>` pipeline (off only to look at unoptimized IR).
    pub optimize: bool,
    /// An `Unrolled` loop that would copy the statements of its body more than this many
    /// times in all (its extent times the copies of unrolled loops inside) becomes a serial
    /// loop, so that a bad candidate cannot blow up compile time. 256 copies covers every
    /// register tile we use. Counting single loops only, conv2d's padding stage unrolled
    /// 30 x 16 ways (480 copies) took 330 ms to compile where 30 ms is typical.
    pub max_unroll: i64,
    /// `Vectorized` loops with more lanes than this become serial loops (LLVM may still
    /// vectorize them). 64 lanes is four AVX-512 registers of f32.
    pub max_vector_lanes: i64,
    /// A `local`/`shared` temporary up to this size lives on the stack; larger ones, and every
    /// `global` one, on the heap through the runtime.
    pub max_stack_alloc_bytes: u64,
    /// Total stack temporaries per generated function; past it temporaries go to the heap.
    /// Kept well under the 2 MiB stack of a default Rust thread.
    pub max_stack_bytes: u64,
    /// Vector width in bits LLVM may use (`prefer-vector-width`/`min-legal-vector-width`);
    /// `None` takes the host's widest ([`HostTarget::vector_bits`]). For experiments: on an
    /// AVX-512 host, 256 makes LLVM split every 512-bit vector in two.
    pub vector_bits: Option<u32>,
    /// The LLVM pass pipeline run on the module when `optimize` is set, in `opt -passes=`
    /// syntax.
    pub pipeline: String,
    /// Optimization level of LLVM's machine-code generation (instruction selection,
    /// scheduling, register allocation): 0 to 3.
    pub codegen_level: u8,
    /// Let LLVM unroll loops the loop IR left rolled (its own cost model decides how far).
    pub llvm_unroll: bool,
    /// LLVM may unroll a rolled loop only if every rolled loop inside it has at most this
    /// many iterations; the others carry `llvm.loop.unroll.disable`. Unrolling a loop around
    /// a longer loop only copies that loop nest: on conv2d's copy-out loop (8 copies of a
    /// 28-iteration loop) it tripled the compile time, mostly in loop strength reduction.
    /// With 16, 256 conv2d tuning candidates compiled in 0.70x the time, and the best
    /// conv2d and matmul programs ran as fast (`examples/compile_cost.rs`); with 1, the best
    /// matmul programs lost a quarter of their speed (LLVM's unrolling of a loop around a
    /// 2-iteration loop builds their register tile). `i64::MAX` lifts the limit.
    pub llvm_unroll_max_inner: i64,
    /// LLVM may unroll only loops whose body updates a buffer (stores a value that reads the
    /// same buffer: the accumulation of a reduction); the others (initialization, copies,
    /// padding, elementwise stages) carry `llvm.loop.unroll.disable`, the schedule's own
    /// unrolling and vectorization being all they get. LLVM otherwise unrolled and merged
    /// conv2d's zero-initialization into dozens of `memset`s whose stores dominated
    /// instruction selection: 256 conv2d candidates compiled in 0.77x the time with this
    /// (matmul: 0.81x), and the best conv2d, matmul and dense programs ran as fast.
    pub llvm_unroll_updates_only: bool,
    /// Let LLVM's loop and SLP vectorizers vectorize what the loop IR left scalar.
    pub llvm_vectorize: bool,
    /// On AVX-512 hosts, compile a contiguous vector access of a non-power-of-two lane count
    /// to a main-memory buffer as one masked access of the next power of two lanes (a
    /// 14-lane f32 load is one masked 16-lane load, not three loads and two inserts). On the
    /// 48 best programs of a conv2d tuning run (W = 56, so 14- and 28-lane tiles) the
    /// geometric-mean speed rose 7%, at the same compile time.
    pub padded_vectors: bool,
    /// With `padded_vectors`, run a vectorized loop of a non-power-of-two lane count on the
    /// next power of two lanes under a mask where its accesses to local temporaries are whole
    /// padded rows (see `codegen::llvm::vector`), so that no value of an odd lane count is
    /// left for instruction selection to take apart.
    pub widen_lanes: bool,
    /// On x86, store whole cache lines of a vector loop to an output with non-temporal
    /// stores (`vmovntps`, past the caches, without reading the lines first) where the
    /// output is larger than this many bytes and the kernel never reads it: such an output
    /// cannot stay in the caches anyway, and an ordinary store first reads each line from
    /// memory. `None`: the last-level cache of the machine compiling, at most a core's share
    /// of a server's (`runtime::cache::usable_last_level_cache_bytes`; no such stores where
    /// it is unknown); `Some(u64::MAX)`: never. Vectors of whole lines, or of a half or a
    /// quarter of one, are so stored; the address is checked for the vector's alignment (its
    /// size, at most 64 bytes) at each store (an output's alignment is the caller's) and
    /// the kernel ends with an `sfence`. What they gain on softmax: docs/measurements.md, "The memory-bound rows
    /// after the cheaper exp".
    pub nontemporal_past_bytes: Option<u64>,
}

impl Default for CodegenOptions {
    fn default() -> Self {
        CodegenOptions {
            optimize: true,
            max_unroll: 256,
            max_vector_lanes: 64,
            max_stack_alloc_bytes: 128 << 10,
            max_stack_bytes: 512 << 10,
            vector_bits: None,
            pipeline: "default<O3>".into(),
            codegen_level: 3,
            llvm_unroll: true,
            llvm_unroll_max_inner: 16,
            llvm_unroll_updates_only: true,
            llvm_vectorize: true,
            padded_vectors: true,
            widen_lanes: true,
            nontemporal_past_bytes: None,
        }
    }
}
