//! Golden-PTX checks on the modules embedded in the host library: what each architecture's module
//! must contain, what it must not, and that no kernel's barriers were duplicated by the compiler.

use kiln::gpu::Arch;
use kiln::gpu::Kernel;
use kiln::gpu::kernels;
use kiln::ptx::{embedded, entries};

fn body<'a>(ptx: &'a str, kernel: &str) -> &'a str {
    let start = ptx.find(&format!(".entry {kernel}(")).unwrap_or_else(|| panic!("no entry {kernel}"));
    let rest = &ptx[start..];
    let end = rest.find("\n}\n").expect("entry body ends");
    &rest[..end]
}

#[test]
fn modules_declare_their_targets() {
    assert!(embedded(Arch::Sm80).contains(".target sm_80"));
    assert!(embedded(Arch::Sm90a).contains(".target sm_90a"));
    assert!(embedded(Arch::Sm100a).contains(".target sm_100a"));
    assert!(embedded(Arch::Sm100a).contains(".version 8.6"));
    for a in Arch::ALL {
        assert!(!embedded(a).contains(".extern .func"), "{} calls a function it does not define", a.name());
    }
}

/// The persistent wgmma GEMM runs in clusters of two (declared in the PTX, so a plain launch
/// forms them), multicasts B, and hands stages back to the peer with plain (CTA-scope release)
/// remote arrivals: `.release.cluster` on those arrivals halved its speed on the H200.
#[test]
fn persistent_gemm_is_a_cluster_kernel() {
    let sm90 = embedded(Arch::Sm90a);
    let name = <kernels::gemm_wgmma::GemmWgmmaBf16Persistent as Kernel>::NAME;
    let start = sm90.find(&format!(".entry {name}(")).expect("entry");
    let header = &sm90[start..start + sm90[start..].find('{').expect("body")];
    assert!(header.contains(".maxntid 384, 1, 1") && header.contains(".reqnctapercluster 2, 1, 1"), "{header}");
    assert_eq!(<kernels::gemm_wgmma::GemmWgmmaBf16Persistent as Kernel>::CLUSTER, 2);
    let b = body(sm90, name);
    for needle in [
        "multicast::cluster",
        "mapa.shared::cluster.u32",
        "mbarrier.arrive.shared::cluster.b64",
        "barrier.cluster.wait",
        // the staged epilogue: TMA stores from shared memory behind a warpgroup's named barrier
        "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group",
        "barrier.sync",
    ] {
        assert!(b.contains(needle), "{name} lacks `{needle}`");
    }
    // Only the one block barrier is `.aligned`: the epilogue's named barrier follows a branch on
    // one thread and is duplicated into both arms, which only the non-aligned form survives.
    assert_eq!(b.matches("bar.sync").count(), 1, "{name}: an aligned named barrier");
    assert!(!b.contains("mbarrier.arrive.release.cluster"), "{name}: a cluster-scope release on every stage");
    assert_eq!(<kernels::gemm_wgmma::GemmWgmmaBf16Wide as Kernel>::CLUSTER, 1);
}

#[test]
fn golden_instructions() {
    let sm90 = embedded(Arch::Sm90a);
    for needle in [
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
        "cp.async.cg.shared.global",
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
        "cp.async.bulk.tensor.2d.global.shared::cta",
        "mbarrier.try_wait.parity",
        "mbarrier.arrive.expect_tx",
        "fence.proxy.async.shared::cta",
        "shfl.sync.bfly.b32",
    ] {
        assert!(sm90.contains(needle), "sm_90a module lacks `{needle}`");
    }
    assert!(sm90.contains("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"));
    for a in [Arch::Sm80, Arch::Sm100a] {
        assert!(
            !embedded(a).contains("wgmma.mma_async") && !embedded(a).contains("wgmma.fence"),
            "wgmma is sm_90a only"
        );
    }
    let sm100 = embedded(Arch::Sm100a);
    assert!(sm100.contains("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32"));
    assert!(sm100.contains("tcgen05.dealloc"));
    assert!(sm100.contains("tcgen05.mma.cta_group::1.kind::f16"));
    assert!(sm100.contains("tcgen05.commit.cta_group::1.mbarrier::arrive::one"));
    // the warp-specialized GEMM's epilogue reads tensor memory back
    assert!(sm100.contains(".entry gemm_tcgen05_bf16"));
    assert!(sm100.contains("tcgen05.ld.sync.aligned.32x32b.x32.b32"));
    assert!(sm100.contains("tcgen05.wait::ld.sync.aligned"));
    let sm80 = embedded(Arch::Sm80);
    assert!(sm80.contains("mma.sync.aligned"));
    assert!(!sm80.contains("cp.async.bulk"), "sm_80 has no TMA: no kernel using it may be in its module");
    // no tcgen05 instruction outside sm_100a (host-side helpers such as `gemm_tcgen05::tc_tile`
    // are emitted as functions everywhere, so look for the instructions' `tcgen05.` prefix)
    assert!(!sm80.contains("tcgen05.") && !embedded(Arch::Sm90a).contains("tcgen05."));
}

#[test]
fn every_kernel_is_where_its_target_says() {
    fn check<K: Kernel>() {
        for a in Arch::ALL {
            let present = entries(embedded(a)).contains(&K::NAME);
            assert_eq!(present, K::TARGET.available_on(a), "{} in {}: present {present}", K::NAME, a.name());
        }
    }
    check::<kernels::elementwise::VectorAdd>();
    check::<kernels::reduce::ReduceSumF32>();
    check::<kernels::mma_tile::MmaTileBf16>();
    check::<kernels::mma_tile::MmaTileF16>();
    check::<kernels::mma_tile::MmaTileTf32>();
    check::<kernels::tma_tile::TmaTileTransform>();
    check::<kernels::barrier::MbarrierPhases>();
    check::<kernels::tmem::TmemAllocRoundtrip>();
    check::<kernels::tmem::TmemMmaSmoke>();
}

/// The compiler must not duplicate a block barrier into divergent branches (it did, with an asm
/// `bar.sync`, and the TMA kernel hung on the H200). Each kernel has as many `bar.sync` as its
/// source has `sync_threads()` calls once inlined: `block_reduce` has 2, and the row kernels call
/// it from a register-cached path (per monomorphization) and from the strided path.
#[test]
fn barriers_are_not_duplicated() {
    let expected = [
        ("reduce_sum_f32", 1),
        ("tma_tile_transform", 2),
        ("mbarrier_phases", 1),
        ("softmax_rows_f32", 12),
        ("cross_entropy_rows_f32", 8),
        ("cross_entropy_backward_rows_f32", 8),
        // one after the prologue, one per stage
        ("hgemm_mma_bf16", 2),
        ("hgemm_mma_bf16_wide", 2),
        // 3 in the instruction loop; per tile size (3): the tile product's 2 in each of the three
        // product arms, the loss gradient's 1 and the fused update's 1 (between dW and the update)
        ("megakernel_step", 3 + 3 * (3 * 2 + 1 + 1)),
        ("layer_norm_rows_f32", 5),
        ("matmul_f32", 2),
        // one before the k loop and one per k-tile (double-buffered), in each of the two bodies
        // (blocks inside C, blocks at its edges)
        ("sgemm_warptile_128x128x8_8x8_db", 4),
        ("sgemm_warptile_128x128x16_8x8_db", 4),
        ("sgemm_warptile_128x256x8_8x16_db", 4),
        ("sgemm_warptile_128x256x8_8x16_db_nt", 4),
        ("sgemm_warptile_128x256x8_8x16_db_tn", 4),
        ("sgemm_warptile_256x128x8_16x8_db", 4),
        ("sgemm_warptile_64x128x8_4x8_db", 4),
        ("sgemm_warptile_64x128x8_4x8_db_nt", 4),
        ("sgemm_warptile_64x128x8_4x8_db_tn", 4),
    ];
    for a in [Arch::Sm90a, Arch::Sm100a] {
        for (k, n) in expected {
            let count = body(embedded(a), k).matches("bar.sync").count();
            assert_eq!(count, n, "{k} in {} has {count} bar.sync, its source {n}", a.name());
        }
    }
    assert_eq!(body(embedded(Arch::Sm80), "reduce_sum_f32").matches("bar.sync").count(), 1);
    // Warp- and warpgroup-collective (`.sync.aligned`) instructions written as asm: nothing marks
    // them convergent, so each must appear exactly as often as in the source (an asm copy in a
    // divergent arm would hang or fault a warp). The Blackwell GEMM's tensor-memory instructions
    // and its 3 block barriers (ring set-up, TMEM set-up, teardown); the training megakernel's
    // warpgroup products (the fence, four m64n64k8 tf32, m64n64k16 or m64n128k16 bf16 products (the
    // last in three forms: which operands are read transposed), the commit
    // and the wait for the page before, one site in the page walk, which a warp that gave up the
    // walk keeps executing with the others; the last wait, once after the walk).
    // (kernel's architecture, kernel, [(PTX needle, count)])
    type Collectives<'a> = (Arch, &'a str, &'a [(&'a str, usize)]);
    let collectives: [Collectives; 9] = [
        (
            Arch::Sm100a,
            "gemm_tcgen05_bf16",
            &[
                ("tcgen05.alloc", 1),
                ("tcgen05.dealloc", 1),
                ("tcgen05.relinquish_alloc_permit", 1),
                ("tcgen05.ld.sync.aligned", 1),
                ("tcgen05.wait::ld", 1),
                ("bar.sync", 3),
            ],
        ),
        (
            Arch::Sm90a,
            "megakernel_step_tf32_t64",
            &[
                ("wgmma.fence.sync.aligned", 1),
                ("wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32", 4),
                ("wgmma.commit_group.sync.aligned", 1),
                ("wgmma.wait_group.sync.aligned 1", 1),
                ("wgmma.wait_group.sync.aligned 0", 1),
            ],
        ),
        (
            Arch::Sm90a,
            "megakernel_step_bf16_t64",
            &[
                ("wgmma.fence.sync.aligned", 1),
                ("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16", 4),
                ("wgmma.mma_async.sync.aligned.m64n64k8", 0),
                ("wgmma.commit_group.sync.aligned", 1),
                ("wgmma.wait_group.sync.aligned 1", 1),
                ("wgmma.wait_group.sync.aligned 0", 1),
            ],
        ),
        (
            Arch::Sm90a,
            "megakernel_step_bf16_t128",
            &[
                // three forms of the page's products (one site each, picked per instruction):
                // both operands K-major, B read transposed (MN-major), both transposed
                ("wgmma.fence.sync.aligned", 3),
                ("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16", 12),
                ("p, 1, 1, 0, 0;", 4),
                ("p, 1, 1, 0, 1;", 4),
                ("p, 1, 1, 1, 1;", 4),
                ("wgmma.mma_async.sync.aligned.m64n64", 0),
                ("wgmma.commit_group.sync.aligned", 3),
                ("wgmma.wait_group.sync.aligned 1", 1),
                ("wgmma.wait_group.sync.aligned 0", 1),
                // the storer's two boxes a staged tile (and a staged update's four f32 boxes of
                // new weights), released once read, published once written; the consumers' one
                // proxy fence before handing a tile over. (The storer's commit and read wait,
                // one thread's, not a warp's, are compiled twice: once for the updates, which
                // also release the weight buffer, once for the others.)
                ("cp.async.bulk.tensor.2d.global.shared::cta", 6),
                ("cp.async.bulk.commit_group", 2),
                ("cp.async.bulk.wait_group.read 0", 2),
                ("cp.async.bulk.wait_group 0", 1),
                ("fence.proxy.async.shared::cta", 1),
            ],
        ),
        // only the tile-128 kernel stores through TMA
        (Arch::Sm90a, "megakernel_step_bf16_t64", &[("cp.async.bulk.tensor.2d.global", 0)]),
        (Arch::Sm90a, "megakernel_step_tf32_t64", &[("cp.async.bulk.tensor.2d.global", 0)]),
        // the step's other kernels multiply on mma.sync only
        (Arch::Sm90a, "megakernel_step_tf32_t32", &[("wgmma.", 0)]),
        (Arch::Sm90a, "megakernel_step_tf32x3_t32", &[("wgmma.", 0)]),
        (Arch::Sm90a, "megakernel_step_tf32x3_t64", &[("wgmma.", 0)]),
    ];
    for (arch, kernel, needles) in collectives {
        let k = body(embedded(arch), kernel);
        for &(needle, n) in needles {
            assert_eq!(k.matches(needle).count(), n, "{kernel}: `{needle}`");
        }
    }
}

/// Warp-collective asm must never be `pure`: LLVM may then sink it into a branch only some lanes
/// take (the reduction's second butterfly was once sunk into `if lane == 0`, and its sum was wrong
/// on the H200). The PTX alone cannot show that reliably, so this checks the cause in the source.
#[test]
fn collective_asm_is_not_pure() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../gpu/src");
    if !std::path::Path::new(dir).exists() {
        // A GPU bundle runs this binary away from the source tree; CI checks the sources.
        eprintln!("collective_asm_is_not_pure: {dir} is not here; checked where the sources are");
        return;
    }
    for file in ["warp.rs", "mma.rs", "matrix.rs", "sync.rs"] {
        let src = std::fs::read_to_string(format!("{dir}/{file}")).expect("device library source");
        for (n, line) in src.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            assert!(
                !(code.contains("options(") && code.contains("pure")),
                "{file}:{}: warp-collective asm marked pure: {line}",
                n + 1
            );
        }
    }
}

/// The host's GEMM table names kernels that exist in every module, with consistent launch shapes.
#[test]
fn sgemm_table_matches_the_modules() {
    use kiln::cuda::gemm::{Mapping, RUNGS, choose};
    use kiln::gpu::kernels::mma_tile::GemmShape;
    for a in Arch::ALL {
        let names = entries(embedded(a));
        for r in RUNGS {
            assert!(names.contains(&r.name), "{} missing from {}", r.name, a.name());
        }
    }
    for r in RUNGS {
        assert!(r.threads <= 1024 && r.smem <= 48 * 1024, "{}", r.name);
        if r.mapping == Mapping::Tiled && r.level >= 4 {
            // every thread owns an equal share of the tile
            assert_eq!((r.tile_m * r.tile_n) % r.threads, 0, "{}", r.name);
        }
    }
    let c = choose(GemmShape { m: 4096, n: 4096, k: 4096 });
    assert_eq!(c.level, 7);
    assert!(c.name.ends_with("_db"), "{}", c.name);
    assert_eq!(choose(GemmShape { m: 4096, n: 4095, k: 4096 }).level, 5);
    let cfg = c.config(GemmShape { m: 4096, n: 1000, k: 64 });
    assert_eq!(cfg.grid_dim, (1000u32.div_ceil(c.tile_n), 4096u32.div_ceil(c.tile_m), 1));
    assert_eq!(cfg.grid_dim, (8, 32, 1), "{} is 128 x 128", c.name);
    assert!(choose(GemmShape { m: 1024, n: 1024, k: 1024 }).name.starts_with("sgemm_warptile_64x128"));
}

/// Every shape a layout declares aligned has a rung of that layout (autograd's backward relies on
/// it: a TN product with k = 6, the rows of a batch of 6, once passed the check and then found no
/// rung), and every rung chosen for a layout is of that layout.
#[test]
fn aligned_layout_shapes_have_a_rung() {
    use kiln::cuda::gemm::{Layout, choose_layout};
    use kiln::gpu::kernels::mma_tile::GemmShape;
    for layout in [Layout::NT, Layout::TN] {
        for m in [1u32, 4, 6, 8, 12, 130, 132, 4096] {
            for n in [1u32, 4, 6, 8, 12, 132, 4096] {
                for k in [1u32, 4, 6, 8, 12, 516] {
                    let s = GemmShape { m, n, k };
                    let r = choose_layout(s, layout);
                    assert_eq!(r.is_some(), layout.rows_aligned(s), "{layout:?} {m}x{n}x{k}");
                    if let Some(r) = r {
                        assert_eq!(r.layout, layout, "{}", r.name);
                    }
                }
            }
        }
    }
}
