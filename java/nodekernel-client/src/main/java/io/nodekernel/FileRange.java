package io.nodekernel;

import java.util.Objects;

/**
 * Bytes {@code [offset, offset + length)} of the File or KeyValue at {@code path}: one piece of a
 * {@link NodeKernel#openRanges} stream.
 *
 * @param path the node's path
 * @param offset the first byte
 * @param length how many bytes
 */
public record FileRange(String path, long offset, long length) {
  public FileRange {
    Objects.requireNonNull(path, "path");
    if (offset < 0 || length < 0) {
      throw new IllegalArgumentException(
          "negative offset or length (" + offset + ", " + length + ") of " + path);
    }
  }
}
