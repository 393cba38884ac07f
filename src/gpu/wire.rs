//! The frames between the supervisor and its worker.
//!
//! A frame is the magic `TTG1`, the header's length (u32, little-endian), the payload's
//! length (u64, little-endian), the header (a JSON [`Request`] or [`Reply`]) and the payload:
//! the raw little-endian bytes of the buffers the header lists, one after another. Tensor
//! data travels as bytes rather than JSON numbers: it is most of a request, and JSON would
//! round-trip f32 through decimal text.

use super::{GpuProgram, RunOptions};
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use tensortune_schedules::data::{Data, NdData};
use tensortune_schedules::target::CudaDesc;
use tensortune_schedules::DType;

/// The start of every frame: a stream that is not one (a stray print, garbage) is caught at
/// its first bytes.
const MAGIC: &[u8; 4] = b"TTG1";

/// The largest header read: a PTX module of the largest unrolled kernels is a few MiB.
const MAX_HEADER: u32 = 256 << 20;

/// The largest payload read: more than any device's memory, so only a damaged length
/// passes it.
const MAX_PAYLOAD: u64 = 1 << 40;

/// One buffer of a frame's payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BufMeta {
    pub shape: Vec<i64>,
    pub dtype: DType,
}

/// What the supervisor asks.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Request {
    /// The device's description.
    Hello,
    /// Run a program on the payload's inputs.
    Run {
        program: Box<GpuProgram>,
        opts: RunOptions,
        inputs: Vec<BufMeta>,
    },
}

/// [`CudaDesc`] on the wire (the schedule crate's type is not serializable).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireDesc {
    pub arch: String,
    pub warp_size: u32,
    pub max_threads_per_block: u32,
    pub shared_memory_per_block: u64,
    pub registers_per_thread: u32,
    pub multiprocessors: u32,
    pub l2_bytes: u64,
}

impl From<&CudaDesc> for WireDesc {
    fn from(d: &CudaDesc) -> Self {
        WireDesc {
            arch: d.arch.clone(),
            warp_size: d.warp_size,
            max_threads_per_block: d.max_threads_per_block,
            shared_memory_per_block: d.shared_memory_per_block,
            registers_per_thread: d.registers_per_thread,
            multiprocessors: d.multiprocessors,
            l2_bytes: d.l2_bytes,
        }
    }
}

impl From<WireDesc> for CudaDesc {
    fn from(d: WireDesc) -> Self {
        CudaDesc {
            arch: d.arch,
            warp_size: d.warp_size,
            max_threads_per_block: d.max_threads_per_block,
            shared_memory_per_block: d.shared_memory_per_block,
            registers_per_thread: d.registers_per_thread,
            multiprocessors: d.multiprocessors,
            l2_bytes: d.l2_bytes,
        }
    }
}

/// The kinds of failure a worker reports; see [`super::GpuRunError`], whose variants of
/// the same names they become.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum ErrorKind {
    Unavailable,
    Invalid,
    Load,
    Launch,
    Kernel,
    Simulation,
    Device,
}

/// What the worker answers.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Reply {
    /// The device.
    Hello {
        name: String,
        desc: WireDesc,
        simulated: bool,
    },
    /// A run's result; the outputs are the payload.
    Ran {
        outputs: Vec<BufMeta>,
        times_s: Vec<f64>,
        registers: Option<u32>,
        shared_bytes: Option<u32>,
        local_bytes: Option<u32>,
    },
    /// A failure. `sticky`: the worker's device is unusable and the worker exits after
    /// this reply.
    Error {
        kind: ErrorKind,
        message: String,
        sticky: bool,
    },
}

/// A frame read back: the header's bytes and the payload's.
pub(crate) struct Frame {
    pub header: Vec<u8>,
    pub payload: Vec<u8>,
}

/// Why no frame was read.
#[derive(Debug)]
pub(crate) enum FrameError {
    /// The stream ended inside a frame (the writer died while writing it).
    Truncated,
    /// Bytes that are not a frame.
    Malformed(String),
    /// The read itself failed.
    Io(io::Error),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Truncated => f.write_str("the stream ended inside a frame"),
            FrameError::Malformed(m) => f.write_str(m),
            FrameError::Io(e) => write!(f, "read failed: {e}"),
        }
    }
}

/// Bytes of one element of a data dtype; `None` for the others.
fn elem_size(dtype: DType) -> Option<usize> {
    match dtype {
        DType::F32 | DType::I32 => Some(4),
        DType::F64 => Some(8),
        DType::BF16 => Some(2),
        DType::Bool | DType::I64 => None,
    }
}

/// The description of a buffer.
pub(crate) fn meta(nd: &NdData) -> BufMeta {
    BufMeta {
        shape: nd.shape.clone(),
        dtype: nd.data.dtype(),
    }
}

/// The frame of `header` with `bufs` as its payload.
pub(crate) fn encode<H: Serialize>(header: &H, bufs: &[&NdData]) -> Result<Vec<u8>, String> {
    let head = serde_json::to_vec(header).map_err(|e| format!("cannot encode a header: {e}"))?;
    let head_len = u32::try_from(head.len())
        .ok()
        .filter(|&n| n <= MAX_HEADER)
        .ok_or_else(|| format!("a header of {} bytes is too large", head.len()))?;
    let payload: usize = bufs
        .iter()
        .map(|b| b.data.len() * elem_size(b.data.dtype()).unwrap_or(0))
        .sum();
    let mut out = Vec::new();
    out.try_reserve_exact(16 + head.len() + payload)
        .map_err(|_| format!("out of memory for a frame of {payload} bytes"))?;
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&head_len.to_le_bytes());
    out.extend_from_slice(&(payload as u64).to_le_bytes());
    out.extend_from_slice(&head);
    for b in bufs {
        match &b.data {
            Data::F32(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Data::F64(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Data::I32(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Data::BF16(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        }
    }
    Ok(out)
}

/// Writes a frame and flushes.
pub(crate) fn write_frame(w: &mut impl Write, frame: &[u8]) -> io::Result<()> {
    w.write_all(frame)?;
    w.flush()
}

/// Reads `buf.len()` bytes; `Ok(false)` if the stream ended before the first of them.
fn read_exact_or_eof(r: &mut impl Read, buf: &mut [u8]) -> Result<bool, FrameError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(FrameError::Truncated),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    Ok(true)
}

/// Reads `n` bytes, growing the buffer as they arrive rather than trusting `n` up front.
fn read_n(r: &mut impl Read, n: u64) -> Result<Vec<u8>, FrameError> {
    let mut v = Vec::new();
    r.take(n).read_to_end(&mut v).map_err(FrameError::Io)?;
    if v.len() as u64 != n {
        return Err(FrameError::Truncated);
    }
    Ok(v)
}

/// The next frame; `Ok(None)` where the stream ends between frames.
pub(crate) fn read_frame(r: &mut impl Read) -> Result<Option<Frame>, FrameError> {
    let mut head = [0u8; 16];
    if !read_exact_or_eof(r, &mut head)? {
        return Ok(None);
    }
    if &head[..4] != MAGIC {
        let shown = String::from_utf8_lossy(&head);
        return Err(FrameError::Malformed(format!(
            "not a frame: it starts with {:?}",
            tensortune_schedules::text::single_line(&shown)
        )));
    }
    let mut n4 = [0u8; 4];
    n4.copy_from_slice(&head[4..8]);
    let head_len = u32::from_le_bytes(n4);
    let mut n8 = [0u8; 8];
    n8.copy_from_slice(&head[8..16]);
    let payload_len = u64::from_le_bytes(n8);
    if head_len > MAX_HEADER || payload_len > MAX_PAYLOAD {
        return Err(FrameError::Malformed(format!(
            "a frame of {head_len} header and {payload_len} payload bytes is past the limits"
        )));
    }
    let header = read_n(r, head_len as u64)?;
    let payload = read_n(r, payload_len)?;
    Ok(Some(Frame { header, payload }))
}

/// The buffers `metas` describes, cut from `payload`, which they must use up exactly.
pub(crate) fn split(payload: &[u8], metas: &[BufMeta]) -> Result<Vec<NdData>, String> {
    let mut at = 0usize;
    let mut out = Vec::with_capacity(metas.len());
    for m in metas {
        let size = elem_size(m.dtype).ok_or_else(|| format!("{} is not a data dtype", m.dtype))?;
        let n = m
            .shape
            .iter()
            .try_fold(1usize, |n, &d| {
                usize::try_from(d).ok().and_then(|d| n.checked_mul(d))
            })
            .ok_or_else(|| format!("bad shape {:?}", m.shape))?;
        let bytes = n
            .checked_mul(size)
            .filter(|&b| b <= payload.len() - at)
            .ok_or_else(|| {
                format!(
                    "the payload is too short for a buffer of shape {:?}",
                    m.shape
                )
            })?;
        let raw = &payload[at..at + bytes];
        at += bytes;
        let data = match m.dtype {
            DType::F32 => Data::F32(
                raw.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            DType::I32 => Data::I32(
                raw.chunks_exact(4)
                    .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            DType::BF16 => Data::BF16(
                raw.chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            ),
            _ => Data::F64(
                raw.chunks_exact(8)
                    .map(|c| {
                        let mut b = [0u8; 8];
                        b.copy_from_slice(c);
                        f64::from_le_bytes(b)
                    })
                    .collect(),
            ),
        };
        out.push(
            NdData::new(m.shape.clone(), data).ok_or_else(|| format!("bad shape {:?}", m.shape))?,
        );
    }
    if at != payload.len() {
        return Err(format!(
            "{} payload bytes past the buffers the header lists",
            payload.len() - at
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_garbage_is_malformed() {
        let a = NdData::new(vec![2, 2], Data::F32(vec![1.0, -2.5, f32::NAN, 4.0])).unwrap();
        let b = NdData::new(vec![3], Data::I32(vec![1, -2, 3])).unwrap();
        let f = encode(&Request::Hello, &[&a, &b]).unwrap();
        let mut r = &f[..];
        let got = read_frame(&mut r).unwrap().unwrap();
        assert!(matches!(
            serde_json::from_slice::<Request>(&got.header).unwrap(),
            Request::Hello
        ));
        let bufs = split(&got.payload, &[meta(&a), meta(&b)]).unwrap();
        assert_eq!(bufs[1], b);
        assert!(bufs[0].data.get_f64(2).is_nan());
        assert!(read_frame(&mut r).unwrap().is_none());
        let mut g = &b"garbage garbage garbage"[..];
        assert!(matches!(read_frame(&mut g), Err(FrameError::Malformed(_))));
        let mut t = &f[..f.len() - 1];
        assert!(matches!(read_frame(&mut t), Err(FrameError::Truncated)));
        assert!(split(&got.payload, &[meta(&a)]).is_err());
    }
}
