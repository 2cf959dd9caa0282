package io.nodekernel.spark;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.util.List;
import java.util.Properties;

/**
 * The Spark line this jar was built for (one jar per line: {@code nodekernel-spark-3.5_2.12}, ...,
 * from the same sources against each line's Spark), checked against the Spark it runs in before the
 * shuffle manager or a broadcast does anything. A jar of another Scala version or another Spark
 * line would fail later with a {@code NoClassDefFoundError} or {@code NoSuchMethodError} deep in a
 * task (Spark's internals the writers and the reader call change between minor versions: 4.1's
 * {@code MapStatus.apply} and {@code ExternalSorter} take an argument more than 4.0's); this fails
 * at once, naming the jar to use.
 */
final class SparkLine {
  /** The lines there is a jar for: Spark's major.minor and the Scala binary version. */
  static final List<String> LINES = List.of("3.5_2.12", "3.5_2.13", "4.0_2.13");

  private static final String RESOURCE = "nodekernel-spark.properties";

  private static volatile boolean checked;

  private SparkLine() {}

  /** What a jar was built for ({@code nodekernel-spark.properties}, filled in by Maven). */
  record Build(String artifact, String version, String sparkVersion, String line, String scala) {
    /** The jar's file name, as Maven names it. */
    String jar() {
      return artifact + "-" + version + ".jar";
    }
  }

  static Build build() {
    Properties p = new Properties();
    try (InputStream in = SparkLine.class.getResourceAsStream(RESOURCE)) {
      if (in == null) {
        throw new IllegalStateException(RESOURCE + " is missing from the NodeKernel Spark jar");
      }
      p.load(in);
    } catch (IOException e) {
      throw new UncheckedIOException("cannot read " + RESOURCE, e);
    }
    return new Build(
        p.getProperty("artifact"),
        p.getProperty("version"),
        p.getProperty("spark.version"),
        p.getProperty("spark.line"),
        p.getProperty("scala.binary.version"));
  }

  /** Fails, once per JVM, if this jar is not built for the running Spark line and Scala. */
  static void check() {
    if (checked) {
      return;
    }
    String m =
        mismatch(
            build(),
            org.apache.spark.package$.MODULE$.SPARK_VERSION(),
            scala.util.Properties.versionNumberString());
    if (m != null) {
      throw new IllegalStateException(m);
    }
    checked = true;
  }

  /** The first {@code n} dot-separated numbers of a version ({@code 3.5.3} to {@code 3.5}). */
  static String prefix(String version, int n) {
    String[] parts = version.split("[.-]");
    StringBuilder s = new StringBuilder();
    for (int i = 0; i < n && i < parts.length; i++) {
      s.append(i == 0 ? "" : ".").append(parts[i]);
    }
    return s.toString();
  }

  /**
   * What is wrong with running the jar {@code b} on Spark {@code spark} over Scala {@code scala}
   * (full versions, as they report themselves), or null when it is the line the jar was built for.
   */
  static String mismatch(Build b, String spark, String scala) {
    String line = prefix(spark, 2) + "_" + prefix(scala, 2);
    if (line.equals(b.line() + "_" + b.scala())) {
      return null;
    }
    String advice =
        LINES.contains(line)
            ? "use nodekernel-spark-"
                + line
                + "-"
                + b.version()
                + ".jar instead"
                + " (docs/spark.md: which jar goes with which Spark)"
            : "no NodeKernel jar is built for it; the lines built are "
                + LINES
                + " (docs/spark.md)";
    return b.jar()
        + " is built for Spark "
        + b.line()
        + " on Scala "
        + b.scala()
        + ", but this is Spark "
        + spark
        + " on Scala "
        + scala
        + ": "
        + advice;
  }
}
