//! Output files of the subcommands: never one of the command's inputs or another of its
//! outputs, and always written whole or not at all.
//!
//! Paths are compared after resolving links and `..` (of the file, or of its folder when the
//! file does not exist yet), so `--out ./a.db`, `--out link-to-a.db` and a hard link (same
//! device and inode) all count as `a.db`.

use std::path::{Path, PathBuf};

use super::CliError;

/// The path with links resolved: of the file when it exists, else of its folder joined with
/// its name; as given when neither resolves.
fn resolved(path: &Path) -> PathBuf {
    if let Ok(p) = std::fs::canonicalize(path) {
        return p;
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match (std::fs::canonicalize(parent), path.file_name()) {
        (Ok(dir), Some(name)) => dir.join(name),
        _ => path.to_path_buf(),
    }
}

/// True when `a` and `b` name one file: the same resolved path, or (Unix) the same inode.
fn same_file(a: &Path, b: &Path) -> bool {
    if resolved(a) == resolved(b) {
        return true;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return x.dev() == y.dev() && x.ino() == y.ino();
        }
    }
    false
}

/// A usage error when an output is one of the inputs or two outputs are one file. `-`
/// (standard output) is not a file and is skipped.
pub fn refuse_clobbering(
    inputs: &[(&str, &Path)],
    outputs: &[(&str, &Path)],
) -> Result<(), CliError> {
    let is_file = |p: &Path| p.as_os_str() != "-";
    for (i, (name, out)) in outputs.iter().enumerate() {
        if !is_file(out) {
            continue;
        }
        for (in_name, input) in inputs {
            if is_file(input) && same_file(out, input) {
                return Err(CliError::Usage(format!(
                    "{name} {} is the same file as {in_name}: refusing to overwrite it",
                    out.display()
                )));
            }
            // An SQLite database's write-ahead log and shared-memory index hold part of it:
            // writing over either loses or corrupts transactions not yet in the main file.
            for suffix in ["-wal", "-shm"] {
                let mut side = input.as_os_str().to_owned();
                side.push(suffix);
                if is_file(input) && same_file(out, Path::new(&side)) {
                    return Err(CliError::Usage(format!(
                        "{name} {} is {in_name}'s `{suffix}` file: refusing to overwrite it",
                        out.display()
                    )));
                }
            }
        }
        for (other_name, other) in &outputs[i + 1..] {
            if is_file(other) && same_file(out, other) {
                return Err(CliError::Usage(format!(
                    "{name} and {other_name} are the same file ({}): give each its own",
                    out.display()
                )));
            }
        }
    }
    Ok(())
}

/// Writes `bytes` to `path` through a temporary file renamed into place (see
/// [`tensortune_records::atomic`]); an error names the file.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    tensortune_records::write_bytes_atomic(path, bytes).map_err(|e| io_error(path, &e))
}

/// An I/O error on `path` for the exit status: every failure to write a file the user named
/// (no such folder, no permission, a full disk) is one the user can act on.
pub fn io_error(path: &Path, e: &std::io::Error) -> CliError {
    CliError::Usage(format!("{}: cannot write: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_that_are_inputs_are_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let db = dir.path().join("a.db");
        std::fs::write(&db, "x").expect("write");
        let link = dir.path().join("link.db");
        #[cfg(unix)]
        std::os::unix::fs::symlink(&db, &link).expect("link");
        let dotted = dir.path().join(".").join("a.db");
        let wal = dir.path().join("a.db-wal");
        for out in [&db, &dotted, &link, &wal] {
            let e = refuse_clobbering(&[("--db", &db)], &[("--out", out)]).expect_err("same");
            assert_eq!(e.exit_code(), 2);
            assert!(e.to_string().contains("--db"), "{e}");
        }
        let fresh = dir.path().join("new.o");
        refuse_clobbering(&[("--db", &db)], &[("--out", &fresh)]).expect("distinct");
        let e = refuse_clobbering(&[], &[("--out", &fresh), ("--header", &fresh)])
            .expect_err("two outputs");
        assert!(e.to_string().contains("--header"), "{e}");
        refuse_clobbering(&[("--db", &db)], &[("--out", Path::new("-"))]).expect("stdout");
    }
}
