package io.nodekernel;

import java.util.ArrayList;
import java.util.List;
import java.util.OptionalLong;

/**
 * The disk usage of a subtree, from the metadata servers' accounting (no walk): for a container,
 * what is below it; for a File or KeyValue, itself ({@code docs/lifecycle.md}, <i>Disk usage</i>).
 *
 * @param nodes nodes below a container (a data node: 1)
 * @param bytes bytes of data: the published sizes of its data nodes
 * @param stored storage held: the bytes of the blocks and pieces its data nodes hold (what a byte
 *     quota limits)
 * @param classes storage held per storage class, in class order
 * @param quota the container's quota, or null
 */
public record Usage(long nodes, long bytes, long stored, List<ClassUsage> classes, Quota quota) {
  /**
   * What a subtree holds in one storage class.
   *
   * @param storageClass the class (255: blocks on storage servers since retired)
   * @param blocks whole blocks
   * @param pieceBytes bytes of small values' pieces of shared blocks
   */
  public record ClassUsage(int storageClass, long blocks, long pieceBytes) {}

  /**
   * A container's limits; empty for no limit.
   *
   * @param bytes storage its subtree may hold
   * @param nodes nodes it may hold below it
   */
  public record Quota(OptionalLong bytes, OptionalLong nodes) {}

  /** Reads the array {@code Native.du} and {@code Native.setQuota} return (crates/jni). */
  static Usage of(long[] v) {
    Quota quota = null;
    if (v[3] != -2) {
      quota = new Quota(limit(v[3]), limit(v[4]));
    }
    int n = (int) v[5];
    List<ClassUsage> classes = new ArrayList<>(n);
    for (int i = 0; i < n; i++) {
      int at = 6 + 3 * i;
      classes.add(new ClassUsage((int) v[at], v[at + 1], v[at + 2]));
    }
    return new Usage(v[0], v[1], v[2], List.copyOf(classes), quota);
  }

  private static OptionalLong limit(long v) {
    return v < 0 ? OptionalLong.empty() : OptionalLong.of(v);
  }
}
