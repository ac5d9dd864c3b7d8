#!/usr/bin/env python3
"""Draws the guide's figures as SVG into guide/src/figures/.

    python3 guide/figures-src/figures.py

Standard library only. The layouts come from the code: the thread maps of rungs 1 and 2 and the
warp tile of rung 7 from gpu/src/kernels/gemm/sgemm.rs, the mma.sync fragments from the
(host-tested) layout functions of gpu/src/mma.rs, the swizzle from gpu/src/swizzle.rs. The
asynchronous pipelines follow the kernels: the TMA ring and its parities (rung 9), cluster multicast
(rung 11) and the staged epilogue (rung 12) from gpu/src/kernels/gemm/gemm_wgmma.rs, tensor memory
(rung 14) from gemm_tcgen05.rs and gpu/src/tcgen05.rs, the megakernel's instruction lists and page
ring from gpu/src/megakernel.rs and gpu/src/kernels/megakernel/tensor_cores/. Their timelines are
illustrative (made-up durations); the order of events, the counts and the parities are the code's.

The plots from measured data (the ladder, the roofline) are not drawn here: `cargo xtask figures`
draws them from benches/results/*.json (xtask/src/figures.rs).
"""

import os
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "guide", "src", "figures")

FONT = 'font-family="sans-serif"'
COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"]
LIGHT = ["#c6d5e6", "#fbd6b3", "#c9e3c4", "#f5c2c3", "#d3eae8", "#f8edc0", "#e3d0df", "#dfd0c4"]


class Svg:
    def __init__(self, w, h):
        self.w, self.h, self.items = w, h, []

    def rect(self, x, y, w, h, fill="none", stroke="#000", sw=1, extra=""):
        self.items.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="{sw}" {extra}/>'
        )

    def line(self, x1, y1, x2, y2, stroke="#000", sw=1, extra=""):
        self.items.append(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{stroke}" '
            f'stroke-width="{sw}" {extra}/>'
        )

    def text(self, x, y, s, size=12, anchor="start", fill="#000", weight="normal", extra=""):
        s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        self.items.append(
            f'<text x="{x:.1f}" y="{y:.1f}" {"" if "font-family" in extra else FONT} font-size="{size}" text-anchor="{anchor}" '
            f'fill="{fill}" font-weight="{weight}" {extra}>{s}</text>'
        )

    def circle(self, x, y, r, fill):
        self.items.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{fill}" stroke="#000" stroke-width="0.5"/>')

    def arrow(self, x1, y1, x2, y2, stroke="#000"):
        self.line(x1, y1, x2, y2, stroke, 1.5, 'marker-end="url(#arrow)"')

    def save(self, name):
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.w}" height="{self.h}" '
            f'viewBox="0 0 {self.w} {self.h}">\n'
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#000"/></marker></defs>\n'
            f'<rect x="0" y="0" width="{self.w}" height="{self.h}" fill="#fff"/>\n'
        )
        body = head + "\n".join(self.items) + "\n</svg>\n"
        path = os.path.join(OUT, name)
        with open(path, "w") as f:
            f.write(body)
        ET.parse(path)  # well-formed XML or an exception
        print("wrote", os.path.relpath(path, ROOT))


def grid(svg, x, y, rows, cols, cell, fill_fn=None, stroke="#bbb"):
    for r in range(rows):
        for c in range(cols):
            fill = fill_fn(r, c) if fill_fn else None
            svg.rect(x + c * cell, y + r * cell, cell, cell, fill or "#fff", stroke, 0.4)
    svg.rect(x, y, cols * cell, rows * cell, "none", "#000", 1)


# (a) rungs 1 and 2: which thread computes which C element, what a warp touches -----------------


def thread_maps():
    # Rung 1 (sgemm_naive): block (32, 32); row = bx*32 + tx, col = by*32 + ty. A warp is 32
    # consecutive tx with one ty: 32 rows of one column.
    # Rung 2 (sgemm_coalesced): block 1024; row = by*32 + t/32, col = bx*32 + t%32. A warp is
    # 32 adjacent columns of one row.
    cell, K, N = 5, 8, 32
    svg = Svg(920, 350)
    svg.text(460, 22, "Which thread computes which C element (one 32 x 32 block), and what warps 0 and 1 read at k step p = 3", 13, "middle", weight="bold")
    warp_col = {0: COLORS[0], 1: COLORS[1]}
    for panel, (title, sub, rung) in enumerate([
        ("Rung 1, sgemm_naive", "warp = 32 rows of one column", 1),
        ("Rung 2, sgemm_coalesced", "warp = 32 adjacent columns of one row", 2),
    ]):
        ox = 30 + panel * 440
        ax, ay = ox + 20, 128  # A: 32 rows x K
        bx, by = ax + K * cell + 14, 72  # B: K x 32
        cx, cy = bx, ay  # C: 32 x 32
        svg.text(ox + 20, 44, title, 12, weight="bold")
        svg.text(ox + 20, 58, sub, 11)
        p = 3

        def owner(r, c):
            # which warp of the block computes C[r][c]
            t = (c * 32 + r) if rung == 1 else (r * 32 + c)
            return t // 32

        def cfill(r, c):
            w = owner(r, c)
            return LIGHT[w] if w in warp_col else None

        def afill(r, k):
            if k != p:
                return None
            if rung == 1 and r < 32:
                return warp_col[0]  # warp 0 reads A[0..31][p]; warp 1 the same rows
            if rung == 2 and r in (0, 1):
                return warp_col[r]
            return None

        def bfill(k, c):
            if k != p:
                return None
            if rung == 1 and c in (0, 1):
                return warp_col[c]
            if rung == 2:
                return warp_col[0]  # every warp reads B[p][0..31]
            return None

        grid(svg, ax, ay, 32, K, cell, afill)
        grid(svg, bx, by, K, N, cell, bfill)
        grid(svg, cx, cy, 32, N, cell, cfill)
        svg.text(ax + K * cell / 2, ay - 6, "A", 12, "middle")
        svg.text(bx - 6, by + K * cell / 2 + 4, "B", 12, "end")
        svg.text(cx + N * cell / 2, cy + 32 * cell + 16, "C (block's 32 x 32 outputs)", 11, "middle")
        # warp 0's and warp 1's outputs, outlined
        for w in (0, 1):
            if rung == 1:
                svg.rect(cx + w * cell, cy, cell, 32 * cell, "none", warp_col[w], 1.5)
            else:
                svg.rect(cx, cy + w * cell, 32 * cell, cell, "none", warp_col[w], 1.5)
        tx = cx + N * cell + 12
        if rung == 1:
            notes = [
                ("thread (tx, ty) computes", "#000"),
                ("C[32 bx + tx][32 by + ty]", "#000"),
                ("warp 0 (ty = 0): column 0", COLORS[0]),
                ("warp 1 (ty = 1): column 1", COLORS[1]),
                ("per k step a warp reads:", "#000"),
                ("A: 32 rows (4k bytes apart):", "#000"),
                ("  32 sectors, 4 B used of each", "#000"),
                ("B: 1 element (broadcast)", "#000"),
                ("C: 32 stores, 4n bytes apart", "#000"),
            ]
        else:
            notes = [
                ("thread t computes C[r][c],", "#000"),
                ("r = 32 by + t / 32, c = 32 bx + t % 32", "#000"),
                ("warp 0: row 0", COLORS[0]),
                ("warp 1: row 1", COLORS[1]),
                ("per k step a warp reads:", "#000"),
                ("A: 1 element (broadcast)", "#000"),
                ("B: 32 adjacent floats,", "#000"),
                ("  one 128-byte run", "#000"),
                ("C: one 128-byte store", "#000"),
            ]
        for i, (s, col) in enumerate(notes):
            svg.text(tx, cy + 10 + i * 16, s, 10.5, fill=col)
        svg.text(ax + p * cell + cell / 2, ay + 32 * cell + 12, "p", 10, "middle")
    svg.text(460, 338, "Filled cells of A and B: the elements a warp loads at k step p (warp 0 blue, warp 1 orange). Shaded C: the outputs of warps 0 and 1.", 10.5, "middle")
    svg.save("thread-maps.svg")


# (b) rungs 3-7: block tile -> warp tile -> thread tile -------------------------------------------


def tiles():
    # sgemm_warptile_128x128x8_8x8_db: BM = BN = 128, BK = 8, WM = 32, WN = 64, TM = TN = 8.
    # Warps (BM/WM) x (BN/WN) = 4 x 2; warp w -> (wr, wc) = (w / 2, w % 2). Lanes
    # (WM/TM) x (WN/TN) = 4 x 8; lane -> (lm, ln) = (lane / 8, lane % 8). Lane (lm, ln) owns 4 x 4
    # blocks at rows 4 lm + {0, 16} and columns 4 ln + {0, 32} of its warp tile (sub_m = 4 WM/TM =
    # 16, sub_n = 4 WN/TN = 32).
    BM, BN, BK, WM, WN, TM, TN = 128, 128, 8, 32, 64, 8, 8
    svg = Svg(980, 420)
    svg.text(490, 22, "sgemm_warptile_128x128x8_8x8_db: block tile -> warp tile -> thread tile", 14, "middle", weight="bold")
    # panel 1: block tile
    s = 1.5
    ox, oy = 60, 80
    ax, ay = ox, oy + BK * s * 2 + 10
    cx, cy = ox + BK * s * 2 + 10, ay
    svg.rect(ax, ay, BK * s * 2, BM * s, LIGHT[0], "#000", 1)
    svg.text(ax - 4, ay + BM * s / 2, "A", 12, "end")
    svg.rect(cx, oy, BN * s, BK * s * 2, LIGHT[1], "#000", 1)
    svg.text(cx + BN * s / 2, oy - 5, "B", 12, "middle")
    for w in range(8):
        wr, wc = w // 2, w % 2
        fill = LIGHT[2] if w == 2 else "#fff"
        svg.rect(cx + wc * WN * s, cy + wr * WM * s, WN * s, WM * s, fill, "#000", 1)
        svg.text(cx + (wc + 0.5) * WN * s, cy + (wr + 0.5) * WM * s + 4, f"warp {w}", 10, "middle")
    svg.text(cx + BN * s / 2, cy + BM * s + 18, "block tile 128 x 128 of C", 11, "middle", weight="bold")
    for i, t in enumerate([
        "256 threads = 8 warps (4 x 2)",
        "each k tile: A 128 x 8 and B 8 x 128",
        "in shared memory (A transposed,",
        "two stages: double-buffered)",
    ]):
        svg.text(ox - 20, cy + BM * s + 36 + i * 15, t, 10.5)
    # panel 2: warp tile 32 x 64 at 4 px
    s2 = 4.2
    wx, wy = 330, 110
    lane_fill = {0: COLORS[0], 9: COLORS[3]}

    def lane_of(r, c):
        lm = (r % 16) // 4
        ln = (c % 32) // 4
        return lm * 8 + ln

    for r0 in range(0, WM, 4):
        for c0 in range(0, WN, 4):
            lane = lane_of(r0, c0)
            fill = lane_fill.get(lane, "#fff")
            svg.rect(wx + c0 * s2, wy + r0 * s2, 4 * s2, 4 * s2, fill, "#999", 0.5)
            svg.text(wx + (c0 + 2) * s2, wy + (r0 + 2) * s2 + 3.5, str(lane), 8.5, "middle",
                     fill="#fff" if lane in lane_fill else "#444")
    svg.rect(wx, wy, WN * s2, WM * s2, "none", "#000", 1.5)
    svg.line(wx, wy + 16 * s2, wx + WN * s2, wy + 16 * s2, "#000", 1, 'stroke-dasharray="4,3"')
    svg.line(wx + 32 * s2, wy, wx + 32 * s2, wy + WM * s2, "#000", 1, 'stroke-dasharray="4,3"')
    svg.text(wx + WN * s2 / 2, wy - 10, "warp tile 32 x 64 (warp 2): the lane owning each 4 x 4 block", 11, "middle", weight="bold")
    for i, t in enumerate([
        "lanes form a 4 x 8 grid; lane (lm, ln) = (lane / 8, lane % 8)",
        "owns four 4 x 4 blocks, 16 rows and 32 columns apart",
        "(lane 0 blue, lane 9 red); per k step the 8 lanes of a",
        "quarter warp read one A vector (broadcast) and 8 adjacent",
        "B vectors (128 contiguous bytes): no bank conflicts",
    ]):
        svg.text(wx, wy + WM * s2 + 20 + i * 15, t, 10.5)
    svg.arrow(cx + BN * s + 6, cy + 1.5 * WM * s, wx - 8, wy + WM * s2 / 2)
    # panel 3: thread tile: 8 x 8 accumulators from 8 A + 8 B values per k step
    s3 = 17
    tx, ty = 740, 150
    for r in range(TM):
        for c in range(TN):
            svg.rect(tx + c * s3, ty + r * s3, s3, s3, LIGHT[0] if (r // 4 + c // 4) % 2 == 0 else LIGHT[3], "#999", 0.5)
    svg.rect(tx, ty, TN * s3, TM * s3, "none", "#000", 1.5)
    for r in range(TM):
        svg.rect(tx - s3 - 8, ty + r * s3, s3, s3, LIGHT[0], "#999", 0.5)
    for c in range(TN):
        svg.rect(tx + c * s3, ty - s3 - 8, s3, s3, LIGHT[1], "#999", 0.5)
    svg.rect(tx - s3 - 8, ty, s3, 4 * s3, "none", "#000", 1.2)
    svg.rect(tx - s3 - 8, ty + 4 * s3, s3, 4 * s3, "none", "#000", 1.2)
    svg.rect(tx, ty - s3 - 8, 4 * s3, s3, "none", "#000", 1.2)
    svg.rect(tx + 4 * s3, ty - s3 - 8, 4 * s3, s3, "none", "#000", 1.2)
    svg.text(tx + TN * s3 / 2, ty - s3 - 16, "8 B values (2 x ld.shared.v4)", 10, "middle")
    svg.text(tx - s3 - 14, ty + TM * s3 / 2, "8 A values", 10, "end")
    svg.text(tx - s3 - 14, ty + TM * s3 / 2 + 13, "(2 x v4)", 10, "end")
    svg.text(tx + TN * s3 / 2, ty + TM * s3 + 20, "thread tile: 8 x 8 accumulators", 11, "middle", weight="bold")
    for i, t in enumerate([
        "in registers (2 x 2 blocks of 4 x 4,",
        "the blocks of lane 0 in the warp tile);",
        "per k step: 16 values read from",
        "shared memory, 64 FMAs",
    ]):
        svg.text(tx - 40, ty + TM * s3 + 38 + i * 15, t, 10.5)
    svg.arrow(wx + WN * s2 + 6, wy + 10, tx - s3 - 14, ty + 10)
    svg.save("tiles.svg")


# (c) mma.sync m16n8k16 fragments, from gpu/src/mma.rs --------------------------------------------


def m16n8k16_a(lane, i):
    group, t = lane // 4, lane % 4
    return group + 8 * ((i // 2) % 2), t * 2 + (i % 2) + 8 * (i // 4)


def m16n8k16_b(lane, i):
    group, t = lane // 4, lane % 4
    return t * 2 + (i % 2) + 8 * (i // 2), group


def m16n8_c(lane, i):
    group, t = lane // 4, lane % 4
    return group + 8 * (i // 2), t * 2 + (i % 2)


def fragments():
    cell = 26
    svg = Svg(1010, 560)
    svg.text(505, 22, "mma.sync.m16n8k16 (bf16/f16 in, f32 accumulate): which lane holds which element", 14, "middle", weight="bold")
    svg.text(505, 40, "cell: lane Ln and its fragment element; colour: t = lane % 4; group = lane / 4 (layouts of gpu/src/mma.rs, tested on the host)", 11, "middle")
    panels = [
        ("A: 16 x 16 (m x k), 8 per lane, 4 registers", 16, 16, m16n8k16_a, "a", 30),
        ("B: 16 x 8 (k x n), 4 per lane, 2 registers", 16, 8, m16n8k16_b, "b", 490),
        ("C / D: 16 x 8 (m x n), f32, 4 per lane", 16, 8, m16n8_c, "c", 760),
    ]
    for title, rows, cols, fn, name, ox in panels:
        oy = 80
        owner = {}
        for lane in range(32):
            for i in range(8 if name == "a" else 4):
                owner[fn(lane, i)] = (lane, i)
        assert len(owner) == rows * cols, name
        for r in range(rows):
            for c in range(cols):
                lane, i = owner[(r, c)]
                svg.rect(ox + c * cell, oy + r * cell, cell, cell, LIGHT[lane % 4], "#999", 0.5)
                svg.text(ox + c * cell + cell / 2, oy + r * cell + 11, f"L{lane}", 8.5, "middle")
                svg.text(ox + c * cell + cell / 2, oy + r * cell + 21, f"{name}{i}", 8, "middle", fill="#555")
        svg.rect(ox, oy, cols * cell, rows * cell, "none", "#000", 1.5)
        if name == "a":
            svg.line(ox + 8 * cell, oy, ox + 8 * cell, oy + rows * cell, "#000", 1, 'stroke-dasharray="4,3"')
        svg.line(ox, oy + 8 * cell, ox + cols * cell, oy + 8 * cell, "#000", 1, 'stroke-dasharray="4,3"')
        svg.text(ox, oy - 8, title, 11, weight="bold")
        for r in range(rows):
            svg.text(ox - 3, oy + r * cell + 16, str(r), 8, "end", fill="#777")
        for c in range(cols):
            svg.text(ox + c * cell + cell / 2, oy + rows * cell + 11, str(c), 8, "middle", fill="#777")
    notes = [
        "A: lane holds rows group and group + 8, columns 2t, 2t + 1 and 2t + 8, 2t + 9; a0 a1 share a register (lower index in the low half).",
        "B: lane holds column n = group, rows k = 2t, 2t + 1, 2t + 8, 2t + 9.   C/D: rows group and group + 8, columns 2t and 2t + 1.",
    ]
    for i, s in enumerate(notes):
        svg.text(30, 530 + i * 15, s, 10.5)
    svg.save("mma-m16n8k16.svg")


# (d) the 128-byte swizzle, from gpu/src/swizzle.rs -----------------------------------------------


def swizzle128(offset):
    return offset ^ (((offset >> 7) & 7) << 4)


def swizzle():
    cell_w, cell_h = 58, 30
    svg = Svg(1100, 410)
    svg.text(550, 22, "128-byte swizzle (Swizzle<3,4,3>): chunk c of row r is stored at chunk c ^ (r % 8)", 14, "middle", weight="bold")
    svg.text(550, 40, "one 1024-byte atom: 8 rows of 128 bytes = 8 chunks of 16 bytes (8 bf16 or 4 f32 each); colour = logical chunk c", 11, "middle")
    for panel, (title, phys) in enumerate([("logical (unswizzled) layout", False), ("where the hardware stores it", True)]):
        ox, oy = 60 + panel * 560, 90
        svg.text(ox + 4 * cell_w, oy - 22, title, 12, "middle", weight="bold")
        for p in range(8):
            svg.text(ox + p * cell_w + cell_w / 2, oy - 6, f"banks {4 * p}-{4 * p + 3}", 9, "middle", fill="#555")
        for r in range(8):
            svg.text(ox - 6, oy + r * cell_h + 19, f"row {r}", 10, "end")
            for p in range(8):
                if phys:
                    # which logical chunk lands in physical chunk p of row r
                    c = [c for c in range(8) if (swizzle128(r * 128 + c * 16) - r * 128) // 16 == p][0]
                else:
                    c = p
                fill = COLORS[c] if c == 0 else LIGHT[c]
                svg.rect(ox + p * cell_w, oy + r * cell_h, cell_w, cell_h, fill, "#888", 0.5)
                svg.text(ox + p * cell_w + cell_w / 2, oy + r * cell_h + 19, f"c{c}", 11, "middle",
                         fill="#fff" if c == 0 else "#000")
        svg.rect(ox, oy, 8 * cell_w, 8 * cell_h, "none", "#000", 1.5)
    svg.arrow(60 + 8 * cell_w + 12, 90 + 4 * cell_h, 620 - 50, 90 + 4 * cell_h)
    notes = [
        "Unswizzled, chunk 0 of all 8 rows (a column of the tile, dark blue) sits in banks 0-3: an 8-way bank conflict, 8 wavefronts instead of 1.",
        "Swizzled, the same 8 chunks fall in 8 different bank groups and a warp reads them in one. The map is an XOR (an involution);",
        "TMA writes tiles this way and wgmma / ldmatrix read them back through the same pattern. In bytes: bits 4-6 ^= bits 7-9 of the offset.",
    ]
    for i, s in enumerate(notes):
        svg.text(60, 360 + i * 15, s, 10.5)
    svg.save("swizzle-128b.svg")



# (e) rung 9: the TMA + mbarrier ring over time, from gpu/src/kernels/gemm/gemm_wgmma.rs -----------


def ring_timeline():
    # A toy schedule with the kernel's rules (Ring::fill_at, Ring::wait_full, gemm_wgmma_bf16):
    # the producer issues use t once stage t % 4 is free; a load lands D after its issue; the
    # consumers start use t once it has landed and use t - 1 is done (wait_group::<0>), take M,
    # then arrive on empty[t % 4]. The times are illustrative; the order and parities are the code's.
    STAGES, T, D, M, ISSUE = 4, 11, 3.2, 1.9, 0.35
    L, F, C, E = [], [], [], []
    for t in range(T):
        l = (L[-1] + ISSUE) if L else 0.0
        if t >= STAGES:
            l = max(l, E[t - STAGES])
        L.append(l)
        F.append(l + D)
        c = max(F[t], E[-1] if E else 0.0)
        C.append(c)
        E.append(c + M)
    svg = Svg(1120, 640)
    svg.text(560, 22, "Rung 9 (gemm_wgmma_bf16): the 4-stage TMA ring over time, and the parity every wait names", 14, "middle", weight="bold")
    ox, U = 300, (1120 - 300 - 30) / (E[-1] + 0.5)
    X = lambda v: ox + v * U
    rows = {"prod": 60, 0: 130, 1: 170, 2: 210, 3: 250, "cons": 320}
    svg.text(ox - 10, rows["prod"] + 18, "producer", 11, "end", weight="bold")
    svg.text(ox - 10, rows["prod"] + 32, "warpgroup 0, thread 0", 9.5, "end", fill="#555")
    for st in range(STAGES):
        svg.text(ox - 10, rows[st] + 17, f"stage {st} (32 KiB)", 11, "end")
    svg.text(ox - 10, rows["cons"] + 18, "consumers", 11, "end", weight="bold")
    svg.text(ox - 10, rows["cons"] + 32, "warpgroups 1 and 2", 9.5, "end", fill="#555")
    for t in range(T):
        st, col, light = t % STAGES, COLORS[t % STAGES], LIGHT[t % STAGES]
        # producer: wait empty (from lap 1), arrive_expect_tx, two tma::load_2d
        svg.rect(X(L[t]), rows["prod"] + 6, ISSUE * U * 0.9, 26, col, "#000", 0.5)
        svg.text(X(L[t]) + ISSUE * U * 0.45, rows["prod"] + 24, f"{t}", 10, "middle", fill="#fff", weight="bold")
        # the stage: bytes in flight (light), then read by the consumers (dark)
        y = rows[st]
        svg.rect(X(L[t]), y + 4, X(F[t]) - X(L[t]), 24, light, col, 0.8)
        svg.text((X(L[t]) + X(F[t])) / 2, y + 20, f"TMA t={t}", 9.5, "middle")
        svg.rect(X(C[t]), y + 4, X(E[t]) - X(C[t]), 24, col, "#000", 0.5)
        svg.text((X(C[t]) + X(E[t])) / 2, y + 20, f"read t={t}", 9.5, "middle", fill="#fff")
        # consumers: 4 wgmma m64n128k16 per warpgroup, commit, wait_group::<0>, arrive(empty)
        svg.rect(X(C[t]), rows["cons"] + 6, X(E[t]) - X(C[t]), 26, col, "#000", 0.5)
        svg.text((X(C[t]) + X(E[t])) / 2, rows["cons"] + 24, f"wgmma {t}", 9.5, "middle", fill="#fff")
    # two hand-offs, drawn once each
    svg.arrow(X(F[1]), rows[1] + 28, X(C[1]) + 2, rows["cons"] + 5)
    svg.text(X(F[1]) - 4, rows["cons"] - 24, "full[1] completes (1 arrival + 32 KiB):", 9.5, "end")
    svg.text(X(F[1]) - 4, rows["cons"] - 12, "consumers' wait, parity 0, passes", 9.5, "end")
    svg.arrow(X(E[0]), rows["cons"] + 6, X(L[4]) + 1, rows["prod"] + 33)
    svg.text(X(L[4]) + 8, rows["prod"] + 48, "empty[0] completes (2 arrivals, one per consumer warpgroup):", 9.5)
    svg.text(X(L[4]) + 8, rows["prod"] + 60, "the producer's wait for use 4 (parity 0: phase 0 of empty[0]) passes; it refills stage 0", 9.5)
    svg.line(ox, rows["cons"] + 44, X(E[-1]), rows["cons"] + 44, "#000", 1, 'marker-end="url(#arrow)"')
    svg.text(X(E[-1]), rows["cons"] + 58, "time (illustrative)", 10, "end", fill="#555")
    # the table: each use t, its stage, its lap and the parities
    ty, cw = 410, (1120 - 300 - 30) / T
    heads = [
        ("use t (k tile)", lambda t: f"{t}"),
        ("stage s = t % 4", lambda t: f"{t % STAGES}"),
        ("phase of full[s], empty[s] = t / 4", lambda t: f"{t // STAGES}"),
        ("consumers wait full[s], parity (t / 4) & 1", lambda t: f"{(t // STAGES) & 1}"),
        ("producer waits empty[s], parity (t / 4 + 1) & 1", lambda t: "-" if t < STAGES else f"{((t // STAGES) + 1) & 1}"),
    ]
    for i, (name, f) in enumerate(heads):
        y = ty + i * 24
        svg.text(ox - 10, y + 16, name, 10.5, "end", weight="bold" if i == 0 else "normal")
        for t in range(T):
            fill = LIGHT[t % STAGES] if i == 1 else ("#fff" if i != 3 and i != 4 else ("#ddd" if f(t) == "1" else "#fff"))
            svg.rect(ox + t * cw, y, cw, 24, fill, "#999", 0.5)
            svg.text(ox + t * cw + cw / 2, y + 16, f(t), 11, "middle")
    notes = [
        "Ring::init: full[s] expects 1 arrival (arrive_expect_tx) plus the stage's bytes; empty[s] expects 2 arrivals. A phase completes when both",
        "counts reach zero; then the barrier's phase bit flips. wait_parity_bounded(bar, p) returns once the phase with parity p has completed, so the",
        "parity of use t is that of its lap, t / 4, and flips every wrap. Lap 0 needs no empty wait: the stages start empty (full_parity, empty_parity).",
    ]
    for i, n in enumerate(notes):
        svg.text(40, 560 + i * 16, n, 10.5)
    svg.save("tma-ring-parity.svg")


# (f) rung 11: cluster multicast of B, from gemm_wgmma_bf16_persistent ----------------------------


def cluster_multicast():
    svg = Svg(1120, 600)
    svg.text(560, 22, "Rung 11 (gemm_wgmma_bf16_persistent): a cluster of 2 CTAs shares B; each producer loads half and multicasts it", 14, "middle", weight="bold")
    # global memory: A rows of the cluster tile (256), B rows (256), one k tile of 64
    svg.rect(30, 50, 1060, 150, "#f6f6f6", "#999", 1)
    svg.text(42, 68, "global memory (through L2), one k tile (64 bf16 = 128 bytes per row)", 11, weight="bold")
    boxes = {
        "A0": (70, 104, COLORS[0], "A: tile rows 0 .. 127", "(rank 0's), 16 KiB"),
        "A1": (270, 104, COLORS[1], "A: tile rows 128 .. 255", "(rank 1's), 16 KiB"),
        "B0": (620, 104, COLORS[2], "B rows n0 .. n0+127", "(share 0), 16 KiB"),
        "B1": (830, 104, COLORS[6], "B rows n0+128 .. n0+255", "(share 1), 16 KiB"),
    }
    for key, (x, y, col, t1, t2) in boxes.items():
        svg.rect(x, y, 180, 56, col, "#000", 0.8)
        svg.text(x + 90, y + 24, t1, 10.5, "middle", fill="#fff", weight="bold")
        svg.text(x + 90, y + 40, t2, 10, "middle", fill="#fff")
    svg.text(260, 94, "each A box: tma::load_2d, into its own CTA only", 10.5, "middle")
    svg.text(820, 82, "each B share: tma::load_2d_multicast(.., mask 0b11), issued once, by the", 10.5, "middle")
    svg.text(820, 96, "producer of the CTA whose rank is the share's number; it lands in both CTAs", 10.5, "middle")
    # the two CTAs
    for r in range(2):
        x0 = 40 + r * 550
        svg.rect(x0, 250, 500, 250, "#fff", "#000", 1.5)
        svg.text(x0 + 10, 270, f"CTA rank {r} (its SM): shared memory, stage s", 12, weight="bold")
        svg.text(x0 + 10, 286, f"computes rows {128 * r} .. {128 * r + 127} of the 256 x 256 cluster tile, all 256 columns", 10, fill="#555")
        slots = [("A" + str(r), "A box", 0), ("B0", "B share 0", 1), ("B1", "B share 1", 2)]
        for key, name, i in slots:
            bx = x0 + 20 + i * 155
            svg.rect(bx, 300, 140, 56, boxes[key][2], "#000", 0.8)
            svg.text(bx + 70, 324, name, 11, "middle", fill="#fff", weight="bold")
            svg.text(bx + 70, 340, "16 KiB", 10, "middle", fill="#fff")
        # barriers
        svg.rect(x0 + 20, 380, 215, 50, "#fff", "#000", 1)
        svg.text(x0 + 30, 398, "full[s]", 11, weight="bold")
        svg.text(x0 + 30, 414, "1 arrival: own producer's", 9.5)
        svg.text(x0 + 30, 426, "arrive_expect_tx(48 KiB)", 9.5)
        svg.rect(x0 + 265, 380, 215, 50, "#fff", "#000", 1)
        svg.text(x0 + 275, 398, "empty[s]", 11, weight="bold")
        svg.text(x0 + 275, 414, "WP_EMPTY_ARRIVALS = 4: both consumer", 9.5)
        svg.text(x0 + 275, 426, "warpgroups of both CTAs", 9.5)
        svg.text(x0 + 20, 452, "consumer warpgroups 1 and 2: wgmma m64n256k16 on the stage, then", 10)
        svg.text(x0 + 20, 466, "each arrives on empty[s] here and, through cluster::map_shared + ", 10)
        svg.text(x0 + 20, 480, "mbarrier::arrive_cluster, on the peer CTA's empty[s]", 10)
        # arrows from global memory
        ax = boxes["A" + str(r)][0] + 90
        svg.arrow(ax, 160, x0 + 20 + 70, 298)
        for j, key in enumerate(["B0", "B1"]):
            bx = boxes[key][0] + 90
            svg.arrow(bx, 160, x0 + 20 + (1 + j) * 155 + 70, 298)
    # complete_tx bytes: the loads complete on full[s] at the same offset in each destination CTA
    notes = [
        "A multicast load writes the same shared-memory offset in every CTA of the mask and signals, in each, the mbarrier at the same offset: each CTA's full[s]",
        "receives its A box's bytes and both B shares' bytes, 48 KiB (persistent_stage_bytes), though its own producer issued only 32 KiB of the loads.",
        "L2 serves 32 KiB per CTA per k tile instead of 48. A stage then holds bytes that the peer's producer wrote, so neither producer may refill it before",
        "all four consumer warpgroups are done with it: that is why empty[s] counts 4, and why cluster::sync() runs after the barriers are initialized and before exit.",
    ]
    for i, n in enumerate(notes):
        svg.text(30, 530 + i * 16, n, 10.5)
    svg.save("cluster-multicast.svg")


# (g) rung 12: the staged epilogue, from StagedStore in gemm_wgmma.rs ------------------------------


def staged_epilogue():
    svg = Svg(1120, 640)
    svg.text(560, 22, "Rung 12: the staged epilogue (StagedStore): registers -> shared staging box -> TMA store, overlapped with the next tile", 14, "middle", weight="bold")
    # left: one consumer warpgroup's 64 x 256 accumulator in 8 subtiles of 32 columns
    x0, y0, cw, ch = 40, 70, 52, 90
    svg.text(x0, y0 - 10, "one consumer warpgroup's accumulators: 64 rows x 256 columns of C, 128 f32 registers per thread (acc_m64)", 11, weight="bold")
    for j in range(8):
        svg.rect(x0 + j * cw, y0, cw, ch, LIGHT[j % 2], "#000", 0.8)
        svg.text(x0 + j * cw + cw / 2, y0 + 40, f"j = {j}", 11, "middle")
        svg.text(x0 + j * cw + cw / 2, y0 + 56, f"box {j % 2}", 10, "middle", fill="#555")
    svg.text(x0 + 4 * cw, y0 + ch + 16, "8 subtiles of WP_EPI_COLS = 32 columns: accumulator elements 16 j .. 16 j + 16 of every thread", 10, "middle")
    # staging boxes
    sx, sy = 40, 220
    for b in range(2):
        svg.rect(sx + b * 200, sy, 180, 70, COLORS[b] if b == 0 else COLORS[1], "#000", 0.8)
        svg.text(sx + b * 200 + 90, sy + 28, f"staging box {b}", 11, "middle", fill="#fff", weight="bold")
        svg.text(sx + b * 200 + 90, sy + 46, "64 x 32 f32, 8 KiB,", 10, "middle", fill="#fff")
        svg.text(sx + b * 200 + 90, sy + 60, "128-byte swizzle", 10, "middle", fill="#fff")
    svg.text(sx, sy + 90, "shared memory, per warpgroup (WP_EPI_BUFFERS = 2); subtile j uses box j % 2", 10)
    steps = [
        "for each subtile j:",
        "1. every thread: act(acc + bias) -> st_shared_v2 into box j % 2 (tile_offset, swizzled: conflict-free)",
        "2. fence::proxy_async_shared_cta (the async proxy, TMA, will read what the generic proxy wrote)",
        "3. thread 0: tma::wait_group_read::<0>() (store j - 1 has read box (j + 1) % 2, which subtile j + 1 fills next)",
        "4. named_barrier_sync(WP_EPI_BARRIER + cons, 128): the warpgroup's writes are all in",
        "5. thread 0: tma::store_2d(c_map, box) + tma::commit_group; the copy engine writes C and clips at m and n",
    ]
    for i, t in enumerate(steps):
        svg.text(500, 80 + i * 18, t, 10.5, weight="bold" if i == 0 else "normal")
    svg.arrow(x0 + 2 * cw, y0 + ch + 22, sx + 90, sy - 2)
    svg.arrow(x0 + 3 * cw, y0 + ch + 22, sx + 290, sy - 2)
    svg.rect(500, 220, 280, 70, "#eee", "#000", 1)
    svg.text(640, 250, "C in global memory", 11, "middle", weight="bold")
    svg.text(640, 266, "(TMA store, box 32 x 64, C's tensor map)", 10, "middle")
    svg.arrow(sx + 380, sy + 35, 498, 255)
    # timeline
    ty = 360
    svg.text(40, ty - 10, "over time, for one consumer warpgroup (the other does the same with its 64 rows)", 11, weight="bold")
    ox, U = 200, 34
    X = lambda v: ox + v * U
    lanes = [("producer (thread 0 of warpgroup 0)", ty + 10), ("consumer warpgroup", ty + 60), ("TMA stores (copy engine)", ty + 104)]
    for name, y in lanes:
        svg.text(ox - 8, y + 18, name, 10.5, "end")
    # tile i mainloop, epilogue, tile i+1 mainloop
    svg.rect(X(0), ty + 62, X(10) - X(0), 26, COLORS[2], "#000", 0.5)
    svg.text((X(0) + X(10)) / 2, ty + 80, "tile i: k tiles, wgmma m64n256k16 (one group in flight)", 10, "middle", fill="#fff")
    for j in range(8):
        a, b = 10 + j * 0.7, 10 + (j + 1) * 0.7
        svg.rect(X(a), ty + 62, X(b) - X(a), 26, LIGHT[j % 2], "#000", 0.5)
        svg.text((X(a) + X(b)) / 2, ty + 80, f"{j}", 9.5, "middle")
        # store j: issued after subtile j's barrier, on the row of its box
        sy = ty + 100 + 18 * (j % 2)
        svg.rect(X(b), sy, 1.3 * U, 16, COLORS[j % 2], "#000", 0.5)
        svg.text(X(b) + 0.65 * U, sy + 12, f"store {j}", 8.5, "middle", fill="#fff")
    svg.rect(X(15.6), ty + 62, X(26) - X(15.6), 26, COLORS[2], "#000", 0.5)
    svg.text((X(15.6) + X(26)) / 2, ty + 80, "tile i+1: k tiles", 10, "middle", fill="#fff")
    # the producer: tile i's loads, then tile i+1's first 4 stages (the ring's depth) during the
    # epilogue, then one load per stage the consumers free
    loads = [k - 3.0 for k in range(3, 10)] + [7.3, 8.3, 9.3] + [10.0, 10.4, 10.8, 11.2] + [16.6 + k for k in range(9)]
    for i, k in enumerate(loads):
        svg.rect(X(k), ty + 12, 0.32 * U, 26, LIGHT[4] if i < 10 else COLORS[4], "#000", 0.4)
    svg.text(X(10.6), ty + 8, "tile i+1's first 4 stages (the ring's depth)", 9.5, "middle")
    svg.line(ox, ty + 150, X(26), ty + 150, "#000", 1, 'marker-end="url(#arrow)"')
    svg.text(X(26), ty + 164, "time (illustrative)", 10, "end", fill="#555")
    svg.text(X(12.8), ty + 164, "the epilogue: 8 subtiles", 9.5, "middle")
    notes = [
        "Without staging (rung 11's kernel with stores from registers, `_regstore`), each thread writes its scattered outputs to global memory itself and the warpgroup",
        "waits for them before the next tile. Staged, the consumers only write shared memory, 16 values per thread per subtile; the global writes run on the copy engine",
        "while the next tile's wgmma run, and the last tile's stores are waited for (tma::wait_group::<0>) once, before the kernel exits.",
    ]
    for i, n in enumerate(notes):
        svg.text(40, 560 + i * 16, n, 10.5)
    svg.save("staged-epilogue.svg")


# (h) rung 14: tensor memory, from gemm_tcgen05.rs and gpu/src/tcgen05.rs ----------------------------


def tmem_lanes():
    svg = Svg(1120, 600)
    svg.text(560, 22, "Rung 14 (gemm_tcgen05_bf16): the accumulators live in tensor memory (TMEM), 128 lanes x 512 columns of 32 bits per SM", 14, "middle", weight="bold")
    ox, oy, W, H = 250, 70, 800, 384
    lw = H / 128
    cwid = W / 512
    # columns: two accumulators
    for acc in range(2):
        for ch in range(8):
            c0 = acc * 256 + ch * 32
            for q in range(4):
                svg.rect(ox + c0 * cwid, oy + q * 32 * lw, 32 * cwid, 32 * lw, LIGHT[q], "#999", 0.4)
        svg.rect(ox + acc * 256 * cwid, oy, 256 * cwid, H, "none", "#000", 2)
        svg.text(ox + (acc * 256 + 128) * cwid, oy - 22, f"accumulator {acc}: columns {256 * acc} .. {256 * acc + 255}", 11.5, "middle", weight="bold")
        svg.text(ox + (acc * 256 + 128) * cwid, oy - 8, f"tiles j with j % 2 == {acc} (accumulator(j))", 10, "middle", fill="#555")
    for c in range(0, 513, 64):
        svg.text(ox + c * cwid, oy + H + 14, f"{c}", 9.5, "middle", fill="#555")
    svg.text(ox + W / 2, oy + H + 30, "TMEM column = output column of the 128 x 256 tile (+ 256 for accumulator 1); tcgen05::tmem_addr(base, lane, col): lane << 16 | col", 10, "middle")
    for q in range(4):
        y = oy + q * 32 * lw
        svg.text(ox - 10, y + 16 * lw + 4, f"lanes {32 * q} .. {32 * q + 31}  <-  warp {4 + q}", 11, "end", weight="bold")
        svg.text(ox - 10, y + 16 * lw + 18, f"(warp_lane_base({4 + q}) = {32 * q})", 9.5, "end", fill="#555")
    svg.text(ox - 10, oy - 8, "lane = row of the tile", 10.5, "end")
    # one load highlighted
    q, ch = 1, 3
    svg.rect(ox + (ch * 32) * cwid, oy + q * 32 * lw, 32 * cwid, 32 * lw, COLORS[5], "#000", 1.5)
    svg.text(ox + (ch * 32 + 16) * cwid, oy + q * 32 * lw + 16 * lw + 4, "x32", 9, "middle")
    svg.rect(ox + 212, oy + q * 32 * lw + 16 * lw - 10, 500, 20, "#fff", "#000", 0.5)
    svg.text(ox + 218, oy + q * 32 * lw + 16 * lw + 4, "<- one tcgen05::ld_32x32b_x32 by warp 5: thread l gets lane 32 + l, columns 96 .. 127", 10)
    notes = [
        "Roles (TC_THREADS = 256, 8 warps): warp 0, one thread, fills the TMA ring (Ring::fill_at); warp 1, one thread, issues tcgen05::mma_f16 (128 x 256 x 16, four per k tile)",
        "into accumulator j % 2 and tcgen05::commit(empty[s]) per stage, then commit(acc_full[j % 2]) per tile; warp 2 allocates all 512 columns (tcgen05::alloc) and frees",
        "them at the end; warp 3 idles; warps 4-7, the epilogue warpgroup, wait acc_full (parity acc_full_parity(j)), read their lanes 32 columns at a time, store C, and",
        "arrive on acc_empty (128 arrivals), which the issuer waits for (acc_empty_parity) before reusing the accumulator for tile j + 2: one tile's epilogue overlaps the next's MMAs.",
        "A warp may only reach the lane quarter 32 (w % 4) of TMEM, so the four epilogue warps must be a whole warpgroup, here warps 4-7.",
    ]
    for i, n in enumerate(notes):
        svg.text(30, 505 + i * 16, n, 10.5)
    svg.save("tmem-lanes.svg")


# (i) the megakernel: instruction stream and page ring, from gpu/src/megakernel.rs and
# gpu/src/kernels/megakernel/tensor_cores/ --------------------------------------------------------


def megakernel_stream():
    svg = Svg(1120, 700)
    svg.text(560, 22, "The megakernel: per-SM instruction lists, dependency counters in global memory, and each block's page ring", 14, "middle", weight="bold")
    # host
    svg.rect(30, 44, 1060, 44, "#f6f6f6", "#999", 1)
    svg.text(42, 62, "host: schedule::build lists every Instruction (12 words: opcode, layer, tile_row, tile_col, wait, wait_value, wait2, wait2_value, signal, signal2)", 10.5)
    svg.text(42, 78, "in one topological order and deals them to the SMs (per_sm, in that order); block b runs its list, instructions sm_offsets[b] .. sm_offsets[b + 1]", 10.5)
    # an example dealing of a 2-layer step: 2 row blocks (rb) x 2 column tiles per layer
    S, W = "#c00", "#06c"
    lists = [
        ("block 0", [("FWD 0", "rb 0, col 0", "+1 fwd[0][rb 0]", S), ("FWD 1", "rb 0, col 0", "wait fwd[0][rb 0] >= 2", W),
                     ("LOSS", "rb 0, col 0", "wait fwd[1][rb 0] >= 2", W), ("BWD_INPUT 1", "rb 0, col 0", "wait grad[2][rb 0] >= 2", W),
                     ("BWD_W + SGD 1", "tile (0, 0)", "wait grad_total[2]", W)]),
        ("block 1", [("FWD 0", "rb 0, col 1", "+1 fwd[0][rb 0]", S), ("FWD 1", "rb 0, col 1", "wait fwd[0][rb 0] >= 2", W),
                     ("LOSS", "rb 0, col 1", "+1 grad[2][rb 0], grad_total[2]", S), ("BWD_W + SGD 1", "tile (0, 1)", "wait grad_total[2]", W),
                     ("BWD_W + SGD 0", "tile (0, 0)", "wait grad_total[1]", W)]),
        ("block 2", [("FWD 0", "rb 1, col 0", "+1 fwd[0][rb 1]", S), ("FWD 0", "rb 1, col 1", "+1 fwd[0][rb 1]", S),
                     ("FWD 1", "rb 1, col 0", "wait fwd[0][rb 1] >= 2", W), ("FWD 1", "rb 1, col 1", "wait fwd[0][rb 1] >= 2", W),
                     ("LOSS", "rb 1, col 0", "wait fwd[1][rb 1] >= 2", W)]),
    ]
    ox, bw, gap = 90, 156, 10
    svg.text(ox, 104, "an example dealing (2 layers, 2 row blocks, 2 column tiles); red: what an instruction signals when done, blue: what it waits for first", 10, fill="#333")
    for i, (name, ins) in enumerate(lists):
        y = 112 + i * 56
        svg.text(ox - 8, y + 28, name, 11, "end", weight="bold")
        for k, (op, arg, dep, dc) in enumerate(ins):
            x = ox + k * (bw + gap)
            col = LIGHT[0] if op.startswith("FWD") else (LIGHT[3] if op == "LOSS" else LIGHT[2])
            svg.rect(x, y, bw, 50, col, "#000", 0.8)
            svg.text(x + bw / 2, y + 15, op, 10.5, "middle", weight="bold")
            svg.text(x + bw / 2, y + 29, arg, 9.5, "middle", fill="#555")
            svg.text(x + bw / 2, y + 43, dep, 9, "middle", fill=dc)
        svg.text(ox + 5 * (bw + gap) - 4, y + 30, "...", 12)
    # counters
    cx, cy = 960, 112
    svg.rect(cx - 6, cy, 136, 162, "#fff8e1", "#000", 1)
    svg.text(cx + 62, cy + 16, "counters (global)", 10.5, "middle", weight="bold")
    for k, c in enumerate(["fwd[l][rb]", "grad[l][rb]", "grad_total[l]", "dw_total[l]", "all start at 0;", "instruction waits:", "counter >= value"]):
        svg.text(cx + 2, cy + 36 + k * 18, c, 10, fill="#000" if k < 4 else "#555")
    svg.text(30, 296, "Any order the host deals keeps each list in the global topological order, so the first unfinished instruction overall is first in its list with its waits met:", 10)
    svg.text(30, 310, "some block always makes progress (no deadlock by construction). Every wait is bounded; a stall sets an abort flag and the host gets Error::Stalled.", 10)
    # the page ring of one block
    py = 340
    svg.rect(30, py, 1060, 290, "#fff", "#000", 1.5)
    svg.text(42, py + 20, "inside one block (tensor-core path, sm_90): the page ring, PAGE_STAGES = 8 slots in shared memory, each with a ready and a free mbarrier", 11.5, weight="bold")
    svg.rect(50, py + 50, 200, 110, LIGHT[1], "#000", 1)
    for i, t in enumerate(["loader: warp 8, lane 0", "for each instruction of the list:", "wait its counters (acquire),", "fence.proxy.async.global,", "then per page use u:", "wait free[u % 8], parity (u/8 + 1) & 1", "arrive_expect_tx(ready[u % 8]) + TMA"]):
        svg.text(58, py + 66 + i * 13.5, t, 9.5, weight="bold" if i == 0 else "normal")
    rx, ry = 300, py + 60
    for sl in range(8):
        x = rx + sl * 58
        svg.rect(x, ry, 52, 80, LIGHT[sl % 8], "#000", 0.8)
        svg.text(x + 26, ry + 20, f"slot {sl}", 10, "middle", weight="bold")
        svg.text(x + 26, ry + 38, "16 KiB", 9, "middle")
        svg.text(x + 26, ry + 56, "ready", 9, "middle", fill="#06c")
        svg.text(x + 26, ry + 70, "free", 9, "middle", fill="#c00")
    svg.arrow(252, py + 100, rx - 4, py + 100)
    svg.rect(800, py + 50, 270, 110, LIGHT[2], "#000", 1)
    for i, t in enumerate(["consumers: warps 0-7 (two warpgroups)", "per page use u: wait ready[u % 8],", "parity (u / 8) & 1; wgmma (or ldmatrix +", "mma.sync) from the slot; each reading warp", "arrives on free[u % 8]: page_free_arrivals =", "4 warps (tile <= 64) or all 8 (tile 128)"]):
        svg.text(808, py + 66 + i * 14, t, 9.5, weight="bold" if i == 0 else "normal")
    svg.arrow(rx + 8 * 58, py + 100, 798, py + 100)
    svg.rect(800, py + 180, 270, 90, LIGHT[6], "#000", 1)
    for i, t in enumerate(["storer: warp 9, lane 0 (bf16 tile 128)", "the consumers stage each finished tile", "(arrive staged); it TMA-stores the tile,", "waits for the writes, fences and signals", "the instruction's counters"]):
        svg.text(808, py + 196 + i * 14, t, 9.5, weight="bold" if i == 0 else "normal")
    svg.arrow(935, py + 162, 935, py + 178)
    notes = [
        "u counts every page use of the block, over all its instructions in order, so the loader and the consumers agree on slot u % 8 and",
        "parity without talking: they walk the same list with the same k extents. At tile 128 a page fills a slot and a K block takes two uses",
        "(A, then B: slot_uses_per_block). The loader runs up to the whole ring ahead, across instructions, so the next tile's loads overlap this tile's math.",
        "(ready: PAGE_READY_ARRIVALS = 1 plus the bytes; page_slot, ready_parity, free_parity in gpu/src/megakernel.rs; block.rs sets the roles.)",
    ]
    for i, n in enumerate(notes):
        svg.text(50, py + 196 + i * 16, n, 10) if False else svg.text(50, py + 196 + i * 16, n, 9.5)
    svg.save("megakernel-stream.svg")


# (b) chapters outside the ladder: one figure each ------------------------------------------------


def box(svg, x, y, w, h, lines, fill="#fff", size=11, bold_first=True, fg="#000"):
    svg.rect(x, y, w, h, fill, "#000", 1)
    n = len(lines)
    y0 = y + h / 2 - (n - 1) * (size + 3) / 2 + size * 0.35
    for i, t in enumerate(lines):
        svg.text(x + w / 2, y0 + i * (size + 3), t, size if i == 0 else size - 1, "middle", fg,
                 "bold" if (i == 0 and bold_first) else "normal")


def level0_reduce():
    # reduce_sum_f32 (gpu/src/kernels/reduce.rs): grid-stride accumulation, warp butterfly
    # (warp::reduce_sum_f32: lanes pair at distance 16, 8, 4, 2, 1), lane 0 -> warp_sums, barrier,
    # warp 0 combines the warp sums, one partial per block; the host runs it again with one block.
    svg = Svg(940, 545)
    svg.text(470, 22, "reduce_sum_f32: a grid-stride loop, a butterfly per warp, then warp 0 over the warp sums", 14, "middle", weight="bold")
    # 1. grid-stride loop over x
    y1 = 60
    svg.text(30, y1, "1. grid-stride loop: thread t of the grid adds x[t], x[t + stride], x[t + 2 stride], ...  (stride = grid_stride_x() = all threads of the grid)", 11, weight="bold")
    cell, T = 13, 16
    for r in range(3):
        for t in range(T):
            x = 30 + (r * T + t) * cell
            b = t // 8
            svg.rect(x, y1 + 14, cell, 22, LIGHT[b] if t != 2 else COLORS[b], "#888", 0.5)
    for r in range(3):
        svg.text(30 + (r * T + T / 2) * cell, y1 + 52, f"x[{r} stride ..]" if r else "x[0 .. stride)", 10, "middle")
    for r in range(3):
        x = 30 + (r * T + 2) * cell + cell / 2
        svg.line(x, y1 + 36, x, y1 + 62, COLORS[0], 1)
    svg.line(30 + 2 * cell + cell / 2, y1 + 62, 30 + (2 * T + 2) * cell + cell / 2, y1 + 62, COLORS[0], 1)
    svg.text(30 + 48 * cell + 14, y1 + 30, "block 0 (light blue), block 1 (light orange);", 10)
    svg.text(30 + 48 * cell + 14, y1 + 44, "thread 2 of block 0 (dark) sums its own slice", 10)
    svg.text(30 + 48 * cell + 14, y1 + 58, "sequentially into acc: no atomics", 10)
    # 2. butterfly in one warp
    y2 = 160
    svg.text(30, y2 - 6, "2. warp::reduce_sum_f32: shfl.sync.bfly at lane distance 16, 8, 4, 2, 1; every lane ends with the warp's sum", 11, weight="bold")
    lx, lw = 60, 26
    lanes = 32
    rows = [16, 8, 4, 2, 1]
    rowh = 34
    for lvl in range(6):
        y = y2 + 24 + lvl * rowh
        for l in range(lanes):
            svg.circle(lx + l * lw, y, 4, COLORS[0] if lvl == 5 else "#fff")
        if lvl < 5:
            d = rows[lvl]
            for l in range(lanes):
                svg.line(lx + l * lw, y + 4, lx + (l ^ d) * lw, y + rowh - 4, "#999", 0.6)
            svg.text(lx - 10, y + rowh / 2 + 4, f"{d}", 10, "end", fill="#555")
    svg.text(lx + 15.5 * lw, y2 + 16, "lanes 0 .. 31 of one warp; level labels: the lane distance", 9, "middle", fill="#555")
    svg.text(lx + 31 * lw + 14, y2 + 24 + 5 * rowh + 4, "sum", 10)
    # 3. across warps
    y3 = y2 + 24 + 5 * rowh + 34
    svg.text(30, y3, "3. lane 0 of warp w writes warp_sums[w] (shared memory); sync_threads(); warp 0 runs the same butterfly over them;", 11, weight="bold")
    svg.text(30, y3 + 15, "    its lane 0 writes partials[block] = scale x total", 11, weight="bold")
    y3 += 15
    for w in range(4):
        box(svg, 40 + w * 120, y3 + 16, 100, 34, [f"warp {w}" if w < 3 else "...", "sum" if w < 3 else ""], LIGHT[0])
        svg.arrow(90 + w * 120, y3 + 52, 90 + w * 120, y3 + 76)
    box(svg, 40, y3 + 78, 460, 30, ["warp_sums: one f32 per warp (static shared memory)"], "#eee", 10, False)
    svg.arrow(510, y3 + 93, 570, y3 + 93)
    box(svg, 572, y3 + 78, 150, 30, ["warp 0: butterfly"], LIGHT[2], 10, False)
    svg.arrow(724, y3 + 93, 764, y3 + 93)
    box(svg, 766, y3 + 70, 150, 46, ["partials[block]", "then a second launch", "with one block over them"], LIGHT[1], 10)
    svg.save("level0-reduce-sum.svg")


def determinism_chain():
    # the f32 tier (guide/src/determinism.md): C[i][j] is one thread's fma chain over ascending p
    svg = Svg(960, 450)
    svg.text(480, 22, "The f32 tier: each output is one thread's FMA chain over k, in ascending p", 14, "middle", weight="bold")
    cell = 16
    K = 12
    # X (batch x k) and W^T (k x n)
    ax, ay = 40, 140
    rows = 6
    def afill(r, c):
        if r == 2:
            return COLORS[0] if c < 9 else "#ddd"
        return None
    grid(svg, ax, ay, rows, K, cell, afill)
    svg.text(ax + K * cell / 2, ay - 8, "X (row i = one sample)", 11, "middle")
    svg.text(ax + K * cell / 2, ay + rows * cell + 16, "row i: a[i][p]", 10, "middle", fill=COLORS[0])
    bx, by = ax + K * cell + 40, 70
    def bfill(r, c):
        if c == 3:
            return COLORS[1] if r < 9 else "#ddd"
        return None
    grid(svg, bx, by, K, 6, cell, bfill)
    svg.text(bx + 3 * cell, by - 8, "W^T (column j: b[p][j])", 11, "middle")
    svg.text(ax, ay + rows * cell + 32, "grey: zero padding to the tile depth", 9, fill="#555")
    svg.text(ax, ay + rows * cell + 44, "(tiled rungs only, when k is not a multiple of it)", 9, fill="#555")
    cx, cy = bx, ay + 4 * 0  # C under W^T
    cy = by + K * cell + 14
    def cfill(r, c):
        return COLORS[2] if (r == 2 and c == 3) else None
    grid(svg, cx, cy, rows, 6, cell, cfill)
    svg.text(cx + 3 * cell, cy + rows * cell + 16, "C[i][j]: one thread", 10, "middle")
    # the chain
    qx, qy = 450, 80
    svg.text(qx, qy, "one thread, one output:", 12, weight="bold")
    chain = ["acc = +0.0", "acc = fma(a[i][0], b[0][j], acc)", "acc = fma(a[i][1], b[1][j], acc)", "...", "acc = fma(a[i][k-1], b[k-1][j], acc)",
             "(padded steps: fma(0, 0, acc): same acc, except -0.0 -> +0.0)"]
    for i, t in enumerate(chain):
        svg.text(qx + 10, qy + 22 + i * 18, t, 11, fill="#555" if i == 5 else "#000", extra='font-family="monospace"' if False else "")
    svg.text(qx, qy + 22 + 6 * 18 + 6, "fma.rn.f32 (kiln_gpu::math::fma), reproduced on the CPU by f32::mul_add", 10)
    # what enters and what does not
    ey = 250
    box(svg, qx, ey, 220, 116, ["the association depends on", "k only", "(the steps p = 0, 1, ..., k - 1", "in this order)"], LIGHT[2], 11)
    box(svg, qx + 240, ey, 230, 116, ["does not enter it", "the batch (m), other rows", "the tile sizes and the grid", "the rung the chooser picks", "no atomics, no split-k"], LIGHT[3], 11)
    svg.text(480, 428, "Rows are independent: sample i gets the same bits in a batch of 7 or of 128; padding can change only the sign of a zero result.", 11, "middle")
    svg.save("determinism-chain.svg")


def autograd_tape():
    # host/src/tensor: each result holds the Op that made it (ops.rs), backward() sorts the graph
    # topologically (autograd.rs topo_order) and walks it in reverse; Storage is Cpu | Cuda (storage.rs)
    svg = Svg(960, 470)
    svg.text(480, 22, "The graph is the tensors: each result holds its Op; backward walks it in reverse topological order", 14, "middle", weight="bold")
    # forward nodes
    nodes = {
        "x": (40, 80, "x (leaf)", "no grad"),
        "w": (40, 170, "w (leaf)", "requires_grad"),
        "wt": (230, 170, "w.transpose(0, 1)", "Op::Transpose (a view)"),
        "mm": (430, 120, "x.matmul(..)", "Op::Matmul"),
        "ce": (630, 120, "cross_entropy", "Op::CrossEntropy"),
    }
    W, H = 160, 46
    for k, (x, y, a, b) in nodes.items():
        box(svg, x, y, W, H, [a, b], LIGHT[0] if k in ("x", "w") else LIGHT[1])
    svg.arrow(200, 193, 228, 193)
    svg.arrow(200, 103, 428, 135)
    svg.arrow(390, 190, 428, 150)
    svg.arrow(590, 143, 628, 143)
    svg.text(800, 148, "= loss", 12, weight="bold")
    svg.text(40, 62, "forward: each op returns a Tensor whose Op holds its inputs (host/src/tensor/forward.rs, ops.rs)", 11)
    # backward order
    by = 250
    svg.text(40, by, "loss.backward(): topological sort (iterative DFS), seed the loss with ones, then each Op's rule in reverse order", 11, weight="bold")
    order = ["Op::CrossEntropy's rule", "Op::Matmul's rule", "Op::Transpose's rule", "leaf w: w.grad()"]
    for i, t in enumerate(order):
        box(svg, 40 + i * 225, by + 16, 195, 36, [t], LIGHT[2], 11, False)
        if i < 3:
            svg.arrow(237 + i * 225, by + 34, 263 + i * 225, by + 34)
    svg.text(40, by + 72, "each rule is written with the same tensor ops, so it runs on the backend the forward ran on", 10)
    # backend seam
    sy = 350
    svg.text(40, sy, "the backend seam (host/src/tensor/storage.rs)", 11, weight="bold")
    box(svg, 40, sy + 14, 220, 46, ["Tensor", "Arc: storage, layout, dtype, Op"], LIGHT[0])
    svg.arrow(262, sy + 37, 318, sy + 37)
    box(svg, 320, sy + 14, 160, 46, ["Storage", "enum"], "#eee")
    svg.arrow(482, sy + 30, 558, sy + 14 + 8)
    svg.arrow(482, sy + 44, 558, sy + 66 + 8)
    box(svg, 560, sy + 2, 360, 40, ["Storage::Cpu", "cpu/: the reference, f32 and f64, rows over threads"], LIGHT[2], 11)
    box(svg, 560, sy + 54, 360, 40, ["Storage::Cuda", "cuda_backend.rs: kiln's Rust kernels (tensor_ops.rs)"], LIGHT[1], 11)
    svg.save("autograd-tape.svg")


def layers():
    # guide/src/layout.md: the host's layers; an import goes to the same layer or below
    svg = Svg(900, 520)
    svg.text(450, 22, "The host's layers: a module imports its own layer and those below it, never one above", 14, "middle", weight="bold")
    L = [
        ("main.rs (CLI)", ""),
        ("train", "the main job"),
        ("megakernel · tools", "one launch per step; kiln gemm"),
        ("nn · optim · checkpoint · data", "layers, optimizers, files, datasets"),
        ("tensor", "Tensor, autograd, the backend seam"),
        ("cuda", "devices, buffers, launches, GEMM launchers"),
        ("ptx", "the embedded PTX modules"),
        ("error · dtype · testing · deterministic · attention", "leaves"),
        ("kiln_gpu (gpu/)", "kernels, parameter structs, constants"),
    ]
    x, w, h, gap = 60, 440, 40, 12
    for i, (a, b) in enumerate(L):
        y = 50 + i * (h + gap)
        fill = LIGHT[4] if i < 8 else LIGHT[5]
        box(svg, x, y, w, h, [a, b] if b else [a], fill, 11)
        if i < 8:
            svg.arrow(x + w / 2, y + h, x + w / 2, y + h + gap - 1)
    # the allowed and forbidden arrows, drawn on the stack: nn -> cuda (down, skipping a layer) is
    # allowed; cuda -> tensor (up) is not
    yc = lambda i: 50 + i * (h + gap) + h / 2
    gx = x + w + 16
    svg.line(x + w, yc(3), gx, yc(3), COLORS[2], 1.5)
    svg.line(gx, yc(3), gx, yc(5), COLORS[2], 1.5)
    svg.line(gx, yc(5), x + w + 2, yc(5), COLORS[2], 1.5, 'marker-end="url(#arrow)"')
    rx = 560
    svg.text(rx, yc(3) + 4, "allowed: nn imports cuda (down, any distance)", 11, weight="bold", fill=COLORS[2])
    svg.text(rx, yc(3) + 20, "nn maps nn::Activation onto the", 10)
    svg.text(rx, yc(3) + 34, "epilogue's cuda::gemm::Activation", 10)
    bx2 = x - 16
    svg.line(x, yc(5), bx2, yc(5), COLORS[3], 1.5)
    svg.line(bx2, yc(5), bx2, yc(4), COLORS[3], 1.5)
    svg.line(bx2, yc(4), x - 2, yc(4), COLORS[3], 1.5, 'marker-end="url(#arrow)"')
    ym = (yc(4) + yc(5)) / 2
    svg.line(bx2 - 8, ym - 8, bx2 + 8, ym + 8, COLORS[3], 3)
    svg.line(bx2 + 8, ym - 8, bx2 - 8, ym + 8, COLORS[3], 3)
    svg.text(rx, yc(5) + 4, "forbidden: cuda imports tensor (up)", 11, weight="bold", fill=COLORS[3])
    svg.text(rx, yc(5) + 20, "the CUDA runtime knows nothing of tensors,", 10)
    svg.text(rx, yc(5) + 34, "tensors nothing of layers", 10)
    svg.text(rx, 420, "tests/structure.rs checks the direction on", 10, weight="bold")
    svg.text(rx, 434, "every test run, and that inline PTX stays", 10, weight="bold")
    svg.text(rx, 448, "inside the device library", 10, weight="bold")
    svg.save("host-layers.svg")


def device_library():
    # guide/src/device-library.md: PTX wrapped once in kiln-gpu modules; kernels call only wrappers
    svg = Svg(980, 500)
    svg.text(490, 22, "The device library: every PTX instruction wrapped once, kernels written as algorithms over the wrappers", 14, "middle", weight="bold")
    # top: kernels
    ky = 50
    svg.text(30, ky + 4, "kernels (gpu/src/kernels/)", 12, weight="bold")
    ks = ["vector_add", "reduce_sum_f32", "sgemm_*", "gemm_wgmma*", "flash_fwd_*", "megakernel_step*"]
    for i, k in enumerate(ks):
        box(svg, 30 + i * 155, ky + 14, 140, 34, [k], LIGHT[1], 11, False)
    svg.text(500, ky + 76, "call #[inline(always)] wrappers with # Safety sections; no inline PTX elsewhere", 10)
    # middle: modules, grouped
    my = 150
    svg.text(30, my, "kiln-gpu modules (wrappers)", 12, weight="bold")
    groups = [
        ("threads and sync", ["thread", "sync", "warp", "atomic", "fence"], LIGHT[0]),
        ("memory", ["shared", "cp_async", "mbarrier", "tma", "matrix"], LIGHT[2]),
        ("math units", ["mma", "wgmma (sm_90a)", "cluster (sm_90)", "tcgen05 (sm_100a)", "math"], LIGHT[6]),
        ("formats and hints", ["convert", "swizzle (pure)", "hint"], LIGHT[5]),
    ]
    gw = 225
    for g, (name, mods, fill) in enumerate(groups):
        gx = 30 + g * (gw + 15)
        svg.rect(gx, my + 10, gw, 200, "#fafafa", "#888", 1)
        svg.text(gx + gw / 2, my + 28, name, 11, "middle", weight="bold")
        for i, m in enumerate(mods):
            box(svg, gx + 12, my + 38 + i * 33, gw - 24, 27, [m], fill, 11, False)
    svg.arrow(490, ky + 52, 490, my - 10)
    # bottom: PTX
    py = 390
    svg.arrow(490, my + 214, 490, py - 2)
    svg.text(500, my + 232, "pure functions (fragment layouts, swizzle, smem_descriptor) emit no PTX: host-tested", 10)
    svg.rect(30, py, 920, 80, "#eee", "#000", 1)
    svg.text(490, py + 20, "PTX (asm!), one instruction per wrapper, shown in its documentation", 12, "middle", weight="bold")
    ex = ["mov.u32 %r, %tid.x;", "shfl.sync.bfly.b32", "mbarrier.try_wait.parity", "cp.async.bulk.tensor.2d",
          "mma.sync.aligned.m16n8k16", "wgmma.mma_async", "tcgen05.mma", "fma.rn.f32"]
    for i, e in enumerate(ex):
        svg.text(50 + (i % 4) * 228, py + 44 + (i // 4) * 18, e, 10.5, extra='font-family="monospace"')
    svg.save("device-library.svg")


def online_softmax():
    # guide/src/attention.md: one query block walks key tiles; m, l, o per row; causal tiles skipped
    svg = Svg(980, 445)
    svg.text(490, 22, "The online softmax: one query block walks the key tiles, keeping m, l and o per row;", 14, "middle", weight="bold")
    svg.text(490, 40, "with the causal mask, tiles past the diagonal are never visited", 14, "middle", weight="bold")
    x0, y0 = 90, 86
    nt, qb = 8, 8  # tiles shown along keys and query blocks (schematic)
    c = 34
    svg.text(x0 + nt * c / 2, y0 - 10, "keys (tiles of K, V) ->", 11, "middle")
    svg.text(x0 - 12, y0 + qb * c / 2, "query blocks", 11, "middle", extra=f'transform="rotate(-90 {x0 - 12} {y0 + qb * c / 2})"')
    sel = 5
    for r in range(qb):
        for t in range(nt):
            if t > r:
                fill = "#f2f2f2"
            elif t == r:
                fill = LIGHT[5]
            else:
                fill = "#fff"
            if r == sel:
                fill = COLORS[0] if t < r else (COLORS[5] if t == r else "#f2f2f2")
            svg.rect(x0 + t * c, y0 + r * c, c, c, fill, "#999", 0.6)
    svg.rect(x0, y0, nt * c, qb * c, "none", "#000", 1)
    for t in range(sel + 1):
        svg.text(x0 + t * c + c / 2, y0 + sel * c + c / 2 + 4, f"{t}", 11, "middle", fill="#fff" if t < sel else "#000")
    svg.text(x0 + nt * c / 2, y0 + qb * c + 20, "white/blue: full tiles; yellow: diagonal tiles (masked inside); grey: skipped", 10, "middle")
    svg.text(x0 + nt * c / 2, y0 + qb * c + 34, "the highlighted row is one query block's walk, tiles 0, 1, ... in order", 10, "middle")
    svg.text(x0 + nt * c / 2, y0 + qb * c + 48, "(schematic: square tiles, q_len = kv_len)", 10, "middle", fill="#555")
    # right side: the recurrence
    rx = 420
    svg.text(rx, 86, "per query row, for each key tile of scores s_1 .. s_n:", 12, weight="bold")
    eqs = ["m' = max(m, s_1, ..., s_n)",
           "l' = l e^(m - m') + sum_j e^(s_j - m')",
           "o' = o e^(m - m') + sum_j e^(s_j - m') v_j"]
    for i, e in enumerate(eqs):
        svg.text(rx + 16, 106 + i * 22, e, 12, extra='font-family="monospace"')
    svg.text(rx, 186, "e^(m - m') rescales what was computed against the old maximum", 11)
    # timeline boxes
    ty = 220
    for i in range(4):
        lbl = ["tile 0", "tile 1", "...", "diagonal tile"][i]
        box(svg, rx + i * 130, ty, 110, 40, [lbl, "S, P on chip" if i != 2 else ""], COLORS[0] if i < 3 else COLORS[5], 11, True, "#fff" if i < 3 else "#000")
        if i < 3:
            svg.arrow(rx + i * 130 + 112, ty + 20, rx + i * 130 + 128, ty + 20)
    svg.text(rx, ty + 62, "m, l, o stay in registers between tiles (one row per thread on rung 1;", 10)
    svg.text(rx, ty + 76, "warp w owns 16 rows on rung 2)", 10)
    box(svg, rx, ty + 100, 250, 46, ["after the last tile", "O = o / l,  LSE = m + ln l"], LIGHT[2], 11)
    svg.text(rx + 270, ty + 118, "the backward recomputes P", 10)
    svg.text(rx + 270, ty + 132, "from the LSE instead of storing it", 10)
    svg.text(490, 430, "The naive form writes and reads back all of S and P (q_len x kv_len per head); here they live one tile at a time.", 11, "middle")
    svg.save("online-softmax.svg")


def mixed_precision():
    # guide/src/mixed-precision.md: f32 masters, bf16 compute copies written by the optimizer's launch,
    # the fused Linear (gemm_wgmma_bf16_fused: bias + ReLU in the epilogue), dW in f32
    svg = Svg(980, 470)
    svg.text(490, 22, "Mixed precision: f32 masters, bf16 copies written by the optimizer's launch, dW back in f32", 14, "middle", weight="bold")
    # one step as a cycle: optimizer -> master and copy -> forward -> backward -> dW -> master
    box(svg, 40, 115, 240, 70, ["multi_adam_f32 / multi_sgd_f32", "reads W and dW, writes the new W", "and, in the same launch, its copy"], LIGHT[5], 11)
    box(svg, 340, 55, 220, 50, ["W master (f32)", "with its gradient dW (f32)"], LIGHT[0])
    box(svg, 340, 195, 220, 50, ["W compute copy (bf16)", "rounded to nearest-even"], LIGHT[1])
    svg.arrow(282, 135, 338, 90)
    svg.arrow(282, 165, 338, 210)
    box(svg, 640, 195, 300, 50, ["forward inside autocast(BF16)", "Linear reads the copy: X bf16 -> Y bf16"], LIGHT[1])
    svg.arrow(562, 220, 638, 220)
    box(svg, 640, 45, 300, 70, ["backward (rung 13's layouts on wgmma)", "dX = dY W   (AB, bf16 out)", "dW = dY^T X (AtB, f32 out)"], LIGHT[1], 11)
    svg.arrow(790, 193, 790, 117)
    svg.line(638, 80, 562, 80, COLORS[0], 2, 'marker-end="url(#arrow)"')
    svg.text(600, 72, "dW", 11, "middle", fill=COLORS[0], weight="bold")
    svg.text(490, 280, "dW reaches the master in f32, never rounded to bf16; only the optimizer's launch writes the copy", 11, "middle", fill=COLORS[0])
    # epilogue
    ey = 320
    svg.text(40, ey, "the fused Linear (Tensor::linear -> gemm_wgmma_bf16_fused, rung 12's epilogue): one pass over the output", 12, weight="bold")
    steps = [("TMA loads", "X, W bf16"), ("wgmma", "f32 accumulator"), ("+ bias", "f32"), ("ReLU", "in registers"), ("round once", "store bf16 Y")]
    for i, (a, b) in enumerate(steps):
        box(svg, 40 + i * 185, ey + 16, 160, 44, [a, b], LIGHT[2] if 1 < i < 4 else LIGHT[4], 11)
        if i < 4:
            svg.arrow(202 + i * 185, ey + 38, 223 + i * 185, ey + 38)
    svg.text(40, ey + 86, "unfused: the product, the bias addition and the activation, each reading and writing the whole activation", 10)
    svg.text(40, ey + 102, "elsewhere (CPU, f32, older GPU, other shapes): composed from matmul_t, the bias addition and the activation", 10)
    svg.text(40, ey + 118, "GELU's gradient needs the pre-activation: after a fused product and bias it runs as its own op", 10)
    svg.save("mixed-precision.svg")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    thread_maps()
    tiles()
    fragments()
    swizzle()
    ring_timeline()
    cluster_multicast()
    staged_epilogue()
    tmem_lanes()
    megakernel_stream()
    level0_reduce()
    determinism_chain()
    autograd_tape()
    layers()
    device_library()
    online_softmax()
    mixed_precision()
