package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// depthTimer decorates the model's backend: while on, the step runs eagerly
// and every IndexerTopK and SparseAttention (the ops whose work grows with
// the context) is timed alone by time; off, it passes everything through, so
// decode steps are recorded and replayed as without it. Both ops only read
// the cache and write their output, so time may run them more than once.
type depthTimer struct {
	backend.Backend
	on   bool
	time func(run func() error) (float64, error) // µs
	// attnUs, idxUs sum the op times while on.
	attnUs, idxUs float64
}

// Unwrap implements backend.Wrapper.
func (d *depthTimer) Unwrap() backend.Backend { return d.Backend }

// RecordStep implements backend.Backend.
func (d *depthTimer) RecordStep(bt *backend.Batch, ids []int32, forward func() ([]backend.Tensor, error)) ([]backend.Tensor, error) {
	if d.on {
		return forward()
	}
	return d.Backend.RecordStep(bt, ids, forward)
}

// IndexerTopK implements backend.Backend.
func (d *depthTimer) IndexerTopK(s backend.KVStore, q, w backend.Tensor, a backend.IndexerArgs, b *backend.Batch, out backend.Tensor) error {
	run := func() error { return d.Backend.IndexerTopK(s, q, w, a, b, out) }
	if !d.on {
		return run()
	}
	us, err := d.time(run)
	d.idxUs += us
	return err
}

// SparseAttention implements backend.Backend.
func (d *depthTimer) SparseAttention(s backend.KVStore, q, kv, sel backend.Tensor, a backend.AttnArgs, b *backend.Batch, out backend.Tensor) error {
	run := func() error { return d.Backend.SparseAttention(s, q, kv, sel, a, b, out) }
	if !d.on {
		return run()
	}
	us, err := d.time(run)
	d.attnUs += us
	return err
}

// wallTime times one run on the host (the CPU backend's ops are synchronous).
func wallTime(run func() error) (float64, error) {
	t := time.Now()
	err := run()
	return float64(time.Since(t).Nanoseconds()) / 1e3, err
}

// depthResult is one depth's measurements.
type depthResult struct {
	context, batch int
	fill           time.Duration
	steps          []time.Duration // timed decode steps
	attnUs, idxUs  float64         // per step, all layers
	idxBytes       int64           // index keys a decode step reads
	floorUs        float64         // idxBytes at the copy rate
	prefillTokens  int
	prefill        time.Duration
	// firstTok is the token the first decode step of sequence 0 took at
	// depth, first its logits (tests compare them with depth 0).
	firstTok int32
	first    []float32
}

// runDepth fills f.batch sequences to n-steps and one more to n-2·prefill,
// then runs the decode steps (ending at position n-1) and two prefill chunks
// (the second, timed, ending at n).
func runDepth(m *model.Model, dt *depthTimer, f *stackFlags, n int) (*depthResult, error) {
	c := m.Config()
	steps := decodeWarm + f.decode + 1
	rng := rand.New(rand.NewPCG(f.seed, uint64(n)))
	seqs := make([]*kvcache.Sequence, f.batch)
	for i := range seqs {
		seqs[i] = m.Cache().NewSequence()
		defer m.FreeSequence(seqs[i])
	}
	pre := m.Cache().NewSequence()
	defer m.FreeSequence(pre)
	r := &depthResult{context: n, batch: f.batch, prefillTokens: f.prefill}
	t0 := time.Now()
	if err := m.FillCache(seqs, n-steps, f.seed+uint64(n)); err != nil {
		return nil, err
	}
	if d := n - 2*f.prefill; d > 0 {
		if err := m.FillCache([]*kvcache.Sequence{pre}, d, f.seed+uint64(n)+1); err != nil {
			return nil, err
		}
	}
	r.fill = time.Since(t0)
	toks := randTokens(rng, f.batch, c.Vocab)
	for step := range steps {
		b := &model.Batch{}
		for i, s := range seqs {
			it := model.BatchItem{Seq: s, Tokens: []int32{toks[i]}}
			if f.draw {
				it.Draw = &backend.Draw{}
			}
			b.Items = append(b.Items, it)
		}
		timing := step == steps-1
		dt.on, dt.attnUs, dt.idxUs = timing, 0, 0
		t := time.Now()
		out, err := m.Forward(b)
		el := time.Since(t)
		dt.on = false
		if err != nil {
			return nil, fmt.Errorf("decode step %d at depth %d: %w", step, seqs[0].Len(), err)
		}
		switch {
		case timing:
			r.attnUs, r.idxUs = dt.attnUs, dt.idxUs
		case step >= decodeWarm:
			r.steps = append(r.steps, el)
		}
		if out.IDs != nil {
			copy(toks, out.IDs)
			continue
		}
		if step == 0 {
			r.firstTok, r.first = toks[0], slices.Clone(out.Last(0))
		}
		for i, s := range seqs {
			last := out.Last(i)
			if err := checkFinite(fmt.Sprintf("decode step %d", step), i, s.Len(), last); err != nil {
				return nil, err
			}
			toks[i] = engine.Argmax(last)
		}
	}
	for k := range 2 {
		b := &model.Batch{Items: []model.BatchItem{{Seq: pre, Tokens: randTokens(rng, f.prefill, c.Vocab)}}}
		t := time.Now()
		out, err := m.Forward(b)
		r.prefill = time.Since(t)
		if err != nil {
			return nil, fmt.Errorf("prefill chunk %d at depth %d: %w", k, pre.Len()-f.prefill, err)
		}
		if err := checkFinite("prefill", 0, pre.Len(), out.Last(0)); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// setFloor sets the bytes the indexer of a decode step must read at the
// timed step's depth (n-1: its row sees n/ratio entries a CSA layer): every
// CSA layer's index keys (e2m1 codes and scales, as stored), and each row's
// fp32 queries and head weights; and their read time at the copy rate.
func (r *depthResult) setFloor(l kvcache.Layout, c *checkpoint.Config, copyGBs float64) {
	r.idxBytes = 0
	for _, k := range l.Layers[:c.Layers] {
		if k.IndexDim > 0 {
			r.idxBytes += int64(r.batch) * (int64(r.context/k.Ratio)*int64(l.IndexBytes) + 4*int64(c.IndexHeads)*int64(c.IndexHeadDim+1))
		}
	}
	if copyGBs > 0 {
		r.floorUs = float64(r.idxBytes) / (copyGBs * 1e3)
	}
}

func (r *depthResult) stepMs() float64 {
	if len(r.steps) == 0 {
		return 0
	}
	s := slices.Clone(r.steps)
	slices.Sort(s)
	return ms(s[len(s)/2])
}

func (r *depthResult) prefillTokS() float64 {
	return float64(r.prefillTokens) / max(r.prefill.Seconds(), 1e-9)
}

// share is part/whole, 0 when whole is 0.
func share(part, whole float64) float64 {
	if whole <= 0 {
		return 0
	}
	return part / whole
}

func printDepthHeader(out io.Writer) {
	fmt.Fprintln(out, "| context | batch | decode step ms | × first | attention ms (share) | indexer ms (share) | indexer floor ms | indexer / floor | prefill tok/s | fill s |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|---|---|---|")
}

// print writes the depth's table row; first is the first depth's step (ms).
func (r *depthResult) print(out io.Writer, first float64) {
	step := r.stepMs()
	a, i := r.attnUs/1e3, r.idxUs/1e3
	fmt.Fprintf(out, "| %d | %d | %.3f | %.2f | %.3f (%.1f%%) | %.3f (%.1f%%) | %.4f | %.2f | %.0f | %.1f |\n",
		r.context, r.batch, step, share(step, first), a, 100*share(a, step), i, 100*share(i, step),
		r.floorUs/1e3, share(r.idxUs, r.floorUs), r.prefillTokS(), r.fill.Seconds())
}

// depthJSON is one --jsonl line.
type depthJSON struct {
	Device          string    `json:"device"`
	Preset          string    `json:"preset"`
	Layers          int       `json:"layers"`
	Context         int       `json:"context"`
	Batch           int       `json:"batch"`
	StepMs          float64   `json:"decode_step_ms"`
	AttentionMs     float64   `json:"attention_ms"`
	IndexerMs       float64   `json:"indexer_ms"`
	IndexerBytes    int64     `json:"indexer_key_bytes"`
	IndexerFloorMs  float64   `json:"indexer_floor_ms"`
	PrefillTokens   int       `json:"prefill_tokens"`
	PrefillTokS     float64   `json:"prefill_tok_s"`
	FillSeconds     float64   `json:"fill_s"`
	AttentionShare  float64   `json:"attention_share"`
	IndexerShare    float64   `json:"indexer_share"`
	IndexerPerFloor float64   `json:"indexer_over_floor"`
	DecodeStepsMs   []float64 `json:"decode_steps_ms"`
}

func (r *depthResult) json(device, preset string, layers int) depthJSON {
	step := r.stepMs()
	j := depthJSON{Device: device, Preset: preset, Layers: layers, Context: r.context, Batch: r.batch, StepMs: step,
		AttentionMs: r.attnUs / 1e3, IndexerMs: r.idxUs / 1e3, IndexerBytes: r.idxBytes, IndexerFloorMs: r.floorUs / 1e3,
		PrefillTokens: r.prefillTokens, PrefillTokS: r.prefillTokS(), FillSeconds: r.fill.Seconds(),
		AttentionShare: share(r.attnUs/1e3, step), IndexerShare: share(r.idxUs/1e3, step), IndexerPerFloor: share(r.idxUs, r.floorUs)}
	for _, d := range r.steps {
		j.DecodeStepsMs = append(j.DecodeStepsMs, ms(d))
	}
	return j
}
