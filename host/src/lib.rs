//! # kiln
//!
//! GPU kernels written in Rust, and the engine that runs them. This crate is the host side: it
//! loads the PTX built from [`kiln_gpu`] through the CUDA driver API, picks the module for the
//! device, and launches kernels through launchers typed by the kernels' own declarations.
//!
//! - [`cuda`]: devices, buffers, typed launches, TMA tensor maps, and checked launchers ([`cuda::ops`]).
//! - [`ptx`]: the embedded PTX modules and the choice of module per compute capability.
//! - [`testing`]: the comparison helper and GPU-test plumbing every backend's tests share.
//! - [`tools`]: the runners behind the CLI's tool commands (`kiln gemm`).
#![warn(missing_docs)]

pub mod checkpoint;
pub mod cuda;
pub mod data;
pub mod deterministic;
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
