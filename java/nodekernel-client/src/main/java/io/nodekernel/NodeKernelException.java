package io.nodekernel;

import java.io.IOException;

/**
 * A NodeKernel call failed. Each {@link ErrorCode} has its subclass, nested here under the code's
 * wire name ({@code NodeKernelException.NotFound}, ...), so callers catch exactly what they handle;
 * the message names the path and the rule, as everywhere in NodeKernel.
 */
public class NodeKernelException extends IOException {
  private final ErrorCode code;
  private int range = -1;

  protected NodeKernelException(ErrorCode code, String message) {
    super(message);
    this.code = code;
  }

  /** The stable error code. */
  public ErrorCode code() {
    return code;
  }

  /**
   * For a failure of {@link NodeKernel#openRanges}, the index of the range it is about (where a
   * path cannot be looked up, the first range of that path); -1 otherwise.
   */
  public int range() {
    return range;
  }

  /** Set by the native library when it throws an {@code openRanges} failure. */
  void setRange(int range) {
    this.range = range;
  }

  /** The exception of {@code code}, as a failing native call throws it. */
  public static NodeKernelException of(ErrorCode code, String message) {
    return switch (code) {
      case NOT_FOUND -> new NotFound(message);
      case ALREADY_EXISTS -> new AlreadyExists(message);
      case NOT_EMPTY -> new NotEmpty(message);
      case TYPE_MISMATCH -> new TypeMismatch(message);
      case INVALID_PATH -> new InvalidPath(message);
      case BUSY -> new Busy(message);
      case STALE -> new Stale(message);
      case NO_SPACE -> new NoSpace(message);
      case OUT_OF_RANGE -> new OutOfRange(message);
      case CROSS_PARTITION -> new CrossPartition(message);
      case UNAVAILABLE -> new Unavailable(message);
      case DATA_LOST -> new DataLost(message);
      case PROTOCOL -> new Protocol(message);
      case TIMEOUT -> new Timeout(message);
      case INVALID_ARGUMENT -> new InvalidArgument(message);
      case INTERNAL -> new Internal(message);
      case LEASE_EXPIRED -> new LeaseExpired(message);
      case UNKNOWN_SERVER -> new UnknownServer(message);
      case TRY_AGAIN -> new TryAgain(message);
      case WRONG_PARTITION -> new WrongPartition(message);
      case VERSION_MISMATCH -> new VersionMismatch(message);
      case UNAUTHENTICATED -> new Unauthenticated(message);
      case INTEGRITY -> new Integrity(message);
      case QUOTA_EXCEEDED -> new QuotaExceeded(message);
    };
  }

  /** No node at the path (or a parent is missing). */
  public static final class NotFound extends NodeKernelException {
    public NotFound(String message) {
      super(ErrorCode.NOT_FOUND, message);
    }
  }

  /** A node already exists at the path. */
  public static final class AlreadyExists extends NodeKernelException {
    public AlreadyExists(String message) {
      super(ErrorCode.ALREADY_EXISTS, message);
    }
  }

  /** A container still has children. */
  public static final class NotEmpty extends NodeKernelException {
    public NotEmpty(String message) {
      super(ErrorCode.NOT_EMPTY, message);
    }
  }

  /** The node has another type than the call needs. */
  public static final class TypeMismatch extends NodeKernelException {
    public TypeMismatch(String message) {
      super(ErrorCode.TYPE_MISMATCH, message);
    }
  }

  /** The path breaks the naming rules. */
  public static final class InvalidPath extends NodeKernelException {
    public InvalidPath(String message) {
      super(ErrorCode.INVALID_PATH, message);
    }
  }

  /** Another writer holds the node. */
  public static final class Busy extends NodeKernelException {
    public Busy(String message) {
      super(ErrorCode.BUSY, message);
    }
  }

  /** The node or block changed under the call (replaced, moved or deleted). */
  public static final class Stale extends NodeKernelException {
    public Stale(String message) {
      super(ErrorCode.STALE, message);
    }
  }

  /** No storage class has room. */
  public static final class NoSpace extends NodeKernelException {
    public NoSpace(String message) {
      super(ErrorCode.NO_SPACE, message);
    }
  }

  /** A read or write outside the node's bytes. */
  public static final class OutOfRange extends NodeKernelException {
    public OutOfRange(String message) {
      super(ErrorCode.OUT_OF_RANGE, message);
    }
  }

  /** A rename between paths of different metadata servers. */
  public static final class CrossPartition extends NodeKernelException {
    public CrossPartition(String message) {
      super(ErrorCode.CROSS_PARTITION, message);
    }
  }

  /** A server could not be reached. */
  public static final class Unavailable extends NodeKernelException {
    public Unavailable(String message) {
      super(ErrorCode.UNAVAILABLE, message);
    }
  }

  /** The bytes were on a server that is gone. */
  public static final class DataLost extends NodeKernelException {
    public DataLost(String message) {
      super(ErrorCode.DATA_LOST, message);
    }
  }

  /** A peer broke the protocol. */
  public static final class Protocol extends NodeKernelException {
    public Protocol(String message) {
      super(ErrorCode.PROTOCOL, message);
    }
  }

  /** A server did not answer in time. */
  public static final class Timeout extends NodeKernelException {
    public Timeout(String message) {
      super(ErrorCode.TIMEOUT, message);
    }
  }

  /** An argument is out of its bounds. */
  public static final class InvalidArgument extends NodeKernelException {
    public InvalidArgument(String message) {
      super(ErrorCode.INVALID_ARGUMENT, message);
    }
  }

  /** A server-side bug. */
  public static final class Internal extends NodeKernelException {
    public Internal(String message) {
      super(ErrorCode.INTERNAL, message);
    }
  }

  /** The write lease ran out before the writer closed. */
  public static final class LeaseExpired extends NodeKernelException {
    public LeaseExpired(String message) {
      super(ErrorCode.LEASE_EXPIRED, message);
    }
  }

  /** A storage server the metadata server does not know. */
  public static final class UnknownServer extends NodeKernelException {
    public UnknownServer(String message) {
      super(ErrorCode.UNKNOWN_SERVER, message);
    }
  }

  /** Not now, but the same call may succeed shortly. */
  public static final class TryAgain extends NodeKernelException {
    public TryAgain(String message) {
      super(ErrorCode.TRY_AGAIN, message);
    }
  }

  /** The path belongs to another metadata partition. */
  public static final class WrongPartition extends NodeKernelException {
    public WrongPartition(String message) {
      super(ErrorCode.WRONG_PARTITION, message);
    }
  }

  /** The two ends speak different wire versions. */
  public static final class VersionMismatch extends NodeKernelException {
    public VersionMismatch(String message) {
      super(ErrorCode.VERSION_MISMATCH, message);
    }
  }

  /** The peer could not prove it may do this (token, TLS, capability, key). */
  public static final class Unauthenticated extends NodeKernelException {
    public Unauthenticated(String message) {
      super(ErrorCode.UNAUTHENTICATED, message);
    }
  }

  /** Encrypted data failed its authentication check. */
  public static final class Integrity extends NodeKernelException {
    public Integrity(String message) {
      super(ErrorCode.INTEGRITY, message);
    }
  }

  /**
   * A write or create would take a subtree past its quota of bytes or nodes; the message names the
   * path whose quota it hit. Nothing was changed.
   */
  public static final class QuotaExceeded extends NodeKernelException {
    public QuotaExceeded(String message) {
      super(ErrorCode.QUOTA_EXCEEDED, message);
    }
  }
}
