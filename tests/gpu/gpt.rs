//! The GPT on CUDA against the CPU model: the loss and every parameter's gradient in f32 and under
//! bf16 autocast (odd shapes: vocabulary 37, 3 heads of 16, 11 positions, an untied head); AdamW's
//! parameter groups in the fused optimizer against the CPU step; `kiln`'s GPT training loop on
//! CUDA (f32 against the CPU's loss curve, bf16 learning); the key/value-cached logits and
//! sampling on CUDA. Inputs are fresh random ids (the seed printed); outputs poisoned by the suite.

use crate::common::{Outcome, err};
use crate::{GpuTest, any};
use kiln::cuda::Device;
use kiln::nn::{Gpt, GptConfig, Module, autocast};
use kiln::optim::{Adam, Optimizer};
use kiln::tensor::{DType, Device as TDev, Tensor};
use kiln::testing::{self, relative_l2};
use rand::Rng;

pub(crate) fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest { name: "gpu::gpt::loss_and_gradients_match_cpu_f32", available: any, run: grads_f32 },
        GpuTest { name: "gpu::gpt::loss_and_gradients_match_cpu_bf16", available: any, run: grads_bf16 },
        GpuTest { name: "gpu::gpt::adamw_groups_match_cpu", available: any, run: adamw_groups },
        GpuTest { name: "gpu::gpt::training_steps_on_cuda", available: any, run: training_steps },
        GpuTest { name: "gpu::gpt::kv_cache_and_sampling_on_cuda", available: any, run: cached_sampling },
        GpuTest { name: "gpu::gpt::resume_on_cuda_matches_cpu", available: any, run: resume_matches },
    ]
}

fn config() -> GptConfig {
    GptConfig { vocab: 37, block: 12, width: 48, layers: 2, heads: 3, dropout: 0.0, tie_weights: false, bias: true }
}

/// Random ids and targets: `batch` rows of `t`.
fn ids(batch: usize, t: usize, vocab: usize) -> (Vec<usize>, Vec<usize>) {
    let (mut rng, _) = testing::rng();
    let x = (0..batch * t).map(|_| rng.random_range(0..vocab)).collect();
    let y = (0..batch * t).map(|_| rng.random_range(0..vocab)).collect();
    (x, y)
}

/// The CPU f64 model's loss and gradients, and the CUDA f32 model's (same seed, same ids; `bf16`:
/// the CUDA forward inside a bf16 autocast scope).
#[allow(clippy::type_complexity)]
fn both(bf16: bool) -> Result<(f64, f64, Vec<(String, Vec<f32>, Vec<f64>)>), String> {
    let cfg = config();
    let (x, y) = ids(3, 11, cfg.vocab);
    let cpu = Gpt::new(&cfg, DType::F64, 7).map_err(err)?;
    let want = cpu.loss(&x, &y, 3).map_err(err)?;
    want.backward().map_err(err)?;
    let gpu = Gpt::new(&cfg, DType::F32, 7).map_err(err)?;
    gpu.move_to(&TDev::cuda().map_err(err)?).map_err(err)?;
    let got = {
        let _mixed = if bf16 { Some(autocast(DType::BF16).map_err(err)?) } else { None };
        gpu.loss(&x, &y, 3).map_err(err)?
    };
    got.backward().map_err(err)?;
    let mut grads = Vec::new();
    for ((name, c), (_, g)) in cpu.named_parameters().into_iter().zip(gpu.named_parameters()) {
        let gc = c.grad().ok_or(format!("{name}: no CPU gradient"))?.to_vec_f64();
        let gg = g.grad().ok_or(format!("{name}: no CUDA gradient"))?.to_vec_f32();
        grads.push((name, gg, gc));
    }
    Ok((got.item().map_err(err)?, want.item().map_err(err)?, grads))
}

fn check(bf16: bool, loss_rel: f64, grad_rel: f64) -> Outcome {
    let (got, want, grads) = both(bf16)?;
    if ((got - want) / want).abs() > loss_rel {
        return Err(format!("loss {got} on CUDA, {want} on the CPU (relative tolerance {loss_rel})"));
    }
    for (name, g, c) in grads {
        let e = relative_l2(&g, &c);
        if e.is_nan() || e > grad_rel {
            return Err(format!("{name}: gradient relative L2 error {e:e} (tolerance {grad_rel:e})"));
        }
    }
    Ok(())
}

/// f32 on CUDA against f64 on the CPU: loss within 1e-5, each gradient within 1e-3 (relative L2).
fn grads_f32(_: &Device) -> Outcome {
    check(false, 1e-5, 1e-3)
}

/// bf16 autocast on CUDA against f64 on the CPU: loss within 2%, gradients within 1e-1 (relative
/// L2; bf16 keeps 8 significant bits and the error grows through the blocks' backward).
fn grads_bf16(_: &Device) -> Outcome {
    check(true, 2e-2, 1e-1)
}

/// Three AdamW steps with parameter groups (every other parameter undecayed), random gradients,
/// clipping: the fused CUDA update against the CPU reference, within 1e-5.
fn adamw_groups(_: &Device) -> Outcome {
    let (mut rng, _) = testing::rng();
    let sizes = [5usize, 4096 + 3, 17, 64];
    let decay: Vec<bool> = (0..sizes.len()).map(|i| i % 2 == 0).collect();
    let weights: Vec<Vec<f32>> = sizes.iter().map(|&n| testing::uniform(&mut rng, n)).collect();
    let grads: Vec<Vec<Vec<f32>>> =
        (0..3).map(|_| sizes.iter().map(|&n| testing::uniform(&mut rng, n)).collect()).collect();
    let mut results = Vec::new();
    for dev in [TDev::Cpu, TDev::cuda().map_err(err)?] {
        let params: Vec<(String, Tensor)> = weights
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let t = Tensor::from_vec(w.clone(), [w.len()])?.to_device(&dev)?.requires_grad();
                Ok((format!("p{i}"), t))
            })
            .collect::<kiln::Result<_>>()
            .map_err(err)?;
        let mut opt = Adam::adamw(params.clone(), 1e-2, 0.3);
        opt.set_decay(&decay).map_err(err)?;
        for step in &grads {
            opt.zero_grad();
            for ((_, p), g) in params.iter().zip(step) {
                let g = Tensor::from_vec(g.clone(), [g.len()]).and_then(|g| g.to_device(&dev)).map_err(err)?;
                p.mul(&g).and_then(|l| l.sum_all()).and_then(|l| l.backward()).map_err(err)?;
            }
            opt.clip_grad_norm(5.0).map_err(err)?;
            opt.step().map_err(err)?;
        }
        results.push(params.iter().map(|(_, p)| p.to_vec_f32()).collect::<Vec<_>>());
    }
    for (i, (g, c)) in results[1].iter().zip(&results[0]).enumerate() {
        let want: Vec<f64> = c.iter().map(|&v| v as f64).collect();
        testing::compare(
            &format!("parameter {i} (decay {})", decay[i]),
            g,
            &want,
            testing::Tol { abs: 1e-5, rel: 1e-5 },
        )?;
    }
    Ok(())
}

/// A text of the CLI tests' kind, in a fresh temporary file.
pub(crate) fn text_file(name: &str) -> Result<std::path::PathBuf, String> {
    let d = std::env::temp_dir().join(format!("kiln-gpu-gpt-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
    let p = d.join("text.txt");
    let s: String = (0..300)
        .map(|i| {
            format!(
                "the {} {} the {}. ",
                ["cat", "dog", "fox"][i % 3],
                ["sees", "likes"][i % 2],
                ["bird", "cat"][i % 5 % 2]
            )
        })
        .collect();
    std::fs::write(&p, s).map_err(|e| e.to_string())?;
    Ok(p)
}

/// `train_gpt` on CUDA: in f32 its first 5 losses match the CPU run's within 1e-3 (relative),
/// and both f32 and bf16 runs of 40 steps lower the loss by a third.
fn training_steps(_: &Device) -> Outcome {
    use kiln::train::DeviceChoice;
    use kiln::train::gpt::{GptSpec, GptTrainConfig, train_gpt};
    let data = text_file("train")?;
    let base = GptTrainConfig {
        data: data.clone(),
        tokens: kiln::corpus::TokenKind::Chars,
        spec: GptSpec { block: Some(24), width: Some(48), heads: Some(3), ..GptSpec::default() },
        steps: 40,
        batch: 8,
        lr: 3e-3,
        warmup: 5,
        eval_every: 20,
        checkpoint: None,
        ..GptTrainConfig::default()
    };
    let run = |dtype: DType, device: DeviceChoice, steps: usize| {
        train_gpt(&GptTrainConfig { dtype, device, steps, ..base.clone() }, |_| {}).map_err(err)
    };
    let cpu = run(DType::F32, DeviceChoice::Cpu, 5)?;
    let gpu = run(DType::F32, DeviceChoice::Cuda, 40)?;
    for ((s, c), (_, g)) in cpu.train_losses.iter().zip(&gpu.train_losses) {
        if ((g - c) / c).abs() > 1e-3 {
            return Err(format!("step {s}: loss {g} on CUDA, {c} on the CPU"));
        }
    }
    let bf = run(DType::BF16, DeviceChoice::Cuda, 40)?;
    for (what, r) in [("f32", &gpu), ("bf16", &bf)] {
        let first = r.train_losses[0].1;
        let last = r.train_losses.last().ok_or("no steps")?.1;
        if last.is_nan() || last >= first * 2.0 / 3.0 {
            return Err(format!("{what}: loss {first} at step 1, {last} at step 40"));
        }
    }
    let _ = std::fs::remove_dir_all(data.parent().ok_or("a folder")?);
    Ok(())
}

/// Prefill and one-token steps through the cache on CUDA give the CPU model's full-forward logits
/// (f32: within 1e-4 relative L2), and `sample` runs on CUDA from a checkpoint.
fn cached_sampling(_: &Device) -> Outcome {
    let cfg = config();
    let (x, _) = ids(1, 11, cfg.vocab);
    let cpu = Gpt::new(&cfg, DType::F64, 3).map_err(err)?;
    let want = cpu.logits(&x, 1).map_err(err)?.to_vec_f64();
    let gpu = Gpt::new(&cfg, DType::F32, 3).map_err(err)?;
    gpu.move_to(&TDev::cuda().map_err(err)?).map_err(err)?;
    let _g = kiln::tensor::no_grad();
    let mut cache = gpu.cache();
    let mut got = gpu.logits_cached(&x[..4], 1, &mut cache).map_err(err)?.to_vec_f32();
    for &t in &x[4..] {
        got.extend(gpu.logits_cached(&[t], 1, &mut cache).map_err(err)?.to_vec_f32());
    }
    let e = relative_l2(&got, &want);
    if e.is_nan() || e > 1e-4 {
        return Err(format!("cached CUDA logits: relative L2 error {e:e} against the CPU's full forward"));
    }
    drop(_g);
    use kiln::train::DeviceChoice;
    use kiln::train::gpt::{GptSpec, GptTrainConfig, SampleConfig, sample, train_gpt};
    let data = text_file("sample")?;
    let ckpt = data.with_file_name("m.safetensors");
    let train = GptTrainConfig {
        data: data.clone(),
        tokens: kiln::corpus::TokenKind::Chars,
        spec: GptSpec { block: Some(16), ..GptSpec::default() },
        steps: 5,
        batch: 4,
        device: DeviceChoice::Cuda,
        checkpoint: Some(ckpt.clone()),
        ..GptTrainConfig::default()
    };
    train_gpt(&train, |_| {}).map_err(err)?;
    let text = sample(&SampleConfig {
        checkpoint: ckpt,
        prompt: "the ".into(),
        tokens: 40,
        temperature: 0.8,
        top_k: Some(5),
        seed: 1,
        device: DeviceChoice::Cuda,
    })
    .map_err(err)?;
    if !text.starts_with("the ") || text.chars().count() != 44 {
        return Err(format!("sampled {text:?}: the prompt and 40 characters expected"));
    }
    let _ = std::fs::remove_dir_all(data.parent().ok_or("a folder")?);
    Ok(())
}

/// A run resumed on CUDA continues from the saved AdamW moments: 3 steps on CUDA saved, then one
/// more step resumed on CUDA and, from the same checkpoint, on the CPU; the parameters agree
/// within 1e-4 (relative L2; a resume that dropped the moments would move them by about lr).
fn resume_matches(_: &Device) -> Outcome {
    use kiln::train::DeviceChoice;
    use kiln::train::gpt::{GptSpec, GptTrainConfig, load_gpt, train_gpt};
    let data = text_file("resume")?;
    let dir = data.parent().ok_or("a folder")?.to_path_buf();
    let base = GptTrainConfig {
        data: data.clone(),
        tokens: kiln::corpus::TokenKind::Chars,
        spec: GptSpec { block: Some(16), ..GptSpec::default() },
        steps: 3,
        batch: 4,
        warmup: 2,
        eval_every: 0,
        device: DeviceChoice::Cuda,
        checkpoint: Some(dir.join("a.safetensors")),
        ..GptTrainConfig::default()
    };
    train_gpt(&base, |_| {}).map_err(err)?;
    for (dev, out) in [(DeviceChoice::Cuda, "b.safetensors"), (DeviceChoice::Cpu, "c.safetensors")] {
        let cfg = GptTrainConfig {
            steps: 4,
            device: dev,
            resume: Some(dir.join("a.safetensors")),
            checkpoint: Some(dir.join(out)),
            ..base.clone()
        };
        train_gpt(&cfg, |_| {}).map_err(err)?;
    }
    let (b, _) = load_gpt(&dir.join("b.safetensors")).map_err(err)?;
    let (c, _) = load_gpt(&dir.join("c.safetensors")).map_err(err)?;
    let (a, _) = load_gpt(&dir.join("a.safetensors")).map_err(err)?;
    for (((name, pb), (_, pc)), (_, pa)) in
        b.named_parameters().iter().zip(c.named_parameters()).zip(a.named_parameters())
    {
        let want = pc.to_vec_f64();
        let e = relative_l2(&pb.to_vec_f32(), &want);
        if e.is_nan() || e > 1e-4 {
            let moved = relative_l2(&pa.to_vec_f32(), &want);
            return Err(format!(
                "{name}: resumed on CUDA vs the CPU: relative L2 {e:e} (the step itself moved it {moved:e})"
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
