//! The CPU interpreter: runs a [`Schedule`] with the SMs interleaved in a seeded random order and
//! every wait checked ([`interpret`]), each instruction in the device's arithmetic, its operands
//! rounded as the chosen path's kernel rounds them ([`StepState::with_operands`]). The reference
//! for the device kernels and the check that a schedule cannot deadlock.

use super::{DataPath, Loss, MlpShape, Schedule, StepInputs, WeightReads};
use crate::error::{Error, Result};
use kiln_gpu::math;
use kiln_gpu::megakernel::{Instruction, NO_COUNTER, opcode};
use rand::{Rng, SeedableRng, rngs::StdRng};

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
