//! [`SharedStr`]: an immutable string that many events share instead of
//! each owning a copy.
//!
//! Most of an event's text comes from tables the generator draws once: a
//! bid's channel and URL are one of ten thousand, and every `extra` is a
//! slice of one megabyte of padding text. Owned `String`s made each event
//! pay three allocations for copies of those (made on the generator's
//! threads and freed on the workers', the slow path of most `malloc`s). A
//! [`SharedStr`] is a reference-counted handle to a table entry, or to a
//! slice of the padding, so making and dropping one costs a counter.
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

/// An immutable string shared by reference count: a whole `Arc<str>`, or a
/// slice of one (see the module docs). Cloning it copies no text.
///
/// ```
/// use std::sync::Arc;
/// use spate_nexmark::SharedStr;
///
/// let padding: Arc<str> = Arc::from("abcdefgh");
/// let slice = SharedStr::slice(&padding, 2..5).unwrap();
/// assert_eq!(slice, "cde");
/// assert_eq!(slice.len(), 3);
/// assert_eq!(serde_json::to_string(&slice).unwrap(), "\"cde\"");
/// assert_eq!(SharedStr::from("cde"), slice);
/// ```
#[derive(Clone)]
pub struct SharedStr(Repr);

/// Two shapes, so that a whole string needs no bounds (and so has no limit
/// on its length) while a slice keeps its bounds in 32 bits each: either
/// way the handle is as large as a `String`.
#[derive(Clone)]
enum Repr {
    Whole(Arc<str>),
    Slice { text: Arc<str>, start: u32, end: u32 },
}

impl SharedStr {
    /// The whole of `text`, shared.
    pub fn new(text: Arc<str>) -> SharedStr {
        SharedStr(Repr::Whole(text))
    }

    /// The bytes `range` of `text`, shared; `None` when the range is out of
    /// bounds, does not fall on character boundaries, or ends past 4 GiB.
    pub fn slice(text: &Arc<str>, range: Range<usize>) -> Option<SharedStr> {
        text.get(range.clone())?;
        let start = u32::try_from(range.start).ok()?;
        let end = u32::try_from(range.end).ok()?;
        Some(SharedStr(Repr::Slice { text: Arc::clone(text), start, end }))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Whole(text) => text,
            // The bounds were checked when the slice was made, and the text
            // behind an `Arc<str>` never changes.
            Repr::Slice { text, start, end } => text.get(*start as usize..*end as usize).unwrap_or_default(),
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
        SharedStr::new(Arc::from(""))
    }
}

impl From<&str> for SharedStr {
    fn from(text: &str) -> Self {
        SharedStr::new(Arc::from(text))
    }
}

impl From<String> for SharedStr {
    fn from(text: String) -> Self {
        SharedStr::new(Arc::from(text))
    }
}

impl From<Arc<str>> for SharedStr {
    fn from(text: Arc<str>) -> Self {
        SharedStr::new(text)
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

    #[test]
    fn a_slice_is_its_text_in_every_comparison() {
        let text: Arc<str> = Arc::from("hello, world");
        let slice = SharedStr::slice(&text, 7..12).unwrap();
        let owned = SharedStr::from("world");
        assert_eq!(slice.as_str(), "world");
        assert_eq!(slice, owned);
        assert_eq!(hash_of(&slice), hash_of(&owned));
        assert_eq!(hash_of(&slice), hash_of("world"));
        let world = String::from("world");
        assert_eq!(slice, "world");
        assert_eq!("world", slice);
        assert_eq!(slice, world);
        assert_eq!(world, slice);
        assert_eq!(SharedStr::slice(&text, 0..5).unwrap().cmp(&slice), "hello".cmp("world"));
        assert_eq!(format!("{slice:?} {slice:>7}"), "\"world\"   world");
        let mut counts: HashMap<SharedStr, u32> = HashMap::new();
        counts.insert(slice, 1);
        assert_eq!(counts.get("world"), Some(&1));
        assert_eq!(SharedStr::default(), "");
        assert_eq!(String::from(SharedStr::slice(&text, 0..0).unwrap()), "");
    }

    #[test]
    fn bad_ranges_make_no_slice() {
        let text: Arc<str> = Arc::from("añb");
        assert!(SharedStr::slice(&text, 0..5).is_none());
        assert!(SharedStr::slice(&text, 2..3).is_none(), "inside the two bytes of ñ");
        assert!(SharedStr::slice(&text, Range { start: 3, end: 1 }).is_none(), "backwards");
        assert_eq!(SharedStr::slice(&text, 1..3).unwrap(), "ñ");
    }

    #[test]
    fn it_serializes_as_the_string_and_reads_back() {
        let text: Arc<str> = Arc::from("x\"quoted\" \u{e9}y");
        let slice = SharedStr::slice(&text, 1..text.len() - 1).unwrap();
        let json = serde_json::to_string(&slice).unwrap();
        assert_eq!(json, serde_json::to_string(&slice.to_string()).unwrap());
        let back: SharedStr = serde_json::from_str(&json).unwrap();
        assert_eq!(back, slice);
    }
}
