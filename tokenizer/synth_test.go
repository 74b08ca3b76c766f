package tokenizer

import "testing"

// TestSynthV4: the synthetic tokenizer has V4's id count and special-token
// ids, and round-trips text.
func TestSynthV4(t *testing.T) {
	tok, err := SynthV4()
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.VocabSize(); got != SynthV4Vocab {
		t.Errorf("vocab %d, want %d", got, SynthV4Vocab)
	}
	for _, tc := range []struct {
		s  string
		id int
	}{{BOS, 0}, {EOS, 1}, {UserTag, 128803}, {AssistantTag, 128804}, {ThinkOpen, 128821},
		{ThinkClose, 128822}, {DSML, 128825}, {LatestReminder, 128828}, {"<｜place▁holder▁no▁1279｜>", 129279}} {
		if id, ok := tok.TokenID(tc.s); !ok || id != tc.id {
			t.Errorf("TokenID(%q) = %d, %v; want %d", tc.s, id, ok, tc.id)
		}
	}
	const text = "Hello, world: 12345 <think>x</think>"
	ids := tok.Encode(text)
	if got := tok.Decode(ids); got != text {
		t.Errorf("Decode(Encode(%q)) = %q", text, got)
	}
}
