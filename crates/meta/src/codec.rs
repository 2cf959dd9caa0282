//! Effects as bytes: what the operation log keeps, one record per decision.
//!
//! A record is a format byte ([`EFFECTS_FORMAT`]), a count, and the effects
//! in the order they were applied, each a tag byte and its fields
//! (little-endian, strings length-prefixed; `nodekernel_proto::codec`).
//! Tags are append-only: a new effect gets a new tag, and an old tag never
//! changes its fields (a new format byte would). Decoding is bounded like
//! every wire decoder: counts are checked against the bytes present before
//! anything is allocated, and bad input is an error, never a panic.

use crate::alloc::BlockRef;
use crate::effect::Effect;
use crate::namespace::{Lease, NewNode};
use crate::slab::Piece;
use bytes::BytesMut;
use nodekernel_proto::codec::{Dec, Enc};
use nodekernel_proto::{Error, NodeType, Result, ServerSpec};

/// The record format written; the only one read.
pub const EFFECTS_FORMAT: u8 = 1;

/// Smallest encoding of one effect (a tag and a u32), for count checks.
const MIN_EFFECT: usize = 5;

mod tag {
    pub const NODE_CREATED: u8 = 1;
    pub const LINKED: u8 = 2;
    pub const REPLACED: u8 = 3;
    pub const UNLINKED: u8 = 4;
    pub const DROPPED: u8 = 5;
    pub const MOVED: u8 = 6;
    pub const SLOT_RELEASED: u8 = 7;
    pub const BLOCK_ADDED: u8 = 8;
    pub const BLOCK_SWAPPED: u8 = 9;
    pub const BLOCKS_TRUNCATED: u8 = 10;
    pub const BLOCK_FREED: u8 = 11;
    pub const BLOCK_STAMPED: u8 = 12;
    pub const SIZE_SET: u8 = 13;
    pub const LEASE_SET: u8 = 14;
    pub const LEASE_CLEARED: u8 = 15;
    pub const SERVER_ADDED: u8 = 16;
    pub const SERVER_RETIRED: u8 = 17;
    pub const MOVE_STARTED: u8 = 18;
    pub const MOVE_ENDED: u8 = 19;
    pub const SLAB_CREATED: u8 = 20;
    pub const PIECE_TAKEN: u8 = 21;
    pub const PIECE_FREED: u8 = 22;
    pub const SLAB_STAMPED: u8 = 23;
    pub const SLAB_RELEASED: u8 = 24;
    pub const COUNTERS_RAISED: u8 = 25;
    pub const SERVER_READDRESSED: u8 = 26;
    pub const BLOCK_HELD: u8 = 27;
    pub const PIECE_HELD: u8 = 28;
    pub const BALLOONED: u8 = 29;
    pub const ATTRS_SET: u8 = 30;
    /// `SERVER_ADDED` and `SERVER_READDRESSED` with the server's
    /// capability key (the old tags are still read, without one).
    pub const SERVER_ADDED_KEYED: u8 = 31;
    pub const SERVER_READDRESSED_KEYED: u8 = 32;
    /// A slab of encrypted values (`SLAB_CREATED` is one of plain ones).
    pub const SLAB_CREATED_ENCRYPTED: u8 = 33;
    /// A container's record piece replaced (`Effect::RecordPieceSwapped`).
    pub const RECORD_PIECE_SWAPPED: u8 = 34;
    /// A File's blocks replace its piece (`Effect::PieceOutgrown`).
    pub const PIECE_OUTGROWN: u8 = 35;
    /// A reserved put given its table and name (`Effect::Aimed`).
    pub const AIMED: u8 = 36;
    /// A node's expiry and child TTL (`Effect::LifetimeSet`).
    pub const LIFETIME_SET: u8 = 37;
    /// A session opened (`Effect::SessionOpened`).
    pub const SESSION_OPENED: u8 = 38;
    /// A session ended (`Effect::SessionEnded`).
    pub const SESSION_ENDED: u8 = 39;
    /// A container's quota (`Effect::QuotaSet`).
    pub const QUOTA_SET: u8 = 40;
    /// A node bound to a session (`Effect::SessionBound`).
    pub const SESSION_BOUND: u8 = 41;
}

fn block(e: &mut Enc, b: &BlockRef) {
    e.u32(b.server).u32(b.block).u64(b.gen);
}

fn piece(e: &mut Enc, p: &Piece) {
    e.u32(p.server).u32(p.block).u32(p.index).u32(p.size);
}

fn slot(e: &mut Enc, s: Option<u32>) {
    match s {
        Some(s) => e.bool(true).u32(s),
        None => e.bool(false),
    };
}

/// Appends the record of one decision's effects to `out`.
pub fn encode_effects(effects: &[Effect], out: &mut BytesMut) {
    let e = &mut Enc(out);
    e.u8(EFFECTS_FORMAT).u32(effects.len() as u32);
    for x in effects {
        match x {
            Effect::NodeCreated(n) => {
                e.u8(tag::NODE_CREATED)
                    .u64(n.id)
                    .u64(n.parent)
                    .str(&n.name)
                    .u8(n.ty as u8)
                    .u8(n.storage_class)
                    .str(&n.location)
                    .u8(crate::namespace::node_flags(
                        n.enumerable,
                        n.pinned,
                        n.encrypted,
                    ));
            }
            Effect::Linked { id, slot: s } => {
                e.u8(tag::LINKED).u64(*id);
                slot(e, *s);
            }
            Effect::Replaced { old, new } => {
                e.u8(tag::REPLACED).u64(*old).u64(*new);
            }
            Effect::Unlinked { id } => {
                e.u8(tag::UNLINKED).u64(*id);
            }
            Effect::Dropped { ids } => {
                e.u8(tag::DROPPED).u32(ids.len() as u32);
                for id in ids {
                    e.u64(*id);
                }
            }
            Effect::Moved {
                id,
                parent,
                name,
                slot: s,
            } => {
                e.u8(tag::MOVED).u64(*id).u64(*parent).str(name);
                slot(e, *s);
            }
            Effect::SlotReleased { container, slot } => {
                e.u8(tag::SLOT_RELEASED).u64(*container).u32(*slot);
            }
            Effect::BlockAdded { node, block: b } => {
                e.u8(tag::BLOCK_ADDED).u64(*node);
                block(e, b);
            }
            Effect::BlockSwapped {
                node,
                index,
                block: b,
            } => {
                e.u8(tag::BLOCK_SWAPPED).u64(*node).u64(*index);
                block(e, b);
            }
            Effect::BlocksTruncated { node, len } => {
                e.u8(tag::BLOCKS_TRUNCATED).u64(*node).u64(*len);
            }
            Effect::BlockFreed { block: b } => {
                e.u8(tag::BLOCK_FREED);
                block(e, b);
            }
            Effect::BlockStamped { node, index, gen } => {
                e.u8(tag::BLOCK_STAMPED).u64(*node).u64(*index).u64(*gen);
            }
            Effect::SizeSet { node, size } => {
                e.u8(tag::SIZE_SET).u64(*node).u64(*size);
            }
            Effect::LeaseSet { node, lease } => {
                e.u8(tag::LEASE_SET)
                    .u64(*node)
                    .u64(lease.id)
                    .u64(lease.expires_ms);
            }
            Effect::LeaseCleared { node } => {
                e.u8(tag::LEASE_CLEARED).u64(*node);
            }
            Effect::ServerAdded { id, spec } => {
                e.u8(tag::SERVER_ADDED_KEYED).u32(*id);
                spec.encode(e);
            }
            Effect::ServerRetired { id } => {
                e.u8(tag::SERVER_RETIRED).u32(*id);
            }
            Effect::ServerReaddressed { id, addr, cap_key } => match cap_key {
                Some(k) => {
                    e.u8(tag::SERVER_READDRESSED_KEYED)
                        .u32(*id)
                        .str(addr)
                        .fixed(k);
                }
                None => {
                    e.u8(tag::SERVER_READDRESSED).u32(*id).str(addr);
                }
            },
            Effect::MoveStarted {
                node,
                index,
                to,
                fence,
            } => {
                e.u8(tag::MOVE_STARTED).u64(*node).u64(*index);
                block(e, to);
                e.u64(*fence);
            }
            Effect::MoveEnded { node, index, done } => {
                e.u8(tag::MOVE_ENDED).u64(*node).u64(*index).bool(*done);
            }
            Effect::SlabCreated {
                block: b,
                piece_size,
                encrypted,
            } => {
                e.u8(if *encrypted {
                    tag::SLAB_CREATED_ENCRYPTED
                } else {
                    tag::SLAB_CREATED
                });
                block(e, b);
                e.u32(*piece_size);
            }
            Effect::PieceOutgrown { node } => {
                e.u8(tag::PIECE_OUTGROWN).u64(*node);
            }
            Effect::Aimed { node, parent, name } => {
                e.u8(tag::AIMED).u64(*node).u64(*parent).str(name);
            }
            Effect::PieceTaken { node, piece: p } => {
                e.u8(tag::PIECE_TAKEN).u64(*node);
                piece(e, p);
            }
            Effect::RecordPieceSwapped {
                node,
                index,
                piece: p,
            } => {
                e.u8(tag::RECORD_PIECE_SWAPPED).u64(*node).u32(*index);
                piece(e, p);
            }
            Effect::PieceFreed { piece: p } => {
                e.u8(tag::PIECE_FREED);
                piece(e, p);
            }
            Effect::SlabStamped { server, block, gen } => {
                e.u8(tag::SLAB_STAMPED).u32(*server).u32(*block).u64(*gen);
            }
            Effect::SlabReleased { server, block } => {
                e.u8(tag::SLAB_RELEASED).u32(*server).u32(*block);
            }
            Effect::CountersRaised { floor } => {
                e.u8(tag::COUNTERS_RAISED).u64(*floor);
            }
            Effect::BlockHeld { block: b } => {
                e.u8(tag::BLOCK_HELD);
                block(e, b);
            }
            Effect::PieceHeld { piece: p } => {
                e.u8(tag::PIECE_HELD);
                piece(e, p);
            }
            Effect::Ballooned { block: b } => {
                e.u8(tag::BALLOONED);
                block(e, b);
            }
            Effect::AttrsSet { node, mode, mtime } => {
                e.u8(tag::ATTRS_SET).u64(*node).u16(*mode).u64(*mtime);
            }
            Effect::LifetimeSet {
                node,
                expires_ms,
                child_ttl_ms,
            } => {
                e.u8(tag::LIFETIME_SET)
                    .u64(*node)
                    .u64(*expires_ms)
                    .u64(*child_ttl_ms);
            }
            Effect::SessionOpened {
                id,
                secret,
                lease_ms,
            } => {
                e.u8(tag::SESSION_OPENED)
                    .u64(*id)
                    .u64(*secret as u64)
                    .u64((*secret >> 64) as u64)
                    .u64(*lease_ms);
            }
            Effect::SessionEnded { id, at_ms } => {
                e.u8(tag::SESSION_ENDED).u64(*id).u64(*at_ms);
            }
            Effect::SessionBound { node, session } => {
                e.u8(tag::SESSION_BOUND).u64(*node).u64(*session);
            }
            Effect::QuotaSet { node, bytes, nodes } => {
                e.u8(tag::QUOTA_SET).u64(*node).u64(*bytes).u64(*nodes);
            }
        }
    }
}

fn dec_block(d: &mut Dec) -> Result<BlockRef> {
    Ok(BlockRef {
        server: d.u32()?,
        block: d.u32()?,
        gen: d.u64()?,
    })
}

fn dec_piece(d: &mut Dec) -> Result<Piece> {
    Ok(Piece {
        server: d.u32()?,
        block: d.u32()?,
        index: d.u32()?,
        size: d.u32()?,
    })
}

fn dec_slot(d: &mut Dec) -> Result<Option<u32>> {
    Ok(if d.bool()? { Some(d.u32()?) } else { None })
}

/// Reads one record written by [`encode_effects`], exactly.
pub fn decode_effects(buf: &[u8]) -> Result<Vec<Effect>> {
    let mut dec = Dec::new(buf, "logged effects");
    let d = &mut dec;
    let format = d.u8()?;
    if format != EFFECTS_FORMAT {
        return Err(Error::protocol(format!(
            "logged effects in format {format}; this build reads format {EFFECTS_FORMAT}"
        )));
    }
    let n = d.count(MIN_EFFECT)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = d.u8()?;
        out.push(match t {
            tag::NODE_CREATED => {
                let (id, parent, name) = (d.u64()?, d.u64()?, d.string()?);
                let ty = NodeType::from_u8(d.u8()?)?;
                let (storage_class, location) = (d.u8()?, d.string()?);
                let (enumerable, pinned, encrypted) = crate::namespace::dec_node_flags(d)?;
                Effect::NodeCreated(NewNode {
                    id,
                    parent,
                    name,
                    ty,
                    storage_class,
                    location,
                    enumerable,
                    pinned,
                    encrypted,
                })
            }
            tag::LINKED => Effect::Linked {
                id: d.u64()?,
                slot: dec_slot(d)?,
            },
            tag::REPLACED => Effect::Replaced {
                old: d.u64()?,
                new: d.u64()?,
            },
            tag::UNLINKED => Effect::Unlinked { id: d.u64()? },
            tag::DROPPED => {
                let n = d.count(8)?;
                let mut ids = Vec::with_capacity(n);
                for _ in 0..n {
                    ids.push(d.u64()?);
                }
                Effect::Dropped { ids }
            }
            tag::MOVED => Effect::Moved {
                id: d.u64()?,
                parent: d.u64()?,
                name: d.string()?,
                slot: dec_slot(d)?,
            },
            tag::SLOT_RELEASED => Effect::SlotReleased {
                container: d.u64()?,
                slot: d.u32()?,
            },
            tag::BLOCK_ADDED => Effect::BlockAdded {
                node: d.u64()?,
                block: dec_block(d)?,
            },
            tag::BLOCK_SWAPPED => Effect::BlockSwapped {
                node: d.u64()?,
                index: d.u64()?,
                block: dec_block(d)?,
            },
            tag::BLOCKS_TRUNCATED => Effect::BlocksTruncated {
                node: d.u64()?,
                len: d.u64()?,
            },
            tag::BLOCK_FREED => Effect::BlockFreed {
                block: dec_block(d)?,
            },
            tag::BLOCK_STAMPED => Effect::BlockStamped {
                node: d.u64()?,
                index: d.u64()?,
                gen: d.u64()?,
            },
            tag::SIZE_SET => Effect::SizeSet {
                node: d.u64()?,
                size: d.u64()?,
            },
            tag::LEASE_SET => Effect::LeaseSet {
                node: d.u64()?,
                lease: Lease {
                    id: d.u64()?,
                    expires_ms: d.u64()?,
                },
            },
            tag::LEASE_CLEARED => Effect::LeaseCleared { node: d.u64()? },
            tag::SERVER_ADDED => Effect::ServerAdded {
                id: d.u32()?,
                spec: ServerSpec::decode_keyed(d, false)?,
            },
            tag::SERVER_ADDED_KEYED => Effect::ServerAdded {
                id: d.u32()?,
                spec: ServerSpec::decode(d)?,
            },
            tag::SERVER_READDRESSED_KEYED => Effect::ServerReaddressed {
                id: d.u32()?,
                addr: d.string()?,
                cap_key: Some(d.array()?),
            },
            tag::SERVER_RETIRED => Effect::ServerRetired { id: d.u32()? },
            tag::SERVER_READDRESSED => Effect::ServerReaddressed {
                id: d.u32()?,
                addr: d.string()?,
                cap_key: None,
            },
            tag::MOVE_STARTED => Effect::MoveStarted {
                node: d.u64()?,
                index: d.u64()?,
                to: dec_block(d)?,
                fence: d.u64()?,
            },
            tag::MOVE_ENDED => Effect::MoveEnded {
                node: d.u64()?,
                index: d.u64()?,
                done: d.bool()?,
            },
            tag::SLAB_CREATED | tag::SLAB_CREATED_ENCRYPTED => Effect::SlabCreated {
                block: dec_block(d)?,
                piece_size: d.u32()?,
                encrypted: t == tag::SLAB_CREATED_ENCRYPTED,
            },
            tag::PIECE_OUTGROWN => Effect::PieceOutgrown { node: d.u64()? },
            tag::AIMED => Effect::Aimed {
                node: d.u64()?,
                parent: d.u64()?,
                name: d.string()?,
            },
            tag::PIECE_TAKEN => Effect::PieceTaken {
                node: d.u64()?,
                piece: dec_piece(d)?,
            },
            tag::RECORD_PIECE_SWAPPED => Effect::RecordPieceSwapped {
                node: d.u64()?,
                index: d.u32()?,
                piece: dec_piece(d)?,
            },
            tag::PIECE_FREED => Effect::PieceFreed {
                piece: dec_piece(d)?,
            },
            tag::SLAB_STAMPED => Effect::SlabStamped {
                server: d.u32()?,
                block: d.u32()?,
                gen: d.u64()?,
            },
            tag::SLAB_RELEASED => Effect::SlabReleased {
                server: d.u32()?,
                block: d.u32()?,
            },
            tag::COUNTERS_RAISED => Effect::CountersRaised { floor: d.u64()? },
            tag::BLOCK_HELD => Effect::BlockHeld {
                block: dec_block(d)?,
            },
            tag::PIECE_HELD => Effect::PieceHeld {
                piece: dec_piece(d)?,
            },
            tag::BALLOONED => Effect::Ballooned {
                block: dec_block(d)?,
            },
            tag::ATTRS_SET => {
                let node = d.u64()?;
                let mode = d.u16()?;
                if u32::from(mode) > nodekernel_proto::meta::MAX_MODE {
                    return Err(Error::protocol(format!("bad mode {mode:#o}")));
                }
                Effect::AttrsSet {
                    node,
                    mode,
                    mtime: d.u64()?,
                }
            }
            tag::LIFETIME_SET => Effect::LifetimeSet {
                node: d.u64()?,
                expires_ms: d.u64()?,
                child_ttl_ms: d.u64()?,
            },
            tag::SESSION_OPENED => Effect::SessionOpened {
                id: d.u64()?,
                secret: u128::from(d.u64()?) | u128::from(d.u64()?) << 64,
                lease_ms: d.u64()?,
            },
            tag::SESSION_ENDED => Effect::SessionEnded {
                id: d.u64()?,
                at_ms: d.u64()?,
            },
            tag::SESSION_BOUND => Effect::SessionBound {
                node: d.u64()?,
                session: d.u64()?,
            },
            tag::QUOTA_SET => Effect::QuotaSet {
                node: d.u64()?,
                bytes: d.u64()?,
                nodes: d.u64()?,
            },
            t => return Err(Error::protocol(format!("unknown logged effect {t}"))),
        });
    }
    dec.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec() -> ServerSpec {
        ServerSpec {
            addr: "127.0.0.1:1".into(),
            class: 1,
            class_name: "file".into(),
            medium: "file".into(),
            location: "rack-a".into(),
            block_size: 1 << 20,
            first_block: 0,
            num_blocks: 64,
            identity: "s-1".into(),
            incarnation: 7,
            cap_key: [3; 32],
        }
    }

    /// One of every effect, with distinct field values.
    fn every_effect() -> Vec<Effect> {
        let b = BlockRef {
            server: 3,
            block: 9,
            gen: 1 << 40,
        };
        let p = Piece {
            server: 2,
            block: 5,
            index: 77,
            size: 112,
        };
        vec![
            Effect::NodeCreated(NewNode {
                id: 42,
                parent: 1,
                name: "naïve name".into(),
                ty: NodeType::KeyValue,
                storage_class: 1,
                location: "here".into(),
                enumerable: false,
                pinned: true,
                encrypted: true,
            }),
            Effect::Linked { id: 42, slot: None },
            Effect::Linked {
                id: 43,
                slot: Some(7),
            },
            Effect::Replaced { old: 4, new: 5 },
            Effect::Unlinked { id: 6 },
            Effect::Dropped {
                ids: vec![1, 2, u64::MAX],
            },
            Effect::Moved {
                id: 8,
                parent: 9,
                name: "x".into(),
                slot: Some(0),
            },
            Effect::SlotReleased {
                container: 10,
                slot: 11,
            },
            Effect::BlockAdded { node: 12, block: b },
            Effect::BlockSwapped {
                node: 13,
                index: 2,
                block: b,
            },
            Effect::BlocksTruncated { node: 14, len: 3 },
            Effect::BlockFreed { block: b },
            Effect::BlockStamped {
                node: 15,
                index: 1,
                gen: 99,
            },
            Effect::SizeSet {
                node: 16,
                size: 1 << 33,
            },
            Effect::LeaseSet {
                node: 17,
                lease: Lease {
                    id: 5,
                    expires_ms: 123,
                },
            },
            Effect::LeaseCleared { node: 18 },
            Effect::ServerAdded {
                id: 2,
                spec: spec(),
            },
            Effect::ServerRetired { id: 3 },
            Effect::ServerReaddressed {
                id: 2,
                addr: "127.0.0.1:7001".into(),
                cap_key: Some([4; 32]),
            },
            Effect::ServerReaddressed {
                id: 2,
                addr: "127.0.0.1:7002".into(),
                cap_key: None,
            },
            Effect::MoveStarted {
                node: 19,
                index: 4,
                to: b,
                fence: 1000,
            },
            Effect::MoveEnded {
                node: 19,
                index: 4,
                done: true,
            },
            Effect::SlabCreated {
                block: b,
                piece_size: 112,
                encrypted: false,
            },
            Effect::SlabCreated {
                block: b,
                piece_size: 160,
                encrypted: true,
            },
            Effect::PieceTaken { node: 20, piece: p },
            Effect::RecordPieceSwapped {
                node: 21,
                index: 3,
                piece: p,
            },
            Effect::PieceFreed { piece: p },
            Effect::PieceOutgrown { node: 22 },
            Effect::Aimed {
                node: 23,
                parent: 4,
                name: "k1".into(),
            },
            Effect::SlabStamped {
                server: 2,
                block: 5,
                gen: 1001,
            },
            Effect::SlabReleased {
                server: 2,
                block: 5,
            },
            Effect::CountersRaised { floor: 1 << 50 },
            Effect::BlockHeld { block: b },
            Effect::PieceHeld { piece: p },
            Effect::Ballooned { block: b },
            Effect::AttrsSet {
                node: 12,
                mode: 0o1777,
                mtime: 1_700_000_000_000_000_000,
            },
            Effect::LifetimeSet {
                node: 12,
                expires_ms: 1_800_000_000_000,
                child_ttl_ms: 600_000,
            },
            Effect::SessionOpened {
                id: 3,
                secret: 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
                lease_ms: 10_000,
            },
            Effect::SessionEnded {
                id: 3,
                at_ms: 1_800_000_000_000,
            },
            Effect::SessionBound {
                node: 12,
                session: 3,
            },
            Effect::QuotaSet {
                node: 12,
                bytes: 50 << 30,
                nodes: u64::MAX,
            },
        ]
    }

    #[test]
    fn every_effect_round_trips() {
        let all = every_effect();
        let mut buf = BytesMut::new();
        encode_effects(&all, &mut buf);
        assert_eq!(decode_effects(&buf).unwrap(), all);
        let mut empty = BytesMut::new();
        encode_effects(&[], &mut empty);
        assert_eq!(decode_effects(&empty).unwrap(), vec![]);
    }

    #[test]
    fn truncated_extended_and_unknown_records_are_refused() {
        let mut buf = BytesMut::new();
        encode_effects(&every_effect(), &mut buf);
        for cut in 0..buf.len() {
            assert!(decode_effects(&buf[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = buf.to_vec();
        long.push(0);
        assert!(decode_effects(&long).is_err());
        let mut other = buf.to_vec();
        other[0] = EFFECTS_FORMAT + 1;
        assert!(decode_effects(&other).is_err());
        let mut unknown = BytesMut::new();
        Enc(&mut unknown).u8(EFFECTS_FORMAT).u32(1).u8(200).u32(0);
        let err = decode_effects(&unknown).unwrap_err();
        assert!(err.message.contains("unknown logged effect 200"), "{err}");
    }

    /// Records written before capability keys still read: the server
    /// comes without a key (its old blocks' capabilities cannot verify
    /// until it registers again), and a new address keeps the key.
    #[test]
    fn records_from_before_capability_keys_are_read() {
        let mut buf = BytesMut::new();
        let e = &mut Enc(&mut buf);
        e.u8(EFFECTS_FORMAT).u32(2).u8(tag::SERVER_ADDED).u32(2);
        let s = spec();
        s.encode(e);
        // The spec as it was: without the key at its end.
        buf.truncate(buf.len() - 32);
        let e = &mut Enc(&mut buf);
        e.u8(tag::SERVER_READDRESSED).u32(2).str("127.0.0.1:9");
        let back = decode_effects(&buf).unwrap();
        assert_eq!(
            back,
            vec![
                Effect::ServerAdded {
                    id: 2,
                    spec: ServerSpec {
                        cap_key: [0; 32],
                        ..s
                    }
                },
                Effect::ServerReaddressed {
                    id: 2,
                    addr: "127.0.0.1:9".into(),
                    cap_key: None
                },
            ]
        );
    }

    /// A node created before encryption (flags without bit 2) reads as
    /// not encrypted; flags past the known bits are refused.
    #[test]
    fn node_records_from_before_encryption_are_read() {
        let record = |flags: u8| {
            let mut buf = BytesMut::new();
            Enc(&mut buf)
                .u8(EFFECTS_FORMAT)
                .u32(1)
                .u8(tag::NODE_CREATED)
                .u64(5)
                .u64(1)
                .str("f")
                .u8(NodeType::File as u8)
                .u8(1)
                .str("")
                .u8(flags);
            decode_effects(&buf)
        };
        for (flags, pinned, encrypted) in [(3, true, false), (1, false, false), (5, false, true)] {
            match &record(flags).unwrap()[..] {
                [Effect::NodeCreated(n)] => {
                    assert_eq!(
                        (n.enumerable, n.pinned, n.encrypted),
                        (true, pinned, encrypted)
                    )
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(record(8).is_err());
    }

    #[test]
    fn a_huge_count_is_refused_before_allocating() {
        let mut buf = BytesMut::new();
        Enc(&mut buf).u8(EFFECTS_FORMAT).u32(u32::MAX);
        assert!(decode_effects(&buf).is_err());
        let mut buf = BytesMut::new();
        Enc(&mut buf)
            .u8(EFFECTS_FORMAT)
            .u32(1)
            .u8(tag::DROPPED)
            .u32(u32::MAX);
        assert!(decode_effects(&buf).is_err());
    }

    proptest! {
        #[test]
        fn any_bytes_decode_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_effects(&bytes);
        }

        #[test]
        fn any_sublist_round_trips(mask in any::<u32>()) {
            let picked: Vec<Effect> = every_effect()
                .into_iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << (i % 32)) != 0)
                .map(|(_, e)| e)
                .collect();
            let mut buf = BytesMut::new();
            encode_effects(&picked, &mut buf);
            prop_assert_eq!(decode_effects(&buf).unwrap(), picked);
        }
    }
}
