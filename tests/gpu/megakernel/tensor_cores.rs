//! The tensor-core megakernel (sm_90a: 3xTF32, tf32 and bf16 data paths) against the interpreter,
//! on edge-case, shallow, long and random models; bit-identity across runs and schedules; traced
//! steps; and the operands each path stores for later products.

use super::reference::{
    BOTH_UPDATES, FUSED, MegaBound, Shadows, TC_DEEP, mega_check, megakernel_edge_cases, megakernel_vs_interpreter,
    reference_state, tc_deep,
};
use super::{dev_arc, mk_weights};
use crate::common::{Outcome, err};
use kiln::cuda::Device;
use kiln::testing;

/// The tensor-core paths against the interpreter's FMA chains ([`reference_state`]) on the
/// edge-case models, after 1 and 3 steps, within [`TC_DEEP`].
pub(crate) fn megakernel_tc_matches(_: &Device) -> Outcome {
    use kiln::megakernel::DataPath;
    let cases = megakernel_edge_cases();
    megakernel_vs_interpreter(DataPath::Tf32x3, &cases, 3, TC_DEEP, &BOTH_UPDATES)?;
    megakernel_vs_interpreter(DataPath::Tf32, &cases, 3, TC_DEEP, &BOTH_UPDATES)
}

/// [`megakernel_tc_matches`] for the bf16 path (a test of its own: the shadows' interpreter runs
/// take most of a test's minute), against the interpreter rounding the same operands
/// ([`reference_state`]).
pub(crate) fn megakernel_bf16_matches(_: &Device) -> Outcome {
    megakernel_vs_interpreter(kiln::megakernel::DataPath::Bf16, &megakernel_edge_cases(), 3, TC_DEEP, &BOTH_UPDATES)
}

/// The tensor-core products checked tightly where no ReLU decision can flip above them: a linear
/// model (forward and weight gradient) and one hidden layer (a unit that flips, in any batch row,
/// changes that unit's weight row of the first layer and its column of the second). 3xTF32: every
/// weight within 2e-3 of the largest update (f32-like sums), with 0.5 % outliers (one unit);
/// tf32: within 5 % (10-bit inputs), with 1.5 % outliers (three units of [100, 257, 10]): its
/// coarser sums flip two units now and then (with some seeds: 0.67 % of the first layer's
/// weights). bf16, against the interpreter rounding the same
/// operands ([`reference_state`]): the f32 sums' order is all that differs, as on 3xTF32, but a
/// stored operand whose f32 value sits at a bf16 rounding boundary can round the other way (one
/// bf16 step, 2^-8 relative), so within 5e-3 of the largest update, 0.5 % outliers.
pub(crate) fn megakernel_tc_shallow(_: &Device) -> Outcome {
    use kiln::megakernel::{DataPath, Loss};
    let cases = [
        (200usize, vec![300usize, 70], Loss::Mse, 0.0f32),
        (77, vec![129, 64], Loss::CrossEntropy, 0.9),
        (130, vec![100, 257, 10], Loss::CrossEntropy, 0.5),
    ];
    let (x3, x1) =
        (MegaBound::Update { frac: 2e-3, outliers: 0.005 }, MegaBound::Update { frac: 5e-2, outliers: 0.015 });
    megakernel_vs_interpreter(DataPath::Tf32x3, &cases, 3, x3, &BOTH_UPDATES)?;
    megakernel_vs_interpreter(DataPath::Tf32, &cases, 3, x1, &BOTH_UPDATES)?;
    megakernel_vs_interpreter(
        DataPath::Bf16,
        &cases,
        3,
        MegaBound::Update { frac: 5e-3, outliers: 0.005 },
        &BOTH_UPDATES,
    )
}

/// 100 steps with momentum 0.9 on the 3xTF32 path. Training amplifies the last-bit differences
/// of reordered sums (the CUDA-core path, bit-identical, has none), and near-zero ReLU units that
/// flip: measured on the H200, up to 4.8e-4 apart after 100 steps on weights of about 0.1, with
/// one weight of 9216 off by 2.9e-3. Bound: [`TC_DEEP`] on the distance travelled.
pub(crate) fn megakernel_tc_hundred_steps(_: &Device) -> Outcome {
    use kiln::megakernel::{DataPath, Loss};
    let cases = [(64usize, vec![32usize, 96, 96, 10], Loss::CrossEntropy, 0.9f32)];
    megakernel_vs_interpreter(DataPath::Tf32x3, &cases, 100, TC_DEEP, &FUSED)
}

/// Bit-identical weights across runs, and across schedules: every output tile is one block's
/// fixed-order product whichever SM runs it, so the schedule for all SMs and one for 3 SMs (each
/// block then makes thousands of page uses, far past the one parity bit's wrap-around) agree bit
/// for bit after 5 steps, on every tensor-core precision at each of its tiles and on the CUDA-core
/// path (tile 64); so does a traced run, whose last step's stamps must be complete and in order.
pub(crate) fn megakernel_tc_bits_repeat(dev: &Device) -> Outcome {
    use kiln::megakernel::{DataPath, MlpShape};
    let sms = dev.sm_count().map_err(err)?;
    let shape = MlpShape { batch: 200, dims: vec![300, 257, 257, 7] };
    // every tile of every path (a tile fixes each output's order of sums: tiles sum differently)
    let runs = [DataPath::Tf32x3, DataPath::Tf32, DataPath::Bf16, DataPath::CudaCores]
        .into_iter()
        .flat_map(|p| p.tiles().iter().map(move |&t| (p, t)))
        .filter(|&(p, t)| p != DataPath::CudaCores || t == 64);
    for (path, tile) in runs {
        let (a, _) = megakernel_weights_after(path, &shape, sms, tile, 5, false)?;
        let (b, _) = megakernel_weights_after(path, &shape, sms, tile, 5, false)?;
        let (c, _) = megakernel_weights_after(path, &shape, 3, tile, 5, false)?;
        let (d, _) = megakernel_weights_after(path, &shape, sms, tile, 5, true)?;
        for (l, (((a, b), c), d)) in a.iter().zip(&b).zip(&c).zip(&d).enumerate() {
            for (what, other) in [("a second run", b), ("the 3-SM schedule", c), ("a traced run", d)] {
                if let Some(i) = a.iter().zip(other).position(|(x, y)| x.to_bits() != y.to_bits()) {
                    return Err(format!(
                        "{path:?} tile {tile} layer {l} weight {i}: {} on {sms} SMs, {} in {what}",
                        a[i], other[i]
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Weights after `steps` steps of `path` with the schedule for `sms` SMs (fixed inputs).
fn megakernel_weights_after(
    path: kiln::megakernel::DataPath,
    shape: &kiln::megakernel::MlpShape,
    sms: usize,
    tile: u32,
    steps: usize,
    traced: bool,
) -> Result<(Vec<Vec<f32>>, u32), String> {
    use kiln::megakernel::{GpuStep, Loss, StepInputs, Updates, build_with_tile};
    let schedule = build_with_tile(shape, sms, tile, Updates::default(), path.weight_reads()).map_err(err)?;
    let mut gpu =
        GpuStep::new(Device::shared().map_err(err)?, &schedule, &mk_weights(&shape.dims, 5), path).map_err(err)?;
    gpu.set_trace(traced).map_err(err)?;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(17);
    let last = shape.dims[shape.layers()];
    for step in 0..steps {
        let x = testing::uniform(&mut rng, shape.batch * shape.dims[0]);
        let classes: Vec<usize> = (0..shape.batch).map(|i| (i * 5 + step) % last).collect();
        let inp = StepInputs { x: &x, y: &[], classes: &classes, loss: Loss::CrossEntropy, lr: 0.05, momentum: 0.9 };
        gpu.step(&inp).map_err(err)?;
    }
    if traced {
        check_trace(&gpu.trace().map_err(err)?, path, schedule.tile, schedule.order.len())?;
    }
    Ok((gpu.weights().map_err(err)?, schedule.tile))
}

/// A traced step's stamps are complete and in order: every instruction signalled; each stamp the
/// data path writes for its kind of instruction is present, and they follow the instruction's life
/// (`kiln_gpu::megakernel::trace`). The loader stamps the products, and the loss tiles whose
/// logits it stages (`box_slot_uses`: bf16 at tile 128).
fn check_trace(
    t: &kiln::megakernel::StepTrace,
    path: kiln::megakernel::DataPath,
    tile: u32,
    instructions: usize,
) -> Outcome {
    use kiln::gpu::megakernel::{box_slot_uses, opcode, trace as at};
    if t.records.len() != instructions || t.unfinished() != 0 {
        return Err(format!(
            "trace of {} instructions, {} unfinished; want {instructions}, 0",
            t.records.len(),
            t.unfinished()
        ));
    }
    for (k, r) in t.records.iter().enumerate() {
        let product = !matches!(r.instruction.opcode, opcode::LOSS_GRAD | opcode::SGD_UPDATE)
            || box_slot_uses(r.instruction.opcode, path.code(), tile) > 0;
        let chain: &[u32] = match path {
            kiln::megakernel::DataPath::CudaCores => &[at::START, at::FIRST, at::STORED, at::SIGNALED],
            _ => &[at::START, at::FIRST, at::WORK_DONE, at::STORED, at::SIGNALED],
        };
        let loader: &[u32] = match (path, product) {
            (kiln::megakernel::DataPath::CudaCores, _) | (_, false) => &[],
            (_, true) => &[at::LOADER_START, at::LOADER_DEPS, at::LOADER_ISSUED],
        };
        for seq in [chain, loader] {
            let got: Vec<Option<u64>> = seq.iter().map(|&w| r.stamps[w as usize]).collect();
            if got.iter().any(Option::is_none) || got.windows(2).any(|p| p[0] > p[1]) {
                return Err(format!("{path:?} instruction {k} ({:?}): stamps {seq:?} = {got:?}", r.instruction));
            }
        }
        let written = r.stamps.iter().filter(|s| s.is_some()).count();
        if written != chain.len() + loader.len() {
            return Err(format!(
                "{path:?} instruction {k}: {written} stamps written, want {}",
                chain.len() + loader.len()
            ));
        }
        // the cycle counts: on tensor-core products and loss gradients, waits within their spans;
        // elsewhere none
        let [ready_wait, work, free_wait, issue] = r.cycles;
        let loss_on_tc = r.instruction.opcode == opcode::LOSS_GRAD && path != kiln::megakernel::DataPath::CudaCores;
        let ok = match (loader.is_empty(), loss_on_tc) {
            (false, _) => work > 0 && issue > 0 && ready_wait <= work && free_wait <= issue,
            (true, true) => work > 0 && ready_wait <= work && free_wait == 0 && issue == 0,
            (true, false) => r.cycles == [0; 4],
        };
        if !ok {
            return Err(format!("{path:?} instruction {k} ({:?}): cycle counts {:?}", r.instruction, r.cycles));
        }
    }
    Ok(())
}

/// The tf32 and bf16 paths' page loops convert nothing, so every operand they store for a later
/// product must already be a tf32 (bf16) value: after a step, `act[0]` is the batch rounded to
/// nearest, every hidden activation and every computed gradient has its 13 (16) low bits clear.
/// The 3xTF32 path rounds nothing it stores: there `act[0]` is the batch bit for bit and some
/// hidden activation keeps low bits. On all three, the K-major copies the products read hold
/// exactly those operands, transposed: `act_t` and `grad_t` are `act` and `grad` bit for bit,
/// `w_t` is the updated weights (rounded on tf32 and bf16) and, on tf32 and bf16, `w_op` the
/// rounded weights; on bf16 its copy of the batch is `act[0]` bit for bit; with fused and
/// with separate updates. bf16 at tile 128 reads its operands in place and keeps no transposed
/// copies (and reports none). The CUDA-core path keeps no copies: asking for them is an error that
/// names the paths that do.
pub(crate) fn megakernel_tf32_operands_rounded(dev: &Device) -> Outcome {
    use kiln::megakernel::{DataPath, GpuStep, Loss, MlpShape, StepInputs, build_with_tile};
    // `a` (rows x cols) transposed against `t`, bit for bit: the first mismatch
    let transposed = |a: &[f32], t: &[f32], rows: usize, cols: usize| {
        (0..rows * cols).find(|&i| a[i].to_bits() != t[(i % cols) * rows + i / cols].to_bits())
    };
    let sms = dev.sm_count().map_err(err)?;
    let (mut rng, _) = testing::rng();
    // the CUDA-core path keeps no copies, and says so
    {
        let shape = MlpShape { batch: 8, dims: vec![5, 3] };
        let schedule = kiln::megakernel::build(&shape, sms, DataPath::CudaCores).map_err(err)?;
        let mut gpu =
            GpuStep::new(dev_arc()?, &schedule, &mk_weights(&shape.dims, 1), DataPath::CudaCores).map_err(err)?;
        match gpu.operand_copies() {
            Err(e) if e.to_string().contains("use DataPath::Tf32, Tf32x3 or Bf16") => {}
            other => return Err(format!("operand_copies on the CUDA-core path: {:?}", other.map(|_| ()))),
        }
    }
    let cases = [(100usize, vec![37usize, 130, 65, 10], Loss::CrossEntropy), (70, vec![129, 64, 33], Loss::Mse)];
    for (batch, dims, loss) in cases {
        let shape = MlpShape { batch, dims: dims.clone() };
        let layers = shape.layers();
        let x = testing::uniform(&mut rng, batch * dims[0]);
        let y = testing::uniform(&mut rng, batch * dims[layers]);
        let classes: Vec<usize> = (0..batch).map(|i| (i * 3) % dims[layers]).collect();
        let inp = StepInputs { x: &x, y: &y, classes: &classes, loss, lr: 0.05, momentum: 0.0 };
        let paths = [DataPath::Tf32, DataPath::Tf32x3, DataPath::Bf16];
        for (path, updates) in paths.into_iter().flat_map(|p| BOTH_UPDATES.map(|u| (p, u))) {
            for &tile in path.tiles() {
                let schedule = build_with_tile(&shape, sms, tile, updates, path.weight_reads()).map_err(err)?;
                let mut gpu = GpuStep::new(dev_arc()?, &schedule, &mk_weights(&dims, 3), path).map_err(err)?;
                gpu.step(&inp).map_err(err)?;
                let (act, grad) = (gpu.activations().map_err(err)?, gpu.activation_grads().map_err(err)?);
                let what = format!("{path:?} {updates:?} {dims:?} {loss:?} tile {tile}");
                let copies = gpu.operand_copies().map_err(err)?;
                let weights = gpu.weights().map_err(err)?;
                let operand = |v: f32| path.operand(v);
                let rounded: Vec<Vec<f32>> = weights.iter().map(|w| w.iter().map(|&v| operand(v)).collect()).collect();
                let same =
                    |got: &[f32], want: &[f32]| got.iter().zip(want).position(|(g, w)| g.to_bits() != w.to_bits());
                // the transposed copies: kept unless the step reads its operands in place (bf16 at
                // tile 128), and then none of them
                let (act_t, grad_t, w_t) = match (&copies.act_t, &copies.grad_t, &copies.w_t, gpu.reads_in_place()) {
                    (Some(a), Some(g), Some(w), false) => (a.clone(), g.clone(), w.clone()),
                    (None, None, None, true) => (vec![], vec![], vec![]),
                    _ => {
                        return Err(format!(
                            "{what}: transposed copies kept where the step reads in place, or missing"
                        ));
                    }
                };
                let checks = (0..act_t.len().min(layers))
                    .map(|l| ("act", l, &act[l], &act_t[l], batch, dims[l]))
                    .chain((1..grad_t.len().min(layers + 1)).map(|l| ("grad", l, &grad[l], &grad_t[l], batch, dims[l])))
                    .chain((0..w_t.len()).map(|l| ("weights", l, &rounded[l], &w_t[l], dims[l + 1], dims[l])));
                for (name, l, a, t, rows, cols) in checks {
                    if let Some(i) = transposed(a, t, rows, cols) {
                        let (r, c) = (i / cols, i % cols);
                        return Err(format!(
                            "{what}: {name}[{l}][{r}][{c}] = {:e}, its transposed copy has {:e}",
                            a[i],
                            t[c * rows + r]
                        ));
                    }
                }
                match (&copies.w_op, path) {
                    (Some(w_op), DataPath::Tf32 | DataPath::Bf16) => {
                        for (l, (got, want)) in w_op.iter().zip(&rounded).enumerate() {
                            if let Some(i) = same(got, want) {
                                return Err(format!("{what}: w_op[{l}][{i}] = {:e}, want {:e}", got[i], want[i]));
                            }
                        }
                    }
                    (None, DataPath::Tf32x3) => {}
                    _ => return Err(format!("{what}: w_op present on the wrong path")),
                }
                match (&copies.act_bf16, &copies.grad_bf16, path) {
                    (Some(act16), Some(grad16), DataPath::Bf16) => {
                        // the hidden activations and the gradients are kept as bf16 only (what
                        // `activations` and `activation_grads` read); the batch is in both arrays
                        if act16.len() != layers + 1 || grad16.len() != layers + 1 {
                            return Err(format!("{what}: bf16 copies of {} and {} layers", act16.len(), grad16.len()));
                        }
                        if let Some(i) = same(&act16[0], &act[0]) {
                            return Err(format!(
                                "{what}: the bf16 copy of the batch has {:e} at {i}, the f32 array {:e}",
                                act16[0][i], act[0][i]
                            ));
                        }
                    }
                    (None, None, DataPath::Tf32 | DataPath::Tf32x3) => {}
                    _ => return Err(format!("{what}: bf16 copies present on the wrong path")),
                }
                let want0: Vec<f32> = x.iter().map(|&v| operand(v)).collect();
                if let Some(i) = act[0].iter().zip(&want0).position(|(g, w)| g.to_bits() != w.to_bits()) {
                    return Err(format!(
                        "{what}: act[0][{i}] = {:e}, want {:e} (batch {:e})",
                        act[0][i], want0[i], x[i]
                    ));
                }
                let low = |v: f32| v.to_bits() & if path == DataPath::Bf16 { 0xffff } else { 0x1fff } != 0;
                if path != DataPath::Tf32x3 {
                    let stored =
                        (1..layers).map(|l| ("act", l, &act[l])).chain((1..=layers).map(|l| ("grad", l, &grad[l])));
                    for (name, l, v) in stored {
                        if let Some(i) = v.iter().position(|&v| low(v)) {
                            return Err(format!("{what}: {name}[{l}][{i}] = {:e} is not a {path:?} value", v[i]));
                        }
                    }
                } else if !act[1..layers].iter().flatten().any(|&v| low(v)) {
                    return Err(format!(
                        "{what}: every hidden activation is a tf32 value; 3xTF32 should keep f32 ones"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Random shapes on the device (the GPU side of the schedule property test): batches, widths and
/// depths drawn log-uniformly (batch 1..=4096, widths 1..=4096, 1..=16 layers, capped so the CPU
/// interpreter's reference stays under about 2 GFLOP per case), the three tensor-core precisions
/// in turn, random SM counts; weights after 2 steps within the path's bound of the interpreter.
pub(crate) fn megakernel_tc_random_shapes(dev: &Device) -> Outcome {
    use kiln::megakernel::{DataPath, GpuStep, Loss, MlpShape, StepInputs, build, interpret};
    use rand::Rng;
    let sms = dev.sm_count().map_err(err)?;
    let (mut rng, seed) = testing::rng();
    let log_uniform = |rng: &mut rand::rngs::StdRng, hi: f64| (rng.random_range(0.0..hi.ln())).exp().round() as usize;
    for case in 0..12 {
        let path = [DataPath::Tf32x3, DataPath::Tf32, DataPath::Bf16][(case % 3) as usize];
        let layers = log_uniform(&mut rng, 16.0).clamp(1, 16);
        let batch = log_uniform(&mut rng, 4096.0).max(1);
        let mut dims: Vec<usize> = (0..=layers).map(|_| log_uniform(&mut rng, 4096.0).max(1)).collect();
        // cap the reference's work (3 products per layer, 2 steps; the interpreter runs three times
        // with the two shadows, nine with bf16's eight, so bf16's cap is a third, and the tf32
        // interpreter, which rounds every operand, half: the test stays within the bundle's 60 s)
        let shadow_count = if path == DataPath::Bf16 { 8 } else { 2 };
        let cap = 600_000_000 * 3 / (1 + shadow_count) / if path == DataPath::Tf32 { 2 } else { 1 };
        while 6 * batch * dims.windows(2).map(|w| w[0] * w[1]).sum::<usize>() > cap {
            let widest = (0..dims.len()).max_by_key(|&i| dims[i]).unwrap_or(0);
            dims[widest] = dims[widest] / 2 + 1;
        }
        let shape = MlpShape { batch, dims: dims.clone() };
        let schedule = build(&shape, rng.random_range(1..=sms), path).map_err(err)?;
        let w0 = mk_weights(&dims, case);
        let mut gpu = GpuStep::new(dev_arc()?, &schedule, &w0, path).map_err(err)?;
        let mut cpu = reference_state(&shape, &w0, path)?;
        // Two shadows, or eight on bf16: there a nudge survives the operands' rounding only
        // rarely, so few shadows part, but one that does can part far, as far as the GPU's
        // trajectory does.
        let mut shadows = Shadows::new(&shape, &w0, path, shadow_count)?;
        let loss = if (case / 3) % 2 == 0 { Loss::Mse } else { Loss::CrossEntropy };
        for step in 0..2 {
            let x = testing::uniform(&mut rng, batch * dims[0]);
            let y = testing::uniform(&mut rng, batch * dims[layers]);
            let classes: Vec<usize> = (0..batch).map(|i| (i * 3 + step) % dims[layers]).collect();
            let inp = StepInputs { x: &x, y: &y, classes: &classes, loss, lr: 0.05, momentum: 0.5 };
            gpu.step(&inp).map_err(err)?;
            interpret(&schedule, &mut cpu, &inp, step as u64).map_err(err)?;
            shadows.step(&schedule, &inp, step)?;
        }
        let bound = tc_deep(path, layers, batch);
        for (l, (g, c)) in gpu.weights().map_err(err)?.iter().zip(&cpu.weights).enumerate() {
            let what = format!(
                "seed {seed} case {case}: {path:?} batch {batch} dims {dims:?} {loss:?} tile {} on {} SMs, layer {l}",
                schedule.tile,
                schedule.per_sm.len()
            );
            mega_check(&what, g, c, &w0[l], shadows.widen(bound, l, c, &w0[l]))?;
        }
    }
    Ok(())
}
