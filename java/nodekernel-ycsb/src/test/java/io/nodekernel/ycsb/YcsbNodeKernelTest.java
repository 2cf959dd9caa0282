package io.nodekernel.ycsb;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

import io.nodekernel.NodeKernel;
import io.nodekernel.TestCluster;
import java.util.ArrayList;
import java.util.List;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Test;

/** YCSB itself (load, then workloads A and B) against a real cluster through the binding. */
public class YcsbNodeKernelTest {
  private static final int RECORDS = 300;
  private static final int OPS = 600;
  private static TestCluster cluster;

  @BeforeClass
  public static void start() throws Exception {
    cluster = TestCluster.start();
  }

  @AfterClass
  public static void stop() throws Exception {
    if (cluster != null) {
      cluster.close();
    }
  }

  private static List<String> props(String workload) {
    List<String> p = new ArrayList<>(Ycsb.workload(workload, RECORDS, OPS));
    p.add(NodeKernelClient.META + "=" + cluster.meta());
    p.add(NodeKernelClient.CONFIG + "=" + cluster.clientConfig());
    return p;
  }

  @Test
  public void loadThenWorkloadsAAndB() throws Exception {
    String db = NodeKernelClient.class.getName();
    Ycsb.run(db, "-load", props("a"), 2).assertAllOk(RECORDS);
    try (NodeKernel nk = cluster.connect()) {
      assertEquals(RECORDS, nk.enumerate("/ycsb/usertable").size());
    }
    Ycsb.Report a = Ycsb.run(db, "-t", props("a"), 2);
    a.assertAllOk(OPS);
    assertTrue(a.output, a.count("READ", "Operations") > 0);
    assertTrue(a.output, a.count("UPDATE", "Operations") > 0);
    Ycsb.Report b = Ycsb.run(db, "-t", props("b"), 1);
    b.assertAllOk(OPS);
    assertTrue(b.output, b.count("READ", "Operations") > b.count("UPDATE", "Operations"));
  }
}
