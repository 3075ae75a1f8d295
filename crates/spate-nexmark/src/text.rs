//! [`SharedStr`]: an immutable string that many events share instead of
//! each owning a copy.
//!
//! Most of an event's text comes from tables the generator draws once per
//! seed: a bid's channel and URL are one of ten thousand, and every `extra`
//! is a slice of one megabyte of padding text. Owned `String`s made each
//! bid pay three allocations for copies of those (made on the generator's
//! threads and freed on the workers', the slow path of most `malloc`s). The
//! tables live as long as the process, so a [`SharedStr`] of the generator
//! is a plain reference into them: making, moving, cloning and dropping it
//! touches neither the allocator nor a reference count. A text from
//! elsewhere (read back from a checkpoint, built by hand) is held in an
//! `Arc<str>`, so that cloning it copies nothing either.
//!
//! It behaves as the text it holds: it derefs to `str`, compares, orders
//! and hashes by content (as `String` does, so it may key a map looked up
//! by `&str`), prints and debugs as the text, and serializes as a plain
//! string. Read back, a string becomes a [`SharedStr`] of its own.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::{Deref, Range};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An immutable string: a reference to text that lives as long as the
/// process, or a shared `Arc<str>` (see the module docs). Cloning it copies
/// no text.
///
/// ```
/// use spate_nexmark::SharedStr;
///
/// let channel = SharedStr::from_static("Google");
/// assert_eq!(channel, "Google");
/// assert_eq!(channel.len(), 6);
/// assert_eq!(serde_json::to_string(&channel).unwrap(), "\"Google\"");
/// assert_eq!(SharedStr::from(String::from("Google")), channel);
/// ```
#[derive(Clone)]
pub struct SharedStr(Repr);

/// Each shape is 16 bytes, so the handle is as large as a `String`.
#[derive(Clone)]
enum Repr {
    /// Text that lives as long as the process: a literal, or an entry of
    /// the generator's tables.
    Static(&'static str),
    /// The bytes `start..end` of a text that lives as long as the process,
    /// cut when read: a slice of the padding is made without reading the
    /// padding, which most queries never do.
    StaticSlice { text: &'static String, start: u32, end: u32 },
    /// Any other text.
    Shared(Arc<str>),
}

impl SharedStr {
    /// `text`, by reference: no allocation.
    pub const fn from_static(text: &'static str) -> SharedStr {
        SharedStr(Repr::Static(text))
    }

    /// The bytes `range` of `text`, cut when read; the range is not checked
    /// here, so it must fall on character boundaries within `text` (an
    /// ASCII text's are all), else the slice reads as the empty string. A
    /// range past 4 GiB is cut at once.
    pub(crate) fn static_slice(text: &'static String, range: Range<usize>) -> SharedStr {
        match (u32::try_from(range.start), u32::try_from(range.end)) {
            (Ok(start), Ok(end)) => SharedStr(Repr::StaticSlice { text, start, end }),
            _ => SharedStr::from_static(text.get(range).unwrap_or_default()),
        }
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Static(text) => text,
            Repr::StaticSlice { text, start, end } => text.get(*start as usize..*end as usize).unwrap_or_default(),
            Repr::Shared(text) => text,
        }
    }
}

impl Deref for SharedStr {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for SharedStr {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

/// Hash and equality are the text's, so a map keyed by `SharedStr` may be
/// looked up by `&str`.
impl Borrow<str> for SharedStr {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl Default for SharedStr {
    /// The empty string.
    fn default() -> Self {
        SharedStr::from_static("")
    }
}

impl From<&str> for SharedStr {
    /// A shared copy of `text` (see [`SharedStr::from_static`] for a
    /// literal).
    fn from(text: &str) -> Self {
        SharedStr(Repr::Shared(Arc::from(text)))
    }
}

impl From<String> for SharedStr {
    fn from(text: String) -> Self {
        SharedStr(Repr::Shared(Arc::from(text)))
    }
}

impl From<Arc<str>> for SharedStr {
    fn from(text: Arc<str>) -> Self {
        SharedStr(Repr::Shared(text))
    }
}

impl From<SharedStr> for String {
    fn from(text: SharedStr) -> Self {
        text.as_str().to_string()
    }
}

impl PartialEq for SharedStr {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for SharedStr {}

impl PartialEq<str> for SharedStr {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for SharedStr {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for SharedStr {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<SharedStr> for str {
    fn eq(&self, other: &SharedStr) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<SharedStr> for &str {
    fn eq(&self, other: &SharedStr) -> bool {
        *self == other.as_str()
    }
}

impl PartialEq<SharedStr> for String {
    fn eq(&self, other: &SharedStr) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialOrd for SharedStr {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SharedStr {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Hash for SharedStr {
    /// As `str` hashes, which `Borrow<str>` requires.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl fmt::Debug for SharedStr {
    /// As the text's `Debug`: quoted and escaped.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for SharedStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl Serialize for SharedStr {
    /// As a plain string, exactly as a `String` of the same text.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for SharedStr {
    /// A plain string, into a `SharedStr` of its own.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(SharedStr::from)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::collections::hash_map::DefaultHasher;

    use super::*;

    fn hash_of<T: Hash + ?Sized>(value: &T) -> u64 {
        let mut hasher = DefaultHasher::new();
        value.hash(&mut hasher);
        hasher.finish()
    }

    /// A text that lives as long as the process, as the generator's tables do.
    fn leaked(text: &str) -> &'static String {
        Box::leak(Box::new(text.to_string()))
    }

    #[test]
    fn every_shape_is_its_text_in_every_comparison() {
        let slice = SharedStr::static_slice(leaked("hello, world"), 7..12);
        let shared = SharedStr::from("world");
        let literal = SharedStr::from_static("world");
        for text in [&slice, &shared, &literal] {
            assert_eq!(text.as_str(), "world");
            assert_eq!(*text, slice);
            assert_eq!(hash_of(text), hash_of("world"));
            assert_eq!(format!("{text:?} {text:>7}"), "\"world\"   world");
        }
        let world = String::from("world");
        assert_eq!(slice, "world");
        assert_eq!("world", slice);
        assert_eq!(slice, world);
        assert_eq!(world, slice);
        assert_eq!(SharedStr::from_static("hello").cmp(&slice), "hello".cmp("world"));
        let mut counts: HashMap<SharedStr, u32> = HashMap::new();
        counts.insert(slice, 1);
        assert_eq!(counts.get("world"), Some(&1));
        assert_eq!(SharedStr::default(), "");
        assert_eq!(std::mem::size_of::<SharedStr>(), std::mem::size_of::<String>());
    }

    #[test]
    fn a_slice_off_its_text_or_its_boundaries_reads_empty() {
        let text = leaked("a\u{f1}b");
        assert_eq!(SharedStr::static_slice(text, 1..3), "\u{f1}");
        assert_eq!(SharedStr::static_slice(text, 0..5), "");
        assert_eq!(SharedStr::static_slice(text, 2..3), "", "inside the two bytes of the tilde n");
        assert_eq!(SharedStr::static_slice(text, Range { start: 3, end: 1 }), "", "backwards");
    }

    #[test]
    fn it_serializes_as_the_string_and_reads_back() {
        let slice = SharedStr::static_slice(leaked("x\"quoted\" \u{e9}y"), 1..12);
        assert_eq!(slice, "\"quoted\" \u{e9}");
        let json = serde_json::to_string(&slice).unwrap();
        assert_eq!(json, serde_json::to_string(&slice.to_string()).unwrap());
        let back: SharedStr = serde_json::from_str(&json).unwrap();
        assert_eq!(back, slice);
    }
}
