#!/usr/bin/env python3
"""Draws the guide's figures as SVG into guide/src/figures/.

    python3 guide/figures-src/figures.py

Standard library only. The layouts come from the code: the thread maps of rungs 1 and 2 and the
warp tile of rung 7 from gpu/src/kernels/gemm/sgemm.rs, the mma.sync fragments from the
(host-tested) layout functions of gpu/src/mma.rs, the swizzle from gpu/src/swizzle.rs. The plots
read run 13's table at the top of benches/results/gemm.md (H200, 2026-11-21). The peaks are those
of guide/src/hardware.md.
"""

import math
import os
import re
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "guide", "src", "figures")

FP32_PEAK = 66.9  # TFLOP/s, H100/H200 SXM FP32 non-tensor
BF16_PEAK = 989.4  # TFLOP/s, H100/H200 SXM bf16 dense tensor core
H200_BW = 4.8  # TB/s

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
            f'<text x="{x:.1f}" y="{y:.1f}" {FONT} font-size="{size}" text-anchor="{anchor}" '
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


# (e) plots from benches/results/gemm.md (run 13) -------------------------------------------------


def run13():
    text = open(os.path.join(ROOT, "benches", "results", "gemm.md")).read()
    first = text.split("\n## ")[0]  # run 13's table: the file's first section
    rows = []
    for line in first.splitlines():
        m = re.match(r"\| (\d+) x (\d+) x (\d+) \| (\S+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", line)
        if m:
            rows.append(((int(m[1]), int(m[2]), int(m[3])), m[4], float(m[5]), float(m[6])))
    return rows


FP32_RUNGS = [
    ("3", "sgemm_smem", "smem"),
    ("4", "sgemm_tile1d_64x64x8_8", "tile1d"),
    ("5", "sgemm_tile2d_64x64x8_4x4", "tile2d 4x4"),
    ("6", "sgemm_vec_128x128x8_8x8", "vec 8x8"),
    ("7", "sgemm_warptile_128x128x16", "warptile, 1st"),
    ("7", "sgemm_warptile_128x256x8_8x16_db", "128x256 db"),
    ("13", "sgemm_warptile_128x256x8_8x16_db_tn", "128x256 db, TN"),
]
# In run 13, gemm_wgmma_bf16_persistent was rung 11's kernel (register-store epilogue); the staged
# epilogue of rung 12 came in runs 15-16 under the same name.
TC_RUNGS = [
    ("8", "hgemm_mma_bf16", "mma.sync"),
    ("9", "gemm_wgmma_bf16", "wgmma"),
    ("10", "gemm_wgmma_bf16_wide", "wgmma wide"),
    ("11", "gemm_wgmma_bf16_persistent", "persistent"),
]


def ladder_plot():
    rows = run13()
    shape = (4096, 4096, 4096)
    at = {(s, k): (t, c) for s, k, t, c in rows}
    svg = Svg(980, 470)
    svg.text(490, 22, "The ladder at 4096^3 against cuBLAS and the hardware peak (H200, run 13, 2026-11-21)", 14, "middle", weight="bold")
    for panel, (title, rungs, peak, top, step, cublas_name) in enumerate([
        ("FP32 rungs (CUDA cores) vs cuBLAS SGEMM, TF32 off", FP32_RUNGS, FP32_PEAK, 70, 10, "FP32"),
        ("tensor-core rungs, bf16 in, f32 out, vs cuBLAS GemmEx", TC_RUNGS, BF16_PEAK, 1000, 100, "bf16"),
    ]):
        ox, oy, w, h = 70 + panel * 490, 60, 400, 320
        svg.text(ox + w / 2, oy - 8, title, 11.5, "middle", weight="bold")
        y = lambda v: oy + h - v / top * h
        for v in range(0, top + 1, step):
            svg.line(ox, y(v), ox + w, y(v), "#ddd", 0.8)
            svg.text(ox - 5, y(v) + 4, str(v), 10, "end")
        svg.text(ox - 42, oy + h / 2, "TFLOP/s", 11, "middle", extra=f'transform="rotate(-90 {ox - 42} {oy + h / 2})"')
        bw = w / len(rungs)
        cub = None
        for i, (rung, name, short) in enumerate(rungs):
            t, c = at[(shape, name)]
            cub = c
            x = ox + i * bw + bw * 0.15
            svg.rect(x, y(t), bw * 0.7, y(0) - y(t), COLORS[0] if panel == 0 else COLORS[2], "none", 0)
            svg.text(x + bw * 0.35, y(t) - 4, f"{t:g}", 10, "middle")
            svg.text(x + bw * 0.35, oy + h + 14, f"rung {rung}", 10, "middle")
            svg.text(x + bw * 0.35, oy + h + 27 + 11 * (i % 2), short, 9, "middle", fill="#555")
        svg.line(ox, y(peak), ox + w, y(peak), COLORS[3], 2)
        svg.text(ox + w - 4, y(peak) + 14, f"{cublas_name} peak {peak} TFLOP/s", 10.5, "end", fill=COLORS[3])
        svg.line(ox, y(cub), ox + w, y(cub), "#000", 1.5, 'stroke-dasharray="6,4"')
        svg.text(ox + 2, y(cub) - 5, f"cuBLAS {cub:g}", 10.5, fill="#000")
        svg.rect(ox, oy, w, h, "none", "#000", 1)
    svg.text(490, 440, "Data: the first table of benches/results/gemm.md (one run; cuBLAS measured first in the same process). Later runs moved some", 10.5, "middle")
    svg.text(490, 455, "rungs (the staged epilogue of rung 12 reached 757-763 TFLOP/s); the chapters give those. Peaks: guide/src/hardware.md.", 10.5, "middle")
    svg.save("ladder-4096.svg")


def roofline():
    rows = run13()
    shape = (4096, 4096, 4096)
    at = {(s, k): t for s, k, t, c in rows}
    svg = Svg(820, 520)
    svg.text(410, 22, "Roofline of the H200 (4.8 TB/s) with the ladder at 4096^3 (run 13)", 14, "middle", weight="bold")
    ox, oy, w, h = 80, 50, 680, 380
    xmin, xmax, ymin, ymax = -1, 4, -1, math.log10(3000)  # log10 of FLOP/byte and TFLOP/s
    X = lambda v: ox + (math.log10(v) - xmin) / (xmax - xmin) * w
    Y = lambda v: oy + h - (math.log10(v) - ymin) / (ymax - ymin) * h
    for e in range(xmin, xmax + 1):
        svg.line(X(10**e), oy, X(10**e), oy + h, "#ddd", 0.8)
        svg.text(X(10**e), oy + h + 15, f"{10**e:g}", 10, "middle")
    for e in range(ymin, 4):
        svg.line(ox, Y(10**e), ox + w, Y(10**e), "#ddd", 0.8)
        svg.text(ox - 5, Y(10**e) + 4, f"{10**e:g}", 10, "end")
    svg.text(ox + w / 2, oy + h + 34, "arithmetic intensity (FLOP per byte of DRAM traffic)", 11, "middle")
    svg.text(ox - 45, oy + h / 2, "TFLOP/s", 11, "middle", extra=f'transform="rotate(-90 {ox - 45} {oy + h / 2})"')
    for peak, col, name in [(FP32_PEAK, COLORS[0], "FP32"), (BF16_PEAK, COLORS[2], "bf16 dense")]:
        ridge = peak / H200_BW
        svg.line(X(0.1), Y(0.1 * H200_BW), X(ridge), Y(peak), col, 2)
        svg.line(X(ridge), Y(peak), X(10**xmax), Y(peak), col, 2)
        svg.line(X(ridge), Y(peak), X(ridge), oy + h, col, 1, 'stroke-dasharray="3,3"')
        svg.text(X(10**xmax) - 4, Y(peak) - 6, f"{name} peak {peak}", 10.5, "end", fill=col)
        svg.text(X(ridge) + 4, oy + h - 6, f"ridge {ridge:.1f}", 10, fill=col)
    svg.text(X(0.5), Y(0.5 * H200_BW) - 10, "HBM 4.8 TB/s", 10.5, extra=f'transform="rotate(-{math.degrees(math.atan(h / (ymax - ymin) / (w / (xmax - xmin)))):.1f} {X(0.5):.1f} {Y(0.5 * H200_BW) - 10:.1f})"')
    # ideal intensities at 4096^3: f32 operands n/6, bf16 in + f32 out n/4
    n = 4096
    for ai, rungs, col in [(n / 6, FP32_RUNGS, COLORS[0]), (n / 4, TC_RUNGS, COLORS[2])]:
        pts = sorted(((at[(shape, name)], rung) for rung, name, _ in rungs), reverse=True)
        last = -1e9
        for t, rung in pts:
            svg.circle(X(ai), Y(t), 4, col)
            # labels in a column to the left, at least 12 px apart, with a leader line
            ly = max(Y(t), last + 12)
            last = ly
            svg.line(X(ai) - 5, Y(t), X(ai) - 40, ly, "#999", 0.6)
            svg.text(X(ai) - 43, ly + 4, f"rung {rung}: {t:g}", 9.5, "end")
    svg.rect(ox, oy, w, h, "none", "#000", 1)
    notes = [
        "Points: each rung's TFLOP/s (numbered by rung) at the intensity of an ideal GEMM (each matrix through DRAM once): n/6 = 683 FLOP/byte",
        "for f32 operands, n/4 = 1,024 for bf16 inputs and f32 output. Both are right of the ridges, so the distance to the roof is the kernel's.",
    ]
    for i, s in enumerate(notes):
        svg.text(40, 490 + i * 15, s, 10.5)
    svg.save("roofline.svg")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    thread_maps()
    tiles()
    fragments()
    swizzle()
    ladder_plot()
    roofline()
