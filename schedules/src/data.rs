//! Host-side tensor data: the values the references (and the backends' tests) read and write.
//!
//! An [`NdData`] is a row-major array with a shape and one of the data dtypes. Random data
//! comes from a small seeded generator (SplitMix64) so that every reference run is repeatable
//! without pulling a random-number crate into the schedule language.

use crate::expr::DType;

/// Flat storage of one dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// f32 values.
    F32(Vec<f32>),
    /// f64 values.
    F64(Vec<f64>),
    /// i32 values.
    I32(Vec<i32>),
    /// bf16 values, as their bits (see [`bf16_to_f32`]).
    BF16(Vec<u16>),
}

/// The f32 a bf16 stands for: its bits are the f32's upper half (exact).
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// The bf16 nearest `x`, ties to even (NaN stays a quiet NaN of its sign).
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    // Adding 0x7fff plus the lowest kept bit rounds the dropped half to nearest, ties to
    // even; a carry out of the fraction correctly bumps the exponent (to infinity at the top).
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

impl Data {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::F64(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::BF16(v) => v.len(),
        }
    }
    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The dtype stored.
    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::F64(_) => DType::F64,
            Data::I32(_) => DType::I32,
            Data::BF16(_) => DType::BF16,
        }
    }
    /// Element `i` as f64.
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            Data::F32(v) => v[i] as f64,
            Data::F64(v) => v[i],
            Data::I32(v) => v[i] as f64,
            Data::BF16(v) => bf16_to_f32(v[i]) as f64,
        }
    }
    /// `n` elements of `dtype`, all zero; an error for dtypes that are not data types and
    /// when the memory cannot be had (allocated fallibly: a workload too large for the
    /// machine is an error, not an abort).
    pub fn zeros(dtype: DType, n: usize) -> Result<Data, DataError> {
        Ok(match dtype {
            DType::F32 => Data::F32(filled(n, |_| 0.0)?),
            DType::F64 => Data::F64(filled(n, |_| 0.0)?),
            DType::I32 => Data::I32(filled(n, |_| 0)?),
            DType::BF16 => Data::BF16(filled(n, |_| 0)?),
            DType::Bool | DType::I64 => return Err(DataError::NotData(dtype)),
        })
    }
}

/// Why host data could not be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DataError {
    /// Host data holds f32, f64, i32 and bf16 only.
    #[error("{0} is not a data dtype (f32, f64, i32, bf16)")]
    NotData(DType),
    /// The allocator could not give this many bytes.
    #[error("out of memory: cannot allocate {bytes} bytes of tensor data")]
    OutOfMemory {
        /// The size asked for.
        bytes: usize,
    },
}

/// `n` values of `f(i)`, in memory reserved fallibly.
fn filled<T>(n: usize, f: impl FnMut(usize) -> T) -> Result<Vec<T>, DataError> {
    let oom = || DataError::OutOfMemory {
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
    };
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| oom())?;
    v.extend((0..n).map(f));
    Ok(v)
}

/// A row-major array.
#[derive(Clone, Debug, PartialEq)]
pub struct NdData {
    /// Extent of each dimension.
    pub shape: Vec<i64>,
    /// `shape.iter().product()` elements.
    pub data: Data,
}

impl NdData {
    /// Wraps data with a shape; `None` if the element count does not match.
    pub fn new(shape: Vec<i64>, data: Data) -> Option<NdData> {
        let nd = NdData { shape, data };
        nd.is_consistent().then_some(nd)
    }

    /// Whether the shape's extents are all non-negative and their product is the number of
    /// values held. The fields are public, so a value may have been built without
    /// [`NdData::new`]: whatever indexes the data by the shape checks this first.
    pub fn is_consistent(&self) -> bool {
        self.shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))
            == Some(self.data.len())
    }

    /// Random values from `seed`: floats uniform in [-1, 1), integers uniform in [-8, 8).
    /// An error for dtypes that are not data types and when the memory cannot be had.
    pub fn random(shape: &[i64], dtype: DType, seed: u64) -> Result<NdData, DataError> {
        let n = shape
            .iter()
            .try_fold(1usize, |n, &d| {
                n.checked_mul(usize::try_from(d).unwrap_or(0))
            })
            .ok_or(DataError::OutOfMemory { bytes: usize::MAX })?;
        let mut rng = SplitMix64(seed ^ 0x9e37_79b9_7f4a_7c15);
        let data = match dtype {
            DType::F32 => Data::F32(filled(n, |_| rng.unit() as f32)?),
            DType::F64 => Data::F64(filled(n, |_| rng.unit())?),
            DType::I32 => Data::I32(filled(n, |_| (rng.next_u64() % 16) as i32 - 8)?),
            DType::BF16 => Data::BF16(filled(n, |_| f32_to_bf16(rng.unit() as f32))?),
            DType::Bool | DType::I64 => return Err(DataError::NotData(dtype)),
        };
        Ok(NdData {
            shape: shape.to_vec(),
            data,
        })
    }

    /// Largest difference to `other`, relative to `1 + |other|` elementwise; `None` if the
    /// shapes or dtypes differ (or either holds a count of values its shape does not). NaN in either side counts as infinitely far unless both are NaN.
    pub fn max_rel_diff(&self, other: &NdData) -> Option<f64> {
        if self.shape != other.shape
            || self.data.dtype() != other.data.dtype()
            || !self.is_consistent()
            || !other.is_consistent()
        {
            return None;
        }
        let mut worst = 0.0f64;
        for i in 0..self.data.len() {
            worst = worst.max(rel_diff(self.data.get_f64(i), other.data.get_f64(i)));
        }
        Some(worst)
    }
}

/// The difference of `got` to `want` relative to `1 + |want|`, as [`NdData::max_rel_diff`]
/// measures it elementwise: 0 when both are NaN or equal, infinite when only one is NaN or
/// either is infinite.
pub fn rel_diff(got: f64, want: f64) -> f64 {
    if (got.is_nan() && want.is_nan()) || got == want {
        0.0
    } else if got.is_nan() || want.is_nan() || got.is_infinite() || want.is_infinite() {
        f64::INFINITY
    } else {
        (got - want).abs() / (1.0 + want.abs())
    }
}

/// SplitMix64: a tiny, well-mixed, seedable generator.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}
