//! CPU tests of the attention launchers' tables and checks.

use super::*;
use crate::error::Error;
use kiln_gpu::kernels::flash_bwd_simt::flash_bwd_smem_bytes;

#[test]
fn the_hopper_rung_is_refused_off_sm90a_and_not_dispatched_yet() {
    use kiln_gpu::Arch;
    check_arch(FlashKernel::Wgmma, Arch::Sm90a).unwrap();
    for arch in [Arch::Sm80, Arch::Sm100a] {
        let e = check_arch(FlashKernel::Wgmma, arch).unwrap_err();
        assert!(e.to_string().contains("sm_90a") && e.to_string().contains("MmaSync"), "{e}");
        check_arch(FlashKernel::MmaSync, arch).unwrap();
        check_arch(FlashKernel::Simt, arch).unwrap();
    }
    for arch in Arch::ALL {
        let want = match arch == Arch::Sm90a {
            true if FLASH_WGMMA_PP_DISPATCH => FlashKernel::WgmmaPingPong,
            true if FLASH_WGMMA_DISPATCH => FlashKernel::Wgmma,
            _ => FlashKernel::MmaSync,
        };
        assert_eq!(flash_forward_kernel(DType::BF16, 128, arch), Some(want));
        assert_eq!(flash_forward_kernel(DType::F16, 64, arch), Some(want));
        assert_eq!(flash_forward_kernel(DType::F32, 64, arch), Some(FlashKernel::Simt));
        assert_eq!(flash_forward_kernel(DType::BF16, 96, arch), None);
        assert_eq!(flash_forward_kernel(DType::F64, 64, arch), None);
    }
    assert_eq!(FlashBwdKernel::of_forward(FlashKernel::Wgmma), FlashBwdKernel::MmaSync);
    assert!(FlashKernel::Wgmma.needs_16_byte_alignment());
    assert_eq!(FlashKernel::Wgmma.dtypes(), vec![DType::BF16, DType::F16]);
    // Q, two stages of K and V, five barriers; under the 227 KiB opt-in of Hopper
    assert_eq!(FlashKernel::Wgmma.smem_bytes(64), 5 * 8192 + 40);
    assert_eq!(FlashKernel::Wgmma.smem_bytes(128), 5 * 16384 + 40);
    assert_eq!(FlashKernel::Wgmma2.smem_bytes(128), 6 * 16384 + 40);
    assert!(check_arch(FlashKernel::Wgmma2, Arch::Sm80).is_err());
    assert_eq!(FlashKernel::Wgmma2.threads(), 288);
    assert_eq!(FlashBwdKernel::of_forward(FlashKernel::Wgmma2), FlashBwdKernel::MmaSync);
    // the ping-pong kernel: 384 threads, 128 rows, two Q tiles and 3 stages of K and V, sm_90a only
    assert_eq!(FlashKernel::WgmmaPingPong.threads(), 384);
    assert_eq!(FlashKernel::WgmmaPingPong.block_rows(), 128);
    assert_eq!(FlashKernel::WgmmaPingPong.smem_bytes(64), 8 * 8192 + 56);
    assert_eq!(FlashKernel::WgmmaPingPong.smem_bytes(128), 8 * 16384 + 56);
    assert!(check_arch(FlashKernel::WgmmaPingPong, Arch::Sm80).is_err());
    assert!(check_arch(FlashKernel::WgmmaPingPong, Arch::Sm90a).is_ok());
    assert_eq!(flash_entry("flash_fwd_wgmma_pp_bf16").unwrap().kernel, FlashKernel::WgmmaPingPong);
    assert_eq!(flash_entry("flash_fwd_wgmma_pp_f16").unwrap().dtype, DType::F16);
    // not dispatched until measured: the const flip is the only switch
    let pick = flash_forward_kernel(DType::BF16, 128, Arch::Sm90a);
    assert_eq!(pick == Some(FlashKernel::WgmmaPingPong), FLASH_WGMMA_PP_DISPATCH);
    let e = check_forward(FlashKernel::Wgmma, DType::BF16, SHAPE, 0.1, lens(SHAPE), [0, 8, 0, 0, 0]).unwrap_err();
    assert!(e.to_string().contains("16-byte"), "{e}");
}

#[test]
fn the_hopper_rung_maps_are_valid_tensor_maps() {
    for d in FLASH_HEAD_DIMS {
        for dtype in [DType::BF16, DType::F16] {
            let spec = wgmma_qkv_spec(dtype, 6 * 17, *d);
            spec.validate(0x1000).unwrap();
            assert_eq!(spec.box_bytes(), 64 * 64 * 2);
            assert!(spec.validate(0x1008).is_err());
        }
    }
}

const SHAPE: AttentionShape = AttentionShape { batch: 2, heads: 3, q_len: 17, kv_len: 33, head_dim: 64 };

fn lens(s: AttentionShape) -> [usize; 5] {
    [s.q_elems(), s.kv_elems(), s.kv_elems(), s.q_elems(), s.lse_elems()]
}

#[test]
fn the_table_accepts_its_pairs_and_refuses_the_rest_with_what_to_use() {
    for e in FLASH_KERNELS {
        for d in FLASH_HEAD_DIMS {
            let s = AttentionShape { head_dim: *d, ..SHAPE };
            check_forward(e.kernel, e.dtype, s, 0.125, lens(s), [0; 5]).unwrap();
        }
        assert_eq!(flash_entry(e.name).unwrap(), *e);
    }
    let e = check_forward(FlashKernel::MmaSync, DType::F32, SHAPE, 0.125, lens(SHAPE), [0; 5]).unwrap_err();
    assert!(e.to_string().contains("use flash_fwd_simt_f32"), "{e}");
    let e = check_forward(FlashKernel::Simt, DType::F16, SHAPE, 0.125, lens(SHAPE), [0; 5]).unwrap_err();
    assert!(e.to_string().contains("flash_fwd_mma_f16"), "{e}");
    let e = check_forward(FlashKernel::Simt, DType::F64, SHAPE, 0.125, lens(SHAPE), [0; 5]).unwrap_err();
    assert!(e.to_string().contains("convert the inputs"), "{e}");
    assert!(flash_entry("flash_fwd_nope").unwrap_err().to_string().contains("flash_fwd_mma_bf16"));
}

#[test]
fn head_dims_scales_sizes_and_alignment_are_checked() {
    let s = AttentionShape { head_dim: 96, ..SHAPE };
    let e = check_forward(FlashKernel::Simt, DType::F32, s, 0.1, lens(s), [0; 5]).unwrap_err();
    assert!(e.to_string().contains("head dim 96"), "{e}");
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert!(check_forward(FlashKernel::Simt, DType::F32, SHAPE, bad, lens(SHAPE), [0; 5]).is_err());
    }
    let mut l = lens(SHAPE);
    l[4] -= 1;
    let e = check_forward(FlashKernel::Simt, DType::F32, SHAPE, 0.1, l, [0; 5]).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }) && e.to_string().contains("lse: 102"), "{e}");
    let e = check_forward(FlashKernel::MmaSync, DType::BF16, SHAPE, 0.1, lens(SHAPE), [0, 0, 8, 0, 0]).unwrap_err();
    assert!(e.to_string().contains("16-byte"), "{e}");
    check_forward(FlashKernel::Simt, DType::BF16, SHAPE, 0.1, lens(SHAPE), [0, 0, 8, 0, 0]).unwrap();
    let wide = AttentionShape { batch: 256, heads: 256, ..SHAPE };
    assert!(check_forward(FlashKernel::Simt, DType::F32, wide, 0.1, lens(wide), [0; 5]).is_err());
}

#[test]
fn shared_memory_fits_an_sm_80_block() {
    // sm_80 (A100) allows 163 KiB per block with the opt-in; sm_86/89 99 KiB
    for e in FLASH_KERNELS {
        for &d in FLASH_HEAD_DIMS {
            // the Hopper kernels run only on sm_90a, which allows 227 KiB per block with the opt-in
            let limit = if e.kernel.is_hopper() { 227 } else { 99 } * 1024;
            assert!(e.kernel.smem_bytes(d) <= limit, "{e:?} d {d}: {}", e.kernel.smem_bytes(d));
        }
    }
    assert_eq!(FlashKernel::MmaSync.smem_bytes(128), 80 * 1024);
    // the backward needs the opt-in on every GPU: 106 KiB at head dim 128 (an A100 allows 163)
    assert!(flash_bwd_smem_bytes(128) <= 163 * 1024 && flash_bwd_smem_bytes(64) <= 99 * 1024);
}

fn bwd_lens(s: AttentionShape) -> [usize; 9] {
    let (q, kv) = (s.q_elems(), s.kv_elems());
    [q, kv, kv, q, s.lse_elems(), q, q, kv, kv]
}

#[test]
fn the_backward_picks_mma_sync_for_16_bit_types_and_simt_for_f32() {
    for d in [64, 128] {
        assert_eq!(flash_backward_kernel(DType::BF16, d), Some(FlashBwdKernel::MmaSync));
        assert_eq!(flash_backward_kernel(DType::F16, d), Some(FlashBwdKernel::MmaSync));
        assert_eq!(flash_backward_kernel(DType::F32, d), Some(FlashBwdKernel::Simt));
        assert!(flash_backward_supports(DType::F16, d));
    }
    assert_eq!(flash_backward_kernel(DType::F64, 64), None);
    assert!(!flash_backward_supports(DType::BF16, 96));
    assert!(FlashBwdKernel::Simt.supports(DType::BF16, 64) && !FlashBwdKernel::Simt.supports(DType::F16, 64));
    for k in [FlashKernel::Simt, FlashKernel::MmaSync] {
        assert_eq!(FlashBwdKernel::of_forward(k).forward(), k);
    }
}

#[test]
fn the_backward_checks_dtypes_sizes_and_alignment() {
    let l = bwd_lens(SHAPE);
    check_backward(FlashBwdKernel::MmaSync, DType::BF16, SHAPE, 0.1, l, [0; 9]).unwrap();
    check_backward(FlashBwdKernel::MmaSync, DType::F16, SHAPE, 0.1, l, [0; 9]).unwrap();
    let e = check_backward(FlashBwdKernel::MmaSync, DType::F32, SHAPE, 0.1, l, [0; 9]).unwrap_err();
    assert!(e.to_string().contains("flash_fwd_simt_f32") && e.to_string().contains("MmaSync backward"), "{e}");
    let e = check_backward(FlashBwdKernel::Simt, DType::F16, SHAPE, 0.1, l, [0; 9]).unwrap_err();
    assert!(e.to_string().contains("flash_fwd_mma_f16"), "{e}");
    let mut short = l;
    short[7] -= 1;
    let e = check_backward(FlashBwdKernel::MmaSync, DType::BF16, SHAPE, 0.1, short, [0; 9]).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }) && e.to_string().contains("dk"), "{e}");
    // a misaligned gradient is refused by MmaSync; the lse (f32, read per element) may be at 4
    let mut addrs = [0u64; 9];
    addrs[8] = 8;
    let e = check_backward(FlashBwdKernel::MmaSync, DType::BF16, SHAPE, 0.1, l, addrs).unwrap_err();
    assert!(e.to_string().contains("16-byte"), "{e}");
    check_backward(FlashBwdKernel::Simt, DType::BF16, SHAPE, 0.1, l, addrs).unwrap();
    let mut addrs = [0u64; 9];
    addrs[4] = 4;
    check_backward(FlashBwdKernel::MmaSync, DType::BF16, SHAPE, 0.1, l, addrs).unwrap();
    let s = AttentionShape { head_dim: 96, ..SHAPE };
    assert!(check_backward(FlashBwdKernel::MmaSync, DType::BF16, s, 0.1, bwd_lens(s), [0; 9]).is_err());
}

#[test]
fn the_mma_backward_fits_shared_memory_and_walks_the_right_query_blocks() {
    use kiln_gpu::kernels::flash_bwd_mma::flash_bwd_query_blocks;
    assert_eq!(FlashBwdKernel::MmaSync.smem_bytes(64), 48 * 1024);
    assert_eq!(FlashBwdKernel::MmaSync.smem_bytes(128), 96 * 1024);
    let p = |q_len, kv_len, causal: bool| {
        AttentionShape { batch: 1, heads: 1, q_len, kv_len, head_dim: 64 }.params(causal, 0.1)
    };
    // without the mask every key block walks every query block
    assert_eq!(flash_bwd_query_blocks(p(1000, 1000, false), 640), (0, 16));
    // with it, from the block of the first row that sees the first key (rows see j <= i + kv - q)
    assert_eq!(flash_bwd_query_blocks(p(1000, 1000, true), 0), (0, 16));
    assert_eq!(flash_bwd_query_blocks(p(1000, 1000, true), 640), (10, 6));
    assert_eq!(flash_bwd_query_blocks(p(1000, 1000, true), 960), (15, 1));
    // q_len < kv_len: the first keys are seen by every row
    assert_eq!(flash_bwd_query_blocks(p(17, 129, true), 64), (0, 1));
    // q_len > kv_len: rows 0..871 see no key; key 0 is first seen by row 871
    assert_eq!(flash_bwd_query_blocks(p(1000, 129, true), 0), (13, 3));
    // brute force against the mask itself
    for (q, kv) in [(1, 1), (17, 17), (129, 17), (17, 129), (1000, 129), (200, 1000)] {
        let pp = p(q, kv, true);
        for k0 in (0..kv).step_by(64) {
            let (b, n) = flash_bwd_query_blocks(pp, k0);
            let first = (0..q).find(|&i| pp.visible_keys(i) > k0);
            match first {
                Some(i) => assert!(b * 64 <= i && i < (b + 1) * 64 && b + n == q.div_ceil(64), "{q} {kv} {k0}"),
                None => assert_eq!(n, 0, "{q} {kv} {k0}"),
            }
        }
    }
}
