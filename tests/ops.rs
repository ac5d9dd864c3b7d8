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
        dropout,
        mixed_dtypes,
    );
}
