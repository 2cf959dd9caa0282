package io.nodekernel;

/**
 * How a node is created besides its path and type. Immutable; each setter returns a copy.
 *
 * <pre>{@code
 * CreateOptions.defaults().storageClass(0).local(true)
 * }</pre>
 */
public final class CreateOptions {
  private static final CreateOptions DEFAULTS =
      new CreateOptions(-1, false, false, true, -1, 0, 0, 0);

  final int storageClass;
  final boolean local;
  final boolean pinned;
  final boolean enumerable;
  final int mode;
  final long sizeHint;
  final int bufferSize;
  final int sliceSize;

  private CreateOptions(
      int storageClass,
      boolean local,
      boolean pinned,
      boolean enumerable,
      int mode,
      long sizeHint,
      int bufferSize,
      int sliceSize) {
    this.storageClass = storageClass;
    this.local = local;
    this.pinned = pinned;
    this.enumerable = enumerable;
    this.mode = mode;
    this.sizeHint = sizeHint;
    this.bufferSize = bufferSize;
    this.sliceSize = sliceSize;
  }

  /** No storage class preference, not local, not pinned, enumerable, default mode. */
  public static CreateOptions defaults() {
    return DEFAULTS;
  }

  /** Preferred storage class (0 is the fastest), or -1 to inherit the parent's preference. */
  public CreateOptions storageClass(int cls) {
    if (cls < -1 || cls > 254) {
      throw new IllegalArgumentException("storage class " + cls + " is not in -1..254");
    }
    return new CreateOptions(cls, local, pinned, enumerable, mode, sizeHint, bufferSize, sliceSize);
  }

  /**
   * Location affinity: blocks go to storage servers on this client's host first (see {@link
   * NodeKernel#localLocation()}), so a reader there reads them through memory.
   */
  public CreateOptions local(boolean local) {
    return new CreateOptions(
        storageClass, local, pinned, enumerable, mode, sizeHint, bufferSize, sliceSize);
  }

  /** Tier migration never moves the node's blocks. */
  public CreateOptions pinned(boolean pinned) {
    return new CreateOptions(
        storageClass, local, pinned, enumerable, mode, sizeHint, bufferSize, sliceSize);
  }

  /** For Tables: whether children are listed. */
  public CreateOptions enumerable(boolean enumerable) {
    return new CreateOptions(
        storageClass, local, pinned, enumerable, mode, sizeHint, bufferSize, sliceSize);
  }

  /** Permission bits (0 to 07777), or -1 for the default (0755 containers, 0644 data). */
  public CreateOptions mode(int mode) {
    if (mode < -1 || mode > 07777) {
      throw new IllegalArgumentException(
          "mode " + Integer.toOctalString(mode) + " is not 0..07777");
    }
    return new CreateOptions(
        storageClass, local, pinned, enumerable, mode, sizeHint, bufferSize, sliceSize);
  }

  /**
   * For a KeyValue: the bytes its writer will write, when known; a small value then shares a block
   * with other small values.
   */
  public CreateOptions sizeHint(long bytes) {
    if (bytes < 0) {
      throw new IllegalArgumentException("negative size hint " + bytes);
    }
    return new CreateOptions(
        storageClass, local, pinned, enumerable, mode, bytes, bufferSize, sliceSize);
  }

  /**
   * The writer's buffer: {@code bufferSize} bytes in flight at most, in transfers of {@code
   * sliceSize} (default 4 MiB of 1 MiB slices).
   */
  public CreateOptions buffer(int bufferSize, int sliceSize) {
    if (bufferSize <= 0 || sliceSize <= 0 || sliceSize > bufferSize) {
      throw new IllegalArgumentException(
          "buffer " + bufferSize + " and slice " + sliceSize + ": need 0 < slice <= buffer");
    }
    return new CreateOptions(
        storageClass, local, pinned, enumerable, mode, sizeHint, bufferSize, sliceSize);
  }
}
