//! Tier migration in the metadata state: the heat of nodes and slabs from
//! this server's traffic, the policy's plan turned into block moves, and
//! the counters. Soft state, like drains: a restarted metadata server
//! starts cold, with the configured settings.

use super::{slab_move_index, MetaState, NodeId, SLAB_MOVE};
use crate::tier::{Heat, TierPolicy, TierSettings, Unit, Watermarks};
use nodekernel_proto::ClassMoves;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Tier migration's part of [`MetaState`].
#[derive(Debug)]
pub struct Tiering {
    pub(super) settings: TierSettings,
    policy: Box<dyn TierPolicy>,
    /// By node: nodes with blocks of their own.
    heat: HashMap<NodeId, Heat>,
    /// By slab (server, block): small values.
    slab_heat: HashMap<(u32, u32), Heat>,
    /// Classes above their high watermark, not yet down to their low one.
    shedding: BTreeSet<u8>,
    /// Blocks moved, by the class they left.
    pub(super) moves: BTreeMap<u8, ClassMoves>,
}

impl Default for Tiering {
    fn default() -> Self {
        Tiering {
            settings: TierSettings::default(),
            policy: Box::new(Watermarks),
            heat: HashMap::new(),
            slab_heat: HashMap::new(),
            shedding: BTreeSet::new(),
            moves: BTreeMap::new(),
        }
    }
}

/// One block move tier migration wants: block `index` of `node` (or the
/// slab of `index` with [`SLAB_MOVE`]), on `server`, from class `from` to
/// class `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    pub node: NodeId,
    pub index: u64,
    pub server: u32,
    pub from: u8,
    pub to: u8,
}

impl Migration {
    /// Towards a faster class.
    pub fn is_promotion(&self) -> bool {
        self.to < self.from
    }
}

/// What a planned unit stands for.
#[derive(Clone, Copy)]
enum UnitOf {
    Node(NodeId),
    Slab(u32, u32),
}

impl UnitOf {
    /// A total order: nodes by id, then slabs by place.
    fn order(&self) -> (u8, u64, u64) {
        match *self {
            UnitOf::Node(id) => (0, id, 0),
            UnitOf::Slab(server, block) => (1, server.into(), block.into()),
        }
    }
}

impl MetaState {
    pub fn tier_settings(&self) -> &TierSettings {
        &self.tier.settings
    }

    /// Sets the tiering and placement settings (from the configuration).
    pub fn set_tier_settings(&mut self, s: TierSettings) {
        self.alloc
            .set_round_robin(s.placement == crate::tier::PlacementPolicy::RoundRobin);
        self.tier.settings = s;
    }

    /// Replaces the migration policy (the default is [`Watermarks`]).
    pub fn set_tier_policy(&mut self, p: Box<dyn TierPolicy>) {
        self.tier.policy = p;
    }

    /// The heat of node `id` (its slab's, for a small value).
    pub fn heat(&self, id: NodeId) -> Heat {
        let n = self.ns.get(id);
        match n.and_then(|n| n.piece) {
            Some(p) => self.tier.slab_heat.get(&(p.server, p.block)),
            None => self.tier.heat.get(&id),
        }
        .copied()
        .unwrap_or_default()
    }

    /// Counts one access to node `id` at `now` (a create, lookup, open or
    /// map).
    pub(super) fn touch(&mut self, id: NodeId, now: u64) {
        let Some(n) = self.ns.get(id) else { return };
        // Only what can move: containers (their records are cold to the
        // policy) and nodes without data yet (a put just created) keep no
        // heat, so a million small values cost a heat entry per slab, not
        // per value.
        if n.ty.is_container() || (n.blocks.is_empty() && n.piece.is_none()) {
            return;
        }
        let hl = self.tier.settings.half_life_ms;
        let h = match n.piece {
            Some(p) => self.tier.slab_heat.entry((p.server, p.block)).or_default(),
            None => self.tier.heat.entry(id).or_default(),
        };
        h.touch(now, hl);
    }

    /// Forgets the heat of a node that is gone.
    pub(super) fn forget_heat(&mut self, id: NodeId) {
        self.tier.heat.remove(&id);
    }

    /// Up to `limit` block moves the policy wants now, demotions first.
    /// Pinned nodes, blocks being moved, blocks a snapshot reads and
    /// blocks on servers that take no new blocks (dead, draining) stay
    /// out. Walks the namespace only while a class sheds or promotion is
    /// on.
    pub fn migration_candidates(&mut self, now: u64, limit: usize) -> Vec<Migration> {
        let s = &self.tier.settings;
        let classes = self.alloc.class_use();
        let over = s.migration
            && classes
                .iter()
                .any(|c| c.used * 100 > c.capacity * s.watermarks(c.class).0 as u64);
        if !s.promotion && !over && (self.tier.shedding.is_empty() || !s.migration) {
            self.tier.shedding.clear();
            return Vec::new();
        }
        let ns = &self.ns;
        self.tier.heat.retain(|id, _| ns.get(*id).is_some());
        let slabs = &self.slabs;
        self.tier
            .slab_heat
            .retain(|(server, block), _| slabs.get(*server, *block).is_some());

        let hl = s.half_life_ms;
        let usable_class = |server: u32| {
            self.alloc
                .usable(server)
                .then(|| self.alloc.server_class(server))
                .flatten()
        };
        // (what, class, blocks, heat, may go to an encrypted class), in a
        // stable order (the namespace iterates in hash order), so ties
        // break the same way every time.
        let mut found: Vec<(UnitOf, u8, u64, Heat, bool)> = Vec::new();
        let mut unit = |u: UnitOf, class: u8, blocks: u64, h: Heat, sealed_ok: bool| {
            found.push((u, class, blocks, h, sealed_ok))
        };
        for n in self.ns.nodes() {
            if n.pinned || n.blocks.is_empty() {
                continue;
            }
            let moving = (0..n.blocks.len() as u64).any(|i| self.moves.contains_key(&(n.id, i)));
            if moving {
                continue;
            }
            let mut per: BTreeMap<u8, u64> = BTreeMap::new();
            for b in &n.blocks {
                if let Some(c) = usable_class(b.server) {
                    *per.entry(c).or_default() += 1;
                }
            }
            let h = self.tier.heat.get(&n.id).copied().unwrap_or_default();
            // A container's child records may go anywhere
            // (docs/encryption.md).
            let sealed_ok = n.encrypted || n.ty.is_container();
            for (class, blocks) in per {
                unit(UnitOf::Node(n.id), class, blocks, h, sealed_ok);
            }
        }
        for ((server, block), slab) in self.slabs.iter() {
            let index = slab_move_index(server, block);
            if self.moves.contains_key(&(SLAB_MOVE, index))
                || self.slab_pinned(server, block)
                || !self.alloc.usable(server)
            {
                continue;
            }
            let h = self
                .tier
                .slab_heat
                .get(&(server, block))
                .copied()
                .unwrap_or_default();
            let sealed_ok = slab.encrypted;
            unit(UnitOf::Slab(server, block), slab.class, 1, h, sealed_ok);
        }
        found.sort_by_key(|(u, class, ..)| (u.order(), *class));
        let units: Vec<Unit> = found
            .iter()
            .enumerate()
            .map(|(i, (_, class, blocks, h, sealed_ok))| Unit {
                key: i as u64,
                class: *class,
                blocks: *blocks,
                score: h.at(now, hl),
                last_ms: h.last_ms,
                settling: h.settling(now, hl),
                encrypted: *sealed_ok,
            })
            .collect();
        let plan = self
            .tier
            .policy
            .plan(s, &classes, &units, &mut self.tier.shedding);
        let mut out = Vec::new();
        for p in plan {
            match found[p.key as usize].0 {
                UnitOf::Node(id) => {
                    let Some(n) = self.ns.get(id) else { continue };
                    for (i, b) in n.blocks.iter().enumerate() {
                        if usable_class(b.server) == Some(p.from) {
                            out.push(Migration {
                                node: id,
                                index: i as u64,
                                server: b.server,
                                from: p.from,
                                to: p.to,
                            });
                        }
                    }
                }
                UnitOf::Slab(server, block) => out.push(Migration {
                    node: SLAB_MOVE,
                    index: slab_move_index(server, block),
                    server,
                    from: p.from,
                    to: p.to,
                }),
            }
            if out.len() >= limit {
                out.truncate(limit);
                break;
            }
        }
        out
    }

    /// Counts a migration that moved its block at `now`.
    pub fn note_migration(&mut self, m: &Migration, now: u64) {
        if m.node != SLAB_MOVE {
            self.tier.heat.entry(m.node).or_default().moved_ms = now.max(1);
        }
        let c = self.tier.moves.entry(m.from).or_insert(ClassMoves {
            class: m.from,
            ..ClassMoves::default()
        });
        if m.is_promotion() {
            c.promoted += 1;
        } else {
            c.demoted += 1;
        }
    }

    /// Whether a migration found by a scan still applies: its block is
    /// still on the same server and not being moved.
    pub fn migration_still_wanted(&self, m: &Migration) -> bool {
        let on_server = if m.node == SLAB_MOVE {
            let (s, block) = super::slab_of(m.index);
            s == m.server && self.slabs.get(s, block).is_some()
        } else {
            self.ns
                .get(m.node)
                .and_then(|n| n.blocks.get(m.index as usize))
                .is_some_and(|b| b.server == m.server)
        };
        on_server && self.alloc.usable(m.server) && !self.moves.contains_key(&(m.node, m.index))
    }
}
