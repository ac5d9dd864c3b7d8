//! Collectives over NCCL on two GPUs (`kiln::dist`): all-reduce (sum and mean) of f32 and bf16
//! buffers of odd lengths against the CPU sum of the ranks' inputs, broadcast from each root, and
//! the refusal of more GPUs than present. Ignored on machines with fewer than two GPUs.
//!
//! Tolerances: with two ranks NCCL adds the two values once (f32, or f32 arithmetic rounded to
//! bf16), and the mean scales by a power of two, so the result is the CPU's f64 sum rounded once:
//! f32 within `1e-7 |want|` (one rounding), bf16 within `2^-8 |want|` (one bf16 rounding). Every rank
//! must hold the same bits.

use crate::common::{Outcome, bits, err};
use crate::{GpuTest, any};
use half::bf16;
use kiln::cuda::Device;
use kiln::dist::{self, ReduceOp};
use kiln::testing::{self, Tol, compare};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// This family's tests, in the order the suite lists them.
pub(crate) fn tests() -> Vec<GpuTest> {
    vec![
        GpuTest { name: "gpu::dist::all_reduce_f32_on_two_gpus", available: two_gpus, run: all_reduce_f32 },
        GpuTest { name: "gpu::dist::all_reduce_bf16_on_two_gpus", available: two_gpus, run: all_reduce_bf16 },
        GpuTest { name: "gpu::dist::broadcast_on_two_gpus", available: two_gpus, run: broadcast },
        GpuTest { name: "gpu::dist::more_gpus_than_present_is_refused", available: any, run: too_many },
    ]
}

/// At least two GPUs are present.
fn two_gpus(_: &Device) -> bool {
    Device::count().is_ok_and(|n| n >= 2)
}

const LENS: [usize; 3] = [1, 1023, 1_000_003];

/// Each rank's input: the run's seed, the rank and the length pick the values.
fn input(rank: usize, len: usize) -> Vec<f32> {
    let (_, seed) = testing::rng();
    let mut rng = StdRng::seed_from_u64(seed ^ ((rank as u64 + 1) << 40) ^ len as u64);
    (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn same_bits(what: &str, ranks: &[Vec<f32>]) -> Outcome {
    for (r, v) in ranks.iter().enumerate().skip(1) {
        if bits(v) != bits(&ranks[0]) {
            return Err(format!("{what}: rank {r}'s result differs in bits from rank 0's"));
        }
    }
    Ok(())
}

fn all_reduce_f32(_: &Device) -> Outcome {
    for len in LENS {
        for op in [ReduceOp::Sum, ReduceOp::Avg] {
            let got = dist::run(2, |r| {
                let mut buf = r.device.upload(&input(r.rank, len))?;
                r.comm.all_reduce_f32(&r.device, &mut buf, op)?;
                r.device.download(&buf)
            })
            .map_err(err)?;
            let scale = if op == ReduceOp::Avg { 0.5 } else { 1.0 };
            let (a, b) = (input(0, len), input(1, len));
            let want: Vec<f64> = a.iter().zip(&b).map(|(x, y)| (*x as f64 + *y as f64) * scale).collect();
            let what = format!("f32 all-reduce {op:?} of {len}");
            same_bits(&what, &got)?;
            compare(&what, &got[0], &want, Tol { abs: 1e-30, rel: 1.2e-7 })?;
        }
    }
    Ok(())
}

fn all_reduce_bf16(_: &Device) -> Outcome {
    for len in LENS {
        for op in [ReduceOp::Sum, ReduceOp::Avg] {
            let to_bf = |v: Vec<f32>| v.into_iter().map(bf16::from_f32).collect::<Vec<_>>();
            let got = dist::run(2, |r| {
                let mut buf = r.device.upload(&to_bf(input(r.rank, len)))?;
                r.comm.all_reduce_bf16(&r.device, &mut buf, op)?;
                Ok(r.device.download(&buf)?.into_iter().map(f32::from).collect::<Vec<f32>>())
            })
            .map_err(err)?;
            let scale = if op == ReduceOp::Avg { 0.5 } else { 1.0 };
            let (a, b) = (to_bf(input(0, len)), to_bf(input(1, len)));
            let want: Vec<f64> = a.iter().zip(&b).map(|(x, y)| (x.to_f64() + y.to_f64()) * scale).collect();
            let what = format!("bf16 all-reduce {op:?} of {len}");
            same_bits(&what, &got)?;
            compare(&what, &got[0], &want, Tol { abs: 1e-30, rel: 1.0 / 256.0 })?;
        }
    }
    Ok(())
}

fn broadcast(_: &Device) -> Outcome {
    for root in 0..2 {
        let len = 4099;
        let got = dist::run(2, |r| {
            let mut f = r.device.upload(&input(r.rank, len))?;
            r.comm.broadcast_f32(&r.device, &mut f, root)?;
            let mut h = r.device.upload(&input(r.rank, len).into_iter().map(bf16::from_f32).collect::<Vec<_>>())?;
            r.comm.broadcast_bf16(&r.device, &mut h, root)?;
            Ok((r.device.download(&f)?, r.device.download(&h)?))
        })
        .map_err(err)?;
        let want = input(root, len);
        for (r, (f, h)) in got.iter().enumerate() {
            if bits(f) != bits(&want) {
                return Err(format!("f32 broadcast from {root}: rank {r} does not hold root's bits"));
            }
            let want_h: Vec<u16> = want.iter().map(|x| bf16::from_f32(*x).to_bits()).collect();
            if h.iter().map(|x| x.to_bits()).collect::<Vec<_>>() != want_h {
                return Err(format!("bf16 broadcast from {root}: rank {r} does not hold root's bits"));
            }
        }
    }
    Ok(())
}

fn too_many(_: &Device) -> Outcome {
    let present = Device::count().map_err(err)?;
    match dist::run(present + 1, |_| Ok(())) {
        Err(kiln::Error::TooFewGpus { asked, present: p }) if asked == present + 1 && p == present => Ok(()),
        other => Err(format!("--gpus {} on {present} GPU(s): expected TooFewGpus, got {other:?}", present + 1)),
    }
}
