package checkpoint

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestWithDSpark: a preset's DSpark drafter reads the last layers built
// (the published [40, 41, 42] on the whole Flash), its stages add
// sliding-window compress_ratios entries and replace the MTP block, and its
// tensors have the published shapes.
func TestWithDSpark(t *testing.T) {
	for _, tc := range []struct {
		preset  string
		layers  int // 0: all
		targets []int
		tensors map[string][]int // name: shape
	}{
		{"flash", 0, []int{40, 41, 42}, map[string][]int{
			"mtp.0.main_proj.weight":                     {4096, 3 * 4096},
			"mtp.2.markov_head.markov_w1.weight":         {129280, 256},
			"mtp.2.markov_head.markov_w2.weight":         {129280, 256},
			"mtp.1.ffn.gate.bias":                        {256},
			"mtp.2.confidence_head.proj.weight":          {1, 4096 + 256},
			"mtp.2.hc_head_fn":                           {4, 4 * 4096},
			"mtp.0.main_norm.weight":                     {4096},
			"mtp.2.norm.weight":                          {4096},
			"mtp.2.markov_head.markov_w1.weight.missing": nil,
		}},
		{"flash", 4, []int{1, 2, 3}, map[string][]int{"mtp.0.main_proj.weight": {4096, 3 * 4096}, "layers.3.attn.wkv.weight": {512, 4096}}},
		{"pro", 0, []int{58, 59, 60}, map[string][]int{"mtp.0.main_proj.weight": {7168, 3 * 7168}, "mtp.2.markov_head.markov_w2.weight": {129280, 256}}},
		{"small", 0, []int{3, 4, 5}, map[string][]int{"mtp.2.markov_head.markov_w2.weight": {SmallVocab, 16}}},
	} {
		t.Run(fmt.Sprintf("%s %d layers", tc.preset, tc.layers), func(t *testing.T) {
			full, err := PresetConfig(tc.preset)
			if err != nil {
				t.Fatal(err)
			}
			c := full
			if tc.layers > 0 {
				if c, err = CutLayers(full, tc.layers, false); err != nil {
					t.Fatal(err)
				}
			}
			s, err := PresetDSpark(tc.preset)
			if err != nil {
				t.Fatal(err)
			}
			mtp, ratios := c.MTPLayers, len(c.CompressRatios)
			d, err := WithDSpark(c, s)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(d.DSparkTargetLayers, tc.targets) || d.DSparkLayers() != s.Stages || d.MTPLayers != 0 ||
				len(d.CompressRatios) != c.Layers+s.Stages || d.DSparkBlockSize != s.BlockSize || *d.DSparkNoiseToken != s.NoiseToken {
				t.Errorf("targets %v, %d stages, %d MTP layers, %d ratios, block %d", d.DSparkTargetLayers, d.DSparkLayers(), d.MTPLayers, len(d.CompressRatios), d.DSparkBlockSize)
			}
			if c.MTPLayers != mtp || len(c.CompressRatios) != ratios {
				t.Errorf("WithDSpark changed its input: %d MTP layers, %d ratios", c.MTPLayers, len(c.CompressRatios))
			}
			shapes := map[string][]int{}
			for _, ts := range Tensors(d, nil) {
				shapes[ts.Name] = ts.Shape
				if strings.HasPrefix(ts.Name, "mtp.") && (strings.Contains(ts.Name, "tid2eid") || strings.Contains(ts.Name, "e_proj")) {
					t.Errorf("stage tensor %s: the stages are not hash-routed and hold no MTP block", ts.Name)
				}
			}
			for name, want := range tc.tensors {
				if got, ok := shapes[name]; !slices.Equal(got, want) || ok != (want != nil) {
					t.Errorf("%s: shape %v, want %v", name, got, want)
				}
			}
		})
	}
	small := SmallDSparkConfig()
	s, err := PresetDSpark("small")
	if err != nil {
		t.Fatal(err)
	}
	if d, err := WithDSpark(SmallConfig(), s); err != nil || !slices.Equal(d.CompressRatios, small.CompressRatios) ||
		d.DSparkMarkovRank != small.DSparkMarkovRank || *d.DSparkNoiseToken != *small.DSparkNoiseToken {
		t.Errorf("small: %v, want the small-dspark preset's drafter", err)
	}
}

func TestWithDSparkErrors(t *testing.T) {
	flash, err := PresetConfig("flash")
	if err != nil {
		t.Fatal(err)
	}
	two, err := CutLayers(flash, 2, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		c    *Config
		s    DSparkShape
		want string
	}{
		{"too few layers", two, PublishedDSpark, "3 target layers need at least as many main layers, not 2"},
		{"noise outside the vocabulary", SmallConfig(), PublishedDSpark, "dspark_noise_token_id = 128799 outside vocab"},
		{"no stages", flash, DSparkShape{Targets: 3, BlockSize: 5, MarkovRank: 256, NoiseToken: 1}, "trailing entries for the DSpark stages"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := WithDSpark(tc.c, tc.s); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := PresetDSpark("huge"); err == nil {
		t.Error("unknown preset: no error")
	}
}
