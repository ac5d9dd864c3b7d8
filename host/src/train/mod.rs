//! The main job: check the configuration and the memory it needs, train a classifier MLP, report
//! loss and accuracy per epoch, save a checkpoint; and rebuild a saved model for `eval`.
//!
//! By role: [`TrainConfig`] and its checks (`config.rs`), the memory a run needs (`memory.rs`), the
//! MLP on the tensor engine (`mlp.rs`: [`train`], [`load_model`]), the same job through the
//! training megakernel (`megakernel.rs`), the GPT ([`gpt`]), data parallelism over GPUs
//! ([`data_parallel`], [`gpt_parallel`]) and its benchmark ([`dist_bench`]).

pub mod data_parallel;
pub mod dist_bench;
pub mod gpt;
pub mod gpt_parallel;

mod config;
mod megakernel;
mod memory;
mod mlp;

pub use config::*;
pub use memory::*;
pub use mlp::*;
// the crate-visible helpers the other files of `train` share
#[allow(unused_imports)]
pub(crate) use {config::*, megakernel::*, mlp::*};
