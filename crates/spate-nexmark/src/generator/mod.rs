//! The generator: any event from its position, deterministically.
//!
//! The event at position `p` (the count of events before it) has event
//! number `first_event_number + p`, shuffled within its out-of-order group;
//! its id is `first_event_id` plus that number; `id mod 50` decides the
//! kind (0 a person, 1 to 3 an auction, 4 to 49 a bid, with the default
//! proportions); its time is the base time plus the number times the
//! inter-event delay; and its random fields are drawn from a stream seeded
//! by the generator's seed and the id.

mod auction;
mod bid;
mod person;
mod strings;

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::{Mutex, OnceLock};

use spate_core::sync::lock;

use crate::error::NexmarkError;
use crate::model::{Event, EventKind};
use crate::random::SplitMix;
use crate::settings::GeneratorSettings;
use crate::text::SharedStr;

/// Channels that most bids come from, with one URL each.
const HOT_CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];
/// The other channels, `channel-0` to `channel-9999`.
const CHANNELS_NUMBER: usize = 10_000;

/// What every event shares: drawn once from the seed, and kept for the
/// life of the process ([`Tables::of`]), so that events refer to these
/// texts without copying or counting them (see [`SharedStr`]).
struct Tables {
    seed: u64,
    /// The URL of each hot channel.
    hot_urls: [String; 4],
    /// The name and URL of each other channel.
    channels: Vec<(String, String)>,
    /// The padding text that `extra` fields are slices of (ASCII).
    padding: String,
}

impl fmt::Debug for Tables {
    /// Which seed's: the megabyte of padding is not worth printing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tables").field("seed", &self.seed).finish_non_exhaustive()
    }
}

/// The tables of every seed a generator of this process was made for.
static TABLES: OnceLock<Mutex<HashMap<u64, &'static Tables>>> = OnceLock::new();

/// A random URL of the spec's shape:
/// `https://www.nexmark.com/xxx/yyy/zzz/item.htm?query=1`.
fn base_url(rng: &mut SplitMix) -> String {
    let mut parts = (0..3).map(|_| strings::next_string(rng, 5, '_'));
    let (a, b, c) = (parts.next(), parts.next(), parts.next());
    format!(
        "https://www.nexmark.com/{}/{}/{}/item.htm?query=1",
        a.unwrap_or_default(),
        b.unwrap_or_default(),
        c.unwrap_or_default()
    )
}

impl Tables {
    /// As the spec's static tables are made, in the same order of draws,
    /// but from the seed: four hot URLs, then each channel's URL, nine in
    /// ten of them with `&channel_id=` and the channel's number with its 32
    /// bits reversed (as a signed int, its absolute value; Java's `abs`
    /// leaves the smallest int negative, and so does this).
    fn new(seed: u64) -> Tables {
        let mut rng = SplitMix::for_tables(seed, 0);
        let hot_urls = std::array::from_fn(|_| base_url(&mut rng));
        let channels = (0..CHANNELS_NUMBER)
            .map(|i| {
                let mut url = base_url(&mut rng);
                if rng.next_int(10) > 0 {
                    let reversed = (i as i32).reverse_bits().wrapping_abs();
                    url.push_str(&format!("&channel_id={reversed}"));
                }
                (format!("channel-{i}"), url)
            })
            .collect();
        let padding = strings::exact_string_from_draws(&mut SplitMix::for_tables(seed, 1), strings::PADDING_LENGTH);
        Tables { seed, hot_urls, channels, padding }
    }

    /// The tables of `seed`: drawn by the first generator of the seed, and
    /// kept (about 1.7 MB a seed) for the life of the process, where every
    /// later generator of the seed finds them. So an event's texts are
    /// plain references into them, which cost nothing to make, move or
    /// drop, on any thread; a process makes generators for a handful of
    /// seeds at most.
    fn of(seed: u64) -> &'static Tables {
        let mut tables = lock(TABLES.get_or_init(Mutex::default));
        tables.entry(seed).or_insert_with(|| Box::leak(Box::new(Tables::new(seed))))
    }
}

/// Everything one event's fields are computed from.
pub(crate) struct EventContext<'a> {
    pub(crate) config: &'a GeneratorSettings,
    /// The event's id.
    pub(crate) event_id: i64,
    /// The event's time, in milliseconds.
    pub(crate) timestamp: i64,
    /// The event's position (the spec's `eventsCountSoFar`).
    pub(crate) position: u64,
    pub(crate) rng: SplitMix,
    padding: &'static String,
}

impl EventContext<'_> {
    /// Padding for an event of `current_size` aiming at `average`.
    pub(crate) fn extra(&mut self, current_size: usize, average: u32) -> SharedStr {
        strings::next_extra(&mut self.rng, self.padding, current_size, average)
    }

    /// A random string of up to `max_length - 1` letters and spaces.
    pub(crate) fn string(&mut self, max_length: i32) -> String {
        strings::next_string(&mut self.rng, max_length, ' ')
    }
}

/// The spec's random price: `10^(6u) * 100` cents rounded, `u` uniform in
/// `[0, 1)`: one dollar to a million dollars, log-uniformly.
pub(crate) fn next_price(rng: &mut SplitMix) -> i64 {
    (10f64.powf(rng.next_double() * 6.0) * 100.0).round() as i64
}

/// The Nexmark generator: the event at any position, the same for the same
/// [`GeneratorSettings`]. Cloning is cheap (the tables are shared).
#[derive(Clone, Debug)]
pub struct NexmarkGenerator {
    config: GeneratorSettings,
    tables: &'static Tables,
}

impl NexmarkGenerator {
    /// A generator for `config`. The first generator of a seed in a
    /// process draws the seed's tables (a few milliseconds: ten thousand
    /// URLs and 1 MiB of padding), which the process keeps: the events'
    /// channels, URLs and padding refer to them.
    pub fn new(config: GeneratorSettings) -> Result<Self, NexmarkError> {
        config.validate()?;
        let tables = Tables::of(config.seed);
        Ok(NexmarkGenerator { config, tables })
    }

    /// The config.
    pub fn config(&self) -> &GeneratorSettings {
        &self.config
    }

    /// The same generator with another base time (the tables are shared).
    pub fn with_base_time(&self, base_time_ms: i64) -> Self {
        let config = GeneratorSettings { base_time_ms, ..self.config.clone() };
        NexmarkGenerator { config, tables: self.tables }
    }

    /// How many events there are; `None` for no end.
    pub fn max_events(&self) -> Option<u64> {
        self.config.max_events
    }

    /// The kind of the event at `position`.
    pub fn kind_at(&self, position: u64) -> EventKind {
        self.config.kind_of(self.config.event_id(position))
    }

    /// The time at which the event at `position` is due, in milliseconds:
    /// the time of its unshuffled number (the spec emits events in this
    /// order; it never decreases with the position).
    pub fn emit_time_ms(&self, position: u64) -> i64 {
        self.config.timestamp_for_event(self.config.event_number(position))
    }

    /// A bound on the event time of the event at `position` and every
    /// later one, in milliseconds (the spec's watermark: the time of the
    /// first number of the out-of-order group).
    pub fn watermark_ms(&self, position: u64) -> i64 {
        self.config.timestamp_for_event(self.config.watermark_event_number(position))
    }

    /// The event at `position`, whether or not `max_events` ends before it.
    pub fn event(&self, position: u64) -> Event {
        let config = &self.config;
        let event_id = config.event_id(position);
        let mut cx = EventContext {
            config,
            event_id,
            timestamp: config.timestamp_for_event(config.adjusted_event_number(position)),
            position,
            rng: SplitMix::for_event(config.seed, event_id),
            padding: &self.tables.padding,
        };
        match config.kind_of(event_id) {
            EventKind::Person => Event::Person(person::next_person(&mut cx)),
            EventKind::Auction => Event::Auction(auction::next_auction(&mut cx)),
            EventKind::Bid => Event::Bid(bid::next_bid(&mut cx, self.tables)),
        }
    }

    /// The events at the positions of `range`, cut at `max_events`.
    pub fn events(&self, range: Range<u64>) -> Vec<Event> {
        let until = self.max_events().map_or(range.end, |max| range.end.min(max));
        (range.start..until.max(range.start)).map(|p| self.event(p)).collect()
    }
}

#[cfg(test)]
mod tests;
