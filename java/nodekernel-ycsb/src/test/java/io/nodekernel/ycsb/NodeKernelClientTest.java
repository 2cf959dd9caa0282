package io.nodekernel.ycsb;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import io.nodekernel.NodeKernel;
import io.nodekernel.NodeType;
import io.nodekernel.TestCluster;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.Vector;
import org.junit.After;
import org.junit.Before;
import org.junit.ClassRule;
import org.junit.Test;
import site.ycsb.ByteArrayByteIterator;
import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;
import site.ycsb.StringByteIterator;

/** The NodeKernel binding against a real CLUSTER.cluster(). */
public class NodeKernelClientTest {
  private DB db;

  @ClassRule public static final TestCluster.Rule CLUSTER = new TestCluster.Rule();

  private static NodeKernel nk() {
    return CLUSTER.client();
  }

  static Properties props(String root) {
    Properties p = new Properties();
    p.setProperty(NodeKernelClient.META, CLUSTER.cluster().meta());
    p.setProperty(NodeKernelClient.CONFIG, CLUSTER.cluster().clientConfig());
    p.setProperty(NodeKernelClient.ROOT, root);
    return p;
  }

  static DB open(Properties p) throws DBException {
    DB db = new NodeKernelClient();
    db.setProperties(p);
    db.init();
    return db;
  }

  @Before
  public void openDb() throws Exception {
    db = open(props("/test/ycsb"));
  }

  @After
  public void closeDb() throws Exception {
    db.cleanup();
  }

  private static Map<String, ByteIterator> values(String... nameValue) {
    Map<String, String> m = new LinkedHashMap<>();
    for (int i = 0; i < nameValue.length; i += 2) {
      m.put(nameValue[i], nameValue[i + 1]);
    }
    return StringByteIterator.getByteIteratorMap(m);
  }

  private Map<String, String> read(String table, String key, Set<String> fields) {
    Map<String, ByteIterator> out = new HashMap<>();
    assertEquals(Status.OK, db.read(table, key, fields, out));
    return StringByteIterator.getStringMap(out);
  }

  @Test
  public void insertReadUpdateDelete() throws Exception {
    assertEquals(Status.OK, db.insert("usertable", "user1", values("f0", "a", "f1", "b")));
    assertTrue(nk().exists("/test/ycsb/usertable/user1"));
    assertEquals(NodeType.TABLE, nk().lookup("/test/ycsb/usertable").type());
    assertEquals(Map.of("f0", "a", "f1", "b"), read("usertable", "user1", null));
    assertEquals(Map.of("f1", "b"), read("usertable", "user1", Set.of("f1", "nope")));

    // Update merges: f1 changes, f2 is added, f0 stays.
    assertEquals(Status.OK, db.update("usertable", "user1", values("f1", "B", "f2", "c")));
    assertEquals(Map.of("f0", "a", "f1", "B", "f2", "c"), read("usertable", "user1", null));

    // Insert of an existing key replaces the record whole.
    assertEquals(Status.OK, db.insert("usertable", "user1", values("g", "only")));
    assertEquals(Map.of("g", "only"), read("usertable", "user1", null));

    assertEquals(Status.OK, db.delete("usertable", "user1"));
    assertFalse(nk().exists("/test/ycsb/usertable/user1"));
  }

  @Test
  public void missingKeysAreNotFound() {
    assertEquals(Status.OK, db.insert("t2", "present", values("f", "v")));
    Map<String, ByteIterator> out = new HashMap<>();
    assertEquals(Status.NOT_FOUND, db.read("t2", "absent", null, out));
    assertTrue(out.isEmpty());
    assertEquals(Status.NOT_FOUND, db.update("t2", "absent", values("f", "v")));
    assertEquals(Status.NOT_FOUND, db.delete("t2", "absent"));
    // A table never written to: its records are not found either.
    assertEquals(Status.NOT_FOUND, db.read("never", "k", null, out));
  }

  @Test
  public void binaryValuesSurvive() {
    byte[] all = new byte[256];
    for (int i = 0; i < all.length; i++) {
      all[i] = (byte) i;
    }
    Map<String, ByteIterator> v = new HashMap<>();
    v.put("bin", new ByteArrayByteIterator(all));
    assertEquals(Status.OK, db.insert("bin", "k", v));
    Map<String, ByteIterator> out = new HashMap<>();
    assertEquals(Status.OK, db.read("bin", "k", null, out));
    assertArrayEquals(all, out.get("bin").toArray());
  }

  @Test
  public void corruptRecordIsAnError() throws Exception {
    assertEquals(Status.OK, db.insert("raw", "k", values("f", "v")));
    nk().put("/test/ycsb/raw/k", "not a record".getBytes(StandardCharsets.UTF_8));
    assertEquals(Status.ERROR, db.read("raw", "k", null, new HashMap<>()));
    assertEquals(Status.ERROR, db.update("raw", "k", values("f", "w")));
  }

  @Test
  public void scanIsNotImplemented() {
    assertEquals(Status.NOT_IMPLEMENTED, db.scan("usertable", "user1", 10, null, new Vector<>()));
  }

  @Test
  public void threadsShareOneClientUntilTheLastCleanup() throws Exception {
    // A second DB object (as for a second YCSB thread) works alongside, and closing one
    // leaves the other working.
    DB second = open(props("/test/ycsb"));
    assertEquals(Status.OK, second.insert("shared", "k", values("f", "v")));
    second.cleanup();
    assertEquals(Map.of("f", "v"), read("shared", "k", null));
    second.cleanup(); // twice: no effect on the others
    assertEquals(Map.of("f", "v"), read("shared", "k", null));
  }

  @Test
  public void rootIsConfigurable() throws Exception {
    DB other = open(props("/elsewhere/deep/"));
    try {
      assertEquals(Status.OK, other.insert("t", "k", values("f", "v")));
      assertTrue(nk().exists("/elsewhere/deep/t/k"));
    } finally {
      other.cleanup();
    }
  }

  @Test
  public void relativeRootFailsInit() {
    Properties p = props("relative");
    DBException e = assertThrows(DBException.class, () -> open(p));
    assertTrue(e.getMessage(), e.getMessage().contains("absolute"));
  }
}
