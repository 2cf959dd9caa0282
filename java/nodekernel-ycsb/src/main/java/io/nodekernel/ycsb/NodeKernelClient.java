package io.nodekernel.ycsb;

import io.nodekernel.CreateOptions;
import io.nodekernel.NodeKernel;
import io.nodekernel.NodeKernelException;
import io.nodekernel.NodeType;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.Vector;
import java.util.concurrent.ConcurrentHashMap;
import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;

/**
 * YCSB binding for NodeKernel: a YCSB table is a NodeKernel Table at {@code <root>/<table>}, a
 * record is a KeyValue {@code <root>/<table>/<key>} whose value holds all its fields ({@link
 * RecordCodec}).
 *
 * <p>Properties:
 *
 * <ul>
 *   <li>{@code nodekernel.meta}: metadata servers ({@code host:port}, comma-separated); else {@code
 *       NK_META}, the client configuration, {@code 127.0.0.1:9060}.
 *   <li>{@code nodekernel.config}: a client configuration file (TOML); else the default lookup.
 *   <li>{@code nodekernel.root}: the directory the tables live in, default {@code /ycsb} (created
 *       with its parents).
 *   <li>{@code nodekernel.enumerable}: whether tables are created enumerable (listed by {@code nk
 *       ls}), default true; false makes inserting new keys cheaper.
 * </ul>
 *
 * <p>YCSB makes one DB object per thread; they share one {@link NodeKernel} client per JVM
 * (thread-safe), connected by the first {@link #init} and closed by the last {@link #cleanup}; the
 * connection properties of the first one count.
 *
 * <p>{@link #update} is read-modify-write (get, merge, put) and not atomic: of two concurrent
 * updates of one record, one can overwrite the other's fields. The Redis binding here does the
 * same, so both do the same work per operation. {@link #scan} is not implemented: NodeKernel keeps
 * no key order, and workloads A-D and F do not scan.
 */
public class NodeKernelClient extends DB {
  public static final String META = "nodekernel.meta";
  public static final String CONFIG = "nodekernel.config";
  public static final String ROOT = "nodekernel.root";
  public static final String ENUMERABLE = "nodekernel.enumerable";
  public static final String DEFAULT_ROOT = "/ycsb";

  private static final Object LOCK = new Object();
  private static NodeKernel shared;
  private static int users;

  /** Roots and tables known to exist on {@link #shared}. */
  private static final Set<String> CREATED = ConcurrentHashMap.newKeySet();

  private NodeKernel nk;
  private String root;
  private CreateOptions tableOptions;

  /** This thread's buffer for encoded records (direct: the native library reads it in place). */
  private ByteBuffer out = ByteBuffer.allocateDirect(4096);

  @Override
  public void init() throws DBException {
    Properties p = getProperties();
    root = p.getProperty(ROOT, DEFAULT_ROOT);
    while (root.length() > 1 && root.endsWith("/")) {
      root = root.substring(0, root.length() - 1);
    }
    if (!root.startsWith("/")) {
      throw new DBException(ROOT + " must be an absolute path, not \"" + root + "\"");
    }
    tableOptions =
        CreateOptions.defaults()
            .enumerable(Boolean.parseBoolean(p.getProperty(ENUMERABLE, "true")));
    String meta = emptyToNull(p.getProperty(META));
    String config = emptyToNull(p.getProperty(CONFIG));
    synchronized (LOCK) {
      if (shared == null) {
        try {
          shared = NodeKernel.connect(meta, config);
        } catch (IOException e) {
          throw new DBException(
              "cannot connect to NodeKernel ("
                  + (meta == null ? "NK_META or the client configuration" : meta)
                  + "): "
                  + e.getMessage(),
              e);
        }
      }
      if (!root.equals("/") && !CREATED.contains(root)) {
        try {
          shared.mkdir(root, true);
        } catch (IOException e) {
          if (users == 0) {
            shared.close();
            shared = null;
          }
          throw new DBException("cannot create " + root + ": " + e.getMessage(), e);
        }
        CREATED.add(root);
      }
      users++;
      nk = shared;
    }
  }

  @Override
  public void cleanup() throws DBException {
    synchronized (LOCK) {
      if (nk == null) {
        return;
      }
      nk = null;
      if (--users == 0) {
        shared.close();
        shared = null;
        CREATED.clear();
      }
    }
  }

  private static String emptyToNull(String s) {
    return s == null || s.isEmpty() ? null : s;
  }

  private String tablePath(String table) {
    return root.equals("/") ? "/" + table : root + "/" + table;
  }

  /** The record's path; creates the table the first time this JVM writes to it. */
  private String recordPath(String table, String key, boolean create) throws IOException {
    String t = tablePath(table);
    if (create && !CREATED.contains(t)) {
      try {
        nk.createContainer(t, NodeType.TABLE, tableOptions);
      } catch (NodeKernelException.AlreadyExists e) {
        // Another thread or client made it: fine.
      }
      CREATED.add(t);
    }
    return t + "/" + key;
  }

  private static Status fail(String op, String path, Exception e) {
    System.err.println("nodekernel: " + op + " " + path + ": " + e);
    return Status.ERROR;
  }

  @Override
  public Status read(
      String table, String key, Set<String> fields, Map<String, ByteIterator> result) {
    String path = tablePath(table) + "/" + key;
    try {
      RecordCodec.decode(nk.get(path), fields, result);
      return Status.OK;
    } catch (NodeKernelException.NotFound e) {
      return Status.NOT_FOUND;
    } catch (IOException e) {
      return fail("read", path, e);
    }
  }

  @Override
  public Status scan(
      String table,
      String startkey,
      int recordcount,
      Set<String> fields,
      Vector<HashMap<String, ByteIterator>> result) {
    return Status.NOT_IMPLEMENTED;
  }

  @Override
  public Status update(String table, String key, Map<String, ByteIterator> values) {
    String path = tablePath(table) + "/" + key;
    try {
      Map<String, byte[]> updates = RecordCodec.toBytes(values);
      put(path, RecordCodec.merge(nk.get(path), updates));
      return Status.OK;
    } catch (NodeKernelException.NotFound e) {
      return Status.NOT_FOUND;
    } catch (IOException e) {
      return fail("update", path, e);
    }
  }

  @Override
  public Status insert(String table, String key, Map<String, ByteIterator> values) {
    String path = tablePath(table) + "/" + key;
    try {
      path = recordPath(table, key, true);
      put(path, RecordCodec.toBytes(values));
      return Status.OK;
    } catch (IOException e) {
      return fail("insert", path, e);
    }
  }

  @Override
  public Status delete(String table, String key) {
    String path = tablePath(table) + "/" + key;
    try {
      nk.delete(path, false);
      return Status.OK;
    } catch (NodeKernelException.NotFound e) {
      return Status.NOT_FOUND;
    } catch (IOException e) {
      return fail("delete", path, e);
    }
  }

  /** Encodes into this thread's direct buffer and stores it (no further copy in Java). */
  private void put(String path, Map<String, byte[]> fields) throws IOException {
    int size = RecordCodec.encodedSize(fields);
    if (out.capacity() < size) {
      out = ByteBuffer.allocateDirect(Math.max(size, out.capacity() * 2));
    }
    out.clear();
    RecordCodec.encode(fields, out);
    out.flip();
    nk.put(path, out);
  }
}
