package com.github.nexmark.flink;
import com.github.nexmark.flink.utils.NexmarkUtils;
/** Stub with the defaults of the real configuration. */
public class NexmarkConfiguration implements java.io.Serializable {
  public long numEvents = 0; public int numEventGenerators = 1;
  public NexmarkUtils.RateShape rateShape = NexmarkUtils.RateShape.SQUARE;
  public int firstEventRate = 10000; public int nextEventRate = 10000; public int ratePeriodSec = 600;
  public int personProportion = 1; public int auctionProportion = 3; public int bidProportion = 46;
  public int avgPersonByteSize = 200; public int avgAuctionByteSize = 500; public int avgBidByteSize = 100;
  public int hotAuctionRatio = 2; public int hotSellersRatio = 4; public int hotBiddersRatio = 4;
  public int numInFlightAuctions = 100; public int numActivePeople = 1000;
  public long occasionalDelaySec = 3; public double probDelayedEvent = 0.1; public long outOfOrderGroupSize = 1;
  public boolean isSourceKeepAlive = false; public long stopAtEvent = -1L; public boolean maxEmitSpeed = true;
}
