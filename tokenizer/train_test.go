package tokenizer

import (
	"bytes"
	"os"
	"strings"
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

// trainBPENaive is the direct statement of TrainBPE's merge rule: recount
// every pair after each merge. TrainBPE's incremental counting must agree.
func trainBPENaive(corpus string, vocabSize int, special []string) ([]byte, error) {
	b2u := bytesToUnicode()
	vocab := make(map[string]int, vocabSize)
	for i := 0; i < 256; i++ {
		vocab[string(b2u[i])] = len(special) + i
	}
	skeleton, err := tokenizerJSON(special, vocab, nil)
	if err != nil {
		return nil, err
	}
	pre, err := Load(skeleton)
	if err != nil {
		return nil, err
	}
	freq := map[string]int{}
	for _, p := range pre.preTokenize(corpus, nil) {
		freq[p]++
	}
	type word struct {
		syms []string
		n    int
	}
	var words []word
	for _, p := range sortedKeys(freq) {
		var syms []string
		for i := 0; i < len(p); i++ {
			syms = append(syms, string(b2u[p[i]]))
		}
		words = append(words, word{syms, freq[p]})
	}
	var merges [][2]string
	for len(special)+len(vocab) < vocabSize {
		counts := map[[2]string]int{}
		for _, w := range words {
			for i := 0; i+1 < len(w.syms); i++ {
				counts[[2]string{w.syms[i], w.syms[i+1]}] += w.n
			}
		}
		var best [2]string
		bestN := 1
		for pr, n := range counts {
			if n > bestN || (n == bestN && bestN > 1 && pr[0]+" "+pr[1] < best[0]+" "+best[1]) {
				best, bestN = pr, n
			}
		}
		if bestN < 2 {
			break
		}
		if _, dup := vocab[best[0]+best[1]]; !dup {
			vocab[best[0]+best[1]] = len(special) + len(vocab)
			merges = append(merges, best)
		}
		for wi := range words {
			out := words[wi].syms[:0]
			s := words[wi].syms
			for i := 0; i < len(s); i++ {
				if i+1 < len(s) && s[i] == best[0] && s[i+1] == best[1] {
					out = append(out, best[0]+best[1])
					i++
					continue
				}
				out = append(out, s[i])
			}
			words[wi].syms = out
		}
	}
	return tokenizerJSON(special, vocab, merges)
}

func TestTrainBPEMatchesNaive(t *testing.T) {
	small, err := os.ReadFile("../checkpoint/testdata/corpus.txt")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		corpus string
		vocab  int
	}{
		{"aaaa aaaa aaab abab ab ab ba ba aaaa", 275},
		{"the the the then there their other others otherwise", 300},
		{strings.Repeat("lowest lower newer wider new ", 20) + "ééé ééé 你好你好", 320},
		{string(small), 1024},
	}
	special := DeepSeekV4SpecialTokens()
	for i, c := range cases {
		got, err := TrainBPE(c.corpus, c.vocab, special)
		if err != nil {
			t.Fatal(err)
		}
		want, err := trainBPENaive(c.corpus, c.vocab, special)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("case %d: incremental training differs from the full recount", i)
		}
	}
}
