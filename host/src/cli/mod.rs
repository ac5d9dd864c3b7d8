//! The `kiln` binary's commands, by role: their flags ([`args`]), training and sampling
//! ([`train`]), and the kernel and collective measurements ([`kernels`]). `main.rs` parses the
//! command line and dispatches here.

pub(crate) mod args;
pub(crate) mod kernels;
pub(crate) mod train;
