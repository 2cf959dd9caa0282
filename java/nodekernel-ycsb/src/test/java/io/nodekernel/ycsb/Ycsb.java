package io.nodekernel.ycsb;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;

import io.nodekernel.TestCluster;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Runs YCSB itself ({@code site.ycsb.Client}, which ends with {@code System.exit}) in a child JVM
 * on this test's class path, and reads its report.
 */
final class Ycsb {
  private static final Pattern LINE = Pattern.compile("^\\[([\\w-]+)\\], ([^,]+), (\\S+)$");

  private Ycsb() {}

  /** The core workload properties of YCSB's workloads/workloada and workloadb. */
  static List<String> workload(String which, int records, int operations) {
    String read;
    String update;
    switch (which) {
      case "a" -> {
        read = "0.5";
        update = "0.5";
      }
      case "b" -> {
        read = "0.95";
        update = "0.05";
      }
      default -> throw new IllegalArgumentException("workload " + which);
    }
    return List.of(
        "workload=site.ycsb.workloads.CoreWorkload",
        "recordcount=" + records,
        "operationcount=" + operations,
        "readallfields=true",
        "readproportion=" + read,
        "updateproportion=" + update,
        "scanproportion=0",
        "insertproportion=0",
        "requestdistribution=zipfian",
        "measurementtype=hdrhistogram");
  }

  /** {@code metric -> value} per section ({@code READ}, {@code OVERALL}, ...). */
  static final class Report {
    final String output;
    final Map<String, Map<String, String>> sections = new TreeMap<>();

    Report(String output) {
      this.output = output;
      for (String line : output.split("\n")) {
        Matcher m = LINE.matcher(line.strip());
        if (m.matches()) {
          sections.computeIfAbsent(m.group(1), k -> new TreeMap<>()).put(m.group(2), m.group(3));
        }
      }
    }

    long count(String section, String metric) {
      Map<String, String> s = sections.get(section);
      String v = s == null ? null : s.get(metric);
      return v == null ? 0 : Long.parseLong(v);
    }

    /** Every operation of the phase succeeded: {@code ops} in all, none failed. */
    void assertAllOk(long ops) {
      long ok = 0;
      for (Map.Entry<String, Map<String, String>> s : sections.entrySet()) {
        assertFalse(output, s.getKey().endsWith("-FAILED"));
        for (String metric : s.getValue().keySet()) {
          if (metric.startsWith("Return=")) {
            assertEquals(output, "Return=OK", metric);
          }
        }
        if (!s.getKey().equals("CLEANUP")) {
          ok += count(s.getKey(), "Return=OK");
        }
      }
      assertEquals(output, ops, ok);
    }
  }

  /** Runs {@code site.ycsb.Client} with {@code args}, each of {@code props} as {@code -p}. */
  static Report run(String db, String phase, List<String> props, int threads)
      throws IOException, InterruptedException {
    String cp = System.getProperty("surefire.test.class.path");
    if (cp == null || cp.isEmpty()) {
      cp = System.getProperty("java.class.path");
    }
    List<String> cmd = new ArrayList<>();
    cmd.add(Path.of(System.getProperty("java.home"), "bin", "java").toString());
    cmd.add("-cp");
    cmd.add(cp);
    cmd.add("site.ycsb.Client");
    cmd.add(phase);
    cmd.add("-db");
    cmd.add(db);
    cmd.add("-threads");
    cmd.add(Integer.toString(threads));
    for (String p : props) {
      cmd.add("-p");
      cmd.add(p);
    }
    Path log = Files.createTempFile("ycsb", ".log");
    try {
      Process proc =
          new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(log.toFile()).start();
      if (!proc.waitFor(TestCluster.HANG_SECONDS, TimeUnit.SECONDS)) {
        proc.destroyForcibly().waitFor();
        throw new AssertionError("YCSB hung: " + Files.readString(log, StandardCharsets.UTF_8));
      }
      String out = Files.readString(log, StandardCharsets.UTF_8);
      assertEquals(out, 0, proc.exitValue());
      assertTrue(out, out.contains("[OVERALL], RunTime(ms)"));
      return new Report(out);
    } finally {
      Files.deleteIfExists(log);
    }
  }
}
