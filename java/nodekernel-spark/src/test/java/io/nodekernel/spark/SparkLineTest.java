package io.nodekernel.spark;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertTrue;

import org.apache.spark.SparkConf;
import org.junit.Test;

/**
 * Each line's jar says which Spark it was built for, and a jar of another Scala version or Spark
 * line is refused with the name of the jar to use, instead of failing later inside Spark.
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
    assertNull(SparkLine.mismatch(b, spark, scalaVersion));
    SparkLine.check();
    // The constructor checks it first, and then goes on.
    new NodeKernelShuffleManager(new SparkConf(false), false).stop();
  }

  @Test
  public void otherPatchVersionsOfTheLineFit() {
    assertNull(SparkLine.mismatch(jar("3.5", "2.12"), "3.5.3", "2.12.18"));
    assertNull(SparkLine.mismatch(jar("3.5", "2.13"), "3.5.0", "2.13.8"));
    assertNull(SparkLine.mismatch(jar("4.0", "2.13"), "4.0.1", "2.13.16"));
    assertEquals("3.5", SparkLine.prefix("3.5.3-SNAPSHOT", 2));
  }

  private static String refused(SparkLine.Build b, String spark, String scala) {
    String m = SparkLine.mismatch(b, spark, scala);
    assertNotNull(b + " on " + spark + "/" + scala, m);
    assertTrue(m, m.startsWith(b.artifact() + "-0.1.0.jar is built for Spark " + b.line()));
    assertTrue(m, m.contains("but this is Spark " + spark + " on Scala " + scala + ": "));
    return m;
  }

  /** The pyspark wheel's Spark 3.5 is Scala 2.12: the 2.13 jar names the 2.12 one. */
  @Test
  public void anotherScalaIsRefusedNamingTheRightJar() {
    String m = refused(jar("3.5", "2.13"), "3.5.3", "2.12.18");
    assertTrue(
        m,
        m.endsWith(
            "use nodekernel-spark-3.5_2.12-0.1.0.jar instead (docs/spark.md:"
                + " which jar goes with which Spark)"));
    m = refused(jar("3.5", "2.12"), "3.5.9", "2.13.8");
    assertTrue(m, m.contains("use nodekernel-spark-3.5_2.13-0.1.0.jar instead"));
  }

  @Test
  public void anotherSparkLineIsRefusedNamingTheRightJar() {
    String m = refused(jar("3.5", "2.13"), "4.0.4", "2.13.16");
    assertTrue(m, m.contains("use nodekernel-spark-4.0_2.13-0.1.0.jar instead"));
    m = refused(jar("4.0", "2.13"), "3.5.3", "2.12.18");
    assertTrue(m, m.contains("use nodekernel-spark-3.5_2.12-0.1.0.jar instead"));
  }

  /**
   * A line nothing is built for, even a later minor of a built major (4.1 changed internals the 4.0
   * jar calls), is refused, listing the lines there are.
   */
  @Test
  public void aLineWithoutAJarIsRefused() {
    for (String[] v :
        new String[][] {{"4.1.3", "2.13.17"}, {"3.4.4", "2.12.17"}, {"2.4.8", "2.11.12"}}) {
      String m = refused(jar(v[0].startsWith("4") ? "4.0" : "3.5", "2.13"), v[0], v[1]);
      assertTrue(
          m,
          m.endsWith(
              "no NodeKernel jar is built for it; the lines built are "
                  + SparkLine.LINES
                  + " (docs/spark.md)"));
    }
  }
}
