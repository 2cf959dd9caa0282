package io.nodekernel;

/**
 * Bytes of storage over the cluster's live storage servers.
 *
 * @param capacity bytes in all
 * @param used bytes in use
 */
public record Capacity(long capacity, long used) {
  public long remaining() {
    return Math.max(0, capacity - used);
  }
}
