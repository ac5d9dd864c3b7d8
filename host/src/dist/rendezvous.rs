//! The ranks of a multi-process run meet over TCP, torchrun-style (`--master-addr`,
//! `--master-port`, `--rank`, `--world-size`): rank 0 listens, makes the 128-byte NCCL unique id
//! and hands it to every other rank, which connects (retrying until a deadline) and says its rank
//! and world size. A world size that differs from rank 0's, a rank out of range or twice, a busy
//! port and a master that never answers are typed errors ([`Error::Rendezvous`]), never a hang.
//!
//! Wire format (little-endian): a rank sends `rank: u32, world: u32`; rank 0 answers one status
//! byte, then 128 id bytes (status 0) or a `u32` length and a UTF-8 message (status 1).

use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Where a process of a multi-process run meets the others, and who it is there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendezvous {
    /// Rank 0's address (`--master-addr`, `MASTER_ADDR`).
    pub addr: String,
    /// Rank 0's port (`--master-port`, `MASTER_PORT`).
    pub port: u16,
    /// This process's rank (`--rank`, `RANK`).
    pub rank: usize,
    /// Processes in the run (`--world-size`, `WORLD_SIZE`).
    pub world: usize,
}

/// Shares the id that rank 0 makes with `make` among `world` ranks; every rank returns the same
/// bytes. `timeout` bounds the whole exchange for every rank.
pub fn share_id(
    addr: &str,
    port: u16,
    rank: usize,
    world: usize,
    timeout: Duration,
    make: impl FnOnce() -> Result<[u8; 128]>,
) -> Result<[u8; 128]> {
    let at = format!("{addr}:{port}");
    let fail = |msg: String| Error::Rendezvous { addr: at.clone(), rank, world, msg };
    if world == 0 || rank >= world {
        return Err(fail(format!("rank {rank} is not in a world of {world}: ranks are 0 to world size - 1")));
    }
    if world > u32::MAX as usize {
        return Err(fail("world size too large".into()));
    }
    let deadline = Instant::now() + timeout;
    if rank == 0 {
        let listener = TcpListener::bind(&at)
            .map_err(|e| fail(format!("cannot listen ({e}); is the port busy? pick another --master-port")))?;
        listener.set_nonblocking(true).map_err(|e| fail(e.to_string()))?;
        let id = make()?;
        let mut seen = vec![false; world];
        seen[0] = true;
        let mut joined = 1;
        while joined < world {
            let (mut s, _) = match listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<String> = (0..world).filter(|&r| !seen[r]).map(|r| r.to_string()).collect();
                        return Err(fail(format!(
                            "timed out after {timeout:?} waiting for rank(s) {}",
                            missing.join(", ")
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                Err(e) => return Err(fail(e.to_string())),
            };
            s.set_nonblocking(false).map_err(|e| fail(e.to_string()))?;
            s.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))))
                .map_err(|e| fail(e.to_string()))?;
            let mut hdr = [0u8; 8];
            s.read_exact(&mut hdr).map_err(|e| fail(format!("reading a rank's greeting: {e}")))?;
            let r = u32::from_le_bytes(hdr[..4].try_into().unwrap_or_default()) as usize;
            let w = u32::from_le_bytes(hdr[4..].try_into().unwrap_or_default()) as usize;
            let refusal = if w != world {
                Some(format!(
                    "rank {r} was given world size {w}, rank 0 {world}: give every rank the same --world-size"
                ))
            } else if r == 0 || r >= world || seen[r] {
                Some(format!("rank {r} joined twice or is out of range 1..{world}: give each process its own --rank"))
            } else {
                None
            };
            match refusal {
                None => {
                    seen[r] = true;
                    joined += 1;
                    let mut msg = vec![0u8];
                    msg.extend_from_slice(&id);
                    s.write_all(&msg).map_err(|e| fail(format!("sending the id to rank {r}: {e}")))?;
                }
                Some(why) => {
                    let mut msg = vec![1u8];
                    msg.extend_from_slice(&(why.len() as u32).to_le_bytes());
                    msg.extend_from_slice(why.as_bytes());
                    let _ = s.write_all(&msg);
                    return Err(fail(why));
                }
            }
        }
        return Ok(id);
    }
    let target = at
        .to_socket_addrs()
        .map_err(|e| fail(format!("cannot resolve the master address: {e}")))?
        .next()
        .ok_or_else(|| fail("the master address resolves to nothing".into()))?;
    let mut s = loop {
        match TcpStream::connect_timeout(&target, Duration::from_millis(200)) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(fail(format!("rank 0 did not answer within {timeout:?} ({e}); is it running?")));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    s.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))))
        .map_err(|e| fail(e.to_string()))?;
    let mut hdr = [0u8; 8];
    hdr[..4].copy_from_slice(&(rank as u32).to_le_bytes());
    hdr[4..].copy_from_slice(&(world as u32).to_le_bytes());
    s.write_all(&hdr).map_err(|e| fail(format!("greeting rank 0: {e}")))?;
    let mut status = [0u8; 1];
    s.read_exact(&mut status).map_err(|e| fail(format!("waiting for the id: {e}")))?;
    if status[0] == 0 {
        let mut id = [0u8; 128];
        s.read_exact(&mut id).map_err(|e| fail(format!("reading the id: {e}")))?;
        return Ok(id);
    }
    let mut len = [0u8; 4];
    s.read_exact(&mut len).map_err(|e| fail(e.to_string()))?;
    let mut why = vec![0u8; (u32::from_le_bytes(len) as usize).min(1 << 16)];
    s.read_exact(&mut why).map_err(|e| fail(e.to_string()))?;
    Err(fail(format!("rank 0 refused: {}", String::from_utf8_lossy(&why))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
    }

    const T: Duration = Duration::from_secs(10);

    #[test]
    fn four_ranks_over_loopback_get_rank_zeros_id() {
        let port = free_port();
        let id: [u8; 128] = std::array::from_fn(|i| (i * 3 + 1) as u8);
        let got: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .rev() // the others start before rank 0 listens: they retry
                .map(|r| s.spawn(move || share_id("127.0.0.1", port, r, 4, T, || Ok(id))))
                .collect();
            hs.into_iter().map(|h| h.join().expect("no panic")).collect()
        });
        for g in got {
            assert_eq!(g.expect("every rank meets"), id);
        }
    }

    #[test]
    fn a_mismatched_world_size_fails_on_both_sides() {
        let port = free_port();
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(move || share_id("127.0.0.1", port, 0, 2, T, || Ok([7; 128])));
            let b = s.spawn(move || share_id("127.0.0.1", port, 1, 3, T, || Ok([7; 128])));
            (a.join().expect("no panic"), b.join().expect("no panic"))
        });
        for e in [a.unwrap_err().to_string(), b.unwrap_err().to_string()] {
            assert!(e.contains("world size 3") && e.contains("--world-size"), "{e}");
        }
    }

    #[test]
    fn a_busy_port_a_missing_master_and_a_bad_rank_are_errors() {
        let held = TcpListener::bind("127.0.0.1:0").expect("a port");
        let port = held.local_addr().expect("addr").port();
        let e = share_id("127.0.0.1", port, 0, 2, T, || Ok([0; 128])).unwrap_err().to_string();
        assert!(e.contains("busy") && e.contains("--master-port"), "{e}");
        drop(held);
        let port = free_port();
        let e = share_id("127.0.0.1", port, 1, 2, Duration::from_millis(300), || Ok([0; 128])).unwrap_err();
        assert!(e.to_string().contains("did not answer"), "{e}");
        let e = share_id("127.0.0.1", port, 0, 2, Duration::from_millis(200), || Ok([0; 128])).unwrap_err();
        assert!(e.to_string().contains("timed out") && e.to_string().contains("rank(s) 1"), "{e}");
        assert!(share_id("127.0.0.1", port, 2, 2, T, || Ok([0; 128])).is_err());
    }
}
