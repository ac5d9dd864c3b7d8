//! Hardware probes: the smallest kernels that exercise one mechanism each (mbarrier phases, a TMA
//! round trip, TMA streaming into a page ring, tensor memory, `mma.sync` tiles and their peak rate)
//! so that the GEMMs and the megakernel build on checked parts. Tests compare them with CPU
//! references; `benches/` times the streaming and peak probes.

pub use super::{barrier, mma_tile, tma_stream, tma_tile, tmem};
