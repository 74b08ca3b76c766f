package cuda

import "testing"

// TestPlanAttn: the sparse attention paths planAttn picks for Flash and Pro
// decode shapes on an H100-sized sm_90 device and on an sm_80 one (no
// clusters), short contexts (few keys can hold an entry), the forced paths, and that every split plan fits the kernels'
// limits (AT_SMAX splits, a counter per (row, head group)).
func TestPlanAttn(t *testing.T) {
	const W = 128
	h100 := &Device{SMs: 132, Major: 9}
	a100 := &Device{SMs: 108, Major: 8}
	swa := func(rows, heads int) AttnShape { return AttnShape{Rows: rows, Heads: heads, D: 512, Window: W} }
	csa := func(rows, heads, topk int) AttnShape {
		return AttnShape{Rows: rows, Heads: heads, D: 512, Window: W, Ratio: 4, SelCols: topk, MaxKeys: W + topk}
	}
	hca := func(rows, heads, ctx int) AttnShape {
		return AttnShape{Rows: rows, Heads: heads, D: 512, Window: W, Ratio: 128, MaxKeys: W + ctx/128}
	}
	live := func(sh AttnShape, keys int) AttnShape { sh.LiveKeys = keys; return sh }
	for _, c := range []struct {
		name   string
		dev    *Device
		force  KernelChoice
		sh     AttnShape
		path   Path
		splits int
	}{
		{"flash batch 1 swa", h100, KernelChoice{}, swa(1, 64), PathAttnCluster, 0},
		{"flash batch 1 csa at 40 tokens", h100, KernelChoice{}, live(csa(1, 64, 512), 40+10), PathAttnRow, 0},
		{"flash batch 1 csa at 100 tokens", h100, KernelChoice{}, live(csa(1, 64, 512), 100+25), PathAttnSplit, 10},
		{"flash batch 1 csa at 128 tokens", h100, KernelChoice{}, live(csa(1, 64, 512), 128+32), PathAttnSplit, 10},
		{"flash batch 1 hca at 40 tokens", h100, KernelChoice{}, live(hca(1, 64, 40), 40), PathAttnRow, 0},
		{"flash batch 1 csa", h100, KernelChoice{}, csa(1, 64, 512), PathAttnSplit, 10},
		{"flash batch 1 hca 4K", h100, KernelChoice{}, hca(1, 64, 4096), PathAttnCluster, 0},
		{"flash batch 1 hca 128K", h100, KernelChoice{}, hca(1, 64, 131072), PathAttnSplit, 18},
		{"flash batch 1 hca 1M", h100, KernelChoice{}, hca(1, 64, 1<<20), PathAttnSplit, 33},
		{"flash batch 8 swa", h100, KernelChoice{}, swa(8, 64), PathAttnSplit, 2},
		{"flash batch 8 hca 4K", h100, KernelChoice{}, hca(8, 64, 4096), PathAttnSplit, 3},
		{"flash batch 8 csa", h100, KernelChoice{}, csa(8, 64, 512), PathAttnSplit, 4},
		{"flash batch 16 csa", h100, KernelChoice{}, csa(16, 64, 512), PathAttnSplit, 2},
		{"flash batch 17 csa", h100, KernelChoice{}, csa(17, 64, 512), PathAttnRow, 0},
		{"pro batch 1 csa", h100, KernelChoice{}, csa(1, 128, 1024), PathAttnSplit, 16},
		{"pro batch 8 csa", h100, KernelChoice{}, csa(8, 128, 1024), PathAttnSplit, 2},
		{"window of one block", h100, KernelChoice{}, AttnShape{Rows: 1, Heads: 64, D: 512, Window: 64}, PathAttnRow, 0},
		{"a100 batch 1 swa", a100, KernelChoice{}, swa(1, 64), PathAttnSplit, 2},
		{"a100 batch 1 hca 4K", a100, KernelChoice{}, hca(1, 64, 4096), PathAttnSplit, 3},
		{"a100 batch 1 hca 1M", a100, KernelChoice{}, hca(1, 64, 1<<20), PathAttnSplit, 27},
		{"forced row", h100, KernelChoice{Attn: PathAttnRow}, csa(1, 64, 512), PathAttnRow, 0},
		{"forced cluster", h100, KernelChoice{Attn: PathAttnCluster}, csa(64, 64, 512), PathAttnCluster, 0},
		{"forced split", h100, KernelChoice{Attn: PathAttnSplit}, csa(64, 64, 512), PathAttnSplit, 1},
		{"forced 64 splits", h100, KernelChoice{Attn: PathAttnSplit, AttnSplits: 64}, swa(1, 64), PathAttnSplit, 64},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := &Context{dev: c.dev, choice: c.force}
			p, err := ctx.planAttn(c.sh)
			if err != nil {
				t.Fatal(err)
			}
			if p.path != c.path || p.splits != c.splits {
				t.Errorf("planAttn(%+v) = %+v, want %s with %d splits", c.sh, p, c.path, c.splits)
			}
			if p.path == PathAttnSplit && (p.splits < 1 || p.splits > attnMaxSplits || c.sh.Rows*ceilDiv(c.sh.Heads, attnHeads) > ctx.fixupSlots()) {
				t.Errorf("split plan %+v outside the kernel's limits", p)
			}
		})
	}
	for _, c := range []struct {
		name  string
		dev   *Device
		force KernelChoice
		sh    AttnShape
	}{
		{"cluster on sm_80", a100, KernelChoice{Attn: PathAttnCluster}, swa(1, 64)},
		{"split past the counters", h100, KernelChoice{Attn: PathAttnSplit}, swa(200, 64)},
	} {
		if _, err := (&Context{dev: c.dev, choice: c.force}).planAttn(c.sh); err == nil {
			t.Errorf("%s: planAttn accepted %+v", c.name, c.sh)
		}
	}
}

// TestAttnKernelChoice: SetKernelChoice refuses unknown attention paths and
// split counts outside 1..64 or without the split path.
func TestAttnKernelChoice(t *testing.T) {
	for _, k := range []KernelChoice{
		{Attn: "clusters"}, {Attn: PathAttnSplit, AttnSplits: attnMaxSplits + 1}, {Attn: PathAttnSplit, AttnSplits: -1},
		{Attn: PathAttnRow, AttnSplits: 4}, {AttnSplits: 2},
	} {
		if err := (&Context{}).SetKernelChoice(k); err == nil {
			t.Errorf("SetKernelChoice(%+v) accepted", k)
		}
	}
	for _, k := range []KernelChoice{{}, {Attn: PathAttnRow}, {Attn: PathAttnCluster}, {Attn: PathAttnSplit, AttnSplits: attnMaxSplits}} {
		if err := (&Context{}).SetKernelChoice(k); err != nil {
			t.Errorf("SetKernelChoice(%+v): %v", k, err)
		}
	}
}
