package io.nodekernel.spark;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.util.List;
import java.util.Properties;
import org.slf4j.LoggerFactory;

/**
 * The Spark line this jar was built for (one jar per line: {@code nodekernel-spark-3.5_2.12}, ...,
 * from the same sources against each line's Spark), checked against the Spark it runs in before the
 * shuffle manager or a broadcast does anything. A jar of another Scala version or another Spark
 * major version would fail later with a {@code NoClassDefFoundError} or {@code NoSuchMethodError}
 * deep in a task; this fails at once, naming the jar to use. Another minor version of the same
 * major (a line not built here) is only warned about.
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

  /** A running Spark this jar does not fit; {@code fatal}: it cannot work there. */
  record Mismatch(boolean fatal, String message) {}

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

  /**
   * Fails, once per JVM, if this jar is not built for the running Spark and Scala; logs a warning
   * if it runs on another minor version of its Spark major (untested).
   */
  static void check() {
    if (checked) {
      return;
    }
    Build b = build();
    Mismatch m =
        compare(
            b,
            org.apache.spark.package$.MODULE$.SPARK_VERSION(),
            scala.util.Properties.versionNumberString());
    if (m != null && m.fatal()) {
      throw new IllegalStateException(m.message());
    }
    if (m != null) {
      LoggerFactory.getLogger(SparkLine.class).warn(m.message());
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
  static Mismatch compare(Build b, String spark, String scala) {
    String sparkLine = prefix(spark, 2);
    String scalaBinary = prefix(scala, 2);
    if (sparkLine.equals(b.line()) && scalaBinary.equals(b.scala())) {
      return null;
    }
    String built =
        b.jar() + " is built for Spark " + b.line() + " on Scala " + b.scala() + ", but this is";
    String running = " Spark " + spark + " on Scala " + scala;
    boolean sameMajor = prefix(spark, 1).equals(prefix(b.line(), 1));
    if (sameMajor && scalaBinary.equals(b.scala())) {
      return new Mismatch(
          false,
          built
              + running
              + ": an untested combination (the jars built are for the lines "
              + LINES
              + ", docs/spark.md)");
    }
    // The jar of the running line, else of another minor of its major with its Scala.
    String right = null;
    for (String line : LINES) {
      String[] ls = line.split("_");
      if (ls[1].equals(scalaBinary) && prefix(ls[0], 1).equals(prefix(spark, 1))) {
        if (right == null || ls[0].equals(sparkLine)) {
          right = "nodekernel-spark-" + line + "-" + b.version() + ".jar";
        }
      }
    }
    String advice =
        right != null
            ? ": use " + right + " instead (docs/spark.md: which jar goes with which Spark)"
            : ": no NodeKernel jar is built for it; the lines built are "
                + LINES
                + " (docs/spark.md)";
    return new Mismatch(true, built + running + advice);
  }
}
