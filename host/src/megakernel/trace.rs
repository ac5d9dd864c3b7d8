//! Reading a traced megakernel step ([`GpuStep::set_trace`](super::GpuStep::set_trace)): the
//! kernel stamps every instruction with the global timer as it waits, works and signals
//! (`kiln_gpu::megakernel::trace`); this module turns the stamps into where the step's time went,
//! phase by phase (a phase is one opcode of one layer: "layer 3's forward", "layer 5's weight
//! gradient").

use kiln_gpu::megakernel::{Instruction, opcode, trace as at};

const WORDS: usize = at::WORDS as usize;
const STAMPS: usize = at::STAMPS as usize;

/// One instruction of a traced step.
#[derive(Clone, Debug)]
pub struct TraceRecord {
    /// The SM (block) whose list held it.
    pub sm: u32,
    /// The instruction.
    pub instruction: Instruction,
    /// Its stamps (indexed by `kiln_gpu::megakernel::trace` constants), in nanoseconds from the
    /// step's first stamp; `None` where the kernel wrote none (a stamp that does not apply to the
    /// instruction or the data path, or a step given up before it).
    pub stamps: [Option<u64>; STAMPS],
    /// The SM-clock cycle counts (indexed by the `trace` constants from `STAMPS` on:
    /// `READY_WAIT_CLK`, `WORK_CLK`, `FREE_WAIT_CLK`, `ISSUE_CLK`), as written, 0 where none. A
    /// tensor-core product writes all four; a loss gradient on the tensor-core path writes the
    /// first two with its own meaning (its rendezvous cycles, its whole body's cycles); the
    /// CUDA-core kernel and the updates write none.
    pub cycles: [u64; WORDS - STAMPS],
}

impl TraceRecord {
    fn get(&self, what: u32) -> Option<u64> {
        self.stamps[what as usize]
    }
    /// Nanoseconds from stamp `from` to stamp `to`, when both were written.
    fn span(&self, from: u32, to: u32) -> Option<u64> {
        Some(self.get(to)?.saturating_sub(self.get(from)?))
    }
    fn clk(&self, what: u32) -> u64 {
        self.cycles[what as usize - STAMPS]
    }
    /// The share of the consumers' work spent waiting for pages after the first (consumer thread
    /// 0's view), for a tensor-core product that finished its pages.
    fn page_wait(&self) -> Option<f64> {
        let work = self.clk(at::WORK_CLK);
        (self.get(at::LOADER_START).is_some() && self.get(at::WORK_DONE).is_some() && work > 0)
            .then(|| self.clk(at::READY_WAIT_CLK) as f64 / work as f64)
    }
    /// The share of the loader's issuing (dependency met to last page issued) spent waiting for
    /// free pages, for a tensor-core product whose pages were all issued.
    fn free_wait(&self) -> Option<f64> {
        let issue = self.clk(at::ISSUE_CLK);
        (self.get(at::LOADER_ISSUED).is_some() && issue > 0).then(|| self.clk(at::FREE_WAIT_CLK) as f64 / issue as f64)
    }
}

/// Where one phase's instructions spent their time: means over its instructions, microseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseTimes {
    /// The phase's opcode (`kiln_gpu::megakernel::opcode`).
    pub opcode: u32,
    /// Its layer.
    pub layer: u32,
    /// Its instructions.
    pub count: usize,
    /// When its first instruction started, from the step's start.
    pub start_us: f64,
    /// When its last instruction signalled, from the step's start.
    pub end_us: f64,
    /// Products on the tensor-core path: the loader's wait for the instruction's dependency
    /// counter. Element-wise instructions (and the CUDA-core kernel): the consumers' wait for
    /// their counters. `None` where no instruction of the phase has the stamps.
    pub deps_us: Option<f64>,
    /// Products on the tensor-core path: from the consumers reaching the instruction to its first
    /// page being ready (this includes any dependency wait the loader had not finished).
    pub first_page_us: Option<f64>,
    /// The work: the products' pages (first ready to last multiplied), or the element-wise loop.
    pub work_us: f64,
    /// The longest work of one instruction.
    pub work_max_us: f64,
    /// The stores after the work (the products' epilogue, as thread 0 sees it).
    pub store_us: Option<f64>,
    /// From the stores to the signal (the block's rendezvous and the counter update).
    pub publish_us: f64,
    /// Products on the tensor-core path: from the loader issuing the last page to the consumers
    /// finishing it: how far ahead the loader ran. A full ring's worth of pages means the loader
    /// was held back by the ring, which happens both when the consumers are slow and when the
    /// loads are; it does not tell the two apart ([`PhaseTimes::page_wait`] and
    /// [`PhaseTimes::free_wait`] do).
    pub loader_lead_us: Option<f64>,
    /// Products on the tensor-core path: the share of the work (first page ready to last
    /// multiplied) that consumer thread 0 spent waiting for pages (SM clock cycles). Near 0: the
    /// consumers' math sets the pace; near 1: the pages do.
    pub page_wait: Option<f64>,
    /// Products on the tensor-core path: the share of the loader's issuing (dependency met to the
    /// last page issued) spent waiting for free pages. Near 1 with `page_wait` near 0: the ring is
    /// full and the consumers are the bottleneck; near 0: issuing the loads is.
    pub free_wait: Option<f64>,
}

/// The stamps of one traced step.
#[derive(Clone, Debug)]
pub struct StepTrace {
    /// Every instruction, in the order of the device's instruction buffer (SM by SM).
    pub records: Vec<TraceRecord>,
    /// SMs (blocks) of the step.
    pub sms: u32,
}

/// A human name of a phase.
fn phase_name(op: u32, layer: u32) -> String {
    let what = match op {
        opcode::LINEAR_FWD => "forward",
        opcode::LOSS_GRAD => "loss gradient",
        opcode::LINEAR_BWD_INPUT => "input gradient",
        opcode::LINEAR_BWD_WEIGHT => "weight gradient",
        opcode::SGD_UPDATE => "update",
        opcode::LINEAR_BWD_WEIGHT_SGD => "weight gradient + update",
        _ => "opcode ?",
    };
    format!("{what} {layer}")
}

impl StepTrace {
    /// The trace of `listing` (each instruction with its SM, in buffer order) from the raw
    /// timestamps the kernel wrote (`WORDS` per instruction, 0 for none).
    pub fn new(listing: &[(u32, Instruction)], words: &[u64], sms: u32) -> StepTrace {
        let t0 = words.chunks(WORDS).flat_map(|w| &w[..STAMPS]).copied().filter(|&w| w != 0).min().unwrap_or(0);
        let records = listing
            .iter()
            .enumerate()
            .map(|(k, &(sm, instruction))| {
                let w = &words[k * WORDS..(k + 1) * WORDS];
                let mut stamps = [None; STAMPS];
                for (s, w) in stamps.iter_mut().zip(&w[..STAMPS]) {
                    *s = (*w != 0).then(|| w - t0);
                }
                let mut cycles = [0; WORDS - STAMPS];
                cycles.copy_from_slice(&w[STAMPS..]);
                TraceRecord { sm, instruction, stamps, cycles }
            })
            .collect();
        StepTrace { records, sms }
    }

    /// From the first stamp to the last signal, microseconds.
    pub fn duration_us(&self) -> f64 {
        let end = self.records.iter().filter_map(|r| r.get(at::SIGNALED)).max().unwrap_or(0);
        end as f64 / 1e3
    }

    /// Instructions with no signal stamp (a step given up, or a trace read before its step ran).
    pub fn unfinished(&self) -> usize {
        self.records.iter().filter(|r| r.get(at::SIGNALED).is_none()).count()
    }

    /// The fraction of the SMs' time (`sms x duration`) spent in work (see [`PhaseTimes::work_us`]).
    pub fn work_fraction(&self) -> f64 {
        let work: u64 = self.records.iter().filter_map(work_ns).sum();
        work as f64 / 1e3 / (self.sms as f64 * self.duration_us()).max(f64::MIN_POSITIVE)
    }

    /// Each phase's times, in the order their first instructions were reached by the consumers
    /// (ties in buffer order).
    pub fn phases(&self) -> Vec<PhaseTimes> {
        let mut keys: Vec<(u32, u32)> = Vec::new();
        for r in &self.records {
            let k = (r.instruction.opcode, r.instruction.layer);
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        let us = |ns: u64| ns as f64 / 1e3;
        let mean_f = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        let mean = |v: Vec<u64>| mean_f(v.into_iter().map(us).collect());
        let mut out: Vec<PhaseTimes> = keys
            .into_iter()
            .map(|(op, layer)| {
                let rs: Vec<&TraceRecord> = self
                    .records
                    .iter()
                    .filter(|r| (r.instruction.opcode, r.instruction.layer) == (op, layer))
                    .collect();
                let collect =
                    |f: &dyn Fn(&TraceRecord) -> Option<u64>| rs.iter().filter_map(|r| f(r)).collect::<Vec<_>>();
                // instructions with loader stamps (tensor-core products) wait in the loader
                let loaded = |r: &TraceRecord| r.get(at::LOADER_START).is_some();
                let deps = collect(&|r| match loaded(r) {
                    true => r.span(at::LOADER_START, at::LOADER_DEPS),
                    false => r.span(at::START, at::FIRST),
                });
                let first_page = collect(&|r| if loaded(r) { r.span(at::START, at::FIRST) } else { None });
                let work = collect(&work_ns);
                PhaseTimes {
                    opcode: op,
                    layer,
                    count: rs.len(),
                    start_us: us(rs.iter().filter_map(|r| r.get(at::START)).min().unwrap_or(0)),
                    end_us: us(rs.iter().filter_map(|r| r.get(at::SIGNALED)).max().unwrap_or(0)),
                    deps_us: mean(deps),
                    first_page_us: mean(first_page),
                    work_max_us: us(work.iter().copied().max().unwrap_or(0)),
                    work_us: mean(work).unwrap_or(0.0),
                    store_us: mean(collect(&|r| r.span(at::WORK_DONE, at::STORED))),
                    publish_us: mean(collect(&|r| r.span(at::STORED, at::SIGNALED))).unwrap_or(0.0),
                    loader_lead_us: mean(collect(&|r| r.span(at::LOADER_ISSUED, at::WORK_DONE))),
                    page_wait: mean_f(rs.iter().filter_map(|r| r.page_wait()).collect()),
                    free_wait: mean_f(rs.iter().filter_map(|r| r.free_wait()).collect()),
                }
            })
            .collect();
        out.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
        out
    }

    /// A Markdown table of [`StepTrace::phases`] with the step's totals above it.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "step {:.1} us on {} SMs, {:.0} % of SM time in work, {} instructions{}\n\n",
            self.duration_us(),
            self.sms,
            100.0 * self.work_fraction(),
            self.records.len(),
            match self.unfinished() {
                0 => String::new(),
                n => format!(" ({n} never signalled)"),
            }
        );
        s += "| phase | tiles | from us | to us | deps wait | first page | work (max) | store | publish | loader lead \
              | page wait | loader free wait |\n";
        s += "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
        // a blank cell: nothing measured (a stamp the path or instruction kind does not write)
        let cell = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.2}"));
        let pct = |v: Option<f64>| v.map_or(String::new(), |v| format!("{:.0} %", 100.0 * v));
        for p in self.phases() {
            s += &format!(
                "| {} | {} | {:.1} | {:.1} | {} | {} | {:.2} ({:.2}) | {} | {:.2} | {} | {} | {} |\n",
                phase_name(p.opcode, p.layer),
                p.count,
                p.start_us,
                p.end_us,
                cell(p.deps_us),
                cell(p.first_page_us),
                p.work_us,
                p.work_max_us,
                cell(p.store_us),
                p.publish_us,
                cell(p.loader_lead_us),
                pct(p.page_wait),
                pct(p.free_wait)
            );
        }
        s
    }

    /// Every record as a CSV row: SM, position in the instruction buffer, opcode, layer, tile row
    /// and column, then the stamps in nanoseconds (empty where none) and the cycle counts (see
    /// [`TraceRecord::cycles`]: on loss-gradient rows the first two columns are its rendezvous and
    /// body cycles), for plotting or a closer look.
    pub fn to_csv(&self) -> String {
        let mut s = String::from(
            "sm,index,opcode,layer,tile_row,tile_col,loader_start,loader_deps,loader_issued,start,first,work_done,stored,signaled,\
             ready_wait_clk,work_clk,free_wait_clk,issue_clk\n",
        );
        for (k, r) in self.records.iter().enumerate() {
            let i = &r.instruction;
            s += &format!("{},{k},{},{},{},{}", r.sm, i.opcode, i.layer, i.tile_row, i.tile_col);
            for st in r.stamps {
                s += &st.map_or(",".into(), |v| format!(",{v}"));
            }
            for c in r.cycles {
                s += &format!(",{c}");
            }
            s.push('\n');
        }
        s
    }
}

/// An instruction's work: first page (or dependencies met) to the last page multiplied (or the
/// element-wise work done); where the kernel writes no work stamp (the CUDA-core kernel), to the
/// stores.
fn work_ns(r: &TraceRecord) -> Option<u64> {
    r.span(at::FIRST, at::WORK_DONE).or_else(|| r.span(at::FIRST, at::STORED))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ins(op: u32, layer: u32) -> Instruction {
        Instruction { opcode: op, layer, ..Default::default() }
    }

    /// Two forward tiles on two SMs and one update: phases, spans and means from known stamps.
    #[test]
    fn phases_from_known_stamps() {
        let listing =
            [(0, ins(opcode::LINEAR_FWD, 0)), (1, ins(opcode::LINEAR_FWD, 0)), (0, ins(opcode::SGD_UPDATE, 0))];
        let mut w = vec![0u64; 3 * WORDS];
        let base = 1_000_000u64;
        // forward on SM 0: loader 0..100 (deps 100 ns), consumers start 0, first page 500,
        // work to 2500, stored 2600, signalled 2700
        for (i, v) in [(0, 0), (1, 100), (2, 400), (3, 0), (4, 500), (5, 2500), (6, 2600), (7, 2700)] {
            w[i] = base + v;
        }
        // cycles: 1000 of 4000 waiting for pages; the loader waited 300 of 600 for free pages
        for (i, c) in [(at::READY_WAIT_CLK, 1000), (at::WORK_CLK, 4000), (at::FREE_WAIT_CLK, 300), (at::ISSUE_CLK, 600)]
        {
            w[i as usize] = c;
        }
        // forward on SM 1: deps 300, first page 1000, work 3000 ns
        for (i, v) in [(0, 10), (1, 310), (2, 900), (3, 10), (4, 1010), (5, 4010), (6, 4110), (7, 4310)] {
            w[WORDS + i] = base + v;
        }
        // cycles: no page wait, the loader always waiting
        for (i, c) in [(at::WORK_CLK, 6000), (at::FREE_WAIT_CLK, 900), (at::ISSUE_CLK, 900)] {
            w[WORDS + i as usize] = c;
        }
        // update on SM 0: start 2700, deps met 5000, work to 5500, stored 5500, signalled 5600
        for (i, v) in [(3, 2700), (4, 5000), (5, 5500), (6, 5500), (7, 5600)] {
            w[2 * WORDS + i] = base + v;
        }
        let t = StepTrace::new(&listing, &w, 2);
        assert_eq!(t.unfinished(), 0);
        assert!((t.duration_us() - 5.6).abs() < 1e-9);
        let p = t.phases();
        assert_eq!(p.len(), 2);
        let f = &p[0];
        assert_eq!((f.opcode, f.count), (opcode::LINEAR_FWD, 2));
        let near = |v: Option<f64>, want: f64| v.is_some_and(|v| (v - want).abs() < 1e-9);
        assert!(near(f.deps_us, 0.2), "{f:?}");
        assert!(near(f.first_page_us, 0.75), "{f:?}");
        assert!((f.work_us - 2.5).abs() < 1e-9 && (f.work_max_us - 3.0).abs() < 1e-9, "{f:?}");
        assert!(near(f.store_us, 0.1) && (f.publish_us - 0.15).abs() < 1e-9, "{f:?}");
        assert!((f.end_us - 4.31).abs() < 1e-9, "{f:?}");
        let u = &p[1];
        assert_eq!(u.opcode, opcode::SGD_UPDATE);
        assert!(near(u.deps_us, 2.3) && u.first_page_us.is_none() && (u.work_us - 0.5).abs() < 1e-9, "{u:?}");
        assert!(u.loader_lead_us.is_none(), "{u:?}");
        // work: 2.0 + 3.0 + 0.5 us over 2 SMs x 5.6 us
        assert!((t.work_fraction() - 5.5 / 11.2).abs() < 1e-9);
        assert!(t.summary().contains("| forward 0 | 2 |"), "{}", t.summary());
        // loader issued its last page at 400 and 900 ns, the consumers finished it at 2500 and 4010
        assert!(near(f.loader_lead_us, (2.1 + 3.11) / 2.0), "{f:?}");
        // cycle shares: (0.25 + 0) / 2 waiting for pages, (0.5 + 1) / 2 waiting for free pages
        assert!(near(f.page_wait, 0.125) && near(f.free_wait, 0.75), "{f:?}");
        assert!(u.page_wait.is_none() && u.free_wait.is_none(), "{u:?}");
        assert!(t.summary().contains("| 12 % | 75 % |"), "{}", t.summary());
        // nothing measured prints as a blank cell, not as 0
        assert!(
            t.summary().contains("| update 0 | 1 | 2.7 | 5.6 | 2.30 |  | 0.50 (0.50) | 0.00 | 0.10 |  |  |  |"),
            "{}",
            t.summary()
        );
        let csv = t.to_csv();
        assert_eq!(csv.lines().count(), 4);
        assert!(csv.lines().nth(3).is_some_and(|l| l.ends_with(",,,2700,5000,5500,5500,5600,0,0,0,0")), "{csv}");
        assert!(csv.lines().nth(1).is_some_and(|l| l.ends_with(",1000,4000,300,600")), "{csv}");
    }

    /// A step given up part-way: the instructions it never reached are counted as unfinished, and
    /// a phase with no complete span reports nothing measured rather than a zero wait.
    #[test]
    fn unfinished_instructions_are_counted() {
        let listing = [(0, ins(opcode::LINEAR_FWD, 0)), (0, ins(opcode::LINEAR_FWD, 1))];
        let mut w = vec![0u64; 2 * WORDS];
        w[at::START as usize] = 5;
        w[at::FIRST as usize] = 10;
        let t = StepTrace::new(&listing, &w, 1);
        assert_eq!(t.unfinished(), 2);
        assert!(t.summary().contains("(2 never signalled)"));
        let p = t.phases();
        assert_eq!(p[0].work_us, 0.0);
        assert!(p[1].deps_us.is_none() && p[1].store_us.is_none(), "{:?}", p[1]);
    }
}
