package tokenizer

import (
	"slices"
	"testing"
)

// EncodeHead's ids spell the head of the text and start Encode's tokens of
// the text followed by any of several continuations.
func TestEncodeHead(t *testing.T) {
	tok, err := LoadFile("testdata/deepseek_v3_tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	conts := []string{"", "x", "1", " ", "  y", "\"", "\":", "_name", "ü", "\n", "'s", "123"}
	cases := []struct {
		text  string
		empty bool // a single piece: nothing is safe
	}{
		{`{"customer_shipping_address":`, false},
		{`","billing_postal_code":"`, false},
		{`true`, true},
		{`<｜end▁of▁sentence｜>{"a":`, false},
		{`<｜end▁of▁sentence｜>`, false},
		{`ünï ünï`, false},
		{"12345", false},
		{"  \n\t x", false},
		{"", true},
	}
	for _, tc := range cases {
		ids, n := tok.EncodeHead(tc.text)
		if (len(ids) == 0) != tc.empty {
			t.Errorf("%q: %d ids, want none: %v", tc.text, len(ids), tc.empty)
		}
		if got := tok.Decode(ids); got != tc.text[:n] {
			t.Errorf("%q: ids spell %q, n=%d", tc.text, got, n)
		}
		for _, c := range conts {
			if full := tok.Encode(tc.text + c); !slices.Equal(full[:min(len(ids), len(full))], ids) {
				t.Errorf("%q + %q: tokens %v do not start with the head %v", tc.text, c, full, ids)
			}
		}
	}
}
