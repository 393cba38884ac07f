//! Writing a file so that it is either the old one or the whole new one, never half of it.
//!
//! The content goes to a temporary file of a name no other file has (created exclusively, in
//! the same folder, so the rename stays on one file system), is flushed to disk, and is then
//! renamed over the target. On any error the temporary file is removed and the target is
//! untouched: a full disk, a kill or a crash mid-write leave the previous file as it was, and
//! no file but our own temporary is ever created or removed.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `path` through `fill`, atomically (see the module doc).
pub fn write_atomic(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    // A device, pipe or socket (`/dev/null`, `/dev/stdout`, a FIFO) is a stream, not a file
    // to replace: it is written in place. Renaming over it would put a regular file where
    // the device was (as root, for every program on the machine).
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                "the output path is a directory",
            ));
        }
        if !meta.is_file() {
            let mut w = BufWriter::new(OpenOptions::new().write(true).open(path)?);
            fill(&mut w)?;
            return w.flush();
        }
    }
    let (tmp, file) = create_temp(path)?;
    let result = (|| {
        let mut w = BufWriter::new(file);
        fill(&mut w)?;
        let file = w.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        // Best effort: the error that matters is the one being returned.
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// [`write_atomic`] of a byte string.
pub fn write_bytes_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic(path, |w| w.write_all(bytes))
}

/// Writes several files so that a failure leaves every one of them as it was: each content
/// goes to its temporary file first (a directory, a missing folder or a full disk fails here,
/// before any target changes), and only then are the temporaries renamed over their targets,
/// in order. A device or pipe among the targets is written in place at that point, as
/// [`write_atomic`] does.
pub fn write_files_atomic(files: &[(&Path, &[u8])]) -> io::Result<()> {
    let mut staged: Vec<(PathBuf, &Path)> = Vec::new();
    let mut streams: Vec<(&Path, &[u8])> = Vec::new();
    let result = (|| {
        for &(path, bytes) in files {
            if let Ok(meta) = std::fs::metadata(path) {
                if meta.is_dir() {
                    return Err(io::Error::new(
                        io::ErrorKind::IsADirectory,
                        format!("{}: the output path is a directory", path.display()),
                    ));
                }
                if !meta.is_file() {
                    streams.push((path, bytes));
                    continue;
                }
            }
            let (tmp, file) = create_temp(path)?;
            staged.push((tmp, path));
            let mut w = BufWriter::new(file);
            w.write_all(bytes)?;
            w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        }
        Ok(())
    })();
    if let Err(e) = result {
        for (tmp, _) in &staged {
            let _ = std::fs::remove_file(tmp);
        }
        return Err(e);
    }
    for (i, (tmp, path)) in staged.iter().enumerate() {
        if let Err(e) = std::fs::rename(tmp, path) {
            for (rest, _) in &staged[i..] {
                let _ = std::fs::remove_file(rest);
            }
            return Err(e);
        }
    }
    for (path, bytes) in streams {
        write_atomic(path, |w| w.write_all(bytes))?;
    }
    Ok(())
}

/// A new, exclusively created file beside `path`: `.NAME.PID-N.tmp`, `N` counting up in this
/// process until a free name is found.
fn create_temp(path: &Path) -> io::Result<(PathBuf, File)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "the output path names no file")
    })?;
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}-{n}.tmp", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_files_are_all_written_or_none_is() {
        let dir = tempfile::tempdir().expect("dir");
        let (a, b) = (dir.path().join("a.o"), dir.path().join("a.h"));
        std::fs::write(&a, "old a").expect("write");
        // The second target is a directory, the third's folder does not exist: nothing changes.
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).expect("dir");
        let missing = dir.path().join("no").join("x.h");
        for bad in [&sub, &missing] {
            assert!(write_files_atomic(&[(&a, b"new a"), (bad, b"h")]).is_err());
            assert_eq!(std::fs::read(&a).expect("read"), b"old a");
        }
        write_files_atomic(&[(&a, b"new a"), (&b, b"new h")]).expect("both");
        assert_eq!(std::fs::read(&a).expect("read"), b"new a");
        assert_eq!(std::fs::read(&b).expect("read"), b"new h");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "temporaries left: {left:?}");
    }

    #[test]
    fn a_device_is_written_in_place_not_replaced() {
        let null = Path::new("/dev/null");
        if !null.exists() {
            return;
        }
        write_bytes_atomic(null, b"discarded").expect("writes to the device");
        let meta = std::fs::metadata(null).expect("still there");
        assert!(!meta.is_file(), "/dev/null is still a device");
        let dir = tempfile::tempdir().expect("dir");
        let e = write_bytes_atomic(dir.path(), b"x").expect_err("a directory");
        assert_eq!(e.kind(), io::ErrorKind::IsADirectory);
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("out.json");
        let neighbour = dir.path().join("out.tmp");
        std::fs::write(&path, "old").expect("write");
        std::fs::write(&neighbour, "someone else's").expect("write");
        let err = write_atomic(&path, |w| {
            w.write_all(b"half")?;
            Err(io::Error::other("disk full"))
        })
        .expect_err("fails");
        assert_eq!(err.to_string(), "disk full");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "old");
        assert_eq!(
            std::fs::read_to_string(&neighbour).expect("read"),
            "someone else's"
        );
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 2);
        write_bytes_atomic(&path, b"new").expect("write");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "new");
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 2);
    }
}
