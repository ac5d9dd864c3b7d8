//! Forward values of every op against straightforward f64 references, on the CPU backend. The same
//! cases run on CUDA from the GPU suite (`gpu/tensor.rs`); they are written once, in
//! `backend_cases.rs`.

mod backend_cases;
mod dtype_cases;

macro_rules! cpu_tests {
    ($($name:ident),* $(,)?) => {
        $(#[test] fn $name() { backend_cases::$name(&kiln::tensor::Device::Cpu) })*
    };
}

cpu_tests!(
    matmul_matches_naive,
    matmul_t_matches_matmul_of_transpose,
    broadcast_binary,
    reductions_and_max,
    softmax_and_cross_entropy,
    cross_entropy_many_rows_reused_targets,
    layer_norm_matches_two_pass,
    gelu_and_friends,
    embedding_and_transpose,
    dtypes_round_trip,
);

/// The bf16 / f16 cases (`dtype_cases.rs`) on the CPU backend, each for both 16-bit dtypes.
macro_rules! cpu_dtype_tests {
    ($($name:ident),* $(,)?) => {
        $(#[test] fn $name() {
            for dt in [kiln::tensor::DType::BF16, kiln::tensor::DType::F16] {
                dtype_cases::$name(&kiln::tensor::Device::Cpu, dt).unwrap();
            }
        })*
    };
}

mod dtypes {
    use super::dtype_cases;
    cpu_dtype_tests!(
        conversions,
        elementwise,
        copies,
        sums,
        max_and_argmax,
        softmax_rows,
        cross_entropy,
        layer_norm,
        embedding,
        matmul,
        matmul_in_place,
        dropout,
        mixed_dtypes,
    );
}

/// A product over zero inputs (K = 0) is zeros of the right shape (plus the bias for `linear`),
/// and its gradients are zeros too: the row count comes from the leading dimensions, not from
/// dividing the element count by K.
#[test]
fn products_over_zero_inputs_are_zeros_of_the_right_shape() {
    use kiln::tensor::{DType, Tensor};
    let x = Tensor::zeros([5, 0], DType::F64).requires_grad();
    let w = Tensor::zeros([3, 0], DType::F64).requires_grad();
    let y = x.matmul_t(&w).expect("x w^T with k = 0");
    assert_eq!(y.dims(), [5, 3]);
    assert_eq!(y.to_vec_f64(), vec![0.0; 15]);
    let b = Tensor::from_f64(&[1.0, 2.0, 3.0], [3], DType::F64).expect("bias");
    let z = x.linear(&w, Some(&b), None).expect("linear with k = 0");
    assert_eq!(z.dims(), [5, 3]);
    assert_eq!(z.to_vec_f64(), [1.0, 2.0, 3.0].repeat(5));
    let x3 = Tensor::zeros([2, 4, 0], DType::F64);
    assert_eq!(x3.matmul_t(&w).expect("rank 3, k = 0").dims(), [2, 4, 3]);
    z.sum_all().expect("sum").backward().expect("backward with k = 0");
    assert_eq!(x.grad().expect("x grad").dims(), [5, 0]);
    assert_eq!(w.grad().expect("w grad").dims(), [3, 0]);
}
