package io.nodekernel.hadoop;

import static org.apache.hadoop.fs.impl.PathCapabilitiesSupport.validatePathCapabilityArgs;

import io.nodekernel.Capacity;
import io.nodekernel.CreateOptions;
import io.nodekernel.NkOutputStream;
import io.nodekernel.NodeKernel;
import io.nodekernel.NodeKernelException;
import io.nodekernel.NodeStatus;
import io.nodekernel.NodeType;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.net.URI;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.EnumSet;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.BlockLocation;
import org.apache.hadoop.fs.CommonPathCapabilities;
import org.apache.hadoop.fs.CreateFlag;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.FsStatus;
import org.apache.hadoop.fs.ParentNotDirectoryException;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathIsNotEmptyDirectoryException;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.security.UserGroupInformation;
import org.apache.hadoop.util.Progressable;

/**
 * Hadoop's view of a NodeKernel cluster: the {@code nk} scheme.
 *
 * <p>{@code nk://host:port/path} names the metadata server {@code host:port}; {@code fs.nk.meta} (a
 * comma list, one per metadata partition in partition order) overrides it, and {@code nk:///path}
 * takes the servers from {@code fs.nk.meta}, else from the client defaults ({@code NK_META}, the
 * client configuration file). {@code fs.nk.config} names a client configuration file (TOML). Each
 * instance holds one NodeKernel client; {@link #close()} closes it.
 *
 * <p>Node types: Directories, Tables and Bags are directories; Files and KeyValues are files
 * (KeyValues read only; they are written through NodeKernel's KV interface). Files are written by
 * one writer at a time and readers see the bytes of the writer's last {@code hflush}/{@code
 * hsync}/{@code close}. {@code create} with {@code overwrite} deletes the old File first (not one
 * atomic step). {@code rename} follows HDFS: into an existing directory, {@code false} when the
 * source is missing, the destination exists as a file or its parent is missing. {@code
 * setPermission} and {@code setTimes} (the modification time) change the node's attributes; there
 * is no {@code concat}, {@code truncate} or {@code setOwner} (NodeKernel keeps no owners).
 */
public class NodeKernelFileSystem extends FileSystem {
  /** The URI scheme. */
  public static final String SCHEME = "nk";

  /** Metadata servers, {@code host:port[,host:port...]}; overrides the URI's authority. */
  public static final String META_KEY = "fs.nk.meta";

  /** A client configuration file (TOML), as the command-line tools take. */
  public static final String CONFIG_KEY = "fs.nk.config";

  /**
   * The block size Hadoop sees ({@link FileStatus#getBlockSize()}, {@link
   * #getDefaultBlockSize(Path)}, the unit of {@link #getFileBlockLocations}): the split unit of
   * {@code FileInputFormat}. NodeKernel's own blocks (1 MiB by default) would make one task per
   * MiB; each reported block names the hosts holding most of its bytes.
   */
  public static final String BLOCK_SIZE_KEY = "fs.nk.block.size";

  /** {@value} bytes (128 MiB), HDFS's default. */
  public static final long DEFAULT_BLOCK_SIZE = 128L << 20;

  private URI uri;
  private NodeKernel nk;
  private Path workingDir;
  private String user;
  private String group;
  private long blockSize;

  /** Hadoop makes instances through {@link FileSystem#get}; call {@link #initialize} next. */
  public NodeKernelFileSystem() {}

  @Override
  public String getScheme() {
    return SCHEME;
  }

  /**
   * Connects: the metadata servers from {@code fs.nk.meta}, else the URI's authority, else the
   * client defaults; the client configuration file from {@code fs.nk.config}.
   */
  @Override
  public void initialize(URI name, Configuration conf) throws IOException {
    super.initialize(name, conf);
    setConf(conf);
    String authority = name.getAuthority();
    String meta = conf.getTrimmed(META_KEY, "");
    if (meta.isEmpty()) {
      meta = authority;
    }
    blockSize = conf.getLongBytes(BLOCK_SIZE_KEY, DEFAULT_BLOCK_SIZE);
    if (blockSize <= 0) {
      throw new IllegalArgumentException(
          BLOCK_SIZE_KEY + " must be positive, not " + conf.get(BLOCK_SIZE_KEY));
    }
    String configFile = conf.getTrimmed(CONFIG_KEY, "");
    nk = NodeKernel.connect(meta, configFile.isEmpty() ? null : configFile);
    uri = URI.create(SCHEME + "://" + (authority == null ? "" : authority) + "/");
    UserGroupInformation ugi = UserGroupInformation.getCurrentUser();
    user = ugi.getShortUserName();
    String primary = ugi.getPrimaryGroupName();
    group = primary == null || primary.isEmpty() ? user : primary;
    workingDir = makeQualified(new Path("/user/" + user));
  }

  @Override
  public URI getUri() {
    return uri;
  }

  /** NodeKernel has no delegation tokens: there is no service to get one from. */
  @Override
  public String getCanonicalServiceName() {
    return null;
  }

  @Override
  public Path getWorkingDirectory() {
    return workingDir;
  }

  @Override
  public void setWorkingDirectory(Path dir) {
    workingDir = makeQualified(dir);
  }

  /** The NodeKernel client this file system uses (for NodeKernel-only calls, e.g. KV puts). */
  public NodeKernel client() {
    return nk;
  }

  /** The NodeKernel path of {@code p}: absolute, normalized, no trailing {@code /}. */
  String nkPath(Path p) {
    String s = makeQualified(p).toUri().getPath();
    if (s == null || s.isEmpty()) {
      return "/";
    }
    while (s.length() > 1 && s.endsWith("/")) {
      s = s.substring(0, s.length() - 1);
    }
    return s;
  }

  private Path qualify(String nkPath) {
    return new Path(null, null, nkPath).makeQualified(uri, workingDir);
  }

  private static String parentOf(String nkPath) {
    int slash = nkPath.lastIndexOf('/');
    return slash <= 0 ? "/" : nkPath.substring(0, slash);
  }

  private static String nameOf(String nkPath) {
    return nkPath.substring(nkPath.lastIndexOf('/') + 1);
  }

  /**
   * The node at {@code path}, or null if there is none (NodeKernel answers TypeMismatch for a path
   * under a File: nothing is there either).
   */
  private NodeStatus lookupOrNull(String path) throws IOException {
    try {
      return nk.lookup(path);
    } catch (NodeKernelException.NotFound | NodeKernelException.TypeMismatch e) {
      return null;
    }
  }

  private static <T extends IOException> T withCause(T e, Throwable cause) {
    e.initCause(cause);
    return e;
  }

  /** The Hadoop exception for a NodeKernel failure on {@code path}, keeping it as the cause. */
  private static IOException translate(NodeKernelException e, String path) {
    if (e instanceof NodeKernelException.NotFound) {
      return withCause(new FileNotFoundException(path + ": " + e.getMessage()), e);
    }
    if (e instanceof NodeKernelException.AlreadyExists) {
      return withCause(new FileAlreadyExistsException(path + ": " + e.getMessage()), e);
    }
    if (e instanceof NodeKernelException.NotEmpty) {
      return withCause(new PathIsNotEmptyDirectoryException(path + ": " + e.getMessage()), e);
    }
    if (e instanceof NodeKernelException.CrossPartition) {
      return withCause(
          new IOException(
              path
                  + ": source and destination belong to different metadata partitions"
                  + " (NodeKernel moves nodes only within one; copy and delete instead): "
                  + e.getMessage()),
          e);
    }
    return e;
  }

  private FileStatus toStatus(NodeStatus st) {
    return toStatus(st, qualify(st.path()));
  }

  private FileStatus toStatus(NodeStatus st, Path qualified) {
    boolean dir = st.isContainer();
    return new FileStatus(
        dir ? 0 : st.size(),
        dir,
        1,
        dir ? 0 : blockSize,
        st.mtimeMillis(),
        st.mtimeMillis(),
        new FsPermission((short) (st.mode() & 07777)),
        user,
        group,
        qualified);
  }

  // ---- reading ----

  /** Opens a File or KeyValue; a directory (or Table or Bag) is a {@link FileNotFoundException}. */
  @Override
  public FSDataInputStream open(Path f, int bufferSize) throws IOException {
    String p = nkPath(f);
    try {
      return new FSDataInputStream(new NodeKernelInputStream(nk.open(p), statistics));
    } catch (NodeKernelException.TypeMismatch e) {
      throw withCause(
          new FileNotFoundException(p + " is not a File or KeyValue (or a parent is a file)"), e);
    } catch (NodeKernelException e) {
      throw translate(e, p);
    }
  }

  // ---- writing ----

  /**
   * Creates a File, and its missing parents as HDFS does. With {@code overwrite}, an existing File
   * is deleted first (two steps: a reader may see no file in between); a directory is never
   * overwritten. The block size, replication and buffer size are the cluster's own; {@code
   * permission} becomes the File's mode.
   */
  @Override
  public FSDataOutputStream create(
      Path f,
      FsPermission permission,
      boolean overwrite,
      int bufferSize,
      short replication,
      long blockSize,
      Progressable progress)
      throws IOException {
    return create(nkPath(f), permission, overwrite, true);
  }

  /** {@link #create} that fails with {@link FileNotFoundException} if the parent is missing. */
  @Override
  public FSDataOutputStream createNonRecursive(
      Path f,
      FsPermission permission,
      EnumSet<CreateFlag> flags,
      int bufferSize,
      short replication,
      long blockSize,
      Progressable progress)
      throws IOException {
    boolean overwrite = flags.contains(CreateFlag.OVERWRITE);
    if (flags.contains(CreateFlag.APPEND)) {
      Path qualified = makeQualified(f);
      if (exists(qualified)) {
        return append(qualified, bufferSize, progress);
      }
    }
    return create(nkPath(f), permission, overwrite, false);
  }

  private FSDataOutputStream create(
      String p, FsPermission permission, boolean overwrite, boolean makeParents)
      throws IOException {
    if ("/".equals(p)) {
      throw new FileAlreadyExistsException("/ is a directory");
    }
    CreateOptions options = CreateOptions.defaults();
    if (permission != null) {
      options = options.mode(permission.toShort() & 07777);
    }
    boolean deleted = false;
    boolean madeParents = false;
    while (true) {
      try {
        NkOutputStream out = nk.createFile(p, options);
        return new FSDataOutputStream(new NodeKernelOutputStream(out), statistics);
      } catch (NodeKernelException.AlreadyExists e) {
        NodeStatus existing = lookupOrNull(p);
        if (existing == null) {
          continue; // deleted meanwhile
        }
        if (existing.isContainer()) {
          throw withCause(new FileAlreadyExistsException(p + " is a directory"), e);
        }
        if (!overwrite || deleted) {
          throw withCause(new FileAlreadyExistsException(p + " already exists"), e);
        }
        try {
          nk.delete(p, false);
        } catch (NodeKernelException.NotFound gone) {
          // deleted meanwhile: create it
        } catch (NodeKernelException other) {
          throw translate(other, p);
        }
        deleted = true;
      } catch (NodeKernelException.NotFound e) {
        if (!makeParents || madeParents) {
          throw withCause(new FileNotFoundException("the parent of " + p + " does not exist"), e);
        }
        mkdirs(parentOf(p), FsPermission.getDirDefault());
        madeParents = true;
      } catch (NodeKernelException.TypeMismatch e) {
        throw parentNotDirectory(p, e);
      } catch (NodeKernelException e) {
        throw translate(e, p);
      }
    }
  }

  /**
   * A create at {@code p} failed with TypeMismatch: a {@link ParentNotDirectoryException} if the
   * nearest existing ancestor is a file, else NodeKernel's own reason (a Table holds only
   * KeyValues, a Bag only Files).
   */
  private IOException parentNotDirectory(String p, NodeKernelException e) throws IOException {
    String ancestor = parentOf(p);
    NodeStatus st = lookupOrNull(ancestor);
    while (st == null && !"/".equals(ancestor)) {
      ancestor = parentOf(ancestor);
      st = lookupOrNull(ancestor);
    }
    if (st != null && !st.isContainer()) {
      return withCause(new ParentNotDirectoryException(ancestor + " is a file"), e);
    }
    return e;
  }

  /** Appends to an existing File (one writer at a time: a second gets NodeKernel's Busy). */
  @Override
  public FSDataOutputStream append(Path f, int bufferSize, Progressable progress)
      throws IOException {
    String p = nkPath(f);
    try {
      NkOutputStream out = nk.append(p);
      return new FSDataOutputStream(new NodeKernelOutputStream(out), statistics, out.position());
    } catch (NodeKernelException.TypeMismatch e) {
      throw withCause(new FileNotFoundException(p + " is not a File"), e);
    } catch (NodeKernelException e) {
      throw translate(e, p);
    }
  }

  /** Sets the node's permission bits (NodeKernel keeps them; it has no owners or ACLs). */
  @Override
  public void setPermission(Path f, FsPermission permission) throws IOException {
    String p = nkPath(f);
    try {
      nk.setAttributes(p, permission.toShort() & 07777, -1);
    } catch (NodeKernelException e) {
      throw translate(e, p);
    }
  }

  /**
   * Sets the modification time ({@code mtime} in milliseconds; -1 keeps it). NodeKernel keeps no
   * access time: {@code atime} is ignored.
   */
  @Override
  public void setTimes(Path f, long mtime, long atime) throws IOException {
    String p = nkPath(f);
    try {
      if (mtime >= 0) {
        nk.setAttributes(p, -1, Math.multiplyExact(mtime, 1_000_000L));
      } else {
        nk.lookup(p);
      }
    } catch (NodeKernelException e) {
      throw translate(e, p);
    }
  }

  /** NodeKernel cannot join Files without copying their bytes. */
  @Override
  public void concat(Path trg, Path[] srcs) throws IOException {
    throw new UnsupportedOperationException("NodeKernel does not support concat: " + trg);
  }

  // ---- namespace ----

  /**
   * Moves {@code src} to {@code dst} in one atomic step, HDFS-style: if {@code dst} is a directory,
   * into it; {@code false} if {@code src} is missing, {@code dst} exists as a file, its parent is
   * missing or not a directory, or {@code dst} lies under {@code src}. Across metadata partitions
   * NodeKernel refuses the move ({@link IOException}).
   */
  @Override
  public boolean rename(Path src, Path dst) throws IOException {
    String from = nkPath(src);
    String to = nkPath(dst);
    if ("/".equals(from)) {
      return false;
    }
    if (to.startsWith(from + "/")) {
      return false;
    }
    if (from.equals(to)) {
      return lookupOrNull(from) != null;
    }
    try {
      nk.rename(from, to);
      return true;
    } catch (NodeKernelException.AlreadyExists e) {
      NodeStatus target = lookupOrNull(to);
      if (target == null || !target.isContainer()) {
        return false;
      }
      String into = ("/".equals(to) ? "" : to) + "/" + nameOf(from);
      if (into.equals(from)) {
        return true;
      }
      try {
        nk.rename(from, into);
        return true;
      } catch (NodeKernelException.AlreadyExists
          | NodeKernelException.NotFound
          | NodeKernelException.TypeMismatch again) {
        return false;
      } catch (NodeKernelException other) {
        throw translate(other, from);
      }
    } catch (NodeKernelException.NotFound | NodeKernelException.TypeMismatch e) {
      return false;
    } catch (NodeKernelException e) {
      throw translate(e, from);
    }
  }

  /**
   * Deletes a node; a non-empty directory only with {@code recursive} ({@link
   * PathIsNotEmptyDirectoryException} otherwise). {@code false} if nothing was there; the root is
   * never deleted.
   */
  @Override
  public boolean delete(Path f, boolean recursive) throws IOException {
    String p = nkPath(f);
    if ("/".equals(p)) {
      return false;
    }
    try {
      nk.delete(p, recursive);
      return true;
    } catch (NodeKernelException.NotFound | NodeKernelException.TypeMismatch e) {
      return false;
    } catch (NodeKernelException e) {
      throw translate(e, p);
    }
  }

  /**
   * A directory's children (one NodeKernel call), or the file itself; a non-enumerable Table lists
   * as empty.
   */
  @Override
  public FileStatus[] listStatus(Path f) throws IOException {
    String p = nkPath(f);
    List<NodeStatus> children;
    try {
      children = nk.list(p);
    } catch (NodeKernelException.TypeMismatch e) {
      return new FileStatus[] {getFileStatus(f)};
    } catch (NodeKernelException e) {
      throw translate(e, p);
    }
    FileStatus[] out = new FileStatus[children.size()];
    for (int i = 0; i < out.length; i++) {
      out[i] = toStatus(children.get(i));
    }
    return out;
  }

  /**
   * Creates a directory and its missing parents; {@code true} if it exists afterwards. A file in
   * the way is a {@link FileAlreadyExistsException} (at the path) or {@link
   * ParentNotDirectoryException} (above it).
   */
  @Override
  public boolean mkdirs(Path f, FsPermission permission) throws IOException {
    mkdirs(nkPath(f), permission);
    return true;
  }

  private void mkdirs(String p, FsPermission permission) throws IOException {
    if ("/".equals(p)) {
      return;
    }
    CreateOptions options = CreateOptions.defaults();
    if (permission != null) {
      // As HDFS: the client's umask (fs.permissions.umask-mode) applies to new directories.
      options =
          options.mode(permission.applyUMask(FsPermission.getUMask(getConf())).toShort() & 07777);
    }
    boolean madeParents = false;
    while (true) {
      try {
        nk.createContainer(p, NodeType.DIRECTORY, options);
        return;
      } catch (NodeKernelException.AlreadyExists e) {
        NodeStatus existing = lookupOrNull(p);
        if (existing == null) {
          continue; // deleted meanwhile
        }
        if (!existing.isContainer()) {
          throw withCause(new FileAlreadyExistsException(p + " is a file"), e);
        }
        return;
      } catch (NodeKernelException.NotFound e) {
        if (madeParents) {
          throw translate(e, p);
        }
        mkdirs(parentOf(p), permission);
        madeParents = true;
      } catch (NodeKernelException.TypeMismatch e) {
        throw parentNotDirectory(p, e);
      } catch (NodeKernelException e) {
        throw translate(e, p);
      }
    }
  }

  @Override
  public FileStatus getFileStatus(Path f) throws IOException {
    String p = nkPath(f);
    try {
      return toStatus(nk.lookup(p), makeQualified(f));
    } catch (NodeKernelException.TypeMismatch e) {
      throw withCause(new FileNotFoundException(p + ": a parent is a file"), e);
    } catch (NodeKernelException e) {
      throw translate(e, p);
    }
  }

  // ---- cluster ----

  /**
   * Where the File's blocks lie, one location per NodeKernel block overlapping {@code [start, start
   * + len)}: host = the storage server's host (as schedulers name hosts), name = its data address.
   */
  @Override
  public BlockLocation[] getFileBlockLocations(FileStatus file, long start, long len)
      throws IOException {
    if (file == null) {
      return null;
    }
    if (start < 0 || len < 0) {
      throw new IllegalArgumentException("Invalid start or len parameter");
    }
    if (file.isDirectory() || file.getLen() <= start) {
      return new BlockLocation[0];
    }
    String p = nkPath(file.getPath());
    List<io.nodekernel.BlockLocation> blocks;
    try {
      blocks = nk.blockLocations(p);
    } catch (NodeKernelException e) {
      throw translate(e, p);
    }
    // One location per reported block, naming the hosts that hold its bytes, most first.
    long size = file.getLen();
    long end = Math.min(size, start + Math.max(len, 1));
    List<BlockLocation> out = new ArrayList<>();
    for (long at = start - start % blockSize; at < end; at += blockSize) {
      long from = at;
      long to = Math.min(size, at + blockSize);
      Map<String, Long> bytesAt = new HashMap<>();
      Map<String, String> addressOf = new HashMap<>();
      for (io.nodekernel.BlockLocation b : blocks) {
        long overlap = Math.min(to, b.offset() + b.length()) - Math.max(from, b.offset());
        if (overlap > 0) {
          bytesAt.merge(b.host(), overlap, Long::sum);
          addressOf.putIfAbsent(b.host(), b.address());
        }
      }
      List<String> hosts = new ArrayList<>(bytesAt.keySet());
      hosts.sort(Comparator.comparing(bytesAt::get, Comparator.reverseOrder()));
      String[] names = hosts.stream().map(addressOf::get).toArray(String[]::new);
      out.add(new BlockLocation(names, hosts.toArray(new String[0]), from, to - from));
    }
    return out.toArray(new BlockLocation[0]);
  }

  /** Capacity, use and room over the cluster's live storage servers (all storage classes). */
  @Override
  public FsStatus getStatus(Path p) throws IOException {
    Capacity c = nk.capacity();
    return new FsStatus(c.capacity(), c.used(), c.remaining());
  }

  /** The block size Hadoop sees: {@value #BLOCK_SIZE_KEY} (default 128 MiB). */
  @Override
  public long getDefaultBlockSize(Path f) {
    return blockSize;
  }

  /** As {@link #getDefaultBlockSize(Path)}. */
  @Deprecated
  @Override
  public long getDefaultBlockSize() {
    return getDefaultBlockSize(new Path("/"));
  }

  @Override
  public boolean hasPathCapability(Path path, String capability) throws IOException {
    switch (validatePathCapabilityArgs(makeQualified(path), capability)) {
      case CommonPathCapabilities.FS_APPEND:
        return true;
      case CommonPathCapabilities.FS_CONCAT:
      case CommonPathCapabilities.FS_TRUNCATE:
      case CommonPathCapabilities.FS_PERMISSIONS:
        return false;
      default:
        return super.hasPathCapability(path, capability);
    }
  }

  /**
   * Closes the file system, then its NodeKernel client; streams already open stay usable until they
   * close.
   */
  @Override
  public void close() throws IOException {
    try {
      super.close();
    } finally {
      if (nk != null) {
        nk.close();
      }
    }
  }

  @Override
  public String toString() {
    return "NodeKernelFileSystem{" + uri + "}";
  }
}
