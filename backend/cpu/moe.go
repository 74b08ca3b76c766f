package cpu

import (
	"fmt"
	"math"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/num"
)

// softplus is log(1+e^z), returning z for z > 20 as PyTorch does.
func softplus(z float32) float32 {
	if z > 20 {
		return z
	}
	return float32(math.Log1p(math.Exp(float64(z))))
}

// Router implements backend.Backend (spec §6.1).
func (b *Backend) Router(f backend.Tensor, gate backend.Linear, a backend.RouterArgs, weights, ids backend.Tensor) error {
	g, t, err := backend.Args[*linear, *Tensor](backend.CheckRouter(f, gate, a, weights, ids), "router", gate, f, weights, ids)
	if err != nil {
		return err
	}
	ft, wt, it, n, E, K := t[0], t[1], t[2], f.Rows(), g.out, a.TopK
	var bias []float32
	if a.Bias != nil {
		bv, ok := a.Bias.(*vec)
		if !ok {
			return fmt.Errorf("router: bias %T", a.Bias)
		}
		bias = bv.v
	}
	var table *idTable
	if a.Tid2Eid != nil {
		var ok bool
		if table, ok = a.Tid2Eid.(*idTable); !ok {
			return fmt.Errorf("router: tid2eid %T", a.Tid2Eid)
		}
	}
	logits := make([]float32, n*E)
	b.matmul(ft.F, n, g, logits, E, 0, false)
	return b.parallelErr(n, func(lo, hi int) error {
		sel := make([]float32, E)
		for r := lo; r < hi; r++ {
			s := logits[r*E : (r+1)*E]
			for e, z := range s {
				s[e] = float32(math.Sqrt(float64(softplus(z))))
			}
			idx := it.I[r*K : (r+1)*K]
			if table != nil {
				id := a.IDs[r]
				copy(idx, table.v[int(id)*K:(int(id)+1)*K])
				for _, e := range idx {
					if e < 0 || int(e) >= E {
						return fmt.Errorf("router: tid2eid[%d] holds expert %d of %d", id, e, E)
					}
				}
			} else {
				for e := range s {
					sel[e] = s[e] + bias[e]
				}
				topK(sel, idx)
			}
			var sum float32
			for _, e := range idx {
				sum += s[e]
			}
			sum = max(sum, 1e-20) // 0/0 guard (spec §6.1 robustness note)
			w := wt.F[r*K : (r+1)*K]
			for k, e := range idx {
				w[k] = s[e] / sum * a.Scale
			}
		}
		return nil
	})
}

// topK writes the indices of the len(idx) largest values, descending; ties →
// lower index; NaN sorts last.
func topK(v []float32, idx []int32) {
	k := len(idx)
	better := func(a, b int32) bool { // strictly better: ties keep the lower index first
		x, y := v[a], v[b]
		return x == x && (y != y || x > y)
	}
	n := 0
	for e := range v {
		ei := int32(e)
		if n < k {
			idx[n] = ei
			n++
		} else if better(ei, idx[k-1]) {
			idx[k-1] = ei
		} else {
			continue
		}
		for j := n - 1; j > 0 && better(idx[j], idx[j-1]); j-- {
			idx[j], idx[j-1] = idx[j-1], idx[j]
		}
	}
}

// Experts implements backend.Backend (spec §6.2–§6.3): experts are run grouped
// over their rows in ascending id; each row's fp32 accumulator receives the
// bf16 expert outputs in ascending expert id.
func (b *Backend) Experts(f backend.Tensor, e backend.Experts, weights, ids backend.Tensor, a backend.ExpertsArgs, acc backend.Tensor) error {
	ex, t, err := backend.Args[*experts, *Tensor](backend.CheckExperts(f, e, weights, ids, a, acc), "experts", e, f, weights, ids, acc)
	if err != nil {
		return err
	}
	ft, wt, it, at := t[0], t[1], t[2], t[3]
	n, K := ft.rows, it.cols
	E := len(ex.w1)
	rows := make([][]int, E) // (row·K + slot) per expert
	for i, id := range it.I {
		e := int(id) - a.Offset
		if e < 0 || e >= E {
			if a.Partial {
				continue // another rank's expert
			}
			return fmt.Errorf("experts: expert id %d outside [%d, %d)", id, a.Offset, a.Offset+E)
		}
		rows[e] = append(rows[e], i)
	}
	d, I := ex.dim, ex.inter
	outs := make([]float32, n*K*d)
	faithful := b.faithful()
	check := func(x []float32, name string, e, row int, in []float32) error {
		if !a.Trace {
			return nil
		}
		st := SliceStats(x)
		if st.FirstBad < 0 {
			return nil
		}
		return &backend.OpNonFinite{Component: fmt.Sprintf("expert %d %s", e, name), Row: row, Stats: st, In: SliceStats(in)}
	}
	for e := range E {
		rs := rows[e]
		if len(rs) == 0 {
			continue
		}
		m := len(rs)
		x := make([]float32, m*d)
		for i, rk := range rs {
			copy(x[i*d:(i+1)*d], ft.Row(rk/K))
		}
		xq := b.quantRows(x, m, d)
		g := make([]float32, m*I)
		u := make([]float32, m*I)
		b.matmul(xq, m, ex.w1[e], g, I, 0, faithful)
		b.matmul(xq, m, ex.w3[e], u, I, 0, faithful)
		if err := check(g, "w1", e, rs[0]/K, x); err != nil {
			return err
		}
		if err := check(u, "w3", e, rs[0]/K, x); err != nil {
			return err
		}
		h := g
		for i, rk := range rs {
			w := wt.F[rk]
			for j := i * I; j < (i+1)*I; j++ {
				h[j] = swiglu(g[j], u[j], w, a.Limit)
			}
		}
		if faithful {
			num.RoundBF16Slice(h)
		}
		if err := check(h, "swiglu", e, rs[0]/K, u); err != nil {
			return err
		}
		hq := b.quantRows(h, m, I)
		y := make([]float32, m*d)
		b.matmul(hq, m, ex.w2[e], y, d, 0, faithful)
		if err := check(y, "w2", e, rs[0]/K, h); err != nil {
			return err
		}
		for i, rk := range rs {
			copy(outs[rk*d:(rk+1)*d], y[i*d:(i+1)*d])
		}
	}
	// Sum per row in ascending expert id.
	b.parallel(n, func(lo, hi int) {
		order := make([]int, K)
		for r := lo; r < hi; r++ {
			for k := range K {
				order[k] = k
			}
			ir := it.I[r*K : (r+1)*K]
			for i := 1; i < K; i++ {
				for j := i; j > 0 && ir[order[j]] < ir[order[j-1]]; j-- {
					order[j], order[j-1] = order[j-1], order[j]
				}
			}
			ar := at.Row(r)
			clear(ar)
			for _, k := range order {
				o := outs[(r*K+k)*d : (r*K+k+1)*d]
				for i, v := range o {
					ar[i] += v
				}
			}
		}
	})
	return nil
}
