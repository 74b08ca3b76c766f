package main

import (
	"bytes"
	"io"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// TestDSparkStepRollback drives steps with DSpark drafts on the small
// preset's stack with the small drafter and checks the driver against plain
// decoding: afterwards each sequence's cache holds exactly its emitted
// tokens (the next logits equal those of a sequence decoded one token at a
// time over the same tokens, bit for bit on the CPU), the drafter's next
// block equals that of a drafter fed every position's features at once, and
// with greedy verification the tokens are plain greedy ones.
func TestDSparkStepRollback(t *testing.T) {
	testDSparkStepRollback(t, func(t *testing.T) backend.Backend { return nil }, "faithful", 0)
}

// TestDSparkStepRollbackCUDA is TestDSparkStepRollback on the GPU (exact
// numerics; verification rows and one-row decode steps take different
// kernel shapes, so logits agree to a tolerance; plain steps and the
// verifications replay CUDA graphs). It skips without a GPU.
func TestDSparkStepRollbackCUDA(t *testing.T) {
	testDSparkStepRollback(t, openGraphsGPU, "exact", 1e-3)
}

// testDSparkStepRollback runs the cases on the backend open gives (nil: the
// CPU); tol bounds the logits' difference relative to the row's largest
// magnitude (0: bit for bit, and greedy tokens are compared).
func testDSparkStepRollback(t *testing.T, open func(*testing.T) backend.Backend, numerics string, tol float64) {
	for _, tc := range []struct {
		name       string
		acceptRate float64
		k          int
		draw       bool // verifying rows drawn on the device where the model can
	}{
		{"greedy", -1, 3, false},
		{"greedy drawn", -1, 4, true}, // drafts drawn and features kept on the device where the model can
		{"forced 0.6", 0.6, 4, false},
		{"forced 0.6 drawn", 0.6, 2, true},
		{"all accepted", 1, 3, false},
		{"none accepted", 0, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := open(t)
			f := &stackFlags{preset: "small", batch: 2, prefillSeqs: 2, prefill: 9, decode: 4, seed: 3, numerics: numerics,
				spec: engine.SpecConfig{Method: "dspark", NumTokens: tc.k}, acceptRate: tc.acceptRate}
			full, err := checkpoint.PresetConfig("small")
			if err != nil {
				t.Fatal(err)
			}
			c, err := f.cut(full, 4)
			if err != nil {
				t.Fatal(err)
			}
			w, err := checkpoint.RandomWeights(c, checkpoint.GenOfficial, f.seed)
			if err != nil {
				t.Fatal(err)
			}
			m, err := model.New(w, be, model.Options{CacheBytes: 2 * cacheFor(c, f), Numerics: numerics, DSparkRows: tc.k, Drafts: tc.k})
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			seqs := make([]*specSeq, f.batch)
			for i := range seqs {
				seqs[i] = &specSeq{kv: m.Cache().NewSequence()}
			}
			defer freeHidden(m, seqs)
			if err := dsparkPrefill(m, f, seqs, rng); err != nil {
				t.Fatal(err)
			}
			emitted := 0
			for range f.decode {
				st, err := dsparkStep(m, seqs, tc.k, tc.acceptRate, tc.draw, rng)
				if err != nil {
					t.Fatal(err)
				}
				emitted += st.emitted
				if tc.acceptRate == 1 && st.accepted != st.drafted || tc.acceptRate == 0 && st.accepted != 0 {
					t.Errorf("accept rate %g: %d of %d accepted", tc.acceptRate, st.accepted, st.drafted)
				}
				if st.drafted != tc.k*f.batch || st.emitted != st.accepted+f.batch {
					t.Errorf("%d drafted, %d accepted, %d emitted by %d sequences", st.drafted, st.accepted, st.emitted, f.batch)
				}
			}
			gen := 0
			for i, s := range seqs {
				gen += len(s.toks) - f.prefill - 1 // the first generated token comes from the prefill
				ref, b, feats := replayPlain(t, m, s, f.prefill, tol == 0 && tc.acceptRate < 0)
				checkDSpark(t, m, s, ref, feats, tol)
				checkNextLogits(t, m, s, ref, b, i, tol)
			}
			if gen != emitted {
				t.Errorf("%d tokens generated, %d emitted by the steps", gen, emitted)
			}
		})
	}
}

// checkDSpark compares the next block's base logits of s (the drafter fed
// its queued features, on the host or the device) with those of a drafter
// on ref fed the features of every position but the last at once.
func checkDSpark(t *testing.T, m *model.Model, s *specSeq, ref *kvcache.Sequence, feats []float32, tol float64) {
	t.Helper()
	last := len(s.toks) - 1
	got, err := m.ForwardDSpark([]model.DSparkItem{{Seq: s.kv, Start: s.mtpLen, Context: s.feats, In: s.hidden, Anchor: s.toks[last], Draft: true}})
	if err != nil {
		t.Fatal(err)
	}
	want, err := m.ForwardDSpark([]model.DSparkItem{{Seq: ref, Context: feats, Anchor: s.toks[last], Draft: true}})
	if err != nil {
		t.Fatal(err)
	}
	if d := relDiff(got.Logits[0], want.Logits[0]); d > tol {
		t.Errorf("sequence %d: the drafter's next block differs from one fed every position's features by %g", s.kv.ID, d)
	}
}

// TestDSparkDraftPaths: dsparkDraft's drafts drawn on the device (the
// CPU backend's MarkovDraw) are the host path's, from the same state.
func TestDSparkDraftPaths(t *testing.T) {
	f := &stackFlags{preset: "small", batch: 3, prefillSeqs: 3, prefill: 20, seed: 5, numerics: "faithful",
		spec: engine.SpecConfig{Method: "dspark", NumTokens: 4}}
	full, err := checkpoint.PresetConfig("small")
	if err != nil {
		t.Fatal(err)
	}
	c, err := f.cut(full, 6)
	if err != nil {
		t.Fatal(err)
	}
	w, err := checkpoint.RandomWeights(c, checkpoint.GenOfficial, f.seed)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.New(w, nil, model.Options{CacheBytes: 2 * cacheFor(c, f), DSparkRows: 4})
	if err != nil {
		t.Fatal(err)
	}
	if !m.CanDrawDSpark() {
		t.Fatal("the CPU backend cannot draw DSpark drafts")
	}
	seqs := make([]*specSeq, f.batch)
	for i := range seqs {
		seqs[i] = &specSeq{kv: m.Cache().NewSequence()}
	}
	if err := dsparkPrefill(m, f, seqs, rand.New(rand.NewPCG(1, 2))); err != nil {
		t.Fatal(err)
	}
	host, hp, err := dsparkDraft(m, seqs, 4, false)
	if err != nil {
		t.Fatal(err)
	}
	dev, dp, err := dsparkDraft(m, seqs, 4, true)
	if err != nil {
		t.Fatal(err)
	}
	if hp.drawn || !dp.drawn {
		t.Errorf("drawn: host path %v, device path %v", hp.drawn, dp.drawn)
	}
	for i := range seqs {
		if !slices.Equal(host[i], dev[i]) || len(host[i]) != 4 {
			t.Errorf("sequence %d: drafts %v on the host, %v drawn on the device", i, host[i], dev[i])
		}
	}
}

// TestStackDSparkCPU runs bench stack with DSpark drafts at forced
// acceptances 1 (every draft accepted: mean acceptance length N + 1) and 0
// (none) and checks the report's lines; the weights line counts the
// drafter's tensors.
func TestStackDSparkCPU(t *testing.T) {
	full, err := checkpoint.PresetConfig("small")
	if err != nil {
		t.Fatal(err)
	}
	cut, err := checkpoint.CutLayers(full, 4, false)
	if err != nil {
		t.Fatal(err)
	}
	s, err := checkpoint.PresetDSpark("small")
	if err != nil {
		t.Fatal(err)
	}
	ds, err := checkpoint.WithDSpark(cut, s)
	if err != nil {
		t.Fatal(err)
	}
	weights := gib(checkpoint.TotalBytes(checkpoint.Tensors(ds, formatsOf(checkpoint.GenOfficial))))
	if weights == gib(checkpoint.TotalBytes(checkpoint.Tensors(cut, formatsOf(checkpoint.GenOfficial)))) {
		t.Fatalf("the drafter adds nothing to the weights (%s)", weights)
	}
	for _, tc := range []struct {
		rate, mean, perPos string
		draw               bool
		parts              string
	}{
		{"1", `4\.000`, `\[1\.000 1\.000 1\.000\]`, false, `block [0-9.]+ ms, Markov head [0-9.]+ ms over 3 positions`},
		{"0", `1\.000`, `\[0\.000 0\.000 0\.000\]`, true, `block with the Markov head's 3 positions drawn on the device [0-9.]+ ms`},
	} {
		t.Run("accept "+tc.rate, func(t *testing.T) {
			var out bytes.Buffer
			args := []string{"--preset", "small", "--layers", "4", "--device", "cpu", "--prefill", "8", "--decode", "3", "--batch", "2",
				"--speculative-config", `{"method":"dspark","num_speculative_tokens":3}`, "--accept-rate", tc.rate}
			if tc.draw {
				args = append(args, "--draw")
			}
			if err := runStack(args, &out, io.Discard); err != nil {
				t.Fatal(err)
			}
			for _, re := range []string{
				`(?m)^preset small  layers 4/6  mtp false `,
				`(?m)^dspark: 3 stages, dspark_block_size 4 \(blocks of 3 rows built\), markov rank 16, noise token \d+, target layers \[1 2 3\] \(the last 3 layers built; the whole model's would be 3–5\)$`,
				`(?m)^weights ` + regexp.QuoteMeta(weights) + ` \(checkpoint bytes\)`,
				`(?m)^speculative dspark N=3 \(forced acceptance: each draft accepted with probability ` + tc.rate + `\.00 regardless of the logits \(--accept-rate\)\)$`,
				`(?m)^draft\+verify 3 steps × batch 2 in \S+: [0-9.]+ tok/s  step median [0-9.]+ ms  min [0-9.]+ ms  max [0-9.]+ ms  mean acceptance length ` + tc.mean + `  per position ` + tc.perPos + `$`,
				`(?m)^speculative vs plain decoding: [0-9.]+ / [0-9.]+ tok/s = [0-9.]+x$`,
				`(?m)^parts of a step with drafts \(medians\): DSpark pass [0-9.]+ ms \(context [0-9.]+ ms, ` + tc.parts + `\), verification [0-9.]+ ms, rest -?[0-9.]+ ms `,
				`(?m)^projected 6-layer ratio = A × P / \(D \+ V \+ R\) = ` + tc.mean + ` × [0-9.]+ / \([0-9.]+ \+ [0-9.]+ \+ -?[0-9.]+\) = [0-9.]+x, where .* the DSpark pass does not grow with the layers`,
				`(?m)^DSpark pass floor: [0-9.]+ MiB of weights \(3 stages [0-9.]+ MiB with the experts of 6 rows, markov_w2 read 3 times [0-9.]+ MiB, head [0-9.]+ MiB\)$`,
			} {
				if !regexp.MustCompile(re).MatchString(out.String()) {
					t.Errorf("output lacks %s:\n%s", re, out.String())
				}
			}
		})
	}
}

// TestDSparkFloorBytes: the DSpark pass reads the same bytes whatever the
// layers built, markov_w2 once per draft position and the target's head
// once; a plain step's floor leaves the drafter out.
func TestDSparkFloorBytes(t *testing.T) {
	full, err := checkpoint.PresetConfig("flash")
	if err != nil {
		t.Fatal(err)
	}
	f := &stackFlags{preset: "flash", spec: engine.SpecConfig{Method: "dspark", NumTokens: 5}}
	formats := formatsOf(checkpoint.GenOfficial)
	floor := map[int]dsparkFloor{}
	for _, layers := range []int{4, 16, 43} {
		c, err := f.cut(full, layers)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []int{1, 5} {
			fl := dsparkFloorBytes(c, formats, 8, k)
			const markov, head = 129280 * 256 * 2, 129280 * 4096 * 2 // bf16
			if fl.markov != int64(k)*markov || fl.head != head || fl.stages <= 0 {
				t.Errorf("%d layers, k %d: markov %d (want %d), head %d (want %d), stages %d", layers, k, fl.markov, k*markov, fl.head, head, fl.stages)
			}
			if prev, ok := floor[k]; ok && prev != fl {
				t.Errorf("k %d: %d layers read %+v, fewer read %+v", k, layers, fl, prev)
			}
			floor[k] = fl
		}
		plain, err := checkpoint.CutLayers(full, layers, false)
		if err != nil {
			t.Fatal(err)
		}
		if a, b := decodeFloorSplit(c, formats, 8), decodeFloorSplit(plain, formats, 8); a != b {
			t.Errorf("%d layers: a plain step's floor %+v with the drafter, %+v without", layers, a, b)
		}
	}
	if one, five := floor[1], floor[5]; five.stages <= one.stages {
		t.Errorf("the experts of 40 rows (%d bytes) read no more than those of 8 (%d)", five.stages, one.stages)
	}
}

func TestStackDSparkFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--preset", "flash", "--layers", "4", "--speculative-config", `{"method":"dspark","num_speculative_tokens":6}`}, "num_speculative_tokens 6 out of [1, dspark_block_size 5]"},
		{[]string{"--preset", "small", "--speculative-config", `{"method":"dspark","num_speculative_tokens":5}`}, "num_speculative_tokens 5 out of [1, dspark_block_size 4]"},
		{[]string{"--speculative-config", `{"method":"dspark","num_speculative_tokens":-1}`}, "num_speculative_tokens -1 out of"},
		{[]string{"--speculative-config", `{"method":"eagle","num_speculative_tokens":2}`}, `method "eagle" unsupported`},
		{[]string{"--speculative-config", `{"method":"dspark","block":2}`}, `unknown field "block"`},
		{[]string{"--preset", "flash", "--layers", "2", "--speculative-config", `{"method":"dspark"}`}, "--layers 2: the DSpark drafter reads the last 3 layers built"},
		{[]string{"--mtp", "--speculative-config", `{"method":"dspark"}`}, `--mtp with method "dspark"`},
		{[]string{"--prefill", "1", "--speculative-config", `{"method":"dspark"}`}, "want --prefill >= 2"},
		{[]string{"--preset", "huge", "--speculative-config", `{"method":"dspark"}`}, "--preset"},
	} {
		_, err := parseStack(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.args, err, tc.want)
		}
	}
	// An absent count is dspark_block_size, as in serve.
	for preset, want := range map[string]int{"flash": 5, "pro": 5, "small": 4} {
		f, err := parseStack([]string{"--preset", preset, "--layers", "4", "--speculative-config", `{"method":"dspark"}`}, io.Discard)
		if err != nil || f.spec.NumTokens != want || f.mtp {
			t.Errorf("%s: %v, N = %v (want %d)", preset, err, f, want)
		}
	}
}
