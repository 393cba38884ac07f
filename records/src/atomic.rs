//! Writing a file so that it is either the old one or the whole new one, never half of it.
//!
//! The content goes to a temporary file of a name no other file has (created exclusively, in
//! the same folder, so the rename stays on one file system), is flushed to disk, and is then
//! renamed over the target. On any error the temporary file is removed and the target is
//! untouched: a full disk, a kill or a crash mid-write leave the previous file as it was, and
//! no file but our own temporary is ever created or removed.
//!
//! An output path that is a symbolic link is written through: the file the link names is
//! replaced and the link stays, as a shell's `>` would leave it (renaming over the link itself
//! would turn it into a regular file and leave its target stale). A file replaced keeps its
//! permission bits.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `path` through `fill`, atomically (see the module doc).
pub fn write_atomic(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let resolved = resolve_links(path)?;
    let path = resolved.as_path();
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
    let mut staged: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut streams: Vec<(PathBuf, &[u8])> = Vec::new();
    let result = (|| {
        for &(path, bytes) in files {
            let path = resolve_links(path)?;
            if let Ok(meta) = std::fs::metadata(&path) {
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
            let (tmp, file) = create_temp(&path)?;
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
        write_atomic(&path, |w| w.write_all(bytes))?;
    }
    Ok(())
}

/// The file that `path` names once symbolic links are followed: `path` itself when it is not
/// a link (or does not exist), else the end of its chain of links, relative targets taken from
/// the link's folder. A dangling link gives the missing file it points to, which the write
/// then creates. A loop of links is an error, as opening it would be.
fn resolve_links(path: &Path) -> io::Result<PathBuf> {
    // Linux's own limit on links followed in one lookup.
    const MAX_HOPS: usize = 40;
    let mut at = path.to_path_buf();
    for _ in 0..MAX_HOPS {
        match std::fs::symlink_metadata(&at) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = std::fs::read_link(&at)?;
                at = match at.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                };
            }
            _ => return Ok(at),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{}: too many levels of symbolic links", path.display()),
    ))
}

/// A new, exclusively created file beside `path`: `.NAME.PID-N.tmp`, `N` counting up in this
/// process until a free name is found.
fn create_temp(path: &Path) -> io::Result<(PathBuf, File)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "the output path names no file")
    })?;
    sweep_stale(path, name);
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}-{n}.tmp", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => {
                // The file replaced keeps its permissions (a script's executable bit, a
                // group's write access); best effort, as the content is what matters.
                if let Ok(meta) = std::fs::metadata(path) {
                    let _ = f.set_permissions(meta.permissions());
                }
                return Ok((tmp, f));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Removes the temporaries of `path` that a process which no longer runs left behind (killed
/// mid-write: a signal gives it no chance to clean up). Only names of exactly this module's
/// pattern, `.NAME.PID-N.tmp`, with a PID that is not running here and unchanged for an hour
/// are touched: a temporary of a process still writing the same output is left to it, and so
/// is one that another machine sharing the folder is writing (its PID means nothing here).
/// Linux only (it asks `/proc`); best effort: whatever fails is left as it was.
fn sweep_stale(path: &Path, name: &std::ffi::OsStr) {
    const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(3600);
    if !cfg!(target_os = "linux") {
        return;
    }
    let Some(name) = name.to_str() else {
        return;
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let prefix = format!(".{name}.");
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(tail) = file
            .to_str()
            .and_then(|f| f.strip_prefix(&prefix))
            .and_then(|t| t.strip_suffix(".tmp"))
        else {
            continue;
        };
        let Some((pid, n)) = tail.split_once('-') else {
            continue;
        };
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(pid) || !digits(n) || pid == std::process::id().to_string() {
            continue;
        }
        let idle = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= STALE_AFTER);
        if idle && !Path::new("/proc").join(pid).exists() && Path::new("/proc/self").exists() {
            let _ = std::fs::remove_file(entry.path());
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

    #[cfg(unix)]
    #[test]
    fn a_link_is_written_through_and_a_file_keeps_its_mode() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let dir = tempfile::tempdir().expect("dir");
        let real = dir.path().join("real.json");
        std::fs::write(&real, "old").expect("write");
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        // A relative link, and a link to that link.
        let link = dir.path().join("link.json");
        symlink("real.json", &link).expect("link");
        let link2 = dir.path().join("link2.json");
        symlink(&link, &link2).expect("link");
        write_bytes_atomic(&link2, b"new").expect("write through");
        assert!(std::fs::symlink_metadata(&link)
            .expect("meta")
            .file_type()
            .is_symlink());
        assert!(std::fs::symlink_metadata(&link2)
            .expect("meta")
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&real).expect("read"), "new");
        let mode = std::fs::metadata(&real).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o640);
        // Several files, one through a dangling link: its target is created.
        let dangling = dir.path().join("dangling.h");
        symlink("made.h", &dangling).expect("link");
        write_files_atomic(&[(&link, b"newer"), (&dangling, b"h")]).expect("both");
        assert_eq!(std::fs::read_to_string(&real).expect("read"), "newer");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("made.h")).expect("read"),
            "h"
        );
        // A loop of links is an error and creates nothing.
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        symlink(&b, &a).expect("link");
        symlink(&a, &b).expect("link");
        assert!(write_bytes_atomic(&a, b"x").is_err());
        let left = std::fs::read_dir(dir.path())
            .expect("ls")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .count();
        assert_eq!(left, 0);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn temporaries_of_dead_processes_are_swept() {
        let dir = tempfile::tempdir().expect("dir");
        let out = dir.path().join("e.jsonl");
        // A PID above the kernel's largest (2^22) never runs; our own PID's is ours to keep.
        let dead = dir.path().join(".e.jsonl.99999999-0.tmp");
        let ours = dir
            .path()
            .join(format!(".e.jsonl.{}-77.tmp", std::process::id()));
        let alive = dir.path().join(".e.jsonl.1-0.tmp");
        let other = dir.path().join(".f.jsonl.99999999-0.tmp");
        let recent = dir.path().join(".e.jsonl.99999998-0.tmp");
        let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
        for p in [&dead, &ours, &alive, &other, &recent] {
            std::fs::write(p, "x").expect("write");
            if p != &recent {
                File::options()
                    .write(true)
                    .open(p)
                    .and_then(|f| f.set_modified(two_hours_ago))
                    .expect("age");
            }
        }
        write_bytes_atomic(&out, b"new").expect("write");
        assert!(!dead.exists(), "a dead process's old temporary is swept");
        // Our own, a running process's, another output's and a recent one are kept.
        for p in [&ours, &alive, &other, &recent] {
            assert!(p.exists(), "{} is kept", p.display());
        }
    }
}
