package io.nodekernel.ycsb;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import site.ycsb.ByteArrayByteIterator;
import site.ycsb.ByteIterator;

/**
 * The binary form of a YCSB record (all its fields in one value), shared by {@link
 * NodeKernelClient} and {@link RedisClient} so both stores hold and move the same bytes.
 *
 * <p>Layout, all integers unsigned 32-bit big-endian:
 *
 * <pre>
 *   version      1 byte, {@value #VERSION}
 *   count        u32, the number of fields
 *   count times:
 *     name length  u32, then the field name's UTF-8 bytes
 *     value length u32, then the value's bytes
 * </pre>
 *
 * Fields keep the order they were given in; names are unique. A record of YCSB's default shape (10
 * fields {@code field0..field9} of 100 bytes) takes 5 + 10 * (8 + 6 + 100) = 1145 bytes.
 *
 * <p>Decoding checks every length against the bytes that are left before it allocates anything, so
 * corrupt input gives {@link CorruptRecordException}, never a huge allocation or a loop.
 */
public final class RecordCodec {
  /** The layout's version byte. */
  public static final byte VERSION = 1;

  private static final int HEADER = 1 + 4;

  /** The smallest field: two lengths, empty name and value. */
  private static final int MIN_FIELD = 8;

  private RecordCodec() {}

  /** A stored value is not a record of this layout. */
  public static final class CorruptRecordException extends IOException {
    private static final long serialVersionUID = 1L;

    public CorruptRecordException(String message) {
      super(message);
    }
  }

  /**
   * The fields' bytes, in the map's order. Reads each iterator to its end (YCSB's iterators can be
   * read once).
   */
  public static Map<String, byte[]> toBytes(Map<String, ByteIterator> values) {
    Map<String, byte[]> out = new LinkedHashMap<>(values.size() * 2);
    for (Map.Entry<String, ByteIterator> e : values.entrySet()) {
      out.put(e.getKey(), e.getValue().toArray());
    }
    return out;
  }

  /** The encoded size of {@code fields}. */
  public static int encodedSize(Map<String, byte[]> fields) {
    long size = HEADER;
    for (Map.Entry<String, byte[]> e : fields.entrySet()) {
      int name = e.getKey().getBytes(StandardCharsets.UTF_8).length;
      size += MIN_FIELD + name + e.getValue().length;
    }
    if (size > Integer.MAX_VALUE) {
      throw new IllegalArgumentException("a record of " + size + " bytes is too big");
    }
    return (int) size;
  }

  /** {@code fields} encoded into a new array. */
  public static byte[] encode(Map<String, byte[]> fields) {
    byte[] out = new byte[encodedSize(fields)];
    encode(fields, ByteBuffer.wrap(out));
    return out;
  }

  /**
   * Writes {@code fields} at {@code dst}'s position, which it advances; {@code dst} must have
   * {@link #encodedSize} bytes left.
   */
  public static void encode(Map<String, byte[]> fields, ByteBuffer dst) {
    dst.put(VERSION);
    dst.putInt(fields.size());
    for (Map.Entry<String, byte[]> e : fields.entrySet()) {
      byte[] name = e.getKey().getBytes(StandardCharsets.UTF_8);
      dst.putInt(name.length);
      dst.put(name);
      dst.putInt(e.getValue().length);
      dst.put(e.getValue());
    }
  }

  /** Every field of {@code record}, copied out, in stored order. */
  public static Map<String, byte[]> decode(byte[] record) throws CorruptRecordException {
    Map<String, byte[]> out = new LinkedHashMap<>();
    new Reader(record)
        .forEach(
            (name, off, len) -> {
              byte[] v = new byte[len];
              System.arraycopy(record, off, v, 0, len);
              out.put(name, v);
            });
    return out;
  }

  /**
   * Adds the fields of {@code record} named in {@code fields} (all when null) to {@code out}, as
   * iterators over {@code record} itself (not copied). Names asked for but not stored are left out.
   */
  public static void decode(byte[] record, Set<String> fields, Map<String, ByteIterator> out)
      throws CorruptRecordException {
    new Reader(record)
        .forEach(
            (name, off, len) -> {
              if (fields == null || fields.contains(name)) {
                out.put(name, new ByteArrayByteIterator(record, off, len));
              }
            });
  }

  /**
   * {@code record} with {@code updates} applied: changed fields keep their place, new ones go at
   * the end.
   */
  public static Map<String, byte[]> merge(byte[] record, Map<String, byte[]> updates)
      throws CorruptRecordException {
    Map<String, byte[]> fields = decode(record);
    fields.putAll(updates);
    return fields;
  }

  private interface FieldVisitor {
    void field(String name, int valueOffset, int valueLength);
  }

  /** Walks a record, checking every bound before it takes a step. */
  private static final class Reader {
    private final byte[] buf;
    private int pos;

    Reader(byte[] buf) {
      this.buf = buf;
    }

    private CorruptRecordException corrupt(String what) {
      return new CorruptRecordException(
          "not a YCSB record (" + buf.length + " bytes): " + what + " at byte " + pos);
    }

    private int u32(String what) throws CorruptRecordException {
      if (buf.length - pos < 4) {
        throw corrupt(what + " cut short");
      }
      int v =
          (buf[pos] & 0xff) << 24
              | (buf[pos + 1] & 0xff) << 16
              | (buf[pos + 2] & 0xff) << 8
              | (buf[pos + 3] & 0xff);
      pos += 4;
      return v;
    }

    /** A length that must fit in the bytes left. */
    private int length(String what) throws CorruptRecordException {
      int at = pos;
      int n = u32(what);
      if (n < 0 || n > buf.length - pos) {
        pos = at;
        throw corrupt(
            what
                + " "
                + Integer.toUnsignedString(n)
                + " beyond the "
                + (buf.length - at - 4)
                + " bytes left");
      }
      return n;
    }

    void forEach(FieldVisitor visitor) throws CorruptRecordException {
      if (buf.length < HEADER) {
        throw corrupt("shorter than the " + HEADER + "-byte header");
      }
      if (buf[0] != VERSION) {
        throw corrupt("version " + (buf[0] & 0xff) + ", not " + VERSION);
      }
      pos = 1;
      int count = u32("field count");
      if (count < 0 || count > (buf.length - pos) / MIN_FIELD) {
        pos = 1;
        throw corrupt(
            "field count "
                + Integer.toUnsignedString(count)
                + " cannot fit in "
                + (buf.length - HEADER)
                + " bytes");
      }
      for (int i = 0; i < count; i++) {
        int nameLen = length("field " + i + "'s name length");
        String name = new String(buf, pos, nameLen, StandardCharsets.UTF_8);
        pos += nameLen;
        int valueLen = length("field " + i + "'s value length");
        visitor.field(name, pos, valueLen);
        pos += valueLen;
      }
      if (pos != buf.length) {
        throw corrupt((buf.length - pos) + " bytes after the last field");
      }
    }
  }
}
