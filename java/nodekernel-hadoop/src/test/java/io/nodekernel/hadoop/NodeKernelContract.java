package io.nodekernel.hadoop;

import java.io.IOException;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.contract.AbstractFSContract;

/**
 * The contract of {@code nk://}: the options of {@code contract/nodekernel.xml}, over the shared
 * test cluster, with test files under {@code /test}.
 */
public class NodeKernelContract extends AbstractFSContract {
  /** The contract options resource. */
  public static final String CONTRACT_XML = "contract/nodekernel.xml";

  private FileSystem fs;

  /** A contract over {@code conf} plus the NodeKernel options. */
  public NodeKernelContract(Configuration conf) {
    super(conf);
    addConfResource(CONTRACT_XML);
  }

  @Override
  public void init() throws IOException {
    super.init();
    SharedCluster.configure(getConf());
    fs = FileSystem.get(SharedCluster.uri(), getConf());
  }

  @Override
  public FileSystem getTestFileSystem() {
    return fs;
  }

  @Override
  public String getScheme() {
    return NodeKernelFileSystem.SCHEME;
  }

  @Override
  public Path getTestPath() {
    return fs.makeQualified(new Path("/test"));
  }
}
