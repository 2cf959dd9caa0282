package io.nodekernel;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.EOFException;
import java.io.InputStreamReader;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.Random;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Collectors;
import org.junit.Before;
import org.junit.ClassRule;
import org.junit.Test;

/** The Java client against a real cluster: namespace, streams, KeyValues, Bags, locations. */
public class ClientTest {
  private static final AtomicInteger COUNTER = new AtomicInteger();
  private String dir;

  @ClassRule public static final TestCluster.Rule CLUSTER = new TestCluster.Rule();

  private static NodeKernel nk() {
    return CLUSTER.client();
  }

  @Before
  public void freshDir() throws Exception {
    dir = "/client" + COUNTER.incrementAndGet();
    nk().mkdir(dir, false);
  }

  static byte[] pattern(int len, long seed) {
    byte[] b = new byte[len];
    new Random(seed).nextBytes(b);
    return b;
  }

  static void file(String path, byte[] data) throws Exception {
    try (NkOutputStream out = nk().createFile(path)) {
      out.write(data);
    }
  }

  @Test
  public void aFileWrittenFromArraysAndDirectBuffersReadsBackEveryWay() throws Exception {
    byte[] data = pattern(3 << 20 | 12345, 1);
    String p = dir + "/f";
    try (NkOutputStream out = nk().createFile(p)) {
      out.write(data, 0, 100); // gathered
      out.write(data[100]); // one byte
      ByteBuffer direct = ByteBuffer.allocateDirect(data.length - 101);
      direct.put(data, 101, data.length - 101).flip();
      out.write(direct); // in place
      assertFalse(direct.hasRemaining());
      assertEquals(data.length, out.bytesWritten());
    }
    NodeStatus st = nk().lookup(p);
    assertEquals(NodeType.FILE, st.type());
    assertEquals(data.length, st.size());
    try (NkOutputStream out = nk().createFile(p + ".small")) {
      out.write(data, 0, 100);
    }
    // A 100-byte File takes a 112-byte piece of a shared block.
    assertEquals(112, nk().lookup(p + ".small").stored());

    // Heap reads, byte by byte and in arrays.
    try (NkInputStream in = nk().open(p)) {
      assertEquals(data[0] & 0xff, in.read());
      byte[] got = new byte[data.length];
      got[0] = data[0];
      int off = 1;
      while (off < got.length) {
        int n = in.read(got, off, got.length - off);
        assertTrue(n > 0);
        off += n;
      }
      assertArrayEquals(data, got);
      assertEquals(-1, in.read());
      assertEquals(-1, in.read(new byte[4], 0, 4));
    }
    // Direct reads in place.
    try (NkInputStream in = nk().open(p)) {
      ByteBuffer dst = ByteBuffer.allocateDirect(data.length);
      while (dst.hasRemaining() && in.read(dst) > 0) {}
      dst.flip();
      byte[] got = new byte[data.length];
      dst.get(got);
      assertArrayEquals(data, got);
      assertEquals(-1, in.read(ByteBuffer.allocateDirect(1)));
    }
  }

  @Test
  public void seekAndPositionalReadsReturnTheBytesAtTheirOffsets() throws Exception {
    byte[] data = pattern(2 << 20, 2);
    String p = dir + "/f";
    try (NkOutputStream out = nk().createFile(p)) {
      out.write(data);
    }
    try (NkInputStream in = nk().open(p)) {
      long[] offsets = {1_500_000, 10, 1_048_575, 1_048_576, data.length - 3};
      for (long at : offsets) {
        in.seek(at);
        assertEquals(at, in.position());
        assertEquals(data[(int) at] & 0xff, in.read());
        // Positional reads, heap and direct, do not move the stream.
        byte[] b = new byte[3];
        assertEquals(3, in.read(at - 1 < 0 ? 0 : at - 1, b, 0, 3));
        ByteBuffer d = ByteBuffer.allocateDirect(2);
        assertEquals(2, in.read(0, d));
        assertEquals(data[0], d.get(0));
        assertEquals(at + 1, in.position());
      }
      // A positional read is cut at the end, -1 past it.
      byte[] tail = new byte[10];
      assertEquals(4, in.read(data.length - 4, tail, 0, 10));
      assertEquals(-1, in.read(data.length, tail, 0, 10));
      // Seeking to the end is allowed, past it is not.
      in.seek(data.length);
      assertEquals(-1, in.read());
      assertThrows(EOFException.class, () -> in.seek(data.length + 1));
      assertThrows(EOFException.class, () -> in.seek(-1));
      in.seek(5);
      assertEquals(data[5] & 0xff, in.read());
    }
  }

  @Test
  public void syncPublishesWhatIsWrittenSoFarAndAppendContinues() throws Exception {
    String p = dir + "/log";
    NkOutputStream out = nk().createFile(p);
    out.write("first ".getBytes(StandardCharsets.UTF_8));
    assertEquals(0, nk().lookup(p).size());
    out.sync();
    assertEquals(6, nk().lookup(p).size());
    out.close();
    try (NkOutputStream more = nk().append(p)) {
      assertEquals(6, more.position());
      more.write("second".getBytes(StandardCharsets.UTF_8));
    }
    assertEquals("first second", new String(nk().get(p), StandardCharsets.UTF_8));
  }

  @Test
  public void keyValuesAreReplacedWholeAndReadIntoBuffers() throws Exception {
    nk().createContainer(dir + "/t", NodeType.TABLE, CreateOptions.defaults());
    String k = dir + "/t/k";
    nk().put(k, "one".getBytes(StandardCharsets.UTF_8));
    nk().put(k, "second".getBytes(StandardCharsets.UTF_8));
    assertEquals("second", new String(nk().get(k), StandardCharsets.UTF_8));
    assertEquals(NodeType.KEY_VALUE, nk().lookup(k).type());

    ByteBuffer direct = ByteBuffer.allocateDirect(16);
    direct.put((byte) 9);
    assertEquals(6, nk().get(k, direct));
    assertEquals(7, direct.position());
    ByteBuffer small = ByteBuffer.allocate(3);
    assertEquals(6, nk().get(k, small)); // does not fit: nothing read
    assertEquals(0, small.position());
    ByteBuffer heap = ByteBuffer.allocate(6);
    assertEquals(6, nk().get(k, heap));
    assertEquals("second", new String(heap.array(), StandardCharsets.UTF_8));

    // A direct put reads the buffer in place and leaves its position alone.
    ByteBuffer v = ByteBuffer.allocateDirect(4).put(new byte[] {1, 2, 3, 4});
    v.flip();
    nk().put(k, v);
    assertEquals(0, v.position());
    assertArrayEquals(new byte[] {1, 2, 3, 4}, nk().get(k));

    // A streamed KeyValue: the old value until close, nothing after abort.
    NkOutputStream w = nk().createKeyValue(k, CreateOptions.defaults());
    w.write(new byte[] {7, 7});
    assertArrayEquals(new byte[] {1, 2, 3, 4}, nk().get(k));
    w.close();
    assertArrayEquals(new byte[] {7, 7}, nk().get(k));
    NkOutputStream gone = nk().createKeyValue(dir + "/t/never", CreateOptions.defaults());
    gone.write(1);
    gone.abort();
    assertFalse(nk().exists(dir + "/t/never"));
  }

  @Test
  public void namespaceCallsListRenameAndDelete() throws Exception {
    nk().mkdir(dir + "/a/b/c", true);
    nk().mkdir(dir + "/a/b/c", true); // exists: fine with parents
    for (int i = 0; i < 40; i++) {
      file(dir + "/a/v" + i, new byte[i]);
    }
    List<NodeStatus> listed = nk().list(dir + "/a");
    assertEquals(41, listed.size());
    NodeStatus v7 =
        listed.stream().filter(s -> s.path().equals(dir + "/a/v7")).findFirst().orElseThrow();
    assertEquals(7, v7.size());
    assertTrue(listed.stream().anyMatch(s -> s.path().equals(dir + "/a/b") && s.isContainer()));
    assertEquals(41, nk().enumerate(dir + "/a").size());

    nk().rename(dir + "/a/v1", dir + "/a/w1");
    assertFalse(nk().exists(dir + "/a/v1"));
    assertEquals(1, nk().lookup(dir + "/a/w1").size());
    assertThrows(
        NodeKernelException.AlreadyExists.class, () -> nk().rename(dir + "/a/v2", dir + "/a/v3"));
    nk().rename(dir + "/a/v2", dir + "/a/v3", true);
    assertEquals(2, nk().lookup(dir + "/a/v3").size());

    NodeStatus changed = nk().setAttributes(dir + "/a/v3", 0600, 1_234_000_000L);
    assertEquals(0600, changed.mode());
    assertEquals(1_234_000_000L, changed.mtimeNanos());
    assertEquals(0600, nk().lookup(dir + "/a/v3").mode());
    assertEquals(1_234_000_000L, nk().setAttributes(dir + "/a/v3", 0640, -1).mtimeNanos());
    assertEquals(0640, nk().setAttributes(dir + "/a/v3", -1, 5L).mode());
    assertThrows(
        IllegalArgumentException.class, () -> nk().setAttributes(dir + "/a/v3", 010000, -1));
    assertThrows(
        NodeKernelException.NotFound.class, () -> nk().setAttributes(dir + "/a/none", 0600, -1));

    assertThrows(NodeKernelException.NotEmpty.class, () -> nk().delete(dir + "/a", false));
    nk().delete(dir + "/a", true);
    assertFalse(nk().exists(dir + "/a"));
  }

  @Test
  public void aBagReadsAsOneStreamInListingOrder() throws Exception {
    String bag = dir + "/bag";
    nk().createContainer(bag, NodeType.BAG, CreateOptions.defaults());
    StringBuilder want = new StringBuilder();
    for (int i = 0; i < 5; i++) {
      String part = "part" + i + ";";
      try (NkOutputStream out = nk().createFile(bag + "/p" + i)) {
        out.write(part.getBytes(StandardCharsets.UTF_8));
      }
    }
    for (String name : nk().enumerate(bag)) {
      want.append(new String(nk().get(bag + "/" + name), StandardCharsets.UTF_8));
    }
    try (NkInputStream in = nk().openBag(bag)) {
      assertFalse(in.isSeekable());
      assertEquals(want.length(), in.size());
      String got = new String(in.readAllBytes(), StandardCharsets.UTF_8);
      assertEquals(want.toString(), got);
      assertThrows(UnsupportedOperationException.class, () -> in.seek(0));
    }
  }

  @Test
  public void byteRangesOfSeveralFilesReadAsOneStreamInTheOrderGiven() throws Exception {
    byte[] a = pattern(3 << 20, 11);
    byte[] b = pattern(1000, 12);
    file(dir + "/a", a);
    file(dir + "/b", b);
    List<FileRange> ranges =
        List.of(
            new FileRange(dir + "/a", (1 << 20) - 3, (1 << 20) + 6),
            new FileRange(dir + "/b", 10, 20),
            new FileRange(dir + "/a", 0, 0),
            new FileRange(dir + "/a", 5, 1));
    ByteArrayOutputStream want = new ByteArrayOutputStream();
    for (FileRange r : ranges) {
      byte[] src = r.path().endsWith("/a") ? a : b;
      want.write(src, (int) r.offset(), (int) r.length());
    }
    try (NkInputStream in = nk().openRanges(ranges, 4)) {
      assertEquals(want.size(), in.size());
      ByteBuffer direct = ByteBuffer.allocateDirect(want.size());
      while (direct.hasRemaining() && in.read(direct) > 0) {}
      assertFalse(direct.hasRemaining());
      byte[] got = new byte[want.size()];
      direct.flip().get(got);
      assertArrayEquals(want.toByteArray(), got);
      assertEquals(-1, in.read());
    }
    // A failure names the range it is about, in its message and as range().
    NodeKernelException past =
        assertThrows(
            NodeKernelException.OutOfRange.class,
            () ->
                nk().openRanges(
                        List.of(new FileRange(dir + "/a", 0, 1), new FileRange(dir + "/b", 999, 2)),
                        0));
    assertEquals(1, past.range());
    assertTrue(past.getMessage(), past.getMessage().contains("range 1 (bytes 999..1001 of "));
    NodeKernelException missing =
        assertThrows(
            NodeKernelException.NotFound.class,
            () ->
                nk().openRanges(
                        List.of(
                            new FileRange(dir + "/b", 0, 1),
                            new FileRange(dir + "/b", 0, 2),
                            new FileRange(dir + "/none", 0, 0),
                            new FileRange(dir + "/none", 0, 0)),
                        0));
    assertEquals(2, missing.range());
    assertEquals(
        -1,
        assertThrows(NodeKernelException.NotFound.class, () -> nk().lookup(dir + "/none")).range());
    assertThrows(IllegalArgumentException.class, () -> new FileRange(dir + "/b", -1, 2));
    // A File whose writer aborted keeps its synced bytes; the next writer appends after them.
    NkOutputStream w = nk().createFile(dir + "/slot");
    w.write(new byte[] {1, 2});
    w.sync();
    w.write(pattern(2 << 20, 13));
    w.abort();
    try (NkOutputStream next = nk().append(dir + "/slot")) {
      assertEquals(2, next.position());
      next.write(3);
    }
    assertArrayEquals(new byte[] {1, 2, 3}, nk().get(dir + "/slot"));
  }

  @Test
  public void appendOrCreateMakesAMissingFileAndContinuesAnExistingOne() throws Exception {
    String bag = dir + "/p0";
    nk().createContainer(bag, NodeType.BAG, CreateOptions.defaults());
    String p = bag + "/e1-t0";
    try (NkOutputStream out = nk().appendOrCreate(p, CreateOptions.defaults().mode(0600))) {
      assertEquals(0, out.position());
      out.write(new byte[] {1, 2});
      assertThrows(
          NodeKernelException.Busy.class, () -> nk().appendOrCreate(p, CreateOptions.defaults()));
    }
    try (NkOutputStream out = nk().appendOrCreate(p, CreateOptions.defaults())) {
      assertEquals(2, out.position());
      out.write(3);
    }
    assertArrayEquals(new byte[] {1, 2, 3}, nk().get(p));
    assertEquals(0600, nk().lookup(p).mode());
    assertThrows(
        NodeKernelException.AlreadyExists.class,
        () -> nk().appendOrCreate(bag, CreateOptions.defaults()));
    assertThrows(
        NodeKernelException.NotFound.class,
        () -> nk().appendOrCreate(dir + "/none/f", CreateOptions.defaults()));
  }

  @Test
  public void getManyAnswersEveryKeyInOrderWithNullForAMissingOne() throws Exception {
    String t = dir + "/idx";
    nk().createContainer(t, NodeType.TABLE, CreateOptions.defaults());
    byte[] small = pattern(40, 21);
    byte[] big = pattern(3 << 20 | 5, 22);
    nk().put(t + "/a", small);
    nk().put(t + "/b", big);
    nk().put(t + "/empty", new byte[0]);
    List<String> keys = List.of(t + "/b", t + "/gone", t + "/a", t + "/empty", t + "/a");
    for (int inFlight : new int[] {0, 1, 8}) {
      List<byte[]> got = nk().getMany(keys, inFlight);
      assertEquals(keys.size(), got.size());
      assertArrayEquals(big, got.get(0));
      assertEquals(null, got.get(1));
      assertArrayEquals(small, got.get(2));
      assertArrayEquals(new byte[0], got.get(3));
      assertArrayEquals(small, got.get(4));
    }
    assertTrue(nk().getMany(List.of(), 0).isEmpty());
    // A failure other than a missing key is thrown, not hidden as null.
    assertThrows(
        NodeKernelException.InvalidPath.class,
        () -> nk().getMany(List.of(t + "/a", "relative"), 0));
  }

  @Test
  public void putManyStoresEveryValueAndThrowsTheFailuresTogether() throws Exception {
    String t = dir + "/batch";
    nk().createContainer(t, NodeType.TABLE, CreateOptions.defaults());
    nk().put(t + "/old", new byte[] {9});
    for (int inFlight : new int[] {0, 1, 8}) {
      String k = t + "/" + inFlight + "-";
      byte[] big = pattern(3 << 20 | 5, 31);
      Map<String, byte[]> items = new LinkedHashMap<>();
      items.put(k + "a", pattern(100, 32));
      items.put(k + "big", big);
      items.put(k + "empty", new byte[0]);
      items.put(t + "/old", pattern(77, 33 + inFlight));
      nk().putMany(items, inFlight);
      for (Map.Entry<String, byte[]> e : items.entrySet()) {
        assertArrayEquals(e.getKey(), e.getValue(), nk().get(e.getKey()));
      }
      // Two failing items: the first is thrown, the second suppressed in it; the others stored.
      List<String> paths =
          List.of(k + "x", dir + "/none/" + inFlight, k + "y", "relative", k + "x");
      List<byte[]> values =
          List.of(new byte[] {1}, new byte[] {2}, new byte[] {3}, new byte[] {4}, new byte[] {5});
      NodeKernelException.NotFound e =
          assertThrows(
              NodeKernelException.NotFound.class, () -> nk().putMany(paths, values, inFlight));
      assertTrue(e.getMessage(), e.getMessage().contains(dir + "/none/" + inFlight));
      assertEquals(1, e.getSuppressed().length);
      assertTrue(e.getSuppressed()[0] instanceof NodeKernelException.InvalidPath);
      assertArrayEquals("the last value of a key wins", new byte[] {5}, nk().get(k + "x"));
      assertArrayEquals(new byte[] {3}, nk().get(k + "y"));
    }
    nk().putMany(List.of(), List.of(), 0);
    assertThrows(
        IllegalArgumentException.class,
        () -> nk().putMany(List.of(t + "/a"), List.of(new byte[1], new byte[1]), 0));
  }

  @Test
  public void deleteManyDeletesEveryPathAndThrowsAMissingOne() throws Exception {
    String t = dir + "/batchdel";
    nk().createContainer(t, NodeType.TABLE, CreateOptions.defaults());
    for (int inFlight : new int[] {0, 1, 8}) {
      String k = t + "/" + inFlight + "-";
      nk().putMany(
              List.of(k + "a", k + "b", k + "c"),
              List.of(new byte[1], new byte[2], new byte[3]),
              inFlight);
      NodeKernelException.NotFound e =
          assertThrows(
              NodeKernelException.NotFound.class,
              () ->
                  nk().deleteMany(List.of(k + "a", k + "gone", k + "b", k + "c"), false, inFlight));
      assertTrue(e.getMessage(), e.getMessage().contains(k + "gone"));
      assertEquals(0, e.getSuppressed().length);
      List<byte[]> got = nk().getMany(List.of(k + "a", k + "b", k + "c"), inFlight);
      assertEquals(Arrays.asList(null, null, null), got);
    }
    nk().put(t + "/kept", new byte[] {1});
    assertThrows(NodeKernelException.NotEmpty.class, () -> nk().deleteMany(List.of(t), false, 0));
    nk().deleteMany(List.of(t), true, 0);
    assertThrows(NodeKernelException.NotFound.class, () -> nk().get(t + "/kept"));
  }

  /** Waits until {@code path} is gone; the bound only catches a hang (expiry is the server's). */
  static void awaitGone(String path) throws Exception {
    long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
    while (nk().exists(path)) {
      assertTrue(path + " never expired", System.nanoTime() < deadline);
      Thread.sleep(50);
    }
  }

  @Test
  public void ttlsGivenAtCreateAreShownChangedAndHonoured() throws Exception {
    String t = dir + "/ttl";
    nk().createContainer(
            t, NodeType.TABLE, CreateOptions.defaults().childTtl(Duration.ofMillis(200)));
    assertEquals(Optional.of(Duration.ofMillis(200)), nk().lookup(t).childTtl());
    try (NkOutputStream out = nk().createKeyValue(t + "/inherits", CreateOptions.defaults())) {
      out.write(1);
    }
    try (NkOutputStream out =
        nk().createKeyValue(t + "/kept", CreateOptions.defaults().ttlNever())) {
      out.write(2);
    }
    long before = System.currentTimeMillis();
    try (NkOutputStream out =
        nk().createFile(dir + "/hour", CreateOptions.defaults().ttl(Duration.ofHours(1)))) {
      out.write(3);
    }
    Instant at = nk().lookup(dir + "/hour").expires().orElseThrow();
    assertTrue(at.toString(), at.toEpochMilli() > before + 3_590_000);
    assertTrue(at.toString(), at.toEpochMilli() < System.currentTimeMillis() + 3_610_000);

    awaitGone(t + "/inherits");
    assertArrayEquals(new byte[] {2}, nk().get(t + "/kept"));
    assertEquals(Optional.empty(), nk().lookup(t + "/kept").expires());
    // expire(null) clears a TTL; a short one removes the node.
    assertEquals(Optional.empty(), nk().expire(dir + "/hour", null).expires());
    nk().expire(dir + "/hour", Duration.ofMillis(100));
    awaitGone(dir + "/hour");
    assertEquals(Optional.empty(), nk().setChildTtl(t, null).childTtl());

    assertThrows(
        NodeKernelException.InvalidArgument.class,
        () -> nk().setChildTtl(t + "/kept", Duration.ofMinutes(1)));
    assertThrows(IllegalArgumentException.class, () -> CreateOptions.defaults().ttl(Duration.ZERO));
    assertThrows(
        IllegalArgumentException.class, () -> nk().expire(t + "/kept", Duration.ofSeconds(-1)));
    // Rounded up to whole milliseconds, never down to none.
    assertEquals(1, CreateOptions.millis("TTL", Duration.ofNanos(1)));
  }

  /** Sessions short enough for the tests, long enough for a stalled 2-core machine to renew. */
  static final Duration LEASE = Duration.ofSeconds(3);

  @Test
  public void whatASessionBindsGoesWhenItIsClosedAndNothingElse() throws Exception {
    Session s = nk().session(LEASE);
    assertEquals(LEASE, s.lease());
    assertFalse(s.hasEnded());
    CreateOptions bound = CreateOptions.defaults().session(s);
    nk().createContainer(dir + "/job", NodeType.DIRECTORY, bound);
    file(dir + "/job/inside", pattern(100, 1));
    try (NkOutputStream out = nk().createFile(dir + "/bound-file", bound)) {
      out.write(pattern(10, 2));
    }
    nk().createContainer(dir + "/t", NodeType.TABLE, CreateOptions.defaults());
    try (NkOutputStream out = nk().createKeyValue(dir + "/t/bound-kv", bound)) {
      out.write(3);
    }
    file(dir + "/sibling", pattern(10, 4));
    // Renewed in the background: more than a lease later it all stays.
    Thread.sleep(LEASE.toMillis() + 1000);
    assertTrue(nk().exists(dir + "/job/inside"));
    s.close();
    assertTrue(s.hasEnded());
    for (String gone : List.of("/job", "/bound-file", "/t/bound-kv")) {
      assertFalse(gone, nk().exists(dir + gone));
    }
    assertTrue(nk().exists(dir + "/sibling"));
    assertTrue(nk().exists(dir + "/t"));
    s.close(); // twice: nothing
    // An ended session binds nothing more.
    assertThrows(
        NodeKernelException.NotFound.class,
        () -> nk().createContainer(dir + "/late", NodeType.DIRECTORY, bound));
    assertThrows(NodeKernelException.NotFound.class, () -> s.bindExisting(dir + "/sibling"));
    assertFalse(nk().exists(dir + "/late"));
  }

  @Test
  public void bindExistingBindsANodeMadeWithoutTheSession() throws Exception {
    nk().mkdir(dir + "/made", false);
    file(dir + "/made/f", pattern(10, 5));
    nk().mkdir(dir + "/kept", false);
    try (Session s = nk().session(LEASE)) {
      s.bindExisting(dir + "/made");
      s.bindExisting(dir + "/made"); // again: nothing
      assertThrows(NodeKernelException.NotFound.class, () -> s.bindExisting(dir + "/missing"));
      assertThrows(NodeKernelException.InvalidArgument.class, () -> s.bindExisting("/"));
      assertTrue(nk().exists(dir + "/made/f"));
    }
    assertFalse(nk().exists(dir + "/made"));
    assertTrue(nk().exists(dir + "/kept"));
    // appendOrCreate binds only what it creates: an existing File stays.
    file(dir + "/kept/old", pattern(10, 6));
    try (Session s = nk().session(LEASE)) {
      CreateOptions bound = CreateOptions.defaults().session(s);
      nk().appendOrCreate(dir + "/kept/old", bound).close();
      nk().appendOrCreate(dir + "/kept/new", bound).close();
    }
    assertTrue(nk().exists(dir + "/kept/old"));
    assertFalse(nk().exists(dir + "/kept/new"));
  }

  @Test
  public void aSessionBindsOnlyForTheClientThatOpenedIt() throws Exception {
    NodeKernel other = CLUSTER.cluster().connect();
    try (Session s = other.session(LEASE)) {
      assertThrows(
          NodeKernelException.InvalidArgument.class,
          () ->
              nk().createContainer(
                      dir + "/foreign", NodeType.DIRECTORY, CreateOptions.defaults().session(s)));
      assertFalse(nk().exists(dir + "/foreign"));
      // Closing the client leaves its session open and renewed.
      other.createContainer(
          dir + "/outlives", NodeType.DIRECTORY, CreateOptions.defaults().session(s));
      other.close();
      Thread.sleep(LEASE.toMillis() + 1000);
      assertTrue(nk().exists(dir + "/outlives"));
      assertFalse(s.hasEnded());
    } finally {
      other.close();
    }
    assertFalse(nk().exists(dir + "/outlives"));
    assertThrows(IllegalArgumentException.class, () -> nk().session(Duration.ZERO));
    assertThrows(IllegalArgumentException.class, () -> nk().session(null));
  }

  /**
   * A JVM holding a session is killed (SIGKILL): its bound directory goes once the lease lapses,
   * the rest stays.
   */
  @Test
  public void aKilledJvmLosesWhatItsSessionBoundOnceTheLeaseLapses() throws Exception {
    file(dir + "/other", pattern(10, 7));
    String cp =
        System.getProperty("surefire.test.class.path", System.getProperty("java.class.path"));
    String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
    Process p =
        new ProcessBuilder(
                java,
                "-cp",
                cp,
                SessionHolder.class.getName(),
                CLUSTER.cluster().meta(),
                CLUSTER.cluster().clientConfig(),
                dir + "/job",
                "" + LEASE.toMillis())
            .redirectError(ProcessBuilder.Redirect.INHERIT)
            .start();
    try {
      BufferedReader out =
          new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8));
      assertEquals("ready", out.readLine());
      // Renewed while it lives: more than a lease passes and it stays.
      Thread.sleep(LEASE.toMillis() + 1000);
      assertTrue(nk().exists(dir + "/job/data"));
    } finally {
      p.destroyForcibly(); // SIGKILL
      assertTrue(p.waitFor(TestCluster.HANG_SECONDS, TimeUnit.SECONDS));
    }
    awaitGone(dir + "/job");
    assertTrue(nk().exists(dir + "/other"));
  }

  @Test
  public void blockLocationsCoverTheFileAndNameTheServersHost() throws Exception {
    String p = dir + "/big";
    int size = 5 << 20 | 7;
    try (NkOutputStream out = nk().createFile(p, CreateOptions.defaults().local(true))) {
      out.write(pattern(size, 3));
    }
    NodeStatus st = nk().lookup(p);
    List<BlockLocation> locs = nk().blockLocations(p);
    long bs = st.blockSize();
    assertEquals((size + bs - 1) / bs, locs.size());
    assertEquals(locs.size() * bs, st.stored());
    long covered = 0;
    for (BlockLocation l : locs) {
      assertEquals(covered, l.offset());
      covered += l.length();
      assertFalse(l.host().isEmpty());
      assertTrue(l.address(), l.address().contains(":"));
    }
    assertEquals(size, covered);
    // All blocks on the one local server, whose location is this host's.
    assertEquals(
        List.of(NodeKernel.localLocation()),
        locs.stream().map(BlockLocation::host).distinct().collect(Collectors.toList()));
    assertEquals(NodeKernel.localLocation(), nk().location());
    Capacity c = nk().capacity();
    assertTrue(c.capacity() >= 1L << 30);
    assertTrue(c.used() >= size);
  }

  /** A quota refuses growth past it with QuotaExceeded (nothing left); du reads the accounting. */
  @Test
  public void aQuotaRefusesGrowthAndDuCountsTheSubtree() throws Exception {
    String q = dir + "/q";
    nk().mkdir(q, false);
    Usage set = nk().setQuota(q, OptionalLong.empty(), OptionalLong.of(2));
    assertEquals(new Usage.Quota(OptionalLong.empty(), OptionalLong.of(2)), set.quota());
    assertEquals(0, set.nodes());
    nk().mkdir(q + "/a", false);
    file(q + "/f", pattern(100, 2));
    NodeKernelException.QuotaExceeded e =
        assertThrows(NodeKernelException.QuotaExceeded.class, () -> nk().mkdir(q + "/b", false));
    assertEquals(ErrorCode.QUOTA_EXCEEDED, e.code());
    assertTrue(e.getMessage(), e.getMessage().contains(q + ": its quota of 2 nodes"));
    assertThrows(NodeKernelException.NotFound.class, () -> nk().lookup(q + "/b"));
    Usage u = nk().du(q);
    assertEquals(2, u.nodes());
    assertEquals(100, u.bytes());
    // A 100-byte File takes a 112-byte piece of a shared block.
    assertEquals(112, u.stored());
    assertEquals(112, u.classes().stream().mapToLong(Usage.ClassUsage::pieceBytes).sum());
    assertEquals(1, nk().du(q + "/f").nodes());
    assertNull(nk().clearQuota(q).quota());
    nk().mkdir(q + "/b", false);
    assertEquals(3, nk().du(q).nodes());
    assertThrows(
        IllegalArgumentException.class,
        () -> nk().setQuota(q, OptionalLong.of(-5), OptionalLong.empty()));
    assertThrows(
        NodeKernelException.TypeMismatch.class,
        () -> nk().setQuota(q + "/f", OptionalLong.empty(), OptionalLong.of(1)));
  }

  /** A client's location is its configuration's, which the shuffle manager places map output by. */
  @Test
  public void aClientCountsAsTheLocationItsConfigurationNames() throws Exception {
    Path cfg = Files.createTempFile("nk-client", ".toml");
    try {
      String base = Files.readString(Path.of(CLUSTER.cluster().clientConfig()));
      Files.writeString(cfg, base.replace("[client]\n", "[client]\nlocation = \"rack-7\"\n"));
      try (NodeKernel other = NodeKernel.connect(CLUSTER.cluster().meta(), cfg.toString())) {
        assertEquals("rack-7", other.location());
      }
    } finally {
      Files.deleteIfExists(cfg);
    }
  }
}
