//! Persons, and the choice of a person for an auction or a bid.

use super::{EventContext, strings};
use crate::model::Person;
use crate::random::SplitMix;
use crate::settings::{FIRST_PERSON_ID, GeneratorSettings};

/// People not created yet that an auction or bid may name (so that a
/// person and their first auction seem to have swapped in time).
pub(crate) const PERSON_ID_LEAD: i64 = 10;

/// Few states, so that queries find matches on small inputs.
pub(crate) const US_STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
pub(crate) const US_CITIES: [&str; 10] =
    ["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne"];
pub(crate) const FIRST_NAMES: [&str; 11] =
    ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"];
pub(crate) const LAST_NAMES: [&str; 9] =
    ["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"];

/// One of `items`, uniformly.
fn pick<'a>(rng: &mut SplitMix, items: &[&'a str]) -> &'a str {
    let i = rng.next_int(i32::try_from(items.len()).unwrap_or(i32::MAX));
    items.get(usize::try_from(i).unwrap_or(0)).copied().unwrap_or_default()
}

/// The person the event makes: the next person id, then (in the spec's
/// order of draws) name, email, credit card, city, state and padding.
pub(crate) fn next_person(cx: &mut EventContext<'_>) -> Person {
    let id = cx.config.last_base0_person_id(cx.event_id) + FIRST_PERSON_ID;
    // Each field is built in one allocation, in the spec's order of draws.
    let (first, last) = (pick(&mut cx.rng, &FIRST_NAMES), pick(&mut cx.rng, &LAST_NAMES));
    let mut name = String::with_capacity(first.len() + 1 + last.len());
    name.push_str(first);
    name.push(' ');
    name.push_str(last);
    // At most 6 + 1 + 4 + 4 characters: `xxxxxx@yyyy.com`.
    let mut email_address = String::with_capacity(15);
    strings::push_string(&mut cx.rng, 7, ' ', &mut email_address);
    email_address.push('@');
    strings::push_string(&mut cx.rng, 5, ' ', &mut email_address);
    email_address.push_str(".com");
    // Four groups of four digits, zero-padded, separated by spaces.
    let mut credit_card = String::with_capacity(19);
    for group in 0..4 {
        if group > 0 {
            credit_card.push(' ');
        }
        push_four_digits(&mut credit_card, cx.rng.next_int(10_000));
    }
    let city = pick(&mut cx.rng, &US_CITIES).to_string();
    let state = pick(&mut cx.rng, &US_STATES).to_string();
    let size = 8 + name.len() + email_address.len() + credit_card.len() + city.len() + state.len();
    let extra = cx.extra(size, cx.config.avg_person_byte_size);
    Person { id, name, email_address, credit_card, city, state, date_time: cx.timestamp, extra }
}

/// `n` (0 to 9999) as four digits with leading zeros, as `{:04}` prints it.
fn push_four_digits(out: &mut String, n: i32) {
    for unit in [1000, 100, 10, 1] {
        let digit = u8::try_from((n / unit) % 10).unwrap_or(0);
        out.push(char::from(b'0' + digit));
    }
}

/// A random person id (from 0) for an auction or bid: one of the last
/// `num_active_people` people, or of the next [`PERSON_ID_LEAD`] ones.
pub(crate) fn next_base0_person_id(config: &GeneratorSettings, event_id: i64, rng: &mut SplitMix) -> i64 {
    let people = config.last_base0_person_id(event_id) + 1;
    let active = people.min(i64::from(config.num_active_people));
    people - active + rng.next_long(active + PERSON_ID_LEAD)
}
