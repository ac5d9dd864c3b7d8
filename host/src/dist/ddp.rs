//! Gradient synchronization for data-parallel training: buckets of gradients reduced across the
//! ranks while the backward pass goes on, and the ZeRO-1 variant that shards the optimizer.
//!
//! [`GradSync::backward`] runs the backward pass with a hook ([`Tensor::backward_with`]): when the
//! last gradient of a bucket ([`BucketPlan`], reverse parameter order, about 25 MiB each) is
//! final, the bucket's collective is enqueued on the rank's communication stream behind an event
//! of the compute stream ([`Rank::launch`]), so it runs while the compute stream differentiates
//! the earlier layers. Buckets launch in plan order on every rank (NCCL needs the same order
//! everywhere). After the pass the compute stream waits (on the GPU) for every bucket, so the
//! optimizer's step, enqueued next, reads the reduced gradients. With `overlap` off every bucket
//! is launched after the whole pass (the same collectives, for comparison).
//!
//! - Replicated (plain data parallelism): each bucket's gradients are summed in place by one
//!   grouped NCCL all-reduce; every rank then runs the same optimizer step on the same gradients.
//!   The ranks' losses are scaled by their share of the global batch, so the sum is the global
//!   batch's mean gradient.
//! - ZeRO-1: each bucket's gradients are packed into one flat buffer (padded with zeros to a
//!   multiple of the ranks) and reduce-scattered: rank `r` receives the summed part `r` of every
//!   bucket ([`BucketPlan::owned`]), the slice of the parameters it owns. Its optimizer holds only
//!   that slice (a flat f32 master shard) and its state; after its step the updated slices are
//!   all-gathered into every rank's parameters ([`GradSync::gather_parameters`]).
//!
//! The gradient buffers a collective touches are kept alive here until the compute stream has
//! waited for it: kiln frees memory in compute-stream order, so nothing is reused under NCCL.

use super::plan::BucketPlan;
use super::{NCCL_FLOAT32, Pending, Rank, ReduceOp};
use crate::error::{Error, Result};
use crate::tensor::{DType, Device, Storage, Tensor, TensorId, no_grad};
use std::collections::HashMap;

/// How gradients and optimizer state are laid out over the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharding {
    /// Every rank holds all of the optimizer state; gradients are all-reduced.
    Replicated,
    /// ZeRO-1: each rank holds its shard of the optimizer state and of the master parameters;
    /// gradients are reduce-scattered and parameters all-gathered.
    Zero1,
}

/// Which buckets may launch as gradients become final: buckets launch in plan order (NCCL needs
/// the same order on every rank), each once all of its parameters' gradients are final.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchOrder {
    /// Final gradients seen per bucket.
    ready: Vec<usize>,
    /// The next bucket to launch.
    next: usize,
}

impl LaunchOrder {
    /// A pass over `plan` with no gradient final yet.
    pub fn new(plan: &BucketPlan) -> LaunchOrder {
        LaunchOrder { ready: vec![0; plan.buckets.len()], next: 0 }
    }

    /// Parameter `param`'s gradient is final: the buckets that may launch now, in order.
    pub fn on_final(&mut self, plan: &BucketPlan, param: usize) -> std::ops::Range<usize> {
        self.ready[plan.bucket_of[param]] += 1;
        let from = self.next;
        while self.next < plan.buckets.len() && self.ready[self.next] == plan.buckets[self.next].params.len() {
            self.next += 1;
        }
        from..self.next
    }

    /// The pass is over: the buckets not launched yet, in order (their missing gradients count as
    /// zeros).
    pub fn rest(&mut self, plan: &BucketPlan) -> std::ops::Range<usize> {
        let from = self.next;
        self.next = plan.buckets.len();
        from..self.next
    }
}

/// The gradient synchronization of one rank's model.
pub struct GradSync {
    plan: BucketPlan,
    params: Vec<Tensor>,
    index: HashMap<TensorId, usize>,
    sharding: Sharding,
    overlap: bool,
    /// Which buckets have launched in the current pass.
    order: LaunchOrder,
    /// Buffers the collectives in flight read or write (kept alive until the compute stream waits).
    in_flight: Vec<Tensor>,
    pending: Vec<Pending>,
    /// ZeRO-1: each bucket's summed part of this pass.
    parts: Vec<Option<Tensor>>,
    /// ZeRO-1: this rank's flat f32 master shard (the optimizer's only parameter), and the
    /// buffers the updated parameters are gathered into, one per bucket.
    shard: Option<Tensor>,
    gathered: Vec<Tensor>,
}

impl std::fmt::Debug for GradSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GradSync({} buckets, {:?}, overlap {})", self.plan.buckets.len(), self.sharding, self.overlap)
    }
}

/// The address of a dense f32 CUDA tensor with a storage of its own.
fn f32_addr(t: &Tensor, op: &'static str) -> Result<u64> {
    if t.dtype() != DType::F32 {
        return Err(Error::DType { op, got: t.dtype(), expected: DType::F32 });
    }
    if t.is_view() || t.layout().offset() != 0 || !t.is_contiguous() {
        return Err(Error::Unsupported {
            op,
            what: "a view (the collectives need a tensor with its own storage)".into(),
        });
    }
    match &*t.storage() {
        Storage::Cuda(c) => Ok(c.addr()),
        _ => Err(Error::Unsupported { op, what: "a tensor on the CPU".into() }),
    }
}

/// `n` zeros on `like`'s device (filled there by the fill kernel), 1-D.
fn zeros(like: &Tensor, n: usize) -> Result<Tensor> {
    let data = like.storage().filled(n, 0.0)?;
    Ok(Tensor::from_storage(data, [n].into(), None))
}

impl GradSync {
    /// Plans the buckets of `params` (f32 CUDA leaves on `rank`'s GPU, in parameter order) of at
    /// most `bucket_bytes` bytes of gradient each. Under ZeRO-1 also makes this rank's master
    /// shard from the parameters as they are now (broadcast them first).
    pub fn new(
        rank: &Rank,
        params: &[Tensor],
        bucket_bytes: usize,
        sharding: Sharding,
        overlap: bool,
    ) -> Result<GradSync> {
        for p in params {
            if p.dtype() != DType::F32 || !matches!(p.device(), Device::Cuda(_)) || !p.is_requires_grad() {
                return Err(Error::Unsupported {
                    op: "gradient synchronization",
                    what: format!(
                        "a parameter of shape {}: data-parallel parameters are f32 CUDA leaves that require gradients",
                        p.shape()
                    ),
                });
            }
        }
        let sizes: Vec<usize> = params.iter().map(|p| p.elem_count()).collect();
        let plan = BucketPlan::new(&sizes, 4, bucket_bytes, rank.world);
        let index = params.iter().enumerate().map(|(i, p)| (p.id(), i)).collect();
        let n = plan.buckets.len();
        let order = LaunchOrder::new(&plan);
        let mut gs = GradSync {
            plan,
            params: params.to_vec(),
            index,
            sharding,
            overlap,
            order,
            in_flight: Vec::new(),
            pending: Vec::new(),
            parts: (0..n).map(|_| None).collect(),
            shard: None,
            gathered: Vec::new(),
        };
        if sharding == Sharding::Zero1 && n > 0 {
            let _g = no_grad();
            let mut pieces = Vec::new();
            for b in 0..n {
                let flat = gs.pack(b, |p| Ok(p.clone()))?;
                let own = gs.plan.owned(b, rank.rank);
                pieces.push(flat.narrow(0, own.start, own.len())?);
                gs.gathered.push(zeros(&flat, gs.plan.buckets[b].padded)?);
            }
            let refs: Vec<&Tensor> = pieces.iter().collect();
            gs.shard = Some(Tensor::cat(&refs, 0)?.detach().requires_grad());
        }
        Ok(gs)
    }

    /// The bucket plan.
    pub fn plan(&self) -> &BucketPlan {
        &self.plan
    }

    /// How state is sharded.
    pub fn sharding(&self) -> Sharding {
        self.sharding
    }

    /// ZeRO-1: this rank's master shard, the one parameter its optimizer updates (None when
    /// replicated).
    pub fn shard(&self) -> Option<&Tensor> {
        self.shard.as_ref()
    }

    /// Bucket `b`'s tensors (through `of`: a parameter or its gradient) flattened into one
    /// contiguous 1-D f32 tensor of the bucket's padded length.
    fn pack(&self, b: usize, of: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        let bucket = &self.plan.buckets[b];
        let mut parts = Vec::with_capacity(bucket.params.len() + 1);
        for &p in &bucket.params {
            let t = of(&self.params[p])?;
            parts.push(t.reshape([t.elem_count()])?);
        }
        let pad = bucket.padded - bucket.len;
        if pad > 0 {
            parts.push(zeros(&self.params[bucket.params[0]], pad)?);
        }
        let refs: Vec<&Tensor> = parts.iter().collect();
        Tensor::cat(&refs, 0)
    }

    /// Runs `loss.backward()` and synchronizes the gradients (see the module's documentation).
    /// The optimizer's step can follow at once; the host is not blocked ([`Rank::settle`] waits).
    pub fn backward(&mut self, rank: &Rank, loss: &Tensor) -> Result<()> {
        self.start();
        rank.mark(|| "backward start".into(), false)?;
        {
            let this = &mut *self;
            loss.backward_with(&mut |leaf| match this.index.get(&leaf.id()) {
                Some(&i) if this.overlap => {
                    for b in this.order.on_final(&this.plan, i) {
                        this.launch(rank, b)?;
                    }
                    Ok(())
                }
                _ => Ok(()),
            })?;
        }
        rank.mark(|| "backward end".into(), false)?;
        self.finish(rank)
    }

    /// The synchronization of a rank with no rows in this step (a last batch smaller than the
    /// ranks): its gradients count as zeros, and it takes part in every bucket's collective.
    pub fn backward_without_loss(&mut self, rank: &Rank) -> Result<()> {
        for p in &self.params {
            p.zero_grad();
        }
        self.start();
        self.finish(rank)
    }

    fn start(&mut self) {
        self.order = LaunchOrder::new(&self.plan);
    }

    fn launch(&mut self, rank: &Rank, b: usize) -> Result<()> {
        let _g = no_grad();
        // a parameter the loss does not reach counts as a zero gradient
        for &p in &self.plan.buckets[b].params {
            let param = &self.params[p];
            if param.grad().is_none() {
                param.accumulate_grad(param.zeros_like()?)?;
            }
        }
        match self.sharding {
            Sharding::Replicated => {
                let mut calls = Vec::new();
                for &p in &self.plan.buckets[b].params {
                    let g = self.params[p].grad().ok_or_else(|| Error::Autograd("a gradient vanished".into()))?;
                    calls.push((f32_addr(&g, "all-reduce of gradients")?, g.elem_count()));
                    self.in_flight.push(g);
                }
                let pending = rank.launch(format!("bucket {b} all-reduce"), |s| {
                    rank.comm.group_start()?;
                    let mut first = Ok(());
                    for &(addr, len) in &calls {
                        // SAFETY: each address holds its gradient's `len` f32 on this rank's GPU,
                        // kept alive in `in_flight` until the compute stream waits for `s`.
                        let r =
                            unsafe { rank.comm.all_reduce_on(&rank.device, s, addr, len, NCCL_FLOAT32, ReduceOp::Sum) };
                        first = first.and(r);
                    }
                    let end = rank.comm.group_end();
                    first.and(end)
                })?;
                self.pending.push(pending);
            }
            Sharding::Zero1 => {
                let flat = self.pack(b, |p| p.grad().ok_or_else(|| Error::Autograd("a gradient vanished".into())))?;
                // packed: the model's own gradients are not read again (the shard gets the sum)
                for &p in &self.plan.buckets[b].params {
                    self.params[p].zero_grad();
                }
                let c = self.plan.buckets[b].shard_len(rank.world);
                let part = zeros(&flat, c)?;
                let (send, recv) = (f32_addr(&flat, "reduce-scatter")?, f32_addr(&part, "reduce-scatter")?);
                let pending = rank.launch(format!("bucket {b} reduce-scatter"), |s| {
                    // SAFETY: `flat` holds c x world f32 and `part` c, both on this GPU, kept alive
                    // (`in_flight`, `parts`) until the compute stream waits for `s`.
                    unsafe {
                        rank.comm.reduce_scatter_on(&rank.device, s, (send, recv), c, NCCL_FLOAT32, ReduceOp::Sum)
                    }
                })?;
                self.in_flight.push(flat);
                self.parts[b] = Some(part);
                self.pending.push(pending);
            }
        }
        Ok(())
    }

    /// Launches what is left, makes the compute stream wait for every collective, and (ZeRO-1)
    /// sets the summed parts as the shard's gradient.
    fn finish(&mut self, rank: &Rank) -> Result<()> {
        for b in self.order.rest(&self.plan) {
            self.launch(rank, b)?;
        }
        // the communication stream runs the buckets in order, so only the last wait can hold
        // the compute stream up
        for p in self.pending.drain(..) {
            rank.then_compute(p)?;
        }
        // the compute stream now waits for the collectives before anything it frees is reused
        self.in_flight.clear();
        if let Some(shard) = &self.shard {
            let _g = no_grad();
            let parts: Vec<Tensor> = self.parts.iter_mut().filter_map(Option::take).collect();
            let refs: Vec<&Tensor> = parts.iter().collect();
            shard.set_grad(Tensor::cat(&refs, 0)?)?;
        }
        rank.mark(|| "gradients reduced".into(), false)?;
        Ok(())
    }

    /// ZeRO-1, after the optimizer's step on the shard: gathers every rank's updated slices and
    /// writes the parameters (on every rank). A no-op when replicated.
    pub fn gather_parameters(&mut self, rank: &Rank) -> Result<()> {
        let Some(shard) = &self.shard else { return Ok(()) };
        let _g = no_grad();
        let base = f32_addr(shard, "all-gather of parameters")?;
        let mut calls = Vec::new();
        for b in 0..self.plan.buckets.len() {
            let c = self.plan.buckets[b].shard_len(rank.world);
            let at = base + (self.plan.shard_offset(b) * 4) as u64;
            calls.push((at, f32_addr(&self.gathered[b], "all-gather of parameters")?, c));
        }
        let pending = rank.launch("all-gather of parameters", |s| {
            rank.comm.group_start()?;
            let mut first = Ok(());
            for &(send, recv, c) in &calls {
                // SAFETY: `send` addresses c f32 of the shard, `recv` c x world of a gathered
                // buffer, both held by `self` for the run.
                let r = unsafe { rank.comm.all_gather_on(&rank.device, s, (send, recv), c, NCCL_FLOAT32) };
                first = first.and(r);
            }
            let end = rank.comm.group_end();
            first.and(end)
        })?;
        rank.then_compute(pending)?;
        for (b, bucket) in self.plan.buckets.iter().enumerate() {
            for (&p, &off) in bucket.params.iter().zip(&bucket.offsets) {
                let param = &self.params[p];
                let v = self.gathered[b].narrow(0, off, param.elem_count())?.reshape(param.shape().clone())?;
                param.set_data(&v)?;
            }
        }
        rank.mark(|| "parameters gathered".into(), false)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_launch_in_plan_order_once_complete() {
        // six parameters, 8-byte cap on f32: buckets [5, 4], [3, 2], [1, 0]
        let plan = BucketPlan::new(&[1, 1, 1, 1, 1, 1], 4, 8, 2);
        assert_eq!(plan.buckets.len(), 3);
        // backward's order (reverse): each bucket launches with its last gradient
        let mut o = LaunchOrder::new(&plan);
        let got: Vec<Vec<usize>> = (0..6).rev().map(|p| o.on_final(&plan, p).collect()).collect();
        assert_eq!(got, [vec![], vec![0], vec![], vec![1], vec![], vec![2]]);
        assert!(o.rest(&plan).is_empty());
        // bucket 1 complete before bucket 0: it waits, then both launch in order
        let mut o = LaunchOrder::new(&plan);
        assert!(o.on_final(&plan, 3).is_empty());
        assert!(o.on_final(&plan, 2).is_empty());
        assert!(o.on_final(&plan, 5).is_empty());
        assert_eq!(o.on_final(&plan, 4), 0..2);
        // a parameter the loss never reaches: the rest launches after the pass
        assert!(o.on_final(&plan, 1).is_empty());
        assert_eq!(o.rest(&plan), 2..3);
        // no overlap: everything after the pass
        let mut o = LaunchOrder::new(&plan);
        assert_eq!(o.rest(&plan), 0..3);
    }
}
