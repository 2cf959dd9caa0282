//! Tier migration: how hot each node is, the runtime policy settings, and
//! the policy that decides which blocks move between storage classes.
//!
//! Plain data, no I/O, no clock (time is a parameter). The metadata
//! server keeps the heat of every node from its own traffic — creates,
//! lookups, opens and maps (reads and writes) — because that is what it
//! sees; a client that reads a node it already mapped, straight from the
//! storage servers, is not counted until it maps again. A small value's
//! heat is its slab's: the slab moves as a whole.
//!
//! [`Watermarks`] is the default [`TierPolicy`]: a class above its high
//! watermark sheds its coldest blocks into the next class until it is at
//! its low watermark; with promotion on, a unit read at least
//! `promote_after` times (decayed) on a slower class moves up while the
//! class above stays at or below its *promotion limit* (halfway between
//! its low and high watermarks: shedding stops at the low one, so a
//! class that ever shed has room to promote into), and only if it is
//! hotter than the coldest unit there (else it would be the next to go
//! down), and never into a class still shedding: a promotion never makes
//! the class shed again, never brings back what is next to go down, and a
//! unit moved within the last half-life is not promoted (no ping-pong).

use std::collections::BTreeSet;

/// How hot a node (or slab) is: an access count that halves every
/// `half_life_ms` without accesses, and the last access.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Heat {
    pub last_ms: u64,
    score: f32,
    /// When migration last moved it (0: never).
    pub moved_ms: u64,
}

impl Heat {
    /// The decayed score at `now`.
    pub fn at(&self, now: u64, half_life_ms: u64) -> f32 {
        let age = now.saturating_sub(self.last_ms) as f32;
        self.score * (-age / half_life_ms.max(1) as f32).exp2()
    }

    /// Whether migration moved it within the last half-life.
    pub fn settling(&self, now: u64, half_life_ms: u64) -> bool {
        self.moved_ms != 0 && now.saturating_sub(self.moved_ms) < half_life_ms
    }

    /// One access at `now`.
    pub fn touch(&mut self, now: u64, half_life_ms: u64) {
        self.score = self.at(now, half_life_ms) + 1.0;
        self.last_ms = self.last_ms.max(now);
    }
}

/// Where new blocks go within a storage class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementPolicy {
    /// Servers at the client's location first (the default).
    LocalFirst,
    /// Round-robin over every server of the class, ignoring location.
    RoundRobin,
}

impl PlacementPolicy {
    pub fn name(self) -> &'static str {
        match self {
            PlacementPolicy::LocalFirst => "local-first",
            PlacementPolicy::RoundRobin => "round-robin",
        }
    }
}

/// The migration policy's settings, read and changed at runtime
/// (`nk policy`), first taken from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierSettings {
    /// Demotion on (the watermarks apply).
    pub migration: bool,
    /// Percent of a class's capacity above which it sheds blocks.
    pub high_watermark: u8,
    /// Percent of a class's capacity it sheds down to.
    pub low_watermark: u8,
    /// Per-class watermarks (high, low), overriding the two above.
    pub class_watermarks: Vec<(u8, u8, u8)>,
    /// Hot blocks on slower classes move up when there is room.
    pub promotion: bool,
    /// Decayed accesses that make a unit hot enough to promote.
    pub promote_after: u32,
    /// Half-life of a unit's access count.
    pub half_life_ms: u64,
    /// Bytes per second all block moves (drain and migration) may copy;
    /// 0: no limit.
    pub move_rate: u64,
    pub placement: PlacementPolicy,
}

impl Default for TierSettings {
    fn default() -> Self {
        TierSettings {
            migration: true,
            high_watermark: 90,
            low_watermark: 75,
            class_watermarks: Vec::new(),
            promotion: false,
            promote_after: 8,
            half_life_ms: 60_000,
            move_rate: 256 << 20,
            placement: PlacementPolicy::LocalFirst,
        }
    }
}

/// Every key [`TierSettings::set`] takes, for help texts.
pub const POLICY_KEYS: &[&str] = &[
    "migration",
    "high_watermark",
    "low_watermark",
    "class.<id>.high_watermark",
    "class.<id>.low_watermark",
    "promotion",
    "promote_after",
    "half_life_ms",
    "move_rate",
    "placement",
];

fn on_off(key: &str, v: &str) -> Result<bool, String> {
    match v {
        "on" | "true" | "1" | "yes" => Ok(true),
        "off" | "false" | "0" | "no" => Ok(false),
        _ => Err(format!("{key}: {v:?} is not on or off")),
    }
}

fn percent(key: &str, v: &str) -> Result<u8, String> {
    match v.trim_end_matches('%').parse::<u8>() {
        Ok(p) if p <= 100 => Ok(p),
        _ => Err(format!("{key}: {v:?} is not a percentage from 0 to 100")),
    }
}

fn number(key: &str, v: &str, min: u64) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(n) if n >= min => Ok(n),
        _ => Err(format!(
            "{key}: {v:?} is not a whole number of at least {min}"
        )),
    }
}

impl TierSettings {
    /// The (high, low) watermarks of `class`, in percent.
    pub fn watermarks(&self, class: u8) -> (u8, u8) {
        self.class_watermarks
            .iter()
            .find(|(c, _, _)| *c == class)
            .map_or((self.high_watermark, self.low_watermark), |(_, h, l)| {
                (*h, *l)
            })
    }

    /// The percent of `class` promotions fill it up to: halfway between
    /// its low and high watermarks.
    pub fn promotion_limit(&self, class: u8) -> u8 {
        let (high, low) = self.watermarks(class);
        ((u16::from(high) + u16::from(low)) / 2) as u8
    }

    /// Every setting as (key, value), in [`POLICY_KEYS`] order.
    pub fn show(&self) -> Vec<(String, String)> {
        let onoff = |b: bool| if b { "on" } else { "off" }.to_string();
        let mut out = vec![
            ("migration".into(), onoff(self.migration)),
            ("high_watermark".into(), self.high_watermark.to_string()),
            ("low_watermark".into(), self.low_watermark.to_string()),
        ];
        for (c, h, l) in &self.class_watermarks {
            out.push((format!("class.{c}.high_watermark"), h.to_string()));
            out.push((format!("class.{c}.low_watermark"), l.to_string()));
        }
        out.extend([
            ("promotion".into(), onoff(self.promotion)),
            ("promote_after".into(), self.promote_after.to_string()),
            ("half_life_ms".into(), self.half_life_ms.to_string()),
            ("move_rate".into(), self.move_rate.to_string()),
            ("placement".into(), self.placement.name().to_string()),
        ]);
        out
    }

    /// Changes the settings `set` names, in order, all or none; refuses
    /// an unknown key, a bad value, or watermarks whose low one ends above
    /// the high one.
    pub fn apply<K: AsRef<str>, V: AsRef<str>>(&mut self, set: &[(K, V)]) -> Result<(), String> {
        let mut next = self.clone();
        for (k, v) in set {
            next.set_one(k.as_ref(), v.as_ref())?;
        }
        let bad = std::iter::once((None, next.high_watermark, next.low_watermark))
            .chain(
                next.class_watermarks
                    .iter()
                    .map(|(c, h, l)| (Some(*c), *h, *l)),
            )
            .find(|(_, h, l)| l > h);
        if let Some((c, h, l)) = bad {
            let (of, key) = match c {
                Some(c) => (format!(" of class {c}"), format!("class.{c}.low_watermark")),
                None => (String::new(), "low_watermark".to_string()),
            };
            return Err(format!(
                "{key}: the low watermark{of} ({l}%) would be above the high one ({h}%)"
            ));
        }
        *self = next;
        Ok(())
    }

    /// Changes one setting (see [`TierSettings::apply`]).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        self.apply(&[(key, value)])
    }

    fn set_one(&mut self, key: &str, value: &str) -> Result<(), String> {
        let next = self;
        let v = value.trim();
        match key {
            "migration" => next.migration = on_off(key, v)?,
            "high_watermark" => next.high_watermark = percent(key, v)?,
            "low_watermark" => next.low_watermark = percent(key, v)?,
            "promotion" => next.promotion = on_off(key, v)?,
            "promote_after" => {
                next.promote_after = u32::try_from(number(key, v, 1)?)
                    .map_err(|_| format!("{key}: {v:?} is too large"))?
            }
            "half_life_ms" => next.half_life_ms = number(key, v, 1)?,
            "move_rate" => {
                next.move_rate = nodekernel_proto::size::parse_bytes(v)
                    .map_err(|e| format!("{key}: {e} (bytes per second, 0: no limit)"))?
            }
            "placement" => {
                next.placement = match v {
                    "local-first" => PlacementPolicy::LocalFirst,
                    "round-robin" => PlacementPolicy::RoundRobin,
                    _ => return Err(format!("{key}: {v:?} is not local-first or round-robin")),
                }
            }
            _ => {
                let parts: Vec<&str> = key.split('.').collect();
                let (class, which) = match parts[..] {
                    ["class", c, w] if w == "high_watermark" || w == "low_watermark" => {
                        let c = c.parse::<u8>().map_err(|_| {
                            format!("{key}: {c:?} is not a storage class id (0-254)")
                        })?;
                        (c, w)
                    }
                    _ => {
                        return Err(format!(
                            "unknown policy key {key:?}; the keys are {}",
                            POLICY_KEYS.join(", ")
                        ))
                    }
                };
                let p = percent(key, v)?;
                let (mut h, mut l) = next.watermarks(class);
                if which == "high_watermark" {
                    h = p;
                } else {
                    l = p;
                }
                next.class_watermarks.retain(|(c, _, _)| *c != class);
                next.class_watermarks.push((class, h, l));
                next.class_watermarks.sort();
            }
        }
        Ok(())
    }
}

/// One storage class as the policy sees it: blocks on servers that take
/// new blocks (alive, not draining).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassUse {
    pub class: u8,
    pub capacity: u64,
    pub used: u64,
    /// An encrypted class: only encrypted units may move into it.
    pub encrypted: bool,
}

impl ClassUse {
    /// Whether unit `u` may move into this class.
    pub fn admits(&self, u: &Unit) -> bool {
        u.encrypted || !self.encrypted
    }
}

/// What moves as one: a node's blocks on one class, or a slab.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Unit {
    /// The caller's handle for it.
    pub key: u64,
    pub class: u8,
    pub blocks: u64,
    /// Decayed accesses at the time of planning.
    pub score: f32,
    pub last_ms: u64,
    /// Moved within the last half-life: not promoted (a unit demoted while
    /// still hot, because the class above had no colder one left, must
    /// not come straight back).
    pub settling: bool,
    /// It may move into an encrypted class ([`ClassUse::admits`]): its
    /// data is encrypted, or it is a container's child records (namespace
    /// metadata, `docs/encryption.md`); any other unit stays out of them.
    pub encrypted: bool,
}

impl Unit {
    /// Colder first: lower score, then older last access, then key.
    fn colder(a: &Unit, b: &Unit) -> std::cmp::Ordering {
        a.score
            .total_cmp(&b.score)
            .then(a.last_ms.cmp(&b.last_ms))
            .then(a.key.cmp(&b.key))
    }
}

/// One planned move of a whole unit to another class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    pub key: u64,
    pub from: u8,
    pub to: u8,
}

/// A migration policy: given the classes (fastest first) and the units
/// that may move (pinned nodes and blocks already moving are left out by
/// the caller), which move where. `shedding` holds the classes that
/// passed their high watermark and have not reached their low one yet
/// (kept by the caller between plans, updated by the policy).
pub trait TierPolicy: std::fmt::Debug + Send + Sync {
    fn plan(
        &self,
        s: &TierSettings,
        classes: &[ClassUse],
        units: &[Unit],
        shedding: &mut BTreeSet<u8>,
    ) -> Vec<Planned>;
}

/// The default policy (see the module docs).
#[derive(Debug, Default, Clone, Copy)]
pub struct Watermarks;

fn pct_of(capacity: u64, pct: u8) -> u64 {
    capacity * pct as u64 / 100
}

impl TierPolicy for Watermarks {
    fn plan(
        &self,
        s: &TierSettings,
        classes: &[ClassUse],
        units: &[Unit],
        shedding: &mut BTreeSet<u8>,
    ) -> Vec<Planned> {
        // Classes that hold nothing usable take no part.
        let classes: Vec<ClassUse> = classes.iter().copied().filter(|c| c.capacity > 0).collect();
        let mut used: Vec<u64> = classes.iter().map(|c| c.used).collect();
        let mut out = Vec::new();
        let mut planned: BTreeSet<u64> = BTreeSet::new();
        shedding.retain(|c| classes.iter().any(|x| x.class == *c));
        // Demotion, fastest class first, so what it sheds can cascade.
        for i in 0..classes.len() {
            let c = classes[i];
            let (high, low) = s.watermarks(c.class);
            if !s.migration {
                shedding.clear();
                break;
            }
            if used[i] > pct_of(c.capacity, high) {
                shedding.insert(c.class);
            }
            if used[i] <= pct_of(c.capacity, low) {
                shedding.remove(&c.class);
            }
            if !shedding.contains(&c.class) || i + 1 == classes.len() {
                continue;
            }
            let mut cold: Vec<&Unit> = units.iter().filter(|u| u.class == c.class).collect();
            cold.sort_by(|a, b| Unit::colder(a, b));
            let target = pct_of(c.capacity, low);
            for u in cold {
                if used[i] <= target {
                    break;
                }
                // Into the next class that admits it with room for the
                // whole unit.
                let Some(j) = (i + 1..classes.len()).find(|&j| {
                    classes[j].admits(u)
                        && classes[j].capacity - used[j].min(classes[j].capacity) >= u.blocks
                }) else {
                    continue;
                };
                used[i] -= u.blocks.min(used[i]);
                used[j] += u.blocks;
                planned.insert(u.key);
                out.push(Planned {
                    key: u.key,
                    from: c.class,
                    to: classes[j].class,
                });
            }
        }
        if !s.promotion {
            return out;
        }
        // Promotion: hottest first, one class up, while the class above
        // stays at or below its promotion limit, and only a unit hotter
        // than the coldest unit left there (else it would be next to go
        // down).
        let coldest: Vec<Option<&Unit>> = classes
            .iter()
            .map(|c| {
                units
                    .iter()
                    .filter(|u| u.class == c.class && !planned.contains(&u.key))
                    .min_by(|a, b| Unit::colder(a, b))
            })
            .collect();
        let threshold = s.promote_after as f32;
        let mut hot: Vec<&Unit> = units
            .iter()
            .filter(|u| u.score >= threshold && !u.settling && !planned.contains(&u.key))
            .collect();
        hot.sort_by(|a, b| Unit::colder(b, a));
        for u in hot {
            let Some(j) = classes.iter().position(|c| c.class == u.class) else {
                continue;
            };
            if j == 0 {
                continue;
            }
            let i = j - 1;
            // Not into a class still shedding: it would shed the unit again.
            let shedding_above = shedding.contains(&classes[i].class);
            let limit = s.promotion_limit(classes[i].class);
            let hotter = coldest[i].is_none_or(|c| Unit::colder(c, u).is_lt());
            if hotter
                && !shedding_above
                && classes[i].admits(u)
                && used[i] + u.blocks <= pct_of(classes[i].capacity, limit)
            {
                used[i] += u.blocks;
                used[j] -= u.blocks.min(used[j]);
                out.push(Planned {
                    key: u.key,
                    from: u.class,
                    to: classes[i].class,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
