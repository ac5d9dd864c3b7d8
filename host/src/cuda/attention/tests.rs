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
        // on sm_90a: the two-consumer form (128-key tiles) at head dim 128, the one-consumer one at 64
        let want = |d: u32| match arch == Arch::Sm90a {
            true if FLASH_WGMMA_PP_DISPATCH => FlashKernel::WgmmaPingPong,
            true if FLASH_WGMMA_DISPATCH && d == 128 => FlashKernel::Wgmma2,
            true if FLASH_WGMMA_DISPATCH => FlashKernel::Wgmma,
            _ => FlashKernel::MmaSync,
        };
        assert_eq!(flash_forward_kernel(DType::BF16, 128, arch), Some(want(128)));
        assert_eq!(flash_forward_kernel(DType::F16, 128, arch), Some(want(128)));
        assert_eq!(flash_forward_kernel(DType::F16, 64, arch), Some(want(64)));
        assert_eq!(flash_forward_kernel(DType::BF16, 64, arch), Some(want(64)));
        assert_eq!(flash_forward_kernel(DType::F32, 64, arch), Some(FlashKernel::Simt));
        assert_eq!(flash_forward_kernel(DType::BF16, 96, arch), None);
        assert_eq!(flash_forward_kernel(DType::F64, 64, arch), None);
    }
    let hopper_bwd = if FLASH_BWD_WGMMA_DISPATCH { FlashBwdKernel::Wgmma2 } else { FlashBwdKernel::MmaSync };
    assert_eq!(FlashBwdKernel::of_forward(FlashKernel::Wgmma), hopper_bwd);
    assert!(FlashKernel::Wgmma.needs_16_byte_alignment());
    assert_eq!(FlashKernel::Wgmma.dtypes(), vec![DType::BF16, DType::F16]);
    // Q, two stages of K and V, six barriers and the Q buffer's tile number; under the 227 KiB
    // opt-in of Hopper
    assert_eq!(FlashKernel::Wgmma.smem_bytes(64), 5 * 8192 + 56);
    assert_eq!(FlashKernel::Wgmma.smem_bytes(128), 5 * 16384 + 56);
    // two buffers of two Q tiles, two stages of 128-key K and V (four 64-row tiles each), eight
    // barriers and two tile numbers
    assert_eq!(FlashKernel::Wgmma2.smem_bytes(128), 12 * 16384 + 80);
    assert!(FlashKernel::Wgmma2.smem_bytes(128) <= 227 * 1024);
    assert!(check_arch(FlashKernel::Wgmma2, Arch::Sm80).is_err());
    assert_eq!(FlashKernel::Wgmma2.threads(), 384);
    let hopper_bwd2 = if FLASH_BWD_WGMMA_DISPATCH { FlashBwdKernel::Wgmma2 } else { FlashBwdKernel::MmaSync };
    assert_eq!(FlashBwdKernel::of_forward(FlashKernel::Wgmma2), hopper_bwd2);
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
    use kiln_gpu::Arch;
    for arch in [Arch::Sm80, Arch::Sm100a] {
        for d in [64, 128] {
            assert_eq!(flash_backward_kernel(DType::BF16, d, arch), Some(FlashBwdKernel::MmaSync));
            assert_eq!(flash_backward_kernel(DType::F16, d, arch), Some(FlashBwdKernel::MmaSync));
            assert_eq!(flash_backward_kernel(DType::F32, d, arch), Some(FlashBwdKernel::Simt));
            assert!(flash_backward_supports(DType::F16, d));
        }
        assert_eq!(flash_backward_kernel(DType::F64, 64, arch), None);
    }
    assert!(!flash_backward_supports(DType::BF16, 96));
    assert!(FlashBwdKernel::Simt.supports(DType::BF16, 64) && !FlashBwdKernel::Simt.supports(DType::F16, 64));
    for k in [FlashKernel::Simt, FlashKernel::MmaSync] {
        assert_eq!(FlashBwdKernel::of_forward(k).forward(), k);
    }
}

#[test]
fn the_wgmma_backward_is_picked_on_sm90a_and_refused_elsewhere() {
    use kiln_gpu::Arch;
    // the two-consumer form: 1.4x the one-consumer form's speed on an H200 (run 230)
    let hopper = if FLASH_BWD_WGMMA_DISPATCH { FlashBwdKernel::Wgmma2 } else { FlashBwdKernel::MmaSync };
    for d in [64, 128] {
        assert_eq!(flash_backward_kernel(DType::BF16, d, Arch::Sm90a), Some(hopper));
        assert_eq!(flash_backward_kernel(DType::F16, d, Arch::Sm90a), Some(hopper));
        // f32 has no wgmma kernel: the CUDA-core rung on every module
        assert_eq!(flash_backward_kernel(DType::F32, d, Arch::Sm90a), Some(FlashBwdKernel::Simt));
    }
    assert_eq!(flash_backward_kernel(DType::BF16, 96, Arch::Sm90a), None);
    // every Hopper forward rung pairs with it; its forward rung is the Hopper one
    for k in [FlashKernel::Wgmma, FlashKernel::Wgmma2, FlashKernel::WgmmaPingPong] {
        assert_eq!(FlashBwdKernel::of_forward(k), hopper);
    }
    // each backward by name (`kiln attention --backward-kernel NAME`)
    for k in FlashBwdKernel::ALL {
        assert_eq!(FlashBwdKernel::from_name(k.name()).unwrap(), k);
    }
    let e = FlashBwdKernel::from_name("wgmma3").unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }) && e.to_string().contains("simt, mma, wgmma, wgmma2"), "{e}");
    assert_eq!(FlashBwdKernel::Wgmma.forward(), FlashKernel::Wgmma);
    assert_eq!(FlashBwdKernel::Wgmma2.forward(), FlashKernel::Wgmma2);
    assert!(FlashBwdKernel::Wgmma2.is_hopper() && FlashBwdKernel::Wgmma2.needs_16_byte_alignment());
    assert!(FlashBwdKernel::Wgmma.supports(DType::BF16, 128) && FlashBwdKernel::Wgmma.supports(DType::F16, 64));
    assert!(!FlashBwdKernel::Wgmma.supports(DType::F32, 64) && !FlashBwdKernel::Wgmma.supports(DType::BF16, 96));
    // the module check
    check_backward_arch(FlashBwdKernel::Wgmma, Arch::Sm90a).unwrap();
    check_backward_arch(FlashBwdKernel::Wgmma2, Arch::Sm90a).unwrap();
    for arch in [Arch::Sm80, Arch::Sm100a] {
        for k in [FlashBwdKernel::Wgmma, FlashBwdKernel::Wgmma2] {
            let e = check_backward_arch(k, arch).unwrap_err();
            assert!(matches!(e, Error::Unsupported { .. }), "{e}");
            assert!(e.to_string().contains("sm_90a") && e.to_string().contains("MmaSync"), "{e}");
        }
        check_backward_arch(FlashBwdKernel::MmaSync, arch).unwrap();
        check_backward_arch(FlashBwdKernel::Simt, arch).unwrap();
    }
    // dtypes, sizes and alignment (TMA needs 16-byte-aligned buffers)
    let l = bwd_lens(SHAPE);
    check_backward(FlashBwdKernel::Wgmma, DType::BF16, SHAPE, 0.1, l, [0; 9]).unwrap();
    check_backward(FlashBwdKernel::Wgmma, DType::F16, SHAPE, 0.1, l, [0; 9]).unwrap();
    let e = check_backward(FlashBwdKernel::Wgmma, DType::F32, SHAPE, 0.1, l, [0; 9]).unwrap_err();
    assert!(e.to_string().contains("flash_fwd_simt_f32") && e.to_string().contains("Wgmma backward"), "{e}");
    let mut addrs = [0u64; 9];
    addrs[5] = 8;
    let e = check_backward(FlashBwdKernel::Wgmma, DType::BF16, SHAPE, 0.1, l, addrs).unwrap_err();
    assert!(e.to_string().contains("16-byte"), "{e}");
    let mut addrs = [0u64; 9];
    addrs[4] = 4;
    check_backward(FlashBwdKernel::Wgmma, DType::BF16, SHAPE, 0.1, l, addrs).unwrap();
}

#[test]
fn the_wgmma_backward_fits_hopper_shared_memory() {
    use kiln_gpu::kernels::flash_bwd_wgmma::{FLASH_BWD_WGMMA_BKV, FLASH_BWD_WGMMA_BQ, FLASH_BWD_WGMMA_THREADS};
    // two owned tiles, two stages of two streamed tiles, five barriers (padded to 48 bytes), each
    // stage's 64 log-sum-exps and deltas; under Hopper's 227 KiB
    assert_eq!(FlashBwdKernel::Wgmma.smem_bytes(64), 6 * 8192 + 48 + 2 * 512);
    assert_eq!(FlashBwdKernel::Wgmma.smem_bytes(128), 6 * 16384 + 48 + 2 * 512);
    assert!(FlashBwdKernel::Wgmma.smem_bytes(128) <= 227 * 1024);
    // the two-consumer form: two owned tiles per consumer warpgroup
    assert_eq!(FlashBwdKernel::Wgmma2.smem_bytes(64), 8 * 8192 + 48 + 2 * 512);
    assert_eq!(FlashBwdKernel::Wgmma2.smem_bytes(128), 8 * 16384 + 48 + 2 * 512);
    assert!(FlashBwdKernel::Wgmma2.smem_bytes(128) <= 227 * 1024);
    {
        use kiln_gpu::kernels::flash_bwd_wgmma::{
            FLASH_BWD_WGMMA2_CONSUMER_REGS, FLASH_BWD_WGMMA2_PRODUCER_REGS, FLASH_BWD_WGMMA2_ROWS,
            FLASH_BWD_WGMMA2_THREADS,
        };
        assert_eq!((FLASH_BWD_WGMMA2_THREADS, FLASH_BWD_WGMMA2_ROWS), (384, 128));
        // setmaxnreg: multiples of 8 in 24..=256, within the SM's 65536 registers
        for r in [FLASH_BWD_WGMMA2_CONSUMER_REGS, FLASH_BWD_WGMMA2_PRODUCER_REGS] {
            assert!(r % 8 == 0 && (24..=256).contains(&r), "{r}");
        }
        const { assert!(128 * (FLASH_BWD_WGMMA2_PRODUCER_REGS + 2 * FLASH_BWD_WGMMA2_CONSUMER_REGS) <= 65536) };
    }
    // one consumer warpgroup and a producer warp; 64-row tiles (the TMA box and the delta kernel's
    // query blocks)
    assert_eq!(FLASH_BWD_WGMMA_THREADS, 160);
    assert_eq!((FLASH_BWD_WGMMA_BQ, FLASH_BWD_WGMMA_BKV), (64, 64));
    assert_eq!(FLASH_BWD_WGMMA_BQ, kiln_gpu::kernels::flash_bwd_mma::FLASH_BWD_MMA_BQ);
    // Q / dO and K / V are read through the forward's maps: 64 x 64 boxes of 128 bytes a row
    for d in FLASH_HEAD_DIMS {
        let spec = wgmma_qkv_spec(DType::F16, 3 * 1000, *d);
        spec.validate(0x2000).unwrap();
        assert_eq!(spec.box_bytes() * (*d / 64), kiln_gpu::kernels::flash_bwd_wgmma::flash_bwd_wgmma_tile_bytes(*d));
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

#[test]
fn the_wgmma_backward_blocks_walk_every_visible_pair() {
    use kiln_gpu::kernels::flash_bwd_mma::flash_bwd_query_blocks;
    // a dK / dV block of `keys` keys from k0 walks the query blocks of 64 rows from the block of
    // the first row that sees k0; a dQ block of `rows` rows walks the key tiles of 64 its last row
    // sees. Every visible (query, key) pair must be in a walked tile, for one and two consumers.
    for (q, kv) in [(1, 1), (17, 17), (129, 129), (17, 129), (129, 17), (1000, 129), (200, 1000)] {
        for causal in [false, true] {
            let p = AttentionShape { batch: 1, heads: 1, q_len: q, kv_len: kv, head_dim: 64 }.params(causal, 0.1);
            for block in [64u32, 128] {
                for k0 in (0..kv).step_by(block as usize) {
                    let (b, n) = flash_bwd_query_blocks(p, k0);
                    for key in k0..(k0 + block).min(kv) {
                        for i in (0..q).filter(|&i| key < p.visible_keys(i)) {
                            assert!(b * 64 <= i && i < (b + n) * 64, "dK/dV {q} {kv} {causal} {block}: {i} {key}");
                        }
                    }
                }
                for q0 in (0..q).step_by(block as usize) {
                    let tiles = p.keys_for_rows(q0, block).div_ceil(64);
                    for i in q0..(q0 + block).min(q) {
                        assert!(p.visible_keys(i) <= tiles * 64, "dQ {q} {kv} {causal} {block}: row {i}");
                    }
                }
            }
        }
    }
}
