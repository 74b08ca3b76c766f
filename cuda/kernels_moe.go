package cuda

import "fmt"

// Launchers of kernels/moe_route.cu: MoE routing and the glue around the
// grouped FP4 expert GEMM (MoEFP4).

// RouterTopK turns gate logits [rows, E] (replaced in place by the scores
// sqrt(softplus(z))) into ids and weights [rows, k]: top-k of score+bias
// (bias != 0), or table[tok[r]] rows of k ids (bias == 0; ids validated by
// the caller). weights = s/max(Σs, 1e-20)·scale.
func RouterTopK(s *Stream, logits DevicePtr, rows, experts, k int, bias, table, tok DevicePtr, scale float32, weights, ids DevicePtr) error {
	if rows < 0 || experts <= 0 || k <= 0 || k > experts || (bias == 0 && (table == 0 || tok == 0)) {
		return fmt.Errorf("cuda: router_topk: bad arguments rows=%d experts=%d k=%d", rows, experts, k)
	}
	if rows == 0 {
		return nil
	}
	a := new(Args).Ptr(logits).I32(rows).I32(experts).I32(k).Ptr(bias).Ptr(table).Ptr(tok).F32(scale).Ptr(weights).Ptr(ids)
	return launch(s, "moe_route", "router_topk", Dim3{uint32(ceilDiv(rows, 128)), 1, 1}, Dim3{128, 1, 1}, 0, a)
}

// MoEPermute sorts the nk (row, slot) pairs of ids [nk] into expert order:
// counts [E] (scratch), offsets [E+1], perm [nk] (pair of every position,
// ascending inside an expert) and inv [nk] (position of every pair; the caller
// fills it with -1 first: pairs with an id outside [0, E) keep -1 and are left
// out, so offsets[E] < nk).
func MoEPermute(s *Stream, ids DevicePtr, nk, experts int, counts, offsets, perm, inv DevicePtr) error {
	if nk < 0 || experts <= 0 || experts > 1<<20 {
		return fmt.Errorf("cuda: moe_permute: bad shape nk=%d experts=%d", nk, experts)
	}
	grid := Dim3{uint32(ceilDiv(experts, 8)), 1, 1}
	a := new(Args).Ptr(ids).I32(nk).I32(experts).Ptr(counts)
	if err := launch(s, "moe_route", "moe_count", grid, Dim3{256, 1, 1}, 0, a); err != nil {
		return err
	}
	b := new(Args).Ptr(ids).I32(nk).I32(experts).Ptr(counts).Ptr(offsets).Ptr(perm).Ptr(inv)
	return launch(s, "moe_route", "moe_scatter", grid, Dim3{256, 1, 1}, 0, b)
}

// MoEGather copies x [*, d] row perm[m]/k into xg [m, d] for m < offsets[E]
// (rows is the capacity of xg).
func MoEGather(s *Stream, xg, x, perm, offsets DevicePtr, experts, k, d, rows int) error {
	if rows < 0 || experts <= 0 || k <= 0 || d <= 0 || rows > 1<<31-1 {
		return fmt.Errorf("cuda: moe_gather: bad shape rows=%d k=%d d=%d", rows, k, d)
	}
	if rows == 0 {
		return nil
	}
	a := new(Args).Ptr(xg).Ptr(x).Ptr(perm).Ptr(offsets).I32(experts).I32(k).I32(d)
	return launch(s, "moe_route", "moe_gather", Dim3{uint32(rows), 1, 1}, Dim3{256, 1, 1}, 0, a)
}

// MoESwiGLU: h [rows, inter] = bf16(w·silu-gate(g)·u) from the bf16 GEMM outputs
// g, u [rows, inter], routing weight weights[perm[m]], clamp limit (<= 0: none).
// gf, uf (optional, both or neither) receive g and u widened to fp32.
func MoESwiGLU(s *Stream, h, g, u, perm, offsets DevicePtr, experts int, weights DevicePtr, rows, inter int, limit float32, gf, uf DevicePtr) error {
	if rows < 0 || experts <= 0 || inter <= 0 || (gf == 0) != (uf == 0) {
		return fmt.Errorf("cuda: moe_swiglu: bad arguments rows=%d inter=%d", rows, inter)
	}
	if rows == 0 {
		return nil
	}
	a := new(Args).Ptr(h).Ptr(g).Ptr(u).Ptr(perm).Ptr(offsets).I32(experts).Ptr(weights).I32(inter).F32(limit).Ptr(gf).Ptr(uf)
	grid := Dim3{uint32(rows), uint32(min(ceilDiv(inter, 256), 64)), 1}
	return launch(s, "moe_route", "moe_swiglu", grid, Dim3{256, 1, 1}, 0, a)
}

// MoECombine: acc [rows, d] = Σ over the k slots of each row, in ascending
// expert id, of the bf16 expert outputs y [*, d] at inv[r*k+slot].
func MoECombine(s *Stream, acc, y, ids, inv DevicePtr, rows, k, d int) error {
	if rows < 0 || k <= 0 || k > 32 || d <= 0 {
		return fmt.Errorf("cuda: moe_combine: bad shape rows=%d k=%d d=%d (k <= 32)", rows, k, d)
	}
	if rows == 0 {
		return nil
	}
	a := new(Args).Ptr(acc).Ptr(y).Ptr(ids).Ptr(inv).I32(k).I32(d)
	return launch(s, "moe_route", "moe_combine", Dim3{uint32(rows), 1, 1}, Dim3{256, 1, 1}, 0, a)
}
