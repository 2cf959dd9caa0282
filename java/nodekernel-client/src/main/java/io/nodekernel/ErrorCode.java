package io.nodekernel;

/**
 * NodeKernel's stable error codes, as on the wire (README.md, Semantics in brief). Each has its
 * exception class, nested in {@link NodeKernelException} under the code's {@link #wireName()}.
 */
public enum ErrorCode {
  NOT_FOUND(1, "NotFound"),
  ALREADY_EXISTS(2, "AlreadyExists"),
  NOT_EMPTY(3, "NotEmpty"),
  TYPE_MISMATCH(4, "TypeMismatch"),
  INVALID_PATH(5, "InvalidPath"),
  BUSY(6, "Busy"),
  STALE(7, "Stale"),
  NO_SPACE(8, "NoSpace"),
  OUT_OF_RANGE(9, "OutOfRange"),
  CROSS_PARTITION(10, "CrossPartition"),
  UNAVAILABLE(11, "Unavailable"),
  DATA_LOST(12, "DataLost"),
  PROTOCOL(13, "Protocol"),
  TIMEOUT(14, "Timeout"),
  INVALID_ARGUMENT(15, "InvalidArgument"),
  INTERNAL(16, "Internal"),
  LEASE_EXPIRED(17, "LeaseExpired"),
  UNKNOWN_SERVER(18, "UnknownServer"),
  TRY_AGAIN(19, "TryAgain"),
  WRONG_PARTITION(20, "WrongPartition"),
  VERSION_MISMATCH(21, "VersionMismatch"),
  UNAUTHENTICATED(22, "Unauthenticated"),
  INTEGRITY(23, "Integrity"),
  QUOTA_EXCEEDED(24, "QuotaExceeded");

  private final int code;
  private final String wireName;

  ErrorCode(int code, String wireName) {
    this.code = code;
    this.wireName = wireName;
  }

  /** The number on the wire. */
  public int code() {
    return code;
  }

  /** The name the servers, the CLI and the other bindings use. */
  public String wireName() {
    return wireName;
  }

  /** The code with this number, or {@code null}. */
  public static ErrorCode of(int code) {
    ErrorCode[] all = values();
    return code >= 1 && code <= all.length ? all[code - 1] : null;
  }
}
