package io.nodekernel.spark;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertTrue;

import org.apache.spark.SparkConf;
import org.junit.Test;

/**
 * Each line's jar says which Spark it was built for, and a jar of another Scala or Spark major
 * version is refused with the name of the jar to use instead of failing later inside Spark.
 */
public class SparkLineTest {
  private static SparkLine.Build jar(String line, String scala) {
    return new SparkLine.Build(
        "nodekernel-spark-" + line + "_" + scala, "0.1.0", line + ".9", line, scala);
  }

  /** The jar under test is the one built for the Spark and Scala on the test class path. */
  @Test
  public void thisModuleIsBuiltForTheSparkItIsTestedWith() {
    SparkLine.Build b = SparkLine.build();
    String spark = org.apache.spark.package$.MODULE$.SPARK_VERSION();
    String scalaVersion = scala.util.Properties.versionNumberString();
    assertEquals(spark, b.sparkVersion());
    assertEquals(SparkLine.prefix(spark, 2), b.line());
    assertEquals(SparkLine.prefix(scalaVersion, 2), b.scala());
    assertEquals("nodekernel-spark-" + b.line() + "_" + b.scala(), b.artifact());
    assertTrue(b.line() + "_" + b.scala(), SparkLine.LINES.contains(b.line() + "_" + b.scala()));
    assertNull(SparkLine.compare(b, spark, scalaVersion));
    SparkLine.check();
    // The constructor checks it first, and then goes on.
    new NodeKernelShuffleManager(new SparkConf(false), false).stop();
  }

  @Test
  public void otherPatchVersionsOfTheLineFit() {
    assertNull(SparkLine.compare(jar("3.5", "2.12"), "3.5.3", "2.12.18"));
    assertNull(SparkLine.compare(jar("3.5", "2.13"), "3.5.0", "2.13.8"));
    assertNull(SparkLine.compare(jar("4.0", "2.13"), "4.0.1", "2.13.16"));
    assertEquals("3.5", SparkLine.prefix("3.5.3-SNAPSHOT", 2));
  }

  private static String refused(SparkLine.Build b, String spark, String scala) {
    SparkLine.Mismatch m = SparkLine.compare(b, spark, scala);
    assertTrue(b + " on " + spark + "/" + scala + ": " + m, m != null && m.fatal());
    assertTrue(m.message(), m.message().startsWith(b.artifact() + "-0.1.0.jar is built for"));
    assertTrue(m.message(), m.message().contains("Spark " + spark + " on Scala " + scala));
    return m.message();
  }

  /** The pyspark wheel's Spark is Scala 2.12: the 2.13 jar names the 2.12 one. */
  @Test
  public void anotherScalaIsRefusedNamingTheRightJar() {
    String m = refused(jar("3.5", "2.13"), "3.5.3", "2.12.18");
    assertTrue(m, m.contains("use nodekernel-spark-3.5_2.12-0.1.0.jar instead"));
    m = refused(jar("3.5", "2.12"), "3.5.9", "2.13.8");
    assertTrue(m, m.contains("use nodekernel-spark-3.5_2.13-0.1.0.jar instead"));
  }

  @Test
  public void anotherSparkMajorIsRefusedNamingTheRightJar() {
    String m = refused(jar("3.5", "2.13"), "4.0.4", "2.13.16");
    assertTrue(m, m.contains("use nodekernel-spark-4.0_2.13-0.1.0.jar instead"));
    m = refused(jar("4.0", "2.13"), "3.5.3", "2.12.18");
    assertTrue(m, m.contains("use nodekernel-spark-3.5_2.12-0.1.0.jar instead"));
    // A later 4.x: the nearest line built, 4.0.
    m = refused(jar("3.5", "2.12"), "4.1.0", "2.13.16");
    assertTrue(m, m.contains("use nodekernel-spark-4.0_2.13-0.1.0.jar instead"));
    // Spark 2.4 on Scala 2.11: nothing is built for it.
    m = refused(jar("3.5", "2.12"), "2.4.8", "2.11.12");
    assertTrue(m, m.contains("no NodeKernel jar is built for it"));
  }

  /** Another minor of the same major, on the same Scala: may work, untested, so a warning. */
  @Test
  public void anotherMinorVersionIsOnlyWarnedAbout() {
    SparkLine.Mismatch m = SparkLine.compare(jar("4.0", "2.13"), "4.1.0", "2.13.16");
    assertFalse(m.toString(), m.fatal());
    assertTrue(m.message(), m.message().contains("untested"));
    m = SparkLine.compare(jar("3.5", "2.12"), "3.4.4", "2.12.17");
    assertFalse(m.toString(), m.fatal());
  }
}
