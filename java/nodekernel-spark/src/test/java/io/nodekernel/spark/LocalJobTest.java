package io.nodekernel.spark;

import static org.apache.spark.sql.functions.col;
import static org.apache.spark.sql.functions.explode;
import static org.apache.spark.sql.functions.length;
import static org.apache.spark.sql.functions.split;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

import io.nodekernel.TestCluster;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;
import java.util.stream.Collectors;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Test;

/**
 * A Spark job in local mode ({@code local[2]}) reads its input from and writes its output to {@code
 * nk://} through the Hadoop FileSystem, and gives the same results as the same job on the local
 * file system (and as the counts computed here without Spark).
 */
public class LocalJobTest {
  private static final String[] WORDS = {
    "shuffle", "broadcast", "cache", "tier", "dram", "flash", "block", "lease", "bag", "table"
  };
  private static final int FILES = 3;
  private static final int LINES = 3000;

  private static TestCluster cluster;
  private static SparkSession spark;
  private static java.nio.file.Path local;
  private static final Map<String, Long> EXPECTED = new TreeMap<>();
  private static final List<String> LINES_WRITTEN = new ArrayList<>();

  @BeforeClass
  public static void start() throws Exception {
    cluster = TestCluster.start();
    local = Files.createTempDirectory("nk-spark-");
    spark =
        SparkSession.builder()
            .master("local[2]")
            .appName("nodekernel-local-job")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.hadoop.fs.nk.impl", "io.nodekernel.hadoop.NodeKernelFileSystem")
            .config("spark.hadoop.fs.nk.config", cluster.clientConfig())
            .getOrCreate();
    Random r = new Random(42);
    for (int f = 0; f < FILES; f++) {
      StringBuilder text = new StringBuilder();
      for (int i = 0; i < LINES; i++) {
        StringBuilder line = new StringBuilder();
        int n = 1 + r.nextInt(8);
        for (int w = 0; w < n; w++) {
          String word = WORDS[r.nextInt(WORDS.length)] + (r.nextInt(4) == 0 ? r.nextInt(50) : "");
          EXPECTED.merge(word, 1L, Long::sum);
          line.append(w == 0 ? "" : " ").append(word);
        }
        LINES_WRITTEN.add(line.toString());
        text.append(line).append('\n');
      }
      byte[] bytes = text.toString().getBytes(StandardCharsets.UTF_8);
      write(nk("/job/in/part-" + f + ".txt"), bytes);
      write(new Path(local.toUri().toString() + "in/part-" + f + ".txt"), bytes);
    }
  }

  @AfterClass
  public static void stop() throws Exception {
    if (spark != null) {
      spark.stop();
    }
    if (cluster != null) {
      cluster.close();
    }
    if (local != null) {
      try (var all = Files.walk(local)) {
        all.sorted(Collections.reverseOrder()).forEach(p -> p.toFile().delete());
      }
    }
  }

  private static Path nk(String path) {
    return new Path("nk://" + cluster.meta() + path);
  }

  private static FileSystem fs(Path p) throws IOException {
    return p.getFileSystem(spark.sparkContext().hadoopConfiguration());
  }

  private static void write(Path p, byte[] bytes) throws IOException {
    try (OutputStream out = fs(p).create(p, false)) {
      out.write(bytes);
    }
  }

  /** Word counts as Parquet (the DataFrame writer) and upper-cased lines as text (RDDs). */
  private static void job(String in, String out) {
    Dataset<Row> words =
        spark
            .read()
            .text(in)
            .select(explode(split(col("value"), " ")).as("word"))
            .filter(length(col("word")).gt(0));
    words.groupBy("word").count().write().mode("overwrite").parquet(out + "/counts");
    new JavaSparkContext(spark.sparkContext())
        .textFile(in, 4)
        .map(s -> s.toUpperCase(Locale.ROOT))
        .saveAsTextFile(out + "/upper");
  }

  private static Map<String, Long> counts(String out) {
    Map<String, Long> m = new TreeMap<>();
    for (Row row : spark.read().parquet(out + "/counts").collectAsList()) {
      m.put(row.getString(0), row.getLong(1));
    }
    return m;
  }

  private static List<String> upper(String out) {
    return spark.read().textFile(out + "/upper").collectAsList().stream()
        .sorted()
        .collect(Collectors.toList());
  }

  @Test
  public void aJobOnNkGivesTheSameResultsAsOnTheLocalFileSystem() throws Exception {
    String nkBase = nk("/job").toString();
    String localBase = local.toUri().toString();
    job(nkBase + "/in", nkBase + "/out");
    job(localBase + "in", localBase + "out");

    Map<String, Long> onNk = counts(nkBase + "/out");
    assertEquals(EXPECTED, onNk);
    assertEquals(counts(localBase + "out"), onNk);

    List<String> upperNk = upper(nkBase + "/out");
    assertEquals(FILES * LINES, upperNk.size());
    assertEquals(upper(localBase + "out"), upperNk);
    List<String> want =
        LINES_WRITTEN.stream()
            .map(s -> s.toUpperCase(Locale.ROOT))
            .sorted()
            .collect(Collectors.toList());
    assertEquals(want, upperNk);

    // The output really is in NodeKernel: committed, with part files.
    FileSystem fs = fs(nk("/job/out"));
    assertTrue(fs.exists(nk("/job/out/counts/_SUCCESS")));
    assertTrue(fs.exists(nk("/job/out/upper/_SUCCESS")));
    FileStatus[] parts = fs.listStatus(nk("/job/out/upper"));
    assertTrue(
        "part files in " + List.of(parts),
        List.of(parts).stream().anyMatch(s -> s.getPath().getName().startsWith("part-")));
    // No temporary files of the committers are left behind.
    assertTrue(List.of(parts).stream().noneMatch(s -> s.getPath().getName().startsWith("_temp")));
  }
}
