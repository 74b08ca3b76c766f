package tokenizer

import (
	"bytes"
	"testing"
)

func TestTrainBPE(t *testing.T) {
	corpus := "the quick brown fox jumps over the lazy dog. the dog sleeps; the fox runs 12345 times.\n" +
		"func main() {\n\tfmt.Println(\"hello, world\")\n}\n你好，世界。こんにちは 世界\n"
	special := DeepSeekV4SpecialTokens()
	js, err := TrainBPE(corpus, 320, special)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := TrainBPE(corpus, 320, special)
	if !bytes.Equal(js, again) {
		t.Fatal("training is not deterministic")
	}
	tok, err := Load(js)
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() > 320 || tok.VocabSize() <= len(special)+256 {
		t.Fatalf("vocab size %d, want in (%d, 320]", tok.VocabSize(), len(special)+256)
	}
	for i, s := range special {
		if id, ok := tok.TokenID(s); !ok || id != i {
			t.Errorf("special %q: id %d ok %v, want %d", s, id, ok, i)
		}
	}
	for _, text := range []string{corpus, "unseen wörds ✓ 🦀\r\n", "<｜User｜>hi the fox<｜Assistant｜></think>"} {
		ids := tok.Encode(text)
		if got := tok.Decode(ids); got != text {
			t.Errorf("round trip %q -> %q", text, got)
		}
	}
	// Learned merges must shorten the training text well below one id per byte.
	if n := len(tok.Encode(corpus)); n > len(corpus)-40 {
		t.Errorf("corpus of %d bytes encodes to %d ids: merges not applied", len(corpus), n)
	}
	if ids := tok.Encode("<｜User｜>"); len(ids) != 1 || ids[0] != 3 {
		t.Errorf("special token encodes to %v, want [3]", ids)
	}
	if _, err := TrainBPE(corpus, 10, special); err == nil {
		t.Error("vocab smaller than the byte alphabet accepted")
	}
}
