package io.nodekernel;

import java.time.Duration;
import java.time.Instant;
import java.util.Optional;

/**
 * What the metadata server knows of one node.
 *
 * @param path the node's path
 * @param type its type
 * @param size bytes of a File or KeyValue (as of its last sync), live children of a container
 * @param blockSize bytes per block
 * @param mode permission bits
 * @param mtimeNanos modification time, nanoseconds since the Unix epoch
 * @param id the node's id, never reused (a replaced KeyValue gets a new one)
 * @param storageClass preferred storage class, or -1 for none
 * @param enumerable whether its children are listed (Tables may hide them)
 * @param encrypted whether its clients encrypt its bytes
 * @param stored bytes of the cluster it takes: its blocks and pieces (a container's: those of its
 *     child records)
 * @param expiresMillis when it expires, milliseconds since the Unix epoch, or 0 for never
 * @param childTtlMillis for a container, the TTL of new children that name none, or 0 for none
 */
public record NodeStatus(
    String path,
    NodeType type,
    long size,
    int blockSize,
    int mode,
    long mtimeNanos,
    long id,
    int storageClass,
    boolean enumerable,
    boolean encrypted,
    long stored,
    long expiresMillis,
    long childTtlMillis) {

  /** Longs per node in the arrays the native library returns. */
  static final int FIELDS = 11;

  static NodeStatus decode(String path, long[] a, int at) {
    int cls = (int) a[at + 6];
    return new NodeStatus(
        path,
        NodeType.of(a[at]),
        a[at + 1],
        (int) a[at + 2],
        (int) a[at + 3],
        a[at + 4],
        a[at + 5],
        cls == 255 ? -1 : cls,
        (a[at + 7] & 1) != 0,
        (a[at + 7] & 2) != 0,
        a[at + 8],
        a[at + 9],
        a[at + 10]);
  }

  /** When the node expires, if it does. */
  public Optional<Instant> expires() {
    return expiresMillis == 0 ? Optional.empty() : Optional.of(Instant.ofEpochMilli(expiresMillis));
  }

  /** The TTL of a container's new children that name none, if it has one. */
  public Optional<Duration> childTtl() {
    return childTtlMillis == 0 ? Optional.empty() : Optional.of(Duration.ofMillis(childTtlMillis));
  }

  /** Modification time in milliseconds since the Unix epoch. */
  public long mtimeMillis() {
    return mtimeNanos / 1_000_000;
  }

  public boolean isContainer() {
    return !type.isData();
  }
}
