package checkpoint

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/safetensors"
)

func loadTestConfig(t *testing.T, name string) *Config {
	t.Helper()
	data, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func specMap(specs []TensorSpec) map[string]TensorSpec {
	m := make(map[string]TensorSpec, len(specs))
	for _, s := range specs {
		m[s.Name] = s
	}
	return m
}

// TestTableAgainstSpec spot-checks the name table against the spec §8 table
// for the real Flash and Pro configs, and the published totals.
func TestTableAgainstSpec(t *testing.T) {
	type spot struct {
		name  string
		dtype safetensors.DType
		shape []int // nil: must be absent
	}
	cases := []struct {
		file      string
		tensors   int   // official
		bytes     int64 // official total_size (0: not published exactly)
		nvTensors int
		approxGiB float64 // published rounded size in GiB (0: none)
		nvBytes   int64
		spots     []spot
	}{
		{
			file: "flash-config.json", bytes: 159_609_485_896, nvTensors: 135_235, nvBytes: 168_266_793_544,
			spots: []spot{
				{"embed.weight", "BF16", []int{129280, 4096}},
				{"head.weight", "BF16", []int{129280, 4096}},
				{"norm.weight", "BF16", []int{4096}},
				{"hc_head_fn", "F32", []int{4, 16384}},
				{"hc_head_base", "F32", []int{4}},
				{"hc_head_scale", "F32", []int{1}},
				{"layers.0.hc_attn_fn", "F32", []int{24, 16384}},
				{"layers.7.hc_ffn_base", "F32", []int{24}},
				{"layers.7.hc_ffn_scale", "F32", []int{3}},
				{"layers.0.attn.attn_sink", "F32", []int{64}},
				{"layers.0.attn.wq_a.weight", "F8_E4M3", []int{1024, 4096}},
				{"layers.0.attn.wq_a.scale", "F8_E8M0", []int{8, 32}},
				{"layers.5.attn.wq_b.weight", "F8_E4M3", []int{32768, 1024}},
				{"layers.5.attn.wq_b.scale", "F8_E8M0", []int{256, 8}},
				{"layers.5.attn.wkv.scale", "F8_E8M0", []int{4, 32}},
				{"layers.5.attn.kv_norm.weight", "BF16", []int{512}},
				{"layers.9.attn.wo_a.weight", "F8_E4M3", []int{8192, 4096}},
				{"layers.9.attn.wo_a.scale", "F8_E8M0", []int{64, 32}},
				{"layers.9.attn.wo_b.scale", "F8_E8M0", []int{32, 64}},
				// SWA layers 0, 1: no compressor.
				{"layers.1.attn.compressor.ape", "", nil},
				{"layers.0.attn.indexer.wq_b.weight", "", nil},
				// CSA layer 2 and 42.
				{"layers.2.attn.compressor.wkv.weight", "BF16", []int{1024, 4096}},
				{"layers.2.attn.compressor.wgate.weight", "BF16", []int{1024, 4096}},
				{"layers.2.attn.compressor.ape", "F32", []int{4, 1024}},
				{"layers.2.attn.compressor.norm.weight", "BF16", []int{512}},
				{"layers.42.attn.indexer.wq_b.weight", "F8_E4M3", []int{8192, 1024}},
				{"layers.42.attn.indexer.wq_b.scale", "F8_E8M0", []int{64, 8}},
				{"layers.42.attn.indexer.weights_proj.weight", "BF16", []int{64, 4096}},
				{"layers.42.attn.indexer.compressor.wkv.weight", "BF16", []int{256, 4096}},
				{"layers.42.attn.indexer.compressor.ape", "F32", []int{4, 256}},
				{"layers.42.attn.indexer.compressor.norm.weight", "BF16", []int{128}},
				// HCA layer 3: compressor, no indexer.
				{"layers.3.attn.compressor.wkv.weight", "BF16", []int{512, 4096}},
				{"layers.3.attn.compressor.ape", "F32", []int{128, 512}},
				{"layers.3.attn.indexer.weights_proj.weight", "", nil},
				// MoE, hash layers 0..2.
				{"layers.10.ffn.gate.weight", "BF16", []int{256, 4096}},
				{"layers.2.ffn.gate.tid2eid", "I64", []int{129280, 6}},
				{"layers.2.ffn.gate.bias", "", nil},
				{"layers.3.ffn.gate.bias", "F32", []int{256}},
				{"layers.3.ffn.gate.tid2eid", "", nil},
				{"layers.4.ffn.shared_experts.w1.weight", "F8_E4M3", []int{2048, 4096}},
				{"layers.4.ffn.shared_experts.w3.scale", "F8_E8M0", []int{16, 32}},
				{"layers.4.ffn.shared_experts.w2.scale", "F8_E8M0", []int{32, 16}},
				{"layers.42.ffn.experts.255.w1.weight", "I8", []int{2048, 2048}},
				{"layers.42.ffn.experts.255.w1.scale", "F8_E8M0", []int{2048, 128}},
				{"layers.0.ffn.experts.0.w2.weight", "I8", []int{4096, 1024}},
				{"layers.0.ffn.experts.0.w2.scale", "F8_E8M0", []int{4096, 64}},
				{"layers.0.ffn.experts.256.w2.scale", "", nil},
				{"layers.43.attn_norm.weight", "", nil},
				// MTP block.
				{"mtp.0.e_proj.weight", "F8_E4M3", []int{4096, 4096}},
				{"mtp.0.h_proj.scale", "F8_E8M0", []int{32, 32}},
				{"mtp.0.enorm.weight", "BF16", []int{4096}},
				{"mtp.0.hnorm.weight", "BF16", []int{4096}},
				{"mtp.0.norm.weight", "BF16", []int{4096}},
				{"mtp.0.hc_head_fn", "F32", []int{4, 16384}},
				{"mtp.0.hc_head_scale", "F32", []int{1}},
				{"mtp.0.hc_attn_fn", "F32", []int{24, 16384}},
				{"mtp.0.ffn.gate.bias", "F32", []int{256}},
				{"mtp.0.ffn.gate.tid2eid", "", nil},
				{"mtp.0.attn.compressor.wkv.weight", "", nil},
				{"mtp.0.ffn.experts.17.w3.scale", "F8_E8M0", []int{2048, 128}},
				{"mtp.0.embed.weight", "", nil},
			},
		},
		{
			file: "pro-config.json", tensors: 145_116, approxGiB: 805,
			spots: []spot{
				{"embed.weight", "BF16", []int{129280, 7168}},
				{"hc_head_fn", "F32", []int{4, 28672}},
				{"layers.0.hc_attn_fn", "F32", []int{24, 28672}},
				{"layers.0.attn.attn_sink", "F32", []int{128}},
				{"layers.0.attn.wq_a.weight", "F8_E4M3", []int{1536, 7168}},
				{"layers.0.attn.wq_a.scale", "F8_E8M0", []int{12, 56}},
				{"layers.0.attn.wq_b.scale", "F8_E8M0", []int{512, 12}},
				{"layers.0.attn.wkv.scale", "F8_E8M0", []int{4, 56}},
				{"layers.0.attn.wo_a.weight", "F8_E4M3", []int{16384, 4096}},
				{"layers.0.attn.wo_a.scale", "F8_E8M0", []int{128, 32}},
				{"layers.0.attn.wo_b.scale", "F8_E8M0", []int{56, 128}},
				// Pro layers 0, 1 are HCA: 128-row ape, no indexer.
				{"layers.0.attn.compressor.ape", "F32", []int{128, 512}},
				{"layers.1.attn.compressor.wkv.weight", "BF16", []int{512, 7168}},
				{"layers.1.attn.indexer.wq_b.weight", "", nil},
				{"layers.60.attn.indexer.wq_b.scale", "F8_E8M0", []int{64, 12}},
				{"layers.60.attn.indexer.compressor.wgate.weight", "BF16", []int{256, 7168}},
				{"layers.60.attn.compressor.ape", "F32", []int{4, 1024}},
				{"layers.59.attn.compressor.ape", "F32", []int{128, 512}},
				{"layers.2.ffn.gate.tid2eid", "I64", []int{129280, 6}},
				{"layers.3.ffn.gate.bias", "F32", []int{384}},
				{"layers.5.ffn.shared_experts.w1.scale", "F8_E8M0", []int{24, 56}},
				{"layers.5.ffn.shared_experts.w2.scale", "F8_E8M0", []int{56, 24}},
				{"layers.5.ffn.experts.383.w1.weight", "I8", []int{3072, 3584}},
				{"layers.5.ffn.experts.383.w1.scale", "F8_E8M0", []int{3072, 224}},
				{"layers.5.ffn.experts.0.w2.weight", "I8", []int{7168, 1536}},
				{"layers.5.ffn.experts.0.w2.scale", "F8_E8M0", []int{7168, 96}},
				{"mtp.0.e_proj.scale", "F8_E8M0", []int{56, 56}},
				{"mtp.0.attn.compressor.ape", "", nil},
				{"layers.61.ffn.gate.weight", "", nil},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			c := loadTestConfig(t, tc.file)
			specs := Tensors(c, OfficialFormats)
			m := specMap(specs)
			if len(m) != len(specs) {
				t.Fatalf("name table has %d duplicate names", len(specs)-len(m))
			}
			for _, s := range tc.spots {
				got, ok := m[s.name]
				if s.shape == nil {
					if ok {
						t.Errorf("%s should be absent, table has %s", s.name, got)
					}
					continue
				}
				if !ok {
					t.Errorf("%s missing from table", s.name)
					continue
				}
				if got.DType != s.dtype || !slices.Equal(got.Shape, s.shape) {
					t.Errorf("%s = %s, want %s %v", s.name, got, s.dtype, s.shape)
				}
			}
			total := TotalBytes(specs)
			t.Logf("%s official: %d tensors, %d bytes", tc.file, len(specs), total)
			if tc.tensors != 0 && len(specs) != tc.tensors {
				t.Errorf("official tensor count %d, published %d", len(specs), tc.tensors)
			}
			if tc.bytes != 0 && total != tc.bytes {
				t.Errorf("official total %d bytes, published %d (diff %d)", total, tc.bytes, total-tc.bytes)
			}
			if g := float64(total) / (1 << 30); tc.approxGiB != 0 && (g < tc.approxGiB-1 || g > tc.approxGiB+1) {
				t.Errorf("official total %.1f GiB, published about %g", g, tc.approxGiB)
			}
			nv := Tensors(c, NVFP4Formats)
			nvTotal := TotalBytes(nv)
			t.Logf("%s nvfp4: %d tensors, %d bytes", tc.file, len(nv), nvTotal)
			if tc.nvTensors != 0 && len(nv) != tc.nvTensors {
				t.Errorf("nvfp4 tensor count %d, published %d", len(nv), tc.nvTensors)
			}
			if tc.nvBytes != 0 && nvTotal != tc.nvBytes {
				t.Errorf("nvfp4 total %d bytes, published %d (diff %d)", nvTotal, tc.nvBytes, nvTotal-tc.nvBytes)
			}
			// Every MTP expert stays MXFP4 in the NVFP4 layout; every main one is NVFP4.
			nvm := specMap(nv)
			for _, n := range []string{"mtp.0.ffn.experts.3.w1.scale"} {
				if s, ok := nvm[n]; !ok || s.DType != safetensors.F8E8M0 {
					t.Errorf("nvfp4 layout: %s = %v, want MXFP4 E8M0 scale", n, s)
				}
			}
			for _, s := range nv {
				if strings.HasPrefix(s.Name, "layers.") && strings.Contains(s.Name, ".ffn.experts.") && strings.HasSuffix(s.Name, ".scale") {
					t.Fatalf("nvfp4 layout still has MXFP4 scale %s", s.Name)
				}
			}
			if s := nvm["layers.4.ffn.experts.9.w2.weight_scale"]; s.DType != safetensors.F8E4M3 || !slices.Equal(s.Shape, []int{c.Dim, c.MoEInter / 16}) {
				t.Errorf("nvfp4 w2.weight_scale = %v", s)
			}
			if s := nvm["layers.4.ffn.experts.9.w2.weight_scale_2"]; s.DType != safetensors.F32 || len(s.Shape) != 0 {
				t.Errorf("nvfp4 w2.weight_scale_2 = %v", s)
			}
		})
	}
}
