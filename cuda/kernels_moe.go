package cuda

import "fmt"

// Launchers of kernels/moe_route.cu: MoE routing and the glue around the
// grouped FP4 expert GEMM (MoEFP4).

// RouterTopK turns gate logits [rows, E] (replaced in place by the scores
// sqrt(softplus(z))) into ids and weights [rows, k]: top-k of score+bias
// (bias != 0), or table[tok[r]] rows of k ids (bias == 0; ids validated by
// the caller). weights = s/max(Σs, 1e-20)·scale.
func RouterTopK(s *Stream, logits DevicePtr, rows, experts, k int, bias, table, tok DevicePtr, scale float32, weights, ids DevicePtr) error {
	if rows < 0 || experts <= 0 || experts > 1024 || k <= 0 || k > experts || k > 32 || (bias == 0 && (table == 0 || tok == 0)) {
		return fmt.Errorf("cuda: router_topk: bad arguments rows=%d experts=%d k=%d (experts <= 1024, k <= 32)", rows, experts, k)
	}
	if rows == 0 {
		return nil
	}
	a := new(Args).Ptr(logits).I32(rows).I32(experts).I32(k).Ptr(bias).Ptr(table).Ptr(tok).F32(scale).Ptr(weights).Ptr(ids)
	name := "router_topk32"
	switch {
	case experts <= 256:
		name = "router_topk8"
	case experts <= 384:
		name = "router_topk12"
	}
	if rows > 1<<31-1 {
		return fmt.Errorf("cuda: router_topk: %d rows exceed the grid", rows)
	}
	// One block of 256 threads (ROUTER_THREADS) per row.
	return launch(s, "moe_route", name, Dim3{uint32(rows), 1, 1}, Dim3{256, 1, 1}, 0, a)
}

// MoEPermute sorts the nk (row, slot) pairs of ids [nk] into expert order:
// counts [E] (scratch), offsets [E+1], perm [nk] (pair of every position,
// ascending inside an expert) and inv [nk] (position of every pair; -1 for
// pairs with an id outside [0, E), which are left out, so offsets[E] < nk).
func MoEPermute(s *Stream, ids DevicePtr, nk, experts int, counts, offsets, perm, inv DevicePtr) error {
	if nk < 0 || experts <= 0 || experts > 1<<20 {
		return fmt.Errorf("cuda: moe_permute: bad shape nk=%d experts=%d", nk, experts)
	}
	grid := Dim3{uint32(ceilDiv(experts, 8)), 1, 1}
	a := new(Args).Ptr(ids).I32(nk).I32(experts).Ptr(counts).Ptr(inv)
	if err := launch(s, "moe_route", "moe_count", grid, Dim3{256, 1, 1}, 0, a); err != nil {
		return err
	}
	b := new(Args).Ptr(ids).I32(nk).I32(experts).Ptr(counts).Ptr(offsets).Ptr(perm).Ptr(inv)
	return launch(s, "moe_route", "moe_scatter", grid, Dim3{256, 1, 1}, 0, b)
}

// MoECombine: acc [rows, d] = Σ over the k slots of each row, in ascending
// expert id, of the expert outputs y [*, d] (bf16; exact: fp32) at inv[r*k+slot].
func MoECombine(s *Stream, acc, y, ids, inv DevicePtr, rows, k, d int, exact bool) error {
	return moeCombine(s, acc, y, ids, inv, 0, rows, k, d, exact, false, nil)
}

// MoECombineShared is MoECombine followed by AddF32(out, acc, shared, rnd)
// in one launch (the same bits): out [rows, d] = rbf(Σ + shared) with the
// shared expert's output shared fp32 [rows, d].
func MoECombineShared(s *Stream, out, y, ids, inv, shared DevicePtr, rows, k, d int, exact, rnd bool) error {
	if shared == 0 {
		return fmt.Errorf("cuda: moe_combine: no shared expert output")
	}
	return moeCombine(s, out, y, ids, inv, shared, rows, k, d, exact, rnd, nil)
}

// MoEHcPost is the hc post after the MoE (spec §4.2) of MoECombineSharedPost:
// the streams X [rows, N*D] updated in place with the rows' Mix [rows, N+N*N].
type MoEHcPost struct {
	X, Mix DevicePtr
	N      int // streams: 1, 2, 4 or 8
}

// MoECombineSharedPost is MoECombineShared followed by HcPostF32(post.X,
// post.X, out, post.Mix, rows, post.N, d, rnd) in one launch (the same bits).
func MoECombineSharedPost(s *Stream, out, y, ids, inv, shared DevicePtr, rows, k, d int, exact, rnd bool, post MoEHcPost) error {
	if shared == 0 || post.X == 0 || post.Mix == 0 || !hcStreams(post.N) {
		return fmt.Errorf("cuda: moe_combine_post: shared %#x, streams %#x, mix %#x, %d streams (want 1, 2, 4 or 8)",
			uint64(shared), uint64(post.X), uint64(post.Mix), post.N)
	}
	return moeCombine(s, out, y, ids, inv, shared, rows, k, d, exact, rnd, &post)
}

func moeCombine(s *Stream, acc, y, ids, inv, shared DevicePtr, rows, k, d int, exact, rnd bool, post *MoEHcPost) error {
	if rows < 0 || k <= 0 || k > 32 || d <= 0 {
		return fmt.Errorf("cuda: moe_combine: bad shape rows=%d k=%d d=%d (k <= 32)", rows, k, d)
	}
	if rows == 0 {
		return nil
	}
	// One block per (row, 512 values): d is split over blocks so a decode
	// row (rows = 1) is not a single latency-bound block.
	const chunk = 512 // COMBINE_CHUNK of moe_route.cu
	if rows > 1<<31-1 || ceilDiv(d, chunk) > 65535 {
		return fmt.Errorf("cuda: moe_combine: shape rows=%d d=%d exceeds the grid", rows, d)
	}
	a := new(Args).Ptr(acc).Ptr(y).Ptr(ids).Ptr(inv).I32(k).I32(d).I32(b2i(exact)).Ptr(shared).I32(b2i(rnd))
	name := "moe_combine"
	if post != nil {
		a.Ptr(post.X).Ptr(post.Mix)
		name = fmt.Sprintf("moe_combine_post_n%d", post.N)
	}
	return launch(s, "moe_route", name, Dim3{uint32(rows), uint32(ceilDiv(d, chunk)), 1}, Dim3{128, 1, 1}, 0, a)
}

// MoELinearF32 is the exact-mode grouped expert linear: for every expert e and
// row m in [offsets[e], offsets[e+1]), y[m, :] = x[m, :] · W_eᵀ in fp32 with
// the FP4 weights of MoEFP4 (w [E][N][K/2], wscale [E][N][K/blk], gscale fp32
// [E] for NVFP4) dequantised exactly on chip. rows bounds offsets[E].
func MoELinearF32(s *Stream, y, x, offsets, w, wscale, gscale DevicePtr, sh MoEShape) error {
	if sh.Experts <= 0 || sh.Experts > 65535 || sh.Rows < 0 || sh.N <= 0 || sh.K <= 0 || sh.K%32 != 0 {
		return fmt.Errorf("cuda: moe_linear_f32: bad shape %+v (K %% 32 == 0)", sh)
	}
	if sh.Rows == 0 {
		return nil
	}
	fmtID, blk := WeightMXFP4, 32
	if sh.Format == NVFP4 {
		if gscale == 0 {
			return fmt.Errorf("cuda: moe_linear_f32: NVFP4 needs gscale")
		}
		fmtID, blk = WeightNVFP4, 16
	} else {
		gscale = 0
	}
	if ceilDiv(sh.Rows, 64) > 65535 || ceilDiv(sh.N, 64) > 65535 {
		return fmt.Errorf("cuda: moe_linear_f32: shape %+v exceeds the grid", sh)
	}
	sCols := sh.K / blk
	a := new(Args).Ptr(y).Ptr(x).Ptr(offsets).Ptr(w).Ptr(wscale).Ptr(gscale).I32(int(fmtID)).
		I64(int64(sh.N * sh.K / 2)).I64(int64(sh.N * sCols)).I32(sCols).I32(sh.N).I32(sh.K)
	grid := Dim3{uint32(ceilDiv(sh.N, 64)), uint32(ceilDiv(sh.Rows, 64)), uint32(sh.Experts)}
	return launch(s, "linear_f32", "moe_linear_f32", grid, Dim3{256, 1, 1}, 0, a)
}
