package checkpoint

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/safetensors"
)

// TestDSparkCheckpointLoads: the small-dspark preset writes the published
// DSpark config fields (compress_ratios with a zero per stage,
// num_nextn_predict_layers 1) and mtp.* stages, which load as the DSpark
// drafter and not as an MTP block; a missing or an extra draft tensor is
// refused by name.
func TestDSparkCheckpointLoads(t *testing.T) {
	dir := t.TempDir()
	w, st, err := GenerateLoad(dir, GenSpec{Seed: 2, Preset: "small-dspark"})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	c := w.Config
	if !c.HasDSpark() || c.DSparkLayers() != 3 || c.MTPLayers != 0 || len(w.MTP) != 0 {
		t.Fatalf("dspark %v, %d stages, %d MTP layers, %d MTP blocks", c.HasDSpark(), c.DSparkLayers(), c.MTPLayers, len(w.MTP))
	}
	ds := w.DSpark
	if ds == nil || len(ds.Layers) != 3 || ds.Layers[2].Index != c.Layers+2 || !ds.MarkovW2.Weight.Valid() || !ds.Confidence.Weight.Valid() ||
		ds.MainProj.In != c.Dim*3 || ds.Layers[0].Attn.Compressor != nil || ds.Layers[1].FFN.Hash() {
		t.Fatalf("drafter bound wrongly: %+v", ds)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	if m["num_nextn_predict_layers"] != 1.0 || len(m["compress_ratios"].([]any)) != c.Layers+3 || m["dspark_block_size"] != 4.0 {
		t.Errorf("config.json: %s", raw)
	}
	names := map[string]bool{}
	for _, s := range Tensors(c, nil) {
		names[s.Name] = true
	}
	for _, n := range []string{"mtp.0.main_proj.weight", "mtp.0.main_norm.weight", "mtp.2.markov_head.markov_w1.weight",
		"mtp.2.markov_head.markov_w2.weight", "mtp.2.confidence_head.proj.weight", "mtp.2.hc_head_fn", "mtp.1.ffn.gate.bias"} {
		if !names[n] {
			t.Errorf("name table lacks %s", n)
		}
	}
	for _, n := range []string{"mtp.0.e_proj.weight", "mtp.0.enorm.weight", "mtp.1.main_proj.weight", "mtp.0.markov_head.markov_w1.weight"} {
		if names[n] {
			t.Errorf("name table has %s", n)
		}
	}
	// Drop a draft tensor and add a stray one: both are reported by name.
	es, _, err := genEntries(c, GenOfficial, 2, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	es = drop("mtp.2.confidence_head.proj.weight")(es)
	es = append(es, genEntry{name: "mtp.3.norm.weight", dtype: safetensors.BF16, shape: []int{c.Dim}, data: make([]byte, 2*c.Dim)})
	bad := t.TempDir()
	if err := writeFiles(bad, c, GenOfficial, es, 0, nil); err != nil {
		t.Fatal(err)
	}
	_, _, err = Load(bad)
	if err == nil || !strings.Contains(err.Error(), "missing tensor mtp.2.confidence_head.proj.weight") || !strings.Contains(err.Error(), "unexpected tensor mtp.3.norm.weight") {
		t.Errorf("load with a missing and a stray draft tensor: %v", err)
	}
}

func TestDSparkConfigErrors(t *testing.T) {
	base := func() map[string]any {
		return map[string]any{"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2, "head_dim": 64,
			"qk_rope_head_dim": 32, "q_lora_rank": 32, "o_lora_rank": 32, "o_groups": 1, "sliding_window": 8,
			"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "hc_mult": 2,
			"vocab_size": 100, "rope_theta": 10000, "routed_scaling_factor": 1.5, "num_nextn_predict_layers": 1,
			"compress_ratios": []int{0, 0, 0, 0, 0}, "dspark_block_size": 5, "dspark_noise_token_id": 99,
			"dspark_target_layer_ids": []int{0, 1}, "dspark_markov_rank": 8}
	}
	for _, tc := range []struct {
		name string
		edit func(m map[string]any)
		want string
	}{
		{"valid", func(map[string]any) {}, ""},
		{"no stage", func(m map[string]any) { m["compress_ratios"] = []int{0, 0} }, "trailing entries for the DSpark stages"},
		{"compressed stage", func(m map[string]any) { m["compress_ratios"] = []int{0, 0, 4} }, "must be sliding-window"},
		{"target layer out of range", func(m map[string]any) { m["dspark_target_layer_ids"] = []int{0, 2} }, "dspark_target_layer_ids[1] = 2 outside"},
		{"target layers not increasing", func(m map[string]any) { m["dspark_target_layer_ids"] = []int{1, 1} }, "must increase"},
		{"no target layers", func(m map[string]any) { delete(m, "dspark_target_layer_ids") }, "dspark_target_layer_ids missing"},
		{"noise token missing", func(m map[string]any) { delete(m, "dspark_noise_token_id") }, "dspark_noise_token_id missing"},
		{"noise token outside", func(m map[string]any) { m["dspark_noise_token_id"] = 100 }, "dspark_noise_token_id = 100 outside"},
		{"block size", func(m map[string]any) { m["dspark_block_size"] = 0 }, "dspark_block_size = 0"},
		{"rank", func(m map[string]any) { m["dspark_markov_rank"] = -1 }, "dspark_markov_rank = -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := base()
			tc.edit(m)
			data, _ := json.Marshal(m)
			c, err := ParseConfig(data)
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want == "" && (c.DSparkLayers() != 3 || c.MTPLayers != 0):
				t.Fatalf("%d stages, %d MTP layers", c.DSparkLayers(), c.MTPLayers)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}
