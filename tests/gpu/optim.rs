//! The fused multi-tensor optimizer (`kiln_gpu::kernels::optim`): SGD (plain, momentum, Nesterov,
//! weight decay), Adam and AdamW over 26 parameters of odd sizes (1, 3, 1023, 4097, around the
//! 16384-element chunk edges) against the CPU reference for several steps; the same kernels
//! against the per-tensor kernels bit for bit, with the bf16 / f16 compute copies equal to the
//! masters rounded to nearest-even; gradient-norm clipping against the CPU reference; two runs
//! giving the same bits; and one launch per step.
//!
//! Tolerances: the CPU reference keeps its state in f64 and rounds each weight once per step to
//! f32; the GPU keeps f32 state. Over 4 steps at lr 0.05 (SGD) or 0.01 (Adam) with weights and
//! gradients in [-1, 1) the weights differ by a few f32 ulps: `|gpu - cpu| <= 4e-6 + 4e-6 |cpu|`.
//! The norm (f32 sums of squares in a fixed tree) within `1e-5` relative of the f64 norm.

use crate::common::{Outcome, bits, err};
use crate::{GpuTest, any};
use half::{bf16, f16};
use kiln::cuda::Device;
use kiln::cuda::optim::{ComputeCopy, CopyFormat, MultiTensorTable, TensorSlot};
use kiln::gpu::kernels::optim::{GRAD_PATCH, MultiAdam, MultiSgd, OPTIM_CHUNK};
use kiln::gpu::kernels::tensor_ops::{AdamStep, SgdStep};
use kiln::optim::{Adam, Optimizer, Sgd};
use kiln::tensor::{CudaStorage, Device as TDev, Tensor};
use kiln::testing::{self, Tol, compare};
use std::sync::Arc;

/// This family's tests, in the order the suite lists them.
pub(crate) fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest { name: "gpu::optim::fused_sgd_matches_cpu", available: any, run: fused_sgd_matches_cpu },
        GpuTest { name: "gpu::optim::adamw_captured_matches_eager", available: any, run: adamw_captured_matches_eager },
        GpuTest { name: "gpu::optim::a_parameter_listed_twice_is_refused", available: any, run: listed_twice },
        GpuTest { name: "gpu::optim::fused_adam_matches_cpu", available: any, run: fused_adam_matches_cpu },
        GpuTest {
            name: "gpu::optim::fused_matches_per_tensor_kernels_with_copies",
            available: any,
            run: fused_matches_per_tensor_kernels,
        },
        GpuTest { name: "gpu::optim::clip_grad_norm_matches_cpu", available: any, run: clip_grad_norm_matches_cpu },
        GpuTest {
            name: "gpu::optim::fused_steps_are_deterministic",
            available: any,
            run: fused_steps_are_deterministic,
        },
        GpuTest { name: "gpu::optim::one_launch_per_step", available: any, run: one_launch_per_step },
        GpuTest { name: "gpu::optim::fused_checkpoint_round_trip", available: any, run: fused_checkpoint_round_trip },
        GpuTest { name: "gpu::optim::train_main_job_with_clipping", available: any, run: train_main_job_with_clipping },
    ]
}

/// Weight tolerance against the CPU reference (module docs).
const TOL: Tol = Tol { abs: 4e-6, rel: 4e-6 };

/// 26 parameter sizes: odd ones, and around the chunk edges.
fn sizes() -> Vec<usize> {
    let c = OPTIM_CHUNK as usize;
    let mut v = vec![1, 3, 1023, 4097, 5, 2, c - 1, c, c + 1, 2 * c + 3, 64, 7];
    v.extend((0..14).map(|i| 13 * i + 9));
    v
}

type Make = fn(Vec<(String, Tensor)>) -> Box<dyn Optimizer>;

/// Random weights and, per step, random gradients for `sizes`.
struct Inputs {
    weights: Vec<Vec<f32>>,
    grads: Vec<Vec<Vec<f32>>>,
}

fn inputs(steps: usize, sizes: &[usize]) -> Inputs {
    let (mut rng, _) = testing::rng();
    let weights = sizes.iter().map(|&n| testing::uniform(&mut rng, n)).collect();
    let grads = (0..steps).map(|_| sizes.iter().map(|&n| testing::uniform(&mut rng, n)).collect()).collect();
    Inputs { weights, grads }
}

/// Leaf parameters with `weights` on `dev`.
fn params(weights: &[Vec<f32>], dev: &TDev) -> Result<Vec<(String, Tensor)>, String> {
    weights
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let p = Tensor::from_vec(w.clone(), [w.len()]).map_err(err)?.requires_grad();
            p.move_to(dev).map_err(err)?;
            Ok((format!("p{i}"), p))
        })
        .collect()
}

/// Sets each parameter's gradient to `grads[i]` (the gradient of `sum(p * g)`, exactly `g`).
fn set_grads(params: &[(String, Tensor)], grads: &[Vec<f32>], dev: &TDev) -> Result<(), String> {
    for ((_, p), g) in params.iter().zip(grads) {
        p.zero_grad();
        let g = Tensor::from_vec(g.clone(), [g.len()]).map_err(err)?.to_device(dev).map_err(err)?;
        p.mul(&g).map_err(err)?.sum_all().map_err(err)?.backward().map_err(err)?;
    }
    Ok(())
}

/// `steps` steps of the optimizer `make` builds over parameters on `dev` (clipping to `clip` first
/// when given): the weights after the last step and the norm of each clip.
fn run(dev: &TDev, make: Make, x: &Inputs, clip: Option<f64>) -> Result<(Vec<Vec<f32>>, Vec<f64>), String> {
    let ps = params(&x.weights, dev)?;
    let mut opt = make(ps.clone());
    let mut norms = Vec::new();
    for g in &x.grads {
        set_grads(&ps, g, dev)?;
        if let Some(c) = clip {
            opt.clip_grad_norm(c).map_err(err)?;
            norms.push(opt.grad_norm().map_err(err)?.ok_or("no norm after clip_grad_norm")?);
        }
        opt.step().map_err(err)?;
        opt.zero_grad();
    }
    Ok((ps.iter().map(|(_, p)| p.to_vec_f32()).collect(), norms))
}

/// Each optimizer's weights on CUDA against the CPU reference.
fn against_cpu(cases: &[(&str, Make)], clip: Option<f64>) -> Outcome {
    let cuda = TDev::Cuda(Device::shared().map_err(err)?);
    let x = inputs(4, &sizes());
    for (name, make) in cases {
        let (gpu, gn) = run(&cuda, *make, &x, clip)?;
        let (cpu, cn) = run(&TDev::Cpu, *make, &x, clip)?;
        for (i, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
            let want: Vec<f64> = c.iter().map(|&v| v as f64).collect();
            compare(&format!("{name}, parameter {i} of {} elements", g.len()), g, &want, TOL)?;
        }
        for (s, (g, c)) in gn.iter().zip(&cn).enumerate() {
            if (g - c).abs() > 1e-5 * c.abs() {
                return Err(format!("{name}: the norm at step {s} is {g} on the GPU, {c} on the CPU"));
            }
        }
    }
    Ok(())
}

fn fused_sgd_matches_cpu(_: &Device) -> Outcome {
    against_cpu(
        &[
            ("sgd", |p| Box::new(Sgd::new(p, 0.05, 0.0, 0.0, false))),
            ("sgd weight decay", |p| Box::new(Sgd::new(p, 0.05, 0.0, 0.01, false))),
            ("sgd momentum", |p| Box::new(Sgd::new(p, 0.05, 0.9, 0.0, false))),
            ("sgd momentum weight decay", |p| Box::new(Sgd::new(p, 0.05, 0.9, 0.01, false))),
            ("nesterov weight decay", |p| Box::new(Sgd::new(p, 0.05, 0.9, 0.01, true))),
        ],
        None,
    )
}

fn fused_adam_matches_cpu(_: &Device) -> Outcome {
    against_cpu(
        &[
            ("adam", |p| Box::new(Adam::adam(p, 0.01, 0.0))),
            ("adam weight decay", |p| Box::new(Adam::adam(p, 0.01, 0.01))),
            ("adamw", |p| Box::new(Adam::adamw(p, 0.01, 0.01))),
        ],
        None,
    )
}

/// Clipping on CUDA against the CPU reference: the norm at each step and the weights after, with
/// a max_norm below the gradients' norm (about 160 here: every step scales) and one above it.
fn clip_grad_norm_matches_cpu(_: &Device) -> Outcome {
    let cases: [(&str, Make); 3] = [
        ("sgd momentum", |p| Box::new(Sgd::new(p, 0.05, 0.9, 0.01, false))),
        ("nesterov", |p| Box::new(Sgd::new(p, 0.05, 0.9, 0.0, true))),
        ("adamw", |p| Box::new(Adam::adamw(p, 0.01, 0.01))),
    ];
    against_cpu(&cases, Some(1.5))?;
    against_cpu(&cases[..1], Some(1e4))
}

/// Two runs of the same steps (clipping included) give the same bits, weights and norms.
fn fused_steps_are_deterministic(_: &Device) -> Outcome {
    let cuda = TDev::Cuda(Device::shared().map_err(err)?);
    let x = inputs(3, &sizes());
    let makes: [(&str, Make); 2] = [
        ("nesterov", |p| Box::new(Sgd::new(p, 0.05, 0.9, 0.01, true))),
        ("adamw", |p| Box::new(Adam::adamw(p, 0.01, 0.01))),
    ];
    for (name, make) in makes {
        let (w1, n1) = run(&cuda, make, &x, Some(2.0))?;
        let (w2, n2) = run(&cuda, make, &x, Some(2.0))?;
        let flat = |w: &[Vec<f32>]| w.iter().flat_map(|v| bits(v)).collect::<Vec<_>>();
        if flat(&w1) != flat(&w2) {
            return Err(format!("{name}: two runs gave different weights"));
        }
        if n1.iter().map(|n| n.to_bits()).ne(n2.iter().map(|n| n.to_bits())) {
            return Err(format!("{name}: two runs gave different norms: {n1:?} vs {n2:?}"));
        }
    }
    Ok(())
}

/// On a device of its own (so that other tests' launches do not count): after a first step (which
/// allocates the optimizer's state), a step is one launch whether no gradient moved or up to
/// GRAD_PATCH did, one more per further GRAD_PATCH moved gradients, and clipping is one launch;
/// parameters without gradients are left alone. The old gradients are kept alive while new ones
/// are made, so that the new ones are at new addresses.
fn one_launch_per_step(_: &Device) -> Outcome {
    let dev = Arc::new(Device::new(0).map_err(err)?);
    let td = TDev::Cuda(dev.clone());
    let n = GRAD_PATCH + 8;
    let lens: Vec<usize> = (0..n).map(|i| 3 * i + 1).collect();
    let x = inputs(2, &lens);
    let ps = params(&x.weights, &td)?;
    let mut opt = Adam::adamw(ps.clone(), 0.01, 0.01);
    let launches = |f: &mut dyn FnMut() -> kiln::Result<()>| -> Result<u64, String> {
        let before = dev.launch_count();
        f().map_err(err)?;
        Ok(dev.launch_count() - before)
    };
    let held = |ps: &[(String, Tensor)]| ps.iter().filter_map(|(_, p)| p.grad()).collect::<Vec<_>>();
    // the first GRAD_PATCH parameters get gradients; the first step allocates the state
    set_grads(&ps[..GRAD_PATCH], &x.grads[0][..GRAD_PATCH], &td)?;
    opt.step().map_err(err)?;
    for (i, (_, p)) in ps.iter().enumerate().skip(GRAD_PATCH) {
        if bits(&p.to_vec_f32()) != bits(&x.weights[i]) {
            return Err(format!("parameter {i} has no gradient but changed"));
        }
    }
    // the same gradients again: nothing moved; clipping; a clipped step
    let k = launches(&mut || opt.step())?;
    let c = launches(&mut || opt.clip_grad_norm(1.0))?;
    let s = launches(&mut || opt.step())?;
    if (k, c, s) != (1, 1, 1) {
        return Err(format!("launches: step {k}, clip {c}, clipped step {s}; expected 1 each"));
    }
    // GRAD_PATCH new gradients: one launch
    let old = held(&ps);
    set_grads(&ps[..GRAD_PATCH], &x.grads[1][..GRAD_PATCH], &td)?;
    let k = launches(&mut || opt.step())?;
    if k != 1 {
        return Err(format!("a step with {GRAD_PATCH} new gradients made {k} launches, not 1"));
    }
    drop(old);
    // every gradient new (GRAD_PATCH + 8): one patch launch, then the step
    let old = held(&ps);
    set_grads(&ps, &x.grads[0], &td)?;
    let k = launches(&mut || opt.step())?;
    if k != 2 {
        return Err(format!("a step with {n} new gradients made {k} launches, not 2"));
    }
    drop(old);
    Ok(())
}

/// State saved from the fused path loads into a fresh optimizer on the GPU and on the CPU, and
/// one more step from each agrees with one more step of the original; with and without clipping
/// before each step (the clip's norm launch is then the first launch after `load_state`: it builds
/// the fresh optimizer's table, whose device step count must start at the loaded one).
fn fused_checkpoint_round_trip(_: &Device) -> Outcome {
    let cuda = TDev::Cuda(Device::shared().map_err(err)?);
    let x = inputs(3, &[5, 1023, 7]);
    let makes: [(&str, Make); 3] = [
        ("nesterov", |p| Box::new(Sgd::new(p, 0.05, 0.9, 0.01, true))),
        ("adam", |p| Box::new(Adam::adam(p, 0.01, 0.01))),
        ("adamw", |p| Box::new(Adam::adamw(p, 0.01, 0.1))),
    ];
    for clip in [None, Some(0.5)] {
        let step = |o: &mut Box<dyn Optimizer>| -> Outcome {
            if let Some(c) = clip {
                o.clip_grad_norm(c).map_err(err)?;
            }
            o.step().map_err(err)
        };
        for (name, make) in makes {
            let ps = params(&x.weights, &cuda)?;
            let mut opt = make(ps.clone());
            for g in &x.grads[..2] {
                set_grads(&ps, g, &cuda)?;
                step(&mut opt)?;
            }
            let state: std::collections::HashMap<String, Tensor> = opt.state().map_err(err)?.into_iter().collect();
            let now: Vec<Vec<f32>> = ps.iter().map(|(_, p)| p.to_vec_f32()).collect();
            set_grads(&ps, &x.grads[2], &cuda)?;
            step(&mut opt)?;
            let want: Vec<Vec<f32>> = ps.iter().map(|(_, p)| p.to_vec_f32()).collect();
            for dev in [&cuda, &TDev::Cpu] {
                let fresh = params(&now, dev)?;
                let mut o = make(fresh.clone());
                o.load_state(&state).map_err(err)?;
                set_grads(&fresh, &x.grads[2], dev)?;
                step(&mut o)?;
                for (i, (_, p)) in fresh.iter().enumerate() {
                    let w: Vec<f64> = want[i].iter().map(|&v| v as f64).collect();
                    let tol = if matches!(dev, TDev::Cuda(_)) { Tol::EXACT } else { TOL };
                    let what = format!("{name} (clip {clip:?}) reloaded on the {}, parameter {i}", dev.name());
                    compare(&what, &p.to_vec_f32(), &w, tol)?;
                }
            }
        }
    }
    Ok(())
}

/// The multi-tensor kernels at the runtime level against the per-tensor kernels
/// (`sgd_step_f32`, `adam_step_f32`) bit for bit over 4 steps, with new gradient buffers each
/// step (so the gradients move), one parameter at an address that is not 16-byte aligned (the
/// element-wise path), an empty one, and a bf16 copy (f16 for every third parameter) of every
/// parameter that must equal the master rounded to nearest-even after each step. An empty table
/// launches nothing.
fn fused_matches_per_tensor_kernels(_: &Device) -> Outcome {
    let dev = Device::shared().map_err(err)?;
    let mut lens = sizes();
    lens.push(0);
    let x = inputs(4, &lens);
    let unaligned = 3; // parameter 3 (4097 elements) starts one element into its buffer
    for variant in ["sgd", "nesterov", "adam", "adamw"] {
        let adam = variant.starts_with("adam");
        // reference: one per-tensor launch per parameter
        let mut refs: Vec<(CudaStorage, CudaStorage, CudaStorage)> = Vec::new();
        for w in &x.weights {
            let z = || CudaStorage::full(&dev, w.len(), 0.0);
            refs.push((CudaStorage::upload(&dev, w).map_err(err)?, z().map_err(err)?, z().map_err(err)?));
        }
        // fused: its own buffers, copies poisoned
        let mut bufs = Vec::new();
        let mut copies = Vec::new();
        let mut slots = Vec::new();
        for (i, w) in x.weights.iter().enumerate() {
            let off = usize::from(i == unaligned);
            let mut host = vec![0.0f32; off];
            host.extend_from_slice(w);
            host.push(0.0);
            let p = dev.upload(&host).map_err(err)?;
            let s1 = dev.zeros::<f32>(w.len() + 1).map_err(err)?;
            let s2 = dev.zeros::<f32>(w.len() + 1).map_err(err)?;
            let c = dev.upload(&vec![0xffffu16; w.len() + 1]).map_err(err)?;
            let format = if i % 3 == 2 { CopyFormat::F16 } else { CopyFormat::Bf16 };
            slots.push(TensorSlot {
                param: p.addr() + 4 * off as u64,
                len: w.len(),
                state1: s1.addr(),
                state2: if adam { s2.addr() } else { 0 },
                copy: Some(ComputeCopy { addr: c.addr(), len: w.len(), format }),
                no_decay: false,
            });
            bufs.push((p, s1, s2, off));
            copies.push((c, format));
        }
        let mut table = MultiTensorTable::new(&dev, &slots).map_err(err)?;
        for (t, grads) in x.grads.iter().enumerate() {
            let gbufs: Vec<_> =
                grads.iter().map(|g| CudaStorage::upload(&dev, g)).collect::<kiln::Result<_>>().map_err(err)?;
            let (c1, c2) = (1.0 - 0.9f64.powi(t as i32 + 1), 1.0 - 0.999f64.powi(t as i32 + 1));
            for ((p, m, v), g) in refs.iter_mut().zip(&gbufs) {
                if p.is_empty() {
                    continue;
                }
                if adam {
                    let h = AdamStep {
                        n: 0,
                        lr: 0.01,
                        beta1: 0.9,
                        beta2: 0.999,
                        eps: 1e-8,
                        weight_decay: 0.01,
                        c1: c1 as f32,
                        c2: c2 as f32,
                        decoupled: (variant == "adamw") as u32,
                    };
                    p.adam_step(g, m, v, h).map_err(err)?;
                } else {
                    let h = SgdStep {
                        n: 0,
                        lr: 0.05,
                        momentum: 0.9,
                        weight_decay: 0.01,
                        nesterov: (variant == "nesterov") as u32,
                        first: (t == 0) as u32,
                    };
                    p.sgd_step(g, m, h).map_err(err)?;
                }
            }
            let addrs: Vec<u64> = gbufs.iter().map(|g| g.addr()).collect();
            // SAFETY: every buffer of the table and every gradient lives until the downloads below.
            unsafe {
                if adam {
                    let h = MultiAdam {
                        chunks: 0,
                        lr: 0.01,
                        beta1: 0.9,
                        beta2: 0.999,
                        eps: 1e-8,
                        weight_decay: 0.01,
                        c1: c1 as f32,
                        c2: c2 as f32,
                        decoupled: (variant == "adamw") as u32,
                    };
                    table.adam(&addrs, h, false).map_err(err)?;
                } else {
                    let h = MultiSgd {
                        chunks: 0,
                        lr: 0.05,
                        momentum: 0.9,
                        weight_decay: 0.01,
                        nesterov: (variant == "nesterov") as u32,
                    };
                    table.sgd(&addrs, h, false).map_err(err)?;
                }
            }
            for (i, ((p, _, _, off), (c, format))) in bufs.iter().zip(&copies).enumerate() {
                let n = lens[i];
                let got = dev.download(p).map_err(err)?[*off..*off + n].to_vec();
                let want = refs[i].0.download().map_err(err)?;
                if bits(&got) != bits(&want) {
                    let j = (0..n).find(|&j| got[j].to_bits() != want[j].to_bits()).unwrap_or(0);
                    return Err(format!(
                        "{variant} step {t}, parameter {i} ({n} elements): fused {} != per-tensor {} at {j}",
                        got[j], want[j]
                    ));
                }
                let copy = dev.download(c).map_err(err)?;
                for j in 0..n {
                    let rounded = match format {
                        CopyFormat::Bf16 => bf16::from_f32(got[j]).to_bits(),
                        CopyFormat::F16 => f16::from_f32(got[j]).to_bits(),
                    };
                    if copy[j] != rounded {
                        return Err(format!(
                            "{variant} step {t}, parameter {i}: {format:?} copy {:#06x} at {j}, the master {} rounds to {rounded:#06x}",
                            copy[j], got[j]
                        ));
                    }
                }
                if copy[n] != 0xffff {
                    return Err(format!("{variant}: the copy of parameter {i} was written past its end"));
                }
            }
        }
    }
    // an empty table: nothing to launch, no error, norm 0 and scale 1
    let mut empty = MultiTensorTable::new(&dev, &[]).map_err(err)?;
    let h = MultiSgd { chunks: 0, lr: 0.1, momentum: 0.0, weight_decay: 0.0, nesterov: 0 };
    // SAFETY: the table has no parameters.
    unsafe { empty.sgd(&[], h, false).map_err(err)? };
    // SAFETY: as above.
    unsafe { empty.grad_norm(&[], 1.0).map_err(err)? };
    let st = empty.clip_state().map_err(err)?;
    if (st.norm, st.scale) != (0.0, 1.0) {
        return Err(format!("an empty table's clip state is {st:?}"));
    }
    Ok(())
}

/// The main job on the GPU with `--clip-grad-norm 1.0` (AdamW, a clip before every step) reaches
/// the 90 % accuracy bar of the unclipped GPU run.
fn train_main_job_with_clipping(_: &Device) -> Outcome {
    use kiln::train::{DataSource, DeviceChoice, OptimizerKind, TrainConfig};
    let cfg = TrainConfig {
        data: DataSource::Spirals { per_class: 300, classes: 3, noise: 0.2 },
        epochs: 20,
        device: DeviceChoice::Cuda,
        optimizer: OptimizerKind::AdamW,
        weight_decay: 0.01,
        clip_grad_norm: Some(1.0),
        checkpoint: None,
        progress: false,
        ..TrainConfig::default()
    };
    let report = kiln::train::train(&cfg, |l| eprintln!("{l}")).map_err(err)?;
    if !report.device.starts_with("GPU") {
        return Err(format!("trained on {} instead of the GPU", report.device));
    }
    let acc = report.epochs.last().map(|r| r.test_accuracy).unwrap_or(0.0);
    if acc < 0.9 {
        return Err(format!("test accuracy {acc} after 20 epochs on the GPU with --clip-grad-norm 1.0"));
    }
    Ok(())
}

/// One CUDA tensor listed twice (tied weights as two handles) is refused by the step and by
/// `attach_compute_copies` with a typed error naming both entries, before any launch: the fused
/// update would otherwise write it from two blocks at once.
fn listed_twice(_dev: &Device) -> Outcome {
    let td = TDev::cuda().map_err(err)?;
    let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).map_err(err)?.to_device(&td).map_err(err)?.requires_grad();
    let loss = (&w * &w).map_err(err)?.sum_all().map_err(err)?;
    loss.backward().map_err(err)?;
    let params = vec![("a".to_string(), w.clone()), ("b".to_string(), w.clone())];
    let mut sgd = Sgd::new(params.clone(), 0.1, 0.9, 0.0, false);
    let before = w.to_vec_f64();
    match sgd.step() {
        Err(e @ kiln::Error::Unsupported { .. }) if e.to_string().contains("`a` and `b` are the same tensor") => {}
        other => return Err(format!("a twice-listed parameter: expected a typed refusal, got {other:?}")),
    }
    if w.to_vec_f64() != before {
        return Err("the refused step changed the weights".into());
    }
    let mut adam = Adam::adamw(params, 1e-3, 0.0);
    match kiln::optim::attach_compute_copies(&mut adam, kiln::tensor::DType::BF16) {
        Err(e @ kiln::Error::Unsupported { .. }) if e.to_string().contains("same tensor") => Ok(()),
        other => Err(format!("attach_compute_copies on a twice-listed parameter: got {other:?}")),
    }
}

/// AdamW steps replayed from a CUDA graph give the bits of eager steps: an MLP on CUDA with AdamW
/// (weight decay 0.01, biases undecayed), gradient clipping inside the step, the learning rate on
/// a warmup + cosine schedule (written to the device before each replay), and an eager step after
/// the replays. One eager step, a capture, five replays and one more eager step against seven
/// eager steps: every parameter, both moments and the step count equal. The capture itself runs
/// nothing (the parameters are unchanged after it).
fn adamw_captured_matches_eager(dev: &Device) -> Outcome {
    use kiln::nn::{Module, Sequential, mlp};
    use kiln::optim::LrSchedule;
    use kiln::tensor::{DType, Targets};
    let td = TDev::Cuda(Device::shared().map_err(err)?);
    let (batch, features, width, classes) = (24, 13, 40, 7);
    let x = Tensor::randn([batch, features], DType::F32, &mut Tensor::rng(21)).to_device(&td).map_err(err)?;
    let targets = Targets::new((0..batch).map(|i| (i * 3) % classes).collect());
    let schedule = LrSchedule::CosineWarmup { warmup: 3, total: 7, min_ratio: 0.1 };
    let build = || -> Result<(Sequential, Adam), String> {
        let model = mlp(features, width, 3, classes, kiln::nn::Activation::Relu, DType::F32, &mut Tensor::rng(8))
            .map_err(err)?;
        for p in model.parameters() {
            p.move_to(&td).map_err(err)?;
        }
        let named = model.named_parameters();
        let decay: Vec<bool> = named.iter().map(|(n, _)| !n.ends_with("bias")).collect();
        let mut opt = Adam::adamw(named, 0.01, 0.01);
        opt.set_decay(&decay).map_err(err)?;
        Ok((model, opt))
    };
    let step = |model: &Sequential, opt: &mut Adam| -> kiln::Result<()> {
        let loss = model.forward(&x)?.cross_entropy(&targets)?;
        loss.backward()?;
        opt.clip_grad_norm(0.5)?;
        opt.step()?;
        opt.zero_grad();
        Ok(())
    };
    let state = |model: &Sequential, opt: &Adam| -> Result<Vec<u64>, String> {
        let mut v: Vec<u64> =
            model.parameters().iter().flat_map(|p| p.to_vec_f32()).map(|x| x.to_bits() as u64).collect();
        for (_, t) in opt.state().map_err(err)? {
            v.extend(t.to_vec_f64().iter().map(|x| x.to_bits()));
        }
        Ok(v)
    };
    let (eager, mut eager_opt) = build()?;
    for t in 0..7 {
        eager_opt.set_lr(schedule.lr(0.01, t));
        step(&eager, &mut eager_opt).map_err(err)?;
    }
    let (replayed, mut opt) = build()?;
    opt.set_lr(schedule.lr(0.01, 0));
    step(&replayed, &mut opt).map_err(err)?; // the warm-up: state allocated, caches filled
    let before = state(&replayed, &opt)?;
    opt.set_lr(schedule.lr(0.01, 1));
    opt.prepare_replay().map_err(err)?;
    let graph = dev.capture(|| step(&replayed, &mut opt)).map_err(|e| format!("capturing the AdamW step: {e}"))?;
    if state(&replayed, &opt)? != before {
        return Err("capturing the step ran it".into());
    }
    for t in 1..6 {
        opt.set_lr(schedule.lr(0.01, t));
        opt.prepare_replay().map_err(err)?;
        // SAFETY: the model, the optimizer's state, x and the targets outlive the replays.
        unsafe { graph.launch() }.map_err(err)?;
    }
    opt.set_lr(schedule.lr(0.01, 6));
    step(&replayed, &mut opt).map_err(err)?; // eager after the replays
    dev.synchronize().map_err(err)?;
    let (a, b) = (eager_opt.steps().map_err(err)?, opt.steps().map_err(err)?);
    if (a, b) != (7, 7) {
        return Err(format!("step counts: eager {a}, replayed {b}; expected 7"));
    }
    let (want, got) = (state(&eager, &eager_opt)?, state(&replayed, &opt)?);
    if let Some(i) = (0..want.len().min(got.len())).find(|&i| want[i] != got[i]) {
        return Err(format!(
            "word {i} of the parameters and moments differs: eager {:#x}, replayed {:#x}",
            want[i], got[i]
        ));
    }
    if want.len() != got.len() {
        return Err(format!("{} state words eager, {} replayed", want.len(), got.len()));
    }
    Ok(())
}
