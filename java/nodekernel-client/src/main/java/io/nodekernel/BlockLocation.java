package io.nodekernel;

/**
 * Where one block of a File or KeyValue lies.
 *
 * @param offset the block's first byte in the node
 * @param length bytes of the node in this block
 * @param host the storage server's host (its configured location), as schedulers name hosts
 * @param address the storage server's data address, {@code host:port}
 */
public record BlockLocation(long offset, long length, String host, String address) {}
