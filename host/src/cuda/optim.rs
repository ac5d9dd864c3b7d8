//! The multi-tensor optimizer on the runtime level: a table of parameters by device address
//! ([`MultiTensorTable`]), uploaded once per set of parameters, and one launch per SGD or Adam
//! step over all of them (`multi_sgd_f32`, `multi_adam_f32`; the `*_scalars` twins read the
//! learning rate, and Adam's step count and bias corrections, from the device, so that a CUDA
//! graph can replay them: [`MultiTensorTable::adam_scalars`]), plus one launch for the global
//! gradient norm that clipping scales by (`multi_grad_norm_f32`), with no host round trip
//! between them. The kernels and their table are documented in
//! [`kiln_gpu::kernels::optim`].
//!
//! This layer knows buffers, not tensors: `optim` builds the table from its parameters' storage,
//! and a mixed-precision wrapper adds each parameter's 16-bit compute copy ([`ComputeCopy`]), which
//! the same launch then writes from the updated f32 master weights.

use super::{Device, DeviceBuffer, LaunchConfig};
use crate::error::{Error, Result};
use kiln_gpu::kernels::optim::{
    ClipState, GRAD_PATCH, GradNorm, GradPatch, MAX_OPTIM_BLOCKS, MultiAdam, MultiAdamF32, MultiAdamScalarsF32,
    MultiGradNormF32, MultiPatchGrads, MultiSgd, MultiSgdF32, MultiSgdScalarsF32, OPTIM_CHUNK, OPTIM_THREADS,
    OptimAdamTick, OptimChunk, OptimTensor, StepScalars,
};
use kiln_gpu::{DevicePtr, DevicePtrMut};
use std::sync::Arc;

/// The 16-bit format of a compute copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyFormat {
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
}

/// A 16-bit compute copy of an f32 parameter, by device address: `len` u16 values of `format`
/// that each fused update overwrites with the updated weights rounded to nearest-even.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ComputeCopy {
    /// Device address of the first value (8-byte aligned for the vectorized path; any 2-byte
    /// aligned address works).
    pub addr: u64,
    /// Values (must equal the parameter's length).
    pub len: usize,
    /// Format.
    pub format: CopyFormat,
}

impl ComputeCopy {
    /// The copy held in a bf16 buffer (its whole length).
    pub fn bf16(buf: &DeviceBuffer<half::bf16>) -> ComputeCopy {
        ComputeCopy { addr: buf.addr(), len: buf.len(), format: CopyFormat::Bf16 }
    }
    /// The copy held in an f16 buffer (its whole length).
    pub fn f16(buf: &DeviceBuffer<half::f16>) -> ComputeCopy {
        ComputeCopy { addr: buf.addr(), len: buf.len(), format: CopyFormat::F16 }
    }
}

/// One parameter of a [`MultiTensorTable`], by device address (0: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TensorSlot {
    /// The f32 master weights.
    pub param: u64,
    /// Elements.
    pub len: usize,
    /// First f32 state array of `len` elements (SGD's velocity, Adam's first moment).
    pub state1: u64,
    /// Second f32 state array (Adam's second moment).
    pub state2: u64,
    /// The 16-bit compute copy, if any.
    pub copy: Option<ComputeCopy>,
    /// The parameter takes no weight decay (flag `NO_DECAY`).
    pub no_decay: bool,
}

/// The table entry of a slot (its gradient 0 until the first launch patches it in).
pub fn table_entry(slot: &TensorSlot) -> Result<OptimTensor> {
    let op = "multi-tensor optimizer";
    let len = u32::try_from(slot.len)
        .map_err(|_| Error::shape(op, format!("a parameter of {} elements (at most 2^32 - 1)", slot.len)))?;
    if slot.len > 0 && slot.param == 0 {
        return Err(Error::shape(op, format!("a parameter of {} elements at address 0", slot.len)));
    }
    let (copy, flags) = match slot.copy {
        None => (0, 0),
        Some(c) if c.len != slot.len => {
            return Err(Error::shape(
                op,
                format!("a compute copy of {} values for a parameter of {} elements", c.len, slot.len),
            ));
        }
        Some(c) if c.addr % 2 != 0 => {
            return Err(Error::shape(op, format!("a compute copy at the odd address {:#x}", c.addr)));
        }
        Some(c) => (c.addr, if c.format == CopyFormat::F16 { kiln_gpu::kernels::optim::COPY_F16 } else { 0 }),
    };
    let flags = if slot.no_decay { flags | kiln_gpu::kernels::optim::NO_DECAY } else { flags };
    Ok(OptimTensor { param: slot.param, grad: 0, state1: slot.state1, state2: slot.state2, copy, len, flags })
}

/// The chunks of parameters of `lens` elements, in order: parameter `i` of `n` elements gets
/// `ceil(n / OPTIM_CHUNK)` chunks (none when empty).
pub fn plan_chunks(lens: &[usize]) -> Result<Vec<OptimChunk>> {
    let op = "multi-tensor optimizer";
    let mut out = Vec::new();
    for (i, &n) in lens.iter().enumerate() {
        let tensor = u32::try_from(i).map_err(|_| Error::shape(op, "more than 2^32 parameters"))?;
        let n = u32::try_from(n).map_err(|_| Error::shape(op, format!("a parameter of {n} elements")))?;
        let mut start = 0u32;
        while start < n {
            out.push(OptimChunk { tensor, start });
            start = match start.checked_add(OPTIM_CHUNK) {
                Some(s) => s,
                None => break,
            };
        }
    }
    if u32::try_from(out.len()).is_err() {
        return Err(Error::shape(op, format!("{} chunks (at most 2^32 - 1)", out.len())));
    }
    Ok(out)
}

/// Blocks of a multi-tensor launch over `chunks` chunks (each block takes at least one).
pub fn launch_blocks(chunks: usize) -> u32 {
    chunks.min(MAX_OPTIM_BLOCKS as usize) as u32
}

/// Whether a launch must patch every gradient address of its table rather than those that moved
/// since the host last wrote them: while capturing (the graph must carry them all), when the host's
/// mirror of the device's table is not known (after a capture or a failed launch), and for good once
/// a launch over the table was captured (`in_graph`): each replay of that graph writes the graph's
/// gradient addresses into the device's table, so a later eager launch whose gradients sit where
/// the previous eager step's did (the pool hands the same addresses back) would otherwise read the
/// graph's stale gradients.
pub fn patch_every_gradient(capturing: bool, grads_known: bool, in_graph: bool) -> bool {
    capturing || !grads_known || in_graph
}

/// The patches that bring a table holding gradient addresses `held` to `now` (all of them when
/// `all`, else those that differ), [`GRAD_PATCH`] per patch, in parameter order. Empty when
/// nothing moved.
pub fn plan_patches(held: &[u64], now: &[u64], all: bool) -> Vec<GradPatch> {
    let mut out: Vec<GradPatch> = Vec::new();
    for (i, (&h, &g)) in held.iter().zip(now).enumerate() {
        if !all && h == g {
            continue;
        }
        if out.last().is_none_or(|p| p.n as usize == GRAD_PATCH) {
            out.push(GradPatch::default());
        }
        let p = out.last_mut().expect("pushed above");
        p.tensor[p.n as usize] = i as u32;
        p.grad[p.n as usize] = g;
        p.n += 1;
    }
    out
}

/// A device-side table of parameters for the multi-tensor kernels, with the scratch and the
/// [`ClipState`] of gradient clipping. Built once per set of parameters ([`MultiTensorTable::new`],
/// [`MultiTensorTable::set_tensors`]); each step passes the gradients' current addresses, and the
/// ones that moved since the last launch travel in that launch ([`GradPatch`]).
pub struct MultiTensorTable {
    dev: Arc<Device>,
    /// What the device's table holds (gradients: as of the last launch, when `grads_known`).
    entries: Vec<OptimTensor>,
    tensors: DeviceBuffer<u64>,
    chunks: DeviceBuffer<u64>,
    n_chunks: u32,
    /// Whether `entries`' gradients are what the device's table holds (not after a capture,
    /// whose launches run only when the graph is replayed, or after a failed launch).
    grads_known: bool,
    /// Whether a launch over this table was captured into a CUDA graph: every replay writes the
    /// graph's gradient addresses into the device's table behind the host's back, so from then on
    /// each launch patches every gradient ([`patch_every_gradient`]).
    in_graph: bool,
    partials: DeviceBuffer<f32>,
    /// One [`ClipState`] as four u32 words.
    clip: DeviceBuffer<u32>,
    /// Whether the last [`MultiTensorTable::grad_norm`] measured anything (a table without chunks
    /// launches nothing: its norm is 0 and its scale 1).
    norm_launched: bool,
    /// One [`StepScalars`] as four u32 words: the learning rate, the step count and Adam's bias
    /// corrections that the `*_scalars` launches read ([`MultiTensorTable::sgd_scalars`],
    /// [`MultiTensorTable::adam_scalars`]).
    scalars: DeviceBuffer<u32>,
    /// The learning rate last written into `scalars` (None: not written yet).
    written_lr: Option<f32>,
}

impl std::fmt::Debug for MultiTensorTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MultiTensorTable({} tensors, {} chunks on {})", self.entries.len(), self.n_chunks, self.dev.name())
    }
}

impl MultiTensorTable {
    /// Uploads the table of `slots` to `dev` (and allocates the clipping scratch).
    pub fn new(dev: &Arc<Device>, slots: &[TensorSlot]) -> Result<MultiTensorTable> {
        let init = ClipState { norm: 0.0, scale: 1.0, ticket: 0, pad: 0 };
        let mut t = MultiTensorTable {
            dev: dev.clone(),
            entries: Vec::new(),
            tensors: dev.zeros::<u64>(1)?,
            chunks: dev.zeros::<u64>(1)?,
            n_chunks: 0,
            grads_known: false,
            in_graph: false,
            partials: dev.zeros::<f32>(MAX_OPTIM_BLOCKS as usize)?,
            clip: dev.upload(&[init.norm.to_bits(), init.scale.to_bits(), init.ticket, init.pad])?,
            norm_launched: false,
            scalars: dev.zeros::<u32>(4)?,
            written_lr: None,
        };
        t.set_tensors(slots)?;
        Ok(t)
    }

    /// Replaces the table with `slots` (one upload of the table and one of the chunks).
    pub fn set_tensors(&mut self, slots: &[TensorSlot]) -> Result<()> {
        let entries = slots.iter().map(table_entry).collect::<Result<Vec<_>>>()?;
        let lens: Vec<usize> = slots.iter().map(|s| s.len).collect();
        let chunks = plan_chunks(&lens)?;
        let mut words: Vec<u64> = entries.iter().flat_map(|e| e.to_words()).collect();
        words.resize(words.len().max(1), 0);
        let mut cwords: Vec<u64> = chunks.iter().map(OptimChunk::to_word).collect();
        cwords.resize(cwords.len().max(1), 0);
        self.tensors = self.dev.upload(&words)?;
        self.chunks = self.dev.upload(&cwords)?;
        self.n_chunks = chunks.len() as u32;
        self.entries = entries;
        self.grads_known = true; // every gradient is 0 in the uploaded table
        Ok(())
    }

    /// Parameters in the table.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    /// Whether the table has no parameters.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// Chunks in the table.
    pub fn chunks(&self) -> usize {
        self.n_chunks as usize
    }
    /// The table's entries as the host last wrote them (gradients as of the last launch).
    pub fn entries(&self) -> &[OptimTensor] {
        &self.entries
    }
    /// The device.
    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    fn launch_cfg(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (launch_blocks(self.n_chunks as usize), 1, 1),
            block_dim: (OPTIM_THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    fn table_ptr(&self) -> DevicePtrMut<OptimTensor> {
        DevicePtrMut::from_addr(self.tensors.addr())
    }

    /// The patch for the next launch: the gradients that moved (all of them while capturing or
    /// when unknown). Surplus patches beyond one launch's [`GRAD_PATCH`] go first, each in a
    /// `multi_patch_grads` launch.
    fn sync_grads(&mut self, grads: &[u64]) -> Result<GradPatch> {
        if grads.len() != self.entries.len() {
            return Err(Error::shape(
                "multi-tensor optimizer",
                format!("{} gradient addresses for a table of {} parameters", grads.len(), self.entries.len()),
            ));
        }
        let capturing = self.dev.is_capturing();
        self.in_graph |= capturing;
        let held: Vec<u64> = self.entries.iter().map(|e| e.grad).collect();
        let all = patch_every_gradient(capturing, self.grads_known, self.in_graph);
        let mut patches = plan_patches(&held, grads, all);
        let last = patches.pop().unwrap_or_default();
        // whatever happens below, trust the mirror again only after the launches went out
        self.grads_known = false;
        for p in patches {
            let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (GRAD_PATCH as u32, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: the patch names parameters of this table; the table holds `len()` entries.
            unsafe { self.dev.launch(MultiPatchGrads, cfg, (self.table_ptr(), p))? };
        }
        for (e, &g) in self.entries.iter_mut().zip(grads) {
            e.grad = g;
        }
        Ok(last)
    }

    fn clip_ptr(&self, clip: bool) -> DevicePtr<ClipState> {
        DevicePtr::from_addr(if clip && self.norm_launched { self.clip.addr() } else { 0 })
    }

    /// One SGD step of every parameter that has a gradient (`grads[i]`: parameter `i`'s f32
    /// gradient address, 0 for none), in one launch; with `clip`, the gradients are scaled by the
    /// scale the last [`MultiTensorTable::grad_norm`] left on the device. `h.chunks` is set here.
    ///
    /// # Safety
    /// Every address in the table and in `grads` must point to a live allocation of its
    /// parameter's length (state arrays: f32, as many as the optimizer reads: one with momentum),
    /// until the launch has run.
    pub unsafe fn sgd(&mut self, grads: &[u64], mut h: MultiSgd, clip: bool) -> Result<()> {
        let patch = self.sync_grads(grads)?;
        if self.n_chunks == 0 {
            self.grads_known = true;
            return Ok(());
        }
        h.chunks = self.n_chunks;
        let args = (self.table_ptr(), DevicePtr::from_addr(self.chunks.addr()), self.clip_ptr(clip), h, patch);
        // SAFETY: the caller guarantees the table's addresses; the chunks cover its parameters.
        unsafe { self.dev.launch(MultiSgdF32, self.launch_cfg(), args)? };
        self.grads_known = !self.dev.is_capturing();
        Ok(())
    }

    /// One Adam / AdamW step of every parameter that has a gradient, in one launch (as
    /// [`MultiTensorTable::sgd`]; both state arrays are read and written).
    ///
    /// # Safety
    /// As [`MultiTensorTable::sgd`], with both state arrays live.
    pub unsafe fn adam(&mut self, grads: &[u64], mut h: MultiAdam, clip: bool) -> Result<()> {
        let patch = self.sync_grads(grads)?;
        if self.n_chunks == 0 {
            self.grads_known = true;
            return Ok(());
        }
        h.chunks = self.n_chunks;
        let args = (self.table_ptr(), DevicePtr::from_addr(self.chunks.addr()), self.clip_ptr(clip), h, patch);
        // SAFETY: as `sgd`.
        unsafe { self.dev.launch(MultiAdamF32, self.launch_cfg(), args)? };
        self.grads_known = !self.dev.is_capturing();
        Ok(())
    }

    /// Writes the learning rate the next `*_scalars` launches (and the replays of a graph that
    /// captured them) read: one 4-byte host-to-device copy on the stream, skipped when the device
    /// already holds `lr`. Refused while capturing (a graph cannot copy from the host): write it
    /// before the capture and before each replay.
    pub fn write_lr(&mut self, lr: f32) -> Result<()> {
        if self.written_lr.is_some_and(|w| w.to_bits() == lr.to_bits()) {
            return Ok(());
        }
        if self.dev.is_capturing() {
            return Err(Error::Unsupported {
                op: "multi-tensor optimizer",
                what: "writing the learning rate during a capture: write it before the capture and before each replay"
                    .into(),
            });
        }
        self.dev.write_prefix(&mut self.scalars, &[lr.to_bits()])?;
        self.written_lr = Some(lr);
        Ok(())
    }

    /// Overwrites the device's step scalars (a checkpoint's step count, Adam's corrections for it).
    pub fn set_step_scalars(&mut self, s: StepScalars) -> Result<()> {
        self.dev.write(&mut self.scalars, &s.to_words())?;
        self.written_lr = Some(s.lr);
        Ok(())
    }

    /// The device's step scalars (one download: synchronizes).
    pub fn step_scalars(&self) -> Result<StepScalars> {
        let w = self.dev.download(&self.scalars)?;
        Ok(StepScalars::from_words([w[0], w[1], w[2], w[3]]))
    }

    /// [`MultiTensorTable::sgd`] with the learning rate read from the device's step scalars
    /// (`h.lr` ignored; [`MultiTensorTable::write_lr`] sets it): the launch a CUDA graph replays
    /// at the rate written before each replay (`multi_sgd_scalars_f32`).
    ///
    /// # Safety
    /// As [`MultiTensorTable::sgd`].
    pub unsafe fn sgd_scalars(&mut self, grads: &[u64], mut h: MultiSgd, clip: bool) -> Result<()> {
        let patch = self.sync_grads(grads)?;
        if self.n_chunks == 0 {
            self.grads_known = true;
            return Ok(());
        }
        h.chunks = self.n_chunks;
        let scalars = DevicePtr::<StepScalars>::from_addr(self.scalars.addr());
        let args = (self.table_ptr(), DevicePtr::from_addr(self.chunks.addr()), self.clip_ptr(clip), h, patch, scalars);
        // SAFETY: as `sgd`; `scalars` holds one StepScalars.
        unsafe { self.dev.launch(MultiSgdScalarsF32, self.launch_cfg(), args)? };
        self.grads_known = !self.dev.is_capturing();
        Ok(())
    }

    /// One Adam / AdamW step with its step count on the device (`multi_adam_scalars_f32`): the
    /// launch reads the count `t` and the learning rate from the device's step scalars, takes the
    /// bias corrections of step `t + 1` (`1 - beta^(t+1)` in f64, rounded once: the host's
    /// `(1.0 - beta.powi(t + 1)) as f32`) and leaves `t + 1` behind (`h.lr`, `h.c1`, `h.c2`
    /// ignored). One launch and no host data: a CUDA graph replays it, each replay one more step
    /// (a table without elements launches `optim_adam_tick`, which only counts).
    ///
    /// # Safety
    /// As [`MultiTensorTable::adam`].
    pub unsafe fn adam_scalars(
        &mut self,
        grads: &[u64],
        mut h: MultiAdam,
        (beta1, beta2): (f64, f64),
        clip: bool,
    ) -> Result<()> {
        let patch = self.sync_grads(grads)?;
        let scalars = DevicePtrMut::<StepScalars>::from_addr(self.scalars.addr());
        if self.n_chunks == 0 {
            let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: `scalars` holds one StepScalars; one thread writes it.
            unsafe { self.dev.launch(OptimAdamTick, one, (scalars,))? };
            self.grads_known = true;
            return Ok(());
        }
        h.chunks = self.n_chunks;
        let table = (self.table_ptr(), DevicePtr::from_addr(self.chunks.addr()), self.clip_ptr(clip));
        let args = (table.0, table.1, table.2, h, patch, scalars, beta1, beta2);
        // SAFETY: as `adam`; `scalars` holds one StepScalars whose ticket the last launch reset.
        unsafe { self.dev.launch(MultiAdamScalarsF32, self.launch_cfg(), args)? };
        self.grads_known = !self.dev.is_capturing();
        Ok(())
    }

    /// Measures the global L2 norm of the gradients `grads` (as [`MultiTensorTable::sgd`]) in one
    /// launch and leaves it, and the clip scale `min(1, max_norm / (norm + 1e-6))`, on the device
    /// for the next step ([`MultiTensorTable::clip_state`] reads them). Deterministic: the same
    /// gradients give the same bits.
    ///
    /// # Safety
    /// Every gradient address must point to a live f32 allocation of its parameter's length until
    /// the launch has run.
    pub unsafe fn grad_norm(&mut self, grads: &[u64], max_norm: f32) -> Result<()> {
        let patch = self.sync_grads(grads)?;
        if self.n_chunks == 0 {
            self.grads_known = true;
            self.norm_launched = false;
            return Ok(());
        }
        let h = GradNorm { chunks: self.n_chunks, max_norm };
        let args = (
            self.table_ptr(),
            DevicePtr::from_addr(self.chunks.addr()),
            self.partials.ptr_mut(),
            DevicePtrMut::from_addr(self.clip.addr()),
            h,
            patch,
        );
        // SAFETY: `partials` holds MAX_OPTIM_BLOCKS floats, one per block at most; `clip` one
        // ClipState with its ticket at 0 (the last launch's last block reset it).
        unsafe { self.dev.launch(MultiGradNormF32, self.launch_cfg(), args)? };
        self.grads_known = !self.dev.is_capturing();
        self.norm_launched = true;
        Ok(())
    }

    /// Overwrites the clip state on the device with `norm` and `scale` (one host-to-device copy on
    /// the stream, ordered after the launches before it): the next [`MultiTensorTable::sgd`] /
    /// [`MultiTensorTable::adam`] with `clip` multiplies every gradient by `scale` inside its update
    /// (loss scaling's unscale, fused with clipping). Needs a [`MultiTensorTable::grad_norm`]
    /// launched before (it is what makes the state the launches read); refused otherwise.
    pub fn set_clip_state(&mut self, norm: f32, scale: f32) -> Result<()> {
        if !self.norm_launched {
            return Err(Error::Unsupported {
                op: "multi-tensor optimizer",
                what: "setting the clip state before any grad_norm launch: launch grad_norm first".into(),
            });
        }
        self.dev.write(&mut self.clip, &[norm.to_bits(), scale.to_bits(), 0, 0])
    }

    /// The norm and scale of the last [`MultiTensorTable::grad_norm`] (one download; norm 0 and
    /// scale 1 before any, or for a table without elements).
    pub fn clip_state(&self) -> Result<ClipState> {
        if !self.norm_launched {
            return Ok(ClipState { norm: 0.0, scale: 1.0, ticket: 0, pad: 0 });
        }
        let w = self.dev.download(&self.clip)?;
        Ok(ClipState { norm: f32::from_bits(w[0]), scale: f32::from_bits(w[1]), ticket: w[2], pad: w[3] })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_bias_corrections_match_the_hosts_powi() {
        use kiln_gpu::kernels::optim::{bias_correction, powi_f64};
        for beta in [0.9f64, 0.999, 0.95, 0.98, 0.5] {
            for t in (1u32..3000).chain([65535, 1 << 20, i32::MAX as u32]) {
                assert_eq!(powi_f64(beta, t).to_bits(), beta.powi(t as i32).to_bits(), "{beta}^{t}");
                let host = (1.0 - beta.powi(t as i32)) as f32;
                assert_eq!(bias_correction(beta, t).to_bits(), host.to_bits(), "1 - {beta}^{t}");
            }
        }
        assert_eq!(powi_f64(0.9, 0), 1.0);
    }

    #[test]
    fn step_scalars_round_trip_their_words_learning_rate_first() {
        let s = StepScalars { lr: 3e-4, t: 17, ticket: 0, pad: 0 };
        assert_eq!(std::mem::size_of::<StepScalars>(), 16);
        // SAFETY: repr(C), four 4-byte fields (size checked above).
        let words: [u32; 4] = unsafe { std::mem::transmute(s) };
        assert_eq!(words, s.to_words());
        assert_eq!(words[0], 3e-4f32.to_bits(), "the learning rate is the word the host rewrites alone");
        assert_eq!(StepScalars::from_words(words), s);
    }

    #[test]
    fn every_gradient_is_patched_once_a_graph_replays_the_table() {
        assert!(!patch_every_gradient(false, true, false), "eager, mirror known: only what moved");
        assert!(patch_every_gradient(true, true, false), "capturing");
        assert!(patch_every_gradient(false, false, false), "mirror unknown");
        assert!(patch_every_gradient(false, true, true), "after a capture: replays rewrite the table");
        // with every gradient patched, an eager step at the previous eager step's addresses still
        // writes them (a replay in between left the graph's there)
        let eager = [0x1000u64, 0x2000];
        assert!(plan_patches(&eager, &eager, false).is_empty());
        let p = plan_patches(&eager, &eager, patch_every_gradient(false, true, true));
        assert_eq!((p.len(), p[0].n, p[0].grad[0], p[0].grad[1]), (1, 2, 0x1000, 0x2000));
    }

    #[test]
    fn layouts_match_the_uploaded_words() {
        assert_eq!(std::mem::size_of::<OptimTensor>(), 48);
        assert_eq!(std::mem::size_of::<OptimChunk>(), 8);
        assert_eq!(std::mem::size_of::<ClipState>(), 16);
        let e = OptimTensor {
            param: 1,
            grad: 2,
            state1: 3,
            state2: 4,
            copy: 5,
            len: 6,
            flags: kiln_gpu::kernels::optim::COPY_F16,
        };
        // SAFETY: OptimTensor is repr(C): six u64-sized fields, no padding (size checked above).
        let words: [u64; 6] = unsafe { std::mem::transmute(e) };
        assert_eq!(words, e.to_words());
        let c = OptimChunk { tensor: 7, start: 8 * OPTIM_CHUNK };
        // SAFETY: two u32, repr(C).
        let word: u64 = unsafe { std::mem::transmute(c) };
        assert_eq!(word, c.to_word());
    }

    #[test]
    fn chunks_cover_every_element_once() {
        use kiln_gpu::kernels::optim::chunk_len;
        assert!(OPTIM_CHUNK.is_multiple_of(4 * OPTIM_THREADS));
        let c = OPTIM_CHUNK as usize;
        // odd sizes, exact multiples, one past, empties between, many tensors
        let mut lens = vec![1, 3, 0, 1023, 4097, c - 1, c, c + 1, 3 * c + 5, 0];
        lens.extend((0..40).map(|i| 7 * i + 1));
        let chunks = plan_chunks(&lens).unwrap();
        let mut covered = vec![0usize; lens.len()];
        let mut last: Option<(u32, u32)> = None;
        for ch in &chunks {
            let n = lens[ch.tensor as usize] as u32;
            assert!(ch.start < n && ch.start.is_multiple_of(OPTIM_CHUNK), "{ch:?}");
            if let Some(prev) = last {
                assert!(prev < (ch.tensor, ch.start), "chunks in order: {prev:?} then {ch:?}");
            }
            last = Some((ch.tensor, ch.start));
            covered[ch.tensor as usize] += chunk_len(n, ch.start) as usize;
        }
        assert_eq!(covered, lens);
        let want: usize = lens.iter().map(|n| n.div_ceil(c)).sum();
        assert_eq!(chunks.len(), want);
        assert!(plan_chunks(&[]).unwrap().is_empty());
        assert!(plan_chunks(&[0, 0]).unwrap().is_empty());
        assert_eq!(chunk_len(OPTIM_CHUNK + 3, OPTIM_CHUNK), 3);
        assert!(plan_chunks(&[1usize << 33]).is_err());
        assert_eq!(launch_blocks(0), 0);
        assert_eq!(launch_blocks(5), 5);
        assert_eq!(launch_blocks(1 << 20), MAX_OPTIM_BLOCKS);
    }

    #[test]
    fn table_entries_check_copies() {
        let slot = TensorSlot { param: 0x1000, len: 10, state1: 0x2000, state2: 0, copy: None, no_decay: false };
        assert_eq!(
            table_entry(&TensorSlot { no_decay: true, ..slot }).unwrap().flags,
            kiln_gpu::kernels::optim::NO_DECAY
        );
        let e = table_entry(&slot).unwrap();
        assert_eq!((e.param, e.grad, e.state1, e.copy, e.len, e.flags), (0x1000, 0, 0x2000, 0, 10, 0));
        let copy = ComputeCopy { addr: 0x3000, len: 10, format: CopyFormat::F16 };
        let e = table_entry(&TensorSlot { copy: Some(copy), ..slot }).unwrap();
        assert_eq!((e.copy, e.flags), (0x3000, kiln_gpu::kernels::optim::COPY_F16));
        let bf = ComputeCopy { format: CopyFormat::Bf16, ..copy };
        assert_eq!(table_entry(&TensorSlot { copy: Some(bf), ..slot }).unwrap().flags, 0);
        let short = ComputeCopy { len: 9, ..copy };
        assert!(table_entry(&TensorSlot { copy: Some(short), ..slot }).unwrap_err().to_string().contains("9 values"));
        let odd = ComputeCopy { addr: 0x3001, ..copy };
        assert!(table_entry(&TensorSlot { copy: Some(odd), ..slot }).is_err());
        assert!(table_entry(&TensorSlot { param: 0, ..slot }).is_err());
        assert!(table_entry(&TensorSlot { param: 0, len: 0, ..slot }).is_ok());
    }

    #[test]
    fn patches_carry_what_moved() {
        let held: Vec<u64> = (0..100).map(|i| 0x1000 * i).collect();
        assert!(plan_patches(&held, &held, false).is_empty());
        let mut now = held.clone();
        now[3] = 7;
        now[50] = 0; // the gradient went away
        let p = plan_patches(&held, &now, false);
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].n, &p[0].tensor[..2], &p[0].grad[..2]), (2, &[3, 50][..], &[7, 0][..]));
        assert_eq!(p[0].grad_of(3, 1), 7);
        assert_eq!(p[0].grad_of(50, 1), 0);
        assert_eq!(p[0].grad_of(4, 1), 1);
        // everything, in groups of GRAD_PATCH
        let all = plan_patches(&held, &now, true);
        assert_eq!(all.len(), 100usize.div_ceil(GRAD_PATCH));
        assert_eq!(all.iter().map(|p| p.n as usize).sum::<usize>(), 100);
        for (k, p) in all.iter().enumerate() {
            for j in 0..p.n as usize {
                let i = k * GRAD_PATCH + j;
                assert_eq!((p.tensor[j] as usize, p.grad[j]), (i, now[i]));
            }
        }
        assert!(plan_patches(&[], &[], true).is_empty());
    }

    #[test]
    fn clip_scale_is_min_one() {
        use kiln_gpu::kernels::optim::clip_scale;
        assert_eq!(clip_scale(0.0, 1.0), 1.0);
        assert_eq!(clip_scale(0.5, 1.0), 1.0);
        assert!((clip_scale(4.0, 1.0) - 0.25).abs() < 1e-6);
        assert_eq!(clip_scale(f32::INFINITY, 1.0), 0.0);
        assert_eq!(clip_scale(f32::NAN, 1.0), 1.0);
    }
}
