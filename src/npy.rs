//! Reading `.npy` files from outside: what `tensortune run --inputs` takes.
//!
//! ndarray-npy's reader allocates as many elements as the header declares before it reads
//! any data, so a 144-byte file that declares 10¹² elements aborts the process on the failed
//! allocation. [`read`] first checks the declared shape against the bytes that follow the
//! header (through ndarray-npy's view, which checks lengths without allocating), so the only
//! allocation is the array the file really holds; every bad file is an [`NpyError`] of one
//! line.
//!
//! The view reads native-endian data only; a big-endian file (`>f4`) is checked on a copy
//! whose header says little-endian, then read by ndarray-npy's reader, which swaps the bytes.

use std::path::{Path, PathBuf};

use ndarray::{ArrayD, ArrayViewD};
use ndarray_npy::{ReadNpyExt, ReadableElement, ViewElement, ViewNpyError, ViewNpyExt};

/// A `.npy` file that cannot be read as an array of the element type asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NpyError {
    /// The file could not be read.
    #[error("{}: {message}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's message.
        message: String,
    },
    /// The bytes are not a `.npy` array of the element type (header, type, length).
    #[error("not a valid .npy array: {0}")]
    Format(String),
}

/// Element types the `.npy` reader accepts.
pub trait NpyElement: ReadableElement + ViewElement + Clone {}
impl<T: ReadableElement + ViewElement + Clone> NpyElement for T {}

/// Reads the array in the `.npy` file at `path` (see the module doc).
pub fn read<T: NpyElement>(path: &Path) -> Result<ArrayD<T>, NpyError> {
    let io = |message: String| NpyError::Io {
        path: path.to_path_buf(),
        message,
    };
    // A device or a pipe (`/dev/zero`, a FIFO) could be read forever: only a regular file,
    // and no more of it than it says it holds, fits in memory.
    let meta = std::fs::metadata(path).map_err(|e| io(e.to_string()))?;
    if !meta.is_file() {
        return Err(io("not a regular file".to_string()));
    }
    crate::runtime::memory::check_fits(meta.len(), "the .npy file")
        .map_err(|e| io(e.to_string()))?;
    let bytes = std::fs::read(path).map_err(|e| io(e.to_string()))?;
    parse(&bytes)
}

/// Parses the bytes of a `.npy` file.
pub fn parse<T: NpyElement>(bytes: &[u8]) -> Result<ArrayD<T>, NpyError> {
    let data_start = data_offset(bytes).unwrap_or(0);
    let mut copy = AlignedCopy::new(bytes, data_start);
    match ArrayViewD::<T>::view_npy(copy.bytes()) {
        Ok(view) => Ok(view.to_owned()),
        Err(ViewNpyError::NonNativeEndian) => {
            let header = copy.bytes_mut().get_mut(..data_start).unwrap_or_default();
            if !flip_to_little_endian(header) {
                return Err(format_error(&ViewNpyError::NonNativeEndian));
            }
            // The view checks the declared length; then the reader allocates what is there.
            ArrayViewD::<T>::view_npy(copy.bytes()).map_err(|e| format_error(&e))?;
            ArrayD::<T>::read_npy(bytes).map_err(|e| format_error(&e))
        }
        Err(e) => Err(format_error(&e)),
    }
}

/// One line, whatever the error: the header parser's messages span several (a caret under
/// the offending column), and the header's text may hold any byte.
fn format_error(e: &dyn std::fmt::Display) -> NpyError {
    let text = e.to_string();
    let words: Vec<&str> = text.split_whitespace().collect();
    NpyError::Format(tensortune_schedules::text::single_line(&words.join(" ")).into_owned())
}

/// Where the data starts, from the fixed prefix: magic (6 bytes), version (2), then the
/// header length (2 bytes little-endian in version 1, 4 in versions 2 and 3) and the header.
fn data_offset(bytes: &[u8]) -> Option<usize> {
    if bytes.get(..6)? != b"\x93NUMPY" {
        return None;
    }
    match bytes.get(6)? {
        1 => Some(10 + usize::from(u16::from_le_bytes([*bytes.get(8)?, *bytes.get(9)?]))),
        2 | 3 => {
            let len: [u8; 4] = bytes.get(8..12)?.try_into().ok()?;
            Some(12 + usize::try_from(u32::from_le_bytes(len)).ok()?)
        }
        _ => None,
    }
}

/// Turns the first big-endian type descriptor in a header (`'>f4'`) little-endian; false
/// when the header has none.
fn flip_to_little_endian(header: &mut [u8]) -> bool {
    let found = header
        .windows(2)
        .position(|w| (w[0] == b'\'' || w[0] == b'"') && w[1] == b'>');
    match found {
        Some(i) => {
            header[i + 1] = b'<';
            true
        }
        None => false,
    }
}

/// A copy of a file whose data part starts on a 64-byte boundary, as the view needs for
/// the element type (a file's own header length need not be a multiple of it).
struct AlignedCopy {
    buffer: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedCopy {
    fn new(bytes: &[u8], data_start: usize) -> AlignedCopy {
        const ALIGN: usize = 64;
        let mut buffer = vec![0u8; bytes.len() + ALIGN];
        let misalignment = (buffer.as_ptr() as usize + data_start) % ALIGN;
        let start = (ALIGN - misalignment) % ALIGN;
        buffer[start..start + bytes.len()].copy_from_slice(bytes);
        AlignedCopy {
            buffer,
            start,
            len: bytes.len(),
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.buffer[self.start..self.start + self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buffer[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray_npy::WriteNpyExt;

    /// A version-1 file of `<f4` (or `descr`) data of `shape`, with `data` after the header.
    fn file(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
        let mut header =
            format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({shape}), }}")
                .into_bytes();
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(b' ');
        }
        header.push(b'\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&u16::try_from(header.len()).expect("short").to_le_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn a_huge_declared_shape_is_an_error_not_an_abort() {
        let bad = file("<f4", "1000000000000,", &[0; 16]);
        let e = parse::<f32>(&bad).unwrap_err();
        assert!(matches!(e, NpyError::Format(_)), "{e}");
        let big_endian = file(">f4", "1000000000000,", &[0; 16]);
        assert!(parse::<f32>(&big_endian).is_err());
    }

    #[test]
    fn what_ndarray_npy_writes_reads_back_in_either_byte_order() {
        let a = ndarray::Array2::from_shape_fn((3, 5), |(i, j)| i as f32 * 10.0 - j as f32);
        let mut bytes = Vec::new();
        a.write_npy(&mut bytes).expect("write");
        assert_eq!(parse::<f32>(&bytes).expect("read"), a.clone().into_dyn());
        let values: Vec<u8> = a.iter().flat_map(|v| v.to_be_bytes()).collect();
        let big = file(">f4", "3, 5", &values);
        assert_eq!(parse::<f32>(&big).expect("big-endian"), a.into_dyn());
        // A header whose length is not a multiple of the element size.
        let mut odd = b"\x93NUMPY\x01\x00".to_vec();
        let header = b"{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }\n";
        odd.extend_from_slice(&u16::try_from(header.len()).expect("short").to_le_bytes());
        odd.extend_from_slice(header);
        odd.extend_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(
            parse::<i32>(&odd).expect("odd header").as_slice(),
            Some(&[1, 2][..])
        );
    }

    #[test]
    fn errors_are_one_line() {
        for bad in [
            &b""[..],
            b"\x93NUMPY",
            b"\x93NUMPY\x01\x00\x04\x00{'d\n",
            &file("<f8", "2,", &[0; 16]),
            &file("<f4", "2,", &[0; 12]),
            &file("<f4", "2,", &[0; 9]),
            &file("<f4", "(", &[]),
        ] {
            let e = parse::<f32>(bad).unwrap_err().to_string();
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
