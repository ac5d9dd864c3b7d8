//! Float math for kernels, in plain Rust: `core` has no `exp`/`ln`/`tanh` without a libm, and a
//! PTX module cannot link one. These are pure functions, compiled for the host too, where
//! `tests/device_lib.rs` checks them against f64 references over wide ranges (a few ulp).
//! Only `sqrt` (`sqrt.rn.f32`, correctly rounded), `fma`, `exp_fast` and `exp2_fast` (`ex2.approx`, for
//! softmax-style reductions) are instructions.

const LOG2E: f32 = core::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_145_75; // ln 2 split so that k * LN2_HI is exact for |k| < 2^8
const LN2_LO: f32 = 1.428_606_8e-6;

/// 2^k as an f32, for k in -126..=127.
#[inline(always)]
const fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// e^x (within 2 ulp over the host sweep): Cody-Waite reduction x = k ln2 + r, |r| <= ln2 / 2, a degree-7 polynomial
/// for e^r, then scaling by 2^k.
///
/// Branch-free: the argument is clamped to the finite range, every case is computed and the
/// special results (NaN, overflow, underflow) are selected at the end. On the GPU a branchy
/// version made each call its own basic block, so a warp could not overlap one `exp`'s dependent
/// chain with the next one's: a loop over a row ran at one `exp` per ~150 cycles.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const HI: f32 = 88.722_84;
    const LO: f32 = -103.972_08;
    let xc = x.clamp(LO, HI);
    let kf = xc * LOG2E;
    let k = (if kf >= 0.0 { kf + 0.5 } else { kf - 0.5 }) as i32;
    let r = (xc - k as f32 * LN2_HI) - k as f32 * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // 2^k in two exact factors: subnormal results scale in two steps (2^(k+64) 2^-64), k = 128 as
    // 2^127 * 2, all others as 2^k * 1 (integer arithmetic, so no branch)
    let (sub, over) = ((k < -126) as i32, (k > 127) as i32);
    let y = p * pow2(k + 64 * sub - over) * pow2(over - 64 * sub);
    if x.is_nan() {
        x
    } else if x > HI {
        f32::INFINITY
    } else if x < LO {
        0.0
    } else {
        y
    }
}

/// e^x - 1, accurate near 0 (Taylor series to x^9 for |x| < 0.5).
#[inline(always)]
pub fn expm1(x: f32) -> f32 {
    if x > -0.5 && x < 0.5 {
        x * (1.0
            + x * (0.5
                + x * (1.0 / 6.0
                    + x * (1.0 / 24.0
                        + x * (1.0 / 120.0
                            + x * (1.0 / 720.0 + x * (1.0 / 5040.0 + x * (1.0 / 40320.0 + x * (1.0 / 362_880.0)))))))))
    } else {
        exp(x) - 1.0
    }
}

/// Natural logarithm (within 3 ulp over the host sweep): x = m 2^e with m in [sqrt(1/2), sqrt(2)), then
/// ln m = 2 atanh(s) with s = (m - 1) / (m + 1), as an odd series to s^9.
#[inline(always)]
pub fn ln(x: f32) -> f32 {
    if x.is_nan() || x < 0.0 {
        return f32::NAN;
    }
    if x == 0.0 {
        return f32::NEG_INFINITY;
    }
    if x == f32::INFINITY {
        return x;
    }
    let (mut bits, mut e) = (x.to_bits(), 0i32);
    if bits < 0x0080_0000 {
        // subnormal: scale into the normal range
        bits = (x * pow2(23)).to_bits();
        e = -23;
    }
    e += ((bits >> 23) as i32) - 127;
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    if m > core::f32::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let lm = 2.0 * s * (1.0 + z * (1.0 / 3.0 + z * (1.0 / 5.0 + z * (1.0 / 7.0 + z * (1.0 / 9.0)))));
    e as f32 * LN2_HI + (e as f32 * LN2_LO + lm)
}

/// Hyperbolic tangent: `expm1(2|x|) / (expm1(2|x|) + 2)` with the sign restored (±1 past |x| = 9).
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = if x < 0.0 { -x } else { x };
    let t = if a > 9.0 {
        1.0
    } else {
        let y = expm1(2.0 * a);
        y / (y + 2.0)
    };
    if x < 0.0 {
        -t
    } else if x.is_nan() {
        x
    } else {
        t
    }
}

/// The logistic sigmoid `1 / (1 + e^-x)`.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// e^x through the special-function unit: `2^(x log2 e)` with `ex2.approx.ftz`. Relative error
/// about 2^-22 from the instruction plus up to |x| 2^-24 from rounding `x log2 e` (under 4e-6 for
/// the |x| < 88 where the result is a normal f32); results below 2^-126 flush to 0. For reductions
/// whose terms are normalized anyway (softmax, log-sum-exp), where [`exp`]'s ~30 instructions per
/// element made the row kernels compute-bound; elementwise `exp` keeps the accurate [`exp`].
///
/// PTX: `mul.f32 %t, x, 0f3FB8AA3B; ex2.approx.ftz.f32 %f, %t;`
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn exp_fast(x: f32) -> f32 {
    let r: f32;
    let t = x * LOG2E;
    // SAFETY: register-only.
    unsafe {
        core::arch::asm!("ex2.approx.ftz.f32 {r}, {t};", r = out(reg32) r, t = in(reg32) t, options(nomem, nostack, pure))
    };
    r
}

/// 2^x through the special-function unit: `ex2.approx.ftz` (relative error about 2^-22; results
/// below 2^-126 flush to 0, `2^-inf` is 0). For softmax kernels that keep their scores in log2
/// units (the scale folded with `log2 e` into one multiply-add per score).
///
/// PTX: `ex2.approx.ftz.f32 %f, x;`
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn exp2_fast(x: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only.
    unsafe {
        core::arch::asm!("ex2.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(nomem, nostack, pure))
    };
    r
}

/// Square root, correctly rounded.
///
/// PTX: `sqrt.rn.f32 %f, x;`
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn sqrt(x: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only.
    unsafe {
        core::arch::asm!("sqrt.rn.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(nomem, nostack, pure))
    };
    r
}

/// Fused multiply-add `a * b + c`, rounded once. Rust never contracts `a * b + c` by itself (the
/// backend emits `mul.rn` and `add.rn`), so GEMM inner loops call this to get one FMA per step:
/// twice the arithmetic rate, and the exact association of an ascending-k FMA chain.
///
/// PTX: `fma.rn.f32 %f, a, b, c;`
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only.
    unsafe {
        core::arch::asm!("fma.rn.f32 {r}, {a}, {b}, {c};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c,
            options(nomem, nostack, pure))
    };
    r
}
