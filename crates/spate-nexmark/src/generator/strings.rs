//! Random strings: names, descriptions, URLs and the padding of `extra`.

use crate::random::SplitMix;
use crate::text::SharedStr;

/// The shortest random string the spec draws.
const MIN_STRING_LENGTH: i32 = 3;

/// The length of the shared padding text (1 MiB, as in the spec); padding
/// shorter than half of it is a slice of it.
pub(crate) const PADDING_LENGTH: usize = 1024 * 1024;

/// A string of 3 to `max_length - 1` characters, each `special` with
/// probability 1/13 and otherwise a lower-case letter, with leading and
/// trailing blanks removed (the spec's `nextString`).
pub(crate) fn next_string(rng: &mut SplitMix, max_length: i32, special: char) -> String {
    let mut s = String::new();
    push_string(rng, max_length, special, &mut s);
    s
}

/// [`next_string`] appended to `out`, trimmed where it stands, so a field
/// made of several (an email address) is one allocation.
pub(crate) fn push_string(rng: &mut SplitMix, max_length: i32, special: char, out: &mut String) {
    let length = MIN_STRING_LENGTH + rng.next_int(max_length - MIN_STRING_LENGTH);
    let start = out.len();
    out.reserve(usize::try_from(length).unwrap_or(0));
    for _ in 0..length {
        if rng.next_int(13) == 0 {
            out.push(special);
        } else {
            out.push(letter(rng.next_int(26)));
        }
    }
    // Java's trim: every character up to and including the space.
    let is_blank = |c: char| c <= ' ';
    let end = start + out.get(start..).unwrap_or_default().trim_end_matches(is_blank).len();
    out.truncate(end);
    let kept = out.get(start..).unwrap_or_default().trim_start_matches(is_blank).len();
    out.drain(start..end - kept);
}

/// The letter `'a' + offset`; the offset may be negative (see
/// [`exact_string_from_draws`]), which gives the characters below `a`.
fn letter(offset: i32) -> char {
    char::from_u32(u32::try_from(i32::from(b'a') + offset).unwrap_or(u32::from(b'a'))).unwrap_or('a')
}

/// `length` characters made six at a time from one 32-bit draw, the
/// remainder by 26 each (the spec's `nextExactString` without the shared
/// text). The draw is signed and so is the remainder, so about half of the
/// characters fall in `H` to `` ` `` rather than `a` to `z`; the spec's
/// padding text is made this way.
pub(crate) fn exact_string_from_draws(rng: &mut SplitMix, length: usize) -> String {
    let mut s = String::with_capacity(length);
    let (mut draw, mut left) = (0i32, 0u32);
    for _ in 0..length {
        if left == 0 {
            draw = rng.next_i32();
            left = 6;
        }
        s.push(letter(draw % 26));
        draw /= 26;
        left -= 1;
    }
    s
}

/// `length` characters: a slice of the shared padding text at a random
/// offset when it is less than half as long (a reference, not a copy),
/// else made from draws.
pub(crate) fn next_exact_string(rng: &mut SplitMix, padding: &'static String, length: usize) -> SharedStr {
    if length < padding.len() / 2 {
        let room = i32::try_from(padding.len() - length).unwrap_or(i32::MAX);
        let offset = usize::try_from(rng.next_int(room)).unwrap_or(0);
        // The padding is ASCII, so any byte offset is a character boundary.
        return SharedStr::static_slice(padding, offset..offset + length);
    }
    SharedStr::from(exact_string_from_draws(rng, length))
}

/// Padding that brings an event of `current_size` to `desired_average` on
/// average: empty when the event is already larger; else uniform in the
/// remainder plus or minus a fifth (the spec's `nextExtra`).
pub(crate) fn next_extra(
    rng: &mut SplitMix,
    padding: &'static String,
    current_size: usize,
    desired_average: u32,
) -> SharedStr {
    let desired = usize::try_from(desired_average).unwrap_or(usize::MAX);
    if current_size > desired {
        return SharedStr::default();
    }
    let rest = desired - current_size;
    // Java's Math.round of a non-negative value rounds halves up, as f64::round does.
    let delta = (rest as f64 * 0.2).round() as usize;
    let min_size = rest - delta;
    let size = if delta == 0 {
        min_size
    } else {
        min_size + usize::try_from(rng.next_int(i32::try_from(2 * delta).unwrap_or(i32::MAX))).unwrap_or(0)
    };
    next_exact_string(rng, padding, size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_have_the_spec_lengths_and_alphabet() {
        let mut rng = SplitMix::new(1);
        for _ in 0..1_000 {
            let s = next_string(&mut rng, 20, ' ');
            assert!(s.len() <= 19, "{s:?}");
            assert!(!s.starts_with(' ') && !s.ends_with(' '), "{s:?}");
            assert!(s.chars().all(|c| c == ' ' || c.is_ascii_lowercase()), "{s:?}");
            let u = next_string(&mut rng, 5, '_');
            assert!((3..=4).contains(&u.len()), "{u:?}");
        }
    }

    #[test]
    fn padding_made_from_draws_spans_h_to_z() {
        let mut rng = SplitMix::new(2);
        let s = exact_string_from_draws(&mut rng, 10_000);
        assert_eq!(s.len(), 10_000);
        assert!(s.bytes().all(|b| (b'H'..=b'z').contains(&b)));
        assert!(s.bytes().any(|b| b < b'a') && s.bytes().any(|b| b >= b'a'));
    }

    #[test]
    fn extra_pads_to_the_average_within_a_fifth() {
        let mut rng = SplitMix::new(3);
        let padding: &'static String = Box::leak(Box::new(exact_string_from_draws(&mut rng, 4096)));
        // 100 - 32 = 68 to pad; a fifth is 13.6, rounded to 14: 54 to 81.
        let sizes: Vec<usize> = (0..2_000).map(|_| next_extra(&mut rng, padding, 32, 100).len()).collect();
        assert!(sizes.iter().all(|s| (54..=81).contains(s)), "{:?}", sizes.iter().max());
        assert!(sizes.contains(&54) && sizes.contains(&81));
        assert_eq!(next_extra(&mut rng, padding, 101, 100), "");
        assert_eq!(next_extra(&mut rng, padding, 100, 100), "");
    }
}
