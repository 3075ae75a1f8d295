//! Generates Nexmark events on one thread and prints how fast, with the
//! count of each kind and the average size of the padding.
//!
//! ```sh
//! cargo run --release -p spate-nexmark --example generate -- 10000000
//! ```

use std::time::Instant;

use spate_nexmark::{Event, GeneratorSettings, NexmarkGenerator};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let count: u64 = match std::env::args().nth(1) {
        Some(arg) => arg.parse()?,
        None => 1_000_000,
    };
    let generator = NexmarkGenerator::new(GeneratorSettings::new(1, 0))?;
    let started = Instant::now();
    let (mut persons, mut auctions, mut bids, mut extra) = (0u64, 0u64, 0u64, 0usize);
    for position in 0..count {
        match generator.event(position) {
            Event::Person(p) => {
                persons += 1;
                extra += p.extra.len();
            }
            Event::Auction(a) => {
                auctions += 1;
                extra += a.extra.len();
            }
            Event::Bid(b) => {
                bids += 1;
                extra += b.extra.len();
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!("{count} events in {seconds:.3} s: {:.0} events/s on one thread", count as f64 / seconds);
    println!(
        "persons {persons}, auctions {auctions}, bids {bids}; padding {:.1} bytes an event",
        extra as f64 / count as f64
    );
    Ok(())
}
