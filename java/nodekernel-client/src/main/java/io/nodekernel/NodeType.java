package io.nodekernel;

/** The five node types (README.md, Semantics in brief). */
public enum NodeType {
  /** A container listed by name. */
  DIRECTORY(0),
  /** Bytes appended by one writer at a time, read at any offset. */
  FILE(1),
  /** A container of KeyValues, optionally not enumerable. */
  TABLE(2),
  /** A value replaced as a whole by each put. */
  KEY_VALUE(3),
  /** A container of Files read as one stream. */
  BAG(4);

  private final int code;

  NodeType(int code) {
    this.code = code;
  }

  /** The number on the wire. */
  public int code() {
    return code;
  }

  /** Whether the node holds bytes (a File or a KeyValue), not children. */
  public boolean isData() {
    return this == FILE || this == KEY_VALUE;
  }

  static NodeType of(long code) {
    for (NodeType t : values()) {
      if (t.code == code) {
        return t;
      }
    }
    throw new IllegalStateException("unknown node type code " + code);
  }
}
