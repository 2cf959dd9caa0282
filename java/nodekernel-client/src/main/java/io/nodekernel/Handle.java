package io.nodekernel;

import java.lang.ref.Cleaner;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.LongConsumer;

/**
 * A native handle owned by one Java object: released once, by {@link #take()} (an explicit close,
 * which does the native call itself) or, if the owner is garbage collected unclosed, by the cleaner
 * with the release action given.
 */
final class Handle {
  private static final Cleaner CLEANER = Cleaner.create();

  private final State state;
  private final Cleaner.Cleanable cleanable;

  private static final class State implements Runnable {
    final AtomicLong handle;
    final LongConsumer release;

    State(long handle, LongConsumer release) {
      this.handle = new AtomicLong(handle);
      this.release = release;
    }

    @Override
    public void run() {
      long h = handle.getAndSet(0);
      if (h != 0) {
        release.accept(h);
      }
    }
  }

  /** {@code release} must not refer to {@code owner} (or it is never collected). */
  Handle(Object owner, long handle, LongConsumer release) {
    this.state = new State(handle, release);
    this.cleanable = CLEANER.register(owner, state);
  }

  /** The handle, or 0 once taken. */
  long get() {
    return state.handle.get();
  }

  /** Takes the handle for an explicit close (0 if already taken); the cleaner then does nothing. */
  long take() {
    long h = state.handle.getAndSet(0);
    cleanable.clean();
    return h;
  }
}
