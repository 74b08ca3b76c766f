package main

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/model"
)

// TestStackSmallCPU runs the whole small stack with random weights on the CPU
// backend (prefill and batched decode, finite logits) in both formats.
func TestStackSmallCPU(t *testing.T) {
	for _, format := range []string{"official", "nvfp4"} {
		var out bytes.Buffer
		args := []string{"--preset", "small", "--device", "cpu", "--format", format, "--prefill", "20", "--decode", "3", "--batch", "2", "--mtp"}
		if err := runStack(args, &out, io.Discard); err != nil {
			t.Fatalf("%s: %v", format, err)
		}
		for _, re := range []string{
			`(?m)^preset small  layers 6/6  mtp true  format ` + format + `  device cpu  numerics faithful$`,
			`(?m)^weights [0-9.]+ MiB \(checkpoint bytes\)  host heap .*  kv cache [0-9.]+ MiB$`,
			`(?m)^generate \S+  load \S+$`,
			`(?m)^prefill 40 tokens \(2 × 20\) in \S+: [0-9.]+ tok/s$`,
			`(?m)^decode 3 steps × batch 2 in \S+: [0-9.]+ tok/s  step median [0-9.]+ ms  min [0-9.]+ ms  max [0-9.]+ ms$`,
			`(?m)^finite: every logits row of 2 prefills and 3 decode steps$`,
		} {
			if !regexp.MustCompile(re).MatchString(out.String()) {
				t.Errorf("%s: output lacks %s:\n%s", format, re, out.String())
			}
		}
	}
}

// TestStackLayers: --layers cuts the stack; 0 on the CPU means all layers of
// the small preset only.
func TestStackLayers(t *testing.T) {
	var out bytes.Buffer
	if err := runStack([]string{"--preset", "small", "--device", "cpu", "--layers", "3", "--prefill", "5", "--decode", "1"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "layers 3/6  mtp false") {
		t.Errorf("output:\n%s", out.String())
	}
	out.Reset()
	if err := runStack([]string{"--model", "synth:small:2", "--device", "cpu", "--prefill", "5", "--decode", "1"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "preset small  layers 2/6") {
		t.Errorf("--model synth:small:2 output:\n%s", out.String())
	}
}

// TestStackNonFinite: a NaN norm weight fails the run with the step and
// sequence, and the traced rerun names the component.
func TestStackNonFinite(t *testing.T) {
	f, err := parseStack([]string{"--preset", "small", "--device", "cpu", "--prefill", "4", "--decode", "1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	f.corrupt = func(w *checkpoint.Weights) {
		d := w.Layers[2].FFNNorm.Data
		for i := 0; i < len(d); i += 2 {
			d[i], d[i+1] = 0xc0, 0x7f // bf16 NaN
		}
	}
	var stderr bytes.Buffer
	err = stack(f, io.Discard, &stderr)
	var nf *model.NonFiniteError
	if !errors.As(err, &nf) || nf.Layer != 2 {
		t.Fatalf("got %v, want a traced non-finite error in layer 2", err)
	}
	if !strings.Contains(stderr.String(), "prefill: sequence 0") {
		t.Errorf("stderr lacks the untraced failure: %q", stderr.String())
	}
	t.Log(err)
}

func TestStackBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--preset", "huge", "--device", "cpu"},
		{"--format", "int3", "--device", "cpu"},
		{"--device", "tpu"},
		{"--prefill", "0", "--device", "cpu"},
		{"--batch", "0", "--device", "cpu"},
		{"--batch", "2", "--prefill-seqs", "3", "--device", "cpu"},
		{"--prefill-seqs", "0", "--device", "cpu"},
		{"--decode", "-1", "--device", "cpu"},
		{"--warmup", "-1", "--device", "cpu"},
		{"--layers", "-1", "--device", "cpu"},
		{"--layers", "7", "--preset", "small", "--device", "cpu"},
		{"--numerics", "sloppy", "--device", "cpu"},
		{"--nope"},
		{"--device", "cpu", "extra"},
		{"--model", "synth:flash:44", "--device", "cpu"},
		{"--model", "/data/flash", "--device", "cpu"},
		// Full-size presets on the CPU need an explicit layer count (and
		// fail before allocating anything).
		{"--preset", "flash", "--device", "cpu"},
		{"--tensor-parallel", "0", "--device", "cpu"},
		{"--tensor-parallel", "2", "--preset", "flash", "--device", "cpu"},
		{"--tensor-parallel", "2", "--preset", "small-tp", "--device", "cpu", "--profile"},
		{"--tensor-parallel", "3", "--preset", "small-tp", "--device", "cpu"}, // 4 heads
	} {
		if err := runStack(args, io.Discard, io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// TestStackProfile: --profile prints a prefill and a decode breakdown whose
// rows name the ops the served path runs, fused ones included, with per-step
// call counts that follow from its 6 layers (every layer runs
// experts_combine_post once per step, which holds the ffn site's hc post, so
// hc_post runs once a layer; the 3 layers with an indexer run
// rope_hadamard_fp4).
func TestStackProfile(t *testing.T) {
	var out bytes.Buffer
	args := []string{"--preset", "small", "--device", "cpu", "--prefill", "16", "--decode", "2", "--profile"}
	if err := runStack(args, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{
		`(?m)^profile prefill: 1 steps, [0-9.]+ ms/step wall \(profiled\), ops [0-9.]+ ms/step, host and transfers -?[0-9.]+ ms/step$`,
		`(?m)^profile decode \(batch 1\): 2 steps, `,
		`(?m)^  experts_combine_post +[0-9.]+ ms/step +[0-9.]+% +6\.0 calls/step$`,
		`(?m)^  hc_post +[0-9.]+ ms/step +[0-9.]+% +6\.0 calls/step$`,
		`(?m)^  rope_hadamard_fp4 +[0-9.]+ ms/step +[0-9.]+% +3\.0 calls/step$`,
		`(?m)^  norm_linears attn\.wq_b 768x128[ a-z_.0-9x]* +[0-9.]+ ms/step`,
		`(?m)^  hc_pre_norm_linears attn\.wq_a 128x256 attn\.wkv 128x256 +[0-9.]+ ms/step +[0-9.]+% +6\.0 calls/step$`,
		`(?m)^  sparse_attention +[0-9.]+ ms/step +[0-9.]+% +6\.0 calls/step$`,
	} {
		if !regexp.MustCompile(re).MatchString(out.String()) {
			t.Errorf("output lacks %s:\n%s", re, out.String())
		}
	}
}

// TestStackParallel: --tensor-parallel 2 runs the small-tp stack split over
// two CPU ranks and reports the collectives: per forward, one all-reduce
// after each layer's attention and one after its routed experts (6 layers:
// 12), and one all-gather of the head.
func TestStackParallel(t *testing.T) {
	var out bytes.Buffer
	args := []string{"--preset", "small-tp", "--device", "cpu", "--tensor-parallel", "2", "--prefill", "12", "--decode", "3", "--batch", "2"}
	if err := runStack(args, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{
		`(?m)^preset small-tp  layers 6/6  format official  device cpu  numerics faithful  tensor-parallel 2$`,
		`(?m)^finite: every logits row of 2 prefills and 3 decode steps$`,
		`(?m)^collectives on rank 0: 60 all-reduce [0-9.]+ ms, 5 all-gather [0-9.]+ ms in 5 forwards \([0-9.]+ ms per forward\)$`,
	} {
		if !regexp.MustCompile(re).MatchString(out.String()) {
			t.Errorf("output lacks %s:\n%s", re, out.String())
		}
	}
}

// TestStackPrefillSeqs: prefilling three sequences in one step gives the
// same greedy tokens (after the prefill and every decode step) as one
// sequence a step, and the output names the step shape.
func TestStackPrefillSeqs(t *testing.T) {
	tokens := func(seqs int) []int32 {
		f, err := parseStack([]string{"--preset", "small", "--device", "cpu", "--prefill", "9", "--decode", "2",
			"--batch", "3", "--prefill-seqs", strconv.Itoa(seqs)}, io.Discard)
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
		m, err := model.New(w, be, model.Options{Numerics: f.numerics, CacheBytes: cacheFor(c, f)})
		if err != nil {
			t.Fatal(err)
		}
		r, err := runPlan(m, f, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r.tokens
	}
	one, three := tokens(1), tokens(3)
	if !slices.Equal(one, three) {
		t.Errorf("tokens with one sequence a prefill step %v, with three %v", one, three)
	}
	var out bytes.Buffer
	if err := runStack([]string{"--preset", "small", "--device", "cpu", "--prefill", "5", "--decode", "1", "--batch", "2", "--prefill-seqs", "2"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^prefill 10 tokens \(2 × 5, 2 a step\) in \S+: [0-9.]+ tok/s$`).MatchString(out.String()) {
		t.Errorf("output:\n%s", out.String())
	}
}

// TestParseVariants: --variants names each run's side stream, MoE, linear and attention paths,
// labels the runs, and refuses unknown names and what it cannot combine with.
func TestParseVariants(t *testing.T) {
	got, err := parseVariants("default; no-side ;ns=no-side,default;;moe-decf16;m=moe-decf16,no-side;moe-dec;moe-decpre;u=unfused;dense-decsk;d=dense-deccta,moe-dec;attn-split;c=attn-cluster,moe-dec;attn-row")
	if err != nil {
		t.Fatal(err)
	}
	want := []variant{
		{label: "default"},
		{label: "no-side", noSide: true},
		{label: "ns", noSide: true},
		{label: "default"},
		{label: "moe-decf16", moe: cuda.PathDecF16},
		{label: "m", noSide: true, moe: cuda.PathDecF16},
		{label: "moe-dec", moe: cuda.PathDec},
		{label: "moe-decpre", moe: cuda.PathDecPre},
		{label: "u", unfused: true},
		{label: "dense-decsk", linear: cuda.PathDecSK},
		{label: "d", linear: cuda.PathDecCTA, moe: cuda.PathDec},
		{label: "attn-split", attn: cuda.PathAttnSplit},
		{label: "c", moe: cuda.PathDec, attn: cuda.PathAttnCluster},
		{label: "attn-row", attn: cuda.PathAttnRow},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseVariants = %+v\nwant %+v", got, want)
	}
	for _, args := range [][]string{
		{"--variants", "nope"},
		{"--variants", "no-side;f32-simt"}, // a removed experiment
		{"--kernel-opts", "f32-simt"},
		{"--variants", "no-side", "--side-stream=false"},
		{"--variants", "no-side", "--device", "cpu"},
		{"--variants", "no-side", "--profile"},
		{"--attn-path", "clusters"},
	} {
		if _, err := parseStack(args, io.Discard); err == nil {
			t.Errorf("bench stack accepted %q", args)
		}
	}
}
