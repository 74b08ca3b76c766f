package checkpoint

import (
	"strings"
	"testing"
)

func TestQuantConfigNVFP4(t *testing.T) {
	current := `{"producer": {"name": "modelopt", "version": "dsv4-nvfp4-experts"},
	 "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": null, "group_size": 16,
	  "quantized_layers": {"layers.1.ffn.experts": {"quant_algo": "NVFP4", "group_size": 16}},
	  "exclude_modules": ["*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"]}}`
	old := `{"producer": {"name": "modelopt"}, "quantization": {"quant_algo": null,
	  "quantized_layers": {"layers.1.ffn.experts.4.w2": {"quant_algo": "NVFP4", "awq_block_size": 16}}}}`
	cases := []struct {
		doc, linear string
		want        bool
	}{
		{current, "layers.1.ffn.experts.4.w2", true},
		{current, "layers.1.ffn.experts.0.w1", true},
		{current, "layers.10.ffn.experts.0.w1", false},
		{current, "layers.11.ffn.experts.0.w1", false},
		{current, "mtp.0.ffn.experts.0.w1", false},
		{current, "layers.1.ffn.shared_experts.w1", false},
		{old, "layers.1.ffn.experts.4.w2", true},
		{old, "layers.1.ffn.experts.4.w1", false},
		{old, "layers.1.ffn.experts.40.w2", false},
	}
	for _, tc := range cases {
		q, err := ParseQuantConfig([]byte(tc.doc))
		if err != nil {
			t.Fatal(err)
		}
		if got := q.NVFP4(tc.linear); got != tc.want {
			t.Errorf("NVFP4(%s) = %v, want %v", tc.linear, got, tc.want)
		}
	}
	var nilQ *QuantConfig
	if nilQ.NVFP4("layers.0.ffn.experts.0.w1") {
		t.Error("nil config declares NVFP4")
	}
	for _, bad := range []struct{ doc, want string }{
		{`{"quantization": {"quantized_layers": {"layers.0.ffn.experts": {"quant_algo": "FP8"}}}}`, `quant_algo "FP8" unsupported`},
		{`{"quantization": {"quantized_layers": {"layers.0.ffn.experts": {"quant_algo": "NVFP4", "group_size": 32}}}}`, "group size 32"},
		{`{"quantization": {"quantized_layers": {"layers.0.attn.wq_a": {"quant_algo": "NVFP4"}}}}`, "only routed experts"},
		{`[1, 2]`, "hf_quant_config.json"},
	} {
		if _, err := ParseQuantConfig([]byte(bad.doc)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseQuantConfig(%s) = %v, want error with %q", bad.doc, err, bad.want)
		}
	}
}

func TestLinearTensors(t *testing.T) {
	l := LinearSpec{Name: "x", Kind: KindExpert, Out: 200, In: 300}
	cases := []struct {
		f    Format
		want string
	}{
		{FormatBF16, "x.weight BF16 [200 300]"},
		{FormatF32, "x.weight F32 [200 300]"},
		{FormatFP8Block, "x.weight F8_E4M3 [200 300]; x.scale F8_E8M0 [2 3]"},
		{FormatMXFP4, "x.weight I8 [200 150]; x.scale F8_E8M0 [200 10]"},
		{FormatNVFP4, "x.weight U8 [200 150]; x.weight_scale F8_E4M3 [200 19]; x.weight_scale_2 F32 []; x.input_scale F32 []"},
	}
	for _, tc := range cases {
		var parts []string
		for _, s := range LinearTensors(l, tc.f) {
			parts = append(parts, s.Name+" "+s.String())
		}
		if got := strings.Join(parts, "; "); got != tc.want {
			t.Errorf("%v: %s, want %s", tc.f, got, tc.want)
		}
	}
}
