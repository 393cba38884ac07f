//! The CPU caches: how large the last level is, and evicting buffers from them between runs
//! of a kernel so that a timing does not credit it with data an earlier run left behind.

use std::sync::OnceLock;

/// The size of the largest cache cpu0 reports (`/sys/devices/system/cpu/cpu0/cache`), read
/// once per process; `None` where the system does not say.
pub fn last_level_cache_bytes() -> Option<usize> {
    static LLC: OnceLock<Option<usize>> = OnceLock::new();
    *LLC.get_or_init(|| {
        let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
        dir.flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("size")).ok())
            .filter_map(|s| parse_cache_size(s.trim()))
            .max()
    })
}

/// The most of the last-level cache a kernel is taken to have to itself (32 MiB): where a
/// machine reports more, the cache is a server socket's, shared by dozens of cores (a
/// virtual machine sees the host's whole cache: 480 MiB on one of ours, with two cores of
/// it). A kernel whose buffers are larger than a core's share cannot count on finding them
/// there between runs, nor on an output of that size staying there for its consumer.
pub const LAST_LEVEL_CACHE_SHARE_BYTES: usize = 32 << 20;

/// The last-level cache a kernel can count on: [`last_level_cache_bytes`], at most
/// [`LAST_LEVEL_CACHE_SHARE_BYTES`]. What the timings' cache flush
/// ([`CacheFlush::PastLastLevel`]) and the code generator's non-temporal stores
/// (`CodegenOptions::nontemporal_past_bytes`) take as the cache's size.
pub fn usable_last_level_cache_bytes() -> Option<usize> {
    last_level_cache_bytes().map(|b| b.min(LAST_LEVEL_CACHE_SHARE_BYTES))
}

/// `32768K`, `1M`, `512` (bytes) as sysfs writes them.
pub(crate) fn parse_cache_size(s: &str) -> Option<usize> {
    let (num, mult) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1usize << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok()?.checked_mul(mult)
}

/// When a timing evicts the kernel's buffers from the caches before each run.
///
/// Back-to-back runs of a kernel whose buffers are larger than the last-level cache still
/// find part of them cached from the run before (a 64 MiB `reduce_sum` on a machine with a
/// 32 MiB L3 came out at 1.2x the probe's DRAM bandwidth), which no real use of so large an
/// operand does; buffers that fit in the cache stay there between runs in real use too (the
/// layer before wrote them), so timing those warm is the honest figure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CacheFlush {
    /// Never evict: every run after the first finds what fits in the caches.
    Never,
    /// Evict before every run when the kernel's buffers together are larger than the
    /// last-level cache a kernel can count on ([`usable_last_level_cache_bytes`]; 32 MiB
    /// where unknown).
    #[default]
    PastLastLevel,
    /// Evict before every run.
    Always,
}

/// The last-level cache assumed where the system does not report one: the largest of the
/// desktop and server parts we tune on (a smaller guess would flush more, which is only
/// slower).
const UNKNOWN_LLC_BYTES: usize = 32 << 20;

impl CacheFlush {
    /// Whether runs over buffers of `bytes` in all are preceded by an eviction.
    pub fn applies(self, bytes: usize) -> bool {
        match self {
            CacheFlush::Never => false,
            CacheFlush::Always => true,
            CacheFlush::PastLastLevel => {
                bytes > usable_last_level_cache_bytes().unwrap_or(UNKNOWN_LLC_BYTES)
            }
        }
    }

    /// The policy's name on the command line: `never`, `past-llc` or `always`.
    pub fn name(self) -> &'static str {
        match self {
            CacheFlush::Never => "never",
            CacheFlush::PastLastLevel => "past-llc",
            CacheFlush::Always => "always",
        }
    }

    /// The policy of a [`CacheFlush::name`].
    pub fn parse(s: &str) -> Option<CacheFlush> {
        [
            CacheFlush::Never,
            CacheFlush::PastLastLevel,
            CacheFlush::Always,
        ]
        .into_iter()
        .find(|p| p.name() == s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("32768K"), Some(32 << 20));
        assert_eq!(parse_cache_size("1M"), Some(1 << 20));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("K"), None);
        assert_eq!(parse_cache_size("x1K"), None);
        assert_eq!(parse_cache_size("12X"), None);
        assert_eq!(parse_cache_size(""), None);
        assert_eq!(parse_cache_size("48K"), Some(48 << 10));
    }

    #[test]
    fn the_policy_flushes_what_the_cache_cannot_hold() {
        let llc = usable_last_level_cache_bytes().unwrap_or(UNKNOWN_LLC_BYTES);
        assert!(llc <= LAST_LEVEL_CACHE_SHARE_BYTES.max(UNKNOWN_LLC_BYTES));
        if let Some(reported) = last_level_cache_bytes() {
            assert_eq!(llc, reported.min(LAST_LEVEL_CACHE_SHARE_BYTES));
        }
        assert!(!CacheFlush::PastLastLevel.applies(llc));
        assert!(CacheFlush::PastLastLevel.applies(llc + 1));
        assert!(CacheFlush::Always.applies(64));
        assert!(!CacheFlush::Never.applies(usize::MAX));
        for p in [
            CacheFlush::Never,
            CacheFlush::PastLastLevel,
            CacheFlush::Always,
        ] {
            assert_eq!(CacheFlush::parse(p.name()), Some(p));
        }
        assert_eq!(CacheFlush::parse("sometimes"), None);
    }
}
