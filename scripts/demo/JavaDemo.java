// The demo's JVM step (scripts/demo.sh): the Java client on the same
// cluster, run as a single-file program with nodekernel-client on the class
// path. NK_META names the cluster.

import io.nodekernel.NkInputStream;
import io.nodekernel.NkOutputStream;
import io.nodekernel.NodeKernel;
import io.nodekernel.NodeKernelException;
import io.nodekernel.NodeStatus;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;

public class JavaDemo {
  public static void main(String[] args) throws Exception {
    try (NodeKernel nk = NodeKernel.connect()) {
      String key1 = new String(nk.get("/demo/cache/key1"), StandardCharsets.UTF_8);
      System.out.println("  /demo/cache/key1 from Java: " + key1);
      nk.put("/demo/cache/from-java", "written by Java".getBytes(StandardCharsets.UTF_8));

      // A File read into a direct buffer in place, then positionally.
      NodeStatus st = nk.lookup("/demo/jobs/job1/input.bin");
      ByteBuffer buf = ByteBuffer.allocateDirect(1 << 20);
      long read = 0;
      try (NkInputStream in = nk.open(st.path())) {
        while (in.read(buf.clear()) > 0) {
          read += buf.position();
        }
        in.read(st.size() - 16, buf.clear());
      }
      System.out.printf("  read %d MiB of %s into a direct buffer%n", read >> 20, st.path());

      try (NkOutputStream out = nk.createFile("/demo/jobs/job1/from-java.txt")) {
        out.write("the JVM wrote this\n".getBytes(StandardCharsets.UTF_8));
      }
      System.out.println("  ls /demo/jobs/job1: " + nk.enumerate("/demo/jobs/job1"));
      try {
        nk.lookup("/demo/no-such-node");
      } catch (NodeKernelException.NotFound e) {
        System.out.println("  NotFound as " + e.getClass().getSimpleName() + ": " + e.getMessage());
      }
    }
  }
}
