package io.nodekernel.ycsb;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;
import static org.junit.Assume.assumeTrue;

import io.nodekernel.TestCluster;
import java.io.File;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Test;
import redis.clients.jedis.Jedis;
import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.Status;
import site.ycsb.StringByteIterator;

/** The Redis binding against a redis-server of its own; skipped where none is installed. */
public class RedisClientTest {
  private static Process redis;
  private static Path dir;
  private static int port;

  private static String onPath(String name) {
    for (String d : System.getenv().getOrDefault("PATH", "").split(File.pathSeparator)) {
      Path p = Path.of(d, name);
      if (Files.isExecutable(p)) {
        return p.toString();
      }
    }
    return null;
  }

  @BeforeClass
  public static void start() throws Exception {
    String bin = onPath("redis-server");
    // scripts/java.sh installs it and sets NK_REQUIRE_REDIS: there the test must run.
    if (bin == null && "1".equals(System.getenv("NK_REQUIRE_REDIS"))) {
      throw new AssertionError("redis-server is not on PATH and NK_REQUIRE_REDIS=1");
    }
    assumeTrue("redis-server is not on PATH", bin != null);
    dir = Files.createTempDirectory("nk-ycsb-redis");
    // A free port: taken from the kernel, then handed to Redis (a race only with
    // another process binding it in between, which makes the ping below fail clearly).
    try (ServerSocket s = new ServerSocket(0)) {
      port = s.getLocalPort();
    }
    redis =
        new ProcessBuilder(
                bin,
                "--port",
                "" + port,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                dir.toString())
            .redirectErrorStream(true)
            .redirectOutput(dir.resolve("redis.log").toFile())
            .start();
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(TestCluster.HANG_SECONDS);
    while (true) {
      try (Jedis j = new Jedis("127.0.0.1", port)) {
        j.ping();
        return;
      } catch (RuntimeException e) {
        if (!redis.isAlive() || System.nanoTime() > deadline) {
          throw new AssertionError(
              "redis-server did not start: " + Files.readString(dir.resolve("redis.log")), e);
        }
        Thread.sleep(50);
      }
    }
  }

  @AfterClass
  public static void stop() throws Exception {
    if (redis != null) {
      redis.destroy();
      redis.waitFor(TestCluster.HANG_SECONDS, TimeUnit.SECONDS);
    }
    if (dir != null) {
      try (var all = Files.walk(dir)) {
        all.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
      }
    }
  }

  private static Properties props() {
    Properties p = new Properties();
    p.setProperty(RedisClient.HOST, "127.0.0.1");
    p.setProperty(RedisClient.PORT, "" + port);
    return p;
  }

  @Test
  public void insertReadUpdateDelete() throws Exception {
    DB db = new RedisClient();
    db.setProperties(props());
    db.init();
    try {
      Map<String, String> v = Map.of("f0", "a", "f1", "b");
      assertEquals(Status.OK, db.insert("t", "k", StringByteIterator.getByteIteratorMap(v)));
      Map<String, ByteIterator> out = new HashMap<>();
      assertEquals(Status.OK, db.read("t", "k", Set.of("f1"), out));
      assertEquals(Map.of("f1", "b"), StringByteIterator.getStringMap(out));
      assertEquals(
          Status.OK, db.update("t", "k", StringByteIterator.getByteIteratorMap(Map.of("f1", "B"))));
      out.clear();
      assertEquals(Status.OK, db.read("t", "k", null, out));
      assertEquals(Map.of("f0", "a", "f1", "B"), StringByteIterator.getStringMap(out));
      // The same bytes as the NodeKernel binding stores.
      try (Jedis j = new Jedis("127.0.0.1", port)) {
        assertEquals(
            RecordCodec.decode(j.get("t:k".getBytes(java.nio.charset.StandardCharsets.UTF_8)))
                .keySet(),
            Set.of("f0", "f1"));
      }
      assertEquals(Status.OK, db.delete("t", "k"));
      assertEquals(Status.NOT_FOUND, db.read("t", "k", null, out));
      assertEquals(Status.NOT_FOUND, db.update("t", "k", StringByteIterator.getByteIteratorMap(v)));
      assertEquals(Status.NOT_FOUND, db.delete("t", "k"));
    } finally {
      db.cleanup();
    }
  }

  @Test
  public void ycsbWorkloadA() throws Exception {
    List<String> p = new ArrayList<>(Ycsb.workload("a", 200, 400));
    p.add(RedisClient.HOST + "=127.0.0.1");
    p.add(RedisClient.PORT + "=" + port);
    String db = RedisClient.class.getName();
    Ycsb.run(db, "-load", p, 2).assertAllOk(200);
    Ycsb.Report a = Ycsb.run(db, "-t", p, 2);
    a.assertAllOk(400);
    assertTrue(a.output, a.count("UPDATE", "Operations") > 0);
  }
}
