package io.nodekernel.ycsb;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.Set;
import org.junit.Test;
import site.ycsb.ByteArrayByteIterator;
import site.ycsb.ByteIterator;
import site.ycsb.RandomByteIterator;

public class RecordCodecTest {
  private static Map<String, byte[]> record(Object... nameValue) {
    Map<String, byte[]> m = new LinkedHashMap<>();
    for (int i = 0; i < nameValue.length; i += 2) {
      Object v = nameValue[i + 1];
      byte[] bytes = v instanceof String s ? s.getBytes(StandardCharsets.UTF_8) : (byte[]) v;
      m.put((String) nameValue[i], bytes);
    }
    return m;
  }

  private static void assertSame(Map<String, byte[]> want, Map<String, byte[]> got) {
    assertEquals(new ArrayList<>(want.keySet()), new ArrayList<>(got.keySet()));
    for (String k : want.keySet()) {
      assertArrayEquals(k, want.get(k), got.get(k));
    }
  }

  @Test
  public void roundTripKeepsOrderAndBytes() throws Exception {
    byte[] binary = new byte[256];
    for (int i = 0; i < binary.length; i++) {
      binary[i] = (byte) i;
    }
    Map<String, byte[]> r =
        record(
            "field1",
            "one",
            "field0",
            binary,
            "",
            "empty name",
            "empty",
            new byte[0],
            "ünïcødé ✓",
            "x");
    byte[] enc = RecordCodec.encode(r);
    assertEquals(RecordCodec.encodedSize(r), enc.length);
    assertEquals(RecordCodec.VERSION, enc[0]);
    assertSame(r, RecordCodec.decode(enc));
  }

  @Test
  public void emptyRecord() throws Exception {
    byte[] enc = RecordCodec.encode(new LinkedHashMap<>());
    assertArrayEquals(new byte[] {1, 0, 0, 0, 0}, enc);
    assertTrue(RecordCodec.decode(enc).isEmpty());
  }

  @Test
  public void documentedLayout() {
    byte[] enc = RecordCodec.encode(record("ab", "xyz"));
    assertArrayEquals(
        new byte[] {1, 0, 0, 0, 1, 0, 0, 0, 2, 'a', 'b', 0, 0, 0, 3, 'x', 'y', 'z'}, enc);
  }

  @Test
  public void ycsbDefaultRecordSize() {
    Map<String, ByteIterator> values = new HashMap<>();
    for (int i = 0; i < 10; i++) {
      values.put("field" + i, new RandomByteIterator(100));
    }
    assertEquals(1145, RecordCodec.encode(RecordCodec.toBytes(values)).length);
  }

  @Test
  public void encodeIntoBufferAtPosition() throws Exception {
    Map<String, byte[]> r = record("a", "1", "b", "22");
    ByteBuffer buf = ByteBuffer.allocateDirect(100);
    buf.position(7);
    RecordCodec.encode(r, buf);
    assertEquals(7 + RecordCodec.encodedSize(r), buf.position());
    buf.flip().position(7);
    byte[] enc = new byte[buf.remaining()];
    buf.get(enc);
    assertSame(r, RecordCodec.decode(enc));
  }

  @Test
  public void decodeSubsetAsIterators() throws Exception {
    byte[] enc = RecordCodec.encode(record("a", "1", "b", "22", "c", "333"));
    Map<String, ByteIterator> out = new HashMap<>();
    RecordCodec.decode(enc, Set.of("c", "a", "missing"), out);
    assertEquals(Set.of("a", "c"), out.keySet());
    assertEquals("333", out.get("c").toString());
    assertEquals("1", out.get("a").toString());
    Map<String, ByteIterator> all = new HashMap<>();
    RecordCodec.decode(enc, null, all);
    assertEquals(3, all.size());
  }

  @Test
  public void mergeReplacesInPlaceAndAppendsNew() throws Exception {
    byte[] enc = RecordCodec.encode(record("a", "1", "b", "2"));
    Map<String, byte[]> merged = RecordCodec.merge(enc, record("b", "two", "c", "3"));
    assertSame(record("a", "1", "b", "two", "c", "3"), merged);
  }

  @Test
  public void toBytesReadsIterators() {
    Map<String, ByteIterator> v = new LinkedHashMap<>();
    v.put("x", new ByteArrayByteIterator("hello".getBytes(StandardCharsets.UTF_8)));
    assertArrayEquals("hello".getBytes(StandardCharsets.UTF_8), RecordCodec.toBytes(v).get("x"));
  }

  private static String corrupt(byte[] bad) {
    return assertThrows(RecordCodec.CorruptRecordException.class, () -> RecordCodec.decode(bad))
        .getMessage();
  }

  @Test
  public void corruptInputIsRejectedClearly() {
    byte[] good = RecordCodec.encode(record("name", "value", "n2", "v2"));
    assertTrue(corrupt(new byte[0]).contains("header"));
    assertTrue(corrupt(new byte[] {1, 0, 0}).contains("header"));
    byte[] v2 = good.clone();
    v2[0] = 2;
    assertTrue(corrupt(v2).contains("version 2"));
    // Every truncation fails (never reads past the end or loops).
    for (int len = 0; len < good.length; len++) {
      byte[] cut = new byte[len];
      System.arraycopy(good, 0, cut, 0, len);
      corrupt(cut);
    }
    byte[] trailing = new byte[good.length + 1];
    System.arraycopy(good, 0, trailing, 0, good.length);
    assertTrue(corrupt(trailing).contains("after the last field"));
  }

  @Test
  public void hugeLengthsFailBeforeAllocating() {
    // A count of 2^31-1 fields, and of 2^32-1 (negative as an int).
    assertTrue(corrupt(new byte[] {1, 0x7f, -1, -1, -1}).contains("field count 2147483647"));
    assertTrue(corrupt(new byte[] {1, -1, -1, -1, -1}).contains("field count 4294967295"));
    // One field whose name claims 2 GiB, then one whose value does.
    assertTrue(
        corrupt(new byte[] {1, 0, 0, 0, 1, 0x7f, -1, -1, -1, 0, 0, 0, 0})
            .contains("name length 2147483647"));
    assertTrue(
        corrupt(new byte[] {1, 0, 0, 0, 1, 0, 0, 0, 0, -1, -1, -1, -2})
            .contains("value length 4294967294"));
  }

  @Test
  public void randomGarbageNeverEscapesAsAnotherException() {
    Random rnd = new Random(42);
    List<byte[]> seeds = List.of(RecordCodec.encode(record("a", "1", "bb", "22", "ccc", "")));
    for (int i = 0; i < 20000; i++) {
      byte[] b;
      if (i % 2 == 0) {
        b = new byte[rnd.nextInt(40)];
        rnd.nextBytes(b);
        if (b.length > 0) {
          b[0] = RecordCodec.VERSION;
        }
      } else {
        b = seeds.get(0).clone();
        b[rnd.nextInt(b.length)] = (byte) rnd.nextInt(256);
      }
      try {
        RecordCodec.decode(b);
      } catch (RecordCodec.CorruptRecordException e) {
        // expected for most inputs
      }
    }
  }
}
