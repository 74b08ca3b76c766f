package main

import (
	"bytes"
	"io"
	"math"
	"math/rand/v2"
	"regexp"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/gpu"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// TestSpecStepRollback drives steps with drafts on a small random model and
// checks the driver against plain decoding: afterwards each sequence's cache
// holds exactly its emitted tokens (the next logits equal those of a
// sequence decoded one token at a time over the same tokens, bit for bit on
// the CPU), and with greedy verification the tokens are plain greedy ones.
func TestSpecStepRollback(t *testing.T) {
	testSpecStepRollback(t, func(t *testing.T) backend.Backend { return nil }, "faithful", 0)
}

// TestSpecStepRollbackCUDA is TestSpecStepRollback on the GPU (exact
// numerics; verification rows and one-row decode steps take different
// kernel shapes, so logits agree to a tolerance; plain steps and the
// verifications of steps with drafts replay CUDA graphs). It skips without a
// GPU.
func TestSpecStepRollbackCUDA(t *testing.T) {
	testSpecStepRollback(t, openGraphsGPU, "exact", 1e-3)
}

// openGraphsGPU opens the GPU backend with CUDA graphs, or skips the test.
func openGraphsGPU(t *testing.T) backend.Backend {
	g, err := gpu.New(gpu.Options{Graphs: true})
	if err != nil {
		t.Skipf("no GPU: %v", err)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	})
	return g
}

// testSpecStepRollback runs the cases on the backend open gives (nil: the
// CPU); tol bounds the logits' difference relative to the row's largest
// magnitude (0: bit for bit, and greedy tokens are compared).
func testSpecStepRollback(t *testing.T, open func(*testing.T) backend.Backend, numerics string, tol float64) {
	for _, tc := range []struct {
		name       string
		acceptRate float64
		k          int
		draw       bool // tokens drawn on the device where the model can
	}{
		{"greedy", -1, 2, false},
		{"greedy drawn", -1, 2, true},
		{"forced 0.6", 0.6, 3, false},
		{"forced 0.6 drawn", 0.6, 3, true},
		{"all accepted", 1, 2, false},
		{"none accepted", 0, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := open(t)
			f := &stackFlags{preset: "small", batch: 2, prefillSeqs: 2, prefill: 9, decode: 4, seed: 3, numerics: numerics,
				spec: engine.SpecConfig{Method: "mtp", NumTokens: tc.k}, acceptRate: tc.acceptRate}
			full, err := checkpoint.PresetConfig("small")
			if err != nil {
				t.Fatal(err)
			}
			c, err := checkpoint.CutLayers(full, 3, true)
			if err != nil {
				t.Fatal(err)
			}
			w, err := checkpoint.RandomWeights(c, checkpoint.GenOfficial, f.seed)
			if err != nil {
				t.Fatal(err)
			}
			m, err := model.New(w, be, model.Options{CacheBytes: 2 * cacheFor(c, f), Numerics: numerics, Drafts: tc.k})
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			seqs := make([]*specSeq, f.batch)
			for i := range seqs {
				seqs[i] = &specSeq{kv: m.Cache().NewSequence()}
			}
			if err := specPrefill(m, f, seqs, rng); err != nil {
				t.Fatal(err)
			}
			emitted := 0
			for range f.decode {
				st, err := specStep(m, seqs, tc.k, tc.acceptRate, tc.draw, rng)
				if err != nil {
					t.Fatal(err)
				}
				emitted += st.emitted
				switch tc.acceptRate {
				case 1:
					if st.accepted != st.drafted {
						t.Errorf("accept rate 1: %d of %d accepted", st.accepted, st.drafted)
					}
				case 0:
					if st.accepted != 0 {
						t.Errorf("accept rate 0: %d accepted", st.accepted)
					}
				}
			}
			gen := 0
			for i, s := range seqs {
				gen += len(s.toks) - f.prefill - 1 // the first generated token comes from the prefill
				ref, b, hidden := replayPlain(t, m, s, f.prefill, tol == 0 && tc.acceptRate < 0)
				checkMTP(t, m, s, ref, hidden, max(tol, 1e-4))
				checkNextLogits(t, m, s, ref, b, i, tol)
			}
			if gen != emitted {
				t.Errorf("%d tokens generated, %d emitted by the steps", gen, emitted)
			}
		})
	}
}

// replayPlain decodes s's tokens one at a time on a fresh sequence from its
// prompt of prefill tokens, checking (with greedy) that each is plain
// decoding's argmax; it returns that sequence, the batch of its last token
// and the drafter inputs of every position (Output.Hidden).
func replayPlain(t *testing.T, m *model.Model, s *specSeq, prefill int, greedy bool) (*kvcache.Sequence, *model.Batch, []float32) {
	t.Helper()
	ref := m.Cache().NewSequence()
	b := &model.Batch{Items: []model.BatchItem{{Seq: ref, Tokens: s.toks[:prefill], Hidden: true}}}
	var hidden []float32
	for p := prefill; p < len(s.toks); p++ {
		out, err := m.Forward(b)
		if err != nil {
			t.Fatal(err)
		}
		hidden = append(hidden, out.Hidden[0]...)
		if greedy && engine.Argmax(out.Last(0)) != s.toks[p] {
			t.Fatalf("token %d is %d, plain greedy decoding gives %d", p, s.toks[p], engine.Argmax(out.Last(0)))
		}
		b.Items[0].Tokens = s.toks[p : p+1]
	}
	return ref, b, hidden
}

// checkNextLogits compares the next logits of s (sequence i, after the steps
// with drafts) with those of ref after b, plain decoding's.
func checkNextLogits(t *testing.T, m *model.Model, s *specSeq, ref *kvcache.Sequence, b *model.Batch, i int, tol float64) {
	t.Helper()
	b.Items[0].Hidden = false
	want, err := m.Forward(b)
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s.kv, Tokens: s.pending}}})
	if err != nil {
		t.Fatal(err)
	}
	if d := relDiff(got.Last(0), want.Last(0)); ref.Len() != s.kv.Len() || d > tol {
		t.Errorf("sequence %d: after the steps with drafts (%d tokens) the next logits differ from plain decoding's (%d tokens) by %g", i, s.kv.Len(), ref.Len(), d)
	}
}

// checkMTP compares the next draft's logits of s (the MTP block caught up
// with its pending hidden states) with those of the MTP block run over ref's
// positions one at a time.
func checkMTP(t *testing.T, m *model.Model, s *specSeq, ref *kvcache.Sequence, hidden []float32, tol float64) {
	t.Helper()
	w := m.Config().HcDim()
	n := s.hidden.Rows
	got, err := m.ForwardMTP([]model.MTPItem{{Seq: s.kv, Start: s.mtpLen, In: s.hidden, Next: s.toks[s.mtpLen+1 : s.mtpLen+n+1], Ahead: true}})
	if err != nil {
		t.Fatal(err)
	}
	var want *model.Output
	for p := range len(s.toks) - 1 {
		if want, err = m.ForwardMTP([]model.MTPItem{{Seq: ref, Start: p, Hidden: hidden[p*w : (p+1)*w], Next: s.toks[p+1 : p+2]}}); err != nil {
			t.Fatal(err)
		}
	}
	if d := relDiff(got.Logits[0], want.Logits[0]); d > tol {
		t.Errorf("sequence %d: the MTP block's next draft logits differ from a run over the emitted tokens by %g", s.kv.ID, d)
	}
}

// relDiff is the largest difference of a and b relative to b's largest
// magnitude (+Inf for different lengths).
func relDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	var d, big float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i]-b[i])))
		big = max(big, math.Abs(float64(b[i])))
	}
	return d / max(big, 1e-30)
}

// TestStackSpeculativeCPU runs bench stack with drafts at a forced
// acceptance and checks the report's lines.
func TestStackSpeculativeCPU(t *testing.T) {
	var out bytes.Buffer
	args := []string{"--preset", "small", "--layers", "2", "--device", "cpu", "--prefill", "8", "--decode", "3", "--batch", "2",
		"--speculative-config", `{"method":"mtp","num_speculative_tokens":2}`, "--accept-rate", "1"}
	if err := runStack(args, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{
		`(?m)^preset small  layers 2/6  mtp true `,
		`(?m)^speculative mtp N=2 \(forced acceptance: each draft accepted with probability 1\.00 regardless of the logits \(--accept-rate\)\)$`,
		`(?m)^draft\+verify 3 steps × batch 2 in \S+: [0-9.]+ tok/s  step median [0-9.]+ ms  min [0-9.]+ ms  max [0-9.]+ ms  mean acceptance length 3\.000  per position \[1\.000 1\.000\]$`,
		`(?m)^speculative vs plain decoding: [0-9.]+ / [0-9.]+ tok/s = [0-9.]+x$`,
		`(?m)^parts of a step with drafts \(medians\): MTP passes [0-9.]+ ms \(2 a step\), verification [0-9.]+ ms, rest -?[0-9.]+ ms `,
		`(?m)^projected 6-layer ratio = A × P / \(M \+ V \+ R\) = 3\.000 × [0-9.]+ / \([0-9.]+ \+ [0-9.]+ \+ -?[0-9.]+\) = [0-9.]+x, where `,
	} {
		if !regexp.MustCompile(re).MatchString(out.String()) {
			t.Errorf("output lacks %s:\n%s", re, out.String())
		}
	}
}

func TestStackSpeculativeFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--accept-rate", "0.5"}, "--accept-rate needs --speculative-config"},
		{[]string{"--speculative-config", `{"method":"mtp","num_speculative_tokens":2}`, "--accept-rate", "1.5"}, "--accept-rate"},
		{[]string{"--speculative-config", `{"method":"mtp","num_speculative_tokens":9}`}, "num_speculative_tokens 9"},
		{[]string{"--speculative-config", `{"method":"mtp","n":2}`}, `unknown field "n"`},
		{[]string{"--speculative-config", `{"method":"mtp","num_speculative_tokens":2}`, "--tensor-parallel", "2", "--layers", "2"}, "one rank"},
	} {
		_, err := parseStack(tc.args, io.Discard)
		if err == nil || !regexp.MustCompile(regexp.QuoteMeta(tc.want)).MatchString(err.Error()) {
			t.Errorf("%q: error %v, want %q", tc.args, err, tc.want)
		}
	}
}
