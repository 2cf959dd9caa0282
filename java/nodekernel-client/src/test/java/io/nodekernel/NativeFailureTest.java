package io.nodekernel;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.io.IOException;
import java.net.ServerSocket;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.BeforeClass;
import org.junit.ClassRule;
import org.junit.Test;

/**
 * A native failure never crashes the JVM: real errors, bad arguments, stale handles, closed streams
 * and clients, a stopped cluster and even a panic in the library all arrive as Java exceptions, and
 * the JVM goes on working.
 */
public class NativeFailureTest {

  @ClassRule public static final TestCluster.Rule CLUSTER = new TestCluster.Rule();

  private static NodeKernel nk() {
    return CLUSTER.client();
  }

  @BeforeClass
  public static void start() throws Exception {
    nk().mkdir("/nf", false);
  }

  @Test
  public void realFailuresArriveAsTheirCodesClass() throws Exception {
    assertThrows(NodeKernelException.NotFound.class, () -> nk().lookup("/nf/missing"));
    assertThrows(NodeKernelException.NotFound.class, () -> nk().open("/nf/missing"));
    assertThrows(NodeKernelException.NotFound.class, () -> nk().get("/nf/missing"));
    nk().mkdir("/nf/d", false);
    assertThrows(NodeKernelException.AlreadyExists.class, () -> nk().mkdir("/nf/d", false));
    assertThrows(NodeKernelException.TypeMismatch.class, () -> nk().open("/nf/d"));
    assertThrows(NodeKernelException.InvalidPath.class, () -> nk().lookup("no-slash"));
    assertThrows(NodeKernelException.InvalidPath.class, () -> nk().mkdir("/nf/a//b", false));
    NkOutputStream w = nk().createFile("/nf/busy");
    assertThrows(NodeKernelException.Busy.class, () -> nk().append("/nf/busy"));
    w.close();
    nk().createFile("/nf/d/x").close();
    assertThrows(NodeKernelException.NotEmpty.class, () -> nk().delete("/nf/d", false));
  }

  @Test
  public void badArgumentsAreJavaExceptions() throws Exception {
    assertThrows(NullPointerException.class, () -> nk().lookup(null));
    assertThrows(IllegalArgumentException.class, () -> nk().lookup("/nf/nul\0char"));
    assertThrows(IllegalArgumentException.class, () -> CreateOptions.defaults().storageClass(300));
    assertThrows(IllegalArgumentException.class, () -> CreateOptions.defaults().mode(-5));
    assertThrows(
        IllegalArgumentException.class,
        () -> nk().createContainer("/nf/x", NodeType.FILE, CreateOptions.defaults()));
    // Straight at the native layer: what the Java API never passes.
    long h = nk().handle();
    ByteBuffer direct = ByteBuffer.allocateDirect(8);
    assertThrows(IllegalArgumentException.class, () -> Native.put(h, "/nf/k", direct, 4, 8));
    assertThrows(IllegalArgumentException.class, () -> Native.put(h, "/nf/k", direct, -1, 2));
    assertThrows(
        IllegalArgumentException.class, () -> Native.put(h, "/nf/k", ByteBuffer.allocate(8), 0, 8));
    assertThrows(IllegalArgumentException.class, () -> Native.put(h, "/nf/k", null, 0, 0));
    assertThrows(IllegalArgumentException.class, () -> Native.lookup(h, null));
    assertThrows(
        IllegalArgumentException.class,
        () -> Native.create(h, "/nf/k", 99, -1, false, false, true, -1, 0, 0, 0, false, 0, 0, 0));
    assertThrows(
        NodeKernelException.InvalidArgument.class,
        () -> Native.create(h, "/nf/k2", 1, -1, false, false, true, -1, 0, 1, 2, false, 0, 0, 0));
    // TTLs: -1 (never) and 0 (none) are the only non-positive values.
    assertThrows(
        IllegalArgumentException.class,
        () -> Native.create(h, "/nf/k3", 1, -1, false, false, true, -1, 0, 0, 0, false, -2, 0, 0));
    assertThrows(
        IllegalArgumentException.class,
        () -> Native.create(h, "/nf/k3", 1, -1, false, false, true, -1, 0, 0, 0, false, 0, -1, 0));
    assertThrows(IllegalArgumentException.class, () -> Native.expire(h, "/nf", 0));
    assertThrows(IllegalArgumentException.class, () -> Native.setChildTtl(h, "/nf", -1));
    assertThrows(IllegalArgumentException.class, () -> Native.raise(999, "no such code"));
  }

  @Test
  public void staleAndForgedHandlesFindNothing() {
    for (long forged : new long[] {0, -1, 123456789L, Long.MAX_VALUE}) {
      assertThrows(IllegalStateException.class, () -> Native.lookup(forged, "/"));
      assertThrows(
          IllegalStateException.class,
          () -> Native.read(forged, ByteBuffer.allocateDirect(1), 0, 1));
      assertThrows(
          IllegalStateException.class,
          () -> Native.write(forged, ByteBuffer.allocateDirect(1), 0, 1));
      assertThrows(IllegalStateException.class, () -> Native.closeReader(forged));
      assertThrows(IllegalStateException.class, () -> Native.disconnect(forged));
      assertThrows(IllegalStateException.class, () -> Native.closeSession(forged));
      assertThrows(IllegalStateException.class, () -> Native.dropSession(forged));
      assertThrows(IllegalStateException.class, () -> Native.sessionEnded(forged));
      assertThrows(IllegalStateException.class, () -> Native.bindSession(forged, "/nf"));
      assertThrows(IllegalStateException.class, () -> Native.openSession(forged, 3000));
    }
  }

  @Test
  public void closedAndForgedSessionsAreRefusedClearly() throws Exception {
    long h = nk().handle();
    // A session handle that is not one (here a client's) finds no session.
    IllegalStateException e =
        assertThrows(
            IllegalStateException.class,
            () ->
                Native.create(h, "/nf/s1", 2, -1, false, false, true, -1, 0, 0, 0, false, 0, 0, h));
    assertTrue(e.getMessage(), e.getMessage().contains("session"));
    assertThrows(IllegalArgumentException.class, () -> Native.openSession(h, -5));
    Session s = nk().session(Duration.ofSeconds(3));
    long sh = s.handle();
    s.close();
    assertTrue(s.hasEnded());
    // The Java object refuses as an ended session does; its old handle finds nothing.
    assertThrows(
        NodeKernelException.NotFound.class,
        () ->
            nk().createContainer(
                    "/nf/s2", NodeType.DIRECTORY, CreateOptions.defaults().session(s)));
    assertThrows(NodeKernelException.NotFound.class, () -> s.bindExisting("/nf"));
    assertThrows(IllegalStateException.class, () -> Native.closeSession(sh));
    assertThrows(
        IllegalStateException.class,
        () -> Native.create(h, "/nf/s3", 2, -1, false, false, true, -1, 0, 0, 0, false, 0, 0, sh));
    assertFalse(nk().exists("/nf/s1"));
    assertFalse(nk().exists("/nf/s3"));
    // A session on a closed client's handle: the Java client refuses before the library.
    NodeKernel other = CLUSTER.cluster().connect();
    other.close();
    assertThrows(IOException.class, () -> other.session(Duration.ofSeconds(3)));
  }

  @Test
  public void closedStreamsAndClientsRefuseWithIoExceptions() throws Exception {
    NkOutputStream out = nk().createFile("/nf/closed");
    out.write(new byte[] {1, 2, 3});
    out.close();
    out.close(); // twice: nothing
    assertThrows(IOException.class, () -> out.write(1));
    assertThrows(IOException.class, out::sync);
    NkInputStream in = nk().open("/nf/closed");
    in.close();
    in.close();
    assertThrows(IOException.class, in::read);
    assertThrows(IOException.class, () -> in.seek(1));
    assertThrows(IOException.class, () -> in.read(0, new byte[1], 0, 1));

    NodeKernel other = CLUSTER.cluster().connect();
    NkInputStream stillOpen = other.open("/nf/closed");
    other.close();
    other.close();
    assertThrows(IOException.class, () -> other.lookup("/"));
    // A stream outlives its client.
    assertEquals(1, stillOpen.read());
    stillOpen.close();
  }

  @Test
  public void threadsShareAClientAndClosingItUnderThemNeverCrashes() throws Exception {
    NodeKernel shared = CLUSTER.cluster().connect();
    shared.createContainer("/nf/shared", NodeType.TABLE, CreateOptions.defaults());
    int threads = 6;
    AtomicInteger done = new AtomicInteger();
    CountDownLatch started = new CountDownLatch(threads);
    List<Throwable> unexpected = Collections.synchronizedList(new ArrayList<>());
    List<Thread> all = new ArrayList<>();
    for (int t = 0; t < threads; t++) {
      int id = t;
      Thread th =
          new Thread(
              () -> {
                started.countDown();
                try {
                  for (int i = 0; ; i++) {
                    String k = "/nf/shared/t" + id + "-" + (i % 20);
                    byte[] v = ("value " + id + " " + i).getBytes(StandardCharsets.UTF_8);
                    shared.put(k, v);
                    if (!Arrays.equals(v, shared.get(k))) {
                      unexpected.add(new AssertionError("wrong value at " + k));
                      return;
                    }
                    done.incrementAndGet();
                  }
                } catch (IOException e) {
                  // Expected once the client is closed: "closed" from Java or from the library.
                  if (!e.getMessage().contains("closed")) {
                    unexpected.add(e);
                  }
                } catch (IllegalStateException e) {
                  if (!e.getMessage().contains("closed")) {
                    unexpected.add(e);
                  }
                } catch (Throwable e) {
                  unexpected.add(e);
                }
              });
      th.start();
      all.add(th);
    }
    started.await();
    while (done.get() < 200 && unexpected.isEmpty()) {
      Thread.sleep(10);
    }
    shared.close();
    for (Thread th : all) {
      th.join(TestCluster.HANG_SECONDS * 1000);
      assertTrue("a thread hung after the close", !th.isAlive());
    }
    assertTrue("unexpected failures: " + unexpected, unexpected.isEmpty());
    // The JVM and the other clients go on.
    assertEquals(NodeType.TABLE, nk().lookup("/nf/shared").type());
  }

  @Test
  public void aPanicInTheLibraryIsAnExceptionAndTheJvmGoesOn() throws Exception {
    IllegalStateException e = assertThrows(IllegalStateException.class, Native::panicForTest);
    assertTrue(e.getMessage(), e.getMessage().contains("on purpose"));
    assertNotNull(nk().lookup("/nf"));
  }

  @Test
  public void aClusterThatIsGoneGivesUnavailable() throws Exception {
    int port;
    try (ServerSocket s = new ServerSocket(0)) {
      port = s.getLocalPort();
    }
    NodeKernelException refused =
        assertThrows(
            NodeKernelException.class,
            () -> NodeKernel.connect("127.0.0.1:" + port, CLUSTER.cluster().clientConfig()));
    assertEquals(ErrorCode.UNAVAILABLE, refused.code());

    try (TestCluster doomed = TestCluster.start();
        NodeKernel c = doomed.connect()) {
      c.createContainer("/t", NodeType.TABLE, CreateOptions.defaults());
      c.put("/t/v", new byte[] {1});
      NkInputStream in = c.open("/t/v");
      doomed.stop();
      NodeKernelException e = assertThrows(NodeKernelException.class, () -> c.lookup("/t/v"));
      assertTrue(
          e.code().toString(), e.code() == ErrorCode.UNAVAILABLE || e.code() == ErrorCode.TIMEOUT);
      assertThrows(NodeKernelException.class, () -> c.put("/t/w", new byte[] {2}));
      in.close();
    }
  }
}
