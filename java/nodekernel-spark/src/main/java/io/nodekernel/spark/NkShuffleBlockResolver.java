package io.nodekernel.spark;

import org.apache.spark.network.buffer.ManagedBuffer;
import org.apache.spark.network.shuffle.MergedBlockMeta;
import org.apache.spark.shuffle.ShuffleBlockResolver;
import org.apache.spark.storage.BlockId;
import org.apache.spark.storage.ShuffleMergedBlockId;
import scala.Option;
import scala.collection.immutable.Seq;

/**
 * Serves no blocks: reducers read shuffle data from NodeKernel, never through a BlockManager, so
 * these are reached only by a misconfiguration (push-based shuffle, block migration), which the
 * manager refuses at construction.
 */
final class NkShuffleBlockResolver implements ShuffleBlockResolver {
  private static UnsupportedOperationException unsupported() {
    return new UnsupportedOperationException("shuffle data lives in NodeKernel");
  }

  @Override
  public ManagedBuffer getBlockData(BlockId blockId, Option<String[]> dirs) {
    throw unsupported();
  }

  /**
   * {@code Seq} is {@code scala.collection.Seq} on Scala 2.12 and {@code
   * scala.collection.immutable.Seq} on 2.13; the immutable one, a subtype of both, overrides
   * either.
   */
  @Override
  public Seq<ManagedBuffer> getMergedBlockData(
      ShuffleMergedBlockId blockId, Option<String[]> dirs) {
    throw unsupported();
  }

  @Override
  public MergedBlockMeta getMergedBlockMeta(ShuffleMergedBlockId blockId, Option<String[]> dirs) {
    throw unsupported();
  }

  @Override
  public void stop() {}
}
