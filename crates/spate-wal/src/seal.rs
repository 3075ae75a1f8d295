//! Seals: what a fenced writer found of the earlier epochs' segments when
//! it took over a log, so that bytes a stale writer appends later are
//! never read back in order.
//!
//! A writer of epoch `E > 0` writes `seal-e<E>` once, on its first open of
//! the directory, before it appends anything: the name and valid length of
//! every segment of an earlier epoch it will read. From then on the ordered
//! reads of any writer of epoch `E` or later read such a segment only up to
//! its sealed length, and skip earlier-epoch segments the seal does not
//! list (a stale writer created them after the takeover).
//!
//! The file is written atomically and never replaced: a temporary file,
//! synced, is linked to its final name (which fails if it exists) and the
//! directory is synced. Its format, all integers little-endian:
//!
//! ```text
//! 0..8    magic "SPWLSEAL"
//! 8..12   version (1)
//! 12..20  the sealing writer's epoch
//! 20..24  number of entries
//!         per entry: name length (u16), name (UTF-8), sealed length (u64)
//! last 4  CRC32C of every byte before it
//! ```

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::WalError;
use crate::files::FileLayer;
use crate::segment::parse_segment_name;

const MAGIC: &[u8; 8] = b"SPWLSEAL";
const VERSION: u32 = 1;
/// The largest seal read: far more than the segments of any real log.
const MAX_SEAL_BYTES: u64 = 16 << 20;
const SEAL_PREFIX: &str = "seal-e";

/// The file name of the seal of `epoch`.
pub(crate) fn seal_name(epoch: u64) -> String {
    format!("{SEAL_PREFIX}{epoch}")
}

/// The epoch in a seal's file name, or `None` for any other file.
pub(crate) fn parse_seal_name(name: &str) -> Option<u64> {
    let epoch = name.strip_prefix(SEAL_PREFIX)?.parse().ok()?;
    (seal_name(epoch) == name).then_some(epoch)
}

/// The name of the temporary file a seal is written to first.
pub(crate) fn seal_temp_name(epoch: u64) -> String {
    format!(".{}.tmp", seal_name(epoch))
}

/// The epoch in a seal's temporary file name, or `None` for any other file.
pub(crate) fn parse_seal_temp_name(name: &str) -> Option<u64> {
    let epoch = parse_seal_name(name.strip_prefix('.')?.strip_suffix(".tmp")?)?;
    (seal_temp_name(epoch) == name).then_some(epoch)
}

/// A seal: the earlier epochs' segments a writer reads, and how far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Seal {
    pub(crate) epoch: u64,
    /// Segment file name → valid length in bytes.
    pub(crate) segments: BTreeMap<String, u64>,
}

impl Seal {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(28 + self.segments.len() * 40);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&VERSION.to_le_bytes());
        bytes.extend_from_slice(&self.epoch.to_le_bytes());
        // Segment names are short and their number bounded by the directory.
        bytes.extend_from_slice(&(self.segments.len() as u32).to_le_bytes());
        for (name, len) in &self.segments {
            bytes.extend_from_slice(&(name.len() as u16).to_le_bytes());
            bytes.extend_from_slice(name.as_bytes());
            bytes.extend_from_slice(&len.to_le_bytes());
        }
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Decodes a seal, checking its magic, version, checksum, and that
    /// every entry names a segment of an earlier epoch.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Seal, String> {
        let (body, crc) = bytes.split_last_chunk::<4>().ok_or("shorter than a checksum")?;
        let computed = crc32c::crc32c(body);
        if u32::from_le_bytes(*crc) != computed {
            return Err(format!(
                "checksum mismatch (stored {:#010x}, computed {computed:#010x})",
                u32::from_le_bytes(*crc)
            ));
        }
        let mut input = Input(body);
        if input.take(MAGIC.len())? != MAGIC {
            return Err(String::from("not a seal (bad magic)"));
        }
        let version = u32::from_le_bytes(input.array()?);
        if version != VERSION {
            return Err(format!("unknown version {version} (this build reads version {VERSION})"));
        }
        let epoch = u64::from_le_bytes(input.array()?);
        let count = u32::from_le_bytes(input.array()?);
        let mut segments = BTreeMap::new();
        for _ in 0..count {
            let name_len = u16::from_le_bytes(input.array()?);
            let name = std::str::from_utf8(input.take(usize::from(name_len))?)
                .map_err(|_| String::from("a segment name is not UTF-8"))?;
            let len = u64::from_le_bytes(input.array()?);
            match parse_segment_name(name) {
                Some(id) if id.epoch < epoch => {}
                _ => return Err(format!("{name:?} is not a segment of an epoch before {epoch}")),
            }
            if segments.insert(name.to_owned(), len).is_some() {
                return Err(format!("{name} is listed twice"));
            }
        }
        if !input.0.is_empty() {
            return Err(format!("{} bytes after the last entry", input.0.len()));
        }
        Ok(Seal { epoch, segments })
    }
}

/// The unread rest of a seal being decoded.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(String::from("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.take(N)?);
        Ok(array)
    }
}

/// Reads and checks the seal at `path`.
pub(crate) fn read_seal(files: &dyn FileLayer, path: &Path) -> Result<Seal, WalError> {
    let file = files.open_read(path).map_err(WalError::io("open", path))?;
    let mut bytes = Vec::new();
    file.take(MAX_SEAL_BYTES + 1).read_to_end(&mut bytes).map_err(WalError::io("read", path))?;
    let bad = |reason: String| WalError::BadSeal { path: path.to_path_buf(), reason };
    if bytes.len() as u64 > MAX_SEAL_BYTES {
        return Err(bad(format!("larger than {MAX_SEAL_BYTES} bytes")));
    }
    Seal::decode(&bytes).map_err(bad)
}

/// Writes `seal` into `dir` atomically, never over an existing seal, and
/// makes it durable; returns its path.
pub(crate) fn write_seal(files: &dyn FileLayer, dir: &Path, seal: &Seal) -> Result<PathBuf, WalError> {
    let temp = dir.join(seal_temp_name(seal.epoch));
    let path = dir.join(seal_name(seal.epoch));
    // A leftover of a crash of this epoch's writer, which is the only one
    // that writes this name.
    match files.remove(&temp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(WalError::Io { op: "remove", path: temp, source: e }),
    }
    files.create_new(&temp, &seal.encode()).map_err(WalError::io("write", &temp))?;
    files.link(&temp, &path).map_err(WalError::io("link", &path))?;
    files.remove(&temp).map_err(WalError::io("remove", &temp))?;
    files.sync_dir(dir).map_err(WalError::io("fsync directory", dir))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Seal {
        let segments = [("log-0-1000".to_owned(), 4096), ("log-1000-2000-e3".to_owned(), 12)].into_iter().collect();
        Seal { epoch: 4, segments }
    }

    #[test]
    fn seals_round_trip_and_names_parse_exactly() {
        assert_eq!(Seal::decode(&sample().encode()), Ok(sample()));
        assert_eq!(parse_seal_name(&seal_name(7)), Some(7));
        assert_eq!(parse_seal_temp_name(&seal_temp_name(7)), Some(7));
        for name in ["seal-e", "seal-e07", "seal-e1.tmp", "seal-7", ".seal-e1", "log-1-2"] {
            assert_eq!(parse_seal_name(name), None, "{name}");
        }
    }

    #[test]
    fn damaged_or_inconsistent_seals_are_refused() {
        let bytes = sample().encode();
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x40;
            assert!(Seal::decode(&damaged).is_err(), "flip at {at}");
        }
        for len in 0..bytes.len() {
            assert!(Seal::decode(&bytes[..len]).is_err(), "cut at {len}");
        }
        // A seal may only list earlier epochs' segments.
        let mut seal = sample();
        seal.segments.insert("log-0-1-e4".to_owned(), 1);
        assert!(Seal::decode(&seal.encode()).unwrap_err().contains("log-0-1-e4"));
        // A later version is named as such.
        let mut later = sample().encode();
        later[8] = 2;
        let body = later.len() - 4;
        let crc = crc32c::crc32c(&later[..body]);
        later[body..].copy_from_slice(&crc.to_le_bytes());
        assert!(Seal::decode(&later).unwrap_err().contains("version 2"));
    }
}
