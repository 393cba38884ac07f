//! Fuzzing of the root crate's parsers of outside input: target strings (`--target`) and
//! `.npy` files (`run --inputs`). Mutations of valid inputs parse, or fail with a typed error
//! of one line, never a panic (nor an abort: a `.npy` header may declare any shape).

use ndarray::{ArrayD, IxDyn, ShapeBuilder};
use ndarray_npy::WriteNpyExt;
use tensortune::npy::{self, NpyElement};
use tensortune::{Target, UnknownTarget};
use tensortune_fuzzkit::{one_line, Campaign};

/// The target parser under test, in one place, so a parsed target-key type can take its
/// place: it returns what the CLI files records under, or a typed error.
fn parse_target(text: &str) -> Result<Target, UnknownTarget> {
    Target::parse(text, 4)
}

/// A parsed target re-parses from the text that states it.
fn check_target(bytes: &[u8]) -> Result<(), String> {
    let text = String::from_utf8_lossy(bytes);
    let target = match parse_target(&text) {
        Ok(target) => target,
        Err(e) => return one_line(&e),
    };
    if target.threads() == 0 {
        return Err(format!("{text:?} parsed to zero threads"));
    }
    let stated = format!("llvm -threads={}", target.threads());
    match parse_target(&stated) {
        Ok(again) if again == target => Ok(()),
        other => Err(format!(
            "{text:?} parsed to {target:?}, {stated:?} to {other:?}"
        )),
    }
}

#[test]
fn mutated_target_strings_parse_or_fail_with_one_line() {
    Campaign::new(
        "target strings",
        &[
            b"llvm",
            b"llvm -threads=8",
            b"  llvm   -threads=1 ",
            b"llvm -mcpu=znver4 -mattr=+avx512f,+fma -threads=2",
            b"cuda -arch=sm_90",
        ],
    )
    .tokens(&[
        "llvm",
        "cuda",
        "-threads=",
        "-mcpu=",
        "-mattr=",
        "-arch=",
        "+avx2",
        " ",
    ])
    .run(check_target);
}

/// `bytes` as an array of `T`: an error of one line, or an array that the file really holds
/// (no more elements than its bytes can carry) and that writes and reads back to the same
/// bytes.
fn check_npy<T: NpyElement + ndarray_npy::WritableElement>(bytes: &[u8]) -> Result<(), String> {
    let array: ArrayD<T> = match npy::parse(bytes) {
        Ok(array) => array,
        Err(e) => return one_line(&e),
    };
    if array.len().saturating_mul(std::mem::size_of::<T>()) > bytes.len() {
        return Err(format!(
            "{} elements from {} bytes",
            array.len(),
            bytes.len()
        ));
    }
    let write = |a: &ArrayD<T>| {
        let mut out = Vec::new();
        a.write_npy(&mut out)
            .map(|()| out)
            .map_err(|e| format!("write: {e}"))
    };
    let written = write(&array)?;
    let again: ArrayD<T> = npy::parse(&written).map_err(|e| format!("re-read: {e}"))?;
    if again.shape() != array.shape() || write(&again)? != written {
        return Err("write -> read changed the array".into());
    }
    Ok(())
}

fn npy_bytes<T: ndarray_npy::WritableElement>(a: &ArrayD<T>) -> Vec<u8> {
    let mut out = Vec::new();
    a.write_npy(&mut out).expect("writing to memory");
    out
}

/// A version-1 file with a header of our own (big-endian data, odd header lengths, version
/// 2), which ndarray-npy's writer does not make.
fn hand_npy(version: u8, descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
    let header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({shape}), }}\n");
    let mut out = vec![0x93, b'N', b'U', b'M', b'P', b'Y', version, 0];
    if version == 1 {
        out.extend_from_slice(&u16::try_from(header.len()).expect("short").to_le_bytes());
    } else {
        out.extend_from_slice(&u32::try_from(header.len()).expect("short").to_le_bytes());
    }
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

#[test]
fn mutated_npy_files_read_or_fail_with_one_line() {
    let f32s = ArrayD::from_shape_fn(IxDyn(&[2, 3]), |i| i[0] as f32 - 0.5 * i[1] as f32);
    let fortran =
        ArrayD::from_shape_vec(IxDyn(&[3, 2]).f(), (0..6).map(f64::from).collect()).expect("shape");
    let ints = ArrayD::from_shape_fn(IxDyn(&[4]), |i| i[0] as i32 - 2);
    let seeds = [
        npy_bytes(&f32s),
        npy_bytes(&ArrayD::<f32>::zeros(IxDyn(&[]))),
        npy_bytes(&ArrayD::<f32>::zeros(IxDyn(&[0, 5]))),
        npy_bytes(&fortran),
        npy_bytes(&ints),
        hand_npy(1, ">f4", "2,", &[0x3f, 0x80, 0, 0, 0xc0, 0, 0, 0]),
        hand_npy(2, "<i4", "1, 1", &[7, 0, 0, 0]),
        hand_npy(1, "<f8", "1,", &1.5f64.to_le_bytes()),
    ];
    let seeds: Vec<&[u8]> = seeds.iter().map(Vec::as_slice).collect();
    let tokens = [
        "'descr'",
        "'<f4'",
        "'>f8'",
        "'<i4'",
        "'|u1'",
        "'<c8'",
        "'fortran_order'",
        "True",
        "'shape'",
        "(",
        ")",
        ",",
        "NUMPY",
        "\x01\x00",
        "\x02\x00",
        "\x03\x00",
    ];
    // Each input read as every element type `run` takes, so that a file is right for one.
    Campaign::new(".npy files", &seeds)
        .tokens(&tokens)
        .run(|bytes| {
            check_npy::<f32>(bytes)?;
            check_npy::<f64>(bytes)?;
            check_npy::<i32>(bytes)
        });
}
