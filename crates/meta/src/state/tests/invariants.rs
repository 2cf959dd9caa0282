//! The checks debug builds run after every committed decision
//! (`invariants.rs`): they catch a decision that breaks an invariant where
//! it happens, and a decision committed to a state it was not decided on.

use super::*;

/// A lapse that (by the injected bug) keeps the blocks past the published
/// size: the check of the decision alone names the node, and a debug
/// build's commit panics with it.
fn lapse_keeping_blocks() -> (MetaState, Decision, NodeId) {
    let mut s = state();
    let f = create(&mut s, "/f", File, 0).unwrap();
    map(&mut s, f.id, 0, 5, f.lease).unwrap();
    sync(&mut s, &f, BS as u64 + 100, false).unwrap();
    s.bug = Some(Bug::LapseKeepsBlocks);
    let d = s.decide_sweep(2000, 1000).expect("the writer is gone");
    // Decided with the bug; committed as a build without it would.
    s.bug = None;
    (s, d, f.id)
}

#[test]
fn the_decision_check_finds_what_a_decision_broke() {
    let (mut s, d, id) = lapse_keeping_blocks();
    let effects = d.effects.clone();
    // What the commit would panic with, checked without the panic.
    s.bug = Some(Bug::LapseKeepsBlocks);
    s.commit(d, 2000);
    let e = s.check_decision(&effects).unwrap_err();
    assert!(
        e.contains(&format!("node {id} has no writer but holds")),
        "{e}"
    );
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "a decision broke an invariant of the metadata state")]
fn a_debug_build_panics_at_the_commit_that_breaks_an_invariant() {
    let (mut s, d, _) = lapse_keeping_blocks();
    s.commit(d, 2000);
}

#[test]
fn a_sound_decision_passes_its_check() {
    let mut s = state();
    let f = create(&mut s, "/f", File, 0).unwrap();
    map(&mut s, f.id, 0, 5, f.lease).unwrap();
    sync(&mut s, &f, BS as u64 + 100, false).unwrap();
    let d = s.decide_sweep(2000, 1000).expect("the writer is gone");
    let effects = d.effects.clone();
    s.commit(d, 2000);
    s.check_decision(&effects).unwrap();
    s.check_invariants().unwrap();
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "committed to the state it was decided on")]
fn a_debug_build_refuses_a_decision_made_on_an_older_state() {
    let mut s = state();
    let f = create(&mut s, "/f", File, 0).unwrap();
    map(&mut s, f.id, 0, 5, f.lease).unwrap();
    sync(&mut s, &f, BS as u64 + 100, false).unwrap();
    let stale = s.decide_sweep(2000, 1000).expect("the writer is gone");
    let d = s.decide_sweep(2000, 1000).expect("the writer is gone");
    s.commit(d, 2000);
    s.commit(stale, 2000);
}
