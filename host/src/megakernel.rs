//! The megakernel's host side: build the per-SM instruction schedule of one MLP training step, and
//! interpret it on the CPU — SMs interleaved in a seeded random order, every wait checked — as the
//! reference for the device kernel and as the check that the schedule cannot deadlock. (A missing
//! wait shows up there only when a random interleaving changes the numbers: the interpreter runs
//! each instruction whole, so it is a strong test of the ordering, not a proof.)
//!
//! The instruction format, opcodes and counter protocol are `kiln_gpu::megakernel`'s (one
//! definition for host and device). The model is an MLP without biases: hidden layers
//! `act[l+1] = relu(act[l] W[l]^T)`, a linear last layer, mean-squared error or softmax
//! cross-entropy, and SGD (optional momentum).

use crate::error::{Error, Result};
use kiln_gpu::math;
use kiln_gpu::megakernel::{Instruction, NO_COUNTER, SCHEDULE_TILES, choose_tile, opcode, pitch, precision};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// The loss the step differentiates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// Mean over all outputs of (y - target)^2.
    Mse,
    /// Mean over the batch of softmax cross-entropy with integer targets.
    CrossEntropy,
}

/// How the device multiplies: which kernel runs the step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DataPath {
    /// `megakernel_step` (any GPU): shared-memory slabs and CUDA-core FMA chains in ascending k,
    /// bit-identical to [`interpret`]. Tiles 16, 32, 64.
    CudaCores,
    /// `megakernel_step_tf32_t32` / `_t64` (sm_90): TMA pages, a loader warp, tensor-core products
    /// (`mma.sync` at tile 32, `wgmma` at 64) with inputs rounded to tf32 (about 3 decimal digits
    /// per input, as PyTorch's `allow_tf32`; to nearest, ties to even). The activations and
    /// gradients are stored rounded (the values the products use), so [`GpuStep::activations`]
    /// reads tf32 values, all but the outputs. Tiles 32, 64.
    Tf32,
    /// `megakernel_step_tf32x3_t32` / `_t64` (sm_90), 3xTF32 products on `mma.sync` (each input
    /// split into a tf32 head and tail): about f32 accuracy. The default. Tiles 32, 64.
    #[default]
    Tf32x3,
    /// `megakernel_step_bf16_t64` / `_t128` (sm_90): as [`DataPath::Tf32`] at tile 64, with every
    /// operand of the products rounded to bf16 (8 significant bits, as PyTorch's bf16 autocast;
    /// to nearest, ties to even) and stored as bf16, so that a page carries twice the K of an f32
    /// one; f32 sums, f32 weights. [`GpuStep::activations`] reads bf16 values, all but the
    /// outputs. Tiles 64 and 128 (where each warpgroup owns 64 rows of the tile and multiplies
    /// with `wgmma` m64n128k16).
    Bf16,
}

impl DataPath {
    /// The kernel's [`precision`] code.
    pub fn code(self) -> u32 {
        match self {
            DataPath::CudaCores => precision::CUDA_CORES,
            DataPath::Tf32 => precision::TF32,
            DataPath::Tf32x3 => precision::TF32X3,
            DataPath::Bf16 => precision::BF16,
        }
    }

    /// `v` as the path's products read it from memory: rounded (nearest, ties to even) to tf32 on
    /// [`DataPath::Tf32`] and to bf16 on [`DataPath::Bf16`], whose page loops convert nothing; as
    /// it is on the others. The host stores what it uploads for the products (the batch, the
    /// weights' copies) this way, as the kernel's epilogues do.
    pub fn operand(self, v: f32) -> f32 {
        match self {
            DataPath::Tf32 => kiln_gpu::convert::tf32_round_host(v),
            DataPath::Bf16 => half::bf16::from_f32(v).to_f32(),
            DataPath::CudaCores | DataPath::Tf32x3 => v,
        }
    }

    /// Whether [`DataPath::operand`] rounds anything (tf32, bf16).
    fn rounds(self) -> bool {
        matches!(self, DataPath::Tf32 | DataPath::Bf16)
    }

    /// The tile edges the path's kernel is built for, ascending.
    pub fn tiles(self) -> &'static [u32] {
        kiln_gpu::megakernel::tiles_for(self.code())
    }

    /// What the path's input gradients read `W[l]` from: the tensor-core paths read a copy
    /// (`w_t`, or at bf16 tile 128 `w_op`) that [`GpuStep`] keeps twice, so the step's updates
    /// write the other copy; the CUDA cores read the weights the updates overwrite.
    pub fn weight_reads(self) -> WeightReads {
        match self {
            DataPath::CudaCores => WeightReads::InPlace,
            DataPath::Tf32 | DataPath::Tf32x3 | DataPath::Bf16 => WeightReads::StepStartCopy,
        }
    }
}

/// What a step's input gradients read the weights `W[l]` from, which decides whether the update
/// of `W[l]` must wait for them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightReads {
    /// The weights the step's updates overwrite ([`DataPath::CudaCores`]): each update of `W[l]`
    /// waits for every input gradient of layer `l`, which reads the old `W[l]` (a
    /// write-after-read guard, the instructions' second wait). Correct on every path.
    #[default]
    InPlace,
    /// A copy of the weights as the step started, which no update of the step writes (the
    /// tensor-core paths: [`GpuStep`] keeps the products' weight copies twice and alternates
    /// them, the updates writing the copy the next step reads): no guard, so a layer's updates
    /// can run beside its input gradients.
    StepStartCopy,
}

/// Parses `cuda-cores`, `tf32`, `tf32x3` or `bf16` (the main job's `--mega-path`).
impl std::str::FromStr for DataPath {
    type Err = Error;
    fn from_str(s: &str) -> Result<DataPath> {
        match s {
            "cuda-cores" => Ok(DataPath::CudaCores),
            "tf32" => Ok(DataPath::Tf32),
            "tf32x3" => Ok(DataPath::Tf32x3),
            "bf16" => Ok(DataPath::Bf16),
            other => Err(Error::Unsupported {
                op: "megakernel data path",
                what: format!("{other:?}: choose cuda-cores, tf32, tf32x3 or bf16"),
            }),
        }
    }
}

/// The model and batch a schedule is built for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlpShape {
    /// Rows per step.
    pub batch: usize,
    /// `dims[0]` inputs, `dims[l + 1]` outputs of layer l; `dims.len() - 1` layers.
    pub dims: Vec<usize>,
}

impl MlpShape {
    /// Number of layers.
    pub fn layers(&self) -> usize {
        self.dims.len() - 1
    }
}

/// Where a schedule applies each layer's SGD update.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Updates {
    /// `LINEAR_BWD_WEIGHT_SGD`: each weight-gradient tile updates its own weights from the product,
    /// once every input gradient of its layer (which reads the old weights) is done. No `dW` round
    /// trip, no update phase at the end of the step. The default.
    #[default]
    Fused,
    /// `LINEAR_BWD_WEIGHT` tiles write `dW`; `SGD_UPDATE` tiles, last in every SM's list, apply it.
    Separate,
}

mod trace;
pub use trace::{PhaseTimes, StepTrace, TraceRecord};

fn tiles(n: usize, tile: u32) -> u32 {
    n.div_ceil(tile as usize) as u32
}

/// Counter indices: forward row blocks, gradient row blocks and totals, weight-gradient totals.
#[derive(Clone, Copy, Debug)]
struct Counters {
    row_blocks: u32,
    layers: u32,
}

impl Counters {
    /// `act[l+1]` tiles done in row block `rb`.
    fn fwd(&self, l: u32, rb: u32) -> u32 {
        l * self.row_blocks + rb
    }
    /// `grad[l]` tiles done in row block `rb` (l in 1..=L).
    fn grad(&self, l: u32, rb: u32) -> u32 {
        self.layers * self.row_blocks + (l - 1) * self.row_blocks + rb
    }
    /// All `grad[l]` tiles done.
    fn grad_total(&self, l: u32) -> u32 {
        2 * self.layers * self.row_blocks + (l - 1)
    }
    /// All `dW[l]` tiles done.
    fn dw_total(&self, l: u32) -> u32 {
        2 * self.layers * self.row_blocks + self.layers + l
    }
    fn count(&self) -> usize {
        (2 * self.layers * self.row_blocks + 2 * self.layers) as usize
    }
}

/// A training step as instruction lists, one per SM.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// The shape it was built for.
    pub shape: MlpShape,
    /// Every instruction in its global (topological) order.
    pub order: Vec<Instruction>,
    /// Instruction lists per SM, each in global order: dealt as [`Schedule::dealing`] says.
    pub per_sm: Vec<Vec<Instruction>>,
    /// Number of dependency counters (all start at 0).
    pub counters: usize,
    /// Output tile edge (one of [`SCHEDULE_TILES`]).
    pub tile: u32,
    /// Where the updates are applied.
    pub updates: Updates,
    /// What the input gradients read the weights from (whether the updates wait for them).
    pub weight_reads: WeightReads,
    /// How `order` was dealt to the SMs.
    pub dealing: Dealing,
}

/// How [`build`] dealt a step's instructions to the SMs: whichever of these [`estimated_cost`]'s
/// times estimate fastest (on a tie the later one here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dealing {
    /// Instruction `k` of the order to SM `k % sms`.
    RoundRobin,
    /// In order, each to the SM where it can start first (list scheduling).
    List,
    /// Whenever an SM is free, the ready instruction on the longest path to the step's end
    /// (critical-path list scheduling); the order is then that of their estimated starts.
    CriticalPath,
}

fn instr(op: u32, layer: u32, tr: u32, tc: u32) -> Instruction {
    Instruction {
        opcode: op,
        layer,
        tile_row: tr,
        tile_col: tc,
        wait: NO_COUNTER,
        wait2: NO_COUNTER,
        signal: NO_COUNTER,
        signal2: NO_COUNTER,
        ..Default::default()
    }
}

/// Builds the schedule of one training step for `shape` on `sms` multiprocessors, with the tile
/// [`choose_tile`] picks for it among `path`'s tiles, fused updates, and the path's
/// [`DataPath::weight_reads`].
pub fn build(shape: &MlpShape, sms: usize, path: DataPath) -> Result<Schedule> {
    let widest = shape.dims.iter().skip(1).copied().max().unwrap_or(1);
    let clamp = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    let tile = choose_tile(clamp(shape.batch), clamp(widest), clamp(sms), path.tiles());
    build_with_tile(shape, sms, tile, Updates::default(), path.weight_reads())
}

/// [`build`] with a given tile edge (one of [`SCHEDULE_TILES`]), update placement and what the
/// input gradients read the weights from (a [`WeightReads::StepStartCopy`] schedule runs on the
/// tensor-core paths only; [`WeightReads::InPlace`] on every path).
pub fn build_with_tile(
    shape: &MlpShape,
    sms: usize,
    tile: u32,
    updates: Updates,
    weight_reads: WeightReads,
) -> Result<Schedule> {
    let op = "megakernel schedule";
    if !SCHEDULE_TILES.contains(&tile) {
        return Err(Error::shape(op, format!("tile {tile}: the kernels are built for tiles {SCHEDULE_TILES:?}")));
    }
    if shape.dims.len() < 2 || shape.dims.contains(&0) || shape.batch == 0 || sms == 0 {
        return Err(Error::shape(
            op,
            format!(
                "batch {}, dims {:?}, {sms} SMs: need a batch, at least one layer, non-zero widths and SMs",
                shape.batch, shape.dims
            ),
        ));
    }
    let layers = shape.layers() as u32;
    let rbs = tiles(shape.batch, tile);
    let c = Counters { row_blocks: rbs, layers };
    let w = |l: u32| tiles(shape.dims[l as usize], tile);
    let mut order = Vec::new();
    let cost = |i: &Instruction| estimated_cost(shape, tile, i);
    // the order's list schedule and its estimate, where a branch below already made them
    let mut scheduled = None;
    for l in 0..layers {
        for rb in 0..rbs {
            for cb in 0..w(l + 1) {
                let mut i = instr(opcode::LINEAR_FWD, l, rb, cb);
                if l > 0 {
                    (i.wait, i.wait_value) = (c.fwd(l - 1, rb), w(l));
                }
                i.signal = c.fwd(l, rb);
                order.push(i);
            }
        }
    }
    for rb in 0..rbs {
        for cb in 0..w(layers) {
            let mut i = instr(opcode::LOSS_GRAD, layers - 1, rb, cb);
            (i.wait, i.wait_value) = (c.fwd(layers - 1, rb), w(layers));
            (i.signal, i.signal2) = (c.grad(layers, rb), c.grad_total(layers));
            order.push(i);
        }
    }
    // The input gradients are the step's critical path: each layer's go before the weight work
    // that could run beside them.
    let input_gradients = |l: u32, order: &mut Vec<Instruction>| {
        for rb in 0..rbs {
            for cb in 0..w(l) {
                let mut i = instr(opcode::LINEAR_BWD_INPUT, l, rb, cb);
                (i.wait, i.wait_value) = (c.grad(l + 1, rb), w(l + 1));
                (i.signal, i.signal2) = (c.grad(l, rb), c.grad_total(l));
                order.push(i);
            }
        }
    };
    // The weight tiles of layer l: all of grad[l+1] first.
    let weight_tiles = |l: u32, op: u32| {
        (0..w(l + 1)).flat_map(move |tr| (0..w(l)).map(move |tc| (tr, tc))).map(move |(tr, tc)| {
            let mut i = instr(op, l, tr, tc);
            (i.wait, i.wait_value) = (c.grad_total(l + 1), rbs * w(l + 1));
            i
        })
    };
    // Where the input gradients read the weights the updates overwrite, the update of W[l] also
    // waits for every input gradient of layer l, which reads the old W[l] (a write-after-read
    // hazard a counter on dW alone would miss).
    let war_guard = |l: u32, i: &mut Instruction| {
        if l > 0 && weight_reads == WeightReads::InPlace {
            (i.wait2, i.wait2_value) = (c.grad_total(l), rbs * w(l));
        }
    };
    match updates {
        Updates::Separate => {
            // The updates go last: each waits for a whole layer's weight gradient (a barrier
            // across the GPU), and an SM's list runs in order, so an update in the middle would
            // hold back the input gradients behind it.
            let mut tail = Vec::new();
            for l in (0..layers).rev() {
                if l > 0 {
                    input_gradients(l, &mut order);
                }
                for mut i in weight_tiles(l, opcode::LINEAR_BWD_WEIGHT) {
                    i.signal = c.dw_total(l);
                    order.push(i);
                    let mut u = instr(opcode::SGD_UPDATE, l, i.tile_row, i.tile_col);
                    (u.wait, u.wait_value) = (c.dw_total(l), w(l + 1) * w(l));
                    war_guard(l, &mut u);
                    tail.push(u);
                }
            }
            order.extend(tail);
        }
        Updates::Fused => {
            // The backward's order: each layer's input gradients, top down, with each layer's
            // fused tiles placed "early" (right after the layer's own input gradients) or "late"
            // (after the next layer down's). Under a write-after-read guard a layer's fused
            // tiles can start once its input gradients are done, the same moment as the next
            // layer down's, which go first: late. Without the guard they can start once the
            // layer above's input gradients are done, beside the layer's own: early, except
            // that the last layers' input gradients are the step's critical path (the weight
            // tiles of layer 0 wait for all of them), so weight work placed beside them
            // lengthens the step. Layers from `k` up go early, the others late; the `k` whose
            // list schedule is estimated fastest is kept (ties: the larger, all late being the
            // order measured until run 160). Estimates, 4096 x 1024 x 8 at tile 128: 6512 all
            // late, 6372 from k = 2 (and all early); 256 x 1024 x 4 at tile 64: 436 against
            // 432 from k = 2; 64 x 256 x 4 at tile 32: all tie.
            let forward = order.len();
            let mut best: Option<(Vec<Instruction>, (Vec<Vec<Instruction>>, f64))> = None;
            for k in (0..=layers).rev() {
                let mut order = order[..forward].to_vec();
                let fused = |l: u32, order: &mut Vec<Instruction>| {
                    order.extend(weight_tiles(l, opcode::LINEAR_BWD_WEIGHT_SGD).map(|mut i| {
                        war_guard(l, &mut i);
                        i
                    }))
                };
                for l in (0..layers).rev() {
                    if l > 0 {
                        input_gradients(l, &mut order);
                    }
                    if l >= k {
                        fused(l, &mut order);
                    }
                    if l + 1 < layers.min(k) {
                        fused(l + 1, &mut order);
                    }
                }
                if k > 0 {
                    fused(0, &mut order);
                }
                let listed = list_schedule(&order, sms, c.count(), cost);
                if best.as_ref().is_none_or(|(_, (_, b))| listed.1 < *b) {
                    best = Some((order, listed));
                }
            }
            if let Some((o, listed)) = best {
                (order, scheduled) = (o, Some(listed));
            }
        }
    }
    // The list schedule where the estimate says it is faster than dealing the order round-robin
    // (on a tie, round-robin: the 64 x 256 x 4 model ties, and measured 0.042 ms round-robin
    // against 0.043 listed, run 117); the critical-path schedule where it is estimated no slower
    // than either.
    let (listed, estimate) = scheduled.unwrap_or_else(|| list_schedule(&order, sms, c.count(), cost));
    let dealt = round_robin(&order, sms);
    let dealt_estimate = estimated_time(&dealt, c.count(), cost);
    let (mut per_sm, estimate, mut dealing) = if estimate < dealt_estimate {
        (listed, estimate, Dealing::List)
    } else {
        (dealt, dealt_estimate, Dealing::RoundRobin)
    };
    let (by_rank, ranked_order, _) = priority_schedule(&order, sms, c.count(), cost, SIGNAL_LATENCY);
    if estimated_time(&by_rank, c.count(), cost) <= estimate {
        (per_sm, order, dealing) = (by_rank, ranked_order, Dealing::CriticalPath);
    }
    Ok(Schedule { shape: shape.clone(), order, per_sm, counters: c.count(), tile, updates, weight_reads, dealing })
}

/// The time [`priority_schedule`] estimates from a signal to its waiter's start, in
/// [`estimated_cost`]'s units (about 2 us on the H200's tile-128 path: a staged tile's counter is
/// signalled by the storer after its stores land, 1.5-2 us after the consumers are done, runs
/// 184-191). With 0 the large model's step measured 0.469-0.471 ms, with this 0.467-0.472 (H200
/// run 192).
const SIGNAL_LATENCY: f64 = 30.0;

/// An instruction's estimated time, in units of one 64 x 64 product over one [`PAGE_K`] page (about
/// 0.3 us on the H200's tensor-core path): a fixed 12 for its first page's latency, its stores and
/// its signal (about 3.5 us in the traces of runs 101-116), plus its pages scaled by the tile's
/// area. Only the ratios matter: [`list_schedule`] compares them.
///
/// [`PAGE_K`]: kiln_gpu::megakernel::PAGE_K
fn estimated_cost(shape: &MlpShape, tile: u32, i: &Instruction) -> f64 {
    let area = (tile as f64 / 64.0).powi(2);
    let pages = |k: usize| k.div_ceil(kiln_gpu::megakernel::PAGE_K as usize) as f64;
    let l = i.layer as usize;
    12.0 + area
        * match i.opcode {
            opcode::LINEAR_FWD => pages(shape.dims[l]),
            opcode::LINEAR_BWD_INPUT => pages(shape.dims[l + 1]),
            opcode::LINEAR_BWD_WEIGHT | opcode::LINEAR_BWD_WEIGHT_SGD => pages(shape.batch),
            // a loss tile takes about as long as 16 pages, an update tile 4
            opcode::LOSS_GRAD => 16.0,
            _ => 4.0,
        }
}

/// `order` dealt to `sms` in-order lists round-robin: instruction `k` to SM `k % sms`.
fn round_robin(order: &[Instruction], sms: usize) -> Vec<Vec<Instruction>> {
    let mut per_sm = vec![Vec::new(); sms];
    for (k, i) in order.iter().enumerate() {
        per_sm[k % sms].push(*i);
    }
    per_sm
}

/// The estimated finish times of each counter's signals, kept sorted.
struct SignalTimes(Vec<Vec<f64>>);

impl SignalTimes {
    fn new(counters: usize) -> SignalTimes {
        SignalTimes(vec![Vec::new(); counters])
    }

    fn push(&mut self, counter: u32, at: f64) {
        if counter != NO_COUNTER {
            let t = &mut self.0[counter as usize];
            t.insert(t.partition_point(|&x| x <= at), at);
        }
    }

    /// When a wait for `value` signals of `counter` is met, or `None` while fewer are known.
    fn met(&self, counter: u32, value: u32) -> Option<f64> {
        if counter == NO_COUNTER || value == 0 {
            return Some(0.0);
        }
        self.0[counter as usize].get(value as usize - 1).copied()
    }

    /// When both of `i`'s waits are met.
    fn ready(&self, i: &Instruction) -> Option<f64> {
        Some(self.met(i.wait, i.wait_value)?.max(self.met(i.wait2, i.wait2_value)?))
    }
}

/// Deals `order` (a topological order: every instruction after all that signal a counter it waits
/// for) to `sms` (at least one) in-order lists by list scheduling on estimated costs: in turn, each
/// instruction goes to the SM where it can start first, the later of the SM's free time and its
/// dependencies' estimated finish. Returns the lists and the estimated step time.
///
/// Deadlock-free whatever the real times: on every SM the estimated start times increase down the
/// list, and each instruction starts after the producers it waits for finish, so the unfinished
/// instruction with the earliest estimated start is always at the head of its SM's list with its
/// waits met. (Dealt round-robin, the 256 x 1024 x 4 model spent its last 37 us on weight tiles
/// queued behind input gradients, run 116; listed, its step went from 0.161 to 0.152-0.154 ms,
/// run 117.)
fn list_schedule(
    order: &[Instruction],
    sms: usize,
    counters: usize,
    cost: impl Fn(&Instruction) -> f64,
) -> (Vec<Vec<Instruction>>, f64) {
    let mut per_sm = vec![Vec::new(); sms];
    let mut free = vec![0.0f64; sms];
    let mut signals = SignalTimes::new(counters);
    for i in order {
        // (a wait no earlier instruction can meet, outside a topological order: after them all)
        let ready = signals.ready(i).unwrap_or_else(|| free.iter().copied().fold(0.0, f64::max));
        let sm = (0..sms).min_by(|&a, &b| free[a].max(ready).total_cmp(&free[b].max(ready))).unwrap_or(0);
        free[sm] = free[sm].max(ready) + cost(i);
        per_sm[sm].push(*i);
        signals.push(i.signal, free[sm]);
        signals.push(i.signal2, free[sm]);
    }
    (per_sm, free.iter().copied().fold(0.0, f64::max))
}

/// Deals `order` (a topological order, as for [`list_schedule`]) to `sms` (at least one) in-order
/// lists by critical-path list scheduling: whenever an SM is free (the earliest first), it takes,
/// of the instructions whose dependencies are estimated done by then, the one with the longest
/// estimated path from its start to the step's end (its rank: its cost, then `latency` and the
/// rank of the longest waiter on what it signals), the earliest in `order` among equals; when none
/// is, the one estimated ready first. So the input gradients, the step's critical path, go before
/// the weight tiles beside them, which fill the SMs the critical path leaves idle. Returns the
/// lists, the instructions in the order of their estimated starts (a topological order of which
/// every list is a subsequence), and the estimated step time (a dependency's signal reaching its
/// waiter `latency` after the producer's end).
///
/// Deadlock-free whatever the real times, as [`list_schedule`]: a waiter's estimated start is
/// after its producers' estimated ends, so in the order of estimated starts every producer comes
/// before its waiters, and every SM's list runs in that order.
fn priority_schedule(
    order: &[Instruction],
    sms: usize,
    counters: usize,
    cost: impl Fn(&Instruction) -> f64,
    latency: f64,
) -> (Vec<Vec<Instruction>>, Vec<Instruction>, f64) {
    use std::cmp::{Ordering, Reverse};
    use std::collections::BinaryHeap;
    let n = order.len();
    let waits = |i: &Instruction| {
        [(i.wait, i.wait_value), (i.wait2, i.wait2_value)].into_iter().filter(|&(c, v)| c != NO_COUNTER && v > 0)
    };
    let signals = |i: &Instruction| [i.signal, i.signal2].into_iter().filter(|&c| c != NO_COUNTER);
    // ranks, from the back: every waiter of a counter comes after all its signallers
    let (mut rank, mut longest_waiter) = (vec![0.0f64; n], vec![f64::NEG_INFINITY; counters]);
    for k in (0..n).rev() {
        let tail = signals(&order[k]).map(|c| latency + longest_waiter[c as usize]).fold(0.0, f64::max);
        rank[k] = cost(&order[k]) + tail;
        for (c, _) in waits(&order[k]) {
            longest_waiter[c as usize] = longest_waiter[c as usize].max(rank[k]);
        }
    }
    // an f64 with a total order, for the heaps
    struct Key(f64);
    impl PartialEq for Key {
        fn eq(&self, other: &Self) -> bool {
            self.cmp(other) == Ordering::Equal
        }
    }
    impl Eq for Key {}
    impl PartialOrd for Key {
        fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for Key {
        fn cmp(&self, other: &Self) -> Ordering {
            self.0.total_cmp(&other.0)
        }
    }
    // waits not yet known to be met, per instruction; waiters by counter, in the order of the
    // signal count they wait for
    let mut unmet: Vec<u8> = order.iter().map(|i| waits(i).count() as u8).collect();
    let mut waiters: Vec<Vec<(u32, usize)>> = vec![Vec::new(); counters];
    for (k, i) in order.iter().enumerate() {
        for (c, v) in waits(i) {
            waiters[c as usize].push((v, k));
        }
    }
    for w in &mut waiters {
        w.sort_unstable();
    }
    let (mut next_waiter, mut times) = (vec![0usize; counters], SignalTimes::new(counters));
    // instructions with every wait known: by estimated ready time (not yet reached), and those
    // ready by the current time, by rank
    let mut pending: BinaryHeap<Reverse<(Key, Reverse<Key>, usize)>> = BinaryHeap::new();
    let mut ready: BinaryHeap<(Key, Reverse<usize>)> = BinaryHeap::new();
    let ready_at = |times: &SignalTimes, i: &Instruction| {
        times.ready(i).map_or(0.0, |t| if waits(i).next().is_some() { t + latency } else { t })
    };
    for (k, i) in order.iter().enumerate() {
        if unmet[k] == 0 {
            pending.push(Reverse((Key(ready_at(&times, i)), Reverse(Key(rank[k])), k)));
        }
    }
    let mut free: BinaryHeap<Reverse<(Key, usize)>> = (0..sms).map(|m| Reverse((Key(0.0), m))).collect();
    let mut per_sm = vec![Vec::new(); sms];
    let mut started: Vec<(f64, usize)> = Vec::with_capacity(n);
    let mut end = 0.0f64;
    for _ in 0..n {
        let Some(Reverse((Key(t), sm))) = free.pop() else { break };
        while let Some(Reverse((Key(r), _, k))) = pending.peek() {
            let (r, k) = (*r, *k);
            if r > t {
                break;
            }
            pending.pop();
            ready.push((Key(rank[k]), Reverse(k)));
        }
        let (k, start) = match ready.pop() {
            Some((_, Reverse(k))) => (k, t),
            None => match pending.pop() {
                Some(Reverse((Key(r), _, k))) => (k, r.max(t)),
                // (a topological order always has an instruction whose waits are known)
                None => break,
            },
        };
        let i = &order[k];
        let done = start + cost(i);
        end = end.max(done);
        free.push(Reverse((Key(done), sm)));
        per_sm[sm].push(*i);
        started.push((start, k));
        for c in signals(i) {
            times.push(c, done);
            let c = c as usize;
            let placed = times.0[c].len() as u32;
            while let Some(&(v, w)) = waiters[c].get(next_waiter[c]) {
                if v > placed {
                    break;
                }
                next_waiter[c] += 1;
                unmet[w] -= 1;
                if unmet[w] == 0 {
                    pending.push(Reverse((Key(ready_at(&times, &order[w])), Reverse(Key(rank[w])), w)));
                }
            }
        }
    }
    // (stable: equal starts keep the order they were placed in)
    started.sort_by(|a, b| a.0.total_cmp(&b.0));
    (per_sm, started.into_iter().map(|(_, k)| order[k]).collect(), end)
}

/// The estimated step time of in-order lists `per_sm` with instruction times `cost`: each SM runs
/// its list in order, an instruction starting when its SM is free and its waits are met (by the
/// estimated finish times of the signals). Infinite if the lists deadlock.
fn estimated_time(per_sm: &[Vec<Instruction>], counters: usize, cost: impl Fn(&Instruction) -> f64) -> f64 {
    let mut signals = SignalTimes::new(counters);
    let (mut pc, mut free) = (vec![0usize; per_sm.len()], vec![0.0f64; per_sm.len()]);
    loop {
        let mut progress = false;
        for (sm, list) in per_sm.iter().enumerate() {
            while let Some((i, ready)) = list.get(pc[sm]).and_then(|i| Some((i, signals.ready(i)?))) {
                free[sm] = free[sm].max(ready) + cost(i);
                signals.push(i.signal, free[sm]);
                signals.push(i.signal2, free[sm]);
                pc[sm] += 1;
                progress = true;
            }
        }
        if !progress {
            let done = pc.iter().zip(per_sm).all(|(p, l)| *p == l.len());
            return if done { free.iter().copied().fold(0.0, f64::max) } else { f64::INFINITY };
        }
    }
}

#[cfg(test)]
mod schedule_tests {
    use super::*;

    /// Every list of `s` is a subsequence of its order, and in the order every instruction comes
    /// after all the signals it waits for: the lists cannot deadlock, whatever the real times.
    fn assert_deadlock_free(s: &Schedule, what: &str) {
        let mut at = std::collections::HashMap::new();
        for (k, i) in s.order.iter().enumerate() {
            assert!(at.insert(*i, k).is_none(), "{what}: {i:?} twice in the order");
        }
        for list in &s.per_sm {
            let places: Vec<usize> = list.iter().map(|i| at[i]).collect();
            assert!(places.windows(2).all(|w| w[0] < w[1]), "{what}: a list out of the order");
        }
        assert_eq!(s.per_sm.iter().map(Vec::len).sum::<usize>(), s.order.len(), "{what}");
        let mut signalled = vec![0u32; s.counters];
        for i in &s.order {
            for (c, v) in [(i.wait, i.wait_value), (i.wait2, i.wait2_value)] {
                assert!(c == NO_COUNTER || signalled[c as usize] >= v, "{what}: {i:?} waits for a later signal");
            }
            for c in [i.signal, i.signal2].into_iter().filter(|&c| c != NO_COUNTER) {
                signalled[c as usize] += 1;
            }
        }
    }

    /// On the three benchmark models and both tensor-core paths: the schedule `build` takes cannot
    /// deadlock; the list schedule's and the critical-path schedule's estimates are what their
    /// lists give when run in order (the latter's without signal latency); and `build` deals
    /// each model as measured fastest: by critical path where that is estimated no slower than
    /// the list schedule and round-robin (the small and medium models tie; the large bf16 model
    /// is 6308 against 6372, and measured 0.467-0.472 ms a step against 0.471-0.477, H200 run
    /// 192), else as before (the large tf32 model, 7568 against the list's 7540).
    #[test]
    fn schedules_hold_their_estimates_and_the_fastest_is_chosen() {
        for (batch, width, layers) in [(64usize, 256usize, 4usize), (256, 1024, 4), (4096, 1024, 8)] {
            for path in [DataPath::Tf32, DataPath::Bf16] {
                let what = format!("{batch}x{width}x{layers} {path:?}");
                let shape = MlpShape { batch, dims: vec![width; layers + 1] };
                let s = build(&shape, 132, path).unwrap();
                assert_deadlock_free(&s, &what);
                let cost = |i: &Instruction| estimated_cost(&shape, s.tile, i);
                let (lists, estimate) = list_schedule(&s.order, 132, s.counters, cost);
                let listed = estimated_time(&lists, s.counters, cost);
                assert!((listed - estimate).abs() < 1e-6 * estimate, "{what}: {listed} vs {estimate}");
                let (ranked, order, estimate) = priority_schedule(&s.order, 132, s.counters, cost, 0.0);
                let by_rank = estimated_time(&ranked, s.counters, cost);
                assert!((by_rank - estimate).abs() < 1e-6 * estimate, "{what}: {by_rank} vs {estimate}");
                let dealt = Schedule { per_sm: ranked, order, ..s.clone() };
                assert_deadlock_free(&dealt, &what);
                let want = if batch == 4096 && path == DataPath::Tf32 { Dealing::List } else { Dealing::CriticalPath };
                assert_eq!(s.dealing, want, "{what}");
            }
        }
    }

    /// Odd shapes, few SMs, every tile and update placement: whichever way `build` deals them,
    /// the lists cannot deadlock.
    #[test]
    fn every_dealing_is_deadlock_free() {
        let mut seen = std::collections::HashSet::new();
        for (batch, dims) in [
            (1usize, vec![1usize, 1]),
            (130, vec![64, 65, 1]),
            (45, vec![33, 70, 40, 7]),
            (700, vec![300, 129, 257, 64, 10]),
        ] {
            for sms in [1usize, 3, 7, 132] {
                for tile in SCHEDULE_TILES {
                    for updates in [Updates::Fused, Updates::Separate] {
                        for reads in [WeightReads::InPlace, WeightReads::StepStartCopy] {
                            let shape = MlpShape { batch, dims: dims.clone() };
                            let s = build_with_tile(&shape, sms, tile, updates, reads).unwrap();
                            assert_deadlock_free(
                                &s,
                                &format!("{batch} {dims:?} {sms} SMs tile {tile} {updates:?} {reads:?}"),
                            );
                            seen.insert(format!("{:?}", s.dealing));
                        }
                    }
                }
            }
        }
        assert_eq!(seen.len(), 3, "every dealing was exercised: {seen:?}");
    }

    /// Lists that wait on a counter nobody signals are estimated as never finishing.
    #[test]
    fn a_stranded_wait_is_an_infinite_estimate() {
        let shape = MlpShape { batch: 64, dims: vec![8, 8, 4] };
        let mut s = build(&shape, 3, DataPath::CudaCores).unwrap();
        let cost = |i: &Instruction| estimated_cost(&shape, s.tile, i);
        assert!(estimated_time(&s.per_sm, s.counters, cost).is_finite());
        let victim = s.per_sm[1].iter_mut().find(|i| i.wait != NO_COUNTER).unwrap();
        victim.wait_value += 1;
        assert_eq!(estimated_time(&s.per_sm, s.counters, cost), f64::INFINITY);
    }
}

/// Parameters and buffers of one step, row-major f32.
#[derive(Clone, Debug)]
pub struct StepState {
    /// `W[l]`, `dims[l+1] x dims[l]`.
    pub weights: Vec<Vec<f32>>,
    /// Momentum buffers (same shapes), used when momentum is non-zero.
    pub velocity: Vec<Vec<f32>>,
    act: Vec<Vec<f32>>,
    grad: Vec<Vec<f32>>,
    dw: Vec<Vec<f32>>,
    /// The path whose operand rounding the products use ([`StepState::with_operands`]; the
    /// CUDA cores' by default: none).
    rounding: DataPath,
}

impl StepState {
    /// Buffers for `shape` with the given weights.
    pub fn new(shape: &MlpShape, weights: Vec<Vec<f32>>) -> Result<StepState> {
        for (l, w) in weights.iter().enumerate() {
            if l >= shape.layers() || w.len() != shape.dims[l] * shape.dims[l + 1] {
                return Err(Error::shape(
                    "megakernel",
                    format!("weight {l} has {} values for dims {:?}", w.len(), shape.dims),
                ));
            }
        }
        if weights.len() != shape.layers() {
            return Err(Error::shape("megakernel", format!("{} weights for {} layers", weights.len(), shape.layers())));
        }
        let b = shape.batch;
        Ok(StepState {
            velocity: weights.iter().map(|w| vec![0.0; w.len()]).collect(),
            dw: weights.iter().map(|w| vec![0.0; w.len()]).collect(),
            act: shape.dims.iter().map(|&d| vec![0.0; b * d]).collect(),
            grad: shape.dims.iter().map(|&d| vec![0.0; b * d]).collect(),
            weights,
            rounding: DataPath::CudaCores,
        })
    }

    /// The state with every operand of the products (the batch, the activations, their
    /// gradients, the weights) rounded as `path` rounds it ([`DataPath::operand`]) where a product
    /// reads it, so that [`interpret`] multiplies what that path's kernel multiplies and only
    /// the order of the f32 sums differs. The weights, the outputs and everything else stay f32.
    /// Without it the interpreter multiplies f32 values (the CUDA-core kernel's arithmetic).
    pub fn with_operands(mut self, path: DataPath) -> StepState {
        self.rounding = path;
        self
    }
}

/// The step's inputs and hyper-parameters.
pub struct StepInputs<'a> {
    /// `batch x dims[0]`.
    pub x: &'a [f32],
    /// Regression targets (`batch x dims[L]`) for MSE.
    pub y: &'a [f32],
    /// Class per row for cross-entropy.
    pub classes: &'a [usize],
    /// The loss.
    pub loss: Loss,
    /// Learning rate.
    pub lr: f32,
    /// Momentum (0: plain SGD).
    pub momentum: f32,
}

fn tile_range(t: u32, n: usize, tile: u32) -> std::ops::Range<usize> {
    let lo = t as usize * tile as usize;
    lo..(lo + tile as usize).min(n)
}

/// The sum of `values` in the device's order: lane `k % 32` adds its elements in ascending order,
/// then the butterfly of `warp::reduce_sum_f32` (offsets 16, 8, 4, 2, 1) combines the lanes.
fn warp_order_sum(values: impl Iterator<Item = f32>) -> f32 {
    let mut p = [0.0f32; 32];
    for (k, v) in values.enumerate() {
        p[k % 32] += v;
    }
    for off in [16, 8, 4, 2, 1] {
        let q = p;
        for (l, v) in p.iter_mut().enumerate() {
            *v = q[l] + q[l ^ off];
        }
    }
    p[0]
}

/// Executes one instruction on the CPU (the reference semantics of each opcode, in the device's
/// arithmetic: the same FMA chains, `kiln_gpu::math::exp` and the same summation order, so that the
/// device's results can be compared bit for bit).
/// Input gradients read the weights from `step_start` where given (see [`WeightReads`]), else
/// from `st`.
fn execute(s: &Schedule, st: &mut StepState, step_start: Option<&[Vec<f32>]>, inp: &StepInputs<'_>, i: &Instruction) {
    let d = &s.shape.dims;
    let b = s.shape.batch;
    let l = i.layer as usize;
    let layers = s.shape.layers();
    // Operand rounding ([`StepState::with_operands`]), as the kernel does it: activations and
    // gradients are stored rounded (the batch was rounded by `interpret`), and the weights a
    // product reads are rounded here, the instruction's rows or columns of them (read live, so
    // that an update running too early still shows).
    let rounding = st.rounding;
    let op = move |v: f32| rounding.operand(v);
    let weight_tile = |w: &[f32], rows: std::ops::Range<usize>, cols: std::ops::Range<usize>, din: usize| {
        rounding.rounds().then(|| {
            rows.flat_map(|o| cols.clone().map(move |k| rounding.operand(w[o * din + k]))).collect::<Vec<f32>>()
        })
    };
    match i.opcode {
        opcode::LINEAR_FWD => {
            let (din, dout) = (d[l], d[l + 1]);
            let outs = tile_range(i.tile_col, dout, s.tile);
            // the tile's weight rows, rounded: row `o - outs.start`
            let w = weight_tile(&st.weights[l], outs.clone(), 0..din, din);
            for r in tile_range(i.tile_row, b, s.tile) {
                for o in outs.clone() {
                    let mut acc = 0.0f32;
                    for k in 0..din {
                        let a = if l == 0 { inp.x[r * din + k] } else { st.act[l][r * din + k] };
                        let wv = w.as_ref().map_or(st.weights[l][o * din + k], |w| w[(o - outs.start) * din + k]);
                        acc = a.mul_add(wv, acc);
                    }
                    st.act[l + 1][r * dout + o] = if l + 1 < layers { op(acc.max(0.0)) } else { acc };
                }
            }
        }
        opcode::LOSS_GRAD => {
            let n = d[layers];
            for r in tile_range(i.tile_row, b, s.tile) {
                let row = &st.act[layers][r * n..(r + 1) * n];
                let (m, z) = match inp.loss {
                    Loss::CrossEntropy => {
                        let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                        (m, warp_order_sum(row.iter().map(|v| math::exp(v - m))))
                    }
                    Loss::Mse => (0.0, 1.0),
                };
                for o in tile_range(i.tile_col, n, s.tile) {
                    let v = st.act[layers][r * n + o];
                    st.grad[layers][r * n + o] = op(match inp.loss {
                        Loss::Mse => 2.0 * (v - inp.y[r * n + o]) / (b * n) as f32,
                        Loss::CrossEntropy => {
                            (math::exp(v - m) / z - if inp.classes[r] == o { 1.0 } else { 0.0 }) / b as f32
                        }
                    });
                }
            }
        }
        opcode::LINEAR_BWD_WEIGHT => {
            let (din, dout) = (d[l], d[l + 1]);
            for o in tile_range(i.tile_row, dout, s.tile) {
                for k in tile_range(i.tile_col, din, s.tile) {
                    let mut acc = 0.0f32;
                    for r in 0..b {
                        let a = if l == 0 { inp.x[r * din + k] } else { st.act[l][r * din + k] };
                        acc = st.grad[l + 1][r * dout + o].mul_add(a, acc);
                    }
                    st.dw[l][o * din + k] = acc;
                }
            }
        }
        opcode::LINEAR_BWD_INPUT => {
            let (din, dout) = (d[l], d[l + 1]);
            let ins = tile_range(i.tile_col, din, s.tile);
            // the tile's weight columns, rounded: element (o, k) at `o * ins.len() + k - ins.start`
            let weights = step_start.map_or(&st.weights[l], |w| &w[l]);
            let w = weight_tile(weights, 0..dout, ins.clone(), din);
            for r in tile_range(i.tile_row, b, s.tile) {
                for k in ins.clone() {
                    let mut acc = 0.0f32;
                    for o in 0..dout {
                        let wv = w.as_ref().map_or(weights[o * din + k], |w| w[o * ins.len() + k - ins.start]);
                        acc = st.grad[l + 1][r * dout + o].mul_add(wv, acc);
                    }
                    // relu'(pre) from the post-activation: the hidden act[l] is relu(pre)
                    st.grad[l][r * din + k] = if st.act[l][r * din + k] > 0.0 { op(acc) } else { 0.0 };
                }
            }
        }
        opcode::LINEAR_BWD_WEIGHT_SGD => {
            // the weight gradient of the tile, then its update: what the device computes in one
            // instruction, in the same arithmetic
            for op in [opcode::LINEAR_BWD_WEIGHT, opcode::SGD_UPDATE] {
                execute(s, st, step_start, inp, &Instruction { opcode: op, ..*i });
            }
        }
        opcode::SGD_UPDATE => {
            let din = d[l];
            for o in tile_range(i.tile_row, d[l + 1], s.tile) {
                for k in tile_range(i.tile_col, din, s.tile) {
                    let j = o * din + k;
                    let g = st.dw[l][j];
                    let step = if inp.momentum != 0.0 {
                        st.velocity[l][j] = inp.momentum * st.velocity[l][j] + g;
                        st.velocity[l][j]
                    } else {
                        g
                    };
                    st.weights[l][j] -= inp.lr * step;
                }
            }
        }
        other => unreachable!("schedule built with unknown opcode {other}"),
    }
}

/// Runs a schedule on the CPU: at each step one SM whose next instruction's waits are met (chosen
/// with `seed`) executes it and signals its counters. Returns an error naming the stuck
/// instructions if no SM can proceed before all are done (a deadlock the device would hang on).
pub fn interpret(s: &Schedule, st: &mut StepState, inp: &StepInputs<'_>, seed: u64) -> Result<()> {
    // the batch as the products read it, when operands are rounded
    let x_rounded: Vec<f32>;
    let rounded_inp;
    let inp = match st.rounding.rounds() {
        true => {
            x_rounded = inp.x.iter().map(|&v| st.rounding.operand(v)).collect();
            rounded_inp = StepInputs { x: &x_rounded, ..*inp };
            &rounded_inp
        }
        false => inp,
    };
    // the weights the input gradients read: on a schedule without write-after-read guards, the
    // step's first (the device reads a copy the updates do not write); else the live ones, so
    // that an update running before an input gradient that reads its weights still shows
    let step_start = (s.weight_reads == WeightReads::StepStartCopy).then(|| st.weights.clone());
    let mut counters = vec![0u32; s.counters];
    let mut pc = vec![0usize; s.per_sm.len()];
    let mut rng = StdRng::seed_from_u64(seed);
    let ready = |i: &Instruction, c: &[u32]| {
        (i.wait == NO_COUNTER || c[i.wait as usize] >= i.wait_value)
            && (i.wait2 == NO_COUNTER || c[i.wait2 as usize] >= i.wait2_value)
    };
    loop {
        let runnable: Vec<usize> = (0..s.per_sm.len())
            .filter(|&m| pc[m] < s.per_sm[m].len() && ready(&s.per_sm[m][pc[m]], &counters))
            .collect();
        if runnable.is_empty() {
            if (0..s.per_sm.len()).all(|m| pc[m] == s.per_sm[m].len()) {
                return Ok(());
            }
            let stuck: Vec<String> = (0..s.per_sm.len())
                .filter(|&m| pc[m] < s.per_sm[m].len())
                .map(|m| {
                    let i = &s.per_sm[m][pc[m]];
                    format!(
                        "SM {m} instruction {} (opcode {} layer {} tile {},{}) waits counter {} >= {} and {} >= {}",
                        pc[m], i.opcode, i.layer, i.tile_row, i.tile_col, i.wait, i.wait_value, i.wait2, i.wait2_value
                    )
                })
                .collect();
            return Err(Error::Unsupported {
                op: "megakernel schedule",
                what: format!("a deadlock: {}", stuck.join("; ")),
            });
        }
        let m = runnable[rng.random_range(0..runnable.len())];
        let i = s.per_sm[m][pc[m]];
        execute(s, st, step_start.as_deref(), inp, &i);
        for c in [i.signal, i.signal2] {
            if c != NO_COUNTER {
                counters[c as usize] += 1;
            }
        }
        pc[m] += 1;
    }
}

/// Where [`GpuStep::set_give_up`]'s planted warp gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GiveUp {
    /// The first page of each page walk, without waiting for it, while the rest of its page
    /// group sees the page arrive.
    Pages,
    /// Each meeting that publishes an instruction, after arriving at it: the other warps pass
    /// the meeting and go on to the next instruction without it.
    Publish,
}

/// Whether `dev` runs the tensor-core step kernels ([`DataPath::Tf32`], [`DataPath::Tf32x3`],
/// [`DataPath::Bf16`]): they use TMA and are built for sm_90a only, all five
/// (`kiln_gpu::kernels::megakernel_tc`).
pub fn tensor_core_step_supported(dev: &crate::cuda::Device) -> bool {
    use kiln_gpu::kernels::megakernel_tc::{
        MegakernelStepBf16T64, MegakernelStepTf32T32, MegakernelStepTf32T64, MegakernelStepTf32x3T32,
        MegakernelStepTf32x3T64,
    };
    dev.supports::<MegakernelStepTf32T32>()
        && dev.supports::<MegakernelStepTf32x3T32>()
        && dev.supports::<MegakernelStepTf32T64>()
        && dev.supports::<MegakernelStepTf32x3T64>()
        && dev.supports::<MegakernelStepBf16T64>()
}

/// A device buffer of product operands as a step kernel reads them: f32 values (tf32 ones on
/// [`DataPath::Tf32`]), or on [`DataPath::Bf16`] bf16 ones at the same element indices. The
/// host passes and reads f32 either way (values already rounded as [`DataPath::operand`] does,
/// so that the narrowing is exact).
enum OperandBuffer {
    F32(crate::cuda::DeviceBuffer<f32>),
    Bf16(crate::cuda::DeviceBuffer<half::bf16>),
}

impl OperandBuffer {
    /// `n` zeros of `path`'s operand format.
    fn zeros(dev: &crate::cuda::Device, path: DataPath, n: usize) -> Result<OperandBuffer> {
        Ok(match path {
            DataPath::Bf16 => OperandBuffer::Bf16(dev.zeros::<half::bf16>(n)?),
            _ => OperandBuffer::F32(dev.zeros::<f32>(n)?),
        })
    }

    /// `v` in `path`'s operand format.
    fn upload(dev: &crate::cuda::Device, path: DataPath, v: &[f32]) -> Result<OperandBuffer> {
        Ok(match path {
            DataPath::Bf16 => OperandBuffer::Bf16(dev.upload(&to_bf16(v))?),
            _ => OperandBuffer::F32(dev.upload(v)?),
        })
    }

    /// Overwrites the first `v.len()` elements.
    fn write_prefix(&mut self, dev: &crate::cuda::Device, v: &[f32]) -> Result<()> {
        match self {
            OperandBuffer::Bf16(b) => dev.write_prefix(b, &to_bf16(v)),
            OperandBuffer::F32(b) => dev.write_prefix(b, v),
        }
    }

    /// Every element, widened to f32.
    fn download(&self, dev: &crate::cuda::Device) -> Result<Vec<f32>> {
        Ok(match self {
            OperandBuffer::Bf16(b) => dev.download(b)?.into_iter().map(half::bf16::to_f32).collect(),
            OperandBuffer::F32(b) => dev.download(b)?,
        })
    }

    /// The device address of element `i`.
    fn addr_of(&self, i: u32) -> u64 {
        match self {
            OperandBuffer::Bf16(b) => b.addr() + 2 * i as u64,
            OperandBuffer::F32(b) => b.addr() + 4 * i as u64,
        }
    }

    /// The kernel parameter (typed f32; the bf16 kernel stores bf16 through it).
    fn ptr_mut(&mut self) -> kiln_gpu::DevicePtrMut<f32> {
        kiln_gpu::DevicePtrMut::from_addr(self.addr_of(0))
    }
}

/// `v` as bf16 (rounded to nearest, ties to even: exact for values already rounded).
fn to_bf16(v: &[f32]) -> Vec<half::bf16> {
    v.iter().map(|&x| half::bf16::from_f32(x)).collect()
}

/// The schedule and buffers of one model on the GPU: [`GpuStep::step`] runs one training step as a
/// single launch of the megakernel of its [`DataPath`].
///
/// Device layout: every matrix (`act[l]`, `grad[l]`: `batch x dims[l]`; `W[l]`, its gradient and
/// momentum: `dims[l+1] x dims[l]`) is row-major with a row pitch of
/// [`pitch`]`(columns)` (a multiple of 8 elements, so that every row starts 16-byte aligned, as TMA
/// needs, in f32 and in bf16 alike); the padding is never read or written. The host API takes and returns unpadded rows.
/// The tensor-core paths also keep the K-major copies their products read
/// (`kiln_gpu::megakernel::map`): `act_t[l]` and `grad_t[l]` (`dims[l] x batch`), `w_t[l]`
/// (`dims[l] x dims[l+1]`) and, on [`DataPath::Tf32`] and [`DataPath::Bf16`], `w_op[l]` (the
/// weights rounded to the products' format); on [`DataPath::Bf16`] all of them bf16, with bf16
/// copies of `act` and `grad` besides.
pub struct GpuStep {
    dev: std::sync::Arc<crate::cuda::Device>,
    shape: MlpShape,
    path: DataPath,
    sms: u32,
    counters: usize,
    tile: u32,
    instructions: crate::cuda::DeviceBuffer<InstructionWords>,
    sm_offsets: crate::cuda::DeviceBuffer<u32>,
    counter_buf: crate::cuda::DeviceBuffer<u32>,
    dims: crate::cuda::DeviceBuffer<u32>,
    w_off: crate::cuda::DeviceBuffer<u32>,
    a_off: crate::cuda::DeviceBuffer<u32>,
    t_off: crate::cuda::DeviceBuffer<u32>,
    wt_off: crate::cuda::DeviceBuffer<u32>,
    weights: crate::cuda::DeviceBuffer<f32>,
    velocity: crate::cuda::DeviceBuffer<f32>,
    dw: crate::cuda::DeviceBuffer<f32>,
    act: crate::cuda::DeviceBuffer<f32>,
    grad: crate::cuda::DeviceBuffer<f32>,
    /// The tensor-core paths' K-major operand copies (one element each on the CUDA-core path;
    /// `w_op` also on 3xTF32, which multiplies `weights` itself).
    act_t: OperandBuffer,
    grad_t: OperandBuffer,
    /// The weights' copies, twice ([`WeightReads::StepStartCopy`]): a step's products read
    /// `[front]` (through `maps[front]`) and its updates write `[1 - front]`, the copy the next
    /// step reads, so no update waits for the input gradients that read the old weights.
    w_op: [OperandBuffer; 2],
    w_t: [OperandBuffer; 2],
    /// Which of the weights' copies the next step reads.
    front: usize,
    /// [`DataPath::Bf16`]: `act` and `grad` as bf16, what its forwards and input gradients read
    /// (one element each on the other paths).
    act_bf16: OperandBuffer,
    grad_bf16: OperandBuffer,
    y: crate::cuda::DeviceBuffer<f32>,
    classes: crate::cuda::DeviceBuffer<u32>,
    /// The tensor-core path's cross-entropy row-statistic partials (`kiln_gpu::megakernel::loss_partials`).
    row_stats: crate::cuda::DeviceBuffer<f32>,
    /// The tensor maps of the tensor-core path (`map::PER_LAYER` per layer), absent on the
    /// CUDA-core path: `[c]` reads the weights' copies `w_op[c]`, `w_t[c]`.
    maps: Option<[crate::cuda::DeviceTensorMap; 2]>,
    extra_free_arrivals: u32,
    give_up_warp: u32,
    give_up_at: u32,
    /// The step kernel launched last (for stall reports).
    kernel: &'static str,
    /// Every instruction with its SM, in the order of `instructions` (what a trace's rows are).
    listing: Vec<(u32, Instruction)>,
    /// Timestamps of the next steps, when tracing ([`GpuStep::set_trace`]).
    trace: Option<crate::cuda::DeviceBuffer<u64>>,
    steps_since_check: u32,
    /// How long a dependency wait may take before the step is abandoned (nanoseconds).
    pub wait_limit_ns: u32,
    /// Check for a stalled wait after every this many steps (1, the default: after each step, which
    /// waits for the step to finish; 0: only in [`GpuStep::check`] and [`GpuStep::weights`]). The
    /// abort flag stays set until a check reads it, so a stall is never missed, only reported later;
    /// steps launched after a stall stop at their first unmet wait.
    pub check_every: u32,
}

/// An [`Instruction`] as a device-copyable value (cudarc's `DeviceRepr` is implemented here, where
/// the orphan rule allows it; the layout is the instruction's own).
#[repr(transparent)]
#[derive(Clone, Copy)]
struct InstructionWords(Instruction);
// SAFETY: repr(transparent) over a repr(C) struct of u32.
unsafe impl cudarc::driver::DeviceRepr for InstructionWords {}

/// `rows` rows of `cols` values, each padded with zeros to [`pitch`]`(cols)`.
fn pad_rows(v: &[f32], cols: usize) -> Vec<f32> {
    let p = pitch(cols as u32) as usize;
    if p == cols {
        return v.to_vec();
    }
    let mut out = vec![0.0; v.len() / cols * p];
    for (dst, src) in out.chunks_mut(p).zip(v.chunks(cols)) {
        dst[..cols].copy_from_slice(src);
    }
    out
}

/// `rows x cols` values (unpadded rows) transposed into `cols` rows of `rows` values, each padded
/// with zeros to [`pitch`]`(rows)`.
fn transpose_padded(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let p = pitch(rows as u32) as usize;
    let mut out = vec![0.0; cols * p];
    for (r, row) in v.chunks(cols).enumerate() {
        for (c, &x) in row.iter().enumerate() {
            out[c * p + r] = x;
        }
    }
    out
}

/// The inverse of [`pad_rows`].
fn unpad_rows(v: &[f32], cols: usize) -> Vec<f32> {
    let p = pitch(cols as u32) as usize;
    v.chunks(p).flat_map(|r| r[..cols].iter().copied()).collect()
}

impl GpuStep {
    /// Uploads `schedule` and the initial weights (`W[l]`, `dims[l+1] x dims[l]`) for the kernel of
    /// `path` (the schedule's tile must be one of `path.tiles()`).
    pub fn new(
        dev: std::sync::Arc<crate::cuda::Device>,
        schedule: &Schedule,
        weights: &[Vec<f32>],
        path: DataPath,
    ) -> Result<GpuStep> {
        use kiln_gpu::megakernel::{RECORD_WORDS, RECORDS_PER_BLOCK};
        let shape = schedule.shape.clone();
        StepState::new(&shape, weights.to_vec())?;
        if !path.tiles().contains(&schedule.tile) {
            return Err(Error::Unsupported {
                op: "megakernel",
                what: format!(
                    "a schedule with tile {} for the {path:?} path, which takes tiles {:?}: build it with `build(.., {path:?})`",
                    schedule.tile,
                    path.tiles()
                ),
            });
        }
        if schedule.weight_reads == WeightReads::StepStartCopy && path.weight_reads() == WeightReads::InPlace {
            return Err(Error::Unsupported {
                op: "megakernel",
                what: format!(
                    "a schedule without write-after-read guards (WeightReads::StepStartCopy) for the {path:?} path, \
                     whose input gradients read the weights the updates overwrite: build it with `build(.., {path:?})` \
                     or WeightReads::InPlace"
                ),
            });
        }
        if path != DataPath::CudaCores && !tensor_core_step_supported(&dev) {
            return Err(Error::Unsupported {
                op: "megakernel",
                what: format!(
                    "the {path:?} path needs TMA (sm_90); this GPU is {:?}: use DataPath::CudaCores",
                    dev.compute_capability()
                ),
            });
        }
        if path != DataPath::CudaCores {
            use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as OPTIN;
            let need =
                kiln_gpu::kernels::megakernel_tc::tc_smem_bytes(shape.layers() as u32, path.code(), schedule.tile);
            let max_smem = dev.attribute(OPTIN)?.max(0) as u32;
            if need > max_smem {
                return Err(Error::Unsupported {
                    op: "megakernel",
                    what: format!(
                        "{} layers: the {path:?} kernel's shared memory (its page ring, a {}-byte table entry per layer and, bf16 at tile 128, a weight buffer) would be {need} bytes, over this GPU's {max_smem}: use fewer layers or DataPath::CudaCores",
                        shape.layers(),
                        4 * kiln_gpu::kernels::megakernel_tc::TABLE_COLUMNS
                    ),
                });
            }
        }
        let sms = schedule.per_sm.len();
        let max_sms = dev.sm_count()?;
        if sms > max_sms {
            return Err(Error::shape(
                "megakernel",
                format!("a schedule for {sms} SMs on a GPU with {max_sms}: every block must be resident"),
            ));
        }
        let mut flat = Vec::new();
        let mut offsets = vec![0u32];
        let mut listing = Vec::new();
        for (sm, list) in schedule.per_sm.iter().enumerate() {
            flat.extend(list.iter().map(|i| InstructionWords(*i)));
            listing.extend(list.iter().map(|i| (sm as u32, *i)));
            offsets.push(flat.len() as u32);
        }
        let d = &shape.dims;
        let p = |l: usize| pitch(d[l] as u32) as usize;
        let mut w_off = vec![];
        let mut total = 0usize;
        for l in 0..shape.layers() {
            w_off.push(total as u32);
            total += d[l + 1] * p(l);
        }
        let mut a_off = vec![];
        let mut atotal = 0usize;
        for l in 0..d.len() {
            a_off.push(atotal as u32);
            atotal += shape.batch * p(l);
        }
        // the tensor-core paths' K-major copies: act_t[l] / grad_t[l] (dims[l] rows of the batch),
        // w_t[l] (dims[l] rows of dims[l + 1])
        let (mut t_off, mut ttotal) = (vec![], 0usize);
        for &dim in d.iter() {
            t_off.push(ttotal as u32);
            ttotal += dim * pitch(shape.batch as u32) as usize;
        }
        let (mut wt_off, mut wttotal) = (vec![], 0usize);
        for (l, w) in d.windows(2).enumerate() {
            wt_off.push(wttotal as u32);
            wttotal += w[0] * p(l + 1);
        }
        // (the transposed copies exist on the tensor-core paths only, and not where the step
        // reads its operands in place)
        let tc = path != DataPath::CudaCores && !kiln_gpu::megakernel::reads_in_place(path.code(), schedule.tile);
        let sizes = [
            ("weights", total),
            ("activations", atotal),
            ("instructions", flat.len()),
            ("transposed activations", if tc { ttotal } else { 0 }),
            ("transposed weights", if tc { wttotal } else { 0 }),
        ];
        if let Some((what, n)) = sizes.iter().find(|(_, n)| *n > crate::cuda::gemm::MAX_OPERAND_ELEMENTS) {
            return Err(Error::Unsupported {
                op: "megakernel",
                what: format!(
                    "{n} {what} (padded): the kernel indexes in 32 bits (at most 2^31 - 1): use a smaller model"
                ),
            });
        }
        let flat_w: Vec<f32> = weights.iter().enumerate().flat_map(|(l, w)| pad_rows(w, d[l])).collect();
        // Each copy as the products read it: rounded to tf32 or bf16 on those paths.
        let operand = |v: f32| path.operand(v);
        let w_op: Vec<f32> = match path {
            DataPath::Tf32 | DataPath::Bf16 => flat_w.iter().map(|&v| operand(v)).collect(),
            DataPath::CudaCores | DataPath::Tf32x3 => vec![0.0],
        };
        let bf16 = path == DataPath::Bf16;
        let w_t: Vec<f32> = match tc {
            true => {
                (0..shape.layers()).flat_map(|l| transpose_padded(&weights[l], d[l + 1], d[l])).map(operand).collect()
            }
            false => vec![0.0],
        };
        let records = RECORD_WORDS as usize * RECORDS_PER_BLOCK as usize * sms;
        let mut step = GpuStep {
            sms: sms as u32,
            counters: schedule.counters,
            tile: schedule.tile,
            instructions: dev.upload(&flat)?,
            sm_offsets: dev.upload(&offsets)?,
            counter_buf: dev.zeros::<u32>(schedule.counters + 1 + records)?,
            y: dev.zeros::<f32>(shape.batch * d[shape.layers()])?,
            classes: dev.zeros::<u32>(shape.batch)?,
            row_stats: dev.zeros::<f32>(
                kiln_gpu::megakernel::row_stats_words(shape.batch as u32, d[shape.layers()] as u32, schedule.tile)
                    .max(1) as usize,
            )?,
            steps_since_check: 0,
            check_every: 1,
            dims: dev.upload(&d.iter().map(|&x| x as u32).collect::<Vec<_>>())?,
            w_off: dev.upload(&w_off)?,
            a_off: dev.upload(&a_off)?,
            t_off: dev.upload(&t_off)?,
            wt_off: dev.upload(&wt_off)?,
            velocity: dev.zeros::<f32>(total)?,
            dw: dev.zeros::<f32>(total)?,
            weights: dev.upload(&flat_w)?,
            act: dev.zeros::<f32>(atotal)?,
            // (the bf16 path keeps its gradients in `grad_bf16` alone)
            grad: dev.zeros::<f32>(if bf16 { 1 } else { atotal })?,
            act_t: OperandBuffer::zeros(&dev, path, if tc { ttotal } else { 1 })?,
            grad_t: OperandBuffer::zeros(&dev, path, if tc { ttotal } else { 1 })?,
            w_op: [OperandBuffer::upload(&dev, path, &w_op)?, OperandBuffer::upload(&dev, path, &w_op)?],
            w_t: [OperandBuffer::upload(&dev, path, &w_t)?, OperandBuffer::upload(&dev, path, &w_t)?],
            front: 0,
            act_bf16: OperandBuffer::zeros(&dev, path, if bf16 { atotal } else { 1 })?,
            grad_bf16: OperandBuffer::zeros(&dev, path, if bf16 { atotal } else { 1 })?,
            maps: None,
            extra_free_arrivals: 0,
            give_up_warp: 0,
            give_up_at: 0,
            kernel: "",
            listing,
            trace: None,
            wait_limit_ns: 1_000_000_000,
            path,
            shape,
            dev,
        };
        if path != DataPath::CudaCores {
            step.maps = Some([
                step.encode_maps(&w_off, &a_off, &t_off, &wt_off, 0)?,
                step.encode_maps(&w_off, &a_off, &t_off, &wt_off, 1)?,
            ]);
        }
        Ok(step)
    }

    /// The tensor maps of the tensor-core path, in `kiln_gpu::megakernel::map` order per layer:
    /// K-major, a box of `tile` rows by one page's columns (32 f32, or 64 bf16 on
    /// [`DataPath::Bf16`], whose maps all describe bf16 copies). Where the step reads its operands
    /// in place (`kiln_gpu::megakernel::reads_in_place`: bf16 at tile 128), the maps of the
    /// transposed operands describe the operands themselves (`act_bf16`, `grad_bf16`, `w_op`),
    /// MN-major: a box of one page's K rows by `MN_BOX` columns. The weights' maps describe copy
    /// `copy` (`w_op[copy]`, `w_t[copy]`); `LOGITS`, the f32 logits, boxes of `tile` rows by
    /// `F32_BOX_COLS` f32.
    fn encode_maps(
        &self,
        w_off: &[u32],
        a_off: &[u32],
        t_off: &[u32],
        wt_off: &[u32],
        copy: usize,
    ) -> Result<crate::cuda::DeviceTensorMap> {
        use crate::cuda::{TensorMapSpec, TmaDtype};
        use kiln_gpu::megakernel::map;
        use kiln_gpu::swizzle::Swizzle;
        let (d, b, tile) = (&self.shape.dims, self.shape.batch, self.tile);
        let bf16 = self.path == DataPath::Bf16;
        let page_k = kiln_gpu::megakernel::page_k(self.path.code());
        let spec = |rows: usize, cols: usize| TensorMapSpec {
            dtype: if bf16 { TmaDtype::Bf16 } else { TmaDtype::F32 },
            rows: rows as u64,
            cols: cols as u64,
            row_pitch: pitch(cols as u32) as u64,
            box_rows: tile,
            box_cols: page_k,
            swizzle: Swizzle::B128,
        };
        // an operand read in place, MN-major: rows are K
        let mn_spec = |rows: usize, cols: usize| TensorMapSpec {
            box_rows: page_k,
            box_cols: kiln_gpu::megakernel::MN_BOX,
            ..spec(rows, cols)
        };
        let in_place = self.reads_in_place();
        let f32_at = |buf: &crate::cuda::DeviceBuffer<f32>, off: u32| buf.addr() + 4 * off as u64;
        // the forward's A and the input gradient's A: bf16 copies on the bf16 path, else the f32
        // arrays themselves (stored rounded on the tf32 path)
        let act = |off| if bf16 { self.act_bf16.addr_of(off) } else { f32_at(&self.act, off) };
        let grad = |off| if bf16 { self.grad_bf16.addr_of(off) } else { f32_at(&self.grad, off) };
        let mut maps = Vec::new();
        for l in 0..self.shape.layers() {
            // the forward's weights: the rounded copy on tf32 and bf16, else the weights themselves
            let w = match self.path {
                DataPath::Tf32 | DataPath::Bf16 => self.w_op[copy].addr_of(w_off[l]),
                DataPath::CudaCores | DataPath::Tf32x3 => f32_at(&self.weights, w_off[l]),
            };
            let mut layer = [(0u64, spec(1, 1)); map::PER_LAYER as usize];
            layer[map::ACT as usize] = (act(a_off[l]), spec(b, d[l]));
            layer[map::GRAD as usize] = (grad(a_off[l + 1]), spec(b, d[l + 1]));
            layer[map::W as usize] = (w, spec(d[l + 1], d[l]));
            if in_place {
                layer[map::ACT_T as usize] = (act(a_off[l]), mn_spec(b, d[l]));
                layer[map::GRAD_T as usize] = (grad(a_off[l + 1]), mn_spec(b, d[l + 1]));
                layer[map::W_T as usize] = (w, mn_spec(d[l + 1], d[l]));
            } else {
                layer[map::ACT_T as usize] = (self.act_t.addr_of(t_off[l]), spec(d[l], b));
                layer[map::GRAD_T as usize] = (self.grad_t.addr_of(t_off[l + 1]), spec(d[l + 1], b));
                layer[map::W_T as usize] = (self.w_t[copy].addr_of(wt_off[l]), spec(d[l], d[l + 1]));
            }
            // f32 in boxes of `F32_BOX_COLS`: the logits (read where `box_slot_uses` stages them;
            // the same in every layer's and both copies' maps) and the weights themselves (where
            // a fused update stages its tile: `kiln_gpu::megakernel::staged`)
            let boxes = |rows: usize, cols: usize| TensorMapSpec {
                dtype: TmaDtype::F32,
                box_cols: kiln_gpu::megakernel::F32_BOX_COLS,
                ..spec(rows, cols)
            };
            let last = self.shape.layers();
            layer[map::LOGITS as usize] = (f32_at(&self.act, a_off[last]), boxes(b, d[last]));
            layer[map::WEIGHTS as usize] = (f32_at(&self.weights, w_off[l]), boxes(d[l + 1], d[l]));
            // the copy the updates write; elsewhere unread (the CUDA-core and 3xTF32 paths'
            // products read `weights`, which the updates write, so there it is the same array)
            let next = match self.path {
                DataPath::Tf32 | DataPath::Bf16 => self.w_op[1 - copy].addr_of(w_off[l]),
                DataPath::CudaCores | DataPath::Tf32x3 => f32_at(&self.weights, w_off[l]),
            };
            layer[map::W_NEXT as usize] = (next, spec(d[l + 1], d[l]));
            maps.extend(layer);
        }
        self.dev.tensor_maps(&maps)
    }

    /// The step's data path.
    pub fn path(&self) -> DataPath {
        self.path
    }

    /// Whether the step reads every product operand in place and keeps no transposed copies
    /// (`kiln_gpu::megakernel::reads_in_place`: [`DataPath::Bf16`] at tile 128).
    pub fn reads_in_place(&self) -> bool {
        kiln_gpu::megakernel::reads_in_place(self.path.code(), self.tile)
    }

    /// The output tile edge of the schedule.
    pub fn tile(&self) -> u32 {
        self.tile
    }

    /// Test hook for the hang-proof check: every page's free barrier of the tensor-core kernel
    /// expects `n` more arrivals than the consumer warps make, so the loader's first reuse of a page
    /// waits forever; the step must then report [`Error::Stalled`] with the page and parity. 0
    /// (the default) for real training. No effect on the CUDA-core path (it has no pages).
    pub fn set_extra_free_arrivals(&mut self, n: u32) {
        self.extra_free_arrivals = n;
    }

    /// Test hook for the give-up paths: consumer warp `w` of block 0 of the tensor-core kernel gives
    /// up where `at` says (as if its limit had passed) while the other warps go on; the
    /// step must then report [`Error::Stalled`] without hanging (on the `wgmma` path the warp
    /// keeps issuing its group's products to the end of its list, so that the others never wait
    /// for it in one). `None` (the default) for real training. No effect on the CUDA-core path.
    pub fn set_give_up(&mut self, plant: Option<(u32, GiveUp)>) -> Result<()> {
        use kiln_gpu::megakernel::{CONSUMER_WARPS, give_up};
        let (warp, at) = match plant {
            None => (0, 0),
            Some((w, at)) if w < CONSUMER_WARPS => {
                (w + 1, if at == GiveUp::Pages { give_up::PAGES } else { give_up::PUBLISH })
            }
            Some((w, _)) => {
                return Err(Error::Unsupported {
                    op: "GpuStep::set_give_up",
                    what: format!("warp {w}: the consumer warps are 0..{CONSUMER_WARPS}; pick one of them"),
                });
            }
        };
        (self.give_up_warp, self.give_up_at) = (warp, at);
        Ok(())
    }

    /// One training step on the GPU: [`GpuStep::load_batch`], then [`GpuStep::run`]. After an
    /// [`Error::Stalled`] the weights may be partly updated (tiles whose waits were met ran): treat
    /// the model as poisoned and rebuild it.
    pub fn step(&mut self, inp: &StepInputs<'_>) -> Result<()> {
        self.load_batch(inp)?;
        self.run(inp.loss, inp.lr, inp.momentum)
    }

    /// Copies a batch (inputs, and the targets its loss needs) into the step's device buffers, where
    /// every later [`GpuStep::run`] reads it.
    pub fn load_batch(&mut self, inp: &StepInputs<'_>) -> Result<()> {
        let (b, d0, dl) = (self.shape.batch, self.shape.dims[0], *self.shape.dims.last().expect("layers"));
        if inp.x.len() != b * d0
            || (inp.loss == Loss::Mse && inp.y.len() != b * dl)
            || (inp.loss == Loss::CrossEntropy && inp.classes.len() != b)
        {
            return Err(Error::shape("megakernel step", format!("inputs for batch {b}, {d0} features, {dl} outputs")));
        }
        if let Some(c) = inp.classes.iter().find(|&&c| c >= dl) {
            return Err(Error::Index {
                op: "megakernel step",
                msg: format!("class {c} is out of range for {dl} outputs"),
            });
        }
        // The batch goes into layer 0's activations; the other layers are overwritten by the forward.
        // The tf32 and bf16 paths keep every stored product operand rounded (their page loops read
        // them without converting), so the batch is rounded here: the value its products would
        // use. The tensor-core paths' weight gradients read it transposed, from `act_t[0]`; the
        // bf16 path's forwards from its bf16 copy.
        let operand = |v: f32| self.path.operand(v);
        let x: Vec<f32> = pad_rows(inp.x, d0).into_iter().map(operand).collect();
        self.dev.write_prefix(&mut self.act, &x)?;
        if self.path == DataPath::Bf16 {
            self.act_bf16.write_prefix(&self.dev, &x)?;
        }
        if self.path != DataPath::CudaCores && !self.reads_in_place() {
            let xt: Vec<f32> = transpose_padded(inp.x, b, d0).into_iter().map(operand).collect();
            self.act_t.write_prefix(&self.dev, &xt)?;
        }
        match inp.loss {
            Loss::Mse => self.dev.write_prefix(&mut self.y, inp.y)?,
            Loss::CrossEntropy => {
                let classes: Vec<u32> = inp.classes.iter().map(|&c| c as u32).collect();
                self.dev.write_prefix(&mut self.classes, &classes)?
            }
        }
        Ok(())
    }

    /// One training step, one launch, on the batch last loaded. Checks for a stall when
    /// [`GpuStep::check_every`] says so.
    pub fn run(&mut self, loss_kind: Loss, lr: f32, momentum: f32) -> Result<()> {
        use kiln_gpu::kernels::megakernel_step::{MEGA_THREADS, MegakernelStep};
        use kiln_gpu::kernels::megakernel_tc::{
            MegakernelStepBf16T64, MegakernelStepBf16T128, MegakernelStepTf32T32, MegakernelStepTf32T64,
            MegakernelStepTf32x3T32, MegakernelStepTf32x3T64, tc_smem_bytes, tc_threads,
        };
        use kiln_gpu::megakernel::{MegaBuffers, MegaConfig, loss};
        // Zero the dependency counters only: the abort flag and the records after them stay until
        // a check reads them.
        {
            let mut deps = self.counter_buf.slice_mut().slice_mut(..self.counters);
            self.dev.stream().memset_zeros(&mut deps).map_err(Error::driver("zeroing the megakernel's counters"))?;
        }
        // the products read the weights' copies `front`; the updates write the other
        let (front, back) = (self.front, 1 - self.front);
        let maps = self.maps.as_ref().map_or(kiln_gpu::DevicePtr::from_addr(0), |m| m[front].ptr());
        let bufs = MegaBuffers {
            instructions: kiln_gpu::DevicePtr::from_addr(self.instructions.addr()),
            sm_offsets: self.sm_offsets.ptr(),
            counters: self.counter_buf.ptr_mut(),
            dims: self.dims.ptr(),
            w_off: self.w_off.ptr(),
            a_off: self.a_off.ptr(),
            t_off: self.t_off.ptr(),
            wt_off: self.wt_off.ptr(),
            weights: self.weights.ptr_mut(),
            velocity: self.velocity.ptr_mut(),
            dw: self.dw.ptr_mut(),
            act: self.act.ptr_mut(),
            grad: self.grad.ptr_mut(),
            act_t: self.act_t.ptr_mut(),
            grad_t: self.grad_t.ptr_mut(),
            w_op: self.w_op[back].ptr_mut(),
            w_t: self.w_t[back].ptr_mut(),
            act_bf16: self.act_bf16.ptr_mut().cast(),
            grad_bf16: self.grad_bf16.ptr_mut().cast(),
            y: self.y.ptr(),
            classes: self.classes.ptr(),
            maps,
            row_stats: self.row_stats.ptr_mut(),
            trace: match self.trace.as_mut() {
                Some(t) => {
                    self.dev.zero(t)?;
                    t.ptr_mut()
                }
                None => kiln_gpu::DevicePtrMut::from_addr(0),
            },
        };
        let cfg = MegaConfig {
            batch: self.shape.batch as u32,
            layers: self.shape.layers() as u32,
            counters: self.counters as u32,
            loss: if loss_kind == Loss::Mse { loss::MSE } else { loss::CROSS_ENTROPY },
            lr,
            momentum,
            wait_limit_ns: self.wait_limit_ns,
            tile: self.tile,
            precision: self.path.code(),
            extra_free_arrivals: self.extra_free_arrivals,
            give_up_warp: self.give_up_warp,
            give_up_at: self.give_up_at,
        };
        let launch = |threads: u32, smem: u32| crate::cuda::LaunchConfig {
            grid_dim: (self.sms, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem,
        };
        let tc_block = tc_threads(cfg.precision, cfg.tile);
        let (mega, tc) =
            (launch(MEGA_THREADS, 0), launch(tc_block, tc_smem_bytes(cfg.layers, cfg.precision, cfg.tile)));
        let args = (bufs, cfg);
        // The step's kernel: one per data path and, on tensor cores, per tile (the schedule's,
        // which `GpuStep::new` checked is one of the path's).
        // SAFETY: every buffer was sized from the schedule's shape, and the tensor maps describe
        // them; the kernels index within them.
        unsafe {
            match (self.path, self.tile) {
                (DataPath::CudaCores, _) => self.launch_step(MegakernelStep, mega, args),
                (DataPath::Tf32, 32) => self.launch_step(MegakernelStepTf32T32, tc, args),
                (DataPath::Tf32x3, 32) => self.launch_step(MegakernelStepTf32x3T32, tc, args),
                (DataPath::Tf32, _) => self.launch_step(MegakernelStepTf32T64, tc, args),
                (DataPath::Tf32x3, _) => self.launch_step(MegakernelStepTf32x3T64, tc, args),
                (DataPath::Bf16, 128) => self.launch_step(MegakernelStepBf16T128, tc, args),
                (DataPath::Bf16, _) => self.launch_step(MegakernelStepBf16T64, tc, args),
            }?
        }
        // the copies this step's updates write are the next step's
        self.front = back;
        self.steps_since_check += 1;
        if self.check_every != 0 && self.steps_since_check >= self.check_every {
            self.check()?;
        }
        Ok(())
    }

    /// Launches step kernel `K` and remembers its name for stall reports.
    ///
    /// # Safety
    /// As [`crate::cuda::Device::launch`]: `args` must describe buffers the kernel may index.
    unsafe fn launch_step<K>(&mut self, k: K, cfg: crate::cuda::LaunchConfig, args: K::Args) -> Result<()>
    where
        K: kiln_gpu::Kernel<Args = (kiln_gpu::megakernel::MegaBuffers, kiln_gpu::megakernel::MegaConfig)>,
    {
        self.kernel = K::NAME;
        unsafe { self.dev.launch(k, cfg, args) }
    }

    /// Waits for the launched steps and reports a stalled wait in any of them as
    /// [`Error::Stalled`] (then clears the flag).
    pub fn check(&mut self) -> Result<()> {
        use kiln_gpu::megakernel::{
            MASK_READY, PAGE_FREE, PAGE_READY, PAGE_TAG, RECORD_WORDS, RECORDS_PER_BLOCK, RENDEZVOUS, STAGE_FREE,
            STAGED, WEIGHTS_FREE, WEIGHTS_READY, record_offset,
        };
        self.steps_since_check = 0;
        let c = self.dev.download(&self.counter_buf)?;
        let k = self.counters;
        if c[k] == 0 {
            return Ok(());
        }
        let mut stuck = Vec::new();
        for blk in 0..self.sms {
            for role in 0..RECORDS_PER_BLOCK {
                let at = record_offset(k as u32, blk, role) as usize;
                let r = &c[at..at + RECORD_WORDS as usize];
                if r[0] == 0 {
                    continue;
                }
                let who = match role {
                    _ if self.path == DataPath::CudaCores => "block",
                    kiln_gpu::megakernel::role::LOADER => "loader of block",
                    kiln_gpu::megakernel::role::CONSUMERS => "consumers of block",
                    _ => "storer of block",
                };
                let what = if r[1] & PAGE_TAG == 0 {
                    format!("counter {} (saw {}, wanted {})", r[1], r[2], r[3])
                } else {
                    let slot = r[1] & 0xffff;
                    match (r[1] >> 16) & 0xff {
                        PAGE_READY => {
                            format!("the ready barrier of page {slot} with parity {} (page use {})", r[2], r[3])
                        }
                        PAGE_FREE => {
                            format!("the free barrier of page {slot} with parity {} (page use {})", r[2], r[3])
                        }
                        RENDEZVOUS => format!("the consumers' rendezvous with parity {} (meeting {})", r[2], r[3]),
                        STAGED => format!("the staged-tile hand-off with parity {} (staged tile {})", r[2], r[3]),
                        STAGE_FREE => {
                            format!(
                                "the storer's release of the staging buffer with parity {} (staged tile {})",
                                r[2], r[3]
                            )
                        }
                        MASK_READY => format!("the ReLU mask's barrier with parity {} (mask {})", r[2], r[3]),
                        WEIGHTS_READY => {
                            format!("the old weights' barrier with parity {} (staged update {})", r[2], r[3])
                        }
                        WEIGHTS_FREE => format!(
                            "the storer's release of the weight buffer with parity {} (staged update {})",
                            r[2], r[3]
                        ),
                        other => format!("barrier kind {other}, slot {slot}, parity {}", r[2]),
                    }
                };
                stuck.push(format!("{who} {blk} at instruction {} waited on {what}", r[0] - 1));
            }
        }
        self.dev.zero(&mut self.counter_buf)?;
        Err(Error::Stalled { kernel: self.kernel, msg: stuck.join("; ") })
    }

    /// Turns timestamps on or off for the steps that follow: each traced step records when every
    /// instruction waited, worked and signalled (`kiln_gpu::megakernel::trace`), which
    /// [`GpuStep::trace`] reads back. The timer reads and stores cost a little; benchmark untraced.
    pub fn set_trace(&mut self, on: bool) -> Result<()> {
        self.trace = match on {
            true => Some(self.dev.zeros::<u64>(self.listing.len() * kiln_gpu::megakernel::trace::WORDS as usize)?),
            false => None,
        };
        Ok(())
    }

    /// The timestamps of the last traced step (waiting for it to finish). It does not check for a
    /// stall, so that the trace of a step that was given up can be read: its unreached
    /// instructions show as unfinished; [`GpuStep::check`] then reports the stall records.
    pub fn trace(&mut self) -> Result<StepTrace> {
        let Some(buf) = self.trace.as_ref() else {
            return Err(Error::Unsupported {
                op: "megakernel trace",
                what: "a step run without tracing: call GpuStep::set_trace(true) before the step".into(),
            });
        };
        let words = self.dev.download(buf)?;
        Ok(StepTrace::new(&self.listing, &words, self.sms))
    }

    /// The last step's activations, `act[0]` (the batch as the products read it) to `act[L]` (the
    /// outputs), `batch x dims[l]` each (unpadded rows). On [`DataPath::Tf32`] every one but the
    /// outputs is a tf32 value (rounded to nearest, ties to even), on [`DataPath::Bf16`] a bf16
    /// one.
    pub fn activations(&mut self) -> Result<Vec<Vec<f32>>> {
        self.check()?;
        let mut act = self.per_layer_rows(&self.dev.download(&self.act)?);
        if self.path == DataPath::Bf16 {
            // the hidden layers are kept as bf16 only
            let bf16 = self.per_layer_rows(&self.act_bf16.download(&self.dev)?);
            let last = act.len() - 1;
            act[1..last].clone_from_slice(&bf16[1..last]);
        }
        Ok(act)
    }

    /// The last step's gradients of the loss by the activations, laid out as
    /// [`GpuStep::activations`]; layer 0's (the batch's) is not computed and reads as zeros. On
    /// [`DataPath::Tf32`] they are tf32 values, on [`DataPath::Bf16`] bf16 ones.
    pub fn activation_grads(&mut self) -> Result<Vec<Vec<f32>>> {
        self.check()?;
        // (kept as bf16 only on the bf16 path)
        let flat = match self.path {
            DataPath::Bf16 => self.grad_bf16.download(&self.dev)?,
            _ => self.dev.download(&self.grad)?,
        };
        Ok(self.per_layer_rows(&flat))
    }

    /// A buffer laid out as `act` (layer `l`: `batch` rows of `pitch(dims[l])`), split per layer
    /// and unpadded.
    fn per_layer_rows(&self, flat: &[f32]) -> Vec<Vec<f32>> {
        split_rows(flat, self.shape.dims.iter().map(|&d| (self.shape.batch, d)))
    }

    /// The current weights, per layer (unpadded rows).
    pub fn weights(&mut self) -> Result<Vec<Vec<f32>>> {
        self.check()?;
        let flat = self.dev.download(&self.weights)?;
        let d = &self.shape.dims;
        Ok(split_rows(&flat, (0..self.shape.layers()).map(|l| (d[l + 1], d[l]))))
    }

    /// The tensor-core paths' K-major operand copies as the last step left them (unpadded rows;
    /// see [`OperandCopies`]). For inspection and tests: the products read these, never the host.
    pub fn operand_copies(&mut self) -> Result<OperandCopies> {
        if self.path == DataPath::CudaCores {
            return Err(Error::Unsupported {
                op: "megakernel operand copies",
                what: "the CUDA-core path, which keeps none: use DataPath::Tf32, Tf32x3 or Bf16".into(),
            });
        }
        self.check()?;
        let (d, b, layers) = (&self.shape.dims, self.shape.batch, self.shape.layers());
        let per_layer = |flat: Vec<f32>| split_rows(&flat, d.iter().map(|&dim| (dim, b)));
        let dev = &self.dev;
        let kept = !self.reads_in_place();
        let w_t = match kept {
            true => Some(split_rows(&self.w_t[self.front].download(dev)?, (0..layers).map(|l| (d[l], d[l + 1])))),
            false => None,
        };
        let w_op = match self.path {
            DataPath::Tf32 | DataPath::Bf16 => {
                Some(split_rows(&self.w_op[self.front].download(dev)?, (0..layers).map(|l| (d[l + 1], d[l]))))
            }
            DataPath::CudaCores | DataPath::Tf32x3 => None,
        };
        let bf16 = |buf: &OperandBuffer| -> Result<Option<Vec<Vec<f32>>>> {
            Ok(match self.path {
                DataPath::Bf16 => Some(self.per_layer_rows(&buf.download(dev)?)),
                _ => None,
            })
        };
        Ok(OperandCopies {
            act_t: if kept { Some(per_layer(self.act_t.download(dev)?)) } else { None },
            grad_t: if kept { Some(per_layer(self.grad_t.download(dev)?)) } else { None },
            w_t,
            w_op,
            act_bf16: bf16(&self.act_bf16)?,
            grad_bf16: bf16(&self.grad_bf16)?,
        })
    }
}

/// The K-major copies of a tensor-core step's operands ([`GpuStep::operand_copies`]), each as its
/// products read it (rounded to tf32 on [`DataPath::Tf32`], stored as bf16 on
/// [`DataPath::Bf16`]), unpadded rows. The transposed copies are `None` where the step keeps
/// none ([`GpuStep::reads_in_place`]).
#[derive(Clone, Debug)]
pub struct OperandCopies {
    /// `act_t[l]`: `act[l]` transposed, `dims[l] x batch`, for `l` in `0..=L`. Written for the
    /// batch (`l = 0`) and the hidden layers; the outputs' (`l = L`) is never read and stays zero.
    pub act_t: Option<Vec<Vec<f32>>>,
    /// `grad_t[l]`: `grad[l]` transposed, laid out as `act_t`; layer 0's is never computed.
    pub grad_t: Option<Vec<Vec<f32>>>,
    /// `w_t[l]`: `W[l]` transposed, `dims[l] x dims[l + 1]`.
    pub w_t: Option<Vec<Vec<f32>>>,
    /// [`DataPath::Tf32`], [`DataPath::Bf16`]: `W[l]` rounded to the products' format (what the
    /// forward multiplies); `None` on 3xTF32, whose forward reads the weights themselves.
    pub w_op: Option<Vec<Vec<f32>>>,
    /// [`DataPath::Bf16`]: the bf16 copy of the activations (what the forwards read), laid out as
    /// [`GpuStep::activations`]; `None` on the other paths.
    pub act_bf16: Option<Vec<Vec<f32>>>,
    /// [`DataPath::Bf16`]: the bf16 copy of the activations' gradients (what the input gradients
    /// read), laid out as [`GpuStep::activation_grads`]; `None` on the other paths.
    pub grad_bf16: Option<Vec<Vec<f32>>>,
}

/// Consecutive padded matrices of `(rows, cols)` each (rows of [`pitch`]`(cols)`), unpadded.
fn split_rows(flat: &[f32], shapes: impl Iterator<Item = (usize, usize)>) -> Vec<Vec<f32>> {
    let mut at = 0;
    shapes
        .map(|(rows, cols)| {
            let n = rows * pitch(cols as u32) as usize;
            let m = unpad_rows(&flat[at..at + n], cols);
            at += n;
            m
        })
        .collect()
}
