//! Mixed-precision training and the fused Linear layer on CUDA: the fused forward
//! (`act(x W^T + b)` as one `wgmma` GEMM, bf16 out) and backward (dX, dW and db read in place, dW
//! and db in f32) against an f64 reference, the unfused composition on CUDA and the CPU backend,
//! with the fallback where K is not a multiple of 8; a mixed bf16 training step on CUDA (the
//! optimizer writing the compute copies) against the CPU's mixed step; `kiln train --dtype bf16` on
//! CUDA reaching the main job's target; a captured mixed step against the eager one. Outputs are
//! poisoned (the suite sets `KILN_POISON=1`); inputs are fresh random values (the seed printed).

use crate::common::{Outcome, err};
use crate::{GpuTest, any};
use kiln::cuda::Device;
use kiln::cuda::gemm::Activation;
use kiln::tensor::{DType, Device as TDev, Tensor};
use kiln::testing::{self, Tol, compare};

fn wgmma(d: &Device) -> bool {
    d.supports::<kiln::gpu::kernels::gemm_wgmma_fused::GemmWgmmaBf16Fused>()
}

pub(crate) fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest { name: "gpu::mixed::fused_linear_sm90", available: wgmma, run: fused_linear },
        GpuTest { name: "gpu::mixed::linear_falls_back_off_sm90", available: |d| !wgmma(d), run: fallback_linear },
        GpuTest {
            name: "gpu::mixed::linear_weight_gradient_split_k_sm90",
            available: wgmma,
            run: weight_gradient_split,
        },
        GpuTest { name: "gpu::mixed::training_step_matches_the_cpu", available: any, run: mixed_step_vs_cpu },
        GpuTest { name: "gpu::mixed::train_main_job_bf16_on_cuda", available: any, run: train_main_job_bf16 },
        GpuTest { name: "gpu::mixed::training_step_captured", available: any, run: captured_mixed_step },
        GpuTest {
            name: "gpu::mixed::training_step_captured_wgmma_shapes",
            available: any,
            run: captured_mixed_step_wgmma_shapes,
        },
        GpuTest { name: "gpu::mixed::train_main_job_f16_loss_scaled", available: any, run: train_main_job_f16 },
        GpuTest { name: "gpu::mixed::loss_scaled_step_on_cuda", available: any, run: loss_scaled_step },
        GpuTest { name: "gpu::mixed::train_graph_matches_no_graph_f32", available: any, run: train_graph_f32 },
        GpuTest { name: "gpu::mixed::train_graph_matches_no_graph_bf16", available: any, run: train_graph_bf16 },
        GpuTest {
            name: "gpu::mixed::train_graph_matches_no_graph_bf16_adamw_warmup",
            available: any,
            run: train_graph_bf16_adamw,
        },
        GpuTest {
            name: "gpu::mixed::train_graph_matches_no_graph_f32_adam_warmup",
            available: any,
            run: train_graph_f32_adam,
        },
    ]
}

fn bf16_round(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect()
}

/// The f64 reference of `act(x w^T + b)` (x rows x k, w n x k) over the given (already rounded)
/// values, and the pre-activation.
fn reference(x: &[f32], w: &[f32], b: &[f32], (rows, k, n): (usize, usize, usize), relu: bool) -> Vec<f64> {
    let mut y = vec![0.0f64; rows * n];
    for r in 0..rows {
        for o in 0..n {
            let s: f64 = (0..k).map(|i| x[r * k + i] as f64 * w[o * k + i] as f64).sum::<f64>() + b[o] as f64;
            y[r * n + o] = if relu { s.max(0.0) } else { s };
        }
    }
    y
}

/// One Linear on `dev`: x bf16 (tracked), the weight an f32 master on CUDA used through its bf16
/// compute copy, the f32 master bias; `loss = sum(y * g)`. Returns (y, dx, dW, db, whether the
/// forward was the fused op).
#[allow(clippy::type_complexity)]
fn linear_on(
    td: &TDev,
    (xv, wv, bv, gv): (&[f32], &[f32], &[f32], &[f32]),
    (rows, k, n): (usize, usize, usize),
    act: Option<Activation>,
    composed: bool,
) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, bool), String> {
    let x = Tensor::from_vec(xv.to_vec(), [rows, k])
        .and_then(|t| t.to_dtype(DType::BF16))
        .and_then(|t| t.to_device(td))
        .map_err(err)?
        .detach()
        .requires_grad();
    let w = Tensor::from_vec(wv.to_vec(), [n, k]).and_then(|t| t.to_device(td)).map_err(err)?.requires_grad();
    let b = Tensor::from_vec(bv.to_vec(), [n]).and_then(|t| t.to_device(td)).map_err(err)?.requires_grad();
    let g = Tensor::from_vec(gv.to_vec(), [rows, n]).and_then(|t| t.to_device(td)).map_err(err)?;
    let wc = w.compute_copy(DType::BF16).map_err(err)?;
    let y = if composed {
        let y = x.matmul_t(&wc).and_then(|y| y.add(&b.compute_copy(DType::BF16)?)).map_err(err)?;
        if act.is_some() { y.relu().map_err(err)? } else { y }
    } else {
        x.linear(&wc, Some(&b), act).map_err(err)?
    };
    let fused = format!("{y:?}").contains("op=linear");
    y.to_dtype(DType::F32).and_then(|y| y.mul(&g)).and_then(|l| l.sum_all()).and_then(|l| l.backward()).map_err(err)?;
    let grad = |t: &Tensor, want: DType| -> Result<Vec<f32>, String> {
        let gr = t.grad().ok_or("no gradient")?;
        if gr.dtype() != want {
            return Err(format!("a {:?} gradient where {want:?} was expected", gr.dtype()));
        }
        Ok(gr.to_vec_f32())
    };
    Ok((y.to_vec_f32(), grad(&x, DType::BF16)?, grad(&w, DType::F32)?, grad(&b, DType::F32)?, fused))
}

/// The gradients' f64 reference given the GPU's output `y` (its ReLU mask) and the bf16-rounded
/// upstream gradient: (dx, dW, db).
fn grad_reference(
    (x, w, g, y): (&[f32], &[f32], &[f32], &[f32]),
    (rows, k, n): (usize, usize, usize),
    relu: bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let gb = bf16_round(g);
    let gp: Vec<f64> = (0..rows * n)
        .map(|i| if relu && y[i] <= 0.0 { 0.0 } else { half::bf16::from_f32(gb[i]).to_f32() as f64 })
        .collect();
    let dx = (0..rows * k).map(|i| (0..n).map(|o| gp[(i / k) * n + o] * w[o * k + i % k] as f64).sum()).collect();
    let dw = (0..n * k).map(|i| (0..rows).map(|r| gp[r * n + i / k] * x[r * k + i % k] as f64).sum()).collect();
    let db = (0..n).map(|o| (0..rows).map(|r| gp[r * n + o]).sum()).collect();
    (dx, dw, db)
}

/// The largest magnitude in `want` (at least 1e-3).
fn scale(want: &[f64]) -> f64 {
    want.iter().fold(1e-3f64, |m, v| m.max(v.abs()))
}

/// Tolerances, each scaled by the largest expected magnitude (a bf16 rounding error is relative
/// to the value rounded: the product before the bias, which can be much larger than the sum):
/// - a bf16 output against f64: one bf16 ulp of the largest value (2^-7 of it) plus half an ulp
///   relative (2^-8);
/// - an f32 output (dW, db of the fused backward: exact bf16 products summed in f32): 1e-5;
/// - two paths that round differently (fused: once; composed: the product, then the sum): two ulps
///   of the largest value (2^-6) plus 2^-7 relative.
fn bf16_tol(want: &[f64]) -> Tol {
    Tol { abs: scale(want) / 128.0, rel: 1.0 / 256.0 }
}
fn f32_tol(want: &[f64]) -> Tol {
    Tol { abs: 1e-5 * scale(want), rel: 1e-5 }
}
fn cross_tol(want: &[f64]) -> Tol {
    Tol { abs: scale(want) / 64.0, rel: 1.0 / 128.0 }
}

fn check_linear(td: &TDev, shapes: &[(usize, usize, usize)], expect_fused: impl Fn(usize, usize) -> bool) -> Outcome {
    let (mut rng, seed) = testing::rng();
    eprintln!("seed {seed}");
    for &(rows, k, n) in shapes {
        for act in [None, Some(Activation::Relu)] {
            let what = format!("linear {rows} x {k} by {n} x {k}, {act:?}");
            let (xv, wv) = (bf16_round(&testing::uniform(&mut rng, rows * k)), testing::uniform(&mut rng, n * k));
            let (bv, gv) = (testing::uniform(&mut rng, n), testing::uniform(&mut rng, rows * n));
            let wr = bf16_round(&wv);
            let inputs = (&xv[..], &wv[..], &bv[..], &gv[..]);
            let (y, dx, dw, db, fused) = linear_on(td, inputs, (rows, k, n), act, false)?;
            if fused != expect_fused(k, n) {
                return Err(format!("{what}: fused {fused}, expected {}", expect_fused(k, n)));
            }
            let relu = act.is_some();
            let ry = reference(&xv, &wr, &bv, (rows, k, n), relu);
            compare(&format!("{what}: y vs f64"), &y, &ry, bf16_tol(&ry))?;
            let (rdx, rdw, rdb) = grad_reference((&xv, &wr, &gv, &y), (rows, k, n), relu);
            compare(&format!("{what}: dx vs f64"), &dx, &rdx, bf16_tol(&rdx))?;
            // dW and db in f32 where the backward was fused (n % 8 == 0), else rounded to bf16 once
            let fused_back = fused && n % 8 == 0;
            let wide = |want: &[f64]| if fused_back { f32_tol(want) } else { bf16_tol(want) };
            compare(&format!("{what}: dW (f32 master gradient) vs f64"), &dw, &rdw, wide(&rdw))?;
            compare(&format!("{what}: db (f32) vs f64"), &db, &rdb, wide(&rdb))?;
            // the unfused composition on CUDA, and the CPU backend's: the outputs, and (without the
            // ReLU, whose mask may flip where the two paths round a near-zero sum differently) the
            // gradients
            for (place, dev, composed) in [("CUDA composed", td, true), ("CPU", &TDev::Cpu, false)] {
                let (cy, cdx, cdw, cdb, _) = linear_on(dev, inputs, (rows, k, n), act, composed)?;
                let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
                compare(&format!("{what}: y vs {place}"), &y, &f(&cy), cross_tol(&ry))?;
                if !relu {
                    compare(&format!("{what}: dx vs {place}"), &dx, &f(&cdx), cross_tol(&rdx))?;
                    compare(&format!("{what}: dW vs {place}"), &dw, &f(&cdw), cross_tol(&rdw))?;
                    compare(&format!("{what}: db vs {place}"), &db, &f(&cdb), cross_tol(&rdb))?;
                }
            }
        }
    }
    Ok(())
}

/// A bf16 Linear's weight gradient at a 16384 x 384 input (GPT char-mini's), which the engine
/// computes with a k split (`WgmmaGemm::auto_split_k`, checked to be above 1 here): against the
/// unsplit fused product of the same bf16 operands within bf16 tolerance, and the same bits on a
/// second run.
fn weight_gradient_split(_: &Device) -> Outcome {
    use half::bf16;
    use kiln::cuda::gemm::{GemmEpilogue, WgmmaGemm, WgmmaLayout};
    use kiln::gpu::kernels::mma_tile::GemmShape;
    let dev = Device::shared().map_err(err)?;
    let td = TDev::Cuda(dev.clone());
    let (rows, k, n) = (16384usize, 384usize, 384usize);
    let (mut rng, seed) = testing::rng();
    eprintln!("seed {seed}");
    let (xv, wv) = (bf16_round(&testing::uniform(&mut rng, rows * k)), testing::uniform(&mut rng, n * k));
    let (bv, gv) = (testing::uniform(&mut rng, n), testing::uniform(&mut rng, rows * n));
    let inputs = (&xv[..], &wv[..], &bv[..], &gv[..]);
    let (_, _, dw, _, fused) = linear_on(&td, inputs, (rows, k, n), None, false)?;
    if !fused {
        return Err("the 16384 x 384 Linear did not take the fused op".into());
    }
    // the unsplit product dW = dY^T X of the same bf16 operands (dY: the upstream gradient rounded)
    let gb: Vec<bf16> = gv.iter().map(|&x| bf16::from_f32(x)).collect();
    let xb: Vec<bf16> = xv.iter().map(|&x| bf16::from_f32(x)).collect();
    let (dg, dx) = (dev.upload(&gb).map_err(err)?, dev.upload(&xb).map_err(err)?);
    let s = GemmShape { m: n as u32, n: k as u32, k: rows as u32 };
    let plan = WgmmaGemm::with_layout(&dev, &dg, &dx, s, WgmmaLayout::AtB).map_err(err)?;
    if plan.auto_split_k() < 2 {
        return Err(format!("the engine does not split {n}x{k}x{rows}: auto_split_k {}", plan.auto_split_k()));
    }
    let mut c = dev.upload(&vec![testing::POISON_F32; n * k]).map_err(err)?;
    plan.run_fused(&mut c, GemmEpilogue::<f32>::default()).map_err(err)?;
    let unsplit: Vec<f64> = dev.download(&c).map_err(err)?.into_iter().map(|x| x as f64).collect();
    compare("dW split (engine) vs unsplit", &dw, &unsplit, bf16_tol(&unsplit))?;
    let (_, _, dw2, _, _) = linear_on(&td, inputs, (rows, k, n), None, false)?;
    if crate::common::bits(&dw) != crate::common::bits(&dw2) {
        return Err("the split weight gradient differs between two runs".into());
    }
    Ok(())
}

/// The fused Linear on sm_90a: odd rows and outputs (the backward composed where n % 8 != 0),
/// n % 8 == 0 (the backward fused too), and K not a multiple of 8 (the composed fallback).
fn fused_linear(_: &Device) -> Outcome {
    let td = TDev::Cuda(Device::shared().map_err(err)?);
    check_linear(&td, &[(37, 64, 29), (45, 40, 24), (130, 136, 72), (37, 30, 24)], |k, _| k % 8 == 0)
}

/// Without the fused kernel (before sm_90a) every case takes the composed path, same results.
fn fallback_linear(_: &Device) -> Outcome {
    let td = TDev::Cuda(Device::shared().map_err(err)?);
    check_linear(&td, &[(37, 64, 29), (37, 30, 24)], |_, _| false)
}

/// Two mixed bf16 steps (Adam) of an MLP on CUDA, with the optimizer writing the compute copies,
/// against the same steps on the CPU: the first loss within 1e-2 relative, the first step's f32
/// gradients within 2 % of each tensor's largest (bf16 activations rounded on different paths
/// differ by an ulp here and there); after each step the CUDA compute copies are exactly the
/// masters rounded to nearest-even bf16.
fn mixed_step_vs_cpu(_: &Device) -> Outcome {
    use kiln::nn::{Activation as Act, Module, autocast, mlp};
    use kiln::optim::{Adam, Optimizer, attach_compute_copies};
    let td = TDev::Cuda(Device::shared().map_err(err)?);
    let (batch, features, width, classes) = (37usize, 24usize, 40usize, 7usize);
    let (mut rng, seed) = testing::rng();
    eprintln!("seed {seed}");
    let x = Tensor::from_vec(testing::uniform(&mut rng, batch * features), [batch, features]).map_err(err)?;
    let y: Vec<usize> = (0..batch).map(|i| (i * 5 + 3) % classes).collect();
    let run = |dev: &TDev| -> Result<(Vec<f64>, Vec<Vec<f32>>), String> {
        let model = mlp(features, width, 3, classes, Act::Relu, DType::F32, &mut Tensor::rng(seed)).map_err(err)?;
        for p in model.parameters() {
            p.move_to(dev).map_err(err)?;
        }
        let mut opt = Adam::adam(model.named_parameters(), 1e-3, 0.0);
        let copies = attach_compute_copies(&mut opt, DType::BF16).map_err(err)?;
        let on_gpu = matches!(dev, TDev::Cuda(_));
        if copies != if on_gpu { 6 } else { 0 } {
            return Err(format!("{copies} compute copies attached on the {}", dev.name()));
        }
        let xd = x.to_device(dev).map_err(err)?;
        let (mut losses, mut first_grads) = (Vec::new(), Vec::new());
        for step in 0..2 {
            let loss = {
                let _mixed = autocast(DType::BF16).map_err(err)?;
                model.forward(&xd).and_then(|l| l.cross_entropy(&y[..])).map_err(err)?
            };
            loss.backward().map_err(err)?;
            losses.push(loss.item().map_err(err)?);
            if step == 0 {
                first_grads = model
                    .parameters()
                    .iter()
                    .map(|p| p.grad().map(|g| g.to_vec_f32()))
                    .collect::<Option<_>>()
                    .ok_or("a master without a gradient")?;
            }
            opt.step().map_err(err)?;
            opt.zero_grad();
            if on_gpu {
                for p in model.parameters() {
                    let copy = p.compute_copy(DType::BF16).map_err(err)?.to_vec_f32();
                    if copy.iter().map(|v| v.to_bits()).ne(bf16_round(&p.to_vec_f32()).iter().map(|v| v.to_bits())) {
                        return Err(format!("after step {step} a compute copy is not the master rounded to bf16"));
                    }
                }
            }
        }
        Ok((losses, first_grads))
    };
    let (gpu_losses, gpu_grads) = run(&td)?;
    let (cpu_losses, cpu_grads) = run(&TDev::Cpu)?;
    if (gpu_losses[0] - cpu_losses[0]).abs() > 1e-2 * cpu_losses[0].abs() {
        return Err(format!("first loss {} on CUDA, {} on the CPU", gpu_losses[0], cpu_losses[0]));
    }
    for (i, (g, c)) in gpu_grads.iter().zip(&cpu_grads).enumerate() {
        let scale = c.iter().fold(0.0f64, |m, v| m.max(v.abs() as f64));
        let want: Vec<f64> = c.iter().map(|&v| v as f64).collect();
        compare(&format!("parameter {i}'s gradient, CUDA vs CPU"), g, &want, Tol { abs: 0.02 * scale, rel: 0.0 })?;
    }
    Ok(())
}

/// `kiln train --dtype bf16` on CUDA: mixed precision with the optimizer-written copies reaches
/// the main job's 90 % test accuracy in 20 epochs (as `gpu::train_main_job_on_cuda` in f32).
fn train_main_job_bf16(_: &Device) -> Outcome {
    use kiln::train::{DataSource, DeviceChoice, TrainConfig};
    let cfg = TrainConfig {
        data: DataSource::Spirals { per_class: 300, classes: 3, noise: 0.2 },
        epochs: 20,
        dtype: DType::BF16,
        device: DeviceChoice::Cuda,
        checkpoint: None,
        progress: false,
        ..TrainConfig::default()
    };
    let mut lines = Vec::new();
    let report = kiln::train::train(&cfg, |l| {
        eprintln!("{l}");
        lines.push(l.to_string())
    })
    .map_err(err)?;
    if !report.device.starts_with("GPU") {
        return Err(format!("trained on {} instead of the GPU", report.device));
    }
    if !lines.iter().any(|l| l.contains("written by the optimizer")) {
        return Err(format!("no optimizer-written compute copies: {lines:?}"));
    }
    let acc = report.epochs.last().map(|r| r.test_accuracy).unwrap_or(0.0);
    if acc < 0.9 {
        return Err(format!("test accuracy {acc} after 20 epochs of mixed bf16 on the GPU"));
    }
    if kiln::nn::autocast_dtype().is_some() {
        return Err("the training left its autocast scope open on this thread".into());
    }
    Ok(())
}

/// A mixed bf16 training step (autocast forward, cross-entropy, backward, SGD with momentum
/// writing the compute copies, zero_grad) captured into a CUDA graph: one eager step and four
/// replays give exactly the bits (masters and copies) of five eager steps. Odd shapes (the bf16
/// products' packing paths). Where the products run on `wgmma` (sm_90a), the buffers the graph
/// allocates have addresses of the graph's own, so the capture makes tensor maps for them
/// (written outside the graph, kept alive by it): the capture must succeed everywhere.
fn captured_mixed_step(dev: &Device) -> Outcome {
    captured_mixed_case(dev, (24, 16, 40, 7))
}

/// As [`captured_mixed_step`] at shapes whose Linear layers take the fused `wgmma` GEMM on sm_90a
/// (every dimension a multiple of 64), so the captured step makes tensor maps for the graph's
/// own buffers; checks that the capture made (or found) maps there.
fn captured_mixed_step_wgmma_shapes(dev: &Device) -> Outcome {
    let before = dev.tensor_map_cache_stats();
    captured_mixed_case(dev, (256, 128, 192, 64))?;
    let after = dev.tensor_map_cache_stats();
    if wgmma(dev) && after.hits + after.misses == before.hits + before.misses {
        return Err(format!("no tensor map was looked up on sm_90a: {before:?} -> {after:?}"));
    }
    Ok(())
}

/// One eager step plus four replays of a captured step against five eager steps, bit for bit, for
/// an MLP of (batch, features, width, classes).
fn captured_mixed_case(dev: &Device, (batch, features, width, classes): (usize, usize, usize, usize)) -> Outcome {
    use kiln::nn::{Module, autocast, mlp};
    use kiln::optim::{Optimizer, Sgd, attach_compute_copies};
    use kiln::tensor::Targets;
    let td = TDev::Cuda(Device::shared().map_err(err)?);
    let x = Tensor::randn([batch, features], DType::F32, &mut Tensor::rng(11)).to_device(&td).map_err(err)?;
    let targets = Targets::new((0..batch).map(|i| (i * 5) % classes).collect());
    let build = || -> Result<(kiln::nn::Sequential, Sgd), String> {
        let model = mlp(features, width, 3, classes, kiln::nn::Activation::Relu, DType::F32, &mut Tensor::rng(5))
            .map_err(err)?;
        for p in model.parameters() {
            p.move_to(&td).map_err(err)?;
        }
        let mut opt = Sgd::new(model.named_parameters(), 0.05, 0.9, 0.0, false);
        attach_compute_copies(&mut opt, DType::BF16).map_err(err)?;
        Ok((model, opt))
    };
    let step = |model: &kiln::nn::Sequential, opt: &mut Sgd| -> kiln::Result<()> {
        let _mixed = autocast(DType::BF16)?;
        let loss = model.forward(&x)?.cross_entropy(&targets)?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad();
        Ok(())
    };
    let state = |model: &kiln::nn::Sequential| -> Result<Vec<u32>, String> {
        let mut v = Vec::new();
        for p in model.parameters() {
            v.extend(p.to_vec_f32().iter().map(|x| x.to_bits()));
            v.extend(p.compute_copy(DType::BF16).map_err(err)?.to_vec_f32().iter().map(|x| x.to_bits()));
        }
        Ok(v)
    };
    let (eager, mut eager_opt) = build()?;
    for _ in 0..5 {
        step(&eager, &mut eager_opt).map_err(err)?;
    }
    let (replayed, mut opt) = build()?;
    step(&replayed, &mut opt).map_err(err)?; // the warm-up: caches filled, momentum allocated
    let before = state(&replayed)?;
    let graph = dev.capture(|| step(&replayed, &mut opt)).map_err(|e| format!("capturing the mixed step: {e}"))?;
    if state(&replayed)? != before {
        return Err("capturing the step ran it".into());
    }
    for _ in 0..4 {
        // SAFETY: the model, its optimizer state and copies, x and the targets outlive the replays.
        unsafe { graph.launch() }.map_err(err)?;
    }
    dev.synchronize().map_err(err)?;
    if state(&replayed)? != state(&eager)? {
        return Err("one eager mixed step and four replays differ from five eager steps".into());
    }
    Ok(())
}

/// `kiln train --dtype f16 --device cuda`: mixed precision in f16 (f32 masters, f16 copies written
/// by the optimizer) with dynamic loss scaling reaches the main job's target (test accuracy >= 0.9
/// after 20 epochs, as bf16), says so in its log, and leaves no autocast scope open.
fn train_main_job_f16(_: &Device) -> Outcome {
    use kiln::train::{DataSource, DeviceChoice, TrainConfig};
    let cfg = TrainConfig {
        data: DataSource::Spirals { per_class: 300, classes: 3, noise: 0.2 },
        epochs: 20,
        dtype: DType::F16,
        device: DeviceChoice::Cuda,
        checkpoint: None,
        progress: false,
        ..TrainConfig::default()
    };
    let mut lines = Vec::new();
    let report = kiln::train::train(&cfg, |l| {
        eprintln!("{l}");
        lines.push(l.to_string())
    })
    .map_err(err)?;
    if !report.device.starts_with("GPU") {
        return Err(format!("trained on {} instead of the GPU", report.device));
    }
    for want in ["loss scaling", "f16 weight copies written by the optimizer"] {
        if !lines.iter().any(|l| l.contains(want)) {
            return Err(format!("no `{want}` in the log: {lines:?}"));
        }
    }
    let acc = report.epochs.last().map(|r| r.test_accuracy).unwrap_or(0.0);
    if acc < 0.9 {
        return Err(format!("test accuracy {acc} after 20 epochs of mixed f16 on the GPU"));
    }
    if kiln::nn::autocast_dtype().is_some() {
        return Err("the training left its autocast scope open on this thread".into());
    }
    Ok(())
}

/// The fused unscale on CUDA: an SGD step (momentum, weight decay) from the gradients of
/// `scale * loss` through [`kiln::optim::LossScaler::step`] gives the bits of the unscaled step
/// (the scale a power of two; masters and the f16 copies), with and without clipping (clipping
/// against the unscaled norm: within 1e-6 of `clip_grad_norm`'s step); gradients that overflow
/// skip the step (weights unchanged) and halve the scale. Odd parameter sizes.
fn loss_scaled_step(_: &Device) -> Outcome {
    use kiln::optim::{LossScaler, Optimizer, Sgd, attach_compute_copies};
    let td = TDev::Cuda(Device::shared().map_err(err)?);
    let (mut rng, seed) = testing::rng();
    let sizes = [37usize, 1, 130];
    let values: Vec<Vec<f32>> = sizes.iter().map(|&n| testing::uniform(&mut rng, n)).collect();
    let coefs: Vec<Vec<f32>> = sizes.iter().map(|&n| testing::uniform(&mut rng, n)).collect();
    // parameters and an optimizer whose gradients are scale * coefs (the backward of
    // scale * sum(w * coefs)), with f16 compute copies
    let build = |scale: f64, poison: bool| -> Result<(Vec<Tensor>, Sgd), String> {
        let mut params = Vec::new();
        let mut loss: Option<Tensor> = None;
        for (v, c) in values.iter().zip(&coefs) {
            let p = Tensor::from_vec(v.clone(), [v.len()]).and_then(|t| t.to_device(&td)).map_err(err)?;
            p.move_to(&td).map_err(err)?;
            let p = p.requires_grad();
            let mut c = c.clone();
            if poison {
                c[0] = f32::MAX;
            }
            let ct = Tensor::from_vec(c, [v.len()]).and_then(|t| t.to_device(&td)).map_err(err)?;
            let term = p.mul(&ct).and_then(|t| t.sum_all()).map_err(err)?;
            loss = Some(match loss {
                Some(l) => l.add(&term).map_err(err)?,
                None => term,
            });
            params.push(p);
        }
        let loss = loss.expect("three parameters").mul_scalar(scale).map_err(err)?;
        let named = params.iter().enumerate().map(|(i, p)| (format!("p{i}"), p.clone())).collect();
        let mut opt = Sgd::new(named, 0.05, 0.9, 0.01, false);
        attach_compute_copies(&mut opt, DType::F16).map_err(err)?;
        loss.backward().map_err(err)?;
        Ok((params, opt))
    };
    let state = |ps: &[Tensor]| -> Result<Vec<u32>, String> {
        let mut v = Vec::new();
        for p in ps {
            v.extend(p.to_vec_f32().iter().map(|x| x.to_bits()));
            v.extend(p.compute_copy(DType::F16).map_err(err)?.to_vec_f32().iter().map(|x| x.to_bits()));
        }
        Ok(v)
    };
    let what = |s: &str| format!("{s} (seed {seed})");
    // unscaled reference
    let (plain, mut popt) = build(1.0, false)?;
    popt.step().map_err(err)?;
    let mut scaler = LossScaler::new(4096.0, 100).map_err(err)?;
    let (scaled, mut sopt) = build(scaler.scale(), false)?;
    if !scaler.step(&mut sopt, None).map_err(err)? {
        return Err(what("finite scaled gradients were skipped"));
    }
    if state(&scaled)? != state(&plain)? {
        return Err(what("the loss-scaled step differs in bits from the unscaled one"));
    }
    // clipping: against clip_grad_norm's step on the unscaled gradients
    let (clipped, mut copt) = build(1.0, false)?;
    copt.clip_grad_norm(0.25).map_err(err)?;
    copt.step().map_err(err)?;
    let (sc, mut scopt) = build(scaler.scale(), false)?;
    if !scaler.step(&mut scopt, Some(0.25)).map_err(err)? {
        return Err(what("finite scaled gradients were skipped (clipping)"));
    }
    for (a, b) in sc.iter().zip(&clipped) {
        compare(&what("scaled and clipped step"), &a.to_vec_f32(), &b.to_vec_f64(), Tol { abs: 1e-6, rel: 1e-6 })?;
    }
    // an overflow skips the step and halves the scale
    let before = scaler.scale();
    let (over, mut oopt) = build(1e10, true)?;
    let weights = state(&over)?;
    if scaler.step(&mut oopt, None).map_err(err)? {
        return Err(what("overflowing gradients were not skipped"));
    }
    if state(&over)? != weights {
        return Err(what("a skipped step changed the weights or their copies"));
    }
    if scaler.scale() != before / 2.0 || scaler.skipped() != 1 {
        return Err(what(&format!("after the overflow: scale {} skipped {}", scaler.scale(), scaler.skipped())));
    }
    Ok(())
}

/// `kiln train` in f32 on CUDA with its step captured gives the same bits as with `--no-graph`
/// (the case of [`train_graph_bf16`] in f32: each epoch's loss and accuracies, every final
/// parameter). The eager partial batch after replays is what broke it before: its gradients sat
/// where the previous eager step's had, so the optimizer's table, rewritten by each replay, was not
/// patched and the update read the graph's last gradients.
fn train_graph_f32(_: &Device) -> Outcome {
    train_graph_case(DType::F32, SGD_MOMENTUM, 0)
}

/// SGD with momentum 0.9, the captured configuration of the first graph tests.
const SGD_MOMENTUM: kiln::train::OptimizerKind = kiln::train::OptimizerKind::Sgd { momentum: 0.9, nesterov: false };

/// [`train_graph_bf16`] with AdamW (weight decay 0.01) on a 5-step warmup and cosine schedule:
/// the learning rate written to the device before each replay, Adam's step count and bias
/// corrections advanced on the device.
fn train_graph_bf16_adamw(_: &Device) -> Outcome {
    train_graph_case(DType::BF16, kiln::train::OptimizerKind::AdamW, 5)
}

/// As [`train_graph_bf16_adamw`] in f32 with Adam.
fn train_graph_f32_adam(_: &Device) -> Outcome {
    train_graph_case(DType::F32, kiln::train::OptimizerKind::Adam, 5)
}

/// `kiln train` (the library function) on CUDA with its step captured in a CUDA graph gives the
/// same bits as with `--no-graph`, mixed bf16 (f32 masters, optimizer-written bf16 copies): each
/// epoch's loss and accuracies and every final parameter. SGD with momentum at a constant learning
/// rate (the captured configuration), a batch that leaves a partial last batch each epoch (run
/// eagerly), three epochs.
fn train_graph_bf16(_: &Device) -> Outcome {
    train_graph_case(DType::BF16, SGD_MOMENTUM, 0)
}

fn train_graph_case(dtype: DType, optimizer: kiln::train::OptimizerKind, warmup: usize) -> Outcome {
    use kiln::nn::Module;
    use kiln::train::{DataSource, DeviceChoice, OptimizerKind, TrainConfig};
    let run = |graph: bool| {
        let cfg = TrainConfig {
            data: DataSource::Spirals { per_class: 101, classes: 3, noise: 0.2 },
            width: 24,
            depth: 3,
            batch: 37,
            epochs: 3,
            optimizer,
            lr: if matches!(optimizer, OptimizerKind::Sgd { .. }) { 0.05 } else { 0.01 },
            weight_decay: if optimizer == OptimizerKind::AdamW { 0.01 } else { 0.0 },
            warmup,
            dtype,
            device: DeviceChoice::Cuda,
            checkpoint: None,
            progress: false,
            graph,
            ..TrainConfig::default()
        };
        let mut lines = Vec::new();
        let report = kiln::train::train(&cfg, |l| lines.push(l.to_string())).map_err(err)?;
        Ok::<_, String>((report, lines))
    };
    let (eager, _) = run(false)?;
    let (captured, lines) = run(true)?;
    if eager.graph_steps != 0 {
        return Err(format!("--no-graph replayed {} steps", eager.graph_steps));
    }
    if captured.graph_steps == 0 {
        return Err(format!("no step ran as a graph: {lines:?}"));
    }
    if !lines.iter().any(|l| l.starts_with("step graph:")) {
        return Err(format!("no graph line in the summary: {lines:?}"));
    }
    for (a, b) in eager.epochs.iter().zip(&captured.epochs) {
        let same = a.loss.to_bits() == b.loss.to_bits()
            && a.train_accuracy.to_bits() == b.train_accuracy.to_bits()
            && a.test_accuracy.to_bits() == b.test_accuracy.to_bits();
        if !same {
            return Err(format!(
                "{dtype:?} epoch {}: eager loss {} acc {}/{}, graph loss {} acc {}/{}",
                a.epoch, a.loss, a.train_accuracy, a.test_accuracy, b.loss, b.train_accuracy, b.test_accuracy
            ));
        }
    }
    let (pa, pb) = (eager.model.named_parameters(), captured.model.named_parameters());
    for ((name, a), (_, b)) in pa.iter().zip(&pb) {
        let (va, vb) = (a.to_vec_f32(), b.to_vec_f32());
        if let Some(i) = (0..va.len()).find(|&i| va[i].to_bits() != vb[i].to_bits()) {
            return Err(format!("{dtype:?} parameter {name}[{i}]: eager {} graph {}", va[i], vb[i]));
        }
    }
    Ok(())
}
