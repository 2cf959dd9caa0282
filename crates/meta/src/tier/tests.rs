//! The watermark policy, checked over every small configuration.

use super::*;

fn settings(high: u8, low: u8, promotion: bool) -> TierSettings {
    TierSettings {
        high_watermark: high,
        low_watermark: low,
        promotion,
        promote_after: 5,
        ..TierSettings::default()
    }
}

/// Every assignment of `n` units to (class, blocks, score) choices, all
/// encrypted.
fn unit_sets(n: usize, classes: &[u8]) -> Vec<Vec<Unit>> {
    unit_sets_of(n, classes, &[true])
}

/// Every assignment of `n` units to (class, blocks, score, encrypted)
/// choices.
fn unit_sets_of(n: usize, classes: &[u8], encrypted: &[bool]) -> Vec<Vec<Unit>> {
    let choices: Vec<(u8, u64, f32, bool)> = classes
        .iter()
        .flat_map(|&c| [1u64, 2].map(move |b| (c, b)))
        .flat_map(|(c, b)| [0.0f32, 3.0, 9.0].map(move |s| (c, b, s)))
        .flat_map(|(c, b, s)| encrypted.iter().map(move |e| (c, b, s, *e)))
        .collect();
    let mut out = Vec::new();
    let total = choices.len().pow(n as u32);
    for mut k in 0..total {
        let mut units = Vec::new();
        for i in 0..n {
            let (class, blocks, score, encrypted) = choices[k % choices.len()];
            k /= choices.len();
            units.push(Unit {
                key: i as u64,
                class,
                blocks,
                score,
                last_ms: 100 - i as u64,
                settling: false,
                encrypted,
            });
        }
        out.push(units);
    }
    out
}

/// The classes' use when `units` are all that is stored.
fn classes_of(caps: &[(u8, u64)], units: &[Unit]) -> Option<Vec<ClassUse>> {
    classes_sealed(caps, &[], units)
}

/// [`classes_of`], with the classes in `sealed` encrypted.
fn classes_sealed(caps: &[(u8, u64)], sealed: &[u8], units: &[Unit]) -> Option<Vec<ClassUse>> {
    let mut out = Vec::new();
    for &(class, capacity) in caps {
        let used: u64 = units
            .iter()
            .filter(|u| u.class == class)
            .map(|u| u.blocks)
            .sum();
        if used > capacity {
            return None;
        }
        out.push(ClassUse {
            class,
            capacity,
            used,
            encrypted: sealed.contains(&class),
        });
    }
    Some(out)
}

/// `units` after `plan` is carried out.
fn apply(units: &[Unit], plan: &[Planned]) -> Vec<Unit> {
    units
        .iter()
        .map(|u| match plan.iter().find(|p| p.key == u.key) {
            Some(p) => Unit {
                class: p.to,
                settling: true,
                ..*u
            },
            None => *u,
        })
        .collect()
}

/// Checks every rule of the watermark policy for one configuration.
fn check(
    s: &TierSettings,
    caps: &[(u8, u64)],
    units: &[Unit],
    shedding_before: &BTreeSet<u8>,
) -> Result<(), String> {
    check_sealed(s, caps, &[], units, shedding_before)
}

/// [`check`], with the classes in `sealed` encrypted.
fn check_sealed(
    s: &TierSettings,
    caps: &[(u8, u64)],
    sealed: &[u8],
    units: &[Unit],
    shedding_before: &BTreeSet<u8>,
) -> Result<(), String> {
    let Some(classes) = classes_sealed(caps, sealed, units) else {
        return Ok(());
    };
    let mut shedding = shedding_before.clone();
    let plan = Watermarks.plan(s, &classes, units, &mut shedding);
    let ctx = || {
        format!("{s:?}\nclasses {classes:?}\nunits {units:?}\nshedding {shedding_before:?}\nplan {plan:?}")
    };
    let order = |c: u8| caps.iter().position(|x| x.0 == c).unwrap();
    // Each unit at most once, from where it is.
    let keys: BTreeSet<u64> = plan.iter().map(|p| p.key).collect();
    if keys.len() != plan.len() {
        return Err(format!("a unit planned twice\n{}", ctx()));
    }
    for p in &plan {
        let u = units.iter().find(|u| u.key == p.key).unwrap();
        if u.class != p.from || p.from == p.to {
            return Err(format!("bad move {p:?}\n{}", ctx()));
        }
        // A unit that is not encrypted never enters an encrypted class.
        if !u.encrypted && sealed.contains(&p.to) {
            return Err(format!("plain unit into encrypted class {p:?}\n{}", ctx()));
        }
    }
    let after = apply(units, &plan);
    let Some(classes_after) = classes_sealed(caps, sealed, &after) else {
        return Err(format!("a class overfilled\n{}", ctx()));
    };
    for (i, c) in classes.iter().enumerate() {
        let (high, low) = s.watermarks(c.class);
        let high_b = pct_of(c.capacity, high);
        let low_b = pct_of(c.capacity, low);
        let demoted: Vec<&Planned> = plan
            .iter()
            .filter(|p| p.from == c.class && order(p.to) > i)
            .collect();
        let promoted: Vec<&Planned> = plan
            .iter()
            .filter(|p| p.from == c.class && order(p.to) < i)
            .collect();
        // What faster classes shed into it counts before it sheds itself.
        let incoming: u64 = plan
            .iter()
            .filter(|p| p.to == c.class && order(p.from) < i)
            .map(|p| units.iter().find(|u| u.key == p.key).unwrap().blocks)
            .sum();
        let used_at = c.used + incoming;
        let sheds = s.migration && (used_at > high_b || shedding_before.contains(&c.class));
        // Only a shedding class demotes; it is left shedding exactly while
        // it stays above its low watermark.
        if !sheds && !demoted.is_empty() {
            return Err(format!(
                "class {} demoted below its watermark\n{}",
                c.class,
                ctx()
            ));
        }
        let still = s.migration
            && (used_at > high_b || (shedding_before.contains(&c.class) && used_at > low_b));
        if shedding.contains(&c.class) != still {
            return Err(format!("class {} shedding state wrong\n{}", c.class, ctx()));
        }
        // Demotes nothing more than it needs to reach the low watermark.
        let freed: u64 = demoted
            .iter()
            .map(|p| units.iter().find(|u| u.key == p.key).unwrap().blocks)
            .sum();
        if let Some(last) = demoted.last() {
            let b = units.iter().find(|u| u.key == last.key).unwrap().blocks;
            if used_at - (freed - b) <= low_b {
                return Err(format!(
                    "class {} demoted past its low watermark\n{}",
                    c.class,
                    ctx()
                ));
            }
        }
        // Demotes the coldest first: an undemoted unit colder than a
        // demoted one could not fit anywhere slower.
        let promotes = plan.iter().any(|p| order(p.to) < order(p.from));
        if sheds && caps.len() == 2 && i == 0 && !promotes {
            let left = classes_after[i].used;
            for u in units
                .iter()
                .filter(|u| u.class == c.class && !keys.contains(&u.key))
            {
                let colder_than_moved = demoted.iter().any(|p| {
                    let m = units.iter().find(|x| x.key == p.key).unwrap();
                    Unit::colder(u, m).is_lt()
                });
                let fits_now = classes_after[i + 1..]
                    .iter()
                    .any(|x| x.admits(u) && x.capacity - x.used >= u.blocks);
                if colder_than_moved && fits_now {
                    return Err(format!("unit {} skipped though colder\n{}", u.key, ctx()));
                }
                // Still above the low watermark only if nothing else fits.
                if left > low_b && fits_now {
                    return Err(format!(
                        "class {} left above low while unit {} fits\n{}",
                        c.class,
                        u.key,
                        ctx()
                    ));
                }
            }
        }
        // Promotion: hot units only, one class up, never past low.
        for p in &promoted {
            let u = units.iter().find(|u| u.key == p.key).unwrap();
            if !s.promotion
                || u.settling
                || u.score < s.promote_after as f32
                || Some(order(p.to)) != (0..i).rev().find(|&j| caps[j].1 > 0)
            {
                return Err(format!("bad promotion {p:?}\n{}", ctx()));
            }
            let coldest_above = units
                .iter()
                .filter(|x| x.class == p.to && !keys.contains(&x.key))
                .min_by(|a, b| Unit::colder(a, b));
            if coldest_above.is_some_and(|c| !Unit::colder(c, u).is_lt()) {
                return Err(format!(
                    "promoted {p:?} would be the next to go down\n{}",
                    ctx()
                ));
            }
        }
        let arrived: u64 = plan
            .iter()
            .filter(|p| p.to == c.class && order(p.from) > i)
            .map(|p| units.iter().find(|u| u.key == p.key).unwrap().blocks)
            .sum();
        let limit_b = pct_of(c.capacity, s.promotion_limit(c.class));
        if arrived > 0 && (classes_after[i].used > limit_b || limit_b > high_b) {
            return Err(format!(
                "promotion into class {} passed its limit\n{}",
                c.class,
                ctx()
            ));
        }
    }
    // No ping-pong: planning again on the result moves nothing back.
    let mut shedding2 = shedding.clone();
    let again = Watermarks.plan(s, &classes_after, &after, &mut shedding2);
    for p in &again {
        if plan.iter().any(|q| q.key == p.key && q.from == p.to) {
            return Err(format!("unit {} moves back: {p:?}\n{}", p.key, ctx()));
        }
    }
    Ok(())
}

#[test]
fn every_two_class_configuration_keeps_the_rules() {
    let mut checked = 0;
    for n in 0..=4 {
        for units in unit_sets(n, &[0, 1]) {
            for (cap0, cap1) in [(4, 4), (3, 6), (5, 2), (0, 4)] {
                for (high, low) in [(75, 50), (100, 0), (50, 50), (90, 10)] {
                    for promotion in [false, true] {
                        for shedding in [BTreeSet::new(), BTreeSet::from([0])] {
                            let s = settings(high, low, promotion);
                            check(&s, &[(0, cap0), (1, cap1)], &units, &shedding)
                                .unwrap_or_else(|e| panic!("{e}"));
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 100_000, "{checked}");
}

/// With an encrypted class, units that are not encrypted never move into
/// it (neither down nor up), and the rules hold for the others: a colder
/// plain unit is passed over for an encrypted one the class takes.
#[test]
fn an_encrypted_class_takes_only_encrypted_units() {
    let mut checked = 0;
    for n in 0..=3 {
        for units in unit_sets_of(n, &[0, 1], &[true, false]) {
            for (cap0, cap1) in [(4, 4), (3, 6), (5, 2)] {
                for sealed in [&[1u8][..], &[0]] {
                    for promotion in [false, true] {
                        for shedding in [BTreeSet::new(), BTreeSet::from([0])] {
                            let s = settings(75, 50, promotion);
                            check_sealed(&s, &[(0, cap0), (1, cap1)], sealed, &units, &shedding)
                                .unwrap_or_else(|e| panic!("{e}"));
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 10_000, "{checked}");
    let unit = |key, encrypted, score| Unit {
        key,
        class: 0,
        blocks: 1,
        score,
        last_ms: 0,
        settling: false,
        encrypted,
    };
    // The coldest unit is plain: the encrypted one goes instead.
    let units = [unit(1, false, 0.0), unit(2, true, 5.0)];
    let classes = classes_sealed(&[(0, 2), (1, 8)], &[1], &units).unwrap();
    let plan = Watermarks.plan(
        &settings(50, 25, false),
        &classes,
        &units,
        &mut BTreeSet::new(),
    );
    assert_eq!(
        plan,
        vec![Planned {
            key: 2,
            from: 0,
            to: 1
        }]
    );
}

#[test]
fn every_three_class_configuration_keeps_the_rules() {
    for n in 0..=3 {
        for units in unit_sets(n, &[0, 2, 5]) {
            for caps in [[(0, 2), (2, 2), (5, 4)], [(0, 3), (2, 0), (5, 3)]] {
                for promotion in [false, true] {
                    let mut s = settings(60, 30, promotion);
                    s.set("class.2.high_watermark", "100").unwrap();
                    check(&s, &caps, &units, &BTreeSet::new()).unwrap_or_else(|e| panic!("{e}"));
                }
            }
        }
    }
}

#[test]
fn migration_off_demotes_nothing_and_forgets_shedding() {
    let units = vec![Unit {
        key: 1,
        class: 0,
        blocks: 4,
        score: 0.0,
        last_ms: 0,
        settling: false,
        encrypted: true,
    }];
    let classes = classes_of(&[(0, 4), (1, 8)], &units).unwrap();
    let mut s = settings(50, 25, false);
    s.migration = false;
    let mut shedding = BTreeSet::from([0]);
    assert!(Watermarks
        .plan(&s, &classes, &units, &mut shedding)
        .is_empty());
    assert!(shedding.is_empty());
    s.migration = true;
    assert_eq!(
        Watermarks.plan(&s, &classes, &units, &mut shedding),
        vec![Planned {
            key: 1,
            from: 0,
            to: 1
        }]
    );
}

#[test]
fn heat_decays_by_half_life_and_counts_accesses() {
    let mut h = Heat::default();
    for _ in 0..4 {
        h.touch(1000, 100);
    }
    assert!((h.at(1000, 100) - 4.0).abs() < 1e-3);
    assert!((h.at(1100, 100) - 2.0).abs() < 1e-3);
    assert!((h.at(1300, 100) - 0.5).abs() < 1e-3);
    h.touch(1100, 100);
    assert!((h.at(1100, 100) - 3.0).abs() < 1e-3);
    assert_eq!(h.last_ms, 1100);
}

#[test]
fn settings_are_checked_and_shown() {
    let mut s = TierSettings::default();
    s.set("high_watermark", "80").unwrap();
    s.set("low_watermark", "60%").unwrap();
    s.set("class.1.low_watermark", "10").unwrap();
    assert_eq!(s.watermarks(0), (80, 60));
    assert_eq!(s.watermarks(1), (80, 10));
    s.set("promotion", "on").unwrap();
    s.set("move_rate", "64MiB").unwrap();
    assert_eq!(s.move_rate, 64 << 20, "sizes as the config file takes them");
    s.set("move_rate", "0").unwrap();
    s.set("placement", "round-robin").unwrap();
    let shown = s.show();
    for (k, v) in [
        ("high_watermark", "80"),
        ("class.1.low_watermark", "10"),
        ("promotion", "on"),
        ("move_rate", "0"),
        ("placement", "round-robin"),
    ] {
        assert!(
            shown.iter().any(|(a, b)| a == k && b == v),
            "{k} in {shown:?}"
        );
    }
    let before = s.clone();
    for (k, v, needle) in [
        (
            "high_watermark",
            "50",
            "low_watermark: the low watermark (60%) would be above",
        ),
        ("low_watermark", "101", "percentage"),
        ("high_watermark", "101", "percentage"),
        ("migration", "maybe", "on or off"),
        ("colour", "red", "unknown policy key"),
        ("class.x.high_watermark", "5", "storage class id"),
        ("promote_after", "0", "at least 1"),
        ("placement", "random", "local-first"),
        ("move_rate", "fast", "invalid size"),
    ] {
        let e = s.set(k, v).unwrap_err();
        assert!(e.contains(needle), "{k}={v}: {e}");
    }
    assert_eq!(s, before, "a refused change changes nothing");
    // A request is checked as a whole: the order of its keys does not
    // matter, and a refusal anywhere leaves everything.
    s.apply(&[("high_watermark", "30"), ("low_watermark", "20")])
        .unwrap();
    assert_eq!(s.watermarks(0), (30, 20));
    let e = s
        .apply(&[("promotion", "off"), ("class.1.high_watermark", "5")])
        .unwrap_err();
    assert!(e.starts_with("class.1.low_watermark"), "{e}");
    assert!(s.promotion, "nothing of a refused request applies");
}
