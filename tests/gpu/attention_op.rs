//! The attention tensor op on CUDA: `Tensor::scaled_dot_product_attention` forward and backward
//! (through `backward()` of a loss) against the f64 reference, with the cases the CPU runs
//! (`tests/attention_cases.rs`): bf16 on the flash path (lengths 1, 17, 129, 1000; head dims 64
//! and 128; causal and not; crossed lengths; grouped heads; q a permuted view), f16 (flash forward;
//! the backward on the flash kernels where one takes f16, else the naive path), f32 and odd head
//! dims on the naive path, the same bits on a repeat, typed refusals. Tolerances are
//! `attention_cases::tols` (stated there: bf16 output 2e-2 abs + 2e-2 rel, gradients 3e-2
//! relative L2; f32 2e-5 + 1e-4 rel, 1e-4).

use crate::GpuTest;
use crate::any;
use crate::attention_cases::{self as cases, Case, Path};
use crate::common::{Outcome, err};
use kiln::cuda::Device;
use kiln::tensor::{DType, Device as TDevice, Tensor};

pub(crate) fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest { name: "gpu::attention_op::bf16_flash_matches_f64", available: any, run: bf16_flash },
        GpuTest { name: "gpu::attention_op::f16_matches_f64", available: any, run: f16 },
        GpuTest { name: "gpu::attention_op::f32_naive_matches_f64", available: any, run: f32_naive },
        GpuTest { name: "gpu::attention_op::odd_head_dims_run_naive", available: any, run: odd_head_dims },
        GpuTest { name: "gpu::attention_op::same_bits_on_repeat", available: any, run: same_bits },
        GpuTest { name: "gpu::attention_op::refusals", available: any, run: refusals },
        GpuTest { name: "gpu::attention_op::naive_command_runs", available: any, run: naive_command },
    ]
}

fn cuda() -> Result<TDevice, String> {
    TDevice::cuda().map_err(err)
}

/// The path the op took for `c` in `dtype` with gradients: the name of the op that recorded the
/// output ("attention" for flash; the naive path ends in "matmul").
fn path_taken(c: &Case, dtype: DType, dev: &TDevice) -> Result<&'static str, String> {
    let t = |h: usize, s: usize| Tensor::zeros([c.b, h, s, c.d], dtype).to_device(dev).map(|t| t.requires_grad());
    let (q, k) = (t(c.h, c.sq).map_err(err)?, t(c.hkv, c.skv).map_err(err)?);
    let out = q.scaled_dot_product_attention(&k, &k, c.causal, None).map_err(err)?;
    out.op_name().ok_or_else(|| "the op recorded nothing".into())
}

fn bf16_flash(_: &Device) -> Outcome {
    let dev = cuda()?;
    let cases = cases::gpu_cases();
    for c in &cases {
        let p = path_taken(c, DType::BF16, &dev)?;
        if p != "attention" {
            return Err(format!("{c:?}: bf16 took the {p} path, expected the flash op"));
        }
    }
    cases::cases_match_reference(&dev, DType::BF16, Path::Op, &cases)
}

fn f16(_: &Device) -> Outcome {
    let dev = cuda()?;
    let cases: Vec<Case> = cases::gpu_cases().into_iter().filter(|c| c.sq.max(c.skv) <= 129).collect();
    cases::cases_match_reference(&dev, DType::F16, Path::Op, &cases)?;
    // without a gradient the forward runs on the flash kernel
    let _g = kiln::tensor::no_grad();
    for (i, c) in cases::gpu_cases().iter().enumerate() {
        let ins = cases::inputs(c, DType::F16, 500 + i as u64);
        let want = cases::reference(c, &ins);
        let t = |v: &[f64], h: usize, s: usize| {
            Tensor::from_f64(v, [c.b, h, s, c.d], DType::F16).and_then(|t| t.to_device(&dev)).map_err(err)
        };
        let (q, k, v) = (t(&ins[0], c.h, c.sq)?, t(&ins[1], c.hkv, c.skv)?, t(&ins[2], c.hkv, c.skv)?);
        let scale = Some((1.0 / (c.d as f64).sqrt()) as f32 as f64);
        let got = q.scaled_dot_product_attention(&k, &v, c.causal, scale).map_err(err)?.to_vec_f32();
        kiln::testing::compare(&format!("f16 no-grad {c:?}"), &got, &want.out, cases::F16.out)?;
    }
    Ok(())
}

fn f32_naive(_: &Device) -> Outcome {
    let dev = cuda()?;
    let cases: Vec<Case> = cases::gpu_cases().into_iter().filter(|c| c.sq.max(c.skv) <= 129).collect();
    let p = path_taken(&cases[0], DType::F32, &dev)?;
    if p == "attention" {
        return Err("f32 took the flash op; the op runs f32 on the naive path".into());
    }
    cases::cases_match_reference(&dev, DType::F32, Path::Op, &cases)?;
    cases::cases_match_reference(&dev, DType::F32, Path::Naive, &cases::odd_head_dim_cases())
}

fn odd_head_dims(_: &Device) -> Outcome {
    let dev = cuda()?;
    for c in cases::odd_head_dim_cases() {
        let p = path_taken(&c, DType::BF16, &dev)?;
        if p == "attention" {
            return Err(format!("{c:?}: head dim {} took the flash op", c.d));
        }
    }
    cases::cases_match_reference(&dev, DType::BF16, Path::Op, &cases::odd_head_dim_cases())
}

fn same_bits(_: &Device) -> Outcome {
    let dev = cuda()?;
    let c = Case { b: 2, h: 4, hkv: 2, sq: 129, skv: 1000, d: 64, causal: true, q_view: true };
    let ins = cases::inputs(&c, DType::BF16, 77);
    let a = cases::run(&c, DType::BF16, &dev, Path::Op, &ins)?;
    let b = cases::run(&c, DType::BF16, &dev, Path::Op, &ins)?;
    for (name, x, y) in [("out", &a.out, &b.out), ("dq", &a.dq, &b.dq), ("dk", &a.dk, &b.dk), ("dv", &a.dv, &b.dv)] {
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<u64>>();
        if bits(x) != bits(y) {
            let i = x.iter().zip(y.iter()).position(|(p, q)| p.to_bits() != q.to_bits()).unwrap_or(0);
            return Err(format!("{name} differs on a repeat at {i}: {:e} then {:e}", x[i], y[i]));
        }
    }
    Ok(())
}

fn refusals(_: &Device) -> Outcome {
    let dev = cuda()?;
    cases::refusals(&dev)?;
    let q = Tensor::zeros([1, 2, 3, 64], DType::F32);
    let k = q.to_device(&dev).map_err(err)?;
    match q.scaled_dot_product_attention(&k, &k, false, None) {
        Err(e) if e.to_string().contains("cuda") => Ok(()),
        Err(e) => Err(format!("the device refusal does not name the devices: {e}")),
        Ok(_) => Err("q on the CPU with k on CUDA was accepted".into()),
    }
}

/// `kiln attention --kernel naive` / `naive_bf16`'s runner: within its bound at odd lengths, both
/// masks, a head dim the flash kernels do not take.
fn naive_command(_: &Device) -> Outcome {
    use kiln::cuda::attention::AttentionShape;
    for &(name, _) in kiln::tools::attention::NAIVE_KERNELS {
        for (s, causal) in [
            (AttentionShape { batch: 1, heads: 2, q_len: 129, kv_len: 17, head_dim: 64 }, true),
            (AttentionShape { batch: 2, heads: 2, q_len: 17, kv_len: 1000, head_dim: 96 }, false),
        ] {
            let r = kiln::tools::attention::run_naive(name, s, causal, 2, 7).map_err(err)?;
            if !r.passed() || !(r.ms > 0.0) {
                return Err(format!("{r}"));
            }
        }
    }
    Ok(())
}
