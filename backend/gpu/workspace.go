package gpu

import (
	"errors"
	"fmt"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/kvcache"
)

// StepShape bounds the steps a workspace must serve.
type StepShape struct {
	Rows    int  // tokens per step (serve's --max-num-batched-tokens)
	Seqs    int  // sequences per step (--max-num-seqs): the rows of decode steps
	Context int  // longest sequence in tokens (--max-model-len)
	Graphs  bool // decode steps are recorded: their buffers live in an arena of their own
}

// StepWorkspace is the device memory, beyond the weights and the KV cache, that
// steps of shape s take from the backend's pools: an upper bound that counts
// every activation and scratch buffer of one layer as live at once (the pool
// keeps freed blocks for reuse), each rounded up to its size class, with the
// indexer's score rows over the longest context. With Graphs, the arena of the
// recorded decode steps adds the same for Seqs rows at the context bucket
// above Context.
func (b *Backend) StepWorkspace(c *checkpoint.Config, s StepShape) (int64, error) {
	sz := sizers{
		linear: func(m, n, k int) int { return cuda.LinearFP8ScratchBytes(b.s, m, n, k) },
		moe: func(rows, n, k int) int {
			var most int
			for _, f := range []cuda.FP4Format{cuda.MXFP4, cuda.NVFP4} {
				most = max(most, cuda.MoEScratchBytes(b.s, cuda.MoEShape{Experts: c.Experts, Rows: rows, N: n, K: k, Format: f}))
			}
			return most
		},
	}
	return stepWorkspace(c, s, sz)
}

// sizers are the scratch sizes that depend on the device's plans.
type sizers struct {
	linear func(m, n, k int) int    // split-K partials of an FP8 linear
	moe    func(rows, n, k int) int // grouped expert GEMM tiles
}

func stepWorkspace(c *checkpoint.Config, s StepShape, sz sizers) (int64, error) {
	if s.Rows <= 0 || s.Seqs <= 0 || s.Context <= 0 {
		return 0, fmt.Errorf("gpu: step workspace for %+v: every bound must be positive", s)
	}
	if c == nil || c.Dim <= 0 || c.HcMult <= 0 {
		return 0, errors.New("gpu: step workspace: incomplete config")
	}
	w := stepBytes(c, s.Rows, s.Context, sz) + metaBytes(s.Rows, s.Seqs, s.Context)
	if s.Graphs {
		bucket := ctxBucketMin
		for bucket < s.Context {
			bucket *= 2
		}
		rows := min(s.Seqs, s.Rows)
		// Every recording keeps its own copy of the step's inputs.
		w += stepBytes(c, rows, bucket, sz) + maxGraphs*metaBytes(rows, rows, bucket)
	}
	return w, nil
}

// metaBytes bounds a step's device inputs: per-row words, token ids and
// every sequence's block table (blocks of kvcache.DefaultBlockTokens).
func metaBytes(rows, seqs, ctx int) int64 {
	return classBytes(4 * int64(8*rows+seqs*(ctx/kvcache.DefaultBlockTokens+16)))
}

// stepBytes sums the buffers of one step of n rows at context ctx.
func stepBytes(c *checkpoint.Config, n, ctx int, sz sizers) int64 {
	var total int64
	f32 := func(rows, cols int) { total += classBytes(4 * int64(rows) * int64(cols)) }
	raw := func(b int) { total += classBytes(int64(b)) }
	d, hd, D := c.Dim, c.HcDim(), c.HeadDim
	// The residual streams (in and out of a block), hc pre's mix and output.
	f32(n, hd)
	f32(n, hd)
	f32(n, c.HcMix())
	f32(n, d)
	// Attention: first linears, q path, kv, output projections.
	f32(n, c.QLoraRank) // wq_a
	f32(n, c.QLoraRank) // q_norm
	f32(n, D)           // wkv
	f32(n, D)           // kv
	f32(n, c.Heads*D)   // q
	f32(n, c.Heads*D)   // attention output
	f32(n, c.OGroups*c.OLoraRank)
	f32(n, d)
	// Compressors: A and Z of the main (overlapping: 2·Dc) and the indexer's.
	f32(n, 2*D)
	f32(n, 2*D)
	if c.IndexHeads > 0 {
		f32(n, 2*c.IndexHeadDim)
		f32(n, 2*c.IndexHeadDim)
		f32(n, c.IndexHeads)                // weights
		f32(n, c.IndexHeads*c.IndexHeadDim) // q
		f32(n, c.IndexTopK)                 // selection (int32)
		f32(n, ctx/4+1)                     // score rows over every compressed entry
	}
	// The FP8 linears' staging: the largest input quantised, the largest
	// output in bf16, split-K partials.
	in := max(hd, d, c.QLoraRank, c.Heads*D, c.OGroups*c.OLoraRank, c.MoEInter)
	out := max(c.Heads*D, c.IndexHeads*c.IndexHeadDim, 2*c.MoEInter, d, c.Vocab)
	raw(fp8Bytes(n, in) + 2*n*out + sz.linear(n, out, in) + 512)
	f32(n, in) // the simulated quantisation of a linear off the tensor cores
	// MoE: routing, the shared expert, the routed experts' permuted rows.
	nk := n * max(c.TopK, 1)
	I := c.MoEInter
	f32(n, c.TopK)
	f32(n, c.TopK)
	f32(n, d) // out
	f32(n, d) // acc
	for range 4 {
		f32(n, I) // shared gate, up, h, and its quantised copy
	}
	f32(n, c.Experts) // routing scores
	raw(4*c.Experts + 4*(c.Experts+1) + 4*nk + 4*nk)
	f32(nk, 2*I) // gate|up (fp32 in exact numerics)
	f32(nk, d)   // w2 out
	f32(nk, d)   // fp32 stages of exact numerics and tracing
	f32(nk, I)
	f32(nk, I)
	f32(nk, I)
	raw(nk*d + nk*d/128 + nk*I + nk*I/128)
	raw(max(sz.moe(nk, 2*I, d), sz.moe(nk, d, I)))
	// Head: logits of every row (prompt logprobs), hc head, sampling.
	f32(n, hd)
	f32(n, d)
	f32(n, d)
	f32(n, c.Vocab)
	raw(24 * n)
	return total
}

// classBytes is b rounded up to the pool's size class (at most 25% more).
func classBytes(b int64) int64 {
	if b <= 0 {
		return 0
	}
	return int64(cuda.ClassSize(int(b)))
}
