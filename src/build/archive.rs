//! A static library (`.a`) writer: the System V / GNU `ar` format with a symbol index.
//!
//! Layout: the magic `!<arch>\n`, then members, each a 60-byte text header (name, mtime,
//! owner, group, mode, size) followed by its bytes padded to an even length. The first member,
//! named `/`, is the index linkers read to find which member defines a symbol: a big-endian
//! `u32` count, one big-endian `u32` file offset of the defining member's header per symbol,
//! then the symbol names, each NUL-terminated. GNU `ld` refuses an archive without it.
//! Times, owners and modes are fixed so that the same objects give the same bytes.

/// One object file of the library, with the global symbols it defines.
#[derive(Clone, Debug)]
pub struct Member {
    /// File name inside the archive: at most 15 bytes, no `/`.
    pub name: String,
    /// The object file.
    pub data: Vec<u8>,
    /// The global symbols it defines (what the index lists).
    pub symbols: Vec<String>,
}

const MAGIC: &[u8] = b"!<arch>\n";
const HEADER_LEN: usize = 60;

fn header(name: &str, size: usize) -> Vec<u8> {
    let h = format!("{name:<16}{:<12}{:<6}{:<6}{:<8}{size:<10}`\n", 0, 0, 0, 644);
    debug_assert_eq!(h.len(), HEADER_LEN);
    h.into_bytes()
}

fn padded(n: usize) -> usize {
    n + (n & 1)
}

/// The archive of `members`, or a message if a name does not fit the format.
pub fn write(members: &[Member]) -> Result<Vec<u8>, String> {
    for m in members {
        if m.name.is_empty() || m.name.len() > 15 || m.name.contains('/') {
            return Err(format!(
                "archive member name `{}` must be 1 to 15 bytes, no `/`",
                m.name
            ));
        }
    }
    let nsyms: usize = members.iter().map(|m| m.symbols.len()).sum();
    let names_len: usize = members
        .iter()
        .flat_map(|m| &m.symbols)
        .map(|s| s.len() + 1)
        .sum();
    let index_len = 4 + 4 * nsyms + names_len;
    let count = u32::try_from(nsyms).map_err(|_| "too many symbols".to_string())?;
    // Offsets of each member's header: after the magic and the (padded) index.
    let mut offsets = Vec::with_capacity(members.len());
    let mut at = MAGIC.len() + HEADER_LEN + padded(index_len);
    for m in members {
        offsets.push(at);
        at += HEADER_LEN + padded(m.data.len());
    }
    let mut out = Vec::with_capacity(at);
    out.extend_from_slice(MAGIC);
    out.extend(header("/", index_len));
    out.extend(count.to_be_bytes());
    for (m, &off) in members.iter().zip(&offsets) {
        let off = u32::try_from(off).map_err(|_| "library larger than 4 GiB".to_string())?;
        for _ in &m.symbols {
            out.extend(off.to_be_bytes());
        }
    }
    for s in members.iter().flat_map(|m| &m.symbols) {
        out.extend(s.as_bytes());
        out.push(0);
    }
    if index_len % 2 == 1 {
        out.push(b'\n');
    }
    for m in members {
        out.extend(header(&format!("{}/", m.name), m.data.len()));
        out.extend(&m.data);
        if m.data.len() % 2 == 1 {
            out.push(b'\n');
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_index() {
        let a = write(&[
            Member {
                name: "a.o".into(),
                data: b"abc".to_vec(),
                symbols: vec!["f".into(), "g".into()],
            },
            Member {
                name: "b.o".into(),
                data: b"wxyz".to_vec(),
                symbols: vec!["h".into()],
            },
        ])
        .expect("archive");
        assert_eq!(&a[..8], MAGIC);
        let index_len = 4 + 3 * 4 + 6;
        assert_eq!(&a[8..24], b"/               ");
        assert_eq!(&a[8 + 48..8 + 58], format!("{index_len:<10}").as_bytes());
        let body = &a[68..68 + index_len];
        assert_eq!(&body[..4], &3u32.to_be_bytes());
        let first = 68 + index_len;
        let off = |i: usize| u32::from_be_bytes([body[i], body[i + 1], body[i + 2], body[i + 3]]);
        assert_eq!(off(4) as usize, first);
        assert_eq!(off(8) as usize, first);
        assert_eq!(off(12) as usize, first + 60 + 4);
        assert_eq!(&body[16..], b"f\0g\0h\0");
        assert_eq!(&a[first..first + 4], b"a.o/");
        assert_eq!(&a[first + 60..first + 63], b"abc");
        assert_eq!(a[first + 63], b'\n');
        assert_eq!(&a[first + 64..first + 68], b"b.o/");
        assert_eq!(a.len(), first + 64 + 64);
    }

    #[test]
    fn long_names_are_refused() {
        let m = Member {
            name: "a_very_long_name.o".into(),
            data: vec![],
            symbols: vec![],
        };
        assert!(write(&[m]).is_err());
    }

    /// Where binutils is installed, `ar` reads the archive and `nm` its index.
    #[test]
    fn binutils_read_it() {
        if std::process::Command::new("ar")
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("skipped: no ar");
            return;
        }
        let dir = std::env::temp_dir().join(format!("tt-archive-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("libx.a");
        let bytes = write(&[Member {
            name: "k0.o".into(),
            data: b"not an object".to_vec(),
            symbols: vec!["tt_kernel".into()],
        }])
        .expect("archive");
        std::fs::write(&path, bytes).expect("write");
        let out = std::process::Command::new("ar")
            .arg("t")
            .arg(&path)
            .output()
            .expect("ar");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "k0.o");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
