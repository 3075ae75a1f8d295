//! The pseudo-random numbers behind every generated field.
//!
//! The Nexmark generator draws from `java.util.SplittableRandom`, whose
//! algorithm is SplitMix64 (Steele, Lea and Flood, "Fast splittable
//! pseudorandom number generators", OOPSLA 2014): a 64-bit counter advanced
//! by a fixed odd "gamma" and a mixing function of the counter. [`SplitMix`]
//! is that algorithm with the same bounded draws (`nextInt(bound)` with its
//! rejection rule, `nextDouble` from the top 53 bits), so the distributions
//! the spec's formulas assume are the ones drawn here.
//!
//! Unlike the Java generator, which draws every event from one unseeded
//! stream, each event here gets its own stream derived from the generator's
//! seed and the event's id ([`SplitMix::for_event`]): any event can be
//! generated again from its position alone, which is what a replayable
//! source needs.

/// The increment of a SplittableRandom built from a seed (the golden ratio).
const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// Separates the streams of the shared tables from every event's stream.
const TABLES_STREAM: u64 = 0x6e65_786d_6172_6b31;

/// Stafford's variant 13 of the MurmurHash3 finaliser, as SplitMix64 mixes.
pub(crate) fn mix64(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The 32-bit mix of SplittableRandom (the high half of a second finaliser).
fn mix32(z: u64) -> i32 {
    let z = (z ^ (z >> 33)).wrapping_mul(0x62a9_d9ed_7997_05f5);
    // The high 32 bits, reinterpreted as a signed int as Java does.
    ((z ^ (z >> 28)).wrapping_mul(0xcb24_d0a5_c88c_35b3) >> 32) as u32 as i32
}

/// A SplitMix64 stream with SplittableRandom's draws.
#[derive(Clone, Debug)]
pub(crate) struct SplitMix {
    state: u64,
}

impl SplitMix {
    /// The stream `new SplittableRandom(seed)` draws.
    pub(crate) fn new(seed: u64) -> Self {
        SplitMix { state: seed }
    }

    /// The stream of one event: a function of the generator's seed and the
    /// event's id only. Both are mixed before use, so the streams of
    /// neighbouring ids are unrelated (seeds a multiple of the gamma apart
    /// would give overlapping streams).
    pub(crate) fn for_event(seed: u64, event_id: i64) -> Self {
        SplitMix::new(mix64(seed ^ mix64((event_id as u64).wrapping_add(GOLDEN_GAMMA))))
    }

    /// The stream the shared tables (hot URLs, channels, padding text) are
    /// drawn from, `index` telling the tables apart.
    pub(crate) fn for_tables(seed: u64, index: u64) -> Self {
        SplitMix::new(mix64(seed ^ mix64(TABLES_STREAM.wrapping_add(index))))
    }

    fn next_seed(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        self.state
    }

    /// `nextLong()`: any 64-bit value.
    pub(crate) fn next_i64(&mut self) -> i64 {
        mix64(self.next_seed()) as i64
    }

    /// `nextInt()`: any 32-bit value.
    pub(crate) fn next_i32(&mut self) -> i32 {
        mix32(self.next_seed())
    }

    /// `nextInt(bound)`: uniform in `0..bound`. A power of two masks; any
    /// other bound rejects the draws of the incomplete last block, exactly
    /// as Java's rule does (the sum may overflow; a negative sum rejects).
    /// A bound below one is taken as one.
    pub(crate) fn next_int(&mut self, bound: i32) -> i32 {
        let bound = bound.max(1);
        let mut r = self.next_i32();
        let m = bound - 1;
        if bound & m == 0 {
            return r & m;
        }
        let mut u = ((r as u32) >> 1) as i32;
        loop {
            r = u % bound;
            if u.wrapping_add(m).wrapping_sub(r) >= 0 {
                return r;
            }
            u = ((self.next_i32() as u32) >> 1) as i32;
        }
    }

    /// `nextDouble()`: uniform in `[0, 1)` from the top 53 bits.
    pub(crate) fn next_double(&mut self) -> f64 {
        (mix64(self.next_seed()) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// The spec's `LongGenerator.nextLong(random, n)`: `nextInt(n)` when `n`
    /// fits an int, else `|nextLong() % n|` (skewed, as the spec says).
    /// `n` below one is taken as one.
    pub(crate) fn next_long(&mut self, n: i64) -> i64 {
        let n = n.max(1);
        if n < i64::from(i32::MAX) {
            // n < i32::MAX, so the conversion cannot fail.
            i64::from(self.next_int(i32::try_from(n).unwrap_or(i32::MAX)))
        } else {
            (self.next_i64() % n).wrapping_abs()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published SplitMix64 outputs for seed 0 (the reference C code of
    /// the algorithm, and `new SplittableRandom(0).nextLong()` in Java).
    #[test]
    fn seed_zero_gives_the_published_splitmix64_outputs() {
        let mut r = SplitMix::new(0);
        assert_eq!(r.next_i64() as u64, 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_i64() as u64, 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(r.next_i64() as u64, 0x06c4_5d18_8009_454f);
    }

    /// Values printed by Java 17's `new SplittableRandom(seed)` with the
    /// same sequence of calls (`nextInt(13)`, `nextInt(26)`, `nextInt(4)`,
    /// `nextInt(10000)`, `nextInt(Integer.MAX_VALUE)`, `nextInt()`,
    /// `nextLong()`, `nextDouble()`, then the spec's price
    /// `Math.round(Math.pow(10.0, nextDouble() * 6.0) * 100.0)`).
    #[test]
    fn draws_match_java_splittable_random() {
        let mut r = SplitMix::new(12345);
        assert_eq!(r.next_int(13), 2);
        assert_eq!(r.next_int(26), 7);
        assert_eq!(r.next_int(4), 2);
        assert_eq!(r.next_int(10_000), 998);
        assert_eq!(r.next_int(i32::MAX), 493_042_293);
        assert_eq!(r.next_i32(), -1_013_877_753);
        assert_eq!(r.next_i64(), 2_262_534_019_502_804_546);
        assert_eq!(r.next_double(), 0.43145857388310627);
        assert_eq!(crate::generator::next_price(&mut r), 75_634);
        // A bound of 1.5e9 rejects about 30% of the draws: Java's rule for
        // which ones, and what is drawn instead, is followed.
        let mut r = SplitMix::new(7);
        let draws: Vec<i32> = (0..8).map(|_| r.next_int(1_500_000_000)).collect();
        assert_eq!(draws, [1332694696, 349607553, 784385053, 493486521, 1158536205, 527000107, 1241217191, 884477684]);
    }

    #[test]
    fn bounded_ints_stay_in_bounds_and_cover_them() {
        let mut r = SplitMix::new(42);
        for bound in [1, 2, 3, 7, 13, 26, 100, 10_000, i32::MAX] {
            let mut seen_low = false;
            for _ in 0..2_000 {
                let v = r.next_int(bound);
                assert!((0..bound).contains(&v), "{v} not in 0..{bound}");
                seen_low |= v < bound / 2 + 1;
            }
            assert!(seen_low, "bound {bound}: never drew the lower half");
        }
        let mut counts = [0u32; 13];
        for _ in 0..13_000 {
            counts[usize::try_from(r.next_int(13)).unwrap()] += 1;
        }
        // Each value expects 1000 draws; 800 is more than 6 standard deviations away.
        assert!(counts.iter().all(|&c| c > 800), "{counts:?}");
    }

    #[test]
    fn doubles_are_in_the_unit_interval() {
        let mut r = SplitMix::new(7);
        let draws: Vec<f64> = (0..10_000).map(|_| r.next_double()).collect();
        assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
    }

    #[test]
    fn long_draws_follow_the_spec_on_both_sides_of_the_int_range() {
        let mut r = SplitMix::new(3);
        for _ in 0..1_000 {
            assert!((0..1_000).contains(&r.next_long(1_000)));
            let big = i64::from(i32::MAX) * 4;
            assert!((0..big).contains(&r.next_long(big)));
        }
        assert_eq!(r.next_long(0), 0);
    }

    #[test]
    fn event_streams_differ_by_seed_and_by_event() {
        let draw = |seed, id| SplitMix::for_event(seed, id).next_i64();
        assert_eq!(draw(1, 5), draw(1, 5));
        assert_ne!(draw(1, 5), draw(1, 6));
        assert_ne!(draw(1, 5), draw(2, 5));
    }
}
