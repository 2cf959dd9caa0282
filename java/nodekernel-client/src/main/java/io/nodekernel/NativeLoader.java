package io.nodekernel;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.Locale;

/**
 * Loads the native library: from {@code -Dnodekernel.native.library=PATH} or {@code NK_JNI_LIBRARY}
 * when set, else from this jar ({@code io/nodekernel/native/<os>-<arch>/}), copied to a temporary
 * file that is removed once loaded.
 */
final class NativeLoader {
  static final String PROPERTY = "nodekernel.native.library";
  static final String ENV = "NK_JNI_LIBRARY";
  private static final String NAME = "libnodekernel_jni.so";

  private NativeLoader() {}

  static String platform() {
    String os = System.getProperty("os.name", "").toLowerCase(Locale.ROOT);
    String arch = System.getProperty("os.arch", "").toLowerCase(Locale.ROOT);
    if (arch.equals("amd64") || arch.equals("x86_64")) {
      arch = "x86_64";
    } else if (arch.equals("arm64")) {
      arch = "aarch64";
    }
    return (os.startsWith("linux") ? "linux" : os.replace(' ', '_')) + "-" + arch;
  }

  static void load() {
    String explicit = System.getProperty(PROPERTY);
    if (explicit == null || explicit.isEmpty()) {
      explicit = System.getenv(ENV);
    }
    if (explicit != null && !explicit.isEmpty()) {
      System.load(Path.of(explicit).toAbsolutePath().toString());
      return;
    }
    String resource = "/io/nodekernel/native/" + platform() + "/" + NAME;
    try (InputStream in = NativeLoader.class.getResourceAsStream(resource)) {
      if (in == null) {
        throw new UnsatisfiedLinkError(
            "this nodekernel-client jar has no native library for "
                + platform()
                + " (looked for "
                + resource
                + "); build one with scripts/java.sh, or point -D"
                + PROPERTY
                + " (or "
                + ENV
                + ") at a libnodekernel_jni.so");
      }
      Path tmp = Files.createTempFile("libnodekernel_jni", ".so");
      try {
        Files.copy(in, tmp, StandardCopyOption.REPLACE_EXISTING);
        System.load(tmp.toString());
      } finally {
        // The loaded library stays mapped; the file is not needed any more.
        Files.deleteIfExists(tmp);
      }
    } catch (IOException e) {
      UnsatisfiedLinkError err =
          new UnsatisfiedLinkError("cannot unpack the NodeKernel native library: " + e);
      err.initCause(e);
      throw err;
    }
  }
}
