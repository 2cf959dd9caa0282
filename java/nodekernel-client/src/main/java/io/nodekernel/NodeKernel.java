package io.nodekernel;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.OptionalLong;

/**
 * A connection to a NodeKernel cluster: the Java face of the Rust client (through JNI; Java never
 * speaks the protocol itself). Thread-safe; many threads may call at once. Close it when done
 * (connections and the native resources go with it).
 *
 * <pre>{@code
 * try (NodeKernel nk = NodeKernel.connect("meta-host:9060")) {
 *   nk.mkdir("/jobs", true);
 *   try (NkOutputStream out = nk.createFile("/jobs/part-0")) {
 *     out.write(bytes);
 *   }
 *   nk.put("/kv/answer", "42".getBytes());
 * }
 * }</pre>
 *
 * <p>Every failure is a {@link NodeKernelException} of the error code's subclass (for example
 * {@link NodeKernelException.NotFound}); bad arguments are {@link IllegalArgumentException}s.
 */
public final class NodeKernel implements AutoCloseable {
  private final Handle handle;

  private NodeKernel(long handle) {
    this.handle = new Handle(this, handle, Native::disconnect);
  }

  /**
   * Connects as the command-line tools do: the metadata servers from {@code NK_META}, else those of
   * the client configuration file {@code NK_CONFIG}, else {@code 127.0.0.1:9060}; the other
   * settings (timeouts, security) from {@code NK_CONFIG} when set.
   */
  public static NodeKernel connect() throws IOException {
    return connect(null, null);
  }

  /**
   * Connects to the metadata servers {@code meta} ({@code host:port}, comma-separated for several
   * partitions, in partition order), or as {@link #connect()} when null.
   */
  public static NodeKernel connect(String meta) throws IOException {
    return connect(meta, null);
  }

  /**
   * Connects with the client configuration file {@code configFile} (TOML: {@code [client]}, {@code
   * [security]}, ...); {@code meta}, when not null, overrides its server list.
   */
  public static NodeKernel connect(String meta, String configFile) throws IOException {
    return new NodeKernel(Native.connect(meta, configFile));
  }

  /**
   * The location a client counts as when its configuration names none: this host's name. A
   * connected client's own location is {@link #location()}.
   */
  public static String localLocation() {
    return Native.localLocation();
  }

  /**
   * The location this client counts as for location affinity ({@link
   * CreateOptions#local(boolean)}): {@code [client] location} of its configuration, else the host
   * name. Storage servers on the same host name this location for their blocks ({@link
   * BlockLocation#host()}).
   */
  public String location() throws IOException {
    return Native.location(handle());
  }

  long handle() throws IOException {
    long h = handle.get();
    if (h == 0) {
      throw new IOException("this NodeKernel client is closed");
    }
    return h;
  }

  private static String path(String path) {
    return Objects.requireNonNull(path, "path");
  }

  /** Creates a Directory; with {@code parents}, also missing parents, and no error if it exists. */
  public void mkdir(String path, boolean parents) throws IOException {
    Native.mkdir(handle(), path(path), parents);
  }

  /** What the metadata server knows of the node at {@code path}. */
  public NodeStatus lookup(String path) throws IOException {
    return NodeStatus.decode(path, Native.lookup(handle(), path(path)), 0);
  }

  /**
   * Changes the permission bits ({@code mode}, 0 to 07777, or -1 to keep them) and/or the
   * modification time ({@code mtimeNanos} since the Unix epoch, or -1 to keep it) of the node at
   * {@code path}; returns its status as it is now.
   */
  public NodeStatus setAttributes(String path, int mode, long mtimeNanos) throws IOException {
    if (mode < -1 || mode > 07777) {
      throw new IllegalArgumentException(
          "mode " + Integer.toOctalString(mode) + " is not 0..07777");
    }
    if (mtimeNanos < -1) {
      throw new IllegalArgumentException("negative modification time " + mtimeNanos);
    }
    return NodeStatus.decode(path, Native.setAttrs(handle(), path(path), mode, mtimeNanos), 0);
  }

  /**
   * Gives the node at {@code path} (with its subtree) a new TTL from now, or with {@code null} none
   * (it then never expires); returns its status as it is now. See docs/lifecycle.md.
   */
  public NodeStatus expire(String path, Duration ttl) throws IOException {
    long ms = ttl == null ? -1 : CreateOptions.millis("TTL", ttl);
    return NodeStatus.decode(path, Native.expire(handle(), path(path), ms), 0);
  }

  /**
   * Gives the Directory, Table or Bag at {@code path} a TTL for the children created in it from now
   * on that name none ({@code null}: no child TTL); returns its status as it is now.
   */
  public NodeStatus setChildTtl(String path, Duration ttl) throws IOException {
    long ms = ttl == null ? 0 : CreateOptions.millis("child TTL", ttl);
    return NodeStatus.decode(path, Native.setChildTtl(handle(), path(path), ms), 0);
  }

  /** Whether a node exists at {@code path}. */
  public boolean exists(String path) throws IOException {
    try {
      lookup(path);
      return true;
    } catch (NodeKernelException.NotFound e) {
      return false;
    }
  }

  /** Names of a container's children (not of a Table created non-enumerable). */
  public List<String> enumerate(String path) throws IOException {
    return Arrays.asList(Native.enumerate(handle(), path(path)));
  }

  /**
   * A container's children with their status, looked up together (children removed meanwhile are
   * left out).
   */
  public List<NodeStatus> list(String path) throws IOException {
    Object[] pair = Native.list(handle(), path(path));
    String[] names = (String[]) pair[0];
    long[] stats = (long[]) pair[1];
    String dir = path.endsWith("/") ? path : path + "/";
    List<NodeStatus> out = new ArrayList<>(names.length);
    for (int i = 0; i < names.length; i++) {
      out.add(NodeStatus.decode(dir + names[i], stats, i * NodeStatus.FIELDS));
    }
    return out;
  }

  /** Deletes a node; a non-empty container only with {@code recursive}. */
  public void delete(String path, boolean recursive) throws IOException {
    Native.delete(handle(), path(path), recursive);
  }

  /** Atomically moves {@code src} to {@code dst}, which must not exist. */
  public void rename(String src, String dst) throws IOException {
    rename(src, dst, false);
  }

  /**
   * Atomically moves {@code src} to {@code dst}; with {@code replace}, an existing {@code dst} of
   * the same kind (data node, or empty container) is replaced in the same step.
   */
  public void rename(String src, String dst, boolean replace) throws IOException {
    Native.rename(handle(), path(src), path(dst), replace);
  }

  private long create(String path, NodeType type, CreateOptions o) throws IOException {
    return create(path, type, o, false);
  }

  private long create(String path, NodeType type, CreateOptions o, boolean openExisting)
      throws IOException {
    Objects.requireNonNull(o, "options");
    return Native.create(
        handle(),
        path(path),
        type.code(),
        o.storageClass,
        o.local,
        o.pinned,
        o.enumerable,
        o.mode,
        o.sizeHint,
        o.bufferSize,
        o.sliceSize,
        openExisting,
        o.ttlMillis,
        o.childTtlMillis,
        o.session == null ? 0 : o.session.handle());
  }

  /** Creates a node of a container type (Directory, Table or Bag). */
  public void createContainer(String path, NodeType type, CreateOptions options)
      throws IOException {
    if (type.isData()) {
      throw new IllegalArgumentException(
          type + " is not a container type; use createFile or createKeyValue");
    }
    create(path, type, options);
  }

  /** Creates a File and opens it for writing (one writer at a time). */
  public NkOutputStream createFile(String path) throws IOException {
    return createFile(path, CreateOptions.defaults());
  }

  public NkOutputStream createFile(String path, CreateOptions options) throws IOException {
    return new NkOutputStream(path, create(path, NodeType.FILE, options));
  }

  /**
   * Creates (or replaces) a KeyValue written as a stream: readers see the old value until the
   * stream closes, then the whole new one; {@link NkOutputStream#abort()} leaves the old one.
   */
  public NkOutputStream createKeyValue(String path, CreateOptions options) throws IOException {
    return new NkOutputStream(path, create(path, NodeType.KEY_VALUE, options));
  }

  /** Opens an existing File to append to it. */
  public NkOutputStream append(String path) throws IOException {
    return append(path, CreateOptions.defaults());
  }

  /** {@link #append(String)} with the writer buffer of {@code options}. */
  public NkOutputStream append(String path, CreateOptions options) throws IOException {
    return new NkOutputStream(
        path, Native.append(handle(), path(path), options.bufferSize, options.sliceSize));
  }

  /**
   * Opens the File at {@code path} to append to it, creating it with {@code options} if there is
   * none, in one metadata call. The options other than the writer buffer are ignored for an
   * existing File. Another kind of node at {@code path} is {@link
   * NodeKernelException.AlreadyExists}; a File another writer holds is {@link
   * NodeKernelException.Busy}.
   */
  public NkOutputStream appendOrCreate(String path, CreateOptions options) throws IOException {
    return new NkOutputStream(path, create(path, NodeType.FILE, options, true));
  }

  /** Opens a File or KeyValue for reading (sequential and positional). */
  public NkInputStream open(String path) throws IOException {
    long[] r = Native.openReader(handle(), path(path));
    NodeStatus st = NodeStatus.decode(path, r, 1);
    return new NkInputStream(path, r[0], st.size(), true);
  }

  /** Opens a Bag: all its Files, in listing order, as one sequential stream. */
  public NkInputStream openBag(String path) throws IOException {
    return openBag(path, 0);
  }

  /**
   * {@link #openBag(String)} with up to {@code readsInFlight} block reads outstanding (0: the
   * default, 16).
   */
  public NkInputStream openBag(String path, int readsInFlight) throws IOException {
    long[] r = Native.openBag(handle(), path(path), readsInFlight);
    return new NkInputStream(path, r[0], r[1], false);
  }

  /**
   * Opens byte ranges of Files and KeyValues, in the order given, as one sequential stream with up
   * to {@code readsInFlight} block reads outstanding across range boundaries (0: the default, 16):
   * a Bag's multistream over chosen ranges. Each path is looked up once before any byte is read; a
   * range past its node's published size fails with {@link NodeKernelException.OutOfRange}, never a
   * short stream.
   */
  public NkInputStream openRanges(List<FileRange> ranges, int readsInFlight) throws IOException {
    int n = ranges.size();
    String[] paths = new String[n];
    long[] offsets = new long[n];
    long[] lengths = new long[n];
    for (int i = 0; i < n; i++) {
      FileRange r = ranges.get(i);
      paths[i] = r.path();
      offsets[i] = r.offset();
      lengths[i] = r.length();
    }
    long[] h = Native.openRanges(handle(), paths, offsets, lengths, readsInFlight);
    return new NkInputStream(n == 0 ? "(no ranges)" : paths[0] + " and others", h[0], h[1], false);
  }

  /** Stores {@code value} at {@code path} (a KeyValue, replaced as a whole). */
  public void put(String path, byte[] value) throws IOException {
    put(path, ByteBuffer.wrap(value));
  }

  /**
   * Stores the buffer's remaining bytes at {@code path}; a direct buffer is read in place. The
   * buffer's position is not moved.
   */
  public void put(String path, ByteBuffer value) throws IOException {
    ByteBuffer src = value;
    if (!value.isDirect()) {
      src = Scratch.get(value.remaining());
      src.put(value.duplicate()).flip();
    }
    Native.put(handle(), path(path), src, src.position(), src.remaining());
  }

  /** The whole value of a KeyValue (or File) at {@code path}. */
  public byte[] get(String path) throws IOException {
    return Native.get(handle(), path(path));
  }

  /**
   * The whole values at {@code paths}, in the order given, with up to {@code inFlight} gets
   * outstanding (0: the default, 16): one call instead of a round trip per key. A missing key's
   * entry is {@code null}; any other failure is thrown. At most 65536 paths.
   */
  public List<byte[]> getMany(List<String> paths, int inFlight) throws IOException {
    String[] keys = new String[paths.size()];
    for (int i = 0; i < keys.length; i++) {
      keys[i] = path(paths.get(i));
    }
    return Arrays.asList(Native.getMany(handle(), keys, inFlight));
  }

  /**
   * Stores {@code values.get(i)} at {@code paths.get(i)} for every {@code i}, each as {@link
   * #put(String, byte[])}, with up to {@code inFlight} puts outstanding (0: the default, 64; at
   * most 4096): one call instead of a round trip per value. Every item is tried; if any fail, the
   * exception of the first failure (in the order given, its class that of its code, its message
   * naming its path) is thrown once all have ended, with every other failure in its {@link
   * Throwable#getSuppressed()}; every other item is stored. A path given twice keeps its last
   * value. At most 65536 items.
   */
  public void putMany(List<String> paths, List<byte[]> values, int inFlight) throws IOException {
    if (paths.size() != values.size()) {
      throw new IllegalArgumentException(paths.size() + " paths but " + values.size() + " values");
    }
    String[] keys = new String[paths.size()];
    for (int i = 0; i < keys.length; i++) {
      keys[i] = path(paths.get(i));
    }
    Native.putMany(handle(), keys, values.toArray(new byte[0][]), inFlight);
  }

  /** {@link #putMany(List, List, int)} of a map's entries, in its iteration order. */
  public void putMany(Map<String, byte[]> items, int inFlight) throws IOException {
    List<String> paths = new ArrayList<>(items.size());
    List<byte[]> values = new ArrayList<>(items.size());
    for (Map.Entry<String, byte[]> e : items.entrySet()) {
      paths.add(e.getKey());
      values.add(e.getValue());
    }
    putMany(paths, values, inFlight);
  }

  /**
   * Deletes every path, each as {@link #delete(String, boolean)}, with up to {@code inFlight}
   * deletes outstanding (0: the default, 64; at most 4096). Every path is tried; failures (a
   * missing path is {@link NodeKernelException.NotFound}, as with {@code delete}) are thrown as in
   * {@link #putMany(List, List, int)} once all have ended; every other path is gone. At most 65536
   * paths.
   */
  public void deleteMany(List<String> paths, boolean recursive, int inFlight) throws IOException {
    String[] keys = new String[paths.size()];
    for (int i = 0; i < keys.length; i++) {
      keys[i] = path(paths.get(i));
    }
    Native.deleteMany(handle(), keys, recursive, inFlight);
  }

  /**
   * Reads the value at {@code path} into {@code dst} (a direct buffer in place) if it fits in its
   * remaining bytes, advancing its position; returns the value's size either way, so a result above
   * {@code dst.remaining()} means nothing was read.
   */
  public long get(String path, ByteBuffer dst) throws IOException {
    if (dst.isReadOnly()) {
      throw new java.nio.ReadOnlyBufferException();
    }
    if (dst.isDirect()) {
      long size = Native.getInto(handle(), path(path), dst, dst.position(), dst.remaining());
      if (size <= dst.remaining()) {
        dst.position(dst.position() + (int) size);
      }
      return size;
    }
    ByteBuffer tmp = Scratch.get(dst.remaining());
    long size = Native.getInto(handle(), path(path), tmp, 0, tmp.remaining());
    if (size <= dst.remaining()) {
      tmp.limit((int) size);
      dst.put(tmp);
    }
    return size;
  }

  /** Where each block of a File or KeyValue lies, in order. */
  public List<BlockLocation> blockLocations(String path) throws IOException {
    NodeStatus st = lookup(path);
    String[] hosts = Native.blockLocations(handle(), path(path));
    long bs = Math.max(1, st.blockSize());
    List<BlockLocation> out = new ArrayList<>(hosts.length);
    for (int i = 0; i < hosts.length; i++) {
      long off = i * bs;
      if (off >= st.size() && !(i == 0 && st.size() == 0)) {
        break; // allocated ahead by a writer, not published yet
      }
      String[] hostAddr = hosts[i].split("\t", 2);
      out.add(
          new BlockLocation(
              off,
              Math.min(bs, st.size() - off),
              hostAddr[0],
              hostAddr.length > 1 ? hostAddr[1] : hostAddr[0]));
    }
    return out;
  }

  /**
   * Sets the quota of the Directory, Table or Bag at {@code path}: at most {@code bytes} of storage
   * held below it (blocks and small values' pieces) and at most {@code nodes} nodes below it; an
   * empty limit is no limit, and both empty clear the quota. A write or create that would take the
   * subtree past a limit then throws {@link NodeKernelException.QuotaExceeded}, whose message
   * starts with the quota root's path, and changes nothing; a limit below what the subtree holds
   * refuses only growth.
   *
   * @return the subtree's usage with its new quota
   */
  public Usage setQuota(String path, OptionalLong bytes, OptionalLong nodes) throws IOException {
    long b = limit(bytes, "bytes");
    long n = limit(nodes, "nodes");
    return Usage.of(Native.setQuota(handle(), path(path), b, n));
  }

  /** Removes the quota of the container at {@code path}. */
  public Usage clearQuota(String path) throws IOException {
    return setQuota(path, OptionalLong.empty(), OptionalLong.empty());
  }

  private static long limit(OptionalLong v, String what) {
    Objects.requireNonNull(v, what);
    if (v.isPresent() && v.getAsLong() < 0) {
      throw new IllegalArgumentException(
          "a quota of " + v.getAsLong() + " " + what + ": limits are at least 0");
    }
    return v.orElse(-1);
  }

  /**
   * The disk usage of the subtree at {@code path} (its nodes, bytes of data, storage held per
   * class, and quota), from the metadata servers' accounting: instant whatever the subtree's size.
   */
  public Usage du(String path) throws IOException {
    return Usage.of(Native.du(handle(), path(path)));
  }

  /**
   * Opens a session with a lease of {@code lease} (the metadata servers keep it between 1 s and 1
   * h; {@link Session#DEFAULT_LEASE}, 10 s, is a good default), renewed in the background from now
   * on. A node created with {@link CreateOptions#session(Session)}, or bound later with {@link
   * Session#bindExisting(String)}, is removed with its subtree when the session is closed, or when
   * its lease lapses because this process stopped renewing it (it was killed, crashed, hung or was
   * cut off). See docs/lifecycle.md, "Sessions".
   */
  public Session session(Duration lease) throws IOException {
    long ms = CreateOptions.millis("session lease", lease);
    long[] r = Native.openSession(handle(), ms);
    return new Session(r[0], Duration.ofMillis(r[1]));
  }

  /** Capacity and use over the live storage servers. */
  public Capacity capacity() throws IOException {
    long[] c = Native.capacity(handle());
    return new Capacity(c[0], c[1]);
  }

  /**
   * Disconnects. Calls still running finish first; later calls throw {@link IOException}. Streams
   * and sessions opened from this client stay usable until closed (a session keeps what it bound
   * until it is closed, collected or its process exits). Closing twice does nothing; a client
   * collected unclosed is disconnected then.
   */
  @Override
  public void close() {
    long h = handle.take();
    if (h != 0) {
      Native.disconnect(h);
    }
  }
}
