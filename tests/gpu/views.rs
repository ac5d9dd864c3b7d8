//! Views and batched products on CUDA against the CPU reference in f64: views of every kind
//! (permute, transpose, narrow, split, chunk, reshape of views, views of views) feeding elementwise
//! ops, reductions, softmax and matmul, `cat` and the narrow gradient (the scatter kernel),
//! `contiguous` (the strided copy at an offset), transposed 2-D views read by the GEMM in place
//! (bit-identical to `matmul_t`, which reads its weight in place), batched matmul with broadcast
//! batches, attention's head split and merge, and the typed refusal of a view the 4-dimension
//! kernels cannot take. Fresh random inputs (the seed is printed; `KILN_SEED` replays it), odd
//! shapes, outputs poisoned by the suite (`KILN_POISON=1`), forward and gradients.

use crate::common::{Outcome, bits, err};
use crate::{GpuTest, any};
use kiln::cuda::Device;
use kiln::tensor::{DType, Device as TensorDevice, Tensor};
use kiln::testing::{self, Tol};

/// This family's tests, in the order the suite lists them.
pub(crate) fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest { name: "gpu::views::views_feed_elementwise_and_reductions", available: any, run: views_feed_ops },
        GpuTest { name: "gpu::views::cat_narrow_and_contiguous", available: any, run: cat_narrow_contiguous },
        GpuTest { name: "gpu::views::transposed_views_to_the_gemm_in_place", available: any, run: transposed_gemm },
        GpuTest { name: "gpu::views::batched_matmul_broadcast_batches", available: any, run: batched_matmul },
        GpuTest { name: "gpu::views::batched_b16_products_both_sides_batched", available: any, run: batched_b16 },
        GpuTest { name: "gpu::views::attention_head_split_and_merge", available: any, run: attention_heads },
        GpuTest { name: "gpu::views::refusals_are_typed", available: any, run: refusals },
    ]
}

type Graph = fn(&[Tensor]) -> kiln::Result<Tensor>;

const ELEMENTWISE: Tol = Tol { abs: 1e-5, rel: 1e-4 };
const PRODUCTS: Tol = Tol { abs: 1e-4, rel: 1e-4 };

fn cuda() -> Result<TensorDevice, String> {
    Ok(TensorDevice::Cuda(Device::shared().map_err(err)?))
}

/// Runs each graph on random inputs of its shapes, on the CPU in f64 and on CUDA in f32, through a
/// weighted sum; compares the forward and every input's gradient within `tol`.
fn graphs_match(family: &str, cases: &[(&str, Vec<Vec<usize>>, Graph)], tol: Tol) -> Outcome {
    let dev = cuda()?;
    let (mut rng, seed) = testing::rng();
    eprintln!("{family}: seed {seed}");
    for (name, shapes, f) in cases {
        let what = |part: &str| format!("{family}/{name}: {part} (seed {seed})");
        let (mut cpu, mut gpu) = (vec![], vec![]);
        for s in shapes {
            let v: Vec<f64> = testing::uniform(&mut rng, s.iter().product()).into_iter().map(f64::from).collect();
            cpu.push(Tensor::from_f64(&v, s.clone(), DType::F64).map_err(err)?.requires_grad());
            let g = Tensor::from_f64(&v, s.clone(), DType::F32).map_err(err)?.to_device(&dev).map_err(err)?;
            gpu.push(g.detach().requires_grad());
        }
        let oc = f(&cpu).map_err(|e| what(&e.to_string()))?;
        let og = f(&gpu).map_err(|e| what(&e.to_string()))?;
        if og.device() != dev {
            return Err(what("the output left the device"));
        }
        if og.dims() != oc.dims() {
            return Err(what(&format!("shape {} on CUDA, {} on the CPU", og.shape(), oc.shape())));
        }
        testing::compare(&what("forward"), &og.to_vec_f32(), &oc.to_vec_f64(), tol)?;
        let w: Vec<f64> =
            testing::uniform(&mut rng, oc.elem_count()).into_iter().map(|x| 1.0 + 0.5 * f64::from(x)).collect();
        let wc = Tensor::from_f64(&w, oc.shape().clone(), DType::F64).map_err(err)?;
        let wg = Tensor::from_f64(&w, oc.shape().clone(), DType::F32).map_err(err)?.to_device(&dev).map_err(err)?;
        oc.mul(&wc).and_then(|t| t.sum_all()).and_then(|t| t.backward()).map_err(|e| what(&e.to_string()))?;
        og.mul(&wg).and_then(|t| t.sum_all()).and_then(|t| t.backward()).map_err(|e| what(&e.to_string()))?;
        for (j, (c, g)) in cpu.iter().zip(&gpu).enumerate() {
            let gc = c.grad().map(|t| t.to_vec_f64()).unwrap_or_else(|| vec![0.0; c.elem_count()]);
            let gg = match g.grad() {
                Some(t) if t.device() != dev => {
                    return Err(what(&format!("the gradient of input {j} left the device")));
                }
                Some(t) => t.to_vec_f32(),
                None => vec![0.0; g.elem_count()],
            };
            testing::compare(&what(&format!("gradient of input {j}")), &gg, &gc, tol)?;
        }
    }
    Ok(())
}

/// Views of every kind into elementwise ops (flat and broadcast), reductions, max, softmax and
/// layer norm, forward and backward.
fn views_feed_ops(_: &Device) -> Outcome {
    let cases: Vec<(&str, Vec<Vec<usize>>, Graph)> = vec![
        ("permute * permute", vec![vec![3, 5, 7]], |x| {
            x[0].permute(&[2, 0, 1])?.mul(&x[0].permute(&[2, 0, 1])?.exp()?)
        }),
        ("transpose + broadcast row", vec![vec![5, 9], vec![5]], |x| x[0].transpose(0, 1)?.add(&x[1])),
        ("narrow - narrow", vec![vec![4, 11, 3]], |x| x[0].narrow(1, 0, 5)?.sub(&x[0].narrow(1, 6, 5)?)?.tanh()),
        ("view of a view", vec![vec![6, 5, 7]], |x| {
            x[0].narrow(0, 1, 4)?.transpose(1, 2)?.narrow(2, 2, 3)?.permute(&[2, 0, 1])?.sigmoid()
        }),
        ("split and chunk", vec![vec![7, 10]], |x| {
            let rows = x[0].split(3, 0)?; // 3, 3, 1
            let cols = x[0].chunk(3, 1)?; // 4, 4, 2
            rows[1].mul(&rows[0])?.sum_dim(0, true)?.add(&cols[2].sum_dim(1, true)?.narrow(0, 0, 1)?)
        }),
        ("reshape of a transpose", vec![vec![6, 10]], |x| x[0].transpose(0, 1)?.reshape([4, 15])?.relu()),
        ("sum over view dims", vec![vec![5, 6, 7]], |x| x[0].permute(&[1, 2, 0])?.narrow(1, 2, 4)?.sum_dim(0, false)),
        ("sum_all of a narrow", vec![vec![9, 13]], |x| x[0].narrow(1, 3, 7)?.sum_all()),
        ("max and softmax of views", vec![vec![4, 6, 5]], |x| {
            let m = x[0].transpose(0, 2)?.max_dim(1, false)?; // [5, 4]
            m.add(&x[0].permute(&[2, 0, 1])?.softmax()?.sum_dim(2, false)?)
        }),
        ("layer norm of a transpose", vec![vec![9, 5], vec![5], vec![5]], |x| {
            x[0].transpose(0, 1)?.transpose(0, 1)?.narrow(0, 2, 5)?.layer_norm(&x[1], &x[2], 1e-5)
        }),
    ];
    graphs_match("views into ops", &cases, ELEMENTWISE)
}

/// `cat` of views (one scatter launch per input), the narrow gradient (zeros and one scatter),
/// and `contiguous` of views at an offset (one strided copy).
fn cat_narrow_contiguous(_: &Device) -> Outcome {
    let cases: Vec<(&str, Vec<Vec<usize>>, Graph)> = vec![
        ("cat rows", vec![vec![3, 7], vec![5, 7], vec![1, 7]], |x| Tensor::cat(&[&x[0], &x[1], &x[2]], 0)),
        ("cat of views along the middle", vec![vec![2, 3, 5], vec![2, 5, 4]], |x| {
            let t = x[1].transpose(1, 2)?; // [2, 4, 5]
            Tensor::cat(&[&x[0], &t.narrow(1, 1, 3)?, &x[0].narrow(1, 2, 0)?, &t], 1)?.exp()
        }),
        ("cat columns then narrow", vec![vec![6, 3], vec![6, 9]], |x| {
            Tensor::cat(&[&x[0], &x[1]], -1)?.narrow(1, 2, 7)?.mul_scalar(2.0)
        }),
        ("narrow gradient", vec![vec![5, 9, 3]], |x| {
            x[0].narrow(1, 4, 3)?.narrow(0, 1, 3)?.mul(&x[0].narrow(1, 0, 3)?.narrow(0, 0, 3)?)
        }),
        ("contiguous at an offset", vec![vec![7, 6]], |x| {
            x[0].narrow(0, 3, 4)?.transpose(0, 1)?.contiguous()?.log_softmax()
        }),
        ("contiguous of a permute", vec![vec![3, 4, 5, 2]], |x| {
            x[0].permute(&[3, 1, 0, 2])?.contiguous()?.reshape([8, 15])?.tanh()
        }),
    ];
    graphs_match("cat, narrow, contiguous", &cases, ELEMENTWISE)
}

/// Products of transposed 2-D views: the view `w^T` of a contiguous (n x k) `w` goes to the GEMM's
/// NT layout in place, bit-identical to `matmul_t(w)` (which reads `w` in place the same way, or
/// multiplies the same transposed copy where the rows are not 16-byte multiples); `a^T` (TN) and
/// both transposed; forward and gradients against the CPU, at aligned and odd shapes.
fn transposed_gemm(_: &Device) -> Outcome {
    let dev = cuda()?;
    let (mut rng, seed) = testing::rng();
    for &(m, k, n) in &[(64, 32, 48), (37, 20, 52), (33, 17, 29), (128, 64, 96), (5, 3, 7)] {
        let what = |s: &str| format!("({m}, {k}, {n}): {s} (seed {seed})");
        let up = |shape: [usize; 2], rng: &mut rand::rngs::StdRng| -> Result<Tensor, String> {
            let v = testing::uniform(rng, shape[0] * shape[1]);
            Tensor::from_vec(v, shape).and_then(|t| t.to_device(&dev)).map_err(err)
        };
        let (a, w) = (up([m, k], &mut rng)?, up([n, k], &mut rng)?);
        let via_view = a.matmul(&w.transpose(0, 1).map_err(err)?).map_err(err)?;
        let via_matmul_t = a.matmul_t(&w).map_err(err)?;
        if bits(&via_view.to_vec_f32()) != bits(&via_matmul_t.to_vec_f32()) {
            return Err(what("a.matmul(w^T view) differs in bits from a.matmul_t(w)"));
        }
    }
    let cases: Vec<(&str, Vec<Vec<usize>>, Graph)> = vec![
        ("a w^T aligned", vec![vec![64, 32], vec![48, 32]], |x| x[0].matmul(&x[1].transpose(0, 1)?)),
        ("a^T b aligned", vec![vec![32, 64], vec![32, 48]], |x| x[0].transpose(0, 1)?.matmul(&x[1])),
        ("a^T w^T aligned", vec![vec![32, 64], vec![48, 32]], |x| x[0].transpose(0, 1)?.matmul(&x[1].transpose(0, 1)?)),
        ("a w^T odd", vec![vec![37, 19], vec![23, 19]], |x| x[0].matmul(&x[1].transpose(0, 1)?)),
        ("a^T b odd", vec![vec![19, 37], vec![19, 23]], |x| x[0].transpose(0, 1)?.matmul(&x[1])),
        ("3-D a times a transposed view", vec![vec![3, 16, 32], vec![24, 32]], |x| x[0].matmul(&x[1].transpose(0, 1)?)),
        ("narrowed columns (copied)", vec![vec![20, 40], vec![40, 12]], |x| {
            x[0].narrow(1, 8, 24)?.matmul(&x[1].narrow(0, 3, 24)?)
        }),
    ];
    graphs_match("transposed views to the GEMM", &cases, PRODUCTS)
}

/// Batched matmul with broadcast batch dimensions and 1-D operands, forward and backward (the
/// broadcast batches' gradients summed back), odd shapes.
fn batched_matmul(_: &Device) -> Outcome {
    let cases: Vec<(&str, Vec<Vec<usize>>, Graph)> = vec![
        ("bmm", vec![vec![5, 7, 13], vec![5, 13, 9]], |x| x[0].matmul(&x[1])),
        ("bmm shared b", vec![vec![3, 7, 13], vec![13, 9]], |x| x[0].matmul(&x[1])),
        ("bmm shared a", vec![vec![7, 13], vec![3, 13, 9]], |x| x[0].matmul(&x[1])),
        ("broadcast batches", vec![vec![2, 1, 7, 11], vec![3, 11, 5]], |x| x[0].matmul(&x[1])),
        ("broadcast both", vec![vec![2, 1, 6, 11], vec![1, 3, 11, 5]], |x| x[0].matmul(&x[1])),
        ("(1, k, n) right", vec![vec![4, 6, 10], vec![1, 10, 3]], |x| x[0].matmul(&x[1])),
        ("vector @ batch", vec![vec![10], vec![4, 10, 3]], |x| x[0].matmul(&x[1])),
        ("batch @ vector", vec![vec![4, 6, 10], vec![10]], |x| x[0].matmul(&x[1])),
        ("batched transposed views", vec![vec![3, 9, 6], vec![3, 5, 9]], |x| {
            x[0].transpose(1, 2)?.matmul(&x[1].transpose(-1, -2)?)
        }),
    ];
    graphs_match("batched matmul", &cases, PRODUCTS)
}

/// bf16 and f16 products with both sides batched (bf16 on sm_90a: the strided-batch `wgmma`
/// kernel; f16 and other devices: the widened f32 path), forward and both gradients, against the
/// CPU in f64 on the same 16-bit inputs: odd shapes (k not a multiple of 8: the padded rows),
/// aligned shapes, 4-D and broadcast leading dimensions, transposed views on either side (a right
/// operand `k.transpose(-1, -2)` read in place), a shared 2-D right operand. Each output, and each
/// gradient element, is rounded once or twice to the dtype after an f32 sum: bf16 within 1.6e-2
/// relative (+2e-3), f16 within 2e-3 relative (+2e-4).
fn batched_b16(_: &Device) -> Outcome {
    let cases: Vec<(&str, Vec<Vec<usize>>, Graph)> = vec![
        ("bmm odd", vec![vec![5, 7, 13], vec![5, 13, 9]], |x| x[0].matmul(&x[1])),
        ("bmm aligned", vec![vec![3, 64, 48], vec![3, 48, 40]], |x| x[0].matmul(&x[1])),
        ("bmm tall", vec![vec![2, 300, 24], vec![2, 24, 136]], |x| x[0].matmul(&x[1])),
        ("4-D", vec![vec![2, 3, 9, 16], vec![2, 3, 16, 11]], |x| x[0].matmul(&x[1])),
        ("broadcast batches", vec![vec![2, 1, 7, 11], vec![3, 11, 5]], |x| x[0].matmul(&x[1])),
        ("q k^T (in place)", vec![vec![4, 17, 24], vec![4, 19, 24]], |x| x[0].matmul(&x[1].transpose(-1, -2)?)),
        ("q k^T odd k", vec![vec![3, 10, 7], vec![3, 12, 7]], |x| x[0].matmul(&x[1].transpose(-1, -2)?)),
        ("a^T b^T", vec![vec![3, 9, 6], vec![3, 5, 9]], |x| x[0].transpose(1, 2)?.matmul(&x[1].transpose(-1, -2)?)),
        ("a^T b", vec![vec![2, 3, 16, 8], vec![2, 3, 16, 8]], |x| x[0].transpose(-1, -2)?.matmul(&x[1])),
        ("shared b", vec![vec![3, 7, 13], vec![13, 9]], |x| x[0].matmul(&x[1])),
    ];
    let bf16 = Tol { abs: 2e-3, rel: 1.6e-2 };
    let f16 = Tol { abs: 2e-4, rel: 2e-3 };
    for (dt, tol) in [(DType::BF16, bf16), (DType::F16, f16)] {
        graphs_match_16(&format!("batched {dt:?}"), &cases, dt, tol, true)?;
    }
    Ok(())
}

/// [`graphs_match`] for 16-bit CUDA tensors: inputs and the loss weights rounded to `dt` first
/// (so the CPU's f64 reference sees the same values), outputs and gradients checked to stay `dt`.
///
/// `products`: every case is a product of its inputs (multilinear). Then the gradient of an input
/// broadcast over several batches, a sum of per-batch gradients each rounded to `dt`, is held to
/// `tol.abs + tol.rel * L1` per element, where `L1` is the sum of the magnitudes of its terms (the
/// same graph's gradient on `|inputs|` and `|weights|`): the rounding of each term, not of the
/// (possibly much smaller) sum, is what bounds it.
fn graphs_match_16(
    family: &str,
    cases: &[(&str, Vec<Vec<usize>>, Graph)],
    dt: DType,
    tol: Tol,
    products: bool,
) -> Outcome {
    let dev = cuda()?;
    let (mut rng, seed) = testing::rng();
    eprintln!("{family}: seed {seed}");
    let rounded = |v: Vec<f64>, s: &[usize]| -> Result<Vec<f64>, String> {
        Ok(Tensor::from_f64(&v, s.to_vec(), dt).map_err(err)?.to_vec_f64())
    };
    for (name, shapes, f) in cases {
        let what = |part: &str| format!("{family}/{name}: {part} (seed {seed})");
        let (mut cpu, mut gpu) = (vec![], vec![]);
        for s in shapes {
            let v: Vec<f64> = testing::uniform(&mut rng, s.iter().product()).into_iter().map(f64::from).collect();
            let v = rounded(v, s)?;
            cpu.push(Tensor::from_f64(&v, s.clone(), DType::F64).map_err(err)?.requires_grad());
            let g = Tensor::from_f64(&v, s.clone(), dt).map_err(err)?.to_device(&dev).map_err(err)?;
            gpu.push(g.detach().requires_grad());
        }
        let oc = f(&cpu).map_err(|e| what(&e.to_string()))?;
        let og = f(&gpu).map_err(|e| what(&e.to_string()))?;
        if og.device() != dev || og.dtype() != dt || og.dims() != oc.dims() {
            return Err(what(&format!(
                "{} {:?} on {:?}, expected {} {dt:?} on CUDA",
                og.shape(),
                og.dtype(),
                og.device(),
                oc.shape()
            )));
        }
        testing::compare(&what("forward"), &og.to_vec_f32(), &oc.to_vec_f64(), tol)?;
        let w: Vec<f64> =
            testing::uniform(&mut rng, oc.elem_count()).into_iter().map(|x| 1.0 + 0.5 * f64::from(x)).collect();
        let w = rounded(w, oc.dims())?;
        let wc = Tensor::from_f64(&w, oc.shape().clone(), DType::F64).map_err(err)?;
        let wg = Tensor::from_f64(&w, oc.shape().clone(), dt).map_err(err)?.to_device(&dev).map_err(err)?;
        oc.mul(&wc).and_then(|t| t.sum_all()).and_then(|t| t.backward()).map_err(|e| what(&e.to_string()))?;
        og.mul(&wg).and_then(|t| t.sum_all()).and_then(|t| t.backward()).map_err(|e| what(&e.to_string()))?;
        // the magnitudes of each gradient element's terms (products only; see the doc)
        let l1 = if products {
            let abs: Vec<Tensor> = cpu
                .iter()
                .map(|c| {
                    let v: Vec<f64> = c.to_vec_f64().iter().map(|x| x.abs()).collect();
                    Tensor::from_f64(&v, c.shape().clone(), DType::F64).map(|t| t.requires_grad())
                })
                .collect::<kiln::Result<_>>()
                .map_err(err)?;
            let wa: Vec<f64> = w.iter().map(|x| x.abs()).collect();
            let wa = Tensor::from_f64(&wa, oc.shape().clone(), DType::F64).map_err(err)?;
            f(&abs).and_then(|o| o.mul(&wa)).and_then(|t| t.sum_all()).and_then(|t| t.backward()).map_err(err)?;
            abs.iter().map(|a| a.grad().map(|t| t.to_vec_f64())).collect::<Vec<_>>()
        } else {
            vec![None; cpu.len()]
        };
        let batches = |d: &[usize]| d.iter().rev().skip(2).product::<usize>().max(1);
        for (j, (c, g)) in cpu.iter().zip(&gpu).enumerate() {
            let gc = c.grad().map(|t| t.to_vec_f64()).ok_or_else(|| what(&format!("no CPU gradient {j}")))?;
            let gg = g.grad().ok_or_else(|| what(&format!("no CUDA gradient {j}")))?;
            if gg.device() != dev || gg.dtype() != dt {
                return Err(what(&format!("gradient {j} is {:?} on {:?}", gg.dtype(), gg.device())));
            }
            let label = what(&format!("gradient of input {j}"));
            match &l1[j] {
                Some(l1) if batches(oc.dims()) > batches(c.dims()) => {
                    let got = gg.to_vec_f32();
                    for (i, ((&x, &want), &m)) in got.iter().zip(&gc).zip(l1).enumerate() {
                        let bound = tol.abs + tol.rel * m;
                        if !((x as f64 - want).abs() <= bound) {
                            return Err(format!(
                                "{label}: index {i}: got {x:e}, expected {want:e}, tolerance {bound:e} ({tol:?} on the \
                                 terms' magnitude {m:e}: the input is broadcast over batches)"
                            ));
                        }
                    }
                }
                _ => testing::compare(&label, &gg.to_vec_f32(), &gc, tol)?,
            }
        }
    }
    Ok(())
}

/// `[B, T, H*D] -> [B, H, T, D]` by reshape + permute (views), `softmax(q k^T / sqrt(D)) v` as
/// batched products, the merge back to `[B, T, H*D]` (one contiguous copy), then a projection.
fn attention_heads(_: &Device) -> Outcome {
    let cases: Vec<(&str, Vec<Vec<usize>>, Graph)> =
        vec![("attention heads", vec![vec![2, 7, 24], vec![2, 7, 24], vec![2, 7, 24], vec![24, 24]], |x| {
            let (b, t, h, d) = (2, 7, 3, 8);
            let split = |x: &Tensor| x.reshape([b, t, h, d])?.permute(&[0, 2, 1, 3]);
            let (q, k, v) = (split(&x[0])?, split(&x[1])?, split(&x[2])?);
            let scores = q.matmul(&k.transpose(-1, -2)?)?.mul_scalar(1.0 / (d as f64).sqrt())?;
            let out = scores.softmax()?.matmul(&v)?;
            out.permute(&[0, 2, 1, 3])?.contiguous()?.reshape([b, t, h * d])?.matmul_t(&x[3])
        })];
    graphs_match("attention", &cases, PRODUCTS)
}

/// A 5-dimension view whose dimensions do not merge into the kernels' 4 is refused with a typed
/// error that says what to change (the CPU backend takes it); moving a view between devices in
/// place is refused (it would move the storage it shares).
fn refusals(_: &Device) -> Outcome {
    let dev = cuda()?;
    let x = Tensor::arange(2 * 3 * 2 * 3 * 2, DType::F32).reshape([2, 3, 2, 3, 2]).map_err(err)?;
    let reversed = |t: &Tensor| t.permute(&[4, 3, 2, 1, 0]);
    let want = reversed(&x).map_err(err)?.contiguous().map_err(err)?.to_vec_f32();
    let on_gpu = reversed(&x.to_device(&dev).map_err(err)?).map_err(err)?;
    match on_gpu.contiguous() {
        Err(kiln::Error::Unsupported { what, .. }) if what.contains(".contiguous()") => {}
        Err(e) => return Err(format!("unexpected error: {e}")),
        Ok(_) => return Err("a 5-dimension unmergeable view was copied on CUDA; expected a refusal".into()),
    }
    // a 5-dimension view that merges (the two last dimensions stay together) is taken
    let merged =
        x.to_device(&dev).and_then(|t| t.permute(&[1, 0, 2, 3, 4])).and_then(|t| t.contiguous()).map_err(err)?;
    let want_merged = x.permute(&[1, 0, 2, 3, 4]).and_then(|t| t.contiguous()).map_err(err)?.to_vec_f32();
    if merged.to_vec_f32() != want_merged {
        return Err("a mergeable 5-dimension view copied wrong".into());
    }
    if want.len() != x.elem_count() {
        return Err("the CPU refused the view".into());
    }
    let view = x.narrow(0, 1, 1).map_err(err)?;
    match view.move_to(&dev) {
        Err(kiln::Error::Unsupported { op: "move_to", .. }) => {}
        other => return Err(format!("move_to of a view: expected a refusal, got {other:?}")),
    }
    if x.device() != TensorDevice::Cpu {
        return Err("a refused move_to moved the storage".into());
    }
    Ok(())
}
