//! The megakernel's schedule, interpreted on the CPU with SMs interleaved at random, against kiln's
//! layer-by-layer autograd path: no deadlock for any shape, and the same weights after 1 and 3 steps.

use kiln::gpu::megakernel::{NO_COUNTER, TC_TILES, TILES, choose_tile, opcode};
use kiln::megakernel::{
    DataPath, Loss, MlpShape, StepInputs, StepState, Updates, WeightReads, build, build_with_tile, interpret,
};
use kiln::nn::{Linear, Module, ReLU, Sequential};
use kiln::optim::{Optimizer, Sgd};
use kiln::tensor::{DType, Tensor};
use proptest::prelude::*;

fn reference_model(dims: &[usize], seed: u64) -> Sequential {
    let mut rng = Tensor::rng(seed);
    let mut s = Sequential::new();
    for l in 0..dims.len() - 1 {
        s = s.push(Linear::new(dims[l], dims[l + 1], false, DType::F32, &mut rng).unwrap());
        if l + 2 < dims.len() {
            s = s.push(ReLU);
        }
    }
    s
}

/// Trains `steps` steps both ways and returns the largest relative weight difference.
///
/// The reference runs with `set_deterministic(true)`, so its forward products are the same FMA
/// chains as the interpreter's and the activations agree bit for bit: with the default blocked
/// product, a pre-activation within one rounding of 0 could take the other side of a ReLU and
/// change a gradient by far more than rounding (proptest found one: batch 37, widths [92, 1, 2]).
#[allow(clippy::too_many_arguments)]
fn compare(
    shape: &MlpShape,
    loss: Loss,
    sms: usize,
    tile: u32,
    (updates, reads): (Updates, WeightReads),
    steps: usize,
    momentum: f32,
    seed: u64,
) -> Result<f64, String> {
    kiln::deterministic::set_deterministic(true);
    let model = reference_model(&shape.dims, seed);
    let weights: Vec<Vec<f32>> = model.parameters().iter().map(|p| p.to_vec_f32()).collect();
    let schedule = build_with_tile(shape, sms, tile, updates, reads).map_err(|e| e.to_string())?;
    let mut state = StepState::new(shape, weights).map_err(|e| e.to_string())?;
    let mut opt = Sgd::new(model.named_parameters(), 0.05, momentum as f64, 0.0, false);
    let mut rng = Tensor::rng(seed + 100);
    let (b, din, dout) = (shape.batch, shape.dims[0], *shape.dims.last().unwrap());
    for step in 0..steps {
        let x = Tensor::randn([b, din], DType::F32, &mut rng).to_vec_f32();
        let y = Tensor::randn([b, dout], DType::F32, &mut rng).to_vec_f32();
        let classes: Vec<usize> = (0..b).map(|i| (i * 7 + step) % dout).collect();
        let inputs = StepInputs { x: &x, y: &y, classes: &classes, loss, lr: 0.05, momentum };
        interpret(&schedule, &mut state, &inputs, seed + step as u64).map_err(|e| e.to_string())?;
        let xt = Tensor::from_vec(x.clone(), [b, din]).unwrap();
        let out = model.forward(&xt).unwrap();
        let l = match loss {
            Loss::Mse => out.mse(&Tensor::from_vec(y.clone(), [b, dout]).unwrap()).unwrap(),
            Loss::CrossEntropy => out.cross_entropy(&classes).unwrap(),
        };
        l.backward().unwrap();
        opt.step().unwrap();
        opt.zero_grad();
    }
    let mut worst = 0.0f64;
    for (l, p) in model.parameters().iter().enumerate() {
        for (a, r) in state.weights[l].iter().zip(p.to_vec_f32()) {
            worst = worst.max((*a as f64 - r as f64).abs() / (1.0 + r.abs() as f64));
        }
    }
    Ok(worst)
}

#[test]
fn one_and_three_steps_match_autograd() {
    for (loss, momentum) in [(Loss::CrossEntropy, 0.0), (Loss::Mse, 0.9)] {
        let shape = MlpShape { batch: 100, dims: vec![37, 130, 65, 10] };
        for tile in TILES {
            for updates in [Updates::Fused, Updates::Separate] {
                for reads in [WeightReads::InPlace, WeightReads::StepStartCopy] {
                    for steps in [1, 3] {
                        let worst = compare(&shape, loss, 7, tile, (updates, reads), steps, momentum, 1).unwrap();
                        let what = format!("{loss:?} momentum {momentum} tile {tile} {updates:?} {reads:?}");
                        eprintln!("{what} steps {steps}: worst {worst:e}");
                        assert!(worst < 1e-5, "{what} after {steps} steps: {worst}");
                    }
                }
            }
        }
    }
}

#[test]
fn instruction_counts() {
    let shape = MlpShape { batch: 130, dims: vec![64, 65, 1] };
    let s = build(&shape, 4, DataPath::CudaCores).unwrap();
    assert_eq!(s.tile, 64, "3 x 2 tiles of 64 cover 4 SMs");
    assert_eq!(s.updates, Updates::Fused);
    // fwd: 3x2 + 3x1; loss: 3x1; bwd input layer 1: 3x2; bwd weight with the update: (1x2) + (2x1)
    assert_eq!(s.order.len(), 6 + 3 + 3 + 6 + 2 + 2);
    assert_eq!(s.per_sm.iter().map(|v| v.len()).sum::<usize>(), s.order.len());
    // separate updates: the weight gradients (1x2) + (2x1), then as many updates
    let sep = build_with_tile(&shape, 4, 64, Updates::Separate, WeightReads::InPlace).unwrap();
    assert_eq!(sep.order.len(), 6 + 3 + 3 + 2 + 2 + 6 + 2 + 2);
    let count = |s: &kiln::megakernel::Schedule, op: u32| s.order.iter().filter(|i| i.opcode == op).count();
    assert_eq!(count(&s, opcode::LINEAR_BWD_WEIGHT_SGD), 4);
    assert_eq!((count(&s, opcode::LINEAR_BWD_WEIGHT), count(&s, opcode::SGD_UPDATE)), (0, 0));
    assert_eq!((count(&sep, opcode::LINEAR_BWD_WEIGHT), count(&sep, opcode::SGD_UPDATE)), (4, 4));
    // every fused update of a layer above the first waits for all of that layer's input gradients
    for i in s.order.iter().filter(|i| i.opcode == opcode::LINEAR_BWD_WEIGHT_SGD) {
        let guard: Vec<_> =
            s.order.iter().filter(|j| j.opcode == opcode::LINEAR_BWD_INPUT && j.layer == i.layer).collect();
        if i.layer > 0 {
            assert_eq!(i.wait2_value as usize, guard.len(), "{i:?}");
            assert!(guard.iter().all(|j| j.signal2 == i.wait2), "{i:?}");
        } else {
            assert!(guard.is_empty() && i.wait2 == NO_COUNTER, "{i:?}");
        }
    }
    // the tensor-core paths read a copy of the weights the updates do not write: no guard
    for path in [DataPath::Tf32, DataPath::Tf32x3, DataPath::Bf16] {
        let s = build(&shape, 4, path).unwrap();
        assert_eq!(s.weight_reads, WeightReads::StepStartCopy);
        assert!(s.order.iter().all(|i| i.wait2 == NO_COUNTER), "{path:?}");
    }
    assert!(build(&MlpShape { batch: 0, dims: vec![2, 3] }, 4, DataPath::CudaCores).is_err());
    assert!(build(&MlpShape { batch: 4, dims: vec![2] }, 4, DataPath::CudaCores).is_err());
    assert!(
        build_with_tile(&shape, 4, 48, Updates::Fused, WeightReads::InPlace)
            .unwrap_err()
            .to_string()
            .contains("tile 48")
    );
}

/// A fused update is the weight gradient and the update of the same tile in the same arithmetic,
/// and an input gradient reading the step's first weights (no write-after-read guard, the
/// tensor-core paths' double-buffered copies) reads what the guarded schedule's would: the
/// interpreter gives the same weights, bit for bit, whichever schedule it runs.
#[test]
fn fused_and_separate_updates_agree_bit_for_bit() {
    let shape = MlpShape { batch: 45, dims: vec![33, 70, 40, 7] };
    let weights = reference_model(&shape.dims, 5).parameters().iter().map(|p| p.to_vec_f32()).collect::<Vec<_>>();
    let mut rng = Tensor::rng(9);
    let x = Tensor::randn([45, 33], DType::F32, &mut rng).to_vec_f32();
    let y = Tensor::randn([45, 7], DType::F32, &mut rng).to_vec_f32();
    let classes: Vec<usize> = (0..45).map(|i| i % 7).collect();
    for (loss, momentum) in [(Loss::CrossEntropy, 0.0), (Loss::Mse, 0.9)] {
        let inputs = StepInputs { x: &x, y: &y, classes: &classes, loss, lr: 0.05, momentum };
        let mut out = Vec::new();
        for updates in [Updates::Fused, Updates::Separate] {
            for reads in [WeightReads::InPlace, WeightReads::StepStartCopy] {
                let s = build_with_tile(&shape, 5, 32, updates, reads).unwrap();
                let mut st = StepState::new(&shape, weights.clone()).unwrap();
                for step in 0..3 {
                    interpret(&s, &mut st, &inputs, step).unwrap();
                }
                out.push(st.weights.clone());
            }
        }
        assert!(out.iter().all(|w| *w == out[0]), "{loss:?}");
        assert_ne!(out[0], weights, "the steps changed the weights");
    }
}

/// The tile the sweep in `benches/results/mlp_step.md` found fastest for each benchmark model, and
/// the smallest tile when even one tile per 10 SMs is out of reach.
#[test]
fn the_tile_fits_the_model() {
    assert_eq!(choose_tile(4096, 1024, 132, &TILES), 64);
    assert_eq!(choose_tile(256, 1024, 132, &TILES), 64);
    assert_eq!(choose_tile(64, 256, 132, &TILES), 32);
    assert_eq!(choose_tile(1, 1, 1, &TILES), 64);
    assert_eq!(choose_tile(16, 16, 132, &TILES), 16);
    // the tensor-core path has no 16-wide tile
    assert_eq!(choose_tile(16, 16, 132, &TC_TILES), 32);
    assert_eq!(DataPath::Tf32x3.tiles(), &TC_TILES);
    assert_eq!(DataPath::CudaCores.tiles(), &TILES);
    assert_eq!(build(&MlpShape { batch: 16, dims: vec![16, 16] }, 132, DataPath::Tf32).unwrap().tile, 32);
    // the bf16 path multiplies on wgmma only, at tile 64 or 128; 128 only where the widest
    // forward has a tile for every SM (the large model, not the medium one)
    assert_eq!(DataPath::Bf16.tiles(), &[64, 128]);
    assert_eq!(build(&MlpShape { batch: 16, dims: vec![16, 16] }, 132, DataPath::Bf16).unwrap().tile, 64);
    assert_eq!(choose_tile(4096, 1024, 132, DataPath::Bf16.tiles()), 128);
    assert_eq!(choose_tile(256, 1024, 132, DataPath::Bf16.tiles()), 64);
    assert_eq!(choose_tile(4096, 1024, 132, &TC_TILES), 64);
}

#[test]
fn a_wrong_wait_is_a_reported_deadlock_not_a_hang() {
    let shape = MlpShape { batch: 64, dims: vec![8, 8, 4] };
    let mut s = build(&shape, 3, DataPath::CudaCores).unwrap();
    // one arrival too many expected: the waiter can never run
    let victim = s.per_sm[1].iter_mut().find(|i| i.wait != NO_COUNTER).unwrap();
    victim.wait_value += 1;
    let model = reference_model(&shape.dims, 3);
    let mut st = StepState::new(&shape, model.parameters().iter().map(|p| p.to_vec_f32()).collect()).unwrap();
    let (x, y) = (vec![0.5f32; 64 * 8], vec![0.0f32; 64 * 4]);
    let classes = vec![0usize; 64];
    let inputs = StepInputs { x: &x, y: &y, classes: &classes, loss: Loss::Mse, lr: 0.1, momentum: 0.0 };
    let e = interpret(&s, &mut st, &inputs, 0).unwrap_err().to_string();
    assert!(e.contains("deadlock") && e.contains("SM 1"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn random_shapes_never_deadlock_and_match(batch in 1usize..200, widths in prop::collection::vec(1usize..150, 2..5), sms in 1usize..17, tile in prop::sample::select(TILES.to_vec()), fused in any::<bool>(), copy in any::<bool>(), seed in 0u64..1000) {
        let shape = MlpShape { batch, dims: widths };
        let updates = if fused { Updates::Fused } else { Updates::Separate };
        let reads = if copy { WeightReads::StepStartCopy } else { WeightReads::InPlace };
        let worst = compare(&shape, Loss::CrossEntropy, sms, tile, (updates, reads), 1, 0.0, seed).map_err(TestCaseError::fail)?;
        prop_assert!(worst < 1e-5, "{shape:?} on {sms} SMs, tile {tile}, {updates:?}, {reads:?}: {worst}");
    }
}

/// The case proptest found: one hidden unit whose pre-activation sits near 0.
#[test]
fn a_one_unit_hidden_layer_matches() {
    let shape = MlpShape { batch: 37, dims: vec![92, 1, 2] };
    for seed in [450, 451, 452] {
        for sms in [1, 3] {
            let worst =
                compare(&shape, Loss::CrossEntropy, sms, 64, (Updates::Fused, WeightReads::InPlace), 1, 0.0, seed)
                    .unwrap();
            assert!(worst < 1e-5, "seed {seed} on {sms} SMs: {worst}");
        }
    }
}

/// A host model of an mbarrier: arrivals and transaction bytes complete phases; a waiter on
/// `parity` passes once the phase with that parity has completed (the current phase's parity
/// differs), as `mbarrier.try_wait.parity` does.
#[derive(Clone, Debug)]
struct Barrier {
    count: u32,
    pending: u32,
    tx: u32,
    completed: u32,
}

impl Barrier {
    fn new(count: u32) -> Barrier {
        Barrier { count, pending: count, tx: 0, completed: 0 }
    }
    fn finish_if_done(&mut self) {
        if self.pending == 0 && self.tx == 0 {
            self.completed += 1;
            self.pending = self.count;
        }
    }
    fn arrive(&mut self) {
        self.pending -= 1;
        self.finish_if_done();
    }
    fn arrive_expect_tx(&mut self, bytes: u32) {
        self.tx += bytes;
        self.arrive();
    }
    fn complete_tx(&mut self, bytes: u32) {
        self.tx -= bytes;
        self.finish_if_done();
    }
    fn passes(&self, parity: u32) -> bool {
        self.completed % 2 != parity
    }
}

/// The page ring's protocol run on the host with the kernel's constants and parity functions: a
/// loader, the consumer warps that read each slot at `tile` (the page's group, or every warp at
/// tile 128: [`page_free_arrivals`](kiln::gpu::megakernel::page_free_arrivals)) and TMA
/// completions interleaved at random over `uses` ring uses, with `free_arrivals` expected on each
/// free barrier. Returns the use at which everything stopped (`uses` when all consumed) and checks
/// that every consumer read the bytes of the use it waited for.
fn run_page_ring(uses: u32, tile: u32, free_arrivals: u32, seed: u64) -> (u32, Option<(u32, u32)>) {
    use kiln::gpu::megakernel::{
        PAGE_READY_ARRIVALS, PAGE_STAGES, free_parity, page_free_arrivals, page_slot, ready_parity, stage_tx_bytes,
    };
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let s = PAGE_STAGES as usize;
    let mut ready = vec![Barrier::new(PAGE_READY_ARRIVALS); s];
    let mut free = vec![Barrier::new(free_arrivals); s];
    let mut page = vec![u32::MAX; s];
    let tx = stage_tx_bytes(tile);
    let mut loader = 0u32;
    let mut in_flight: Vec<u32> = Vec::new();
    let mut consumers = vec![0u32; page_free_arrivals(tile) as usize];
    loop {
        // what can move: the loader (its free wait met), a copy landing, a consumer (its ready wait met)
        let mut moves = Vec::new();
        if loader < uses && (loader < PAGE_STAGES || free[page_slot(loader) as usize].passes(free_parity(loader))) {
            moves.push(0usize);
        }
        if !in_flight.is_empty() {
            moves.push(1);
        }
        for (w, &u) in consumers.iter().enumerate() {
            if u < uses && ready[page_slot(u) as usize].passes(ready_parity(u)) {
                moves.push(2 + w);
            }
        }
        if moves.is_empty() {
            let stuck = (loader < uses).then(|| (page_slot(loader), free_parity(loader)));
            return (*consumers.iter().min().unwrap(), stuck);
        }
        match moves[rng.random_range(0..moves.len())] {
            0 => {
                ready[page_slot(loader) as usize].arrive_expect_tx(tx);
                in_flight.push(loader);
                loader += 1;
            }
            1 => {
                let u = in_flight.remove(rng.random_range(0..in_flight.len()));
                page[page_slot(u) as usize] = u;
                ready[page_slot(u) as usize].complete_tx(tx);
            }
            m => {
                let w = m - 2;
                let u = consumers[w];
                assert_eq!(page[page_slot(u) as usize], u, "consumer {w} read the wrong use of slot {}", page_slot(u));
                free[page_slot(u) as usize].arrive();
                consumers[w] += 1;
            }
        }
    }
}

/// The ring uses of f32 boxes (`box_slot_uses`): four slots of 32 f32 columns by 128 rows for
/// each loss tile (its logits) where the step reads in place (bf16 at tile 128), a slot's bytes
/// each; none on any other instruction, path or tile.
#[test]
fn f32_boxes_take_four_slots_at_tile_128_only() {
    use kiln::gpu::megakernel::{F32_BOX_COLS, STAGE_BYTES, box_slot_uses, precision, stage_tx_bytes};
    let ops = [
        opcode::LINEAR_FWD,
        opcode::LOSS_GRAD,
        opcode::LINEAR_BWD_WEIGHT,
        opcode::LINEAR_BWD_INPUT,
        opcode::SGD_UPDATE,
        opcode::LINEAR_BWD_WEIGHT_SGD,
    ];
    for p in [precision::TF32, precision::TF32X3, precision::BF16] {
        for tile in [32, 64, 128] {
            for op in ops {
                let want = if op == opcode::LOSS_GRAD && p == precision::BF16 && tile == 128 { 4 } else { 0 };
                assert_eq!(box_slot_uses(op, p, tile), want, "opcode {op} precision {p} tile {tile}");
            }
        }
    }
    assert_eq!(128 * F32_BOX_COLS * 4, stage_tx_bytes(128));
    assert_eq!(stage_tx_bytes(128), STAGE_BYTES);
}

/// The arrival counts and parities the kernel uses (one definition in `kiln_gpu::megakernel`)
/// carry every page use through, far past the parity bit's wrap-around, in any interleaving.
#[test]
fn the_page_ring_protocol_never_strands_a_waiter() {
    use kiln::gpu::megakernel::page_free_arrivals;
    for tile in [32, 64, 128] {
        for seed in 0..20 {
            assert_eq!(
                run_page_ring(5000, tile, page_free_arrivals(tile), seed),
                (5000, None),
                "tile {tile} seed {seed}"
            );
        }
    }
}

/// One expected arrival too many (the GPU test's planted fault) strands the loader at the first
/// reuse of page 0, waiting for parity 0: the record the device reports.
#[test]
fn one_extra_free_arrival_strands_the_loader_at_the_first_reuse() {
    use kiln::gpu::megakernel::{PAGE_STAGES, page_free_arrivals};
    for tile in [64, 128] {
        for seed in 0..5 {
            let got = run_page_ring(100, tile, page_free_arrivals(tile) + 1, seed);
            assert_eq!(got, (PAGE_STAGES, Some((0, 0))), "tile {tile} seed {seed}");
        }
    }
}

/// How the two page groups share a product, and the ring slots a K block takes: tile 64 and
/// below split the pages (one group's four warps free a slot holding both pages), tile 128 the
/// rows (every consumer warp frees each slot, a slot per page, 16 KiB each).
#[test]
fn tile_128_splits_rows_and_takes_two_slots_a_block() {
    use kiln::gpu::megakernel::{
        CONSUMER_WARPS, GROUP_WARPS, STAGE_BYTES, groups_split_rows, page_bytes, page_free_arrivals,
        slot_uses_per_block, stage_tx_bytes,
    };
    for tile in [32, 64] {
        assert!(!groups_split_rows(tile));
        assert_eq!((page_free_arrivals(tile), slot_uses_per_block(tile)), (GROUP_WARPS, 1));
        assert_eq!(stage_tx_bytes(tile), 2 * page_bytes(tile));
    }
    assert!(groups_split_rows(128));
    assert_eq!((page_free_arrivals(128), slot_uses_per_block(128)), (CONSUMER_WARPS, 2));
    assert_eq!(stage_tx_bytes(128), STAGE_BYTES);
    assert_eq!(page_bytes(128), 16 * 1024);
}

/// Tile 128 on bf16 reads its transposed operands in place, MN-major, through descriptors whose
/// fields say: 64-column chunks a box (8 KiB) apart, 8-row groups of K 1024 bytes apart, 128-byte
/// swizzle, and each k step of 16 rows 2048 bytes on. No other path or tile does.
#[test]
fn mn_major_pages_at_tile_128() {
    use kiln::gpu::kernels::megakernel_tc::mn_page_descriptor;
    use kiln::gpu::megakernel::{MN_BOX, PAGE_K_BF16, precision, reads_in_place};
    assert!(reads_in_place(precision::BF16, 128));
    for (p, t) in [(precision::BF16, 64), (precision::TF32, 64), (precision::TF32X3, 32), (precision::TF32, 32)] {
        assert!(!reads_in_place(p, t), "precision {p} tile {t}");
    }
    assert_eq!(MN_BOX * 2, 128, "a box row is one 128-byte swizzle span");
    let page = 3 * 16 * 1024;
    for kk in 0..4u32 {
        let d = mn_page_descriptor(page, kk);
        let field = |lo: u32, bits: u32| (d >> lo) & ((1 << bits) - 1);
        assert_eq!(field(0, 14), ((page + kk * 2048) >> 4) as u64, "start, k step {kk}");
        assert_eq!(field(16, 14), (PAGE_K_BF16 * 128 / 16) as u64, "leading byte offset: a box");
        assert_eq!(field(32, 14), 1024 / 16, "stride byte offset: 8 rows");
        assert_eq!(field(49, 3), 0, "base offset");
        assert_eq!(field(62, 2), 1, "128-byte swizzle");
    }
}

/// The shared-memory layout of the tensor-core kernel: stages 1024-byte aligned (128-byte
/// swizzling computes from address bits), both pages of the largest tile fit a stage, the whole fits
/// the H200's 227 KiB; row pitches keep every row 16-byte aligned.
#[test]
fn tensor_core_layout_constants() {
    use kiln::gpu::kernels::megakernel_tc::{TC_THREADS, tc_smem_bytes, tc_threads};
    use kiln::gpu::megakernel::{
        PAGE_K, PAGE_K_BF16, STAGE_BYTES, page_bytes, page_k, pitch, precision, record_offset,
    };
    assert_eq!(STAGE_BYTES % 1024, 0);
    assert_eq!(page_bytes(64) % 1024, 0, "the B page starts 1024-byte aligned");
    assert!(2 * page_bytes(TC_TILES[1]) <= STAGE_BYTES);
    // the deepest models (16 layers) and far beyond fit (the layer table's five columns
    // take 20 bytes a layer; bf16 at tile 128 also has a 64 KiB weight buffer: 91 layers fit
    // there, thousands elsewhere)
    let max = 227 * 1024;
    assert!(tc_smem_bytes(91, precision::BF16, 128) <= max, "{}", tc_smem_bytes(91, precision::BF16, 128));
    assert!(tc_smem_bytes(92, precision::BF16, 128) > max, "{}", tc_smem_bytes(92, precision::BF16, 128));
    assert!(tc_smem_bytes(2000, precision::TF32, 64) <= max && tc_smem_bytes(2000, precision::BF16, 64) <= max);
    assert_eq!(kiln::gpu::kernels::megakernel_tc::weight_buffer_offset(91) % 1024, 0);
    assert_eq!(TC_THREADS, 288, "eight consumer warps and one loader warp");
    assert_eq!(tc_threads(precision::BF16, 128), 320, "and a storer warp where the tiles are stored through TMA");
    for (p, t) in [(precision::BF16, 64), (precision::TF32, 64), (precision::TF32, 32), (precision::TF32X3, 64)] {
        assert_eq!(tc_threads(p, t), TC_THREADS, "path {p} tile {t}");
    }
    assert_eq!(PAGE_K * 4, 128, "a K-major page row is one 128-byte swizzle span");
    assert_eq!(PAGE_K_BF16 * 2, 128, "so is a bf16 page row");
    assert_eq!(page_k(precision::BF16), PAGE_K_BF16);
    for p in [precision::CUDA_CORES, precision::TF32, precision::TF32X3] {
        assert_eq!(page_k(p), PAGE_K);
    }
    // 16-byte aligned rows of f32 and of bf16 alike
    for d in 1..100u32 {
        assert!(pitch(d) >= d && pitch(d) % 8 == 0 && pitch(d) < d + 8);
    }
    // records: the abort flag right after the counters, then one per role and block (loader,
    // consumers, storer)
    use kiln::gpu::megakernel::role;
    assert_eq!(record_offset(10, 0, role::LOADER), 11);
    assert_eq!(record_offset(10, 0, role::CONSUMERS), 15);
    assert_eq!(record_offset(10, 0, role::STORER), 19);
    assert_eq!(record_offset(10, 1, role::LOADER), 23);
}

/// `--mega-path` names, and the error for an unknown one says the choices.
#[test]
fn data_path_names() {
    assert_eq!("tf32x3".parse::<DataPath>().unwrap(), DataPath::Tf32x3);
    assert_eq!("tf32".parse::<DataPath>().unwrap(), DataPath::Tf32);
    assert_eq!("cuda-cores".parse::<DataPath>().unwrap(), DataPath::CudaCores);
    assert_eq!("bf16".parse::<DataPath>().unwrap(), DataPath::Bf16);
    let e = "fp8".parse::<DataPath>().unwrap_err().to_string();
    assert!(e.contains("cuda-cores, tf32, tf32x3 or bf16"), "{e}");
    assert_eq!(DataPath::default(), DataPath::Tf32x3);
}

/// Each path's operand rounding: bf16 and tf32 to nearest with ties to even, 3xTF32 and the CUDA
/// cores none.
#[test]
fn operand_rounding_per_path() {
    let one = 1.0f32;
    // halfway between 1 and the next bf16 (1 + 2^-7): ties to even, down; just past it, up
    assert_eq!(DataPath::Bf16.operand(one + 2f32.powi(-8)), one);
    assert_eq!(DataPath::Bf16.operand(one + 3.0 * 2f32.powi(-8)), one + 2f32.powi(-6));
    assert_eq!(DataPath::Bf16.operand(one + 2f32.powi(-8) + 2f32.powi(-20)), one + 2f32.powi(-7));
    assert_eq!(DataPath::Tf32.operand(one + 2f32.powi(-11)), one);
    assert_eq!(DataPath::Tf32.operand(one + 3.0 * 2f32.powi(-11)), one + 2f32.powi(-9));
    for p in [DataPath::Tf32x3, DataPath::CudaCores] {
        assert_eq!(p.operand(one + 2f32.powi(-20)), one + 2f32.powi(-20));
    }
}

/// `StepState::with_operands`: the interpreter multiplies the operands as the path rounds them.
/// One linear layer under mean-squared error, one step, against an f64 evaluation that rounds the
/// batch, the weights and the loss gradient to bf16 where the products read them: within f32
/// rounding with the bf16 reference, and measurably off without it (so the check can fail).
#[test]
fn interpreter_rounds_operands_as_the_path_does() {
    let (batch, din, dout, lr) = (48usize, 70usize, 9usize, 0.5f32);
    let shape = MlpShape { batch, dims: vec![din, dout] };
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut uniform = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect() };
    let (x, y, w0) = (uniform(batch * din), uniform(batch * dout), uniform(dout * din));
    let r = |v: f32| DataPath::Bf16.operand(v) as f64;
    // the f64 reference: y_hat = r(x) r(W)^T, g = r(2 (y_hat - y) / (batch dout)), W -= lr g^T r(x)
    let mut g = vec![0.0f64; batch * dout];
    for b in 0..batch {
        for o in 0..dout {
            let yh: f64 = (0..din).map(|k| r(x[b * din + k]) * r(w0[o * din + k])).sum();
            let gv = 2.0 * (yh - y[b * dout + o] as f64) / (batch * dout) as f64;
            g[b * dout + o] = r(gv as f32);
        }
    }
    let want: Vec<f64> = (0..dout * din)
        .map(|j| {
            let (o, k) = (j / din, j % din);
            let dw: f64 = (0..batch).map(|b| g[b * dout + o] * r(x[b * din + k])).sum();
            w0[j] as f64 - lr as f64 * dw
        })
        .collect();
    let largest_update = want.iter().zip(&w0).map(|(w, s)| (w - *s as f64).abs()).fold(0.0, f64::max);
    let inp = StepInputs { x: &x, y: &y, classes: &[], loss: Loss::Mse, lr, momentum: 0.0 };
    let schedule = build(&shape, 4, DataPath::Bf16).unwrap();
    let worst = |path: DataPath| {
        let mut st = StepState::new(&shape, vec![w0.clone()]).unwrap().with_operands(path);
        interpret(&schedule, &mut st, &inp, 1).unwrap();
        st.weights[0].iter().zip(&want).map(|(g, w)| (*g as f64 - w).abs()).fold(0.0, f64::max) / largest_update
    };
    let (rounded, f32_operands) = (worst(DataPath::Bf16), worst(DataPath::CudaCores));
    assert!(rounded < 1e-4, "bf16 operands: off by {rounded} of the largest update");
    assert!(f32_operands > 1e-3, "f32 operands should part from the bf16 reference: {f32_operands}");
}

/// The staged tile of the tile-128 kernel (`stores_through_tma`): element (row, column) of the
/// 128 x 128 bf16 tile sits where TMA's 128-byte swizzle puts it in one of two 64-column boxes
/// (so the storer's two box stores write the tile as the maps describe it), every element has its
/// own two bytes, and a warp's store of one accumulator pair (rows `r0 + lane / 4`, columns `c0 +
/// 2 (lane % 4)`, as `wgmma::acc_m64` lays them out) hits each of the 32 banks once.
#[test]
fn staged_tile_layout() {
    use kiln::gpu::kernels::megakernel_tc::{STAGE_BOX_BYTES, staged_offset};
    use kiln::gpu::megakernel::{MN_BOX, precision, staged, stores_through_tma};
    use kiln::gpu::swizzle::{Swizzle, tile_offset};
    assert_eq!(STAGE_BOX_BYTES, 128 * 128);
    let mut seen = vec![false; 2 * STAGE_BOX_BYTES as usize / 2];
    for r in 0..128u32 {
        for c in 0..128u32 {
            let at = staged_offset(r, c);
            let (boxed, within) = (at / STAGE_BOX_BYTES, at % STAGE_BOX_BYTES);
            assert_eq!(boxed, c / MN_BOX, "({r}, {c})");
            assert_eq!(within, tile_offset(Swizzle::B128, r, c % MN_BOX, 128, 2), "({r}, {c})");
            assert!(!std::mem::replace(&mut seen[at as usize / 2], true), "({r}, {c}) shares its bytes");
        }
    }
    for r0 in [0u32, 8, 16, 72, 120] {
        for j in 0..16u32 {
            let mut banks: Vec<u32> = (0..32u32)
                .map(|lane| {
                    let at = staged_offset(r0 + lane / 4, 8 * j + 2 * (lane % 4));
                    assert_eq!(at % 4, 0, "a pair is one aligned word");
                    at / 4 % 32
                })
                .collect();
            banks.sort_unstable();
            banks.dedup();
            assert_eq!(banks.len(), 32, "rows {r0}.., columns {}..: bank conflicts", 8 * j);
        }
    }
    // only bf16 at tile 128 stages, and only the hidden forwards, the input gradients and the
    // fused updates
    assert!(stores_through_tma(precision::BF16, 128));
    assert!(!stores_through_tma(precision::BF16, 64) && !stores_through_tma(precision::TF32, 64));
    assert!(staged(opcode::LINEAR_FWD, 2, 4) && !staged(opcode::LINEAR_FWD, 3, 4));
    assert!(staged(opcode::LINEAR_BWD_INPUT, 1, 4) && staged(opcode::LINEAR_BWD_WEIGHT_SGD, 0, 4));
    for op in [opcode::LOSS_GRAD, opcode::LINEAR_BWD_WEIGHT, opcode::SGD_UPDATE] {
        assert!(!staged(op, 0, 4), "opcode {op}");
    }
}

/// Who loads an input gradient's ReLU mask into the staging buffer in [`hand_off_model`].
#[derive(Clone, Copy, PartialEq, Debug)]
enum MaskLoader {
    /// The storer, after its own stores of the last staged tile have read the buffer (the kernel).
    Storer,
    /// The loader, running ahead of the stores, after a parity wait for the last tile's release
    /// (the first build, which a review found unsound).
    LoaderAhead,
}

/// A model of the tile-128 kernel's staging hand-off (`megakernel_tc`: consumers, storer, the
/// staged / stage-free / mask-ready barriers and the TMA copies in flight) for one block's list
/// of staged tiles (`true`: an input gradient, which needs a mask), run under a random
/// interleaving. mbarrier parity waits are modelled as the hardware has them: a wait for parity
/// `p` passes while the number of completed phases is odd exactly when `p` is 0, so it can pass
/// on an older phase. Returns what went wrong, if anything: a wait that passed before the phase
/// it meant had completed, the buffer used out of its order (for each tile: its mask, if any,
/// lands; the consumers write the tile; the stores read it), two users of the buffer at once, or
/// a deadlock, or (compute-sanitizer's synccheck rule, "Missing wait") a *stage free* phase
/// completed while the one before it was never waited for. `waits` says which staged tiles'
/// consumers wait for the last tile's release.
fn hand_off_model(
    tiles: &[bool],
    who: MaskLoader,
    waits: ReleaseWaits,
    rng: &mut impl rand::Rng,
) -> Result<(), String> {
    #[derive(Default)]
    struct Bar {
        completed: u32,
    }
    // a parity wait for phase `phase` (parity phase & 1): passes, or says it passed too early
    let wait = |b: &Bar, phase: u32| -> Option<Result<(), String>> {
        if b.completed & 1 == phase & 1 {
            return None; // blocks
        }
        Some(if b.completed > phase {
            Ok(())
        } else {
            Err(format!("a wait for phase {phase} passed at {}", b.completed))
        })
    };
    let (mut staged, mut free, mut mask_ready) = (Bar::default(), Bar::default(), Bar::default());
    // the buffer's life: per tile, [mask lands], consumers write, stores read
    let mut life: Vec<(char, usize)> = Vec::new();
    for (s, &bwd) in tiles.iter().enumerate() {
        if bwd {
            life.push(('m', s));
        }
        life.push(('w', s));
        life.push(('r', s));
    }
    let (mut next_use, mut in_use): (usize, Option<(char, usize)>) = (0, None);
    let mut begin = |what: (char, usize), in_use: &mut Option<(char, usize)>| -> Result<(), String> {
        if let Some(other) = in_use {
            return Err(format!("{what:?} began while {other:?} used the buffer"));
        }
        if life.get(next_use) != Some(&what) {
            return Err(format!("{what:?} used the buffer where {:?} was next", life.get(next_use)));
        }
        next_use += 1;
        *in_use = Some(what);
        Ok(())
    };
    // program counters: consumers, storer, loader (masks, LoaderAhead only); copies in flight
    let masks_before = |s: usize| tiles[..s].iter().filter(|&&b| b).count() as u32;
    let (mut c, mut c_writing, mut c_released) = (0usize, false, false);
    // which phases of *stage free* someone waited for
    let mut free_waited = vec![false; tiles.len()];
    let waits_release = |c: usize| match waits {
        ReleaseWaits::Never => false,
        ReleaseWaits::Forwards => c > 0 && !tiles[c],
        ReleaseWaits::Every => c > 0,
    };
    let (mut st, mut st_phase) = (0usize, 0u8);
    let mut ld = 0usize;
    let mut mask_flight: Vec<(usize, bool)> = Vec::new(); // (tile, landing begun)
    let mut store_flight: Option<(usize, bool)> = None;
    loop {
        // every step that can be taken now
        let mut steps: Vec<u8> = Vec::new();
        if c < tiles.len() {
            let ready = if c_writing {
                Some(Ok(()))
            } else if waits_release(c) && !c_released {
                wait(&free, c as u32 - 1)
            } else if tiles[c] {
                wait(&mask_ready, masks_before(c))
            } else {
                Some(Ok(()))
            };
            match ready {
                Some(Err(e)) => return Err(format!("consumers at tile {c}: {e}")),
                Some(Ok(())) => steps.push(0),
                None => {}
            }
        }
        if st < tiles.len() {
            let ready = match st_phase {
                0 => Some(Ok(())), // issue the mask (storer-loaded, input gradient) or go on
                1 => wait(&staged, st as u32),
                2 => Some(Ok(())),                             // issue the stores
                _ => store_flight.is_none().then_some(Ok(())), // wait_group.read, then free
            };
            match ready {
                Some(Err(e)) => return Err(format!("storer at tile {st}: {e}")),
                Some(Ok(())) => steps.push(1),
                None => {}
            }
        }
        if who == MaskLoader::LoaderAhead {
            while ld < tiles.len() && !tiles[ld] {
                ld += 1;
            }
            if ld < tiles.len() {
                match if ld > 0 { wait(&free, ld as u32 - 1) } else { Some(Ok(())) } {
                    Some(Err(e)) => return Err(format!("loader at tile {ld}: {e}")),
                    Some(Ok(())) => steps.push(2),
                    None => {}
                }
            }
        }
        if !mask_flight.is_empty() {
            steps.push(3);
        }
        if store_flight.is_some() {
            steps.push(4);
        }
        if steps.is_empty() {
            return if c == tiles.len() && st == tiles.len() {
                Ok(())
            } else {
                Err(format!("deadlock: consumers at {c}, storer at {st}"))
            };
        }
        match steps[rng.random_range(0..steps.len())] {
            0 => {
                if !c_writing && waits_release(c) && !c_released {
                    c_released = true;
                    free_waited[c - 1] = true;
                } else if !c_writing {
                    begin(('w', c), &mut in_use)?;
                    c_writing = true;
                } else {
                    in_use = None;
                    (c_writing, c_released) = (false, false);
                    staged.completed += 1;
                    c += 1;
                }
            }
            1 => {
                match st_phase {
                    0 if who == MaskLoader::Storer && tiles[st] => mask_flight.push((st, false)),
                    2 => store_flight = Some((st, false)),
                    3 => {
                        let k = free.completed as usize;
                        if k > 0 && !free_waited[k - 1] {
                            return Err(format!(
                                "stage free phase {k} completed while nobody had waited for phase {}",
                                k - 1
                            ));
                        }
                        free.completed += 1;
                        st += 1;
                    }
                    _ => {}
                }
                st_phase = if st_phase == 3 { 0 } else { st_phase + 1 };
            }
            2 => {
                mask_flight.push((ld, false));
                ld += 1;
            }
            3 => {
                let (s, landing) = mask_flight[0];
                if !landing {
                    begin(('m', s), &mut in_use)?;
                    mask_flight[0].1 = true;
                } else {
                    in_use = None;
                    mask_flight.remove(0);
                    mask_ready.completed += 1;
                }
            }
            _ => {
                let (s, reading) = store_flight.expect("a store in flight");
                if !reading {
                    begin(('r', s), &mut in_use)?;
                    store_flight = Some((s, true));
                } else {
                    in_use = None;
                    store_flight = None;
                }
            }
        }
    }
}

/// Which staged tiles' consumers wait for *stage free* of the tile before them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ReleaseWaits {
    /// None (a negative control: the buffer is overwritten while the stores read it).
    Never,
    /// Forward tiles only: an input gradient waits for its mask alone, which the storer loads
    /// only into a released buffer (correct, but synccheck reports the release phases nobody
    /// waited for).
    Forwards,
    /// Every tile after the first (the kernel's protocol).
    Every,
}

/// The staging hand-off of the tile-128 kernel, modelled ([`hand_off_model`]) on the staged
/// tiles of real schedules' block lists (small and large K, several SMs): under thousands of
/// random interleavings the kernel's protocol (the storer loads the masks) never passes a wait
/// early, never lets two users at the buffer or out of order, and never deadlocks; the first
/// build's protocol (the loader, running ahead, loads them after a parity wait) is caught, and so
/// are consumers that write a forward tile without waiting for the buffer's release, and input
/// gradients that wait for their mask alone (the release phases before them are then never
/// waited for, which compute-sanitizer's synccheck reports). (Not
/// modelled: warps of the consumers drifting apart, which the 256 arrivals a staged tile needs
/// bound to one tile; give-ups; the counter waits.)
#[test]
fn staging_hand_off_protocol() {
    use kiln::gpu::megakernel::staged;
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(6);
    let mut lists = Vec::new();
    for (batch, dims, sms) in
        [(512, vec![64, 256, 128, 64, 10], 3), (256, vec![1024, 1024, 1024], 5), (384, vec![200, 300, 4], 2)]
    {
        let shape = MlpShape { batch, dims };
        let layers = shape.layers() as u32;
        let sched = build_with_tile(&shape, sms, 128, Updates::Fused, WeightReads::StepStartCopy).unwrap();
        for list in &sched.per_sm {
            let tiles: Vec<bool> = list
                .iter()
                .filter(|i| staged(i.opcode, i.layer, layers))
                .map(|i| i.opcode == opcode::LINEAR_BWD_INPUT)
                .collect();
            assert!(!tiles.is_empty());
            lists.push(tiles);
        }
    }
    assert!(lists.iter().any(|t| t.iter().filter(|&&b| !b).count() >= 2 && t.iter().any(|&b| b)));
    let (mut caught, mut skipped_wait, mut unwaited) = (0, 0, 0);
    for tiles in &lists {
        for _ in 0..400 {
            if let Err(e) = hand_off_model(tiles, MaskLoader::Storer, ReleaseWaits::Every, &mut rng) {
                panic!("staged tiles {tiles:?}: {e}");
            }
            caught +=
                hand_off_model(tiles, MaskLoader::LoaderAhead, ReleaseWaits::Forwards, &mut rng).is_err() as usize;
            skipped_wait += hand_off_model(tiles, MaskLoader::Storer, ReleaseWaits::Never, &mut rng).is_err() as usize;
            unwaited += hand_off_model(tiles, MaskLoader::Storer, ReleaseWaits::Forwards, &mut rng).is_err() as usize;
        }
    }
    assert!(caught > 0, "the model misses the first build's early mask");
    assert!(skipped_wait > 0, "the model misses consumers that do not wait for the buffer's release");
    assert!(unwaited > 0, "the model misses release phases nobody waits for (input gradients not waiting)");
}

/// The weight buffer's protocol (bf16 at tile 128, [`staged`] fused updates), modelled with
/// random interleavings of its three parties over `updates` staged updates: the loader waits for
/// *weights free* of the update before (unless `loader_waits` is false) and issues the old
/// weights, which land later (completing *weights ready*); the consumers wait for *weights
/// ready* (a parity wait) and write the new weights in place; the storer, once the consumers have
/// staged them, stores them, and once its stores have read the buffer arrives on *weights free*.
/// An error names a copy that landed over weights not yet stored, or a wait that passed a phase
/// early (a lap ahead).
fn weight_buffer_model(updates: u32, loader_waits: bool, rng: &mut impl rand::Rng) -> Result<(), String> {
    // the buffer: which update's weights it holds, and whether they are the new ones, stored
    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Held {
        Empty,
        Old(u32),
        New(u32),
        Stored(u32),
    }
    let parity_wait = |completed: u32, phase: u32| -> Option<Result<(), String>> {
        if completed & 1 == phase & 1 {
            return None;
        }
        Some(if completed > phase { Ok(()) } else { Err(format!("a wait for phase {phase} passed at {completed}")) })
    };
    let (mut ready, mut free) = (0u32, 0u32);
    let mut held = Held::Empty;
    // the loader's next update, the copies in flight, the consumers' and the storer's next update
    let (mut ld, mut landing, mut c, mut st) = (0u32, Vec::<u32>::new(), 0u32, 0u32);
    let mut store_reading: Option<u32> = None;
    loop {
        let mut steps: Vec<u8> = Vec::new();
        if ld < updates {
            match if ld > 0 && loader_waits { parity_wait(free, ld - 1) } else { Some(Ok(())) } {
                Some(Ok(())) => steps.push(0),
                Some(Err(e)) => return Err(format!("loader: {e}")),
                None => {}
            }
        }
        if !landing.is_empty() {
            steps.push(1);
        }
        if c < updates {
            match parity_wait(ready, c) {
                Some(Ok(())) => steps.push(2),
                Some(Err(e)) => return Err(format!("consumers: {e}")),
                None => {}
            }
        }
        if st < c && store_reading.is_none() {
            steps.push(3);
        }
        if store_reading.is_some() {
            steps.push(4);
        }
        if steps.is_empty() {
            return if ld == updates && c == updates && st == updates && landing.is_empty() {
                Ok(())
            } else {
                Err(format!("stuck: loader {ld}, consumers {c}, storer {st}"))
            };
        }
        match steps[rng.random_range(0..steps.len())] {
            0 => {
                landing.push(ld);
                ld += 1;
            }
            1 => {
                let n = landing.remove(0);
                if n > 0 && held != Held::Stored(n - 1) {
                    return Err(format!("update {n}'s old weights landed over {held:?}"));
                }
                held = Held::Old(n);
                ready += 1;
            }
            2 => {
                if held != Held::Old(c) {
                    return Err(format!("the consumers of update {c} read {held:?}"));
                }
                held = Held::New(c);
                c += 1;
            }
            3 => {
                store_reading = Some(st);
                st += 1;
            }
            _ => {
                let n = store_reading.take().unwrap_or(u32::MAX);
                if held != Held::New(n) {
                    return Err(format!("the storer of update {n} read {held:?}"));
                }
                held = Held::Stored(n);
                free += 1;
            }
        }
    }
}

#[test]
fn weight_buffer_protocol() {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut caught = 0;
    for updates in 1..8 {
        for _ in 0..300 {
            if let Err(e) = weight_buffer_model(updates, true, &mut rng) {
                panic!("{updates} updates: {e}");
            }
            caught += weight_buffer_model(updates, false, &mut rng).is_err() as usize;
        }
    }
    assert!(caught > 0, "the model misses a loader that does not wait for the storer's release");
}
