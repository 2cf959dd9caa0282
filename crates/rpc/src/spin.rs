//! When busy-polling pays, and when it steals a core.
//!
//! Waking a parked thread costs tens of microseconds on small virtual
//! machines, so callers and idle server connections poll their socket for a
//! short budget before they park. That pays only when the awaited bytes
//! usually come within the budget. When they do not — many clients on few
//! cores, where each reply waits for a turn on a CPU — every spin burns its
//! whole budget on a core that threads with real work are waiting for, and
//! throughput halves (`docs/benchmarks.md`, "Scale curves").
//!
//! So each connection decides from its own recent waits ([`SpinStats`]):
//! it spins while at least half of them, by a moving average, ended within
//! a few budgets ([`WITHIN`]). A wait is measured whether or not it spun
//! (a parked wait until the wake-up), so a connection that stopped
//! spinning sees when waits get short again and needs no probing. A parked
//! wait includes the wake-up itself (tens of microseconds), which is one
//! reason the limit is more than one budget: a connection that parks
//! because of a burst of long waits must still be able to see its waits
//! as short afterwards.
//!
//! [`SpinStats`] is plain data (no clock; waits are passed in) and is
//! tested on its own; [`Spin`] is the loop the transport runs.

use std::time::{Duration, Instant};

/// A wait "ends soon" when it ends within this many spin budgets. Not
/// one: waits just past the budget (a reply that needs another server's
/// round trip, say) are common on a quiet machine, and spinning through
/// most of them still beats parking; on a contended one waits are ten or
/// more budgets long.
pub const WITHIN: u32 = 2;
/// The moving average's weight of one wait: 1/8.
const SHIFT: u32 = 3;
/// Fixed-point one.
const ONE: u32 = 1 << 16;

/// A connection's recent waits: the share that ended within the spin
/// budget, as a moving average.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpinStats {
    /// Share of waits within the budget, in `[0, ONE]`.
    within: u32,
}

impl Default for SpinStats {
    /// A new connection spins until its waits say otherwise.
    fn default() -> Self {
        Self { within: ONE }
    }
}

impl SpinStats {
    /// Whether the next wait should spin.
    pub fn should_spin(&self) -> bool {
        self.within >= ONE / 2
    }

    /// Records a wait of `waited` against a spin budget of `budget`.
    pub fn record(&mut self, waited: Duration, budget: Duration) {
        let sample = if waited <= budget.saturating_mul(WITHIN) {
            ONE
        } else {
            0
        };
        self.within = self.within - (self.within >> SHIFT) + (sample >> SHIFT);
    }

    /// The packed form, for an atomic.
    pub fn to_bits(self) -> u32 {
        self.within
    }

    /// From [`to_bits`](Self::to_bits).
    pub fn from_bits(bits: u32) -> Self {
        Self {
            within: bits.min(ONE),
        }
    }
}

/// One busy-poll: [`Spin::begin`] before the first poll, [`Spin::again`]
/// between polls.
pub struct Spin {
    start: Instant,
    budget: Duration,
}

impl Spin {
    /// A spin of at most `budget`, or `None` when the budget is zero or
    /// `stats` say spinning does not pay now.
    pub fn begin(budget: Duration, stats: SpinStats) -> Option<Spin> {
        if budget.is_zero() || !stats.should_spin() {
            return None;
        }
        Some(Spin {
            start: Instant::now(),
            budget,
        })
    }

    /// Whether to poll again: false once the budget is spent.
    pub fn again(&self) -> bool {
        self.start.elapsed() < self.budget
    }
}

/// Busy-poll budget of an idle server connection waiting for its next
/// request, when a setting does not say otherwise: 50 µs, or
/// `NK_POLL_SPIN_US` from the environment (0 disables spinning). See
/// [`ServeOptions::spin`](crate::ServeOptions::spin); a connection spins
/// only while its requests come soon (this module's [`SpinStats`]).
pub fn default_spin() -> Duration {
    env_spin().unwrap_or(Duration::from_micros(50))
}

/// Busy-poll budget of a caller waiting for its reply, when a setting does
/// not say otherwise: 100 µs, or `NK_POLL_SPIN_US` from the environment.
/// See [`ConnOptions::spin`](crate::ConnOptions::spin).
///
/// It is twice the server's because a reply can include the server's own
/// round trip: a replacing put's close waits while the metadata server
/// claims the old block at its storage server, about 50 µs in all on a
/// 2-core machine. A caller that stops spinning just before its reply
/// arrives pays a thread wake-up (25–40 µs there) on top; with a 50 µs
/// budget that cliff cost replacing puts a third of their latency.
pub fn default_call_spin() -> Duration {
    env_spin().unwrap_or(Duration::from_micros(100))
}

/// `NK_POLL_SPIN_US`, read once.
fn env_spin() -> Option<Duration> {
    static SPIN: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        std::env::var("NK_POLL_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .map(Duration::from_micros)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: Duration = Duration::from_micros(100);
    const SHORT: Duration = Duration::from_micros(20);
    const LONG: Duration = Duration::from_micros(900);
    const JUST_PAST: Duration = Duration::from_micros(150);

    #[test]
    fn a_new_connection_spins() {
        assert!(SpinStats::default().should_spin());
    }

    #[test]
    fn long_waits_stop_spinning_and_short_ones_bring_it_back() {
        let mut s = SpinStats::default();
        let mut long = 0;
        while s.should_spin() {
            s.record(LONG, BUDGET);
            long += 1;
            assert!(long < 100, "never stopped spinning");
        }
        // Half the weight gone takes a few waits, not one and not many.
        assert!((3..=8).contains(&long), "stopped after {long} long waits");
        let mut short = 0;
        while !s.should_spin() {
            s.record(SHORT, BUDGET);
            short += 1;
            assert!(short < 100, "never spun again");
        }
        assert!(short <= 8, "took {short} short waits to spin again");
    }

    #[test]
    fn a_mix_mostly_within_the_budget_keeps_spinning() {
        let mut s = SpinStats::default();
        for i in 0..1000 {
            s.record(if i % 3 == 0 { LONG } else { SHORT }, BUDGET);
            assert!(s.should_spin(), "wait {i}");
        }
        let mut s = SpinStats::default();
        for i in 0..1000 {
            s.record(if i % 3 == 0 { SHORT } else { LONG }, BUDGET);
        }
        assert!(!s.should_spin());
    }

    #[test]
    fn waits_just_past_the_budget_keep_spinning() {
        let mut s = SpinStats::default();
        for _ in 0..1000 {
            s.record(JUST_PAST, BUDGET);
        }
        assert!(s.should_spin());
    }

    #[test]
    fn a_wait_of_exactly_the_limit_counts_as_within() {
        let mut s = SpinStats::from_bits(ONE / 2);
        s.record(BUDGET * WITHIN, BUDGET);
        assert!(s.should_spin());
        let mut s = SpinStats::from_bits(ONE / 2);
        s.record(BUDGET * WITHIN + Duration::from_nanos(1), BUDGET);
        assert!(!s.should_spin());
        assert_eq!(SpinStats::from_bits(u32::MAX), SpinStats::default());
    }

    #[test]
    fn a_zero_budget_or_a_bad_record_never_spins() {
        assert!(Spin::begin(Duration::ZERO, SpinStats::default()).is_none());
        assert!(Spin::begin(BUDGET, SpinStats::from_bits(0)).is_none());
        assert!(Spin::begin(BUDGET, SpinStats::default()).is_some());
    }
}
