//! Forward values of every op against straightforward f64 references, on the CPU backend. The same
//! cases run on CUDA from the GPU suite (`gpu/tensor.rs`); they are written once, in
//! `backend_cases.rs`.

mod backend_cases;

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
