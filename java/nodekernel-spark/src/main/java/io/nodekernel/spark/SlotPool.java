package io.nodekernel.spark;

import java.util.BitSet;

/**
 * The task slots of one executor: a map task writes its segments to the Files of the lowest free
 * slot, so one File never has two writers at once (NodeKernel's rule), and an executor running N
 * tasks at a time has N Files per reduce partition, whatever the number of map tasks.
 */
final class SlotPool {
  private final BitSet used = new BitSet();

  synchronized int acquire() {
    int slot = used.nextClearBit(0);
    used.set(slot);
    return slot;
  }

  synchronized void release(int slot) {
    if (!used.get(slot)) {
      throw new IllegalStateException("slot " + slot + " released twice");
    }
    used.clear(slot);
  }

  /** Takes a slot out of use for good (its Files are left to readers), instead of releasing it. */
  synchronized void retire(int slot) {
    if (!used.get(slot)) {
      throw new IllegalStateException("slot " + slot + " retired while free");
    }
  }
}
