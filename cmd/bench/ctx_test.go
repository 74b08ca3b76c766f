package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// TestStackContextCPU: --context prints one table row per depth, in order,
// and the same rows as JSON lines.
func TestStackContextCPU(t *testing.T) {
	jl := filepath.Join(t.TempDir(), "ctx.jsonl")
	var out bytes.Buffer
	args := []string{"--preset", "small", "--device", "cpu", "--context", "512,1K", "--batch", "2", "--prefill", "64", "--decode", "2", "--jsonl", jl}
	if err := runStack(args, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	num := `[0-9.]+`
	row := func(ctx string) string {
		return `(?m)^\| ` + ctx + ` \| 2 \| ` + num + ` \| ` + num + ` \| ` + num + ` \(` + num + `%\) \| ` + num + ` \(` + num + `%\) \| ` +
			num + ` \| ` + num + ` \| ` + num + ` \| ` + num + ` \|$`
	}
	for _, re := range []string{
		`(?m)^preset small  layers 6/6  mtp false  format official  device cpu  numerics faithful  batch 2$`,
		`(?m)^weights .* kv cache .* \(3 sequences of 1024 tokens, compact store\) .* copy rate [0-9]+ GB/s$`,
		`(?m)^per depth N: the batch filled to N-5, 2 untimed \+ 2 timed decode steps .* chunk of 64 tokens ending at N`,
		`(?m)^\| context \| batch \| decode step ms \| × first \| attention ms \(share\) \| indexer ms \(share\) \| indexer floor ms \| indexer / floor \| prefill tok/s \| fill s \|$`,
		row("512") + `\n` + row("1024")[4:],
	} {
		if !regexp.MustCompile(re).MatchString(out.String()) {
			t.Errorf("output lacks %s:\n%s", re, out.String())
		}
	}
	cfg := checkpoint.SmallConfig()
	kf, err := kvcache.NewIndexKeyFormat(cfg.IndexHeadDim)
	if err != nil {
		t.Fatal(err)
	}
	keyBytes := kf.Bytes()
	fh, err := os.Open(jl)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	var got []depthJSON
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		var d depthJSON
		if err := json.Unmarshal(sc.Bytes(), &d); err != nil {
			t.Fatalf("jsonl line %q: %v", sc.Text(), err)
		}
		got = append(got, d)
	}
	if len(got) != 2 || got[0].Context != 512 || got[1].Context != 1024 || got[1].Batch != 2 || got[1].Device != "cpu" ||
		len(got[1].DecodeStepsMs) != 2 || !(got[1].StepMs > 0 && got[1].IndexerMs > 0 && got[1].AttentionMs > 0 && got[1].PrefillTokS > 0) ||
		got[1].IndexerBytes != 2*3*((1024/4)*int64(keyBytes)+4*int64(cfg.IndexHeads*(cfg.IndexHeadDim+1))) { // 2 sequences, 3 CSA layers: keys, queries, weights
		t.Errorf("jsonl %+v", got)
	}
}

// TestStackContextReadsCache: a decode at depth reads the filled cache: its
// logits are finite and differ from those of the same token at depth 0, and
// the timed step saw the attention and indexer ops.
func TestStackContextReadsCache(t *testing.T) {
	f, err := parseStack([]string{"--preset", "small", "--device", "cpu", "--context", "600", "--prefill", "32", "--decode", "1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c, err := checkpoint.PresetConfig(f.preset)
	if err != nil {
		t.Fatal(err)
	}
	w, err := checkpoint.RandomWeights(c, f.format, f.seed)
	if err != nil {
		t.Fatal(err)
	}
	be, closeBE, err := openBackend(f)
	if err != nil {
		t.Fatal(err)
	}
	defer closeBE()
	dt := &depthTimer{Backend: be, time: wallTime}
	m, err := model.New(w, dt, model.Options{Numerics: f.numerics, CacheBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	r, err := runDepth(m, dt, f, 600)
	if err != nil {
		t.Fatal(err)
	}
	if r.attnUs <= 0 || r.idxUs <= 0 || len(r.steps) != 1 {
		t.Errorf("timed step: attention %v µs, indexer %v µs, %d timed steps", r.attnUs, r.idxUs, len(r.steps))
	}
	s := m.Cache().NewSequence()
	defer m.FreeSequence(s)
	out, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: []int32{r.firstTok}}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range r.first {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("non-finite logit %v at depth", v)
		}
	}
	if len(r.first) != c.Vocab || slices.Equal(r.first, out.Last(0)) {
		t.Errorf("the decode at depth 595 gave %d logits, equal to depth 0's: %v", len(r.first), slices.Equal(r.first, out.Last(0)))
	}
}

func TestStackContextBadFlags(t *testing.T) {
	cpu := []string{"--device", "cpu", "--preset", "small", "--prefill", "16", "--decode", "2"}
	for _, args := range [][]string{
		{"--context", "0"},
		{"--context", "-4K"},
		{"--context", "4X"},
		{"--context", "4K,"},
		{"--context", "2M"},   // beyond max_position_embeddings (1M)
		{"--context", "31"},   // less than two prefill chunks
		{"--jsonl", "x.json"}, // without --context
		{"--context", "1K", "--profile"},
		{"--context", "1K", "--tensor-parallel", "2"},
		{"--context", "1K", "--batch", "2", "--prefill-seqs", "2"},
		{"--context", "1K", "--preset", "flash"}, // no --layers
		{"--context", "1K", "--decode", "0"},
		{"--context", "1K", "--jsonl", "/nonexistent/dir/x.jsonl"},
	} {
		if err := runStack(append(slices.Clone(cpu), args...), io.Discard, io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

func TestParseDepths(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
	}{
		{"4096", []int{4096}},
		{"4K,32k, 128K,512K,1M", []int{4096, 32768, 131072, 524288, 1048576}},
		{"2m,100", []int{2 << 20, 100}},
	} {
		got, err := parseDepths(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("parseDepths(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "K", "1.5M", "0", "-1", "4G", "99999999999M"} {
		if _, err := parseDepths(in); err == nil {
			t.Errorf("parseDepths(%q) accepted", in)
		}
	}
}

// TestDeviceMemoryCheck: a shape that fits passes; one that does not is
// refused with the longest depth that fits at its batch.
func TestDeviceMemoryCheck(t *testing.T) {
	full, err := checkpoint.PresetConfig("flash")
	if err != nil {
		t.Fatal(err)
	}
	c, err := checkpoint.CutLayers(full, 4, false)
	if err != nil {
		t.Fatal(err)
	}
	layout, err := kvcache.LayoutFromConfig(c, kvcache.DefaultBlockTokens, kvcache.StoreCompact)
	if err != nil {
		t.Fatal(err)
	}
	f := &stackFlags{batch: 8, ctx: contextFlags{depths: []int{4096, 1 << 20}}}
	cache := 9 * kvcache.NewManager(layout, 0).BytesFor(1<<20)
	const gb = 1 << 30
	for _, tc := range []struct {
		name string
		free int64
		want string // "" fits
	}{
		{"fits", 20 * gb, ""},
		{"exactly", 16*gb + cache, ""},
		{"short", 16*gb + cache/2, `^--context 1048576 at --batch 8 does not fit on H: .* at most (52[0-9]{4}) tokens a sequence fit`},
		{"nothing left", 15 * gb, `at most 0 tokens a sequence fit`},
	} {
		m := deviceMemory{free: tc.free, weights: 15 * gb, cache: cache, other: gb}
		err := m.check(layout, f, "H")
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !regexp.MustCompile(tc.want).MatchString(err.Error())):
			t.Errorf("%s: got %v, want %s", tc.name, err, tc.want)
		}
	}
}
