package io.nodekernel.spark;

import java.util.ArrayList;
import java.util.List;
import org.apache.spark.SparkConf;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.broadcast.Broadcast;
import scala.Tuple2;

/**
 * A Spark driver (local mode) that DriverSessionTest kills: with the NodeKernel shuffle on the
 * metadata server {@code args[0]} (client configuration {@code args[1]}) and a driver timeout of
 * {@code args[2]}, it prints {@code app <appId>}, broadcasts a value through NodeKernel, then runs
 * a shuffle whose reduce tasks print {@code ready} and sleep until the JVM is killed.
 */
public final class KilledDriver {
  private KilledDriver() {}

  public static void main(String[] args) throws Exception {
    SparkConf conf =
        new SparkConf()
            .setMaster("local[2]")
            .setAppName("nodekernel-killed-driver")
            .set("spark.ui.enabled", "false")
            .set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.bindAddress", "127.0.0.1")
            .set("spark.shuffle.manager", NodeKernelShuffleManager.class.getName())
            .set(NkShuffleConf.META, args[0])
            .set(NkShuffleConf.CONFIG, args[1])
            .set(NkShuffleConf.DRIVER_TIMEOUT, args[2]);
    JavaSparkContext sc = new JavaSparkContext(conf);
    System.out.println("app " + sc.sc().applicationId());
    System.out.flush();
    // The application's directory is made (bound) by the broadcast, before any shuffle.
    Broadcast<String> b = NkBroadcast.create(sc, "broadcast while the driver lives");
    List<Tuple2<Integer, Integer>> pairs = new ArrayList<>();
    for (int i = 0; i < 1000; i++) {
      pairs.add(new Tuple2<>(i % 10, i));
    }
    sc.parallelizePairs(pairs, 4)
        .reduceByKey(Integer::sum, 2)
        .foreachPartition(
            it -> {
              if (b.value().isEmpty()) {
                throw new IllegalStateException("no broadcast value");
              }
              System.out.println("ready");
              System.out.flush();
              Thread.sleep(600_000);
            });
  }
}
