package io.nodekernel.hadoop;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.contract.AbstractContractVectoredReadTest;
import org.apache.hadoop.fs.contract.AbstractFSContract;

/**
 * Hadoop's vectored read suite (Parquet and ORC readers use it) against {@code nk://}: Hadoop's
 * default implementation over NodeKernel's positional reads, into heap and direct buffers.
 */
public class TestNodeKernelContractVectoredRead extends AbstractContractVectoredReadTest {
  /** One run per buffer type ({@code direct}, {@code array}). */
  public TestNodeKernelContractVectoredRead(String bufferType) {
    super(bufferType);
  }

  @Override
  protected AbstractFSContract createContract(Configuration conf) {
    return new NodeKernelContract(conf);
  }
}
