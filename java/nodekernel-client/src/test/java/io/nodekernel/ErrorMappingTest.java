package io.nodekernel;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertSame;
import static org.junit.Assert.assertTrue;

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import org.junit.Test;
import org.junit.runner.RunWith;
import org.junit.runners.Parameterized;
import org.junit.runners.Parameterized.Parameters;

/**
 * Every error code, raised by the native library the way a failing call raises it, arrives as its
 * own exception class carrying the code and the message (one test per code).
 */
@RunWith(Parameterized.class)
public class ErrorMappingTest {
  private final ErrorCode code;

  public ErrorMappingTest(String name, ErrorCode code) {
    this.code = code;
  }

  @Parameters(name = "{0}")
  public static Collection<Object[]> codes() {
    List<Object[]> out = new ArrayList<>();
    for (ErrorCode c : ErrorCode.values()) {
      out.add(new Object[] {c.wireName(), c});
    }
    return out;
  }

  @Test
  public void theCodeArrivesAsItsOwnExceptionClass() throws Exception {
    String message = "what went wrong with /some/path (" + code.wireName() + ")";
    try {
      Native.raise(code.code(), message);
      throw new AssertionError("raise returned normally");
    } catch (NodeKernelException e) {
      assertSame(code, e.code());
      assertEquals(message, e.getMessage());
      assertEquals("io.nodekernel.NodeKernelException$" + code.wireName(), e.getClass().getName());
      // The Java-side factory gives the same class.
      assertSame(e.getClass(), NodeKernelException.of(code, "x").getClass());
      assertTrue(e instanceof java.io.IOException);
    }
  }

  @Test
  public void theJavaCodeMatchesTheNativeOne() {
    String[] names = Native.errorCodeNames();
    assertEquals("codes known on each side", names.length, ErrorCode.values().length);
    assertEquals(names[code.code() - 1], code.wireName());
    assertSame(code, ErrorCode.of(code.code()));
  }
}
