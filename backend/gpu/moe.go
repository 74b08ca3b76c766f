package gpu

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/cuda"
)

// proj is one projection of all experts stacked for the grouped FP4 GEMM:
// w [E][N][K/2], scales [E][N][K/blk], gscale fp32 [E] (NVFP4 only).
type proj struct {
	w, scale, gscale *cuda.Buffer
	n, k             int
}

// experts are the routed experts of one layer, all MXFP4 or all NVFP4. w13
// stacks w1 over w3 per expert ([E][2·inter][K/2]) so that gate and up run
// as one GEMM; it needs one global scale per expert, so NVFP4 experts whose
// w1 and w3 scales differ keep w1 and w3 apart (w13 unset).
type experts struct {
	count, dim, inter int
	format            cuda.FP4Format
	w1, w2, w3, w13   proj
}

func (e *experts) Count() int { return e.count }
func (e *experts) Inter() int { return e.inter }
func (e *experts) Dim() int   { return e.dim }

// PrepareExperts implements backend.Backend: validation as the CPU's, then
// every projection is stacked into one device array per kind.
func (b *Backend) PrepareExperts(name string, ex []checkpoint.Expert, dim, inter int) (backend.Experts, error) {
	if len(ex) == 0 {
		return nil, fmt.Errorf("%s: no experts", name)
	}
	for i := range ex {
		if err := backend.CheckPrepareExpert(name, i, &ex[i], dim, inter); err != nil {
			return nil, err
		}
		for _, cl := range []*checkpoint.Linear{&ex[i].W1, &ex[i].W2, &ex[i].W3} {
			if cl.Format != ex[0].W1.Format {
				return nil, fmt.Errorf("%s expert %d: %s is %v, expert 0 w1 %v (one format per layer)", name, i, cl.Name, cl.Format, ex[0].W1.Format)
			}
		}
	}
	e := &experts{count: len(ex), dim: dim, inter: inter}
	switch f := ex[0].W1.Format; f {
	case checkpoint.FormatMXFP4:
		e.format = cuda.MXFP4
	case checkpoint.FormatNVFP4:
		e.format = cuda.NVFP4
	default:
		return nil, fmt.Errorf("%s: gpu experts: format %v not supported; FP4 experts only", name, f)
	}
	if dim%128 != 0 || inter%128 != 0 {
		return nil, fmt.Errorf("%s: gpu experts: dim %d and inter %d must be multiples of 128", name, dim, inter)
	}
	// Projections by their linears (0 w1, 1 w2, 2 w3) stacked per expert.
	type stacking struct {
		p     *proj
		which []int
	}
	stacks := []stacking{{&e.w13, []int{0, 2}}, {&e.w2, []int{1}}}
	if !sameGlobalScales(ex) {
		stacks = []stacking{{&e.w1, []int{0}}, {&e.w2, []int{1}}, {&e.w3, []int{2}}}
	}
	for _, st := range stacks {
		var err error
		if *st.p, err = b.stack(ex, st.which, e.format); err != nil {
			e.free()
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return e, nil
}

// sameGlobalScales reports whether every expert's w1 and w3 share their
// global scale (always so for MXFP4, whose Scale2 is unused).
func sameGlobalScales(ex []checkpoint.Expert) bool {
	for i := range ex {
		if ex[i].W1.Format == checkpoint.FormatNVFP4 && ex[i].W1.Scale2 != ex[i].W3.Scale2 {
			return false
		}
	}
	return true
}

func (e *experts) free() {
	for _, p := range []*proj{&e.w1, &e.w2, &e.w3, &e.w13} {
		for _, buf := range []*cuda.Buffer{p.w, p.scale, p.gscale} {
			if buf != nil {
				buf.Free()
			}
		}
	}
}

// stack uploads one projection of every expert into contiguous arrays:
// per expert the rows of its linears `which` (0 w1, 1 w2, 2 w3) one after
// the other; the global scale is the first's.
func (b *Backend) stack(ex []checkpoint.Expert, which []int, f cuda.FP4Format) (proj, error) {
	pick := func(x *checkpoint.Expert, j int) *checkpoint.Linear {
		return [...]*checkpoint.Linear{&x.W1, &x.W2, &x.W3}[which[j]]
	}
	l0, per := pick(&ex[0], 0), len(which)
	p := proj{n: l0.Out * per, k: l0.In}
	wn, sn := len(l0.Weight.Data), len(l0.Scale.Data)
	var err error
	if p.w, err = b.ctx.Alloc(len(ex) * per * wn); err != nil {
		return p, err
	}
	if p.scale, err = b.ctx.Alloc(len(ex) * per * sn); err != nil {
		return p, err
	}
	g := make([]float32, len(ex))
	for i := range ex {
		for j := range per {
			l, at := pick(&ex[i], j), i*per+j
			if err := b.s.CopyHtoD(p.w.Ptr.Add(at*wn), l.Weight.Data); err != nil {
				return p, fmt.Errorf("upload %s: %w", l.Name, err)
			}
			if err := b.s.CopyHtoD(p.scale.Ptr.Add(at*sn), l.Scale.Data); err != nil {
				return p, fmt.Errorf("upload %s scale: %w", l.Name, err)
			}
			if j == 0 {
				g[i] = l.Scale2
			}
		}
	}
	if f == cuda.NVFP4 {
		if p.gscale, err = b.upload(cuda.Bytes(g)); err != nil {
			return p, err
		}
	}
	return p, nil
}

// Router implements backend.Backend (spec §6.1): fp32 gate logits, then one
// thread per row for scores, top-k (or the hash table) and weights.
func (b *Backend) Router(f backend.Tensor, gate backend.Linear, a backend.RouterArgs, weights, ids backend.Tensor) error {
	g, t, err := backend.Args[*linear, *Tensor](backend.CheckRouter(f, gate, a, weights, ids), "router", gate, f, weights, ids)
	if err != nil {
		return err
	}
	ft, wt, it, n, E, K := t[0], t[1], t[2], f.Rows(), g.out, a.TopK
	var bias, table, tok cuda.DevicePtr
	if a.Bias != nil {
		bv, ok := a.Bias.(*vec)
		if !ok {
			return fmt.Errorf("router: bias %T", a.Bias)
		}
		bias = bv.buf.Ptr
	}
	if a.Tid2Eid != nil {
		tb, ok := a.Tid2Eid.(*idTable)
		if !ok {
			return fmt.Errorf("router: tid2eid %T", a.Tid2Eid)
		}
		if int(tb.maxV) >= E {
			return fmt.Errorf("router: tid2eid holds expert %d of %d", tb.maxV, E)
		}
		bias, table = 0, tb.buf.Ptr // the table wins over a bias, as on the CPU
	}
	if n == 0 {
		return nil
	}
	tmp, err := b.scratch(4*n*E + 4*n)
	if err != nil {
		return fmt.Errorf("router: %w", err)
	}
	defer tmp.Free()
	logits := tmp.Ptr
	if table != 0 {
		if tok = b.recordedIDs(a.IDs); tok == 0 {
			if b.rec != nil {
				return fmt.Errorf("router: %w", errHostInRecording)
			}
			tok = logits.Add(4 * n * E)
			if err := b.s.CopyHtoD(tok, cuda.Bytes(a.IDs)); err != nil {
				return fmt.Errorf("router: %w", err)
			}
		}
	}
	if err := b.linearF32(logits, ft.ptr, g, n); err != nil {
		return fmt.Errorf("router: %w", err)
	}
	return cuda.RouterTopK(b.s, logits, n, E, K, bias, table, tok, a.Scale, wt.ptr, it.ptr)
}

// Experts implements backend.Backend (spec §6.2–§6.3). Faithful: the (row,
// slot) pairs are sorted into expert order on the device, the gathered rows
// FP8-quantised, w1/w3 run as grouped FP4 GEMMs (bf16 out), the weighted
// SwiGLU is rounded to bf16 and re-quantised for w2 (on sm_100a in the w1/w3
// GEMM's epilogue, MoEGateUpSwiGLU), and every row sums its
// bf16 expert outputs in ascending expert id (fp32, as the CPU). Exact: the
// same steps in fp32 with the weights dequantised exactly (MoELinearF32),
// no activation quantisation and no rounding.
// Expert ids outside [0, E) are reported only with a.Trace (the check needs a
// download); otherwise such pairs contribute nothing.
func (b *Backend) Experts(f backend.Tensor, e backend.Experts, weights, ids backend.Tensor, a backend.ExpertsArgs, acc backend.Tensor) error {
	return b.experts(f, e, weights, ids, a, acc, nil, nil)
}

// ExpertsCombine implements backend.Backend: Experts whose moe_combine
// also adds the shared expert's output as Combine does, into out.
func (b *Backend) ExpertsCombine(f backend.Tensor, e backend.Experts, weights, ids backend.Tensor, a backend.ExpertsArgs, shared, out backend.Tensor) error {
	if shared == nil {
		return fmt.Errorf("experts: no shared expert output")
	}
	return b.experts(f, e, weights, ids, a, out, shared, nil)
}

// ExpertsCombinePost implements backend.Backend: the hc post runs in the
// combine's launch where its streams are unrolled (1, 2, 4 or 8), else (and
// with SetSplitFused) as its own op after it.
func (b *Backend) ExpertsCombinePost(f backend.Tensor, e backend.Experts, weights, ids backend.Tensor, a backend.ExpertsArgs, shared, out, x, mix backend.Tensor, h backend.HcArgs) error {
	if shared == nil {
		return fmt.Errorf("experts: no shared expert output")
	}
	t, err := backend.Tensors[*Tensor](backend.CheckHcPost(out, x, mix, h, x), "experts hc post", x, mix)
	if err != nil {
		return err
	}
	if b.split || !cuda.HcStreamsUnrolled(h.Streams) {
		if err := b.experts(f, e, weights, ids, a, out, shared, nil); err != nil {
			return err
		}
		return b.HcPost(out, x, mix, h, x)
	}
	return b.experts(f, e, weights, ids, a, out, shared, &cuda.MoEHcPost{X: t[0].ptr, Mix: t[1].ptr, N: h.Streams})
}

// experts runs the routed experts into acc, or with shared into acc =
// rbf(Σ + shared), and with post (and shared) also its hc post.
func (b *Backend) experts(f backend.Tensor, e backend.Experts, weights, ids backend.Tensor, a backend.ExpertsArgs, acc, shared backend.Tensor, post *cuda.MoEHcPost) error {
	ex, t, err := backend.Args[*experts, *Tensor](backend.CheckExperts(f, e, weights, ids, a, acc), "experts", e, f, weights, ids, acc)
	if err != nil {
		return err
	}
	ft, wt, it, at := t[0], t[1], t[2], t[3]
	n, K := ft.rows, it.cols
	var sp cuda.DevicePtr
	if shared != nil {
		st, err := f32(shared, n, ex.dim, "experts shared expert")
		if err != nil {
			return err
		}
		sp = st.ptr
	}
	if n == 0 {
		return nil
	}
	E, d, I, nk := ex.count, ex.dim, ex.inter, n*K
	exact := !b.faithful()
	lids, idBuf, err := b.localIDs(it.ptr, nk, E, a)
	if err != nil {
		return err
	}
	if idBuf != nil {
		defer idBuf.Free()
	}
	var bufs []*cuda.Buffer
	defer func() {
		for _, buf := range bufs {
			buf.Free()
		}
	}()
	alloc := func(bytes int) cuda.DevicePtr {
		if err != nil || bytes == 0 {
			return 0
		}
		var buf *cuda.Buffer
		if buf, err = b.scratch(bytes); err == nil {
			bufs = append(bufs, buf)
			return buf.Ptr
		}
		return 0
	}
	// GEMM outputs: gate and up in one buffer (fused w13: [nk][2I], u at
	// column I; apart: g then u), then w2's y; bf16, exact fp32. The fp32
	// stage copies (xg, gf, uf, h, yf) exist for the tracer and exact mode.
	eb := 2
	if exact {
		eb = 4
	}
	// On sm_100a the w1/w3 GEMM's epilogue writes h for w2 itself: no g, u.
	fused := !exact && !a.Trace && b.s.MoEGateUpFused(cuda.MoEShape{Experts: E, Rows: nk, N: I, K: d, Format: ex.format})
	guBytes := eb * nk * 2 * I
	if fused {
		guBytes = 0
	}
	counts, offsets, perm, inv := alloc(4*E), alloc(4*(E+1)), alloc(4*nk), alloc(4*nk)
	gu, y := alloc(guBytes), alloc(eb*nk*d)
	var xq, xs, hq, hs, tiles, xg, h, gf, uf, yf cuda.DevicePtr
	if exact || a.Trace {
		xg, h = alloc(4*nk*d), alloc(4*nk*I)
	}
	if a.Trace {
		gf, uf = alloc(4*nk*I), alloc(4*nk*I)
		yf = y
		if !exact {
			yf = alloc(4 * nk * d)
		}
	}
	if !exact {
		xq, xs, hq, hs = alloc(nk*d), alloc(nk*d/128), alloc(nk*I), alloc(nk*I/128)
		var sb int // one scratch serves every projection
		for _, p := range []*proj{&ex.w13, &ex.w1, &ex.w2} {
			if p.w != nil {
				sb = max(sb, cuda.MoEScratchBytes(b.s, cuda.MoEShape{Experts: E, Rows: nk, N: p.n, K: p.k, Format: ex.format}))
			}
		}
		tiles = alloc(sb)
	}
	if err != nil {
		return fmt.Errorf("experts: %w", err)
	}
	g, u, ld := gu, gu.Add(eb*I), 2*I
	if ex.w13.w == nil {
		u, ld = gu.Add(eb*nk*I), I
	}
	var tl cuda.MoETileList
	gemm := func(out, q, s cuda.DevicePtr, p *proj) error {
		sh := cuda.MoEShape{Experts: E, Rows: nk, N: p.n, K: p.k, Format: ex.format}
		var gs cuda.DevicePtr
		if p.gscale != nil {
			gs = p.gscale.Ptr
		}
		if exact {
			return cuda.MoELinearF32(b.s, out, q, offsets, p.w.Ptr, p.scale.Ptr, gs, sh)
		}
		return cuda.MoEFP4Tiles(b.s, out, q, s, p.w.Ptr, p.scale.Ptr, gs, sh, tiles, tl)
	}
	x1, s1, x2, s2 := xq, xs, hq, hs // GEMM inputs: codes and scales, exact fp32
	if exact {
		x1, x2 = xg, h
	}
	// Permutation, gathered rows and tile list: one launch at decode sizes.
	steps := []func() error{func() (err error) {
		tl, err = cuda.MoERoute(b.s, cuda.MoERouteArgs{IDs: lids, Pairs: nk, Experts: E, Counts: counts, Offsets: offsets, Perm: perm, Inv: inv,
			Tiles: tiles, Shape: cuda.MoEShape{Experts: E, Rows: nk, N: ex.w2.n, K: ex.w2.k, Format: ex.format},
			XQ: xq, XS: xs, XG: xg, X: ft.ptr, K: K, D: d})
		return err
	}}
	switch {
	case fused:
		steps = append(steps, func() error {
			return cuda.MoEGateUpSwiGLU(b.s, ex.gateUpArgs(hq, hs, xq, xs, perm, wt.ptr, nk, a.Limit, tiles, tl))
		})
	case ex.w13.w != nil:
		steps = append(steps, func() error { return gemm(gu, x1, s1, &ex.w13) })
	default:
		steps = append(steps,
			func() error { return gemm(g, x1, s1, &ex.w1) },
			func() error { return gemm(u, x1, s1, &ex.w3) })
	}
	if !fused {
		steps = append(steps, func() error {
			return cuda.MoESwiGLUQuant(b.s, cuda.MoESwiGLUArgs{HQ: hq, HS: hs, H: h, G: g, U: u, LD: ld, Perm: perm, Offsets: offsets,
				Weights: wt.ptr, GF: gf, UF: uf, Experts: E, Rows: nk, Inter: I, Limit: a.Limit, Exact: exact})
		})
	}
	steps = append(steps, func() error { return gemm(y, x2, s2, &ex.w2) })
	if a.Trace && !exact {
		steps = append(steps, func() error { return cuda.BF16ToF32(b.s, yf, y, int64(nk*d)) })
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return fmt.Errorf("experts: %w", err)
		}
	}
	if a.Trace {
		if err := b.traceExperts(E, K, nk, d, I, offsets, perm, xg, gf, uf, h, yf, a.Partial); err != nil {
			return err
		}
	}
	if sp != 0 {
		// shared may come from the open fork (Fork): the
		// routed experts above ran beside it.
		if err := b.Join(); err != nil {
			return fmt.Errorf("experts: %w", err)
		}
		if post != nil {
			err = cuda.MoECombineSharedPost(b.s, at.ptr, y, lids, inv, sp, n, K, d, exact, b.faithful(), *post)
		} else {
			err = cuda.MoECombineShared(b.s, at.ptr, y, lids, inv, sp, n, K, d, exact, b.faithful())
		}
	} else {
		err = cuda.MoECombine(b.s, at.ptr, y, lids, inv, n, K, d, exact)
	}
	if err != nil {
		return fmt.Errorf("experts: %w", err)
	}
	return nil
}

// traceExperts downloads the stage buffers and reports the first non-finite
// stage in the CPU's order (expert ascending; w1, w3, swiglu, w2).
func (b *Backend) traceExperts(E, K, nk, d, I int, offsets, perm, xg, gf, uf, h, yf cuda.DevicePtr, partial bool) error {
	off := make([]int32, E+1)
	pm := make([]int32, nk)
	x, g, u, hh, y := make([]float32, nk*d), make([]float32, nk*I), make([]float32, nk*I), make([]float32, nk*I), make([]float32, nk*d)
	for _, c := range []struct {
		dst []byte
		src cuda.DevicePtr
	}{{cuda.Bytes(off), offsets}, {cuda.Bytes(pm), perm}, {cuda.Bytes(x), xg}, {cuda.Bytes(g), gf}, {cuda.Bytes(u), uf}, {cuda.Bytes(hh), h}, {cuda.Bytes(y), yf}} {
		if err := b.s.CopyDtoH(c.dst, c.src); err != nil {
			return fmt.Errorf("experts trace: %w", err)
		}
	}
	if err := b.sync(); err != nil {
		return fmt.Errorf("experts trace: %w", err)
	}
	if int(off[E]) != nk && !partial {
		return fmt.Errorf("experts: %d of %d expert ids outside [0, %d)", nk-int(off[E]), nk, E)
	}
	for e := range E {
		lo, hi := int(off[e]), int(off[e+1])
		if lo == hi {
			continue
		}
		row := int(pm[lo]) / K
		for _, st := range []struct {
			name    string
			out, in []float32
			w, wIn  int
		}{{"w1", g, x, I, d}, {"w3", u, x, I, d}, {"swiglu", hh, u, I, I}, {"w2", y, hh, d, I}} {
			s := backend.SliceStats(st.out[lo*st.w : hi*st.w])
			if s.FirstBad >= 0 {
				return &backend.OpNonFinite{Component: fmt.Sprintf("expert %d %s", e, st.name), Row: row, Stats: s, In: backend.SliceStats(st.in[lo*st.wIn : hi*st.wIn])}
			}
		}
	}
	return nil
}

// localIDs maps global expert ids to this backend's [0, E) for expert
// parallel (ExpertsArgs.Offset/Partial): another rank's ids become -1, which
// the permutation skips. It runs on the host (one small download and upload
// per MoE layer), the v1 path until the permute kernels take the offset.
// Without an offset or Partial it returns ids itself.
func (b *Backend) localIDs(ids cuda.DevicePtr, nk, E int, a backend.ExpertsArgs) (cuda.DevicePtr, *cuda.Buffer, error) {
	if a.Offset == 0 && !a.Partial {
		return ids, nil, nil
	}
	v := make([]int32, nk)
	if err := b.s.CopyDtoH(cuda.Bytes(v), ids); err != nil {
		return 0, nil, fmt.Errorf("experts ids: %w", err)
	}
	if err := b.sync(); err != nil {
		return 0, nil, fmt.Errorf("experts ids: %w", err)
	}
	for i, id := range v {
		e := int(id) - a.Offset
		if e < 0 || e >= E {
			if !a.Partial {
				return 0, nil, fmt.Errorf("experts: expert id %d outside [%d, %d)", id, a.Offset, a.Offset+E)
			}
			e = -1
		}
		v[i] = int32(e)
	}
	buf, err := b.upload(cuda.Bytes(v))
	if err != nil {
		return 0, nil, fmt.Errorf("experts ids: %w", err)
	}
	return buf.Ptr, buf, nil
}
