//! # kiln
//!
//! GPU kernels written in Rust, and the engine that runs them. This crate is the host side: it
//! loads the PTX built from [`kiln_gpu`] through the CUDA driver API, picks the module for the
//! device, and launches kernels through launchers typed by the kernels' own declarations.
//!
//! - [`attention`]: the f64 CPU reference of attention, forward and backward, that the attention
//!   kernels are checked against.
//! - [`cuda`]: devices, buffers, typed launches, TMA tensor maps, and checked launchers ([`cuda::ops`]).
//! - [`ptx`]: the embedded PTX modules and the choice of module per compute capability.
//! - [`testing`]: the comparison helper and GPU-test plumbing every backend's tests share.
//! - [`tools`]: the runners behind the CLI's tool commands (`kiln gemm`).
//! - [`tensor`]: [`Tensor`] with autograd, its methods and operators (`&a + &b`), on the CPU or a GPU;
//!   [`nn`], [`optim`], [`checkpoint`] and [`data`] build models, train them and save them;
//!   [`train`] is the main job the `kiln` binary runs.
//!
//! # Using kiln from another crate
//!
//! Depend on it by path or git (`kiln = { path = "../kiln/host" }`), and build with the nightly
//! pinned in kiln's `rust-toolchain.toml`: the build script compiles the kernels to PTX with
//! `-Zbuild-std=core`, which only a nightly cargo accepts (copy the file into your crate, or run
//! `rustup override set` there; the README's section "Using kiln as a library" has the steps).
//!
//! The crates whose types kiln's API takes or returns are re-exported, so their versions always
//! match kiln's: [`rand`] (the seeded generators that [`Tensor::randn`], [`nn::Linear::new`] and
//! [`data::spirals`] take: `kiln::rand::rngs::StdRng`, `kiln::rand::SeedableRng`), [`half`] (the
//! bf16 and f16 elements of [`tensor::CpuStorage`]), [`cudarc`] (the driver types of [`cuda`]) and
//! [`gpu`] (`kiln-gpu`: the kernels and their parameter structs).
//!
//! # Example: train, save, reload, evaluate
//!
//! The crate's example `examples/train_mlp.rs` (`cargo run --example train_mlp`), run here as a test:
//! an MLP trained on generated spirals on the CPU, saved, loaded into a fresh model and evaluated.
//!
//! ```
#![doc = include_str!("../examples/train_mlp.rs")]
//! ```
#![warn(missing_docs)]

pub mod attention;
pub mod checkpoint;
pub mod corpus;
pub mod cuda;
pub mod data;
pub mod deterministic;
pub mod dist;
mod dtype;
mod error;
pub mod megakernel;
pub mod nn;
pub mod optim;
pub mod ptx;
pub mod tensor;
pub mod testing;
pub mod tools;
pub mod train;

pub use dtype::DType;
pub use error::{Error, Result};
pub use kiln_gpu as gpu;
pub use tensor::{Device, Shape, Tensor};
pub use {cudarc, half, rand};
