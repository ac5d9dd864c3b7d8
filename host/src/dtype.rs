//! Element types of tensors: a leaf that the error type, the tensor frontend and every backend name.

/// Element types of tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float: the default compute type.
    F32,
    /// 64-bit float: for gradient checks and references.
    F64,
    /// bfloat16: storage and matrix products.
    BF16,
    /// IEEE half: storage and matrix products.
    F16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F64 => 8,
            DType::BF16 | DType::F16 => 2,
        }
    }
}

/// `x` rounded once to the nearest bf16, ties to even. `half`'s `bf16::from_f64` and
/// `f16::from_f64` (2.7) can round a value near a tie the wrong way (the bf16 one drops the f64's
/// low bits first, the f16 one rounds through an f32 where the CPU converts f16 in hardware:
/// 1.17578125 + 2^-26 became the bf16 below it, -638.74999999 the f16 -639); these round to f32
/// to odd first, which keeps the side of the tie, then to the 16-bit type.
pub(crate) fn bf16_from_f64(x: f64) -> half::bf16 {
    half::bf16::from_f32(f32_round_to_odd(x))
}

/// `x` rounded once to the nearest f16, ties to even (see [`bf16_from_f64`]).
pub(crate) fn f16_from_f64(x: f64) -> half::f16 {
    half::f16::from_f32(f32_round_to_odd(x))
}

/// `x` as f32, rounded to odd: exact values as they are, the rest truncated toward zero with the
/// last significand bit set. A second rounding to a type of at most 22 significand bits then
/// gives the correctly rounded result.
fn f32_round_to_odd(x: f64) -> f32 {
    let t = x as f32;
    if !t.is_finite() || t as f64 == x {
        return t;
    }
    let mut bits = t.to_bits();
    if (t as f64).abs() > x.abs() {
        // the nearest f32 was the one away from zero: step back toward zero
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    /// The nearest of the 16-bit values around `x` (ties to the even bit pattern), by exact
    /// comparison in f64 (both neighbours and `x`'s distances to them are exact there).
    fn nearest(x: f64, start: u16, value: impl Fn(u16) -> f64) -> u16 {
        let mut best = (f64::INFINITY, start);
        for d in -2i32..=2 {
            let b = (start as i32 + d) as u16;
            let v = value(b);
            if !v.is_finite() {
                continue;
            }
            let e = (v - x).abs();
            if e < best.0 || (e == best.0 && b.is_multiple_of(2)) {
                best = (e, b);
            }
        }
        best.1
    }

    #[test]
    fn sixteen_bit_rounding_from_f64_is_correct_near_ties() {
        assert_eq!(bf16_from_f64(1.17578125 + 2f64.powi(-26)).to_bits(), 0x3f97);
        assert_eq!(f16_from_f64(-638.74999999).to_f64(), -638.5);
        assert_eq!(bf16_from_f64(126.25).to_f64(), 126.0);
        assert_eq!(bf16_from_f64(126.25 + 2f64.powi(-40)).to_f64(), 126.5);
        assert!(bf16_from_f64(f64::NAN).is_nan() && f16_from_f64(f64::NAN).is_nan());
        assert_eq!(bf16_from_f64(1e300), bf16::INFINITY);
        assert_eq!(f16_from_f64(-1e10), f16::NEG_INFINITY);
        assert_eq!(f16_from_f64(65519.99), f16::MAX);
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let x = (s >> 11) as f64 / (1u64 << 53) as f64 * 2000.0 - 1000.0;
            // a bf16 (f16) midpoint, nudged by up to 2^-33 of it either way
            let nudge = ((s & 0xff) as f64 - 128.0) * 2f64.powi(-40);
            let b_mid = bf16::from_f32(x as f32).to_f64() * (1.0 + 2f64.powi(-9)) * (1.0 + nudge);
            let h_mid = f16::from_f32(x as f32).to_f64() * (1.0 + 2f64.powi(-12)) * (1.0 + nudge);
            for y in [x, b_mid, h_mid] {
                let want = nearest(y, bf16::from_f32(y as f32).to_bits(), |b| bf16::from_bits(b).to_f64());
                assert_eq!(bf16_from_f64(y).to_bits(), want, "bf16 of {y:e}");
                let want = nearest(y, f16::from_f32(y as f32).to_bits(), |b| f16::from_bits(b).to_f64());
                assert_eq!(f16_from_f64(y).to_bits(), want, "f16 of {y:e}");
            }
        }
    }
}
