package checkpoint

import (
	"bytes"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/megamoe/megamoe/num"
)

// linearRMS dequantises l in row blocks (the Flash head is 0.5 G values) and
// returns its rms.
func linearRMS(l *Linear) float64 {
	in := l.In
	var sum float64
	for r0 := 0; r0 < l.Out; r0 += 128 {
		rows := min(128, l.Out-r0)
		v := make([]float32, rows*in)
		switch l.Format {
		case FormatBF16:
			num.DecodeBF16(l.Weight.Data[2*r0*in:2*(r0+rows)*in], v)
		case FormatF32:
			num.DecodeF32(l.Weight.Data[4*r0*in:4*(r0+rows)*in], v)
		case FormatFP8Block:
			num.DequantFP8Block(l.Weight.Data[r0*in:], l.Scale.Data[r0/128*ceilDiv(in, 128):], rows, in, v)
		case FormatMXFP4:
			num.DequantMXFP4(l.Weight.Data[r0*in/2:], l.Scale.Data[r0*in/32:], rows, in, v)
		case FormatNVFP4:
			num.DequantNVFP4(l.Weight.Data[r0*in/2:], l.Scale.Data[r0*in/16:], l.Scale2, rows, in, v)
		}
		for _, x := range v {
			sum += float64(x) * float64(x)
		}
	}
	return math.Sqrt(sum / float64(l.Out*l.In))
}

func flashLayers(t *testing.T, n int) *Config {
	t.Helper()
	c, err := PresetConfig("flash")
	if err != nil {
		t.Fatal(err)
	}
	if c, err = CutLayers(c, n, true); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRandomWeights(t *testing.T) {
	cases := []struct {
		name   string
		cfg    func(t *testing.T) *Config
		format string
		long   bool // skipped in -short mode
	}{
		{"small official", func(*testing.T) *Config { return SmallConfig() }, GenOfficial, false},
		{"small nvfp4", func(*testing.T) *Config { return SmallConfig() }, GenNVFP4, false},
		// Layers 0..3 of Flash are SWA, SWA, CSA, HCA (plus the MTP block).
		{"flash 4 layers official", func(t *testing.T) *Config { return flashLayers(t, 4) }, GenOfficial, true},
		// Full-size layers, a cut vocabulary (the full one is tested above).
		{"flash 4 layers nvfp4 vocab 8k", func(t *testing.T) *Config {
			c := flashLayers(t, 4)
			c.Vocab = 8192
			return c
		}, GenNVFP4, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if testing.Short() && tc.long {
				t.Skip("full-size layers in -short mode")
			}
			c := tc.cfg(t)
			formats, _ := genFormats(tc.format)
			t0 := time.Now()
			w, err := RandomWeights(c, tc.format, 1)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("RandomWeights in %v", time.Since(t0))

			specs := Tensors(c, formats)
			want := map[string]TensorSpec{}
			for _, s := range specs {
				want[s.Name] = s
			}
			ts, ls := w.Tensors(), w.Linears()
			nScalars := 0
			for _, l := range ls {
				if l.Format == FormatNVFP4 {
					nScalars += 2 // weight_scale_2, input_scale are fields, not tensors
				}
			}
			if len(ts)+nScalars != len(specs) {
				t.Errorf("%d tensors (+%d NVFP4 scalars), name table has %d", len(ts), nScalars, len(specs))
			}
			for _, x := range ts {
				s, ok := want[x.Name]
				switch {
				case !ok:
					t.Errorf("unexpected tensor %q", x.Name)
				case x.DType != s.DType || !shapeOK(x.Shape, s.Shape):
					t.Errorf("%s: %s %v, want %s", x.Name, x.DType, x.Shape, s)
				case int64(len(x.Data)) != s.Bytes():
					t.Errorf("%s: %d bytes, want %d", x.Name, len(x.Data), s.Bytes())
				}
			}

			// Each distinct matrix once: its rms must be near 1/sqrt(in).
			seen := map[*byte]bool{}
			lo, hi := math.Inf(1), 0.0
			for _, l := range ls {
				if p := &l.Weight.Data[0]; !seen[p] {
					seen[p] = true
					got, wantRMS := linearRMS(l), 1/math.Sqrt(float64(l.In))
					r := got / wantRMS
					lo, hi = min(lo, r), max(hi, r)
					if !(r > 0.5 && r < 2) {
						t.Errorf("%s (%v %dx%d): rms %.4g, want within 2× of %.4g", l.Name, l.Format, l.Out, l.In, got, wantRMS)
					}
				}
				if l.Format == FormatNVFP4 && !(l.Scale2 > 0 && l.InputScale > 0) {
					t.Errorf("%s: scale2 %g input scale %g", l.Name, l.Scale2, l.InputScale)
				}
			}
			t.Logf("%d distinct matrices, rms/(1/sqrt(in)) in [%.3f, %.3f]", len(seen), lo, hi)
			if c.Dim > 1024 && len(seen) > 64 {
				t.Errorf("%d distinct matrices: the pool does not bound memory", len(seen))
			}
			for i := range w.Layers {
				for e, x := range w.Layers[i].FFN.Experts {
					if x.W1.Format == FormatNVFP4 && x.W1.Scale2 != x.W3.Scale2 {
						t.Errorf("layer %d expert %d: w1 scale2 %g != w3 scale2 %g", i, e, x.W1.Scale2, x.W3.Scale2)
					}
				}
			}
			for _, id := range must(w.Layers[0].FFN.Tid2Eid.Int64s()) {
				if id < 0 || id >= int64(c.Experts) {
					t.Fatalf("tid2eid id %d outside [0, %d)", id, c.Experts)
				}
			}
		})
	}
}

// TestRandomWeightsSeeded: one seed always gives the same values, another
// seed different ones.
func TestRandomWeightsSeeded(t *testing.T) {
	get := func(seed uint64) *Weights {
		w, err := RandomWeights(SmallConfig(), GenOfficial, seed)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	a, b, c := get(3), get(3), get(4)
	pick := func(w *Weights) [][]byte {
		l := &w.Layers[1]
		return [][]byte{w.Embed.Data, l.HcAttn.Fn.Data, l.Attn.WqB.Weight.Data, l.FFN.Experts[5].W2.Weight.Data, w.Head.Weight.Data}
	}
	for i, x := range pick(a) {
		if !bytes.Equal(x, pick(b)[i]) {
			t.Errorf("tensor %d differs between two runs of seed 3", i)
		}
		if bytes.Equal(x, pick(c)[i]) {
			t.Errorf("tensor %d is the same for seeds 3 and 4", i)
		}
	}
}

func TestRandomWeightsErrors(t *testing.T) {
	if _, err := RandomWeights(SmallConfig(), "int3", 1); err == nil {
		t.Error("unknown format accepted")
	}
	c := SmallConfig()
	c.Dim = 0
	if _, err := RandomWeights(c, GenOfficial, 1); err == nil {
		t.Error("invalid config accepted")
	}
}

func TestPresetConfig(t *testing.T) {
	cases := []struct {
		name                   string
		layers, dim, experts   int
		ratios0, ratiosLastMTP int
	}{
		{"small", 6, 256, 8, 0, 0},
		{"flash", 43, 4096, 256, 0, 0},
		{"pro", 61, 7168, 384, 128, 0},
	}
	for _, tc := range cases {
		c, err := PresetConfig(tc.name)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if c.Layers != tc.layers || c.Dim != tc.dim || c.Experts != tc.experts ||
			c.Ratio(0) != tc.ratios0 || c.Ratio(c.Layers) != tc.ratiosLastMTP {
			t.Errorf("%s: layers %d dim %d experts %d ratios %v", tc.name, c.Layers, c.Dim, c.Experts, c.CompressRatios)
		}
	}
	if _, err := PresetConfig("huge"); err == nil {
		t.Error("unknown preset accepted")
	}
}

func TestCutLayers(t *testing.T) {
	full, err := PresetConfig("flash")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		layers int
		mtp    bool
		ratios []int
		hash   int
		bad    bool
	}{
		{layers: 2, mtp: true, ratios: []int{0, 0, 0}, hash: 2},
		{layers: 4, mtp: false, ratios: []int{0, 0, 4, 128}, hash: 3},
		{layers: 43, mtp: true, ratios: full.CompressRatios, hash: 3},
		{layers: 0, bad: true},
		{layers: 44, bad: true},
	}
	for _, tc := range cases {
		c, err := CutLayers(full, tc.layers, tc.mtp)
		if tc.bad {
			if err == nil {
				t.Errorf("CutLayers(%d) accepted", tc.layers)
			}
			continue
		}
		if err != nil {
			t.Fatalf("CutLayers(%d): %v", tc.layers, err)
		}
		wantMTP := 0
		if tc.mtp {
			wantMTP = 1
		}
		if c.Layers != tc.layers || c.HashLayers != tc.hash || c.MTPLayers != wantMTP || !slices.Equal(c.CompressRatios, tc.ratios) {
			t.Errorf("CutLayers(%d, %v): layers %d hash %d mtp %d ratios %v", tc.layers, tc.mtp, c.Layers, c.HashLayers, c.MTPLayers, c.CompressRatios)
		}
	}
	if full.Layers != 43 || len(full.CompressRatios) != 44 {
		t.Error("CutLayers modified its argument")
	}
}
