package io.nodekernel.hadoop;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertSame;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import io.nodekernel.CreateOptions;
import io.nodekernel.NodeKernel;
import io.nodekernel.NodeKernelException;
import io.nodekernel.NodeType;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.net.URI;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.BlockLocation;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.FsStatus;
import org.apache.hadoop.fs.ParentNotDirectoryException;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathIsNotEmptyDirectoryException;
import org.apache.hadoop.fs.StreamCapabilities;
import org.apache.hadoop.fs.permission.FsPermission;
import org.junit.After;
import org.junit.Before;
import org.junit.Test;

/** What the contract suites do not check: locality, capacity, visibility, wiring, node types. */
public class NodeKernelFileSystemTest {
  private FileSystem fs;
  private Path dir;

  private static Configuration conf() {
    return SharedCluster.configure(new Configuration());
  }

  @Before
  public void setUp() throws IOException {
    fs = FileSystem.newInstance(SharedCluster.uri(), conf());
    dir = new Path("/unit/" + Long.toHexString(System.nanoTime()));
    assertTrue(fs.mkdirs(dir));
  }

  @After
  public void tearDown() throws IOException {
    if (fs != null) {
      fs.delete(new Path("/unit"), true);
      fs.close();
    }
  }

  private static byte[] bytes(int n) {
    byte[] b = new byte[n];
    for (int i = 0; i < n; i++) {
      b[i] = (byte) (i * 31 + 7);
    }
    return b;
  }

  private void write(Path p, byte[] data) throws IOException {
    try (FSDataOutputStream out = fs.create(p, false)) {
      out.write(data);
    }
  }

  @Test
  public void blockLocationsNameTheStorageHostAndCoverTheFile() throws IOException {
    assertEquals(128L << 20, fs.getDefaultBlockSize(dir));
    // Reported blocks of 3 MiB: each spans three of NodeKernel's 1 MiB blocks.
    Configuration small = conf();
    small.set(NodeKernelFileSystem.BLOCK_SIZE_KEY, "3m");
    try (FileSystem sfs = FileSystem.newInstance(SharedCluster.uri(), small)) {
      long bs = sfs.getDefaultBlockSize(dir);
      assertEquals(3 << 20, bs);
      int len = (int) (bs * 2 + bs / 2);
      Path p = new Path(dir, "blocks");
      write(p, bytes(len));
      FileStatus st = sfs.getFileStatus(p);
      assertEquals(len, st.getLen());
      assertEquals(bs, st.getBlockSize());

      BlockLocation[] all = sfs.getFileBlockLocations(st, 0, len);
      assertEquals(3, all.length);
      long next = 0;
      for (BlockLocation b : all) {
        assertEquals(next, b.getOffset());
        next += b.getLength();
        assertArrayEquals(new String[] {NodeKernel.localLocation()}, b.getHosts());
        assertEquals(1, b.getNames().length);
        assertTrue(b.getNames()[0], b.getNames()[0].contains(":"));
      }
      assertEquals(len, next);
      assertEquals(bs / 2, all[2].getLength());

      // A range inside the second block gives that block only.
      BlockLocation[] middle = sfs.getFileBlockLocations(st, bs + 1, 10);
      assertEquals(1, middle.length);
      assertEquals(bs, middle[0].getOffset());
      assertEquals(bs, middle[0].getLength());
      assertEquals(0, sfs.getFileBlockLocations(st, len, 10).length);
      assertEquals(0, sfs.getFileBlockLocations(sfs.getFileStatus(dir), 0, 10).length);
    }
    Configuration bad = conf();
    bad.set(NodeKernelFileSystem.BLOCK_SIZE_KEY, "0");
    assertThrows(
        IllegalArgumentException.class, () -> FileSystem.newInstance(SharedCluster.uri(), bad));
  }

  @Test
  public void statusReportsTheClusterCapacity() throws IOException {
    FsStatus before = fs.getStatus();
    assertTrue("capacity " + before.getCapacity(), before.getCapacity() > 0);
    assertEquals(before.getCapacity(), before.getUsed() + before.getRemaining());
    int len = 3 << 20;
    write(new Path(dir, "fill"), bytes(len));
    FsStatus after = fs.getStatus();
    assertTrue(
        "used " + before.getUsed() + " -> " + after.getUsed(),
        after.getUsed() >= before.getUsed() + len);
    assertEquals(after.getCapacity(), after.getUsed() + after.getRemaining());
  }

  @Test
  public void hflushMakesBytesVisibleToANewReader() throws IOException {
    Path p = new Path(dir, "flushed");
    try (FSDataOutputStream out = fs.create(p, false)) {
      assertTrue(out.hasCapability("hflush"));
      assertTrue(out.hasCapability("hsync"));
      out.write("abc".getBytes(StandardCharsets.UTF_8));
      out.hflush();
      out.write("def".getBytes(StandardCharsets.UTF_8)); // not published yet
      assertEquals(3, fs.getFileStatus(p).getLen());
      try (FSDataInputStream in = fs.open(p)) {
        byte[] got = new byte[3];
        in.readFully(0, got);
        assertEquals("abc", new String(got, StandardCharsets.UTF_8));
        assertEquals(-1, in.read(3, new byte[1], 0, 1));
      }
      out.hsync();
      assertEquals(6, fs.getFileStatus(p).getLen());
    }
  }

  @Test
  public void implKeyAndServiceLoaderBothReachTheFileSystem() throws IOException {
    Configuration withImpl = conf();
    withImpl.set("fs.nk.impl", NodeKernelFileSystem.class.getName());
    withImpl.setBoolean("fs.nk.impl.disable.cache", true);
    try (FileSystem viaImpl = FileSystem.get(SharedCluster.uri(), withImpl)) {
      assertTrue(viaImpl instanceof NodeKernelFileSystem);
      assertTrue(viaImpl.getFileStatus(dir).isDirectory());
    }

    Configuration plain = conf();
    assertSame(NodeKernelFileSystem.class, FileSystem.getFileSystemClass("nk", plain));

    // nk:/// takes the servers from fs.nk.meta.
    plain.set(NodeKernelFileSystem.META_KEY, SharedCluster.get().meta());
    try (FileSystem viaMeta = FileSystem.newInstance(URI.create("nk:///"), plain)) {
      assertEquals("nk", viaMeta.getUri().getScheme());
      FileStatus st = viaMeta.getFileStatus(dir);
      assertTrue(st.isDirectory());
      assertEquals("nk", st.getPath().toUri().getScheme());
    }
  }

  @Test
  public void errorsMapToHadoopExceptionsKeepingTheCause() throws IOException {
    Path missing = new Path(dir, "missing");
    FileNotFoundException fnf = assertThrows(FileNotFoundException.class, () -> fs.open(missing));
    assertTrue(fnf.getCause() instanceof NodeKernelException.NotFound);
    assertThrows(FileNotFoundException.class, () -> fs.getFileStatus(missing));
    assertThrows(FileNotFoundException.class, () -> fs.listStatus(missing));
    assertThrows(FileNotFoundException.class, () -> fs.append(missing));
    assertFalse(fs.delete(missing, true));
    assertFalse(fs.rename(missing, new Path(dir, "elsewhere")));

    Path file = new Path(dir, "file");
    write(file, bytes(10));
    FileAlreadyExistsException exists =
        assertThrows(FileAlreadyExistsException.class, () -> fs.create(file, false));
    assertTrue(exists.getCause() instanceof NodeKernelException.AlreadyExists);
    assertThrows(FileAlreadyExistsException.class, () -> fs.mkdirs(file));
    assertThrows(FileAlreadyExistsException.class, () -> fs.create(dir, true));
    assertThrows(ParentNotDirectoryException.class, () -> fs.create(new Path(file, "child")));
    assertThrows(ParentNotDirectoryException.class, () -> fs.mkdirs(new Path(file, "a/b")));
    assertThrows(FileNotFoundException.class, () -> fs.open(dir));
    assertThrows(
        FileNotFoundException.class,
        () ->
            fs.createNonRecursive(
                new Path(dir, "no/parent"), true, 4096, (short) 1, 1 << 20, null));

    PathIsNotEmptyDirectoryException notEmpty =
        assertThrows(PathIsNotEmptyDirectoryException.class, () -> fs.delete(dir, false));
    assertTrue(notEmpty.getCause() instanceof NodeKernelException.NotEmpty);

    assertThrows(
        UnsupportedOperationException.class,
        () -> fs.concat(file, new Path[] {new Path(dir, "other")}));

    // One writer at a time: a second appender is refused while the first holds the File.
    try (FSDataOutputStream first = fs.append(file)) {
      first.write(1);
      assertThrows(NodeKernelException.Busy.class, () -> fs.append(file));
    }
    assertEquals(11, fs.getFileStatus(file).getLen());
  }

  @Test
  public void byteBufferReadsFillADirectBufferInPlace() throws IOException {
    byte[] data = bytes(100_000);
    Path p = new Path(dir, "direct");
    write(p, data);
    try (FSDataInputStream in = fs.open(p)) {
      assertTrue(in.hasCapability(StreamCapabilities.READBYTEBUFFER));
      assertTrue(in.hasCapability(StreamCapabilities.PREADBYTEBUFFER));
      ByteBuffer buf = ByteBuffer.allocateDirect(data.length);
      while (buf.hasRemaining()) {
        assertTrue(in.read(buf) > 0);
      }
      assertEquals(-1, in.read(ByteBuffer.allocateDirect(1)));
      buf.flip();
      byte[] got = new byte[data.length];
      buf.get(got);
      assertArrayEquals(data, got);

      ByteBuffer part = ByteBuffer.allocateDirect(1000);
      in.readFully(50_000, part);
      part.flip();
      byte[] mid = new byte[1000];
      part.get(mid);
      assertArrayEquals(Arrays.copyOfRange(data, 50_000, 51_000), mid);
      assertEquals(data.length, in.getPos());
    }
  }

  @Test
  public void tablesAndBagsAreDirectoriesAndKeyValuesAreReadableFiles() throws IOException {
    NodeKernel nk = ((NodeKernelFileSystem) fs).client();
    String table = dir.toUri().getPath() + "/table";
    nk.createContainer(table, NodeType.TABLE, CreateOptions.defaults());
    nk.put(table + "/key", "value".getBytes(StandardCharsets.UTF_8));
    String bag = dir.toUri().getPath() + "/bag";
    nk.createContainer(bag, NodeType.BAG, CreateOptions.defaults());

    assertTrue(fs.getFileStatus(new Path(table)).isDirectory());
    assertTrue(fs.getFileStatus(new Path(bag)).isDirectory());
    FileStatus[] kvs = fs.listStatus(new Path(table));
    assertEquals(1, kvs.length);
    assertTrue(kvs[0].isFile());
    assertEquals(5, kvs[0].getLen());
    assertEquals("key", kvs[0].getPath().getName());
    try (FSDataInputStream in = fs.open(kvs[0].getPath())) {
      byte[] got = new byte[5];
      in.readFully(got);
      assertEquals("value", new String(got, StandardCharsets.UTF_8));
    }

    // A listed file lists itself.
    FileStatus[] self = fs.listStatus(kvs[0].getPath());
    assertEquals(1, self.length);
    assertEquals(kvs[0].getPath(), self[0].getPath());
  }

  @Test
  public void newNodesTakeTheUmaskedMode() throws IOException {
    Path sub = new Path(dir, "sub");
    assertTrue(fs.mkdirs(sub)); // 0777 less the default umask 022
    assertEquals(new FsPermission((short) 0755), fs.getFileStatus(sub).getPermission());
    Path file = new Path(sub, "file");
    write(file, bytes(1)); // 0666 less 022
    assertEquals(new FsPermission((short) 0644), fs.getFileStatus(file).getPermission());
  }

  @Test
  public void closedFileSystemRefusesCalls() throws IOException {
    FileSystem other = FileSystem.newInstance(SharedCluster.uri(), conf());
    assertTrue(other.exists(dir));
    other.close();
    assertThrows(IOException.class, () -> other.getFileStatus(dir));
  }
}
