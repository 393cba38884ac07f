//! [`AlignedBuffer`]: a 64-byte aligned, zero-initialized host array with a dtype and shape.

use super::fenced::Fenced;
use std::alloc::Layout;
use tensortune_schedules::data::{Data, DataError, NdData};
use tensortune_schedules::DType;

/// Alignment of every buffer, as the kernels' `align 64` parameter attribute promises.
pub const BUFFER_ALIGN: usize = 64;

/// Why a buffer could not be made or read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum BufferError {
    /// A negative extent, or a byte size that overflows.
    #[error("invalid shape {shape:?} for {dtype}")]
    BadShape {
        /// The shape asked for.
        shape: Vec<i64>,
        /// Its dtype.
        dtype: DType,
    },
    /// Kernels have no buffers of this dtype.
    #[error("{0} is not a buffer dtype (f32, f64, i32, i64)")]
    BadDType(DType),
    /// The allocator returned nothing.
    #[error("out of memory allocating {0} bytes")]
    OutOfMemory(usize),
    /// The buffers would not fit in the memory left (checked before allocating).
    #[error(
        "{what} need {:.2} GiB, more than the {:.2} GiB this process can still use",
        *need as f64 / 1073741824.0,
        *have as f64 / 1073741824.0
    )]
    TooLarge {
        /// What the memory is for.
        what: String,
        /// Bytes needed.
        need: u64,
        /// Bytes available.
        have: u64,
    },
    /// An element type that does not match the buffer's.
    #[error("buffer holds {have}, asked for {want}")]
    DTypeMismatch {
        /// The buffer's dtype.
        have: DType,
        /// What the caller asked for.
        want: DType,
    },
}

/// Element types a buffer can be viewed as.
pub trait Element: Copy + Default + 'static {
    /// The matching dtype.
    const DTYPE: DType;
}
impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for f64 {
    const DTYPE: DType = DType::F64;
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
}
impl Element for i64 {
    const DTYPE: DType = DType::I64;
}
/// bf16 elements are viewed as their bits (`tensortune_schedules::data::bf16_to_f32` and
/// `f32_to_bf16` convert).
impl Element for u16 {
    const DTYPE: DType = DType::BF16;
}

/// A row-major array in 64-byte aligned, owned memory.
pub struct AlignedBuffer {
    ptr: *mut u8,
    bytes: usize,
    dtype: DType,
    shape: Vec<i64>,
    /// Set for a buffer between fence pages ([`AlignedBuffer::fenced`]); `None` for one from
    /// the allocator.
    fence: Option<Fenced>,
}

// SAFETY: the buffer exclusively owns its allocation, like a `Vec<u8>`.
unsafe impl Send for AlignedBuffer {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuffer {}

impl AlignedBuffer {
    /// A zero-filled buffer.
    pub fn zeros(shape: &[i64], dtype: DType) -> Result<AlignedBuffer, BufferError> {
        let bytes = Self::bytes_of(shape, dtype)?;
        let bad = || BufferError::BadShape {
            shape: shape.to_vec(),
            dtype,
        };
        // Allocate at least one line so the pointer is always valid and aligned.
        let layout =
            Layout::from_size_align(bytes.max(BUFFER_ALIGN), BUFFER_ALIGN).map_err(|_| bad())?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(BufferError::OutOfMemory(bytes));
        }
        Ok(AlignedBuffer {
            ptr,
            bytes,
            dtype,
            shape: shape.to_vec(),
            fence: None,
        })
    }

    /// A zero-filled buffer between two inaccessible pages, for running untrusted kernels: a
    /// write far outside it faults, and one just outside it shows in
    /// [`AlignedBuffer::fences_intact`]. Where the system has no such mappings, a plain
    /// buffer (whose fences are always intact).
    pub fn fenced(shape: &[i64], dtype: DType) -> Result<AlignedBuffer, BufferError> {
        let bytes = Self::bytes_of(shape, dtype)?;
        match Fenced::new(bytes, BUFFER_ALIGN) {
            Some(fence) => Ok(AlignedBuffer {
                ptr: fence.ptr(),
                bytes,
                dtype,
                shape: shape.to_vec(),
                fence: Some(fence),
            }),
            None if cfg!(unix) => Err(BufferError::OutOfMemory(bytes)),
            None => AlignedBuffer::zeros(shape, dtype),
        }
    }

    /// A fenced ([`AlignedBuffer::fenced`]) copy of host data.
    pub fn fenced_from_nd(nd: &NdData) -> Result<AlignedBuffer, BufferError> {
        let mut b = AlignedBuffer::fenced(&nd.shape, nd.data.dtype())?;
        b.copy_from_nd(nd)?;
        Ok(b)
    }

    /// False once something wrote just outside a fenced buffer's data (always true for a
    /// buffer that is not fenced).
    pub fn fences_intact(&self) -> bool {
        self.fence.as_ref().is_none_or(Fenced::intact)
    }

    /// Bytes of `shape` elements of `dtype`, checked.
    fn bytes_of(shape: &[i64], dtype: DType) -> Result<usize, BufferError> {
        if matches!(dtype, DType::Bool) {
            return Err(BufferError::BadDType(dtype));
        }
        let bad = || BufferError::BadShape {
            shape: shape.to_vec(),
            dtype,
        };
        let mut n: usize = 1;
        for &d in shape {
            let d = usize::try_from(d).map_err(|_| bad())?;
            n = n.checked_mul(d).ok_or_else(bad)?;
        }
        n.checked_mul(dtype.bytes()).ok_or_else(bad)
    }

    /// A copy of host data.
    pub fn from_nd(nd: &NdData) -> Result<AlignedBuffer, BufferError> {
        let mut b = AlignedBuffer::zeros(&nd.shape, nd.data.dtype())?;
        b.copy_from_nd(nd)?;
        Ok(b)
    }

    fn copy_from_nd(&mut self, nd: &NdData) -> Result<(), BufferError> {
        // `NdData`'s fields are public: its values may not be as many as its shape says.
        if !nd.is_consistent() {
            return Err(BufferError::BadShape {
                shape: nd.shape.clone(),
                dtype: nd.data.dtype(),
            });
        }
        match &nd.data {
            Data::F32(v) => self.as_mut_slice::<f32>()?.copy_from_slice(v),
            Data::F64(v) => self.as_mut_slice::<f64>()?.copy_from_slice(v),
            Data::I32(v) => self.as_mut_slice::<i32>()?.copy_from_slice(v),
            Data::BF16(v) => self.as_mut_slice::<u16>()?.copy_from_slice(v),
        }
        Ok(())
    }

    /// Random contents from `seed`, the same values [`NdData::random`] gives.
    pub fn random(shape: &[i64], dtype: DType, seed: u64) -> Result<AlignedBuffer, BufferError> {
        let nd = NdData::random(shape, dtype, seed).map_err(|e| match e {
            DataError::NotData(d) => BufferError::BadDType(d),
            DataError::OutOfMemory { bytes } => BufferError::OutOfMemory(bytes),
        })?;
        AlignedBuffer::from_nd(&nd)
    }

    /// The contents as host data (i64 buffers are not host data types).
    pub fn to_nd(&self) -> Result<NdData, BufferError> {
        let data = match self.dtype {
            DType::F32 => Data::F32(self.as_slice::<f32>()?.to_vec()),
            DType::F64 => Data::F64(self.as_slice::<f64>()?.to_vec()),
            DType::I32 => Data::I32(self.as_slice::<i32>()?.to_vec()),
            DType::BF16 => Data::BF16(self.as_slice::<u16>()?.to_vec()),
            d => return Err(BufferError::BadDType(d)),
        };
        Ok(NdData {
            shape: self.shape.clone(),
            data,
        })
    }

    /// The elements, if `T` is the buffer's element type.
    pub fn as_slice<T: Element>(&self) -> Result<&[T], BufferError> {
        self.check::<T>()?;
        // SAFETY: the allocation holds `len` initialized (zeroed or written) elements of T,
        // aligned to 64 >= align_of::<T>().
        Ok(unsafe { std::slice::from_raw_parts(self.ptr as *const T, self.len()) })
    }

    /// The elements, mutably, if `T` is the buffer's element type.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T], BufferError> {
        self.check::<T>()?;
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut T, self.len()) })
    }

    fn check<T: Element>(&self) -> Result<(), BufferError> {
        if T::DTYPE != self.dtype {
            return Err(BufferError::DTypeMismatch {
                have: self.dtype,
                want: T::DTYPE,
            });
        }
        Ok(())
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.bytes / self.dtype.bytes()
    }

    /// True if the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> usize {
        self.bytes
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Logical shape.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// Start of the data (64-byte aligned).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// Start of the data, for writing (64-byte aligned).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        if self.fence.is_some() {
            return; // the fence unmaps its pages
        }
        // SAFETY: allocated in `zeros` with exactly this layout.
        unsafe {
            std::alloc::dealloc(
                self.ptr,
                Layout::from_size_align_unchecked(self.bytes.max(BUFFER_ALIGN), BUFFER_ALIGN),
            )
        }
    }
}

impl std::fmt::Debug for AlignedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuffer({}{:?})", self.dtype, self.shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_checks_dtype() {
        let nd = NdData::random(&[3, 5], DType::F32, 7).expect("f32 is data");
        let b = AlignedBuffer::from_nd(&nd).expect("buffer");
        assert_eq!(b.as_ptr() as usize % BUFFER_ALIGN, 0);
        assert_eq!(b.to_nd().expect("nd"), nd);
        assert!(b.as_slice::<f64>().is_err());
        assert!(AlignedBuffer::zeros(&[-1], DType::F32).is_err());
        assert!(AlignedBuffer::zeros(&[0], DType::F32)
            .expect("empty")
            .is_empty());
    }

    #[test]
    fn fenced_buffers_see_writes_just_outside() {
        for shape in [[3i64, 5], [16, 64], [0, 4]] {
            let nd = NdData::random(&shape, DType::F32, 1).expect("data");
            let mut b = AlignedBuffer::fenced_from_nd(&nd).expect("fenced");
            assert_eq!(b.as_ptr() as usize % BUFFER_ALIGN, 0);
            assert_eq!(b.to_nd().expect("nd"), nd);
            assert!(b.fences_intact());
            b.as_mut_slice::<f32>().expect("f32").fill(1.0);
            assert!(b.fences_intact(), "writes inside keep the fences");
        }
        // 15 floats (60 bytes) end 4 bytes short of the trailing fence, and the page before
        // them is slack down to the leading fence: a write on either side shows.
        let mut b = AlignedBuffer::fenced(&[15], DType::F32).expect("fenced");
        // SAFETY: the byte before the data lies in the leading slack of the mapping.
        unsafe { *b.as_mut_ptr().sub(1) = 0 };
        assert!(!b.fences_intact(), "a write before the start shows");
        let mut b = AlignedBuffer::fenced(&[15], DType::F32).expect("fenced");
        // SAFETY: 60 bytes of data rounded up to 64: bytes 60..64 are slack in the mapping.
        unsafe { *b.as_mut_ptr().add(60) = 0 };
        assert!(!b.fences_intact());
    }

    /// Data of 2 MiB or more starts on a huge-page boundary (whole pages of it exactly,
    /// others within the page: their end is what touches the trailing fence), so that a
    /// matrix of whole huge pages can be backed by them all, as a user's array from the
    /// allocator is; the slack on either side still shows a write.
    #[cfg(unix)]
    #[test]
    fn large_fenced_buffers_start_on_a_huge_page_boundary() {
        let page = 4096;
        for floats in [1i64 << 20, (1 << 19) + 3, 1 << 21] {
            let mut b = AlignedBuffer::fenced(&[floats], DType::F32).expect("fenced");
            let start = b.as_ptr() as usize;
            assert!(start % (2 << 20) < page, "{floats}: starts at {start:#x}");
            if floats % 1024 == 0 {
                assert_eq!(start % (2 << 20), 0, "{floats}: whole pages start on it");
            }
            b.as_mut_slice::<f32>().expect("f32").fill(2.0);
            assert!(b.fences_intact());
            if floats % 16 != 0 {
                // SAFETY: the end is not a multiple of 64 bytes: the bytes up to the next
                // multiple are slack inside the mapping.
                unsafe { *b.as_mut_ptr().add(floats as usize * 4) = 0 };
                assert!(!b.fences_intact(), "{floats}: a write past the end shows");
                let mut b = AlignedBuffer::fenced(&[floats], DType::F32).expect("fenced");
                // SAFETY: the data does not start on a page, so the bytes before it down to
                // the leading fence are slack inside the mapping.
                unsafe { *b.as_mut_ptr().sub(1) = 0 };
                assert!(
                    !b.fences_intact(),
                    "{floats}: a write before the start shows"
                );
            }
        }
    }
}
