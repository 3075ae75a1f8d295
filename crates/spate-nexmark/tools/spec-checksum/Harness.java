// Computes, with the nexmark/nexmark project's own generator classes, the
// checksums that `events_match_the_spec_code_driven_by_the_same_random_streams`
// (src/generator/tests.rs) expects: each event gets `new SplittableRandom`
// seeded as spate-nexmark seeds it, so both sides draw the same numbers.
//
// The stubs stand in for what the model generators need from Flink and
// Jackson (the configuration's fields with their defaults, `@Nullable`).
// With a checkout of nexmark/nexmark in $NEXMARK:
//
//   P=$NEXMARK/nexmark-flink/src/main/java/com/github/nexmark/flink
//   mkdir -p out && javac -d out Harness.java $(find stubs -name '*.java') \
//     $P/model/{Event,Person,Auction,Bid}.java $P/generator/GeneratorConfig.java \
//     $P/generator/model/{Person,Auction,Bid,Price,Strings,Long}Generator.java
//   java -cp out Harness 7 1700000000000 10000 1 100000
//   java -cp out Harness 3 1600000000000 1000 16 100000
//
// Arguments: seed, base time (ms), events per second, out-of-order group
// size, events. It prints a few events and the checksum.

import com.github.nexmark.flink.NexmarkConfiguration;
import com.github.nexmark.flink.generator.GeneratorConfig;
import com.github.nexmark.flink.generator.model.*;
import com.github.nexmark.flink.model.*;
import java.util.SplittableRandom;

/** Drives the spec's model generators with one SplittableRandom per event, seeded as spate-nexmark seeds it. */
public class Harness {
  static final long GAMMA = 0x9e3779b97f4a7c15L;
  static long mix64(long z) {
    z = (z ^ (z >>> 30)) * 0xbf58476d1ce4e5b9L;
    z = (z ^ (z >>> 27)) * 0x94d049bb133111ebL;
    return z ^ (z >>> 31);
  }
  static long checksum = 0;
  static void add(long v) { checksum = checksum * 31 + v; }
  public static void main(String[] args) {
    long seed = Long.parseLong(args[0]);
    long base = Long.parseLong(args[1]);
    int rate = Integer.parseInt(args[2]);
    long group = Long.parseLong(args[3]);
    long n = Long.parseLong(args[4]);
    NexmarkConfiguration c = new NexmarkConfiguration();
    c.firstEventRate = rate; c.nextEventRate = rate; c.outOfOrderGroupSize = group;
    GeneratorConfig config = new GeneratorConfig(c, base, 0, 0, -1, 0);
    for (long count = 0; count < n; count++) {
      long number = config.nextAdjustedEventNumber(count);
      long ts = config.timestampForEvent(number);
      long id = config.firstEventId + number;
      SplittableRandom r = new SplittableRandom(mix64(seed ^ mix64(id + GAMMA)));
      long rem = id % config.totalProportion;
      String line;
      if (rem < config.personProportion) {
        Person p = PersonGenerator.nextPerson(id, r, ts, config);
        add(p.id); add(p.name.hashCode()); add(p.emailAddress.hashCode()); add(p.creditCard.hashCode());
        add(p.city.hashCode()); add(p.state.hashCode()); add(p.dateTime.toEpochMilli()); add(p.extra.length());
        line = "P " + p.id + " " + p.name + "|" + p.emailAddress + "|" + p.creditCard + "|" + p.city + "|" + p.state + "|" + p.dateTime.toEpochMilli() + "|" + p.extra.length();
      } else if (rem < config.personProportion + config.auctionProportion) {
        Auction a = AuctionGenerator.nextAuction(count, id, r, ts, config);
        add(a.id); add(a.itemName.hashCode()); add(a.description.hashCode()); add(a.initialBid); add(a.reserve);
        add(a.dateTime.toEpochMilli()); add(a.expires.toEpochMilli()); add(a.seller); add(a.category); add(a.extra.length());
        line = "A " + a.id + " " + a.itemName + "|" + a.initialBid + "|" + a.reserve + "|" + a.dateTime.toEpochMilli() + "|" + a.expires.toEpochMilli() + "|" + a.seller + "|" + a.category + "|" + a.extra.length();
      } else {
        Bid b = BidGenerator.nextBid(id, r, ts, config);
        // The spec adds FIRST_PERSON_ID to the bidder twice (nexmark/nexmark#30); undo one.
        long bidder = b.bidder - GeneratorConfig.FIRST_PERSON_ID;
        boolean hot = !b.channel.startsWith("channel-");
        add(b.auction); add(bidder); add(b.price); add(b.channel.hashCode()); add(b.dateTime.toEpochMilli()); add(b.extra.length());

        line = "B " + b.auction + " " + bidder + "|" + b.price + "|" + b.channel + "|" + b.dateTime.toEpochMilli() + "|" + b.extra.length();
      }
      if (count < 6 || count == 1049 || count == 1053) System.out.println(count + " " + line);
    }
    System.out.println("checksum " + checksum);
  }
}
