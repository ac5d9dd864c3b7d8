//! Mixed-precision training on the CPU reference: f32 master parameters, bf16 products and
//! activations inside an `autocast` scope, f32 gradients for the masters, and the training loop's
//! `--dtype bf16`. (The CUDA side, with the optimizer-written compute copies: tests/gpu/mixed.rs.)

use kiln::nn::{Activation, Linear, Module, autocast, autocast_dtype, mlp};
use kiln::optim::{Adam, Optimizer, attach_compute_copies};
use kiln::tensor::{DType, Tensor};
use kiln::train::{DataSource, DeviceChoice, TrainConfig, train};

/// The model's step by hand: each master converted to bf16 (a tracked conversion), the layers
/// composed from tensor ops in bf16, the loss of bf16 logits, and an f32 Adam update.
fn explicit_step(layers: &[(Tensor, Tensor)], x: &Tensor, y: &[usize], opt: &mut Adam) -> Tensor {
    let mut h = x.to_dtype(DType::BF16).unwrap();
    for (i, (w, b)) in layers.iter().enumerate() {
        let wb = w.to_dtype(DType::BF16).unwrap();
        let bb = b.to_dtype(DType::BF16).unwrap();
        h = h.matmul_t(&wb).unwrap().add(&bb).unwrap();
        if i + 1 < layers.len() {
            h = h.relu().unwrap();
        }
    }
    let loss = h.cross_entropy(y).unwrap();
    loss.backward().unwrap();
    opt.step().unwrap();
    loss
}

#[test]
fn a_mixed_bf16_step_equals_the_explicit_composition() {
    let (inputs, width, classes) = (5, 12, 4);
    let model = mlp(inputs, width, 3, classes, Activation::Relu, DType::F32, &mut Tensor::rng(3)).unwrap();
    let twin = mlp(inputs, width, 3, classes, Activation::Relu, DType::F32, &mut Tensor::rng(3)).unwrap();
    let x = Tensor::randn([7, inputs], DType::F32, &mut Tensor::rng(4));
    let y = [0, 1, 2, 3, 0, 1, 2];

    let mut opt = Adam::adam(model.named_parameters(), 1e-2, 0.0);
    // no parameter is on a GPU: no copies to attach (the forward converts the masters)
    assert_eq!(attach_compute_copies(&mut opt, DType::BF16).unwrap(), 0);
    let logits = {
        let _mixed = autocast(DType::BF16).unwrap();
        assert_eq!(autocast_dtype(), Some(DType::BF16));
        model.forward(&x).unwrap()
    };
    assert_eq!(autocast_dtype(), None, "the scope ends with its guard");
    assert_eq!(logits.dtype(), DType::BF16);
    let loss = logits.cross_entropy(&y).unwrap();
    loss.backward().unwrap();
    let grads: Vec<Vec<f64>> = model
        .parameters()
        .iter()
        .map(|p| {
            let g = p.grad().expect("every master gets a gradient");
            assert_eq!(g.dtype(), DType::F32, "the masters' gradients are f32");
            g.to_vec_f64()
        })
        .collect();
    opt.step().unwrap();

    let tp = twin.parameters();
    let layers: Vec<(Tensor, Tensor)> = tp.chunks(2).map(|c| (c[0].clone(), c[1].clone())).collect();
    let mut twin_opt = Adam::adam(twin.named_parameters(), 1e-2, 0.0);
    let twin_grads = {
        // the same step by hand; gradients read before its update
        let mut h = x.to_dtype(DType::BF16).unwrap();
        for (i, (w, b)) in layers.iter().enumerate() {
            h = h.matmul_t(&w.to_dtype(DType::BF16).unwrap()).unwrap().add(&b.to_dtype(DType::BF16).unwrap()).unwrap();
            if i + 1 < layers.len() {
                h = h.relu().unwrap();
            }
        }
        let l = h.cross_entropy(&y).unwrap();
        assert_eq!(l.to_vec_f64(), loss.to_vec_f64(), "the same loss");
        l.backward().unwrap();
        tp.iter().map(|p| p.grad().unwrap().to_vec_f64()).collect::<Vec<_>>()
    };
    assert_eq!(grads, twin_grads, "the same f32 gradients, bit for bit");
    twin_opt.step().unwrap();
    for (a, b) in model.parameters().iter().zip(&tp) {
        assert_eq!(a.dtype(), DType::F32, "the masters stay f32");
        assert_eq!(a.to_vec_f64(), b.to_vec_f64(), "the same f32 update, bit for bit");
    }

    // and a second step through the helper agrees too (state carried over)
    model.parameters().iter().for_each(|p| p.zero_grad());
    tp.iter().for_each(|p| p.zero_grad());
    let mixed_loss = {
        let _mixed = autocast(DType::BF16).unwrap();
        let l = model.forward(&x).unwrap().cross_entropy(&y).unwrap();
        l.backward().unwrap();
        opt.step().unwrap();
        l
    };
    let explicit_loss = explicit_step(&layers, &x, &y, &mut twin_opt);
    assert_eq!(mixed_loss.to_vec_f64(), explicit_loss.to_vec_f64());
    for (a, b) in model.parameters().iter().zip(&tp) {
        assert_eq!(a.to_vec_f64(), b.to_vec_f64());
    }
}

#[test]
fn autocast_takes_16_bit_dtypes_and_leaves_16_bit_layers_alone() {
    assert!(autocast(DType::F32).is_err());
    assert!(autocast(DType::F64).is_err());
    {
        let _outer = autocast(DType::BF16).unwrap();
        {
            let _inner = autocast(DType::F16).unwrap();
            assert_eq!(autocast_dtype(), Some(DType::F16));
        }
        assert_eq!(autocast_dtype(), Some(DType::BF16), "nested scopes restore what they found");
        // a layer that is already bf16 computes in its own dtype
        let l = Linear::new(3, 2, true, DType::BF16, &mut Tensor::rng(1)).unwrap();
        let y = l.forward(&Tensor::ones([4, 3], DType::BF16)).unwrap();
        assert_eq!(y.dtype(), DType::BF16);
        // an f32 layer takes an f32 input and returns bf16
        let l = Linear::new(3, 2, true, DType::F32, &mut Tensor::rng(1)).unwrap();
        assert_eq!(l.forward(&Tensor::ones([4, 3], DType::F32)).unwrap().dtype(), DType::BF16);
    }
    // outside the scope a dtype mismatch stays an error, not a conversion
    let l = Linear::new(3, 2, true, DType::F32, &mut Tensor::rng(1)).unwrap();
    assert!(l.forward(&Tensor::ones([4, 3], DType::BF16)).is_err());
}

#[test]
fn a_mixed_step_is_close_to_the_f32_step() {
    // bf16 products and activations keep about 3 significant digits: the first step's gradients
    // agree with f32's to a few percent of their scale.
    let model = mlp(6, 16, 3, 3, Activation::Relu, DType::F32, &mut Tensor::rng(8)).unwrap();
    let x = Tensor::randn([9, 6], DType::F32, &mut Tensor::rng(9));
    let y = [0, 1, 2, 0, 1, 2, 0, 1, 2];
    let grads = |mixed: bool| -> Vec<Vec<f64>> {
        model.parameters().iter().for_each(|p| p.zero_grad());
        let _m = mixed.then(|| autocast(DType::BF16).unwrap());
        model.forward(&x).unwrap().cross_entropy(&y).unwrap().backward().unwrap();
        model.parameters().iter().map(|p| p.grad().unwrap().to_vec_f64()).collect()
    };
    let (f32_grads, bf16_grads) = (grads(false), grads(true));
    for (a, b) in f32_grads.iter().zip(&bf16_grads) {
        let scale = a.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-3);
        for (u, v) in a.iter().zip(b) {
            assert!((u - v).abs() <= 0.05 * scale, "f32 {u} vs mixed {v} (scale {scale})");
        }
    }
}

#[test]
fn training_with_dtype_bf16_is_mixed_precision_and_learns_spirals() {
    let cfg = TrainConfig {
        data: DataSource::Spirals { per_class: 200, classes: 3, noise: 0.2 },
        epochs: 25,
        dtype: DType::BF16,
        device: DeviceChoice::Cpu,
        checkpoint: None,
        progress: false,
        ..TrainConfig::default()
    };
    let mut lines = Vec::new();
    let report = train(&cfg, |l| lines.push(l.to_string())).unwrap();
    assert!(lines.iter().any(|l| l.contains("mixed precision")), "{lines:?}");
    assert!(report.model.parameters().iter().all(|p| p.dtype() == DType::F32), "f32 masters");
    let last = report.epochs.last().unwrap();
    assert!(last.test_accuracy >= 0.9, "test accuracy {}", last.test_accuracy);
    assert!(report.epochs[0].loss > last.loss);
}

#[test]
fn f16_on_cuda_trains_with_loss_scaling() {
    if !kiln::cuda::Device::count().is_ok_and(|n| n > 0) {
        return; // without a GPU asking for CUDA is a driver error (tests/training.rs)
    }
    let cfg = TrainConfig {
        dtype: DType::F16,
        device: DeviceChoice::Cuda,
        epochs: 1,
        checkpoint: None,
        progress: false,
        ..TrainConfig::default()
    };
    let mut lines = Vec::new();
    let report = train(&cfg, |l| lines.push(l.to_string())).expect("f16 trains on CUDA");
    assert!(report.device.starts_with("GPU"), "{}", report.device);
    assert!(lines.iter().any(|l| l.contains("loss scaling")), "{lines:?}");
}

#[test]
fn linear_is_the_composition_of_its_parts_on_the_cpu() {
    use kiln::cuda::gemm::Activation as Act;
    let mut rng = Tensor::rng(21);
    for dtype in [DType::F32, DType::BF16] {
        // odd rows and outputs, inputs not a multiple of 8, a 3-D input
        for x_shape in [vec![7usize, 13], vec![2, 5, 13]] {
            for act in [None, Some(Act::Relu), Some(Act::Gelu)] {
                let x = Tensor::randn(x_shape.clone(), DType::F32, &mut rng).to_dtype(dtype).unwrap();
                let w = Tensor::randn([9, 13], DType::F32, &mut rng).requires_grad();
                let b = Tensor::randn([9], DType::F32, &mut rng).requires_grad();
                let (wc, bc) = (w.compute_copy(dtype).unwrap(), b.compute_copy(dtype).unwrap());
                let y = x.linear(&wc, Some(&b), act).unwrap();
                let pre = x.matmul_t(&wc).unwrap().add(&bc).unwrap();
                let want = match act {
                    None => pre,
                    Some(Act::Relu) => pre.relu().unwrap(),
                    Some(Act::Gelu) => pre.gelu().unwrap(),
                };
                assert_eq!(y.dtype(), dtype);
                assert_eq!(y.dims(), want.dims());
                assert_eq!(y.to_vec_f64(), want.to_vec_f64(), "{dtype:?} {x_shape:?} {act:?}");
                y.to_dtype(DType::F32).unwrap().sum_all().unwrap().backward().unwrap();
                let (gw, gb) = (w.grad().unwrap(), b.grad().unwrap());
                assert_eq!((gw.dtype(), gb.dtype()), (DType::F32, DType::F32), "the masters' gradients are f32");
            }
        }
    }
    // shapes are checked
    let x = Tensor::ones([3, 4], DType::F32);
    assert!(x.linear(&Tensor::ones([2, 5], DType::F32), None, None).is_err());
    assert!(x.linear(&Tensor::ones([2, 4], DType::F32), Some(&Tensor::ones([3], DType::F32)), None).is_err());
}

#[test]
fn sequential_runs_a_linear_and_its_activation_together_with_the_same_result() {
    let model = mlp(6, 16, 4, 3, Activation::Gelu, DType::F32, &mut Tensor::rng(2)).unwrap();
    let x = Tensor::randn([5, 6], DType::F32, &mut Tensor::rng(3));
    let params = model.parameters();
    let mut h = x.clone();
    for (i, pair) in params.chunks(2).enumerate() {
        h = h.matmul_t(&pair[0]).unwrap().add(&pair[1]).unwrap();
        if i + 1 < params.len() / 2 {
            h = h.gelu().unwrap();
        }
    }
    assert_eq!(model.forward(&x).unwrap().to_vec_f64(), h.to_vec_f64());
    // parameter names do not change (checkpoints read the same)
    let names: Vec<String> = model.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias", "6.weight", "6.bias"]);
}
