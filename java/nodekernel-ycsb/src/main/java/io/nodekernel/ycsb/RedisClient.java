package io.nodekernel.ycsb;

import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.Vector;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.exceptions.JedisException;
import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;

/**
 * YCSB binding for Redis with {@link RecordCodec}'s encoding, the baseline for {@link
 * NodeKernelClient}: a record is one string key {@code <table>:<key>} whose value holds all its
 * fields, read with {@code GET} and written with {@code SET} (YCSB's own Redis binding keeps hashes
 * and is not on Maven Central). {@link #update} is get, merge, set, not atomic, exactly as
 * NodeKernel's, so both do the same work per operation.
 *
 * <p>Properties: {@code redis.host} (default {@code localhost}), {@code redis.port} (default 6379),
 * {@code redis.timeout} (milliseconds, default 2000). One connection per YCSB thread.
 */
public class RedisClient extends DB {
  public static final String HOST = "redis.host";
  public static final String PORT = "redis.port";
  public static final String TIMEOUT = "redis.timeout";

  private Jedis jedis;

  @Override
  public void init() throws DBException {
    Properties p = getProperties();
    String host = p.getProperty(HOST, "localhost");
    int port;
    int timeout;
    try {
      port = Integer.parseInt(p.getProperty(PORT, "6379"));
      timeout = Integer.parseInt(p.getProperty(TIMEOUT, "2000"));
    } catch (NumberFormatException e) {
      throw new DBException("bad " + PORT + " or " + TIMEOUT + ": " + e.getMessage(), e);
    }
    try {
      jedis = new Jedis(host, port, timeout);
      jedis.ping();
    } catch (JedisException e) {
      throw new DBException("cannot reach Redis at " + host + ":" + port + ": " + e, e);
    }
  }

  @Override
  public void cleanup() throws DBException {
    if (jedis != null) {
      jedis.close();
      jedis = null;
    }
  }

  private static byte[] key(String table, String key) {
    return (table + ":" + key).getBytes(StandardCharsets.UTF_8);
  }

  private static Status fail(String op, String table, String key, Exception e) {
    System.err.println("redis: " + op + " " + table + ":" + key + ": " + e);
    return Status.ERROR;
  }

  @Override
  public Status read(
      String table, String key, Set<String> fields, Map<String, ByteIterator> result) {
    try {
      byte[] v = jedis.get(key(table, key));
      if (v == null) {
        return Status.NOT_FOUND;
      }
      RecordCodec.decode(v, fields, result);
      return Status.OK;
    } catch (JedisException | RecordCodec.CorruptRecordException e) {
      return fail("read", table, key, e);
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
    try {
      byte[] k = key(table, key);
      Map<String, byte[]> updates = RecordCodec.toBytes(values);
      byte[] v = jedis.get(k);
      if (v == null) {
        return Status.NOT_FOUND;
      }
      jedis.set(k, RecordCodec.encode(RecordCodec.merge(v, updates)));
      return Status.OK;
    } catch (JedisException | RecordCodec.CorruptRecordException e) {
      return fail("update", table, key, e);
    }
  }

  @Override
  public Status insert(String table, String key, Map<String, ByteIterator> values) {
    try {
      jedis.set(key(table, key), RecordCodec.encode(RecordCodec.toBytes(values)));
      return Status.OK;
    } catch (JedisException e) {
      return fail("insert", table, key, e);
    }
  }

  @Override
  public Status delete(String table, String key) {
    try {
      return jedis.del(key(table, key)) == 0 ? Status.NOT_FOUND : Status.OK;
    } catch (JedisException e) {
      return fail("delete", table, key, e);
    }
  }
}
