//! Host tests of the device library's pure arithmetic: fragment layouts, ldmatrix address maps,
//! swizzles, descriptor encodings, conversions and architecture selection. These are the same
//! functions the kernels call on the device, compiled for the host.

use kiln::gpu::convert::{bf16_bits_to_f32, pack_b16x2, tf32_round_host, unpack_b16x2};
use kiln::gpu::matrix::{ldmatrix_x2_b_row_col, ldmatrix_x4_a_row_col};
use kiln::gpu::mbarrier::ring_parity;
use kiln::gpu::mma::{m16n8_c, m16n8k8_tf32_a, m16n8k8_tf32_b, m16n8k16_a, m16n8k16_b};
use kiln::gpu::swizzle::{Swizzle, tile_offset};
use kiln::gpu::tcgen05::valid_alloc_columns;
use kiln::gpu::wgmma::smem_descriptor;
use kiln::gpu::{Arch, KernelTarget};
use std::collections::HashSet;

/// Every (row, col) of a `rows x cols` tile is held by exactly one (lane, element).
fn assert_bijection(name: &str, rows: u32, cols: u32, per_lane: u32, f: fn(u32, u32) -> (u32, u32)) {
    let mut seen = HashSet::new();
    for lane in 0..32 {
        for i in 0..per_lane {
            let (r, c) = f(lane, i);
            assert!(r < rows && c < cols, "{name}: lane {lane} element {i} -> ({r}, {c}) outside {rows}x{cols}");
            assert!(seen.insert((r, c)), "{name}: ({r}, {c}) held twice (lane {lane} element {i})");
        }
    }
    assert_eq!(seen.len() as u32, rows * cols, "{name}: not every element is held");
}

#[test]
fn mma_fragments_cover_their_tiles_once() {
    assert_bijection("m16n8k16 A", 16, 16, 8, m16n8k16_a);
    assert_bijection("m16n8k16 B", 16, 8, 4, m16n8k16_b);
    assert_bijection("m16n8 C", 16, 8, 4, m16n8_c);
    assert_bijection("m16n8k8 tf32 A", 16, 8, 4, m16n8k8_tf32_a);
    assert_bijection("m16n8k8 tf32 B", 8, 8, 2, m16n8k8_tf32_b);
}

#[test]
fn mma_fragments_match_the_ptx_isa_figures() {
    // PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type": lane 5 (group 1,
    // thread-in-group 1) holds a0,a1 = (1, 2), (1, 3); a2,a3 = (9, 2), (9, 3); a4..a7 = cols + 8.
    assert_eq!(m16n8k16_a(5, 0), (1, 2));
    assert_eq!(m16n8k16_a(5, 1), (1, 3));
    assert_eq!(m16n8k16_a(5, 2), (9, 2));
    assert_eq!(m16n8k16_a(5, 5), (1, 11));
    assert_eq!(m16n8k16_a(5, 7), (9, 11));
    // b0,b1 = k 2,3 / b2,b3 = k 10,11, n = group.
    assert_eq!(m16n8k16_b(5, 0), (2, 1));
    assert_eq!(m16n8k16_b(5, 3), (11, 1));
    // c0,c1 = (group, 2t..2t+1); c2,c3 = row + 8.
    assert_eq!(m16n8_c(31, 0), (7, 6));
    assert_eq!(m16n8_c(31, 3), (15, 7));
    // tf32 m16n8k8: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); b0 (t, g), b1 (t+4, g).
    assert_eq!(m16n8k8_tf32_a(6, 0), (1, 2));
    assert_eq!(m16n8k8_tf32_a(6, 1), (9, 2));
    assert_eq!(m16n8k8_tf32_a(6, 2), (1, 6));
    assert_eq!(m16n8k8_tf32_b(6, 1), (6, 1));
}

#[test]
fn ldmatrix_addresses_produce_the_mma_fragments() {
    // ldmatrix .x4: register j comes from matrix j, whose rows lanes 8j..8j+8 address; lane l then
    // holds row l/4, columns 2(l%4)..+1 of that matrix. Check that this lands on the A fragment.
    for lane in 0..32u32 {
        for j in 0..4u32 {
            for half in 0..2u32 {
                let src_lane = 8 * j + lane / 4; // the lane that addressed this row
                let (row, col0) = ldmatrix_x4_a_row_col(src_lane);
                let got = (row, col0 + 2 * (lane % 4) + half);
                assert_eq!(got, m16n8k16_a(lane, 2 * j + half), "A: lane {lane} register {j} half {half}");
            }
        }
        for j in 0..2u32 {
            for half in 0..2u32 {
                let src_lane = 8 * j + lane / 4;
                let (n, k0) = ldmatrix_x2_b_row_col(src_lane);
                let (k, nn) = m16n8k16_b(lane, 2 * j + half);
                assert_eq!((n, k0 + 2 * (lane % 4) + half), (nn, k), "B: lane {lane} register {j} half {half}");
            }
        }
    }
}

#[test]
fn swizzles_are_involutions_within_atoms_and_keep_16_byte_chunks() {
    for s in [Swizzle::None, Swizzle::B32, Swizzle::B64, Swizzle::B128] {
        let mut seen = HashSet::new();
        for off in (0..4096u32).step_by(4) {
            let a = s.apply(off);
            assert_eq!(s.apply(a), off, "{s:?} is not an involution at {off}");
            assert_eq!(a / 1024, off / 1024, "{s:?} left its 1024-byte atom at {off}");
            assert_eq!(a % 16, off % 16, "{s:?} moved bytes within a 16-byte chunk at {off}");
            assert!(seen.insert(a));
        }
    }
    // 128-byte swizzle, PTX ISA / CUTLASS Swizzle<3,4,3>: chunk c of row r lands at chunk c ^ (r % 8).
    for r in 0..16u32 {
        for c in 0..8u32 {
            assert_eq!(tile_offset(Swizzle::B128, r, c * 4, 128, 4), r * 128 + ((c ^ (r % 8)) * 16));
        }
    }
    assert_eq!(Swizzle::B64.apply(3 * 128 + 16), 3 * 128 + 32); // chunk 1 ^ (3 & 3) = 2
}

#[test]
fn wgmma_descriptor_fields() {
    let d = smem_descriptor(0x1230, 16, 1024, 0, Swizzle::B128);
    assert_eq!(d & 0x3fff, 0x123);
    assert_eq!((d >> 16) & 0x3fff, 1);
    assert_eq!((d >> 32) & 0x3fff, 64);
    assert_eq!((d >> 49) & 7, 0);
    assert_eq!(d >> 62, 1);
    assert_eq!(smem_descriptor(0, 0, 0, 5, Swizzle::B32) >> 62, 3);
    assert_eq!((smem_descriptor(0, 0, 0, 5, Swizzle::B32) >> 49) & 7, 5);
    assert_eq!(smem_descriptor(0, 0, 0, 0, Swizzle::B64) >> 62, 2);
}

#[test]
fn conversions() {
    assert_eq!(pack_b16x2(0x1234, 0xabcd), 0xabcd_1234);
    assert_eq!(unpack_b16x2(0xabcd_1234), (0x1234, 0xabcd));
    for x in [1.0f32, -2.5, 3.140625, 0.0, -0.0] {
        let b = half::bf16::from_f32(x);
        assert_eq!(bf16_bits_to_f32(b.to_bits()), b.to_f32());
    }
    // tf32 keeps 10 mantissa bits, rounding to nearest, ties to even.
    assert_eq!(tf32_round_host(1.0 + 2f32.powi(-11)), 1.0);
    assert_eq!(tf32_round_host(1.0 + 3.0 * 2f32.powi(-11)), 1.0 + 2.0 * 2f32.powi(-10));
    assert_eq!(tf32_round_host(1.0 + 2f32.powi(-11) + 2f32.powi(-20)), 1.0 + 2f32.powi(-10));
    assert_eq!(tf32_round_host(1.0 + 2f32.powi(-12)), 1.0);
    assert_eq!(tf32_round_host(-(1.0 + 3.0 * 2f32.powi(-11))), -(1.0 + 2.0 * 2f32.powi(-10)));
    assert!(tf32_round_host(f32::NAN).is_nan());
    assert_eq!(tf32_round_host(f32::INFINITY), f32::INFINITY);
}

/// The host's tf32 rounding (sm_90's `cvt.rn.tf32.f32`, see `kiln_gpu::convert::f32_to_tf32`)
/// against the definition, in f64: of the two tf32 values around x (toward and away from zero),
/// the nearer, a tie to the one with an even last bit; past the largest tf32 by half an ulp,
/// infinity. Every 257th bit pattern, and a few ties.
#[test]
fn tf32_rounding_matches_its_definition() {
    let special = [0x3f80_1000, 0x3f80_3000, 0x7f7f_f000, 0x7f7f_efff, 0x0000_1000, 0x7f80_0001, 0xffff_ffff];
    for bits in (0..=u32::MAX).step_by(257).chain(special) {
        let x = f32::from_bits(bits);
        let got = tf32_round_host(x);
        if x.is_infinite() {
            assert_eq!(got.to_bits(), bits, "{x:e} (infinities pass unchanged)");
            continue;
        }
        if x.is_nan() {
            assert!(got.is_nan() && got.to_bits() & 0x1fff == 0, "{bits:#x}: got {:#x}", got.to_bits());
            continue;
        }
        let toward = bits & !0x1fff;
        let away = toward + 0x2000;
        // the value of `away` (2^128 where it is infinity), and the distances to both
        let away_val = if (away & 0x7f80_0000) == 0x7f80_0000 {
            2f64.powi(128).copysign(x as f64)
        } else {
            f32::from_bits(away) as f64
        };
        let (d_toward, d_away) = ((x as f64 - f32::from_bits(toward) as f64).abs(), (away_val - x as f64).abs());
        let tie_to_away = d_away == d_toward && (toward >> 13) & 1 == 1;
        let want = if d_away < d_toward || tie_to_away { away } else { toward };
        assert_eq!(got.to_bits(), want, "{x:e}: got {got:e}, want {:e}", f32::from_bits(want));
    }
}

#[test]
fn architecture_selection() {
    assert_eq!(Arch::for_compute_capability(9, 0), Some(Arch::Sm90a));
    assert_eq!(Arch::for_compute_capability(10, 0), Some(Arch::Sm100a));
    assert_eq!(Arch::for_compute_capability(10, 3), Some(Arch::Sm100a));
    assert_eq!(Arch::for_compute_capability(8, 0), Some(Arch::Sm80));
    assert_eq!(Arch::for_compute_capability(8, 9), Some(Arch::Sm80));
    assert_eq!(Arch::for_compute_capability(12, 0), Some(Arch::Sm80));
    assert_eq!(Arch::for_compute_capability(7, 5), None);
    assert!(matches!(
        kiln::ptx::arch_for("Tesla T4", 7, 5),
        Err(kiln::Error::UnsupportedDevice { major: 7, minor: 5, .. })
    ));
    let msg = kiln::ptx::arch_for("Tesla T4", 7, 5).unwrap_err().to_string();
    assert!(msg.contains("8.0 or newer") && msg.contains("Tesla T4"), "{msg}");
    for a in Arch::ALL {
        assert_eq!(Arch::from_name(a.name()), Some(a));
    }
}

#[test]
fn kernel_targets() {
    assert!(KernelTarget::Any.available_on(Arch::Sm80));
    assert!(!KernelTarget::MinSm(90).available_on(Arch::Sm80));
    assert!(KernelTarget::MinSm(90).available_on(Arch::Sm90a));
    assert!(KernelTarget::MinSm(90).available_on(Arch::Sm100a));
    assert!(KernelTarget::Exact(Arch::Sm90a).available_on(Arch::Sm90a));
    assert!(!KernelTarget::Exact(Arch::Sm90a).available_on(Arch::Sm100a));
    assert!(!KernelTarget::Exact(Arch::Sm100a).available_on(Arch::Sm90a));
}

#[test]
fn misc_device_helpers() {
    assert_eq!((0..6).map(|k| ring_parity(k, 2)).collect::<Vec<_>>(), [0, 0, 1, 1, 0, 0]);
    assert!(valid_alloc_columns(32) && valid_alloc_columns(512));
    assert!(!valid_alloc_columns(16) && !valid_alloc_columns(48) && !valid_alloc_columns(1024));
}

/// Largest error in ulps of `got` against the f64 value `want` rounded to f32.
fn ulps(got: f32, want: f64) -> u32 {
    let w = want as f32;
    if got == w || (got.is_nan() && w.is_nan()) {
        return 0;
    }
    if !got.is_finite() || !w.is_finite() {
        return u32::MAX;
    }
    (got.to_bits() as i64 - w.to_bits() as i64).unsigned_abs() as u32
}

fn sweep() -> impl Iterator<Item = f32> {
    // every 997th bit pattern of the positive and negative finite floats, plus edge values
    (0..0x7f80_0000u32)
        .step_by(997)
        .flat_map(|b| [f32::from_bits(b), -f32::from_bits(b)])
        .chain([0.0, -0.0, 1.0, -1.0, 0.5, 2.0])
}

#[test]
fn device_math_is_accurate() {
    use kiln::gpu::math;
    let (mut worst_exp, mut worst_ln, mut worst_tanh, mut worst_expm1) = (0, 0, 0, 0);
    for x in sweep() {
        if x.abs() < 100.0 {
            let w = (x as f64).exp();
            if w < f32::MAX as f64 && w > f32::MIN_POSITIVE as f64 {
                worst_exp = worst_exp.max(ulps(math::exp(x), w));
            }
            worst_tanh = worst_tanh.max(ulps(math::tanh(x), (x as f64).tanh()));
            if x.abs() > 1e-30 && x < 80.0 {
                worst_expm1 = worst_expm1.max(ulps(math::expm1(x), (x as f64).exp_m1()));
            }
        }
        if x > 0.0 {
            worst_ln = worst_ln.max(ulps(math::ln(x), (x as f64).ln()));
        }
    }
    assert!(worst_exp <= 2, "exp: {worst_exp} ulp");
    assert!(worst_ln <= 3, "ln: {worst_ln} ulp");
    assert!(worst_expm1 <= 3, "expm1: {worst_expm1} ulp");
    assert!(worst_tanh <= 4, "tanh: {worst_tanh} ulp");
    assert_eq!(math::exp(f32::NEG_INFINITY), 0.0);
    assert_eq!(math::exp(f32::INFINITY), f32::INFINITY);
    assert!(math::exp(f32::NAN).is_nan() && math::ln(-1.0).is_nan() && math::tanh(f32::NAN).is_nan());
    assert_eq!(math::ln(0.0), f32::NEG_INFINITY);
    assert_eq!(math::tanh(20.0), 1.0);
    assert_eq!(math::tanh(-20.0), -1.0);
    assert!((math::sigmoid(0.0) - 0.5).abs() < 1e-7);
}

#[test]
fn strided_and_reduce_index_maps() {
    use kiln::gpu::kernels::tensor_ops::{Strided2, offset_of, strided_offsets};
    // transpose of a 2x3 as a strided read: out (3, 2), input strides (1, 3)
    let p = Strided2 { n: 6, dims: [1, 1, 3, 2], a: [0, 0, 1, 3], b: [0; 4], op: 0 };
    let got: Vec<u32> = (0..6).map(|i| strided_offsets(&p, i).0).collect();
    assert_eq!(got, [0, 3, 1, 4, 2, 5]);
    // row broadcast: b of shape (3) against out (2, 3)
    let p = Strided2 { n: 6, dims: [1, 1, 2, 3], a: [0, 0, 3, 1], b: [0, 0, 0, 1], op: 0 };
    assert_eq!((0..6).map(|i| strided_offsets(&p, i).1).collect::<Vec<_>>(), [0, 1, 2, 0, 1, 2]);
    assert_eq!(offset_of(&[1, 2, 3, 4], &[0, 12, 4, 1], 23), 23);
    assert_eq!(offset_of(&[1, 1, 1, 4], &[0, 0, 0, 6], 3), 18);
}

#[test]
fn welford_combine_matches_two_pass() {
    use kiln::gpu::kernels::tensor_ops::welford_combine;
    let xs = [1.0f32, 4.0, -2.0, 7.5, 3.25, 0.0, 9.0];
    let state = |v: &[f32]| {
        let n = v.len() as f32;
        let m = v.iter().sum::<f32>() / n;
        (n, m, v.iter().map(|x| (x - m) * (x - m)).sum::<f32>())
    };
    let c = welford_combine(state(&xs[..3]), state(&xs[3..]));
    let all = state(&xs);
    assert!((c.0 - all.0).abs() < 1e-6 && (c.1 - all.1).abs() < 1e-5 && (c.2 - all.2).abs() < 1e-4, "{c:?} {all:?}");
    assert_eq!(welford_combine((0.0, 0.0, 0.0), (0.0, 0.0, 0.0)), (0.0, 0.0, 0.0));
    assert_eq!(welford_combine((0.0, 0.0, 0.0), (2.0, 3.0, 1.0)), (2.0, 3.0, 1.0));
}

#[test]
fn hgemm_swizzle_spreads_ldmatrix_rows_over_banks() {
    use kiln::gpu::kernels::hgemm_mma::{chunk_offset, swizzled_chunk};
    // Any 8 consecutive rows (an ldmatrix phase) at one logical chunk land in 8 distinct 16-byte
    // bank groups of a 128-byte window, and the map is a bijection on each row's chunks; for the
    // 64-byte rows of the first rung and the 128-byte rows of the wide one.
    for row_bytes in [64u32, 128] {
        let chunks = row_bytes / 16;
        for start in 0..120u32 {
            for chunk in 0..chunks {
                let groups: HashSet<u32> =
                    (start..start + 8).map(|r| (chunk_offset(row_bytes, r, chunk) % 128) / 16).collect();
                assert_eq!(groups.len(), 8, "{row_bytes}-byte rows {start}.. chunk {chunk}");
            }
        }
        for r in 0..256u32 {
            let offs: HashSet<u32> = (0..chunks).map(|c| chunk_offset(row_bytes, r, c)).collect();
            assert_eq!(offs.len(), chunks as usize);
            assert!(offs.iter().all(|&o| o / row_bytes == r && o % 16 == 0));
        }
    }
    for r in 0..128u32 {
        for c in 0..4 {
            assert_eq!(swizzled_chunk(r, c), r * 64 + ((c ^ ((r / 2) % 4)) * 16));
        }
    }
}

#[test]
fn hgemm_tiles_fit_the_sm_and_the_chooser_fills_the_h200() {
    use kiln::cuda::gemm::hgemm_tile_for;
    use kiln::gpu::kernels::hgemm_mma::{HGEMM_NARROW, HGEMM_WIDE};
    use kiln::gpu::kernels::mma_tile::GemmShape;
    // 227 KiB of dynamic shared memory per block on sm_90 (and sm_80's 163 KiB for the narrow tile)
    assert_eq!(HGEMM_WIDE.smem_bytes(), 4 * 48 * 1024);
    assert!(HGEMM_WIDE.smem_bytes() <= 227 * 1024);
    assert_eq!(HGEMM_NARROW.smem_bytes(), 64 * 1024); // fits sm_80's 163 KiB too
    let s = |m, n| GemmShape { m, n, k: 4096 };
    let h200 = 227 * 1024;
    assert_eq!(hgemm_tile_for(s(4096, 4096), h200, 132), HGEMM_WIDE); // 512 blocks
    assert_eq!(hgemm_tile_for(s(4096, 4096), 163 * 1024, 108), HGEMM_NARROW); // an A100 block's limit
    assert_eq!(hgemm_tile_for(s(1024, 1024), h200, 132), HGEMM_NARROW); // 32 wide blocks, 64 narrow
    assert_eq!(hgemm_tile_for(s(3072, 768), h200, 132), HGEMM_NARROW); // 72 wide blocks
    assert_eq!(hgemm_tile_for(s(3072, 768), h200, 72), HGEMM_WIDE); // ... enough for a 72-SM part
    assert_eq!(HGEMM_WIDE.blocks(s(129, 257)), 4);
}

#[test]
fn wgmma_accumulator_layout_and_ring_parities() {
    use kiln::gpu::kernels::gemm_wgmma::{WG_STAGES, empty_parity, full_parity, tile_descriptor};
    use kiln::gpu::wgmma::acc_m64n128;
    let mut seen = HashSet::new();
    for t in 0..128 {
        for i in 0..64 {
            let (r, c) = acc_m64n128(t, i);
            assert!(r < 64 && c < 128);
            assert!(seen.insert((r, c)), "({r}, {c}) twice");
        }
    }
    assert_eq!(seen.len(), 64 * 128);
    // thread 5 (warp 0, group 1, quad 1): d0 = (1, 2), d2 = (9, 2), d4 = (1, 10)
    assert_eq!(acc_m64n128(5, 0), (1, 2));
    assert_eq!(acc_m64n128(5, 2), (9, 2));
    assert_eq!(acc_m64n128(5, 4), (1, 10));
    assert_eq!(acc_m64n128(37, 0), (17, 2));
    // consumers wait phase t / STAGES of full[t % STAGES]; the producer waits the previous lap's
    // release of empty[t % STAGES]
    for t in 0..40 {
        assert_eq!(full_parity(t), (t / WG_STAGES) % 2);
        if t >= WG_STAGES {
            assert_eq!(empty_parity(t), full_parity(t - WG_STAGES));
        }
    }
    // k steps advance the descriptor's start address by 32 bytes (2 units of 16)
    let d0 = tile_descriptor(0x4000, 0);
    assert_eq!(tile_descriptor(0x4000, 3) - d0, 6);
    assert_eq!((d0 >> 32) & 0x3fff, 64); // SBO 1024 bytes
    assert_eq!(d0 >> 62, 1); // 128-byte swizzle
}

#[test]
fn tcgen05_descriptor_encodings() {
    use kiln::gpu::tcgen05::{Accum, F16Kind, Layout, Major, instr_desc_f16, smem_desc};
    // bf16 x bf16 -> f32, M 128, N 256, both K-major: D format 1 at bit 4, A and B format 1 at
    // bits 7 and 10, N >> 3 = 32 at bit 17, M >> 4 = 8 at bit 24.
    let d = instr_desc_f16(F16Kind::Bf16, F16Kind::Bf16, Accum::F32, 128, 256, Major::K, Major::K).unwrap();
    assert_eq!(d, (1 << 4) | (1 << 7) | (1 << 10) | (32 << 17) | (8 << 24));
    assert_eq!(d, 0x0840_0490);
    let e = instr_desc_f16(F16Kind::F16, F16Kind::F16, Accum::F16, 64, 8, Major::MN, Major::K).unwrap();
    assert_eq!(e, (1 << 15) | (1 << 17) | (4 << 24));
    let f = instr_desc_f16(F16Kind::F16, F16Kind::Bf16, Accum::F32, 64, 64, Major::K, Major::MN).unwrap();
    assert_eq!((f >> 7) & 7, 0);
    assert_eq!((f >> 10) & 7, 1);
    assert_eq!((f >> 16) & 1, 1);
    // shapes the instruction does not have
    assert!(instr_desc_f16(F16Kind::Bf16, F16Kind::Bf16, Accum::F32, 128, 8, Major::K, Major::K).is_none());
    assert!(instr_desc_f16(F16Kind::Bf16, F16Kind::Bf16, Accum::F32, 64, 12, Major::K, Major::K).is_none());
    assert!(instr_desc_f16(F16Kind::Bf16, F16Kind::Bf16, Accum::F32, 96, 64, Major::K, Major::K).is_none());
    assert!(instr_desc_f16(F16Kind::Bf16, F16Kind::Bf16, Accum::F32, 128, 272, Major::K, Major::K).is_none());
    // the shared-memory descriptor (PTX ISA, "Shared memory descriptor"): bits 46-48 the fixed
    // 0b001, bits 53-60 zero, layout in the top 3 bits (128B swizzle = 2)
    let s = smem_desc(0x8000, 16, 1024, 0, Layout::Swizzle128B);
    assert_eq!(s & 0x3fff, 0x800);
    assert_eq!((s >> 16) & 0x3fff, 1);
    assert_eq!((s >> 32) & 0x3fff, 64);
    assert_eq!((s >> 46) & 0b111, 0b001);
    assert_eq!((s >> 53) & 0xff, 0);
    // no field spills into the fixed bits, whatever its operands
    let full = smem_desc(u32::MAX, u32::MAX, u32::MAX, 7, Layout::Swizzle32B);
    assert_eq!((full >> 46) & 0b111, 0b001);
    assert_eq!((full >> 53) & 0xff, 0);
    assert_eq!((full >> 14) & 3, 0);
    assert_eq!((full >> 30) & 3, 0);
    assert_eq!(s >> 61, 2);
    assert_eq!(smem_desc(0, 0, 0, 0, Layout::Swizzle32B) >> 61, 6);
    assert_eq!((smem_desc(0, 0, 0, 5, Layout::Interleave) >> 49) & 7, 5);
}

/// The Blackwell GEMM's encodings and schedule, checked on the host (no Blackwell GPU here): its
/// instruction descriptor, its operand descriptors across a stage's four k steps, its shared-memory
/// and TMEM budgets, and the tile walk and accumulator parities, replayed against a model of the
/// barriers' phase counts for many grids.
#[test]
fn tcgen05_gemm_encodings_and_schedule() {
    use kiln::gpu::kernels::gemm_tcgen05::*;
    use kiln::gpu::kernels::gemm_wgmma::{WG_BK, WG_STAGES, WW_STAGE_BYTES};
    use kiln::gpu::tcgen05::{tmem_addr, valid_alloc_columns, warp_lane_base};
    assert_eq!(TC_IDESC, 0x0840_0490); // bf16 x bf16 -> f32, 128 x 256, K-major (see above)
    for kk in 0..WG_BK / TC_UMMA_K {
        let d = operand_descriptor(0x1_0400, kk);
        assert_eq!(d & 0x3fff, ((0x1_0400 + 32 * kk) >> 4) as u64, "start address at k step {kk}");
        assert_eq!((d >> 32) & 0x3fff, 64, "8-row groups 1024 bytes apart");
        assert_eq!((d >> 46) & 3, 1, "descriptor version 1");
        assert_eq!(d >> 61, 2, "128-byte swizzle");
        // the k steps stay inside the first 128-byte swizzle row of the 1024-byte atom
        assert!(32 * kk + 32 <= 128);
    }
    // budgets: 4 stages of 48 KiB, the barriers and the TMEM slot within the 227 KiB a block may
    // take; all 512 TMEM columns, a legal allocation
    assert_eq!(WW_STAGE_BYTES, (TC_BM + TC_BN) * WG_BK * 2);
    assert!(TC_SMEM_BYTES <= 227 * 1024, "{TC_SMEM_BYTES}");
    assert!(TC_ACC_BARRIERS.is_multiple_of(8) && TC_TMEM_SLOT.is_multiple_of(8));
    assert!(valid_alloc_columns(TC_TMEM_COLUMNS) && TC_TMEM_COLUMNS == 512);
    // TMEM addressing: lane in the high half; the epilogue warps 4..8 cover lanes 0..128 once each
    assert_eq!(tmem_addr(0x20, 96, 256 + 64), (96 << 16) + 0x20 + 320);
    let lanes: Vec<u32> = (TC_EPI_WARP0..TC_EPI_WARP0 + 4).map(warp_lane_base).collect();
    assert_eq!(lanes, [0, 32, 64, 96]);
    assert_eq!(TC_EPI_THREADS, 4 * 32);
    // the schedule: every tile exactly once over the CTAs; the barrier waits match a model of
    // each barrier's completed phases
    for (tiles_m, tiles_n, ctas) in [(1u32, 1u32, 1u32), (3, 2, 4), (9, 5, 7), (33, 17, 148), (64, 32, 132)] {
        let mut seen = vec![0u32; (tiles_m * tiles_n) as usize];
        for cta in 0..ctas {
            let mut acc_full_done = [0u32; 2]; // completions of acc_full[b] so far
            let mut acc_empty_done = [0u32; 2];
            let mut j = 0;
            while let Some((tm, tn)) = tc_tile(cta, ctas, j, tiles_m, tiles_n) {
                seen[(tm * tiles_n + tn) as usize] += 1;
                let b = accumulator(j) as usize;
                if j >= 2 {
                    // the issuer needs the release of tile j - 2: completion number acc_empty_done[b] - 1
                    assert_eq!(acc_empty_parity(j), (acc_empty_done[b] - 1) & 1, "acc_empty wait, tile {j}");
                }
                acc_full_done[b] += 1; // the issuer's commit after the tile's last k tile
                // the epilogue waits for that completion (number acc_full_done[b] - 1)
                assert_eq!(acc_full_parity(j), (acc_full_done[b] - 1) & 1, "acc_full wait, tile {j}");
                acc_empty_done[b] += 1; // the epilogue's 128 arrivals
                j += 1;
            }
            assert_eq!(j, (tiles_m * tiles_n).saturating_sub(cta).div_ceil(ctas), "turns of CTA {cta}");
        }
        assert!(seen.iter().all(|&c| c == 1), "{tiles_m}x{tiles_n} over {ctas} CTAs: a tile taken {seen:?}");
    }
    let _ = WG_STAGES;
}

#[test]
fn grouped_tile_order_is_a_bijection() {
    use kiln::gpu::kernels::gemm_wgmma::grouped_tile;
    for (tm, tn, g) in [(1u32, 1u32, 8u32), (9, 3, 8), (64, 32, 8), (17, 5, 4), (3, 40, 8)] {
        let mut seen = vec![false; (tm * tn) as usize];
        for b in 0..tm * tn {
            let (r, c) = grouped_tile(b, tm, tn, g);
            assert!(r < tm && c < tn, "block {b} -> ({r}, {c}) outside {tm}x{tn}");
            assert!(!std::mem::replace(&mut seen[(r * tn + c) as usize], true), "tile ({r}, {c}) twice");
        }
        // consecutive blocks walk down a group's rows first
        if tm >= 2 {
            assert_eq!(grouped_tile(1, tm, tn, g), (1, 0));
        }
    }
}

#[test]
fn persistent_clusters_cover_every_unit_once() {
    use kiln::gpu::kernels::gemm_wgmma::persistent_tile;
    for (tm, tn) in [(1u32, 1u32), (16, 16), (7, 3), (33, 5)] {
        for (splits, batches) in [(1u32, 1u32), (2, 1), (5, 1), (1, 3)] {
            for clusters in [1u32, 5, 64, 66, 1000] {
                let units = tm * tn * splits * batches;
                let mut seen = vec![0u32; units as usize];
                for c in 0..clusters.min(units) {
                    let mut i = 0;
                    while let Some((b, r, col, sp)) = persistent_tile(c, clusters, i, tm, tn, splits, batches) {
                        assert!(
                            b < batches && r < tm && col < tn && sp < splits,
                            "unit ({b}, {r}, {col}, {sp}) outside"
                        );
                        seen[(((b * tm + r) * tn + col) * splits + sp) as usize] += 1;
                        i += 1;
                    }
                }
                assert!(seen.iter().all(|&s| s == 1), "{tm} x {tn} x {splits} x {batches} over {clusters}: {seen:?}");
            }
        }
    }
}

#[test]
fn split_k_parts_tile_k_and_the_choice_splits_only_long_thin_products() {
    use kiln::gpu::kernels::gemm_wgmma::{choose_split_k, split_k_fits, split_k_range};
    for k_tiles in 1u32..300 {
        for splits in 1u32..=64 {
            let parts: Vec<(u32, u32)> = (0..splits).map(|sp| split_k_range(k_tiles, splits, sp)).collect();
            // consecutive, covering 0..k_tiles exactly once
            let mut next = 0;
            for &(first, count) in &parts {
                assert_eq!(first.min(k_tiles), next.min(k_tiles), "{k_tiles} in {splits}: {parts:?}");
                next = first + count;
            }
            assert_eq!(parts.iter().map(|p| p.1).sum::<u32>(), k_tiles);
            assert_eq!(split_k_fits(k_tiles, splits), parts.iter().all(|p| p.1 > 0), "{k_tiles} in {splits}");
        }
        for tiles in [1u32, 6, 33] {
            let s = choose_split_k(tiles, k_tiles, 66);
            assert!(split_k_fits(k_tiles, s), "{tiles} tiles, {k_tiles} k tiles: {s} parts");
            assert!(tiles as u64 * s as u64 <= 66 || s == 1, "{tiles} tiles in {s} parts: more than one wave");
        }
    }
    let k_tiles = |k: u32| k.div_ceil(64);
    // one cluster tile, 1024 k tiles: 64 parts of 16 (one wave); 6 tiles (512 x 768) with 512 k
    // tiles: 11 parts of 47 (66 units, one wave)
    assert_eq!(choose_split_k(1, k_tiles(65536), 66), 64);
    assert_eq!(choose_split_k(2 * 3, k_tiles(32768), 66), 11);
    // 3072 x 768 x 16384 (dW of a 3072 -> 768 layer at 16384 rows): 36 cluster tiles on 66
    // clusters, more than half of them busy: no split (measured slower with 5)
    assert_eq!(choose_split_k(12 * 3, k_tiles(16384), 66), 1);
    // enough tiles, or short k: no split
    assert_eq!(choose_split_k(16 * 16, k_tiles(4096), 66), 1);
    assert_eq!(choose_split_k(64 * 3, k_tiles(3072), 66), 1);
    assert_eq!(choose_split_k(16 * 4, k_tiles(4096), 66), 1);
    assert_eq!(choose_split_k(1, 1, 66), 1);
}

#[test]
fn persistent_stage_bytes_count_only_boxes_that_are_loaded() {
    use kiln::gpu::kernels::gemm_wgmma::{WG_TILE_BYTES, WP_B_SHARE_BYTES, WW_STAGE_BYTES, persistent_stage_bytes};
    use kiln::gpu::kernels::mma_tile::GemmShape;
    let s = GemmShape { m: 300, n: 300, k: 64 };
    // an interior tile: A and both B shares
    assert_eq!(persistent_stage_bytes(0, 0, s), WW_STAGE_BYTES);
    // the second CTA of a cluster tile below the matrix: no A
    assert_eq!(persistent_stage_bytes(384, 0, s), 2 * WP_B_SHARE_BYTES);
    // the last column panel: B rows 256..300 exist, 384.. do not
    assert_eq!(persistent_stage_bytes(256, 256, s), WG_TILE_BYTES + WP_B_SHARE_BYTES);
    assert_eq!(persistent_stage_bytes(0, 0, GemmShape { m: 1, n: 1, k: 8 }), WG_TILE_BYTES + WP_B_SHARE_BYTES);
}

/// The persistent kernel's staged epilogue: its boxes fit in a block's shared memory after the
/// ring and barriers, 1024-byte aligned (128-byte swizzling needs it); every thread's 16 outputs of
/// a subtile land on distinct words covering the 64 x 32 box once; and each warp-wide 8-byte store
/// touches every bank exactly twice (two wavefronts, the least 256 bytes can take).
#[test]
fn staged_epilogue_boxes_fit_and_stores_are_conflict_free() {
    use kiln::gpu::kernels::gemm_wgmma::{
        WG_CONSUMERS, WG_SWIZZLE, WP_EPI_BOX_BYTES, WP_EPI_BUFFERS, WP_EPI_COLS, WP_EPI_OFFSET, WP_SMEM_BYTES,
        WW_SMEM_BYTES,
    };
    use kiln::gpu::wgmma::acc_m64;
    assert!(WP_EPI_OFFSET >= WW_SMEM_BYTES && WP_EPI_OFFSET % 1024 == 0);
    assert_eq!(WP_SMEM_BYTES, WP_EPI_OFFSET + WG_CONSUMERS * WP_EPI_BUFFERS * WP_EPI_BOX_BYTES);
    assert!(WP_SMEM_BYTES <= 227 * 1024, "{WP_SMEM_BYTES} bytes exceed the 227 KiB a block may have");
    assert_eq!(WP_EPI_COLS * 4, WG_SWIZZLE.span());
    for j in 0..8u32 {
        let mut words = HashSet::new();
        for warp in 0..4u32 {
            for g in 0..4u32 {
                for h in 0..2u32 {
                    let mut banks = [0u32; 32];
                    for lane in 0..32u32 {
                        let (r, col) = acc_m64(warp * 32 + lane, 16 * j + 4 * g);
                        assert!((WP_EPI_COLS * j..WP_EPI_COLS * (j + 1)).contains(&col), "subtile {j}: column {col}");
                        let at = tile_offset(WG_SWIZZLE, r + 8 * h, col - WP_EPI_COLS * j, WP_EPI_COLS * 4, 4);
                        assert!(at % 8 == 0 && at + 8 <= WP_EPI_BOX_BYTES);
                        for w in [at / 4, at / 4 + 1] {
                            assert!(words.insert(w), "subtile {j}: word {w} written twice");
                            banks[(w % 32) as usize] += 1;
                        }
                    }
                    assert!(banks.iter().all(|&b| b == 2), "subtile {j} warp {warp} group {g}: banks {banks:?}");
                }
            }
        }
        assert_eq!(words.len() as u32, WP_EPI_BOX_BYTES / 4);
    }
}

#[test]
fn hgemm_copy_and_fragment_plans_cover_the_tiles() {
    use kiln::gpu::kernels::hgemm_mma::{
        CopyPlan, FragPlan, HGEMM_NARROW, HGEMM_THREADS, HGEMM_WIDE, HgemmTile, chunk_offset, rows_per_pass,
    };
    fn check<const BK: u32, const KS: usize, const BM: u32, const MI: usize, const NI: usize>(tile: HgemmTile) {
        assert_eq!((tile.bk, tile.bm, KS as u32), (BK, BM, BK / 16));
        let (rb, rpp) = (BK * 2, rows_per_pass(BK));
        let a_passes = tile.bm / rpp;
        // every 16-byte chunk of the A and B tiles is copied exactly once, to its swizzled place
        let mut seen = HashSet::new();
        for t in 0..HGEMM_THREADS {
            let p = CopyPlan::new::<BK>(t, 1000, 2000);
            for i in 0..(tile.bm + tile.bn) / rpp {
                let (row, offset) = if i < a_passes {
                    (p.a_row - 1000 + i * rpp, 0)
                } else {
                    (p.b_row - 2000 + (i - a_passes) * rpp, tile.bm)
                };
                let chunk = p.col / 8;
                let pass = if i < a_passes { i } else { i - a_passes };
                assert_eq!(p.dst + pass * rpp * rb, chunk_offset(rb, row, chunk), "t {t} pass {i}");
                assert!(seen.insert((offset + row, chunk)), "t {t} pass {i}: ({row}, {chunk}) twice");
            }
        }
        assert_eq!(seen.len() as u32, (tile.bm + tile.bn) * BK / 8);
        // a lane's ldmatrix rows: A rows 0-15 and B rows 0-15 of its warp's tile at each 16 of k;
        // the other fragments sit 16 rows (16 * rb bytes) apart
        let warps_n = tile.bn / (8 * NI as u32);
        for w in 0..HGEMM_THREADS / 32 {
            let (wm, wn) = (w / warps_n, w % warps_n);
            for lane in 0..32 {
                let plan = FragPlan::<KS>::new::<BM, MI, NI>(wm, wn, lane);
                for ks in 0..KS as u32 {
                    let arow = wm * 16 * MI as u32 + lane % 16;
                    let brow = wn * 8 * NI as u32 + lane % 8 + (lane / 16) * 8;
                    for j in 0..MI as u32 {
                        let want = chunk_offset(rb, arow + j * 16, ks * 2 + lane / 16);
                        assert_eq!(plan.a[ks as usize] + j * 16 * rb, want, "A w {w} lane {lane} ks {ks} mi {j}");
                    }
                    for j in 0..NI as u32 / 2 {
                        let want = BM * rb + chunk_offset(rb, brow + j * 16, ks * 2 + (lane / 8) % 2);
                        assert_eq!(plan.b[ks as usize] + j * 16 * rb, want, "B w {w} lane {lane} ks {ks} pair {j}");
                    }
                }
            }
        }
    }
    check::<32, 2, 128, 4, 4>(HGEMM_NARROW);
    check::<64, 4, 128, 4, 8>(HGEMM_WIDE);
}

/// The chooser's table is what the recorded tuning run's times pick (`benches/gemm_tune.rs` wrote
/// both; recomputed here with the same rule), with a row for every layout, alignment and class.
#[test]
fn the_fp32_chooser_table_is_the_tuning_runs_pick() {
    use kiln::cuda::gemm::tuned::{TUNED, TUNED_ON};
    use kiln::cuda::gemm::{Layout, SizeClass, tuning_candidates, tuning_pick};
    for layout in [Layout::NN, Layout::NT, Layout::TN] {
        for aligned in [true, false] {
            for class in SizeClass::ALL {
                let rows: Vec<_> = TUNED.iter().filter(|t| t.0 == layout && t.1 == aligned && t.2 == class).collect();
                let want = if tuning_candidates(layout, aligned).is_empty() { 0 } else { 1 };
                assert_eq!(rows.len(), want, "{layout:?} aligned={aligned} {class:?}");
                if let Some(r) = rows.first() {
                    assert!(tuning_candidates(layout, aligned).iter().any(|c| c.name == r.3), "{}", r.3);
                }
            }
        }
    }
    // The recorded run, embedded when the test is built: the GPU bundle carries this binary
    // without the source tree.
    let text = include_str!("../benches/results/gemm_tune.json");
    let run: serde_json::Value = serde_json::from_str(text).expect("gemm_tune.json parses");
    let results = run["results"].as_array().expect("results");
    assert!(TUNED_ON.contains(run["device"].as_str().expect("device")), "{TUNED_ON}");
    for &(layout, aligned, class, name) in TUNED {
        let cands = tuning_candidates(layout, aligned);
        let shapes = class.shapes();
        let times: Vec<Vec<f64>> = cands
            .iter()
            .map(|c| {
                shapes
                    .iter()
                    .map(|&(m, n, k)| {
                        let (n, k) = if aligned { (n, k) } else { (n - 1, k - 1) };
                        results
                            .iter()
                            .find(|r| {
                                r["layout"] == format!("{layout:?}")
                                    && r["aligned"] == aligned
                                    && r["kernel"] == c.name
                                    && r["m"] == m
                                    && r["n"] == n
                                    && r["k"] == k
                            })
                            .and_then(|r| r["ms"].as_f64())
                            .unwrap_or_else(|| panic!("no time for {} at {m}x{n}x{k} ({layout:?})", c.name))
                    })
                    .collect()
            })
            .collect();
        let pick = cands[tuning_pick(&times).expect("candidates")].name;
        assert_eq!(pick, name, "{layout:?} aligned={aligned} {class:?}");
    }
}

#[test]
fn tuning_pick_prefers_the_best_total_relative_time() {
    use kiln::cuda::gemm::{SizeClass, tuning_pick};
    use kiln::gpu::kernels::mma_tile::GemmShape;
    // candidate 1 is best on two shapes and close on the third
    assert_eq!(tuning_pick(&[vec![1.0, 2.0, 2.0], vec![1.1, 1.0, 1.0]]), Some(1));
    assert_eq!(tuning_pick(&[vec![1.0], vec![1.0]]), Some(0));
    assert_eq!(tuning_pick(&[]), None);
    for class in SizeClass::ALL {
        for &(m, n, k) in class.shapes() {
            assert_eq!(SizeClass::of(GemmShape { m, n, k }), class, "{m}x{n}x{k}");
            assert_eq!(SizeClass::of(GemmShape { m, n: n - 1, k: k - 1 }), class, "{m}x{n}x{k} unaligned");
        }
    }
}

#[test]
fn flash_mma_swizzle_and_fragment_maps() {
    use kiln::gpu::kernels::flash_mma::flash_chunk_offset;
    // The swizzle: any 8 consecutive rows at one chunk hit 8 distinct 16-byte bank groups, and each
    // row's chunks stay in the row, one each (128- and 256-byte rows: head dims 64 and 128).
    for row_bytes in [128u32, 256] {
        let chunks = row_bytes / 16;
        for start in 0..120u32 {
            for chunk in 0..chunks {
                let groups: HashSet<u32> =
                    (start..start + 8).map(|r| (flash_chunk_offset(row_bytes, r, chunk) % 128) / 16).collect();
                assert_eq!(groups.len(), 8, "{row_bytes}-byte rows {start}.. chunk {chunk}");
            }
        }
        for r in 0..128u32 {
            let offs: HashSet<u32> = (0..chunks).map(|c| flash_chunk_offset(row_bytes, r, c)).collect();
            assert_eq!(offs.len(), chunks as usize);
            assert!(offs.iter().all(|&o| o / row_bytes == r && o % 16 == 0));
        }
    }
    for lane in 0..32u32 {
        // Two n8 accumulator tiles of S are the A fragment of one k step of P V: element i of A is
        // element i % 4 of tile i / 4, its column shifted by 8 per tile.
        for i in 0..8u32 {
            let (r, c) = m16n8_c(lane, i % 4);
            assert_eq!((r, c + 8 * (i / 4)), m16n8k16_a(lane, i), "P: lane {lane} element {i}");
        }
        for step in 0..2u32 {
            for j in 0..4u32 {
                for half in 0..2u32 {
                    let (k, n) = m16n8k16_b(lane, 2 * (j % 2) + half);
                    // K for S (ldmatrix.x4, not transposed): lane s addresses key
                    // 16 step + s % 8 + 8 (s / 16) at chunk 2 ks + (s / 8) % 2 of the [key][d] tile
                    let s = 8 * j + lane / 4;
                    let (key, chunk) = (16 * step + s % 8 + 8 * (s / 16), 2 * step + (s / 8) % 2);
                    let got = (key, chunk * 8 + 2 * (lane % 4) + half);
                    assert_eq!(got, (16 * step + 8 * (j / 2) + n, 16 * step + k), "K: lane {lane} reg {j} half {half}");
                    // V for P V (ldmatrix.x4.trans): lane s addresses key 16 kk + s % 8 + 8 ((s / 8) % 2)
                    // at chunk 2 dp + s / 16; transposed, lane l gets rows 2 (l % 4) + half, column l / 4
                    let s = 8 * j + 2 * (lane % 4) + half;
                    let (key, chunk) = (16 * step + s % 8 + 8 * ((s / 8) % 2), 2 * step + s / 16);
                    let got = (key, chunk * 8 + lane / 4);
                    assert_eq!(got, (16 * step + k, (2 * step + j / 2) * 8 + n), "V: lane {lane} reg {j} half {half}");
                }
            }
        }
    }
}
