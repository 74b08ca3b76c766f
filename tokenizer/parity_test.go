package tokenizer

import (
	"encoding/json"
	"os"
	"slices"
	"testing"
)

// TestParityDeepSeekV3 compares our ids with Hugging Face's tokenizers (Rust core,
// through its npm package) on the DeepSeek-V3 tokenizer.json. The reference ids
// were made by testdata/gen/gen.js; CI needs no npm.
func TestParityDeepSeekV3(t *testing.T) {
	tok, err := LoadFile("testdata/deepseek_v3_tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile("testdata/parity.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Text string `json:"text"`
		IDs  []int  `json:"ids"`
	}
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	ids, match := 0, 0
	for _, c := range cases {
		got := tok.Encode(c.Text)
		ids += len(c.IDs)
		if slices.Equal(got, c.IDs) {
			match++
		} else {
			t.Errorf("encode %q:\n got  %v\n want %v", c.Text, got, c.IDs)
		}
		if dec := tok.Decode(c.IDs); dec != c.Text {
			t.Errorf("decode of HF ids %q = %q", c.Text, dec)
		}
	}
	t.Logf("parity: %d/%d cases, %d reference ids", match, len(cases), ids)
}
