//! Dynamic capacity: a storage server exports fewer (or again more) of its
//! blocks. Withdrawn blocks are owned by the *balloon*
//! (`Effect::Ballooned`: durable, fenced, counted neither free nor used);
//! a shrinking server gets no new blocks while the drainer moves its blocks
//! away, and each free block it gets back joins the balloon, until it
//! exports what it asked for. Growing gives ballooned blocks back.

use super::{Draft, MetaState, Reply};
use crate::alloc::BlockRef;
use crate::effect::Effect;
use nodekernel_proto::meta::MetaRequest;
use nodekernel_proto::types::ResizeStatus;
use nodekernel_proto::{Error, Result};

impl Draft<'_> {
    /// Storage server `server` (its identity or address) asks to export
    /// `blocks` of its blocks: a request signed with its key (`req`), with
    /// sequence number `seq`.
    pub(super) fn resize_asked(
        &mut self,
        req: &MetaRequest,
        server: &str,
        blocks: u32,
        seq: u64,
    ) -> Result<Reply> {
        let id = self.st.find_server(server)?;
        self.st.check_signed(id, req)?;
        self.notes.signed = Some((id, seq));
        self.resize(id, blocks)?;
        Ok(Reply::Resized(id))
    }

    /// Resizes server `id` to export `target` of its blocks: balloons as
    /// many free blocks as it takes (or has), or gives ballooned ones back.
    pub(super) fn resize(&mut self, id: u32, target: u32) -> Result<()> {
        let st = self.st;
        let s = st
            .alloc
            .server(id)
            .ok_or_else(|| Error::unknown_server(format!("no storage server {id}")))?;
        let max = s.spec.num_blocks;
        if target > max {
            return Err(Error::invalid_argument(format!(
                "storage server {} has {max} blocks in metadata partition {}; it cannot export {target}",
                s.spec.addr, st.placement.partition
            )));
        }
        let exported = s.exported_blocks();
        let target64 = u64::from(target);
        if exported > target64 {
            for _ in target64..exported {
                let Some(b) = self.plan.take_on(id) else {
                    break;
                };
                self.push(Effect::Ballooned { block: b });
            }
        } else {
            let back: Vec<(u32, u32)> = st
                .ballooned
                .range((id, 0)..=(id, u32::MAX))
                .map(|(k, _)| *k)
                .take((target64 - exported) as usize)
                .collect();
            for (server, block) in back {
                let gen = self.plan.gen();
                self.push(Effect::BlockFreed {
                    block: BlockRef { server, block, gen },
                });
            }
        }
        self.notes.resize = Some((id, target));
        Ok(())
    }
}

impl MetaState {
    /// Resizes server `id` to `target` blocks again (the drainer, after
    /// blocks moved away): what [`MetaRequest::Resize`] decides.
    ///
    /// [`MetaRequest::Resize`]: nodekernel_proto::meta::MetaRequest::Resize
    pub fn decide_resize(&self, id: u32, target: u32) -> Result<super::Decision> {
        let mut d = Draft::new(self);
        d.resize(id, target)?;
        Ok(d.finish(super::Reply::Resized(id)))
    }

    /// Marks `id` shrinking while it exports more than it asked for.
    pub(super) fn note_shrinking(&mut self, id: u32) {
        let shrinking = match (self.resize.get(&id), self.alloc.server(id)) {
            (Some(t), Some(s)) => s.exported_blocks() > u64::from(*t),
            _ => false,
        };
        self.alloc.set_shrinking(id, shrinking);
    }

    /// Where the resize of `id` stands.
    pub fn resize_status(&self, id: u32) -> ResizeStatus {
        let s = self.alloc.server(id);
        let exported = s.map_or(0, |s| s.exported_blocks());
        ResizeStatus {
            partition: self.placement.partition,
            server: id,
            max_blocks: s.map_or(0, |s| u64::from(s.spec.num_blocks)),
            exported_blocks: exported,
            target_blocks: self.resize.get(&id).map_or(exported, |t| u64::from(*t)),
            used_blocks: s.map_or(0, |s| s.used_blocks()),
        }
    }

    /// Servers still above the size they asked for, with that size (the
    /// drainer asks again after moving blocks away, to balloon them).
    pub fn shrinking(&self) -> Vec<(u32, u32)> {
        self.resize
            .iter()
            .filter(|(id, _)| self.alloc.is_shrinking(**id))
            .map(|(id, t)| (*id, *t))
            .collect()
    }
}
