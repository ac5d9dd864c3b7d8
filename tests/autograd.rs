//! Every op's backward against central finite differences in f64 (`gradcheck`), plus the autograd
//! machinery: accumulation, detach, no_grad, zero_grad, and typed errors.
#![allow(clippy::cloned_ref_to_slice_refs)]

use kiln::tensor::{DType, Tensor, gradcheck, no_grad};

const TOL: f64 = 1e-6;

fn rnd(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn(shape.to_vec(), DType::F64, &mut Tensor::rng(seed))
}
fn pos(shape: &[usize], seed: u64) -> Tensor {
    Tensor::rand(0.5, 2.0, shape.to_vec(), DType::F64, &mut Tensor::rng(seed))
}

fn check(name: &str, inputs: &[Tensor], f: impl Fn(&[Tensor]) -> kiln::Result<Tensor>) {
    match gradcheck(name, inputs, f, TOL) {
        Ok(worst) => assert!(worst <= TOL, "{name}: {worst}"),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn elementwise_binary_with_broadcasting() {
    let (a, b) = (rnd(&[3, 4], 1), rnd(&[3, 4], 2));
    let (row, col) = (rnd(&[4], 3), rnd(&[3, 1], 4));
    check("add", &[a.clone(), b.clone()], |x| x[0].add(&x[1]));
    check("sub", &[a.clone(), b.clone()], |x| x[0].sub(&x[1]));
    check("mul", &[a.clone(), b.clone()], |x| x[0].mul(&x[1]));
    check("div", &[a.clone(), pos(&[3, 4], 5)], |x| x[0].div(&x[1]));
    check("add row broadcast", &[a.clone(), row.clone()], |x| x[0].add(&x[1]));
    check("mul column broadcast", &[a.clone(), col.clone()], |x| x[0].mul(&x[1]));
    check("div row broadcast", &[a.clone(), pos(&[4], 6)], |x| x[0].div(&x[1]));
    check("sub column from row", &[row, col], |x| x[1].sub(&x[0]));
}

#[test]
fn elementwise_unary() {
    let a = rnd(&[2, 5], 7);
    check("neg", &[a.clone()], |x| x[0].neg());
    check("add_scalar", &[a.clone()], |x| x[0].add_scalar(1.5));
    check("mul_scalar", &[a.clone()], |x| x[0].mul_scalar(-2.5));
    check("exp", &[a.clone()], |x| x[0].exp());
    check("log", &[pos(&[2, 5], 8)], |x| x[0].log());
    check("sqrt", &[pos(&[2, 5], 9)], |x| x[0].sqrt());
    check("gelu", &[a.clone()], |x| x[0].gelu());
    check("tanh", &[a.clone()], |x| x[0].tanh());
    check("sigmoid", &[a.clone()], |x| x[0].sigmoid());
    // relu away from its kink (finite differences straddling 0 are meaningless)
    let away = Tensor::from_f64(&[-1.0, -0.3, 0.2, 0.9, 2.0, -2.0], [2, 3], DType::F64).unwrap();
    check("relu", &[away], |x| x[0].relu());
}

#[test]
fn matmul_2d_and_batched() {
    check("matmul 2d", &[rnd(&[3, 4], 10), rnd(&[4, 5], 11)], |x| x[0].matmul(&x[1]));
    check("matmul batched", &[rnd(&[2, 3, 4], 12), rnd(&[2, 4, 2], 13)], |x| x[0].matmul(&x[1]));
    check("matmul 3d x 2d", &[rnd(&[2, 3, 4], 14), rnd(&[4, 2], 15)], |x| x[0].matmul(&x[1]));
    check("matmul_t 2d", &[rnd(&[3, 4], 16), rnd(&[5, 4], 17)], |x| x[0].matmul_t(&x[1]));
    check("matmul_t 3d", &[rnd(&[2, 3, 4], 18), rnd(&[2, 4], 19)], |x| x[0].matmul_t(&x[1]));
}

#[test]
fn reductions() {
    let a = rnd(&[3, 4, 2], 16);
    check("sum all", &[a.clone()], |x| x[0].sum_all());
    check("mean all", &[a.clone()], |x| x[0].mean_all());
    check("sum dim 1", &[a.clone()], |x| x[0].sum_dim(1, false));
    check("sum dim -1 keepdim", &[a.clone()], |x| x[0].sum_dim(-1, true));
    check("mean dim 0", &[a.clone()], |x| x[0].mean_dim(0, false));
    check("max dim 1", &[a.clone()], |x| x[0].max_dim(1, false));
    check("max dim -1 keepdim", &[a.clone()], |x| x[0].max_dim(-1, true));
}

#[test]
fn shape_ops() {
    let a = rnd(&[2, 3, 4], 17);
    check("reshape", &[a.clone()], |x| x[0].reshape([6, 4]));
    check("transpose", &[a.clone()], |x| x[0].transpose(0, 2));
    check("transpose last two", &[a.clone()], |x| x[0].transpose(-1, -2));
    check("expand", &[rnd(&[3, 1], 18)], |x| x[0].expand(&[2, 3, 5].into()));
    check("sum_to", &[a.clone()], |x| x[0].sum_to(&[3, 1].into()));
}

#[test]
fn softmax_family_and_losses() {
    let a = rnd(&[4, 5], 19);
    check("softmax", &[a.clone()], |x| x[0].softmax());
    check("log_softmax", &[a.clone()], |x| x[0].log_softmax());
    check("cross_entropy", &[a.clone()], |x| x[0].cross_entropy(&[0, 4, 2, 2]));
    check("mse", &[a.clone(), rnd(&[4, 5], 20)], |x| x[0].mse(&x[1]));
}

#[test]
fn layer_norm_embedding_dropout() {
    let x = rnd(&[3, 6], 21);
    check("layer_norm", &[x, rnd(&[6], 22), rnd(&[6], 23)], |t| t[0].layer_norm(&t[1], &t[2], 1e-5));
    check("embedding", &[rnd(&[5, 3], 24)], |t| t[0].embedding(&[4, 0, 4, 2], [2, 2]));
    // the same seed gives the same mask in every evaluation
    check("dropout", &[rnd(&[4, 4], 25)], |t| t[0].dropout(0.3, &mut Tensor::rng(99)));
}

#[test]
fn gradients_flow_through_dtype_conversions() {
    // Finite differences through f32 rounding are meaningless; check the rule directly.
    let x = rnd(&[3], 26).requires_grad();
    let y = x.to_dtype(DType::F32).unwrap().mul_scalar(3.0).unwrap().to_dtype(DType::F64).unwrap().sum_all().unwrap();
    y.backward().unwrap();
    let g = x.grad().unwrap();
    assert_eq!(g.dtype(), DType::F64);
    assert_eq!(g.to_vec_f64(), vec![3.0; 3]);
}

#[test]
fn gradients_accumulate_for_reused_tensors() {
    let x = Tensor::from_f64(&[2.0, -3.0], [2], DType::F64).unwrap().requires_grad();
    // y = x*x + x  => dy/dx = 2x + 1, x used three times
    let y = x.mul(&x).unwrap().add(&x).unwrap().sum_all().unwrap();
    y.backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec_f64(), vec![5.0, -5.0]);
    // a second backward adds to the stored gradient; zero_grad clears it
    let y = x.mul_scalar(3.0).unwrap().sum_all().unwrap();
    y.backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec_f64(), vec![8.0, -2.0]);
    x.zero_grad();
    assert!(x.grad().is_none());
}

#[test]
fn detach_and_no_grad_stop_gradients() {
    let x = Tensor::from_f64(&[1.0, 2.0], [2], DType::F64).unwrap().requires_grad();
    let y = x.detach().mul(&x).unwrap().sum_all().unwrap();
    y.backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec_f64(), vec![1.0, 2.0], "only the tracked factor contributes");
    let z = {
        let _g = no_grad();
        x.mul(&x).unwrap().sum_all().unwrap()
    };
    assert!(!z.is_tracked());
    assert!(matches!(z.backward(), Err(kiln::Error::Autograd(_))));
}

#[test]
fn backward_needs_a_scalar() {
    let x = Tensor::ones([3], DType::F32).requires_grad();
    let e = x.mul_scalar(2.0).unwrap().backward().unwrap_err();
    assert!(e.to_string().contains("scalar"), "{e}");
}

#[test]
fn deep_graph_does_not_overflow() {
    let x = Tensor::ones([4], DType::F32).requires_grad();
    let mut y = x.clone();
    for _ in 0..20_000 {
        y = y.add_scalar(0.0).unwrap();
    }
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec_f64(), vec![1.0; 4]);
}

#[test]
fn bad_input_is_a_typed_error_naming_op_and_shapes() {
    let a = Tensor::zeros([2, 3], DType::F32);
    let e = a.add(&Tensor::zeros([4], DType::F32)).unwrap_err().to_string();
    assert!(e.contains("add") && e.contains("[2, 3]") && e.contains("[4]"), "{e}");
    let e = a.matmul(&Tensor::zeros([2, 3], DType::F32)).unwrap_err().to_string();
    assert!(e.contains("matmul") && e.contains("[2, 3]"), "{e}");
    let e = a.add(&Tensor::zeros([2, 3], DType::F64)).unwrap_err();
    assert!(matches!(e, kiln::Error::DType { op: "add", .. }), "{e}");
    let e = a.cross_entropy(&[0, 3]).unwrap_err();
    assert!(matches!(e, kiln::Error::Index { op: "cross_entropy", .. }), "{e}");
    assert!(e.to_string().contains("target 3 at row 1"), "{e}");
    let e = a.cross_entropy(&[0]).unwrap_err().to_string();
    assert!(e.contains("1 targets for 2 rows"), "{e}");
    let table = Tensor::zeros([4, 2], DType::F32);
    let e = table.embedding(&[1, 9], [2]).unwrap_err().to_string();
    assert!(e.contains("id 9") && e.contains("4 rows"), "{e}");
    let e = Tensor::zeros([0, 3], DType::F32).mean_all().unwrap_err().to_string();
    assert!(e.contains("empty"), "{e}");
    let e = Tensor::zeros([2, 0], DType::F32).softmax().unwrap_err().to_string();
    assert!(e.contains("softmax") && e.contains("[2, 0]"), "{e}");
    let e = a.reshape([4, 2]).unwrap_err().to_string();
    assert!(e.contains("reshape"), "{e}");
    let e =
        a.layer_norm(&Tensor::ones([2], DType::F32), &Tensor::zeros([3], DType::F32), 1e-5).unwrap_err().to_string();
    assert!(e.contains("layer_norm") && e.contains("[3]"), "{e}");
    let e = Tensor::zeros([2], DType::BF16).add(&Tensor::zeros([2], DType::F32)).unwrap_err().to_string();
    assert!(e.contains("BF16") && e.contains("F32"), "{e}");
}
