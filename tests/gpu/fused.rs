//! Fused layers on the persistent wgmma GEMM (`gemm_wgmma_bf16_fused`, `WgmmaGemm::run_fused`):
//! every epilogue combination (bias, ReLU / GELU, residual, periodic table; f32, bf16 and f16 C)
//! against an f64 reference and, bit for bit, against the unfused composition (the persistent
//! kernel's own bias + activation, then the additions and the rounding on the host in the kernel's
//! order); the backward layouts (`dX = dY W`, `dW = dY^T X` read in place) and the column sums
//! against f64; the refusals. Outputs are poisoned (NaN) before every launch.

use crate::GpuTest;
use crate::common::{Outcome, err};
use half::{bf16, f16};
use kiln::cuda::Device;
use kiln::cuda::gemm::{Activation, GemmEpilogue, GemmOutput, WgmmaGemm, WgmmaLayout, WgmmaTile, column_sums};
use kiln::gpu::kernels::mma_tile::GemmShape;
use kiln::testing::{self, Tol, compare};

fn wgmma(d: &Device) -> bool {
    d.supports::<kiln::gpu::kernels::gemm_wgmma_fused::GemmWgmmaBf16Fused>()
}

pub(crate) fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest { name: "gpu::fused_epilogue_combinations_sm90", available: wgmma, run: epilogue_combinations },
        GpuTest { name: "gpu::fused_epilogue_many_tiles_sm90", available: wgmma, run: epilogue_many_tiles },
        GpuTest { name: "gpu::fused_backward_layouts_sm90", available: wgmma, run: backward_layouts },
        GpuTest { name: "gpu::fused_column_sums", available: |_| true, run: column_sums_case },
        GpuTest { name: "gpu::fused_refusals_sm90", available: wgmma, run: refusals },
        GpuTest { name: "gpu::fused_split_k_layouts_sm90", available: wgmma, run: split_k_layouts },
    ]
}

/// C's element types in the tests: rounding from f32, widening to f32, a NaN poison.
trait Out: GemmOutput {
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
    fn poison() -> Self;
    /// Relative rounding error of one rounding to this type (half an ulp).
    const HALF_ULP: f64;
}
impl Out for f32 {
    fn from_f32(x: f32) -> Self {
        x
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn poison() -> Self {
        testing::POISON_F32
    }
    const HALF_ULP: f64 = 0.0;
}
impl Out for bf16 {
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn poison() -> Self {
        bf16::from_bits(0x7fc1)
    }
    const HALF_ULP: f64 = 1.0 / 256.0;
}
impl Out for f16 {
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn poison() -> Self {
        f16::from_bits(0x7e01)
    }
    const HALF_ULP: f64 = 1.0 / 2048.0;
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

fn act64(act: Option<Activation>, x: f64) -> f64 {
    match act {
        None => x,
        Some(Activation::Relu) => x.max(0.0),
        Some(Activation::Gelu) => gelu(x),
    }
}

fn rand_bf16(rng: &mut rand::rngs::StdRng, len: usize) -> Vec<bf16> {
    testing::uniform(rng, len).into_iter().map(bf16::from_f32).collect()
}

/// The f64 product `C = A B^T` of bf16 `a` (m x k) and `b` (n x k), and `sum |a b|` per output.
fn abt64(a: &[bf16], b: &[bf16], (m, n, k): (usize, usize, usize)) -> (Vec<f64>, Vec<f64>) {
    let (a, b): (Vec<f64>, Vec<f64>) = (a.iter().map(|x| x.to_f64()).collect(), b.iter().map(|x| x.to_f64()).collect());
    let (mut dot, mut mag) = (vec![0.0; m * n], vec![0.0; m * n]);
    for i in 0..m {
        for j in 0..n {
            let (d, g) = a[i * k..(i + 1) * k]
                .iter()
                .zip(&b[j * k..(j + 1) * k])
                .fold((0.0f64, 0.0f64), |(d, g), (x, y)| (d + x * y, g + (x * y).abs()));
            dot[i * n + j] = d;
            mag[i * n + j] = g;
        }
    }
    (dot, mag)
}

/// The operands of one forward shape, on the device and the host.
struct Forward {
    s: GemmShape,
    a: kiln::cuda::DeviceBuffer<bf16>,
    b: kiln::cuda::DeviceBuffer<bf16>,
    bias: Vec<f32>,
    dbias: kiln::cuda::DeviceBuffer<f32>,
    dot: Vec<f64>,
    mag: Vec<f64>,
}

impl Forward {
    fn new(dev: &Device, rng: &mut rand::rngs::StdRng, (m, n, k): (u32, u32, u32)) -> Result<Forward, String> {
        let (mu, nu, ku) = (m as usize, n as usize, k as usize);
        let (a, b) = (rand_bf16(rng, mu * ku), rand_bf16(rng, nu * ku));
        let (dot, mag) = abt64(&a, &b, (mu, nu, ku));
        let bias = testing::uniform(rng, nu);
        Ok(Forward {
            s: GemmShape { m, n, k },
            a: dev.upload(&a).map_err(err)?,
            b: dev.upload(&b).map_err(err)?,
            dbias: dev.upload(&bias).map_err(err)?,
            bias,
            dot,
            mag,
        })
    }
}

/// One combination: the fused product into a poisoned C of `T`, checked against f64 and, bit for
/// bit, against `unfused` (the persistent kernel's f32 `act(acc + bias)`, the same plan) followed
/// on the host by the additions in f32 in the kernel's order and one rounding to `T`.
#[allow(clippy::too_many_arguments)]
fn one_case<T: Out>(
    dev: &Device,
    rng: &mut rand::rngs::StdRng,
    f: &Forward,
    plan: &WgmmaGemm<'_>,
    unfused: &[f32],
    (with_bias, act): (bool, Option<Activation>),
    with_residual: bool,
    period: Option<u32>,
) -> Outcome {
    let (m, n, k) = (f.s.m as usize, f.s.n as usize, f.s.k as usize);
    let what =
        format!("fused {m}x{n}x{k} {} bias {with_bias} {act:?} residual {with_residual} period {period:?}", T::NAME);
    let residual: Vec<T> = testing::uniform(rng, m * n).into_iter().map(T::from_f32).collect();
    let table: Vec<T> =
        period.map_or(vec![], |p| testing::uniform(rng, p as usize * n).into_iter().map(T::from_f32).collect());
    let dres = dev.upload(&residual).map_err(err)?;
    let dtable = dev.upload(&if table.is_empty() { vec![T::from_f32(0.0)] } else { table.clone() }).map_err(err)?;
    let mut dc = dev.upload(&vec![T::poison(); m * n]).map_err(err)?;
    let epi = GemmEpilogue::<T> {
        bias: with_bias.then_some(&f.dbias),
        act,
        residual: with_residual.then_some(&dres),
        periodic: period.map(|p| (&dtable, p)),
    };
    plan.run_fused(&mut dc, epi).map_err(|e| format!("{what}: {}", err(e)))?;
    let got: Vec<f32> = dev.download(&dc).map_err(err)?.into_iter().map(T::to_f32).collect();
    let (mut want, mut tol, mut composed) = (vec![0.0f64; m * n], vec![0.0f64; m * n], vec![0.0f32; m * n]);
    for i in 0..m {
        for j in 0..n {
            let at = i * n + j;
            let pre = f.dot[at] + if with_bias { f.bias[j] as f64 } else { 0.0 };
            let mut w = act64(act, pre);
            let mut x = unfused[at];
            if with_residual {
                w += residual[at].to_f32() as f64;
                x += residual[at].to_f32();
            }
            if let Some(p) = period {
                let t = table[(i % p as usize) * n + j].to_f32();
                w += t as f64;
                x += t;
            }
            want[at] = w;
            composed[at] = T::from_f32(x).to_f32();
            // the f32 accumulation, the bias add, GELU's f32 tanh, the two additions; then the
            // rounding to T
            let e = k as f64 * 2f64.powi(-22) * f.mag[at] + 2f64.powi(-20) * (3.0 + pre.abs() + w.abs());
            tol[at] = e + T::HALF_ULP * (w.abs() + e);
        }
    }
    for (at, (&g, (&w, &t))) in got.iter().zip(want.iter().zip(&tol)).enumerate() {
        compare(&format!("{what} against f64 at ({}, {})", at / n, at % n), &[g], &[w], Tol { abs: t, rel: 0.0 })?;
    }
    let c64: Vec<f64> = composed.iter().map(|&x| x as f64).collect();
    compare(&format!("{what} against the unfused composition"), &got, &c64, Tol::EXACT)
}

/// Every combination on `shape` for C of `T`.
fn all_combinations<T: Out>(
    dev: &Device,
    rng: &mut rand::rngs::StdRng,
    f: &Forward,
    periods: &[Option<u32>],
) -> Outcome {
    let plan = WgmmaGemm::new(dev, &f.a, &f.b, f.s).map_err(err)?;
    let (m, n) = (f.s.m as usize, f.s.n as usize);
    for with_bias in [false, true] {
        for act in [None, Some(Activation::Relu), Some(Activation::Gelu)] {
            // the unfused first half: the persistent kernel's own epilogue, f32
            let mut c32 = dev.upload(&vec![testing::POISON_F32; m * n]).map_err(err)?;
            let e = GemmEpilogue { bias: with_bias.then_some(&f.dbias), act, ..Default::default() };
            plan.run_with(&mut c32, e).map_err(err)?;
            let unfused = dev.download(&c32).map_err(err)?;
            for with_residual in [false, true] {
                for &period in periods {
                    one_case::<T>(dev, rng, f, &plan, &unfused, (with_bias, act), with_residual, period)?;
                }
            }
        }
    }
    Ok(())
}

/// Every epilogue combination (bias or not, no activation / ReLU / GELU, residual or not, no table
/// or period 1, 7 or m) for f32 and bf16 C, and a few for f16 C, on shapes whose m and n are not
/// multiples of the tile: n even (pair stores), n odd (single stores), one row.
fn epilogue_combinations(dev: &Device) -> Outcome {
    let (mut rng, _) = testing::rng();
    for &(m, n, k) in &[(300u32, 264u32, 136u32), (257, 131, 72), (1, 10, 8)] {
        let f = Forward::new(dev, &mut rng, (m, n, k))?;
        let periods = [None, Some(1), Some(7), Some(m)];
        all_combinations::<f32>(dev, &mut rng, &f, &periods)?;
        all_combinations::<bf16>(dev, &mut rng, &f, &periods)?;
        all_combinations::<f16>(dev, &mut rng, &f, &[None, Some(7)])?;
    }
    // run_with takes the fused kernel for an f32 C with additions
    let f = Forward::new(dev, &mut rng, (70, 40, 24))?;
    let plan = WgmmaGemm::new(dev, &f.a, &f.b, f.s).map_err(err)?;
    let res = dev.upload(&vec![1.0f32; 70 * 40]).map_err(err)?;
    let mut c = dev.upload(&vec![testing::POISON_F32; 70 * 40]).map_err(err)?;
    plan.run_with(&mut c, GemmEpilogue { residual: Some(&res), ..Default::default() }).map_err(err)?;
    let got = dev.download(&c).map_err(err)?;
    let want: Vec<f64> = f.dot.iter().map(|d| d + 1.0).collect();
    let tol: f64 = f.mag.iter().cloned().fold(0.0, f64::max) * 24.0 * 2f64.powi(-22) + 2f64.powi(-20) * 4.0;
    compare("run_with + residual 70x40x24", &got, &want, Tol { abs: tol, rel: 0.0 })
}

/// One bigger product with more cluster tiles than clusters (each cluster takes several, so the
/// ring's parities run on across tiles): bias, GELU, residual and a period-77 table into bf16, and
/// the unicast tile into f32.
fn epilogue_many_tiles(dev: &Device) -> Outcome {
    let (mut rng, _) = testing::rng();
    let f = Forward::new(dev, &mut rng, (2100, 2056, 136))?;
    let (m, n) = (2100usize, 2056usize);
    let plan = WgmmaGemm::new(dev, &f.a, &f.b, f.s).map_err(err)?;
    let tiles = m.div_ceil(256) * n.div_ceil(256);
    if plan.persistent_clusters() as usize >= tiles {
        return Err(format!(
            "{} clusters take the {tiles} cluster tiles of 2100 x 2056 in one turn: the test needs more tiles",
            plan.persistent_clusters()
        ));
    }
    let mut c32 = dev.upload(&vec![testing::POISON_F32; m * n]).map_err(err)?;
    let e = GemmEpilogue { bias: Some(&f.dbias), act: Some(Activation::Gelu), ..Default::default() };
    plan.run_with(&mut c32, e).map_err(err)?;
    let unfused = dev.download(&c32).map_err(err)?;
    one_case::<bf16>(dev, &mut rng, &f, &plan, &unfused, (true, Some(Activation::Gelu)), true, Some(77))?;
    let uni = WgmmaGemm::with_tile(dev, &f.a, &f.b, f.s, WgmmaTile::PersistentUnicast).map_err(err)?;
    one_case::<f32>(dev, &mut rng, &f, &uni, &unfused, (true, Some(Activation::Gelu)), false, Some(5))
}

/// The backward products of `y = x W^T + b` (x: rows x k_in, W: n_out x k_in) read in place:
/// `dX = dY W` ([`WgmmaLayout::AB`]) and `dW = dY^T X` ([`WgmmaLayout::AtB`]), into f32 and bf16,
/// against f64; a second plan over the same buffers reuses the cached tensor maps.
fn backward_layouts(dev: &Device) -> Outcome {
    let (mut rng, _) = testing::rng();
    // (rows, n_out, k_in, check dX, check dW): rows is dW's k (any), n_out is dX's k and dW's m,
    // k_in is both n. The last two have 72 cluster tiles in the product they check (more than the
    // 66 clusters an H100 or H200 holds, so clusters take several tiles and the ring's parities run
    // on across them).
    for &(rows, n_out, k_in, want_dx, want_dw) in &[
        (300u32, 264u32, 136u32, true, true),
        (129, 72, 200, true, true),
        (1, 8, 8, true, true),
        (77, 520, 264, true, true),
        (1030, 776, 1032, true, true),
        (2304, 192, 2048, true, false),
        (192, 2304, 2048, false, true),
    ] {
        let (r, no, ki) = (rows as usize, n_out as usize, k_in as usize);
        let dy = rand_bf16(&mut rng, r * no);
        let w = rand_bf16(&mut rng, no * ki);
        let x = rand_bf16(&mut rng, r * ki);
        let (ddy, dw_in, dx_in) =
            (dev.upload(&dy).map_err(err)?, dev.upload(&w).map_err(err)?, dev.upload(&x).map_err(err)?);
        let f64s = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
        let (dy64, w64, x64) = (f64s(&dy), f64s(&w), f64s(&x));
        if want_dx {
            // dX[i][j] = sum_p dY[i][p] W[p][j]
            let s = GemmShape { m: rows, n: k_in, k: n_out };
            let before = dev.tensor_map_cache_stats();
            let plan = WgmmaGemm::with_layout(dev, &ddy, &dw_in, s, WgmmaLayout::AB).map_err(err)?;
            let again = WgmmaGemm::with_layout(dev, &ddy, &dw_in, s, WgmmaLayout::AB).map_err(err)?;
            let after = dev.tensor_map_cache_stats();
            if after.hits < before.hits + 2 {
                return Err(format!("a second plan over the same buffers made new maps: {before:?} then {after:?}"));
            }
            drop(again);
            let (mut want, mut mag) = (vec![0.0f64; r * ki], vec![0.0f64; r * ki]);
            for i in 0..r {
                for p in 0..no {
                    let a = dy64[i * no + p];
                    for j in 0..ki {
                        want[i * ki + j] += a * w64[p * ki + j];
                        mag[i * ki + j] += (a * w64[p * ki + j]).abs();
                    }
                }
            }
            let what = format!("dX = dY W {rows}x{k_in}x{n_out}");
            check_product::<f32>(dev, &plan, &want, &mag, no, &what)?;
            check_product::<bf16>(dev, &plan, &want, &mag, no, &what)?;
        }
        if want_dw {
            // dW[i][j] = sum_p dY[p][i] X[p][j]
            let s = GemmShape { m: n_out, n: k_in, k: rows };
            let plan = WgmmaGemm::with_layout(dev, &ddy, &dx_in, s, WgmmaLayout::AtB).map_err(err)?;
            let (mut want, mut mag) = (vec![0.0f64; no * ki], vec![0.0f64; no * ki]);
            for p in 0..r {
                for i in 0..no {
                    let a = dy64[p * no + i];
                    for j in 0..ki {
                        want[i * ki + j] += a * x64[p * ki + j];
                        mag[i * ki + j] += (a * x64[p * ki + j]).abs();
                    }
                }
            }
            let what = format!("dW = dY^T X {n_out}x{k_in}x{rows}");
            check_product::<f32>(dev, &plan, &want, &mag, r, &what)?;
            check_product::<bf16>(dev, &plan, &want, &mag, r, &what)?;
        }
    }
    Ok(())
}

/// The fused kernel's k split (`WgmmaGemm::with_split_k` then `run_fused`:
/// `gemm_wgmma_bf16_fused_split` and `gemm_split_k_reduce_fused`) in every layout against f64, into
/// f32 and bf16: k not a multiple of 64 nor of the split, m and n off the 256 x 256 cluster tile,
/// several tiles per part; twice with the same bits; with a bias and ReLU.
fn split_k_layouts(dev: &Device) -> Outcome {
    let (mut rng, _) = testing::rng();
    // (layout, m, n, k, splits)
    for &(lay, m, n, k, splits) in &[
        (WgmmaLayout::AtB, 264u32, 136u32, 1000u32, &[2u32, 3, 6][..]),
        (WgmmaLayout::AtB, 8, 8, 77, &[2][..]),
        (WgmmaLayout::AtB, 520, 264, 2100, &[7][..]),
        (WgmmaLayout::AtB, 384, 136, 4160, &[13][..]),
        (WgmmaLayout::AB, 300, 136, 1032, &[3][..]),
        (WgmmaLayout::ABt, 130, 72, 1000, &[4][..]),
    ] {
        let (mu, nu, ku) = (m as usize, n as usize, k as usize);
        let (a, b) = (rand_bf16(&mut rng, mu * ku), rand_bf16(&mut rng, nu * ku));
        // A(i, p) and B(j, p) as each layout stores them
        let a_at = |i: usize, p: usize| if lay == WgmmaLayout::AtB { a[p * mu + i] } else { a[i * ku + p] };
        let b_at = |j: usize, p: usize| if lay == WgmmaLayout::ABt { b[j * ku + p] } else { b[p * nu + j] };
        let (mut want, mut mag) = (vec![0.0f64; mu * nu], vec![0.0f64; mu * nu]);
        // B as n rows of k f64s
        let brows: Vec<f64> = (0..nu * ku).map(|x| b_at(x / ku, x % ku).to_f64()).collect();
        for i in 0..mu {
            let arow: Vec<f64> = (0..ku).map(|p| a_at(i, p).to_f64()).collect();
            for j in 0..nu {
                let (mut acc, mut abs) = (0.0f64, 0.0f64);
                for (&x, &y) in arow.iter().zip(&brows[j * ku..(j + 1) * ku]) {
                    let t = x * y;
                    acc += t;
                    abs += t.abs();
                }
                want[i * nu + j] = acc;
                mag[i * nu + j] = abs;
            }
        }
        let (da, db) = (dev.upload(&a).map_err(err)?, dev.upload(&b).map_err(err)?);
        let s = GemmShape { m, n, k };
        for &sp in splits {
            let plan = WgmmaGemm::with_layout(dev, &da, &db, s, lay).map_err(err)?.with_split_k(sp).map_err(err)?;
            if plan.split_k() != sp {
                return Err(format!("{lay:?} {m}x{n}x{k}: split {} where {sp} was set", plan.split_k()));
            }
            let what = format!("{lay:?} {m}x{n}x{k} split {sp}");
            check_product::<f32>(dev, &plan, &want, &mag, ku, &what)?;
            check_product::<bf16>(dev, &plan, &want, &mag, ku, &what)?;
            // same bits twice
            let mut runs = Vec::new();
            for _ in 0..2 {
                let mut c = dev.upload(&vec![testing::POISON_F32; mu * nu]).map_err(err)?;
                plan.run_fused(&mut c, GemmEpilogue::<f32>::default()).map_err(err)?;
                runs.push(crate::common::bits(&dev.download(&c).map_err(err)?));
            }
            if runs[0] != runs[1] {
                return Err(format!("{what}: two runs differ"));
            }
            // the epilogue after the sum: relu(acc + bias)
            let bias: Vec<f32> = testing::uniform(&mut rng, nu);
            let dbias = dev.upload(&bias).map_err(err)?;
            let mut c = dev.upload(&vec![testing::POISON_F32; mu * nu]).map_err(err)?;
            let e = GemmEpilogue { bias: Some(&dbias), act: Some(Activation::Relu), ..Default::default() };
            plan.run_fused(&mut c, e).map_err(err)?;
            let got = dev.download(&c).map_err(err)?;
            for (at, &g) in got.iter().enumerate() {
                let w = (want[at] + bias[at % nu] as f64).max(0.0);
                let tol = ku as f64 * 2f64.powi(-22) * mag[at] + 2f64.powi(-22) * (bias[at % nu] as f64).abs() + 1e-30;
                compare(&format!("{what} bias + relu at {at}"), &[g], &[w], Tol { abs: tol, rel: 0.0 })?;
            }
        }
    }
    Ok(())
}

/// Runs `plan` into a poisoned C of `T` (no epilogue) and checks it against `want` within the f32
/// accumulation over `k` terms and one rounding to `T`.
fn check_product<T: Out>(
    dev: &Device,
    plan: &WgmmaGemm<'_>,
    want: &[f64],
    mag: &[f64],
    k: usize,
    what: &str,
) -> Outcome {
    let mut dc = dev.upload(&vec![T::poison(); want.len()]).map_err(err)?;
    plan.run_fused(&mut dc, GemmEpilogue::<T>::default()).map_err(err)?;
    let got: Vec<f32> = dev.download(&dc).map_err(err)?.into_iter().map(T::to_f32).collect();
    for (at, (&g, (&w, &mg))) in got.iter().zip(want.iter().zip(mag)).enumerate() {
        let e = k as f64 * 2f64.powi(-22) * mg + 1e-30;
        let tol = e + T::HALF_ULP * (w.abs() + e);
        compare(&format!("{what} {} at {at}", T::NAME), &[g], &[w], Tol { abs: tol, rel: 0.0 })?;
    }
    Ok(())
}

/// The bias gradient's column sums of an m x n matrix (f32, bf16, f16) against f64, twice with the
/// same bits, on shapes with odd widths and heights.
fn column_sums_case(dev: &Device) -> Outcome {
    fn case<T: Out>(dev: &Device, rng: &mut rand::rngs::StdRng, m: usize, n: usize) -> Outcome {
        let x: Vec<T> = testing::uniform(rng, m * n).into_iter().map(T::from_f32).collect();
        let dx = dev.upload(&x).map_err(err)?;
        let mut out = dev.upload(&vec![testing::POISON_F32; n]).map_err(err)?;
        column_sums(dev, &dx, &mut out, m as u32, n as u32).map_err(err)?;
        let got = dev.download(&out).map_err(err)?;
        let mut out2 = dev.upload(&vec![testing::POISON_F32; n]).map_err(err)?;
        column_sums(dev, &dx, &mut out2, m as u32, n as u32).map_err(err)?;
        if crate::common::bits(&got) != crate::common::bits(&dev.download(&out2).map_err(err)?) {
            return Err(format!("column sums {m}x{n} {}: two runs differ", T::NAME));
        }
        for j in 0..n {
            let (s, g) = (0..m).fold((0.0f64, 0.0f64), |(s, g), i| {
                let v = x[i * n + j].to_f32() as f64;
                (s + v, g + v.abs())
            });
            let tol = m as f64 * 2f64.powi(-23) * g + 1e-30;
            compare(
                &format!("column sums {m}x{n} {} column {j}", T::NAME),
                &[got[j]],
                &[s],
                Tol { abs: tol, rel: 0.0 },
            )?;
        }
        Ok(())
    }
    let (mut rng, _) = testing::rng();
    for &(m, n) in &[(1usize, 1usize), (300, 264), (4097, 33), (17, 1000)] {
        case::<f32>(dev, &mut rng, m, n)?;
        case::<bf16>(dev, &mut rng, m, n)?;
        case::<f16>(dev, &mut rng, m, n)?;
    }
    let x = dev.zeros::<f32>(10).map_err(err)?;
    let mut out = dev.zeros::<f32>(4).map_err(err)?;
    match column_sums(dev, &x, &mut out, 3, 4) {
        Err(kiln::Error::Shape { op: "column sums", .. }) => Ok(()),
        other => Err(format!("column sums of 10 elements as 3 x 4 must be refused, got {other:?}")),
    }
}

/// Typed refusals: buffers of the wrong size, period 0, an MN-major operand whose rows are not a
/// multiple of 8, a split of a transposed layout, the fused epilogue on a non-persistent tile.
fn refusals(dev: &Device) -> Outcome {
    let (m, n, k) = (40usize, 24usize, 16usize);
    let s = GemmShape { m: m as u32, n: n as u32, k: k as u32 };
    let a = dev.upload(&vec![bf16::ONE; m * k]).map_err(err)?;
    let b = dev.upload(&vec![bf16::ONE; n * k]).map_err(err)?;
    let plan = WgmmaGemm::new(dev, &a, &b, s).map_err(err)?;
    let c_ok = dev.zeros::<bf16>(m * n).map_err(err)?;
    let mut c = dev.zeros::<bf16>(m * n).map_err(err)?;
    let short = dev.zeros::<bf16>(m * n - 1).map_err(err)?;
    let table = dev.zeros::<bf16>(7 * n).map_err(err)?;
    let shape_err = |r: kiln::Result<()>, what: &str| match r {
        Err(kiln::Error::Shape { op: "wgmma gemm", .. }) => Ok(()),
        other => Err(format!("{what} must be a shape error, got {other:?}")),
    };
    shape_err(
        plan.run_fused(&mut c, GemmEpilogue { residual: Some(&short), ..Default::default() }),
        "a short residual",
    )?;
    shape_err(
        plan.run_fused(&mut c, GemmEpilogue { periodic: Some((&table, 6)), ..Default::default() }),
        "a table of 7 rows as period 6",
    )?;
    shape_err(plan.run_fused(&mut c, GemmEpilogue { periodic: Some((&table, 0)), ..Default::default() }), "period 0")?;
    let mut c_short = dev.zeros::<bf16>(m * n - 1).map_err(err)?;
    shape_err(plan.run_fused(&mut c_short, GemmEpilogue { residual: Some(&c_ok), ..Default::default() }), "a short c")?;
    let bias = dev.zeros::<f32>(n + 1).map_err(err)?;
    shape_err(plan.run_fused(&mut c, GemmEpilogue { bias: Some(&bias), ..Default::default() }), "a long bias")?;
    // an MN-major B of rows of 12 elements (24 bytes): TMA needs 16-byte pitches
    let b12 = dev.upload(&vec![bf16::ONE; 12 * k]).map_err(err)?;
    match WgmmaGemm::with_layout(dev, &a, &b12, GemmShape { m: m as u32, n: 12, k: k as u32 }, WgmmaLayout::AB) {
        Err(kiln::Error::Unsupported { op: "wgmma gemm", .. }) => {}
        Err(e) => return Err(format!("a 12-wide MN-major b: wrong error {e}")),
        Ok(_) => return Err("a 12-wide MN-major b must be refused".into()),
    }
    let t = WgmmaGemm::with_layout(dev, &a, &b, s, WgmmaLayout::AB).map_err(err)?;
    // one k tile (k = 16) cut in two: an empty part
    if !matches!(t.with_split_k(2), Err(kiln::Error::Unsupported { op: "wgmma gemm", .. })) {
        return Err("a k split of the A B layout with an empty part must be refused".into());
    }
    let wide = WgmmaGemm::with_tile(dev, &a, &b, s, WgmmaTile::T128x256).map_err(err)?;
    match wide.run_fused(&mut c, GemmEpilogue::default()) {
        Err(kiln::Error::Unsupported { op: "wgmma gemm", .. }) => Ok(()),
        other => Err(format!("the fused epilogue on the wide tile must be refused, got {other:?}")),
    }
}
