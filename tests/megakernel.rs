//! The megakernel's schedule, interpreted on the CPU with SMs interleaved at random, against kiln's
//! layer-by-layer autograd path: no deadlock for any shape, and the same weights after 1 and 3 steps.

use kiln::gpu::megakernel::{TILES, choose_tile};
use kiln::megakernel::{Loss, MlpShape, StepInputs, StepState, build, build_with_tile, interpret};
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
fn compare(
    shape: &MlpShape,
    loss: Loss,
    sms: usize,
    tile: u32,
    steps: usize,
    momentum: f32,
    seed: u64,
) -> Result<f64, String> {
    kiln::deterministic::set_deterministic(true);
    let model = reference_model(&shape.dims, seed);
    let weights: Vec<Vec<f32>> = model.parameters().iter().map(|p| p.to_vec_f32()).collect();
    let schedule = build_with_tile(shape, sms, tile).map_err(|e| e.to_string())?;
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
            for steps in [1, 3] {
                let worst = compare(&shape, loss, 7, tile, steps, momentum, 1).unwrap();
                eprintln!("{loss:?} momentum {momentum} tile {tile} steps {steps}: worst {worst:e}");
                assert!(worst < 1e-5, "{loss:?} momentum {momentum} tile {tile} after {steps} steps: {worst}");
            }
        }
    }
}

#[test]
fn instruction_counts() {
    let shape = MlpShape { batch: 130, dims: vec![64, 65, 1] };
    let s = build(&shape, 4).unwrap();
    assert_eq!(s.tile, 64, "3 x 2 tiles of 64 cover 4 SMs");
    // fwd: 3x2 + 3x1; loss: 3x1; bwd weight: (1x2) + (2x1); bwd input layer 1: 3x2; sgd: 2 + 2
    assert_eq!(s.order.len(), 6 + 3 + 3 + 2 + 2 + 6 + 2 + 2);
    assert_eq!(s.per_sm.iter().map(|v| v.len()).sum::<usize>(), s.order.len());
    assert!(build(&MlpShape { batch: 0, dims: vec![2, 3] }, 4).is_err());
    assert!(build(&MlpShape { batch: 4, dims: vec![2] }, 4).is_err());
    assert!(build_with_tile(&shape, 4, 48).unwrap_err().to_string().contains("tile 48"));
}

/// The tile the sweep in `benches/results/mlp_step.md` found fastest for each benchmark model, and
/// the smallest tile when even one tile per 10 SMs is out of reach.
#[test]
fn the_tile_fits_the_model() {
    assert_eq!(choose_tile(4096, 1024, 132), 64);
    assert_eq!(choose_tile(256, 1024, 132), 64);
    assert_eq!(choose_tile(64, 256, 132), 32);
    assert_eq!(choose_tile(1, 1, 1), 64);
    assert_eq!(choose_tile(16, 16, 132), 16);
}

#[test]
fn a_wrong_wait_is_a_reported_deadlock_not_a_hang() {
    let shape = MlpShape { batch: 64, dims: vec![8, 8, 4] };
    let mut s = build(&shape, 3).unwrap();
    // one arrival too many expected: the waiter can never run
    let victim = s.per_sm[1].iter_mut().find(|i| i.wait != kiln::gpu::megakernel::NO_COUNTER).unwrap();
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
    fn random_shapes_never_deadlock_and_match(batch in 1usize..200, widths in prop::collection::vec(1usize..150, 2..5), sms in 1usize..17, tile in prop::sample::select(TILES.to_vec()), seed in 0u64..1000) {
        let shape = MlpShape { batch, dims: widths };
        let worst = compare(&shape, Loss::CrossEntropy, sms, tile, 1, 0.0, seed).map_err(TestCaseError::fail)?;
        prop_assert!(worst < 1e-5, "{shape:?} on {sms} SMs, tile {tile}: {worst}");
    }
}

/// The case proptest found: one hidden unit whose pre-activation sits near 0.
#[test]
fn a_one_unit_hidden_layer_matches() {
    let shape = MlpShape { batch: 37, dims: vec![92, 1, 2] };
    for seed in [450, 451, 452] {
        for sms in [1, 3] {
            let worst = compare(&shape, Loss::CrossEntropy, sms, 64, 1, 0.0, seed).unwrap();
            assert!(worst < 1e-5, "seed {seed} on {sms} SMs: {worst}");
        }
    }
}
